"""Benchmark: skip before sampling (grpo.skip_zero_variance) on and off, rollouts and wall time
to reach a held-out reward.

Setting, chosen so that prompts repeat and many get solved: a JSONL of --prompts fixed demo
prompts (level --level, the built-in task's own generator) trained for --steps steps of 8
prompts x 8 completions on the warm-started built-in model (one warm-start, cached, shared
by every run), so each prompt comes back every few steps. The held-out reward (eval/reward,
greedy) is measured every --eval-every steps on 64 other demo prompts (eval.dataset). Each
seed runs both arms, off and on, with the same seed (grpo.seed = task.seed), interleaved so
both see the same load; "on" is grpo.skip_zero_variance = true with the knobs' defaults.
Two modes: plain GRPO (every step samples 8 groups: skipping can only make each step's groups
more informative) and dynamic sampling (DAPO-style, the setting GRESO reports on: a step
draws batches of 8 prompts until 4 groups are trainable, at most 4 batches, so a skipped
zero-variance prompt saves the rollouts of the extra batches it would have cost).

Per seed: the target is 90% of the way from the held-out reward after step 1 (the same in
both arms: no streak exists before the first step) to the off arm's final held-out reward,
read off a running mean of two evaluations; "to reach" is the first evaluation where that
mean is at or above the target. Rollouts are the completions sampled up to that step
(groups submitted x G, all batches); wall time is the training steps' own time (time/step_s,
evaluation excluded). The ratio is off / on per seed (> 1: skipping needs fewer), summarised
as the geometric mean over seeds with the paired standard error of the log ratio, and the
final held-out reward as the paired difference on - off with its standard error. A run
that never reaches the target counts at its full budget (and is flagged).

    GRPO_HEALTH_TORCH_THREADS=1 .venv/bin/python bench/skip_prompts.py [--seeds 0 1 2] [--steps 200]
        [--modes plain dynamic] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("GRPO_HEALTH_TORCH_THREADS", "1")

import numpy as np  # noqa: E402
from perf_common import machine, publish, scratch_dir  # noqa: E402

HEADING = "## Skip before sampling"
TARGET_RATIO = 1.5  # >= 1.5x fewer rollouts for the same final held-out reward
SAME_REWARD = 0.02  # a final held-out reward within this of off's counts as the same
TARGET_SHARE = 0.9  # the target: this share of the way from step 1's held-out reward to off's final one
HELD_OUT = 64
# Both arms: a binary outcome gates trainability (a group trains only if exact varies in it), as in
# the verifiable-reward runs GRESO measures; answers are at most 9 characters at level 1.
EXTRA = ["reward.outcome_metric=exact", "grpo.max_new_tokens=12"]


def write_data(folder: Path, n_train: int, level: int) -> tuple[Path, Path]:
    """The training prompts and the held-out ones: demo prompts from two separate streams, no overlap."""
    from grpo_core.tasks.demo import DemoTask
    train = DemoTask(level=level, seed="bench-skip-train").batch(n_train * 4)
    seen, rows = set(), []
    for ex in train:
        if ex["prompt_id"] not in seen and len(rows) < n_train:
            seen.add(ex["prompt_id"])
            rows.append(ex)
    held = [ex for ex in DemoTask(level=level, seed="bench-skip-held").batch(HELD_OUT * 4)
            if ex["prompt_id"] not in seen][:HELD_OUT]
    paths = folder / "train.jsonl", folder / "held_out.jsonl"
    for path, exs in zip(paths, (rows, held)):
        path.write_text("".join(json.dumps({k: e[k] for k in ("prompt", "answer", "source", "max_len")}) + "\n"
                                for e in exs))
    return paths


def run_config(train: Path, held: Path, seed: int, steps: int, skip: bool, dynamic: bool, eval_every: int,
               extra: list[str]):
    from grpo_core.runs.config import DEMO_WEIGHTS
    from grpo_core.tasks.loading import load_config
    sets = ["task.name=jsonl", f"task.dataset={train}", f"eval.dataset={held}", f"eval.every={eval_every}",
            f"eval.prompts={HELD_OUT}", f"grpo.steps={steps}", f"grpo.seed={seed}", f"task.seed={seed}",
            "log.progress=false", "log.checkpoint_every=0", f"grpo.skip_zero_variance={str(skip).lower()}",
            f"grpo.dynamic_sampling={str(dynamic).lower()}"]
    sets.append("reward.weights={" + ", ".join(f"{k} = {v}" for k, v in DEMO_WEIGHTS.items()) + "}")
    return load_config(None, sets + extra)


def one_run(runs: Path, train: Path, held: Path, seed: int, steps: int, skip: bool, dynamic: bool,
            eval_every: int, extra: list[str]) -> dict:
    """One training run; returns its per-step series (rollouts, step seconds, eval reward)."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.train.trainer import Trainer
    cfg = run_config(train, held, seed, steps, skip, dynamic, eval_every, extra)
    rid = f"{'dyn' if dynamic else 'plain'}-{'on' if skip else 'off'}-s{seed}"
    store = RunStore.create(rid, cfg.to_dict(), root=runs)
    t0 = time.perf_counter()
    Trainer(cfg, store, log=lambda m: None).run()
    wall = time.perf_counter() - t0
    w = store.scalars_wide()
    ev = w[names.EVAL_REWARD].dropna()
    out = {"seed": seed, "skip": skip, "dynamic": dynamic, "wall_s": wall,
           "rollouts": (w[names.GROUPS_SUBMITTED] * cfg.grpo.group_size).cumsum().tolist(),
           "step_s": w[names.TIME_STEP].cumsum().tolist(), "steps": w.index.tolist(),
           "eval_steps": ev.index.tolist(), "eval": ev.tolist(),
           "trainable_ratio": float(w[names.TRAINABLE_RATIO].mean()),
           "late_ratio": float(w[names.TRAINABLE_RATIO].iloc[len(w) // 2:].mean()),
           "batches": float(w[names.SAMPLING_BATCHES].mean()),
           "skipped": float(w[names.SKIPPED_PROMPTS].sum()) if names.SKIPPED_PROMPTS in w else 0.0}
    out.update(consistency(store.groups()))
    store.close()
    return out


def consistency(groups) -> dict:
    """What skipping bets on, measured: P(a prompt's next group is zero-variance | its last one was)
    against P(... | its last one was trainable), over consecutive groups of the same prompt."""
    g = groups.sort_values(["step", "group"])
    prev = g.groupby("prompt_id")["trainable"].shift()
    pairs = g.assign(prev=prev).dropna(subset=["prev"])
    zv_now, zv_before = ~pairs["trainable"].astype(bool), ~pairs["prev"].astype(bool)
    return {"p_zv_after_zv": float(zv_now[zv_before].mean()), "p_zv_after_trainable": float(zv_now[~zv_before].mean()),
            "p_zv": float((~g["trainable"].astype(bool)).mean())}


def smoothed(vals: list[float]) -> list[float]:
    return [float(np.mean(vals[max(0, i - 1):i + 1])) for i in range(len(vals))]


def reach(run: dict, target: float) -> tuple[float, float, bool]:
    """(rollouts, training seconds) up to the first evaluation whose smoothed reward >= target."""
    sm = smoothed(run["eval"])
    idx = {s: i for i, s in enumerate(run["steps"])}
    for step, v in zip(run["eval_steps"], sm):
        if v >= target:
            return run["rollouts"][idx[step]], run["step_s"][idx[step]], True
    return run["rollouts"][-1], run["step_s"][-1], False


def compare(off: dict, on: dict) -> dict:
    start = off["eval"][0]
    final_off, final_on = smoothed(off["eval"])[-1], smoothed(on["eval"])[-1]
    target = start + TARGET_SHARE * (final_off - start)
    r_off, t_off, ok_off = reach(off, target)
    r_on, t_on, ok_on = reach(on, target)
    return {"seed": off["seed"], "start": start, "target": target, "final_off": final_off, "final_on": final_on,
            "rollouts_off": r_off, "rollouts_on": r_on, "s_off": t_off, "s_on": t_on, "reached_on": ok_on,
            "ratio": r_off / r_on, "time_ratio": t_off / t_on}


def paired(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of paired per-seed values."""
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()), float(xs.std(ddof=1) / math.sqrt(len(xs))) if len(xs) > 1 else float("nan")


def summarise(mode: str, all_pairs: list[dict], runs: list[dict]) -> list[str]:
    # A seed whose off arm did not rise (final <= step 1's + SAME_REWARD) has no target to reach: left out.
    pairs = [p for p in all_pairs if p["final_off"] > p["start"] + SAME_REWARD] or all_pairs
    lr, lr_se = paired([math.log(p["ratio"]) for p in pairs])
    lt, lt_se = paired([math.log(p["time_ratio"]) for p in pairs])
    dr, dr_se = paired([p["final_on"] - p["final_off"] for p in pairs])
    ratio, t_ratio = math.exp(lr), math.exp(lt)
    same = dr >= -SAME_REWARD
    verdict = "meets" if ratio >= TARGET_RATIO and same else "misses"
    on = [r for r in runs if r["skip"]]
    off = [r for r in runs if not r["skip"]]
    lines = [f"**{mode}**: rollouts to the target, off / on: **{ratio:.2f}x** (geometric mean over {len(pairs)} "
             f"seeds, x/÷ {math.exp(lr_se):.2f} paired SE); training time to it {t_ratio:.2f}x (x/÷ "
             f"{math.exp(lt_se):.2f}); final held-out reward on - off {dr:+.3f} ± {dr_se:.3f}: **{verdict}** the "
             f"target (>= {TARGET_RATIO}x at a final reward no more than {SAME_REWARD} below off's).",
             "",
             "| seed | held-out after step 1 | target | final off / on | rollouts to target off / on | "
             "training s to target off / on | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in all_pairs:
        flag = ("" if p["reached_on"] else " (on never reached it)") + ("" if p in pairs else " (off did not rise: left out)")
        lines.append(f"| {p['seed']} | {p['start']:.3f} | {p['target']:.3f} | {p['final_off']:.3f} / "
                     f"{p['final_on']:.3f} | {p['rollouts_off']:,.0f} / {p['rollouts_on']:,.0f}{flag} | "
                     f"{p['s_off']:.1f} / {p['s_on']:.1f} | {p['ratio']:.2f}x |")
    lines += ["", f"Mean over seeds, off / on: trainable ratio {np.mean([r['trainable_ratio'] for r in off]):.2f} / "
              f"{np.mean([r['trainable_ratio'] for r in on]):.2f} (second half of the run "
              f"{np.mean([r['late_ratio'] for r in off]):.2f} / {np.mean([r['late_ratio'] for r in on]):.2f}), "
              f"prompt batches per step {np.mean([r['batches'] for r in off]):.2f} / "
              f"{np.mean([r['batches'] for r in on]):.2f}, rollouts in the whole run "
              f"{np.mean([r['rollouts'][-1] for r in off]):,.0f} / {np.mean([r['rollouts'][-1] for r in on]):,.0f}, "
              f"prompts skipped per run (on) {np.mean([r['skipped'] for r in on]):,.0f}, whole run wall time "
              f"{np.mean([r['wall_s'] for r in off]):.0f} s / {np.mean([r['wall_s'] for r in on]):.0f} s.", "",
              "What skipping bets on, measured on the off runs (consecutive groups of the same prompt): P(zero-variance "
              f"| its last group was zero-variance) {np.mean([r['p_zv_after_zv'] for r in off]):.2f}, P(zero-variance | "
              f"its last group was trainable) {np.mean([r['p_zv_after_trainable'] for r in off]):.2f}, share of "
              f"zero-variance groups {np.mean([r['p_zv'] for r in off]):.2f}.", ""]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=64, help="fixed training prompts in the JSONL")
    ap.add_argument("--level", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="more config overrides for both arms")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--modes", nargs="+", default=["plain", "dynamic"], choices=["plain", "dynamic"])
    ap.add_argument("--json", help="also write every run's series here")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = ap.parse_args()
    start_machine, t_start = machine(), time.time()
    work = scratch_dir("skip-bench-")
    os.environ["GRPO_HEALTH_RUNS_DIR"] = str(work / "runs")
    train, held = write_data(work, args.prompts, args.level)
    runs: dict[str, list[dict]] = {m: [] for m in args.modes}
    for mode in args.modes:
        for seed in args.seeds:
            for skip in (False, True):
                r = one_run(work / "runs", train, held, seed, args.steps, skip, mode == "dynamic", args.eval_every,
                            EXTRA + args.set)
                runs[mode].append(r)
                print(f"{mode} seed {seed} skip {'on' if skip else 'off'}: eval {[round(x, 2) for x in r['eval']]}, "
                      f"ratio {r['trainable_ratio']:.2f}, batches {r['batches']:.2f}, "
                      f"rollouts {r['rollouts'][-1]:,.0f}, {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    total = time.time() - t_start
    cmd = ("GRPO_HEALTH_TORCH_THREADS=1 .venv/bin/python bench/skip_prompts.py --seeds " + " ".join(map(str, args.seeds))
           + f" --steps {args.steps} --prompts {args.prompts} --level {args.level} --modes " + " ".join(args.modes)
           + "".join(f" --set {x}" for x in args.set))
    lines = [HEADING, "",
             f"Skipping prompts whose recent groups were zero-variance before sampling them (grpo.skip_zero_variance, "
             f"grpo_core/train/skipping.py; GRESO's rule, keep probability skip_explore ** streak, floored at "
             f"skip_min_explore). A JSONL of {args.prompts} fixed level-{args.level} demo prompts, 8 prompts x 8 "
             f"completions per step, {args.steps} steps, the warm-started built-in model; held-out reward: greedy, "
             f"on {HELD_OUT} other demo prompts, every {args.eval_every} steps. Per seed the target is 90% of the way "
             "from the held-out reward after step 1 to off's final one (running mean of two evaluations); the "
             "script's docstring has the rest.", "",
             f"- Command: `{cmd}`",
             f"- Machine: {start_machine}; load at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}. "
             "Other engineers were running tests on the same 2 cores: the times are of a busy box.",
             f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, whole benchmark {total / 60:.1f} min",
             ""]
    for mode in args.modes:
        rs = runs[mode]
        pairs = [compare(next(r for r in rs if r["seed"] == s and not r["skip"]),
                         next(r for r in rs if r["seed"] == s and r["skip"])) for s in args.seeds]
        lines += summarise({"plain": "Plain GRPO (8 groups every step)",
                            "dynamic": "Dynamic sampling (up to 4 batches until 4 groups are trainable)"}[mode],
                           pairs, rs)
    publish(HEADING, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
