"""Autopilot on vs off on the built-in demo: the same seeded run twice, side by side.

    python bench/autopilot_demo.py                 # 400 steps each, seed 0; writes docs/demo.md
    python bench/autopilot_demo.py --steps 100 --no-doc
    python bench/autopilot_demo.py --seeds 0 1 2   # seed 0 in full, 1 and 2 in a summary table

Both trainers run at the same time (one torch thread each, so they share the machine alike)
with the same config and seed; only `autopilot.enabled` differs. Reported per run: the
cumulative trainable ratio at the end; the reward over the last 20 training steps (also
re-scored under the run's initial weights, so a reweighting move cannot make the number look
better by changing its scale); the final policy's reward on the run's starting level and
initial weights (a pilot of its last checkpoint on fresh prompts, identical for both runs:
a run whose autopilot raised the difficulty trains on harder prompts, so its training reward
is not comparable); the rollouts generated (a larger G costs compute) and every autopilot
move with its reason and the ratio before/after it (the analysis ledger). The figures and
the command go into the `## Autopilot` section of docs/demo.md.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.perf_common import scratch_dir  # noqa: E402
from grpo_core.analysis import ledger, run_data  # noqa: E402
from grpo_core.runs import names  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402

LAST = 20  # steps in the "final" window
TARGET_GAIN = 0.15
EVAL_BATCHES = 32  # pilot batches (8 prompts x G 8 each) scoring each run's final policy


def start(run_id: str, runs: Path, steps: int, seed: int, autopilot: bool, extra: list[str], log: Path):
    sets = [f"grpo.steps={steps}", f"grpo.seed={seed}", f"task.seed={seed}", "log.progress=false",
            "log.checkpoint_every=0", f"autopilot.enabled={'true' if autopilot else 'false'}", *extra]
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", run_id, "--runs-dir", str(runs)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "GRPO_HEALTH_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def last_step(runs: Path, run_id: str) -> int:
    try:
        with RunStore.open(runs / run_id, readonly=True) as s:
            return s.last_step() or 0
    except Exception:
        return 0


def evaluate(runs: Path, run_id: str, seed: int, batches: int, extra: list[str]) -> dict:
    """The run's final checkpoint, sampled and scored by a pilot (no update) on the run's
    starting level and initial weights, on a prompt stream neither run trained on."""
    from grpo_core.train.checkpoints import latest_checkpoint
    ckpt = latest_checkpoint(runs / run_id)
    eval_id = f"eval-{run_id}"
    if not (runs / eval_id / "run.db").exists():  # else evaluated before (--reuse)
        run_eval(runs, eval_id, ckpt, seed, batches, extra)
    with RunStore.open(runs / eval_id, readonly=True) as st:
        w = st.scalars_wide()
    return {"reward": float(w[names.REWARD].mean()), "answer_f1": float(w[names.metric_mean("answer_f1")].mean())
            if names.metric_mean("answer_f1") in w else float("nan"), "checkpoint": ckpt.name,
            "batches": [float(v) for v in w[names.REWARD]]}


def run_eval(runs: Path, eval_id: str, ckpt: Path, seed: int, batches: int, extra: list[str]):
    cmd = [sys.executable, "-m", "grpo_core", "pilot", "--run-id", eval_id, "--runs-dir", str(runs),
           "--set", f"model.path={ckpt}", "--set", f"task.seed={seed + 1000}", "--set", f"grpo.seed={seed}",
           "--set", f"grpo.steps={batches}", "--set", "log.progress=false"]
    for x in extra:
        cmd += ["--set", x]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env={**os.environ, "GRPO_HEALTH_TORCH_THREADS": "1"})


def paired_se(off: dict, on: dict) -> float:
    """Standard error of the final-reward difference: both evals score the same prompt stream
    batch by batch (task.seed + 1000), so the per-batch differences are paired."""
    d = np.array(on["eval"]["batches"]) - np.array(off["eval"]["batches"])
    return float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")


def summarise(runs: Path, run_id: str) -> dict:
    data = run_data.load_run(runs / run_id)
    w = data.wide
    tail = w.tail(LAST)
    init = {m: float(v) for m, v in ((data.config.get("reward") or {}).get("weights") or {}).items()}
    lo = int(tail.index[0])
    with RunStore.open(runs / run_id, readonly=True) as st:  # whole tables: the report samples large runs
        r = st.rollouts(since_step=lo - 1, with_text=False)
        n_rollouts = int(st.groups()["size"].sum())
    tot = r[list(init)].to_numpy(np.float64) @ np.array(list(init.values()))
    per_group = np.bincount(r.groupby(["step", "group"]).ngroup().to_numpy(), weights=tot) / \
        np.bincount(r.groupby(["step", "group"]).ngroup().to_numpy())
    led = ledger.change_ledger(data, window=20)
    moves = led[led["source"] == "autopilot"]
    meta = data.meta
    return {
        "run_id": run_id, "status": data.status, "steps": int(w.index[-1]),
        "cum_ratio": float(w[names.CUM_TRAINABLE_RATIO].iloc[-1]),
        "final_ratio": float(tail[names.TRAINABLE_RATIO].mean()),
        "final_reward": float(tail[names.REWARD].mean()),
        "final_reward_initial_weights": float(per_group.mean()),
        "final_metrics": {m: float(tail[names.metric_mean(m)].mean()) for m in init if names.metric_mean(m) in tail},
        "rollouts": n_rollouts, "wall_s": float(w[names.TIME_STEP].sum()),
        "settings": meta.get("settings") or {}, "stop_reason": meta.get("stop_reason"),
        "moves": [{"step": int(m["step"]), "kind": m["kind"], "change": m["change"],
                   "ratio_before": m["ratio_before"], "ratio_after": m["ratio_after"], "reason": m["reason"]}
                  for _, m in moves.iterrows()],
    }


def fmt(v, d=3):
    return "–" if v is None or v != v else f"{v:.{d}f}"


def section(off: dict, on: dict, cmd: str, steps: int, seed: int) -> str:
    gain = on["cum_ratio"] - off["cum_ratio"]
    rew = on["eval"]["reward"] - off["eval"]["reward"]
    ok = gain >= TARGET_GAIN and rew >= 0
    lines = [
        "## Autopilot", "",
        f"The same seeded demo run (seed {seed}, {steps} steps, everything else default) with the autopilot off "
        "and on, run side by side on this machine's CPU:", "", "```bash", cmd, "```", "",
        "| | autopilot off | autopilot on |", "|---|---|---|",
        f"| cumulative trainable ratio | {fmt(off['cum_ratio'])} | {fmt(on['cum_ratio'])} |",
        f"| trainable ratio, last {LAST} steps | {fmt(off['final_ratio'])} | {fmt(on['final_ratio'])} |",
        f"| reward, last {LAST} steps (initial weights) | {fmt(off['final_reward_initial_weights'])} | "
        f"{fmt(on['final_reward_initial_weights'])} |",
        f"| reward, last {LAST} steps (weights in force) | {fmt(off['final_reward'])} | {fmt(on['final_reward'])} |",
        f"| **final policy, starting level and weights** (eval: {EVAL_BATCHES} batches of fresh prompts) | "
        f"{fmt(off['eval']['reward'])} | {fmt(on['eval']['reward'])} |",
        f"| answer_f1 of the final policy (eval) | {fmt(off['eval']['answer_f1'])} | {fmt(on['eval']['answer_f1'])} |",
    ]
    for m in off["final_metrics"]:
        lines.append(f"| {m} mean, last {LAST} steps | {fmt(off['final_metrics'][m])} | "
                     f"{fmt(on['final_metrics'].get(m))} |")
    lines += [
        f"| rollouts generated | {off['rollouts']:,} | {on['rollouts']:,} |",
        f"| group size at the end | {off['settings'].get('group_size', '–')} | {on['settings'].get('group_size', '–')} |",
        f"| steps run / status | {off['steps']} / {off['status']} | {on['steps']} / {on['status']}"
        + (f" ({on['stop_reason']})" if on.get("stop_reason") else "") + " |",
        f"| training time (sum of step times) | {off['wall_s']:.0f} s | {on['wall_s']:.0f} s |", "",
        f"Cumulative trainable ratio **{gain:+.3f}** with the autopilot (target ≥ +{TARGET_GAIN}), final policy's "
        f"reward on the starting level and weights **{rew:+.3f}** (± {paired_se(off, on):.3f} standard error, "
        f"paired over the {EVAL_BATCHES} eval batches; target ≥ 0): **{'met' if ok else 'NOT met'}**, for "
        f"{on['rollouts'] / off['rollouts']:.2f}x the rollouts.", "",
        "The autopilot's moves (each one a control request with source `autopilot`; ratio over up to 20 steps "
        "before / after it, from the analysis ledger):", ""]
    if on["moves"]:
        lines += ["| step | change | ratio before → after | reason |", "|---|---|---|---|"]
        for m in on["moves"]:
            lines.append(f"| {m['step']} | {m['kind']}: {m['change']} | {fmt(m['ratio_before'], 2)} → "
                         f"{fmt(m['ratio_after'], 2)} | {m['reason']} |")
    else:
        lines.append("(none)")
    lines += ["", "A larger group costs compute: the rollouts row above is the price of the extra trainable "
              "groups. The autopilot's budget is `autopilot.rollout_budget` (2x the rollouts per step you set, at "
              "the same prompts per step; `autopilot.max_group_size` caps G); once G is at its budget it samples "
              "more widely instead (temperature up to `autopilot.max_temperature`), which costs no rollouts."]
    temps = (off["settings"].get("temperature"), on["settings"].get("temperature"))
    if temps[0] != temps[1]:
        lines += ["", f"Training rewards are measured at the sampling temperature in force ({temps[0]:g} off, "
                  f"{temps[1]:g} on at the end) and under the weights in force: the eval row scores both final "
                  "policies alike (temperature 1, the starting level and weights, the same fresh prompts)."]
    lines.append("")
    return "\n".join(lines)


def write_section(doc: Path, text: str):
    """Replace (or append) the `## Autopilot` section; the rest of the file is left alone."""
    old = doc.read_text() if doc.exists() else ""
    head = "## Autopilot"
    if head in old:
        a = old.index(head)
        b = old.find("\n## ", a + len(head))
        new = old[:a] + text.rstrip("\n") + "\n" + (old[b:] if b >= 0 else "")
    else:
        new = (old.rstrip("\n") + "\n\n" if old.strip() else "") + text
    doc.write_text(new)


def run_pair(runs: Path, steps: int, seed: int, extra: list[str], reuse: bool = False) -> tuple[dict, dict]:
    """The off and on runs of one seed, side by side; their summaries with the evals.
    reuse: summarise the newest finished pair of this seed already in `runs` instead."""
    if reuse:
        found = {k: sorted(runs.glob(f"ap-{k}-s{seed}-*")) for k in ("off", "on")}
        if not found["off"] or not found["on"]:
            raise SystemExit(f"--reuse: no ap-off-s{seed}-*/ap-on-s{seed}-* runs in {runs}")
        pair = tuple(summarise(runs, found[k][-1].name) for k in ("off", "on"))
        for r in pair:
            r["eval"] = evaluate(runs, r["run_id"], seed, EVAL_BATCHES, extra)
        return pair
    stamp = time.strftime("%H%M%S")
    ids = {False: f"ap-off-s{seed}-{stamp}", True: f"ap-on-s{seed}-{stamp}"}
    t0 = time.time()
    procs = {False: start(ids[False], runs, steps, seed, False, extra, runs / f"off-s{seed}.log")}
    # The second run starts once the first has a step: the built-in model's warm-start is then cached.
    while last_step(runs, ids[False]) < 1 and procs[False].poll() is None:
        time.sleep(2)
    procs[True] = start(ids[True], runs, steps, seed, True, extra, runs / f"on-s{seed}.log")
    while any(p.poll() is None for p in procs.values()):
        time.sleep(30)
        print(f"[seed {seed}, {time.time() - t0:5.0f}s] off step {last_step(runs, ids[False])}, on step "
              f"{last_step(runs, ids[True])} of {steps}", flush=True)
    for k, p in procs.items():
        if p.returncode != 0:
            raise SystemExit(f"run {ids[k]} failed (exit {p.returncode}); see {runs}/{'on' if k else 'off'}-s{seed}.log")
    off, on = summarise(runs, ids[False]), summarise(runs, ids[True])
    for r in (off, on):
        r["eval"] = evaluate(runs, r["run_id"], seed, EVAL_BATCHES, extra)
    return off, on


def met(off: dict, on: dict) -> bool:
    return on["cum_ratio"] - off["cum_ratio"] >= TARGET_GAIN and on["eval"]["reward"] >= off["eval"]["reward"]


def short(m: dict) -> str:
    """'G 8→16 (142)', 'level 2→1, taken back (376)' for the seeds table."""
    change = m["change"].replace("group_size ", "G ").replace("prompts_per_step ", "prompts ")
    if m["kind"] == "set_weights":
        change = "weights"
    back = ", taken back" if "did not help" in str(m["reason"]) else ""
    return f"{change}{back} ({m['step']})"


def moves_text(moves: list[dict]) -> str:
    """One entry per decision: a G move paid for with fewer prompts is two requests, one reason."""
    out, last = [], None
    for m in moves:
        key = (m["step"], m["reason"])
        text = short(m)
        if key == last:
            out[-1] = text.rsplit(" (", 1)[0] + " + " + out[-1]
        else:
            out.append(text)
        last = key
    return "; ".join(out)


def seeds_table(pairs: dict[int, tuple[dict, dict]]) -> str:
    lines = ["", "Other seeds, same command (`--seeds` runs them one after another):", "",
             "| seed | cumulative ratio off → on | gain | final policy (eval) off → on | difference (± s.e.) | "
             "rollouts off → on | autopilot moves (step) | met |", "|---|---|---|---|---|---|---|---|"]
    for seed, (off, on) in pairs.items():
        lines.append(f"| {seed} | {fmt(off['cum_ratio'])} → {fmt(on['cum_ratio'])} | "
                     f"{on['cum_ratio'] - off['cum_ratio']:+.3f} | {fmt(off['eval']['reward'])} → "
                     f"{fmt(on['eval']['reward'])} | {on['eval']['reward'] - off['eval']['reward']:+.3f} "
                     f"(± {paired_se(off, on):.3f}) | {off['rollouts']:,} → {on['rollouts']:,} | "
                     f"{moves_text(on['moves']) or '–'} | {'yes' if met(off, on) else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="the first is reported in full")
    ap.add_argument("--runs-dir", help="where the runs go (default: a new temp dir)")
    ap.add_argument("--doc", default=str(ROOT / "docs" / "demo.md"))
    ap.add_argument("--no-doc", action="store_true", help="print the section instead of writing it")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="extra knob for both runs")
    ap.add_argument("--reuse", action="store_true", help="report the pairs already in --runs-dir, run nothing")
    args = ap.parse_args()
    if args.reuse and not args.runs_dir:
        ap.error("--reuse needs --runs-dir")
    runs = Path(args.runs_dir).resolve() if args.runs_dir else scratch_dir("autopilot-bench-")  # --runs-dir: kept
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    pairs = {seed: run_pair(runs, args.steps, seed, args.extra, args.reuse) for seed in args.seeds}
    cmd = "python bench/autopilot_demo.py" + ("" if args.steps == 400 else f" --steps {args.steps}") + \
        ("" if args.seeds == [0] else " --seeds " + " ".join(map(str, args.seeds))) + \
        "".join(f" --set {s}" for s in args.extra)
    first = args.seeds[0]
    text = section(*pairs[first], cmd, args.steps, first)
    if args.reuse:
        text += ("\nReported with `--reuse` from the runs of that command; on this shared 2-core box the seeds ran "
                 "as separate processes (`--seeds N --runs-dir D` each, same settings) into one runs dir.\n")
    if len(pairs) > 1:
        text += seeds_table({s: p for s, p in pairs.items() if s != first})
        gains = [on["cum_ratio"] - off["cum_ratio"] for off, on in pairs.values()]
        diffs = [on["eval"]["reward"] - off["eval"]["reward"] for off, on in pairs.values()]
        text += (f"\nOver the {len(pairs)} seeds: cumulative ratio gain {min(gains):+.3f} .. {max(gains):+.3f} "
                 f"(≥ +{TARGET_GAIN} in {sum(g >= TARGET_GAIN for g in gains)} of {len(pairs)}); final policy's reward "
                 f"{min(diffs):+.3f} .. {max(diffs):+.3f} (≥ 0 in {sum(d >= 0 for d in diffs)} of {len(pairs)}).\n")
    print(text)
    print(f"runs in {runs}; {time.time() - t0:.0f}s wall")
    if not args.no_doc:
        write_section(Path(args.doc), text)
        print(f"wrote the Autopilot section of {args.doc}")
    return 0 if met(*pairs[first]) else 3


if __name__ == "__main__":
    sys.exit(main())
