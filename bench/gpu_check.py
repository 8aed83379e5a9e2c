"""GPU check: a model of the size people post-train, through the embedded trainer, on one GPU.

One prepared run (< 5 minutes on an H100/H200-class GPU) of the trainer's real loop
(`Trainer.run()`, its `native_sampling.rollout` and `grpo.train_on`), on a Qwen2 model with Qwen2.5-0.5B's
published sizes (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocabulary 151,936,
tied embeddings: 494M parameters) at random init, built from the config alone: no download.
The tokenizer is the byte-level BPE one tests/real_model.py trains here (8,192 tokens, Qwen's
chat specials, two eos ids); the model's vocabulary stays Qwen's 151,936, so the embedding, the
LM head and the log-prob chunks have the real model's sizes (sampled ids past the tokenizer's
decode to nothing). Compute in bf16 over fp32 master weights and AdamW state (`model.dtype=auto`
on CUDA); 8 prompts x 8 completions x 512 new tokens (the demo task's longest prompts), the
forward/backward in micro-batches of 2 groups, log-probs in 256 MB chunks; full fine-tuning,
then LoRA (rank 16, all-linear), each loaded afresh. A random model almost never samples an eos
id, so every completion runs to 512 tokens, and a seeded per-completion "noise" reward gives
every group spread: every step samples and trains every row, which is what is measured.

Two sampling-only variants time the other ways to sample a batch of the same shape (demo
prompts at level 4 rendered as the trainer renders them, P x G x 512 tokens, temperature 1,
special tokens suppressed) against the trainer's own sampler (the full variant's generation
tokens/s):
- generate-static: `model.generate(..., cache_implementation="static")` on a bf16 copy of the
  model (the first call, timed apart, compiles);
- vllm: the vLLM engine (grpo_core/train/vllm_engine.py, bf16, colocated), plus its weight sync
  (`load_weights` from the fp32 model, the whole call), sleep and wake-up, and the largest
  |log-prob| gap to the trainer's fp32 log-probs on a short fixed completion, after an
  optimizer step with and without the sync. Without vLLM installed: "skipped: vllm not installed".

One data-parallel variant, ranks: the same small run (the full variant's model and batch, but
max_new_tokens=64 and 1 warm-up + --steps steps) as a CLI job on 1 rank (`python -m grpo_core
train`) and under torchrun on 2 ranks sharing the one GPU (NCCL refuses two ranks on one device;
ranks.from_environment then picks gloo, the gradients going through host memory), each a fresh
process: wall steps/s and the median step times of each (bench/ranks_step.py runs the jobs), and
whether both trained the same groups at every step. It shows that the torchrun path runs on a
GPU and what a second rank on the same GPU costs or gains; not NCCL, which needs a GPU per rank.
A job that fails is reported as the variant's status (its output's tail), the other figures kept.

Per variant, one JSON object (printed, and written to --out, default $OUT/gpu_check.json):
- generation tokens/s (completion tokens sampled / time/generate_s) and training tokens/s
  (prompt + completion tokens through forward/backward / time/train_s), medians over the
  timed steps, and seconds per step;
- torch.cuda.max_memory_allocated over the variant's steps (the largest of the trainer's
  gpu/max_memory_allocated_gb, its per-step peak) and what the last step left allocated, next to
  grpo_core.train.memory_model's estimate of the same step (its parts too), so a GPU run checks
  the memory model;
- the share of trained parameter elements that moved over the run (fp32 master weights at
  lr 1e-6: with bf16 weights most small updates would be lost), and parameters trained.

    python bench/gpu_check.py [--steps 2] [--variants full,lora,generate-static,vllm,ranks] [--out gpu_check.json]
    python bench/gpu_check.py --smoke      # CPU, a tiny Qwen2, fp32: checks the script itself
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))

import torch  # noqa: E402

QWEN2_5_0_5B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                    intermediate_size=4864, vocab_size=151936)
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=128, vocab_size=4096)  # vocabulary past the tokenizer's, as the real check's;
# heads of 32: vLLM's CPU attention has no kernel for smaller ones
# prompts, group size, new tokens, groups per micro-batch, log-prob chunk MB, LoRA rank
BATCH = dict(prompts=8, group_size=8, max_new_tokens=512, micro_batch_groups=2, logit_chunk_mb=256.0, lora_rank=16)
SMOKE_BATCH = dict(prompts=2, group_size=4, max_new_tokens=16, micro_batch_groups=1, logit_chunk_mb=0.05, lora_rank=4)
LR = 1e-6


def noise(completion: str, example: dict) -> float:
    """A reward in [0, 1) from a hash of the completion: distinct completions (a random model
    samples nothing but) score differently, so every group is trainable."""
    return int(hashlib.sha1(completion.encode()).hexdigest()[:8], 16) / 2**32


def build_model(root: Path, smoke: bool) -> Path:
    """A Hugging Face folder: the locally trained BPE tokenizer and a random-init Qwen2 of the
    chosen sizes (initialised on the GPU when there is one: a 0.5B init on CPU takes long)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from tests.real_model import build
    tokenizer = AutoTokenizer.from_pretrained(build(root / "tokenizer", vocab_size=2048 if smoke else 8192,
                                                    hidden_size=32, layers=1, heads=2, kv_heads=1,
                                                    intermediate_size=64))
    eos = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    config = Qwen2Config(**(TINY if smoke else QWEN2_5_0_5B), max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]), torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = eos, tokenizer.pad_token_id
    path = root / ("qwen2-tiny" if smoke else "qwen2.5-0.5b-random")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return path


def make_config(path: Path, smoke: bool, lora: bool, steps: int):
    from grpo_core.runs.config import RunConfig, validate
    b = SMOKE_BATCH if smoke else BATCH
    cfg = RunConfig()
    cfg.model.path, cfg.model.device = str(path), "cpu" if smoke else "cuda"
    cfg.model.lora_rank = b["lora_rank"] if lora else 0
    cfg.task.level = 4
    cfg.reward.weights = {"noise": 1.0}
    cfg.reward.custom = {"noise": "gpu_check:noise"}
    cfg.reward.custom_dirs = [str(ROOT / "bench")]
    g = cfg.grpo
    g.prompts_per_step, g.group_size, g.max_new_tokens = b["prompts"], b["group_size"], b["max_new_tokens"]
    g.micro_batch_groups, g.logit_chunk_mb, g.sample_batch_groups = b["micro_batch_groups"], b["logit_chunk_mb"], 0
    g.steps, g.lr, g.min_group_std = steps, LR, 0.0
    cfg.log.progress, cfg.log.checkpoint_every = False, 0
    return validate(cfg)


def counting(counts: list):
    """Wrappers of native_sampling.rollout / grpo.train_on that count each step's tokens where they are made."""
    from grpo_core.train import grpo, native_sampling
    rollout, train_on = native_sampling.rollout, grpo.train_on

    def counted_rollout(*a, **kw):
        r = rollout(*a, **kw)
        counts.append({"completion_tokens": int(r.completion_mask.sum()), "rows": len(r.texts), "prompt_len": r.prompt_len})
        return r

    def counted_train_on(model, opt, roll, *a, **kw):
        out = train_on(model, opt, roll, *a, **kw)
        counts[-1]["train_tokens"] = int(roll.attention_mask.sum()) if out.get("rows") else 0
        return out
    return counted_rollout, counted_train_on


def moved(model, before: dict) -> dict:
    """Share of the trained parameters' elements (and tensors) that changed since `before` (on CPU)."""
    changed = total = unmoved = 0
    for name, p in model.named_parameters():
        if name in before:
            diff = int((p.detach().cpu() != before[name]).sum())
            changed, total, unmoved = changed + diff, total + p.numel(), unmoved + (diff == 0)
    return {"params_moved_fraction": changed / max(total, 1), "tensors_unmoved": unmoved, "tensors_trained": len(before)}


def memory_estimate(tr, cfg, prompt_len: int) -> dict:
    """grpo_core.train.memory_model's estimate (GiB) of this variant's step."""
    from grpo_core.train import memory_model
    g, m = cfg.grpo, cfg.model
    step = memory_model.Step(rows=g.micro_batch_groups * g.group_size, prompt_tokens=prompt_len,
                             completion_tokens=g.max_new_tokens, group_size=g.group_size,
                             sample_rows=g.prompts_per_step * g.group_size,
                             compute_dtype=str(tr.compute_dtype).removeprefix("torch."), lora_rank=m.lora_rank,
                             gradient_checkpointing=m.gradient_checkpointing, logit_chunk_mb=g.logit_chunk_mb,
                             device=tr.device.type)
    return memory_model.estimate(memory_model.Architecture.from_config(tr.model.config), step).gib()


def run_variant(path: Path, smoke: bool, lora: bool, steps: int, warm: int) -> dict:
    """One variant: the trainer's run of warm + steps steps, timed and measured."""
    from grpo_core.runs import names
    from grpo_core.runs.store import RunStore
    from grpo_core.train import grpo, native_sampling
    from grpo_core.train.models import set_threads
    from grpo_core.train.trainer import Trainer
    cfg = make_config(path, smoke, lora, warm + steps)
    set_threads(cfg)
    store = RunStore.create("gpu-check-lora" if lora else "gpu-check-full", cfg.to_dict(),
                            root=path.parent / "runs")
    t0 = time.perf_counter()
    tr = Trainer(cfg, store, log=lambda m: print(m, file=sys.stderr))
    load_s = time.perf_counter() - t0
    before = {n: p.detach().to("cpu", copy=True) for n, p in tr.model.named_parameters() if p.requires_grad}
    cuda = tr.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    counts = []
    saved = native_sampling.rollout, grpo.train_on
    native_sampling.rollout, grpo.train_on = counting(counts)
    try:
        t0 = time.perf_counter()
        status = tr.run()
        run_s = time.perf_counter() - t0
    finally:
        native_sampling.rollout, grpo.train_on = saved
    w = store.scalars_wide(names=[names.TIME_STEP, names.TIME_GENERATE, names.TIME_TRAIN, names.TRAINABLE_RATIO,
                                  names.GPU_MEMORY_ALLOCATED, names.GPU_MAX_MEMORY_ALLOCATED])
    res = summarize(w.iloc[warm:], counts[warm:], names)
    res.update({"variant": "lora" if lora else "full", "status": status, "load_s": round(load_s, 2),
                "run_s": round(run_s, 2), "lora_rank": cfg.model.lora_rank,
                "micro_batch_groups": cfg.grpo.micro_batch_groups,  # after any out-of-memory halving
                "sample_batch_groups": cfg.grpo.sample_batch_groups,
                "params": sum(p.numel() for p in tr.model.parameters()),
                "params_trained": sum(p.numel() for p in tr.model.parameters() if p.requires_grad),
                "weight_dtype": str(next(tr.model.parameters()).dtype), "compute_dtype": str(tr.compute_dtype),
                # The trainer logs each step's peak (and resets it): the run's peak is the largest.
                "max_memory_allocated_gib": float(w[names.GPU_MAX_MEMORY_ALLOCATED].max()) if cuda else None,
                "memory_allocated_gib": float(w[names.GPU_MEMORY_ALLOCATED].iloc[-1]) if cuda else None,
                "memory_model_gib": memory_estimate(tr, cfg, max(c["prompt_len"] for c in counts)),
                **moved(tr.model, before)})
    store.close()
    del tr, before
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return res


def summarize(w, counts: list, names) -> dict:
    """Medians over the timed steps: tokens/s of sampling and of training, seconds per step."""
    gen_tps = [c["completion_tokens"] / t for c, t in zip(counts, w[names.TIME_GENERATE])]
    train_tps = [c.get("train_tokens", 0) / t for c, t in zip(counts, w[names.TIME_TRAIN]) if t > 0]
    return {"steps_timed": len(w), "rows_per_step": statistics.median(c["rows"] for c in counts),
            "completion_tokens_per_step": statistics.median(c["completion_tokens"] for c in counts),
            "train_tokens_per_step": statistics.median(c.get("train_tokens", 0) for c in counts),
            "step_s_median": statistics.median(w[names.TIME_STEP]),
            "generate_s_median": statistics.median(w[names.TIME_GENERATE]),
            "train_s_median": statistics.median(w[names.TIME_TRAIN]),
            "generation_tokens_per_s": statistics.median(gen_tps),
            "training_tokens_per_s": statistics.median(train_tps) if train_tps else None,
            "trainable_ratio_median": float(w[names.TRAINABLE_RATIO].median())}


SAMPLERS = ("generate-static", "vllm")
SYNC_CHECK_TOKENS = 8  # prompt and completion of the sync check: score() reads the whole vocabulary per token


def sampling_batch(path: Path, smoke: bool):
    """The fp32 model on the check's device, its tokenizer, and the batch every sampler samples."""
    from grpo_core.tasks import chat
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train import models, native_sampling
    device = torch.device("cpu" if smoke else "cuda")
    model, tokenizer = models.load_pretrained(str(path), device, torch.float32)
    b = SMOKE_BATCH if smoke else BATCH
    examples = DemoTask(4, seed=0).batch(b["prompts"])
    batch = dict(examples=examples, prompts=[chat.render(tokenizer, e["prompt"]) for e in examples],
                 group_size=b["group_size"], max_new_tokens=b["max_new_tokens"],
                 eos=native_sampling.eos_token_ids(model, tokenizer), suppress=models.suppressed_token_ids(tokenizer))
    return model, tokenizer, device, batch


def time_sampler(sample, steps: int, cuda: bool) -> dict:
    """Medians over `steps` timed calls of sample() (-> completion tokens), after a first call
    timed apart (compiling, warming up)."""
    def once():
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens = sample()
        if cuda:
            torch.cuda.synchronize()
        return tokens, time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    _, first_s = once()
    runs = [once() for _ in range(steps)]
    return {"steps_timed": steps, "first_call_s": round(first_s, 2),
            "completion_tokens_per_step": statistics.median(t for t, _ in runs),
            "generate_s_median": statistics.median(s for _, s in runs),
            "generation_tokens_per_s": statistics.median(t / s for t, s in runs),
            "max_memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}


def generate_static(path: Path, smoke: bool, steps: int) -> dict:
    """model.generate with a static KV cache, in bf16 on the GPU (fp32 in the smoke run)."""
    from grpo_core.train import native_sampling
    model, tokenizer, device, b = sampling_batch(path, smoke)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    enc = tokenizer(b["prompts"], return_tensors="pt", padding=True, add_special_tokens=False).to(device)

    def sample() -> int:
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, top_k=0, temperature=1.0, num_return_sequences=b["group_size"],
                                 max_new_tokens=b["max_new_tokens"], cache_implementation="static",
                                 suppress_tokens=b["suppress"], eos_token_id=b["eos"],
                                 pad_token_id=tokenizer.pad_token_id)
        return int(native_sampling.completion_mask(out[:, enc["input_ids"].shape[1]:], b["eos"]).sum())
    res = {"variant": "generate-static", "status": "finished", "rows_per_step": len(b["prompts"]) * b["group_size"],
           **time_sampler(sample, steps, device.type == "cuda"), "weight_dtype": str(model.dtype)}
    return res


def vllm_sampling(path: Path, smoke: bool, steps: int) -> dict:
    """The vLLM engine's rollouts (bf16 on the GPU, fp32 in the smoke run), then its sync figures."""
    import importlib.util
    if importlib.util.find_spec("vllm") is None:
        return {"variant": "vllm", "status": "skipped: vllm not installed"}
    from grpo_core.errors import ConfigError
    from grpo_core.train import vllm_engine
    model, tokenizer, device, b = sampling_batch(path, smoke)
    t0 = time.perf_counter()
    try:
        engine = vllm_engine.VllmEngine(path, dtype="float32" if smoke else "bfloat16", max_model_len=2048)
    except ConfigError as e:
        return {"variant": "vllm", "status": f"skipped: {e}"}
    load_s = time.perf_counter() - t0

    def sample() -> int:
        roll = vllm_engine.rollout(engine, tokenizer, b["examples"], b["group_size"],
                                   max_new_tokens=b["max_new_tokens"], eos_ids=b["eos"], suppress_ids=b["suppress"], prompts=b["prompts"],
                                   add_special_tokens=False)
        return int(roll.completion_mask.sum())
    res = {"variant": "vllm", "status": "finished", "vllm": engine.vllm.__version__, "load_s": round(load_s, 2),
           "rows_per_step": len(b["prompts"]) * b["group_size"], **time_sampler(sample, steps, device.type == "cuda")}
    res.update(sync_figures(engine, model, tokenizer, b, steps))
    return res


def sync_figures(engine, model, tokenizer, b: dict, steps: int) -> dict:
    """The weight sync's cost (the whole load_weights call), sleep and wake-up, and the largest
    |log-prob| gap between the engine and the trainer on a fixed completion: as loaded, after
    an optimizer step without the sync, and with it."""
    from grpo_core.train import grpo
    cuda = next(model.parameters()).is_cuda
    ids = tokenizer(b["prompts"][0], add_special_tokens=False)["input_ids"]
    prompt, completion = ids[:SYNC_CHECK_TOKENS], ids[SYNC_CHECK_TOKENS:2 * SYNC_CHECK_TOKENS]
    full = torch.tensor([prompt + completion], device=next(model.parameters()).device)

    def gap() -> float:
        ours = engine.score([prompt], [completion], 1.0, b["suppress"])[0]
        with torch.no_grad():
            theirs, _ = grpo.token_logprobs(model, full, torch.ones_like(full), len(prompt), suppress_ids=b["suppress"])
        return float((ours - theirs[0].float().cpu()).abs().max())

    def seconds(call) -> float:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0
    loaded = gap()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=full, labels=full).loss.backward()
    optimizer.step()
    unsynced = gap()
    sync_s = [seconds(lambda: engine.load_weights(model)) for _ in range(max(steps, 1))]
    synced = gap()
    sleep_s, wake_s = seconds(engine.sleep), seconds(engine.wake_up)
    return {"sync_s_median": statistics.median(sync_s), "sleep_s": sleep_s, "wake_up_s": wake_s,
            "logprob_gap_loaded": loaded, "logprob_gap_unsynced": unsynced, "logprob_gap_synced": synced,
            "logprob_gap_after_wake_up": gap()}


RANKS_NEW_TOKENS = 64  # the ranks variant's completions (the smoke run keeps its 16): two start-ups and a few steps


def ranks_variant(path: Path, smoke: bool, steps: int, warm: int = 1) -> dict:
    """The same run on 1 rank and on 2 (torchrun, both on the one GPU over gloo), each a CLI job:
    wall steps/s and median step times after `warm` steps, and whether they trained the same groups."""
    from ranks_step import run_job, step_figures
    cfg = make_config(path, smoke, lora=False, steps=warm + steps)
    if not smoke:
        cfg.grpo.max_new_tokens = RANKS_NEW_TOKENS
    root = path.parent / "ranks"
    root.mkdir()
    config = root / "config.toml"
    config.write_text(cfg.to_toml())
    res = {"variant": "ranks", "max_new_tokens": cfg.grpo.max_new_tokens, "steps_timed": steps}
    for ranks in (1, 2):
        run_id = f"ranks-{ranks}"
        try:  # one torch thread a process on the smoke run's 2 cores; the trainer's choice on a GPU box
            job = run_job(ranks, run_id, root / "runs", config, [], one_thread=smoke, limit_s=300)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return {**res, "status": f"failed: {str(e)[-2000:]}"}
        fig = step_figures(root / "runs", run_id, job["ends"], warm)
        shutil.rmtree(root / "runs" / run_id / "checkpoints", ignore_errors=True)  # the end's: ~6 GB at 0.5B
        keep = ("status", "steps", "wall_steps_per_s", "step_s", "generate_s", "train_s", "other_s", "trainable",
                "submitted")
        res[f"rank_{ranks}"] = {"job_s": round(job["job_s"], 2), **{k: fig[k] for k in keep}}
    one, two = res["rank_1"], res["rank_2"]
    res.update(status="finished" if one["status"] == two["status"] == "finished" else "failed: a job did not finish",
               same_trainable_groups=one["trainable"] == two["trainable"] and one["submitted"] == two["submitted"],
               speedup_wall=two["wall_steps_per_s"] / one["wall_steps_per_s"])
    return res


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check(root: Path, args, variants: list[str]) -> dict:
    """Build the model under root, then run each variant on it (their runs under root too)."""
    t0 = time.perf_counter()
    path = build_model(root, args.smoke)
    res = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu (smoke)",
           "torch": torch.__version__, "model": {**(TINY if args.smoke else QWEN2_5_0_5B), "tied": True},
           "batch": SMOKE_BATCH if args.smoke else BATCH, "lr": LR, "build_s": round(time.perf_counter() - t0, 2),
           "variants": []}
    for variant in variants:
        if variant in SAMPLERS:  # each loads its own model, freed when it returns
            res["variants"].append((generate_static if variant == "generate-static" else vllm_sampling)(
                path, args.smoke, args.steps))
            free_memory()
        elif variant == "ranks":  # processes of their own
            res["variants"].append(ranks_variant(path, args.smoke, args.steps))
        else:
            res["variants"].append(run_variant(path, args.smoke, variant == "lora", args.steps, warm=1))
    res["total_s"] = round(time.perf_counter() - t0, 2)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant (after 1 warm-up step)")
    ap.add_argument("--variants", default="full,lora,generate-static,vllm,ranks",
                    help="comma-separated: full, lora (the trainer's loop), generate-static, vllm (sampling only), "
                         "ranks (1 rank against 2 on the one GPU, torchrun jobs)")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny Qwen2, fp32: test the script itself")
    ap.add_argument("--out", default=None, help="write the JSON here (default: $OUT/gpu_check.json when $OUT is set)")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in ("full", "lora", *SAMPLERS, "ranks")]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; choose from full, lora, {', '.join(SAMPLERS)}, ranks")
    if not args.smoke and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available (use --smoke for the CPU check of this script)"}))
        return 2
    with tempfile.TemporaryDirectory(prefix="grpo-gpu-check-") as scratch:  # models and runs: gone after
        res = check(Path(scratch), args, variants)
    text = json.dumps(res, indent=1)
    print(text)
    out = args.out or (str(Path(os.environ["OUT"]) / "gpu_check.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
