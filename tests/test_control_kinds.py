"""Which request kinds a run accepts (requests.accepted_kinds, from its meta), and the live page
offering only those controls: a TRL run's callback applies weights, threshold, pause/resume,
stop and checkpoint, and rejects the rest, so the page does not offer the rest."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from grpo_core.dashboard import live_cards, live_view
from grpo_core.runs import requests
from grpo_core.runs.live_settings import CONTROL_KINDS
from grpo_core.runs.store import RunStore

TRL = ("set_weights", "set_threshold", "pause", "resume", "stop", "checkpoint")


def test_accepted_kinds_follow_the_run_kind_and_task():
    assert requests.accepted_kinds({"kind": "train", "config": {"task": {"name": "demo"}}}) == CONTROL_KINDS
    assert requests.accepted_kinds({}) == CONTROL_KINDS  # an older store without kind: the built-in trainer
    jsonl = requests.accepted_kinds({"kind": "train", "config": {"task": {"name": "jsonl"}}})
    assert "set_difficulty" not in jsonl and "set_group_size" in jsonl and "set_autopilot" in jsonl
    assert requests.accepted_kinds({"kind": "trl", "source": "trl"}) == TRL
    assert requests.accepted_kinds({"kind": "pilot"}) == ("stop",)
    assert requests.accepted_kinds({"kind": "import", "source": "trl"}) == ()
    assert requests.accepted_kinds({"kind": "train", "source": "wandb"}) == ()  # imported by an older version
    assert "GRPOConfig" in requests.unsupported_note({"kind": "trl"})
    assert "no difficulty levels" in requests.unsupported_note({"config": {"task": {"name": "jsonl"}}})
    assert requests.unsupported_note({"kind": "train"}) == ""


def test_the_trl_callback_rejects_exactly_the_kinds_it_does_not_accept(runs_dir):
    """The list is the callback's: every kind outside it is rejected with a reason by _claim."""
    import pytest
    trl = pytest.importorskip("grpo_core.integrations.trl")
    cb = trl.GRPOHealthCallback.__new__(trl.GRPOHealthCallback)
    cb.store, cb.names, cb._paused = RunStore.create("t", {}, kind="trl"), ["a"], False
    cb.trainer, cb.min_group_std = SimpleNamespace(reward_weights=torch.tensor([0.5])), 0.0  # what the handlers read
    cb.session = cb._new_session(cb.store)
    assert cb.session.accepts == TRL
    payloads = {"set_weights": {"weights": {"a": 1.0}}, "set_threshold": {"min_group_std": 0.02},
                "set_difficulty": {"level": 2}, "set_group_size": {"group_size": 4}, "set_prompts": {"prompts_per_step": 2},
                "set_steps": {"steps": 9}, "set_temperature": {"temperature": 0.5}, "set_autopilot": {"enabled": True},
                "stop": {}, "checkpoint": {}, "resume": {}}
    for kind, p in payloads.items():
        cb.store.request(kind, p)
    cb._claim(3, True)
    rows = cb.store.control().set_index("kind")
    applied = {k for k in payloads if rows.loc[k, "status"] == "applied"}
    assert applied == set(TRL) - {"pause", "resume"}  # resume is refused only because the run is not paused
    assert all(rows.loc[k, "message"] for k in payloads if k not in applied)
    cb.store.close()


def test_live_capabilities_treat_a_trl_run_as_live_and_steerable(runs_dir):
    from tests.helpers_dashboard import synth_run
    store = synth_run(runs_dir, "t", 6)
    store.set_meta(kind="trl", source="trl")
    caps = live_cards.capabilities(live_view.load(store.run_dir))
    assert not caps["imported"] and caps["steer"] and caps["accepts"] == TRL and "GRPOConfig" in caps["accepts_note"]
    store.close()


def test_live_page_offers_a_trl_run_only_the_controls_its_callback_applies(runs_dir):
    from tests.helpers_dashboard import app_test, synth_run
    store = synth_run(runs_dir, "t", 6)
    store.set_meta(kind="trl", source="trl")
    at = app_test()
    at.session_state["run_id"] = "t"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    steering = {s.key for s in at.slider} - {"smoothing"}  # the chart smoothing slider is not a control
    assert steering == {f"w:t:{m}" for m in store.config["reward"]["weights"]} | {"thr:t"}
    # no G / prompts / temperature / steps, no autopilot switch: the charts' own toggle only
    assert not at.number_input and [t.key for t in at.toggle] == ["raw_steps"]
    assert any("GRPOConfig" in c.value for c in at.caption)
    assert [h.value for h in at.subheader][0] == "Reward weights, threshold"
    assert {b.key for b in at.button} >= {"apply", "pause", "stop"}
    at.slider(key="thr:t").set_value(0.05).run()
    at.button(key="apply").click().run()
    assert list(store.control()["kind"]) == ["set_threshold"]
    store.close()
    # the built-in trainer's run keeps every control
    own = synth_run(runs_dir, "o", 6)
    at = app_test()
    at.session_state["run_id"] = "o"
    at.run()
    assert {n.key for n in at.number_input} == {f"{k}:o" for k in live_view.RUN_SETTINGS}
    assert {t.key for t in at.toggle} == {"raw_steps", "ap:o"}  # the charts' toggle and the autopilot switch
    assert "lvl:o" in {s.key for s in at.slider}
    own.close()
