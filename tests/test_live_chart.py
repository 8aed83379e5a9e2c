"""grpo_core.dashboard.live_chart.spec: a charts.py figure in uPlot's terms carries every line's
values at its own steps, the fills, stacks, thresholds and change markers of the figure, and
nothing the figure did not draw; encode's bytes decode to it. (The element in a real browser: tests/test_browser_live_chart.py.)"""
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from grpo_core.analysis import charts
from grpo_core.analysis.downsample import envelope_names
from grpo_core.dashboard import live_cache, live_chart, live_view
from grpo_core.runs import names
from tests.helpers_dashboard import series, synth_run
from tests import test_charts
from tests.test_live import _extend

run = test_charts.run  # a fixture: the charts' 40-step run with two weight changes


def _sent(fig) -> dict:
    """A figure as the element receives it: spec, encoded, decoded."""
    return live_chart.decode(live_chart.encode(live_chart.spec(fig)))


def _values(spec, label):
    """(steps, values) of one series as arrays (helpers_dashboard.series' points)."""
    points = np.array(series(spec, label), dtype=float).reshape(-1, 2)
    return points[:, 0], points[:, 1]


def test_every_live_chart_carries_each_traces_points_at_its_own_steps(run):
    wide = run.scalars_wide()
    figs = [(k, f) for k, f in charts.live_charts(wide, live_view.run_metrics(run.get_meta()), run.changes(),
                                                  smoothing=0.6) if f is not None]
    for key, fig in figs:
        spec = _sent(fig)
        assert spec["x"] == sorted(spec["x"]) and len(spec["y"]) == len(spec["series"]) == len(fig.data), key
        assert all(len(col) == len(spec["x"]) for col in spec["y"]), key
        for trace in fig.data:
            x, y = _values(spec, trace.name)
            finite = np.isfinite(np.asarray(trace.y, float))
            np.testing.assert_allclose(x, np.asarray(trace.x, float)[finite])
            np.testing.assert_allclose(y, np.asarray(trace.y, float)[finite], rtol=1e-5)
        assert spec["title"] == fig.layout.title.text
    ratio = _sent(dict(figs)["ratio"])
    assert ratio["y_range"] == [0, 1.05] and ratio["hlines"] == [
        {"y": 0.3, "colour": "#C0392B", "dash": "dash", "text": "healthy > 0.3"}]
    raw, line = (next(s for s in ratio["series"] if s["label"] == n) for n in ("per step (raw)", "per step"))
    assert raw["legend"] is False and raw["alpha"] < 1 and raw["group"] == line["group"] == "per step"
    np.testing.assert_allclose(_values(ratio, "per step")[1], charts.ema(wide[names.TRAINABLE_RATIO].to_numpy(), 0.6),
                               rtol=1e-5)


def test_the_live_page_draws_the_plain_dicts_as_the_figures(run):
    """The live page builds each chart's plain dict (charts.live_charts(plain=True)), no plotly
    Figure: the element receives the same bytes as from the Figure of the same chart."""
    args = (run.scalars_wide(), live_view.run_metrics(run.get_meta()), run.changes())
    figures = charts.live_charts(*args, smoothing=0.6)
    plain = charts.live_charts(*args, smoothing=0.6, plain=True)
    assert [k for k, _ in plain] == [k for k, _ in figures]
    for (key, fig), (_, d) in zip(figures, plain):
        assert (fig is None) == (d is None), key
        if fig is not None:
            assert isinstance(d, dict) and not isinstance(d, go.Figure), key
            plain, figure = live_chart.spec(d), live_chart.spec(fig)
            assert plain["token"] != figure["token"]  # each chart made is a version of its own
            assert live_chart.encode({**plain, "token": 0}) == live_chart.encode({**figure, "token": 0}), key


def test_change_markers_keep_their_step_label_and_what_changed(run):
    fig = charts.reward_chart(run.scalars_wide(), live_view.run_metrics(run.get_meta()), run.changes())
    marks = _sent(fig)["vlines"]
    assert [m["x"] for m in marks] == [12.0, 30.0]
    assert marks[1]["hover"].startswith("step 30") and "length=0.4" in marks[1]["hover"]
    assert marks[0]["label"] == charts.MARKER_LABELS["set_weights"]


def test_a_bins_minimum_and_maximum_stay_two_points():
    """A binned chart frame draws a bin's min and max at its mid step: both reach the chart."""
    low, high = envelope_names("v")
    df = pd.DataFrame({"v": [0.5, 0.2], low: [0.1, 0.2], high: [0.9, 0.2]}, index=[8, 24])
    fig = charts._figure(charts._series(df, "v", "v", "#123456", 0.0), "t", "y")
    x, y = _values(_sent(fig), "v (raw)")
    assert list(y) == pytest.approx([0.1, 0.9, 0.2], rel=1e-7) and x[0] == 8 and 8 < x[1] < 8.01 and x[2] == 24


def test_values_near_the_float_limits_reach_the_chart():
    """Values are sent as float32 (7 digits, more than a chart or its legend shows): a smoothed stack
    decaying through thousands of zero steps to subnormal values (the demo's flat-causes chart, every
    step drawn, at 12,000 steps: 5e-324) arrives as 0. A chart with a value float32 cannot hold is
    sent as float64, exactly. An infinite value is no point (a gap), as a missing one."""
    v = np.array([0.123456789, 1e-300, 1e-310, 5e-324, -1e-320, 3.0e38, -2.0e-5, np.inf, np.nan])
    _, y = _values(_sent(go.Figure(go.Scatter(x=np.arange(len(v)), y=v, mode="lines", name="v"))), "v")
    assert list(y) == pytest.approx([0.123456789, 0.0, 0.0, 0.0, 0.0, 3.0e38, -2.0e-5], rel=1e-7, abs=0.0)
    huge = np.array([0.123456789, 1e-300, 1.5e300])
    _, y = _values(_sent(go.Figure(go.Scatter(x=np.arange(3), y=huge, mode="lines", name="v"))), "v")
    assert list(y) == list(huge)


def test_the_bytes_hold_the_columns_as_floats_after_an_aligned_header():
    """What assets/live_chart.js reads: a uint32 header length, the JSON header, padding, the steps
    as float64 at a multiple of 8, then each line's float32 values."""
    import json
    import struct
    fig = go.Figure([go.Scatter(x=[1, 2, 3], y=[0.5, np.nan, 1.5], mode="lines", name="a"),
                     go.Scatter(x=[2], y=[7.0], mode="lines", name="b")])
    data = live_chart.encode(live_chart.spec(fig))
    (size,) = struct.unpack_from("<I", data)
    head = json.loads(data[4:4 + size])
    assert (head["n"], head["lines"], head["dtype"]) == (3, 2, "f4") and "x" not in head and "y" not in head
    at = 4 + size + (-(4 + size) % 8)
    assert at % 8 == 0 and len(data) == at + 3 * 8 + 2 * 3 * 4
    assert np.frombuffer(data, "<f8", 3, at).tolist() == [1.0, 2.0, 3.0]
    np.testing.assert_array_equal(np.frombuffer(data, "<f4", 6, at + 24), [0.5, np.nan, 1.5, np.nan, 7.0, np.nan])


def test_stacked_causes_are_running_sums_listed_top_first():
    df = pd.DataFrame({n: [1.0, 2.0] for n in list(names.FLAT_CAUSES.values())[:3]}, index=[0, 1])
    fig = charts.flat_causes_chart(df)
    spec = _sent(fig)
    labels = [s["label"] for s in spec["series"]]
    assert labels == [t.name for t in fig.data][::-1]
    assert spec["y"][0] == [3.0, 6.0] and spec["y"][-1] == [1.0, 2.0]  # the top band: the step's flat groups
    assert all(s["fill"].startswith("rgba(") for s in spec["series"])


def test_step_lines_markers_and_filled_areas_are_kept():
    df = pd.DataFrame({names.metric_weight("a"): [0.5, 0.7], names.GROUPS_SUBMITTED: [4.0, 4.0],
                       names.GROUPS_TRAINABLE: [1.0, 3.0], names.EVAL_REWARD: [0.2, np.nan]}, index=[0, 5])
    weights = _sent(charts.weights_chart(df, ["a"]))
    assert weights["series"][0]["step"] is True
    groups = _sent(charts.groups_chart(df))
    filled = {s["label"]: s["fill"] for s in groups["series"]}
    assert filled["trainable"] and not filled["submitted"] and groups["series"][-1]["dash"] == "dash"
    evaluation = _sent(charts.eval_chart(df))
    assert evaluation["series"][0]["points"] is True and evaluation["x"] == [0.0]


# ---- a refresh sends the rows a page lacks ------------------------------------------------------
def _charts(state) -> dict:
    """The live page's chart specs of a LiveState's version (as pages/live.py builds them)."""
    figs = charts.live_charts(live_view.chart_frame(state), state.metrics, state.changes,
                              live_view.health_config(state.meta), None, smoothing=0.6, plain=True)
    return {key: chart for key, chart in live_chart.specs(figs) if chart is not None}


def test_a_page_following_a_growing_run_holds_each_whole_chart_from_the_rows_it_lacked(runs_dir, monkeypatch):
    """Each version's update, applied to what the element held (live_chart.apply, what
    assets/live_chart.js does), is that version's whole chart; a new step sends its rows only
    (the smoothed lines do not change before it); a fold into bins and the bins' widening send
    the rows from the first bin they changed."""
    monkeypatch.setattr(live_view, "RECENT_STEPS", 10)
    monkeypatch.setattr(live_view, "MAX_BINS", 8)
    store = synth_run(runs_dir, "r", 5, steps_total=400)
    state = live_view.load(store.run_dir)
    sent, held = {}, {}
    appended = folded = widened = 0
    rebinned = False  # the last load made the first bins or widened them: every row changed
    for start in range(6, 200, 3):
        before = {key: len(chart["x"]) for key, chart in held.items()}
        for key, chart in _charts(state).items():
            sent[key] = live_chart.update(chart, sent.get(key))
            received = live_chart.decode(sent[key].data)
            held[key] = live_chart.apply(held.get(key), received)
            whole = live_chart.decode(live_chart.encode(chart))
            assert held[key] is not None, key
            assert (held[key]["x"], held[key]["y"]) == (whole["x"], whole["y"]), (key, start)
            if key in before and not rebinned:  # part of the chart at most
                assert received["keep"] > 0 and len(sent[key].data) < len(live_chart.encode(chart)), (key, start)
                appended += received["keep"] == before[key]
        bins = (len(state.bin_sum), state.bin_size)
        _extend(store, start, 3, steps_total=400)
        live_view.load(store.run_dir, state)
        folded += len(state.bin_sum) != bins[0]
        rebinned = bins[0] == 0 < len(state.bin_sum) or state.bin_size != bins[1]
        widened += state.bin_size != bins[1]
    assert widened >= 3 and folded >= 5  # the run went through folds and widened bins
    assert appended > len(held) * 30  # most versions appended rows and changed none before them


def test_viewers_that_hold_the_same_version_are_sent_one_update(runs_dir, monkeypatch):
    """The bytes that take an element from the version it holds to the chart's depend on the two
    versions alone: through live_cache.chart_update (the page's memo) they are made once for every
    viewer that holds the same version, and each viewer's element still ends up with the chart."""
    live_cache.clear()
    store = synth_run(runs_dir, "r", 30, steps_total=400)
    state = live_view.load(store.run_dir)
    made = []
    real = live_chart._update
    monkeypatch.setattr(live_chart, "_update", lambda chart, sent: made.append(chart["token"]) or real(chart, sent))

    def refresh(viewers: list[dict], drawn: list[dict], version: dict):
        for held, shown in zip(viewers, drawn):
            for key, chart in version.items():
                held[key] = live_chart.update(chart, held.get(key), lambda k, fn: live_cache.chart_update(store.run_dir, k, fn))
                shown[key] = live_chart.apply(shown.get(key), live_chart.decode(held[key].data))
                whole = live_chart.decode(live_chart.encode(chart))
                assert (shown[key]["x"], shown[key]["y"]) == (whole["x"], whole["y"]), key
    first = _charts(state)
    viewers, drawn = [{}, {}], [{}, {}]
    refresh(viewers, drawn, first)  # two new pages: the whole charts, made once
    assert len(made) == len(first) and all(viewers[0][k] is viewers[1][k] for k in first)
    _extend(store, 31, 3, steps_total=400)
    second = _charts(live_view.load(store.run_dir, state))
    refresh(viewers, drawn, second)  # both held the first version: one update per chart
    assert len(made) == 2 * len(first) and all(viewers[0][k] is viewers[1][k] for k in second)
    assert all(0 < live_chart.decode(viewers[0][k].data)["keep"] for k in second)
    late, late_drawn = [{}], [{}]
    refresh(late, late_drawn, second)  # a page opened now: the whole second version, made once more
    assert len(made) == 3 * len(first) and set(made[-len(first):]) == {c["token"] for c in second.values()}
    live_cache.clear()


def test_an_update_for_data_the_element_does_not_hold_asks_for_the_whole_chart():
    def chart(n):
        return live_chart.spec(go.Figure(go.Scatter(x=np.arange(n), y=np.sin(np.arange(n)), mode="lines", name="s")))
    first = live_chart.update(chart(10), None)
    assert live_chart.update(first.chart, first) is first  # the same chart: the same bytes, no redraw
    second = live_chart.update(chart(12), first)
    received = live_chart.decode(second.data)
    assert (received["keep"], received["base"], len(received["x"])) == (10, first.token, 2)
    assert live_chart.apply(None, received) is None  # a new element (a reloaded page) holds nothing
    stale = {**live_chart.decode(first.data), "token": first.token + 1}
    assert live_chart.apply(stale, received) is None  # it holds other data (an update lost on the way)
    held = live_chart.apply(live_chart.decode(first.data), received)
    assert held["x"] == list(map(float, range(12))) and held["token"] == second.token
    other = live_chart.spec(go.Figure(go.Scatter(x=np.arange(12), y=np.arange(12.0), mode="lines", name="t")))
    assert live_chart.decode(live_chart.update(other, second).data)["keep"] == 0  # other lines: whole


def test_the_charts_element_is_sent_each_charts_rows_it_lacks_in_one_message(monkeypatch):
    """pack's bytes name every chart in the order drawn, and hold the bytes of the charts sent
    something, one after another: whole at first, the rows a chart lacks once it holds a version,
    nothing for a chart it holds; a chart forgotten (the page asked for it whole) is sent whole."""
    def chart(name, n):
        return live_chart.spec(go.Figure(go.Scatter(x=np.arange(n), y=np.cos(np.arange(n)), mode="lines", name=name)))
    held, sent = {}, []  # the element's (key, data) at each draw
    monkeypatch.setattr(live_chart, "_components", lambda: (None, lambda data, key, on_resend_change: sent.append((key, data))))
    first = [("a", chart("a", 10)), ("b", chart("b", 20))]
    size = live_chart.draw_charts(first, "charts", held)
    entries = live_chart.unpack(sent[-1][1])
    assert size == len(sent[-1][1]) and sent[-1][0] == "charts"
    assert [e["key"] for e in entries] == ["a", "b"] and [e["token"] for e in entries] == [c["token"] for _, c in first]
    assert [live_chart.decode(e["data"])["x"] for e in entries] == [list(map(float, range(n))) for n in (10, 20)]
    live_chart.draw_charts(first, "charts", held)  # the same versions: nothing but the directory
    assert [e["data"] for e in live_chart.unpack(sent[-1][1])] == [None, None] and len(sent[-1][1]) < 100
    second = [("a", chart("a", 12)), first[1]]
    live_chart.draw_charts(second, "charts", held)
    a, b = live_chart.unpack(sent[-1][1])
    assert (live_chart.decode(a["data"])["keep"], len(live_chart.decode(a["data"])["x"])) == (10, 2)
    assert b["data"] is None and b["token"] == first[1][1]["token"]
    live_chart.forget(held, ["b"])  # the page asked for b whole
    live_chart.draw_charts(second, "charts", held)
    a, b = live_chart.unpack(sent[-1][1])
    assert a["data"] is None and live_chart.decode(b["data"])["keep"] == 0
    live_chart.forget(held, None)  # asked without naming the charts: every chart whole
    assert held == {}
