"""Health metrics: pure, vectorised numpy/pandas over one step or a window of steps.

Vocabulary (../shared/DESIGN.md): a *group* is the G completions of one prompt; its
reward std is the population std (ddof=0) of the weighted totals; it is *trainable*
when that std > min_group_std (0 reproduces ART's "not all equal"); with an outcome
gate it must also vary in the outcome metric, else it is *phantom* (its variance is
shaping terms only). No Python loop over groups anywhere here: the dashboard calls
these on tens of thousands of rollouts per refresh.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_core import names as N

# Float noise: a group of identical rewards has std ~1e-17, not 0; "not all equal" must say no.
STD_EPS = 1e-8  # torch.isclose(std, 0) in TRL uses atol 1e-8


@dataclass
class GroupStats:
    mean: np.ndarray  # [P] mean total reward per group
    std: np.ndarray  # [P] population std of the total reward per group
    trainable: np.ndarray  # [P] bool
    phantom: np.ndarray  # [P] bool: passes the std gate, outcome metric uniform
    metric_std: np.ndarray | None  # [P, K] within-group std of each raw metric


def group_stats(totals: np.ndarray, scores: np.ndarray | None = None, *, min_group_std: float = 0.01,
                outcome_index: int | None = None, uniform_std: float = 1e-3) -> GroupStats:
    """totals [P, G] weighted rewards; scores [P, G, K] raw metric scores (optional)."""
    totals = np.asarray(totals, dtype=np.float64)
    mean = totals.mean(axis=1)
    std = totals.std(axis=1)  # ddof=0, as TRL and ART compute it
    passes = std > max(min_group_std, STD_EPS)
    metric_std = None if scores is None else np.asarray(scores, dtype=np.float64).std(axis=1)
    phantom = np.zeros_like(passes)
    trainable = passes
    if outcome_index is not None and metric_std is not None:
        outcome_varies = metric_std[:, outcome_index] > max(uniform_std, STD_EPS)
        phantom = passes & ~outcome_varies
        trainable = passes & outcome_varies
    return GroupStats(mean, std, trainable, phantom, metric_std)


def trainable_ratio(submitted: float, trainable: float) -> float:
    return float(trainable) / float(submitted) if submitted else 0.0


def step_scalars(stats: GroupStats, scores: np.ndarray, metric_names: list[str],
                 weights: dict[str, float], cum_submitted: int, cum_trainable: int) -> dict[str, float]:
    """The per-step health and reward scalars under names.py's names.

    cum_submitted / cum_trainable are the totals *before* this step."""
    p = len(stats.mean)
    t = int(stats.trainable.sum())
    cs, ct = cum_submitted + p, cum_trainable + t
    out = {
        N.GROUPS_SUBMITTED: p, N.GROUPS_TRAINABLE: t,
        N.CUM_GROUPS_SUBMITTED: cs, N.CUM_GROUPS_TRAINABLE: ct,
        N.TRAINABLE_RATIO: trainable_ratio(p, t), N.CUM_TRAINABLE_RATIO: trainable_ratio(cs, ct),
        N.PHANTOM_GROUPS: int(stats.phantom.sum()),
        N.REWARD: float(stats.mean.mean()), N.REWARD_STD: float(stats.std.mean()),
        N.FRAC_REWARD_ZERO_STD: float((stats.std <= STD_EPS).mean()),
    }
    scores = np.asarray(scores, dtype=np.float64)
    means = scores.reshape(-1, scores.shape[-1]).mean(axis=0)
    mstd = stats.metric_std.mean(axis=0) if stats.metric_std is not None else scores.std(axis=1).mean(axis=0)
    for k, name in enumerate(metric_names):
        out[N.metric_mean(name)] = float(means[k])
        out[N.metric_group_std(name)] = float(mstd[k])
        out[N.metric_weight(name)] = float(weights.get(name, 0.0))
    return out
