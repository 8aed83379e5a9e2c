"""Demo curves: does the built-in demo show what the dashboard is for?

Runs the real CLI (`python -m grpo_core train`) on the built-in demo in a fresh runs dir
(so the warm-start is part of the timing), watches its run store like the dashboard does,
and checks three things:

  1. the mean reward rises by >= 0.3 within 3 minutes of the process start;
  2. the trainable ratio falls below 0.3 as the easy level gets easy;
  3. a set_difficulty request to a harder level lifts the ratio above 0.3 again within
     50 steps of the step it took effect at.

Ratios and rewards are 10-step rolling means (one step is 8 groups: a single step's
ratio moves in steps of 1/8). Writes docs/demo.md with the command, the verdicts and the
curves. Usage: .venv/bin/python bench/demo_curves.py [--threads 2] [--harder 2]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.perf_common import scratch_dir  # noqa: E402
from grpo_core.errors import StoreError  # noqa: E402
from grpo_core.runs import names  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402

WINDOW = 10
RISE, RISE_WITHIN_S = 0.3, 180.0
LOW_RATIO, LIFT_WITHIN = 0.3, 50
SPARK = "▁▂▃▄▅▆▇█"


def spark(values, lo=0.0, hi=1.0) -> str:
    out = []
    for v in values:
        f = 0.0 if v != v else min(1.0, max(0.0, (v - lo) / (hi - lo)))
        out.append(SPARK[min(len(SPARK) - 1, int(f * len(SPARK)))])
    return "".join(out)


def wait_store(db: Path, proc, timeout=120) -> RunStore:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"trainer exited with {proc.returncode} before its store appeared")
        try:
            return RunStore(db)
        except StoreError:
            time.sleep(0.5)
    raise SystemExit("no run store after 120 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0,
                    help="GRPO_HEALTH_TORCH_THREADS for the trainer (0: the trainer's rule, 1 for the built-in model)")
    ap.add_argument("--harder", type=int, default=2, help="level the set_difficulty request asks for")
    ap.add_argument("--max-steps", type=int, default=600, help="grpo.steps of the run (it is stopped earlier)")
    ap.add_argument("--after-lift", type=int, default=60, help="steps to keep running after the switch")
    ap.add_argument("--min-switch-step", type=int, default=100, help="never switch before this step")
    ap.add_argument("--out", default=str(ROOT / "docs" / "demo.md"))
    ap.add_argument("--every", type=int, default=20, help="table row every N steps")
    args = ap.parse_args()

    runs = scratch_dir("grpo-demo-bench-")
    run_id = "demo-curves"
    cmd = [sys.executable, "-m", "grpo_core", "train", "--set", f"grpo.steps={args.max_steps}",
           "--set", "log.progress=false", "--run-id", run_id, "--runs-dir", str(runs)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("GRPO_HEALTH_TORCH_THREADS", None)
    prefix = ""
    if args.threads:
        env["GRPO_HEALTH_TORCH_THREADS"] = str(args.threads)
        prefix = f"GRPO_HEALTH_TORCH_THREADS={args.threads} "
    shown = f"{prefix}python -m grpo_core train --set grpo.steps={args.max_steps} --run-id {run_id} --runs-dir <fresh dir>"
    print(f"$ {shown}", flush=True)
    load0 = os.getloadavg()[0]
    t_start = time.time()
    log = open(runs / "trainer.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    store = wait_store(runs / run_id / "run.db", proc)

    walls: dict[int, float] = {}  # step -> seconds since process start, as seen by the poller
    switch_req = switch_step = lift_step = None
    stop_sent = False
    last = 0
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            w = store.scalars_wide(since_step=last, names=[names.TRAINABLE_RATIO])
            if w.empty:
                continue
            now = time.time() - t_start
            for s in w.index:
                walls.setdefault(int(s), now)
            last = int(w.index[-1])
            ratio = store.scalars_wide(since_step=last - WINDOW, names=[names.TRAINABLE_RATIO])[names.TRAINABLE_RATIO]
            rolling = float(ratio.mean())
            if switch_req is None and last >= args.min_switch_step and len(ratio) >= WINDOW and rolling < LOW_RATIO:
                switch_req = store.request("set_difficulty", {"level": args.harder}, source="bench")
                print(f"step {last} ({now:.0f}s): rolling ratio {rolling:.2f} < {LOW_RATIO}: "
                      f"set_difficulty {args.harder}", flush=True)
            if switch_req is not None and switch_step is None:
                c = store.control()
                row = c[c["id"] == switch_req].iloc[0]
                if row["status"] == "applied":
                    switch_step = int(row["applied_step"])
            if switch_step is not None and not stop_sent and last >= switch_step + args.after_lift:
                store.request("stop", {}, source="bench")
                stop_sent = True
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        log.close()
    total_s = time.time() - t_start

    wide = store.scalars_wide()
    meta = store.get_meta()
    events = store.events()
    steps = wide.index.to_numpy()
    R = wide[names.REWARD].rolling(WINDOW, min_periods=1).mean()
    Q = wide[names.TRAINABLE_RATIO].rolling(WINDOW, min_periods=WINDOW).mean()
    wall = pd.Series(walls).reindex(wide.index).ffill()
    start_reward = float(wide[names.REWARD].iloc[:WINDOW].mean())

    rise_hits = R[(R >= start_reward + RISE) & (wall <= RISE_WITHIN_S)]
    rise_step = int(rise_hits.index[0]) if len(rise_hits) else None
    best_3min = float(R[wall <= RISE_WITHIN_S].max()) if (wall <= RISE_WITHIN_S).any() else float("nan")
    pre = Q[Q.index < (switch_step or 10**9)]
    low_hits = pre[pre < LOW_RATIO]
    low_step = int(low_hits.index[0]) if len(low_hits) else None
    if switch_step is not None:
        # windows wholly after the switch: a rolling mean straddling it would count the old level
        post = Q[(Q.index >= switch_step + WINDOW - 1) & (Q.index <= switch_step + LIFT_WITHIN)]
        lift = post[post > LOW_RATIO]
        lift_step = int(lift.index[0]) if len(lift) else None
    ok1, ok2, ok3 = rise_step is not None, low_step is not None, lift_step is not None
    step_s = wide[names.TIME_STEP]
    warm = next((p.get("model", {}) for p in events["payload"] if p.get("event") == "started"), {})

    after_switch = []
    if switch_step is not None:
        pts = [(k, Q.get(switch_step + k)) for k in (10, 30, 50, 80) if switch_step + k in Q.index]
        after_switch = [
            "Level 1 is a copy task this model learns: the reward climbs and, as the answers become",
            "certain, whole groups score alike and the trainable ratio falls (the dashboard's",
            "'declining ratio' alert fires and suggests harder tasks). Level 2 adds the key lookup,",
            "which a 2-layer model does not learn within a few hundred GRPO steps: right after the",
            "switch it samples both sources, so groups disagree and the ratio jumps; then the policy",
            "settles on one guess per prompt and the ratio sinks again (rolling ratio "
            + ", ".join(f"{v:.2f} at +{k}" for k, v in pts) + " steps) while the reward stays low: the",
            "dashboard's near-zero alert is the cue to stop or to use a bigger model.",
            "",
        ]

    def row(s):
        r = wide.loc[s]
        return (f"| {s} | {wall.loc[s]:.0f} | {int(r[names.DIFFICULTY])} | {r[names.REWARD]:.3f} | {R.loc[s]:.3f} | "
                f"{r[names.TRAINABLE_RATIO]:.2f} | {Q.loc[s]:.2f} | {r[names.metric_mean('exact')]:.2f} | "
                f"{r[names.metric_mean('citation')]:.2f} | {r[names.TIME_STEP]:.3f} |")

    marks = sorted({int(s) for s in steps if s == 1 or s % args.every == 0}
                   | {x for x in (rise_step, low_step, switch_step, lift_step) if x is not None} | {int(steps[-1])})
    lines = [
        "# The built-in demo: reward and trainable-ratio curves",
        "",
        "Written by `bench/demo_curves.py` (do not edit by hand). It runs the real CLI on the",
        "built-in demo (\"answer and cite your source\", see `grpo_core/tasks/demo.py`) in a fresh",
        "runs dir, so the cached warm-start is built inside the timing, and reads the run store the",
        "way the dashboard does. Rolling values are over the last 10 steps.",
        "",
        "```",
        f"$ {shown}",
        "# after the rolling trainable ratio falls below 0.3 (and step >= "
        f"{args.min_switch_step}) the script sends:",
        f"$ python -m grpo_core control {run_id} set-difficulty {args.harder}",
        "```",
        "",
        f"Machine: {os.cpu_count()} CPU cores shared with other jobs (timings are pessimistic), "
        f"torch threads {args.threads or '1 (the trainer default for the built-in model)'}, "
        f"device {meta.get('device')}; load average at the start {load0:.1f}, at the end {os.getloadavg()[0]:.1f}.",
        "",
        "## Verdicts",
        "",
        "| check | result |",
        "| --- | --- |",
        f"| reward +{RISE} within {RISE_WITHIN_S:.0f} s | {'PASS' if ok1 else 'FAIL'}: start {start_reward:.3f} "
        f"(mean of steps 1-10), best rolling mean in the first {RISE_WITHIN_S:.0f} s {best_3min:.3f}"
        + (f"; +{RISE} reached at step {rise_step}, {wall.loc[rise_step]:.0f} s after launch" if ok1 else "") + " |",
        f"| ratio falls below {LOW_RATIO} (easy level) | {'PASS' if ok2 else 'FAIL'}"
        + (f": rolling ratio {Q.loc[low_step]:.2f} at step {low_step} ({wall.loc[low_step]:.0f} s)" if ok2 else "")
        + " |",
        f"| harder level lifts ratio above {LOW_RATIO} within {LIFT_WITHIN} steps | {'PASS' if ok3 else 'FAIL'}"
        + (f": level {args.harder} from step {switch_step}, rolling ratio {Q.loc[lift_step]:.2f} at step "
           f"{lift_step} ({lift_step - switch_step} steps later)" if ok3 else
           (f": level {args.harder} from step {switch_step}" if switch_step else ": never switched")) + " |",
        "",
        f"Warm-start: {warm.get('warm_steps', '?')} supervised steps, "
        f"{warm.get('warm_success', float('nan')):.0%} of sampled answers right before GRPO. "
        f"Run: {int(steps[-1])} steps in {total_s:.0f} s wall (process start to exit); "
        f"median step {step_s.median():.3f} s (generate {wide[names.TIME_GENERATE].median():.3f} s, "
        f"train {wide[names.TIME_TRAIN].median():.3f} s, score {wide[names.TIME_SCORE].median():.4f} s, "
        f"store write {wide[names.TIME_LOG].median():.4f} s), 8 prompts x 8 completions.",
        "",
        "## The task",
        "",
        "The prompt asks for a key, shows sources (a fact and its id each), and the answer is the",
        "value followed by the id it came from: `Q: ice? sun=hot [S1] ice=red [S2] A: ` -> `red [S2]`.",
        "Levels: 1 = one source; 2 = two sources (the key must be looked up); 3 = three sources,",
        "one- or two-word values; 4 = four sources, two-word values, distractor keys sharing their",
        "first letters. Metrics and weights (config.DEMO_WEIGHTS): answer_f1 0.4 (continuous),",
        "exact 0.3, citation 0.2, format 0.1 (binary), length 0.1 (graduated penalty); the best",
        "total is 1.0. The built-in model (~140k parameters, 2 layers) is warmed up with supervised",
        "steps until 30% of its sampled answers are right, then trained with GRPO (lr 1e-3,",
        "8 prompts x 8 completions).",
        "",
        "## What the curves show",
        "",
        *after_switch,
        "## Curves",
        "",
        "```",
        f"reward (0..1)  {spark(wide[names.REWARD].rolling(WINDOW, min_periods=1).mean().iloc[::5])}",
        f"ratio  (0..1)  {spark(wide[names.TRAINABLE_RATIO].rolling(WINDOW, min_periods=1).mean().iloc[::5])}",
        f"level  (1..4)  {spark(wide[names.DIFFICULTY].iloc[::5], 1, 4.01)}",
        "               one character per 5 steps",
        "```",
        "",
        "| step | wall s | level | reward | reward (rolling) | trainable ratio | ratio (rolling) | exact | citation | step s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *[row(s) for s in marks],
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines[lines.index("## Verdicts"):lines.index("## Curves")]))
    print(f"wrote {args.out}")
    return 0 if (ok1 and ok2 and ok3) else 1


if __name__ == "__main__":
    sys.exit(main())
