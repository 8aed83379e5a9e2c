"""grpo_core.dashboard.widget_state: the live page's widget bookkeeping, over a plain dict (no browser,
no Streamlit): seeding, following changes made elsewhere, the weight range that only
grows, the autopilot switch, this session's requests, and the widgets' arguments taken
from the settings registry."""
import math

import pytest

from grpo_core.dashboard import live_view, widget_state
from grpo_core.runs import live_settings

W = {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2, "format": 0.1, "length": 0.1}


def settings(weights=None, thr=0.01, lvl=1, **run) -> dict:
    """What live_view.current_settings returns for a run of ours."""
    base = {"group_size": 8, "prompts_per_step": 8, "temperature": 1.0, "top_p": 1.0, "steps": 200}
    return {"weights": dict(W if weights is None else weights), "min_group_std": thr, "level": lvl,
            "outcome_metric": None, **base, **run, "autopilot": False}


def test_keys_are_per_run_and_the_ones_the_page_has_always_used():
    k = widget_state.keys("r", W)
    assert k.weights == {m: f"w:r:{m}" for m in W}
    assert (k.thr, k.lvl, k.top, k.seen) == ("thr:r", "lvl:r", "wtop:r", "seen:r")
    assert k.run == {key: f"{key}:r" for key in live_view.RUN_SETTINGS}
    assert (k.suggestions, k.autopilot, k.autopilot_seen, k.preset_name) == ("sugg:r", "ap:r", "ap_seen:r",
                                                                             "preset_name:r")
    other = widget_state.keys("s", W)
    assert not set(k.weights.values()) & set(other.weights.values()) and k.thr != other.thr


def test_first_sync_seeds_every_widget_from_the_settings_in_force():
    ss = {}
    cur = settings({**W, "length": 0.123}, thr=0.02, lvl=3, temperature=0.7, group_size=16.0)
    k = widget_state.sync(ss, "r", cur)
    assert {m: ss[key] for m, key in k.weights.items()} == {**W, "length": 0.12}  # the sliders' resolution
    assert ss[k.thr] == 0.02 and isinstance(ss[k.thr], float)
    assert ss[k.lvl] == 3 and isinstance(ss[k.lvl], int)
    assert ss[k.run["group_size"]] == 16 and isinstance(ss[k.run["group_size"]], int)  # the registry's type
    assert ss[k.run["temperature"]] == 0.7 and isinstance(ss[k.run["temperature"]], float)
    assert ss[k.top] == 1.0  # weights up to 1: the range is [0, 1]
    assert ss[k.seen]["weights"] == cur["weights"] and ss[k.seen]["weights"] is not cur["weights"]  # a copy


def test_a_setting_the_run_does_not_have_is_not_seeded():
    ss = {}
    k = widget_state.sync(ss, "r", settings(top_p=None))
    assert k.run["top_p"] not in ss and ss[k.run["group_size"]] == 8


def test_a_second_sync_with_nothing_changed_touches_nothing_the_user_moved():
    ss = {}
    k = widget_state.sync(ss, "r", settings())
    ss[k.weights["length"]], ss[k.thr], ss[k.run["group_size"]] = 0.7, 0.05, 12  # the user moves them
    widget_state.sync(ss, "r", settings())
    assert (ss[k.weights["length"]], ss[k.thr], ss[k.run["group_size"]]) == (0.7, 0.05, 12)


def test_shown_values_are_what_the_controls_hold_and_the_setting_in_force_for_one_not_drawn():
    """What a button's callback reads: the session state as the browser sent it."""
    ss, cur = {}, settings(lvl=2)
    k = widget_state.sync(ss, "r", cur)
    ss[k.weights["length"]], ss[k.thr], ss[k.lvl], ss[k.run["group_size"]] = 0.7, 0.05, 3, 12  # the user moves them
    accepts = {live_settings.SET_DIFFICULTY, "set_group_size"}
    assert widget_state.shown_values(ss, k, accepts, cur) == ({**W, "length": 0.7}, 0.05, 3, {"group_size": 12})
    del ss[k.weights["exact"]], ss[k.thr]  # not drawn yet: the setting in force, never 0
    weights, thr, lvl, run = widget_state.shown_values(ss, k, {"set_weights"}, cur)
    assert weights == {**W, "length": 0.7} and thr == 0.01 and lvl == 2 and run == {}  # no level slider: in force


def test_an_untouched_input_follows_a_change_made_elsewhere_an_edited_one_keeps_the_users_value():
    ss = {}
    k = widget_state.sync(ss, "r", settings())
    ss[k.weights["length"]] = 0.7  # edited
    ss[k.run["temperature"]] = 0.9  # edited
    # e.g. an autopilot move, another tab or the CLI: every setting changes at once
    widget_state.sync(ss, "r", settings({**W, "length": 0.9, "exact": 0.5}, thr=0.03, lvl=2, temperature=1.5,
                                    group_size=12))
    assert ss[k.weights["length"]] == 0.7 and ss[k.run["temperature"]] == 0.9  # kept: not reverted, not lost
    assert ss[k.weights["exact"]] == 0.5 and ss[k.thr] == 0.03 and ss[k.lvl] == 2  # followed
    assert ss[k.run["group_size"]] == 12 and isinstance(ss[k.run["group_size"]], int)
    assert ss[k.weights["answer_f1"]] == 0.4  # unchanged settings: unchanged inputs


def test_follow_compares_at_the_sliders_resolution():
    ss = {}
    k = widget_state.sync(ss, "r", settings({**W, "length": 0.1234}))
    assert ss[k.weights["length"]] == 0.12
    widget_state.sync(ss, "r", settings({**W, "length": 0.3}))  # the slider shows 0.12 == round(0.1234, 2)
    assert ss[k.weights["length"]] == 0.3


def test_the_weight_range_is_fixed_and_only_grows_then_every_slider_is_reseeded():
    ss = {}
    k = widget_state.sync(ss, "r", settings())
    assert ss[k.top] == 1.0
    ss[k.weights["answer_f1"]] = 0.8  # the user moved one
    widget_state.sync(ss, "r", settings({**W, "length": 0.9}))  # within the range: it stays
    assert ss[k.top] == 1.0 and ss[k.weights["answer_f1"]] == 0.8 and ss[k.weights["length"]] == 0.9
    widget_state.sync(ss, "r", settings({**W, "length": 1.6}))  # beyond it: grows, and the sliders re-seed
    assert ss[k.top] == widget_state.slider_top({**W, "length": 1.6}) == 2.41
    assert ss[k.weights["length"]] == 1.6 and ss[k.weights["answer_f1"]] == 0.4  # never zeroed
    widget_state.sync(ss, "r", settings({**W, "length": 0.2}))  # a smaller weight never shrinks it
    assert ss[k.top] == 2.41


@pytest.mark.parametrize("weights, top", [({}, 1.5), ({"a": 0.0}, 1.0), ({"a": 0.5}, 1.0), ({"a": 1.0}, 1.5),
                                          ({"a": 3.0, "b": 0.1}, 4.5), ({"a": 1.6}, 2.41)])
def test_slider_top(weights, top):
    assert widget_state.slider_top(weights) == top
    assert all(w <= widget_state.slider_top(weights) for w in weights.values())


def test_a_missing_slider_key_reseeds_the_sliders():
    ss = {}
    k = widget_state.sync(ss, "r", settings())
    ss[k.weights["exact"]] = 0.9
    del ss[k.thr]  # e.g. Streamlit dropped a widget's state that was not drawn
    widget_state.sync(ss, "r", settings())
    assert ss[k.thr] == 0.01 and ss[k.weights["exact"]] == 0.3


def test_load_values_is_reset_and_a_suggestions_load():
    ss = {}
    k = widget_state.sync(ss, "r", settings())
    ss[k.weights["length"]], ss[k.thr] = 0.7, 0.2
    widget_state.load_values(ss, k, {"length": 0.456, "unknown": 3.0})  # a suggestion: weights only
    assert ss[k.weights["length"]] == 0.46 and ss[k.thr] == 0.2 and "w:r:unknown" not in ss
    widget_state.load_values(ss, k, W, 0.01, 1)  # Reset: everything in force
    assert ss[k.weights["length"]] == 0.1 and ss[k.thr] == 0.01 and ss[k.lvl] == 1


def test_autopilot_switch_shows_the_setting_when_it_changes_and_the_users_flip_in_between():
    ss, k = {}, widget_state.keys("r")
    assert widget_state.sync_autopilot(ss, k, False) == "ap:r" and ss["ap:r"] is False
    ss["ap:r"] = True  # the user flips it (its request is on the way)
    widget_state.sync_autopilot(ss, k, False)
    assert ss["ap:r"] is True  # not flipped back while the request is pending
    widget_state.sync_autopilot(ss, k, True)  # applied
    assert ss["ap:r"] is True
    widget_state.sync_autopilot(ss, k, False)  # turned off elsewhere
    assert ss["ap:r"] is False


def test_my_requests_and_the_one_just_resolved():
    ss = {}
    widget_state.my_requests(ss, "r").append(3)
    assert widget_state.my_requests(ss, "r") == [3] and widget_state.my_requests(ss, "s") == []
    lines = [{"id": 3, "status": "pending"}, {"id": 2, "status": "applied"}]
    assert widget_state.open_requests(lines) == [lines[0]]
    assert not widget_state.request_resolved(ss, lines) and ss["open_requests"] == {3}
    assert not widget_state.request_resolved(ss, [{"id": 3, "status": "applying"}])
    assert widget_state.request_resolved(ss, [{"id": 3, "status": "applied"}])  # redraw once ...
    assert not widget_state.request_resolved(ss, [{"id": 3, "status": "applied"}])  # ... not again


@pytest.mark.parametrize("key", list(live_view.RUN_SETTINGS))
def test_run_inputs_take_label_bounds_type_and_help_from_the_registry(key):
    setting = live_view.RUN_SETTINGS[key]
    spec = widget_state.run_input_spec(setting)
    number = int if setting.integer else float
    assert spec["label"] == setting.label
    assert type(spec["min_value"]) is number and type(spec["max_value"]) is number
    assert spec["max_value"] == setting.hi
    assert spec["min_value"] == (setting.lo + widget_state.OPEN_BOUND_STEP if setting.lo_open else setting.lo)
    setting.check_value(spec["min_value"]), setting.check_value(spec["max_value"])  # both ends are values a request accepts
    assert spec["help"].startswith(setting.what)
    assert ("not below the step the run has reached" in spec["help"]) == (key == "steps")
    assert spec.get("step") == setting.step and spec.get("format") == setting.fmt


def test_the_page_shows_the_run_inputs_the_run_accepts_in_registry_order():
    every = [s.kind for s in live_settings.RUN_INPUTS]
    assert widget_state.run_inputs(every) == [s.key for s in live_settings.RUN_INPUTS]
    assert widget_state.run_inputs([live_settings.SET_STEPS, live_settings.SET_GROUP_SIZE]) == ["group_size", "steps"]
    assert widget_state.run_inputs([]) == []


def test_slider_specs():
    thr = widget_state.threshold_spec()
    setting = live_settings.BY_KEY["min_group_std"]
    assert (thr["label"], thr["step"], thr["format"], thr["help"]) == (setting.label, setting.step, setting.fmt,
                                                                       setting.what)
    assert thr["min_value"] == 0.0 and thr["max_value"] == widget_state.THRESHOLD_MAX < setting.hi
    assert widget_state.level_spec()["min_value"] == 1 and widget_state.level_spec()["max_value"] == 4
    w = widget_state.weight_spec("length", 2.41)
    assert w == {"label": "length", "min_value": 0.0, "max_value": 2.41, "step": widget_state.WEIGHT_STEP}
    assert math.isclose(widget_state.WEIGHT_STEP, 10 ** -widget_state.WEIGHT_DIGITS)


def test_steering_needs_no_streamlit():
    import ast
    tree = ast.parse(open(widget_state.__file__).read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.split(".")[0] == "streamlit"}
