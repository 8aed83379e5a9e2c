"""VllmEngine: vLLM in the trainer's process (TRL's colocate mode) that samples the rollouts, its weights pushed in place after every step.

The engine is given token ids, never text (`skip_tokenizer_init`): the trainer's tokenizer
renders and pads the prompts exactly as `native_sampling.rollout` does, and `rollout` here returns the
same `native_sampling.Rollouts`, plus the sampler's log-prob of every sampled token.

What keeps the engine's policy the trainer's policy:
- Sampling: one SamplingParams per completion with its own seed (a seeded run is
  reproducible), every eos id a stop token kept in the completion (as the native sampler keeps
  it), the suppressed ids at -inf before the temperature, no top-k.
- The sampler's log-probs are vLLM's "processed_logprobs": the log-softmax of the logits after
  the suppression and the temperature, the same quantity `grpo.token_logprobs` computes (with
  grpo.top_p < 1 vLLM's are renormalised over the nucleus, which the trainer's are not).
- Weights: `load_weights(model)` after every optimizer step pushes the trainer's parameters
  into the engine in place (a LoRA policy: merged, pushed, unmerged) and drops the prefix
  cache, whose KV the old weights computed. tests/test_vllm_engine.py checks all of it on a
  real Qwen2 against the trainer's own log-probs.

What keeps it the run's engine: its context (`max_model_len`) and KV cache are the caller's
(sampling.py sizes them from the run), a completion that would not fit the context is refused
before vLLM would cut it short, and an engine that cannot start is one ConfigError naming the
knob to change, never vLLM's traceback.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from grpo_core.errors import ConfigError
from grpo_core.train import native_sampling
from grpo_core.train.models import is_lora

# vLLM versions [from, to) whose internals used here were checked; outside it the engine runs
# while missing_internals finds nothing, and names this range when it does.
SUPPORTED = ((0, 32), (0, 34))
NEEDS_VLLM = ("grpo.engine=vllm needs vLLM: pip install 'vllm>=0.32,<0.34' (CUDA; the wheel's [vllm] extra) "
              "or see docs/trainer.md, 'Sample with vLLM'")
# On CPU the KV cache is plain memory of a size we choose (vLLM's share of "GPU memory" would be
# one of the whole machine's): sized from the run, at least this (a few short sequences always fit),
# at most a quarter of the memory free at start (the trainer, its optimizer and the OS keep the rest).
CPU_KV_CACHE_BYTES = 256 * 2**20
CPU_KV_SHARE = 0.25
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# A start failure that these words mark is about the context or the memory: its fix is our knobs.
MEMORY_WORDS = ("kv cache", "memory", "max seq len", "max_model_len", "model length", "out of memory")
# vLLM's advice names its own flags (`--gpu-memory-utilization`): the sentences we drop for ours.
ADVICE = ("try ", "see ", "please ", "to resolve", "for more", "set ")
SEED_RANGE = 2**31 - 1
# Warns, on every reload, about the layers no checkpoint weight goes to (rotary, a tied head).
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
# Warns, with a whole traceback, at every start of a model with a chat template: its warm-up
# renders one, which an engine without a tokenizer cannot (we pass token ids, never chats).
RENDERER_LOGGER = "vllm.renderers.base"


# ---- importing vLLM ---------------------------------------------------------------------------
def import_vllm():
    """The vllm module, its version checked; ConfigError in one line when it is missing or moved."""
    # Colocated: the engine core runs in this process, so a weight push is a copy, not a pickle.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError:
        raise ConfigError(NEEDS_VLLM) from None
    check_version(vllm)
    return vllm


def missing_internals(vllm) -> list[str]:
    """The parts of vLLM this module relies on beyond its documented API, absent from this one."""
    missing = []
    try:
        import dataclasses

        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
        from vllm.v1.worker.gpu_worker import Worker
        engine_fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
        for name in ("logprobs_mode", "kv_cache_memory_bytes", "enable_sleep_mode", "max_logprobs"):
            if name not in engine_fields:
                missing.append(f"EngineArgs.{name}")
        if "flat_logprobs" not in getattr(vllm.SamplingParams, "__struct_fields__", ()):
            missing.append("SamplingParams.flat_logprobs")
        if not hasattr(Worker, "reload_weights"):
            missing.append("Worker.reload_weights")
        if not hasattr(CPUAttentionBackend, "get_supported_head_sizes"):
            missing.append("CPUAttentionBackend.get_supported_head_sizes")
        for name in ("apply_model", "collective_rpc", "reset_prefix_cache", "sleep", "wake_up"):
            if not hasattr(vllm.LLM, name):
                missing.append(f"LLM.{name}")
    except (ImportError, AttributeError, TypeError) as e:
        missing.append(str(e).splitlines()[0] if str(e) else type(e).__name__)
    return missing


def check_version(vllm):
    """Raise when the installed vLLM lacks an internal this module uses (its version named)."""
    missing = missing_internals(vllm)
    if missing:
        (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED
        version = getattr(vllm, "__version__", "?")
        raise ConfigError(f"vLLM {version} lacks {', '.join(missing)}: grpo.engine=vllm supports vLLM "
                          f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor} "
                          f"(pip install 'vllm>={lo_major}.{lo_minor},<{hi_major}.{hi_minor}')")


def check_cpu_head_size(model_dir):
    """vLLM's CPU attention has kernels for some head sizes only (none below 32): say so in one
    line rather than deep in the engine's start."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    head, sizes = head_dim(model_config(model_dir)), CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise ConfigError(f"vLLM on CPU has no attention kernel for heads of {head} (hidden_size / "
                          f"num_attention_heads of {model_dir}); it has {sizes}: sample this model natively")


# ---- the model's shape: context limit and KV bytes ----------------------------------------------
def model_config(model_dir) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def position_limit(model_dir) -> int | None:
    """The longest sequence the model was built for (max_position_embeddings), None if unsaid."""
    return model_config(model_dir).get("max_position_embeddings") or None


def kv_bytes_per_token(model_dir, dtype: str) -> int:
    """One token's keys and values over every layer, in the engine's dtype (vLLM's KV cache dtype
    "auto" is the model's)."""
    config = model_config(model_dir)
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim(config) * DTYPE_BYTES.get(dtype, 4)


def available_memory() -> int | None:
    """Bytes the kernel says can be had now (MemAvailable), None where it does not say."""
    try:
        found = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def cpu_kv_cache_bytes(bytes_per_token: int, max_model_len: int, sequences: int) -> int:
    """The CPU KV cache for `sequences` sequences of the full context (vLLM schedules the rest in
    waves), at least CPU_KV_CACHE_BYTES, at most CPU_KV_SHARE of the free memory but never below
    one full sequence (vLLM refuses to start without room for one)."""
    one = bytes_per_token * max_model_len
    free = available_memory()
    cap = max(one, int(free * CPU_KV_SHARE)) if free else max(one, sequences * one)
    return max(CPU_KV_CACHE_BYTES, min(max(1, sequences) * one, cap))


# ---- the engine ---------------------------------------------------------------------------------
class VllmEngine:
    """One vLLM engine over a Hugging Face model folder, fed token ids. `max_model_len`: its
    context (prompt + completion); `kv_cache_bytes`: its KV cache (None: on CPU sized for
    `kv_sequences` full sequences, on CUDA `gpu_memory_utilization`'s share)."""

    def __init__(self, model_dir, *, dtype: str = "float32", seed: int = 0, max_model_len: int = 2048,
                 gpu_memory_utilization: float = 0.3, enforce_eager: bool | None = None,
                 kv_cache_bytes: int | None = None, kv_sequences: int = 1):
        vllm = import_vllm()
        from vllm.platforms import current_platform
        self.vllm, self.on_cpu = vllm, current_platform.is_cpu()
        if self.on_cpu:
            check_cpu_head_size(model_dir)
        self.max_model_len, self.position_limit = max_model_len, position_limit(model_dir)
        args = dict(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                    max_model_len=max_model_len, logprobs_mode="processed_logprobs",
                    max_logprobs=-1,  # score() reads the whole vocabulary's prompt log-probs
                    generation_config="vllm")  # sampling is what we pass, never the folder's defaults
        if self.on_cpu:
            self.kv_cache_bytes = kv_cache_bytes or cpu_kv_cache_bytes(kv_bytes_per_token(model_dir, dtype),
                                                                       max_model_len, kv_sequences)
            args.update(enforce_eager=True if enforce_eager is None else enforce_eager,
                        kv_cache_memory_bytes=self.kv_cache_bytes)
        else:
            self.kv_cache_bytes = kv_cache_bytes
            args.update(enforce_eager=bool(enforce_eager), gpu_memory_utilization=gpu_memory_utilization,
                        enable_sleep_mode=True)
            if kv_cache_bytes:
                args["kv_cache_memory_bytes"] = kv_cache_bytes
        self.llm = self.start(vllm, args)
        self.asleep = False

    def start(self, vllm, args: dict):
        """vllm.LLM(**args) as one ConfigError when it fails (its traceback kept as the cause, for
        the run's log), and with the caller's random streams as they were: vLLM seeds Python's,
        numpy's and torch's global generators with its own seed when it starts."""
        try:
            with kept_random_state(), quiet(RENDERER_LOGGER):
                return vllm.LLM(**args)
        except Exception as error:  # noqa: BLE001 - whatever vLLM raised, the user gets one line
            raise ConfigError(self.start_error(error)) from error

    def start_error(self, error: BaseException) -> str:
        line = meaningful_line(error)
        if not any(word in line.lower() for word in MEMORY_WORDS):
            return f"vLLM engine could not start: {line} (grpo.engine=native samples without vLLM)"
        budget = (f"grpo.vllm_kv_cache_gb (now {self.kv_cache_bytes / 2**30:.2f})" if self.kv_cache_bytes else
                  "grpo.vllm_gpu_memory_utilization or set grpo.vllm_kv_cache_gb")
        return (f"vLLM engine could not start: {line}; lower grpo.vllm_max_model_length (now {self.max_model_len}) "
                f"or raise {budget}")

    def sampling_params(self, *, max_new_tokens: int, temperature: float, top_p: float, eos_ids: list[int],
                        suppress_ids: list[int] | None, seed: int | None, top_k: int = 0):
        return self.vllm.SamplingParams(  # top_k 0: off, in vLLM as here
            max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            stop_token_ids=list(eos_ids), logprobs=0, detokenize=False,
            logit_bias={int(i): float("-inf") for i in suppress_ids or []})

    def generate(self, prompt_ids: list[list[int]], group_size: int, *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, top_k: int = 0, eos_ids: list[int], suppress_ids: list[int] | None = None,
                 seeds: list[int] | None = None) -> tuple[list[list[int]], list[list[float]]]:
        """P prompts -> P*G completions (rows g*G..g*G+G-1 are prompt g's): the ids of each
        (its eos kept) and the sampler's log-prob of each sampled token. `seeds`: one per row."""
        rows = len(prompt_ids) * group_size
        seeds = list(seeds) if seeds is not None else [None] * rows
        if len(seeds) != rows:
            raise ValueError(f"generate: {len(seeds)} seeds for {rows} completions")
        params = [self.sampling_params(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       top_k=top_k, eos_ids=eos_ids, suppress_ids=suppress_ids, seed=seed) for seed in seeds]
        prompts = [{"prompt_token_ids": list(map(int, ids))} for ids in prompt_ids for _ in range(group_size)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        completions = [out.outputs[0] for out in outs]
        ids = [list(c.token_ids) for c in completions]
        logprobs = [[step[token].logprob for step, token in zip(c.logprobs, c.token_ids)] for c in completions]
        return ids, logprobs

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
              suppress_ids: list[int] | None = None) -> list[torch.Tensor]:
        """Per-token log-probs of fixed completions under the engine's weights, the quantity
        `grpo.token_logprobs` computes (temperature, suppressed ids at -inf). From the prompt
        log-probs of the whole vocabulary (vLLM's are at temperature 1): for checks on short
        completions, not for the training loop."""
        params = self.vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, flat_logprobs=True, detokenize=False)
        requests = [{"prompt_token_ids": list(map(int, p)) + list(map(int, c))}
                    for p, c in zip(prompt_ids, completion_ids)]
        outs = self.llm.generate(requests, [params] * len(requests), use_tqdm=False)
        return [rescore(out.prompt_logprobs, len(p), list(c), temperature, suppress_ids)
                for out, p, c in zip(outs, prompt_ids, completion_ids)]

    def load_weights(self, model):
        """Push the trainer's current parameters into the engine in place (never from disk):
        a LoRA model's merged weights, under Hugging Face names; then drop the prefix cache."""
        with hf_weights(model) as weights:
            if self.on_cpu:
                # vLLM's CPU backend repacks each linear weight into a kernel at load and drops
                # the parameter, so load_weights has nothing to write into: its in-place reload
                # restores the layers, loads and repacks them.
                with quiet(RELOAD_LOGGER):
                    self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights),
                                                                      "is_checkpoint_format": True})
                self.llm.apply_model(repack_tied_head)
            else:
                self.llm.apply_model(lambda engine_model: engine_model.load_weights(weights))
        self.llm.reset_prefix_cache()

    def sleep(self):
        """Free the GPU memory the engine holds while the trainer trains (weights to CPU, KV
        dropped); a no-op on CPU."""
        if not self.on_cpu and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self):
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def meaningful_line(error: BaseException) -> str:
    """vLLM's own words for a failure, in one line: the message of the error (or of its cause,
    when it only points there), without its advice about vLLM's flags."""
    while error.__cause__ is not None and "root cause" in str(error):
        error = error.__cause__
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if not lines:
        return type(error).__name__
    sentences = re.split(r"(?<=[.!])\s+", lines[-1] if "Traceback" in lines[0] else lines[0])
    kept = [s for s in sentences if not s.lower().startswith(ADVICE)] or sentences[:1]
    line = " ".join(kept).rstrip(".")
    return line if len(line) <= 320 else line[:319] + "…"


@contextmanager
def kept_random_state():
    """Python's, numpy's and torch's global generators (every device's) as they were, after the block."""
    python, numpy = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextmanager
def quiet(name: str):
    """The named logger's warnings off for a block: a filter, not a level, since vLLM's start
    reconfigures its logging and sets every vllm.* logger's level back to NOTSET."""
    logger = logging.getLogger(name)
    logger.addFilter(errors_only)
    try:
        yield
    finally:
        logger.removeFilter(errors_only)


def rescore(flat, prompt_len: int, completion: list[int], temperature: float,
            suppress_ids: list[int] | None) -> torch.Tensor:
    """The completion tokens' log-probs from one request's whole-vocabulary prompt log-probs
    (vLLM's FlatLogprobs, at temperature 1): log_softmax(logprobs / T) is log_softmax(logits / T)."""
    if not completion:
        return torch.zeros(0)
    vocab = max(flat.token_ids) + 1
    rows = torch.full((len(completion), vocab), float("-inf"))
    for row, position in enumerate(range(prompt_len, prompt_len + len(completion))):
        start, end = flat.start_indices[position], flat.end_indices[position]
        rows[row, torch.tensor(flat.token_ids[start:end])] = torch.tensor(flat.logprobs[start:end])
    if suppress_ids:
        rows[:, suppress_ids] = float("-inf")
    logsm = (rows / temperature if temperature not in (0, 1) else rows).log_softmax(-1)
    return logsm.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def repack_tied_head(engine_model):
    """CPU: a tied LM head's kernel was packed from the embedding at load, and the reload packs
    only the embedding it loads: pack the head again from the new weights."""
    head = getattr(engine_model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if method is not None and "lm_head.weight" not in dict(engine_model.named_parameters()):
        method.process_weights_after_loading(head)


# ---- the trainer's weights under Hugging Face names ---------------------------------------------
def hf_name(peft_name: str) -> str | None:
    """A peft parameter's name in the base model's checkpoint (None: an adapter's own weight)."""
    if "lora_" in peft_name or ".original_module." in peft_name:
        return None
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")


@contextmanager
def hf_weights(model):
    """(name, tensor) of every weight as the model's Hugging Face checkpoint names it; a LoRA
    model's adapters merged into its base weights for the block, unmerged after (they train on)."""
    if not is_lora(model):
        yield ((name, param.detach()) for name, param in model.named_parameters())
        return
    model.merge_adapter()
    try:
        yield ((hf_name(name), param.detach()) for name, param in model.named_parameters()
               if hf_name(name) is not None)
    finally:
        model.unmerge_adapter()


# ---- rollouts -----------------------------------------------------------------------------------
def rollout(engine: VllmEngine, tokenizer, examples: list[dict], group_size: int, *, max_new_tokens: int,
            eos_ids: list[int], temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
            suppress_ids: list[int] | None = None, add_special_tokens: bool = True, prompts: list[str] | None = None,
            seeds: list[int] | None = None) -> native_sampling.Rollouts:
    """`native_sampling.rollout` with the engine sampling: the same Rollouts (left-padded prompts,
    right-padded completions, the mask 0 after the first eos), and `sampler_logprobs` [B, Lc]
    (float32, 0 on padding). `seeds` (one per completion) default to draws from torch's
    generator, so torch.manual_seed makes a run reproducible as with the native sampler."""
    prompts = [e["prompt"] for e in examples] if prompts is None else list(prompts)
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
    prompt_ids = [ids[mask.bool()].tolist() for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    check_context(engine, max(map(len, prompt_ids)), max_new_tokens)
    if seeds is None:
        seeds = torch.randint(SEED_RANGE, (len(prompts) * group_size,)).tolist()
    ids, logprobs = engine.generate(prompt_ids, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                                    top_p=top_p, top_k=top_k, eos_ids=eos_ids, suppress_ids=suppress_ids,
                                    seeds=seeds)
    completion, cmask, sampled = pad_completions(ids, logprobs, tokenizer.pad_token_id)
    return native_sampling.assemble(tokenizer, enc, completion, cmask, examples, group_size, prompts, sampled)


def prompt_lengths(tokenizer, prompts: list[str], add_special_tokens: bool = True) -> list[int]:
    """Each prompt's length in tokens, as `rollout` encodes it."""
    return [len(ids) for ids in tokenizer(prompts, add_special_tokens=add_special_tokens)["input_ids"]]


def check_context(engine: VllmEngine, longest_prompt: int, max_new_tokens: int):
    """Refuse a batch whose longest prompt leaves no room for max_new_tokens in the engine's
    context: vLLM would end those completions early without a word (its "length capped"), and
    the trainer would take them for what the policy chose."""
    need = longest_prompt + max_new_tokens
    if need <= engine.max_model_len:
        return
    head = f"a prompt of {longest_prompt} tokens + grpo.max_new_tokens {max_new_tokens} = {need} tokens"
    limit = engine.position_limit
    if limit and need > limit:
        raise ConfigError(f"{head}, above the model's {limit} (max_position_embeddings): lower grpo.max_new_tokens "
                          "or shorten the prompts")
    raise ConfigError(f"{head}, above the vLLM engine's context of {engine.max_model_len}: set "
                      f"grpo.vllm_max_model_length to at least {need}" + (f" (at most {limit})" if limit else ""))


def pad_completions(ids: list[list[int]], logprobs: list[list[float]], pad_id: int):
    """Ragged completions -> ids [B, Lc] (pad after each), their mask and log-probs (0 on pad).
    vLLM stops a row at its first eos, so a row's mask is its length."""
    width = max(1, max(map(len, ids)))
    completion = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    sampled = torch.zeros((len(ids), width), dtype=torch.float32)
    for row, (tokens, lps) in enumerate(zip(ids, logprobs)):
        completion[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = 1
        sampled[row, :len(lps)] = torch.tensor(lps, dtype=torch.float32)
    return completion, mask, sampled
