"""Benchmark: the native sampler (native_sampling.rollout) against the vLLM engine (vllm_engine.rollout) on CPU, the weight sync's cost, and whole trainer steps with each.

The model: `--model ''` (the default) is the real-architecture Qwen2 of tests/real_model.py
(float32, random init: it almost never samples an eos, so every row runs to its token budget);
`--model smollm2` (or any model.path: a folder, a GGUF) is a real model, exported to a plain
folder for the engine, whose rows end at its eos as they would in a run. The prompts: `--task`'s
(demo or arithmetic), rendered with the chat template, temperature 1, the tokenizer's special
tokens suppressed. Per shape (prompts x completions per prompt x new tokens): completion tokens
per second of a whole rollout (the tokens the rows kept, up to and with their eos), median and
min-max over --repeats rollouts after one warm-up. The weight sync: `VllmEngine.load_weights` of
the full model and of a LoRA model (rank 8, all-linear: merge, push, unmerge), the whole call.

`--train-steps N` also runs the trainer itself N steps per engine (`--train-shape`), each engine
in a process of its own, and reports the store's time/step_s, time/generate_s, time/train_s and
time/weight_sync_s over the steps after the first (which starts the engine), every group given a
reward spread so that every step trains.

The native sampler runs first, before the engine exists: vLLM's CPU backend takes over
`torch.set_num_threads` when it starts. Needs the vLLM venv:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python bench/vllm_sampling.py \
        [--model smollm2] [--task arithmetic] [--shapes 8x4x128 16x8x128] [--repeats 5] \
        [--train-steps 6 --train-shape 8x8x16]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from perf_common import every_group_varies, machine, summary  # noqa: E402

STEP_TIMES = ("time/step_s", "time/generate_s", "time/train_s", "time/weight_sync_s")


def parse_shape(text: str) -> tuple[int, int, int]:
    prompts, group, tokens = (int(x) for x in text.lower().split("x"))
    return prompts, group, tokens


def task_of(name: str):
    from grpo_core.tasks.arithmetic import ArithmeticTask
    from grpo_core.tasks.demo import DemoTask
    return {"demo": lambda: DemoTask(4, seed=0), "arithmetic": lambda: ArithmeticTask(1, seed=0)}[name]()


def inputs(tokenizer, prompts: int, task: str = "demo"):
    from grpo_core.tasks import chat
    examples = task_of(task).batch(prompts)
    return examples, [chat.render(tokenizer, e["prompt"]) for e in examples]


def timed(sample, repeats: int) -> list[float]:
    """Completion tokens per second of each of `repeats` rollouts, after one warm-up."""
    sample()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        roll = sample()
        rates.append(int(roll.completion_mask.sum()) / (time.perf_counter() - t0))
    return rates


def native_rates(model, tokenizer, shapes, repeats: int, task: str) -> dict:
    from grpo_core.train import models, native_sampling
    suppress = models.suppressed_token_ids(tokenizer)
    out = {}
    for prompts, group, tokens in shapes:
        examples, texts = inputs(tokenizer, prompts, task)
        out[(prompts, group, tokens)] = timed(lambda: native_sampling.rollout(
            model, tokenizer, examples, group, max_new_tokens=tokens, suppress_ids=suppress, prompts=texts,
            add_special_tokens=False), repeats)
    return out


def engine_rates(engine, model, tokenizer, shapes, repeats: int, task: str) -> dict:
    from grpo_core.train import models, native_sampling, vllm_engine
    suppress, eos = models.suppressed_token_ids(tokenizer), native_sampling.eos_token_ids(model, tokenizer)
    out = {}
    for prompts, group, tokens in shapes:
        examples, texts = inputs(tokenizer, prompts, task)
        out[(prompts, group, tokens)] = timed(lambda: vllm_engine.rollout(
            engine, tokenizer, examples, group, max_new_tokens=tokens, eos_ids=eos, suppress_ids=suppress,
            prompts=texts, add_special_tokens=False), repeats)
    return out


def sync_seconds(engine, model, repeats: int) -> list[float]:
    engine.load_weights(model)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine.load_weights(model)
        out.append(time.perf_counter() - t0)
    return out


def threads() -> int:
    """The samplers' torch threads: $GRPO_HEALTH_TORCH_THREADS (which the trainer steps' set_threads
    reads too), else every core this process may use."""
    return int(os.environ.get("GRPO_HEALTH_TORCH_THREADS") or len(os.sched_getaffinity(0)))


def load_model(path: str, root: Path):
    """(folder, model, tokenizer): the test Qwen2 for '', else model.path saved as a plain folder
    (the engine loads a folder; a GGUF or shipped name is dequantised first)."""
    from grpo_core.train import models
    if not path:
        from tests.real_model import build
        folder = build(root)
        return (folder, *models.load_pretrained(str(folder), dtype=torch.float32))
    model, tokenizer = models.load_pretrained(path, dtype=torch.float32)
    folder = Path(path)
    if not (folder / "config.json").is_file():
        folder = root / "model"
        models.save_pretrained(model, tokenizer, folder)
    return folder, model, tokenizer


def start_engine(folder: Path, tokenizer, shapes, task: str):
    """The engine as a run would size it (sampling.engine_length and the CPU KV cache for the
    largest shape's rows), for the longest prompt of the largest shape."""
    from grpo_core.train import sampling, vllm_engine
    longest = max(max(vllm_engine.prompt_lengths(tokenizer, inputs(tokenizer, p, task)[1], False))
                  for p, _, _ in shapes)
    length = sampling.engine_length(0, longest, max(t for _, _, t in shapes), vllm_engine.position_limit(folder))
    return vllm_engine.VllmEngine(folder, dtype="float32", max_model_len=length,
                                  kv_sequences=max(p * g for p, g, _ in shapes))


# ---- whole trainer steps, one engine per process -------------------------------------------------
def train_steps(folder: Path, engine: str, task: str, steps: int, shape: str, root: Path) -> dict:
    """Run the trainer `steps` steps with `engine` in this process: each STEP_TIMES scalar and the
    mean completion length per step after the first."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.tasks.loading import load_config
    from grpo_core.train.models import set_threads
    from grpo_core.train.trainer import Trainer
    prompts, group, tokens = parse_shape(shape)
    cfg = load_config(None, [f"model.path={folder}", "model.dtype=float32", f"grpo.engine={engine}",
                             f"task.name={task}", f"grpo.steps={steps}", f"grpo.prompts_per_step={prompts}",
                             f"grpo.group_size={group}", f"grpo.max_new_tokens={tokens}", "grpo.min_group_std=0",
                             "log.progress=false", "log.checkpoint_every=0"])
    set_threads(cfg)
    store = RunStore.create(f"bench-{engine}", cfg.to_dict(), root=root / "runs")
    tr = Trainer(cfg, store, log=lambda m: None)
    every_group_varies(tr)
    tr.run()
    wide = store.scalars_wide().iloc[1:]
    store.close()
    out = {name: wide[name].dropna().tolist() for name in STEP_TIMES if name in wide.columns}
    out["length"] = wide[names.COMPLETION_MEAN_LENGTH].dropna().tolist()
    out["threads"] = torch.get_num_threads()
    return out


def step_results(folder: Path, args) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for engine in ("native", "vllm"):
            out = subprocess.run([sys.executable, __file__, "--child-engine", engine, "--child-folder", str(folder),
                                  "--child-root", root, "--task", args.task, "--train-steps", str(args.train_steps),
                                  "--train-shape", args.train_shape], capture_output=True, text=True, env=env,
                                 cwd=ROOT, check=True)
            results[engine] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


# ---- the report ------------------------------------------------------------------------------------
def cell(values: list[float], scale: float = 1000.0, unit: str = " ms") -> str:
    s = summary(values)
    return f"{s['median'] * scale:.0f}{unit} ({s['min'] * scale:.0f}-{s['max'] * scale:.0f})"


def header(cfg, params: int, vllm_version: str, label: str) -> list[str]:
    return [f"`{' '.join(['VLLM_ENABLE_V1_MULTIPROCESSING=0', '.venv-vllm/bin/python', *sys.argv])}`", "",
            f"Machine: {machine()}; torch {torch.__version__} ({threads()} threads), vLLM {vllm_version}.",
            f"Model: {label}: {cfg.model_type} hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, vocabulary "
            f"{cfg.vocab_size}, {params / 1e6:.2f}M parameters, float32.", ""]


def sampling_table(native: dict, vllm: dict, sync_full, sync_lora) -> list[str]:
    lines = ["| prompts x G x new tokens | sampler | tokens/s (median) | min-max | repeats |",
             "| --- | --- | --- | --- | --- |"]
    for shape in native:
        for name, rates in (("native (native_sampling.rollout)", native[shape]), ("vLLM engine", vllm[shape])):
            s = summary(rates)
            lines.append(f"| {'x'.join(map(str, shape))} | {name} | {s['median']:.0f} | {s['min']:.0f}-{s['max']:.0f} "
                         f"| {s['n']} |")
    lines += ["", "| weight sync (VllmEngine.load_weights) | median | min-max | repeats |", "| --- | --- | --- | --- |"]
    for name, secs in (("full model", sync_full), ("LoRA rank 8, all-linear (merge, push, unmerge)", sync_lora)):
        s = summary(secs)
        lines.append(f"| {name} | {s['median'] * 1000:.1f} ms | {s['min'] * 1000:.1f}-{s['max'] * 1000:.1f} ms "
                     f"| {s['n']} |")
    return lines


def step_table(results: dict, args) -> list[str]:
    lines = ["", f"Trainer steps ({args.task}, {args.train_shape}, {args.train_steps - 1} timed steps after the "
             "first; median (min-max)):", "",
             "| engine | " + " | ".join(STEP_TIMES) + " | mean completion length | torch threads after |",
             "|---|" + "---|" * (len(STEP_TIMES) + 2)]
    for engine, times in results.items():
        cells = [cell(times[n]) if times.get(n) else "-" for n in STEP_TIMES]
        lines.append(f"| {engine} | " + " | ".join(cells) + f" | {cell(times['length'], 1.0, '')} | "
                     f"{times['threads']} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="model.path ('' = the real-architecture test Qwen2; smollm2; a folder)")
    ap.add_argument("--task", default="demo", choices=("demo", "arithmetic"), help="whose prompts are sampled")
    ap.add_argument("--shapes", nargs="+", default=["8x4x128", "16x8x128"], help="prompts x G x new tokens")
    ap.add_argument("--repeats", type=int, default=5, help="timed rollouts per shape and sampler (after a warm-up)")
    ap.add_argument("--train-steps", type=int, default=0, help="also time this many trainer steps per engine (0: no)")
    ap.add_argument("--train-shape", default="8x8x16", help="the trainer steps' prompts x G x new tokens")
    ap.add_argument("--child-engine", help=argparse.SUPPRESS)  # a trainer-steps child process's engine
    ap.add_argument("--child-folder", help=argparse.SUPPRESS)
    ap.add_argument("--child-root", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child_engine:
        print(json.dumps(train_steps(Path(args.child_folder), args.child_engine, args.task, args.train_steps,
                                     args.train_shape, Path(args.child_root))))
        return 0
    with tempfile.TemporaryDirectory(prefix="grpo-vllm-bench-") as root:
        print("\n".join(measure(args, Path(root))))
    return 0


def measure(args, root: Path) -> list[str]:
    """The report's lines: the samplers, the syncs and (--train-steps) the trainer's steps."""
    from grpo_core.runs.config import ModelConfig
    from grpo_core.train import models
    shapes = [parse_shape(s) for s in args.shapes]
    folder, model, tokenizer = load_model(args.model, root)
    params = sum(p.numel() for p in model.parameters())
    torch.set_num_threads(threads())
    with torch.no_grad():
        native = native_rates(model, tokenizer, shapes, args.repeats, args.task)
    engine = start_engine(folder, tokenizer, shapes, args.task)
    vllm = engine_rates(engine, model, tokenizer, shapes, args.repeats, args.task)
    sync_full = sync_seconds(engine, model, args.repeats)
    lora = models.apply_lora(model, ModelConfig(lora_rank=8, lora_alpha=16.0))
    sync_lora = sync_seconds(engine, lora, args.repeats)
    lines = header(model.config, params, engine.vllm.__version__, args.model or "tests/real_model.py")
    lines += sampling_table(native, vllm, sync_full, sync_lora)
    if args.train_steps:
        del engine
        lines += step_table(step_results(folder, args), args)
    return lines


if __name__ == "__main__":
    sys.exit(main())
