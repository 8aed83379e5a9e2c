"""The app and its Runs / Live pages under Streamlit's AppTest, against real run stores:
one written by a real trainer run (once per session), live trainers started the way the
dashboard starts them, and special stores (imported, failed, unreadable) built directly."""
import ast
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.dashboard import live_chart, processes
from grpo_core.runs import names
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import (REPO, TRAINED_STEPS, app_test, live_chart_bytes, live_chart_entries,
                                     live_chart_messages, live_charts, series, synth_run, trained_run, wait_for)

APP = str(REPO / "app.py")
FIXTURE = Path(__file__).parent / "fixtures" / "trl" / "chaos-economy-trainer_state.json"
LIVE_CFG = {"grpo": {"steps": 3000, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
            "model": {"warm_start_steps": 0}, "log": {"progress": False, "checkpoint_every": 0}}


@pytest.fixture
def trained(tmp_path_factory, monkeypatch):
    """(runs_dir, run_id) of a finished real trainer run, shared by the session."""
    root, rid = trained_run(tmp_path_factory.getbasetemp())
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(root))
    return root, rid


def app(page: str | None = None, **state) -> AppTest:
    at = app_test()
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def texts(elements) -> list[str]:
    return [e.value for e in elements]


# ---- live page ------------------------------------------------------------------------------------
def test_live_page_shows_a_finished_real_run_once(trained):
    root, rid = trained
    at = app()
    with RunStore.open(root / rid, readonly=True) as s:
        last = s.scalars_wide(since_step=TRAINED_STEPS - 1).iloc[-1]
    m = metrics(at)
    assert m["Trainable ratio (cumulative)"] == f"{last[names.CUM_TRAINABLE_RATIO]:.0%}"
    assert m["Trainable ratio (step)"] == f"{last[names.TRAINABLE_RATIO]:.0%}"
    assert m["Groups trainable / submitted"] == (f"{int(last[names.CUM_GROUPS_TRAINABLE])} / "
                                                 f"{int(last[names.CUM_GROUPS_SUBMITTED])}")
    specs = live_charts(at)
    assert len(specs) == 7 and any(s["title"] == "Why groups were flat" for s in specs)
    ratio = next(s for s in specs if s["title"] == "Trainable ratio")
    # the per-step ratio as a faint raw line under its smoothed line, the cumulative ratio as is
    assert [t["label"] for t in ratio["series"]] == ["per step (raw)", "per step", "cumulative"]
    raw, line = ratio["series"][:2]
    assert not raw["points"] and not line["points"] and raw["alpha"] < 1 and not raw["legend"]
    assert series(ratio, "cumulative")[-1] == (last.name, pytest.approx(last[names.CUM_TRAINABLE_RATIO], rel=1e-5))
    assert any(f"{rid}" in md and "finished" in md for md in texts(at.markdown))
    assert [sl.label for sl in at.slider] == ["Chart smoothing"]  # nothing to steer on a finished run ...
    assert any("nothing to steer" in c for c in texts(at.caption))
    assert any(f"step {TRAINED_STEPS} of {TRAINED_STEPS}" in str(p.proto) for p in at.get("progress"))
    assert refreshes(at) == {}  # drawn once


def test_live_page_without_runs_offers_the_demo(monkeypatch, runs_dir):
    at = app()
    assert any("No run yet" in i for i in texts(at.info))
    started = synth_run(runs_dir, "demo-x", 3)
    monkeypatch.setattr(processes, "start_demo_if_idle", lambda root=None, overrides=None, which="builtin": ("demo-x", True))
    at.button(key="start_demo").click().run()
    assert at.session_state["run_id"] == "demo-x" and not at.exception
    assert len(live_charts(at)) == 6
    started.close()


def test_both_pages_offer_the_real_model_demo(monkeypatch, runs_dir):
    """The live page without runs and the Runs page start SmolLM2's demo (processes.DEMOS) by its name."""
    asked = []
    monkeypatch.setattr(processes, "start_demo_if_idle",
                        lambda root=None, overrides=None, which="builtin": asked.append(which) or ("demo-smollm2-x", True))
    at = app()
    at.button(key="start_demo_smollm2").click().run()
    assert asked == ["smollm2"] and not at.exception
    at = app("pages/runs.py")
    assert any("SmolLM2 learns sums" in c for c in texts(at.caption))
    at.button(key="start_demo_smollm2").click().run()
    assert asked == ["smollm2", "smollm2"] and not at.exception


def test_imported_run_says_what_it_lacks_instead_of_empty_charts(runs_dir):
    from grpo_core.integrations.importers import import_run
    rid = import_run("trl", FIXTURE.read_bytes(), FIXTURE.name, root=runs_dir)
    at = app()
    assert at.session_state["run_id"] == rid
    assert any("no what-if" in i and "no rollout inspector" in i for i in texts(at.info))
    assert [sl.key for sl in at.slider] == ["smoothing"] and "apply" not in [b.key for b in at.button]
    titles = [s["title"] for s in live_charts(at)]
    assert "Trainable ratio" in titles and "Groups submitted vs trainable" not in titles
    assert any(c.startswith("Not logged by this run:") for c in texts(at.caption))


@pytest.mark.slow
def test_sliders_what_if_apply_pending_applied_marker_with_a_real_trainer(runs_dir):
    rid = processes.start_run(LIVE_CFG, run_id="live", root=runs_dir)
    try:
        wait_for(lambda: (RunStore.open(runs_dir / rid, readonly=True).last_step() or 0) >= 2, 240,
                 what="two real steps")
        at = app()
        assert at.slider(key=f"w:{rid}:length").value == pytest.approx(0.1)
        before = metrics(at)
        assert any(k.startswith("What-if trainable ratio") for k in before)
        at.slider(key=f"w:{rid}:length").set_value(0.6).run()
        assert any("length=0.6" in c for c in texts(at.caption))  # the pending change, before any apply
        with RunStore.open(runs_dir / rid, readonly=True) as s:
            assert s.control().empty  # moving a slider sends nothing
        at.button(key="apply").click().run()
        assert not at.exception
        with RunStore.open(runs_dir / rid, readonly=True) as s:
            rows = s.control()
        assert len(rows) == 1 and rows.iloc[0]["kind"] == "set_weights" and rows.iloc[0]["source"] == "ui"
        assert rows.iloc[0]["payload"]["weights"] == {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2,
                                                      "format": 0.1, "length": 0.6}

        def applied():
            with RunStore.open(runs_dir / rid, readonly=True) as s:
                r = s.control().iloc[0]
            return int(r["applied_step"]) if r["status"] == "applied" else None
        step = wait_for(applied, 120, what="the trainer to apply the request")
        at.run()
        assert any(f"applied at step {step}" in md for md in texts(at.markdown))
        for spec in live_charts(at):
            assert step in [v["x"] for v in spec["vlines"]], spec["title"]
        wait_for(lambda: RunStore.open(runs_dir / rid, readonly=True).last_step() >= step, 120, what="step N")
        at.run()
        assert at.slider(key=f"w:{rid}:length").value == pytest.approx(0.6)
        assert any("none (sliders equal the settings in force)" in c for c in texts(at.caption))

        at.button(key="suggest").click().run()  # suggestions or the plain "nothing better" line
        assert any("predicted" in md for md in texts(at.markdown)) or any(
            "No weights near these" in c for c in texts(at.caption))

        at.button(key="stop").click().run()
        wait_for(lambda: list_runs(runs_dir).set_index("run_id").loc[rid, "status"] == "stopped", 120,
                 what="stopped")
        at.run()
        assert [sl.key for sl in at.slider] == ["smoothing"] and any("nothing to steer" in c for c in texts(at.caption))
    finally:
        processes.terminate_run(rid, root=runs_dir, wait_s=30)


def test_weights_that_cannot_apply_show_one_line_not_a_traceback(runs_dir):
    store = synth_run(runs_dir, "r", 30)
    at = app()
    for m in ("answer_f1", "exact", "citation", "format", "length"):
        at.slider(key=f"w:r:{m}").set_value(0.0)
    at.run()
    assert not at.exception
    shown = [e for e in texts(at.error) if "all zero" in e]  # the what-if's
    assert shown and at.button(key="apply").disabled is False
    at.button(key="apply").click().run()
    assert not at.exception and [e for e in texts(at.error) if "all zero" in e] == shown * 2  # and Apply's
    assert store.control().empty  # nothing was sent
    at.run()
    assert [e for e in texts(at.error) if "all zero" in e] == shown  # said once
    store.close()


def test_suggestion_loads_into_the_sliders(runs_dir):
    store = synth_run(runs_dir, "r", 60)
    at = app()
    at.button(key="suggest").click().run()
    assert any("predicted" in md for md in texts(at.markdown))
    at.button(key="load_sugg_0").click().run()
    loaded = {m: at.slider(key=f"w:r:{m}").value for m in ("answer_f1", "exact", "citation", "format", "length")}
    assert loaded["length"] > 0.1  # the synthetic run rewards a higher length weight
    what_if = next(v for k, v in metrics(at).items() if k.startswith("What-if"))
    assert what_if == "100%"
    store.close()


def test_viewers_of_one_run_share_what_depends_on_the_run_alone(runs_dir, monkeypatch):
    """A second session of the live page on the same view of a run recomputes none of the cards,
    the what-if, the flat-group forecast or the charts; a new step computes each once again."""
    from grpo_core.analysis import charts
    from grpo_core.dashboard import advice, live_cards
    calls = {}
    for module, name in ((live_cards, "cards"), (advice, "what_if"), (advice, "flat_forecast"), (charts, "live_charts")):
        real = getattr(module, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **kw)
        monkeypatch.setattr(module, name, counted)
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    first = app()
    assert calls == {"cards": 1, "what_if": 1, "flat_forecast": 1, "live_charts": 1}, calls
    app()  # another viewer, nothing new
    assert calls == {"cards": 1, "what_if": 1, "flat_forecast": 1, "live_charts": 1}, calls
    synth_run(None, "r", 1, store=store, start=41)
    first.run()
    assert calls == {"cards": 2, "what_if": 2, "flat_forecast": 2, "live_charts": 2}, calls
    first.slider(key="w:r:length").set_value(0.5).run()  # this viewer's own sliders: its own what-if
    assert calls["what_if"] == 3 and calls["cards"] == 2
    store.close()


def refresh_data(at) -> dict:
    """The live page's paced refreshes (grpo_core.dashboard.refresh): {fragment's key: what its element is sent}."""
    import json

    from grpo_core.dashboard import refresh
    return {e.key: json.loads(e.proto.json) for e in at.get("bidi_component") if e.proto.component_name == refresh.COMPONENT}


def refreshes(at) -> dict:
    """The live page's paced refreshes: {fragment's key: period, s}."""
    return {key: data["every"] for key, data in refresh_data(at).items()}


def paced_run(runs_dir, step_s: float | None) -> RunStore:
    """A synthetic live run of 40 steps, then 20 more logged as taking `step_s` each (the rate the
    page sees: one load, none yet); None: none more."""
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    if step_s is not None:
        for step in range(41, 61):
            store.log_step(step, {names.TIME_STEP: step_s})
    return store


@pytest.mark.parametrize("step_s, monitor, what_if", [(None, None, 5.0), (8.0, 4.0, 5.0), (60.0, 10.0, 10.0)])
def test_a_live_run_refreshes_at_its_pace(runs_dir, step_s, monitor, what_if):
    """The monitor refreshes at live_cache.refresh_interval (half a step, 2-10 s), the what-if at
    that pace too but no more often than every 5 s (its rollouts change once per step), each asked
    by the page once it drew the last refresh (a finished run's page asks for none: above)."""
    from grpo_core.dashboard import live_cache
    store = paced_run(runs_dir, step_s)
    at = app(run_id="r")
    period = live_cache.refresh_interval(live_cache.current(runs_dir / "r"))
    assert period == monitor if monitor else period <= 5.0  # the synthetic run's own step times: fast
    assert refreshes(at) == {"monitor_refresh": period, "steer_refresh": what_if}
    store.close()


def test_served_with_the_route_each_refresh_asks_it_with_the_key_it_drew(runs_dir, monkeypatch):
    """Where asgi.py mounted live_probe's route, every refresh of the live page carries the route's
    URL and the key of the state it drew (the browser reruns only when the route's key differs:
    tests/test_browser_refresh.py), and polls every 2 s (the what-if every 5 s) whatever the run's
    pace; served from app.py alone, none does, and a slow run is polled at its pace."""
    import json

    from grpo_core.dashboard import live_cache, live_probe, refresh
    store = paced_run(runs_dir, 60.0)  # a slow run: a minute per step

    def asks(at):
        return {e.key: {k: v for k, v in json.loads(e.proto.json).items() if k in ("probe", "drawn")}
                for e in at.get("bidi_component") if e.proto.component_name == refresh.COMPONENT}
    at = app(run_id="r")
    assert asks(at) == {"monitor_refresh": {}, "steer_refresh": {}}
    assert refreshes(at) == {"monitor_refresh": 10.0, "steer_refresh": 10.0}  # its pace: every poll redraws
    monkeypatch.setattr(live_probe, "_mounted", True)
    key = live_probe.key(live_cache.current(runs_dir / "r"))
    at = app(run_id="r")
    probe = f"/grpo-health/live/r?viewer={at.session_state['live_viewer']}"  # the page's viewer id: the run's viewers are who ask
    assert asks(at) == {name: {"probe": probe, "drawn": key} for name in ("monitor_refresh", "steer_refresh")}
    # a poll with nothing new costs a few bytes: the slow run is asked as often as a fast one
    assert refreshes(at) == {"monitor_refresh": live_cache.MIN_REFRESH_S, "steer_refresh": 5.0}
    store.close()


def test_the_page_takes_the_redraw_rate_serve_hands_it(runs_dir, monkeypatch):
    """$GRPO_HEALTH_REDRAWS_PER_S (serve --redraws-per-s) reaches the page's period: at a quarter
    of a redraw a second, the one page of a fast run asks every 4 s; at the default, it and a
    second page each every 2 s."""
    from grpo_core.dashboard import live_cache, live_probe
    store = paced_run(runs_dir, 0.1)  # a fast run: a tenth of a second per step
    monkeypatch.setattr(live_probe, "_mounted", True)
    monkeypatch.setenv(live_cache.REDRAWS_ENV, "0.25")
    assert refreshes(app(run_id="r"))["monitor_refresh"] == pytest.approx(4.0)
    monkeypatch.delenv(live_cache.REDRAWS_ENV)
    assert refreshes(app(run_id="r"))["monitor_refresh"] == live_cache.MIN_REFRESH_S
    store.close()


def test_with_ten_viewers_the_what_if_refreshes_half_as_often_as_the_charts(runs_dir, monkeypatch):
    """Ten pages of a fast run share its redraws: the charts every 10 / 1.5 s, the what-if line
    (live_cache.what_if_interval) half as often, where one page alone has them every 2 and 5 s."""
    from grpo_core.dashboard import live_cache, live_probe
    store = paced_run(runs_dir, 0.1)  # a fast run: a tenth of a second per step
    monkeypatch.setattr(live_probe, "_mounted", True)
    assert refreshes(app(run_id="r")) == {"monitor_refresh": 2.0, "steer_refresh": 5.0}
    s = live_cache.current(runs_dir / "r")
    for i in range(8):  # eight more pages asked for their period: ten with the next one
        live_cache.refresh_interval(s, probed=True, viewer=f"other{i}")
    assert refreshes(app(run_id="r")) == {"monitor_refresh": pytest.approx(10 / 1.5), "steer_refresh": pytest.approx(20 / 1.5)}
    store.close()


def test_a_bug_in_a_refreshing_panel_is_one_line_and_the_refreshes_go_on(runs_dir, monkeypatch, caplog):
    """An exception nobody foresaw while drawing the monitor or the steering panel (here: the
    run's capabilities fail) shows one line naming the panel and the error, not Streamlit's
    traceback, which ended the page's refresh chain; the traceback is logged, the panels ask for
    their next refresh, and the next refresh that works draws the page again."""
    from grpo_core.dashboard import live_cards
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    real = live_cards.capabilities

    def broken(s):
        raise RuntimeError("capabilities exploded\nsecond line of the message")
    monkeypatch.setattr(live_cards, "capabilities", broken)
    at = app(run_id="r")  # fails on any exception shown as Streamlit's traceback
    errors = texts(at.error)
    assert [e.split(":")[0] for e in errors] == ["Could not draw the run's cards and charts", "Could not draw the steering panel"]
    assert all("RuntimeError: capabilities exploded. This is a bug" in e and "second line" not in e for e in errors)
    assert set(refreshes(at)) == {"monitor_refresh", "steer_retry"}
    assert "capabilities exploded" in caplog.text and "Traceback" in caplog.text
    monkeypatch.setattr(live_cards, "capabilities", real)
    at.run()  # the next refresh
    assert not at.exception and not at.error and "Trainable ratio (cumulative)" in metrics(at)
    store.close()


def test_a_view_too_large_to_resend_at_the_runs_pace_refreshes_less_often(runs_dir, monkeypatch):
    """The monitor's period is the run's, or the chart bytes it sends over live_chart.SEND_RATE
    when that is longer (every step of a long run: 2.6 MB at 10,000 steps), which is the new
    steps' rows only once the page holds the rest, and nothing at a refresh with no new step."""
    from grpo_core.dashboard import live_cache, live_chart
    store = synth_run(runs_dir, "r", 1600, P=2, G=4, steps_total=2000)  # bins of 2 steps (live_view.MAX_BINS)
    at = app(run_id="r")
    period = live_cache.refresh_interval(live_cache.current(runs_dir / "r"))
    assert refreshes(at)["monitor_refresh"] == period  # a few kB: the run's pace

    def sent(at) -> int:  # the charts element's message: its directory and the charts' bytes
        return sum(len(data) for data in live_chart_messages(at))
    monkeypatch.setattr(live_chart, "SEND_RATE", 1_000)  # 1 kB/s: both views are too large for the run's pace
    at = app(run_id="r")  # a new page: the whole binned view
    binned = sent(at)
    assert binned / 1_000 > period and refreshes(at)["monitor_refresh"] == pytest.approx(binned / 1_000)
    at.run()  # no new step: the page holds every chart and is sent none, at the run's pace
    assert len(live_chart_entries(at)) >= 6 and not live_chart_bytes(at) and refreshes(at)["monitor_refresh"] == period
    at.toggle(key="raw_steps").set_value(True).run()
    raw = sent(at)
    assert raw > binned and refreshes(at)["monitor_refresh"] == pytest.approx(raw / 1_000)
    # New steps: each chart is sent their rows only (live_chart.update) and its header (~1 kB).
    synth_run(None, "r", 2, store=store, start=1601, P=2, G=4, steps_total=2000)
    live_cache.expire(runs_dir / "r")
    at.run()
    rows = sent(at)
    assert all(c["keep"] >= 1600 and len(c["x"]) == 2 for c in live_charts(at)) and rows < raw / 20
    assert refreshes(at)["monitor_refresh"] == pytest.approx(max(rows / 1_000, period))
    store.close()


def test_a_new_session_paints_the_run_and_its_charts_first_then_the_whole_page(runs_dir):
    """A session's first run of the live page draws the run line, its progress and its charts, and
    asks its browser for the whole page once it drew the first chart (a refresh at 0 s outside the
    fragments, waiting for a drawn chart): the cards, alerts and controls come with that second run."""
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    at = AppTest.from_file(APP, default_timeout=60)  # a new session: no first paint yet
    at.session_state["run_id"] = "r"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(live_charts(at)) >= 6 and any("step 40 of 100" in str(p.proto) for p in at.get("progress"))
    assert not at.metric and not at.slider and refreshes(at)["first_paint"] == 0.0
    assert refresh_data(at)["first_paint"]["ready"] == live_chart.DRAWN
    assert not at.selectbox and at.query_params["run"] in ("r", ["r"])  # the run picked, its box drawn with the rest
    elements = [e.proto.component_name for e in at.get("bidi_component")]
    assert elements.index(live_chart.LIBRARY) < elements.index(live_chart.COMPONENT)  # uPlot before the charts' data
    at.run()  # what the browser asks for once it painted the charts
    assert "Trainable ratio (cumulative)" in metrics(at)
    assert at.selectbox(key="run_id").value == "r"
    assert {"Chart smoothing", "exact", "min_group_std"} <= {s.label for s in at.slider}  # the steering panel too
    assert "first_paint" not in refreshes(at) and len(live_chart_entries(at)) >= 6
    assert not live_chart_bytes(at)  # the page holds its charts from the first paint: sent none again
    store.close()


def test_a_first_paint_with_no_chart_asks_for_the_rest_at_once(runs_dir):
    """A run with no step logged yet has no chart to draw: its first paint asks for the rest of the
    page at once, not once a chart is drawn (which would be never: the page's 15-s fallback)."""
    synth_run(runs_dir, "r", 0, steps_total=100).close()
    at = AppTest.from_file(APP, default_timeout=60)
    at.session_state["run_id"] = "r"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "No steps logged yet." in [i.value for i in at.info] and not live_charts(at)
    assert refresh_data(at)["first_paint"] == {"every": 0.0, "n": 1}
    at.run()  # what the browser asks for at once
    assert "first_paint" not in refreshes(at) and at.selectbox(key="run_id").value == "r"


def chart_places(at) -> list[tuple[int, ...]]:
    """Where the live charts element sits on the page: its path of child indexes from the main area,
    what the browser knows an element by (at a new path it is a new element: new uPlot charts)."""
    def walk(node, path):
        for i, child in sorted(getattr(node, "children", {}).items()):
            if getattr(getattr(child, "proto", None), "component_name", None) == live_chart.COMPONENT:
                yield path + (i,)
            yield from walk(child, path + (i,))
    return list(walk(at.main, ()))


def test_the_charts_keep_their_places_when_what_is_above_them_changes(runs_dir):
    """From the first paint to the whole page, and when a request line appears above them, the
    charts stay at their place: the browser hands the same uPlot charts the new data (a reader's
    zoom survives: tests/test_browser_live_chart.py) instead of building every chart again."""
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    at = AppTest.from_file(APP, default_timeout=60)  # a new session: its first paint
    at.session_state["run_id"] = "r"
    at.run()
    places = chart_places(at)
    assert len(places) == 1 and len(live_chart_entries(at)) >= 6  # one element, every chart
    at.run()  # the whole page: the cards, the verdict, the chart controls above the charts
    assert "Trainable ratio (cumulative)" in metrics(at) and chart_places(at) == places
    at.slider(key="w:r:length").set_value(0.6).run()
    at.button(key="apply").click().run()
    assert not at.exception and any("Your requests" in md for md in texts(at.markdown))
    assert chart_places(at) == places
    store.close()


# ---- runs page ------------------------------------------------------------------------------------
def test_runs_page_lists_a_real_run_with_progress(trained):
    root, rid = trained
    at = app("pages/runs.py")
    assert any(rid in md and "finished" in md for md in texts(at.markdown))
    assert any(f"step {TRAINED_STEPS} of {TRAINED_STEPS}" in str(p.proto) for p in at.get("progress"))
    at.button(key=f"open_{rid}").click().run()
    # The live page's charts, whole: the session showed them before (app.py's start page), but a
    # new visit's element holds none of them.
    assert at.session_state["run_id"] == rid and len(live_charts(at)) == 7


@pytest.mark.parametrize("extra, message", [
    ("grpo.group_size=1", "grpo.group_size must be >= 2"),
    ("grpo.grup_size=3", "unknown key 'grpo.grup_size' (did you mean 'group_size'?)"),
    ("task.level=9", "task.level must be between 1 and 4 for task demo, got 9"),
    ("no equals sign", "--set expects section.key=value"),
])
def test_start_form_bad_input_is_one_line_and_starts_nothing(runs_dir, extra, message):
    at = app("pages/runs.py")
    at.text_area[0].set_value(extra)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception
    errors = texts(at.error)
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0] and "Traceback" not in errors[0]
    assert list_runs(runs_dir).empty


def test_start_form_bad_run_id_is_one_line(runs_dir):
    at = app("pages/runs.py")
    next(t for t in at.text_input if t.label == "Run id (optional)").set_value("../x")
    next(b for b in at.button if b.label == "Start run").click().run()
    assert any("run id '../x' is not allowed" in e for e in texts(at.error)) and list_runs(runs_dir).empty


@pytest.mark.slow
def test_start_form_launches_a_real_trainer_with_the_form_values(runs_dir):
    at = app("pages/runs.py")
    next(t for t in at.text_input if t.label == "Run id (optional)").set_value("formrun")
    next(n for n in at.number_input if n.label == "Group size G").set_value(4)
    next(n for n in at.number_input if n.label == "Steps").set_value(3)
    next(n for n in at.number_input if n.label == "length").set_value(0.25)
    at.text_area[0].set_value("model.warm_start_steps=0\ngrpo.prompts_per_step=2")
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception and not at.error
    cfg = RunStore.open(runs_dir / "formrun", readonly=True).config
    assert cfg["grpo"]["group_size"] == 4 and cfg["grpo"]["steps"] == 3 and cfg["grpo"]["prompts_per_step"] == 2
    assert cfg["reward"]["weights"]["length"] == 0.25
    assert at.session_state["run_id"] == "formrun"
    wait_for(lambda: list_runs(runs_dir).set_index("run_id").loc["formrun", "status"] == "finished", 240,
             what="the form's run to finish")


def test_failed_stale_and_unreadable_runs_say_why(runs_dir):
    bad = synth_run(runs_dir, "bad", 3)  # a store from before errors were one line: a whole traceback in meta
    bad.set_status("failed")
    bad.set_meta(error="Traceback (most recent call last):\n ...\nValueError: reward metric 'exact' raised\n")
    (runs_dir / "junk").mkdir()
    (runs_dir / "junk" / "run.db").write_bytes(b"\x00garbage" * 64)
    gone = subprocess.Popen(["true"])
    gone.wait()
    synth_run(runs_dir, "ghost", 3).set_meta(pid=gone.pid)  # its trainer died without a word
    at = app("pages/runs.py")
    assert "bad failed: ValueError: reward metric 'exact' raised" in texts(at.error)
    # its expander: the one line, then the run's trainer.log (where a traceback goes now; none here)
    assert "ValueError: reward metric 'exact' raised\n---- trainer.log ----" in [c.value for c in at.code]
    assert any(e.startswith("unreadable:") for e in texts(at.error))
    assert any(w.startswith("ghost: no heartbeat") for w in texts(at.warning))
    at.button(key="kill_ghost").click().run()  # nothing to signal: the run is marked stopped
    assert list_runs(runs_dir).set_index("run_id").loc["ghost", "status"] == "stopped"
    at.session_state["goto_run"] = "bad"
    at.switch_page("pages/live.py").run()  # the failed run's live page says so too, once
    assert any("The run failed: ValueError: reward metric 'exact' raised" in e for e in texts(at.error))


def test_import_expander_imports_a_real_trl_log(runs_dir):
    at = app("pages/runs.py")
    at.file_uploader(key="import_file").upload(FIXTURE.name, FIXTURE.read_bytes(), "application/json")
    at.run()
    at.text_input(key="import_run_id").set_value("chaos")
    at.button(key="import_go").click().run()
    assert not at.exception and "imported as chaos" in texts(at.success)
    assert list_runs(runs_dir).set_index("run_id").loc["chaos", "source"] != "grpo_core"


def test_import_of_a_wrong_file_is_one_line(runs_dir):
    at = app("pages/runs.py")
    at.file_uploader(key="import_file").upload("notes.json", b"{not json", "application/json")
    at.run()
    at.button(key="import_go").click().run()
    errors = texts(at.error)
    assert not at.exception and len(errors) == 1 and "\n" not in errors[0] and list_runs(runs_dir).empty


def test_url_run_parameter_picks_the_run(runs_dir):
    synth_run(runs_dir, "a", 3, status="finished").close()
    synth_run(runs_dir, "b", 3).close()
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = "a"
    at.run()
    assert at.session_state["run_id"] == "a" and at.query_params["run"] in ("a", ["a"])
    at.run()  # the whole page, with the run picker's box: what the browser asks for after the first paint
    assert at.session_state["run_id"] == "a"
    at.sidebar.selectbox[0].set_value("b").run()
    assert at.session_state["run_id"] == "b" and at.query_params["run"] in ("b", ["b"])


# ---- legacy pages/ routing -----------------------------------------------------------------------------
def test_a_page_that_legacy_routing_runs_on_its_own_hands_over_to_the_app_once(runs_dir, monkeypatch):
    """AppTest routes a run like a fresh server (by the pages/ folder's file names, before any
    st.navigation call): the page file runs without app.py, and frame.through_app runs frame.main(),
    which draws the run picker and the page, once; a page main() runs does not hand over again."""
    from grpo_core.dashboard import frame
    synth_run(runs_dir, "older", 3, status="finished").close()
    synth_run(runs_dir, "newer", 3, status="finished").close()
    calls = []
    main = frame.main
    monkeypatch.setattr(frame, "main", lambda: calls.append(1) or main())
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["run"] = "older"
    at.switch_page("pages/analysis.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert calls == [1] and [s.key for s in at.sidebar.selectbox] == ["run_id"]  # app.py's run picker
    assert texts(at.header) == ["Analysis"] and "Run **older** · finished (choose another run in the sidebar)" in \
        texts(at.caption)
    calls.clear()
    at.switch_page("pages/runs.py").run()
    assert not at.exception and calls == [1] and texts(at.header) == ["Runs"]
    calls.clear()
    at = AppTest.from_file(APP, default_timeout=60).run()  # the start page: app.py itself, main() once
    assert not at.exception and calls == [1] and texts(at.header) == ["Live monitor"]


def test_a_page_file_run_as_its_own_app_stays_on_its_own(runs_dir, monkeypatch):
    """AppTest of a page file (the page is the entry point): no hand-over, no run picker."""
    from grpo_core.dashboard import frame
    synth_run(runs_dir, "r", 3, status="finished").close()
    monkeypatch.setattr(frame, "main", lambda: pytest.fail("main() ran"))
    at = AppTest.from_file(str(REPO / "pages" / "runs.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert texts(at.header) == ["Runs"] and not at.sidebar.selectbox


# ---- the Streamlit process never imports torch -----------------------------------------------------------
def test_no_page_imports_torch(trained):
    root, rid = trained
    script = textwrap.dedent(f"""
        import sys
        from streamlit.testing.v1 import AppTest
        at = AppTest.from_file({APP!r}, default_timeout=120)
        at.run()
        for page in ("pages/runs.py", "pages/live.py", "pages/analysis.py", "pages/pilot.py"):
            at.switch_page(page).run()
            assert not at.exception, (page, [e.value for e in at.exception])
        import grpo_core.dashboard.processes, grpo_core.dashboard.serve, grpo_core.dashboard.live_view, grpo_core.dashboard.advice, grpo_core.analysis.charts, grpo_core.runs.requests
        heavy = sorted(m for m in ("torch", "transformers", "trl", "accelerate") if m in sys.modules)
        print("HEAVY", heavy)
        sys.exit(1 if heavy else 0)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "GRPO_HEALTH_RUNS_DIR": str(root)})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "HEAVY []" in out.stdout


# ---- Streamlit's magic is off: a page shows only what it calls ---------------------------------------------
def test_no_page_leaves_a_bare_expression_for_magic_to_write():
    # .streamlit/config.toml turns magic off (it costs each newcomer the page's compile): a bare
    # expression a page means to show would silently show nothing.
    assert tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())["runner"]["magicEnabled"] is False
    bare = []
    for path in [REPO / "app.py", REPO / "asgi.py", *sorted((REPO / "pages").glob("*.py"))]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0]) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and ast.get_docstring(node, clean=False) is not None}
        bare += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                 if isinstance(node, ast.Expr) and id(node) not in docstrings
                 and not isinstance(node.value, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom))]
    assert bare == [], "bare expressions (magic is off: write them with st.write):\n" + "\n".join(bare)


def test_sliders_keep_their_values_when_the_run_changes_weights_elsewhere(runs_dir):
    store = synth_run(runs_dir, "r", 20)
    at = app()
    at.slider(key="w:r:length").set_value(0.7).run()
    w = {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2, "format": 0.1}
    synth_run(None, "r", 2, store=store, start=21, changes={21: {**w, "length": 0.9}})  # e.g. from the CLI
    at.run()
    assert not at.error and at.slider(key="w:r:length").value == pytest.approx(0.7)  # not reset
    assert at.slider(key="w:r:answer_f1").value == pytest.approx(0.4)
    synth_run(None, "r", 2, store=store, start=23, changes={23: {**w, "length": 1.6}})  # beyond the range
    at.run()
    sl = at.slider(key="w:r:length")
    assert not at.error and sl.max >= 1.6 and sl.value == pytest.approx(1.6)  # re-seeded, never zeroed
    assert at.slider(key="w:r:answer_f1").value == pytest.approx(0.4)
    store.close()


def test_every_page_opens_with_the_frame_and_nothing_else_of_its_kind():
    """Each page's first statement after its imports and constants is frame.open_page() (token
    gate, run picker's run, legacy-routing guard); no page calls the gate or the guard itself."""
    import ast
    for path in sorted((REPO / "pages").glob("*.py")):
        tree = ast.parse(path.read_text())
        body = [n for n in tree.body if not isinstance(n, (ast.Import, ast.ImportFrom))
                and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))  # the docstring
                and not (isinstance(n, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper()
                                                           for t in n.targets))]  # constants
        first = ast.unparse(body[0])
        assert first.endswith("frame.open_page()"), (path.name, first)
        calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not calls & {"require_token", "through_app", "access.require_token", "frame.through_app"}, path.name


def test_a_click_is_acted_on_when_its_run_is_cut_short_by_a_change_made_elsewhere(runs_dir, monkeypatch):
    """The run a click starts may be rerun before it reaches its buttons (the what-if finds a setting
    applied elsewhere since the panel read the run, the run ends): the click still sends its
    request, once (each button acts in its callback, before the run)."""
    from grpo_core.dashboard import live_cache, widget_state
    from grpo_core.runs import requests
    store = synth_run(runs_dir, "r", 12, steps_total=100)
    at = app_test()
    at.session_state["run_id"] = "r"
    at.run()
    at.slider(key="w:r:length").set_value(0.6).run()
    armed, original = [True], widget_state.sync

    def sync_then_change_elsewhere(*args, **kwargs):
        keys = original(*args, **kwargs)  # the panel drew its controls from the settings before the change
        if armed[0]:
            armed[0] = False
            rid = requests.send(runs_dir / "r", "set_weights", {"weights": {"exact": 0.2}}, source="cli")
            assert [r["id"] for r in store.claim_pending()] == [rid]  # what the trainer does at its next step
            store.resolve_request(rid, True, store.last_step() + 1)
            live_cache.expire(runs_dir / "r")
        return keys
    monkeypatch.setattr(widget_state, "sync", sync_then_change_elsewhere)
    at.button(key="apply").click().run()
    assert not at.exception and not armed[0]
    mine = store.control().query("source == 'ui'")
    assert list(mine["kind"]) == ["set_weights"] and mine["payload"].iloc[0]["weights"]["length"] == 0.6
    at.run()
    assert len(store.control().query("source == 'ui'")) == 1  # sent once
    store.close()
