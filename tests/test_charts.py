"""grpo_core.analysis.charts: figures carry the store's numbers, validate against plotly's schema,
mark every applied change, and say "no data" (None) instead of drawing empty charts."""
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from grpo_core.analysis import charts
from grpo_core.dashboard import live_view
from grpo_core.runs import names
from tests.helpers_dashboard import synth_run

NEW_W = {"answer_f1": 0.5, "exact": 0.3, "citation": 0.1, "format": 0.05, "length": 0.05}


@pytest.fixture
def run(runs_dir):
    store = synth_run(runs_dir, "r", 40, changes={12: NEW_W, 30: {**NEW_W, "length": 0.4}})
    yield store
    store.close()


def _trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_every_live_chart_is_valid_plotly_and_carries_the_store_values(run, monkeypatch):
    monkeypatch.setattr(charts, "VALIDATE", True)  # plotly's validators check every property
    wide = run.scalars_wide()
    figs = dict(charts.live_charts(wide, live_view.run_metrics(run.get_meta()), run.changes(), smoothing=0.6))
    assert figs.pop("eval") is None  # the run evaluated nothing (eval.every = 0)
    assert figs.pop("sampler") is None  # sampled natively: no sampler/trainer mismatch logged
    assert figs.pop("flat") is None  # synthetic steps log no flat-group causes (tests/test_flat_causes.py)
    assert figs.pop("collapse") is None  # nor a collapse check (tests/test_collapse_check.py)
    assert set(figs) == {"ratio", "groups", "metric_std", "reward", "reward_std", "phantom"}
    assert all(isinstance(f, go.Figure) for f in figs.values())
    # A measured series: its raw values as a faint line ("<label> (raw)"), its EMA as the line ("<label>").
    for key, label, name in (("ratio", "per step", names.TRAINABLE_RATIO),
                             ("groups", "trainable", names.GROUPS_TRAINABLE),
                             ("metric_std", "length", names.metric_group_std("length")),
                             ("reward", "total (weighted)", names.REWARD),
                             ("reward_std", "mean group reward std", names.REWARD_STD)):
        raw, line = _trace(figs[key], f"{label} (raw)"), _trace(figs[key], label)
        np.testing.assert_array_equal(raw.x, wide.index.to_numpy())
        np.testing.assert_allclose(raw.y, wide[name].to_numpy())
        assert raw.mode == "lines" and raw.opacity < 1 and raw.showlegend is False and line.mode == "lines"
        np.testing.assert_allclose(line.y, charts.ema(wide[name].to_numpy(), 0.6))
    # Running totals and settings are drawn as they are, no raw points under them.
    np.testing.assert_allclose(_trace(figs["ratio"], "cumulative").y, wide[names.CUM_TRAINABLE_RATIO].to_numpy())
    np.testing.assert_allclose(_trace(figs["groups"], "submitted").y, wide[names.GROUPS_SUBMITTED].to_numpy())
    assert [t.name for t in figs["metric_std"].data if t.showlegend is not False] == \
        ["answer_f1", "exact", "citation", "format", "length"]


def test_smoothing_zero_draws_the_raw_values_as_the_line(run):
    wide = run.scalars_wide()
    fig = charts.ratio_chart(wide, None, smoothing=0.0)
    np.testing.assert_allclose(_trace(fig, "per step").y, wide[names.TRAINABLE_RATIO].to_numpy())


def test_ema_is_wandbs_debiased_ema():
    y = np.array([1.0, 0.0, np.nan, 1.0, 1.0])
    s = 0.5
    out = charts.ema(y, s)
    # by hand: last_n = s * last_{n-1} + (1 - s) * y_n, shown as last_n / (1 - s^n), NaN skipped
    want = [0.5 / 0.5, 0.25 / 0.75, np.nan, 0.625 / 0.875, 0.8125 / 0.9375]
    np.testing.assert_allclose(out, want)
    np.testing.assert_allclose(charts.ema(y, 0.0), y)  # 0: the raw series
    const = charts.ema(np.full(50, 0.3), 0.99)  # debiased: a constant stays itself from the first point
    np.testing.assert_allclose(const, 0.3)
    assert np.isnan(charts.ema([np.nan, np.nan], 0.9)).all() and len(charts.ema([], 0.9)) == 0
    with pytest.raises(ValueError):
        charts.ema(y, 1.0)


def test_the_eval_chart_is_valid_plotly_through_the_evaluated_steps_only(monkeypatch):
    monkeypatch.setattr(charts, "VALIDATE", True)
    wide = pd.DataFrame({names.REWARD: [0.1, 0.2, 0.3, 0.4], names.EVAL_REWARD: [0.5, np.nan, 0.6, np.nan],
                         names.EVAL_PASS: [0.25, np.nan, 0.5, np.nan]}, index=pd.Index([1, 2, 3, 4], name="step"))
    fig = charts.eval_chart(wide)
    assert [t.name for t in fig.data] == ["held-out reward", "held-out pass@1"]
    np.testing.assert_array_equal(fig.data[1].x, [1, 3])
    np.testing.assert_allclose(fig.data[1].y, [0.25, 0.5])


def test_unvalidated_fast_path_builds_the_same_figure(run, monkeypatch):
    wide, changes, metrics = run.scalars_wide(), run.changes(), live_view.run_metrics(run.get_meta())
    fast = [_plain(f.to_dict()) for _, f in charts.live_charts(wide, metrics, changes) if f is not None]
    monkeypatch.setattr(charts, "VALIDATE", True)
    slow = [_plain(f.to_dict()) for _, f in charts.live_charts(wide, metrics, changes) if f is not None]
    assert fast == slow


def _plain(x):
    """Numbers as Python floats, None-valued keys dropped: what the browser gets either way."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.generic, int, float)) and not isinstance(x, bool):
        return float(x)
    return x


def test_every_chart_marks_every_applied_change(run):
    figs = charts.live_charts(run.scalars_wide(), live_view.run_metrics(run.get_meta()), run.changes())
    for key, fig in [(k, f) for k, f in figs if k not in ("eval", "sampler", "flat", "collapse")]:  # not logged
        marks = [s for s in fig.layout.shapes if (s.name or "").startswith("change:")]
        assert [(m.x0, m.name) for m in marks] == [(12, "change:set_weights"), (30, "change:set_weights")], key
        notes = [a for a in fig.layout.annotations if (a.name or "").startswith("change:")]
        assert "length=0.4" in notes[1].hovertext and notes[1].hovertext.startswith("step 30")


def test_threshold_and_difficulty_markers_have_their_own_label():
    changes = pd.DataFrame({"step": [5, 9], "kind": ["set_threshold", "set_difficulty"],
                            "request": [{"min_group_std": 0.05}, {"level": 3}], "source": ["ui", "ui"],
                            "message": ["", ""]})
    shapes, notes = charts.marker_specs(changes)
    assert [s["x0"] for s in shapes] == [5, 9]
    assert [n["text"] for n in notes] == ["thr", "lvl"]
    assert "min_group_std 0.05" in notes[0]["hovertext"] and "difficulty level 3" in notes[1]["hovertext"]


def test_pause_and_stop_are_not_drawn_unless_asked():
    changes = pd.DataFrame({"step": [4, 8], "kind": ["pause", "set_weights"], "request": [{}, {"weights": {}}],
                            "source": ["ui", "ui"], "message": ["", ""]})
    assert [s["x0"] for s in charts.marker_specs(changes)[0]] == [8]
    assert [s["x0"] for s in charts.marker_specs(changes, kinds=None)[0]] == [4, 8]


def test_add_markers_on_a_figure_built_elsewhere(run):
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    charts.add_markers(fig, run.changes())
    assert [s.x0 for s in fig.layout.shapes] == [12, 30]


def test_the_reports_figures_are_valid_plotly_with_the_tables_numbers_and_the_ledgers_changes(run, monkeypatch):
    """The analysis page's and the report's figures come from here too: built from a run's
    tables, checked against plotly's schema, each setting change marked with its ledger text."""
    from grpo_core.analysis import ledger, prompt_history, run_data, run_tables
    monkeypatch.setattr(charts, "VALIDATE", True)
    data = run_data.load_run(run)
    steps = run_tables.steps_table(data)
    changes = ledger.change_ledger(data, steps)
    ratio = charts.trainability_chart(steps, changes)
    np.testing.assert_allclose(_trace(ratio, "trainable ratio (step)").y, steps["ratio"].to_numpy())
    np.testing.assert_allclose(_trace(ratio, "rolling ratio").y, steps["ratio_rolling"].to_numpy())
    notes = [a for a in ratio.layout.annotations if (a.name or "").startswith("change:")]
    assert [a.x for a in notes] == changes["step"].tolist() == [12, 30]
    assert notes[1].hovertext == f"step 30: {changes['change'].iloc[1]}"  # the ledger's old -> new
    reward = charts.reward_trend_chart(steps, run_tables.reward_trend(steps), changes)
    assert [t.name for t in reward.data] == ["reward", "mean group reward std", "OLS fit"]
    bottlenecks = run_tables.bottlenecks(data)
    fig = charts.bottlenecks_chart(bottlenecks)
    np.testing.assert_allclose(fig.data[0].y, bottlenecks["uniform_fraction"].to_numpy())
    assert fig.layout.barmode == "group"
    compare = charts.compare_ratio_chart({"a": steps["ratio_rolling"], "b": steps["ratio_rolling"] / 2}, 20)
    assert [t.name for t in compare.data] == ["a", "b"]
    assert charts.compare_eval_chart({"a": pd.DataFrame()}) is None
    rates = charts.prompt_rates_chart(prompt_history.load(run))
    assert rates.data[0].type == "histogram"


def test_imported_run_shape_charts_what_it_has_and_nothing_else():
    # A TRL import: reward, reward_std, frac_reward_zero_std only; no group counts, no per-metric stds.
    wide = pd.DataFrame({names.REWARD: [0.1, 0.2, 0.3], names.REWARD_STD: [0.3, 0.2, 0.1],
                         names.FRAC_REWARD_ZERO_STD: [0.25, 0.5, 0.75]}, index=pd.Index([10, 20, 30], name="step"))
    figs = dict(charts.live_charts(wide, [], None))
    assert figs["groups"] is None and figs["metric_std"] is None and figs["phantom"] is None
    np.testing.assert_allclose(_trace(figs["ratio"], "per step (1 − frac_reward_zero_std) (raw)").y,
                               [0.75, 0.5, 0.25])  # 1 - frac_reward_zero_std
    assert figs["reward_std"] is not None and figs["reward"] is not None


def test_the_sampler_chart_draws_the_mismatch_and_its_alert_line(monkeypatch):
    monkeypatch.setattr(charts, "VALIDATE", True)
    wide = pd.DataFrame({names.SAMPLER_LOGP_DIFF_MEAN: [1e-6, 2e-6, 0.3], names.SAMPLER_LOGP_DIFF_MAX: [1e-5, 1e-5, 2.0]},
                        index=pd.Index([1, 2, 3], name="step"))
    fig = dict(charts.live_charts(wide, [], None))["sampler"]
    np.testing.assert_allclose(_trace(fig, "mean |log-prob difference| (raw)").y, [1e-6, 2e-6, 0.3])
    np.testing.assert_allclose(_trace(fig, "max |log-prob difference| (raw)").y, [1e-5, 1e-5, 2.0])
    assert [s.y0 for s in fig.layout.shapes if s.name == "threshold"] == [0.1]


def test_no_data_no_figure():
    empty = pd.DataFrame(index=pd.Index([], name="step"))
    assert all(f is None for _, f in charts.live_charts(empty, ["a"], None))
    nan_only = pd.DataFrame({names.TRAINABLE_RATIO: [np.nan]}, index=pd.Index([1], name="step"))
    assert charts.ratio_chart(nan_only) is None


def test_health_thresholds_are_drawn_from_the_run_config(run):
    cfg = live_view.health_config(run.get_meta())
    cfg.min_trainable_ratio = 0.42
    fig = charts.ratio_chart(run.scalars_wide(), None, cfg.min_trainable_ratio)
    line = [s for s in fig.layout.shapes if s.name == "threshold"]
    assert line[0].y0 == 0.42
    assert "0.42" in fig.layout.annotations[0].text


def test_weights_chart_steps_at_each_change(run):
    fig = charts.weights_chart(run.scalars_wide(), live_view.run_metrics(run.get_meta()), run.changes())
    length = _trace(fig, "length")
    y = dict(zip(length.x, length.y))
    assert y[11] == pytest.approx(0.1) and y[12] == pytest.approx(0.05) and y[30] == pytest.approx(0.4)


def test_store_changes_and_live_changes_draw_identically(run):
    st = live_view.load(run.run_dir)
    a = charts.ratio_chart(run.scalars_wide(), run.changes())
    b = charts.ratio_chart(run.scalars_wide(), st.changes)
    assert a.layout.shapes == b.layout.shapes


def test_chart_help_covers_every_live_chart():
    keys = [k for k, _ in charts.live_charts(pd.DataFrame(index=pd.Index([], name="step")), [], None)]
    assert set(keys) == set(charts.CHART_HELP)


# ---- the pilot page's figures --------------------------------------------------------------------
@pytest.fixture
def coin_pilot(runs_dir):
    """A finished pilot: `exact` a coin at p = 0.9 with G = 2 (the plan raises G), `format` always 1,
    `f1` a continuous score that varies in every group."""
    from grpo_core.analysis.pilot import pilot_summary
    from tests.test_pilot import bernoulli_scores, make_pilot_store
    rng = np.random.default_rng(7)
    sc = bernoulli_scores(rng, 4, 32, 2, [0.9, 0.9, 0.5])
    sc[..., 1] = 1.0
    sc[..., 2] = rng.random(sc.shape[:3])
    make_pilot_store("pilot-coin", sc, ["exact", "format", "f1"], {"exact": 0.7, "format": 0.2, "f1": 0.1},
                     config={"grpo": {"group_size": 2}})
    return pilot_summary("pilot-coin", target=0.3)


def test_pilot_histograms_one_panel_per_metric_with_the_pilot_scores(coin_pilot):
    s = coin_pilot
    fig = charts.pilot_histograms(s.values, s.metrics)
    assert isinstance(fig, go.Figure) and fig.layout.height == 260
    assert sorted(a.text for a in fig.layout.annotations) == ["exact", "f1", "format"]  # "metric=exact" shortened
    scores = np.concatenate([np.asarray(t.x, dtype=float) for t in fig.data])
    np.testing.assert_array_equal(np.sort(scores), np.sort(s.values[s.metrics].to_numpy().ravel("F")))


def test_pilot_metric_std_marks_the_uniform_metric_red(coin_pilot):
    t = coin_pilot.metric_table
    fig = charts.pilot_metric_std(t)
    by_uniform = {tr.name: tr for tr in fig.data}
    assert set(by_uniform) == {"True", "False"}
    for uniform in (True, False):
        tr = by_uniform[str(uniform)]
        assert tr.marker.color == charts.UNIFORM_COLOURS[uniform]
        assert list(tr.x) == list(t.index[t["uniform"] == uniform])
        np.testing.assert_allclose(tr.y, t.loc[t["uniform"] == uniform, "within_group_std"])
    assert "format" in by_uniform["True"].x and "f1" in by_uniform["False"].x


def test_pilot_planner_curve_target_measured_point_and_the_g_needed(coin_pilot):
    plan = coin_pilot.plans[0]
    fig = charts.pilot_planner(plan, coin_pilot.target)
    curve, per_prompt, point = fig.data  # the pooled curve, each prompt at its own rate, the pilot
    np.testing.assert_allclose(curve.y, plan.curve["p_trainable"])
    np.testing.assert_allclose(per_prompt.y, plan.curve["p_trainable_prompts"])
    assert (list(point.x), list(point.y)) == ([plan.current_g], [plan.measured_vary])
    lines = {(s.type, s.x0 if s.x0 == s.x1 else None, s.y0 if s.y0 == s.y1 else None) for s in fig.layout.shapes}
    assert ("line", None, 0.3) in lines and ("line", plan.g_needed, None) in lines
    assert {a.text for a in fig.layout.annotations} == {"target 0.30", f"G = {plan.g_needed}"}
    assert tuple(fig.layout.yaxis.range) == (0, 1.02)


def test_the_raw_line_and_the_smoothed_line_cover_every_step_below_the_cap():
    wide = pd.DataFrame({names.TRAINABLE_RATIO: np.linspace(0, 1, 1200)}, index=pd.Index(range(1, 1201), name="step"))
    fig = charts.ratio_chart(wide, None, smoothing=0.5)
    raw, line = _trace(fig, "per step (raw)"), _trace(fig, "per step")
    assert 1200 < charts.MAX_POINTS  # beyond it both are cut by min/max per bucket (tests/test_downsample.py)
    np.testing.assert_array_equal(raw.x, np.arange(1, 1201))
    np.testing.assert_array_equal(line.x, np.arange(1, 1201))
