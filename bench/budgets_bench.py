"""Benchmark: per-prompt budgets (grpo.budget_pilot) against uniform G at the same rollout budget:
rollouts to reach a held-out reward, and the final held-out reward.

Setting, chosen so that prompt difficulty differs and prompts repeat (so a prompt's history
matters): a JSONL of --prompts fixed demo prompts, an equal share from each of --levels (the
built-in task's own generator: level 1 is one source and soon always solved, level 3 is three
sources with one- or two-word values and rarely solved early, level 2 is in between), trained
for --steps steps of 8 prompts on the built-in model warm-started on those prompts (one
warm-start per seed, cached, shared by both arms). The reward is the binary verifiable one of
the budget papers' setting (RLVR): exact = 1 for the right answer with its citation, else 0
(reward.weights = {exact = 1}, reward.outcome_metric = exact). With the demo's composite
reward the held-out reward plateaued after a rise of 0.10-0.18 (under the validity line in 2
of 3 seeds; docs/benchmarks.md says so), with exact alone it rises 0.20-0.29. The uniform arm
samples 8 completions per prompt; the budgets arm samples a pilot of --pilot per prompt and
commits the rest of the same 8 x 8 completions by predicted signal (grpo_core/train/budgets.py),
up to --max-group per group, to prompts whose signal is at least --min-signal, and does not
sample what no such prompt can take. The held-out reward (eval/reward) is measured every
--eval-every steps on --held-out other prompts of the same mix (eval.dataset), EVAL_SAMPLES
completions per prompt sampled at the training temperature from a fixed seed: the policy GRPO
trains is the sampling one, and a greedy held-out reward barely moves here (the warm-started
model's greedy answer is already what sharpening converges to: +0.045 in 600 steps on seed 0
with 1,024 training prompts and the composite reward, against +0.185 sampled).

Per seed (paired: both arms share grpo.seed = task.seed, the warm-start and the data): the
target is 90% of the way from the held-out reward after step 1 to the uniform arm's final one,
read off a running mean of two evaluations; "to reach" is the first evaluation where that mean
is at or above the target, and its rollouts are the completions sampled up to that step
(uniform: groups x 8; budgets: data/budget/rollouts, pilots and commits). A run that never
reaches the target counts at its full budget (and is flagged). The ratio is uniform / budgets
(> 1: budgets need fewer), summarised as the geometric mean over seeds with the paired standard
error of the log ratio; the final held-out reward as the paired difference budgets - uniform.
Validity: the uniform arm's held-out reward must rise by >= 0.15 (final smoothed - after step
1) in every seed, else learning is not real within the budget and the script says the
benchmark is invalid. The two arms of a seed run as two processes side by side.

    GRPO_HEALTH_TORCH_THREADS=1 .venv/bin/python bench/budgets_bench.py [--seeds 0 1 2 3 4] [--steps 1200]
        [--levels 1 2 3] [--min-signal 0.25] [--workers 2] [--no-write]
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
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

HEADING = "## Per-prompt budgets"
TARGET_RATIO = 1.5  # >= 1.5x fewer rollouts ...
SAME_REWARD = 0.02  # ... at a final held-out reward no more than this below uniform's
MIN_RISE = 0.15  # the uniform arm's held-out reward must rise this much in every seed: else invalid
TARGET_SHARE = 0.9  # the target: this share of the way from step 1's held-out reward to uniform's final one
PROMPTS_PER_STEP, GROUP = 8, 8
EVAL_SAMPLES = 4  # held-out completions per prompt, sampled (greedy barely moves: see the docstring)
EXTRA = ["reward.outcome_metric=exact", "reward.weights={exact = 1.0}", "grpo.max_new_tokens=16", f"grpo.prompts_per_step={PROMPTS_PER_STEP}",
         f"grpo.group_size={GROUP}", f"eval.samples={EVAL_SAMPLES}"]


def write_data(folder: Path, n_train: int, n_held: int, levels: list[int]) -> tuple[Path, Path]:
    """Training and held-out prompts, the same share from each level, from separate streams, no overlap."""
    from grpo_core.tasks.demo import DemoTask
    train, held, seen = [], [], set()
    for level in levels:
        for rows, n, stream in ((train, n_train, "train"), (held, n_held, "held")):
            want = n // len(levels) + (levels.index(level) < n % len(levels))
            got = 0
            for ex in DemoTask(level=level, seed=f"bench-budgets-{stream}-{level}").batch(want * 8):
                if got < want and ex["prompt_id"] not in seen:
                    seen.add(ex["prompt_id"])
                    rows.append(ex)
                    got += 1
    paths = folder / "train.jsonl", folder / "held_out.jsonl"
    for path, exs in zip(paths, (train, held)):
        path.write_text("".join(json.dumps({k: e[k] for k in ("prompt", "answer", "source", "max_len")}) + "\n"
                                for e in exs))
    return paths


def run_config(data: tuple[Path, Path, int], seed: int, steps: int, pilot: int, eval_every: int, extra: list[str]):
    from grpo_core.tasks.loading import load_config
    train, held, n_held = data
    sets = ["task.name=jsonl", f"task.dataset={train}", f"eval.dataset={held}", f"eval.every={eval_every}",
            f"eval.prompts={n_held}", f"grpo.steps={steps}", f"grpo.seed={seed}", f"task.seed={seed}",
            "log.progress=false", "log.checkpoint_every=0", f"grpo.budget_pilot={pilot}"]
    return load_config(None, sets + extra)


def warm(job: tuple) -> float:
    """Warm-start (and cache) one seed's built-in model before its two arms start side by side."""
    from grpo_core.tasks import make_task
    from grpo_core.train import models
    runs, data, seed, extra = job
    models.set_threads()  # $GRPO_HEALTH_TORCH_THREADS: a spawned worker is not the CLI, which sets it
    cfg = run_config(data, seed, 1, 0, 0, extra)
    t0 = time.perf_counter()
    models.load_policy(cfg.model, make_task(cfg), runs, seed=seed)
    return time.perf_counter() - t0


def one_run(job: tuple) -> dict:
    """One training run; returns its per-step series (rollouts sampled, eval reward) and counts."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.train import models
    from grpo_core.train.trainer import Trainer
    runs, data, seed, steps, pilot, eval_every, extra = job
    models.set_threads()
    cfg = run_config(data, seed, steps, pilot, eval_every, extra)
    store = RunStore.create(f"{'budgets' if pilot else 'uniform'}-s{seed}", cfg.to_dict(), root=runs)
    t0 = time.perf_counter()
    Trainer(cfg, store, log=lambda m: None).run()
    wall = time.perf_counter() - t0
    w = store.scalars_wide()
    ev = w[names.EVAL_REWARD].dropna()
    sampled = w[names.BUDGET_ROLLOUTS] if pilot else w[names.GROUPS_SUBMITTED] * cfg.grpo.group_size
    out = {"seed": seed, "pilot": pilot, "wall_s": wall, "rollouts": sampled.cumsum().tolist(),
           "steps": w.index.tolist(), "eval_steps": ev.index.tolist(), "eval": ev.tolist(),
           "trainable_ratio": float(w[names.TRAINABLE_RATIO].mean()),
           "late_ratio": float(w[names.TRAINABLE_RATIO].iloc[len(w) // 2:].mean()),
           "trainable_groups": float(w[names.GROUPS_TRAINABLE].sum()) if names.GROUPS_TRAINABLE in w else float("nan"),
           "solved": float(w[names.GROUPS_SOLVED].sum()) if names.GROUPS_SOLVED in w else float("nan"),
           "none_solved": float(w[names.GROUPS_UNSOLVED].sum()) if names.GROUPS_UNSOLVED in w else float("nan")}
    out.update(allocation(store.groups(), pilot))
    store.close()
    return out


def allocation(groups, pilot: int) -> dict:
    """Where the rollouts went: the share in trainable groups, the groups left at their pilot, the largest."""
    ok = groups["trainable"].astype(bool)
    return {"useful": float(groups.loc[ok, "size"].sum() / groups["size"].sum()),
            "pilot_only": float((groups["size"] == pilot).mean()) if pilot else 0.0,
            "biggest": float((groups["size"] == groups["size"].max()).mean()) if pilot else 1.0}


def smoothed(vals: list[float]) -> list[float]:
    return [float(np.mean(vals[max(0, i - 1):i + 1])) for i in range(len(vals))]


def reach(run: dict, target: float) -> tuple[float, bool]:
    """Rollouts sampled up to the first evaluation whose smoothed reward >= target."""
    idx = {s: i for i, s in enumerate(run["steps"])}
    for step, v in zip(run["eval_steps"], smoothed(run["eval"])):
        if v >= target:
            return run["rollouts"][idx[step]], True
    return run["rollouts"][-1], False


def compare(uni: dict, bud: dict) -> dict:
    start = uni["eval"][0]
    final_uni, final_bud = smoothed(uni["eval"])[-1], smoothed(bud["eval"])[-1]
    target = start + TARGET_SHARE * (final_uni - start)
    r_uni, ok_uni = reach(uni, target)
    r_bud, ok_bud = reach(bud, target)
    return {"seed": uni["seed"], "start": start, "target": target, "final_uni": final_uni, "final_bud": final_bud,
            "rise": final_uni - start, "rollouts_uni": r_uni, "rollouts_bud": r_bud, "reached_bud": ok_bud,
            "ratio": r_uni / r_bud}


def paired(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of paired per-seed values."""
    xs = np.asarray(xs, dtype=float)
    return float(xs.mean()), float(xs.std(ddof=1) / math.sqrt(len(xs))) if len(xs) > 1 else float("nan")


def summarise(pairs: list[dict], runs: list[dict]) -> list[str]:
    lr, lr_se = paired([math.log(p["ratio"]) for p in pairs])
    dr, dr_se = paired([p["final_bud"] - p["final_uni"] for p in pairs])
    ratio = math.exp(lr)
    valid = all(p["rise"] >= MIN_RISE for p in pairs)
    verdict = ("**invalid**: the uniform arm's held-out reward rose by less than "
               f"{MIN_RISE} in at least one seed, so learning is not real within this budget and the ratio "
               "measures noise" if not valid else
               "**meets**" if ratio >= TARGET_RATIO and dr >= -SAME_REWARD else "**misses**")
    uni = [r for r in runs if not r["pilot"]]
    bud = [r for r in runs if r["pilot"]]
    mean = lambda rs, k: float(np.mean([r[k] for r in rs]))  # noqa: E731
    lines = [f"Rollouts to the target, uniform / budgets: **{ratio:.2f}x** (geometric mean over {len(pairs)} seeds, "
             f"x/÷ {math.exp(lr_se):.2f} paired SE; per seed {min(p['ratio'] for p in pairs):.2f}x to "
             f"{max(p['ratio'] for p in pairs):.2f}x); final held-out reward budgets - uniform {dr:+.3f} ± "
             f"{dr_se:.3f}: {verdict} (target: >= {TARGET_RATIO}x at a final reward no more than {SAME_REWARD} "
             f"below uniform's; valid when uniform rises >= {MIN_RISE} in every seed).",
             "",
             "| seed | held-out after step 1 | uniform's rise | target | final uniform / budgets | "
             "rollouts to target uniform / budgets | ratio |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for p in pairs:
        flag = "" if p["reached_bud"] else " (budgets never reached it)"
        lines.append(f"| {p['seed']} | {p['start']:.3f} | {p['rise']:+.3f}{'' if p['rise'] >= MIN_RISE else ' (< 0.15)'}"
                     f" | {p['target']:.3f} | {p['final_uni']:.3f} / {p['final_bud']:.3f} | "
                     f"{p['rollouts_uni']:,.0f} / {p['rollouts_bud']:,.0f}{flag} | {p['ratio']:.2f}x |")
    lines += ["", f"Mean over seeds, uniform / budgets: trainable ratio {mean(uni, 'trainable_ratio'):.2f} / "
              f"{mean(bud, 'trainable_ratio'):.2f} (second half of the run {mean(uni, 'late_ratio'):.2f} / "
              f"{mean(bud, 'late_ratio'):.2f}), trainable groups per run {mean(uni, 'trainable_groups'):,.0f} / "
              f"{mean(bud, 'trainable_groups'):,.0f}, all-solved groups {mean(uni, 'solved'):,.0f} / "
              f"{mean(bud, 'solved'):,.0f}, none-solved groups {mean(uni, 'none_solved'):,.0f} / "
              f"{mean(bud, 'none_solved'):,.0f}, rollouts in the whole run {np.mean([r['rollouts'][-1] for r in uni]):,.0f}"
              f" / {np.mean([r['rollouts'][-1] for r in bud]):,.0f}, wall time per run {mean(uni, 'wall_s'):.0f} s / "
              f"{mean(bud, 'wall_s'):.0f} s.", "",
              f"Where the rollouts went, uniform / budgets: share in trainable groups {mean(uni, 'useful'):.2f} / "
              f"{mean(bud, 'useful'):.2f}; budgets: groups left at their pilot {mean(bud, 'pilot_only'):.0%}, groups at "
              f"the largest size {mean(bud, 'biggest'):.0%}.", ""]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--prompts", type=int, default=256, help="fixed training prompts in the JSONL")
    ap.add_argument("--held-out", type=int, default=128, help="held-out prompts, the same mix of levels")
    ap.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--pilot", type=int, default=2, help="grpo.budget_pilot of the budgets arm")
    ap.add_argument("--max-group", type=int, default=8, help="grpo.budget_max_group of the budgets arm (0: 2 x G)")
    ap.add_argument("--min-signal", type=float, default=0.25, help="grpo.budget_min_signal of the budgets arm")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--set", action="append", default=[], help="more config overrides for both arms")
    ap.add_argument("--workers", type=int, default=2, help="runs side by side")
    ap.add_argument("--json", help="also write every run's series here")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = ap.parse_args()
    start_machine, t_start = machine(), time.time()
    work = scratch_dir("budgets-bench-")
    runs_dir = work / "runs"
    os.environ["GRPO_HEALTH_RUNS_DIR"] = str(runs_dir)
    data = (*write_data(work, args.prompts, args.held_out, args.levels), args.held_out)
    extra = EXTRA + args.set
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        pool.map(warm, [(runs_dir, data, s, extra) for s in args.seeds])
        arm = [f"grpo.budget_max_group={args.max_group}", f"grpo.budget_min_signal={args.min_signal}"]
        jobs = [(runs_dir, data, s, args.steps, pilot, args.eval_every, extra + (arm if pilot else []))
                for s in args.seeds for pilot in (0, args.pilot)]
        runs = []
        for r in pool.imap(one_run, jobs):
            runs.append(r)
            print(f"seed {r['seed']} {'budgets' if r['pilot'] else 'uniform'}: eval "
                  f"{[round(x, 2) for x in r['eval']]}, ratio {r['trainable_ratio']:.2f}, "
                  f"rollouts {r['rollouts'][-1]:,.0f}, {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    pairs = [compare(next(r for r in runs if r["seed"] == s and not r["pilot"]),
                     next(r for r in runs if r["seed"] == s and r["pilot"])) for s in args.seeds]
    total = time.time() - t_start
    cmd = ("GRPO_HEALTH_TORCH_THREADS=1 .venv/bin/python bench/budgets_bench.py --seeds " + " ".join(map(str, args.seeds))
           + f" --steps {args.steps} --prompts {args.prompts} --held-out {args.held_out} --levels "
           + " ".join(map(str, args.levels)) + f" --pilot {args.pilot} --max-group {args.max_group} --min-signal "
           f"{args.min_signal:g} --eval-every {args.eval_every}"
           + "".join(f" --set {x}" for x in args.set))
    lines = [HEADING, "",
             f"Per-prompt budgets (grpo.budget_pilot = {args.pilot}, grpo_core/train/budgets.py: a pilot per prompt, "
             f"the rest of the step's {PROMPTS_PER_STEP} x {GROUP} completions committed by predicted signal, at most "
             f"{args.max_group or 2 * GROUP} a group, to prompts whose signal is at least {args.min_signal:g}) against "
             f"uniform G = {GROUP}. A JSONL of {args.prompts} fixed demo prompts, an equal share from levels "
             f"{', '.join(map(str, args.levels))} (some soon always solved, some never, some between), "
             f"{PROMPTS_PER_STEP} prompts a step, {args.steps} steps, the built-in model warm-started on them; "
             f"the binary reward exact (1 for the right answer with its citation, else 0), also the outcome that gates "
             f"trainability; held-out reward: {EVAL_SAMPLES} sampled completions each (temperature 1) on "
             f"{args.held_out} other prompts of the same mix, "
             f"every {args.eval_every} steps. Per seed the target is 90% of the way from the held-out reward after "
             "step 1 to uniform's final one (running mean of two evaluations); the script's docstring has the rest.",
             "",
             f"- Command: `{cmd}`",
             f"- Machine: {start_machine}; load at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}. "
             f"Two runs side by side; other engineers were using the same cores.",
             f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, whole benchmark {total / 60:.1f} min",
             ""]
    lines += summarise(pairs, runs)
    publish(HEADING, "\n".join(lines), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
