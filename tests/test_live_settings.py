"""The live-settings registry, and top_p end to end: a setting that is one entry in
live_settings.py reaches the CLI, the validation, the trainer, the settings in force, the
change ledger, the chart markers, the live page's inputs and a resume's replay."""
from __future__ import annotations

import shutil

import pytest

from grpo_core.__main__ import main
from grpo_core.analysis import charts, report
from grpo_core.dashboard import live_view, request_view
from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings, requests
from grpo_core.runs.live_settings import CONTROL_KINDS
from grpo_core.runs.run_meta import FINISHED, RUNNING
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train.checkpoints import checkpoint_dirs
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=6",
        "log.progress=false", "log.checkpoint_every=0", "grpo.steps=3"]


def _trainer(root, resume=False):
    cfg = load_config(None, TINY)
    store = RunStore.create("r", cfg.to_dict(), root=root, exist_ok=True)
    return Trainer(cfg, store, resume=resume, log=lambda m: None), store


def test_every_setting_is_a_request_kind_the_built_in_trainer_accepts_and_the_cli_offers():
    accepted = requests.accepted_kinds({"kind": "train", "config": {"task": {"name": "demo"}}})
    for setting in live_settings.SETTINGS:
        assert setting.kind in CONTROL_KINDS and setting.kind in accepted
        assert setting.cli in requests.cli_actions() and setting.cli in requests.cli_help()
    assert len(set(live_settings.KINDS)) == len(live_settings.KINDS)


@pytest.mark.parametrize("setting", live_settings.NUMBER_SETTINGS, ids=lambda s: s.key)
def test_a_number_setting_refuses_its_bounds_by_name(setting):
    inside = setting.lo + (1 if setting.integer else 0.5 * min(1.0, setting.hi - setting.lo))
    assert setting.check_value(inside) == inside
    outside = [setting.hi + 1, "x", True, float("nan")] + ([setting.lo] if setting.lo_open else [setting.lo - 1])
    for bad in outside:
        with pytest.raises(ConfigError, match=f"^{setting.key} must be"):
            requests.validate_request(setting.kind, {setting.key: bad})


def test_the_config_has_the_live_bounds():
    with pytest.raises(ConfigError, match="grpo.group_size must be an integer from 2 to 1024"):
        load_config(None, ["grpo.group_size=2048"])
    with pytest.raises(ConfigError, match=r"grpo.top_p must be in \(0, 1\]"):  # the config's own check first
        load_config(None, ["grpo.top_p=0"])


def test_top_p_from_the_cli_to_the_trainer_ledger_markers_and_resume(tmp_path, capsys):
    tr, store = _trainer(tmp_path)
    run = store.run_dir
    # the CLI: parsed and checked against the registry's bounds, one line on bad input
    assert requests.parse_cli_request("set-top-p", ["0.9"]) == {"top_p": 0.9}
    assert main(["control", str(run), "set-top-p", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: top_p must be a number in (0, 1], got 0.0"
    tr.save_checkpoint("periodic")  # at step 0: the resume below starts from here and must replay
    assert main(["control", str(run), "set-top-p", "0.9"]) == 0
    assert tr.run() == FINISHED
    ctl = store.control()
    assert ctl[["kind", "status", "applied_step"]].values.tolist() == [["set_top_p", "applied", 1]]
    assert ctl["message"].iloc[0] == "top_p 1 -> 0.9 from step 1"
    assert tr.cfg.grpo.top_p == 0.9 and store.get_meta()["settings"]["top_p"] == 0.9  # in force, for readers
    assert live_view.run_settings(store.get_meta())["top_p"] == 0.9
    # the change ledger and the chart markers
    rep = report.build_report(run, examples=False)
    row = rep.ledger.iloc[0]
    assert row["kind"] == "set_top_p" and row["change"] == "top_p 1 -> 0.9" and row["step"] == 1
    shapes, notes = charts.marker_specs(store.changes())
    assert [n["text"] for n in notes] == ["top_p"] and shapes[0]["x0"] == 1
    # the live page would send it back as a set_top_p request (the pending-change diff)
    assert request_view.pending_changes({**live_view.run_settings(store.get_meta()), "weights": {}, "min_group_std": 0.01,
                                 "level": 1}, {}, 0.01, 1, {"top_p": 0.8}) == [("set_top_p", {"top_p": 0.8})]
    # resume from the step-0 checkpoint: the request applied after it is replayed
    for ckpt in checkpoint_dirs(run)[1:]:
        shutil.rmtree(ckpt)
    store.set_status(RUNNING)
    resumed, _ = _trainer(tmp_path, resume=True)
    assert resumed.step == 0 and resumed.cfg.grpo.top_p == 0.9
    store.close()


def test_the_live_page_has_a_top_p_input(runs_dir):
    from tests.helpers_dashboard import app_test, synth_run
    own = synth_run(runs_dir, "o", 6)
    at = app_test()
    at.session_state["run_id"] = "o"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    top_p = next(n for n in at.number_input if n.key == "top_p:o")
    assert top_p.label == "Top-p" and top_p.max == 1.0
    top_p.set_value(0.8).run()
    at.button(key="apply").click().run()
    assert list(own.control()["kind"]) == ["set_top_p"] and own.control()["payload"].iloc[0]["top_p"] == 0.8
    own.close()


def test_max_new_tokens_is_one_entry_of_the_registry_and_reaches_the_sampler(tmp_path, capsys):
    """The setting added as one NumberSetting: the CLI parses and bounds it, the trainer applies it
    from the next step (completions are cut at the new length), the ledger and markers name it."""
    setting = live_settings.BY_KIND["set_max_new_tokens"]
    assert setting in live_settings.RUN_INPUTS and setting.cli in requests.cli_actions()
    tr, store = _trainer(tmp_path)
    run = store.run_dir
    assert main(["control", str(run), "set-max-new-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("error: max_new_tokens must be an integer from 1 to 32768 "
                                               "(the most tokens sampled per completion), got 0")
    assert main(["control", str(run), "set-max-new-tokens", "2"]) == 0
    assert tr.run() == FINISHED
    ctl = store.control()
    assert ctl[["kind", "status", "applied_step"]].values.tolist() == [["set_max_new_tokens", "applied", 1]]
    assert ctl["message"].iloc[0] == "max_new_tokens 6 -> 2 from step 1"
    assert store.get_meta()["settings"]["max_new_tokens"] == 2
    texts = store.rollouts(with_text=True)["completion"].dropna()
    assert len(texts) and texts.str.len().max() <= 2  # the built-in tokenizer is one character a token
    shapes, notes = charts.marker_specs(store.changes())
    assert [n["text"] for n in notes] == ["len"] and shapes[0]["x0"] == 1
    store.close()
