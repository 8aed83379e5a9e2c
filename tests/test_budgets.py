"""Per-prompt budgets (grpo.budget_pilot, grpo_core/train/budgets.py): the commit rule on crafted
histories; groups of different sizes handled exactly (advantages, health counts, the loss and its
gradient in float64 for every loss type, against the fixed-G arithmetic where the sizes are equal
and against each group computed on its own where they differ); the native sampler's per-group
sizes; a real run on a JSONL task that stores groups of different sizes and trains; the refusals."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from grpo_core.analysis import step_stats
from grpo_core.errors import ConfigError
from grpo_core.runs import names
from grpo_core.runs.config import GRPOConfig, ModelConfig
from grpo_core.runs.live_settings import SET_BUDGET_PILOT
from grpo_core.runs.run_meta import RUNNING
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train import budgets, models
from grpo_core.train.grpo import advantages, token_logprobs, train_on, trim
from grpo_core.train.native_sampling import rollout
from grpo_core.train.step_batch import StepBatch, row_index
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.max_new_tokens=6", "log.progress=false", "log.checkpoint_every=0"]


def _ex(pid):
    return {"prompt": pid, "prompt_id": pid}


# ---- the commit rule ---------------------------------------------------------------------------
def test_signals_follow_the_pilot_then_the_history():
    h = budgets.BudgetHistory()
    h.after_step([_ex("solved"), _ex("half"), _ex("lost")], [False, True, False])
    h.after_step([_ex("solved"), _ex("half"), _ex("lost")], [False, False, False])
    h.after_step([_ex("solved"), _ex("lost")], [False, False])
    assert h.of(_ex("solved")) == (3, 0) and h.of(_ex("half")) == (2, 1) and h.of(_ex("new")) == (0, 0)
    drawn = [_ex("solved"), _ex("half"), _ex("new"), _ex("lost")]
    pilot_mixed = np.array([False, False, False, True])
    s = budgets.signals(pilot_mixed, [h.of(e) for e in drawn])
    # flat pilot + flat history: 0; flat pilot + half trainable history: 1/2; unseen: UNSEEN_SIGNAL;
    # a pilot that varied: 1, whatever its history said
    np.testing.assert_array_equal(s, [0.0, 0.5, budgets.UNSEEN_SIGNAL, 1.0])


def test_commit_is_proportional_capped_and_gives_nothing_to_no_signal():
    extra = budgets.commit(np.array([1.0, 0.0, 0.5, 0.25]), budget=14, room=100)
    assert extra.tolist() == [8, 0, 4, 2]  # D'Hondt: 8 : 4 : 2 for 1 : 0.5 : 0.25
    capped = budgets.commit(np.array([1.0, 0.0, 0.5, 0.25]), budget=14, room=5)
    assert capped.tolist() == [5, 0, 5, 4] and capped.sum() == 14  # the cap's overflow goes to the next
    tight = budgets.commit(np.array([1.0, 0.0, 0.5]), budget=20, room=3)
    assert tight.tolist() == [3, 0, 3]  # what no prompt with signal can take is not sampled
    assert budgets.commit(np.zeros(4), budget=12, room=8).sum() == 0
    assert budgets.commit(np.ones(3), budget=0, room=8).sum() == 0


def test_history_state_round_trips():
    h = budgets.BudgetHistory()
    h.after_step([_ex("a"), _ex("b"), {"prompt": "no id"}], [True, False, True])
    copy = budgets.BudgetHistory()
    copy.load_state_dict(h.state_dict())
    assert copy.seen == h.seen == {"a": (1, 1), "b": (1, 0)}
    copy.load_state_dict(None)  # a checkpoint from before budgets: no history
    assert copy.seen == {}


def test_merged_rows_put_each_prompts_pilot_then_its_commit():
    order = budgets.row_order(np.array([2, 2, 2]), np.array([1, 0, 3]))
    # pilot rows 0..5 (2 per prompt), commit rows 6 (prompt 0), 7..9 (prompt 2)
    assert order.tolist() == [0, 1, 6, 2, 3, 4, 5, 7, 8, 9]
    group, idx = row_index(np.array([3, 2, 5]))
    assert group.tolist() == [0] * 3 + [1] * 2 + [2] * 5 and idx.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 4]


# ---- variable sizes: advantages and health counts ------------------------------------------------
def _padded(flat: np.ndarray, sizes: list[int]) -> np.ndarray:
    batch = StepBatch(None, np.arange(len(sizes)), [{}] * len(sizes), None, 1, 0.0, 0.0, sizes=np.array(sizes))
    return batch.grouped(flat, 0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("std", ["unbiased", "population"])
def test_equal_sizes_give_the_fixed_g_advantages_bit_for_bit(scale, std):
    rng = np.random.default_rng(0)
    totals = rng.random((5, 6)).round(2)
    totals[1] = 0.5  # a flat group
    trainable = totals.std(axis=1) > 0.01
    fixed = advantages(totals, trainable, scale, std=std)
    variable = advantages(_padded(totals.reshape(-1), [6] * 5), trainable, scale, std=std, sizes=np.full(5, 6))
    np.testing.assert_array_equal(variable, fixed)


@pytest.mark.parametrize("std", ["unbiased", "population"])
def test_each_groups_advantages_are_over_its_own_rows(std):
    rng = np.random.default_rng(1)
    sizes = [2, 5, 3, 8]
    flat = rng.random(sum(sizes)).round(3)
    padded = _padded(flat, sizes)
    got = advantages(padded, np.ones(4, bool), "group", std=std, sizes=np.array(sizes))
    start = 0
    for g, n in enumerate(sizes):
        alone = advantages(flat[start:start + n][None, :], [True], "group", std=std)[0]
        np.testing.assert_allclose(got[g, :n], alone, rtol=1e-14, atol=1e-15)
        assert (got[g, n:] == 0).all()  # the padding has no advantage
        start += n


def test_health_counts_of_groups_of_different_sizes_are_each_groups_own():
    sizes = [2, 6, 3, 4]
    flat = np.array([1, 0, 1, 1, 1, 1, 1, 1, 0.5, 0.5, 0.5, 0, 0, 1, 0.3], float)
    scores = flat[:, None]
    stats = step_stats.group_stats(_padded(flat, sizes), _padded(scores, sizes), min_group_std=0.01)
    assert stats.trainable.tolist() == [True, False, False, True]
    start = 0
    for g, n in enumerate(sizes):
        one = step_stats.group_stats(flat[None, start:start + n], scores[None, start:start + n], min_group_std=0.01)
        assert stats.mean[g] == one.mean[0] and stats.std[g] == one.std[0]
        assert stats.metric_std[g, 0] == one.metric_std[0, 0] and stats.noise[g] == one.noise[0]
        start += n
    sc = step_stats.step_scalars(stats, _padded(scores, sizes), ["m"], {"m": 1.0}, 0, 0)
    assert sc[names.GROUPS_SUBMITTED] == 4 and sc[names.GROUPS_TRAINABLE] == 2
    assert sc[names.metric_mean("m")] == pytest.approx(flat.mean(), abs=1e-15)  # every rollout once, no padding


def test_equal_sizes_give_the_fixed_g_health_counts_exactly():
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 2, (24, 2)).astype(float)
    raw[:6] = 1.0  # a flat group
    examples = [{}] * 4
    fixed = StepBatch(None, np.arange(4), examples, None, 1, 0.0, 0.0)
    sized = StepBatch(None, np.arange(4), examples, None, 1, 0.0, 0.0, sizes=np.full(4, 6))
    totals = raw @ np.array([0.7, 0.3])
    out = []
    for batch in (fixed, sized):
        t, sc = batch.grouped(totals, 6), batch.grouped(raw, 6)
        st = step_stats.group_stats(t, sc, min_group_std=0.01, outcome_index=0)
        out.append((st, step_stats.step_scalars(st, sc, ["a", "b"], {"a": 0.7, "b": 0.3}, 10, 3),
                    step_stats.wasted_compute(batch.grouped(np.arange(24), 6, 0), st.trainable, 1.0, (0, 0))))
    (a, sa, wa), (b, sb, wb) = out
    for field in ("mean", "std", "trainable", "phantom", "metric_std", "noise"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert sa == sb and wa == wb
    assert sized.padded_rows(list("abcdefghijklmnopqrstuvwx"))[0] == list("abcdefghijklmnopqrstuvwx")


def test_flat_cause_rows_are_padded_with_each_groups_first_row():
    sized = StepBatch(None, np.arange(2), [{}] * 2, None, 1, 0.0, 0.0, sizes=np.array([2, 3]))
    errors, lengths = sized.padded_rows(["e", "e", None, None, "x"], np.array([6, 6, 1, 2, 3]))
    assert errors == ["e", "e", "e", None, None, "x"] and lengths.tolist() == [6, 6, 6, 1, 2, 3]


# ---- variable sizes: the loss and its gradient on a real model, float64 ----------------------------
@pytest.fixture(scope="module")
def policy64():
    tok = models.build_tokenizer()
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return models.build_tiny_model(cfg, tok, seed=0).double(), tok


def _grads(model, roll, adv, trainable, cfg):
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: gradients computed, weights kept
    stats = train_on(model, opt, roll, adv, trainable, cfg)
    return [p.grad.clone() for p in model.parameters()], stats


@pytest.mark.parametrize("loss_type", ["token", "sequence", "dr_grpo"])
def test_equal_sizes_through_the_variable_path_give_the_fixed_g_gradient(policy64, loss_type):
    """The same rollouts as fixed G and as sizes [G] * P (the advantages masked by size, the rows
    repeated by size, micro-batches cut at group boundaries)."""
    from grpo_core.tasks.demo import DemoTask
    model, tok = policy64
    roll = rollout(model, tok, DemoTask(2, 0).batch(3), 4, max_new_tokens=8, seeds=[1, 2, 3])
    totals = np.random.default_rng(3).random((3, 4))
    trainable = np.array([True, False, True])
    cfg = GRPOConfig(loss_type=loss_type, max_grad_norm=0, micro_batch_groups=1, max_new_tokens=8)
    fixed, st_fixed = _grads(model, roll, advantages(totals, trainable), trainable, cfg)
    varied = dataclasses.replace(roll, sizes=[4, 4, 4])
    adv = advantages(totals, trainable, sizes=np.array([4, 4, 4]))
    got, st_var = _grads(model, varied, adv, trainable, cfg)
    assert st_var["rows"] == st_fixed["rows"] == 8
    for a, b in zip(got, fixed):
        assert torch.equal(a, b)  # bit for bit: the same rows, advantages, denominators and micro-batches
    assert st_var["policy"] == st_fixed["policy"] and st_var["entropy"] == st_fixed["entropy"]


@pytest.mark.parametrize("loss_type", ["token", "sequence", "dr_grpo"])
def test_groups_of_different_sizes_train_on_each_groups_own_advantages(policy64, loss_type):
    """Sizes 3, 2, 5: train_on's gradient (micro-batches of whole groups, each prompt forwarded
    once for its group) equals the loss written out by hand over one forward of every row, each
    row's advantage from its own group alone. The tolerance is the shared prefill's: its gradient
    sums the rows' terms in another order than one forward does (test_trainer's own test of it
    allows 1e-4 in float32); a wrong advantage, row or denominator moves it by far more."""
    from grpo_core.tasks.demo import DemoTask
    model, tok = policy64
    sizes = [3, 2, 5]
    roll = rollout(model, tok, DemoTask(2, 0).batch(3), sizes, max_new_tokens=8, seeds=[4, 5, 6])
    assert roll.sizes == sizes and roll.input_ids.shape[0] == 10 and roll.group_size == 5
    flat = np.random.default_rng(4).random(10)
    trainable = np.array([True, True, True])
    adv = advantages(_padded(flat, sizes), trainable, sizes=np.array(sizes))
    cfg = GRPOConfig(loss_type=loss_type, max_grad_norm=0, micro_batch_groups=2, max_new_tokens=8)
    got, stats = _grads(model, roll, adv, trainable, cfg)
    assert stats["rows"] == 10

    rows, start = [], 0
    for n in sizes:
        rows += advantages(flat[None, start:start + n], [True])[0].tolist()
        start += n
    a = torch.tensor(rows, dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    ids, attn, lp = trim(roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp, _ = token_logprobs(model, ids, attn, lp)
    mask = attn[:, lp:].double()
    term = -(a[:, None] * logp * mask)  # ratio 1: the surrogate's gradient is -A grad log p
    if loss_type == "token":
        loss = term.sum() / mask.sum()
    elif loss_type == "dr_grpo":
        loss = term.sum() / (10 * 8)
    else:
        loss = (term.sum(-1) / mask.sum(-1)).sum() / 10
    loss.backward()
    for mine, by_hand in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(mine, by_hand, rtol=1e-6, atol=1e-7)
    sizes_t = torch.tensor(sizes)
    shared, _ = token_logprobs(model, ids, attn, lp, group_size=sizes_t)  # each prompt once, its rows from its cache
    torch.testing.assert_close(shared, logp.detach(), rtol=1e-12, atol=1e-12)


def test_the_native_sampler_gives_each_group_its_own_size_and_stream(policy64):
    """A group's completions come from its own seed: the same sampled alone as in a batch of groups
    of other sizes."""
    from grpo_core.tasks.demo import DemoTask
    model, tok = policy64
    examples = DemoTask(2, 0).batch(3)
    together = rollout(model, tok, examples, [3, 1, 2], max_new_tokens=8, seeds=[7, 8, 9])
    assert together.sizes == [3, 1, 2] and len(together.texts) == 6
    assert [e["prompt"] for e in together.examples] == [examples[i]["prompt"] for i in (0, 0, 0, 1, 2, 2)]
    alone = [rollout(model, tok, [ex], n, max_new_tokens=8, seeds=[s]).texts
             for ex, n, s in zip(examples, [3, 1, 2], [7, 8, 9])]
    assert together.texts == sum(alone, [])
    halves = rollout(model, tok, examples, [3, 1, 2], max_new_tokens=8, seeds=[7, 8, 9], batch_groups=2)
    assert halves.texts == together.texts and halves.sizes == [3, 1, 2]


# ---- the real trainer ----------------------------------------------------------------------------
def _jsonl_trainer(tmp_path, extra=(), run_id="r"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "qa.jsonl"
    rows = [('{"prompt": "Q: k%d? A: ", "answer": "v", "fixed": %s}' % (i, "true" if i < 3 else "false"))
            for i in range(6)]
    data.write_text("\n".join(rows) + "\n")
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = '{data}'\n[reward.weights]\nmine = 1.0\n"
                    "[reward.custom]\nmine = 'tests.test_skipping:fixed_or_coin'\n")
    cfg = load_config(toml, TINY + ["grpo.prompts_per_step=3", "grpo.group_size=4"] + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path / "runs", exist_ok=True)
    return Trainer(cfg, store, log=lambda m: None), store


def test_a_real_run_with_budgets_stores_groups_of_different_sizes_and_trains(tmp_path):
    tr, store = _jsonl_trainer(tmp_path, ["grpo.steps=8", "grpo.budget_pilot=2"])
    before = [p.detach().clone() for p in tr.model.parameters()]
    tr.run()
    groups, rollouts, w = store.groups(), store.rollouts(), store.scalars_wide()
    assert groups["size"].nunique() > 1  # groups of different sizes, stored as such
    per_group = rollouts.groupby(["step", "group"]).size()
    np.testing.assert_array_equal(per_group.to_numpy(), groups.set_index(["step", "group"])["size"].to_numpy())
    spent = groups.groupby("step")["size"].sum()
    np.testing.assert_array_equal(spent.to_numpy(), w[names.BUDGET_ROLLOUTS].to_numpy())
    assert (spent <= 3 * 4).all() and (groups["size"] >= 2).all()  # within the budget; a pilot at least
    fixed = {r["prompt_id"] for r in tr.task.rows if r["fixed"]}
    seen_fixed = groups[groups["prompt_id"].isin(fixed)]
    again = seen_fixed[seen_fixed.duplicated("prompt_id")]  # always solved, seen before: nothing committed
    assert len(again) and (again["size"] == 2).all() and not seen_fixed["trainable"].any()
    coin = groups[~groups["prompt_id"].isin(fixed)]
    assert coin["size"].max() > 4 and coin["trainable"].any()  # the budget went where the signal was
    assert w[names.GROUPS_TRAINABLE].sum() == groups["trainable"].sum()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))  # it trained


def test_resume_reproduces_the_uninterrupted_budgeted_run(tmp_path):
    """The history the commit reads is in the checkpoint: a resumed run commits what the straight one did."""
    on = ["grpo.budget_pilot=2"]
    straight, st_a = _jsonl_trainer(tmp_path / "a", on + ["grpo.steps=8"])
    straight.run()
    part, st_b = _jsonl_trainer(tmp_path / "b", on + ["grpo.steps=4", "log.checkpoint_every=4"])
    part.run()
    st_b.set_status(RUNNING)
    resumed = Trainer(load_config(tmp_path / "b" / "run.toml", TINY + ["grpo.prompts_per_step=3", "grpo.group_size=4",
                                                                       "grpo.steps=8"] + on),
                      st_b, resume=True, log=lambda m: None)
    resumed.run()
    assert st_a.groups()["size"].tolist() == st_b.groups()["size"].tolist()
    assert st_a.rollouts()["completion"].tolist() == st_b.rollouts()["completion"].tolist()
    assert resumed.history.seen == straight.history.seen


def test_a_min_signal_of_one_commits_only_to_pilots_that_varied(tmp_path):
    """budget_min_signal = 1: a flat pilot gets nothing more unless every past group of its prompt
    was trainable (its history's signal is then 1); a pilot that varied gets its share."""
    tr, store = _jsonl_trainer(tmp_path, ["grpo.steps=6", "grpo.budget_pilot=2", "grpo.budget_min_signal=1.0"])
    tr.run()
    groups = store.groups().sort_values(["step", "group"]).set_index(["step", "group"])
    pilots = store.rollouts().sort_values(["step", "group", "idx"]).groupby(["step", "group"]).head(2)
    varied = pilots.groupby(["step", "group"])["mine"].nunique() > 1
    always = [bool(past["trainable"].all()) and len(past) > 0 for past in
              (groups[(groups.index.get_level_values("step") < s) & (groups["prompt_id"] == p)]
               for (s, _), p in groups["prompt_id"].items())]
    cut = ~varied.to_numpy() & ~np.array(always)
    assert (groups["size"][cut] == 2).all() and (groups["size"][varied.to_numpy()] > 2).all()
    assert cut.any() and varied.any()  # both kinds happened, so the check bites


def test_budgets_draw_through_skip_before_sampling(tmp_path):
    tr, store = _jsonl_trainer(tmp_path, ["grpo.steps=6", "grpo.budget_pilot=2", "grpo.skip_zero_variance=true"])
    tr.run()
    w = store.scalars_wide()
    assert (w[names.SKIPPED_PROMPTS] >= 0).all() and (w[names.BUDGET_ROLLOUTS] <= 12).all()
    assert (store.groups().groupby("step").size() == 3).all()  # prompts_per_step groups, whatever was skipped


def test_budgets_off_is_the_uniform_run(tmp_path):
    tr, store = _jsonl_trainer(tmp_path, ["grpo.steps=3"])
    tr.run()
    assert (store.groups()["size"] == 4).all() and names.BUDGET_ROLLOUTS not in store.scalars_wide().columns


def test_the_pilot_is_a_live_setting_with_its_refusals(tmp_path):
    tr, store = _jsonl_trainer(tmp_path, ["grpo.steps=1"])
    ok, step, msg = tr.apply_request({"id": 1, "kind": SET_BUDGET_PILOT, "payload": {"budget_pilot": 2}})
    assert ok and step == 1 and "budget_pilot 0 -> 2" in msg and tr.cfg.grpo.budget_pilot == 2
    ok, _, msg = tr.apply_request({"id": 2, "kind": SET_BUDGET_PILOT, "payload": {"budget_pilot": 1}})
    assert not ok and "cannot vary" in msg
    ok, _, msg = tr.apply_request({"id": 3, "kind": SET_BUDGET_PILOT, "payload": {"budget_pilot": 4}})
    assert not ok and "below grpo.group_size (4)" in msg
    tr.run()
    assert store.groups()["size"].sum() <= 12 and names.BUDGET_ROLLOUTS in store.scalars_wide().columns


@pytest.mark.parametrize("sets,message", [
    (["grpo.budget_pilot=1"], "0 (off) or >= 2"),
    (["grpo.budget_pilot=8"], "below grpo.group_size (8)"),
    (["grpo.budget_pilot=2", "grpo.engine=vllm"], "needs grpo.engine=native"),
    (["grpo.budget_pilot=2", "grpo.dynamic_sampling=true"], "do not combine"),
    (["grpo.budget_pilot=2", "grpo.budget_max_group=2"], "above grpo.budget_pilot"),
    (["grpo.budget_max_group=-1"], "grpo.budget_max_group must be >= 0"),
    (["grpo.budget_min_signal=1.5"], "grpo.budget_min_signal must be in [0, 1]"),
])
def test_unsupported_combinations_are_one_line(sets, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        load_config(None, sets)
    assert "\n" not in str(e.value)
    assert load_config(None, []).grpo.budget_pilot == 0  # off by default


@pytest.mark.slow
def test_one_rank_and_two_sample_the_same_budgeted_groups_and_train_alike(tmp_path):
    """Under torchrun every rank computes the commit from the gathered pilots: the same group sizes,
    scores and weights on 1 rank or 2."""
    from tests import test_torchrun as tr
    runs, config = tmp_path / "runs", tr._config(tmp_path)
    sets = tr.TINY + ["grpo.steps=3", "grpo.budget_pilot=2", "log.checkpoint_every=3"]
    tr._train_here("one", runs, sets, config)
    rc, out = tr._finish(tr._start(2, "two", runs, sets, config))
    assert rc == 0, out[-3000:]
    tr._same_run(runs, "one", "two", 3)
    sizes = [tr._steps(runs, run)[2]["size"].tolist() for run in ("one", "two")]
    assert sizes[0] == sizes[1] and len(set(sizes[0])) > 1
