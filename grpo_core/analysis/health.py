"""Health metrics: pure, vectorised numpy/pandas over one step or a window of steps.

Vocabulary (docs/design.md): a *group* is the G completions of one prompt; its
reward std is the population std (ddof=0) of the weighted totals; it is *trainable*
when that std > min_group_std (0 reproduces ART's "not all equal"); with an outcome
gate it must also vary in the outcome metric, else it is *phantom* (its variance is
shaping terms only). No Python loop over groups anywhere here: the dashboard calls
these on tens of thousands of rollouts per refresh.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.runs.names import (CUM_SAMPLED_TOKENS, CUM_WASTED_TOKENS, GROUPS_SOLVED, GROUPS_UNSOLVED, WASTED_SHARE,
                             WASTED_SAMPLING_S, WASTED_TOKENS, CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE,
                             CUM_TRAINABLE_RATIO,
                             FRAC_REWARD_ZERO_STD, GROUPS_SUBMITTED, GROUPS_TRAINABLE, NOISE_GROUPS,
                             PHANTOM_GROUPS, REWARD, REWARD_STD, TRAINABLE_RATIO, metric_group_std,
                             metric_mean, metric_weight)

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


# A non-trainable group, split by why it teaches nothing: every completion right (the prompt is
# too easy: harder prompts or the curriculum) or every one wrong (too hard: easier prompts, a
# larger G, a higher temperature); "uniform" is the same middling reward for all.
MIXED, SOLVED, UNSOLVED, UNIFORM = "mixed", "all solved", "none solved", "uniform"
KIND_RANGES = {"binary": (0.0, 1.0), "continuous": (0.0, 1.0), "penalty": (-1.0, 0.0)}  # rewards.KINDS' ranges
OUTCOME_TOL = 1e-6


def _at(values: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
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
        top, bottom = _at(np.asarray(values, np.float64), *bounds)
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


# =============================================================================================
# Windows of steps: trend, alerts, verdict (over RunStore.scalars_wide(): index step, names.*)
# =============================================================================================
@dataclass
class Alert:
    kind: str  # "zero_trainable" | "low_ratio" | "low_reward_std" | "declining_ratio" | "near_zero"
    severity: str  # "warning" | "critical"
    message: str  # a full sentence with the numbers and the fix
    step: int | None  # the last step the alert is about


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not enough data to judge
    value: float | None
    threshold: float | None
    text: str


@dataclass
class Trend:
    slope: float | None  # per step (per index unit of a Series)
    sign: int  # +1 / -1 / 0 (flat, not significant, or window too short)
    p_value: float | None
    n: int


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (no scipy in the dashboard's environment)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with df degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def reward_trend(values: np.ndarray | pd.Series, min_points: int = 5, alpha: float = 0.05) -> Trend:
    """OLS slope over the window; a sign only with >= min_points values and p < alpha.

    A Series is regressed on its (numeric) index, so the slope is per step; NaNs are dropped."""
    if isinstance(values, pd.Series):
        y = pd.to_numeric(values, errors="coerce").to_numpy(np.float64)
        try:
            x = np.asarray(values.index, dtype=np.float64)
        except (TypeError, ValueError):
            x = np.arange(len(y), dtype=np.float64)
    else:
        y = np.asarray(values, dtype=np.float64).ravel()
        x = np.arange(len(y), dtype=np.float64)
    keep = np.isfinite(y) & np.isfinite(x)
    x, y = x[keep], y[keep]
    n = len(y)
    if n < 2 or np.ptp(x) == 0:
        return Trend(None, 0, None, n)
    xc = x - x.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean())) / sxx
    if n < 3:
        return Trend(slope, 0, None, n)
    resid = y - y.mean() - slope * xc
    sse = float(resid @ resid)
    scale = max(abs(float(y.mean())), float(np.abs(y).max()), 1e-300)
    if sse <= (1e-12 * scale) ** 2 * n:  # an exact line (or a constant): no noise to test against
        p = 1.0 if abs(slope) * np.ptp(x) <= 1e-12 * scale else 0.0
    else:
        p = t_two_sided_p(slope / math.sqrt(sse / (n - 2) / sxx), n - 2)
    sign = int(np.sign(slope)) if n >= max(min_points, 3) and p < alpha else 0
    return Trend(slope, sign, p, n)


def _col(wide: pd.DataFrame, name: str) -> pd.Series | None:
    if name not in wide.columns:
        return None
    s = wide[name]
    if not pd.api.types.is_float_dtype(s.dtype):  # float columns (the store's, the trainer's) need no parsing
        s = pd.to_numeric(s, errors="coerce")
    return s if not np.isnan(s.to_numpy(np.float64, na_value=np.nan)).all() else None


def step_ratio_series(wide: pd.DataFrame) -> pd.Series:
    """Per-step trainable ratio from whatever the run logged: our ratio, the step counts,
    ART's cumulative counts, or TRL's frac_reward_zero_std (imported runs have only some)."""
    r = _col(wide, TRAINABLE_RATIO)
    if r is not None:
        return r.dropna()
    sub, tr = _col(wide, GROUPS_SUBMITTED), _col(wide, GROUPS_TRAINABLE)
    if sub is not None and tr is not None:
        return (tr / sub.where(sub > 0)).dropna()
    csub, ctr = _col(wide, CUM_GROUPS_SUBMITTED), _col(wide, CUM_GROUPS_TRAINABLE)
    if csub is not None and ctr is not None:
        cum = pd.DataFrame({"s": csub, "t": ctr}).dropna()
        d = cum.diff()
        d.iloc[0] = cum.iloc[0]  # first row: the run so far (exact when the frame starts at step 0)
        return (d["t"] / d["s"].where(d["s"] > 0)).dropna()
    z = _col(wide, FRAC_REWARD_ZERO_STD)
    if z is not None:
        return (1.0 - z).dropna()
    return pd.Series(dtype=np.float64)


def in_window(steps, window: int) -> np.ndarray:
    """[n] bool: the entries inside the last `window` *trainer* steps (step > last - window).
    An imported run logs every logging_steps steps: 20 steps there are 4 entries at
    logging_steps 5, not 20 entries (100 steps); on a run logged every step it is tail(window)."""
    steps = np.asarray(steps, np.float64)
    if window <= 0 or not len(steps):
        return np.zeros(len(steps), bool)
    return steps > steps[-1] - window


def last_steps(s: pd.Series, window: int) -> pd.Series:
    """The entries of a step-indexed series inside its last `window` trainer steps."""
    s = s.dropna()
    return s[in_window(s.index.to_numpy(), window)]


def trailing_steps(mask: np.ndarray, steps) -> int:
    """The trailing run of True in `mask`, counted in trainer steps: an entry covers the
    steps since the previous entry (the first one: as many as the first gap). Logged every
    step, it is the number of entries."""
    n, steps = _trailing_run(np.asarray(mask, bool)), np.asarray(steps, np.float64)
    if n == 0:
        return 0
    if n < len(steps):
        return int(steps[-1] - steps[-n - 1])
    first = steps[1] - steps[0] if len(steps) > 1 else 1.0
    return int(steps[-1] - steps[0] + max(first, 1.0))


def window_ratio(wide: pd.DataFrame, window: int) -> tuple[float | None, float | None, float | None, int]:
    """Pooled trainable ratio over the last `window` trainer steps: (ratio, trainable,
    submitted, entries), entries = the logged entries in the window (= steps when the run
    logs every step).

    Pooled (sum of trainable / sum of submitted), so 5 of 28 groups reads 5/28 whatever
    the step sizes; counts are None when the run logged only ratios. Counts stay floats: an
    imported entry averaged over logging_steps carries fractional counts (2.5 of 4), and
    int() of their sum would lose groups."""
    sub, tr = _col(wide, GROUPS_SUBMITTED), _col(wide, GROUPS_TRAINABLE)
    if sub is not None and tr is not None:  # numpy, not a frame: the trainer calls this every step
        a, b = sub.to_numpy(np.float64, na_value=np.nan), tr.to_numpy(np.float64, na_value=np.nan)
        ok = ~(np.isnan(a) | np.isnan(b))
        keep = in_window(wide.index.to_numpy()[ok], window)
        a, b = a[ok][keep], b[ok][keep]
        if len(a) and a.sum() > 0:
            s, t = float(a.sum()), float(b.sum())
            return t / s, t, s, len(a)
    csub, ctr = _col(wide, CUM_GROUPS_SUBMITTED), _col(wide, CUM_GROUPS_TRAINABLE)
    if csub is not None and ctr is not None:
        d = pd.DataFrame({"s": csub, "t": ctr}).dropna()
        if len(d):
            last, k = d.iloc[-1], int(in_window(d.index.to_numpy(), window).sum())
            base = d.iloc[-k - 1] if len(d) > k else pd.Series({"s": 0.0, "t": 0.0})
            s, t = float(last["s"] - base["s"]), float(last["t"] - base["t"])
            if s > 0:
                return t / s, t, s, k
    r = last_steps(step_ratio_series(wide), window)
    if len(r):
        return float(r.mean()), None, None, len(r)
    return None, None, None, 0


def _trailing_run(mask: np.ndarray) -> int:
    """Length of the run of True at the end of mask (no loop)."""
    false_at = np.flatnonzero(~mask)
    return int(len(mask) - (false_at[-1] + 1 if len(false_at) else 0))


def _last_step(wide: pd.DataFrame) -> int | None:
    return int(wide.index[-1]) if len(wide.index) else None


# The scalars alerts() reads: a caller may pass a frame of only these columns (the trainer
# does, every step: a 7-column frame costs a fraction of one with every logged name).
ALERT_INPUTS = (TRAINABLE_RATIO, GROUPS_SUBMITTED, GROUPS_TRAINABLE, CUM_GROUPS_SUBMITTED,
                CUM_GROUPS_TRAINABLE, FRAC_REWARD_ZERO_STD, REWARD_STD)


@dataclass
class AlertInputs:
    """What the alert rules look at, at a window's last step (from frames or from arrays)."""
    last: int | None  # the step the alerts are about
    zero_streak: int  # trailing steps with zero trainable groups
    ratio: float | None  # trainable ratio pooled over the window
    trainable: float | None  # its counts (None: the run logged only ratios; fractional when imported)
    submitted: float | None
    ratio_steps: int  # logged entries in the pooled ratio
    reward_std: float | None  # mean group reward std over the window
    reward_std_steps: int
    ratio_window: pd.Series | np.ndarray  # the per-step ratio over the window (its trend)
    near_streak_mask: np.ndarray  # per step: ratio at or below cfg.near_zero_ratio
    near_steps: np.ndarray | None = None  # the steps of near_streak_mask (None: consecutive)
    window: int | None = None  # the window in trainer steps (None: the run logs every step)
    solved: float | None = None  # untrainable groups all solved / none solved over the window
    unsolved: float | None = None
    outcome: str | None = None  # the outcome metric, and its mean per step over the window
    outcome_window: pd.Series | np.ndarray | None = None
    wide: pd.DataFrame | None = None  # the window's scalars (a run's own rules read any metric)


def dense(steps) -> bool:
    """Whether these entries are consecutive steps (a run that logs every step)."""
    steps = np.asarray(steps, np.float64)
    return len(steps) < 2 or bool((np.diff(steps) == 1).all())


def _over(entries: int, window: int | None) -> str:
    """'the last 20 steps'; where the run logs every few steps, the window is in trainer
    steps and the entries in it are stated: 'the last 20 steps (4 logged entries)'."""
    if window is None:
        return f"the last {entries} steps"
    return f"the last {window} steps ({entries} logged entries)"


def _split(solved: float | None, unsolved: float | None) -> str | None:
    """Which way most of the window's untrainable groups went: "solved", "unsolved" or None."""
    if solved is None or unsolved is None or solved == unsolved:
        return None
    return "solved" if solved > unsolved else "unsolved"


def _noisy_verifier(x: AlertInputs, ratio_trend: Trend, cfg) -> tuple[float | None, dict]:
    """1 when the ratio rises (significantly) while the outcome metric's mean stays flat over
    the window: more groups split, but not by getting the outcome right."""
    if x.outcome_window is None or ratio_trend.sign <= 0:
        return (None if x.outcome_window is None else 0.0), {}
    outcome = pd.Series(x.outcome_window).dropna()
    if len(outcome) < cfg.min_trend_points or reward_trend(outcome, cfg.min_trend_points).sign != 0:
        return 0.0, {}
    return 1.0, {"over": _over(ratio_trend.n, x.window), "slope": ratio_trend.slope, "outcome": x.outcome,
                 "outcome_first": float(outcome.iloc[0]), "outcome_last": float(outcome.iloc[-1])}


def rule_inputs(x: AlertInputs, cfg) -> dict[str, tuple[float | None, dict]]:
    """The values the built-in rules (alert_rules.toml) test, with their messages' fields."""
    counts = f" ({x.trainable:g} of {x.submitted:g} groups)" if x.submitted is not None else ""
    trend = reward_trend(x.ratio_window, cfg.min_trend_points)
    win = np.asarray(x.ratio_window, np.float64)
    mask = np.asarray(x.near_streak_mask, bool)
    near = trailing_steps(mask, np.arange(len(mask)) if x.near_steps is None else x.near_steps)
    trend_fields = {"over": _over(trend.n, x.window), "first": win[0], "last": win[-1], "slope": trend.slope,
                    "p": trend.p_value} if trend.sign else {}
    return {"zero_streak": (x.zero_streak, {}),
            "ratio": (x.ratio, {"counts": counts, "over": _over(x.ratio_steps, x.window)}),
            "reward_std": (x.reward_std, {"over": _over(x.reward_std_steps, x.window)}),
            "ratio_trend": (float(trend.sign), trend_fields),
            "near_zero_streak": (near, {"near_zero_ratio": cfg.near_zero_ratio}),
            "ratio_rising_outcome_flat": _noisy_verifier(x, trend, cfg)}


def alert_rules(x: AlertInputs, cfg) -> list[Alert]:
    """The alerts at the window's last step: the built-in rules (alert_rules.toml) and the
    run's own (health.rules), one evaluator (alert_rules.evaluate); cfg: HealthConfig."""
    from grpo_core.analysis import alert_rules as rules
    fired = rules.evaluate(rules.BUILTIN + rules.user_rules(cfg), rule_inputs(x, cfg), cfg, wide=x.wide,
                           split=_split(x.solved, x.unsolved))
    return [Alert(rule.kind, rule.severity, message, x.last) for rule, message in fired]


def alert_kinds(history: list[dict], h, outcome_metric: str | None = None) -> set[str] | None:
    """The kinds alerts() raises at the last of these steps (dicts of one step's scalars,
    oldest first), read from plain arrays; None when it cannot say (a value missing or not
    finite): then ask alerts(). The trainer calls this every step and needs alerts()'
    frames only on a step an alert starts: they cost ten times what this does
    (docs/benchmarks.md, "Behind the code"). The rules are alert_rules(), as alerts()'."""
    try:
        steps = np.array([r["step"] for r in history], np.float64)
        sub, tr, ratio, rstd = (np.array([r[n] for r in history], np.float64) for n in
                                (GROUPS_SUBMITTED, GROUPS_TRAINABLE, TRAINABLE_RATIO, REWARD_STD))
    except (KeyError, TypeError, ValueError):
        return None
    if not len(steps) or not all(np.isfinite(a).all() for a in (sub, tr, ratio, rstd)):
        return None
    w = h.trend_window
    keep = in_window(steps, w)  # the last w trainer steps (= the last w entries, logged every step)
    a, b = sub[keep], tr[keep]
    if not (len(a) and a.sum() > 0):  # no groups in the window: alerts() falls back to other columns
        return None
    win, x = ratio[keep], steps[keep]
    if len(x) > 1 and not (np.diff(x) == 1).all():  # steps missing (not the loop's case): slope per step
        win = pd.Series(win, index=x)
    if getattr(h, "rules", None):  # a run's own rules read any metric: alerts() has the frame
        return None
    outcome = np.array([r.get(metric_mean(outcome_metric), np.nan) for r in history], np.float64)[keep] \
        if outcome_metric else None
    solved, unsolved = (np.array([r.get(n, np.nan) for r in history], np.float64)[keep].sum()
                        for n in (GROUPS_SOLVED, GROUPS_UNSOLVED))
    inputs = AlertInputs(int(steps[-1]), trailing_steps(tr == 0, steps), float(b.sum()) / float(a.sum()),
                         float(b.sum()), float(a.sum()), len(a), float(rstd[keep].mean() if len(a) else np.nan),
                         int(keep.sum()), win, ratio <= h.near_zero_ratio, steps, None if dense(x) else w,
                         None if np.isnan(solved) else float(solved), None if np.isnan(unsolved) else float(unsolved),
                         outcome_metric, None if outcome is None else pd.Series(outcome, index=x))
    return {alert.kind for alert in alert_rules(inputs, h)}


def alert_columns(cfg, outcome_metric: str | None = None) -> list[str]:
    """The scalars alerts() reads: the built-in rules' inputs, the outcome metric's mean and
    the metrics of the run's own rules."""
    extra = [GROUPS_SOLVED, GROUPS_UNSOLVED] + ([metric_mean(outcome_metric)] if outcome_metric else [])
    extra += [r["metric"] for r in getattr(cfg, "rules", None) or [] if r.get("metric")]
    return list(dict.fromkeys(ALERT_INPUTS + tuple(extra)))


def _window_sum(wide: pd.DataFrame, name: str, window: int) -> float | None:
    s = _col(wide, name)
    return None if s is None or not s.notna().any() else float(last_steps(s.dropna(), window).sum())


def alerts(wide: pd.DataFrame, cfg, outcome_metric: str | None = None) -> list[Alert]:
    """Alerts at the window's last step; `wide` is RunStore.scalars_wide(), cfg a HealthConfig,
    outcome_metric the run's reward.outcome_metric (the noisy-verifier rule reads its mean)."""
    if wide is None or wide.empty:
        return []
    wide = wide.sort_index()
    ratio_s = step_ratio_series(wide)
    tr = _col(wide, GROUPS_TRAINABLE)
    zs = tr.dropna() if tr is not None else ratio_s
    zero = trailing_steps((zs == 0).to_numpy(), zs.index.to_numpy())  # a streak in trainer steps
    ratio, t, s, k = window_ratio(wide, cfg.trend_window)
    rstd = _col(wide, REWARD_STD)
    w = last_steps(rstd, cfg.trend_window) if rstd is not None else None
    inputs = AlertInputs(_last_step(wide), zero, ratio, t, s, k,
                         None if w is None else float(w.mean()), 0 if w is None else len(w),
                         last_steps(ratio_s, cfg.trend_window), (ratio_s <= cfg.near_zero_ratio).to_numpy(),
                         ratio_s.index.to_numpy(), None if dense(last_steps(ratio_s, cfg.trend_window).index)
                         else cfg.trend_window)
    inputs.solved = _window_sum(wide, GROUPS_SOLVED, cfg.trend_window)
    inputs.unsolved = _window_sum(wide, GROUPS_UNSOLVED, cfg.trend_window)
    outcome = _col(wide, metric_mean(outcome_metric)) if outcome_metric else None
    if outcome is not None:
        inputs.outcome, inputs.outcome_window = outcome_metric, last_steps(outcome.dropna(), cfg.trend_window)
    inputs.wide = wide
    return alert_rules(inputs, cfg)


@dataclass
class Verdict:
    status: str  # "healthy" | "warning" | "critical" | "unknown" (no data)
    checks: list[Check]
    alerts: list[Alert]
    trend: Trend


def _span(s: pd.Series, window: int) -> str:
    """'20 steps', or '20 steps (4 logged entries)' where the run logs every few steps."""
    return f"{len(s)} steps" if dense(s.index) else f"{window} steps ({len(s)} logged entries)"


def verdict(wide: pd.DataFrame, cfg, outcome_metric: str | None = None) -> Verdict:
    """healthy: mean group reward std > min_reward_std, trainable ratio > min_trainable_ratio
    and the reward rising over the window; warning: a check fails or a warning alert;
    critical: a critical alert (zero trainable / near zero); unknown: no data."""
    if wide is None or wide.empty:
        return Verdict("unknown", [], [], Trend(None, 0, None, 0))
    wide = wide.sort_index()
    checks = []

    rstd = _col(wide, REWARD_STD)
    if rstd is not None:
        w = last_steps(rstd, cfg.trend_window)
        v = float(w.mean())
        checks.append(Check("reward_std", v > cfg.min_reward_std, v, cfg.min_reward_std,
                            f"mean group reward std {v:.3f} over {_span(w, cfg.trend_window)} "
                            f"({'>' if v > cfg.min_reward_std else '<='} {cfg.min_reward_std:g})"))
    else:
        checks.append(Check("reward_std", None, None, cfg.min_reward_std, "no group reward std logged"))

    ratio, t, s, k = window_ratio(wide, cfg.trend_window)
    span = _span(last_steps(step_ratio_series(wide), cfg.trend_window).iloc[-k:] if k else pd.Series(dtype=float),
                 cfg.trend_window) if ratio is not None else ""
    if ratio is not None:
        counts = f", {t:g} of {s:g} groups" if s is not None else ""
        ok = ratio > cfg.min_trainable_ratio
        checks.append(Check("trainable_ratio", ok, ratio, cfg.min_trainable_ratio,
                            f"trainable ratio {ratio:.2f} over {span}{counts} "
                            f"({'>' if ok else '<='} {cfg.min_trainable_ratio:g})"))
    else:
        checks.append(Check("trainable_ratio", None, None, cfg.min_trainable_ratio, "no group counts logged"))

    rew = _col(wide, REWARD)
    trend = reward_trend(last_steps(rew, cfg.trend_window), cfg.min_trend_points) if rew is not None \
        else Trend(None, 0, None, 0)
    if trend.n < max(cfg.min_trend_points, 3):
        checks.append(Check("reward_trend", None, trend.slope, 0.0,
                            f"reward trend needs {cfg.min_trend_points} steps, have {trend.n}"))
    else:
        word = {1: "rising", -1: "falling", 0: "flat (no significant slope)"}[trend.sign]
        checks.append(Check("reward_trend", trend.sign > 0, trend.slope, 0.0,
                            f"reward {word} over {trend.n} steps (slope {trend.slope:+.4f}/step, "
                            f"p={trend.p_value:.3f})"))

    al = alerts(wide, cfg, outcome_metric)
    if any(a.severity == "critical" for a in al):
        status = "critical"
    elif al or any(c.ok is False for c in checks):
        status = "warning"
    elif any(c.ok for c in checks):
        status = "healthy"
    else:
        status = "unknown"
    return Verdict(status, checks, al, trend)


# =============================================================================================
# Rollouts: ragged groups as flat arrays + segment sums (what-if, bottlenecks, suggestions)
# =============================================================================================
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


def _dense_arrays(scores: np.ndarray) -> RolloutArrays:
    """[P, G, K] (equal group sizes) -> RolloutArrays, metrics unnamed."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 3:
        raise ValueError(f"scores must be [groups, group_size, metrics], got shape {s.shape}")
    p, g, k = s.shape
    starts = np.arange(0, p * g, g)
    return RolloutArrays(s.reshape(p * g, k), np.repeat(np.arange(p), g), p, np.zeros(p, np.int64),
                         np.arange(p), starts, np.full(p, g), [f"m{i}" for i in range(k)])


def _as_arrays(x, metric_names: list[str] | None = None) -> RolloutArrays:
    if isinstance(x, RolloutArrays):
        return x
    if isinstance(x, pd.DataFrame):
        return rollout_arrays(x, metric_names)
    return _dense_arrays(x)


def _seg_mean(x: np.ndarray, a: RolloutArrays) -> np.ndarray:
    c = a.counts if x.ndim == 1 else a.counts[:, None]
    return np.add.reduceat(x, a.starts, axis=0) / c


def _seg_std(x: np.ndarray, a: RolloutArrays) -> np.ndarray:
    """Population std (ddof=0) of x [N] or [N, C] inside each group: two-pass, so a group of
    equal values gives exactly 0 and large offsets do not cancel."""
    dev = x - _seg_mean(x, a)[a.codes]
    return np.sqrt(_seg_mean(dev * dev, a))


def per_metric_group_std(scores) -> np.ndarray:
    """[K]: mean over groups of each raw metric's within-group std. scores: [P, G, K],
    RolloutArrays or a rollouts frame (ragged groups allowed)."""
    a = _as_arrays(scores)
    if a.n_groups == 0:
        return np.full(a.scores.shape[1], np.nan)
    return _seg_std(a.scores, a).mean(axis=0)


def uniform_fraction(scores, uniform_std: float = 1e-3) -> np.ndarray:
    """[K]: share of groups in which each metric is uniform (within-group std <= uniform_std)."""
    a = _as_arrays(scores)
    if a.n_groups == 0:
        return np.full(a.scores.shape[1], np.nan)
    return (_seg_std(a.scores, a) <= max(uniform_std, STD_EPS)).mean(axis=0)


def variance_contribution(scores, weights) -> np.ndarray:
    """[K]: share of the within-group variance of the weighted total that each metric explains.

    Var(sum_k w_k x_k) = sum_k w_k Cov(x_k, total), pooled over groups (sums of within-group
    cross-products, so bigger groups weigh more). Shares sum to 1 when the total varies;
    a share can be negative (a metric that works against the others). All zeros when the
    total is constant in every group: there is no variance to explain."""
    a = _as_arrays(scores)
    w = _weight_vector(weights, a.metric_names) if isinstance(weights, dict) else np.asarray(weights, np.float64)
    if w.shape != (a.scores.shape[1],):
        raise ValueError(f"weights must have one value per metric ({a.scores.shape[1]}), got shape {w.shape}")
    if a.n_groups == 0:
        return np.zeros_like(w)
    xc = a.scores - _seg_mean(a.scores, a)[a.codes]
    t = xc @ w
    var = float(t @ t)
    if var <= 0.0:
        return np.zeros_like(w)
    return w * (xc.T @ t) / var


def _weight_vector(weights: dict[str, float], metric_names: list[str]) -> np.ndarray:
    from grpo_core.runs.config import validate_weights  # pure module; kept local to stay import-light
    clean = validate_weights(weights, metric_names)
    return np.array([clean.get(m, 0.0) for m in metric_names], dtype=np.float64)


def _outcome_varies(a: RolloutArrays, outcome_metric: str, uniform_std: float) -> np.ndarray:
    """bool [n_groups]: the outcome gate (the outcome metric itself varies in the group)."""
    if outcome_metric not in a.metric_names:
        raise ValueError(f"outcome metric {outcome_metric!r} has no scores in these rollouts "
                         f"(metrics: {', '.join(a.metric_names)})")
    return _seg_std(a.scores[:, a.metric_names.index(outcome_metric)], a) > max(uniform_std, STD_EPS)


def _trainable_groups(a: RolloutArrays, w: np.ndarray, min_group_std: float,
                      outcome_metric: str | None, uniform_std: float) -> np.ndarray:
    """bool [n_groups] for w [K], or [n_groups, C] for C weight vectors w [K, C]: the rule of
    group_stats (std > max(min_group_std, STD_EPS), plus the outcome gate) on segments."""
    passes = _seg_std(a.scores @ w, a) > max(min_group_std, STD_EPS)
    if outcome_metric:
        varies = _outcome_varies(a, outcome_metric, uniform_std)
        passes &= varies if passes.ndim == 1 else varies[:, None]
    return passes


def what_if(rollouts, weights: dict[str, float], min_group_std: float = 0.01,
            outcome_metric: str | None = None, uniform_std: float = 1e-3) -> float:
    """Trainable ratio this window would have had under `weights` (metrics not named: 0).
    Recomputes every group's total from the raw scores, so under the recorded weights it
    equals the recorded ratio. 0.0 for an empty window (as trainable_ratio)."""
    a = _as_arrays(rollouts)
    w = _weight_vector(weights, a.metric_names)
    if a.n_groups == 0:
        return 0.0
    return trainable_ratio(a.n_groups, int(_trainable_groups(a, w, min_group_std, outcome_metric,
                                                             uniform_std).sum()))


def what_if_per_step(rollouts, weights: dict[str, float], min_group_std: float = 0.01,
                     outcome_metric: str | None = None, uniform_std: float = 1e-3) -> pd.Series:
    """Trainable ratio per step under `weights` (index: step)."""
    a = _as_arrays(rollouts)
    w = _weight_vector(weights, a.metric_names)
    if a.n_groups == 0:
        return pd.Series(dtype=np.float64, name="trainable_ratio", index=pd.Index([], name="step", dtype="int64"))
    ok = _trainable_groups(a, w, min_group_std, outcome_metric, uniform_std)
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


def _candidate_ratios(a: RolloutArrays, idx: list[int], cand: np.ndarray, min_group_std: float,
                      outcome_metric: str | None, uniform_std: float) -> np.ndarray:
    """Trainable ratio for each row of cand [C, k] (weights of metrics idx) at once.

    A group's total-reward variance under w is the quadratic form w' S_g w of its metric
    covariance S_g, so the rollouts are reduced once to S [groups, k, k] and each candidate
    costs O(groups * k^2), not a pass over every rollout. (Ranking only: the returned
    suggestions are re-scored with what_if, so their predicted ratios are exact.)"""
    xc = a.scores[:, idx] - _seg_mean(a.scores[:, idx], a)[a.codes]
    k = len(idx)
    cov = _seg_mean((xc[:, :, None] * xc[:, None, :]).reshape(-1, k * k), a)  # [groups, k*k]
    var = cov @ (cand[:, :, None] * cand[:, None, :]).reshape(len(cand), k * k).T  # [groups, C]
    ok = var > max(min_group_std, STD_EPS) ** 2
    if outcome_metric:
        ok &= _outcome_varies(a, outcome_metric, uniform_std)[:, None]
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
    a = _as_arrays(rollouts)
    w0v = _weight_vector(current, a.metric_names)  # validates names and values
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
    ratios = _candidate_ratios(a, idx, cand, min_group_std, outcome_metric, uniform_std)
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


# =============================================================================================
# Planner: binary rewards and group size
# =============================================================================================
def p_trainable_binary(p, G):
    """Probability that a group of G binary rewards with success rate p is not all equal:
    1 - p^G - (1-p)^G. Broadcasts over arrays."""
    pa, ga = np.asarray(p, dtype=np.float64), np.asarray(G)
    if np.any(~np.isfinite(pa)) or np.any((pa < 0) | (pa > 1)):
        raise ValueError(f"success rate p must be in [0, 1], got {p!r}")
    if np.any(ga < 1) or np.any(ga != np.round(ga)):
        raise ValueError(f"group size G must be an integer >= 1, got {G!r}")
    out = np.clip(1.0 - pa ** ga - (1.0 - pa) ** ga, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def min_group_size(p: float, target: float, g_max: int = 256) -> int | None:
    """Smallest G >= 2 whose binary trainable probability reaches target; None if no G <= g_max does."""
    if not 0 < target <= 1:
        raise ValueError(f"target probability must be in (0, 1], got {target!r}")
    g = np.arange(2, max(int(g_max), 2) + 1)
    ok = np.flatnonzero(p_trainable_binary(p, g) >= target)
    return int(g[ok[0]]) if len(ok) else None
