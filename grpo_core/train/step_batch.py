"""A step's sampled batch: this rank's rollouts to train on, and the whole step's scores every rank computes the health numbers from.

In a single process the two are the same groups. Under torchrun each rank samples and scores
its share of the step's prompts (ranks.Ranks.share); `gather` joins every rank's texts, scores
and lengths in prompt order, so the counts, advantages and everything logged are computed from
the global batch, identically on every rank, exactly as one process would.

Groups may differ in size (per-prompt budgets, budgets.py): then `StepBatch.sizes` holds each
group's rows, and `grouped` lays the step's rows out as [P, largest group] padded with NaN
(numpy's nan-aware statistics leave the padding out: step_stats' counts and grpo.advantages are
each group's own); `store_columns` writes each group with its own size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grpo_core.runs.step_columns import StepGroups, StepRollouts
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
    sizes: np.ndarray | None = None  # [P] each group's rows when they differ (per-prompt budgets), else None
    scalars: dict = field(default_factory=dict)  # the sampling's own step scalars (budgets.py)

    def group_sizes(self, group_size: int) -> np.ndarray:
        """[P] each group's rows (group_size each when they do not differ)."""
        return np.full(len(self.examples), group_size, np.int64) if self.sizes is None else np.asarray(self.sizes)

    def grouped(self, flat: np.ndarray, group_size: int, fill: float = np.nan) -> np.ndarray:
        """The step's rows [N, ...] as groups [P, G, ...]: a reshape when every group has group_size
        rows, else padded to the largest with `fill` after each group's own rows."""
        flat = np.asarray(flat)
        if self.sizes is None:
            return flat.reshape(len(self.examples), group_size, *flat.shape[1:])
        sizes = np.asarray(self.sizes)
        out = np.full((len(sizes), int(sizes.max())) + flat.shape[1:], fill, np.float64)
        out[np.arange(out.shape[1])[None, :] < sizes[:, None]] = flat
        return out

    @classmethod
    def join(cls, rolls: list[Rollouts], pad_id: int, mine: list[int], examples: list[dict], scored: list[Scored],
             generate_s: float, score_s: float) -> "StepBatch":
        return cls(concat_rollouts(rolls, pad_id), np.asarray(mine, dtype=np.int64), examples,
                   Scored.join(scored), len(rolls), generate_s, score_s)

    def padded_rows(self, *columns):
        """Per-row columns [N] (lists or arrays) as [P x largest group] rows, each group's padding a
        copy of its first row, so a test that every row of a group has a property, or that all are
        the same, is unchanged (flat_causes' all errored, all truncated, identical). Unchanged when
        the groups do not differ in size."""
        if self.sizes is None:
            return columns
        sizes = np.asarray(self.sizes)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        width = int(sizes.max())
        pick = [int(s + (j if j < n else 0)) for s, n in zip(starts, sizes) for j in range(width)]
        return tuple(None if c is None else np.asarray(c)[pick] if isinstance(c, np.ndarray) else [c[i] for i in pick]
                     for c in columns)


def row_index(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group and its index in the group, groups of sizes[g] rows one after another."""
    sizes = np.asarray(sizes, np.int64)
    group = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return group, np.arange(len(group)) - starts[group]


def store_columns(sample: StepBatch, group_size: int, metric_names: list[str], totals: np.ndarray, stats, outcomes,
                  text_groups: int) -> tuple[StepGroups, StepRollouts]:
    """The step's groups and rollouts as the store takes them: totals [N] in row order, the
    completions' texts of the first `text_groups` groups kept."""
    done, sizes = sample.scored, sample.group_sizes(group_size)
    P, n = len(sample.examples), len(done.texts)
    groups = StepGroups(np.arange(P), [e.get("prompt_id", str(i)) for i, e in enumerate(sample.examples)],
                        sizes, stats.mean, stats.std, stats.trainable, stats.phantom, prompt_text=done.prompts,
                        outcome=outcomes)
    kept = int(sizes[:text_groups].sum())
    group, idx = row_index(sizes)
    return groups, StepRollouts(metric_names, group, idx, totals, done.raw,
                                done.texts[:kept] + [None] * (n - kept), done.errors)
