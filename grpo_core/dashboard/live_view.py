"""The live monitor's view of one run: a LiveState read from the store by what changed.

It holds the run's chart history and gives the settings in force. `load(run, state)` makes a session's LiveState current: scalars of new steps, new change
events, control rows that were still open, rollouts of new steps (when asked). Memory stays bounded
however long the run: the last `RECENT_STEPS` steps are kept raw (every health window fits
in them), older steps as bins (sum, count, min and max per name) whose width doubles
whenever there are more than `MAX_BINS` bins, so a chart draws their means and their extremes
(a one-step collapse inside a bin stays visible); the what-if window keeps the rollouts of the
last `WHATIF_STEPS` steps only. The first load of a long run reads the old part already binned by SQLite
(`RunStore.scalars_binned`), so it never materialises every step. `raw_frame` reads every
step of the chart names, for the page's "every step" view.

The pages' other view models read a LiveState: live_cards (the header and cards),
advice (what-if, suggestions, what to do now), request_view (requests and autopilot
moves), run_list (the Runs page).
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

from grpo_core.analysis.downsample import envelope_names
from grpo_core.errors import StoreError
from grpo_core.runs import live_settings
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    CUM_SAMPLED_TOKENS,
    CUM_TRAINABLE_RATIO,
    CUM_WASTED_TOKENS,
    DIFFICULTY,
    EVAL_PASS,
    EVAL_REWARD,
    FLAT_CAUSES,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SOLVED,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    GROUPS_UNSOLVED,
    MIN_GROUP_STD,
    NOISE_GROUPS,
    PHANTOM_GROUPS,
    REWARD,
    REWARD_STD,
    SAMPLER_LOGP_DIFF_MAX,
    SAMPLER_LOGP_DIFF_MEAN,
    TIME_STEP,
    TRAINABLE_RATIO,
    WASTED_SHARE,
    metric_group_std,
    metric_mean,
    metric_weight,
    parse_metric_name,
)
from grpo_core.runs.run_meta import LIVE_STATUSES, RunMeta, display_status
from grpo_core.runs.schema import DB_NAME
from grpo_core.runs.store import APPLIED, APPLYING, EV_AUTOPILOT, EV_CHANGE, PENDING, RunStore

RECENT_STEPS = 500  # raw steps kept (>= every health window: trend, near-zero, zero-trainable)
MAX_BINS = 1000  # bins of older history; with RECENT_STEPS: at most ~2,000 points per chart
WHATIF_STEPS = 50  # rollouts window behind the what-if and the weight suggestions
MAX_CONTROL_ROWS = 200  # control rows kept in a session (the latest ones)
STATUS_S = 0.5  # a LiveState's status (its heartbeat's age, its trainer's pid) is rechecked at most this often

BASE_NAMES = tuple(dict.fromkeys((TRAINABLE_RATIO, CUM_TRAINABLE_RATIO, GROUPS_SUBMITTED, GROUPS_TRAINABLE,
              CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE, PHANTOM_GROUPS, NOISE_GROUPS, REWARD, REWARD_STD,
              FRAC_REWARD_ZERO_STD, MIN_GROUP_STD, DIFFICULTY, TIME_STEP, EVAL_REWARD, EVAL_PASS,
              GROUPS_SOLVED, GROUPS_UNSOLVED, WASTED_SHARE, CUM_SAMPLED_TOKENS, CUM_WASTED_TOKENS,
              SAMPLER_LOGP_DIFF_MEAN, SAMPLER_LOGP_DIFF_MAX) + tuple(FLAT_CAUSES.values())))  # + the flat chart's


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


def config_section(meta: dict, section: str, cls):
    """The run's [section] as the trainer read it: cls's defaults where the run set none."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = RunMeta.parse(meta).config.get(section) or {}
    return cls(**{k: v for k, v in values.items() if k in known})


def health_config(meta: dict) -> HealthConfig:
    return config_section(meta, "health", HealthConfig)


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
    bin_min: pd.DataFrame = field(default_factory=pd.DataFrame)  # NaN: no value in the bin
    bin_max: pd.DataFrame = field(default_factory=pd.DataFrame)
    folded_upto: int = -1  # steps <= this live in the bins
    event_id: int = 0
    changes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=["step", "kind", "request", "source", "message"]))
    control: pd.DataFrame = field(default_factory=pd.DataFrame)
    moves: list = field(default_factory=list)  # the autopilot's events (payload + step), oldest first
    rollouts: pd.DataFrame = field(default_factory=pd.DataFrame)  # the what-if window
    rollout_step: int = -1  # the rollouts are read up to this step (at their own period: load's rollouts)
    version: int = 0  # bumped whenever a new step, event or request row was read (not for rollouts: rollout_step)
    rows_read: int = 0  # scalar rows the last load brought into Python (tests pin incremental reads)
    loaded_at: float = 0.0
    frame_cache: tuple | None = None  # (version, chart frame)
    arrays_cache: tuple | None = None  # (rollout_step, RolloutArrays): advice.rollout_arrays
    advice_cache: tuple | None = None  # ((alert kinds, weights), rollout_step, time, advice.what_to_do's answer)
    settings_cache: tuple | None = None  # (version, meta, current_settings' answer)
    status_cache: tuple | None = None  # (time.monotonic(), meta, display_status' answer)

    @property
    def status(self) -> str:
        """The meta's status, 'stale' for a live run whose trainer is gone or silent (display_status),
        rechecked at most every STATUS_S: a page asks it a dozen times per draw, for every viewer."""
        now, cached = time.monotonic(), self.status_cache
        if cached is None or cached[1] is not self.meta or now - cached[0] >= STATUS_S:
            cached = self.status_cache = (now, self.meta, display_status(self.meta))
        return cached[2]

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
def load(run: str | Path, state: LiveState | None = None, rollouts: bool = True) -> LiveState:
    """First load (state None, or another run) or incremental refresh of `state`; rollouts False:
    a refresh leaves the what-if window's rollouts as they were (live_cache reads them at the
    steering panel's period: the charts never need them). A store that cannot be read (deleted,
    corrupt) raises StoreError with the reason."""
    try:
        return _load(run, state, rollouts)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"run {Path(run).name} cannot be read: {e}") from None


def _open(run) -> RunStore:
    """A run dir or run.db path (a deleted dir says 'no run store at ...'), else a run id."""
    p = Path(run)
    if "/" in str(run):
        return RunStore(p if p.suffix == ".db" else p / DB_NAME, readonly=True)
    return RunStore.open(run, readonly=True)


def _load(run, state, rollouts):
    with _open(run) as store:
        if state is None or state.db != str(store.path):
            return _first_load(store)
        last = store.last_step()
        if last is not None and last < state.last_step:  # a resumed run redid steps: start over
            return _first_load(store)
        _refresh(store, state, rollouts)
        return state


def _first_load(store: RunStore) -> LiveState:
    meta = store.get_meta()
    state = LiveState(run_id=store.run_id, db=str(store.path), meta=meta)
    last = store.last_step()
    state.metrics = run_metrics(meta, store.scalar_names(last) if last is not None else [])
    state.names = chart_names(state.metrics)
    state.recent = pd.DataFrame(index=pd.Index([], name="step", dtype="int64"), columns=state.names, dtype=float)
    empty = pd.DataFrame(columns=state.names, dtype=float)
    state.bin_sum, state.bin_cnt, state.bin_min, state.bin_max = empty, empty.copy(), empty.copy(), empty.copy()
    if last is not None:
        split = last - RECENT_STEPS
        if split >= 0:  # the old part arrives binned: SQLite aggregates, pandas never sees every step
            state.bin_size = 1 << max(0, math.ceil(math.log2(max(1, (split + 1) / MAX_BINS))))
            long = store.scalars_binned(state.names, state.bin_size, until_step=split)
            state.bin_sum, state.bin_cnt, state.bin_min, state.bin_max = _pivot(long, state.names)
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


def _refresh(store: RunStore, state: LiveState, rollouts: bool):
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
    if rollouts:
        _read_rollouts(store, state)
    state.loaded_at = time.time()
    if changed:
        state.version += 1


def _wide(store: RunStore, since: int, names: list[str]) -> pd.DataFrame:
    w = store.scalars_wide(since_step=since, names=names)
    return w.reindex(columns=names).astype(float)


BIN_AGGREGATES = (("total", 0.0), ("count", 0.0), ("low", np.nan), ("high", np.nan))  # scalars_binned's


def _pivot(long: pd.DataFrame, names: list[str]) -> list[pd.DataFrame]:
    """scalars_binned's sum, count, min and max as frames (index bin, columns names), in one pivot;
    where a name had no value in a bin: 0 for a sum or count, NaN for a min or max."""
    if long.empty:
        return [pd.DataFrame(columns=names, dtype=float) for _ in BIN_AGGREGATES]
    p = long.pivot(index="bin", columns="name", values=[v for v, _ in BIN_AGGREGATES])
    return [p[v].reindex(columns=names).astype(float).fillna(empty) for v, empty in BIN_AGGREGATES]


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
    # The first new bin can be the last old one (a bin cut in two by an earlier fold): merge by bin.
    grouped = old.groupby(key)
    state.bin_min = _merge(state.bin_min, grouped.min(), "min")
    state.bin_max = _merge(state.bin_max, grouped.max(), "max")
    state.folded_upto = cut
    while len(state.bin_sum) > MAX_BINS:  # twice as wide bins: memory stays bounded forever
        state.bin_size *= 2
        state.bin_sum = state.bin_sum.groupby(state.bin_sum.index // 2).sum()
        state.bin_cnt = state.bin_cnt.groupby(state.bin_cnt.index // 2).sum()
        state.bin_min = state.bin_min.groupby(state.bin_min.index // 2).min()
        state.bin_max = state.bin_max.groupby(state.bin_max.index // 2).max()


def _merge(bins: pd.DataFrame, new: pd.DataFrame, how: str) -> pd.DataFrame:
    """Per bin and name the min (or max) of both frames; NaN (no value) never wins."""
    if bins.empty:
        return new
    return getattr(pd.concat([bins, new]).groupby(level=0), how)()


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
    """History for the charts: bin means (x = the bin's mid step) then the raw recent steps, one
    column per name; and for the binned rows each name's smallest and largest value in the bin
    (columns downsample.envelope_names(name), NaN on the raw rows), so a chart draws the spikes
    the means smooth away. At most MAX_BINS + 2 x RECENT_STEPS rows."""
    if state.frame_cache is not None and state.frame_cache[0] == state.version:
        return state.frame_cache[1]
    if state.bin_sum.empty:
        df = state.recent.dropna(axis=1, how="all")
    else:
        df = _binned_frame(state)
    state.frame_cache = (state.version, df)
    return df


def _binned_frame(state: LiveState) -> pd.DataFrame:
    """chart_frame of a state with bins, assembled in numpy: pandas' concat would align the
    three column sets of every row block (a few ms at each new step)."""
    names, bins = list(state.names), state.bin_sum.index

    def block(f: pd.DataFrame, index=bins) -> np.ndarray:
        return f.reindex(index=index, columns=names).to_numpy(np.float64)

    total, count = block(state.bin_sum), block(state.bin_cnt)
    mean = np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)
    rows = [np.hstack([mean, block(state.bin_min), block(state.bin_max)])]
    b = bins.to_numpy()
    lo, hi = b * state.bin_size, np.minimum(b * state.bin_size + state.bin_size - 1, state.folded_upto)
    steps = [(lo + hi) / 2.0]
    if not state.recent.empty:
        raw = block(state.recent, state.recent.index)
        rows.append(np.hstack([raw, np.full((len(raw), 2 * len(names)), np.nan)]))
        steps.append(state.recent.index.to_numpy(np.float64))
    values = np.vstack(rows)
    cols = names + [envelope_names(n)[0] for n in names] + [envelope_names(n)[1] for n in names]
    logged = ~np.isnan(values).all(axis=0)  # a name no step logged: no column (as dropna)
    return pd.DataFrame(values[:, logged], index=pd.Index(np.concatenate(steps), name="step"),
                        columns=[c for c, k in zip(cols, logged) if k])


def raw_frame(run: str | Path, names: list[str], since: int | None = None,
              prev: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every logged step of `names` (index step, one column per name; the page's "every step"
    view, drawn by charts.live_charts like a chart frame): steps after `since` only, or, given
    `prev` (an earlier answer), prev with the steps after its last appended; a run that redid
    steps since (resumed from a checkpoint) is read again whole. A 20,000-step run of 40 names
    is 6 MB: the page reads it when asked, not at every refresh."""
    try:
        with _open(run) as store:
            if prev is not None and len(prev):
                last = store.last_step()
                if last is None or last < prev.index[-1]:  # a resumed run redid steps: start over
                    prev, since = None, None
                else:
                    since = int(prev.index[-1])
            new = _wide(store, -1 if since is None else since, names)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"run {Path(run).name} cannot be read: {e}") from None
    if prev is None or prev.empty or new.empty:
        return new if prev is None or prev.empty else prev
    return pd.concat([prev, new])


def last_value(state: LiveState, name: str):
    if name not in state.recent.columns:
        return None
    s = state.recent[name].dropna()
    return float(s.iloc[-1]) if len(s) else None


def current_settings(state: LiveState) -> dict:
    """Weights, threshold and level in force at the last step (logged), else the config's, and
    the run settings in force: worked out once per version and meta, for every viewer; the caller's
    own dict (changing it changes no one else's)."""
    cached = state.settings_cache
    if cached is None or cached[0] != state.version or cached[1] is not state.meta:
        cached = state.settings_cache = (state.version, state.meta, _settings_in_force(state))
    return {**cached[2], "weights": dict(cached[2]["weights"])}


def _settings_in_force(state: LiveState) -> dict:
    run = RunMeta.parse(state.meta)
    weights = dict(run.cfg("reward", "weights", {}))
    for m in state.metrics:
        v = last_value(state, metric_weight(m))
        if v is not None:
            weights[m] = v
    thr = last_value(state, MIN_GROUP_STD)
    lvl = last_value(state, DIFFICULTY)
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

