"""Post-run analysis: plain functions over one run's store, and the report export.

What a finished (or running, or imported) run teaches, in the order you read it:
  1. trainability  - how many groups could carry a signal, over time, and when none did;
  2. bottlenecks   - which reward metric was uniform inside groups and starved the signal;
  3. change ledger - every applied weight/threshold/difficulty change with the ratio and
                     reward in a window before and after it ("reuse" when it helped);
  4. reward trend  - fitted slope and whether it is significant;
  5. inspector     - one group's completions ranked, and why it was (not) trainable;
  6. comparison    - several runs side by side, config keys that differ;
and the export of all of it as self-contained HTML (plotly inlined: opens offline),
Markdown, or CSV. The dashboard page (pages/analysis.py) and the CLI
(`python -m grpo_core report RUN`) only call these; nothing here imports torch.

Before/after windows of a change applied at step s (`window` = W steps, default 20):
  before = logged steps t with  max(s - W, p) <= t < s     p = previous change's step
  after  = logged steps t with  s <= t < min(s + W, n)     n = next change's step
Step s is the first step under the new setting (the trainer applies a request between
steps and records the step it takes effect at; a change event recorded at the last step
under the old setting, as the auto curriculum writes it, is moved to the step where the
logged setting changes). A window never reaches across another change, so each difference
is attributable to one change; run ends clip it naturally. Changes at the same step share
their windows.
"""
from __future__ import annotations

import html
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import health
from grpo_core.runs import names
from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings
from grpo_core.runs.live_settings import SET_AUTOPILOT, SET_DIFFICULTY, SET_STEPS, SET_THRESHOLD, SET_WEIGHTS
from grpo_core.runs.store import FAILED, FINISHED, STALE, STOPPED, RunMeta, RunStore, display_status

INCOMPLETE = "incomplete"  # an imported run whose source stopped before its planned last step

DEFAULT_WINDOW = 20
MOST_GROUPS = 0.5  # a metric uniform in more than this share of groups starved the signal
LIFECYCLE_KINDS = ("pause", "resume", "stop", "checkpoint")  # applied, but not settings: never "reuse"
# Settings changed by requests: (config section, key, ledger label); the numbers from the registry.
RUN_SETTINGS = {**{s.kind: ("grpo", s.key, s.key) for s in live_settings.NUMBER_SETTINGS},
                SET_DIFFICULTY: ("task", "level", "level"), SET_AUTOPILOT: ("autopilot", "enabled", "autopilot")}
NO_REUSE = LIFECYCLE_KINDS + (SET_STEPS, SET_AUTOPILOT)  # change no step's signal: never "reuse" either
ANNOTATIONS = ("reason", "undo_of")  # request keys that explain a change, not part of the setting
ROLLOUT_FIXED_COLS = ("step", "group", "idx", "total", "error", "completion")


class ReportError(ValueError):
    """A report request that cannot be answered (e.g. a step/group not in the run)."""


# =============================================================================================
# Loading: one read of the store, everything else is pure pandas over it
# =============================================================================================
@dataclass
class RunData:
    run_id: str
    db_path: Path
    meta: dict
    config: dict
    status: str  # display status (stale derived from the heartbeat)
    wide: pd.DataFrame  # scalars: index step, columns names.*
    groups: pd.DataFrame
    rollouts: pd.DataFrame  # no completion text (the inspector reads text per group)
    changes: pd.DataFrame
    metrics: list[str]
    # A large run read in part (see load_run): {"steps_read", "steps", "rollouts"}; None: all of it.
    sampled: dict | None = None

    @property
    def error(self) -> str | None:
        return self.meta.get("error")

    @property
    def source(self) -> str:
        return self.meta.get("source") or ("import" if self.meta.get("kind") == "import" else "grpo_core")

    @property
    def imported(self) -> bool:
        """Written by an importer (a finished log of another trainer), not by a live process."""
        return self.meta.get("kind") == "import"

    def cfg(self, section: str, key: str, default=None):
        return (self.config.get(section) or {}).get(key, default)


ROLLOUT_BUDGET = 100_000  # rollouts one report reads at most (~0.5 s); a larger run's are sampled by step
GROUP_SCALARS = (names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE, names.PHANTOM_GROUPS, names.REWARD, names.REWARD_STD)


def _sample_steps(store: RunStore, wide: pd.DataFrame, changes: pd.DataFrame, window: int,
                  budget: int) -> tuple[list[int] | None, int, int]:
    """(steps to read or None for all, steps with rollouts, estimated rollouts). A run whose
    rollouts fit the budget is read whole. A larger one (10M rollouts take minutes to read and
    reduce) is read at: its last `window` steps (examples, inspector), the
    before/after windows of every change (the ledger's like-for-like rewards) and evenly
    spaced steps for the rest of the budget. What the rollouts feed there are means over
    groups (within-group std, uniform share, variance share), which a step sample estimates."""
    lo, hi, per_step = store.rollout_extent()
    if hi is None or per_step == 0:
        return None, 0, 0
    steps = np.asarray(wide.index, dtype=np.int64) if len(wide) else np.arange(lo, hi + 1)
    steps = steps[(steps >= lo) & (steps <= hi)]
    est = len(steps) * per_step
    if est <= budget or not len(steps):
        return None, len(steps), est
    have = set(steps.tolist())
    want = set(steps[-window:].tolist())
    for c in changes["step"].dropna().astype(int):  # +-1: a change may be recorded a step early
        want |= have & set(range(c - window - 1, c + window + 2))
    rest = max(budget // per_step - len(want), 0)
    if rest:
        want |= set(steps[np.linspace(0, len(steps) - 1, rest).astype(int)].tolist())
    return sorted(want), len(steps), est


def load_run(run, window: int = DEFAULT_WINDOW, budget: int | None = None) -> RunData:
    """A run dir, run.db path, run id, or an open RunStore -> RunData (read once). Scalars and
    changes are read whole; rollouts (and groups, when the per-step counts are logged) of a
    run with more than `budget` (default ROLLOUT_BUDGET) rollouts are read for a sample of
    steps (_sample_steps)."""
    if isinstance(run, RunData):
        return run
    own = not isinstance(run, RunStore)
    store = RunStore.open(run, readonly=True) if own else run
    try:
        meta = store.get_meta()
        wide = store.scalars_wide()
        changes = store.changes()
        sample, n_steps, est = _sample_steps(store, wide, changes, window,
                                             ROLLOUT_BUDGET if budget is None else budget)
        counts_logged = all(_col(wide, n) is not None for n in GROUP_SCALARS)
        groups = store.groups(steps=sample if counts_logged else None)  # else steps_table counts them
        rollouts = store.rollouts(with_text=False, steps=sample)
    finally:
        if own:
            store.close()
    config = RunMeta.parse(meta).config
    metrics = list(meta.get("metric_names") or [])  # the trainer records its metrics in order
    metrics += [m for m in (config.get("reward") or {}).get("weights") or {} if m not in metrics]
    for col in rollouts.columns:  # metrics scored but not in the config (custom, imported)
        if col not in ROLLOUT_FIXED_COLS and col not in metrics:
            metrics.append(col)
    for col in wide.columns:
        parsed = names.parse_metric_name(col)
        if parsed and parsed[0] not in metrics:
            metrics.append(parsed[0])
    return RunData(run_id=store.run_id, db_path=store.path, meta=meta, config=config,
                   status=display_status(meta), wide=wide, groups=groups, rollouts=rollouts,
                   changes=changes, metrics=metrics,
                   sampled=None if sample is None else {"steps_read": len(sample), "steps": n_steps, "rollouts": est})


def _col(wide: pd.DataFrame, name: str) -> pd.Series | None:
    if name not in wide.columns:
        return None
    s = pd.to_numeric(wide[name], errors="coerce")
    return s if s.notna().any() else None


def _steps_index(data: RunData) -> pd.Index:
    steps = set(int(s) for s in data.wide.index)
    if len(data.groups):
        steps |= set(int(s) for s in data.groups["step"].unique())
    return pd.Index(sorted(steps), name="step", dtype="int64")


# =============================================================================================
# Run state: what the reader must know before trusting the numbers
# =============================================================================================
@dataclass
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


def notices(data: RunData) -> list[Notice]:
    out = []
    steps = _steps_index(data)
    last = int(steps[-1]) if len(steps) else None
    planned = data.cfg("grpo", "steps")
    of = f" of {planned}" if planned else ""
    if data.status == FAILED:
        at = f" at step {last}" if last is not None else " before its first step"
        out.append(Notice("error", f"Run failed{at}: {data.error or 'no error text recorded'}. "
                                   "The analysis covers the steps logged before the failure."))
    elif data.status == STALE:
        where = f"at step {last}{of}" if last is not None else "before its first step"
        out.append(Notice("warning", f"The trainer stopped reporting (no heartbeat) {where}: "
                                     "it may have been killed. The analysis covers the steps logged."))
    elif data.status == INCOMPLETE:
        out.append(Notice("warning", f"{data.meta.get('status_detail') or INCOMPLETE}: the source stopped before "
                                     "its planned last step (killed, crashed or still running when it was "
                                     "imported). The analysis covers the steps logged."))
    elif data.status not in (FINISHED, STOPPED) and not data.imported:
        where = f"step {last}{of}" if last is not None else "no step logged yet"
        out.append(Notice("info", f"Run still in progress ({data.status}, {where}): the analysis "
                                  "covers the steps so far; reload for newer ones."))
    elif data.status == STOPPED:
        out.append(Notice("info", f"Run stopped by request at step {last}{of}."))
    if not len(steps):
        out.append(Notice("warning", "No steps logged yet: there is nothing to analyse in this run."))
        return out
    if len(steps) == 1:
        out.append(Notice("warning", f"Only one step logged (step {last}): the reward trend and the "
                                     "before/after windows need at least two steps."))
    if data.groups.empty and data.rollouts.empty:
        ratio_from = _ratio_source(data)
        out.append(Notice("warning", f"No per-group or per-rollout records in this run (source: {data.source}): "
                                     "the variance shares, uniform fractions, phantom counts and the rollout "
                                     f"inspector are unavailable; the trainable ratio comes from {ratio_from}."))
    elif data.rollouts.empty:
        out.append(Notice("warning", "Groups are recorded but no rollouts: variance shares, uniform fractions "
                                     "and the rollout inspector are unavailable."))
    if data.sampled:
        sm = data.sampled
        out.append(Notice("info", f"Large run (~{sm['rollouts']:,} rollouts): variance shares, uniform fractions, "
                                  "like-for-like rewards and the rollout inspector use the rollouts of "
                                  f"{sm['steps_read']:,} of its {sm['steps']:,} steps (the last ones, the windows "
                                  "around each change, evenly spaced others); trainability, rewards and ratios "
                                  "use every step."))
    return out


def _ratio_source(data: RunData) -> str:
    for name in (names.GROUPS_SUBMITTED, names.TRAINABLE_RATIO, names.CUM_GROUPS_SUBMITTED, names.FRAC_REWARD_ZERO_STD):
        if _col(data.wide, name) is not None:
            return {names.GROUPS_SUBMITTED: "the logged group counts", names.TRAINABLE_RATIO: f"the logged {name}",
                    names.CUM_GROUPS_SUBMITTED: "the logged cumulative group counts",
                    names.FRAC_REWARD_ZERO_STD: f"1 - {name} (TRL's share of zero-std groups)"}[name]
    return "nothing (no ratio was logged)"


# =============================================================================================
# 1. Trainability
# =============================================================================================
def steps_table(data: RunData, window: int = DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per step: submitted, trainable, ratio, cum_ratio, ratio_rolling, phantom,
    reward, reward_std. Counts are the trainer's logged counts (what the live page shows),
    else counted from the groups table; imported runs may have only a ratio (counts NaN)."""
    steps = _steps_index(data)
    df = pd.DataFrame(index=steps)
    w, g = data.wide.reindex(steps), data.groups
    sub, tr = _col(w, names.GROUPS_SUBMITTED), _col(w, names.GROUPS_TRAINABLE)
    if sub is not None and tr is not None:
        df["submitted"], df["trainable"] = sub, tr
    elif len(g):
        per = g.groupby("step").agg(submitted=("trainable", "size"), trainable=("trainable", "sum"))
        df = df.join(per.astype(float))
    else:
        df["submitted"] = df["trainable"] = np.nan
    if df["submitted"].notna().any():
        df["ratio"] = df["trainable"] / df["submitted"].where(df["submitted"] > 0)
        cs, ct = df["submitted"].fillna(0).cumsum(), df["trainable"].fillna(0).cumsum()
        df["cum_ratio"] = ct / cs.where(cs > 0)
        rs, rt = (_rolling_sum(df["submitted"].fillna(0), window), _rolling_sum(df["trainable"].fillna(0), window))
        df["ratio_rolling"] = rt / rs.where(rs > 0)  # pooled over the trailing window
    else:  # ratio only (imported): TRAINABLE_RATIO or 1 - frac_reward_zero_std, per step
        df["ratio"] = health.step_ratio_series(w).reindex(steps)
        cum = _col(w, names.CUM_TRAINABLE_RATIO)  # an importer's cumulative ratio knows the step weights
        df["cum_ratio"] = cum if cum is not None else df["ratio"].expanding().mean()
        r = df["ratio"]
        df["ratio_rolling"] = _rolling_sum(r.fillna(0), window) / _rolling_sum(r.notna().astype(float), window)
    ph = _col(w, names.PHANTOM_GROUPS)
    if ph is not None:
        df["phantom"] = ph
    elif len(g):
        df["phantom"] = g.groupby("step")["phantom"].sum().astype(float).reindex(steps)
    else:
        df["phantom"] = np.nan
    for col, name, gcol in (("reward", names.REWARD, "reward_mean"), ("reward_std", names.REWARD_STD, "reward_std")):
        s = _col(w, name)
        if s is None and len(g):
            s = g.groupby("step")[gcol].mean().reindex(steps)
        df[col] = s if s is not None else np.nan
    cols = ["submitted", "trainable", "ratio", "cum_ratio", "ratio_rolling", "phantom", "reward", "reward_std"]
    return df[cols].astype(float)


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
           "window_entries": int(health.in_window(steps.index.to_numpy(), window).sum()),
           "every_step": health.dense(steps.index.to_numpy())}
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


# =============================================================================================
# 2. Variance bottlenecks
# =============================================================================================
def _weights_per_step(data: RunData, steps: pd.Index) -> pd.DataFrame:
    """[step, metric] weight in force: the logged reward/<m>/weight, else the config's; a
    metric the config does not weight has weight 0, or NaN (unknown) when the run has no
    reward config at all (an import)."""
    w0 = (data.config.get("reward") or {}).get("weights")
    default = (lambda m: float(w0.get(m, 0.0))) if w0 else (lambda m: np.nan)  # noqa: E731
    out = pd.DataFrame(index=steps)
    for m in data.metrics:
        s = _col(data.wide, names.metric_weight(m))
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
        yield health.rollout_arrays(part, metrics), wps.loc[int(part["step"].iloc[0])].to_numpy(np.float64)


def bottlenecks(data: RunData) -> pd.DataFrame:
    """Per metric: weight (last), mean within-group std, share of the within-group variance
    of the total, share of groups where it was uniform, and whether it starved the signal
    (uniform in most groups, or mean within-group std ~0). Weight-0 metrics are never flagged.

    The variance share is computed per stretch of constant weights and averaged over the
    run's groups (weighted by each stretch's number of groups)."""
    unif = float(data.cfg("health", "uniform_std", 1e-3) or 1e-3)
    metrics = data.metrics
    steps = _steps_index(data)
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
        a = health.rollout_arrays(data.rollouts, scored)
        std[scored] = health.per_metric_group_std(a)
        uf[scored] = health.uniform_fraction(a, uniform_std=unif)
        acc, n = np.zeros(len(scored)), 0
        for seg, w in _weight_segments(data, scored):
            acc += seg.n_groups * np.asarray(health.variance_contribution(seg, w), dtype=np.float64)
            n += seg.n_groups
        share[scored] = acc / n if n else np.nan
    for m in metrics:  # no rollouts for it (imported): the logged per-metric within-group std, if any
        s = _col(data.wide, names.metric_group_std(m))
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


# =============================================================================================
# 3. Weight-change ledger
# =============================================================================================
def _values_at(data: RunData, kind: str, step: int | None):
    """The setting of `kind` logged at `step` (None when not logged)."""
    if step is None or step not in data.wide.index:
        return None
    row = data.wide.loc[step]
    if kind == SET_WEIGHTS:
        vals = {m: float(row[names.metric_weight(m)]) for m in data.metrics
                if names.metric_weight(m) in row.index and pd.notna(row[names.metric_weight(m)])}
        return vals or None
    name = {SET_THRESHOLD: names.MIN_GROUP_STD, SET_DIFFICULTY: names.DIFFICULTY}.get(kind)
    if name and name in row.index and pd.notna(row[name]):
        return float(row[name])
    return None


def _initial_setting(data: RunData, kind: str):
    if kind == SET_WEIGHTS:
        return {m: float(v) for m, v in ((data.config.get("reward") or {}).get("weights") or {}).items()}
    if kind in (SET_THRESHOLD, SET_DIFFICULTY):
        v = data.cfg(*RUN_SETTINGS[kind][:2])
        return float(v) if v is not None else None
    if kind in RUN_SETTINGS:
        sec, key, _ = RUN_SETTINGS[kind]
        return data.cfg(sec, key, False if kind == SET_AUTOPILOT else None)
    return None


def _requested(kind: str, request: dict, old):
    request = {k: v for k, v in (request or {}).items() if k not in ANNOTATIONS}
    if kind == SET_WEIGHTS:
        new = dict(old or {})
        new.update({k: float(v) for k, v in (request.get("weights") or {}).items()})
        return new
    if kind in (SET_THRESHOLD, SET_DIFFICULTY):
        return request.get(RUN_SETTINGS[kind][1])
    if kind in RUN_SETTINGS:
        return request.get(RUN_SETTINGS[kind][1], old)
    return request or None


def _change_text(kind: str, old, new) -> str:
    if kind == SET_WEIGHTS:
        keys = [k for k in (new or {}) if (old or {}).get(k) != new.get(k)]
        return ", ".join(f"{k} {fmt((old or {}).get(k))}→{fmt(new[k])}" for k in keys) or "weights unchanged"
    if kind == SET_AUTOPILOT:
        return f"autopilot {'on' if old else 'off'}→{'on' if new else 'off'}"
    if kind in RUN_SETTINGS:
        return f"{RUN_SETTINGS[kind][2]} {fmt(old)}→{fmt(new)}"
    if new:
        return f"{kind} {json.dumps(new, sort_keys=True)}"
    return kind


def _window_stats(steps: pd.DataFrame, lo: int, hi: int) -> dict:
    """Ratio (pooled when counts exist), reward and reward std over logged steps lo <= t < hi."""
    w = steps[(steps.index >= lo) & (steps.index < hi)]
    out = {"n": len(w), "first": int(w.index[0]) if len(w) else None, "last": int(w.index[-1]) if len(w) else None,
           "ratio": np.nan, "reward": np.nan, "reward_std": np.nan}
    if not len(w):
        return out
    if w["submitted"].notna().any() and w["submitted"].sum() > 0:
        out["ratio"] = float(w["trainable"].sum() / w["submitted"].sum())
    elif w["ratio"].notna().any():
        out["ratio"] = float(w["ratio"].mean())
    out["reward"] = float(w["reward"].mean()) if w["reward"].notna().any() else np.nan
    out["reward_std"] = float(w["reward_std"].mean()) if w["reward_std"].notna().any() else np.nan
    return out


def _reward_under(data: RunData, weights: dict, lo: int, hi: int) -> float:
    """Mean reward of steps lo <= t < hi re-scored under `weights` (like-for-like comparison
    of a weight change: the recorded reward before it was measured on another scale)."""
    r = data.rollouts
    if r.empty or not weights:
        return np.nan
    r = r[(r["step"] >= lo) & (r["step"] < hi)]
    if r.empty:
        return np.nan
    w = np.array([float(weights.get(m, 0.0)) for m in data.metrics])
    total = r.reindex(columns=data.metrics).fillna(0.0).to_numpy(np.float64) @ w
    per_group = pd.Series(total).groupby([r["step"].to_numpy(), r["group"].to_numpy()]).mean()
    return float(per_group.groupby(level=0).mean().mean())  # as train/reward: mean of group means


LEDGER_COLS = ["step", "kind", "source", "change", "old", "new", "before", "after", "n_before", "n_after",
               "ratio_before", "ratio_after", "ratio_diff", "reward_before", "reward_after", "reward_diff",
               "reward_std_before", "reward_std_after", "reward_std_diff", "reward_diff_same_weights", "reuse",
               "note", "reason"]


SETTING_KINDS = (SET_WEIGHTS,) + tuple(RUN_SETTINGS)


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return all(abs(float(a.get(k, np.nan)) - float(v)) < 1e-9 for k, v in b.items())
    try:
        return a is not None and b is not None and abs(float(a) - float(b)) < 1e-9
    except (TypeError, ValueError):
        return False


def _resolve_changes(data: RunData, steps: pd.DataFrame) -> list[dict]:
    """Each applied change with its old/new setting and the first step under it.

    Requests are recorded at the step they take effect. A change recorded at the last step
    under the old setting (the auto curriculum logs its event with the step just finished)
    is moved to the next step when the logged setting shows that."""
    state: dict = {}
    out = []
    logged = steps.index
    for c in data.changes.dropna(subset=["step"]).itertuples():
        s, kind, notes = int(c.step), c.kind, []
        if kind not in state:
            state[kind] = _initial_setting(data, kind)
        before_step = int(logged[logged < s][-1]) if (logged < s).any() else None
        old = _values_at(data, kind, before_step)
        old = state[kind] if old is None else old
        new = _requested(kind, c.request or {}, old)
        at_s = _values_at(data, kind, s)
        if kind == SET_WEIGHTS and at_s and _same(at_s, (c.request or {}).get("weights", {})):
            new = at_s  # what the trainer actually used (metrics not named included)
        nxt = int(logged[logged > s][0]) if (logged > s).any() else None
        if kind in SETTING_KINDS and at_s is not None and not _same(at_s, new) and nxt is not None:
            at_next = _values_at(data, kind, nxt)
            if _same(at_next, new if kind != SET_WEIGHTS else (c.request or {}).get("weights", {})):
                notes.append(f"recorded at step {s}; the logged setting changes at step {nxt}")
                old, s = at_s, nxt
                if kind == SET_WEIGHTS:
                    new = at_next
        if kind in SETTING_KINDS:
            state[kind] = new
        out.append({"step": s, "kind": kind, "source": c.source or "", "old": old, "new": new, "notes": notes,
                    "reason": str((c.request or {}).get("reason") or "")})
    return out


def change_ledger(data: RunData, steps: pd.DataFrame | None = None, window: int = DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per applied change (store.changes()), windows as in the module docstring.

    reuse: a setting change (not pause/resume/stop/checkpoint) after which the trainable
    ratio rose and the reward did not fall, both windows non-empty; for a weight change the
    reward must also not fall when the before-window is re-scored under the new weights."""
    if window < 1:
        raise ConfigError(f"window must be >= 1 step, got {window}")
    if data.changes is None or data.changes.empty:
        return pd.DataFrame(columns=LEDGER_COLS)
    steps = steps_table(data, window) if steps is None else steps
    changes = _resolve_changes(data, steps)
    change_steps = sorted(set(c["step"] for c in changes))
    end = int(steps.index[-1]) + 1 if len(steps) else 0
    rows = []
    for c in changes:
        s, kind, old, new, notes = c["step"], c["kind"], c["old"], c["new"], list(c["notes"])
        prev = max([x for x in change_steps if x < s], default=None)
        nxt = min([x for x in change_steps if x > s], default=None)
        lo = max(s - window, prev) if prev is not None else s - window
        hi = min(s + window, nxt) if nxt is not None else min(s + window, end)
        b, a = _window_stats(steps, lo, s), _window_stats(steps, s, hi)
        same_w = np.nan
        if kind == SET_WEIGHTS and b["n"] and a["n"]:
            same_w = a["reward"] - _reward_under(data, new, lo, s)
        n_here = sum(x["step"] == s for x in changes)
        if n_here > 1:
            notes.append(f"{n_here} changes at this step share their windows")
        if not b["n"]:
            notes.append("no steps before the change")
        if not a["n"]:
            notes.append("no steps after the change yet")
        ratio_d, rew_d = a["ratio"] - b["ratio"], a["reward"] - b["reward"]
        reuse = bool(kind not in NO_REUSE and b["n"] and a["n"] and np.isfinite(ratio_d) and ratio_d > 0
                     and np.isfinite(rew_d) and rew_d >= 0 and not (np.isfinite(same_w) and same_w < 0))
        rows.append({
            "step": s, "kind": kind, "source": c["source"], "change": _change_text(kind, old, new),
            "old": old, "new": new, "before": _span(b), "after": _span(a), "n_before": b["n"], "n_after": a["n"],
            "ratio_before": b["ratio"], "ratio_after": a["ratio"], "ratio_diff": ratio_d,
            "reward_before": b["reward"], "reward_after": a["reward"], "reward_diff": rew_d,
            "reward_std_before": b["reward_std"], "reward_std_after": a["reward_std"],
            "reward_std_diff": a["reward_std"] - b["reward_std"], "reward_diff_same_weights": same_w,
            "reuse": reuse, "note": "; ".join(notes), "reason": c["reason"]})
    return pd.DataFrame(rows, columns=LEDGER_COLS)


def _span(w: dict) -> str:
    return f"{w['first']}–{w['last']}" if w["n"] else "—"


# =============================================================================================
# 4. Reward trend
# =============================================================================================
def reward_trend(steps: pd.DataFrame, window: int = DEFAULT_WINDOW, min_points: int = 5) -> dict:
    """OLS slope of the per-step reward over the whole run and over the last `window` steps
    (health.reward_trend: sign only when significant at p < 0.05)."""
    r = steps["reward"].dropna() if "reward" in steps else pd.Series(dtype=float)
    out = {}
    for key, series in (("run", r), ("last", health.last_steps(r, window))):
        t = health.reward_trend(series, min_points=min_points)
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


# =============================================================================================
# 5. Rollout inspector
# =============================================================================================
@dataclass
class GroupView:
    step: int
    group: int
    prompt_id: str | None
    table: pd.DataFrame  # rank, idx, total, <metric>..., completion, error
    std: float | None
    threshold: float
    trainable: bool | None
    phantom: bool | None
    varied: dict  # metric -> within-group std, for metrics that varied
    explanation: str
    prompt: str | None = None  # the prompt as the model read it (the store's prompts table), if kept


def _threshold_at(data: RunData, step: int) -> float:
    s = _col(data.wide, names.MIN_GROUP_STD)
    if s is not None and step in s.index and pd.notna(s.loc[step]):
        return float(s.loc[step])
    thr = data.cfg("grpo", "min_group_std", 0.01)
    ch = data.changes
    if ch is not None and len(ch):
        for c in ch[(ch["kind"] == SET_THRESHOLD) & (ch["step"] <= step)].itertuples():
            thr = (c.request or {}).get("min_group_std", thr)
    return float(thr if thr is not None else 0.01)


def group_index(data: RunData) -> pd.DataFrame:
    """Groups to choose from in the inspector (from the groups table, else from rollouts)."""
    if len(data.groups):
        return data.groups
    if len(data.rollouts):
        return (data.rollouts.groupby(["step", "group"]).size().rename("size").reset_index())
    return pd.DataFrame(columns=["step", "group"])


def inspect_group(data: RunData, step: int, group: int) -> GroupView:
    """One group's completions ranked by total reward, and why it was (not) trainable."""
    step, group = int(step), int(group)
    grow = data.groups[(data.groups["step"] == step) & (data.groups["group"] == group)] if len(data.groups) \
        else data.groups
    with RunStore(data.db_path, readonly=True) as store:
        r = store.rollouts(step=step, group=group)
        text = store.prompt_texts([str(grow["prompt_id"].iloc[0])]) if len(grow) else {}
    if r.empty and grow.empty:
        idx = group_index(data)
        where = (f"steps {int(idx['step'].min())}–{int(idx['step'].max())}" if len(idx) else "no groups recorded")
        raise ReportError(f"step {step}, group {group} is not in run {data.run_id} ({where})")
    thr = _threshold_at(data, step)
    unif = float(data.cfg("health", "uniform_std", 1e-3) or 1e-3)
    outcome = data.cfg("reward", "outcome_metric", "") or ""
    rec_tr = bool(grow["trainable"].iloc[0]) if len(grow) else None
    rec_ph = bool(grow["phantom"].iloc[0]) if len(grow) else None
    prompt = str(grow["prompt_id"].iloc[0]) if len(grow) else None
    if r.empty:
        expl = (f"No rollouts were recorded for step {step}, group {group}: the group was "
                f"{'trainable' if rec_tr else 'not trainable'} (recorded std {grow['reward_std'].iloc[0]:.4f}), "
                "but its completions cannot be shown.")
        return GroupView(step, group, prompt, pd.DataFrame(), None, thr, rec_tr, rec_ph, {}, expl, text.get(prompt))
    metrics = [m for m in data.metrics if m in r.columns]
    table = r.sort_values("total", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    extra = [c for c in ("completion", "error") if c in table and table[c].notna().any()]  # only when kept / any
    table = table[["rank", "idx", "total", *metrics, *extra]]
    totals = table["total"].to_numpy(np.float64)
    std = float(totals.std())
    mstd = {m: float(table[m].to_numpy(np.float64).std()) for m in metrics}
    varied = {m: v for m, v in mstd.items() if v > max(unif, health.STD_EPS)}
    passes = std > max(thr, health.STD_EPS)
    outcome_varies = (outcome in varied) if outcome else True
    trainable = rec_tr if rec_tr is not None else bool(passes and outcome_varies)
    phantom = rec_ph if rec_ph is not None else bool(passes and not outcome_varies)
    expl = _explain(len(table), totals, std, thr, varied, metrics, outcome, table, trainable, phantom)
    if rec_tr is not None and rec_tr != bool(passes and outcome_varies):
        expl += (f" (Recorded as {'trainable' if rec_tr else 'not trainable'} by the trainer; recomputing from "
                 "the stored rollouts gives the opposite: the threshold or the rollouts kept may differ.)")
    return GroupView(step, group, prompt, table, std, thr, trainable, phantom, varied, expl, text.get(prompt))


def _explain(n, totals, std, thr, varied, metrics, outcome, table, trainable, phantom) -> str:
    var_txt = ", ".join(f"{m} (std {v:.3f})" for m, v in varied.items())
    uniform = [m for m in metrics if m not in varied]
    uni_txt = (f"; uniform: {', '.join(uniform)}" if uniform else "")
    if phantom:
        vals = sorted(set(np.round(table[outcome].to_numpy(np.float64), 6))) if outcome in table else []
        return (f"Not trainable (phantom variance): the total-reward std {std:.4f} passes the threshold {thr:g}, "
                f"but the outcome metric '{outcome}' was uniform (every completion scored "
                f"{', '.join(f'{v:g}' for v in vals)}), so the variance came only from shaping terms: "
                f"{', '.join(m for m in varied) or 'none'}.")
    if trainable:
        gate = f" and the outcome metric '{outcome}' varied" if outcome else ""
        return (f"Trainable: the total-reward std {std:.4f} of its {n} completions is above the threshold "
                f"{thr:g}{gate}. Metrics that varied: {var_txt or 'none'}{uni_txt}.")
    if np.ptp(totals) <= 1e-12:
        why = ("no metric varied" if not varied else f"the metrics that varied ({var_txt}) cancel out or "
               "carry no weight in the total")
        return (f"Not trainable: all {n} completions got the same total reward {totals[0]:.4f} (std 0 <= "
                f"threshold {thr:g}); {why}. Every advantage would be 0.")
    if std <= thr:
        return (f"Not trainable: the total-reward std {std:.4f} is at or below the threshold {thr:g}; "
                f"only {var_txt or 'no metric'} varied, too little after weighting{uni_txt}.")
    gate = f" the outcome metric '{outcome}' did not vary" if outcome else " it was masked by the trainer"
    return f"Not trainable: std {std:.4f} is above the threshold {thr:g}, but{gate}."


# =============================================================================================
# 6. Run comparison
# =============================================================================================
def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _wall_time(data: RunData) -> float | None:
    end = data.meta.get("status_time") if data.status in (FINISHED, FAILED, STOPPED) else None
    end = end or data.meta.get("heartbeat")
    start = data.meta.get("started") or data.meta.get("created")
    if data.imported or not end or not start:
        return None  # an import's timestamps are the import's, not the run's
    return float(end) - float(start)


def compare_runs(runs: list, window: int = DEFAULT_WINDOW) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs side by side: (summary, config_diff). config_diff has one row per config key
    whose value differs between the runs (missing keys count as different)."""
    if len(runs) < 2:
        raise ReportError(f"a comparison needs at least two runs, got {len(runs)}")
    datas = [load_run(r) for r in runs]
    rows = []
    for d in datas:
        st = steps_table(d, window)
        tr, rt, ev = trainability(st, window), reward_trend(st, window), eval_table(d)
        step_s = _col(d.wide, names.TIME_STEP)
        rows.append({"run": d.run_id, "status": d.status, "steps": tr["steps"],
                     "last_step": tr["last_step"], "planned_steps": d.cfg("grpo", "steps"),
                     "submitted": tr["submitted"], "trainable": tr["trainable"], "ratio": tr["ratio"],
                     "reward_final": rt.get("final"), "reward_best": rt.get("best"),
                     "reward_trend": rt["run_text"],
                     **{f"eval_{col}_final": (float(ev[col].dropna().iloc[-1]) if col in ev and ev[col].notna().any()
                                              else None) for col in EVAL_COLS.values()},
                     "train_time_s": float(step_s.sum()) if step_s is not None else None,
                     "wall_time_s": _wall_time(d)})
    summary = pd.DataFrame(rows).set_index("run")
    flat = [_flatten(d.config) for d in datas]
    keys = sorted(set().union(*flat))
    missing = object()
    diff = {k: [f.get(k, missing) for f in flat] for k in keys}
    diff = {k: v for k, v in diff.items() if any(x != v[0] or x is missing for x in v)}
    labels = _unique_labels([d.run_id for d in datas])
    config_diff = pd.DataFrame({lab: [("—" if v[i] is missing else v[i]) for v in diff.values()]
                                for i, lab in enumerate(labels)}, index=pd.Index(list(diff), name="key"))
    return summary, config_diff


def _unique_labels(ids: list[str]) -> list[str]:
    seen: dict = {}
    out = []
    for i in ids:
        seen[i] = seen.get(i, 0) + 1
        out.append(i if seen[i] == 1 else f"{i} ({seen[i]})")
    return out


# =============================================================================================
# Figures (plotly; also inlined in the HTML export)
# =============================================================================================
def fig_ratio(steps: pd.DataFrame, ledger: pd.DataFrame | None = None):
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.add_bar(x=steps.index, y=steps["ratio"], name="trainable ratio (step)", marker_color="#9ecae1")
    fig.add_scatter(x=steps.index, y=steps["ratio_rolling"], name="rolling ratio", line=dict(color="#08519c"))
    fig.add_scatter(x=steps.index, y=steps["cum_ratio"], name="cumulative ratio",
                    line=dict(color="#636363", dash="dot"))
    _mark_changes(fig, ledger)
    fig.update_layout(title="Trainable ratio over time", xaxis_title="step", yaxis_title="trainable groups / groups",
                      yaxis_range=[0, 1.05], height=360, margin=dict(l=50, r=20, t=50, b=40))
    return fig


def fig_reward(steps: pd.DataFrame, trend: dict | None = None, ledger: pd.DataFrame | None = None):
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.add_scatter(x=steps.index, y=steps["reward"], name="reward", line=dict(color="#31a354"))
    fig.add_scatter(x=steps.index, y=steps["reward_std"], name="mean group reward std",
                    line=dict(color="#fd8d3c"))
    t = (trend or {}).get("run")
    r = steps["reward"].dropna()
    if t is not None and t.slope is not None and len(r) >= 2:
        x = r.index.to_numpy(np.float64)
        y0 = float(r.mean()) - t.slope * float(x.mean())
        fig.add_scatter(x=[x[0], x[-1]], y=[y0 + t.slope * x[0], y0 + t.slope * x[-1]], name="OLS fit",
                        line=dict(color="#006d2c", dash="dash"))
    _mark_changes(fig, ledger)
    fig.update_layout(title="Reward and within-group reward std", xaxis_title="step", height=360,
                      margin=dict(l=50, r=20, t=50, b=40))
    return fig


def fig_eval(evaluation: pd.DataFrame, ledger: pd.DataFrame | None = None):
    import plotly.graph_objects as go
    fig = go.Figure()
    for col, colour, dash in (("reward", "#222222", None), ("pass@1", "#00CC96", "dash")):
        if col in evaluation.columns:
            s = evaluation[col].dropna()
            fig.add_scatter(x=s.index, y=s, name=f"held-out {col}", mode="lines+markers",
                            line=dict(color=colour, dash=dash))
    _mark_changes(fig, ledger)
    fig.update_layout(title="Held-out evaluation", xaxis_title="step", yaxis_title="reward / pass@1", height=340,
                      margin=dict(l=50, r=20, t=50, b=40))
    return fig


def fig_compare_eval(runs: list):
    """Each run's held-out reward (solid) and pass@1 (dashed); None when no run evaluated."""
    import plotly.graph_objects as go

    from grpo_core.analysis.charts import PALETTE
    fig, any_eval = go.Figure(), False
    for i, d in enumerate(load_run(r) for r in runs):
        ev = eval_table(d)
        for col, dash in (("reward", None), ("pass@1", "dash")):
            if col in ev.columns:
                s, any_eval = ev[col].dropna(), True
                fig.add_scatter(x=s.index, y=s, name=f"{d.run_id} {col}", mode="lines+markers",
                                line=dict(dash=dash, color=PALETTE[i % len(PALETTE)]))
    fig.update_layout(title="Held-out evaluation", xaxis_title="step", height=340, margin=dict(l=50, r=20, t=50, b=40))
    return fig if any_eval else None


def fig_bottlenecks(bn: pd.DataFrame):
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.add_bar(x=bn["metric"], y=bn["uniform_fraction"], name="share of groups where uniform",
                marker_color=["#de2d26" if b else "#bdbdbd" for b in bn["bottleneck"]])
    fig.add_bar(x=bn["metric"], y=bn["contribution"], name="share of within-group variance",
                marker_color="#3182bd")
    fig.update_layout(title="Per-metric variance (red: bottleneck)", barmode="group", yaxis_range=[0, 1.05],
                      height=340, margin=dict(l=50, r=20, t=50, b=40))
    return fig


def fig_compare(runs: list, window: int = DEFAULT_WINDOW):
    import plotly.graph_objects as go
    fig = go.Figure()
    for d in (load_run(r) for r in runs):
        st = steps_table(d, window)
        fig.add_scatter(x=st.index, y=st["ratio_rolling"], name=d.run_id, mode="lines")
    fig.update_layout(title=f"Trainable ratio (rolling {window} steps)", xaxis_title="step", yaxis_range=[0, 1.05],
                      height=340, margin=dict(l=50, r=20, t=50, b=40))
    return fig


def _mark_changes(fig, ledger):
    if ledger is None or not len(ledger):
        return
    for r in ledger.itertuples():
        fig.add_vline(x=r.step, line_dash="dash", line_color="#756bb1",
                      annotation_text=r.kind.replace("set_", ""), annotation_position="top")


# =============================================================================================
# The report: everything above for one run, and its exports
# =============================================================================================
@dataclass
class Report:
    data: RunData
    window: int
    notices: list[Notice]
    steps: pd.DataFrame
    summary: dict
    bottlenecks: pd.DataFrame
    bottleneck_text: str
    ledger: pd.DataFrame
    trend: dict
    verdict: object | None
    examples: list[GroupView] = field(default_factory=list)
    evaluation: pd.DataFrame = field(default_factory=pd.DataFrame)  # eval_table(data)


def build_report(run, window: int = DEFAULT_WINDOW, examples: bool = True) -> Report:
    if int(window) < 1:
        raise ConfigError(f"window must be >= 1 step, got {window}")
    data = load_run(run, window=int(window))
    steps = steps_table(data, window)
    summary = trainability(steps, window)
    bn = bottlenecks(data)
    ledger = change_ledger(data, steps, window)
    min_pts = int(data.cfg("health", "min_trend_points", 5) or 5)
    trend = reward_trend(steps, window, min_pts)
    ver = _verdict(data)
    rep = Report(data, window, notices(data), steps, summary, bn, bottleneck_summary(bn), ledger, trend, ver)
    if examples:
        rep.examples = _example_groups(data)
    rep.evaluation = eval_table(data)
    return rep


EVAL_COLS = {names.EVAL_REWARD: "reward", names.EVAL_PASS: "pass@1"}


def eval_table(data: RunData) -> pd.DataFrame:
    """The held-out evaluations: index step, columns reward and pass@1 (those logged); empty
    when the run evaluated nothing (eval.every = 0, or a trainer that logs no eval/ names)."""
    have = [n for n in EVAL_COLS if n in data.wide.columns]
    if not have:
        return pd.DataFrame()
    table = data.wide[have].dropna(how="all").rename(columns=EVAL_COLS)
    table.index.name = "step"
    return table


def _verdict(data: RunData):
    if data.wide.empty:
        return None
    from grpo_core.runs.config import HealthConfig, from_dict
    try:
        hcfg = from_dict({"health": data.config.get("health") or {}}).health
    except ConfigError:
        hcfg = HealthConfig()  # an imported config of another shape: the defaults
    return health.verdict(data.wide, hcfg, data.cfg("reward", "outcome_metric", "") or None)


def _example_groups(data: RunData) -> list[GroupView]:
    """From the last step with rollouts: one trainable, one not trainable, one phantom group."""
    g = data.groups
    if g.empty or data.rollouts.empty:
        return []
    have = set(zip(data.rollouts["step"], data.rollouts["group"]))
    g = g[[(s, k) in have for s, k in zip(g["step"], g["group"])]]
    out = []
    for mask in (g["trainable"], ~g["trainable"] & ~g["phantom"], g["phantom"]):
        pick = g[mask]
        if len(pick):
            row = pick.iloc[-1]
            out.append(inspect_group(data, int(row["step"]), int(row["group"])))
    return out


# ---- formatting shared by the exports (the browser test compares HTML cells with these) ----
def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            return "—"
        return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.{digits}f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v) if v else "none"
    return str(v)


def fmt_diff(v, digits: int = 3) -> str:
    if v is None or not isinstance(v, (int, float, np.number)) or not math.isfinite(v):
        return "—"
    return f"{v:+.{digits}f}"


SUMMARY_ROWS = [("steps", "steps logged"), ("last_step", "last step"), ("submitted", "groups submitted"),
                ("trainable", "groups trainable"), ("ratio", "trainable ratio (pooled)"),
                ("final_ratio", "trainable ratio, last window"), ("phantom", "phantom-variance groups"),
                ("zero_trainable_steps", "steps with zero trainable groups")]
BOTTLENECK_COLS = ["metric", "weight", "mean_group_std", "contribution", "uniform_fraction", "bottleneck"]
LEDGER_SHOW = ["step", "kind", "source", "change", "before", "after", "ratio_before", "ratio_after", "ratio_diff",
               "reward_before", "reward_after", "reward_diff", "reward_std_before", "reward_std_after",
               "reward_std_diff", "reward_diff_same_weights", "reuse", "note", "reason"]
STEP_COLS = ["submitted", "trainable", "ratio", "cum_ratio", "ratio_rolling", "phantom", "reward", "reward_std"]


def wasted_sampling(data: RunData) -> str | None:
    """'62% of the sampled tokens (31,000 of 50,000)': the run's sampling spent on groups that
    taught nothing (health.wasted_compute), dynamic sampling's extra batches included; None when
    the run did not log it (an import, an older run)."""
    total, wasted = _col(data.wide, names.CUM_SAMPLED_TOKENS), _col(data.wide, names.CUM_WASTED_TOKENS)
    if total is None or wasted is None or not total.notna().any():
        return None
    t, w = float(total.dropna().iloc[-1]), float(wasted.dropna().iloc[-1])
    seconds = _col(data.wide, names.WASTED_SAMPLING_S)
    secs = f", {float(seconds.sum()):.0f} s of sampling" if seconds is not None else ""
    return f"{w / t:.0%} of the sampled tokens ({w:,.0f} of {t:,.0f}{secs})" if t else None


def summary_rows(rep: Report) -> list[tuple[str, str, str]]:
    """(key, label, formatted value) for the summary table."""
    s = rep.summary
    rows = [(k, label, fmt(s.get(k))) for k, label in SUMMARY_ROWS]
    t = rep.trend
    rows += [("reward_final", "reward, final step", fmt(t.get("final"))),
             ("reward_best", "reward, best step", fmt(t.get("best"))),
             ("trend_run", "reward trend, whole run", t["run_text"]),
             ("trend_last", f"reward trend, last {rep.window} steps", t["last_text"])]
    wasted = wasted_sampling(rep.data)
    if wasted is not None:
        rows.append(("wasted_sampling", "sampling that taught nothing", wasted))
    if not s.get("every_step", True):  # logged every few steps: say what a window holds
        rows.append(("window", "window", f"{rep.window} trainer steps ({s['window_entries']} logged entries)"))
    if rep.verdict is not None:
        rows.append(("verdict", "health verdict (last window)", rep.verdict.status))
    return rows


def cell(col: str, v) -> str:
    """How a table cell is written in every export."""
    if col.endswith("_diff") or col == "reward_diff_same_weights":
        return fmt_diff(v)
    if col in ("uniform_fraction", "contribution") and isinstance(v, float) and math.isfinite(v):
        return f"{v:.3f}"
    return fmt(v, 4 if col in ("mean_group_std",) else 3)


def steps_csv(rep: Report) -> str:
    """The per-step table plus every logged scalar (names.* columns)."""
    extra = rep.data.wide.drop(columns=[c for c in rep.data.wide.columns if c in STEP_COLS], errors="ignore")
    df = rep.steps.join(extra.reindex(rep.steps.index))
    buf = io.StringIO()
    df.to_csv(buf, index_label="step")
    return buf.getvalue()


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _status_text(d: RunData) -> str:
    """The status, with the importer's detail ('incomplete: step 200 of 350')."""
    return d.meta.get("status_detail") or d.status


def to_markdown(rep: Report) -> str:
    d = rep.data
    out = [f"# GRPO Health report: {d.run_id}", "",
           f"status: **{_status_text(d)}** · source: {d.source} · window: {rep.window} steps", ""]
    out += [f"> **{n.level}**: {n.text}" for n in rep.notices] + ([""] if rep.notices else [])
    if not len(rep.steps):
        return "\n".join(out) + "\n"
    out += ["## Trainability", "", _md_table(["", "value"], [[lab, v] for _, lab, v in summary_rows(rep)]), ""]
    if rep.verdict is not None:
        out += [f"- {c.text}" for c in rep.verdict.checks] + [f"- alert ({a.severity}): {a.message}"
                                                              for a in rep.verdict.alerts] + [""]
    out += ["## Variance bottlenecks", "", rep.bottleneck_text, ""]
    if len(rep.bottlenecks):
        out += [_md_table(BOTTLENECK_COLS + ["why"], [[cell(c, r[c]) for c in BOTTLENECK_COLS] + [r["why"]]
                                                      for _, r in rep.bottlenecks.iterrows()]), ""]
    out += ["## Change ledger", "", f"Windows: up to {rep.window} steps before / from each change, never across "
            "a neighbouring change.", ""]
    if len(rep.ledger):
        out += [_md_table(LEDGER_SHOW, [[cell(c, r[c]) for c in LEDGER_SHOW] for _, r in rep.ledger.iterrows()]), ""]
    else:
        out += ["No applied changes.", ""]
    if len(rep.evaluation):
        cols = list(rep.evaluation.columns)
        out += ["## Held-out evaluation", "", _md_table(["step"] + cols, [[str(s)] + [fmt(r[c]) for c in cols]
                                                                          for s, r in rep.evaluation.iterrows()]), ""]
    if rep.examples:
        out += ["## Example groups (last step with rollouts)", ""]
        for gv in rep.examples:
            out += [f"**step {gv.step}, group {gv.group}** — {gv.explanation}", ""]
            if gv.prompt:
                out += ["```text", gv.prompt, "```", ""]
    out += ["## Per step", "", _md_table(["step"] + STEP_COLS, [[str(s)] + [cell(c, r[c]) for c in STEP_COLS]
                                                                for s, r in rep.steps.iterrows()]), ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.notice{padding:.5em 1em;margin:.3em 0;border-left:4px solid}
.info{border-color:#3182bd;background:#eef5fb}.warning{border-color:#e6550d;background:#fdf1e8}
.error{border-color:#a50f15;background:#fbe9ea}.why{font-size:.9em;color:#555}
pre{white-space:pre-wrap;margin:0}.wrap{overflow-x:auto}td.t,th{text-align:left}td:not(.t){white-space:nowrap}"""


def _html_table(table_id: str, cols: list[str], rows: list[list[str]], keys: list[str] | None = None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        key = f' data-key="{e(keys[i])}"' if keys else ""
        tds = "".join(f'<td data-col="{e(c)}"{"" if _numeric(v) else " class=t"}>{e(v)}</td>'
                      for c, v in zip(cols, r))
        body.append(f"<tr{key}>{tds}</tr>")
    return (f'<div class="wrap"><table id="{e(table_id)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return text == "—"


def _fig_html(fig, div_id: str, first: bool) -> str:
    # plotly.js inlined once (the report must open offline; no CDN), no logo link.
    return fig.to_html(full_html=False, include_plotlyjs=bool(first), div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def to_html(rep: Report) -> str:
    """One self-contained HTML file: no external scripts, styles, fonts or links."""
    d, e = rep.data, html.escape
    parts = [f"<h1>GRPO Health report: {e(d.run_id)}</h1>",
             f"<p>status: <b id='status'>{e(_status_text(d))}</b> · source: {e(d.source)} · window: {rep.window} steps</p>"]
    parts += [f'<div class="notice {e(n.level)}">{e(n.text)}</div>' for n in rep.notices]
    if len(rep.steps):
        rows = summary_rows(rep)
        parts += ["<h2>Trainability</h2>",
                  _html_table("summary", ["", "value"], [[lab, v] for _, lab, v in rows], [k for k, _, _ in rows])]
        if rep.verdict is not None:
            parts.append("<ul>" + "".join(f"<li>{e(c.text)}</li>" for c in rep.verdict.checks)
                         + "".join(f"<li><b>{e(a.severity)}</b>: {e(a.message)}</li>" for a in rep.verdict.alerts)
                         + "</ul>")
        figs = [("fig-ratio", fig_ratio(rep.steps, rep.ledger))]
        parts.append(_fig_html(figs[0][1], figs[0][0], True))
        parts += ["<h2>Variance bottlenecks</h2>", f"<p id='bottleneck-text'>{e(rep.bottleneck_text)}</p>"]
        if len(rep.bottlenecks):
            parts.append(_html_table("bottlenecks", BOTTLENECK_COLS + ["why"],
                                     [[cell(c, r[c]) for c in BOTTLENECK_COLS] + [r["why"]]
                                      for _, r in rep.bottlenecks.iterrows()], list(rep.bottlenecks["metric"])))
            if rep.bottlenecks["uniform_fraction"].notna().any():
                parts.append(_fig_html(fig_bottlenecks(rep.bottlenecks), "fig-bottlenecks", False))
        parts += ["<h2>Change ledger</h2>", f"<p>Windows: up to {rep.window} steps before / from each change, never "
                  "across a neighbouring change; step N is the first step under the new setting.</p>"]
        if len(rep.ledger):
            parts.append(_html_table("ledger", LEDGER_SHOW, [[cell(c, r[c]) for c in LEDGER_SHOW]
                                                             for _, r in rep.ledger.iterrows()],
                                     [str(i) for i in range(len(rep.ledger))]))
        else:
            parts.append("<p>No applied changes.</p>")
        parts += ["<h2>Reward</h2>", _fig_html(fig_reward(rep.steps, rep.trend, rep.ledger), "fig-reward", False)]
        if len(rep.evaluation):
            cols = list(rep.evaluation.columns)
            parts += ["<h2>Held-out evaluation</h2>", _fig_html(fig_eval(rep.evaluation, rep.ledger), "fig-eval", False),
                      _html_table("evaluation", ["step"] + cols, [[str(s)] + [fmt(r[c]) for c in cols]
                                                                  for s, r in rep.evaluation.iterrows()])]
        if rep.examples:
            parts.append("<h2>Example groups (last step with rollouts)</h2>")
            for gv in rep.examples:
                cols = list(gv.table.columns)
                text = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)  # noqa: E731
                parts += [f"<h3>step {gv.step}, group {gv.group}</h3>", f"<p class='why'>{e(gv.explanation)}</p>",
                          f"<pre class='prompt'>{e(gv.prompt)}</pre>" if gv.prompt else "",
                          _html_table(f"group-{gv.step}-{gv.group}", cols,
                                      [[text(r[c]) if c in ("completion", "error") else cell(c, r[c]) for c in cols]
                                       for _, r in gv.table.iterrows()])]
        parts += ["<h2>Per step</h2><details><summary>table</summary>",
                  _html_table("steps", ["step"] + STEP_COLS, [[str(s)] + [cell(c, r[c]) for c in STEP_COLS]
                                                              for s, r in rep.steps.iterrows()]), "</details>"]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>GRPO Health report: {e(d.run_id)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>")


# =============================================================================================
# CLI: python -m grpo_core report RUN [--out report.html|report.md|steps.csv]
# =============================================================================================
def cli_report(args) -> int:
    out = getattr(args, "out", None)
    suffix = Path(out).suffix.lower() if out else None
    if out and suffix not in (".html", ".htm", ".md", ".csv"):
        raise ConfigError(f"--out must end in .html, .md or .csv (the format is taken from the suffix), got {out!r}")
    try:
        rep = build_report(args.run, window=getattr(args, "window", None) or DEFAULT_WINDOW)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    if not out:
        try:
            print(to_markdown(rep))
        except BrokenPipeError:  # `report RUN | head`: the reader left, not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 0
    text = to_html(rep) if suffix in (".html", ".htm") else to_markdown(rep) if suffix == ".md" else steps_csv(rep)
    path = Path(out)
    if path.parent and not path.parent.is_dir():
        raise ConfigError(f"--out: folder {str(path.parent)!r} does not exist")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # never a half-written report
    print(f"wrote {path} ({len(text.encode()) // 1024} KiB)")
    for n in rep.notices:
        print(f"{n.level}: {n.text}")
    return 0


__all__ = ["ReportError", "RunData", "load_run", "Notice", "notices", "steps_table", "trainability", "bottlenecks",
           "bottleneck_summary", "change_ledger", "reward_trend", "GroupView", "group_index", "inspect_group",
           "compare_runs", "fig_ratio", "fig_reward", "fig_bottlenecks", "fig_compare", "fig_eval", "fig_compare_eval",
           "eval_table", "Report", "build_report",
           "to_markdown", "to_html", "steps_csv", "cli_report", "fmt"]


# =============================================================================================
# The analysis page's cache key
# =============================================================================================
def store_stamp(run) -> tuple:
    """(mtime_ns, size) of a run's store file and of its write-ahead log, None for one that
    is not there: it changes whenever the trainer writes, so a report cached under it (the
    analysis page's st.cache_data) is rebuilt for a live run's new steps. run: a run dir or
    its store file."""
    from grpo_core.runs.store import DB_NAME
    p = Path(run)
    db = p if p.suffix == ".db" else p / DB_NAME
    out = []
    for f in (db, db.with_name(db.name + "-wal")):  # SQLite's WAL file: the db's name + "-wal"
        try:
            s = os.stat(f)
            out.append((s.st_mtime_ns, s.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


__all__ += ["store_stamp"]
