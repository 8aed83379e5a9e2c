"""A step's sampled batch: this rank's rollouts to train on, and the whole step's scores every rank computes the health numbers from.

In a single process the two are the same groups. Under torchrun each rank samples and scores
its share of the step's prompts (ranks.Ranks.share); `gather` joins every rank's texts, scores
and lengths in prompt order, so the counts, advantages and everything logged are computed from
the global batch, identically on every rank, exactly as one process would.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_core.train.native_sampling import Rollouts, concat_rollouts
from grpo_core.train.ranks import Ranks


@dataclass
class Scored:
    """One draw's groups as scored: the part every rank shares (no tensors)."""
    prompts: list[str]  # [p] each group's prompt as the model read it
    texts: list[str]  # [p*G] the completions
    lengths: np.ndarray  # [p*G] completion tokens
    raw: np.ndarray  # [p*G, K] raw metric scores
    errors: list[str | None]  # [p*G] "metric: what went wrong", or None

    @classmethod
    def of(cls, roll: Rollouts, raw: np.ndarray, errors: list) -> "Scored":
        return cls(list(roll.prompts), list(roll.texts), roll.completion_mask.sum(-1).cpu().numpy(),
                   np.asarray(raw, np.float64), list(errors))

    @classmethod
    def join(cls, parts: list["Scored"]) -> "Scored":
        return cls(sum((p.prompts for p in parts), []), sum((p.texts for p in parts), []),
                   np.concatenate([p.lengths for p in parts]), np.concatenate([p.raw for p in parts]),
                   sum((p.errors for p in parts), []))


def gather(ranks: Ranks, mine: Scored) -> Scored:
    """Every rank's share of one draw, in rank order: the draw's groups in prompt order."""
    return mine if not ranks.distributed else Scored.join(ranks.gather(mine))


@dataclass
class StepBatch:
    """What a step sampled (one prompt batch, or several with dynamic sampling)."""
    roll: Rollouts  # this rank's groups, to train on
    mine: np.ndarray  # [p] the indices of roll's groups among the step's
    examples: list[dict]  # [P] the step's groups' examples, every rank's
    scored: Scored  # the step's groups as scored, every rank's
    batches: int  # prompt batches drawn
    generate_s: float  # this rank's sampling time
    score_s: float  # this rank's scoring time

    @classmethod
    def join(cls, rolls: list[Rollouts], pad_id: int, mine: list[int], examples: list[dict], scored: list[Scored],
             generate_s: float, score_s: float) -> "StepBatch":
        return cls(concat_rollouts(rolls, pad_id), np.asarray(mine, dtype=np.int64), examples,
                   Scored.join(scored), len(rolls), generate_s, score_s)
