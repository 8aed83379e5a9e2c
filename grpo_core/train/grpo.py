"""The GRPO step's math after sampling: advantages -> log-probs -> loss -> update, as small functions over tensors.

Each is tested on its own (tests/test_trainer.py, and against TRL's own code in
tests/test_trl_arithmetic.py). The run machinery (requests, checkpoints, heartbeat, the store)
is in trainer.py and runs/lifecycle.py.

Facts the code relies on:
- With one update per batch (grpo.num_iterations = 1, the default) the "old" policy is the
  current one: old log-probs are the detached current log-probs (as TRL with
  num_iterations=1). The importance ratio is 1 in value and the clipped surrogate reduces to
  the policy gradient, with one forward pass. With N updates per batch the old log-probs are
  the sampling policy's, computed once before the first, so the ratio and clipping act.
- Non-trainable groups get advantage 0 (docs/design.md), and with beta = 0 a zero-advantage
  row has zero gradient, so by default they are dropped from the forward/backward batch:
  a step costs in proportion to its trainable ratio. A step with no trainable group does
  no backward at all and leaves every parameter untouched (with beta > 0 every row trains:
  its KL term has a gradient; with grpo.drop_untrainable off every step does TRL's work, the
  optimizer stepped too, so AdamW's momentum and weight decay move the weights as TRL's do).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from grpo_core.errors import ConfigError
from grpo_core.train import sampler_mismatch
from grpo_core.train.native_sampling import Rollouts, mode
from grpo_core.train.out_of_memory import is_out_of_memory
from grpo_core.train.ranks import SINGLE, Ranks

ADV_EPS = 1e-4  # as TRL: (r - mean) / (std + 1e-4)


# =============================================================================================
# Advantages and loss
# =============================================================================================
def advantages(totals: np.ndarray, trainable: np.ndarray, scale: str = "group", eps: float = ADV_EPS,
               std: str = "unbiased", sizes: np.ndarray | None = None) -> np.ndarray:
    """totals [P, G], trainable [P] -> advantages [P, G].

    group: (r - group mean) / (group std + eps); batch: divided by the whole batch's std
    instead; none: r - group mean. std "unbiased" is the Bessel-corrected std (n - 1), as TRL
    (`nanstd`) and verl (`torch.std`) divide by; "population" divides by n. Non-trainable
    groups get 0: a near-constant group's noise is never blown up into +-1 advantages.

    sizes [P]: groups of different sizes (per-prompt budgets), totals padded to the largest:
    each group's statistics are over its own sizes[g] rows (nan-aware over the padding, and
    over rows no metric scored), and the padding gets 0. With every size G and every total
    finite, numpy's nan-functions are the plain ones: the same numbers, bit for bit."""
    totals = np.asarray(totals, dtype=np.float64)
    if std not in ("unbiased", "population"):
        raise ConfigError(f"grpo.advantage_std must be 'unbiased' or 'population', got {std!r}")
    ddof = 1 if std == "unbiased" else 0
    mean, spread = np.mean, np.std
    valid = np.ones(totals.shape, bool)
    if sizes is not None:
        valid = np.arange(totals.shape[1])[None, :] < np.asarray(sizes)[:, None]
        totals, mean, spread = np.where(valid, totals, np.nan), np.nanmean, np.nanstd
    centered = totals - mean(totals, axis=1, keepdims=True)
    if scale == "group":
        adv = centered / (spread(totals, axis=1, ddof=ddof, keepdims=True) + eps)
    elif scale == "batch":
        adv = centered / (spread(totals, ddof=ddof) + eps)
    elif scale == "none":
        adv = centered
    else:
        raise ConfigError(f"grpo.scale must be 'group', 'batch' or 'none', got {scale!r}")
    keep = np.asarray(trainable, dtype=bool)[:, None]
    if sizes is None:
        return np.where(keep, adv, 0.0)
    return np.where(keep & valid & np.isfinite(adv), adv, 0.0)


def _reduce(x: torch.Tensor, mask: torch.Tensor, loss_type: str, denom: float | None = None) -> torch.Tensor:
    """token: sum over the masked tokens / denom (default: their count; long completions weigh
    more, as in DAPO); dr_grpo: the same sum / denom (default: rows x the mask's length; Dr.
    GRPO's constant, so neither a completion's length nor the batch's token count scales its
    tokens); sequence: sum of per-sequence means / denom (default: sequences with tokens)."""
    mask = mask.to(x.dtype)
    if loss_type == "token":
        return (x * mask).sum() / (denom if denom else mask.sum().clamp(min=1.0))
    if loss_type == "dr_grpo":
        return (x * mask).sum() / (denom if denom else _reduce_count(mask, loss_type))
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    has = (mask.sum(-1) > 0).to(x.dtype)
    return (per_seq * has).sum() / (denom if denom else has.sum().clamp(min=1.0))


def _reduce_count(mask: torch.Tensor, loss_type: str, max_len: int | None = None) -> float:
    """What a loss type divides by: tokens (token), rows x max_len (dr_grpo: TRL's
    max_completion_length, default the mask's length) or rows with tokens (sequence)."""
    if loss_type == "dr_grpo":
        return float(mask.shape[0] * (max_len or mask.shape[1]))
    return float(mask.sum()) if loss_type == "token" else float((mask.sum(-1) > 0).sum())


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *,
              policy_rows: torch.Tensor | None = None, eps_low: float = 0.2, eps_high: float = 0.2,
              loss_type: str = "token", ref_logp: torch.Tensor | None = None, beta: float = 0.0,
              policy_denom: float | None = None, kl_denom: float | None = None,
              token_weights: torch.Tensor | None = None):
    """Clipped surrogate (+ beta * k3 KL to the reference). Shapes: logp/old_logp/ref_logp/mask
    [B, L], adv [B], policy_rows [B] bool (rows whose group is trainable; default all).

    The policy term sums over the tokens of policy rows and divides by every row's tokens
    (token) or the number of rows (sequence), as TRL does with zero-advantage rows in the
    batch; `policy_denom` gives that count when rows were dropped before the call (train_on),
    so masking a non-trainable row and dropping it give the same gradient when beta = 0. A
    step with few trainable groups therefore takes a small step, not a full one built from
    a couple of prompts (a full step collapses the demo's policy after a level change:
    docs/benchmarks.md, "Behind the code"). The KL term averages over every row's tokens
    (train_on forwards every row when beta > 0), as TRL's; `kl_denom` gives that count for a
    micro-batch of the step (dr_grpo: both are rows x max_completion_length; by default the mask's
    length). token_weights [B, L] (detached) scale each token's policy term: the
    sampler/trainer importance weights of an engine-sampled batch (sampler_mismatch.py). Returns
    (loss, stats) with stats as floats ("clipped" and "policy_tokens": the clip ratio's counts, to
    add up over micro-batches)."""
    mask = mask.to(logp.dtype)
    pmask = mask if policy_rows is None else mask * policy_rows.to(logp.dtype)[:, None]
    ratio = torch.exp(logp - old_logp)
    a = adv.to(logp.dtype)[:, None]
    pg = -torch.minimum(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a)
    if token_weights is not None:
        pg = pg * token_weights.to(pg.dtype)
    policy = _reduce(pg, pmask, loss_type, policy_denom or _reduce_count(mask, loss_type))
    if ref_logp is not None and beta > 0:
        d = ref_logp - logp
        kl = _reduce(torch.exp(d) - d - 1, mask, loss_type, kl_denom)  # k3: unbiased, always >= 0
    else:
        kl = torch.zeros((), dtype=logp.dtype, device=logp.device)
    loss = policy + beta * kl
    with torch.no_grad():
        policy, kl = policy.detach(), kl.detach()
        clipped = ((ratio < 1 - eps_low) & (a < 0)) | ((ratio > 1 + eps_high) & (a > 0))
        n_clipped, n_policy = (clipped.to(pmask.dtype) * pmask).sum(), pmask.sum()
        clip = n_clipped / n_policy.clamp(min=1.0)
    return loss, {"policy": policy.item(), "kl": kl.item(), "clip_ratio": clip.item(), "clipped": n_clipped.item(),
                  "policy_tokens": n_policy.item()}


# Logits whose model forward is not head(decoder(x)): these configs scale or cap them after the head.
_LOGIT_POSTPROCESS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_of(model):
    """The LM head when the logits are exactly head(decoder hidden states), else None (the
    log-probs then come from the model's own logits). A LoRA reference (AdaptersOff) and a
    peft model reach the decoder and head of the model they wrap."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is None or any(getattr(text, k, None) not in (None, 1.0) for k in _LOGIT_POSTPROCESS):
        return None
    try:
        head, decoder = model.get_output_embeddings(), model.get_decoder()
    except (AttributeError, ValueError, NotImplementedError):
        return None
    return head if isinstance(head, torch.nn.Module) and decoder is not None else None


def _final_states(model, on_hidden: bool, keep: int, **kwargs):
    """The last `keep` positions' states, and the cache: the decoder's hidden states (before
    the LM head) when on_hidden, else the model's logits."""
    if on_hidden:
        out = model.get_decoder()(**kwargs)
        return out.last_hidden_state[:, -keep:], out.past_key_values
    out = model(**kwargs, logits_to_keep=keep)
    return out.logits, out.past_key_values


def _completion_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                       group_size: int | torch.Tensor, on_hidden: bool) -> torch.Tensor:
    """The states predicting each completion token [B, Lc, D] (D: hidden size, or the vocab
    for logits). Rows in groups of G with the same prompt (group_size = G > 1): the prompt
    goes through the model once per group, with grad, its KV cache is copied to the group's
    rows and the completions attend to it. The same function and gradient as one forward over
    all rows (tests/test_trainer.py), on a fraction of the tokens (docs/benchmarks.md,
    "Behind the code"). group_size a tensor of sizes: groups of different sizes, one after
    another (per-prompt budgets), each prompt's cache rows selected sizes[g] times."""
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    lc = input_ids.shape[1] - prompt_len
    checkpointing = model.training and bool(getattr(model, "is_activation_checkpointing", False))  # no KV cache
    fixed = isinstance(group_size, int)
    shared = group_size > 1 if fixed else len(group_size) < input_ids.shape[0]
    if shared and prompt_len > 0 and not checkpointing:
        firsts = slice(None, None, group_size) if fixed else torch.cumsum(group_size, 0) - group_size
        first, cache = _final_states(model, on_hidden, 1, input_ids=input_ids[firsts, :prompt_len],
                                     attention_mask=attention_mask[firsts, :prompt_len],
                                     position_ids=pos[firsts, :prompt_len], use_cache=True)
        if hasattr(cache, "batch_repeat_interleave"):
            if fixed:
                cache.batch_repeat_interleave(group_size)
            else:
                cache.batch_select_indices(torch.arange(len(group_size), device=pos.device).repeat_interleave(group_size))
            cpos = pos[:, prompt_len - 1:prompt_len] + 1 + torch.arange(lc, device=pos.device)  # as in sample_tokens
            rest, _ = _final_states(model, on_hidden, lc, input_ids=input_ids[:, prompt_len:],
                                    attention_mask=attention_mask, position_ids=cpos, past_key_values=cache,
                                    use_cache=True)
            return torch.cat([first.repeat_interleave(group_size, 0), rest[:, :-1]], 1)
    states, _ = _final_states(model, on_hidden, lc + 1, input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=pos, use_cache=False)
    return states[:, :-1]


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 for the log-softmax; float64 (the exactness tests) stays."""
    return logits if logits.dtype == torch.float64 else logits.float()


def _chunk_logprobs(states: torch.Tensor, targets: torch.Tensor, head, temperature: float,
                    suppress_ids: list[int] | None, with_entropy: bool):
    """Log-probs of `targets` [N] and their entropy [N] (no grad) from states [N, D]."""
    logits = _upcast(head(states))
    if temperature != 1.0:
        logits = logits / temperature
    if suppress_ids:  # the sampler never saw these tokens: the policy it sampled from excludes them
        logits = logits.index_fill(-1, torch.as_tensor(suppress_ids, device=logits.device), float("-inf"))
    logsm = logits.log_softmax(-1)
    logp = logsm.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        p = logsm.exp()
        return logp, -(p * logsm.masked_fill(p == 0, 0.0)).sum(-1)


def vocab_size(model) -> int:
    config = model.config
    return (config.get_text_config() if hasattr(config, "get_text_config") else config).vocab_size


def chunk_tokens(chunk_mb: float, vocab_size: int) -> int | None:
    """Completion tokens per log-prob chunk so its fp32 logits take `chunk_mb` MB (None: all at once)."""
    return max(1, int(chunk_mb * 2 ** 20 // (4 * vocab_size))) if chunk_mb > 0 else None


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, *,
                   temperature: float = 1.0, suppress_ids: list[int] | None = None, with_entropy: bool = False,
                   group_size: int | torch.Tensor = 1, chunk: int | None = None):
    """Log-probs of the completion tokens [B, Lc], and their entropy [B, Lc] (no grad) when
    asked; 0 on the masked positions. Positions follow the attention mask, as in `generate`
    with left padding. group_size = G: rows come in groups of G sharing a prompt (rows
    g*G .. g*G+G-1), whose forward is then shared; a tensor of sizes: groups of those sizes.

    The LM head runs on the attended completion tokens only, `chunk` of them at a time (None:
    all), each chunk's logits recomputed in backward (activation checkpointing), so no
    [rows, tokens, vocab] tensor is held beyond one chunk's, as TRL's chunked log-probs."""
    head = head_of(model)
    with getattr(model, "forward_context", nullcontext)():  # a LoRA reference: its adapters off
        states = _completion_states(model, input_ids, attention_mask, prompt_len, group_size, head is not None)
        mask = attention_mask[:, prompt_len:].bool()
        flat, targets = states[mask], input_ids[:, prompt_len:][mask]
        head = head if head is not None else (lambda logits: logits)
        size = chunk or max(len(flat), 1)
        recompute = torch.is_grad_enabled() and flat.requires_grad and len(flat) > size
        parts = []
        for s, t in zip(flat.split(size), targets.split(size)):
            args = (s, t, head, temperature, suppress_ids, with_entropy)
            parts.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute else
                         _chunk_logprobs(*args))
    dtype = torch.float64 if states.dtype == torch.float64 else torch.float32
    logp = torch.zeros(mask.shape, dtype=dtype, device=states.device)
    if not parts:
        return logp, logp.clone() if with_entropy else None
    logp = logp.masked_scatter(mask, torch.cat([lp for lp, _ in parts]))
    ent = torch.zeros_like(logp).masked_scatter(mask, torch.cat([e for _, e in parts])) if with_entropy else None
    return logp, ent


def trim(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
    """Drop columns that are padding in every row (left of the longest prompt, right of the
    longest completion): no forward pass is spent on them."""
    cols = attention_mask.any(0)
    first = int(cols[:prompt_len].long().argmax()) if prompt_len else 0
    last = prompt_len + int(attention_mask[:, prompt_len:].sum(-1).max())
    return input_ids[:, first:last], attention_mask[:, first:last], prompt_len - first


def autocast(device: torch.device, compute_dtype: torch.dtype):
    """Forward passes in the compute dtype (bf16/fp16) over fp32 weights; off in fp32."""
    return torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype in (torch.bfloat16, torch.float16))


def micro_batch_groups(model, roll: Rollouts, groups: int, gcfg, compute_dtype: torch.dtype) -> int:
    """Groups per forward/backward micro-batch: grpo.micro_batch_groups when set, else the most
    whole groups whose activations (and log-prob chunk) the memory model puts under
    grpo.micro_batch_mb, else all `groups` (micro_batch_mb 0)."""
    if gcfg.micro_batch_groups or not gcfg.micro_batch_mb or groups <= 1:
        return gcfg.micro_batch_groups or groups
    from grpo_core.train import memory_model
    try:
        arch = memory_model.Architecture.from_config(model.config)
    except AttributeError:  # a config the memory model cannot read: no budget
        return groups
    lengths = roll.attention_mask[:, roll.prompt_len:].sum(-1)
    step = memory_model.Step(rows=roll.group_size, prompt_tokens=roll.prompt_len, group_size=roll.group_size,
                             completion_tokens=int(lengths.max()), logit_chunk_mb=gcfg.logit_chunk_mb,
                             compute_dtype=str(compute_dtype).removeprefix("torch."), device="cpu",
                             gradient_checkpointing=bool(getattr(model, "is_activation_checkpointing", False)))
    est = memory_model.estimate(arch, step)
    per_group = est.activations + est.logprob_chunk
    return int(min(groups, max(1, gcfg.micro_batch_mb * 2 ** 20 // max(per_group, 1))))


def forwarded_groups(trainable: np.ndarray, gcfg, with_kl: bool) -> np.ndarray:
    """The groups [P] bool whose rows go through forward/backward: the trainable ones, or every
    group with a KL term (each row's KL has a gradient and TRL averages it over all tokens:
    dropping rows would change it) or with grpo.drop_untrainable off."""
    trainable = np.asarray(trainable, bool)
    if with_kl or not gcfg.drop_untrainable:
        return np.ones_like(trainable)
    return trainable


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The learning rate of update `step` (0 = the first) as a fraction of grpo.lr: a linear
    warmup from 0, then constant, linear to 0 or cosine to 0 at total_steps, exactly as
    transformers' get_scheduler("constant_with_warmup" | "linear" | "cosine") steps it
    (tests/test_trainer.py). Computed from the step, so a step budget changed mid-run stretches
    the schedule and a resumed run needs no scheduler state."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_on(model, optimizer, roll: Rollouts, adv: np.ndarray, trainable: np.ndarray, gcfg, *,
             ref_model=None, suppress_ids=None, compute_dtype: torch.dtype = torch.float32, scaler=None,
             world: Ranks = SINGLE) -> dict:
    """`gcfg.num_iterations` GRPO updates on the rollouts. adv [P, G] (groups of different sizes:
    padded to the largest, roll.sizes saying each group's rows), trainable [P]. Returns
    loss stats (policy, kl, clip_ratio, grad_norm, entropy: the mean over the passes); a batch
    with no trainable group returns zeros without a forward or backward, unless drop_untrainable
    is off (TRL's work: every group forwarded and backpropagated, the optimizer stepped, at every step).

    Each pass runs its forward/backward in micro-batches of whole groups (micro_batch_groups:
    the knob, or the most under grpo.micro_batch_mb), each loss divided by the whole step's counts, so the gradients add up to
    the one-batch gradient while the activations held are one micro-batch's. The forward passes
    run in `compute_dtype` under autocast, the update on the (fp32) weights the optimizer holds;
    `scaler` (a torch.amp.GradScaler, for fp16) scales the loss so small gradients survive.
    With one pass the old policy is the current one (ratio 1); with more, the old log-probs are
    the sampling policy's, computed once before the first pass, as TRL's num_iterations.

    Under torchrun `roll` is this rank's share of the step (`world`: ranks.py): the counts that
    divide the loss and the stats are summed over ranks, the gradients once per pass after the
    last micro-batch, so every rank takes the single-process update. Every rank runs the same
    collectives whatever its share: none trainable, fewer micro-batches, an out-of-memory retry
    (all ranks retry together)."""
    sizes = roll.group_sizes()  # every group G, or each its own (per-prompt budgets)
    row_trainable = torch.as_tensor(np.repeat(np.asarray(trainable, bool), sizes))
    with_kl = gcfg.beta > 0 and ref_model is not None
    forwarded = forwarded_groups(trainable, gcfg, with_kl)
    idx = torch.as_tensor(np.repeat(forwarded, sizes)).nonzero().squeeze(-1)
    # The step's counts, every rank's, in one all-reduce: trainable rows, the policy term's count
    # (every row, the dropped ones too), the KL term's (the rows forwarded), the rows forwarded.
    trainable_rows, policy_count, kl_count, rows = world.sum([
        float(row_trainable.sum()), _reduce_count(roll.completion_mask, gcfg.loss_type, gcfg.max_new_tokens),
        _reduce_count(roll.completion_mask[idx], gcfg.loss_type, gcfg.max_new_tokens), len(idx)])
    if not with_kl and not trainable_rows and gcfg.drop_untrainable:
        return {"policy": 0.0, "kl": 0.0, "clip_ratio": 0.0, "grad_norm": 0.0, "entropy": float("nan"),
                "rows": 0, "tokens": 0, "mismatch": {}}
    per = max(1, micro_batch_groups(model, roll, int(forwarded.sum()), gcfg, compute_dtype))  # whole groups
    adv = np.asarray(adv)
    adv_rows = adv[np.arange(adv.shape[1])[None, :] < sizes[:, None]]  # row order; adv.reshape(-1) when all G
    rows_per, shares = _chunks(roll, sizes[forwarded], per)
    batch = _Batch(roll, idx, rows_per, shares, torch.as_tensor(adv_rows, dtype=torch.float64), row_trainable,
                   (float(policy_count), float(kl_count)))
    learner = _Learner(model, optimizer, gcfg, ref_model, suppress_ids, compute_dtype, scaler, world)
    if gcfg.num_iterations > 1:
        batch.old = _agreed(world, lambda: _old_logprobs(learner, batch))
    passes = [_update(learner, batch) for _ in range(gcfg.num_iterations)]
    out = {k: float(np.mean([p[k] for p in passes])) for k in ("policy", "kl", "clip_ratio", "grad_norm", "entropy")}
    mismatch = passes[0]["mismatch"]
    if roll.sampler_logprobs is not None:  # engine-sampled (on every rank alike): every rank's tokens compared
        mismatch = [part for parts in world.gather(mismatch) for part in parts]
    return {**out, "rows": int(rows), "tokens": passes[0]["tokens"], "mismatch": sampler_mismatch.combine(mismatch)}


class ElsewhereOutOfMemory(MemoryError):
    """Another rank ran out of memory in this step: every rank retries with half the batch."""


def _agreed(world: Ranks, compute):
    """compute() on every rank, then one agreement: when any rank ran out of memory, every rank
    raises (its own error, or ElsewhereOutOfMemory), so all retry the step's training together."""
    failed = None
    try:
        result = compute()
    except Exception as error:
        if not (world.distributed and is_out_of_memory(error)):
            raise
        failed, result = error, None
    if world.any(failed is not None):
        if failed is not None:
            raise failed
        raise ElsewhereOutOfMemory("another rank ran out of memory")
    return result


def _chunks(roll: Rollouts, sizes: np.ndarray, groups: int) -> tuple[list[int], list]:
    """Micro-batches of `groups` whole groups (the forwarded groups' sizes given in order): each
    one's rows, and how its rows share prompts (token_logprobs' group_size: G, or its groups'
    sizes when they differ)."""
    starts = range(0, len(sizes), groups)
    rows = [int(sizes[i:i + groups].sum()) for i in starts]
    if roll.sizes is None or len(set(roll.sizes)) == 1:
        return rows, [roll.group_size if roll.sizes is None else int(roll.sizes[0])] * len(rows)
    return rows, [torch.as_tensor(sizes[i:i + groups], device=roll.input_ids.device) for i in starts]


@dataclass
class _Learner:
    """What every level of train_on trains with, travelling as one: the model and its optimizer,
    the GRPO knobs, the frozen reference, the token ids never sampled, the compute dtype with
    fp16's scaler, the ranks."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    gcfg: object  # GRPOConfig
    ref_model: torch.nn.Module | None
    suppress_ids: list[int] | None
    compute_dtype: torch.dtype
    scaler: object | None  # torch.amp.GradScaler (fp16), else None
    world: Ranks

    def logprobs(self, ids, attn, lp, group_size, *, model=None, with_entropy=False):
        """token_logprobs of `model` (default: the policy) with the run's temperature, suppressed
        ids and logit chunk."""
        model = self.model if model is None else model
        return token_logprobs(model, ids, attn, lp, temperature=self.gcfg.temperature, suppress_ids=self.suppress_ids,
                              with_entropy=with_entropy, group_size=group_size,
                              chunk=chunk_tokens(self.gcfg.logit_chunk_mb, vocab_size(self.model)))


@dataclass
class _Batch:
    """What every pass of train_on reuses."""
    roll: Rollouts
    idx: torch.Tensor  # the rows forwarded
    per: list[int]  # rows of each micro-batch (whole groups)
    shares: list  # each micro-batch's token_logprobs group_size: G, or its groups' sizes
    adv_rows: torch.Tensor  # [B] float64, to logp's dtype in grpo_loss
    row_trainable: torch.Tensor  # [B] bool
    denoms: tuple[float, float]  # the policy and KL terms' counts over the whole step (every rank's)
    old: torch.Tensor | None = None  # [B, Lc] the sampling policy's log-probs (passes > 1), else None

    def chunks(self) -> tuple[torch.Tensor, ...]:
        """The micro-batches' rows (none when this rank forwards no row)."""
        return self.idx.split(self.per) if len(self.idx) else ()


def _old_logprobs(learner: _Learner, batch: _Batch) -> torch.Tensor:
    """The log-probs of the policy that sampled the batch [B, Lc] (no grad), in train mode as
    the passes' forwards are: the first pass's ratio is then 1, as with one pass."""
    roll, old = batch.roll, None
    with torch.no_grad(), mode(learner.model, training=True):
        for chunk, share in zip(batch.chunks(), batch.shares):
            ids, attn, lp = trim(roll.input_ids[chunk], roll.attention_mask[chunk], roll.prompt_len)
            with autocast(roll.input_ids.device, learner.compute_dtype):
                logp, _ = learner.logprobs(ids, attn, lp, share)
            if old is None:
                old = torch.zeros(roll.completion_ids.shape, dtype=logp.dtype, device=logp.device)
            old[chunk, :logp.shape[1]] = logp
    return old


_SUMMED = ("policy", "kl", "clipped", "policy_tokens", "entropy_sum", "tokens")


def _update(learner: _Learner, batch: _Batch) -> dict:
    """One pass: the micro-batches' forward/backward, the gradients summed over ranks, clipping,
    one optimizer step."""
    optimizer, scaler, world, gcfg = learner.optimizer, learner.scaler, learner.world, learner.gcfg
    optimizer.zero_grad(set_to_none=True)

    def local() -> tuple[dict, list]:
        total, mismatch = dict.fromkeys(_SUMMED, 0.0), []
        with mode(learner.model, training=True):
            for chunk, share in zip(batch.chunks(), batch.shares):
                part = _micro_batch(learner, batch, chunk, share)
                mismatch.append(part.pop("mismatch"))
                for k in total:
                    total[k] += part[k]
        return total, mismatch
    total, mismatch = _agreed(world, local)
    total = dict(zip(_SUMMED, world.sum([total[k] for k in _SUMMED])))
    params = [p for g in optimizer.param_groups for p in g["params"]]
    world.sum_gradients(params)
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients
    gn = torch.nn.utils.clip_grad_norm_(params, gcfg.max_grad_norm if gcfg.max_grad_norm > 0 else float("inf"))
    if scaler is not None:
        scaler.step(optimizer)  # skipped when a gradient overflowed; the scale then shrinks
        scaler.update()
    else:
        optimizer.step()
    return {"policy": total["policy"], "kl": total["kl"], "clip_ratio": total["clipped"] / max(total["policy_tokens"], 1.0),
            "grad_norm": float(gn), "entropy": total["entropy_sum"] / max(total["tokens"], 1),
            "tokens": int(total["tokens"]), "mismatch": mismatch}


def _micro_batch(learner: _Learner, batch: _Batch, chunk: torch.Tensor, G) -> dict:
    """Forward and backward of the rows `chunk` (whole groups, sharing prompts as G says); the
    gradients accumulate."""
    roll, gcfg = batch.roll, learner.gcfg
    device = roll.input_ids.device
    ids, attn, lp = trim(roll.input_ids[chunk], roll.attention_mask[chunk], roll.prompt_len)
    cmask = attn[:, lp:]
    with autocast(device, learner.compute_dtype):  # the log-softmax itself runs on fp32 logits (_upcast)
        logp, ent = learner.logprobs(ids, attn, lp, G, with_entropy=True)  # whole groups: share prompts
        ref = None
        if gcfg.beta > 0 and learner.ref_model is not None:
            with torch.no_grad():
                ref, _ = learner.logprobs(ids, attn, lp, G, model=learner.ref_model)
    old = logp.detach() if batch.old is None else batch.old[chunk, :logp.shape[1]]
    weights, mismatch = None, {}
    if roll.sampler_logprobs is not None:  # sampled by another engine: its log-probs against the old policy's
        sampled = roll.sampler_logprobs[chunk, :logp.shape[1]].to(device, old.dtype)
        mismatch = sampler_mismatch.mismatch_sums(old, sampled, cmask)
        if gcfg.vllm_importance_sampling_correction:
            weights = sampler_mismatch.importance_weights(old, sampled, cmask.to(old.dtype),
                                                          gcfg.vllm_importance_sampling_mode,
                                                          gcfg.vllm_importance_sampling_cap)
    loss, stats = grpo_loss(logp, old, batch.adv_rows[chunk].to(device), cmask,
                            policy_rows=batch.row_trainable[chunk].to(device), eps_low=gcfg.epsilon_low,
                            eps_high=gcfg.epsilon_high, loss_type=gcfg.loss_type, ref_logp=ref, beta=gcfg.beta,
                            policy_denom=batch.denoms[0], kl_denom=batch.denoms[1], token_weights=weights)
    (learner.scaler.scale(loss) if learner.scaler is not None else loss).backward()
    m = cmask.to(ent.dtype)
    return {**stats, "entropy_sum": float((ent * m).sum()), "tokens": int(cmask.sum()), "mismatch": mismatch}
