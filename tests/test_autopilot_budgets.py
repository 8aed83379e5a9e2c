"""The autopilot's budgets move (per-prompt budgets on, a set_budget_pilot request): decide() on
store frames built by the trainer's own functions (group stats, flat causes, wasted tokens), when it
fires and when not, its trial on the useful token share and its undo; the hook against a real
store; the real trainer's budget_refusal setting."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import autopilot, flat_causes, step_stats
from grpo_core.runs import names
from grpo_core.runs.config import AUTOPILOT_MOVES, AutopilotConfig, HealthConfig
from grpo_core.runs.live_settings import SET_BUDGET_PILOT
from grpo_core.runs.store import EV_AUTOPILOT, RunStore
from grpo_core.tasks.loading import load_config
from tests.test_autopilot import log_frames
from grpo_core.train.trainer import Trainer

CFG = AutopilotConfig(enabled=True, window=10, moves=list(AUTOPILOT_MOVES))  # budgets is opt-in
HCFG = HealthConfig(near_zero_steps=20)
ROWS = {"solved": 1.0, "unsolved": 0.0}  # a flat group's every completion; "mixed": half right


def frames(plan: list[str], steps: int = 12, G: int = 8, tokens: dict[str, int] | None = None):
    """One binary metric (exact); each step's groups as `plan` says (solved / unsolved / mixed),
    completion lengths per kind from `tokens` -> (wide, rollouts) as the trainer stores them."""
    tokens = tokens or {}
    rows, ro, cs, ct, cum = {}, [], 0, 0, (0, 0)
    for step in range(1, steps + 1):
        sc = np.array([[[ROWS[k]] if k in ROWS else [float(j % 2)] for j in range(G)] for k in plan])
        totals = sc[..., 0]
        stats = step_stats.group_stats(totals, sc, min_group_std=0.01, outcome_index=0)
        sca = step_stats.step_scalars(stats, sc, ["exact"], {"exact": 1.0}, cs, ct)
        cs, ct = int(sca[names.CUM_GROUPS_SUBMITTED]), int(sca[names.CUM_GROUPS_TRAINABLE])
        causes = flat_causes.flat_causes(stats, totals, sc, ["exact"], {"exact": "binary"}, {"exact": 1.0}, "exact")
        sca.update(flat_causes.cause_counts(causes))
        lengths = np.array([[tokens.get(k, 6)] * G for k in plan])
        sca.update(step_stats.wasted_compute(lengths, stats.trainable, 1.0, cum))
        cum = (int(sca[names.CUM_SAMPLED_TOKENS]), int(sca[names.CUM_WASTED_TOKENS]))
        rows[step] = sca
        ro += [{"step": step, "group": g, "idx": j, "total": totals[g, j], "error": None, "exact": totals[g, j]}
               for g in range(len(plan)) for j in range(G)]
    wide = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    wide.index.name = "step"
    return wide, pd.DataFrame(ro)


MIXED_PLAN = ["solved"] * 3 + ["unsolved"] * 3 + ["mixed"] * 2  # ratio 0.25: prompts that differ


def settings(**kw):
    base = {"weights": {"exact": 1.0}, "min_group_std": 0.01, "level": 1, "max_level": 4, "group_size": 8,
            "prompts_per_step": 8, "temperature": 1.0, "outcome_metric": "exact", "uniform_std": 1e-3,
            "metric_max": {"exact": 1.0}, "budget_pilot": 0, "budget_refusal": None}
    return {**base, **kw}


def test_flat_groups_mixed_across_prompts_turn_budgets_on():
    wide, ro = frames(MIXED_PLAN)
    st = autopilot.AutopilotState(settings())
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)  # weights: one metric only; budgets come before a larger G
    assert (mv.move, mv.kind) == ("budgets", SET_BUDGET_PILOT)
    assert mv.payload["budget_pilot"] == autopilot.BUDGET_PILOT == 2 and mv.before == {"budget_pilot": 0}
    # judged on the share of sampled tokens that went to trainable groups: 2 of 8 equal groups
    assert mv.ratio == pytest.approx(0.25)
    assert mv.reason == mv.payload["reason"] == (
        "ratio 0.25 <= 0.6 for 10 steps, flat groups mixed across prompts (30 all solved, 30 none solved of 60 "
        "flat): per-prompt budgets on, a pilot of 2 per prompt and the rest of the step's rollouts where a pilot "
        "varies (useful token share 0.25)")


@pytest.mark.parametrize("plan,why", [
    (["unsolved"] * 6 + ["mixed"] * 2, "not mixed across prompts (0 all solved, 60 none solved)"),
    (["solved"] * 6 + ["mixed"] * 2, "not mixed across prompts (60 all solved, 0 none solved)"),
    (["solved"] * 5 + ["unsolved"] + ["mixed"] * 2, "not mixed across prompts (50 all solved, 10 none solved)"),
])
def test_flat_groups_of_one_kind_leave_it_to_a_global_lever(plan, why):
    wide, ro = frames(plan)
    move, reason = autopilot.try_budgets(ro, wide, settings(), CFG, 0.25, "e")
    assert move is None and why in reason
    # the move after it in the order is tried: all none solved -> rare outcomes -> a larger G, not budgets
    moves = autopilot.decide(wide, ro, autopilot.AutopilotState(settings()), CFG, HCFG)
    assert all(m.move != "budgets" for m in moves)


def test_flat_groups_that_are_not_solved_or_unsolved_do_not_count():
    """Flat for another cause (here every completion the same middling score: other uniform)."""
    wide, ro = frames(MIXED_PLAN)
    counts = {names.GROUPS_SOLVED: 1.0, names.GROUPS_UNSOLVED: 1.0, names.FLAT_OTHER: 4.0}
    for col, v in counts.items():
        wide[col] = v
    move, reason = autopilot.try_budgets(ro, wide, settings(), CFG, 0.25, "e")
    assert move is None and reason == "20 of 60 flat groups all solved or none solved (< 67%)"


def test_no_budgets_move_when_on_already_refused_or_without_causes():
    wide, ro = frames(MIXED_PLAN)
    assert autopilot.try_budgets(ro, wide, settings(budget_pilot=3), CFG, 0.25, "e") == (
        None, "per-prompt budgets already on (pilot 3)")
    why = "grpo.budget_pilot and grpo.dynamic_sampling do not combine (...)"
    assert autopilot.try_budgets(ro, wide, settings(budget_refusal=why), CFG, 0.25, "e") == (None, why)
    old = wide.drop(columns=[c for c in names.FLAT_CAUSES.values() if c not in (names.GROUPS_SOLVED,
                                                                                 names.GROUPS_UNSOLVED)])
    assert autopilot.try_budgets(ro, old, settings(), CFG, 0.25, "e") == (None, "no flat-cause counts in the window")
    # not in autopilot.moves (the default: opt-in until budgets meet their benchmark): never made
    default = AutopilotConfig(enabled=True, window=10)
    assert "budgets" not in default.moves and "budgets" in AUTOPILOT_MOVES
    assert all(m.move != "budgets" for m in autopilot.decide(wide, ro, autopilot.AutopilotState(settings()), default, HCFG))


def test_useful_share_reads_the_stored_token_counts():
    # trainable groups with long completions, flat ones short: 2 x 30 of 2 x 30 + 6 x 5 tokens
    wide, _ = frames(MIXED_PLAN, tokens={"mixed": 30, "solved": 5, "unsolved": 5})
    share, _, _, k = autopilot.useful_share(wide, 10)
    assert share == pytest.approx(60 / 90) and k == 10
    assert autopilot.useful_share(wide.drop(columns=[names.WASTED_TOKENS]), 10) == (None, None, None, 0)


def test_budgets_that_did_not_raise_the_useful_share_are_taken_back_and_kept_when_they_did():
    wide, ro = frames(MIXED_PLAN)  # after the move: useful share 0.25
    trial = {"request_id": 9, "move": "budgets", "kind": SET_BUDGET_PILOT, "before": {"budget_pilot": 0},
             "after": {"budget_pilot": 2}, "ratio": 0.24}
    st = autopilot.AutopilotState(settings(budget_pilot=2), trial=dict(trial))
    [mv] = autopilot.decide(wide, ro, st, CFG, HCFG)
    assert (mv.move, mv.kind, mv.payload["budget_pilot"], mv.payload["undo_of"]) == ("revert", SET_BUDGET_PILOT, 0, 9)
    assert mv.reason == ("autopilot move #9 did not help: useful token share 0.24 -> 0.25 over 10 steps "
                         "(needed >= 0.27): back to budget_pilot 0")
    # the share rose (0.25 >= 0.20 + 0.025): kept
    st.trial = {**trial, "ratio": 0.20}
    assert all(m.move != "revert" for m in autopilot.decide(wide, ro, st, CFG, HCFG))
    # the revert is an undo: no budgets move again in this run
    autopilot.record(st, [mv], 12, [10])
    st.moves.append({"request_id": 9, "move": "budgets", "step": 2})
    autopilot.note_applied(st, {"kind": SET_BUDGET_PILOT, "payload": mv.payload, "source": "autopilot"}, 13)
    assert st.vetoed == ["budgets"]


def test_undo_of_a_budgets_move_turns_them_off():
    assert autopilot.undo_request({"request_id": 4, "kind": SET_BUDGET_PILOT, "before": {"budget_pilot": 0}}) == (
        SET_BUDGET_PILOT, {"budget_pilot": 0, "undo_of": 4, "reason": "undo of autopilot move #4"})


def test_hook_sends_the_budgets_request_to_a_real_store(runs_dir):
    wide, ro = frames(MIXED_PLAN)
    store = RunStore.create("budgets-hook", {"reward": {"weights": {"exact": 1.0}}})
    log_frames(store, wide, ro, ["exact"])
    st = autopilot.AutopilotState(settings())
    [rid] = autopilot.step_hook(store, 12, st, CFG, HCFG)
    row = store.control().set_index("id").loc[rid]
    assert (row["kind"], row["source"], row["payload"]["budget_pilot"]) == (SET_BUDGET_PILOT, "autopilot", 2)
    ev = store.events(kinds=[EV_AUTOPILOT]).iloc[-1]["payload"]
    assert ev["move"] == "budgets" and ev["before"] == {"budget_pilot": 0}
    assert st.trial["move"] == "budgets" and st.trial["ratio"] == pytest.approx(0.25)


def test_the_config_enables_the_move_by_name():
    assert load_config(None, ["autopilot.moves=weights,budgets,stop"]).autopilot.moves == ["weights", "budgets", "stop"]


def test_the_trainer_says_when_budgets_cannot_go_on(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join('{"prompt": "Q: k%d? A: ", "answer": "v"}\n' % i for i in range(4)))
    sets = ["task.name=jsonl", f"task.dataset={data}", "model.hidden_size=32", "model.num_layers=1",
            "model.num_heads=2", "model.intermediate_size=64", "model.warm_start_steps=0", "grpo.max_new_tokens=4",
            "log.progress=false", "log.checkpoint_every=0", "grpo.group_size=4", "grpo.prompts_per_step=2"]
    cfg = load_config(None, sets)
    tr = Trainer(cfg, RunStore.create("r", cfg.to_dict(), root=tmp_path / "runs"), log=lambda m: None)
    assert tr.settings()["budget_refusal"] is None and tr.settings()["budget_pilot"] == 0
    tr.cfg.grpo.group_size = 2  # a live G of 2: a pilot of 2 leaves nothing to commit
    assert "leaves nothing to commit" in tr.settings()["budget_refusal"]
    tr.cfg.grpo.group_size, tr.cfg.grpo.dynamic_sampling = 4, True
    why = tr.settings()["budget_refusal"]
    assert "do not combine" in why
    assert autopilot.try_budgets(None, None, tr.settings(), CFG, 0.2, "e") == (None, why)
