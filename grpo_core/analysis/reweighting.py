"""What-if under other reward weights: the trainable ratio a window would have had, and weights near the current ones that would have made more groups trainable."""
from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_core.analysis.rollout_stats import (
    RolloutArrays,
    as_arrays,
    seg_mean,
    seg_std,
    uniform_fraction,
    weight_vector,
)
from grpo_core.analysis.step_stats import STD_EPS, trainable_ratio


def outcome_varies(a: RolloutArrays, outcome_metric: str, uniform_std: float) -> np.ndarray:
    """bool [n_groups]: the outcome gate (the outcome metric itself varies in the group)."""
    if outcome_metric not in a.metric_names:
        raise ValueError(f"outcome metric {outcome_metric!r} has no scores in these rollouts "
                         f"(metrics: {', '.join(a.metric_names)})")
    return seg_std(a.scores[:, a.metric_names.index(outcome_metric)], a) > max(uniform_std, STD_EPS)


def trainable_groups(a: RolloutArrays, w: np.ndarray, min_group_std: float,
                      outcome_metric: str | None, uniform_std: float) -> np.ndarray:
    """bool [n_groups] for w [K], or [n_groups, C] for C weight vectors w [K, C]: the rule of
    group_stats (std > max(min_group_std, STD_EPS), plus the outcome gate) on segments."""
    passes = seg_std(a.scores @ w, a) > max(min_group_std, STD_EPS)
    if outcome_metric:
        varies = outcome_varies(a, outcome_metric, uniform_std)
        passes &= varies if passes.ndim == 1 else varies[:, None]
    return passes


def what_if(rollouts, weights: dict[str, float], min_group_std: float = 0.01,
            outcome_metric: str | None = None, uniform_std: float = 1e-3) -> float:
    """Trainable ratio this window would have had under `weights` (metrics not named: 0).
    Recomputes every group's total from the raw scores, so under the recorded weights it
    equals the recorded ratio. 0.0 for an empty window (as trainable_ratio)."""
    a = as_arrays(rollouts)
    w = weight_vector(weights, a.metric_names)
    if a.n_groups == 0:
        return 0.0
    return trainable_ratio(a.n_groups, int(trainable_groups(a, w, min_group_std, outcome_metric,
                                                             uniform_std).sum()))


def what_if_per_step(rollouts, weights: dict[str, float], min_group_std: float = 0.01,
                     outcome_metric: str | None = None, uniform_std: float = 1e-3) -> pd.Series:
    """Trainable ratio per step under `weights` (index: step)."""
    a = as_arrays(rollouts)
    w = weight_vector(weights, a.metric_names)
    if a.n_groups == 0:
        return pd.Series(dtype=np.float64, name="trainable_ratio", index=pd.Index([], name="step", dtype="int64"))
    ok = trainable_groups(a, w, min_group_std, outcome_metric, uniform_std)
    steps, code = np.unique(a.group_step, return_inverse=True)
    ratio = np.bincount(code, weights=ok) / np.bincount(code)
    return pd.Series(ratio, index=pd.Index(steps, name="step"), name="trainable_ratio")


def _candidate_mix(d0: np.ndarray, rng: np.random.Generator, n_random: int) -> np.ndarray:
    """Points of the simplex near d0 (rows): single moves of mass from one metric to another,
    moves of a share of everything towards one metric, and seeded random mixes."""
    k = len(d0)
    eye = np.eye(k)
    donors, receivers = np.nonzero(~np.eye(k, dtype=bool))
    fracs = np.array([0.25, 0.5, 0.75, 1.0])
    amt = (d0[donors][:, None] * fracs[None, :]).reshape(-1)  # [pairs * fracs]
    moves = np.repeat(d0[None, :], len(amt), axis=0)
    moves -= np.repeat(eye[donors], len(fracs), axis=0) * amt[:, None]
    moves += np.repeat(eye[receivers], len(fracs), axis=0) * amt[:, None]
    shares = np.array([0.1, 0.25, 0.5])
    towards = ((1 - shares)[:, None, None] * d0 + shares[:, None, None] * eye[None]).reshape(-1, k)
    s = rng.choice([0.1, 0.2, 0.35, 0.5], size=(n_random, 1))
    rand = (1 - s) * d0 + s * rng.dirichlet(np.ones(k), size=n_random)
    return np.vstack([moves, towards, rand])


def candidate_ratios(a: RolloutArrays, idx: list[int], cand: np.ndarray, min_group_std: float,
                      outcome_metric: str | None, uniform_std: float) -> np.ndarray:
    """Trainable ratio for each row of cand [C, k] (weights of metrics idx) at once.

    A group's total-reward variance under w is the quadratic form w' S_g w of its metric
    covariance S_g, so the rollouts are reduced once to S [groups, k, k] and each candidate
    costs O(groups * k^2), not a pass over every rollout. (Ranking only: the returned
    suggestions are re-scored with what_if, so their predicted ratios are exact.)"""
    xc = a.scores[:, idx] - seg_mean(a.scores[:, idx], a)[a.codes]
    k = len(idx)
    cov = seg_mean((xc[:, :, None] * xc[:, None, :]).reshape(-1, k * k), a)  # [groups, k*k]
    var = cov @ (cand[:, :, None] * cand[:, None, :]).reshape(len(cand), k * k).T  # [groups, C]
    ok = var > max(min_group_std, STD_EPS) ** 2
    if outcome_metric:
        ok &= outcome_varies(a, outcome_metric, uniform_std)[:, None]
    return ok.mean(axis=0)


def _why(w: dict[str, float], w0: dict[str, float], uf: dict[str, float], ratio: float, cur: float) -> str:
    diff = {m: w[m] - w0[m] for m in w}
    up = sorted((m for m in diff if diff[m] > 1e-12), key=lambda m: -diff[m])[:2]
    down = sorted((m for m in diff if diff[m] < -1e-12), key=lambda m: diff[m])[:2]
    part = lambda m: f"{m} {diff[m]:+.3f} (uniform in {uf[m]:.0%} of groups)"  # noqa: E731
    moves = "; ".join(x for x in (", ".join(map(part, up)), ", ".join(map(part, down))) if x)
    return f"{moves}: predicted trainable ratio {ratio:.2f} vs {cur:.2f} now"


def suggest_weights(rollouts, current: dict[str, float], min_group_std: float = 0.01, floor: float = 0.05,
                    n: int = 3, outcome_metric: str | None = None, *, uniform_std: float = 1e-3,
                    seed: int = 0, n_random: int = 256) -> list[dict]:
    """Weights near `current` that would have made more groups trainable in this window.

    Bounded search on the simplex of the metrics named in `current` (same total weight,
    each >= floor * total so no metric is switched off): mass moved from one metric to
    another (uniform ones are the usual donors), shares moved towards one metric, and a
    seeded random search nearby. Of the candidates that beat the current ratio it keeps
    the trade-off front (no other is both closer to current and better) and returns up to
    n of it, best ratio first: the best one, then the smallest changes that reach (n-1)/n,
    (n-2)/n, ... of its gain. [] when nothing beats the current weights. Each
    predicted_ratio is what_if() of the returned weights."""
    a = as_arrays(rollouts)
    w0v = weight_vector(current, a.metric_names)  # validates names and values
    names = list(current)
    idx = [a.metric_names.index(m) for m in names]
    k, total = len(names), float(w0v.sum())
    cur_ratio = what_if(a, current, min_group_std, outcome_metric, uniform_std)
    if k < 2 or a.n_groups == 0 or n <= 0:
        return []
    f = min(max(float(floor), 0.0), 1.0 / k)
    free = 1.0 - k * f
    if free <= 1e-12:  # the floor pins every metric: no room to move
        return []
    d0 = np.clip(w0v[idx] / total - f, 0.0, None)
    d0 = d0 / d0.sum() if d0.sum() > 0 else np.full(k, 1.0 / k)
    d = _candidate_mix(d0, np.random.default_rng(seed), n_random)
    cand = np.unique(total * (f + free * np.clip(d, 0.0, None)), axis=0)  # [C, k]
    ratios = candidate_ratios(a, idx, cand, min_group_std, outcome_metric, uniform_std)
    dist = np.abs(cand - w0v[idx]).sum(axis=1) / total
    # Pareto front of (higher ratio, smaller change): walk candidates from the closest out and
    # keep each one that beats every closer one.
    order = np.lexsort((-ratios, dist))
    r = ratios[order]
    best_before = np.maximum.accumulate(np.r_[cur_ratio, r[:-1]])
    front = order[(r > best_before) & (r > cur_ratio)]
    if not len(front):
        return []
    # n picks spread over the gain: the largest, then the smallest changes reaching (n-1)/n, ... of it.
    gain = ratios[front[-1]] - cur_ratio
    targets = cur_ratio + gain * np.arange(n, 0, -1) / n
    picks = front[np.searchsorted(ratios[front], targets - 1e-12)]
    chosen = list(dict.fromkeys(int(i) for i in picks))
    uf = dict(zip(a.metric_names, uniform_fraction(a, uniform_std)))
    w0 = {m: float(current[m]) for m in names}
    out = []
    for i in chosen:
        w = {m: float(v) for m, v in zip(names, cand[i])}
        pred = what_if(a, w, min_group_std, outcome_metric, uniform_std)
        if pred <= cur_ratio:  # the shortcut's ranking flipped a group on a float boundary
            continue
        out.append({"weights": w, "predicted_ratio": pred, "current_ratio": cur_ratio,
                    "why": _why(w, w0, uf, pred, cur_ratio)})
    return sorted(out, key=lambda s: -s["predicted_ratio"])

