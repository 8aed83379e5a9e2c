"""The pilot page in Streamlit's AppTest: no pilot yet, a finished pilot (constructed store),
a bad form, and "Start training with these settings" carrying the values to the runs form."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.analysis import planner
from grpo_core.runs.run_index import list_runs
from tests.test_pilot import bernoulli_scores, make_pilot_store

ROOT = Path(__file__).resolve().parents[1]
PAGE = str(ROOT / "pages" / "pilot.py")


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def texts(at) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "success", "error")
             for e in getattr(at, kind)]
    return "\n".join(map(str, parts))


def test_page_without_a_pilot(runs_dir):
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    assert not at.exception
    assert "No pilot yet" in texts(at)
    assert at.button(key="FormSubmitter:pilot_form-Start pilot") is not None
    assert len(at.get("plotly_chart")) == 0


def test_bad_form_values_show_one_line_and_start_nothing(runs_dir):
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    for m in ("answer_f1", "exact", "citation", "format", "length"):
        at.number_input(key=f"pilot_w_{m}").set_value(0.0)
    at.button(key="FormSubmitter:pilot_form-Start pilot").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == ["reward.weights are all zero: give at least one metric a positive weight"]
    assert list_runs().empty


def _coin_pilot():
    """A finished pilot of one binary metric at p = 0.9 with G = 2: the plan says raise G."""
    sc = bernoulli_scores(np.random.default_rng(7), 4, 32, 2, [0.9, 0.9])
    sc[..., 1] = 1.0  # a second binary metric, always 1: uniform
    make_pilot_store("pilot-coin", sc, ["exact", "format"], {"exact": 0.8, "format": 0.2},
                     config={"grpo": {"group_size": 2}, "task": {"level": 2}})


def test_page_with_a_finished_pilot(runs_dir):
    _coin_pilot()
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    assert not at.exception
    assert at.selectbox[0].value == "pilot-coin"
    from grpo_core.analysis.pilot import pilot_summary
    s = pilot_summary("pilot-coin")
    ratio = next(m for m in at.metric if m.label == "Predicted trainable ratio")
    assert ratio.value == f"{s.ratio:.2f}"
    assert [w.value for w in at.warning][0] == "**change the group size first**"
    assert "`format`" in at.warning[1].value  # the uniform metric is named
    g = planner.min_group_size(s.plans[0].p, 0.3)
    assert f"target 0.30 needs G = {g}" in texts(at)
    assert len(at.get("plotly_chart")) == 3  # histograms, within-group std, planner
    # Moving the target moves the plan.
    at.slider(key="pilot_target").set_value(0.6).run()
    assert f"target 0.60 needs G = {planner.min_group_size(s.plans[0].p, 0.6)}" in texts(at)


def test_start_training_carries_the_chosen_settings(runs_dir):
    _coin_pilot()
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    # The planner's G is preselected; the user picks another and the level.
    from grpo_core.analysis.pilot import pilot_summary
    g = pilot_summary("pilot-coin").verdict.actions[0].settings["group_size"]
    assert at.number_input(key="pilot_train_g").value == g
    at.number_input(key="pilot_train_g").set_value(g + 2)
    at.number_input(key="pilot_train_level").set_value(3)
    at.button(key="pilot_start_training").click().run()
    assert not at.exception
    d = at.session_state["start_form_defaults"]
    assert d["group_size"] == g + 2 and d["level"] == 3 and d["from_pilot"] == "pilot-coin"
    assert d["weights"] == {"exact": 0.8, "format": 0.2}
    assert f"grpo.group_size={g + 2}" in d["overrides"]
    assert "open the Runs page" in texts(at)  # standalone page: no navigation to switch to


def test_progress_of_a_running_pilot(runs_dir):
    sc = bernoulli_scores(np.random.default_rng(8), 2, 8, 4, [0.5])
    make_pilot_store("pilot-live", sc, ["exact"], {"exact": 1.0}, status="running")
    from grpo_core.runs.store import RunStore
    with RunStore.open("pilot-live") as s:
        s.set_meta(config={**s.config, "grpo": {**s.config["grpo"], "steps": 8}}, pid=os.getpid())
        s.heartbeat()
    at = AppTest.from_file(PAGE, default_timeout=30).run()
    assert not at.exception
    prog = at.get("progress")[0]
    assert prog.proto.value == 25 and "2 of 8 batches" in prog.proto.text
    # Stop: a request the pilot process claims after its current batch.
    at.button(key="pilot_stop").click().run()
    assert not at.exception
    ctl = RunStore.open("pilot-live").control()
    assert ctl["kind"].tolist() == ["stop"] and ctl["status"].tolist() == ["pending"]


def test_start_training_opens_the_runs_form_with_the_values(runs_dir):
    """Through the whole app: the button switches to the Runs page, whose start form is
    prefilled from st.session_state["start_form_defaults"]."""
    _coin_pilot()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    at.switch_page("pages/pilot.py").run()
    assert not at.exception
    at.number_input(key="pilot_train_g").set_value(6)
    at.radio(key="pilot_weights_choice").set_value(at.radio(key="pilot_weights_choice").options[0])
    at.button(key="pilot_start_training").click().run()
    assert not at.exception
    form = {w.label: w.value for w in at.number_input}
    assert form["Group size G"] == 6 and form["Demo level"] == 2
    assert at.number_input(key="start_w_exact").value == 0.8
    assert "Settings carried over from pilot pilot-coin." in texts(at)
