"""The analysis page in Streamlit's AppTest, on real run stores (built as in test_report):
a finished run with a change, the inspector, the comparison, and each run state
(no runs, in progress, one step, empty, failed, imported) with its message."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.runs.config import RunConfig
from grpo_core.runs.store import RunStore
from tests.test_report import (CHANGE_AT_50, OLD_TRACEBACK, bottleneck_scores, change_scores, make_imported,
                               make_run)

ROOT = Path(__file__).resolve().parents[1]
PAGE = str(ROOT / "pages" / "analysis.py")


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def page(run_id: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    if run_id:
        at.session_state["run_id"] = run_id
    return at.run()


def table(at, column: str):
    """The (first) dataframe on the page that has `column` (dataframes carry no key in AppTest)."""
    for d in at.dataframe:
        v = d.value
        if column in v.columns or v.index.name == column:
            return v
    raise AssertionError(f"no table with column {column!r} on the page")


def texts(at) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "success", "error")
             for e in getattr(at, kind)]
    return "\n".join(map(str, parts))


def test_no_runs():
    at = page()
    assert not at.exception
    assert [e.value for e in at.info] == ["No runs yet: start one on the Runs page, or from the terminal: "
                                          "`python -m grpo_core train`."]


def test_finished_run_with_a_change():
    make_run("chg", steps=60, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    at = page("chg")
    assert not at.exception
    assert not at.error and not at.warning  # a finished run of our own: nothing to warn about
    assert "Run **chg** · finished" in texts(at)
    ledger = table(at, "reuse")
    assert list(ledger["step"]) == [50] and bool(ledger["reuse"].iloc[0])
    assert (ledger["before"].iloc[0], ledger["after"].iloc[0]) == ("30–49", "50–59")
    assert ledger["ratio_diff"].iloc[0] == pytest.approx(0.5)
    assert "Variance bottleneck: exact" in texts(at)
    assert len(at.get("plotly_chart")) >= 4
    assert [b.key for b in at.get("download_button")] == ["an_never_jsonl", "an_dl_html", "an_dl_md", "an_dl_csv"]
    # the window widget drives the ledger
    at.number_input(key="analysis_window").set_value(5).run()
    ledger = table(at, "reuse")
    assert (ledger["before"].iloc[0], ledger["after"].iloc[0]) == ("45–49", "50–54")


def test_newest_run_is_the_default():
    make_run("older", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    make_run("newer", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    at = page()
    assert "Run **newer**" in texts(at)
    at = page("no-such-run")  # a stale pick (run deleted) falls back to the newest too
    assert "Run **newer**" in texts(at) and not at.exception


def test_inspector_selects_step_and_group():
    make_run("insp", steps=12, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    at = page("insp")
    assert at.selectbox(key="an_step").value == 11  # the last step by default
    at.selectbox(key="an_step").set_value(10).run()
    at.selectbox(key="an_group").set_value(0).run()
    assert at.success[0].value.startswith("Trainable: the total-reward std 0.5000")
    grp = table(at, "rank")
    assert list(grp["idx"]) == [1, 3, 0, 2] and list(grp["total"]) == [1.0, 1.0, 0.0, 0.0]
    at.selectbox(key="an_group").set_value(1).run()
    assert [w.value for w in at.warning][0].startswith("Not trainable: all 4 completions got the same total")


def test_compare_two_runs():
    make_run("a", steps=4, weights={"answer_f1": 0.5, "exact": 0.5}, scores=bottleneck_scores)
    make_run("b", steps=4, weights={"answer_f1": 0.5, "exact": 0.5}, scores=bottleneck_scores,
             config={"grpo.lr": 5e-3})
    at = page("a")
    assert "Choose at least two runs to compare." in texts(at)
    at.multiselect(key="an_compare").set_value(["a", "b"]).run()
    assert not at.exception
    diff = table(at, "key")
    default_lr = str(RunConfig().grpo.lr)  # run a keeps the default; the test must not pin it
    assert list(diff.index) == ["grpo.lr"] and list(diff.loc["grpo.lr"]) == [default_lr, "0.005"]
    assert list(table(at, "reward_final").index) == ["a", "b"]


def test_in_progress_run():
    make_run("live", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="running")
    with RunStore.open("live") as s:
        s.heartbeat()
    at = page("live")
    assert not at.exception
    assert [i.value for i in at.info][0].startswith("Run still in progress (running, step 2 of 3)")
    assert table(at, "uniform_fraction")["metric"].tolist() == ["exact", "f1"]


def test_one_step_run():
    make_run("one", steps=1, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    at = page("one")
    assert not at.exception
    assert "Only one step logged (step 0)" in [w.value for w in at.warning][0]
    assert "not enough steps for a trend" in texts(at)


def test_empty_run():
    RunStore.create("empty", RunConfig().to_dict()).close()
    at = page("empty")
    assert not at.exception
    assert [w.value for w in at.warning] == ["No steps logged yet: there is nothing to analyse in this run."]
    assert not at.tabs and not at.get("plotly_chart")


def test_failed_run():
    make_run("boom", steps=2, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="failed",
             error="ValueError: reward.custom.judge returned None")
    at = page("boom")
    assert not at.exception
    assert [e.value for e in at.error] == ["Run failed at step 1: ValueError: reward.custom.judge returned None. "
                                           "The analysis covers the steps logged before the failure."]


def test_a_failed_run_from_an_older_store_shows_its_traceback_as_one_line():
    run = make_run("old-boom", steps=2, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="failed")
    with RunStore.open(run) as s:
        s.set_meta(error=OLD_TRACEBACK)  # as stores written before errors were one line hold it
    at = page("old-boom")
    assert not at.exception
    assert [e.value for e in at.error] == ["Run failed at step 1: RuntimeError: Engine core initialization failed. "
                                           "See root cause above. The analysis covers the steps logged before the "
                                           "failure."]


def test_imported_run():
    make_imported("trl-run")
    at = page("trl-run")
    assert not at.exception
    warn = [w.value for w in at.warning]
    assert warn and warn[0].startswith("No per-group or per-rollout records in this run (source: trl)")
    assert "No rollouts recorded in this run" in texts(at)
    assert at.get("plotly_chart")  # the ratio (from frac_reward_zero_std) still plots


def test_unreadable_run_is_one_error(runs_dir):
    (runs_dir / "junk").mkdir()
    (runs_dir / "junk" / "run.db").write_bytes(b"not sqlite at all" * 100)
    at = page("junk")
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.startswith("Cannot analyse run junk:")


def test_page_never_imports_torch(runs_dir):
    make_run("t", steps=2, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    code = ("import sys; from streamlit.testing.v1 import AppTest; "
            f"at = AppTest.from_file({PAGE!r}, default_timeout=60); at.session_state['run_id'] = 't'; at.run(); "
            "assert not at.exception, at.exception; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=os.environ.copy())
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]


def test_page_follows_the_sidebar_pick_in_the_app():
    make_run("first", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    make_run("second", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    at.switch_page("pages/analysis.py").run()
    assert not at.exception
    at.sidebar.selectbox(key="run_id").set_value("first").run()
    assert not at.exception
    assert "Run **first** · finished" in texts(at)
