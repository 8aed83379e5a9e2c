"""Benchmark: what one `watch` poll costs as the source grows (source_tail.py).

For each source, a run of 100 and of 10,000 steps is written the way its trainer writes it,
the kind's tail reads it once (as `watch` does at its start), and then, repeated:
- a poll with nothing new: poll() (one stat per file and folder);
- a poll after one new step: the step is appended outside the timing, then poll() + take()
  + run() (what follow.py does before writing the step).
Sources: verl's file logger JSONL ({"step", "data"} lines), a TensorBoard event file (torch's
SummaryWriter, TRL-named tags: the cumulative ratio is carried across polls), and a TRL output
dir (completions/completions_{step}.parquet, one per step, and a trainer_state.json; its one
new step is a new parquet file; the trainer_state is rewritten only at checkpoints, when it is
re-read whole, which is not timed here). Target: flat, the 10,000-step poll within a small
factor of the 100-step one, and under 50 ms.

    .venv/bin/python bench/watch_poll.py [--repeats 20] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.perf_common import machine, publish, summary  # noqa: E402
from grpo_core.integrations.source_tail import open_tail  # noqa: E402

HEADING = "## Watch: cost per poll"
TARGET_MS = 50.0
METRICS = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "actor/lr", "response_length/mean",
           "timing_s/step", "perf/throughput", "actor/grad_norm"]


def verl_source(root: Path, steps: int):
    path = root / "exp.jsonl"

    def add(step):
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "data": {k: step * 0.001 + i for i, k in enumerate(METRICS)}}) + "\n")
    for s in range(1, steps + 1):
        add(s)
    return root, add


def tensorboard_source(root: Path, steps: int):
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(root / "runs" / "run1"))

    def add(step):
        writer.add_scalar("train/reward", step / 10, step)
        writer.add_scalar("train/frac_reward_zero_std", (step % 4) / 4, step)
        for k in ("loss", "grad_norm", "learning_rate", "kl", "entropy"):
            writer.add_scalar(f"train/{k}", step * 0.001, step)
        writer.flush()
    for s in range(1, steps + 1):
        add(s)
    return root / "runs", add


def trl_source(root: Path, steps: int):
    import pandas as pd
    folder = root / "completions"
    folder.mkdir(parents=True)
    (root / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": s, "reward": 0.5, "frac_reward_zero_std": 0.25} for s in range(1, steps + 1)],
        "global_step": steps, "max_steps": 10 * steps}))

    def add(step):
        prompts = [f"prompt {p} of {step}" for p in range(2) for _ in range(4)]
        pd.DataFrame({"step": [step] * 8, "prompt": prompts, "completion": ["x"] * 8,
                      "acc": [float((i + step) % 2) for i in range(8)], "advantage": [0.0] * 8}
                     ).to_parquet(folder / f"completions_{step:05d}.parquet")
    for s in range(1, steps + 1):
        add(s)
    return root, add


SOURCES = {"verl": ("verl JSONL (file logger)", verl_source),
           "tensorboard": ("TensorBoard event file", tensorboard_source),
           "trl": ("TRL output dir (completions parquet)", trl_source)}


def measure(kind: str, steps: int, repeats: int) -> tuple[list[float], list[float], float, int]:
    """(nothing-new poll seconds, one-new-step poll seconds, first read seconds, bytes read per new step)."""
    with tempfile.TemporaryDirectory() as d:
        path, add = SOURCES[kind][1](Path(d), steps)
        tail = open_tail(kind, path, None)
        t = time.perf_counter()
        tail.poll()
        tail.poll()
        tail.take()
        first = time.perf_counter() - t
        quiet, new, new_bytes = [], [], []
        for i in range(repeats):
            t = time.perf_counter()
            tail.poll()
            quiet.append(time.perf_counter() - t)
            add(steps + 1 + i)
            before = tail.reads.bytes
            t = time.perf_counter()
            tail.poll()
            tail.take()
            tail.run()
            new.append(time.perf_counter() - t)
            new_bytes.append(tail.reads.bytes - before)
            tail.poll()  # a history's newest step is finished by the next (quiet) poll: not timed
            tail.take()
        return quiet, new, first, int(sorted(new_bytes)[len(new_bytes) // 2])


def row(label: str, xs: list[float], base: float | None) -> str:
    s = summary(xs)
    ok = s["median"] * 1000 < TARGET_MS and (base is None or s["median"] < max(5 * base, base + 0.002))
    ms = {k: f"{s[k] * 1000:.2f}" for k in ("median", "p25", "p75", "min", "max")}
    return (f"| {label} | {ms['median']} ms {'✓' if ok else '✗'} | {ms['p25']}-{ms['p75']} ms "
            f"| {ms['min']}-{ms['max']} ms | {s['n']} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--steps", default="100,10000", help="run lengths, comma-separated")
    ap.add_argument("--no-write", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.steps.split(",")]
    lines = [HEADING, "", "What one `watch` poll costs as the source grows: a poll reads only what is new (byte "
             "offsets into append-only files, new files in folders, a rewritten file only when its size or mtime "
             "changed; `grpo_core/integrations/source_tail.py`). Each source is written the way its trainer writes "
             "it, read once, then polled: with nothing new, and after one new step (appended outside the timing; "
             "the poll, take and run that `watch` does before writing the step).", "",
             f"- Command: `.venv/bin/python bench/watch_poll.py --repeats {args.repeats}`",
             f"- Machine: {machine()}", f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"- Target: flat: the poll at {sizes[-1]:,} steps within 5x (or 2 ms) of the poll at "
             f"{sizes[0]:,} steps, and under {TARGET_MS:.0f} ms", "",
             "| source, steps, poll | median | spread (p25-p75) | min-max | repeats |",
             "| --- | --- | --- | --- | --- |"]
    notes = []
    for kind, (label, _) in SOURCES.items():
        base = {}
        for steps in sizes:
            quiet, new, first, nbytes = measure(kind, steps, args.repeats)
            for what, xs in (("nothing new", quiet), ("one new step", new)):
                b = base.get(what)
                lines.append(row(f"{label}, {steps:,} steps, {what}", xs, b))
                base.setdefault(what, summary(xs)["median"])
            notes.append(f"{label}, {steps:,} steps: first read {first:.2f} s; bytes read per new step {nbytes:,}")
            print(lines[-2], lines[-1], notes[-1], sep="\n", flush=True)
    lines += ["", *[f"- {n}" for n in notes], ""]
    publish(HEADING, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
