"""A run's health over its last window of steps: the alerts and the verdict (healthy, warning, critical).

Every function reads RunStore.scalars_wide() (index step, columns names.*); the window is
HealthConfig.trend_window trainer steps, and the trainable ratio comes from windows.py's
one order of sources. The rules themselves are data (alert_rules.toml, a run's own
[[health.rules]]); this module computes what they test.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.analysis import alert_rules as rules
from grpo_core.analysis import flat_causes
from grpo_core.analysis.trend_stats import Trend, reward_trend
from grpo_core.analysis.windows import column, dense, in_window, last_steps, ratio_series, trailing_steps, window_ratio
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    FLAT_CAUSES,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SOLVED,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    GROUPS_UNSOLVED,
    REWARD,
    REWARD_STD,
    TRAINABLE_RATIO,
    metric_mean,
)


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


def _last_step(wide: pd.DataFrame) -> int | None:
    return int(wide.index[-1]) if len(wide.index) else None


# The scalars alerts() reads: a caller may pass a frame of only these columns (the trainer
# does when an alert starts: a frame of a few columns is cheaper to build than one of every name).
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
    causes: dict | None = None  # cause -> flat groups over the window (flat_causes; None: not logged)



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
    fired = rules.evaluate(rules.BUILTIN + rules.user_rules(cfg), rule_inputs(x, cfg), cfg, wide=x.wide,
                           split=flat_causes.dominant(x.causes) if x.causes else _split(x.solved, x.unsolved))
    return [Alert(rule.kind, rule.severity, message, x.last) for rule, message in fired]


def alert_kinds(history: list[dict], h, outcome_metric: str | None = None) -> set[str] | None:
    """The kinds alerts() raises at the last of these steps (dicts of one step's scalars,
    oldest first), read from plain arrays; None when it cannot say (a value missing or not
    finite): then ask alerts(). The trainer calls this every step and builds alerts()'
    frames only on a step an alert starts (docs/benchmarks.md, "Behind the code"). The
    rules are alert_rules(), as alerts()'."""
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
                         outcome_metric, None if outcome is None else pd.Series(outcome, index=x),
                         metric_frame(history, steps))
    inputs.causes = flat_causes.history_counts(history, keep)
    return {alert.kind for alert in alert_rules(inputs, h)}


def metric_frame(history: list[dict], steps: np.ndarray) -> pd.DataFrame | None:
    """The logged scalars the built-in metric rules read (the sampler mismatch, the collapse check's
    skill: logged every health.collapse_every steps, so any step of the window counts), as a frame;
    None when the steps logged none of them (the usual case: no frame to build)."""
    read = [r.metric for r in rules.BUILTIN if r.metric and any(r.metric in row for row in history)]
    if not read:
        return None
    return pd.DataFrame({n: [row.get(n, np.nan) for row in history] for n in read},
                        index=pd.Index(steps, name="step"))


def alert_columns(cfg, outcome_metric: str | None = None) -> list[str]:
    """The scalars alerts() reads: the built-in rules' inputs, the outcome metric's mean and
    the metrics of the run's own rules."""
    extra = list(FLAT_CAUSES.values()) + ([metric_mean(outcome_metric)] if outcome_metric else [])
    extra += [r.metric for r in rules.BUILTIN if r.metric]
    extra += [r["metric"] for r in getattr(cfg, "rules", None) or [] if r.get("metric")]
    return list(dict.fromkeys(ALERT_INPUTS + tuple(extra)))


def _window_sum(wide: pd.DataFrame, name: str, window: int) -> float | None:
    s = column(wide, name)
    return None if s is None or not s.notna().any() else float(last_steps(s.dropna(), window).sum())


def alerts(wide: pd.DataFrame, cfg, outcome_metric: str | None = None) -> list[Alert]:
    """Alerts at the window's last step; `wide` is RunStore.scalars_wide(), cfg a HealthConfig,
    outcome_metric the run's reward.outcome_metric (the noisy-verifier rule reads its mean)."""
    if wide is None or wide.empty:
        return []
    wide = wide.sort_index()
    source = ratio_series(wide)
    ratio_s = source.ratio
    zs = source.trainable if source.trainable is not None else ratio_s
    zero = trailing_steps((zs == 0).to_numpy(), zs.index.to_numpy())  # a streak in trainer steps
    ratio, t, s, k = window_ratio(wide, cfg.trend_window)
    rstd = column(wide, REWARD_STD)
    w = last_steps(rstd, cfg.trend_window) if rstd is not None else None
    inputs = AlertInputs(_last_step(wide), zero, ratio, t, s, k,
                         None if w is None else float(w.mean()), 0 if w is None else len(w),
                         last_steps(ratio_s, cfg.trend_window), (ratio_s <= cfg.near_zero_ratio).to_numpy(),
                         ratio_s.index.to_numpy(), None if dense(last_steps(ratio_s, cfg.trend_window).index)
                         else cfg.trend_window)
    inputs.solved = _window_sum(wide, GROUPS_SOLVED, cfg.trend_window)
    inputs.unsolved = _window_sum(wide, GROUPS_UNSOLVED, cfg.trend_window)
    outcome = column(wide, metric_mean(outcome_metric)) if outcome_metric else None
    if outcome is not None:
        inputs.outcome, inputs.outcome_window = outcome_metric, last_steps(outcome.dropna(), cfg.trend_window)
    inputs.wide = wide
    inputs.causes = flat_causes.window_counts(wide, cfg.trend_window)
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

    rstd = column(wide, REWARD_STD)
    if rstd is not None:
        w = last_steps(rstd, cfg.trend_window)
        v = float(w.mean())
        checks.append(Check("reward_std", v > cfg.min_reward_std, v, cfg.min_reward_std,
                            f"mean group reward std {v:.3f} over {_span(w, cfg.trend_window)} "
                            f"({'>' if v > cfg.min_reward_std else '<='} {cfg.min_reward_std:g})"))
    else:
        checks.append(Check("reward_std", None, None, cfg.min_reward_std, "no group reward std logged"))

    ratio, t, s, k = window_ratio(wide, cfg.trend_window)
    span = _span(last_steps(ratio_series(wide).ratio, cfg.trend_window).iloc[-k:] if k else pd.Series(dtype=float),
                 cfg.trend_window) if ratio is not None else ""
    if ratio is not None:
        counts = f", {t:g} of {s:g} groups" if s is not None else ""
        ok = ratio > cfg.min_trainable_ratio
        checks.append(Check("trainable_ratio", ok, ratio, cfg.min_trainable_ratio,
                            f"trainable ratio {ratio:.2f} over {span}{counts} "
                            f"({'>' if ok else '<='} {cfg.min_trainable_ratio:g})"))
    else:
        checks.append(Check("trainable_ratio", None, None, cfg.min_trainable_ratio, "no group counts logged"))

    rew = column(wide, REWARD)
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

