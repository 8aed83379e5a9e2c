"""grpo_core.dashboard.live_cache: one shared, cheaply checked LiveState per run for every viewer,
and RunStore.probe, on real SQLite stores written through RunStore (synth_run)."""
import copy
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time

import pandas as pd
import pytest

from grpo_core.dashboard import live_cache, live_view
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.names import TIME_STEP
from grpo_core.runs.run_meta import FINISHED, PAUSED
from grpo_core.runs.store import APPLIED, APPLYING, PENDING, RunStore
from tests.helpers_dashboard import REPO, synth_run

NEW_W = {"answer_f1": 0.5, "exact": 0.3, "citation": 0.1, "format": 0.05, "length": 0.05}


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    live_cache.clear()
    monkeypatch.setattr(live_cache, "PROBE_S", 0.0)  # every call probes, unless a test says otherwise
    yield
    live_cache.clear()


@pytest.fixture
def probes(monkeypatch):
    """Counts RunStore.probe calls (the real method runs)."""
    count = [0]
    real = RunStore.probe

    def counted(self):
        count[0] += 1
        return real(self)
    monkeypatch.setattr(RunStore, "probe", counted)
    return count


def _small(runs_dir, run_id="r", steps=30, **kw):
    return synth_run(runs_dir, run_id, steps, P=2, G=2, **kw)


def _extend(store, start, steps=1):
    return synth_run(None, store.run_id, steps, store=store, start=start, P=2, G=2)


def _all_threads(n, fn):
    """fn() in n threads started together; their results (an exception fails the test)."""
    barrier, out, errors = threading.Barrier(n), [None] * n, []

    def work(i):
        barrier.wait()
        try:
            out[i] = fn()
        except Exception as e:  # reported below, with the others
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


# ---- one load per change, whatever the viewers ------------------------------------------------------
def test_many_viewers_share_one_load_per_change(runs_dir):
    store = _small(runs_dir)
    states = _all_threads(8, lambda: live_cache.current(store.run_dir))
    assert all(s is states[0] for s in states) and states[0].last_step == 30
    assert live_cache.loads(store.run_dir) == 1
    _extend(store, 31)
    states = _all_threads(8, lambda: live_cache.current(store.run_dir))
    assert all(s is states[0] for s in states) and states[0].last_step == 31
    assert live_cache.loads(store.run_dir) == 2  # eight viewers, one new step: one incremental read


def test_nothing_new_costs_a_probe_and_no_load(runs_dir, probes):
    store = _small(runs_dir)
    first = live_cache.current(store.run_dir)
    for _ in range(5):
        assert live_cache.current(store.run_dir) is first
    assert live_cache.loads(store.run_dir) == 1 and probes[0] == 6


def test_probe_at_most_once_per_period(runs_dir, probes, monkeypatch):
    store = _small(runs_dir)
    monkeypatch.setattr(live_cache, "PROBE_S", 3600.0)
    states = _all_threads(8, lambda: [live_cache.current(store.run_dir) for _ in range(5)])
    assert probes[0] == 1 and all(s is states[0][0] for ss in states for s in ss)
    _extend(store, 31)
    assert live_cache.current(store.run_dir).last_step == 30  # within the period: the last answer
    monkeypatch.setattr(live_cache, "PROBE_S", 0.0)  # the period passed
    assert live_cache.current(store.run_dir).last_step == 31 and probes[0] == 2


def test_expire_makes_the_next_call_probe_within_the_period(runs_dir, probes, monkeypatch):
    store = _small(runs_dir)
    monkeypatch.setattr(live_cache, "PROBE_S", 3600.0)
    live_cache.current(store.run_dir)
    rid = store.request("pause", {})  # the page sent it and reruns: it shows it pending at once
    live_cache.expire(store.run_dir)
    assert live_cache.current(store.run_dir).control["id"].tolist() == [rid] and probes[0] == 2


def test_heartbeat_updates_meta_without_a_load(runs_dir):
    store = _small(runs_dir)
    first = live_cache.current(store.run_dir)
    store.heartbeat()
    s = live_cache.current(store.run_dir)
    assert s is not first and s.meta["heartbeat"] > first.meta["heartbeat"]
    assert s.version == first.version and live_cache.loads(store.run_dir) == 1


def test_rollouts_are_read_at_their_own_period_not_with_every_step(runs_dir, monkeypatch):
    store = _small(runs_dir)  # rollouts at every step
    monkeypatch.setattr(live_cache, "ROLLOUTS_S", 3600.0)
    first = live_cache.current(store.run_dir)
    assert first.rollout_step == 30 and first.rollouts["step"].max() == 30  # a first load reads them
    _extend(store, 31, steps=2)
    s = live_cache.current(store.run_dir)  # the charts' refresh: the new steps, not their rollouts
    assert s.last_step == 32 and s.version == first.version + 1
    assert s.rollout_step == 30 and s.rollouts["step"].max() == 30
    monkeypatch.setattr(live_cache, "ROLLOUTS_S", 0.0)  # the period passed, nothing new in the store
    r = live_cache.current(store.run_dir)
    assert r.rollout_step == 32 and set(r.rollouts["step"]) == set(range(1, 33))  # the window, the new steps' added
    assert r.version == s.version and s.rollout_step == 30  # the charts' view is the same; the snapshot untouched
    assert live_cache.loads(store.run_dir) == 3
    assert live_cache.current(store.run_dir) is r and live_cache.loads(store.run_dir) == 3  # up to date: no load


def test_request_status_and_run_status_changes_are_seen_without_a_new_step(runs_dir):
    store = _small(runs_dir)
    live_cache.current(store.run_dir)
    rid = store.request("set_weights", {"weights": NEW_W})

    def status():
        s = live_cache.current(store.run_dir)
        return s.control.set_index("id").loc[rid, "status"]
    assert status() == PENDING
    store.claim_pending()
    assert status() == APPLYING
    store.resolve_request(rid, True, 31, "applied from step 31")
    assert status() == APPLIED
    s = live_cache.current(store.run_dir)
    assert s.last_step == 30 and s.changes["kind"].tolist() == ["set_weights"]
    assert live_view.current_settings(s)["weights"]["answer_f1"] == pytest.approx(0.5)
    store.set_status(FINISHED)
    s = live_cache.current(store.run_dir)
    assert s.status == FINISHED and live_cache.refresh_interval(s) is None


def test_a_refresh_never_changes_a_snapshot_handed_out(runs_dir, monkeypatch):
    monkeypatch.setattr(live_view, "RECENT_STEPS", 5)  # fold into bins, and double them, within a few steps
    monkeypatch.setattr(live_view, "MAX_BINS", 3)
    store = _small(runs_dir, steps=12, changes={4: NEW_W})
    old = live_cache.current(store.run_dir)
    live_view.chart_frame(old)
    kept = {f: copy.deepcopy(getattr(old, f)) for f in vars(old)}
    _extend(store, 13, steps=20)
    store.request("set_threshold", {"min_group_std": 0.05})
    store.set_status(PAUSED)
    new = live_cache.current(store.run_dir)
    assert new.last_step == 32 and new.bin_size > old.bin_size and new.version > old.version
    for f, v in kept.items():
        assert _same(v, getattr(old, f)), f"LiveState.{f} of the snapshot handed out changed under a refresh"


def _same(a, b) -> bool:
    if isinstance(a, (pd.DataFrame, pd.Series)):
        return type(a) is type(b) and a.equals(b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_a_resumed_run_reloads_with_a_newer_version(runs_dir):
    store = _small(runs_dir)
    first = live_cache.current(store.run_dir)
    store.truncate_after(20)
    s = live_cache.current(store.run_dir)
    assert s.last_step == 20 and s.version > first.version and live_cache.loads(store.run_dir) == 2


# ---- errors ------------------------------------------------------------------------------------------
def test_a_deleted_run_raises_at_every_call(runs_dir, monkeypatch):
    store = _small(runs_dir)
    live_cache.current(store.run_dir)
    store.close()
    shutil.rmtree(store.run_dir)
    for period in (0.0, 3600.0):  # a probe each time, or the last answer within the period: an error both
        monkeypatch.setattr(live_cache, "PROBE_S", period)
        for _ in range(2):
            with pytest.raises(StoreError, match="no run store"):
                live_cache.current(store.run_dir)


def test_a_damaged_store_raises_store_error(runs_dir):
    store = _small(runs_dir)
    live_cache.current(store.run_dir)
    store.close()
    for suffix in ("-wal", "-shm"):
        (store.run_dir / f"run.db{suffix}").unlink(missing_ok=True)
    (store.run_dir / "run.db").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError):
        live_cache.current(store.run_dir)


# ---- memo and eviction ---------------------------------------------------------------------------------
def test_memo_computes_once_per_key_and_keeps_a_few(runs_dir, monkeypatch):
    store = _small(runs_dir)
    calls = []

    def figures(key):
        def fn():
            calls.append(key)
            return {"key": key}
        return fn
    s = live_cache.current(store.run_dir)
    key = (s.version, 0.6, False)
    out = _all_threads(8, lambda: live_cache.memo(store.run_dir, key, figures(key)))
    assert calls == [key] and all(o is out[0] for o in out)
    for i in range(live_cache.MEMO_SIZE):  # a newer key each: the first one falls out
        live_cache.memo(store.run_dir, (s.version + 1 + i, 0.6, False), figures(i))
    live_cache.memo(store.run_dir, key, figures(key))
    assert calls.count(key) == 2

    def broken():
        raise ValueError("no figure")
    for _ in range(2):  # not kept as a value: asked again, raised again
        with pytest.raises(ValueError):
            live_cache.memo(store.run_dir, "broken", broken)


def test_runs_are_evicted_by_count_and_by_age(runs_dir, monkeypatch):
    stores = [_small(runs_dir, f"r{i}", steps=3) for i in range(3)]
    monkeypatch.setattr(live_cache, "MAX_RUNS", 2)
    for st in stores:
        live_cache.current(st.run_dir)
    assert [live_cache.loads(st.run_dir) for st in stores] == [0, 1, 1]  # r0: the least recently asked, dropped
    monkeypatch.setattr(live_cache, "EVICT_S", 0.0)
    live_cache.current(stores[0].run_dir)
    assert [live_cache.loads(st.run_dir) for st in stores] == [1, 0, 0]


# ---- refresh interval -----------------------------------------------------------------------------------
def _with_step_time(store, start, seconds, n=20):
    for step in range(start, start + n):
        store.log_step(step, {TIME_STEP: seconds})


@pytest.mark.parametrize("seconds, expected", [(0.5, 2.0), (8.0, 4.0), (60.0, 10.0)])
def test_refresh_interval_follows_the_logged_step_time(runs_dir, seconds, expected):
    store = _small(runs_dir)
    _with_step_time(store, 31, seconds)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir)) == pytest.approx(expected)


@pytest.mark.parametrize("seconds", [0.5, 60.0])
def test_a_probed_page_polls_every_min_refresh_whatever_the_pace(runs_dir, seconds):
    """A page that asks live_probe's route before each rerun pays a few bytes for a poll with
    nothing new: it polls a slow run as often as a fast one, so a step shows within 2 s (and the
    page redraws once per step); a stale run still every STALE_REFRESH_S, an ended one never."""
    store = _small(runs_dir)
    _with_step_time(store, 31, seconds)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir), probed=True) == live_cache.MIN_REFRESH_S
    store.set_meta(heartbeat=time.time() - 60)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir), probed=True) == live_cache.STALE_REFRESH_S
    store.set_status(FINISHED)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir), probed=True) is None


def test_refresh_interval_prefers_the_step_rate_seen(runs_dir):
    store = _small(runs_dir)
    _with_step_time(store, 31, 60.0)  # logged: a minute per step
    live_cache.current(store.run_dir)
    _with_step_time(store, 51, 60.0)  # but 20 steps arrived within this test: a fast run
    assert live_cache.refresh_interval(live_cache.current(store.run_dir)) == live_cache.MIN_REFRESH_S


def test_refresh_interval_of_stale_paused_and_finished_runs(runs_dir):
    store = _small(runs_dir)
    store.set_status(PAUSED)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir)) == live_cache.MIN_REFRESH_S
    store.set_meta(status="running", heartbeat=time.time() - 60)  # no heartbeat for a minute
    assert live_cache.refresh_interval(live_cache.current(store.run_dir)) == live_cache.STALE_REFRESH_S
    store.set_status(FINISHED)
    assert live_cache.refresh_interval(live_cache.current(store.run_dir)) is None


def test_a_fast_runs_viewers_share_its_redraws(runs_dir, monkeypatch):
    """n pages on a fast run each wait n / REDRAWS_PER_S (2 s while that is shorter); a page that
    stopped asking drops out after VIEWERS_WINDOW_S; a run slower than the viewers' share keeps its
    probed 2-s poll (its pages redraw once per step)."""
    store = _small(runs_dir)
    _with_step_time(store, 31, 0.5)  # a fast run: half a second per step
    s = live_cache.current(store.run_dir)
    periods = [live_cache.refresh_interval(s, probed=True, viewer=f"page{i}") for i in range(10)]
    assert periods[:3] == [live_cache.MIN_REFRESH_S] * 3
    assert periods[-1] == pytest.approx(10 / live_cache.redraws_per_s())
    assert live_cache.refresh_interval(s, viewer="page0") == pytest.approx(10 / live_cache.redraws_per_s())  # no route
    assert live_cache.refresh_interval(s, probed=True, viewer="page0") == pytest.approx(10 / live_cache.redraws_per_s())
    later = time.monotonic() + live_cache.VIEWERS_WINDOW_S + 1
    monkeypatch.setattr(live_cache.time, "monotonic", lambda: later)  # only page0 asks again
    assert live_cache.refresh_interval(s, probed=True, viewer="page0") == live_cache.MIN_REFRESH_S
    many = [live_cache.refresh_interval(s, probed=True, viewer=f"many{i}") for i in range(120)][-1]
    assert many == pytest.approx(121 / live_cache.redraws_per_s()) and many > live_cache.VIEWERS_WINDOW_S
    later += live_cache.VIEWERS_WINDOW_S + 1  # past the window, within 2 periods: all still counted
    assert live_cache.refresh_interval(s, probed=True, viewer="page0") == pytest.approx(many)
    slow = _small(runs_dir, "slow")
    _with_step_time(slow, 31, 60.0)
    s = live_cache.current(slow.run_dir)
    assert [live_cache.refresh_interval(s, probed=True, viewer=f"page{i}") for i in range(10)][-1] == live_cache.MIN_REFRESH_S



def test_the_what_if_lines_share_half_the_redraws(runs_dir):
    """The what-if line polls at the charts' period, 5 s at least (the page's `least`); with many
    viewers of a fast run their what-ifs together are redrawn WHAT_IF_SHARE as often as their charts:
    ten pages each every 13.3 s where the charts are every 6.7 s. A finished run's asks for none."""
    store = _small(runs_dir)
    _with_step_time(store, 31, 0.5)
    s = live_cache.current(store.run_dir)
    assert live_cache.what_if_interval(s, 5.0, probed=True, viewer="page0") == 5.0
    assert live_cache.what_if_interval(s, 1.0, probed=True, viewer="page0") == live_cache.MIN_REFRESH_S
    periods = [live_cache.refresh_interval(s, probed=True, viewer=f"page{i}") for i in range(10)]
    assert periods[-1] == pytest.approx(10 / 1.5)
    assert live_cache.what_if_interval(s, 5.0, probed=True, viewer="page0") == pytest.approx(2 * 10 / 1.5)
    store.set_status(FINISHED)
    assert live_cache.what_if_interval(live_cache.current(store.run_dir), 5.0, viewer="page0") is None


def test_serves_setting_sets_the_viewers_share(runs_dir, monkeypatch):
    """$GRPO_HEALTH_REDRAWS_PER_S (serve --redraws-per-s) sets how often a run's pages together
    are redrawn: ten pages on a fast run each every 2 s with 5 a second, every 20 s with 0.5."""
    store = _small(runs_dir)
    _with_step_time(store, 31, 0.5)
    s = live_cache.current(store.run_dir)
    monkeypatch.setenv(live_cache.REDRAWS_ENV, "5")
    assert [live_cache.refresh_interval(s, probed=True, viewer=f"page{i}") for i in range(10)][-1] == live_cache.MIN_REFRESH_S
    monkeypatch.setenv(live_cache.REDRAWS_ENV, "0.5")
    assert live_cache.refresh_interval(s, probed=True, viewer="page0") == pytest.approx(20.0)
    monkeypatch.setenv(live_cache.REDRAWS_ENV, "")  # empty: unset, the default
    assert live_cache.redraws_per_s() == live_cache.DEFAULT_REDRAWS_PER_S == 1.5
    assert live_cache.redraws_per_s("3") == 3.0  # serve's flag wins over the variable


@pytest.mark.parametrize("text", ["0", "-1", "abc", "nan", "inf", ""])
def test_a_bad_redraw_rate_is_one_line_that_names_it(text):
    with pytest.raises(ConfigError) as e:
        live_cache.redraws_per_s(text)
    assert str(e.value).startswith("--redraws-per-s / $GRPO_HEALTH_REDRAWS_PER_S must be a number above 0")
    assert str(e.value).endswith(f"got {text!r}") and "\n" not in str(e.value)


# ---- the probe, and the trainer's protection ----------------------------------------------------------
def test_probe_is_cheaper_than_a_refresh_with_nothing_new(runs_dir):
    store = _small(runs_dir, steps=300)

    def probe():
        with RunStore(store.path, readonly=True) as s:
            return s.probe()
    state = live_view.load(store.run_dir)

    def median_s(fn, n=30):
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)
    assert median_s(probe) < median_s(lambda: live_view.load(store.run_dir, state))


def test_readers_hold_no_transaction_after_a_call(runs_dir):
    store = _small(runs_dir)
    _extend(store, 31, steps=5)
    live_cache.current(store.run_dir)
    store.request("pause", {})
    live_cache.current(store.run_dir)
    busy, log, done = store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    assert busy == 0 and log == done  # no reader of ours still holds a snapshot of the WAL


STEPS = 300  # steps per phase: alone, then watched
WRITER = r"""
import json, sys, time
from grpo_core.runs.store import RunStore
store = RunStore(sys.argv[1])
names = json.loads(sys.argv[2])
step = store.last_step()
print("ready", flush=True)
for line in sys.stdin:
    times = []
    for _ in range(int(line)):
        step += 1
        t = time.perf_counter()
        store.log_step(step, {n: step * 0.001 for n in names},
                       rollouts=[(g, i, 0.5, {"exact": 1.0}, "text", None) for g in range(8) for i in range(8)],
                       events=[("change", {"kind": "set_weights", "request": {}})] if step % 7 == 0 else ())
        times.append(time.perf_counter() - t)
    print(json.dumps(times), flush=True)
"""


def test_readers_never_block_the_writer(runs_dir):
    """The trainer (another process) logs steps while 4 viewer threads read the run as fast as they
    can: no 'database is locked', and a step's write stays within a generous factor of its time
    with nobody reading (the speed itself is the bench's)."""
    store = _small(runs_dir)
    names = store.scalar_names()
    store.close()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(store.path), json.dumps(names)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()

        def phase(n):
            writer.stdin.write(f"{n}\n")
            writer.stdin.flush()
            line = writer.stdout.readline()
            assert line, writer.stderr.read()
            return json.loads(line)
        alone = phase(STEPS)
        stop, seen, reading = threading.Event(), [], threading.Semaphore(0)

        def viewer(i):
            while not stop.is_set():
                seen.append((live_cache.current(store.run_dir) if i % 2 else live_view.load(store.run_dir)).last_step)
                reading.release()
        errors = []
        threads = [threading.Thread(target=lambda i=i: _catch(errors, viewer, i)) for i in range(4)]
        for t in threads:
            t.start()
        for _ in range(4):  # the viewers are reading before the writer starts
            assert reading.acquire(timeout=60) and not errors, errors
        before = len(seen)
        watched = phase(STEPS)
        stop.set()
        for t in threads:
            t.join()
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert not errors, errors
    logged = 30 + STEPS  # the last step before the watched phase
    assert any(logged < s < logged + STEPS for s in seen[before:])  # they read while it wrote
    alone, watched_median = statistics.median(alone), statistics.median(watched)
    assert watched_median < 3 * alone + 0.005, f"median step write {watched_median:.4f}s watched, {alone:.4f}s alone"
    assert max(watched) < 1.0  # never a wait on a lock (busy_timeout would make it seconds)


def _catch(errors, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # reported by the test
        errors.append(e)
