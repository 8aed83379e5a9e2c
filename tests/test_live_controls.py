"""The new live requests: set_group_size, set_prompts, set_steps, set_temperature, set_autopilot.
Validation and CLI parsing, the live page's helpers, and a real trainer process applying each
exactly once at a step boundary (slow)."""
from __future__ import annotations

import time

import pandas as pd
import pytest

from grpo_core.__main__ import main
from grpo_core.analysis import charts, ledger, run_data
from grpo_core.dashboard import live_view, processes, request_view
from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings, requests
from grpo_core.runs.run_meta import status_label
from grpo_core.runs.store import APPLIED, EV_AUTOPILOT, EV_CHANGE, REJECTED, RunStore


# ---- validation and the CLI ----------------------------------------------------------------------------
@pytest.mark.parametrize("action, values, payload", [
    ("set-group-size", ["12"], {"group_size": 12}), ("set-prompts", ["4"], {"prompts_per_step": 4}),
    ("set-steps", ["20"], {"steps": 20}), ("set-temperature", ["0.7"], {"temperature": 0.7}),
    ("set-autopilot", ["on"], {"enabled": True}), ("set-autopilot", ["OFF"], {"enabled": False})])
def test_cli_parses_and_validates_the_new_kinds(action, values, payload):
    kind = action.replace("-", "_")
    assert requests.validate_request(kind, requests.parse_cli_request(action, values)) == payload


@pytest.mark.parametrize("kind, payload, match", [
    ("set_group_size", {"group_size": 1}, "group_size must be an integer from 2"),
    ("set_group_size", {"group_size": 2.5}, "group_size must be an integer"),
    ("set_group_size", {"group_size": True}, "group_size must be an integer"),
    ("set_prompts", {"prompts_per_step": 0}, "prompts_per_step must be an integer from 1"),
    ("set_steps", {"steps": 0}, "steps must be an integer from 1"),
    ("set_temperature", {"temperature": 0.0}, r"temperature must be a number in \(0, 10\]"),
    ("set_temperature", {"temperature": float("inf")}, "temperature must be a number"),
    ("set_autopilot", {"enabled": "yes"}, "enabled must be true or false"),
    ("set_weights", {"weights": {"exact": 1.0}, "reason": 3}, "reason must be text"),
    ("stop", {"undo_of": -1}, "undo_of must be a request id")])
def test_bad_values_are_one_line_errors_naming_the_field(kind, payload, match):
    with pytest.raises(ConfigError, match=match) as e:
        requests.validate_request(kind, payload)
    assert "\n" not in str(e.value)


def test_a_reason_and_undo_of_travel_with_any_request():
    assert requests.validate_request("stop", {"reason": "ratio 0 for 20 steps"}) == {"reason": "ratio 0 for 20 steps"}
    assert requests.validate_request("set_group_size", {"group_size": 8, "undo_of": 3, "reason": "undo"}) == \
        {"group_size": 8, "undo_of": 3, "reason": "undo"}


def test_cli_control_writes_the_request_and_bad_input_exits_2(runs_dir, capsys):
    RunStore.create("r", {"reward": {"weights": {"exact": 1.0}}}).close()
    assert main(["control", str(runs_dir / "r"), "set-group-size", "12"]) == 0
    assert main(["control", str(runs_dir / "r"), "set-autopilot", "off"]) == 0
    assert main(["control", str(runs_dir / "r"), "set-steps", "0"]) == 2
    assert main(["control", str(runs_dir / "r"), "set-temperature", "hot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: steps must be an integer from 1 to 10000000 (step budget), got 0",
                   "error: set-temperature value must be a number, got 'hot'"]
    with RunStore.open(runs_dir / "r") as s:
        rows = s.control()
    assert list(zip(rows["kind"], rows["payload"], rows["source"])) == [
        ("set_group_size", {"group_size": 12}, "cli"), ("set_autopilot", {"enabled": False}, "cli")]


# ---- the live page's helpers (no browser, no trainer) -------------------------------------------------------
def _state(meta: dict, control_rows: list[dict] = (), moves: list[dict] = ()) -> live_view.LiveState:
    st = live_view.LiveState(run_id="r", db="x", meta=meta, metrics=["a", "b"], last_step=10)
    st.control = pd.DataFrame(list(control_rows), columns=["id", "time", "kind", "payload", "status",
                                                           "applied_step", "message", "source"])
    st.moves = list(moves)
    return st


CFG = {"grpo": {"group_size": 8, "prompts_per_step": 4, "temperature": 1.0, "steps": 100, "min_group_std": 0.01},
       "reward": {"weights": {"a": 0.5, "b": 0.5}}, "autopilot": {"enabled": False}}


def test_settings_in_force_come_from_meta_settings_else_the_config():
    cur = live_view.current_settings(_state({"config": CFG}))
    assert (cur["group_size"], cur["prompts_per_step"], cur["temperature"], cur["steps"], cur["autopilot"]) == \
        (8, 4, 1.0, 100, False)
    settings = {"group_size": 12, "prompts_per_step": 4, "temperature": 0.7, "steps": 300, "autopilot": True}
    cur = live_view.current_settings(_state({"config": CFG, "settings": settings}))
    assert (cur["group_size"], cur["temperature"], cur["steps"], cur["autopilot"]) == (12, 0.7, 300, True)
    assert _state({"config": CFG, "settings": settings}).steps_total == 300  # progress follows set_steps


def test_pending_changes_include_the_run_settings_that_differ():
    cur = live_view.current_settings(_state({"config": CFG}))
    todo = request_view.pending_changes(cur, cur["weights"], cur["min_group_std"], cur["level"],
                                {"group_size": 12, "prompts_per_step": 4, "temperature": 0.7, "steps": 100})
    assert todo == [("set_group_size", {"group_size": 12}), ("set_temperature", {"temperature": 0.7})]
    assert request_view.pending_changes(cur, cur["weights"], cur["min_group_std"], cur["level"], {"steps": 100}) == []
    assert [live_settings.describe(k, p) for k, p in todo] == ["group_size 12", "temperature 0.7"]
    assert live_settings.describe("set_autopilot", {"enabled": True}) == "autopilot on"


def test_autopilot_moves_list_status_reason_and_undo():
    move = {"request_id": 5, "move": "group_size", "kind": "set_group_size", "reason": "ratio 0.2 <= 0.5 ...",
            "before": {"group_size": 8}, "request": {"group_size": 12, "reason": "ratio 0.2 <= 0.5 ..."}, "step": 30}
    stop = {"request_id": 6, "move": "stop", "kind": "stop", "reason": "near zero", "before": {}, "request": {},
            "step": 60}
    rows = [{"id": 5, "time": 0, "kind": "set_group_size", "payload": move["request"], "status": APPLIED,
             "applied_step": 31, "message": "", "source": "autopilot"},
            {"id": 6, "time": 0, "kind": "stop", "payload": {}, "status": APPLIED, "applied_step": 60,
             "message": "", "source": "autopilot"}]
    [m_stop, m_g] = request_view.autopilot_moves(_state({"config": CFG}, rows, [move, stop]))  # newest first
    assert m_g["status"] == "applied at step 31" and m_g["summary"] == "group_size 12"
    assert m_g["reason"].startswith("ratio 0.2") and m_stop["undo"] is None
    kind, payload = m_g["undo"]
    assert kind == "set_group_size" and payload["group_size"] == 8 and payload["undo_of"] == 5
    # once an undo request exists, the move shows it and offers no second undo
    rows.append({"id": 7, "time": 0, "kind": kind, "payload": payload, "status": "pending", "applied_step": None,
                 "message": "", "source": "ui"})
    m_g = request_view.autopilot_moves(_state({"config": CFG}, rows, [move, stop]))[1]
    assert m_g["undo"] is None and m_g["undone_by"] == 7


def test_new_kinds_are_chart_markers():
    ch = pd.DataFrame({"step": [3, 4, 5, 6], "kind": ["set_group_size", "set_prompts", "set_temperature", "set_steps"],
                       "request": [{"group_size": 12}, {"prompts_per_step": 2}, {"temperature": 0.7}, {"steps": 9}],
                       "source": ["autopilot", "ui", "ui", "ui"], "message": [""] * 4})
    shapes, notes = charts.marker_specs(ch)
    assert [s["x0"] for s in shapes] == [3, 4, 5]  # a step budget change alters no step: not drawn
    assert live_settings.describe("set_group_size", {"group_size": 12, "reason": "ratio 0.2 ...", "undo_of": 3}) == \
        "group_size 12"


# ---- a real trainer ---------------------------------------------------------------------------------------
SMALL = {"grpo": {"steps": 400, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6},
         "model": {"warm_start_steps": 0}, "log": {"progress": False, "checkpoint_every": 0}}


def wait_for(fn, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _meta(run_dir):
    with RunStore.open(run_dir, readonly=True) as s:
        return s.get_meta(), s.last_step() or 0


@pytest.mark.slow
def test_a_real_trainer_applies_each_new_request_exactly_once_at_a_step_boundary(runs_dir):
    rid = processes.start_run(SMALL, run_id="live", root=runs_dir)
    run = runs_dir / rid
    wait_for(lambda: _meta(run)[1] >= 2, 240, "two steps")
    requests.send(run, "pause", {})
    wait_for(lambda: _meta(run)[0]["status"] == "paused", 60, "paused")
    k = _meta(run)[1]  # paused after step k: everything below takes effect at step k + 1
    ids = {kind: requests.send(run, kind, payload) for kind, payload in [
        ("set_group_size", {"group_size": 3}), ("set_prompts", {"prompts_per_step": 3}),
        ("set_temperature", {"temperature": 0.7}), ("set_autopilot", {"enabled": True})]}
    low = requests.send(run, "set_steps", {"steps": k - 1})  # below the current step: rejected
    ids["set_steps"] = requests.send(run, "set_steps", {"steps": k + 3})  # 400 -> k + 3: the run ends there
    requests.send(run, "resume", {})
    wait_for(lambda: _meta(run)[0]["status"] == "finished", 120, "the run to finish at the new budget")
    meta, last = _meta(run)
    assert last == k + 3
    with RunStore.open(run, readonly=True) as s:
        ctl, groups, ev = s.control().set_index("id"), s.groups(), s.events(kinds=[EV_CHANGE, "rejected"])
    for kind, i in ids.items():  # applied once, from the next step, one event each
        assert ctl.loc[i, "status"] == APPLIED and int(ctl.loc[i, "applied_step"]) == k + 1, (kind, ctl.loc[i])
        assert sum(p.get("request_id") == i for p in ev["payload"]) == 1
    assert ctl.loc[low, "status"] == REJECTED and f"below the current step {k}" in ctl.loc[low, "message"]
    assert ctl.loc[ids["set_steps"], "message"] == f"steps 400 -> {k + 3}"
    # what the steps trained on: G 4 x 2 prompts up to step k, G 3 x 3 prompts after
    before, after = groups[groups["step"] <= k], groups[groups["step"] > k]
    assert set(before["size"]) == {4} and before.groupby("step").size().eq(2).all()
    assert set(after["size"]) == {3} and after.groupby("step").size().eq(3).all()
    assert sorted(after["step"].unique()) == [k + 1, k + 2, k + 3]
    s = meta["settings"]
    assert (s["group_size"], s["prompts_per_step"], s["temperature"], s["steps"], s["autopilot"]) == \
        (3, 3, 0.7, k + 3, True)
    assert status_label(meta["status"], meta.get("stop_reason")) == "finished"
    # the analysis ledger has a row per change, old -> new
    led = ledger.change_ledger(run_data.load_run(run))
    changes = dict(zip(led["kind"], led["change"]))
    assert changes["set_group_size"] == "group_size 4 -> 3" and changes["set_prompts"] == "prompts_per_step 2 -> 3"
    assert changes["set_temperature"] == "temperature 1 -> 0.7" and changes["set_autopilot"] == "autopilot off -> on"
    assert changes["set_steps"] == f"steps 400 -> {k + 3}"
    assert not led.loc[led["kind"].isin(["set_steps", "set_autopilot"]), "reuse"].any()


# ---- the live page (AppTest, real store, no trainer: requests stay pending) ------------------------------------
def _live_page(run_id: str):
    from tests.helpers_dashboard import app_test
    at = app_test()
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _autopilot_move(store, step: int, g_before: int, g_after: int) -> int:
    """What the trainer and the autopilot write for one G move, applied from step + 1."""
    reason = f"ratio 0.20 <= 0.5 for 10 steps, rare outcomes in groups: group size {g_before} -> {g_after}"
    rid = store.request("set_group_size", {"group_size": g_after, "reason": reason}, source="autopilot")
    store.add_event(EV_AUTOPILOT, {"request_id": rid, "move": "group_size", "kind": "set_group_size",
                                   "reason": reason, "before": {"group_size": g_before},
                                   "request": {"group_size": g_after, "reason": reason}}, step=step)
    store.claim_pending()
    store.resolve_request(rid, True, step + 1, f"group_size {g_before} -> {g_after} from step {step + 1}")
    settings = {**(store.get_meta().get("settings") or {}), "group_size": g_after}
    store.set_meta(settings=settings)
    return rid


def test_live_page_lists_autopilot_moves_and_undo_sends_the_inverse(runs_dir):
    from tests.helpers_dashboard import synth_run
    store = synth_run(runs_dir, "r", 12)
    store.set_meta(settings={"group_size": 8, "prompts_per_step": 8, "temperature": 1.0, "steps": 12,
                             "autopilot": True})
    rid = _autopilot_move(store, 12, 8, 16)
    at = _live_page("r")
    assert at.toggle(key="ap:r").value is True  # the switch shows the autopilot in force
    md = " ".join(m.value for m in at.markdown)
    assert f"`#{rid}` after step 12 · **group_size 16** — applied at step 13" in md
    assert "rare outcomes in groups: group size 8 -> 16" in md
    # the G input follows the move (the user had not touched it): no pending change offered
    assert at.number_input(key="group_size:r").value == 16
    assert not any("group_size=" in c.value for c in at.caption if c.value.startswith("Pending change"))
    at.button(key=f"undo_{rid}").click().run()
    assert not at.exception
    rows = store.control()
    undo = rows.iloc[-1]
    assert (undo["kind"], undo["source"], undo["status"]) == ("set_group_size", "ui", "pending")
    assert undo["payload"] == {"group_size": 8, "undo_of": rid, "reason": f"undo of autopilot move #{rid}"}
    assert f"undone by #{int(undo['id'])}" in " ".join(m.value for m in at.markdown)
    assert not any(b.key == f"undo_{rid}" for b in at.button)  # one undo per move
    # switching the autopilot off is a request too
    at.toggle(key="ap:r").set_value(False).run()
    last = store.control().iloc[-1]
    assert (last["kind"], last["payload"], last["source"]) == ("set_autopilot", {"enabled": False}, "ui")
    store.close()


def test_live_page_run_settings_are_requests_and_presets_are_saved(runs_dir):
    from grpo_core.runs import presets
    from tests.helpers_dashboard import synth_run
    store = synth_run(runs_dir, "r", 12, steps_total=100)
    at = _live_page("r")
    at.number_input(key="group_size:r").set_value(12).run()
    at.number_input(key="steps:r").set_value(300).run()
    assert any(c.value == "Pending change: group_size 12; steps 300" for c in at.caption)
    at.button(key="apply").click().run()
    rows = store.control()
    assert list(zip(rows["kind"], rows["payload"])) == [("set_group_size", {"group_size": 12}),
                                                        ("set_steps", {"steps": 300})]
    at.text_input(key="preset_name:r").set_value("mine").run()
    at.button(key="save_preset").click().run()
    p = presets.load_preset("mine")
    assert p.weights == live_view.current_settings(live_view.load(runs_dir / "r"))["weights"] and p.source_run == "r"
    assert p.group_size == 8  # the settings in force (the G request is still pending)
    store.close()
