"""Benchmark: steps/s of one run on 1 rank against the same run on 2 ranks (torchrun, gloo) on this CPU.

The same config and global batch both ways: the built-in model (float32, no warm start) on the
demo task, grpo.prompts_per_step=8, group_size=8, max_new_tokens=32, and a per-completion hash
"noise" reward, so every group has spread and every step samples and trains all 64 rows. One rank
is `python -m grpo_core train`; two are `python -m torch.distributed.run --nproc_per_node 2 -m
grpo_core train` (each rank samples whole groups for 4 of the 8 prompts, one gloo all-reduce of
the gradients per step). Both are started as the CLI starts them, through a thin wrapper (this
file, `--worker`) that only notes when each of rank 0's steps ends: the store keeps per-step
durations, not timestamps. Every process runs one torch thread (OMP_NUM_THREADS=1,
GRPO_HEALTH_TORCH_THREADS=1, as tests/test_torchrun.py starts its jobs). A third job, one process on
half the prompts, is one rank's share of the work with nobody to wait for or exchange with: the
most 2 ranks could reach, were the split free.

Per job, over the steps after --warmup: wall steps/s (rank 0's step ends: everything a step
costs, the store writes and the ranks' step-boundary exchange included), and the medians of the
store's time/step_s, time/generate_s (rank 0's own share), time/train_s (rank 0's micro-batches
and the gradient all-reduce, its wait for the other rank included) and the rest of the step
(scoring, the gather of every rank's scores and any wait for the slower rank in it). --repeats
jobs per arm, the arms' order rotating; the table gives the median over the jobs and their
min-max, and the ratios of 2 ranks to 1 and to the half-prompts job (paired by repetition).
Also whether 1 rank and 2 trained the same groups at each step (the same seeds; float32
round-off may differ).

What it shows: on this 2-core box 2 ranks get a core each where 1 rank uses one thread of one
core, so this is the scaling of the work split (sampling and training halved per rank) against
what the split adds (gloo all-reduce of the gradients, the gathers of scores and settings, two
processes computing at once). What it cannot show: anything about GPUs or NCCL
(bench/gpu_check.py's `ranks` variant runs 2 ranks on one lent GPU), nor a bigger model, where
the all-reduce's share differs. On a shared box the load average moves the figures; it is
printed with them (at the start and at the end). The section "## Data parallel: 1 rank vs 2 on
this CPU" of docs/benchmarks.md is rewritten (--no-write: printed only).

    python bench/ranks_step.py [--steps 30] [--warmup 5] [--repeats 4] [--model 128x4] [--out ranks_step.json]
                               [--no-write]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HEADING = "## Data parallel: 1 rank vs 2 on this CPU"
LIMIT_S = 600  # a bound on one job that hangs, not a guess of how long it takes


def noise(completion: str, example: dict) -> float:
    """A reward in [0, 1) from a hash of the completion: a random model's groups all get a spread."""
    return int(hashlib.sha1(completion.encode()).hexdigest()[:8], 16) / 2**32


# ---- the job: the CLI's train verb, on 1 rank or under torchrun --------------------------------
def worker(stamps: str, argv: list[str]) -> int:
    """`python -m grpo_core train ...` in this process, noting when each of rank 0's steps ends
    (time.perf_counter after Trainer.one_step) into `stamps` (JSON) when it returns."""
    from grpo_core.__main__ import main as grpo_main
    from grpo_core.train.trainer import Trainer
    ends, one_step = [], Trainer.one_step

    def timed(self, *a, **kw):
        out = one_step(self, *a, **kw)
        ends.append(time.perf_counter())
        return out
    Trainer.one_step = timed
    try:
        return grpo_main(argv)
    finally:
        if os.environ.get("RANK", "0") == "0":
            Path(stamps).write_text(json.dumps(ends))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(ranks: int, run_id: str, runs: Path, config: Path, sets: list[str], one_thread: bool = True,
            limit_s: float = LIMIT_S) -> dict:
    """One train job of `ranks` processes (1: the plain CLI; more: torchrun), waited on; killed by
    its process group if it outlives limit_s. Its step ends (rank 0) and whole wall time."""
    stamps = runs.parent / f"{run_id}.stamps.json"
    launcher = [sys.executable] if ranks == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr", "127.0.0.1",
         "--master_port", str(free_port())]
    cmd = launcher + [str(Path(__file__).resolve()), "--worker", str(stamps), "train", "--run-id", run_id,
                      "--runs-dir", str(runs), "--config", str(config)] + [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if one_thread:
        env.update(OMP_NUM_THREADS="1", GRPO_HEALTH_TORCH_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=runs.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit_s)
    finally:
        kill(proc)
    job_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{ranks}-rank job {run_id} exited {proc.returncode}: {out[-3000:]}")
    return {"ends": json.loads(stamps.read_text()), "job_s": job_s}


def kill(proc: subprocess.Popen):
    """The job, if still running: its process group and each rank's. torchrun starts every rank
    in a session of its own, so killing the launcher's group alone leaves the ranks training."""
    if proc.poll() is not None:
        return
    try:
        ranks = [int(pid) for task in Path(f"/proc/{proc.pid}/task").glob("*")
                 for pid in (task / "children").read_text().split()]
    except OSError:  # the launcher ended meanwhile
        ranks = []
    for group in (proc.pid, *ranks):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def step_figures(runs: Path, run_id: str, ends: list[float], warmup: int) -> dict:
    """Wall steps/s and the medians of the store's step times over the steps after `warmup`."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    with RunStore.open(runs / run_id, readonly=True) as store:
        wide = store.scalars_wide(names=[names.TIME_STEP, names.TIME_GENERATE, names.TIME_SCORE, names.TIME_TRAIN,
                                         names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE])
        status = store.get_meta().get("status")
    timed = wide.iloc[warmup:]
    other = timed[names.TIME_STEP] - timed[names.TIME_GENERATE] - timed[names.TIME_TRAIN]
    n = len(ends) - warmup
    return {"status": status, "steps": len(wide), "steps_timed": n,
            "wall_steps_per_s": n / (ends[-1] - ends[warmup - 1]),
            "step_s": float(timed[names.TIME_STEP].median()), "generate_s": float(timed[names.TIME_GENERATE].median()),
            "train_s": float(timed[names.TIME_TRAIN].median()), "other_s": float(other.median()),
            "score_s": float(timed[names.TIME_SCORE].median()),
            "trainable": wide[names.GROUPS_TRAINABLE].astype(int).tolist(),
            "submitted": wide[names.GROUPS_SUBMITTED].astype(int).tolist()}


def write_config(folder: Path, module: str = "ranks_step:noise") -> Path:
    """The reward half of the config (a custom metric needs a file): the noise metric from bench/."""
    path = folder / "config.toml"
    path.write_text(f'[reward]\nweights = {{ noise = 1.0 }}\ncustom = {{ noise = "{module}" }}\n'
                    f'custom_dirs = ["{ROOT / "bench"}"]\n')
    return path


def settings(args, prompts: int) -> list[str]:
    hidden, layers = (int(x) for x in args.model.split("x"))
    return [f"model.hidden_size={hidden}", f"model.num_layers={layers}", f"model.intermediate_size={4 * hidden}",
            "model.num_heads=4", "model.warm_start_steps=0", "model.device=cpu", f"grpo.steps={args.steps}",
            f"grpo.prompts_per_step={prompts}", f"grpo.group_size={args.group_size}",
            f"grpo.max_new_tokens={args.new_tokens}", "grpo.min_group_std=0", "log.progress=false",
            "log.checkpoint_every=0"]


# ---- the comparison ----------------------------------------------------------------------------
# arm: (label, ranks, share of --prompts). "half" is one rank's work on 2 ranks with nobody to wait
# for or exchange with: the most 2 ranks can reach, were the split free.
ARMS = {"one": ("1 rank", 1, 1), "two": ("2 ranks", 2, 1), "half": ("1 rank, half the prompts", 1, 2)}


def measure(args) -> dict:
    """--repeats jobs per arm, the arms' order rotating from one repetition to the next, each a fresh run."""
    from perf_common import machine
    jobs = {arm: [] for arm in ARMS}
    before = machine()
    with tempfile.TemporaryDirectory(prefix="grpo-ranks-bench-") as tmp:
        root = Path(tmp)
        config = write_config(root)
        for rep in range(args.repeats):
            order = list(ARMS)[rep % len(ARMS):] + list(ARMS)[:rep % len(ARMS)]
            for arm in order:
                label, ranks, part = ARMS[arm]
                run_id = f"{arm}-{rep}"
                job = run_job(ranks, run_id, root / "runs", config, settings(args, args.prompts // part))
                figures = step_figures(root / "runs", run_id, job["ends"], args.warmup)
                jobs[arm].append({"repeat": rep, "job_s": job["job_s"], **figures})
                print(f"{label}, repeat {rep}: {figures['wall_steps_per_s']:.2f} steps/s, step "
                      f"{figures['step_s'] * 1000:.0f} ms, job {job['job_s']:.0f} s", file=sys.stderr, flush=True)
    return {"machine": before, "load_after": list(os.getloadavg()), "config": settings(args, args.prompts),
            "jobs": jobs, "summary": summarize(jobs)}


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


FIELDS = ("wall_steps_per_s", "step_s", "generate_s", "train_s", "other_s", "job_s")


def summarize(jobs: dict) -> dict:
    """Per arm: median and min-max over its jobs of each figure; ratios paired by repetition."""
    out = {arm: {f: spread([j[f] for j in js]) for f in FIELDS} for arm, js in jobs.items()}

    def ratio(a: str, b: str, field: str) -> dict:
        return spread([y[field] / x[field] for x, y in zip(jobs[a], jobs[b])])
    out["ratio_steps_per_s_two_to_one"] = ratio("one", "two", "wall_steps_per_s")
    out["ratio_step_s_two_to_one"] = ratio("one", "two", "step_s")
    out["ratio_step_s_two_to_half"] = ratio("half", "two", "step_s")
    out["same_trainable_groups"] = all(x["trainable"] == y["trainable"] for x, y in zip(jobs["one"], jobs["two"]))
    out["trainable_ratio"] = {arm: sum(sum(j["trainable"]) for j in js) / sum(sum(j["submitted"]) for j in js)
                              for arm, js in jobs.items()}
    return out


def cell(s: dict, scale: float = 1000.0, digits: int = 0) -> str:
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'] * scale)} ({f.format(s['min'] * scale)}-{f.format(s['max'] * scale)})"


def table(res: dict) -> str:
    s = res["summary"]
    lines = ["| job | steps/s, wall | time/step_s (ms) | generate (ms) | train (ms) | other (ms) | job incl. "
             "start-up (s) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for arm, (label, _, _) in ARMS.items():
        a = s[arm]
        lines.append(f"| {label} | {cell(a['wall_steps_per_s'], 1, 2)} | {cell(a['step_s'])} | "
                     f"{cell(a['generate_s'])} | {cell(a['train_s'])} | {cell(a['other_s'])} | "
                     f"{cell(a['job_s'], 1, 0)} |")
    lines += ["", f"Paired by repetition: 2 ranks make x{cell(s['ratio_steps_per_s_two_to_one'], 1, 2)} the wall "
              f"steps/s of 1 rank (time/step_s x{cell(s['ratio_step_s_two_to_one'], 1, 2)}); their time/step_s is "
              f"x{cell(s['ratio_step_s_two_to_half'], 1, 2)} that of 1 rank on half the prompts. The same trainable "
              f"groups at every step on 1 rank and 2: {'yes' if s['same_trainable_groups'] else 'no'} (trainable "
              f"ratio {s['trainable_ratio']['one']:.2f} / {s['trainable_ratio']['two']:.2f}).",
              "", "Medians, 2 ranks against the half-prompts job: " + ", ".join(
                  f"{name} {s['two'][f]['median'] * 1000:.0f} ms against {s['half'][f]['median'] * 1000:.0f} ms"
                  for name, f in (("generate", "generate_s"), ("train", "train_s"), ("other", "other_s"))) + "."]
    return "\n".join(lines)


def section(res: dict, command: str) -> str:
    """The docs/benchmarks.md section: the command, machine and config, the table, how to read it."""
    import torch
    a = res["args"]
    hidden, layers, mlp = *a["model"].split("x"), 4 * int(a["model"].split("x")[0])
    load_end = ", ".join(f"{x:.2f}" for x in res["load_after"])
    return f"""{HEADING}

`{command}`. Machine: {res['machine']}; at the end, load average {load_end};
torch {torch.__version__}. The same run as one process (`python -m grpo_core train`) and as a 2-rank
torchrun job (gloo), plus one process on half the prompts (one rank's work on 2, with nobody to wait
for or exchange with: what 2 ranks would reach were the split free). The built-in model (hidden
{hidden}, {layers} layers, MLP {mlp}, float32, no warm start), the demo task, {a['prompts']} prompts x G
{a['group_size']} x {a['new_tokens']} new tokens a step, a per-completion hash reward (every group trains), one
torch thread a process. {a['steps']} steps a job, the first {a['warmup']} left out;
{a['repeats']} jobs per arm, the arms' order
rotating; median over the jobs (min-max). Target: none on CPU; the GPU variant (`bench/gpu_check.py --variants
ranks`) is the one that matters.

{table(res)}

Columns: wall steps/s from rank 0's step ends (all a step costs, the store writes and the ranks'
step-boundary exchange included); the store's time/step_s and its split on rank 0: generate (its
share of the sampling), train (its micro-batches and the gradient all-reduce, waiting for the other
rank included), other (scoring and the gather of every rank's scores, with any wait for the slower
rank). What it shows: each rank gets one of the box's 2 cores where 1 rank runs one thread of one
core, so the ratio is the scaling of the work split (sampling and training halved per rank) against
what the split adds: the gloo all-reduce and gathers (in train and other), and two processes
computing at once on the VM's two vCPUs (in every column: compare 2 ranks' generate, which
exchanges nothing, with the half-prompts job's). What it cannot show: anything about NCCL or GPUs,
a model whose all-reduce weighs more, or more ranks than cores.
"""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:  # a job's process (see worker)
        return worker(argv[1], argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="steps per job")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the figures (>= 1)")
    ap.add_argument("--repeats", type=int, default=4, help="jobs per arm, the arms' order rotating")
    ap.add_argument("--model", default="128x4", help="built-in model HIDDENxLAYERS (MLP 4x hidden, 4 heads)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave docs/benchmarks.md alone")
    args = ap.parse_args(argv)
    if not 1 <= args.warmup < args.steps:
        ap.error("--warmup must be at least 1 and below --steps")
    if args.prompts < 2 or args.prompts % 2:
        ap.error("--prompts must be even: 2 ranks and the half-prompts job split it in two")
    sys.path.insert(0, str(ROOT / "bench"))
    from perf_common import publish
    res = {**measure(args), "args": vars(args)}
    publish(HEADING, section(res, " ".join(["python bench/ranks_step.py", *argv])), write=not args.no_write)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
