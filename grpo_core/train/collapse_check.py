"""The template-collapse check: do a step's completions still depend on their prompt (RAGEN-2, arXiv 2604.06268)?

A policy can keep a healthy trainable ratio while it collapses onto a template: completions
that vary (so groups still differ in reward) but no longer depend on the prompt. The ratio
cannot see it; retrieval can. Every health.collapse_every steps the trainer takes N distinct
prompts of the step's batch with one completion each (the first of its group), scores every
completion under every prompt (N x N log-likelihoods, each prompt forwarded once for its N
completions: grpo.token_logprobs' shared-prompt path) and asks, for each completion, whether
its own prompt scores it best. While completions depend on their prompt the retrieval accuracy
is near 1; under collapse it falls to chance, 1/N. Ties share the credit (a completion tied
best under k prompts, its own among them, counts 1/k), so a policy that ignores its prompt
scores exactly 1/N, not 1 or 0 by the order of the prompts.

Beside the accuracy: its skill above chance, (acc - 1/N) / (1 - 1/N) (0 at chance, 1 when every
completion finds its prompt: the alert rule's input, comparable across N), and the InfoNCE
lower bound on the mutual information between prompt and completion, in nats (at most log N):
the same scores read as a continuous signal, which moves before the accuracy does.

Scored by the current policy (after the step's update), in eval mode, in the compute dtype,
at the sampling temperature with the suppressed tokens removed, as the training log-probs
are. The trainer runs it on rank 0 only, on rank 0's share of the step (as the held-out
evaluation): a forward with no collective, so the other ranks never wait on it except at
the next step's gather. It never touches a random stream.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch

from grpo_core.runs import names
from grpo_core.train import grpo, out_of_memory
from grpo_core.train.native_sampling import Rollouts, mode

logger = logging.getLogger(__name__)


def due(health_cfg, step: int) -> bool:
    """After step `step` (numbered from 1): every health.collapse_every steps (0 = never)."""
    every = health_cfg.collapse_every
    return bool(every) and step % every == 0


def sample_rows(roll: Rollouts, n: int) -> list[int]:
    """The rows of the sample: the first completion of each of the first `n` groups whose
    prompt text is new (two groups of one prompt could not be told apart by any policy)."""
    sizes = roll.group_sizes()  # groups may differ in size (per-prompt budgets)
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    seen, rows = set(), []
    for prompt, first, size in zip(roll.prompts, firsts, sizes):
        if len(rows) == n:
            break
        if size and prompt not in seen:
            seen.add(prompt)
            rows.append(int(first))
    return rows


def pairs(roll: Rollouts, rows: list[int]) -> Rollouts:
    """The N x N batch: row j*N + i is prompt j (row rows[j]'s) followed by completion i (row
    rows[i]'s), so the N rows of a prompt are a group that token_logprobs forwards the prompt of once."""
    n, lp = len(rows), roll.prompt_len
    idx = torch.as_tensor(rows, device=roll.input_ids.device)
    prompt, pmask = roll.input_ids[idx, :lp], roll.attention_mask[idx, :lp]
    comp, cmask = roll.input_ids[idx, lp:], roll.attention_mask[idx, lp:]
    ids = torch.cat([prompt.repeat_interleave(n, 0), comp.repeat(n, 1)], 1)
    attn = torch.cat([pmask.repeat_interleave(n, 0), cmask.repeat(n, 1)], 1)
    return Rollouts(ids, attn, lp, [], [], n, n, [])


@torch.no_grad()
def pair_scores(model, batch: Rollouts, *, prompts_per_forward: int, temperature: float = 1.0,
                suppress_ids: list[int] | None = None, compute_dtype: torch.dtype = torch.float32,
                logit_chunk_mb: float = 0.0) -> np.ndarray:
    """scores [N, N] (float64): scores[i, j] = log p(completion i | prompt j), summed over the
    completion's tokens, from `prompts_per_forward` prompts (x N rows) per forward."""
    n, device = batch.group_size, batch.input_ids.device
    out = np.empty((n, n), np.float64)  # [prompt, completion] while filling
    per_chunk = grpo.chunk_tokens(logit_chunk_mb, grpo.vocab_size(model))
    with mode(model, training=False):
        for start in range(0, n, prompts_per_forward):
            stop = min(n, start + prompts_per_forward)
            ids, attn, lp = grpo.trim(batch.input_ids[start * n:stop * n], batch.attention_mask[start * n:stop * n],
                                      batch.prompt_len)
            with grpo.autocast(device, compute_dtype):
                logp, _ = grpo.token_logprobs(model, ids, attn, lp, temperature=temperature, suppress_ids=suppress_ids,
                                              group_size=n, chunk=per_chunk)
            out[start:stop] = logp.sum(-1).double().view(stop - start, n).cpu().numpy()
    return out.T


def retrieval(scores: np.ndarray, tol: float = 1e-5) -> dict[str, float]:
    """The check's scalars from scores [N, N] (scores[i, j]: completion i under prompt j).
    Scores within `tol` of a row's best, relative to it (at least `tol` nats), tie with it: the
    rounding of a float32 sum over a completion's tokens is not a preference."""
    n = scores.shape[0]
    top = scores.max(1, keepdims=True)
    best = scores >= top - tol * np.maximum(1.0, np.abs(top))
    acc = float(np.mean(np.diag(best) / best.sum(1)))
    chance = 1.0 / n
    # InfoNCE: mean of log p(c_i|x_i) - log((1/N) sum_j p(c_i|x_j)), a lower bound on I(prompt; completion).
    lse = np.logaddexp.reduce(scores, axis=1)
    mi = float(np.mean(np.diag(scores) - lse + math.log(n)))
    return {names.COLLAPSE_RETRIEVAL: acc, names.COLLAPSE_CHANCE: chance,
            names.COLLAPSE_SKILL: (acc - chance) / (1.0 - chance), names.COLLAPSE_MI: mi}


def check(trainer, roll: Rollouts) -> dict[str, float]:
    """The trainer's call after a due step: the scalars above and their time; none when the
    step has fewer than 2 distinct prompts here (nothing to tell apart) or when even one prompt
    per forward does not fit in memory (the check is skipped, the run goes on: a warning says so)."""
    t0 = time.perf_counter()
    h, g = trainer.cfg.health, trainer.cfg.grpo
    rows = sample_rows(roll, h.collapse_prompts)
    if len(rows) < 2:
        return {}
    batch = pairs(roll, rows)
    start = grpo.micro_batch_groups(trainer.model, batch, len(rows), g, trainer.compute_dtype)

    def attempt(per: int) -> np.ndarray:
        return pair_scores(trainer.model, batch, prompts_per_forward=per, temperature=g.temperature,
                           suppress_ids=trainer.suppress_ids, compute_dtype=trainer.compute_dtype,
                           logit_chunk_mb=g.logit_chunk_mb)
    try:
        scores = out_of_memory.halving(attempt, start, stage="the collapse check", knob="prompts per forward",
                                       on_retry=lambda per, error: logger.warning(
                                           "collapse check out of memory (%s): %d prompts per forward", error, per))
    except out_of_memory.OutOfMemory as error:
        logger.warning("collapse check skipped at step %d: %s", trainer.step, error)
        return {}
    return {**retrieval(scores), names.TIME_COLLAPSE: time.perf_counter() - t0}
