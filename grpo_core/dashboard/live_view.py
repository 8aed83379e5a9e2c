"""The live monitor's data layer: everything the Live and Runs pages show, computed here
as plain functions over the store, so the pages stay layout + widgets.

A `LiveState` is one browser session's view of one run. `load(run, state)` makes it
current by reading only what changed since the last call: scalars of new steps, new
change events, control rows that were still open, rollouts of new steps. Memory stays
bounded however long the run: the last `RECENT_STEPS` steps are kept raw (every health
window fits in them), older steps as bin means whose width doubles whenever there are
more than `MAX_BINS` bins; the what-if window keeps the rollouts of the last
`WHATIF_STEPS` steps only. The first load of a long run reads the old part already
binned by SQLite (`RunStore.scalars_binned`), so it never materialises every step.
"""
from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import health
from grpo_core.runs import live_settings
from grpo_core.runs.names import (CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE, CUM_TRAINABLE_RATIO, DIFFICULTY,
                             EVAL_PASS, EVAL_REWARD, GROUPS_SOLVED, GROUPS_UNSOLVED, WASTED_SHARE,
                             CUM_SAMPLED_TOKENS, CUM_WASTED_TOKENS,
                             FRAC_REWARD_ZERO_STD, GROUPS_SUBMITTED, GROUPS_TRAINABLE, MIN_GROUP_STD,
                             NOISE_GROUPS, PHANTOM_GROUPS, REWARD, REWARD_STD, TIME_STEP, TRAINABLE_RATIO,
                             metric_group_std, metric_mean, metric_weight, parse_metric_name)
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.requests import accepted_kinds, unsupported_note
from grpo_core.errors import StoreError
from grpo_core.runs.store import (APPLIED, DB_NAME, EV_AUTOPILOT, EV_CHANGE, LIVE_STATUSES, PENDING, APPLYING, REJECTED, RunMeta, RunStore, display_status, list_runs)

RECENT_STEPS = 500  # raw steps kept (>= every health window: trend, near-zero, zero-trainable)
MAX_BINS = 1000  # bins of older history; with RECENT_STEPS: at most ~2,000 points per chart
WHATIF_STEPS = 50  # rollouts window behind the what-if and the weight suggestions
REFRESH_S = 2.0  # the live page's refresh period while a run is live
MAX_CONTROL_ROWS = 200  # control rows kept in a session (the latest ones)

BASE_NAMES = (TRAINABLE_RATIO, CUM_TRAINABLE_RATIO, GROUPS_SUBMITTED, GROUPS_TRAINABLE,
              CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE, PHANTOM_GROUPS, NOISE_GROUPS, REWARD, REWARD_STD,
              FRAC_REWARD_ZERO_STD, MIN_GROUP_STD, DIFFICULTY, TIME_STEP, EVAL_REWARD, EVAL_PASS,
              GROUPS_SOLVED, GROUPS_UNSOLVED, WASTED_SHARE, CUM_SAMPLED_TOKENS, CUM_WASTED_TOKENS)


def run_metrics(meta: dict, names: list[str] = ()) -> list[str]:
    """Reward metric names: the config's weights (order kept), else those in scalar names."""
    metrics = list(RunMeta.parse(meta).cfg("reward", "weights", {}))
    for n in names:
        parsed = parse_metric_name(n)
        if parsed and parsed[0] not in metrics:
            metrics.append(parsed[0])
    return metrics


def chart_names(metrics: list[str]) -> list[str]:
    per = [f(m) for m in metrics for f in (metric_mean, metric_group_std, metric_weight)]
    return list(BASE_NAMES) + per


def health_config(meta: dict) -> HealthConfig:
    known = {f.name for f in dataclasses.fields(HealthConfig)}
    values = RunMeta.parse(meta).config.get("health") or {}
    return HealthConfig(**{k: v for k, v in values.items() if k in known})


@dataclass
class LiveState:
    """One session's incremental view of one run (kept in st.session_state)."""
    run_id: str
    db: str
    meta: dict = field(default_factory=dict)
    metrics: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    last_step: int = -1  # last step read (scalars are written a whole step per transaction)
    recent: pd.DataFrame = field(default_factory=pd.DataFrame)  # raw rows, index step
    bin_size: int = 1
    bin_sum: pd.DataFrame = field(default_factory=pd.DataFrame)  # index bin, columns names
    bin_cnt: pd.DataFrame = field(default_factory=pd.DataFrame)
    folded_upto: int = -1  # steps <= this live in the bins
    event_id: int = 0
    changes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["step", "kind", "request", "source", "message"]))
    control: pd.DataFrame = field(default_factory=pd.DataFrame)
    moves: list = field(default_factory=list)  # the autopilot's events (payload + step), oldest first
    rollouts: pd.DataFrame = field(default_factory=pd.DataFrame)  # the what-if window
    rollout_step: int = -1
    version: int = 0  # bumped whenever something new was read
    rows_read: int = 0  # scalar rows the last load brought into Python (tests pin incremental reads)
    loaded_at: float = 0.0
    _frame: tuple | None = None  # (version, chart frame)
    _arrays: tuple | None = None  # (rollout_step, RolloutArrays)
    _advice: tuple | None = None  # ((rollout_step, alert kinds, weights), what_to_do's answer)

    @property
    def status(self) -> str:
        return display_status(self.meta)

    @property
    def is_live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def source(self) -> str:
        return self.meta.get("source", "grpo_core")

    @property
    def steps_total(self) -> int | None:
        """Steps of the run: the settings in force if the trainer records them (steps can be
        changed mid-run), else the config's."""
        return RunMeta.parse(self.meta).steps_budget


# ---- loading -------------------------------------------------------------------------------------
def load(run: str | Path, state: LiveState | None = None) -> LiveState:
    """First load (state None, or another run) or incremental refresh of `state`.
    A store that cannot be read (deleted, corrupt) raises StoreError with the reason."""
    try:
        return _load(run, state)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"run {Path(run).name} cannot be read: {e}") from None


def _open(run) -> RunStore:
    """A run dir or run.db path (a deleted dir says 'no run store at ...'), else a run id."""
    p = Path(run)
    if "/" in str(run):
        return RunStore(p if p.suffix == ".db" else p / DB_NAME, readonly=True)
    return RunStore.open(run, readonly=True)


def _load(run, state):
    with _open(run) as store:
        if state is None or state.db != str(store.path):
            return _first_load(store)
        last = store.last_step()
        if last is not None and last < state.last_step:  # a resumed run redid steps: start over
            return _first_load(store)
        _refresh(store, state)
        return state


def _first_load(store: RunStore) -> LiveState:
    meta = store.get_meta()
    state = LiveState(run_id=store.run_id, db=str(store.path), meta=meta)
    last = store.last_step()
    state.metrics = run_metrics(meta, store.scalar_names(last) if last is not None else [])
    state.names = chart_names(state.metrics)
    state.recent = pd.DataFrame(index=pd.Index([], name="step", dtype="int64"), columns=state.names, dtype=float)
    state.bin_sum = pd.DataFrame(columns=state.names, dtype=float)
    state.bin_cnt = pd.DataFrame(columns=state.names, dtype=float)
    if last is not None:
        split = last - RECENT_STEPS
        if split >= 0:  # the old part arrives binned: SQLite aggregates, pandas never sees every step
            state.bin_size = 1 << max(0, math.ceil(math.log2(max(1, (split + 1) / MAX_BINS))))
            long = store.scalars_binned(state.names, state.bin_size, until_step=split)
            state.bin_sum = _pivot(long, "total", state.names)
            state.bin_cnt = _pivot(long, "count", state.names)
            state.folded_upto = split
            state.rows_read += len(long)  # rows that reach Python: one per (bin, name)
        state.recent = _wide(store, max(split, -1), state.names)
        state.rows_read += int(state.recent.notna().sum().sum())
        state.last_step = last
    _read_events(store, state)
    _read_control(store, state)
    _read_rollouts(store, state)
    state.loaded_at = time.time()
    state.version = 1
    return state


def _refresh(store: RunStore, state: LiveState):
    state.meta = store.get_meta()
    state.rows_read = 0
    new = _wide(store, state.last_step, state.names)
    changed = False
    if len(new):
        state.rows_read = int(new.notna().sum().sum())
        state.recent = new if state.recent.empty else pd.concat([state.recent, new])
        state.last_step = int(new.index[-1])
        _fold(state)
        changed = True
    changed |= _read_events(store, state)
    changed |= _read_control(store, state)
    _read_rollouts(store, state)
    state.loaded_at = time.time()
    if changed:
        state.version += 1


def _wide(store: RunStore, since: int, names: list[str]) -> pd.DataFrame:
    w = store.scalars_wide(since_step=since, names=names)
    return w.reindex(columns=names).astype(float)


def _pivot(long: pd.DataFrame, value: str, names: list[str]) -> pd.DataFrame:
    if long.empty:
        return pd.DataFrame(columns=names, dtype=float)
    p = long.pivot(index="bin", columns="name", values=value).reindex(columns=names).astype(float)
    return p.fillna(0.0)


def _fold(state: LiveState):
    """Move raw rows older than RECENT_STEPS into the bins once there are 2x RECENT_STEPS."""
    if len(state.recent) <= 2 * RECENT_STEPS:
        return
    cut = int(state.recent.index[-RECENT_STEPS - 1])
    old, state.recent = state.recent[state.recent.index <= cut], state.recent[state.recent.index > cut]
    key = old.index.to_numpy() // state.bin_size
    sums, cnts = old.fillna(0.0).groupby(key).sum(), old.notna().astype(float).groupby(key).sum()
    state.bin_sum = sums if state.bin_sum.empty else state.bin_sum.add(sums, fill_value=0.0)
    state.bin_cnt = cnts if state.bin_cnt.empty else state.bin_cnt.add(cnts, fill_value=0.0)
    state.folded_upto = cut
    while len(state.bin_sum) > MAX_BINS:  # twice as wide bins: memory stays bounded forever
        state.bin_size *= 2
        state.bin_sum = state.bin_sum.groupby(state.bin_sum.index // 2).sum()
        state.bin_cnt = state.bin_cnt.groupby(state.bin_cnt.index // 2).sum()


def _read_events(store: RunStore, state: LiveState) -> bool:
    ev = store.events(since_id=state.event_id, kinds=[EV_CHANGE, EV_AUTOPILOT])
    if ev.empty:
        return False
    state.event_id = int(ev["id"].max())
    auto = ev["kind"] == EV_AUTOPILOT
    state.moves += [{**p, "step": int(s)} for s, p in zip(ev.loc[auto, "step"], ev.loc[auto, "payload"])]
    ev = ev[~auto]
    if ev.empty:
        return True
    rows = pd.DataFrame({"step": ev["step"], "kind": [p.get("kind") for p in ev["payload"]],
                         "request": [p.get("request") for p in ev["payload"]],
                         "source": [p.get("source") for p in ev["payload"]],
                         "message": [p.get("message", "") for p in ev["payload"]]})
    state.changes = rows if state.changes.empty else pd.concat([state.changes, rows], ignore_index=True)
    return True


def _read_control(store: RunStore, state: LiveState) -> bool:
    """New rows, plus rows that were still open (pending/applying) last time: re-read from
    the oldest open id, so a status change is seen without re-reading the whole table."""
    if state.control.empty:
        since = 0
    else:
        open_ids = state.control.loc[state.control["status"].isin([PENDING, APPLYING]), "id"]
        since = int(open_ids.min()) - 1 if len(open_ids) else int(state.control["id"].max())
    rows = store.control(since_id=since)
    if rows.empty:
        return False
    before = state.control
    kept = before[before["id"] <= since] if not before.empty else before
    new = pd.concat([kept, rows], ignore_index=True) if not kept.empty else rows
    state.control = new.tail(MAX_CONTROL_ROWS).reset_index(drop=True)
    if before.empty or len(before) != len(state.control):
        return True
    return not before[["id", "status"]].reset_index(drop=True).equals(state.control[["id", "status"]])


def _read_rollouts(store: RunStore, state: LiveState):
    """Keep the rollouts of the last WHATIF_STEPS logged steps (with rollouts)."""
    if state.last_step < 0 or state.rollout_step >= state.last_step:
        return
    lo = max(state.rollout_step, state.last_step - WHATIF_STEPS)
    new = store.rollouts(since_step=lo, until_step=state.last_step, with_text=False)
    state.rollout_step = state.last_step
    if new.empty:
        return
    keep = state.rollouts[state.rollouts["step"] > state.last_step - WHATIF_STEPS] if not state.rollouts.empty else state.rollouts
    state.rollouts = pd.concat([keep, new], ignore_index=True) if not keep.empty else new.reset_index(drop=True)


# ---- what the pages show -------------------------------------------------------------------------
def chart_frame(state: LiveState) -> pd.DataFrame:
    """History for the charts: bin means (x = the bin's mean step) then the raw recent steps."""
    if state._frame is not None and state._frame[0] == state.version:
        return state._frame[1]
    parts = []
    if not state.bin_sum.empty:
        mean = state.bin_sum / state.bin_cnt.where(state.bin_cnt > 0)
        b = state.bin_sum.index.to_numpy()
        lo, hi = b * state.bin_size, np.minimum(b * state.bin_size + state.bin_size - 1, state.folded_upto)
        mean.index = pd.Index((lo + hi) / 2.0, name="step")
        parts.append(mean)
    if not state.recent.empty:
        parts.append(state.recent)
    df = pd.concat(parts) if len(parts) > 1 else (parts[0] if parts else state.recent)
    df = df.dropna(axis=1, how="all")
    state._frame = (state.version, df)
    return df


def _last_value(state: LiveState, name: str):
    if name not in state.recent.columns:
        return None
    s = state.recent[name].dropna()
    return float(s.iloc[-1]) if len(s) else None


def current_settings(state: LiveState) -> dict:
    """Weights, threshold and level in force at the last step (logged), else the config's."""
    run = RunMeta.parse(state.meta)
    weights = dict(run.cfg("reward", "weights", {}))
    for m in state.metrics:
        v = _last_value(state, metric_weight(m))
        if v is not None:
            weights[m] = v
    thr = _last_value(state, MIN_GROUP_STD)
    lvl = _last_value(state, DIFFICULTY)
    thr = float(thr if thr is not None else run.cfg("grpo", "min_group_std", 0.01))
    lvl = int(lvl if lvl is not None else run.cfg("task", "level", 1))
    # Requests applied from a step not logged yet are in force too (the next step trains with them).
    if not state.control.empty:
        ahead = state.control[(state.control["status"] == APPLIED) & (state.control["applied_step"] > state.last_step)]
        for _, r in ahead.sort_values("id").iterrows():
            p = r["payload"] or {}
            if r["kind"] == "set_weights":
                weights.update(p.get("weights") or {})
            elif r["kind"] == "set_threshold":
                thr = float(p.get("min_group_std", thr))
            elif r["kind"] == "set_difficulty":
                lvl = int(p.get("level", lvl))
    return {"weights": {m: float(weights.get(m, 0.0)) for m in state.metrics}, "min_group_std": thr, "level": lvl,
            "outcome_metric": run.cfg("reward", "outcome_metric") or None, **run_settings(state.meta)}


# The live page's run-setting inputs: grpo.<key> numbers, by key (live_settings.RUN_INPUTS).
RUN_SETTINGS = {s.key: s for s in live_settings.RUN_INPUTS}


def run_settings(meta: dict) -> dict:
    """The run-setting numbers (G, prompts per step, temperature, top-p, step budget) and the
    autopilot switch in force: the trainer records them in meta "settings" when it applies a
    request, else the config's."""
    run = RunMeta.parse(meta)
    out = {k: run.settings.get(k, run.cfg("grpo", k)) for k in RUN_SETTINGS}
    out["autopilot"] = bool(run.settings.get("autopilot", run.cfg("autopilot", "enabled", False)))
    return out


@dataclass
class Cards:
    status: str
    step: int | None
    steps: int | None
    progress: float  # 0..1
    eta_s: float | None
    ratio: float | None  # last step
    cum_ratio: float | None
    reward: float | None
    reward_std: float | None  # mean over the health window
    trend: int  # +1 / 0 / -1
    trend_text: str
    submitted: int | None  # cumulative groups
    trainable: int | None
    verdict: str  # healthy | warning | critical | unknown
    colour: str
    checks: list
    alerts: list


VERDICT_COLOURS = {"healthy": "green", "warning": "orange", "critical": "red", "unknown": "gray"}


def wasted_text(state: LiveState) -> str | None:
    """"62% of this run's sampling taught nothing (...)": the sampled tokens spent on groups
    with no learning signal (health.wasted_compute); None when the run does not log it."""
    total, wasted = _last_value(state, CUM_SAMPLED_TOKENS), _last_value(state, CUM_WASTED_TOKENS)
    if not total or wasted is None:
        return None
    return (f"{wasted / total:.0%} of this run's sampling taught nothing ({wasted:,.0f} of {total:,.0f} completion "
            "tokens went to groups whose rewards did not differ)")
# A run status's colour (display_status, plus list_runs' "unreadable"), on the Live and Runs pages.
STATUS_COLOURS = {"running": "green", "paused": "orange", "created": "blue", "finished": "gray", "stopped": "gray",
                  "failed": "red", "stale": "red", "unreadable": "red"}


def status_badge(status: str, text: str | None = None) -> str:
    """Streamlit markdown for a status in its colour: ':green[running]' (text: what to show
    instead of the status itself, e.g. store.status_label's 'stopped (autopilot)')."""
    return f":{STATUS_COLOURS.get(status, 'gray')}[{status if text is None else text}]"
TREND_ARROWS = {1: "↑", 0: "→", -1: "↓"}


def progress(state: LiveState) -> tuple[int | None, float, float | None]:
    """(steps done, fraction, ETA seconds) from the last step and the recent step time."""
    total = state.steps_total
    if state.last_step < 0:
        return None, 0.0, None
    done = state.last_step  # the trainer numbers steps from 1: the last step is the count done
    if not total:
        return done, 0.0, None
    frac = min(1.0, done / total)
    eta = None
    if state.is_live and TIME_STEP in state.recent.columns:
        dt = state.recent[TIME_STEP].dropna().tail(20)
        if len(dt):
            eta = max(0.0, (total - done) * float(dt.mean()))
    return done, frac, eta


def cards(state: LiveState) -> Cards:
    cfg = health_config(state.meta)
    window = state.recent.tail(max(cfg.trend_window, cfg.near_zero_steps, cfg.zero_trainable_steps) + 5)
    v = health.verdict(window.dropna(axis=1, how="all"), cfg, current_settings(state)["outcome_metric"] or None)
    done, frac, eta = progress(state)
    rstd = next((c.value for c in v.checks if c.name == "reward_std"), None)
    trend_check = next((c for c in v.checks if c.name == "reward_trend"), None)
    sub, tr = _last_value(state, CUM_GROUPS_SUBMITTED), _last_value(state, CUM_GROUPS_TRAINABLE)
    ratio = _last_value(state, TRAINABLE_RATIO)
    if ratio is None and FRAC_REWARD_ZERO_STD in state.recent.columns:  # imported TRL runs
        z = _last_value(state, FRAC_REWARD_ZERO_STD)
        ratio = None if z is None else 1.0 - z
    return Cards(status=state.status, step=done, steps=state.steps_total, progress=frac, eta_s=eta,
                 ratio=ratio, cum_ratio=_last_value(state, CUM_TRAINABLE_RATIO),
                 reward=_last_value(state, REWARD), reward_std=rstd, trend=v.trend.sign,
                 trend_text=trend_check.text if trend_check else "",
                 submitted=None if sub is None else int(sub), trainable=None if tr is None else int(tr),
                 verdict=v.status, colour=VERDICT_COLOURS.get(v.status, "gray"), checks=v.checks,
                 alerts=v.alerts)


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


# ---- what-if and suggestions (the sliders) ---------------------------------------------------------
def capabilities(state: LiveState) -> dict:
    """What this run can show. Imported runs carry scalars only: say so instead of empty charts.
    accepts: the request kinds the process behind the run applies (control.accepted_kinds), so
    the page offers only those controls; accepts_note says which ones it lacks and why."""
    has_rollouts = not state.rollouts.empty
    # A TRL (ART) run writes source "trl" ("art") like a log imported from a file, but its callback
    # (monitor) is live and applies requests: only a run with no process of ours behind it is "imported".
    imported = state.source != "grpo_core" and state.meta.get("kind") not in ("trl", "art")
    why = ""
    if imported and has_rollouts:  # ART's trajectory files carry every rollout's scores
        why = (f"Imported from {state.source}: it cannot be steered (no trainer of ours is attached); its "
               "rollout scores are kept.")
    elif imported:
        why = (f"Imported from {state.source}: this run has logged scalars only, no per-rollout scores, "
               "so there is no what-if, no weight suggestion and no rollout inspector; it cannot be "
               "steered either (no trainer of ours is attached).")
    elif state.last_step >= 0 and not has_rollouts:
        why = "No rollout scores in the last steps: the what-if needs them."
    return {"imported": imported, "what_if": has_rollouts, "steer": state.is_live and not imported,
            "message": why, "accepts": accepted_kinds(state.meta), "accepts_note": unsupported_note(state.meta)}


def rollout_arrays(state: LiveState):
    if state._arrays is not None and state._arrays[0] == (state.rollout_step, len(state.rollouts)):
        return state._arrays[1]
    a = health.rollout_arrays(state.rollouts, state.metrics) if not state.rollouts.empty else None
    state._arrays = ((state.rollout_step, len(state.rollouts)), a)
    return a


def what_if(state: LiveState, weights: dict, min_group_std: float) -> dict:
    """Trainable ratio of the recent window under the settings in force and under the
    slider settings. Raises ConfigError for weights that could not be applied either."""
    a = rollout_arrays(state)
    cur = current_settings(state)
    if a is None or a.n_groups == 0:
        return {"available": False, "steps": 0, "groups": 0, "now": None, "predicted": None}
    steps = int(len(np.unique(a.group_step)))
    now = health.what_if(a, cur["weights"], cur["min_group_std"], cur["outcome_metric"])
    pred = health.what_if(a, weights, min_group_std, cur["outcome_metric"])
    return {"available": True, "steps": steps, "groups": int(a.n_groups), "now": now, "predicted": pred}


def suggestions(state: LiveState, weights: dict | None = None, min_group_std: float | None = None,
                n: int = 3) -> list[dict]:
    a = rollout_arrays(state)
    if a is None:
        return []
    cur = current_settings(state)
    return health.suggest_weights(a, weights or cur["weights"],
                                  cur["min_group_std"] if min_group_std is None else min_group_std,
                                  n=n, outcome_metric=cur["outcome_metric"])


def pending_changes(settings: dict, weights: dict, min_group_std: float, level: int,
                    run: dict | None = None) -> list[tuple[str, dict]]:
    """The requests that move the run from `settings` to the slider values: one per kind
    that differs (a weight change is one request carrying every weight). run: the page's
    group_size / prompts_per_step / temperature / steps inputs (any subset)."""
    out = []
    for key, value in (run or {}).items():
        if value is not None and key in RUN_SETTINGS and settings.get(key) is not None \
                and abs(float(value) - float(settings[key])) > 1e-9:
            out.append((RUN_SETTINGS[key].kind, {key: RUN_SETTINGS[key].cast(value)}))
    if any(abs(float(weights.get(m, 0.0)) - w) > 1e-9 for m, w in settings["weights"].items()):
        out.append(("set_weights", {"weights": {m: float(weights.get(m, 0.0)) for m in settings["weights"]}}))
    if abs(float(min_group_std) - settings["min_group_std"]) > 1e-12:
        out.append(("set_threshold", {"min_group_std": float(min_group_std)}))
    if int(level) != settings["level"]:
        out.append(("set_difficulty", {"level": int(level)}))
    return out


def describe_request(row) -> str:
    """'pending', 'applied at step N', 'rejected: <reason>' for a control row."""
    if row["status"] == APPLIED:
        step = row["applied_step"]
        return f"applied at step {int(step)}" if step == step and step is not None else "applied"
    if row["status"] == REJECTED:
        return f"rejected: {row['message'] or 'no reason given'}"
    return "pending (applied at the next step boundary)" if row["status"] == PENDING else "being applied"


def request_lines(state: LiveState, ids: list[int]) -> list[dict]:
    """Status of the requests this session sent, newest first."""
    if state.control.empty or not ids:
        return []
    rows = state.control[state.control["id"].isin(ids)].sort_values("id", ascending=False)
    return [{"id": int(r["id"]), "kind": r["kind"], "payload": r["payload"], "status": r["status"],
             "applied_step": None if r["applied_step"] != r["applied_step"] else r["applied_step"],
             "text": describe_request(r)} for _, r in rows.iterrows()]


def request_summary(kind: str, payload: dict) -> str:
    if kind == "set_weights":
        return "weights " + ", ".join(f"{m}={w:g}" for m, w in payload.get("weights", {}).items())
    if kind == "set_difficulty":
        return f"difficulty level {payload.get('level')}"
    if kind == "set_autopilot":
        return f"autopilot {'on' if payload.get('enabled') else 'off'}"
    if kind in live_settings.NUMBERS:
        key = live_settings.NUMBERS[kind].key
        return f"{key}={payload.get(key):g}"
    return kind


def autopilot_moves(state: LiveState) -> list[dict]:
    """The autopilot's moves, newest first: step decided, what, why, the request's status,
    and the inverse request the page's Undo sends (None for a stop, or once undone)."""
    from grpo_core.analysis.autopilot import undo_request  # pure; kept local so live_view.py stays light
    ctl = state.control.set_index("id") if not state.control.empty else pd.DataFrame()
    undone = {}
    if not state.control.empty:
        for rid, p in zip(state.control["id"], state.control["payload"]):
            if isinstance(p, dict) and p.get("undo_of") is not None:
                undone[int(p["undo_of"])] = int(rid)
    out = []
    for m in reversed(state.moves):
        rid = int(m.get("request_id", 0))
        row = ctl.loc[rid] if rid in ctl.index else None
        status = describe_request(row) if row is not None else "sent"
        undo = undo_request(m) if rid not in undone and row is not None and row["status"] == APPLIED else None
        out.append({"request_id": rid, "step": m.get("step"), "move": m.get("move"), "kind": m.get("kind"),
                    "summary": request_summary(m.get("kind", ""), m.get("request") or {}),
                    "reason": m.get("reason", ""), "status": status, "undo": undo, "undone_by": undone.get(rid)})
    return out


# ---- the runs page ----------------------------------------------------------------------------------
def config_summary(meta: dict) -> str:
    run = RunMeta.parse(meta)
    if run.source != "grpo_core":
        return f"imported from {run.source}"
    c = run.config
    t, m, g = c.get("task") or {}, c.get("model") or {}, c.get("grpo") or {}
    task = f"{t.get('name', 'demo')} L{t.get('level', 1)}" if t.get("name", "demo") == "demo" \
        else f"jsonl {Path(str(t.get('dataset', ''))).name}"
    model = Path(m["path"]).name if m.get("path") else "built-in model"
    return (f"{task} · {model} · {g.get('prompts_per_step', '?')} prompts × G={g.get('group_size', '?')} · "
            f"lr {g.get('lr', 0):g} · min std {g.get('min_group_std', 0):g}")


def runs_overview(root=None) -> pd.DataFrame:
    """list_runs plus what the runs page shows per run: progress, ETA, started, summary."""
    runs = list_runs(root)
    extra = []
    for _, r in runs.iterrows():
        row = {"progress": 0.0, "eta": "–", "started": "–", "summary": "", "done": None}
        if r["status"] != "unreadable":
            try:
                with RunStore.open(r["path"], readonly=True) as s:
                    meta = s.get_meta()
                    last = s.last_step()
                    dt = s.scalars_wide(since_step=(last - 20) if last is not None else -1,
                                        names=[TIME_STEP]) if last is not None else pd.DataFrame()
                state = LiveState(run_id=r["run_id"], db=str(s.path), meta=meta, last_step=-1 if last is None else last,
                               recent=dt)
                done, frac, eta = progress(state)
                row.update(progress=frac, eta=fmt_eta(eta) if eta is not None else "–", done=done,
                           summary=config_summary(meta))
                started = meta.get("started") or meta.get("launched") or meta.get("created")
                if started:
                    row["started"] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
            except (StoreError, OSError, ValueError) as e:
                row["summary"] = f"unreadable: {e}"
        extra.append(row)
    return pd.concat([runs, pd.DataFrame(extra, index=runs.index)], axis=1) if len(runs) else \
        runs.assign(progress=[], eta=[], started=[], summary=[], done=[])


def default_run(root=None, runs: pd.DataFrame | None = None) -> str | None:
    """The run a fresh page shows: the newest live training run, else the newest training
    run, else (pilots only) the newest run. Runs come newest first from list_runs."""
    runs = list_runs(root) if runs is None else runs
    if runs.empty:
        return None
    train = runs[runs["kind"].fillna("train") == "train"]
    for pick in (train[train["status"].isin(LIVE_STATUSES)], train, runs):
        if len(pick):
            return str(pick.iloc[0]["run_id"])


def resolve_run(picked: str | None, from_url: str | None = None, root=None) -> str | None:
    """The run a page shows: the sidebar's pick, else ?run=<id> if it exists, else the default."""
    if picked:
        return picked
    runs = list_runs(root)
    if from_url and from_url in set(runs["run_id"]):
        return from_url
    return default_run(runs=runs)


# ---- what to do now: the top alert's fix as one request ---------------------------------------------
# The fix each alert asks for, in the order tried (the autopilot's move functions decide whether
# it applies and predict its effect, so the page offers what the autopilot would do, one click away).
ALERT_FIXES = {"zero_trainable": ("group_size", "weights", "temperature"),
               "low_ratio": ("difficulty", "group_size", "weights", "temperature"),
               "declining_ratio": ("difficulty", "group_size", "temperature"),
               "near_zero": ("difficulty", "group_size", "weights", "temperature"),
               "low_reward_std": ("temperature", "group_size", "weights")}
UNPREDICTABLE = {"difficulty": "not predictable: a new level changes the prompts themselves",
                 "temperature": "not predictable from past rollouts: wider sampling changes the completions"}


@dataclass
class Fix:
    """One request that answers an alert: what it changes, and what it is predicted to do."""
    move: str  # weights | group_size | temperature | difficulty
    label: str  # "G 8 -> 16", "difficulty 1 -> 2"
    kind: str  # the request kind
    payload: dict
    now: float | None  # the window's trainable ratio
    predicted: float | None  # None: cannot be predicted (see note)
    note: str  # the prediction in words, or why there is none
    reason: str  # the evidence, as the autopilot would write it


def _fix_settings(state: LiveState) -> dict:
    """The settings the autopilot's move functions read (as the trainer fills them)."""
    cur, run = current_settings(state), RunMeta.parse(state.meta)
    return {**cur, "max_level": int(run.cfg("curriculum", "max_level", 4) or 4), "user_weights": cur["weights"],
            "uniform_std": health_config(state.meta).uniform_std,
            "steps": state.steps_total, "prompts_per_step": cur.get("prompts_per_step") or 1,
            "user_rollouts": int(run.cfg("grpo", "group_size", 8)) * int(run.cfg("grpo", "prompts_per_step", 8))}


def _fix_label(move: str, before: dict, payload: dict) -> str:
    if move == "group_size":
        return f"G {before.get('group_size')} -> {payload['group_size']}"
    if move == "difficulty":
        return f"difficulty {before.get('level')} -> {payload['level']}"
    if move == "temperature":
        return f"temperature {before.get('temperature'):g} -> {payload['temperature']:g}"
    changed = [m for m, w in payload["weights"].items() if abs(w - before["weights"].get(m, w)) > 1e-4]
    return "weights " + ", ".join(f"{m} {before['weights'][m]:.2f} -> {payload['weights'][m]:.2f}" for m in changed)


def fixes(state: LiveState, moves=("difficulty", "group_size", "weights", "temperature")) -> tuple[list[Fix], list[str]]:
    """(fixes that apply now, why each other move does not), over the health window's rollouts,
    computed by the autopilot's own move functions with the run's autopilot bounds (G within its
    rollout budget, temperature within its cap, one level up) but no rate limit."""
    from grpo_core.analysis import autopilot  # pure; kept local so live_view.py stays light
    from grpo_core.runs.config import AutopilotConfig
    a = rollout_arrays(state)
    if a is None or a.n_groups == 0:
        return [], ["no rollout scores in the recent steps"]
    hcfg = health_config(state.meta)
    known = {f.name for f in dataclasses.fields(AutopilotConfig)}
    acfg = AutopilotConfig(**{k: v for k, v in (RunMeta.parse(state.meta).config.get("autopilot") or {}).items()
                              if k in known})
    last = state.recent.tail(hcfg.trend_window)
    ro = state.rollouts[state.rollouts["step"].isin(last.index)]
    ratio, *_ = health.window_ratio(last, hcfg.trend_window)
    ratio = 0.0 if ratio is None else ratio
    s, out, why_not = _fix_settings(state), [], []
    for move in moves:
        mv, why = autopilot.TRIES[move](ro, last, s, acfg, ratio, f"ratio {ratio:.2f} over {len(last)} steps")
        if mv is None:
            why_not.append(f"{move.replace('_', ' ')}: {why}")
            continue
        pred = None if move in UNPREDICTABLE else mv.predicted_ratio
        note = UNPREDICTABLE.get(move) or f"predicted trainable ratio {pred:.0%} (now {ratio:.0%})"
        payload = {k: v for k, v in mv.payload.items() if k != "reason"}
        out.append(Fix(move, _fix_label(move, mv.before or s, payload), mv.kind, payload, ratio, pred, note, mv.reason))
    return out, why_not


def what_to_do(state: LiveState, c: Cards | None = None) -> dict | None:
    """The top alert (critical first) and the fixes it asks for, first the one to click; None
    when no alert is up. A healthy run, or one whose alerts no move answers, says so instead."""
    c = c or cards(state)
    # The fixes are judged on the rollout window (read every 5 s) under the alerts in force: the
    # page asks every 2 s, and recomputing at every new step of a fast run kept the server busy
    # enough to lag the sliders' own messages.
    key = (state.rollout_step, tuple(sorted(a.kind for a in c.alerts)), tuple(sorted(current_settings(state)["weights"].items())))
    if state._advice is not None and state._advice[0] == key:
        return state._advice[1]
    out = None
    if c.alerts:
        top = sorted(c.alerts, key=lambda x: x.severity != "critical")[0]
        found, why_not = fixes(state, ALERT_FIXES.get(top.kind, ("group_size", "weights")))
        out = {"alert": top, "fixes": found, "why_not": why_not}
    state._advice = (key, out)
    return out


def what_would_help(state: LiveState) -> str:
    """What the page says when Suggest weights finds nothing: the moves other than a reweight
    that would make groups vary (a harder level, a larger G, wider sampling), else why none can."""
    found, why_not = fixes(state, ("difficulty", "group_size", "temperature"))
    if found:
        return "What would help instead: " + "; ".join(f"**{f.label}** ({f.note})" for f in found) + "."
    return "Nothing else applies now either: " + "; ".join(why_not) + "."
