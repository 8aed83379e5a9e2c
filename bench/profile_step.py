"""Where the time of a GRPO step goes, on the real loop (`Trainer.run()`, demo config).

Each stage is wrapped with a timer (no profiler in the timed runs: cProfile's per-call cost
would inflate the Python-heavy stages), the loop runs --steps steps after --warmup, and every
step's interval (log_step end to log_step end: the whole loop) is split into:

  floor    sampling pass (trainer.sample_tokens) + one forward/backward/update (train_on)
  else     prompt tokenisation + decoding, scoring, health (group stats, advantages, step
           scalars), alerts + curriculum, store write (Trainer.log_step), control polling,
           autopilot, and the rest (Python glue, pandas frames of the step)

Target: everything outside the floor < 10% of the step. Ablations (--ablate) run in the same
process in alternating segments, so a shared box's load hits both alike:

  sampler   the sampling loop vs `model.generate` (before: 64 prompt rows prefilled)
  shared    the shared-prompt forward/backward vs one forward over all rows
  threads   1 vs 2 torch threads

    .venv/bin/python bench/profile_step.py [--steps 40] [--ablate sampler,shared,threads]
        [--cprofile 25] [--no-write]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("GRPO_HEALTH_TORCH_THREADS", "1")

import torch  # noqa: E402
from perf_common import machine, summary, write_section  # noqa: E402

HEADING = "## Where the time goes"
TARGET_SHARE = 0.10
FLOOR = ("sampling pass", "forward/backward/update")
STORE_STAGE = "store write (log_step)"
ABLATE = "sampler,shared,threads"


class Timers:
    """Accumulated seconds per stage; `wrap` times a function or method in place."""

    def __init__(self):
        self.acc = defaultdict(float)
        self.undo = []
        self.inner = {}  # (owner, attr) -> the function the timer calls (an ablation swaps it)

    def wrap(self, owner, attr: str, stage: str):
        fn = getattr(owner, attr)
        acc, inner, key = self.acc, self.inner, (id(owner), attr)
        inner[key] = fn

        def timed(*a, **kw):
            t = time.perf_counter()
            try:
                return inner[key](*a, **kw)
            finally:
                acc[stage] += time.perf_counter() - t
        setattr(owner, attr, timed)
        self.undo.append((owner, attr, fn))

    def swap(self, owner, attr: str, fn):
        """Replace the timed function (returns the one it replaced)."""
        key = (id(owner), attr)
        old, self.inner[key] = self.inner[key], fn
        return old

    def restore(self):
        for owner, attr, fn in reversed(self.undo):
            setattr(owner, attr, fn)


def reference_sample_tokens(model, prompt_ids, prompt_mask, group_size, *, max_new_tokens, eos_ids, pad_id,
                            temperature=1.0, top_p=1.0, suppress_ids=None):
    """What the trainer did before: one `generate` call over P*G rows."""
    out = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, do_sample=True, temperature=temperature,
                         top_p=top_p, top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=group_size,
                         use_cache=True, suppress_tokens=suppress_ids or None, pad_token_id=pad_id,
                         eos_token_id=eos_ids)
    return out[:, prompt_ids.shape[1]:]


def make_trainer(runs_dir: str, steps: int, overrides: list[str] = ()):
    """The demo run's trainer (overrides: `section.key=value` strings, as `--set` takes them)."""
    from grpo_core.runs.config import validate
    from grpo_core.runs.locations import new_run_id
    from grpo_core.runs.store import RunStore
    from grpo_core.tasks.loading import load_config
    from grpo_core.train.models import set_threads
    from grpo_core.train.trainer import Trainer
    cfg = load_config(None, list(overrides))
    cfg.grpo.steps = steps
    cfg.log.progress, cfg.log.checkpoint_every = False, 0
    cfg = validate(cfg)
    set_threads(cfg)
    store = RunStore.create(new_run_id("profile"), cfg.to_dict(), root=runs_dir)
    return Trainer(cfg, store, log=lambda m: None)


def instrument(tr, timers: Timers):
    """Stage timers on the functions the loop calls (looked up at call time, so patching the
    module attribute is enough)."""
    from grpo_core.analysis import step_stats
    from grpo_core.tasks.rewards import CompositeReward
    from grpo_core.train import grpo
    timers.wrap(grpo, "sample_tokens", "sampling pass")
    timers.wrap(grpo, "rollout", "_rollout")  # minus the sampling pass = tokenise + decode
    timers.wrap(grpo, "train_on", "forward/backward/update")
    timers.wrap(CompositeReward, "score", "scoring")
    for fn in ("group_stats", "step_scalars"):
        timers.wrap(step_stats, fn, "health")
    timers.wrap(grpo, "advantages", "health")
    timers.wrap(tr.alerts, "new_alerts", "alerts + curriculum")
    timers.wrap(tr.curriculum, "after_step", "alerts + curriculum")
    timers.wrap(tr, "log_step", STORE_STAGE)
    timers.wrap(tr, "poll_control", "control polling")
    timers.wrap(tr, "run_autopilot", "autopilot")


def run_segment(tr, n: int, timers: Timers) -> list[dict]:
    """n more steps of the real loop; per-step stage deltas for the n - 1 intervals inside it."""
    snaps = []
    log_step = tr.log_step

    def tick(*a, **kw):
        out = log_step(*a, **kw)
        snaps.append((time.perf_counter(), dict(timers.acc)))
        return out
    tr.log_step = tick
    tr.cfg.grpo.steps = tr.step + n
    close = tr.close_writer

    end_commit = []

    def close_writer(*a, **kw):
        t = time.perf_counter()
        if tr.writer is not None:
            tr.writer.flush()  # the segment's kept steps (batched commits): a store write the loop pays
        end_commit.append(time.perf_counter() - t)
        return close(*a, **kw)
    tr.close_writer = close_writer
    try:
        tr.run()
    finally:
        tr.log_step = log_step
        tr.close_writer = close
    # The commit at the segment's end comes after its last interval: spread it over the intervals,
    # as the commits of a run are spread over its steps (a segment commits more often than a run).
    extra = sum(end_commit) / max(len(snaps) - 1, 1)
    rows = []
    for (t0, a0), (t1, a1) in zip(snaps, snaps[1:]):
        d = {k: a1.get(k, 0.0) - a0.get(k, 0.0) for k in a1}
        d["tokenise + decode"] = d.pop("_rollout", 0.0) - d.get("sampling pass", 0.0)
        d[STORE_STAGE] = d.get(STORE_STAGE, 0.0) + extra
        d["step"] = t1 - t0 + extra
        d["rest (glue, frames)"] = d["step"] - sum(v for k, v in d.items() if k != "step")
        rows.append(d)
    return rows


def variants(ablate: list[str], timers: Timers, tr):
    """(name, setup, teardown) per variant; 'current' always first. Applied after `instrument`,
    so the stage timers still time the swapped-in function."""
    from grpo_core.train import grpo
    out = [("current", lambda: None, lambda: None)]
    if "sampler" in ablate:
        cur = timers.inner[(id(grpo), "sample_tokens")]
        out.append(("model.generate over P*G rows (before)",
                    lambda: timers.swap(grpo, "sample_tokens", reference_sample_tokens),
                    lambda: timers.swap(grpo, "sample_tokens", cur)))
    if "shared" in ablate:
        cur_lp = grpo.token_logprobs

        def full(*a, **kw):
            kw["group_size"] = 1
            return cur_lp(*a, **kw)
        out.append(("one forward over all rows (before)",
                    lambda: setattr(grpo, "token_logprobs", full), lambda: setattr(grpo, "token_logprobs", cur_lp)))
    if "threads" in ablate:
        n0 = torch.get_num_threads()
        out.append(("2 torch threads instead of 1", lambda: torch.set_num_threads(2),
                    lambda: torch.set_num_threads(n0)))
    return out


def cprofile_top(tr, n_steps: int, top: int) -> str:
    pr = cProfile.Profile()
    tr.cfg.grpo.steps = tr.step + n_steps
    pr.enable()
    tr.run()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--segment", type=int, default=5, help="steps per alternating segment")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ablate", default=ABLATE)
    ap.add_argument("--cprofile", type=int, default=0, help="also print the top-N functions by self time")
    ap.add_argument("--runs-dir", default=os.path.join(tempfile.gettempdir(), "grpo-bench-runs"))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    ablate = [a for a in args.ablate.split(",") if a]

    tr = make_trainer(args.runs_dir, args.warmup)
    tr.run()  # warm-up (first-call allocations)
    timers = Timers()
    instrument(tr, timers)
    vs = variants(ablate, timers, tr)
    rows = {name: [] for name, _, _ in vs}
    segs = max(1, -(-args.steps // (args.segment - 1)))
    for _ in range(segs):
        for name, setup, teardown in vs:
            setup()
            try:
                rows[name] += run_segment(tr, args.segment, timers)
            finally:
                teardown()
    timers.restore()
    prof = cprofile_top(tr, 10, args.cprofile) if args.cprofile else ""

    cur = rows["current"]
    stages = [k for k in cur[0] if k != "step"]
    step = summary([r["step"] for r in cur])
    floor = [sum(r.get(k, 0.0) for k in FLOOR) for r in cur]
    else_share = [1 - f / r["step"] for f, r in zip(floor, cur)]
    es = summary(else_share)
    verdict = "meets" if es["median"] < TARGET_SHARE else "MISSES"
    lines = [
        HEADING, "",
        "One step of the real loop (`Trainer.run()`, demo config: 8 prompts x 8 completions, max 16 new "
        "tokens, built-in model), split by stage timers (no profiler in the timed runs). The floor is one "
        "sampling pass plus one forward/backward/update; everything else should cost < 10% of the step.",
        "",
        f"- Command: `GRPO_HEALTH_TORCH_THREADS=1 .venv/bin/python bench/profile_step.py --steps {args.steps}"
        f"{' --ablate ' + args.ablate if args.ablate != ABLATE else ''}`",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M %Z')}; {len(cur)} steps per variant in alternating segments "
        f"of {args.segment}",
        f"- Target: outside the floor < {TARGET_SHARE:.0%} of the step. Result: median {es['median']:.1%} "
        f"(p25-p75 {es['p25']:.1%}-{es['p75']:.1%}): **{verdict}**" + (
            "" if verdict == "meets" else "; what limits it: the store write's CPU time (RunStore.log_step) and "
            "the Python between the two torch passes (tokenise + decode, the step's frames)") + ".",
        "",
        "| stage | median ms/step | p25-p75 ms | share of the median step |",
        "| --- | --- | --- | --- |",
    ]
    for k in sorted(stages, key=lambda k: -statistics.median(r.get(k, 0.0) for r in cur)):
        s = summary([r.get(k, 0.0) for r in cur])
        tag = " (floor)" if k in FLOOR else ""
        lines.append(f"| {k}{tag} | {s['median'] * 1000:.1f} | {s['p25'] * 1000:.1f}-{s['p75'] * 1000:.1f} | "
                     f"{s['median'] / step['median']:.1%} |")
    lines.append(f"| **whole step** | **{step['median'] * 1000:.1f}** | {step['p25'] * 1000:.1f}-"
                 f"{step['p75'] * 1000:.1f} | 100% |")
    outside = sum(statistics.median(r.get(k, 0.0) for r in cur) for k in stages if k not in FLOOR)
    lines += ["", f"Sum of the per-stage medians outside the floor: {outside * 1000:.1f} ms = "
              f"{outside / step['median']:.1%} of the median step. The per-step share above is the stricter reading "
              "(its median over steps); on a loaded box the short Python stages between the two torch passes are "
              "the ones a preemption lands in, which is what widens their p75."]
    store_mean = statistics.mean(r.get(STORE_STAGE, 0.0) for r in cur)
    lines += ["", f"The store write commits the steps of each `log.commit_every_s` ({tr.cfg.log.commit_every_s:g} s) "
              f"together; each segment here is a run of its own, whose kept steps are committed when it ends, and "
              f"that commit is spread over the segment's steps (a run commits less often). Its mean is "
              f"{store_mean * 1000:.2f} ms per step ({store_mean / step['median']:.1%} of the median step). Averaged "
              f"over steps, outside the floor is {statistics.mean(else_share):.1%}."]
    if len(vs) > 1:
        lines += ["", "Ablations (same process, alternating segments; ratio of medians, the step and the stage it "
                  "changes):", "", "| variant | median s/step | vs current | sampling pass ms | "
                  "forward/backward ms | store write ms | outside the floor |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, _, _ in vs:
            r = rows[name]
            s = statistics.median(x["step"] for x in r)
            lines.append(f"| {name} | {s:.3f} | {s / step['median']:.2f}x | "
                         f"{statistics.median(x.get('sampling pass', 0) for x in r) * 1000:.0f} | "
                         f"{statistics.median(x.get('forward/backward/update', 0) for x in r) * 1000:.0f} | "
                         f"{statistics.median(x.get(STORE_STAGE, 0) for x in r) * 1000:.1f} | "
                         f"{statistics.median(1 - sum(x.get(k, 0.0) for k in FLOOR) / x['step'] for x in r):.1%} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if prof:
        print(prof)
    if not args.no_write:
        write_section(HEADING, text)
        print(f"wrote {HEADING!r} in docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
