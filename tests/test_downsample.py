"""grpo_core.analysis.downsample (min/max per bucket) and what it keeps on the live page: a spike or
a dip inside old, binned history stays on the chart (live_view's bins keep min and max, through the
first SQLite read, the folds and the doubling), and every step of a run ("every step" view) draws
cut to charts.MAX_POINTS with its extremes, on real run stores."""
import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import charts
from grpo_core.analysis.downsample import envelope_names, m4
from grpo_core.dashboard import live_view
from grpo_core.runs.config import RunConfig
from grpo_core.runs.names import GROUPS_SUBMITTED, GROUPS_TRAINABLE, REWARD, TRAINABLE_RATIO
from grpo_core.runs.store import RunStore

DIP, SPIKE = 333, 444  # the one step the ratio collapses to 0, the one step it reaches 1


# ---- m4 ------------------------------------------------------------------------------------------
def test_below_the_cap_the_series_comes_back_as_it_is():
    x, y = np.arange(10), np.array([1.0, np.nan, 3, 2, 5, 4, 0, 1, 2, 3])
    ox, oy = m4(x, y, 10)
    np.testing.assert_array_equal(ox, x)
    np.testing.assert_array_equal(oy, y)  # the NaN kept: a line breaks where it did
    assert ox.dtype == x.dtype  # integer steps stay integers


def test_a_one_step_spike_and_dip_and_both_ends_survive_a_50x_cut():
    rng = np.random.default_rng(0)
    y = 0.5 + 0.01 * rng.standard_normal(50_000)
    y[12_345], y[40_001] = 3.0, -2.0
    x = np.arange(50_000)
    ox, oy = m4(x, y, 1000)
    assert len(ox) <= 1000
    assert (ox[0], oy[0], ox[-1], oy[-1]) == (0, y[0], 49_999, y[-1])
    assert (12_345, 3.0) in zip(ox, oy) and (40_001, -2.0) in zip(ox, oy)
    assert np.all(np.diff(ox) > 0)  # in x order, each point once


@pytest.mark.parametrize("n, cap", [(1001, 1000), (5000, 7), (20_000, 4), (123_457, 2000)])
def test_never_more_than_the_cap_and_every_buckets_extremes_kept(n, cap):
    rng = np.random.default_rng(n)
    x = np.sort(rng.uniform(0, 1000, n))
    y = np.cumsum(rng.standard_normal(n))
    ox, oy = m4(x, y, cap)
    assert len(ox) <= cap
    kept = set(zip(ox, oy))
    assert kept <= set(zip(x, y))  # points of the series, none invented
    # The documented buckets: x's range cut into cap // 4 equal parts; each keeps its min and max.
    nb = cap // 4
    bucket = np.minimum(((x - x[0]) / (x[-1] - x[0]) * nb).astype(int), nb - 1)
    for b, part in pd.DataFrame({"x": x, "y": y, "b": bucket}).groupby("b"):
        lo, hi = part.loc[part["y"].idxmin()], part.loc[part["y"].idxmax()]
        assert (lo["x"], lo["y"]) in kept and (hi["x"], hi["y"]) in kept
        assert (part["x"].iloc[0], part["y"].iloc[0]) in kept and (part["x"].iloc[-1], part["y"].iloc[-1]) in kept


def test_nans_are_dropped_above_the_cap_and_never_win_an_extreme():
    y = np.sin(np.arange(10_000) / 50.0)
    y[::7] = np.nan
    y[5001] = -4.0
    ox, oy = m4(np.arange(10_000), y, 400)
    assert len(ox) <= 400 and np.isfinite(oy).all()
    assert (5001, -4.0) in zip(ox, oy)


def test_unsorted_x_is_drawn_in_x_order():
    rng = np.random.default_rng(1)
    x, y = np.arange(5000), rng.standard_normal(5000)
    order = rng.permutation(5000)
    sx, sy = m4(x, y, 200)
    ux, uy = m4(x[order], y[order], 200)
    np.testing.assert_array_equal(ux, sx)
    np.testing.assert_array_equal(uy, sy)


def test_a_cap_below_one_bucket_or_mismatched_lengths_is_refused():
    with pytest.raises(ValueError, match="at least 4"):
        m4(np.arange(10), np.arange(10), 3)
    with pytest.raises(ValueError, match="differ in length"):
        m4(np.arange(10), np.arange(9), 100)


# ---- the live page's binned history keeps its extremes ---------------------------------------------
def _ratio(step: int) -> float:
    return 0.0 if step == DIP else 1.0 if step == SPIKE else 0.5 + 0.05 * np.sin(step / 7.0)


def _log(store: RunStore, start: int, count: int):
    store.log_steps([(s, {TRAINABLE_RATIO: _ratio(s), REWARD: 0.1 * s}, None, None, ())
                     for s in range(start, start + count)])


def _store(runs_dir, steps: int) -> RunStore:
    store = RunStore.create("spiky", RunConfig().to_dict(), root=runs_dir)
    _log(store, 1, steps)
    return store


def _check_bins(st: live_view.LiveState, store: RunStore):
    """Each bin's min and max are those of the store's steps in it (nothing lost, nothing made up)."""
    raw = store.scalars_wide(names=[TRAINABLE_RATIO, REWARD])
    raw = raw[raw.index <= st.folded_upto]
    key = raw.index.to_numpy() // st.bin_size
    pd.testing.assert_frame_equal(st.bin_min[[TRAINABLE_RATIO, REWARD]], raw.groupby(key).min(),
                                  check_names=False, check_index_type=False)
    pd.testing.assert_frame_equal(st.bin_max[[TRAINABLE_RATIO, REWARD]], raw.groupby(key).max(),
                                  check_names=False, check_index_type=False)


def _assert_spikes_drawn(st: live_view.LiveState):
    frame = live_view.chart_frame(st)
    low, high = envelope_names(TRAINABLE_RATIO)
    assert len(frame) <= live_view.MAX_BINS + 2 * live_view.RECENT_STEPS
    old = frame[frame.index <= st.folded_upto]
    assert old[TRAINABLE_RATIO].min() > 0.3 and old[TRAINABLE_RATIO].max() < 0.7  # the means hide both
    assert old[low].min() == 0.0 and old[high].max() == 1.0  # the envelope does not
    assert frame.loc[frame.index > st.folded_upto, [low, high]].isna().all().all()  # raw rows: no envelope
    fig = charts.ratio_chart(frame, None, smoothing=0.6)
    raw = next(t for t in fig.data if t.name == "per step (raw)")
    half = st.bin_size / 2
    assert any(y == 0.0 and abs(x - DIP) <= half for x, y in zip(raw.x, raw.y))
    assert any(y == 1.0 and abs(x - SPIKE) <= half for x, y in zip(raw.x, raw.y))
    np.testing.assert_allclose(raw.y[-5:], [_ratio(s) for s in range(st.last_step - 4, st.last_step + 1)], rtol=1e-6)


def test_a_first_load_reads_each_bins_min_and_max_from_sqlite(runs_dir, monkeypatch):
    monkeypatch.setattr(live_view, "RECENT_STEPS", 10)
    monkeypatch.setattr(live_view, "MAX_BINS", 8)
    store = _store(runs_dir, 600)
    st = live_view.load(store.run_dir)
    assert st.bin_size == 128 and len(st.bin_min) <= live_view.MAX_BINS
    _check_bins(st, store)
    _assert_spikes_drawn(st)


def test_watching_a_run_folds_and_doubles_the_bins_with_their_extremes(runs_dir, monkeypatch):
    monkeypatch.setattr(live_view, "RECENT_STEPS", 10)
    monkeypatch.setattr(live_view, "MAX_BINS", 8)
    store = _store(runs_dir, 5)
    st = live_view.load(store.run_dir)
    for start in range(6, 600, 13):  # 13: folds cut bins in two, merged at the next fold
        _log(store, start, 13)
        live_view.load(store.run_dir, st)
        assert len(st.bin_min) <= live_view.MAX_BINS and len(st.bin_max) <= live_view.MAX_BINS
    assert st.bin_size >= 64  # the bins doubled several times
    _check_bins(st, store)
    _assert_spikes_drawn(st)


def test_charts_y_range_reaches_a_bins_maximum_not_only_the_means():
    low, high = envelope_names(GROUPS_TRAINABLE)
    frame = pd.DataFrame({GROUPS_SUBMITTED: [8.0, 8.0], GROUPS_TRAINABLE: [4.0, 4.0], low: [0.0, 3.0],
                          high: [20.0, 5.0]}, index=pd.Index([10.5, 30.5], name="step"))
    fig = charts.groups_chart(frame)
    assert fig.layout.yaxis.range[1] == pytest.approx(22.0)


# ---- every step, on request -------------------------------------------------------------------------
def test_raw_frame_reads_every_step_and_then_only_the_new_ones(runs_dir):
    store = _store(runs_dir, 300)
    names = [TRAINABLE_RATIO, REWARD]
    frame = live_view.raw_frame(store.run_dir, names)
    pd.testing.assert_frame_equal(frame, store.scalars_wide(names=names).astype(float), check_names=False)
    assert len(live_view.raw_frame(store.run_dir, names, since=290)) == 10
    _log(store, 301, 20)
    grown = live_view.raw_frame(store.run_dir, names, prev=frame)
    pd.testing.assert_frame_equal(grown, store.scalars_wide(names=names).astype(float), check_names=False)
    store.truncate_after(250)  # resumed from a checkpoint: steps 251.. redone with other values
    store.log_steps([(s, {TRAINABLE_RATIO: 0.9, REWARD: -1.0}, None, None, ()) for s in range(251, 261)])
    again = live_view.raw_frame(store.run_dir, names, prev=grown)
    pd.testing.assert_frame_equal(again, store.scalars_wide(names=names).astype(float), check_names=False)


def test_every_step_of_a_long_run_draws_cut_to_the_cap_with_its_extremes(runs_dir, monkeypatch):
    monkeypatch.setattr(charts, "MAX_POINTS", 200)
    store = _store(runs_dir, 2000)
    st = live_view.load(store.run_dir)
    frame = live_view.raw_frame(store.run_dir, st.names)
    assert len(frame) == 2000
    figs = [f for _, f in charts.live_charts(frame, st.metrics, None, smoothing=0.0) if f is not None]
    assert figs and all(len(t.x) <= 200 for f in figs for t in f.data)
    ratio = figs[0]
    for name in ("per step (raw)", "per step"):  # smoothing 0: the line is the raw series too
        t = next(t for t in ratio.data if t.name == name)
        pts = set(zip(t.x.tolist(), t.y.tolist()))
        assert (DIP, 0.0) in pts and (SPIKE, 1.0) in pts and t.x[0] == 1 and t.x[-1] == 2000
