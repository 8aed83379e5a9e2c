"""A run's per-step and per-metric tables: trainability over time, the variance bottlenecks, the reward trend and the held-out evaluations.

What a finished (or running, or imported) run teaches, in the order you read it:
  1. trainability  - how many groups could carry a signal, over time, and when none did;
  2. bottlenecks   - which reward metric was uniform inside groups and starved the signal;
  3. reward trend  - fitted slope and whether it is significant;
  4. evaluation    - the held-out reward and pass@1, where the run evaluated.
The trainable ratio is read from the run's own group counts where it logged them, else
from windows.py's one order of sources, and the notices name that source.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_core.analysis import rollout_stats, trend_stats, windows
from grpo_core.analysis.run_data import DEFAULT_WINDOW, RunData, steps_index
from grpo_core.analysis.windows import column
from grpo_core.runs import names

MOST_GROUPS = 0.5  # a metric uniform in more than this share of groups starved the signal
EVAL_COLS = {names.EVAL_REWARD: "reward", names.EVAL_PASS: "pass@1"}


def steps_table(data: RunData, window: int = DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per step: submitted, trainable, ratio, cum_ratio, ratio_rolling, phantom,
    reward, reward_std. Counts are the logged counts (what the live page shows), else counted
    from the groups table; a run with neither (an import) has its ratio from windows.py's
    order of sources, and counts NaN."""
    steps = steps_index(data)
    w, g = data.wide.reindex(steps), data.groups
    source = windows.ratio_series(w)
    df = _counts(source, g, steps)
    if df["submitted"].notna().any():
        df["ratio"] = df["trainable"] / df["submitted"].where(df["submitted"] > 0)
        cs, ct = df["submitted"].fillna(0).cumsum(), df["trainable"].fillna(0).cumsum()
        df["cum_ratio"] = ct / cs.where(cs > 0)
        rs, rt = (_rolling_sum(df["submitted"].fillna(0), window), _rolling_sum(df["trainable"].fillna(0), window))
        df["ratio_rolling"] = rt / rs.where(rs > 0)  # pooled over the trailing window
    else:  # a ratio only (imported): the logged ratio or 1 - frac_reward_zero_std, per step
        df["ratio"] = source.ratio.reindex(steps)
        cum = column(w, names.CUM_TRAINABLE_RATIO)  # an importer's cumulative ratio knows the step weights
        df["cum_ratio"] = cum if cum is not None else df["ratio"].expanding().mean()
        r = df["ratio"]
        df["ratio_rolling"] = _rolling_sum(r.fillna(0), window) / _rolling_sum(r.notna().astype(float), window)
    ph = column(w, names.PHANTOM_GROUPS)
    if ph is not None:
        df["phantom"] = ph
    elif len(g):
        df["phantom"] = g.groupby("step")["phantom"].sum().astype(float).reindex(steps)
    else:
        df["phantom"] = np.nan
    for col, name, gcol in (("reward", names.REWARD, "reward_mean"), ("reward_std", names.REWARD_STD, "reward_std")):
        s = column(w, name)
        if s is None and len(g):
            s = g.groupby("step")[gcol].mean().reindex(steps)
        df[col] = s if s is not None else np.nan
    cols = ["submitted", "trainable", "ratio", "cum_ratio", "ratio_rolling", "phantom", "reward", "reward_std"]
    return df[cols].astype(float)


def _counts(source: windows.RatioSeries, groups: pd.DataFrame, steps: pd.Index) -> pd.DataFrame:
    """submitted and trainable per step: the logged counts (the ratio's own source, so the
    numbers and the source the notices name agree), else the groups table's, else NaN."""
    df = pd.DataFrame(index=steps)
    if source.submitted is not None:
        df["submitted"], df["trainable"] = source.submitted.reindex(steps), source.trainable.reindex(steps)
    elif len(groups):
        per = groups.groupby("step").agg(submitted=("trainable", "size"), trainable=("trainable", "sum"))
        df = df.join(per.astype(float))
    else:
        df["submitted"] = df["trainable"] = np.nan
    return df


def _rolling_sum(x: pd.Series, window: int) -> pd.Series:
    """Sum over the trailing `window` *trainer* steps (step in (s - window, s]), not the last
    `window` entries: a run imported with logging_steps 5 has 4 entries in 20 steps."""
    steps, c = x.index.to_numpy(np.float64), np.concatenate([[0.0], np.cumsum(x.to_numpy(np.float64))])
    lo = np.searchsorted(steps, steps - window, side="right")
    return pd.Series(c[1:] - c[lo], index=x.index)


def trainability(steps: pd.DataFrame, window: int = DEFAULT_WINDOW) -> dict:
    """Totals over the run: groups submitted/trainable, pooled ratio, zero-trainable steps,
    and the entries in the last window (window_entries: fewer than `window` when the run
    logged every few steps). Counts stay floats: imported entries carry fractional ones."""
    out = {"steps": len(steps), "first_step": int(steps.index[0]) if len(steps) else None,
           "last_step": int(steps.index[-1]) if len(steps) else None,
           "submitted": None, "trainable": None, "ratio": None, "phantom": None,
           "zero_trainable_steps": [], "final_ratio": None, "window": window,
           "window_entries": int(windows.in_window(steps.index.to_numpy(), window).sum()),
           "every_step": windows.dense(steps.index.to_numpy())}
    if not len(steps):
        return out
    if steps["submitted"].notna().any():
        s, t = float(steps["submitted"].sum()), float(steps["trainable"].sum())
        out.update(submitted=s, trainable=t, ratio=t / s if s else None)
        zero = steps.index[(steps["trainable"] == 0) & (steps["submitted"] > 0)]
    else:
        r = steps["ratio"].dropna()
        out["ratio"] = float(r.mean()) if len(r) else None
        zero = r.index[r <= 0]
    out["zero_trainable_steps"] = [int(x) for x in zero]
    if steps["phantom"].notna().any():
        out["phantom"] = float(steps["phantom"].sum())
    if steps["ratio_rolling"].notna().any():
        out["final_ratio"] = float(steps["ratio_rolling"].dropna().iloc[-1])
    return out


def _weights_per_step(data: RunData, steps: pd.Index) -> pd.DataFrame:
    """[step, metric] weight in force: the logged reward/<m>/weight, else the config's; a
    metric the config does not weight has weight 0, or NaN (unknown) when the run has no
    reward config at all (an import)."""
    w0 = (data.config.get("reward") or {}).get("weights")
    default = (lambda m: float(w0.get(m, 0.0))) if w0 else (lambda m: np.nan)  # noqa: E731
    out = pd.DataFrame(index=steps)
    for m in data.metrics:
        s = column(data.wide, names.metric_weight(m))
        out[m] = s.reindex(steps).ffill().bfill().fillna(default(m)) if s is not None else default(m)
    return out


def _weight_segments(data: RunData, metrics: list[str]):
    """Rollouts split where the weights changed: yields (RolloutArrays, weights[K]).
    Ragged groups are fine (health works on segments), weights are one vector per segment."""
    r = data.rollouts
    if r.empty or not metrics:
        return
    wps = _weights_per_step(data, pd.Index(sorted(r["step"].unique())))[metrics].fillna(0.0)
    seg = (wps.diff().abs().sum(axis=1) > 0).cumsum()  # a new segment at every weight change
    seg_of_row = r["step"].map(seg).to_numpy()
    for k in np.unique(seg_of_row):
        part = r[seg_of_row == k]
        yield rollout_stats.rollout_arrays(part, metrics), wps.loc[int(part["step"].iloc[0])].to_numpy(np.float64)


def bottlenecks(data: RunData) -> pd.DataFrame:
    """Per metric: weight (last), mean within-group std, share of the within-group variance
    of the total, share of groups where it was uniform, and whether it starved the signal
    (uniform in most groups, or mean within-group std ~0). Weight-0 metrics are never flagged.

    The variance share is computed per stretch of constant weights and averaged over the
    run's groups (weighted by each stretch's number of groups)."""
    unif = float(data.cfg("health", "uniform_std", 1e-3) or 1e-3)
    metrics = data.metrics
    steps = steps_index(data)
    w0 = (data.config.get("reward") or {}).get("weights") or {}
    last_w = _weights_per_step(data, steps).iloc[-1] if len(steps) else pd.Series({m: w0.get(m, np.nan) for m in metrics})
    cols = ["metric", "weight", "mean_group_std", "contribution", "uniform_fraction", "bottleneck", "why"]
    if not metrics:
        return pd.DataFrame(columns=cols)
    scored = [m for m in metrics if m in data.rollouts.columns]
    std = pd.Series(np.nan, index=metrics)
    uf = pd.Series(np.nan, index=metrics)
    share = pd.Series(np.nan, index=metrics)
    if scored:
        a = rollout_stats.rollout_arrays(data.rollouts, scored)
        std[scored] = rollout_stats.per_metric_group_std(a)
        uf[scored] = rollout_stats.uniform_fraction(a, uniform_std=unif)
        acc, n = np.zeros(len(scored)), 0
        for seg, w in _weight_segments(data, scored):
            acc += seg.n_groups * np.asarray(rollout_stats.variance_contribution(seg, w), dtype=np.float64)
            n += seg.n_groups
        share[scored] = acc / n if n else np.nan
    for m in metrics:  # no rollouts for it (imported): the logged per-metric within-group std, if any
        s = column(data.wide, names.metric_group_std(m))
        if m not in scored and s is not None:
            std[m] = float(s.mean())
    rows = []
    for m in metrics:
        weight = float(last_w.get(m, np.nan))
        starved = bool((np.isfinite(uf[m]) and uf[m] > MOST_GROUPS) or (np.isfinite(std[m]) and std[m] <= unif))
        rows.append({"metric": m, "weight": weight, "mean_group_std": float(std[m]), "contribution": float(share[m]),
                     "uniform_fraction": float(uf[m]), "bottleneck": starved and not weight <= 0,
                     "why": _bottleneck_why(m, weight, std[m], uf[m], share[m], starved, unif)})
    return pd.DataFrame(rows, columns=cols)


def _bottleneck_why(m, weight, std, uf, share, starved, unif) -> str:
    if not np.isfinite(std):
        return f"{m}: no within-group scores recorded"
    where = (f"uniform in {uf:.0%} of groups (mean within-group std {std:.4f})" if np.isfinite(uf)
             else f"uniform inside groups (mean within-group std {std:.4f}, from the logged scalars)")
    if starved and weight <= 0:
        return f"{m} is {where}, but its weight is 0: it is not part of the reward"
    if starved:
        w = f"its weight {weight:g}" if np.isfinite(weight) else "its weight"
        return (f"{m} is {where}; a group counts as uniform at std <= {unif:g}. It rarely separates the "
                f"completions of a prompt, so {w} mostly shifts every total alike: give it partial credit, "
                "raise the group size, or move weight to a metric that varies")
    part = f", {share:.0%} of the within-group variance" if np.isfinite(share) else ""
    return f"{m} varies inside groups (mean within-group std {std:.4f}{part})"


def bottleneck_summary(bn: pd.DataFrame) -> str:
    flagged = bn[bn["bottleneck"]] if len(bn) else bn
    if not len(bn) or bn["mean_group_std"].isna().all():
        return "No within-group scores recorded: the variance bottleneck cannot be computed."
    if not len(flagged):
        return "No variance bottleneck: every weighted metric varied inside most groups."
    worst = flagged.sort_values(["uniform_fraction", "weight"], ascending=False)
    parts = [f"{r.metric} (" + (f"uniform in {r.uniform_fraction:.0%} of groups, " if np.isfinite(r.uniform_fraction)
                                 else "std ~0 in the logged scalars, ")
             + (f"weight {r.weight:g})" if np.isfinite(r.weight) else "weight unknown)") for r in worst.itertuples()]
    return "Variance bottleneck: " + ", ".join(parts) + "."


def reward_trend(steps: pd.DataFrame, window: int = DEFAULT_WINDOW, min_points: int = 5) -> dict:
    """OLS slope of the per-step reward over the whole run and over the last `window` steps
    (trend_stats.reward_trend: sign only when significant at p < 0.05)."""
    r = steps["reward"].dropna() if "reward" in steps else pd.Series(dtype=float)
    out = {}
    for key, series in (("run", r), ("last", windows.last_steps(r, window))):
        t = trend_stats.reward_trend(series, min_points=min_points)
        out[key] = t
        out[key + "_text"] = _trend_text(t, min_points)
    if len(r):
        out["first"], out["final"], out["best"] = float(r.iloc[0]), float(r.iloc[-1]), float(r.max())
        out["best_step"] = int(r.idxmax())
    return out


def _trend_text(t, min_points: int) -> str:
    if t.slope is None:
        return f"not enough steps for a trend ({t.n} logged)"
    word = {1: "rising", -1: "falling", 0: "no significant trend"}[t.sign]
    p = f", p = {t.p_value:.3g}" if t.p_value is not None else ""
    short = f"; a trend needs at least {min_points} steps" if t.n < min_points else ""
    return f"{word}: slope {t.slope:+.4g} per step over {t.n} steps{p}{short}"


def eval_table(data: RunData) -> pd.DataFrame:
    """The held-out evaluations: index step, columns reward and pass@1 (those logged); empty
    when the run evaluated nothing (eval.every = 0, or a trainer that logs no eval/ names)."""
    have = [n for n in EVAL_COLS if n in data.wide.columns]
    if not have:
        return pd.DataFrame()
    table = data.wide[have].dropna(how="all").rename(columns=EVAL_COLS)
    table.index.name = "step"
    return table


def wasted_sampling(data: RunData) -> str | None:
    """'62% of the sampled tokens (31,000 of 50,000)': the run's sampling spent on groups that
    taught nothing (step_stats.wasted_compute), dynamic sampling's extra batches included; None when
    the run did not log it (an import, an older run)."""
    total, wasted = column(data.wide, names.CUM_SAMPLED_TOKENS), column(data.wide, names.CUM_WASTED_TOKENS)
    if total is None or wasted is None or not total.notna().any():
        return None
    t, w = float(total.dropna().iloc[-1]), float(wasted.dropna().iloc[-1])
    seconds = column(data.wide, names.WASTED_SAMPLING_S)
    secs = f", {float(seconds.sum()):.0f} s of sampling" if seconds is not None else ""
    return f"{w / t:.0%} of the sampled tokens ({w:,.0f} of {t:,.0f}{secs})" if t else None
