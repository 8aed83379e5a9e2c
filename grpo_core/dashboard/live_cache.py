"""One shared view of each live run for every viewer of the dashboard process.

Streamlit runs each browser session as a thread of one process. Without this module every
session read the store and rebuilt its own LiveState at every refresh; with it, `current(run_dir)`
asks the store "anything new?" (RunStore.probe: one short indexed read, no transaction left
open) at most once per PROBE_S per run however many viewers ask, calls live_view.load only when
the probe changed, and gives every session the same LiveState. The what-if window's rollouts
(the steering panel's, and the top alert's fix) are read at most once per ROLLOUTS_S, the
steering panel's period, not with every new step the charts show.

Snapshots: a LiveState handed out is never changed by a later refresh. The refresh works on a
shallow copy (its lists and dicts copied; live_view.load assigns new frames, it never edits one in
place), so a session drawing one version while another session's call refreshes sees one
consistent version. Sessions treat it as read-only, except LiveState's own caches (frame_cache,
arrays_cache, advice_cache, settings_cache, status_cache), which live_view and advice fill with the
same value for the same version whichever session fills them.

`memo(run_dir, key, fn)`: what many viewers derive from one version (the figures), computed once
(`chart_specs`: the live page's charts, for its pages and its HTML's first paint);
`chart_update(run_dir, key, fn)`: a chart's update for the viewers that hold the same version of it.
`refresh_interval(state, probed, viewer)`: the live page's poll period, from the run's step rate (2 s
for a page that asks live_probe's route before it redraws), longer for a fast run with many viewers
(together they are redrawn `redraws_per_s()` times a second at most, serve's --redraws-per-s; a
viewer counts from its page's script run and while its page asks, `saw_viewer` when it asks the
route, so a closed or hidden page drops out, and an id made up on the route counts for nothing);
`what_if_interval`: the steering panel's what-if line's, whose redraws the viewers share at half
that rate. `expire(run_dir)`:
the next call probes at once (after the page sent a request).
Memory stays bounded with many runs: at most MAX_RUNS runs, a run nobody asked for in EVICT_S
is dropped.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import sqlite3
import statistics
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

from grpo_core.analysis import charts
from grpo_core.dashboard import live_chart, live_view
from grpo_core.dashboard.live_view import LiveState
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.locations import env
from grpo_core.runs.names import TIME_STEP
from grpo_core.runs.run_meta import RUNNING, STALE
from grpo_core.runs.schema import DB_NAME
from grpo_core.runs.store import RunStore

logger = logging.getLogger(__name__)

PROBE_S = 0.5  # at most one "anything new?" read per run this often, whatever the number of viewers
ROLLOUTS_S = 5.0  # the what-if window's new rollouts are read at most this often (the steering panel's period)
MAX_RUNS = 16  # runs kept at once (each: one LiveState, ~1 MB on a long run, and its memo)
EVICT_S = 300.0  # a run no viewer asked for in this long is dropped
MEMO_SIZE = 12  # derived values kept per run (figure sets, cards, what-ifs): the last version or two x the views asked for
UPDATES_SIZE = 64  # chart updates kept per run: ~7 charts x the versions viewers hold (one per probe they refreshed in)
MIN_REFRESH_S = 2.0  # the live page's poll period for a fast run (the page's period before it adapted)
MAX_REFRESH_S = 10.0  # ... for a slow one: a change still shows within 2 periods
STALE_REFRESH_S = 5.0  # a stale run (no heartbeat) may come back
RATE_WINDOW_S = 120.0  # the step rate is measured over the steps seen in this window
RATE_SAMPLES = 32  # (time, last step) samples kept per run for the rate
REDRAWS_ENV = "GRPO_HEALTH_REDRAWS_PER_S"  # `serve --redraws-per-s` sets it for its Streamlit
DEFAULT_REDRAWS_PER_S = 1.5  # a box that trains and serves on a few cores: ten pages cost what three do
WHAT_IF_SHARE = 0.5  # a run's what-if lines together are redrawn half as often as its charts at most: each costs a page's rerun, and it is read when steering
VIEWERS_WINDOW_S = 25.0  # a viewer counts while its page asked (its period, or live_probe's route) within this long, or 2 periods: a page asks every 10 s at most (MAX_REFRESH_S), and a closed or hidden one drops out


def redraws_per_s(text: str | None = None) -> float:
    """How often a run's viewers together are redrawn at most (the dashboard's share of the CPU):
    `text` (serve's --redraws-per-s), else $GRPO_HEALTH_REDRAWS_PER_S, else 1.5."""
    text = env(REDRAWS_ENV) if text is None else text
    if text is None:
        return DEFAULT_REDRAWS_PER_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--redraws-per-s / ${REDRAWS_ENV} must be a number above 0 (how often a run's open "
                          f"pages together are redrawn, per second; default {DEFAULT_REDRAWS_PER_S}), got {text!r}")
    return value


@dataclass
class _Run:
    """One run's shared state; `lock` guards state/probe/error, `memo_lock` the memo."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    memo_lock: threading.Lock = field(default_factory=threading.Lock)
    state: LiveState | None = None
    probe: tuple | None = None
    probed_at: float = -math.inf  # time.monotonic() of the last probe
    rollouts_at: float = -math.inf  # time.monotonic() of the last load that read the rollouts
    error: str | None = None  # the last probe's or load's StoreError, raised again until the next probe
    asked_at: float = 0.0
    memo: OrderedDict = field(default_factory=OrderedDict)
    updates: OrderedDict = field(default_factory=OrderedDict)  # chart_update's
    steps: deque = field(default_factory=lambda: deque(maxlen=RATE_SAMPLES))  # (time.time(), last_step)
    viewers: dict = field(default_factory=dict)  # viewer id -> time.monotonic() its page last asked (refresh_interval, saw_viewer)
    loads: int = 0  # live_view.load calls (tests and the bench count them)


_runs: OrderedDict[str, _Run] = OrderedDict()
_lock = threading.Lock()  # guards _runs


def _db(run_dir) -> Path:
    p = Path(run_dir)
    return p if p.suffix == ".db" else p / DB_NAME


def _entry(run_dir) -> _Run:
    """The run's entry (made on first ask), after dropping runs unasked-for too long or too many."""
    key = str(_db(run_dir))
    now = time.monotonic()
    with _lock:
        run = _runs.get(key)
        if run is None:
            run = _runs[key] = _Run()
        run.asked_at = now
        _runs.move_to_end(key)
        for k in [k for k, r in _runs.items() if now - r.asked_at > EVICT_S]:
            del _runs[k]
        while len(_runs) > MAX_RUNS:
            _runs.popitem(last=False)  # the least recently asked for
        return run


def current(run_dir: str | Path) -> LiveState:
    """The run's LiveState, up to date within PROBE_S, shared by every caller: read-only.
    A store that cannot be read (deleted, corrupt) raises StoreError, at every call."""
    run = _entry(run_dir)
    with run.lock:
        now = time.monotonic()
        if now - run.probed_at >= PROBE_S:
            run.probed_at = now
            try:
                _update(run_dir, run)
                run.error = None
            except StoreError as e:  # never cached as a success: the next probe tries again
                run.state, run.probe, run.error = None, None, str(e)
                run.memo.clear()
                run.updates.clear()
        if run.error is not None:
            raise StoreError(run.error)
        return run.state


def _update(run_dir, run: _Run):
    """Probe; load only what changed: nothing, the meta alone, or live_view's incremental load
    (with the rollouts of the steps since they were last read, once ROLLOUTS_S has passed)."""
    now = time.monotonic()
    rollouts = now - run.rollouts_at >= ROLLOUTS_S
    # A state to keep unless the store changed: its rollouts are read up to its last step, or not due yet.
    settled = run.state is not None and not (rollouts and run.state.rollout_step < run.state.last_step)
    try:
        with RunStore(_db(run_dir), readonly=True) as store:
            probe = store.probe()
            if settled and probe == run.probe:
                return
            if settled and probe[:-1] == run.probe[:-1]:  # a heartbeat or a status: no rows to read
                new = _snapshot(run.state)
                new.meta, new.rows_read, new.loaded_at = store.get_meta(), 0, time.time()
                run.state, run.probe = new, probe
                return
    except sqlite3.DatabaseError as e:
        raise StoreError(f"run {Path(run_dir).name} cannot be read: {e}") from None
    old = run.state
    mine = _snapshot(old) if old is not None else None
    new = live_view.load(run_dir, mine, rollouts=rollouts)
    run.loads += 1
    if rollouts or new is not mine:  # a first load reads the rollouts too
        run.rollouts_at = now
    if old is not None and new is not mine:  # a fresh first load (a resumed run redid steps)
        new.version = old.version + 1  # versions stay monotone: memo keys never meet an old value
        run.steps.clear()
    if old is None or new.last_step != old.last_step:
        run.steps.append((time.time(), new.last_step))
    run.state, run.probe = new, probe  # the probe from before the load: a change meanwhile is read next time


def _snapshot(state: LiveState) -> LiveState:
    """A copy the next load may change without touching `state` (frames are replaced, not edited)."""
    new = copy.copy(state)
    for f in dataclasses.fields(state):
        v = getattr(state, f.name)
        if isinstance(v, (list, dict)):
            setattr(new, f.name, copy.copy(v))
    return new


def memo(run_dir: str | Path, key, fn):
    """fn() computed once per key for this run and shared by every session (the last MEMO_SIZE
    keys kept). The key must hold all the value depends on, e.g. (state.version, smoothing, raw).
    An exception from fn propagates and nothing is kept."""
    run = _entry(run_dir)
    return _kept(run, run.memo, MEMO_SIZE, key, fn)


def chart_specs(run_dir: str | Path, state: LiveState, smoothing: float, raw_frame=None) -> list[tuple[str, dict | None]]:
    """The live page's charts of `state` (live_chart.spec's dicts by name, None where the run logged
    nothing to chart), built once per version and smoothing for every viewer: the binned history
    (live_view.chart_frame), or `raw_frame` (a session's every-step read) where given. The page and its
    first paint (first_paint: the HTML's preview) share them."""
    def build():
        frame = live_view.chart_frame(state) if raw_frame is None else raw_frame
        return live_chart.specs(charts.live_charts(
            frame, state.metrics, state.changes, live_view.health_config(state.meta),
            live_view.current_settings(state)["outcome_metric"], smoothing=smoothing, plain=True))
    return memo(run_dir, (state.version, state.status, "charts", smoothing, raw_frame is not None), build)


def chart_update(run_dir: str | Path, key, fn):
    """live_chart.update's memo: the bytes that take a page's chart from the version it holds to
    the chart's (key: their tokens) are made once for every viewer holding that version (the last
    UPDATES_SIZE kept, apart from memo's values so that 7 charts do not push those out)."""
    run = _entry(run_dir)
    return _kept(run, run.updates, UPDATES_SIZE, key, fn)


def _kept(run: _Run, table: OrderedDict, size: int, key, fn):
    with run.memo_lock:  # a second viewer asking for the same key waits for the first one's value
        if key in table:
            table.move_to_end(key)
            return table[key]
        value = fn()
        table[key] = value
        while len(table) > size:
            table.popitem(last=False)
        return value


def expire(run_dir: str | Path):
    """The next current() probes at once (the page sent a request: it shows it pending on its rerun)."""
    run = _entry(run_dir)
    with run.lock:
        run.probed_at = -math.inf


def loads(run_dir: str | Path) -> int:
    """live_view.load calls made for this run since it entered the cache."""
    with _lock:
        run = _runs.get(str(_db(run_dir)))
    return run.loads if run is not None else 0


def clear():
    """Forget every run (tests; a runs dir switched)."""
    with _lock:
        _runs.clear()


# ---- how often the page asks -----------------------------------------------------------------------
def refresh_interval(state: LiveState, probed: bool = False, viewer: str | None = None) -> float | None:
    """Poll period: half a step (from the step rate seen, else the logged step time) within
    MIN..MAX_REFRESH_S, so a slow run is not polled 15 times per step and a step shows within
    2 periods; None for a run that has ended. `probed`: the page asks live_probe's route before
    each rerun, so a poll that finds nothing new costs it a few bytes, not a redraw: MIN_REFRESH_S
    whatever the run's pace (a step shows within one period; the page redraws once per step).
    `viewer`: the asking page (one id per browser session). A run's viewers share redraws_per_s():
    with n of them, a page that would redraw more often than every n / redraws_per_s() seconds (a
    fast run) waits that long, so ten viewers cost the server and the trainer's box what a few do."""
    status = state.status
    if status == STALE:
        return STALE_REFRESH_S
    if not state.is_live:
        return None
    fast = fast_period(_viewers(state, viewer))
    if probed:  # redraws once per step at most: the viewers' share bounds only a run faster than it
        if status != RUNNING or fast <= MIN_REFRESH_S:  # no share to bound: the step rate is not needed
            return MIN_REFRESH_S
        step = _step_period(state)
        return MIN_REFRESH_S if step is not None and step >= fast else fast
    step = _step_period(state) if status == RUNNING else None
    if step is None:  # starting or paused: its first step or its resume may come any moment
        return fast
    return max(min(MAX_REFRESH_S, max(MIN_REFRESH_S, step / 2)), fast)


def what_if_interval(state: LiveState, least: float, probed: bool = False, viewer: str | None = None) -> float | None:
    """The steering panel's what-if line's poll period: the charts' (`refresh_interval`), `least` at
    least, and with many viewers their share of WHAT_IF_SHARE x redraws_per_s(): a what-if redraw is
    a rerun of the page like a chart's, so ten pages' what-ifs were as many reruns as their charts."""
    period = refresh_interval(state, probed, viewer)
    if period is None:
        return None
    return max(least, period, viewers_period(_viewers(state, viewer)) / WHAT_IF_SHARE)


def viewers_period(viewers: int) -> float:
    """The period at which `viewers` pages together redraw redraws_per_s() times a second."""
    return viewers / redraws_per_s()


def fast_period(viewers: int) -> float:
    """A fast run's page period (a step or more per period) with `viewers` pages: MIN_REFRESH_S, or
    their share of redraws_per_s() where that is longer."""
    return max(MIN_REFRESH_S, viewers_period(viewers))


def saw_viewer(run_dir: Path, viewer: str):
    """`viewer`'s page asked live_probe's route: it still watches the run (a probed page with nothing
    new asks only the route, and reruns, asking refresh_interval, only once per step). Only a viewer
    counted already (its page's script run asked refresh_interval) is kept so: the route is open to
    any request, and ids made up there would lengthen every page's period and pile up."""
    with _lock:
        run = _runs.get(str(_db(run_dir)))
        if run is not None and viewer in run.viewers:
            _count_viewers(run, viewer)


def _viewers(state: LiveState, viewer: str | None) -> int:
    """The pages that asked for this run's period or its route within VIEWERS_WINDOW_S, `viewer` counted now."""
    with _lock:
        run = _runs.get(state.db)
        if run is None:
            return 1 if viewer else 0
        return _count_viewers(run, viewer)


def _count_viewers(run: _Run, viewer: str | None) -> int:
    """(Under _lock.) `viewer` seen now; those seen longer ago than the window dropped: how many are left.
    Both ways a page is seen prune, so ids that stopped asking never pile up."""
    now = time.monotonic()
    if viewer:
        run.viewers[viewer] = now
    window = max(VIEWERS_WINDOW_S, 2 * viewers_period(len(run.viewers)))  # ~90 viewers and more: pages ask slower
    for v in [v for v, t in run.viewers.items() if now - t > window]:
        del run.viewers[v]
    return len(run.viewers)


def _step_period(state: LiveState) -> float | None:
    """Seconds per step: as the cache saw the steps arrive, else as the run logged them."""
    step = _seen_period(state)
    return _logged_period(state) if step is None else step


def _seen_period(state: LiveState) -> float | None:
    """Seconds per step over the steps the cache saw arrive in the last RATE_WINDOW_S (includes
    what the logged step time leaves out: evals, checkpoints, commit batching)."""
    with _lock:
        run = _runs.get(state.db)
        samples = list(run.steps) if run is not None else []
    recent = [s for s in samples if samples and samples[-1][0] - s[0] <= RATE_WINDOW_S]
    if len(recent) < 2 or recent[-1][1] <= recent[0][1]:
        return None
    return (recent[-1][0] - recent[0][0]) / (recent[-1][1] - recent[0][1])


def _logged_period(state: LiveState) -> float | None:
    """The median logged step time of the last 20 steps (a run's own measure, before any step was seen)."""
    if TIME_STEP not in state.recent.columns:
        return None
    t = state.recent[TIME_STEP].dropna().tail(20)
    t = [float(x) for x in t if x > 0]
    return statistics.median(t) if t else None
