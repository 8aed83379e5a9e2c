"""GPU check: the embedded trainer on CUDA with a ~100M-parameter built-in model.

One prepared run (< 5 minutes on one GPU) of the real loop (`Trainer.run()`): a 12-layer,
768-wide Llama with the built-in character tokenizer, bf16, the demo task's prompts
(level 4, the longest), 16 prompts x 16 completions, up to 128 new tokens. The model is
random (no warm-start: that would dominate the budget), so a seeded per-completion
"noise" reward (a custom metric, reward.custom) gives every group reward spread: every
step then does the full sampling pass and the full forward/backward, which is what is
being measured. Prints one JSON object:

- generation tokens/s (completion tokens sampled / time/generate_s) and training tokens/s
  (prompt + completion tokens through forward/backward / time/train_s), medians per step;
- seconds per step, torch.cuda.max_memory_allocated, parameters, device name;
- the two fast paths against what they replace, on this GPU: the sampling loop vs
  `model.generate` over P*G rows, the shared-prompt forward/backward vs one forward over
  all rows (seconds, medians of 3).

    python bench/gpu_check.py [--steps 12] [--out gpu_check.json]
    python bench/gpu_check.py --smoke      # CPU, tiny model, 3 steps: checks the script itself
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

BIG = dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072)
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256)


def noise(completion: str, example: dict) -> float:
    """A reward in [0, 1) from a hash of the completion: distinct completions (a random model
    samples nothing but) score differently, so every group is trainable."""
    return int(hashlib.sha1(completion.encode()).hexdigest()[:8], 16) / 2**32


def make_config(smoke: bool, steps: int):
    from grpo_core.config import RunConfig, validate
    cfg = RunConfig()
    for k, v in (TINY if smoke else BIG).items():
        setattr(cfg.model, k, v)
    cfg.model.warm_start_steps = 0
    cfg.model.device = "cpu" if smoke else "cuda"
    cfg.task.level = 4
    cfg.reward.weights = {"noise": 1.0}
    cfg.reward.custom = {"noise": "gpu_check:noise"}
    g = cfg.grpo
    g.prompts_per_step, g.group_size, g.max_new_tokens = (2, 4, 16) if smoke else (16, 16, 128)
    g.steps, g.lr = steps, 1e-5
    cfg.log.progress, cfg.log.checkpoint_every = False, 0
    return validate(cfg)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_s(fn, device, n: int = 3) -> float:
    fn()
    out = []
    for _ in range(n):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def fast_path_checks(tr, device) -> dict:
    """Each fast path against what it replaces, on the trainer's model and a real batch."""
    from grpo_core import grpo
    from profile_step import reference_sample_tokens
    g, tok = tr.cfg.grpo, tr.tokenizer
    exs = tr.task.batch(g.prompts_per_step)
    enc = tok([e["prompt"] for e in exs], return_tensors="pt", padding=True).to(device)
    kw = dict(max_new_tokens=g.max_new_tokens, eos_ids=grpo.eos_token_ids(tr.model, tok), pad_id=tok.pad_token_id,
              suppress_ids=tr.suppress_ids)
    args = (tr.model, enc["input_ids"], enc["attention_mask"], g.group_size)
    out = {"sampling_loop_s": median_s(lambda: grpo.sample_tokens(*args, **kw), device),
           "generate_s": median_s(lambda: reference_sample_tokens(*args, **kw), device)}
    roll = grpo.rollout(tr.model, tok, exs, g.group_size, max_new_tokens=g.max_new_tokens, suppress_ids=tr.suppress_ids)
    ids, attn, lp = grpo.trim(roll.input_ids, roll.attention_mask, roll.prompt_len)

    def fwd_bwd(G):
        tr.model.zero_grad(set_to_none=True)
        logp, _ = grpo.token_logprobs(tr.model, ids, attn, lp, suppress_ids=tr.suppress_ids, group_size=G)
        (logp.sum() / attn.sum()).backward()
    out["shared_prompt_fwd_bwd_s"] = median_s(lambda: fwd_bwd(g.group_size), device)
    out["full_fwd_bwd_s"] = median_s(lambda: fwd_bwd(1), device)
    tr.model.zero_grad(set_to_none=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12, help="timed steps (after 2 warm-up steps)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, 3 steps: test the script itself")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print(json.dumps({"error": "CUDA is not available (use --smoke for the CPU check of this script)"}))
        return 2
    from grpo_core import names
    from grpo_core.store import RunStore
    from grpo_core.trainer import Trainer, set_threads

    steps = 3 if args.smoke else args.steps
    warm = 1 if args.smoke else 2
    cfg = make_config(args.smoke, warm + steps)
    set_threads(cfg)
    root = Path(tempfile.mkdtemp(prefix="grpo-gpu-check-"))
    store = RunStore.create("gpu-check", cfg.to_dict(), root=root)
    t0 = time.perf_counter()
    tr = Trainer(cfg, store, log=lambda m: print(m, file=sys.stderr))
    device = tr.device
    load_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    # Tokens per step: count them where they are made (rollout / train_on), not from the logs.
    from grpo_core import grpo
    counts = []
    rollout, train_on = grpo.rollout, grpo.train_on

    def counted_rollout(*a, **kw):
        r = rollout(*a, **kw)
        counts.append({"completion_tokens": int(r.completion_mask.sum()), "rows": len(r.texts)})
        return r

    def counted_train_on(model, opt, roll, *a, **kw):
        out = train_on(model, opt, roll, *a, **kw)
        counts[-1]["train_tokens"] = int(roll.attention_mask.sum()) if out.get("rows") else 0
        return out
    grpo.rollout, grpo.train_on = counted_rollout, counted_train_on
    try:
        t0 = time.perf_counter()
        tr.run()
        run_s = time.perf_counter() - t0
    finally:
        grpo.rollout, grpo.train_on = rollout, train_on
    w = store.scalars_wide(names=[names.TIME_STEP, names.TIME_GENERATE, names.TIME_TRAIN, names.REWARD, names.TRAINABLE_RATIO])
    w, c = w.iloc[warm:], counts[warm:]
    gen_tps = [x["completion_tokens"] / t for x, t in zip(c, w[names.TIME_GENERATE])]
    train_tps = [x.get("train_tokens", 0) / t for x, t in zip(c, w[names.TIME_TRAIN]) if t > 0]
    res = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (smoke)",
        "dtype": str(next(tr.model.parameters()).dtype), "compute_dtype": str(tr.compute_dtype),
        "torch": torch.__version__,
        "params": sum(p.numel() for p in tr.model.parameters()),
        "model": {k: getattr(cfg.model, k) for k in (TINY if args.smoke else BIG)},
        "batch": {"prompts": cfg.grpo.prompts_per_step, "group_size": cfg.grpo.group_size,
                  "max_new_tokens": cfg.grpo.max_new_tokens},
        "steps_timed": len(w), "load_s": round(load_s, 2), "run_s": round(run_s, 2),
        "step_s_median": statistics.median(w[names.TIME_STEP]),
        "generate_s_median": statistics.median(w[names.TIME_GENERATE]),
        "train_s_median": statistics.median(w[names.TIME_TRAIN]),
        "generation_tokens_per_s": statistics.median(gen_tps),
        "training_tokens_per_s": statistics.median(train_tps) if train_tps else None,
        "completion_tokens_per_step": statistics.median(x["completion_tokens"] for x in c),
        "trainable_ratio_median": float(w[names.TRAINABLE_RATIO].median()),
        "max_memory_allocated_gib": (torch.cuda.max_memory_allocated() / 2**30) if device.type == "cuda" else None,
    }
    res["fast_paths"] = fast_path_checks(tr, device)
    store.close()
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
