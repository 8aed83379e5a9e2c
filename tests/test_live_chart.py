"""grpo_core.dashboard.live_chart.spec: a charts.py figure in uPlot's terms carries every line's
values at its own steps, the fills, stacks, thresholds and change markers of the figure, and
nothing the figure did not draw. (The element in a real browser: tests/test_browser_live_chart.py.)"""
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from grpo_core.analysis import charts
from grpo_core.analysis.downsample import envelope_names
from grpo_core.dashboard import live_chart, live_view
from grpo_core.runs import names
from tests.helpers_dashboard import series
from tests.test_charts import run  # noqa: F401  (the charts' 40-step run with two weight changes)


def _values(spec, label):
    """(steps, values) of one series as arrays (helpers_dashboard.series' points)."""
    points = np.array(series(spec, label), dtype=float).reshape(-1, 2)
    return points[:, 0], points[:, 1]


def test_every_live_chart_carries_each_traces_points_at_its_own_steps(run):
    wide = run.scalars_wide()
    figs = [(k, f) for k, f in charts.live_charts(wide, live_view.run_metrics(run.get_meta()), run.changes(),
                                                  smoothing=0.6) if f is not None]
    for key, fig in figs:
        spec = live_chart.spec(fig)
        assert json.loads(live_chart.encode(spec)) == spec  # what the element receives: plain JSON, no NaN
        assert spec["x"] == sorted(spec["x"]) and len(spec["y"]) == len(spec["series"]) == len(fig.data), key
        assert all(len(col) == len(spec["x"]) for col in spec["y"]), key
        for trace in fig.data:
            x, y = _values(spec, trace.name)
            finite = np.isfinite(np.asarray(trace.y, float))
            np.testing.assert_allclose(x, np.asarray(trace.x, float)[finite])
            np.testing.assert_allclose(y, np.asarray(trace.y, float)[finite], rtol=1e-5)
        assert spec["title"] == fig.layout.title.text
    ratio = live_chart.spec(dict(figs)["ratio"])
    assert ratio["y_range"] == [0, 1.05] and ratio["hlines"] == [
        {"y": 0.3, "colour": "#C0392B", "dash": "dash", "text": "healthy > 0.3"}]
    raw, line = (next(s for s in ratio["series"] if s["label"] == n) for n in ("per step (raw)", "per step"))
    assert raw["legend"] is False and raw["alpha"] < 1 and raw["group"] == line["group"] == "per step"
    np.testing.assert_allclose(_values(ratio, "per step")[1], charts.ema(wide[names.TRAINABLE_RATIO].to_numpy(), 0.6),
                               rtol=1e-5)


def test_change_markers_keep_their_step_label_and_what_changed(run):
    fig = charts.reward_chart(run.scalars_wide(), live_view.run_metrics(run.get_meta()), run.changes())
    marks = live_chart.spec(fig)["vlines"]
    assert [m["x"] for m in marks] == [12.0, 30.0]
    assert marks[1]["hover"].startswith("step 30") and "length=0.4" in marks[1]["hover"]
    assert marks[0]["label"] == charts.MARKER_LABELS["set_weights"]


def test_a_bins_minimum_and_maximum_stay_two_points():
    """A binned chart frame draws a bin's min and max at its mid step: both reach the chart."""
    low, high = envelope_names("v")
    df = pd.DataFrame({"v": [0.5, 0.2], low: [0.1, 0.2], high: [0.9, 0.2]}, index=[8, 24])
    fig = charts._figure(charts._series(df, "v", "v", "#123456", 0.0), "t", "y")
    x, y = _values(live_chart.spec(fig), "v (raw)")
    assert list(y) == [0.1, 0.9, 0.2] and x[0] == 8 and 8 < x[1] < 8.01 and x[2] == 24


def test_values_near_the_float_limits_reach_the_chart():
    """A smoothed stack decays through thousands of zero steps to subnormal values (the demo's
    flat-causes chart, every step drawn, at 12,000 steps: 5e-324); they are sent as 0, the rest to
    DIGITS digits, and the chart encodes (JSON refuses the NaN an overflowing scale made)."""
    v = np.array([0.123456789, 1e-300, 1e-310, 5e-324, -1e-320, 1.5e300, -2.0e-5])
    fig = go.Figure(go.Scatter(x=np.arange(len(v)), y=v, mode="lines", name="v"))
    chart = json.loads(live_chart.encode(live_chart.spec(fig)))
    _, y = _values(chart, "v")
    assert list(y) == pytest.approx([0.123457, 1e-300, 0.0, 0.0, 0.0, 1.5e300, -2.0e-5], rel=1e-12, abs=0.0)


def test_stacked_causes_are_running_sums_listed_top_first():
    df = pd.DataFrame({n: [1.0, 2.0] for n in list(names.FLAT_CAUSES.values())[:3]}, index=[0, 1])
    fig = charts.flat_causes_chart(df)
    spec = live_chart.spec(fig)
    labels = [s["label"] for s in spec["series"]]
    assert labels == [t.name for t in fig.data][::-1]
    assert spec["y"][0] == [3.0, 6.0] and spec["y"][-1] == [1.0, 2.0]  # the top band: the step's flat groups
    assert all(s["fill"].startswith("rgba(") for s in spec["series"])


def test_step_lines_markers_and_filled_areas_are_kept():
    df = pd.DataFrame({names.metric_weight("a"): [0.5, 0.7], names.GROUPS_SUBMITTED: [4.0, 4.0],
                       names.GROUPS_TRAINABLE: [1.0, 3.0], names.EVAL_REWARD: [0.2, np.nan]}, index=[0, 5])
    weights = live_chart.spec(charts.weights_chart(df, ["a"]))
    assert weights["series"][0]["step"] is True
    groups = live_chart.spec(charts.groups_chart(df))
    filled = {s["label"]: s["fill"] for s in groups["series"]}
    assert filled["trainable"] and not filled["submitted"] and groups["series"][-1]["dash"] == "dash"
    evaluation = live_chart.spec(charts.eval_chart(df))
    assert evaluation["series"][0]["points"] is True and evaluation["x"] == [0.0]
