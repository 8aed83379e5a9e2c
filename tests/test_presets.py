"""Weight presets: TOML files under <runs_dir>/presets, round trip, names, bad files, use."""
from __future__ import annotations

import re
import tomllib

import numpy as np
import pandas as pd
import pytest

from grpo_core.runs import presets
from grpo_core.runs.config import from_dict, validate


def test_save_load_round_trip_is_a_shareable_toml_file(runs_dir):
    path = presets.save_preset("cite-less", {"answer_f1": 0.55, "citation": 0.4, "exact": 0.05}, group_size=12,
                         min_group_std=0.02, note="from run r1 step 40", source_run="r1")
    assert path == runs_dir / "presets" / "cite-less.toml"
    data = tomllib.loads(path.read_text())  # plain TOML a person can read and share
    assert data["reward"]["weights"] == {"answer_f1": 0.55, "citation": 0.4, "exact": 0.05}
    assert data["grpo"] == {"group_size": 12, "min_group_std": 0.02}
    p = presets.load_preset("cite-less")
    assert (p.name, p.weights, p.group_size, p.min_group_std, p.note, p.source_run) == \
        ("cite-less", {"answer_f1": 0.55, "citation": 0.4, "exact": 0.05}, 12, 0.02, "from run r1 step 40", "r1")
    # weights only: no [grpo] table, and loading gives None for G and threshold
    presets.save_preset("plain", {"answer_f1": 1.0})
    q = presets.load_preset("plain")
    assert q.group_size is None and q.min_group_std is None and "grpo" not in tomllib.loads(q.path.read_text())


def test_list_and_delete(runs_dir):
    assert presets.list_presets() == []
    presets.save_preset("b", {"exact": 1.0})
    presets.save_preset("a", {"exact": 0.5, "format": 0.5})
    assert [p.name for p in presets.list_presets()] == ["a", "b"]
    assert presets.delete_preset("a") is True and presets.delete_preset("a") is False
    assert [p.name for p in presets.list_presets()] == ["b"]
    with pytest.raises(presets.PresetError, match=r"no preset 'a' .*presets: b"):
        presets.load_preset("a")


def test_overwrite_only_when_asked(runs_dir):
    presets.save_preset("x", {"exact": 1.0})
    with pytest.raises(presets.PresetError, match="already exists"):
        presets.save_preset("x", {"exact": 0.5}, overwrite=False)
    presets.save_preset("x", {"exact": 0.25})
    assert presets.load_preset("x").weights == {"exact": 0.25}


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", ".hidden", "", "x" * 65, "a b", "/etc/passwd", "a..b"])
def test_names_with_path_tricks_are_refused(runs_dir, name):
    with pytest.raises(presets.PresetError, match="not allowed"):
        presets.save_preset(name, {"exact": 1.0})
    with pytest.raises(presets.PresetError, match="not allowed"):
        presets.load_preset(name)
    assert not (runs_dir / "presets").exists() or list((runs_dir / "presets").iterdir()) == []
    assert not (runs_dir.parent / "evil.toml").exists()


@pytest.mark.parametrize("weights, match", [
    ({}, "at least one metric"), ({"exact": -1.0}, "must be >= 0"), ({"exact": float("nan")}, "finite"),
    ({"exact": 0.0}, "all zero")])
def test_bad_values_are_refused_on_save(runs_dir, weights, match):
    with pytest.raises(presets.PresetError, match=match):
        presets.save_preset("bad", weights)
    assert not (runs_dir / "presets" / "bad.toml").exists()


def test_bad_files_give_one_line_naming_the_file(runs_dir):
    d = runs_dir / "presets"
    d.mkdir()
    (d / "broken.toml").write_text("[reward.weights\nexact = 1\n")
    (d / "neg.toml").write_text("[reward.weights]\nexact = -2\n")
    (d / "extra.toml").write_text("[reward.weights]\nexact = 1\n[grpo]\nlr = 0.1\n")
    (d / "noweights.toml").write_text("[grpo]\ngroup_size = 4\n")
    (d / "g1.toml").write_text("[reward.weights]\nexact = 1\n[grpo]\ngroup_size = 1\n")
    presets.save_preset("good", {"exact": 1.0})
    for name, match in [("broken", "not valid TOML"), ("neg", "must be >= 0"), ("extra", "unknown key.*grpo.lr"),
                        ("noweights", r"\[reward.weights\] is missing"), ("g1", "group_size must be an integer")]:
        with pytest.raises(presets.PresetError) as e:
            presets.load_preset(name)
        msg = str(e.value)
        assert "\n" not in msg and str(d / f"{name}.toml") in msg and re.search(match, msg)
    listed = presets.list_presets()  # bad files are listed as their error, never skipped or raised
    assert len(listed) == 6
    assert [x.name for x in listed if isinstance(x, presets.Preset)] == ["good"]
    assert sum(isinstance(x, presets.PresetError) for x in listed) == 5


def test_apply_preset_gives_a_valid_config_with_its_values(runs_dir):
    presets.save_preset("p", {"answer_f1": 0.7, "exact": 0.3}, group_size=6, min_group_std=0.0)
    cfg = presets.apply_preset({"grpo": {"steps": 5, "group_size": 8}, "reward": {"weights": {"format": 1.0}}},
                         presets.load_preset("p"))
    rc = validate(from_dict(cfg))
    assert rc.reward.weights == {"answer_f1": 0.7, "exact": 0.3}  # replaced wholesale, not merged
    assert (rc.grpo.group_size, rc.grpo.min_group_std, rc.grpo.steps) == (6, 0.0, 5)
    assert presets.form_defaults(presets.load_preset("p")) == {"weights": {"answer_f1": 0.7, "exact": 0.3}, "from_preset": "p",
                                                   "group_size": 6, "min_group_std": 0.0}


def test_a_ledger_reuse_row_becomes_a_preset(runs_dir):
    row = pd.Series({"step": 50, "kind": "set_weights", "new": {"answer_f1": 0.6, "citation": 0.4},
                     "ratio_before": 0.2, "ratio_after": 0.5, "reuse": True})
    kw = presets.from_ledger_row(row, "run-1")
    presets.save_preset("from-ledger", **kw)
    p = presets.load_preset("from-ledger")
    assert p.weights == {"answer_f1": 0.6, "citation": 0.4} and p.source_run == "run-1"
    assert "step 50" in p.note and "0.20 -> 0.50" in p.note
    with pytest.raises(presets.PresetError, match="only weight changes"):
        presets.from_ledger_row(pd.Series({"step": 3, "kind": "set_threshold", "new": 0.1, "ratio_before": np.nan,
                                     "ratio_after": np.nan}))


# ---- the runs page: start a run from a preset (AppTest, real stores, no browser) ------------------------------
def _runs_page():
    from tests.helpers_dashboard import app_test
    at = app_test()
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_runs_page_fills_the_start_form_from_a_preset_and_lists_a_bad_file(runs_dir):
    presets.save_preset("mix", {"answer_f1": 0.7, "citation": 0.3}, group_size=6, min_group_std=0.02, note="from r1")
    (runs_dir / "presets" / "broken.toml").write_text("[reward.weights\n")
    at = _runs_page()
    assert any("broken.toml: not valid TOML" in w.value for w in at.warning)  # one line naming the file
    at.selectbox(key="start_preset").set_value("mix").run()
    assert not at.exception
    inputs = {n.label: n.value for n in at.number_input}
    assert inputs["Group size G"] == 6 and inputs["min_group_std"] == pytest.approx(0.02)
    assert inputs["answer_f1"] == pytest.approx(0.7) and inputs["citation"] == pytest.approx(0.3)
    assert "exact" not in inputs  # the preset's weights replace the demo's
    assert any("Preset **mix**" in c.value for c in at.caption)
    next(t for t in at.text_input if t.label == "Run id (optional)").set_value("../x")  # starts nothing
    next(b for b in at.button if b.label == "Start run").click().run()
    assert any("not allowed" in e.value for e in at.error)
    at.button(key="delete_preset").click().run()  # delete: the form goes back to the defaults
    assert not at.exception and [p.name for p in presets.list_presets() if isinstance(p, presets.Preset)] == []
    assert "exact" in {n.label for n in at.number_input}


def test_runs_page_says_stopped_by_the_autopilot(runs_dir):
    from grpo_core.runs.store import RunStore
    with RunStore.create("ap", {"grpo": {"steps": 10}}) as s:
        s.set_status("stopped", stop_reason="autopilot", stop_message="stop request 2 from autopilot: ...")
    with RunStore.create("user", {"grpo": {"steps": 10}}) as s:
        s.set_status("stopped", stop_reason="ui")
    at = _runs_page()
    md = " ".join(m.value for m in at.markdown)
    assert "**ap**  \n:gray[stopped (autopilot)]" in md and "**user**  \n:gray[stopped]" in md


def test_analysis_page_saves_a_reuse_row_as_a_preset(runs_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.helpers_dashboard import REPO
    from tests.test_report import CHANGE_AT_50, change_scores, make_run
    monkeypatch.chdir(REPO)
    make_run("chg", steps=60, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    at = AppTest.from_file(str(REPO / "pages" / "analysis.py"), default_timeout=60)
    at.session_state["run_id"] = "chg"
    at.run()
    assert not at.exception
    at.text_input(key="an_preset_name").set_value("from-ledger").run()
    at.button(key="an_save_preset").click().run()
    assert not at.exception and any("saved preset from-ledger" in s.value for s in at.success)
    p = presets.load_preset("from-ledger")
    assert p.weights == CHANGE_AT_50[0][2]["weights"]  # the weights in force after the change
    assert p.source_run == "chg" and "step 50" in p.note
    at.text_input(key="an_preset_name").set_value("../bad").run()
    at.button(key="an_save_preset").click().run()
    assert any("not allowed" in e.value for e in at.error)
