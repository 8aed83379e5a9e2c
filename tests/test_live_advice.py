"""advice.what_to_do / advice.fixes / advice.what_would_help: the top alert's fix as one request, with
its predicted effect where one can be predicted, computed without a browser."""
import os

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import reweighting, rollout_stats, step_stats
from grpo_core.dashboard import advice, live_cards, live_view
from grpo_core.runs import names, requests
from grpo_core.runs.config import DEMO_WEIGHTS, RunConfig
from grpo_core.runs.run_meta import RUNNING
from grpo_core.runs.store import RunStore

METRICS = list(DEMO_WEIGHTS)


def solved_run(root, steps: int = 30, P: int = 8, G: int = 8, fail: float = 0.03, level: int = 1,
               autopilot_moves: list | None = None) -> RunStore:
    """A run whose task is solved: every metric at its top, except a rare failed completion
    (probability `fail`): most groups uniform at the best reward, a few with one outlier."""
    cfg = RunConfig()
    cfg.grpo.steps, cfg.grpo.prompts_per_step, cfg.grpo.group_size, cfg.task.level = 1000, P, G, level
    if autopilot_moves is not None:
        cfg.autopilot.enabled, cfg.autopilot.moves = True, autopilot_moves
    store = RunStore.create("solved", cfg.to_dict(), root=root)
    store.set_meta(pid=os.getpid(), host=os.uname().nodename)  # a live trainer: this process
    store.set_status(RUNNING)
    rng, w, cs, ct = np.random.default_rng(0), np.array([DEMO_WEIGHTS[m] for m in METRICS]), 0, 0
    for step in range(1, steps + 1):
        scores = np.tile(np.array([1.0, 1.0, 1.0, 1.0, 0.0]), (P, G, 1))
        scores[rng.random((P, G)) < fail, :3] = 0.0
        totals = scores @ w
        stats = step_stats.group_stats(totals, scores, min_group_std=0.01)
        sc = step_stats.step_scalars(stats, scores, METRICS, DEMO_WEIGHTS, cs, ct)
        cs, ct = int(sc[names.CUM_GROUPS_SUBMITTED]), int(sc[names.CUM_GROUPS_TRAINABLE])
        sc.update({names.MIN_GROUP_STD: 0.01, names.DIFFICULTY: level, names.TIME_STEP: 0.1})
        groups = pd.DataFrame({"group": np.arange(P), "prompt_id": [f"p{step}-{g}" for g in range(P)], "size": G,
                               "reward_mean": stats.mean, "reward_std": stats.std, "trainable": stats.trainable,
                               "phantom": stats.phantom})
        rolls = [(g, i, float(totals[g, i]), dict(zip(METRICS, scores[g, i].tolist())), None, None)
                 for g in range(P) for i in range(G)]
        store.log_step(step, sc, groups, rolls, [])
    return store


@pytest.fixture
def solved(runs_dir):
    store = solved_run(runs_dir)
    yield live_view.load(store.run_dir)
    store.close()


def test_a_solved_task_gets_a_harder_level_first_then_a_larger_group_with_its_prediction(solved):
    answer = advice.what_to_do(solved)
    assert answer["alert"].kind in ("low_ratio", "zero_trainable", "near_zero")
    by_move = {f.move: f for f in answer["fixes"]}
    assert [f.move for f in answer["fixes"]][:2] == ["difficulty", "group_size"]
    lvl, g = by_move["difficulty"], by_move["group_size"]
    assert (lvl.label, lvl.kind, lvl.payload) == ("difficulty 1 -> 2", "set_difficulty", {"level": 2})
    assert lvl.predicted is None and "not predictable" in lvl.note  # a new level: new prompts
    assert (g.label, g.kind, g.payload) == ("G 8 -> 16", "set_group_size", {"group_size": 16})
    # the binary planner: the window's ratio plus the gain a larger G is predicted to bring
    assert g.now < g.predicted <= 1 and f"{g.predicted:.0%}" in g.note
    assert all("reason" not in f.payload for f in answer["fixes"])  # what the button sends: the setting only
    requests.validate_request("set_group_size", g.payload)  # a request the trainer accepts as it is


@pytest.mark.parametrize("moves, note", [
    (None, None),  # the autopilot off: nothing to say
    (["difficulty", "group_size"], "The autopilot is on: it makes such a move itself"),
    (["difficulty"], "The autopilot is on, with moves: difficulty; it makes difficulty 1 -> 2 itself once the ratio "
                     "stays below its target; G 8 -> 16 is yours to make."),
    (["weights"], "The autopilot is on, with moves: weights; difficulty 1 -> 2 and G 8 -> 16 are yours to make."),
])
def test_the_autopilot_note_says_which_offered_moves_it_will_make(runs_dir, moves, note):
    store = solved_run(runs_dir, autopilot_moves=moves)
    try:
        state = live_view.load(store.run_dir)
        offered = advice.what_to_do(state)["fixes"][:2]
        got = advice.autopilot_note(state, offered)
        assert got == note if note is None or note.endswith(".") else got.startswith(note)
    finally:
        store.close()


def test_the_advice_is_computed_once_per_new_step(solved, monkeypatch):
    first = advice.what_to_do(solved)
    monkeypatch.setattr(advice, "fixes", lambda *a, **k: pytest.fail("recomputed without a new step"))
    assert advice.what_to_do(solved) is first


def test_new_rollouts_judge_the_advice_again_at_most_every_advice_s(solved, monkeypatch):
    monkeypatch.setattr(advice, "ADVICE_S", 1e9)
    first = advice.what_to_do(solved)
    solved.rollout_step += 1  # a later refresh read new rollouts: the same alerts and weights
    monkeypatch.setattr(advice, "fixes", lambda *a, **k: pytest.fail("judged again within ADVICE_S"))
    assert advice.what_to_do(solved) is first
    monkeypatch.setattr(advice, "ADVICE_S", 0.0)  # ADVICE_S has passed
    calls = []
    monkeypatch.setattr(advice, "fixes", lambda *a, **k: calls.append(a) or ([], []))
    assert advice.what_to_do(solved) is not first and len(calls) == 1


def test_no_alert_no_advice(runs_dir):
    from tests.helpers_dashboard import synth_run
    store = synth_run(runs_dir, "fresh", 3)
    st = live_view.load(store.run_dir)
    store.close()
    if not live_cards.cards(st).alerts:
        assert advice.what_to_do(st) is None


def test_when_no_weights_help_the_page_says_what_would(solved):
    assert advice.suggestions(solved) == []  # every metric fails in the same rollouts: no reweight helps
    text = advice.what_would_help(solved)
    assert "difficulty 1 -> 2" in text and "G 8 -> 16" in text and "predicted trainable ratio" in text


def test_at_the_top_level_and_the_cap_it_says_why_nothing_applies(runs_dir):
    store = solved_run(runs_dir, level=4, G=64)
    st = live_view.load(store.run_dir)
    store.close()
    found, why_not = advice.fixes(st, ("difficulty", "group_size"))
    assert found == [] and any("level 4 is the highest" in w for w in why_not)
    assert any("G 64 is at the cap" in w for w in why_not)
    text = advice.what_would_help(st)  # what is left: wider sampling, which no past rollout can predict
    assert "temperature 1 -> 1.25" in text and "not predictable" in text and "G 64" not in text


def test_the_live_page_offers_the_fix_as_one_click_and_sends_it(runs_dir):
    from tests.helpers_dashboard import trainer_beating
    from tests.test_app import app, texts
    store = solved_run(runs_dir)
    try:
        with trainer_beating(store):
            page_sends_the_fix(store, app, texts)
    finally:
        store.close()


def page_sends_the_fix(store: RunStore, app, texts):
    at = app()
    assert any(md.startswith("**What to do now**") for md in texts(at.markdown))
    assert at.button(key="fix_difficulty").label == "difficulty 1 -> 2"
    assert at.button(key="fix_group_size").label == "G 8 -> 16"
    assert any("predicted trainable ratio" in c for c in texts(at.caption))
    at.button(key="fix_group_size").click().run()
    assert not at.exception
    row = store.control().iloc[-1]
    assert (row["kind"], row["payload"]["group_size"], row["source"]) == ("set_group_size", 16, "ui")
    at.button(key="suggest").click().run()  # every metric uniform in the same groups: no reweight helps
    assert any(c.startswith("No weights near these") and "What would help instead" in c and "G 8 -> 16" in c
               for c in texts(at.caption))


def test_a_reweight_fix_carries_the_what_if_prediction(runs_dir):
    from tests.helpers_dashboard import synth_run
    store = synth_run(runs_dir, "r", 60)  # solved prompts vary only in the length penalty
    st = live_view.load(store.run_dir)
    store.close()
    found, _ = advice.fixes(st, ("weights",))
    assert len(found) == 1 and found[0].kind == "set_weights" and "length 0.10 -> " in found[0].label
    f = found[0]
    # the what-if over the health window's rollouts (the autopilot's window), re-scored with these weights
    a = rollout_stats.rollout_arrays(st.rollouts[st.rollouts["step"] > st.last_step - 20], st.metrics)
    assert f.predicted == pytest.approx(reweighting.what_if(a, f.payload["weights"], 0.01))
    assert f.predicted > reweighting.what_if(a, live_view.current_settings(st)["weights"], 0.01) and f"{f.predicted:.0%}" in f.note
