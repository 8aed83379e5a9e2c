"""Group statistics over one step: which groups can train, which pass on shaping terms or float noise alone, why the others taught nothing, and the step's scalars.

Vocabulary (docs/design.md): a *group* is the G completions of one prompt; its
reward std is the population std (ddof=0) of the weighted totals; it is *trainable*
when that std > min_group_std (0 reproduces ART's "not all equal"); with an outcome
gate it must also vary in the outcome metric, else it is *phantom* (its variance is
shaping terms only). No Python loop over groups anywhere here: the trainer calls these
every step and the importers on every logged step of a run.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from grpo_core.runs.names import (
    CAUSE_MIXED,
    CAUSE_SOLVED,
    CAUSE_UNRECORDED,
    CAUSE_UNSOLVED,
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    CUM_SAMPLED_TOKENS,
    CUM_TRAINABLE_RATIO,
    CUM_WASTED_TOKENS,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SOLVED,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    GROUPS_UNSOLVED,
    NOISE_GROUPS,
    PHANTOM_GROUPS,
    REWARD,
    REWARD_STD,
    TRAINABLE_RATIO,
    WASTED_SAMPLING_S,
    WASTED_SHARE,
    WASTED_TOKENS,
    metric_group_std,
    metric_mean,
    metric_weight,
)

# Float noise: a group of identical rewards has std ~1e-17, not 0; "not all equal" must say no.
STD_EPS = 1e-8  # torch.isclose(std, 0) in TRL uses atol 1e-8
# A spread within 8 float32 ulps of the rewards' size is rounding, not a difference between
# completions: summing the same partial credits in another order moves a float32 total by an
# ulp or two. TRL (float32 sums, zero-std test |std| <= 1e-8) still trains such a group.
FLOAT_NOISE_RTOL = 8 * float(np.finfo(np.float32).eps)


@dataclass
class GroupStats:
    mean: np.ndarray  # [P] mean total reward per group (NaN rows, unscorable completions, left out)
    std: np.ndarray  # [P] population std of the total reward per group (NaN rows left out)
    trainable: np.ndarray  # [P] bool
    phantom: np.ndarray  # [P] bool: passes the std gate, outcome metric uniform
    metric_std: np.ndarray | None  # [P, K] within-group std of each raw metric
    noise: np.ndarray | None = None  # [P] bool: passes the std gate on float rounding alone (float_noise)


def float_noise(totals: np.ndarray, std: np.ndarray) -> np.ndarray:
    """[P] bool: the group's spread is float32 rounding (std <= FLOAT_NOISE_RTOL x its largest
    |reward|), or undefined (fewer than two scorable completions)."""
    size = _nan_stat(np.nanmax, np.abs(totals), 1)  # an all-NaN group: NaN, and its std is NaN: noise
    return ~(std > FLOAT_NOISE_RTOL * size) | (np.isfinite(totals).sum(axis=1) < 2)


_PLAIN = {np.nanmean: np.mean, np.nanstd: np.std, np.nanmax: np.max}


def _nan_stat(fn, x: np.ndarray, axis: int) -> np.ndarray:
    """np.nanmean / np.nanstd without the warning for an all-NaN slice (its result is NaN);
    the plain function when there is no NaN (the embedded trainer's every step: cheaper)."""
    if not np.isnan(x).any():
        return _PLAIN[fn](x, axis=axis)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(x, axis=axis)


def group_stats(totals: np.ndarray, scores: np.ndarray | None = None, *, min_group_std: float = 0.01,
                outcome_index: int | None = None, uniform_std: float = 1e-3,
                nonzero: np.ndarray | None = None) -> GroupStats:
    """totals [P, G] weighted rewards; scores [P, G, K] raw metric scores (optional). NaN
    totals (completions no metric could score) are left out of their group.

    nonzero [P]: the trainer's own verdict that a group's rewards are not all equal (the TRL
    callback passes TRL's); min_group_std > 0 then gates on top. Default: std > STD_EPS."""
    totals = np.asarray(totals, dtype=np.float64)
    mean = _nan_stat(np.nanmean, totals, 1)
    std = _nan_stat(np.nanstd, totals, 1)  # ddof=0: the product's gate (DESIGN); advantages use their own
    if nonzero is None:
        passes = std > max(min_group_std, STD_EPS)
    else:
        passes = np.asarray(nonzero, dtype=bool) & ((std > min_group_std) if min_group_std > 0 else True)
    metric_std = None if scores is None else _nan_stat(np.nanstd, np.asarray(scores, dtype=np.float64), 1)
    phantom = np.zeros_like(passes)
    trainable = passes
    if outcome_index is not None and metric_std is not None:
        outcome_varies = metric_std[:, outcome_index] > max(uniform_std, STD_EPS)
        phantom = passes & ~outcome_varies
        trainable = passes & outcome_varies
    return GroupStats(mean, std, trainable, phantom, metric_std, passes & float_noise(totals, std))


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
        GROUPS_SUBMITTED: p, GROUPS_TRAINABLE: t,
        CUM_GROUPS_SUBMITTED: cs, CUM_GROUPS_TRAINABLE: ct,
        TRAINABLE_RATIO: trainable_ratio(p, t), CUM_TRAINABLE_RATIO: trainable_ratio(cs, ct),
        PHANTOM_GROUPS: int(stats.phantom.sum()),
        NOISE_GROUPS: int(stats.noise.sum()) if stats.noise is not None else 0,
        REWARD: float(_nan_stat(np.nanmean, stats.mean, 0)), REWARD_STD: float(_nan_stat(np.nanmean, stats.std, 0)),
        FRAC_REWARD_ZERO_STD: float((~(stats.std > STD_EPS)).mean()),
    }
    scores = np.asarray(scores, dtype=np.float64)
    means = _nan_stat(np.nanmean, scores.reshape(-1, scores.shape[-1]), 0)
    mstd = _nan_stat(np.nanmean, stats.metric_std if stats.metric_std is not None
                     else _nan_stat(np.nanstd, scores, 1), 0)
    for k, name in enumerate(metric_names):
        out[metric_mean(name)] = float(means[k])
        out[metric_group_std(name)] = float(mstd[k])
        out[metric_weight(name)] = float(weights.get(name, 0.0))
    return out


# A non-trainable group, judged by its outcome's range: every completion right (the prompt is
# too easy: harder prompts or the curriculum) or every one wrong (too hard: easier prompts, a
# larger G, a higher temperature); "uniform" is neither (flat_causes splits it further).
MIXED, SOLVED, UNSOLVED, UNIFORM = CAUSE_MIXED, CAUSE_SOLVED, CAUSE_UNSOLVED, CAUSE_UNRECORDED
KIND_RANGES = {"binary": (0.0, 1.0), "continuous": (0.0, 1.0), "penalty": (-1.0, 0.0)}  # metrics.KINDS' ranges
OUTCOME_TOL = 1e-6


def at_ends(values: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """[P, G] -> ([P] every value at the top, [P] every value at the bottom); NaN rows left out."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        vmin, vmax = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
    return vmin >= hi - OUTCOME_TOL, vmax <= lo + OUTCOME_TOL


def group_outcomes(trainable: np.ndarray, totals: np.ndarray, scores: np.ndarray | None, metric_names: list[str],
                   kinds: dict[str, str], weights: dict[str, float], outcome_metric: str | None = None) -> np.ndarray:
    """[P] MIXED / SOLVED / UNSOLVED / UNIFORM. Trainable groups are mixed. The others are
    judged by the outcome metric (its kind's range) when there is one, else by the total at the
    top or bottom of its range (the weighted sum of each metric's range); a metric of unknown
    range (custom) leaves them uniform."""
    out = np.full(len(trainable), UNIFORM, dtype=object)
    if outcome_metric and scores is not None and outcome_metric in metric_names:
        bounds = KIND_RANGES.get(kinds.get(outcome_metric, ""))
        values = scores[:, :, metric_names.index(outcome_metric)]
    else:
        ranges = [KIND_RANGES.get(kinds.get(m, "")) for m in metric_names if weights.get(m, 0.0)]
        bounds = None if any(r is None for r in ranges) or not ranges else tuple(
            sum(weights[m] * KIND_RANGES[kinds[m]][i] for m in metric_names if weights.get(m, 0.0)) for i in (0, 1))
        values = totals
    if bounds is not None:
        top, bottom = at_ends(np.asarray(values, np.float64), *bounds)
        out[top] = SOLVED
        out[bottom & ~top] = UNSOLVED
    out[np.asarray(trainable, bool)] = MIXED
    return out


def wasted_compute(tokens: np.ndarray, trainable: np.ndarray, generate_s: float,
                   cum: tuple[int, int]) -> dict[str, float]:
    """Sampling spent on groups that taught nothing. tokens [P, G] completion tokens per
    rollout (every batch dynamic sampling drew included), trainable [P], cum = (tokens sampled,
    tokens wasted) before this step. Seconds are the step's sampling time shared out by tokens
    (a decode step's cost is close to flat in the rows it carries, so this is an estimate)."""
    per_group = np.asarray(tokens, np.float64).sum(axis=1)
    total, wasted = float(per_group.sum()), float(per_group[~np.asarray(trainable, bool)].sum())
    cum_total, cum_wasted = cum[0] + total, cum[1] + wasted
    return {WASTED_TOKENS: wasted, WASTED_SAMPLING_S: generate_s * wasted / total if total else 0.0,
            CUM_SAMPLED_TOKENS: cum_total, CUM_WASTED_TOKENS: cum_wasted,
            WASTED_SHARE: cum_wasted / cum_total if cum_total else 0.0}


def outcome_counts(outcomes: np.ndarray) -> dict[str, float]:
    return {GROUPS_SOLVED: float(np.sum(outcomes == SOLVED)), GROUPS_UNSOLVED: float(np.sum(outcomes == UNSOLVED))}

