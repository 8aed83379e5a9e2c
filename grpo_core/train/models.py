"""Models: the built-in tiny model (built locally, no download) and loading any Hugging Face causal LM.

Any local folder, or a hub id where there is network; LoRA adapters (peft); the device and
compute dtype; the built-in model's supervised warm-start; torch's CPU threads.

The built-in model is a character-level tokenizer (`tokenizers` WordLevel over single
characters, space included, wrapped in `PreTrainedTokenizerFast`) and a small Llama
(`LlamaConfig`, sizes from `cfg.model`). Llama and not Qwen2: with a Qwen2 config
`AutoTokenizer` forces a Qwen2 tokenizer that drops spaces, so a saved built-in model
would not round-trip through `from_pretrained`. Saved with `save_pretrained`, it loads
back through exactly the code path a real hub model takes (`load_pretrained`).

A random tiny model under GRPO collapses to a constant string (every group has std 0,
nothing to learn from), so the built-in model gets a short supervised warm-start on the
task's targets first, cached per (model, task) config under `<runs_dir>/.cache/`.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from grpo_core.errors import ConfigError
from grpo_core.runs import model_source
from grpo_core.runs.config import ModelConfig, RunConfig
from grpo_core.runs.locations import env

hf_logging.disable_progress_bar()  # the trainer has its own progress bar; shard bars are noise
hf_logging.set_verbosity_error()

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII, space first
MAX_POSITIONS = 512


# ---- device ---------------------------------------------------------------------------------
def pick_device(cfg: ModelConfig) -> tuple[torch.device, torch.dtype]:
    """(device, compute dtype). auto: CUDA with bf16 compute when present, else CPU in fp32
    (bf16 matmuls on CPU are slow). The weights the optimizer updates stay fp32 whatever the
    compute dtype (load_policy): AdamW on bf16 weights drops most small updates."""
    if cfg.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"model.device is {cfg.device!r} but CUDA is not available; use auto or cpu")
    if cfg.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, cfg.dtype)
    return device, dtype


# ---- built-in tiny model ----------------------------------------------------------------------
def build_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level: one token per character, `<bos>` prepended, left padding (decoder-only
    generation continues from the right edge of every prompt)."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every char, space too
    tk.decoder = decoders.Fuse()  # join characters back without separators
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])])
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token=PAD, bos_token=BOS, eos_token=EOS,
                                   unk_token=UNK, padding_side="left")


def build_tiny_model(cfg: ModelConfig, tokenizer, seed: int = 0) -> LlamaForCausalLM:
    conf = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):  # init never disturbs the caller's rng stream
        torch.manual_seed(seed)
        model = LlamaForCausalLM(conf)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ---- LoRA (peft, optional) ---------------------------------------------------------------------
def apply_lora(model, cfg: ModelConfig):
    """The model with LoRA adapters (peft): only the adapters train; the base weights stay."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("model.lora_rank needs peft: pip install peft (the wheel's [lora] extra)") from None
    targets = cfg.lora_target_modules if cfg.lora_target_modules == "all-linear" else \
        [t.strip() for t in cfg.lora_target_modules.split(",") if t.strip()]
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def is_lora(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class AdaptersOff:
    """The frozen reference of a LoRA policy: the same model with its adapters disabled, no
    second copy of the weights. Called like the model; token_logprobs, which calls its decoder
    and head apart, enters forward_context around them."""

    def __init__(self, model):
        self.model, self._off = model, False

    @contextlib.contextmanager
    def forward_context(self):
        if self._off:  # nested (a call inside the block): peft's exit would turn them back on early
            yield
            return
        self._off = True
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._off = False

    def __call__(self, *args, **kwargs):
        with self.forward_context():
            return self.model(*args, **kwargs)

    def __getattr__(self, name):  # training, config, parameters(), get_decoder(): the model's
        return getattr(self.model, name)


def load_lora_state(model, folder: Path):
    """A checkpoint's adapter weights into the model's adapters."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    set_peft_model_state_dict(model, load_file(str(Path(folder) / "adapter_model.safetensors")))


def enable_checkpointing(model):
    """Activation (gradient) checkpointing in train mode: transformers 5 names it
    activation_checkpointing_enable, older versions gradient_checkpointing_enable."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def suppressed_token_ids(tokenizer) -> list[int]:
    """Special tokens the policy may not sample (eos stays allowed: it ends a completion).
    Without this a tiny policy learns to emit <pad>/<unk>, which decode to nothing and
    hide from every metric."""
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
    ids.update(getattr(tokenizer, "all_special_ids", []) or [])
    ids.discard(tokenizer.eos_token_id)
    return sorted(i for i in ids if i is not None)


def save_pretrained(model, tokenizer, path: str | os.PathLike):
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


# ---- any HF causal LM --------------------------------------------------------------------------
def check_model_path(path: str) -> bool:
    """Check model.path without loading it (model_source.resolve; ConfigError names what is
    missing). Returns True when `path` is a hub id."""
    return model_source.resolve(path).kind == "hub"


def load_pretrained(path: str, device: torch.device | None = None, dtype: torch.dtype | None = None):
    """model.path (a folder, a GGUF, a shipped name, or a hub id where there is network) ->
    (model, tokenizer), left padding, a pad token (eos when the tokenizer has none)."""
    source = model_source.resolve(path)
    try:
        if source.kind == "gguf":
            model, tokenizer = load_gguf(source, dtype or torch.float32)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source.location)
            model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype or torch.float32)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, NotImplementedError, RuntimeError) as e:
        where = {"hub": "hub id (no local folder of that name)", "folder": "folder", "gguf": "GGUF file"}[source.kind]
        raise ConfigError(f"model.path {path!r} ({where}) cannot be loaded: {first_line(e)}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    return model, tokenizer


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def load_gguf(source: model_source.ModelSource, dtype: torch.dtype):
    """A GGUF through transformers' reader (dequantised to float; tokenizer, eos and chat
    template from the file), its weights then moved into a plain model of the same config: a
    model transformers loaded from a GGUF refuses save_pretrained, and every checkpoint, export
    and vLLM engine folder of the run is a plain Hugging Face folder."""
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model.path {source.label!r} is a GGUF file: reading it needs the gguf package "
                          "(pip install gguf; make run and make test install it)")
    tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)
    with contextlib.redirect_stderr(io.StringIO()):  # its tensor-by-tensor bar, which hf_logging does not silence
        loaded = AutoModelForCausalLM.from_pretrained(source.location, gguf_file=source.gguf_file, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are float now: nothing is quantized any more
    with torch.random.fork_rng(devices=[]):  # the throwaway init never moves the caller's rng stream
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {k for k in missing if k == "lm_head.weight" and config.tie_word_embeddings}
    if set(missing) - tied or unexpected:
        raise ConfigError(f"model.path {source.label!r}: the GGUF's tensors do not fill a "
                          f"{type(model).__name__} (missing {sorted(set(missing) - tied)[:3]}, unexpected "
                          f"{sorted(unexpected)[:3]})")
    model.tie_weights()
    model.generation_config = loaded.generation_config
    return model, tokenizer


# ---- supervised warm-start -----------------------------------------------------------------------
def warm_key(cfg: ModelConfig, task_key: dict, seed: int) -> str:
    sizes = {k: getattr(cfg, k) for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size",
                                           "warm_start_steps")}
    blob = json.dumps({"model": sizes, "task": task_key, "seed": seed, "target": WARM_TARGET, "v": 2}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sft_batch(tokenizer, prompts: list[str], targets: list[str], device) -> dict:
    """prompt + target + eos, loss on the target and eos only (labels -100 elsewhere)."""
    p = [tokenizer(x)["input_ids"] for x in prompts]
    t = [tokenizer(x, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for x in targets]
    seqs = [a + b for a, b in zip(p, t)]
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for i, (a, b) in enumerate(zip(p, t)):  # left padding, as in generation
        off = width - len(a) - len(b)
        ids[i, off:] = torch.tensor(a + b)
        mask[i, off:] = 1
        labels[i, off + len(a):] = torch.tensor(b)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {k: v.to(device) for k, v in
            dict(input_ids=ids, attention_mask=mask, labels=labels, position_ids=pos).items()}


WARM_TARGET = 0.3  # stop warming up once this share of sampled completions hits the target
WARM_CHECK_EVERY = 2


def target_match_rate(model, tokenizer, task, n: int = 64) -> float:
    """Share of sampled completions (temperature 1, as GRPO samples) equal to the target."""
    exs = task.warm_batch(n)
    enc = tokenizer([e["prompt"] for e in exs], return_tensors="pt", padding=True).to(next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=max(len(task.target(e)) for e in exs) + 4,
                             suppress_tokens=suppressed_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(t.strip() == task.target(e) for t, e in zip(texts, exs)) / n


def warm_start(model, tokenizer, task, max_steps: int, batch_size: int = 64, lr: float = 3e-3,
               target: float | None = None) -> tuple[list[float], float]:
    """Supervised steps on the task's targets until WARM_TARGET of sampled completions are
    right (or max_steps): a policy that is sometimes right, not one that has learned the
    task. Stopping by step count is a knife edge on the demo, stopping by the success rate is
    not (docs/benchmarks.md, "Behind the code"). Returns (loss per step, last success rate)."""
    target = WARM_TARGET if target is None else target
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    losses, rate = [], 0.0
    for step in range(1, max_steps + 1):
        exs = task.warm_batch(batch_size)
        batch = sft_batch(tokenizer, [e["prompt"] for e in exs], [task.target(e) for e in exs], device)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % WARM_CHECK_EVERY == 0 and loss.item() < 1.0:
            rate = target_match_rate(model, tokenizer, task)
            if rate >= target:
                break
    return losses, rate


def master_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the weights the optimizer updates: fp32, or float64 when everything is."""
    return torch.float64 if compute_dtype == torch.float64 else torch.float32


def load_policy(cfg: ModelConfig, task, runs_root: str | os.PathLike, seed: int = 0,
                log=lambda msg: None):
    """cfg -> (model, tokenizer, info), the weights in fp32 (the master copy the optimizer
    updates; forward passes run in the compute dtype under autocast: trainer.Trainer.autocast),
    or float64 with model.dtype float64. info says where the weights came from."""
    device, dtype = pick_device(cfg)
    model, tokenizer, info = _load_policy(cfg, task, runs_root, seed, log, device)
    info["compute_dtype"] = str(dtype)
    return model.to(master_dtype(dtype)), tokenizer, info


def _load_policy(cfg: ModelConfig, task, runs_root, seed: int, log, device):
    if cfg.path:
        model, tokenizer = load_pretrained(cfg.path, device, torch.float32)
        return model, tokenizer, {"source": cfg.path, "warm_start": None}
    cache = Path(runs_root) / ".cache" / f"warm-{warm_key(cfg, task.cache_key(), seed)}"
    if (cache / "config.json").is_file():
        model, tokenizer = load_pretrained(str(cache), device, torch.float32)
        return model, tokenizer, {"source": "builtin", "warm_start": str(cache), "cached": True}
    tokenizer = build_tokenizer()
    model = build_tiny_model(cfg, tokenizer, seed).to(device)
    info = {"source": "builtin", "warm_start": None}
    if cfg.warm_start_steps > 0 and getattr(task, "has_targets", lambda: True)():
        t0 = time.time()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            losses, rate = warm_start(model, tokenizer, task, cfg.warm_start_steps)
        log(f"warm-start: {len(losses)} supervised steps in {time.time() - t0:.1f}s, loss {losses[0]:.2f} -> "
            f"{losses[-1]:.2f}, {rate:.0%} of sampled answers right")
        _save_atomic(model, tokenizer, cache)
        info.update(warm_start=str(cache), cached=False, warm_steps=len(losses), loss_last=losses[-1],
                    warm_success=rate)
    return model, tokenizer, info


def _save_atomic(model, tokenizer, dest: Path):
    """Write into a temp dir beside dest, then rename: a reader never sees half a model, and
    two runs warming up at once both end with the same complete folder."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    save_pretrained(model, tokenizer, tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # someone else finished first: theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)


def set_threads(cfg: RunConfig | None = None, processes: int = 1):
    """CPU threads for torch: $GRPO_HEALTH_TORCH_THREADS, else 1 for the built-in model (and when no
    config is given), else min(4, cores / the training processes on this machine). The built-in
    model's ops are far too small to split: a second thread only waits at barriers, and on a
    shared box it waits for a core (docs/benchmarks.md, "Behind the code")."""
    n = int(env("GRPO_HEALTH_TORCH_THREADS", "0"))
    if not n:
        n = max(1, min(4, (os.cpu_count() or 1) // max(processes, 1))) if cfg is not None and cfg.model.path else 1
    torch.set_num_threads(n)
