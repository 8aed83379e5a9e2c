"""Shared bits of the performance benchmarks (bench/trainer_vs_trl.py, profile_step.py,
monitoring_overhead.py, store_scale.py, gpu_check.py, health_bench.py, dashboard_bench.py,
vllm_*.py): the machine line, robust summaries (median and quartiles: the box is shared and
noisy), a timing table's rows, rewards that make every group train, and writing one section of
docs/benchmarks.md without touching the others (a file lock: the scripts may run at once), and
scratch folders removed when the script exits (a SmolLM2 run's checkpoints are gigabytes)."""
from __future__ import annotations

import atexit
import fcntl
import os
import platform
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"nproc {len(os.sched_getaffinity(0))}, {cpu}; load average {load} (other agents share the CPU); "
            f"Python {platform.python_version()}")


def scratch_dir(prefix: str) -> Path:
    """A fresh folder under the system temp dir, removed (with what the runs wrote there) when the
    script exits, normally or by an exception: benches leave no checkpoints behind."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def load_now() -> float:
    return os.getloadavg()[0]


def summary(xs) -> dict:
    xs = [float(x) for x in xs]
    if not xs:
        return {"median": float("nan"), "p25": float("nan"), "p75": float("nan"), "min": float("nan"),
                "max": float("nan"), "n": 0}
    q = np.percentile(xs, [25, 75])
    return {"median": statistics.median(xs), "p25": float(q[0]), "p75": float(q[1]), "min": min(xs),
            "max": max(xs), "n": len(xs)}


def fmt_ms(s: dict, unit: str = "ms", scale: float = 1000.0, digits: int = 1) -> str:
    """'median | p25-p75 | min-max | n' of a summary of seconds, shown in `unit`."""
    f = f"{{:.{digits}f}}"
    m, a, b, lo, hi = (f.format(s[k] * scale) for k in ("median", "p25", "p75", "min", "max"))
    return f"{m} {unit} | {a}-{b} {unit} | {lo}-{hi} {unit} | {s['n']}"


TABLE_HEAD = ["| operation | median | spread (p25-p75) | min-max | repeats |", "| --- | --- | --- | --- | --- |"]


def table_row(name: str, seconds, target_ms: float | None = None) -> str:
    """A TABLE_HEAD row from seconds per call, in ms; with a target the median gets ✓ (below it) or ✗."""
    s = summary(seconds)
    verdict = "" if target_ms is None else (" ✓" if s["median"] * 1000 < target_ms else " ✗")
    median, rest = fmt_ms(s).split(" | ", 1)
    return f"| {name} | {median}{verdict} | {rest} |"


def timeit(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call (after warm-up calls)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def every_group_varies(trainer):
    """Score so that every group has a reward spread (and every step trains every group): the
    timing benchmarks' rewards, which a random-init model's ties or a task's flat groups would
    otherwise turn into skipped backwards."""
    from grpo_core.tasks.rewards import Scored

    def varied(completions, examples):
        raw = np.zeros((len(completions), len(trainer.reward.names)))
        raw[:, 0] = [i % 2 + len(c) % 3 for i, c in enumerate(completions)]
        return Scored(raw, trainer.reward.totals(raw), [None] * len(completions))
    trainer.reward.score = varied


def write_section(heading: str, text: str, doc: Path = DOC):
    """Replace (or append) the section that starts with `heading`; other sections are left alone."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / "grpo-benchmarks-md.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        old = doc.read_text() if doc.exists() else "# Benchmarks\n"
        start = old.find(heading + "\n")
        if start < 0:
            new = old.rstrip("\n") + "\n\n" + text
        else:
            nxt = old.find("\n## ", start + len(heading))
            new = old[:start] + text.rstrip("\n") + "\n" + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
        doc.write_text(new.rstrip("\n") + "\n")


def publish(heading: str, text: str, write: bool = True, doc: Path = DOC):
    """Print a section and, unless told not to, write it into docs/benchmarks.md."""
    print(text)
    if write:
        write_section(heading, text, doc)
        print(f"wrote {heading!r} in {doc.relative_to(doc.parents[1])}")
