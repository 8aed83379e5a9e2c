"""Benchmark: the native sampler (native_sampling.rollout) against the vLLM engine (vllm_engine.rollout) on CPU, and the weight sync's cost.

On the real-architecture Qwen2 of tests/real_model.py (float32, random init: it almost never
samples an eos, so every row runs to its token budget and the rows sampled are the same work
in both), the demo task's prompts rendered with the chat template, temperature 1, the
tokenizer's special tokens suppressed. Per shape (prompts x completions per prompt x new
tokens): completion tokens per second of a whole rollout, median and min-max over --repeats
rollouts after one warm-up. The weight sync: `VllmEngine.load_weights` of the full model and
of a LoRA model (rank 8, all-linear: merge, push, unmerge), the whole call.

The native sampler runs first, before the engine exists: vLLM's CPU backend binds the
process's OpenMP threads when it starts. Needs the vLLM venv:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 .venv-vllm/bin/python bench/vllm_sampling.py \
        [--shapes 8x4x128 16x8x128] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from perf_common import machine, summary  # noqa: E402


def parse_shape(text: str) -> tuple[int, int, int]:
    prompts, group, tokens = (int(x) for x in text.lower().split("x"))
    return prompts, group, tokens


def inputs(tokenizer, prompts: int):
    from grpo_core.tasks import chat
    from grpo_core.tasks.demo import DemoTask
    examples = DemoTask(4, seed=0).batch(prompts)
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


def native_rates(model, tokenizer, shapes, repeats: int) -> dict:
    from grpo_core.train import models, native_sampling
    suppress = models.suppressed_token_ids(tokenizer)
    out = {}
    for prompts, group, tokens in shapes:
        examples, texts = inputs(tokenizer, prompts)
        out[(prompts, group, tokens)] = timed(lambda: native_sampling.rollout(
            model, tokenizer, examples, group, max_new_tokens=tokens, suppress_ids=suppress, prompts=texts,
            add_special_tokens=False), repeats)
    return out


def engine_rates(engine, model, tokenizer, shapes, repeats: int) -> dict:
    from grpo_core.train import models, native_sampling, vllm_engine
    suppress, eos = models.suppressed_token_ids(tokenizer), native_sampling.eos_token_ids(model, tokenizer)
    out = {}
    for prompts, group, tokens in shapes:
        examples, texts = inputs(tokenizer, prompts)
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


def table(native: dict, vllm: dict, sync_full, sync_lora, cfg, params: int, vllm_version: str) -> str:
    lines = [f"`{' '.join(['VLLM_ENABLE_V1_MULTIPROCESSING=0', '.venv-vllm/bin/python', *sys.argv])}`", "",
             f"Machine: {machine()}; torch {torch.__version__}, vLLM {vllm_version}.",
             f"Model: Qwen2 hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, vocabulary {cfg.vocab_size}, "
             f"{params / 1e6:.2f}M parameters, float32.", "",
             "| prompts x G x new tokens | sampler | tokens/s (median) | min-max | repeats |",
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
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["8x4x128", "16x8x128"], help="prompts x G x new tokens")
    ap.add_argument("--repeats", type=int, default=5, help="timed rollouts per shape and sampler (after a warm-up)")
    args = ap.parse_args(argv)
    from grpo_core.runs.config import ModelConfig
    from grpo_core.train import models, vllm_engine
    from tests.real_model import build
    shapes = [parse_shape(s) for s in args.shapes]
    path = build(Path(tempfile.mkdtemp(prefix="grpo-vllm-bench-")))
    model, tokenizer = models.load_pretrained(str(path), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    with torch.no_grad():
        native = native_rates(model, tokenizer, shapes, args.repeats)
    engine = vllm_engine.VllmEngine(path, dtype="float32", max_model_len=1024)
    vllm = engine_rates(engine, model, tokenizer, shapes, args.repeats)
    sync_full = sync_seconds(engine, model, args.repeats)
    lora = models.apply_lora(model, ModelConfig(lora_rank=8, lora_alpha=16.0))
    sync_lora = sync_seconds(engine, lora, args.repeats)
    print(table(native, vllm, sync_full, sync_lora, model.config, params, engine.vllm.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
