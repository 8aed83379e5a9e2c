"""The change ledger: every applied weight, threshold or difficulty change, with the trainable ratio and reward in a window before and after it.

Before/after windows of a change applied at step s (`window` = W steps, default 20):
  before = logged steps t with  max(s - W, p) <= t < s     p = previous change's step
  after  = logged steps t with  s <= t < min(s + W, n)     n = next change's step
Step s is the first step under the new setting (the trainer applies a request between
steps and records the step it takes effect at; a change event recorded at the last step
under the old setting, as the auto curriculum writes it, is moved to the step where the
logged setting changes). A window never reaches across another change, so each difference
is attributable to one change; run ends clip it naturally. Changes at the same step share
their windows. A change after which the ratio rose and the reward did not fall is marked
"reuse".
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_core.analysis.run_data import DEFAULT_WINDOW, RunData
from grpo_core.analysis.run_tables import steps_table
from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings, names
from grpo_core.runs.live_settings import (
    LIFECYCLE_KINDS,
    SET_AUTOPILOT,
    SET_DIFFICULTY,
    SET_STEPS,
    SET_THRESHOLD,
    SET_WEIGHTS,
)

NO_REUSE = LIFECYCLE_KINDS + (SET_STEPS, SET_AUTOPILOT)  # change no step's signal: never "reuse"
ANNOTATIONS = ("reason", "undo_of")  # request keys that explain a change, not part of the setting


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
    """The value of setting `kind` the run started with (from its config)."""
    setting = live_settings.BY_KIND.get(kind)
    if setting is None:
        return None
    v = data.cfg(*setting.config_path())
    if kind == SET_WEIGHTS:
        return {m: float(w) for m, w in (v or {}).items()}
    if kind == SET_AUTOPILOT:
        return bool(v)
    return float(v) if kind in (SET_THRESHOLD, SET_DIFFICULTY) and v is not None else v


def _requested(kind: str, request: dict, old):
    """The value in force after a request of `kind` when `old` was (a lifecycle request: its payload)."""
    setting = live_settings.BY_KIND.get(kind)
    if setting is None:
        return {k: v for k, v in (request or {}).items() if k not in ANNOTATIONS} or None
    return setting.after(old, setting.value(request))


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


SETTING_KINDS = live_settings.KINDS


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
            "step": s, "kind": kind, "source": c["source"], "change": live_settings.describe_change(kind, old, new),
            "old": old, "new": new, "before": _window_span(b), "after": _window_span(a),
            "n_before": b["n"], "n_after": a["n"],
            "ratio_before": b["ratio"], "ratio_after": a["ratio"], "ratio_diff": ratio_d,
            "reward_before": b["reward"], "reward_after": a["reward"], "reward_diff": rew_d,
            "reward_std_before": b["reward_std"], "reward_std_after": a["reward_std"],
            "reward_std_diff": a["reward_std"] - b["reward_std"], "reward_diff_same_weights": same_w,
            "reuse": reuse, "note": "; ".join(notes), "reason": c["reason"]})
    return pd.DataFrame(rows, columns=LEDGER_COLS)


def _window_span(w: dict) -> str:
    return f"{w['first']}–{w['last']}" if w["n"] else "—"
