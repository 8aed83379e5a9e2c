"""A run's rollouts as flat arrays, one contiguous segment per group, and per-metric statistics inside the groups.

Ragged groups are allowed (an imported run's groups need not be equal): every per-group
quantity is a segment sum (np.add.reduceat), so there is no Python loop over groups.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.analysis.step_stats import STD_EPS
from grpo_core.runs.live_settings import check_weights

ROLLOUT_COLUMNS = ("step", "group", "idx", "total", "error", "completion")


@dataclass
class RolloutArrays:
    """A window of rollouts as flat arrays, rows sorted by (step, group, idx) so each group
    is one contiguous segment: every per-group quantity is an np.add.reduceat away."""
    scores: np.ndarray  # [N, K] raw metric scores (NaN -> 0, as the composite scores a failed metric)
    codes: np.ndarray  # [N] group code 0..n_groups-1, non-decreasing
    n_groups: int
    group_step: np.ndarray  # [n_groups] step of each group
    group_id: np.ndarray  # [n_groups] group number inside its step
    starts: np.ndarray  # [n_groups] first row of each group
    counts: np.ndarray  # [n_groups] rollouts in each group (ragged allowed)
    metric_names: list[str]


def metric_columns(rollouts: pd.DataFrame) -> list[str]:
    """The per-metric score columns of a RunStore.rollouts() frame."""
    return [c for c in rollouts.columns if c not in ROLLOUT_COLUMNS]


def rollout_arrays(rollouts: pd.DataFrame, metric_names: list[str] | None = None) -> RolloutArrays:
    """RunStore.rollouts() frame (step, group, idx, total, <metric>...) -> RolloutArrays."""
    names = list(metric_columns(rollouts) if metric_names is None else metric_names)
    missing = [m for m in names if m not in rollouts.columns]
    n = len(rollouts)
    if missing and n:
        raise ValueError(f"no scores for metric(s) {', '.join(missing)} in these rollouts "
                         f"(metrics: {', '.join(metric_columns(rollouts)) or 'none'})")
    step = rollouts["step"].to_numpy(np.int64) if n else np.zeros(0, np.int64)
    grp = rollouts["group"].to_numpy(np.int64) if n else np.zeros(0, np.int64)
    scores = rollouts[names].to_numpy(np.float64, na_value=np.nan) if n else np.zeros((0, len(names)))
    ds, dg = np.diff(step), np.diff(grp)
    if not np.all((ds > 0) | ((ds == 0) & (dg >= 0))):  # the store returns sorted rows; others may not
        keys = (rollouts["idx"].to_numpy(), grp, step) if "idx" in rollouts.columns else (grp, step)
        order = np.lexsort(keys)
        step, grp, scores = step[order], grp[order], scores[order]
    scores = np.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)
    is_start = np.empty(n, dtype=bool)
    if n:
        is_start[0] = True
        is_start[1:] = (step[1:] != step[:-1]) | (grp[1:] != grp[:-1])
    starts = np.flatnonzero(is_start)
    codes = np.cumsum(is_start) - 1
    counts = np.diff(np.append(starts, n))
    return RolloutArrays(scores, codes, len(starts), step[starts], grp[starts], starts, counts, names)


def dense_arrays(scores: np.ndarray) -> RolloutArrays:
    """[P, G, K] (equal group sizes) -> RolloutArrays, metrics unnamed."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 3:
        raise ValueError(f"scores must be [groups, group_size, metrics], got shape {s.shape}")
    p, g, k = s.shape
    starts = np.arange(0, p * g, g)
    return RolloutArrays(s.reshape(p * g, k), np.repeat(np.arange(p), g), p, np.zeros(p, np.int64),
                         np.arange(p), starts, np.full(p, g), [f"m{i}" for i in range(k)])


def as_arrays(x, metric_names: list[str] | None = None) -> RolloutArrays:
    if isinstance(x, RolloutArrays):
        return x
    if isinstance(x, pd.DataFrame):
        return rollout_arrays(x, metric_names)
    return dense_arrays(x)


def seg_mean(x: np.ndarray, a: RolloutArrays) -> np.ndarray:
    c = a.counts if x.ndim == 1 else a.counts[:, None]
    return np.add.reduceat(x, a.starts, axis=0) / c


def seg_std(x: np.ndarray, a: RolloutArrays) -> np.ndarray:
    """Population std (ddof=0) of x [N] or [N, C] inside each group: two-pass, so a group of
    equal values gives exactly 0 and large offsets do not cancel."""
    dev = x - seg_mean(x, a)[a.codes]
    return np.sqrt(seg_mean(dev * dev, a))


def per_metric_group_std(scores) -> np.ndarray:
    """[K]: mean over groups of each raw metric's within-group std. scores: [P, G, K],
    RolloutArrays or a rollouts frame (ragged groups allowed)."""
    a = as_arrays(scores)
    if a.n_groups == 0:
        return np.full(a.scores.shape[1], np.nan)
    return seg_std(a.scores, a).mean(axis=0)


def uniform_fraction(scores, uniform_std: float = 1e-3) -> np.ndarray:
    """[K]: share of groups in which each metric is uniform (within-group std <= uniform_std)."""
    a = as_arrays(scores)
    if a.n_groups == 0:
        return np.full(a.scores.shape[1], np.nan)
    return (seg_std(a.scores, a) <= max(uniform_std, STD_EPS)).mean(axis=0)


def variance_contribution(scores, weights) -> np.ndarray:
    """[K]: share of the within-group variance of the weighted total that each metric explains.

    Var(sum_k w_k x_k) = sum_k w_k Cov(x_k, total), pooled over groups (sums of within-group
    cross-products, so bigger groups weigh more). Shares sum to 1 when the total varies;
    a share can be negative (a metric that works against the others). All zeros when the
    total is constant in every group: there is no variance to explain."""
    a = as_arrays(scores)
    w = weight_vector(weights, a.metric_names) if isinstance(weights, dict) else np.asarray(weights, np.float64)
    if w.shape != (a.scores.shape[1],):
        raise ValueError(f"weights must have one value per metric ({a.scores.shape[1]}), got shape {w.shape}")
    if a.n_groups == 0:
        return np.zeros_like(w)
    xc = a.scores - seg_mean(a.scores, a)[a.codes]
    t = xc @ w
    var = float(t @ t)
    if var <= 0.0:
        return np.zeros_like(w)
    return w * (xc.T @ t) / var


def weight_vector(weights: dict[str, float], metric_names: list[str]) -> np.ndarray:
    clean = check_weights(weights, metric_names)
    return np.array([clean.get(m, 0.0) for m in metric_names], dtype=np.float64)

