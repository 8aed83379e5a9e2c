"""Benchmark: what monitoring costs a training step.

The real loop (`Trainer.run()`, demo config) in one process, alternating segments of:
  full      as shipped: every scalar, group and rollout (with text) written to the run store
            each step, alerts, control polling, heartbeat thread
  no store  RunStore.log_step replaced by a no-op (the store writes nothing)
  bare      no store writes, no alerts/curriculum, no control polling
Two readings of the overhead, because a 2% difference drowns in a shared box's noise:
  direct    the time the monitoring calls themselves take per step (timed around the calls)
            over the median step: the cost, measured where it is paid
  A/B       the ratio of median step times, full vs no store (and vs bare), with the spread
            of the per-segment-pair ratios: a check that nothing else (cache effects, the
            heartbeat's lock) hides outside the timed calls
Target: full < 2% slower than no store.

    .venv/bin/python bench/monitoring_overhead.py [--steps 60] [--segment 6] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("GRPO_TORCH_THREADS", "1")

from perf_common import machine, summary, publish  # noqa: E402
from profile_step import make_trainer  # noqa: E402

HEADING = "## Monitoring overhead"
TARGET = 0.02


def run_segment(tr, n: int, variant: str, spent: dict) -> list[float]:
    """n steps of the real loop under `variant`; per-step intervals (n - 1) and the time
    spent in the monitoring calls (added into `spent`)."""
    store = tr.store
    real = {"log_step": store.log_step, "new_alerts": tr.new_alerts, "curriculum": tr.curriculum,
            "poll_control": tr.poll_control}
    ticks = []

    def timed(name, fn):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                d = time.perf_counter() - t
                spent[name] = spent.get(name, 0.0) + d
                spent.setdefault("calls:" + name, []).append(d)
                if name == "log_step":
                    ticks.append(time.perf_counter())
        return call

    noop_log = lambda *a, **kw: None  # noqa: E731
    off = {"full": (), "no store": ("log_step",), "bare": ("log_step", "new_alerts", "curriculum", "poll_control")}
    for name, fn in real.items():
        if name in off[variant]:
            fn = {"log_step": noop_log, "new_alerts": lambda step, scalars: [], "curriculum": lambda scalars: [],
                  "poll_control": lambda: None}[name]
        setattr(store if name == "log_step" else tr, name, timed(name, fn))
    tr.cfg.grpo.steps = tr.step + n
    try:
        tr.run()
    finally:
        store.log_step = real["log_step"]
        for name in ("new_alerts", "curriculum", "poll_control"):
            setattr(tr, name, real[name])
    return [b - a for a, b in zip(ticks, ticks[1:])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60, help="timed steps per variant (about)")
    ap.add_argument("--segment", type=int, default=6)
    ap.add_argument("--runs-dir", default=os.path.join(tempfile.gettempdir(), "grpo-bench-runs"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)

    tr = make_trainer(args.runs_dir, 3)
    tr.run()  # warm-up
    variants = ["full", "no store", "bare"]
    steps = {v: [] for v in variants}
    per_seg = {v: [] for v in variants}
    spent = {v: {} for v in variants}
    segs = max(1, -(-args.steps // (args.segment - 1)))
    for _ in range(segs):
        for v in variants:
            dts = run_segment(tr, args.segment, v, spent[v])
            steps[v] += dts
            per_seg[v].append(statistics.median(dts))
    n_full = len(steps["full"]) + segs  # steps run in the full variant (intervals + 1 per segment)
    med = {v: statistics.median(steps[v]) for v in variants}
    calls = {k[6:]: statistics.median(v) for k, v in spent["full"].items() if k.startswith("calls:")}
    direct = {k: s / n_full for k, s in spent["full"].items() if not k.startswith("calls:")}  # s per step
    direct_store = direct.get("log_step", 0.0) / med["full"]
    direct_all = sum(direct.values()) / med["full"]
    pairs = {v: summary([a / b - 1 for a, b in zip(per_seg["full"], per_seg[v])]) for v in ("no store", "bare")}
    ab_store = med["full"] / med["no store"] - 1
    ab_bare = med["full"] / med["bare"] - 1
    ok = "meets" if direct_store < TARGET else "MISSES"
    lines = [
        HEADING, "",
        "The real loop (`Trainer.run()`, demo config, built-in model: 8 prompts x 8 completions, every rollout's "
        "scores and text written) in one process, alternating segments of "
        f"{args.segment} steps: **full** (as shipped), **no store** (`RunStore.log_step` a no-op), **bare** (no "
        "store writes, no alerts/curriculum, no control polling).",
        "",
        f"- Command: `GRPO_TORCH_THREADS=1 .venv/bin/python bench/monitoring_overhead.py --steps {args.steps}`",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M %Z')}; {len(steps['full'])} step intervals per variant",
        f"- Target: writing everything to the store costs < {TARGET:.0%} of a step. Result (direct): "
        f"**{direct_store:.2%}** of the median step: **{ok}**; all monitoring (store + alerts + control polling): "
        f"{direct_all:.2%}. The median call (what a call costs when nothing preempts it): log_step "
        f"{calls.get('log_step', 0) * 1000:.2f} ms = {calls.get('log_step', 0) / med['full']:.2%} of the median step.",
        "",
        "| monitoring call (full variant) | mean ms per step | share of the median step | median call ms |",
        "| --- | --- | --- | --- |",
        *[f"| {k} | {v * 1000:.2f} | {v / med['full']:.2%} | {calls.get(k, 0) * 1000:.2f} |"
          for k, v in sorted(direct.items(), key=lambda kv: -kv[1])],
        "",
        "| variant | median s/step | full vs this (ratio of medians) | per segment pair: median (p25-p75) |",
        "| --- | --- | --- | --- |",
        f"| full | {med['full']:.4f} | - | - |",
        f"| no store | {med['no store']:.4f} | {ab_store:+.1%} | {pairs['no store']['median']:+.1%} "
        f"({pairs['no store']['p25']:+.1%} to {pairs['no store']['p75']:+.1%}) |",
        f"| bare | {med['bare']:.4f} | {ab_bare:+.1%} | {pairs['bare']['median']:+.1%} "
        f"({pairs['bare']['p25']:+.1%} to {pairs['bare']['p75']:+.1%}) |",
        "",
        "The A/B rows are differences of noisy medians on a shared box: their spread is the noise floor "
        "of that reading, far wider than the monitoring cost itself; the direct reading is the cost.",
        "",
    ]
    text = "\n".join(lines)
    publish(HEADING, text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
