"""grpo_core.dashboard.live_view: incremental, bounded reads of a run store, and what the pages show
(cards, what-if, requests, runs overview), on real SQLite stores."""
import subprocess

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import health
from grpo_core.dashboard import advice, live_cards, live_view, request_view, run_list
from grpo_core.errors import ConfigError
from grpo_core.runs import requests
from grpo_core.runs.config import DEMO_WEIGHTS, RunConfig
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    CUM_TRAINABLE_RATIO,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    REWARD,
    TIME_STEP,
    TRAINABLE_RATIO,
    metric_group_std,
)
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import synth_run

NEW_W = {"answer_f1": 0.5, "exact": 0.3, "citation": 0.1, "format": 0.05, "length": 0.05}


def _extend(store, start, steps, **kw):
    return synth_run(None, store.run_id, steps, store=store, start=start, **kw)


# ---- incremental loading -----------------------------------------------------------------------
def test_refresh_reads_only_the_new_steps(runs_dir):
    store = synth_run(runs_dir, "r", 30)
    st = live_view.load(store.run_dir)
    assert st.last_step == 30 and len(st.recent) == 30
    v = st.version
    again = live_view.load(store.run_dir, st)
    assert again is st and st.rows_read == 0 and st.version == v  # nothing new: nothing read

    _extend(store, 31, 5)
    live_view.load(store.run_dir, st)
    new_rows = store.scalars(since_step=30, names=st.names)
    assert st.rows_read == len(new_rows) > 0
    assert st.last_step == 35 and st.version == v + 1
    frame = live_view.chart_frame(st)
    full = store.scalars_wide(names=st.names)
    pd.testing.assert_series_equal(frame[TRAINABLE_RATIO], full[TRAINABLE_RATIO], check_names=False)


def _sums(store, names):
    w = store.scalars_wide(names=names)
    return w.sum(), w.notna().sum()


def test_memory_stays_bounded_while_watching_and_nothing_is_lost(runs_dir, monkeypatch):
    monkeypatch.setattr(live_view, "RECENT_STEPS", 10)
    monkeypatch.setattr(live_view, "MAX_BINS", 8)
    store = synth_run(runs_dir, "r", 5, steps_total=400)
    st = live_view.load(store.run_dir)
    step = 6
    for _ in range(30):
        _extend(store, step, 10, steps_total=400)
        step += 10
        live_view.load(store.run_dir, st)
        assert len(st.recent) <= 2 * live_view.RECENT_STEPS
        assert len(st.bin_sum) <= live_view.MAX_BINS
    assert st.bin_size > 1  # the bins widened as the run grew
    # Conservation: bins + raw rows hold exactly the store's sums and counts, per metric.
    total, count = _sums(store, st.names)
    held = st.bin_sum.sum() + st.recent.sum()
    held_n = st.bin_cnt.sum() + st.recent.notna().sum()
    for name in (TRAINABLE_RATIO, REWARD, metric_group_std("length")):
        assert held[name] == pytest.approx(total[name])
        assert held_n[name] == count[name]
    frame = live_view.chart_frame(st)
    assert frame.index.is_monotonic_increasing and frame.index[0] >= 1 and frame.index[-1] == step - 1
    assert len(frame) <= live_view.MAX_BINS + 2 * live_view.RECENT_STEPS
    np.testing.assert_allclose(frame[REWARD].tail(5), store.scalars_wide()[REWARD].tail(5))


def test_first_load_of_a_long_run_reads_it_binned(runs_dir, monkeypatch):
    monkeypatch.setattr(live_view, "RECENT_STEPS", 10)
    monkeypatch.setattr(live_view, "MAX_BINS", 8)
    store = synth_run(runs_dir, "r", 300, rollouts_last=5)
    st = live_view.load(store.run_dir)
    assert len(st.bin_sum) <= live_view.MAX_BINS and len(st.recent) == live_view.RECENT_STEPS
    assert st.rows_read <= (live_view.MAX_BINS + 1 + live_view.RECENT_STEPS) * len(st.names)  # not 300 x names
    total, count = _sums(store, st.names)
    assert (st.bin_sum.sum() + st.recent.sum())[REWARD] == pytest.approx(total[REWARD])
    assert (st.bin_cnt.sum() + st.recent.notna().sum())[REWARD] == count[REWARD] == 300
    frame = live_view.chart_frame(st)
    bins = frame[frame.index <= 290]
    # Each point is the mean of its bin: the first bin's value equals the mean of its raw steps.
    raw = store.scalars_wide(names=[REWARD])[REWARD]
    width = st.bin_size
    first_bin = raw[raw.index < width]  # steps 1..width-1 (bin 0 holds steps 0..width-1)
    assert bins[REWARD].iloc[0] == pytest.approx(first_bin.mean())
    assert bins.index[0] == pytest.approx((0 + width - 1) / 2)


def test_a_resumed_run_that_redid_steps_is_read_again(runs_dir):
    store = synth_run(runs_dir, "r", 30)
    st = live_view.load(store.run_dir)
    store.truncate_after(20)
    _extend(store, 21, 5, seed=99)  # different values for steps 21..25
    st2 = live_view.load(store.run_dir, st)
    assert st2.last_step == 25
    np.testing.assert_allclose(live_view.chart_frame(st2)[REWARD].to_numpy(),
                               store.scalars_wide()[REWARD].to_numpy())


def test_applied_changes_arrive_incrementally_as_markers(runs_dir):
    store = synth_run(runs_dir, "r", 20, changes={5: NEW_W})
    st = live_view.load(store.run_dir)
    assert st.changes["step"].tolist() == [5]
    _extend(store, 21, 10, changes={25: {**NEW_W, "length": 0.3}})
    live_view.load(store.run_dir, st)
    assert st.changes["step"].tolist() == [5, 25]
    assert st.changes["request"].iloc[1]["weights"]["length"] == 0.3
    assert live_view.current_settings(st)["weights"]["length"] == pytest.approx(0.3)  # logged weight in force


# ---- requests: pending -> applied at step N / rejected ------------------------------------------------
def test_request_status_lines_follow_the_trainer(runs_dir):
    store = synth_run(runs_dir, "r", 10)
    st = live_view.load(store.run_dir)
    a = requests.send(store.run_dir, "set_weights", {"weights": NEW_W})
    b = requests.send(store.run_dir, "set_threshold", {"min_group_std": 0.05})
    live_view.load(store.run_dir, st)
    assert [r["text"] for r in request_view.request_lines(st, [a, b])] == [
        "pending (applied at the next step boundary)"] * 2
    store.claim_pending()  # what the trainer does between steps
    store.resolve_request(a, True, 11, "weights ... from step 11")
    store.resolve_request(b, False, None, "min_group_std must be a number in [0, 1), got 2")
    live_view.load(store.run_dir, st)
    lines = {r["id"]: r["text"] for r in request_view.request_lines(st, [a, b])}
    assert lines == {a: "applied at step 11", b: "rejected: min_group_std must be a number in [0, 1), got 2"}
    assert request_view.request_lines(st, []) == []
    assert st.changes["step"].tolist() == [11]  # the applied one is a marker, the rejected one is not


def test_settings_include_changes_applied_from_a_step_not_logged_yet(runs_dir):
    store = synth_run(runs_dir, "r", 10)
    a = requests.send(store.run_dir, "set_weights", {"weights": NEW_W})
    b = requests.send(store.run_dir, "set_threshold", {"min_group_std": 0.05})
    store.claim_pending()
    store.resolve_request(a, True, 11, "from step 11")  # takes effect at step 11, not logged yet
    store.resolve_request(b, True, 11, "from step 11")
    st = live_view.load(store.run_dir)
    cur = live_view.current_settings(st)
    assert cur["weights"] == NEW_W and cur["min_group_std"] == 0.05
    assert request_view.pending_changes(cur, NEW_W, 0.05, 1) == []  # the sliders at these values: nothing to apply


# ---- what-if -----------------------------------------------------------------------------------
def test_what_if_under_the_recorded_settings_is_the_recorded_ratio(runs_dir):
    store = synth_run(runs_dir, "r", 80)
    st = live_view.load(store.run_dir)
    cur = live_view.current_settings(st)
    wi = advice.what_if(st, cur["weights"], cur["min_group_std"])
    assert wi["available"] and wi["steps"] == live_view.WHATIF_STEPS
    window = store.scalars_wide(since_step=80 - live_view.WHATIF_STEPS)
    recorded = window[GROUPS_TRAINABLE].sum() / window[GROUPS_SUBMITTED].sum()
    assert wi["now"] == pytest.approx(recorded) and wi["predicted"] == pytest.approx(recorded)


def test_what_if_matches_an_independent_group_by(runs_dir):
    store = synth_run(runs_dir, "r", 60)
    st = live_view.load(store.run_dir)
    only_length = {m: 0.0 for m in DEMO_WEIGHTS} | {"length": 1.0}
    wi = advice.what_if(st, only_length, 0.04)  # not a std the 0.1-step penalties can hit exactly
    roll = store.rollouts(since_step=60 - live_view.WHATIF_STEPS, with_text=False)
    std = roll.groupby(["step", "group"])["length"].std(ddof=0)
    assert wi["predicted"] == pytest.approx(float((std > 0.04).mean()))
    assert wi["predicted"] != pytest.approx(wi["now"])


def test_what_if_refuses_weights_the_trainer_would_reject(runs_dir):
    st = live_view.load(synth_run(runs_dir, "r", 10).run_dir)
    with pytest.raises(ConfigError, match="all zero"):
        advice.what_if(st, {m: 0.0 for m in DEMO_WEIGHTS}, 0.01)


def test_suggestions_predict_what_they_say(runs_dir):
    st = live_view.load(synth_run(runs_dir, "r", 60).run_dir)
    sugg = advice.suggestions(st)
    assert sugg, "the synthetic run has groups only a higher length weight can make trainable"
    for s in sugg:
        assert s["predicted_ratio"] > s["current_ratio"]
        assert advice.what_if(st, s["weights"], 0.01)["predicted"] == pytest.approx(s["predicted_ratio"])


def test_pending_changes_is_one_request_per_changed_setting():
    cur = {"weights": dict(DEMO_WEIGHTS), "min_group_std": 0.01, "level": 1}
    assert request_view.pending_changes(cur, dict(DEMO_WEIGHTS), 0.01, 1) == []
    moved = dict(DEMO_WEIGHTS, length=0.3, exact=0.2)
    assert request_view.pending_changes(cur, moved, 0.01, 1) == [("set_weights", {"weights": moved})]
    assert request_view.pending_changes(cur, moved, 0.02, 3) == [
        ("set_weights", {"weights": moved}), ("set_threshold", {"min_group_std": 0.02}),
        ("set_difficulty", {"level": 3})]


# ---- cards ---------------------------------------------------------------------------------------
def test_cards_are_the_health_verdict_of_the_recent_window(runs_dir):
    store = synth_run(runs_dir, "r", 120)
    st = live_view.load(store.run_dir)
    c = live_cards.cards(st)
    cfg = live_view.health_config(store.get_meta())
    v = health.verdict(store.scalars_wide(since_step=120 - 40), cfg)
    assert c.verdict == v.status and [a.message for a in c.alerts] == [a.message for a in v.alerts]
    assert c.colour == live_cards.VERDICT_COLOURS[v.status]
    last = store.scalars_wide(since_step=119).iloc[-1]
    assert c.ratio == last[TRAINABLE_RATIO] and c.cum_ratio == last[CUM_TRAINABLE_RATIO]
    assert (c.submitted, c.trainable) == (int(last[CUM_GROUPS_SUBMITTED]), int(last[CUM_GROUPS_TRAINABLE]))
    assert c.step == 120 and c.progress == 1.0 and c.status == "running"


def test_progress_and_eta_from_the_recent_step_time(runs_dir):
    store = synth_run(runs_dir, "r", 40, steps_total=100)
    st = live_view.load(store.run_dir)
    done, frac, eta = live_cards.progress(st)
    dt = store.scalars_wide(since_step=20, names=[TIME_STEP])[TIME_STEP].mean()
    assert done == 40 and frac == pytest.approx(0.4) and eta == pytest.approx(60 * dt)
    assert live_cards.fmt_eta(3725) == "1h 02m" and live_cards.fmt_eta(75) == "1m 15s" and live_cards.fmt_eta(None) == "–"


def test_a_run_whose_trainer_died_is_stale_and_not_live(runs_dir):
    store = synth_run(runs_dir, "r", 5)
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.set_meta(pid=dead.pid)
    st = live_view.load(store.run_dir)
    assert st.status == "stale" and not st.is_live and not live_cards.capabilities(st)["steer"]


def test_a_state_works_out_its_status_and_settings_once_for_its_viewers(runs_dir, monkeypatch):
    """Every viewer of a run draws from one shared LiveState and asks its status and the settings in
    force a dozen times per draw: each is worked out once per meta and version (the status again
    after STATUS_S: a heartbeat ages), and a caller's dict is its own."""
    store = synth_run(runs_dir, "r", 10)
    st = live_view.load(store.run_dir)
    calls = {"status": 0, "settings": 0}
    real_status, real_settings = live_view.display_status, live_view._settings_in_force

    def counted(name, real):
        def call(arg):
            calls[name] += 1
            return real(arg)
        return call
    monkeypatch.setattr(live_view, "display_status", counted("status", real_status))
    monkeypatch.setattr(live_view, "_settings_in_force", counted("settings", real_settings))
    monkeypatch.setattr(live_view, "STATUS_S", 3600.0)
    answers = [(st.status, st.is_live, live_cards.capabilities(st)["steer"], live_view.current_settings(st))
               for _ in range(20)]
    assert calls == {"status": 1, "settings": 1} and all(a == answers[0] for a in answers)
    assert answers[0][:3] == ("running", True, True)
    answers[0][3]["weights"]["exact"] = 99.0  # the caller's own dict
    assert live_view.current_settings(st)["weights"]["exact"] == DEMO_WEIGHTS["exact"]

    _extend(store, 11, 5, changes={12: NEW_W})  # new steps: a new version and meta
    live_view.load(store.run_dir, st)
    assert live_view.current_settings(st)["weights"] == pytest.approx(NEW_W) and calls["settings"] == 2
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.set_meta(pid=dead.pid)  # the trainer is gone: the next meta says so at once
    live_view.load(store.run_dir, st)
    assert st.status == "stale" and not st.is_live and calls["status"] == 2  # none asked of the meta between
    monkeypatch.setattr(live_view, "STATUS_S", 0.0)
    assert [st.status for _ in range(3)] == ["stale"] * 3 and calls["status"] == 5


def test_an_imported_run_says_what_it_lacks(runs_dir):
    store = RunStore.create("imp", {}, root=runs_dir)
    store.set_meta(source="trl")
    store.set_status("finished")
    for s in range(1, 6):
        store.log_step(s, {REWARD: 0.1 * s, FRAC_REWARD_ZERO_STD: 0.5})
    st = live_view.load(store.run_dir)
    caps = live_cards.capabilities(st)
    assert caps["imported"] and not caps["what_if"] and not caps["steer"]
    assert "no what-if" in caps["message"] and "trl" in caps["message"]
    assert advice.what_if(st, {"a": 1.0}, 0.01)["available"] is False
    assert live_cards.cards(st).ratio == 0.5  # 1 - frac_reward_zero_std
    assert run_list.config_summary(store.get_meta()) == "imported from trl"


# ---- runs page ----------------------------------------------------------------------------------
def test_runs_overview_progress_summary_and_unreadable_runs(runs_dir):
    synth_run(runs_dir, "half", 10, steps_total=20)
    done = synth_run(runs_dir, "done", 5, status="finished")
    (runs_dir / "broken").mkdir()
    (runs_dir / "broken" / "run.db").write_bytes(b"not a database at all" * 100)
    ov = run_list.runs_overview(runs_dir).set_index("run_id")
    assert ov.loc["half", "progress"] == pytest.approx(0.5) and ov.loc["half", "done"] == 10
    assert "8 prompts × G=8" in ov.loc["half", "summary"] and ov.loc["half", "eta"] != "–"
    assert ov.loc["done", "status"] == "finished" and ov.loc["done", "eta"] == "–"
    assert ov.loc["broken", "status"] == "unreadable" and ov.loc["broken", "error"]
    assert run_list.default_run(runs_dir) == "half"  # the live one first
    assert run_list.resolve_run(None, "done", runs_dir) == "done"
    assert run_list.resolve_run(None, "nope", runs_dir) == "half"
    assert run_list.resolve_run("done", None, runs_dir) == "done"
    done.close()


def test_default_run_prefers_training_runs_over_pilots(runs_dir):
    synth_run(runs_dir, "old-train", 3, status="finished").close()
    pilot = RunStore.create("pilot-1", RunConfig().to_dict(), root=runs_dir, kind="pilot")
    pilot.set_meta(pid=__import__("os").getpid(), host=__import__("os").uname().nodename)
    pilot.set_status("running")
    assert run_list.default_run(runs_dir) == "old-train"
    synth_run(runs_dir, "new-train", 3).close()
    assert run_list.default_run(runs_dir) == "new-train"


def test_empty_runs_dir(runs_dir):
    assert run_list.runs_overview(runs_dir).empty and run_list.default_run(runs_dir) is None


def test_config_summary_names_the_setup():
    cfg = RunConfig()
    cfg.grpo.group_size, cfg.task.level, cfg.model.path = 16, 3, "/models/qwen-0.5b"
    text = run_list.config_summary({"config": cfg.to_dict()})
    assert text.startswith("demo L3 · qwen-0.5b · 8 prompts × G=16")


def test_a_run_deleted_or_damaged_while_watched_raises_store_error(runs_dir):
    import shutil

    from grpo_core.errors import StoreError
    store = synth_run(runs_dir, "r", 5)
    st = live_view.load(store.run_dir)
    store.close()
    shutil.rmtree(runs_dir / "r")
    with pytest.raises(StoreError, match="no run store"):
        live_view.load(runs_dir / "r", st)
    (runs_dir / "r").mkdir()
    (runs_dir / "r" / "run.db").write_bytes(b"garbage" * 1000)
    with pytest.raises(StoreError):
        live_view.load(runs_dir / "r", st)


def test_every_status_has_one_colour_the_live_and_runs_pages_share():
    import ast
    from pathlib import Path

    from grpo_core.runs import run_meta
    statuses = (run_meta.CREATED, run_meta.RUNNING, run_meta.PAUSED, run_meta.FINISHED, run_meta.FAILED,
                run_meta.STOPPED, run_meta.STALE, "unreadable")
    assert set(statuses) <= set(live_cards.STATUS_COLOURS)
    assert live_cards.status_badge(run_meta.RUNNING) == ":green[running]"
    assert live_cards.status_badge(run_meta.STALE) == ":red[stale]" and live_cards.status_badge("unreadable") == ":red[unreadable]"
    stopped_by_autopilot = run_meta.status_label(run_meta.STOPPED, "autopilot")
    assert live_cards.status_badge(run_meta.STOPPED, stopped_by_autopilot) == ":gray[stopped (autopilot)]"
    assert live_cards.status_badge("no-such-status") == ":gray[no-such-status]"
    # ... and no page keeps a colour table of its own (a dict keyed by statuses)
    for page in sorted((Path(__file__).resolve().parents[1] / "pages").glob("*.py")):
        for node in ast.walk(ast.parse(page.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                assert len(keys & set(statuses)) < 2, f"{page.name}:{node.lineno} defines status colours"


def test_config_summary_shows_the_settings_in_force_not_the_start():
    """The autopilot raised the level and G mid-run: the header says so, not the config's L1 G=8."""
    cfg = RunConfig()
    meta = {"config": cfg.to_dict(), "settings": {"group_size": 32}}
    assert "L1 ·" in run_list.config_summary({"config": cfg.to_dict()})
    text = run_list.config_summary(meta, {"level": 2, "min_group_std": 0.05})
    assert text.startswith("demo L2 · built-in model · 8 prompts × G=32") and "min std 0.05" in text
