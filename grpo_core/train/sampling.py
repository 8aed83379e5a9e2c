"""Who samples a step's completions: the native KV-cache sampler, or a vLLM engine kept in step with the trainer's weights.

`grpo.engine` picks it (auto: vLLM when it is installed and the run is on CUDA, where it is the
fast path; native otherwise). The vLLM engine runs in the trainer's process, as TRL's colocate
mode: it loads the model's architecture from its folder once, then takes the trainer's weights
in place after every optimizer step (`sync`), never from disk. On CUDA it sleeps while the
trainer updates, so the two share the GPU's memory.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from grpo_core.train import models, native_sampling


def pick_engine(engine: str, device) -> str:
    """grpo.engine with auto resolved for this device."""
    if engine != "auto":
        return engine
    return "vllm" if device.type == "cuda" and importlib.util.find_spec("vllm") is not None else "native"


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
    log-probs (the trainer compares them with its own: sampler_mismatch.py)."""
    name = "vllm"

    def __init__(self, model, folder: Path, cfg, dtype: str):
        from grpo_core.train import vllm_engine  # imports vllm: only when the run samples with it
        g = cfg.grpo
        self.module, self.sleeps = vllm_engine, g.vllm_sleep
        self.engine = vllm_engine.VllmEngine(str(folder), dtype=dtype, seed=g.seed, max_model_len=model_len(model),
                                             gpu_memory_utilization=g.vllm_gpu_memory_utilization)
        self.engine.load_weights(model)  # the policy as the trainer holds it: warm-started or resumed

    def rollout(self, model, tokenizer, examples: list[dict], group_size: int, *, batch_groups: int = 0,
                seeds: list[int] | None = None, **kw) -> native_sampling.Rollouts:
        """The engine batches by itself (batch_groups is the native sampler's memory knob). Each
        completion's seed (below 2**31, as vLLM takes) comes from its group's seed (`seeds`, one per
        prompt), else from torch's generator: a seeded run samples the same again."""
        self.engine.wake_up()
        per_row = None if seeds is None else [int(np.random.SeedSequence([seed, j]).generate_state(1)[0]) >> 1
                                              for seed in seeds for j in range(group_size)]
        return self.module.rollout(self.engine, tokenizer, examples, group_size, seeds=per_row,
                                   eos_ids=native_sampling.eos_token_ids(model, tokenizer), **kw)

    def sync(self, model) -> float:
        """Push the updated weights into the engine; the seconds it took."""
        t0 = time.perf_counter()
        self.engine.wake_up()
        self.engine.load_weights(model)
        return time.perf_counter() - t0

    def before_update(self):
        if self.sleeps:  # a no-op on CPU
            self.engine.sleep()


def model_len(model) -> int:
    """The engine's longest sequence: the model's own limit (prompts are the task's)."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 2048)



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
