"""docs/worked_example.md: its commands run as printed in a fresh folder, reduced as the doc's
"The test" says (fewer warm-start and GRPO steps), and the run ends with held-out scalars in
the store. No learned outcome is asserted: a few steps teach nothing."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "worked_example.md"
REDUCED = {"make.py": " --warm-steps 4", "grpo_core train": " --set grpo.steps=3 --set eval.every=2"}


def doc_block() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    at = text.index("<!-- worked-example commands:")
    block = re.search(r"```bash\n(.*?)\n```", text[at:], re.S)
    assert block, "no ```bash block after the worked-example marker"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]


def reduced(command: str) -> str:
    return command + "".join(extra for key, extra in REDUCED.items() if key in command)


def test_the_worked_example_runs_as_printed(tmp_path):
    commands = doc_block()
    assert [c for c in commands if "make.py" in c] and [c for c in commands if "grpo_core train" in c]
    assert all(key in DOC.read_text(encoding="utf-8") for key in ("--warm-steps 4", "--set grpo.steps=3 --set eval.every=2"))
    for name in (".venv", "docs"):  # the checkout's root, as the doc's commands expect
        (tmp_path / name).symlink_to(REPO / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRPO_HEALTH_RUNS_DIR")}
    env["GRPO_HEALTH_TORCH_THREADS"] = "1"
    for command in map(reduced, commands):
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    data = tmp_path / "arithmetic"
    assert (data / "model" / "config.json").is_file() and (data / "held_out.jsonl").is_file()
    runs = list_runs(tmp_path / "runs").set_index("run_id")
    assert runs.loc["arithmetic", "status"] == "finished"
    with RunStore.open(tmp_path / "runs" / "arithmetic", readonly=True) as store:
        assert store.last_step() == 3
        evals = store.scalars_wide()[["eval/pass@1", "eval/reward"]].dropna()
    assert list(evals.index) == [1, 2, 3]  # after step 1, every 2 steps, after the last
    assert evals.apply(lambda s: s.between(0, 1)).all().all()
