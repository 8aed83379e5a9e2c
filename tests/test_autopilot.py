"""The autopilot: decide() on constructed store frames (each move, bounds, rate limit), the
bookkeeping, the hook against a real store, and real trainer runs (slow)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import zlib

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import autopilot, ledger, reweighting, run_data, step_stats
from grpo_core.runs.config import AutopilotConfig, HealthConfig
from grpo_core.runs.names import CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE, TRAINABLE_RATIO
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import status_label
from grpo_core.runs.store import APPLIED, EV_AUTOPILOT, RunStore

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


# ---- metrics for the real-trainer tests (imported by the trainer process: reward.custom) ------------
def constant_reward(completion: str, example: dict) -> float:
    """Every completion scores the same: every group is uniform, nothing can be learned."""
    return 0.0


def rare_reward(completion: str, example: dict) -> float:
    """1 for about one distinct completion in 12, by a hash: rare outcomes that a larger group finds."""
    return float(zlib.crc32((example["prompt"] + completion).encode()) % 12 == 0)


# ---- constructed frames: the trainer's own scalars over given raw scores -------------------------------
def frames(scores: np.ndarray, weights: dict[str, float], first_step: int = 1, min_group_std: float = 0.01):
    """scores [steps, P, G, K] -> (wide, rollouts) as RunStore.scalars_wide() / rollouts() give them."""
    names = list(weights)
    w = np.array([weights[m] for m in names])
    rows, ro, cs, ct = {}, [], 0, 0
    for i, sc in enumerate(scores):
        step = first_step + i
        totals = sc @ w
        stats = step_stats.group_stats(totals, sc, min_group_std=min_group_std)
        sca = step_stats.step_scalars(stats, sc, names, weights, cs, ct)
        cs, ct = int(sca[CUM_GROUPS_SUBMITTED]), int(sca[CUM_GROUPS_TRAINABLE])
        rows[step] = sca
        P, G, _ = sc.shape
        for g in range(P):
            for j in range(G):
                ro.append({"step": step, "group": g, "idx": j, "total": totals[g, j], "error": None,
                           **dict(zip(names, sc[g, j]))})
    wide = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    wide.index.name = "step"
    return wide, pd.DataFrame(ro)


def settings(weights, **kw):
    base = {"weights": dict(weights), "min_group_std": 0.01, "level": 1, "max_level": 4, "group_size": 8,
            "prompts_per_step": 8, "temperature": 1.25, "outcome_metric": None, "uniform_std": 1e-3,
            "metric_max": {m: 1.0 for m in weights}}
    return {**base, **kw}


CFG = AutopilotConfig(enabled=True, window=10)
HCFG = HealthConfig(near_zero_steps=20)
def shaping_frames(steps=12, P=8, G=8):
    """a: uniform in every group (weight 0.9); b: varies a little (0 / 0.12) but at weight 0.1 the
    total's std (0.006) is under min_group_std: no group trainable until b weighs more (> 0.167)."""
    rng = np.random.default_rng(1)
    sc = np.zeros((steps, P, G, 2))
    sc[..., 0] = rng.integers(0, 2, size=(steps, P, 1))  # a: per-group constant
    sc[..., 1] = 0.12 * (np.arange(G) % 2)  # b: half 0, half 0.12 in every group
    return frames(sc, {"a": 0.9, "b": 0.1})


def rare_frames(steps=12, P=8, G=8, hits_per_step=2):
    """One binary metric; in `hits_per_step` groups of each step exactly one rollout succeeds."""
    rng = np.random.default_rng(2)
    sc = np.zeros((steps, P, G, 1))
    for s in range(steps):
        for g in rng.choice(P, hits_per_step, replace=False):
            sc[s, g, rng.integers(G), 0] = 1.0
    return frames(sc, {"exact": 1.0})


def solved_frames(steps=12, P=8, G=8):
    sc = np.ones((steps, P, G, 1))  # every group all right: uniform at the top
    return frames(sc, {"exact": 1.0})


def constant_frames(steps=25, P=4, G=4):
    return frames(np.zeros((steps, P, G, 1)), {"c": 1.0})


# ---- each move fires when it should -----------------------------------------------------------------
def test_healthy_run_gets_no_move():
    sc = np.random.default_rng(3).random((12, 8, 8, 2))
    wide, ro = frames(sc, {"a": 0.5, "b": 0.5})
    st = autopilot.AutopilotState(settings(({"a": 0.5, "b": 0.5})))
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []


def test_reweight_moves_weight_to_the_metric_that_varies():
    wide, ro = shaping_frames()
    assert wide[TRAINABLE_RATIO].max() == 0.0
    st = autopilot.AutopilotState(settings({"a": 0.9, "b": 0.1}))
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.kind) == ("weights", "set_weights")
    w = mv.payload["weights"]
    assert 0.1 < w["b"] <= 0.2 and 0.45 <= w["a"] < 0.9  # inside the band: the user's weight / 2 .. x 2
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-3)  # same total weight: no gaming the threshold
    # the prediction is the what-if of exactly these weights on the window, and it is a real gain
    assert mv.predicted_ratio == pytest.approx(reweighting.what_if(ro[ro["step"] > 2], w, 0.01))
    assert mv.predicted_ratio >= CFG.min_gain
    assert mv.before == {"weights": {"a": 0.9, "b": 0.1}}
    r = mv.payload["reason"]
    assert r == mv.reason and "ratio 0.00 <= 0.6 for 10 steps" in r and "a uniform in 100% of groups" in r
    assert "a 0.90 -> " in r and "b 0.10 -> " in r and f"predicted ratio {mv.predicted_ratio:.2f}" in r


def test_reweight_stays_inside_floors_and_bands():
    wide, ro = shaping_frames()
    st = autopilot.AutopilotState(settings({"a": 0.9, "b": 0.1}))
    only = dict(moves=["weights"])
    # b needs > 0.167 for any group to pass min_group_std: a floor on a or a narrow band leaves no room
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, min_weights={"a": 0.85}, **only), HCFG) == []
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, weight_band=1.5, **only), HCFG) == []
    [mv] = autopilot.decide(wide, ro, st, dataclasses.replace(CFG, min_weights={"a": 0.8}, **only), HCFG)
    assert mv.payload["weights"]["a"] >= 0.8
    # the band's centre is the user's choice, not the weights in force (an earlier autopilot move)
    st = autopilot.AutopilotState(settings({"a": 0.85, "b": 0.15}), user_weights={"a": 0.95, "b": 0.05})
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, **only), HCFG) == []  # b <= 0.1: nothing to gain
    # a metric the user switched off stays off
    st = autopilot.AutopilotState(settings({"a": 1.0, "b": 0.0}))
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, **only), HCFG) == []


def test_bound_weights_keeps_the_total_and_every_bound():
    lo, hi = {"a": 0.3, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 1.0, "c": 1.0}
    assert autopilot.bound_weights({"a": 0.1, "b": 0.6, "c": 0.3}, lo, hi, 1.0) == {"a": 0.3, "b": 0.4667, "c": 0.2333}
    # pinning one metric can push another over its cap: pinned too, the rest shares what is left
    assert autopilot.bound_weights({"a": 0.0, "b": 0.9, "c": 0.1}, {"a": 0.4, "b": 0, "c": 0}, {"a": 1, "b": 0.5, "c": 1},
                            1.0) == {"a": 0.4, "b": 0.5, "c": 0.1}
    assert autopilot.bound_weights({"a": 0.5, "b": 0.5}, {"a": 0, "b": 0}, {"a": 2, "b": 2}, 2.0) == {"a": 1.0, "b": 1.0}
    assert autopilot.bound_weights({"a": 0.5, "b": 0.5}, {"a": 0.8, "b": 0.8}, {"a": 1, "b": 1}, 1.0) is None


def test_group_size_rises_when_outcomes_are_rare_within_the_caps():
    wide, ro = rare_frames()
    assert wide[TRAINABLE_RATIO].mean() < 0.3
    st = autopilot.AutopilotState(settings({"exact": 1.0}))
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.payload["group_size"], mv.before) == ("group_size", 16, {"group_size": 8})  # x group_size_factor
    assert "group size 8 -> 16 (128 rollouts per step, budget 128)" in mv.reason  # 2 x the user's 8 x 8
    assert "minority rate" in mv.reason and "predicted ratio" in mv.reason
    # at the cap nothing to raise (and one metric: no reweighting; rewards low: no difficulty)
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, max_group_size=8), HCFG) == []
    # a ratio of 0.25 is above a target of 0.2: nothing to do
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, target_ratio=0.2), HCFG) == []
    # G never goes down: a user's G above the cap stays
    assert autopilot.decide(wide, ro, autopilot.AutopilotState(settings({"exact": 1.0}, group_size=80)), CFG, HCFG) == []


def test_group_size_stays_within_the_compute_budget_at_the_same_prompts():
    wide, ro = rare_frames()
    # G 16 (an earlier move) x 8 prompts = 128 = the budget (2 x the user's 8 x 8): at the cap, and
    # no fewer prompts to pay for a larger G
    st = autopilot.AutopilotState(settings({"exact": 1.0}, group_size=16), user_rollouts=64)
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    # the budget is counted from what the user set: 4 x 64 -> G 32
    [mv] = autopilot.decide(wide, ro, st, dataclasses.replace(CFG, rollout_budget=4.0), HCFG)
    assert mv.payload["group_size"] == 32 and "(256 rollouts per step, budget 256)" in mv.reason
    # max_rollouts_per_step is a hard cap on top: 88 -> G 11 over 8 prompts
    st = autopilot.AutopilotState(settings({"exact": 1.0}))
    [mv] = autopilot.decide(wide, ro, st, dataclasses.replace(CFG, max_rollouts_per_step=88), HCFG)
    assert mv.payload["group_size"] == 11
    # 80 -> G 10: predicted +0.04, under min_gain: not worth the compute
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, max_rollouts_per_step=80), HCFG) == []
    assert autopilot.rollout_budget(settings({"exact": 1.0}, group_size=16, user_rollouts=64), CFG) == 128


def test_temperature_rises_once_g_is_at_its_budget_and_outcomes_are_rare():
    wide, ro = rare_frames()
    st = autopilot.AutopilotState(settings({"exact": 1.0}, group_size=16, temperature=1.0), user_rollouts=64)
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.kind, mv.payload["temperature"], mv.before) == ("temperature", "set_temperature", 1.25,
                                                                         {"temperature": 1.0})
    assert "G at its budget" in mv.reason and "sampling temperature 1 -> 1.25" in mv.reason
    # a larger G within the budget comes first (the order practice recommends)
    st = autopilot.AutopilotState(settings({"exact": 1.0}, temperature=1.0))
    assert [m.move for m in autopilot.decide(wide, ro, st, CFG, HCFG)] == ["group_size"]
    # up to max_temperature only, never down from the user's
    st = autopilot.AutopilotState(settings({"exact": 1.0}, group_size=16, temperature=1.1), user_rollouts=64)
    assert autopilot.decide(wide, ro, st, CFG, HCFG)[0].payload["temperature"] == 1.25
    st.settings["temperature"] = 1.5
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    # every group alike to the last rollout: nothing for wider sampling to find (and the stop waits its window)
    wide, ro = constant_frames(steps=12)
    st = autopilot.AutopilotState(settings({"c": 1.0}, group_size=4, prompts_per_step=4, temperature=1.0,
                                    metric_max={"c": None}))
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []


def test_no_setting_move_that_could_not_be_judged_before_the_run_ends():
    wide, ro = rare_frames()  # steps 1..12
    st = autopilot.AutopilotState(settings({"exact": 1.0}, steps=21))  # 9 steps left < window 10
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    st = autopilot.AutopilotState(settings({"exact": 1.0}, steps=22))
    assert [m.move for m in autopilot.decide(wide, ro, st, CFG, HCFG)] == ["group_size"]


def test_difficulty_rises_when_groups_are_solved_then_stops_at_the_top_level():
    wide, ro = solved_frames(steps=22)
    st = autopilot.AutopilotState(settings({"exact": 1.0}, level=2))
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.kind, mv.payload["level"], mv.before) == ("difficulty", "set_difficulty", 3, {"level": 2})
    assert "100% of groups uniform" in mv.reason and "level 2 -> 3" in mv.reason
    # not with fewer than LEVEL_WINDOWS_LEFT windows left: too few steps to learn a harder level
    st = autopilot.AutopilotState(settings({"exact": 1.0}, level=2, steps=22 + 5 * CFG.window - 1))
    moves = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert [m.kind for m in moves] == ["checkpoint", "stop"] and "too few to learn a harder level" in moves[1].reason
    st.settings["steps"] += 1
    assert autopilot.decide(wide, ro, st, CFG, HCFG)[0].move == "difficulty"
    # at the highest level: no move is left, and after near_zero_steps at ratio 0: checkpoint + stop
    st = autopilot.AutopilotState(settings({"exact": 1.0}, level=4))
    moves = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert [m.kind for m in moves] == ["checkpoint", "stop"]
    assert "level 4 is the highest" in moves[1].reason


def test_solved_groups_get_harder_tasks_before_a_larger_group():
    """Rare failures in a task the model has learned: the same counts as rare_frames, mirrored."""
    wide, ro = rare_frames()
    solved = frames(1.0 - np.stack([ro[ro["step"] == s]["exact"].to_numpy().reshape(8, 8, 1)
                                    for s in sorted(ro["step"].unique())]), {"exact": 1.0})
    st = autopilot.AutopilotState(settings({"exact": 1.0}))
    [mv] = autopilot.decide(*solved, st, CFG, HCFG)
    assert mv.move == "difficulty" and "75% of groups uniform" in mv.reason
    # no harder level left: then a larger group is worth trying
    [mv] = autopilot.decide(*solved, autopilot.AutopilotState(settings({"exact": 1.0}, level=4)), CFG, HCFG)
    assert mv.move == "group_size"
    # failing groups (rewards low): the configured order, a larger group first
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert mv.move == "group_size"


def test_the_task_changes_only_once_the_verdicts_own_ratio_check_fails():
    """Mostly solved, ratio 0.375: below the autopilot's target (0.6), above the verdict's line (0.3)."""
    wide, ro = rare_frames(hits_per_step=3)
    solved = frames(1.0 - np.stack([ro[ro["step"] == s]["exact"].to_numpy().reshape(8, 8, 1)
                                    for s in sorted(ro["step"].unique())]), {"exact": 1.0})
    assert solved[0][TRAINABLE_RATIO].mean() == pytest.approx(0.375)
    [mv] = autopilot.decide(*solved, autopilot.AutopilotState(settings({"exact": 1.0})), CFG, HCFG)
    assert mv.move == "group_size"  # not difficulty
    only = dataclasses.replace(CFG, moves=["difficulty", "stop"])
    assert autopilot.decide(*solved, autopilot.AutopilotState(settings({"exact": 1.0})), only, HCFG) == []
    assert autopilot.decide(*solved, autopilot.AutopilotState(settings({"exact": 1.0})), only,
                     dataclasses.replace(HCFG, min_trainable_ratio=0.4))[0].move == "difficulty"


def test_stop_needs_the_near_zero_window_since_the_last_change():
    wide, ro = constant_frames(steps=25)
    st = autopilot.AutopilotState(settings({"c": 1.0}, group_size=4, prompts_per_step=4, metric_max={"c": None}))
    moves = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert [m.kind for m in moves] == ["checkpoint", "stop"]
    assert all(m.move == "stop" and m.payload["reason"] for m in moves)
    assert "25 steps with trainable ratio at or below 0.05 since the last change" in moves[1].reason
    assert "no move left" in moves[1].reason and "minority rate 0.000" in moves[1].reason
    # only 15 steps since the last change: not yet (evidence before a change says nothing after it)
    st.last_change_step = 11
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    # the user did not allow stopping
    st.last_change_step = 0
    assert autopilot.decide(wide, ro, st, dataclasses.replace(CFG, moves=["weights", "group_size"]), HCFG) == []
    # once stopped, nothing more
    st.stopped = True
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []


# ---- bounds: window, rate limit, vetoes -----------------------------------------------------------------
def test_no_decision_before_a_full_window_since_the_last_change():
    wide, ro = rare_frames(steps=12)
    st = autopilot.AutopilotState(settings({"exact": 1.0}), last_change_step=4)  # steps 4..12: 9 < 10
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    st.last_change_step = 3
    assert len(autopilot.decide(wide, ro, st, CFG, HCFG)) == 1


def test_rate_limit_blocks_setting_moves_but_not_the_stop():
    wide, ro = rare_frames(steps=12)
    st = autopilot.AutopilotState(settings({"exact": 1.0}), move_steps=[2, 5, 9])  # 3 moves in the last 100 steps
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []
    st.move_steps = [2, 5, 9]
    assert len(autopilot.decide(wide, ro, st, dataclasses.replace(CFG, max_moves=4), HCFG)) == 1
    assert len(autopilot.decide(wide, ro, st, dataclasses.replace(CFG, per_steps=5), HCFG)) == 1  # 2, 5 are old
    wide, ro = constant_frames(steps=25)
    st = autopilot.AutopilotState(settings({"c": 1.0}, group_size=4, prompts_per_step=4), move_steps=[20, 21, 22])
    moves = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert [m.kind for m in moves] == ["checkpoint", "stop"] and "rate limit" in moves[1].reason


def test_a_move_the_user_undid_is_not_made_again_and_the_next_one_is_tried():
    wide, ro = shaping_frames()
    st = autopilot.AutopilotState(settings({"a": 0.9, "b": 0.1}), vetoed=["weights"])
    moves = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert all(m.move != "weights" for m in moves)


def test_a_move_that_did_not_raise_the_ratio_is_taken_back():
    wide, ro = rare_frames()  # ratio 0.25 in the window after the move
    trial = {"request_id": 7, "move": "group_size", "kind": "set_group_size", "before": {"group_size": 8},
             "after": {"group_size": 16}, "ratio": 0.24}
    st = autopilot.AutopilotState(settings({"exact": 1.0}, group_size=16), trial=dict(trial), move_steps=[1, 2, 3],
                           user_rollouts=64)
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)  # not rate-limited: it corrects, it does not add
    assert (mv.move, mv.kind) == ("revert", "set_group_size")
    assert mv.payload["group_size"] == 8 and mv.payload["undo_of"] == 7 and mv.before == {"group_size": 16}
    assert mv.reason == ("autopilot move #7 did not help: ratio 0.24 -> 0.25 over 10 steps (needed >= 0.27): "
                         "back to group_size 8")
    # it helped (0.25 >= 0.20 + 0.025): kept, and the policy goes on (here: G 16 x 8 is the budget, 2 x the
    # user's 8 x 8: a wider sampling temperature)
    st.trial, st.move_steps, st.settings["temperature"] = {**trial, "ratio": 0.20}, [], 1.0
    assert [m.kind for m in autopilot.decide(wide, ro, st, CFG, HCFG)] == ["set_temperature"]
    # the revert is an undo of the move: that kind is vetoed from then on
    autopilot.record(st, [mv], 12, [8])
    assert st.trial is None and st.move_steps == []
    st.moves.append({"request_id": 7, "move": "group_size", "step": 2})
    autopilot.note_applied(st, {"kind": "set_group_size", "payload": mv.payload, "source": "autopilot"}, 13)
    assert st.vetoed == ["group_size"]


def test_a_raised_level_the_model_mostly_fails_is_taken_back_even_if_the_ratio_rose():
    wide, ro = rare_frames()  # after the move: ratio 0.25, reward ~0.03
    trial = {"request_id": 4, "move": "difficulty", "kind": "set_difficulty", "before": {"level": 1},
             "after": {"level": 2}, "ratio": 0.1, "reward": 0.9}
    st = autopilot.AutopilotState(settings({"exact": 1.0}, level=2), trial=trial)
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.payload["level"], mv.payload["undo_of"]) == ("revert", 1, 4)
    assert "reward 0.90 -> 0.03 over 10 steps at the new level (< 50% of before: too big a step): back to difficulty level 1" \
        in mv.reason
    # a level the model still earns half its reward on stays
    st.trial = {**trial, "reward": 0.05}
    assert all(m.move != "revert" for m in autopilot.decide(wide, ro, st, CFG, HCFG))
    # the reward is judged after LEVEL_CHECK_STEPS steps on the new level, not a whole window
    st.trial, st.last_change_step = dict(trial), 12 - autopilot.LEVEL_CHECK_STEPS + 1
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert mv.move == "revert" and f"over {autopilot.LEVEL_CHECK_STEPS} steps at the new level" in mv.reason
    st.last_change_step = 12 - autopilot.LEVEL_CHECK_STEPS + 2  # one step short: wait
    assert autopilot.decide(wide, ro, st, CFG, HCFG) == []


def test_hook_keeps_a_move_that_helped_and_forgets_the_trial(runs_dir):
    wide, ro = rare_frames(steps=12)
    store = RunStore.create("k", {"reward": {"weights": {"exact": 1.0}}})
    log_frames(store, wide, ro, ["exact"])
    trial = {"request_id": 1, "move": "group_size", "kind": "set_group_size", "before": {"group_size": 4},
             "after": {"group_size": 8}, "ratio": 0.1}
    st = autopilot.AutopilotState(settings({"exact": 1.0}), trial=trial, last_change_step=3, move_steps=[2, 2, 2])
    assert autopilot.step_hook(store, 12, st, CFG, HCFG) == [] and st.trial is None  # 0.25 >= 0.125: kept


# ---- bookkeeping ------------------------------------------------------------------------------------------
def test_record_and_note_applied():
    st = autopilot.AutopilotState()
    mv = autopilot.Move("group_size", "set_group_size", {"group_size": 12, "reason": "r"}, "r", {"group_size": 8})
    autopilot.record(st, [mv], step=30, request_ids=[7])
    assert st.move_steps == [30] and st.last_change_step == 31 and st.moves == [
        {"request_id": 7, "move": "group_size", "step": 30}]
    autopilot.note_applied(st, {"kind": "set_group_size", "payload": {"group_size": 12}}, 31)
    autopilot.note_applied(st, {"kind": "set_steps", "payload": {"steps": 500}}, 40)  # no new evidence window
    autopilot.note_applied(st, {"kind": "set_autopilot", "payload": {"enabled": True}}, 41)
    assert st.last_change_step == 31 and st.vetoed == []
    autopilot.note_applied(st, {"kind": "set_weights", "payload": {"weights": {"a": 1.0}}}, 45)  # the user's change
    assert st.last_change_step == 45
    autopilot.note_applied(st, {"kind": "set_group_size", "payload": {"group_size": 8, "undo_of": 7}}, 50)
    assert st.vetoed == ["group_size"] and st.last_change_step == 50
    autopilot.note_applied(st, {"kind": "set_group_size", "payload": {"group_size": 8, "undo_of": 99}}, 51)  # not ours
    assert st.vetoed == ["group_size"]
    autopilot.record(st, [autopilot.Move("stop", "checkpoint", {}, ""), autopilot.Move("stop", "stop", {}, "")], 60, [8, 9])
    assert st.stopped and st.move_steps == [30]  # a stop is not a setting move
    assert autopilot.AutopilotState.from_dict(json.loads(json.dumps(st.to_dict()))) == st  # checkpointable


def test_undo_request_is_the_inverse_move():
    ev = {"request_id": 5, "kind": "set_weights", "before": {"weights": {"a": 0.9, "b": 0.1}}}
    assert autopilot.undo_request(ev) == ("set_weights", {"weights": {"a": 0.9, "b": 0.1}, "undo_of": 5,
                                                   "reason": "undo of autopilot move #5"})
    assert autopilot.undo_request({"request_id": 6, "kind": "set_group_size", "before": {"group_size": 8}})[1][
        "group_size"] == 8
    assert autopilot.undo_request({"request_id": 8, "kind": "set_temperature", "before": {"temperature": 1.0}})[1][
        "temperature"] == 1.0
    assert autopilot.undo_request({"request_id": 7, "kind": "stop", "before": {}}) is None


def log_frames(store: RunStore, wide: pd.DataFrame, ro: pd.DataFrame, metrics: list[str]):
    """Write test frames into a real store as the trainer does: each step's scalars and its
    rollouts with their metric scores."""
    for step in wide.index:
        r = ro[ro["step"] == step]
        store.log_step(int(step), wide.loc[step].to_dict(),
                       rollouts=[(g, i, t, dict(zip(metrics, scores)), None, None)
                                 for g, i, t, *scores in r[["group", "idx", "total", *metrics]].itertuples(index=False)])


def test_hook_writes_requests_with_source_autopilot_and_an_event(runs_dir):
    wide, ro = shaping_frames()
    store = RunStore.create("hook", {"reward": {"weights": {"a": 0.9, "b": 0.1}}})
    log_frames(store, wide, ro, ["a", "b"])  # what the trainer wrote
    st = autopilot.AutopilotState(settings({"a": 0.9, "b": 0.1}))
    ids = autopilot.step_hook(store, int(wide.index[-1]), st, CFG, HCFG)
    assert len(ids) == 1
    row = store.control().set_index("id").loc[ids[0]]
    assert (row["kind"], row["source"], row["status"]) == ("set_weights", "autopilot", "pending")
    assert row["payload"]["reason"].startswith("ratio 0.00 <= 0.6 for 10 steps")
    ev = store.events(kinds=[EV_AUTOPILOT]).iloc[-1]
    assert ev["step"] == 12 and ev["payload"]["request_id"] == ids[0]
    assert ev["payload"]["before"] == {"weights": {"a": 0.9, "b": 0.1}}
    assert st.last_change_step == 13 and st.move_steps == [12]
    assert autopilot.step_hook(store, 12, st, CFG, HCFG) == []  # the same evidence never moves twice


# ---- a real trainer process ----------------------------------------------------------------------------------
def _train(runs_dir, run_id: str, toml: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cfg = runs_dir / f"{run_id}.toml"
    cfg.write_text(toml)
    return subprocess.run([sys.executable, "-m", "grpo_core", "train", "--config", str(cfg), "--run-id", run_id,
                           "--runs-dir", str(runs_dir)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


SMALL = """
[model]
warm_start_steps = 0
[grpo]
steps = {steps}
prompts_per_step = {prompts}
group_size = 4
max_new_tokens = 6
[log]
progress = false
checkpoint_every = 0
"""


@pytest.mark.slow
def test_collapsed_run_is_stopped_by_the_autopilot_with_a_checkpoint_and_a_reason(runs_dir):
    toml = SMALL.format(steps=60, prompts=2) + """
[reward]
weights = { const = 1.0 }
custom = { const = "tests.test_autopilot:constant_reward" }
[health]
near_zero_steps = 6
[autopilot]
enabled = true
window = 3
"""
    out = _train(runs_dir, "collapse", toml)
    assert out.returncode == 0, out.stderr[-2000:]
    with RunStore.open(runs_dir / "collapse", readonly=True) as s:
        meta, last, ev, ctl = s.get_meta(), s.last_step(), s.events(), s.control()
    assert meta["status"] == "stopped" and meta["stop_reason"] == "autopilot" and last == 6  # not 60
    assert "6 steps with trainable ratio at or below 0.05" in meta["stop_message"]
    assert list(ctl["kind"]) == ["checkpoint", "stop"] and set(ctl["source"]) == {"autopilot"}
    assert set(ctl["status"]) == {APPLIED} and set(ctl["applied_step"]) == {6}
    # the checkpoint is written before the run stops, and the lifecycle event says why
    kinds = list(ev["kind"])
    assert kinds.index("checkpoint") < len(kinds) - 1 and kinds[-1] == "lifecycle"
    assert (runs_dir / "collapse" / "checkpoints" / "step-000006" / "state.pt").is_file()
    stopped = ev.iloc[-1]["payload"]
    assert stopped["event"] == "stopped" and "from autopilot" in stopped["reason"] and "no move left" in stopped["reason"]
    runs = list_runs(runs_dir).set_index("run_id")
    assert status_label(runs.loc["collapse", "status"], runs.loc["collapse", "stop_reason"]) == "stopped (autopilot)"


@pytest.mark.slow
def test_autopilot_moves_are_control_rows_in_the_ledger_with_their_effect(runs_dir):
    """Rare outcomes at G=4: the autopilot raises G through a request; the ledger shows the row
    (source autopilot, reason, ratio before/after) and the groups from that step are larger."""
    toml = SMALL.format(steps=12, prompts=6) + """
[reward]
weights = { rare = 1.0 }
custom = { rare = "tests.test_autopilot:rare_reward" }
[autopilot]
enabled = true
window = 4
moves = ["weights", "group_size", "stop"]
max_group_size = 8
"""
    out = _train(runs_dir, "rare", toml)
    assert out.returncode == 0, out.stderr[-2000:]
    with RunStore.open(runs_dir / "rare", readonly=True) as s:
        ctl, groups, aev = s.control(), s.groups(), s.events(kinds=[EV_AUTOPILOT])
    moves = ctl[ctl["source"] == "autopilot"]
    assert len(moves) >= 1 and set(moves["status"]) == {APPLIED}
    first = moves.iloc[0]
    assert first["kind"] == "set_group_size" and first["payload"]["group_size"] == 8  # 4 x group_size_factor
    at = int(first["applied_step"])
    assert set(groups.loc[groups["step"] < at, "size"]) == {4} and set(groups.loc[groups["step"] >= at, "size"]) == {8}
    assert list(aev["payload"].map(lambda p: p["request_id"])) == list(moves["id"])  # one event per move
    led = ledger.change_ledger(run_data.load_run(runs_dir / "rare"), window=20)
    row = led[(led["source"] == "autopilot")].iloc[0]
    assert (row["step"], row["kind"], row["change"]) == (at, "set_group_size", "group_size 4 -> 8")
    assert row["reason"] == first["payload"]["reason"] and "minority rate" in row["reason"]
    assert row["n_before"] > 0 and row["n_after"] > 0 and np.isfinite(row["ratio_before"])
    assert np.isfinite(row["ratio_after"]) and np.isfinite(row["ratio_diff"])
    assert len(led[led["source"] == "autopilot"]) == len(moves)  # every move is a ledger row
