"""Benchmark: a whole GRPO step with the native sampler against one with the vLLM engine, on CPU.

The trainer itself (`Trainer.run()`), on the real-architecture Qwen2 of tests/real_model.py in
float32, the demo task, the same config but `grpo.engine`: per step the store's time/step_s,
time/generate_s, time/train_s and (vLLM) time/weight_sync_s, median and min-max over the
steps after the first (which warms up). Each engine runs in a process of its own, one after
the other, since vLLM's CPU backend takes over the process's threads when it starts.
Needs the vLLM venv:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python bench/vllm_step.py [--steps 8] [--shape 8x4x128]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from perf_common import every_group_varies, machine, summary  # noqa: E402


def cell(seconds: list[float]) -> str:
    s = summary(seconds)
    return f"{s['median'] * 1000:.0f} ms ({s['min'] * 1000:.0f}-{s['max'] * 1000:.0f})"

TIMES = ("time/step_s", "time/generate_s", "time/train_s", "time/weight_sync_s")


def one_engine(engine: str, steps: int, shape: str, root: Path) -> dict[str, list[float]]:
    """Run the trainer with `engine` in this process; each time/* scalar per step after the first."""
    from grpo_core.runs.store import RunStore
    from grpo_core.tasks.loading import load_config
    from grpo_core.train.models import set_threads
    from grpo_core.train.trainer import Trainer
    from tests.real_model import build
    prompts, group, tokens = (int(x) for x in shape.split("x"))
    cfg = load_config(None, [f"model.path={build(root / 'models')}", "model.dtype=float32", f"grpo.engine={engine}",
                             f"grpo.steps={steps}", f"grpo.prompts_per_step={prompts}", f"grpo.group_size={group}",
                             f"grpo.max_new_tokens={tokens}", "grpo.min_group_std=0", "log.progress=false",
                             "log.checkpoint_every=0"])
    set_threads(cfg)
    store = RunStore.create(f"bench-{engine}", cfg.to_dict(), root=root / "runs")
    tr = Trainer(cfg, store, log=lambda m: None)
    every_group_varies(tr)
    tr.run()
    wide = store.scalars_wide().iloc[1:]
    store.close()
    return {name: wide[name].dropna().tolist() for name in TIMES if name in wide.columns}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--shape", default="8x4x128", help="prompts x G x new tokens")
    ap.add_argument("--engine", help=argparse.SUPPRESS)  # the child process's engine
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        print(json.dumps(one_engine(args.engine, args.steps, args.shape, Path(args.root))))
        return 0
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for engine in ("native", "vllm"):
            out = subprocess.run([sys.executable, __file__, "--engine", engine, "--root", root, "--steps",
                                  str(args.steps), "--shape", args.shape], capture_output=True, text=True, env=env,
                                 cwd=ROOT, check=True)
            results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"`{' '.join(['python', *sys.argv])}`; {machine()}; shape {args.shape}, {args.steps - 1} timed steps\n")
    print("| engine | " + " | ".join(TIMES) + " |")
    print("|---|" + "---|" * len(TIMES))
    for engine, times in results.items():
        cells = [cell(times[n]) if times.get(n) else "-" for n in TIMES]
        print(f"| {engine} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
