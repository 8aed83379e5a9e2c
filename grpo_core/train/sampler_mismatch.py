"""The sampler/trainer mismatch of an engine-sampled batch: the importance weights that correct it, and its health numbers.

A completion sampled by another engine (vLLM) was drawn from the engine's probabilities, not
the trainer's: the kernels differ, and a weight sync that failed or went stale makes them
differ a lot. With the sampler's log-prob of each token kept, the trainer's own log-prob
(before its update) gives the ratio p_trainer / p_sampler per token. The loss weighs each
token by it, bounded (truncated importance sampling, as TRL's vllm_importance_sampling_*), and
the step logs how far apart the two were (names.SAMPLER_*: TRL's names for them).
"""
from __future__ import annotations

import torch

from grpo_core.runs import names


def importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> torch.Tensor:
    """[B, L] detached weights for each token's policy loss. trainer_logp: the trainer's log-probs
    before the update (the old policy); sampler_logp: the engine's; mask: completion tokens.
    token_*: one ratio per token; sequence_*: the completion's product, on each of its tokens.
    *_truncate: clipped to `cap`; *_mask: 0 where the ratio is above `cap`."""
    diff = ((trainer_logp - sampler_logp) * mask).detach()
    diff = torch.nan_to_num(diff, nan=0.0)  # a token the engine could not score: weight 1
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True).expand_as(mask)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio.clamp(max=cap)
    return ratio.masked_fill(ratio > cap, 0.0)


def mismatch_sums(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> dict:
    """A micro-batch's share of the step's mismatch numbers, to add up with `combine`."""
    m = mask.bool()
    diff = (trainer_logp.detach() - sampler_logp)[m].double()
    diff = diff[~torch.isnan(diff)]
    if not diff.numel():
        return {"n": 0}
    ratio = diff.exp()
    return {"n": int(diff.numel()), "abs_sum": float(diff.abs().sum()), "abs_max": float(diff.abs().max()),
            "ratio_sum": float(ratio.sum()), "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def combine(parts: list[dict]) -> dict[str, float]:
    """The step's mismatch scalars (names.SAMPLER_*) from its micro-batches' sums; {} when no token was compared."""
    parts = [p for p in parts if p.get("n")]
    n = sum(p["n"] for p in parts)
    if not n:
        return {}
    return {names.SAMPLER_LOGP_DIFF_MEAN: sum(p["abs_sum"] for p in parts) / n,
            names.SAMPLER_LOGP_DIFF_MAX: max(p["abs_max"] for p in parts),
            names.SAMPLER_IS_RATIO_MIN: min(p["ratio_min"] for p in parts),
            names.SAMPLER_IS_RATIO_MEAN: sum(p["ratio_sum"] for p in parts) / n,
            names.SAMPLER_IS_RATIO_MAX: max(p["ratio_max"] for p in parts)}
