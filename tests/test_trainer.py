"""The GRPO step, function by function, against hand-computed values; the Trainer in-process
on a real run store (tiny model, no warm-start: fast); and the trainer's fast paths against
the reference they replace: the sampling loop against `model.generate` (same tokens under
the same seed), the shared-prompt forward against one forward over every row (same
log-probs, entropies and gradients), and the thread rule."""
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from grpo_core.analysis import health
from grpo_core.runs import lifecycle
from grpo_core.runs.config import GRPOConfig, HealthConfig, ModelConfig, RunConfig
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    DIFFICULTY,
    FRAC_REWARD_ZERO_STD,
    GRAD_NORM,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    LOSS_POLICY,
    MIN_GROUP_STD,
    PHANTOM_GROUPS,
    REWARD,
    REWARD_STD,
    SAMPLING_BATCHES,
    SCORING_ERRORS,
    STEP_SCALARS,
    TIME_LOG,
    TRAINABLE_RATIO,
    metric_group_std,
    metric_mean,
    metric_weight,
)
from grpo_core.runs.run_meta import FAILED, FINISHED, PAUSED, RUNNING, STOPPED, RunMeta, steps_budget
from grpo_core.runs.store import EV_ALERT, EV_LIFECYCLE, RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train import grpo, models, native_sampling, step_events
from grpo_core.train.checkpoints import latest_checkpoint
from grpo_core.train.grpo import ADV_EPS, advantages, grpo_loss, train_on, trim
from grpo_core.train.native_sampling import completion_mask, rollout
from grpo_core.train.trainer import Trainer

torch.set_num_threads(1)  # tiny matrices: extra threads only spin against other jobs (see models.set_threads)

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=3", "grpo.group_size=4", "grpo.max_new_tokens=10",
        "log.progress=false", "log.checkpoint_every=0"]


# ---- advantages ------------------------------------------------------------------------------------
TOTALS = np.array([[1.0, 0.0, 1.0, 0.0],
                   [0.5, 0.5, 0.5, 0.5],  # std 0: not trainable
                   [0.0, 0.0, 0.0, 1.0]])
TRAINABLE = np.array([True, False, True])


def test_advantages_group_scale_by_hand():
    """Default: the Bessel-corrected group std (n - 1), as TRL and verl divide by."""
    adv = advantages(TOTALS, TRAINABLE, "group")
    g0 = 0.5 / (math.sqrt(1 / 3) + ADV_EPS)  # mean 0.5, squared deviations 4 x 0.25 over n - 1 = 3
    s2 = 0.5  # mean 0.25, squared deviations 3 x 0.0625 + 0.5625 = 0.75 over 3
    expected = np.array([[g0, -g0, g0, -g0],
                         [0, 0, 0, 0],  # masked group: 0, not its noise blown up
                         [-0.25 / (s2 + ADV_EPS)] * 3 + [0.75 / (s2 + ADV_EPS)]])
    np.testing.assert_allclose(adv, expected, rtol=1e-12)


def test_advantages_population_std_on_request():
    adv = advantages(TOTALS, TRAINABLE, "group", std="population")
    g0 = 0.5 / (0.5 + ADV_EPS)  # mean 0.5, std 0.5
    s2 = math.sqrt(0.25 * 0.75)  # mean 0.25, std sqrt(p(1-p)) with p = 1/4
    np.testing.assert_allclose(adv[0], [g0, -g0, g0, -g0], rtol=1e-12)
    np.testing.assert_allclose(adv[2], [-0.25 / (s2 + ADV_EPS)] * 3 + [0.75 / (s2 + ADV_EPS)], rtol=1e-12)


def test_advantages_batch_and_none_scale_by_hand():
    batch_var = 4 / 12 - (5 / 12) ** 2  # all 12 rewards: E[x^2] = 4/12, mean 5/12
    for std, var in (("unbiased", batch_var * 12 / 11), ("population", batch_var)):
        adv = advantages(TOTALS, TRAINABLE, "batch", std=std)
        np.testing.assert_allclose(adv[0], np.array([0.5, -0.5, 0.5, -0.5]) / (math.sqrt(var) + ADV_EPS))
        np.testing.assert_allclose(adv[1], 0)
    adv = advantages(TOTALS, TRAINABLE, "none")
    np.testing.assert_allclose(adv, [[0.5, -0.5, 0.5, -0.5], [0, 0, 0, 0], [-0.25, -0.25, -0.25, 0.75]])


def test_advantages_of_a_trainable_group_sum_to_zero():
    rng = np.random.default_rng(0)
    t = rng.random((5, 8))
    adv = advantages(t, np.ones(5, bool))
    np.testing.assert_allclose(adv.sum(1), 0, atol=1e-9)


# ---- loss -----------------------------------------------------------------------------------------
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -1.5], [-1.0, -1.0]])
OLD = torch.tensor([[-1.2, -2.0], [-0.5, -1.0], [-1.0, -1.0]])
MASK = torch.tensor([[1, 1], [1, 0], [1, 1]])
ADV = torch.tensor([1.0, -1.0, 0.5])
ROWS = torch.tensor([True, True, False])  # row 2 belongs to a masked (non-trainable) group


def test_clipped_surrogate_token_level_by_hand():
    loss, st = grpo_loss(LOGP, OLD, ADV, MASK, policy_rows=ROWS, eps_low=0.2, eps_high=0.2)
    # row 0 (A=+1): ratio e^0.2 = 1.2214 is clipped to 1.2 -> -1.2; ratio 1 -> -1
    # row 1 (A=-1): ratio 1 -> +1; its 2nd token is masked. row 2: not a policy row, but its
    # 2 tokens count in the denominator (5 tokens), as zero-advantage rows do in TRL
    assert loss.item() == pytest.approx((-1.2 - 1.0 + 1.0) / 5)
    assert st["policy"] == pytest.approx(-0.24)
    assert st["clip_ratio"] == pytest.approx(1 / 3)  # of the policy tokens
    assert st["kl"] == 0.0


def test_clipped_surrogate_sequence_level_and_clip_high():
    loss, _ = grpo_loss(LOGP, OLD, ADV, MASK, policy_rows=ROWS, loss_type="sequence")
    assert loss.item() == pytest.approx(((-1.2 - 1.0) / 2 + 1.0) / 3)  # per-row means, over all 3 rows
    loss, st = grpo_loss(LOGP, OLD, ADV, MASK, policy_rows=ROWS, eps_low=0.2, eps_high=0.3)
    assert loss.item() == pytest.approx((-math.exp(0.2) - 1.0 + 1.0) / 5)  # 1.2214 < 1.3: not clipped
    assert st["clip_ratio"] == 0.0


def test_dropped_rows_still_count_in_the_denominator():
    """train_on drops row 2 before the call and passes the full count: same loss as masking."""
    keep = torch.tensor([0, 1])
    loss, _ = grpo_loss(LOGP[keep], OLD[keep], ADV[keep], MASK[keep], policy_denom=5.0)
    assert loss.item() == pytest.approx(-0.24)


def test_kl_k3_term_by_hand():
    ref = torch.tensor([[-1.0, -2.5], [-0.5, -1.5], [-2.0, -1.0]])
    loss, st = grpo_loss(LOGP, OLD, ADV, MASK, policy_rows=ROWS, ref_logp=ref, beta=0.1)
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    kl = (k3(0) + k3(-0.5) + k3(0) + k3(-1.0) + k3(0)) / 5  # every row's unmasked tokens, masked group too
    assert st["kl"] == pytest.approx(kl)
    assert loss.item() == pytest.approx(-0.24 + 0.1 * kl)


def test_masked_positions_never_make_the_loss_nan():
    logp = LOGP.clone()
    logp[1, 1] = float("-inf")  # padding after eos may be a suppressed token
    loss, _ = grpo_loss(logp.masked_fill(MASK == 0, 0.0), OLD.masked_fill(MASK == 0, 0.0), ADV, MASK, policy_rows=ROWS)
    assert math.isfinite(loss.item())


# ---- rollout helpers -------------------------------------------------------------------------------
def test_completion_mask_keeps_the_first_eos():
    ids = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 2, 2, 2]])
    assert completion_mask(ids, 2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]


def test_trim_drops_all_padding_columns():
    ids = torch.arange(12).reshape(2, 6)
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]])  # prompt_len 4
    t_ids, t_mask, lp = trim(ids, mask, 4)
    assert lp == 3 and t_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 0]]
    assert t_ids.tolist() == [[1, 2, 3, 4], [7, 8, 9, 10]]


# ---- the update on a real tiny model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def policy():
    cfg = load_config(None, TINY).model
    tok = models.build_tokenizer()
    return models.build_tiny_model(cfg, tok, seed=0), tok


def _roll(policy, P=2, G=4):
    model, tok = policy
    from grpo_core.tasks.demo import DemoTask
    torch.manual_seed(0)
    return rollout(model, tok, DemoTask(2, 0).batch(P), G, max_new_tokens=8)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_zero_trainable_batch_changes_no_parameter(policy):
    model, _ = policy
    roll = _roll(policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = _params(model)
    st = train_on(model, opt, roll, np.zeros((2, 4)), np.array([False, False]), GRPOConfig())
    assert st["rows"] == 0 and st["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not opt.state  # the optimizer never stepped (AdamW's moments would move weights later)


def test_with_drop_untrainable_off_a_flat_batch_does_trls_work(policy):
    """drop_untrainable off is TRL's work at every step: a batch with no trainable group is still
    forwarded and backpropagated (a zero gradient) and the optimizer steps, so AdamW's weight
    decay moves the weights as TRL's step does (bench/smollm2_learning.py's "equal work")."""
    model, tok = policy
    m = type(model)(model.config)
    m.load_state_dict(model.state_dict())
    roll = _roll((m, tok))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    before = _params(m)
    st = train_on(m, opt, roll, np.zeros((2, 4)), np.array([False, False]), GRPOConfig(drop_untrainable=False))
    assert st["rows"] == 8 and st["grad_norm"] == 0.0 and opt.state
    assert any(not torch.equal(a, b) for a, b in zip(before, m.parameters()))


def _two_of_three_trainable():
    """Three groups of 4, the middle one constant: (trainable [3], advantages [3, 4])."""
    totals = np.array([[1.0, 0.0, 0.5, 0.0], [0.2, 0.2, 0.2, 0.2], [0.0, 1.0, 1.0, 0.0]])
    trainable = np.array([True, False, True])
    return trainable, advantages(totals, trainable)


def test_dropping_untrainable_groups_gives_the_masked_gradient(policy):
    """beta = 0: a zero-advantage row has zero gradient, so dropping it is exact."""
    model, _ = policy
    roll = _roll(policy, P=3)
    trainable, adv = _two_of_three_trainable()
    grads = []
    for drop in (True, False):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: grads computed, weights kept
        st = train_on(model, opt, roll, adv, trainable, GRPOConfig(drop_untrainable=drop))
        assert st["rows"] == (8 if drop else 12)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_with_a_kl_term_every_row_trains_whatever_drop_untrainable_says(policy):
    """beta > 0: a non-trainable row's KL term has a gradient, and TRL averages the KL over
    every token, so drop_untrainable must not drop it: both settings give TRL's gradient."""
    model, _ = policy
    ref = type(model)(model.config)
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():  # a reference the policy differs from, so the KL term is not 0
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    roll = _roll(policy, P=3)
    trainable, adv = _two_of_three_trainable()
    grads = []
    for drop in (True, False):
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        st = train_on(model, opt, roll, adv, trainable, GRPOConfig(drop_untrainable=drop, beta=0.1), ref_model=ref)
        assert st["rows"] == 12 and st["kl"] > 0
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # no trainable group at all: the KL term alone still trains, as TRL's step would
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    st = train_on(model, opt, roll, np.zeros((3, 4)), np.zeros(3, bool), GRPOConfig(beta=0.1), ref_model=ref)
    assert st["rows"] == 12 and st["policy"] == 0.0 and st["kl"] > 0 and st["grad_norm"] > 0


def test_an_update_moves_toward_higher_advantage(policy):
    from grpo_core.train.grpo import token_logprobs
    model, tok = policy
    m = type(model)(model.config)
    m.load_state_dict(model.state_dict())
    roll = _roll((m, tok), P=1)
    adv = np.array([[1.0, -1.0, 1.0, -1.0]])
    before, _ = token_logprobs(m, roll.input_ids, roll.attention_mask, roll.prompt_len)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    train_on(m, opt, roll, adv, np.array([True]), GRPOConfig(max_grad_norm=0))
    after, _ = token_logprobs(m, roll.input_ids, roll.attention_mask, roll.prompt_len)
    seq = lambda lp: (lp * roll.completion_mask).sum(1)  # noqa: E731
    gain = (seq(after) - seq(before)).detach()
    assert gain[0] > 0 and gain[2] > 0 and gain[1] < 0 and gain[3] < 0


# ---- the Trainer on a real store ---------------------------------------------------------------------
def _trainer(tmp_path, extra=(), run_id="r", resume=False):
    cfg = load_config(None, TINY + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path, exist_ok=True)
    return Trainer(cfg, store, resume=resume, log=lambda m: None), store


def _one_step(tr):
    scalars, groups, rollouts = tr.train_step()
    tr.step += 1
    tr.store.log_step(tr.step, scalars, groups, rollouts, tr.alerts.new_alerts(tr.step, scalars))
    return scalars, groups, rollouts


def test_step_logs_every_name_and_per_metric_scores(tmp_path):
    tr, store = _trainer(tmp_path)
    scalars, groups, rollouts = _one_step(tr)
    for name in STEP_SCALARS + (MIN_GROUP_STD, DIFFICULTY, SCORING_ERRORS, TIME_LOG, SAMPLING_BATCHES):
        assert name in scalars, name
    for m in tr.reward.names:
        for key in (metric_mean(m), metric_group_std(m), metric_weight(m)):
            assert key in scalars
    assert scalars[GROUPS_SUBMITTED] == 3 and len(groups) == 3 and len(rollouts) == 12
    ro = store.rollouts(step=1)
    assert set(tr.reward.names) <= set(ro.columns) and ro["completion"].notna().all()
    # the stored total is the weighted sum of the stored per-metric scores
    w = np.array([tr.reward.weights[m] for m in tr.reward.names])
    np.testing.assert_allclose(ro["total"], ro[tr.reward.names].to_numpy() @ w)


def test_weights_request_changes_the_next_steps_totals_and_logged_weights(tmp_path):
    tr, store = _trainer(tmp_path)
    s1, _, _ = _one_step(tr)
    assert s1[metric_weight("exact")] == 0.3
    new = {"answer_f1": 0.0, "exact": 1.0, "citation": 0.0, "format": 0.0, "length": 0.0}
    rid = store.request("set_weights", {"weights": new})
    tr.poll_control()
    s2, _, rollouts = _one_step(tr)
    for m, w in new.items():
        assert s2[metric_weight(m)] == w
    for _, _, total, scores, _, _ in rollouts:
        assert total == scores["exact"]  # the total is now exact alone
    assert s2[REWARD] == pytest.approx(s2[metric_mean("exact")])
    row = store.control().set_index("id").loc[rid]
    assert row["status"] == "applied" and row["applied_step"] == 2
    # a partial request changes only the metrics it names
    store.request("set_weights", {"weights": {"citation": 0.5}})
    tr.poll_control()
    assert tr.reward.weights == {**new, "citation": 0.5}


def test_invalid_requests_are_rejected_with_the_reason(tmp_path):
    tr, store = _trainer(tmp_path)
    bad = [store.request("set_weights", {"weights": {"exact": -1}}),
           store.request("set_weights", {"weights": {"nope": 1}}),
           store.request("set_difficulty", {"level": 9}),
           store.request("resume", {})]
    tr.poll_control()
    c = store.control().set_index("id")
    assert (c.loc[bad, "status"] == "rejected").all()
    assert "must be >= 0" in c.loc[bad[0], "message"]
    assert "unknown metric" in c.loc[bad[1], "message"]
    assert "level must be an integer from 1 to 4" in c.loc[bad[2], "message"]
    assert c.loc[bad[3], "message"] == "not paused"
    assert tr.reward.weights["exact"] == 0.3 and tr.task.level == 1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_compute_keeps_fp32_weights_that_move_as_in_fp32(tmp_path, dtype, monkeypatch):
    """model.dtype bf16/fp16 is the compute dtype: forward passes under autocast, weights and
    AdamW state in fp32. At lr 1e-6, bf16 weights updated in place drop nearly every update
    (1.8% of a 15.7M model's parameters moved in 3 steps); fp32 master weights move them all."""
    seen = []
    token_logprobs = grpo.token_logprobs

    def spy(*a, **kw):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == getattr(torch, dtype))
        return token_logprobs(*a, **kw)
    monkeypatch.setattr(grpo, "token_logprobs", spy)
    from grpo_core.tasks.rewards import Scored
    moved = {}
    for compute in ("float32", dtype):
        tr, _ = _trainer(tmp_path, [f"model.dtype={compute}", "grpo.lr=1e-6", "grpo.min_group_std=0"], run_id=compute)

        def varied(completions, examples, tr=tr):  # every group trainable: the untrained model's rewards tie
            raw = np.zeros((len(completions), len(tr.reward.names)))
            raw[:, 0] = [len(c) % 3 + i % 2 for i, c in enumerate(completions)]
            return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
        monkeypatch.setattr(tr.reward, "score", varied)
        before = [p.detach().clone() for p in tr.model.parameters()]
        for _ in range(3):
            _one_step(tr)
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        assert all(v.dtype == torch.float32 for st in tr.optimizer.state.values() for v in st.values() if v.dim())
        changed = sum(int((a != b).sum()) for a, b in zip(before, tr.model.parameters()))
        moved[compute] = changed / sum(p.numel() for p in before)
    assert seen and seen[-1]  # the half-precision run's forward passes ran under autocast
    assert moved["float32"] > 0.9 and moved[dtype] > 0.9 * moved["float32"], moved


def test_zero_trainable_step_does_no_update_and_alerts(tmp_path):
    tr, store = _trainer(tmp_path, ["health.zero_trainable_steps=1"])
    store.request("set_threshold", {"min_group_std": 0.99})  # nothing can vary that much
    tr.poll_control()
    before = _params(tr.model)
    scalars, _, _ = _one_step(tr)
    assert scalars[GROUPS_TRAINABLE] == 0 and scalars[TRAINABLE_RATIO] == 0
    assert scalars[MIN_GROUP_STD] == 0.99 and scalars[GRAD_NORM] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, tr.model.parameters()))
    alerts = store.events(kinds=[EV_ALERT])
    assert "zero_trainable" in [p["kind"] for p in alerts["payload"]]
    assert alerts["step"].tolist()[0] == 1
    _one_step(tr)  # an ongoing alert is not repeated
    assert [p["kind"] for p in store.events(kinds=[EV_ALERT])["payload"]].count("zero_trainable") == 1


def test_a_flapping_alert_is_one_event_until_quiet_for_a_while(tmp_path, monkeypatch):
    tr, _ = _trainer(tmp_path)
    on = {1, 2, 5, 6, 9, 30}  # on and off within ALERT_REARM steps, then again much later
    monkeypatch.setattr(step_events.health, "alerts", lambda wide, cfg, outcome=None: [health.Alert("declining_ratio", "warning", "x",
                                                                             int(wide.index[-1]))]
                        if int(wide.index[-1]) in on else [])
    fired = [s for s in range(1, 31) if tr.alerts.new_alerts(s, {REWARD: 0.5})]
    assert fired == [1, 30] and step_events.ALERT_REARM < 30 - 9


def test_dynamic_sampling_draws_batches_until_enough_trainable_groups(tmp_path):
    tr, store = _trainer(tmp_path, ["grpo.dynamic_sampling=true", "grpo.dynamic_max_batches=3",
                                    "grpo.dynamic_min_trainable=100"])  # never enough: the cap decides
    s, groups, rollouts = _one_step(tr)
    assert s[SAMPLING_BATCHES] == 3 and s[GROUPS_SUBMITTED] == 9
    assert len(groups) == 9 and len(rollouts) == 36 and groups["group"].tolist() == list(range(9))
    tr.cfg.grpo.dynamic_min_trainable = 1
    s, groups, _ = _one_step(tr)  # stops after the first batch with a trainable group
    per_batch = groups["trainable"].reshape(-1, 3).sum(1)
    k = int(s[SAMPLING_BATCHES])
    assert len(per_batch) == k and (per_batch[:-1] == 0).all() and (per_batch[-1] >= 1 or k == 3)


def test_dynamic_sampling_counts_only_what_the_step_trains_on(tmp_path, monkeypatch):
    """With an outcome gate, groups whose variance is shaping terms only (phantom) do not end the
    draw: the step's own trainable rule decides, and the step logs them as phantom."""
    from grpo_core.tasks.rewards import Scored
    tr, store = _trainer(tmp_path, ["grpo.dynamic_sampling=true", "grpo.dynamic_max_batches=3",
                                    "grpo.dynamic_min_trainable=1", "reward.outcome_metric=exact"])
    names = tr.reward.names

    def shaping_only(completions, examples):  # exact uniform, length varies in every group
        raw = np.zeros((len(completions), len(names)))
        raw[:, names.index("length")] = np.arange(len(completions)) % 2
        return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
    monkeypatch.setattr(tr.reward, "score", shaping_only)
    s, groups, _ = _one_step(tr)
    assert s[SAMPLING_BATCHES] == 3  # phantom groups would have stopped it after the first batch
    assert s[GROUPS_TRAINABLE] == 0 and s[PHANTOM_GROUPS] == 9 and groups["phantom"].all()


def test_difficulty_request_and_auto_curriculum(tmp_path):
    tr, store = _trainer(tmp_path, ["curriculum.mode=auto", "curriculum.window=2", "curriculum.raise_reward=-1",
                                    "curriculum.raise_ratio=1.01"])  # always 'easy': raises every 2 steps
    store.request("set_difficulty", {"level": 2})
    tr.poll_control()
    s, _, _ = _one_step(tr)
    assert s[DIFFICULTY] == 2 and tr.curriculum.after_step(tr.step, s) == []
    events = tr.curriculum.after_step(tr.step, s)
    assert tr.task.level == 3 and events[0][1]["source"] == "curriculum"


def test_run_checkpoints_and_resumes_from_the_last_complete_one(tmp_path):
    part, st = _trainer(tmp_path, ["grpo.steps=4", "log.checkpoint_every=2"])
    part.store.request("set_weights", {"weights": {"exact": 1.0}})
    assert part.run() == FINISHED
    ckpts = st.run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000002", "step-000004"]
    # never loaded: a half-written temp dir, and a folder without its state file
    shutil.copytree(ckpts / "step-000004", ckpts / ".tmp-step-000006-999999")
    shutil.copytree(ckpts / "step-000004", ckpts / "step-000008")
    os.remove(ckpts / "step-000008" / "state.pt")
    assert latest_checkpoint(st.run_dir).name == "step-000004"
    st.set_status(RUNNING)
    resumed, _ = _trainer(tmp_path, ["grpo.steps=6"], resume=True)
    assert resumed.step == 4 and resumed.reward.weights["exact"] == 1.0  # the weights in force, not the config's
    assert resumed.run() == FINISHED
    assert st.scalars_wide().index.tolist() == [1, 2, 3, 4, 5, 6]
    assert st.scalars_wide()[metric_weight("exact")].tolist() == [1.0] * 6
    events = [p["event"] for p in st.events(kinds=[EV_LIFECYCLE])["payload"]]
    assert events == ["started", "finished", "resumed", "finished"]


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    """Model, optimizer, rng and task stream all restored: the same samples and losses."""
    straight, st_a = _trainer(tmp_path / "a", ["grpo.steps=5"])
    straight.run()
    part, st_b = _trainer(tmp_path / "b", ["grpo.steps=3", "log.checkpoint_every=3"])
    part.run()
    st_b.set_status(RUNNING)
    resumed, _ = _trainer(tmp_path / "b", ["grpo.steps=5"], resume=True)
    resumed.run()
    ra, rb = st_a.rollouts(), st_b.rollouts()
    assert ra["completion"].tolist() == rb["completion"].tolist()  # the same samples, step for step
    np.testing.assert_allclose(st_a.scalars_wide()[LOSS_POLICY], st_b.scalars_wide()[LOSS_POLICY], atol=1e-6)


def test_resume_keeps_the_step_budget_a_set_steps_request_set(tmp_path):
    """A run given 6 steps mid-run (set_steps) and stopped resumes to 6, not to the config's 3;
    a resume that sets grpo.steps itself (--set grpo.steps=N) gets N."""
    part, st = _trainer(tmp_path, ["grpo.steps=3"])
    st.request("set_steps", {"steps": 6})
    st.request("stop", {})  # both applied at the first boundary: stopped at step 0 with a budget of 6
    assert part.run() == STOPPED and steps_budget(st.get_meta()) == 6
    st.set_status(RUNNING)
    resumed, _ = _trainer(tmp_path, ["grpo.steps=3"], resume=True)  # --resume: the stored config's 3
    assert resumed.cfg.grpo.steps == 6
    assert resumed.run() == FINISHED and st.last_step() == 6
    assert st.get_meta()["config"]["grpo"]["steps"] == 6  # the budget in force, for the next resume
    st.set_status(RUNNING)
    again, _ = _trainer(tmp_path, ["grpo.steps=7"], resume=True)  # --set grpo.steps=7 wins
    assert again.cfg.grpo.steps == 7 and again.run() == FINISHED and st.last_step() == 7
    assert RunMeta.parse({}).resumed_budget(5) == 5  # an old store without settings: the config's


def test_jsonl_task_trains_with_its_own_metrics(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("\n".join('{"prompt": "Q: %s? A: ", "answer": "%s"}' % (k, v)
                              for k, v in [("sun", "hot"), ("ice", "cold"), ("sky", "blue")]) + "\n")
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = '{data}'\n[reward.weights]\nexact = 1.0\nanswer_f1 = 0.5\n")
    cfg = load_config(toml, TINY + ["model.warm_start_steps=3", "grpo.steps=2"])
    store = RunStore.create("j", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    assert tr.run() == FINISHED
    assert tr.reward.names == ["exact", "answer_f1"] and tr.model_info["warm_steps"] == 3
    w = store.scalars_wide()
    assert w.index.tolist() == [1, 2] and metric_weight("citation") not in w.columns
    assert set(store.groups()["prompt_id"]) <= {r["prompt_id"] for r in tr.task.rows}
    assert store.get_meta()["metric_kinds"] == {"exact": "binary", "answer_f1": "continuous"}


def test_a_crash_is_recorded_as_failed_in_one_line_with_the_traceback_in_the_log(tmp_path):
    tr, store = _trainer(tmp_path, ["grpo.steps=3"])
    pending = store.request("set_threshold", {"min_group_std": 0.5})

    def boom(*a, **k):
        raise RuntimeError("boom in a step\nits second line")
    tr.train_step = boom
    tr.poll_control = lambda: None  # leave the request pending: the crash must reject it
    with pytest.raises(RuntimeError):
        tr.run_safely()
    meta, log = store.get_meta(), store.run_dir / "trainer.log"
    assert meta["status"] == FAILED and tr.failure == meta["error"]
    assert meta["error"] == f"RuntimeError: boom in a step (traceback in {log})"
    failed = store.events(kinds=["lifecycle"])["payload"].tolist()[-1]
    assert failed == {"event": FAILED, "error": meta["error"]}  # the event says the same one line
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in boom" in text and "its second line" in text
    assert store.control().set_index("id").loc[pending, "status"] == "rejected"
    assert RunStore.open(store.path, readonly=True).last_step() is None  # readable, nothing half-written


def test_pause_serves_requests_until_resume(tmp_path):
    tr, store = _trainer(tmp_path, ["grpo.steps=2"])
    store.request("pause", {})
    tr.poll_control()
    assert tr.paused and store.get_meta()["status"] == PAUSED
    store.request("set_difficulty", {"level": 3})
    store.request("resume", {})
    tr.wait_while_paused()  # applies both while paused, returns on resume
    assert not tr.paused and tr.task.level == 3 and store.get_meta()["status"] == RUNNING


def test_stop_request_checkpoints_and_ends_stopped(tmp_path):
    tr, store = _trainer(tmp_path, ["grpo.steps=50"])
    store.request("stop", {})
    assert tr.run() == STOPPED
    assert store.get_meta()["status"] == STOPPED
    assert latest_checkpoint(store.run_dir).name == "step-000000"
    assert store.last_step() is None


# =============================================================================================
# Fast paths: sampler vs generate, shared-prompt forward vs one forward over all rows
# =============================================================================================
SMALL = ModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
PROMPTS = ["Q: ice? sun=hot [S1] ice=red [S2] A: ", "Q: a? a=b [S1] A: ", "Q: cat? cat=tall dark [S1] A: "]


@pytest.fixture(scope="module")
def tok():
    return models.build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    """A random tiny Llama whose eos logit is pushed up, so rows end at different lengths
    (a random model alone would almost never end a row)."""
    m = models.build_tiny_model(SMALL, tok, seed=1)

    def eos_boost(module, inputs, out):
        out = out.clone()
        out[..., tok.eos_token_id] += 2.0
        return out
    m.lm_head.register_forward_hook(eos_boost)
    return m.eval()


def _generate(model, tok, prompts, G, n, temperature, top_p, suppress, top_k=0):
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=n,
                         num_return_sequences=G, suppress_tokens=suppress, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    return out[:, enc["input_ids"].shape[1]:]


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.3, 0.8, 0), (1.0, 1.0, 5),
                                                     (1.3, 0.8, 12)])
def test_sampler_returns_generates_tokens_under_the_same_seed(model, tok, temperature, top_p, top_k):
    """Prompts of different lengths (left padding), G rows each, eos mid-way, suppressed
    specials, temperature and nucleus: token for token what generate samples."""
    suppress = models.suppressed_token_ids(tok)
    torch.manual_seed(7)
    ref = _generate(model, tok, PROMPTS, 4, 12, temperature, top_p, suppress, top_k)
    torch.manual_seed(7)
    roll = native_sampling.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 4, max_new_tokens=12, temperature=temperature,
                     top_p=top_p, top_k=top_k, suppress_ids=suppress)
    assert torch.equal(roll.completion_ids, ref)
    ended = (ref == tok.eos_token_id).any(1)
    if not top_k:  # the case is exercised: some rows end early, some run out (top-k: eos is likely, all end)
        assert 0 < int(ended.sum()) < len(ended)
    assert roll.texts == tok.batch_decode(ref, skip_special_tokens=True)


def test_every_eos_id_of_the_generation_config_ends_a_completion(model, tok):
    """Models that list several eos ids (Qwen, Llama 3): a completion ends at the first of any,
    token for token as generate, and is masked after it."""
    other = tok.convert_tokens_to_ids("e")  # a frequent character: some rows end on it
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, other]
    try:
        assert native_sampling.eos_token_ids(model, tok) == [tok.eos_token_id, other]
        suppress = models.suppressed_token_ids(tok)
        torch.manual_seed(3)
        enc = tok(PROMPTS, return_tensors="pt", padding=True)
        ref = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=12, num_return_sequences=4,
                             suppress_tokens=suppress, pad_token_id=tok.pad_token_id,
                             eos_token_id=[tok.eos_token_id, other])[:, enc["input_ids"].shape[1]:]
        torch.manual_seed(3)
        roll = native_sampling.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 4, max_new_tokens=12, suppress_ids=suppress)
    finally:
        model.generation_config.eos_token_id = saved
    assert torch.equal(roll.completion_ids, ref)
    ends_on_other = [i for i, row in enumerate(ref.tolist()) if other in row]
    assert ends_on_other, "the case is exercised: some completion ends on the second eos id"
    for i in ends_on_other:
        first = ref[i].tolist().index(other)
        assert roll.completion_mask[i, first] == 1 and roll.completion_mask[i, first + 1:].sum() == 0


def test_rows_are_masked_after_eos_and_groups_share_their_prompt(model, tok):
    torch.manual_seed(0)
    roll = native_sampling.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 5, max_new_tokens=10,
                     suppress_ids=models.suppressed_token_ids(tok))
    comp, mask = roll.completion_ids, roll.completion_mask
    for row in range(comp.shape[0]):
        eos = (comp[row] == tok.eos_token_id).nonzero()
        end = int(eos[0]) + 1 if len(eos) else comp.shape[1]
        assert mask[row, :end].all() and not mask[row, end:].any()  # up to and including the first eos
        assert (comp[row, end:] == tok.pad_token_id).all()
    prompts = roll.input_ids[:, :roll.prompt_len].view(len(PROMPTS), 5, -1)
    assert (prompts == prompts[:, :1]).all()
    assert [e["prompt"] for e in roll.examples] == [p for p in PROMPTS for _ in range(5)]


def test_sampler_stops_when_every_row_has_ended(tok):
    m = models.build_tiny_model(SMALL, tok, seed=2)
    m.lm_head.register_forward_hook(lambda mod, i, out: out.index_fill(-1, torch.tensor([tok.eos_token_id]), 1e4))
    roll = native_sampling.rollout(m, tok, [{"prompt": PROMPTS[0]}], 3, max_new_tokens=16)
    assert roll.completion_ids.shape[1] == 1 and (roll.completion_ids == tok.eos_token_id).all()
    assert roll.texts == ["", "", ""]


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_shared_prompt_forward_equals_one_forward_over_all_rows(model, tok, temperature):
    """Same log-probs, entropies and gradients, with padded prompts and ended rows; also on a
    subset of whole groups (what train_on keeps when it drops untrainable groups)."""
    suppress = models.suppressed_token_ids(tok)
    torch.manual_seed(3)
    roll = native_sampling.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 4, max_new_tokens=10, suppress_ids=suppress)
    for rows in (torch.arange(12), torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])):
        ids, attn, lp = grpo.trim(roll.input_ids[rows], roll.attention_mask[rows], roll.prompt_len)
        out = {}
        for G in (1, 4):
            model.zero_grad()
            logp, ent = grpo.token_logprobs(model, ids, attn, lp, temperature=temperature, suppress_ids=suppress,
                                         with_entropy=True, group_size=G)
            (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
            out[G] = logp.detach(), ent, [p.grad.clone() for p in model.parameters()]
        mask = attn[:, lp:].bool()
        torch.testing.assert_close(out[4][0][mask], out[1][0][mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[4][1][mask], out[1][1][mask], atol=1e-5, rtol=1e-5)
        assert (out[4][0][~mask] == 0).all()
        for g4, g1 in zip(out[4][2], out[1][2]):
            torch.testing.assert_close(g4, g1, atol=1e-6, rtol=1e-4)
    model.zero_grad()


def test_sampled_tokens_have_the_log_probs_training_scores(model, tok):
    """The policy the sampler draws from (temperature, suppressed specials) is the one the
    loss differentiates: on a greedy-like temperature the sampled tokens are the argmax of
    the training forward's distribution."""
    suppress = models.suppressed_token_ids(tok)
    torch.manual_seed(5)
    roll = native_sampling.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 2, max_new_tokens=8, temperature=1e-3,
                     suppress_ids=suppress)
    ids, attn, lp = grpo.trim(roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp, _ = grpo.token_logprobs(model, ids, attn, lp, temperature=1e-3, suppress_ids=suppress, group_size=2)
    mask = attn[:, lp:].bool()
    assert torch.allclose(logp[mask], torch.zeros_like(logp[mask]), atol=1e-3)  # each token had probability ~1


def test_thread_rule(monkeypatch):
    old = torch.get_num_threads()
    try:
        monkeypatch.delenv("GRPO_HEALTH_TORCH_THREADS", raising=False)
        models.set_threads(RunConfig())
        assert torch.get_num_threads() == 1  # built-in model: one thread
        models.set_threads()
        assert torch.get_num_threads() == 1
        cfg = RunConfig()
        cfg.model.path = "/some/model"
        models.set_threads(cfg)
        assert torch.get_num_threads() == max(1, min(4, __import__("os").cpu_count() or 1))
        monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "2")
        models.set_threads(RunConfig())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_alerts_from_the_alert_inputs_alone_equal_alerts_from_every_column():
    """The trainer passes health.alerts only health.ALERT_INPUTS each step: on frames that
    raise every alert kind (and on healthy ones) that must not change a single alert."""
    rng = np.random.default_rng(0)
    cfg = HealthConfig()
    n = 30
    ratio_shapes = {"healthy": np.full(n, 0.8), "zero": np.r_[np.full(n - 5, 0.5), np.zeros(5)],
                    "declining": np.linspace(0.9, 0.05, n), "near_zero": np.full(n, 0.02),
                    "noisy": rng.random(n)}
    seen = set()
    for name, ratio in ratio_shapes.items():
        sub = np.full(n, 8.0)
        tr = np.round(ratio * sub)
        wide = pd.DataFrame({GROUPS_SUBMITTED: sub, GROUPS_TRAINABLE: tr, TRAINABLE_RATIO: tr / sub,
                             CUM_GROUPS_SUBMITTED: sub.cumsum(), CUM_GROUPS_TRAINABLE: tr.cumsum(),
                             FRAC_REWARD_ZERO_STD: 1 - tr / sub, REWARD_STD: rng.random(n) * 0.2,
                             REWARD: rng.random(n), "loss/policy": rng.normal(size=n), "time/step_s": 0.1},
                            index=pd.Index(np.arange(1, n + 1), name="step"))
        full = health.alerts(wide, cfg)
        narrow = health.alerts(wide[list(health.ALERT_INPUTS)], cfg)
        assert full == narrow, name
        seen |= {a.kind for a in full}
    assert {"zero_trainable", "low_ratio", "low_reward_std", "declining_ratio", "near_zero"} <= seen


def test_the_trainers_alert_check_raises_the_kinds_health_alerts_raises():
    """alert_kinds() (arrays, every step) against health.alerts() (frames, which write the
    messages) on windows that raise each kind, near each threshold, and at random."""
    rng = np.random.default_rng(1)
    cfg = HealthConfig()
    keep = max(cfg.trend_window, cfg.near_zero_steps, cfg.zero_trainable_steps) + 1
    shapes = [np.full(keep, 0.8), np.r_[np.full(keep - 5, 0.5), np.zeros(5)], np.linspace(0.9, 0.05, keep),
              np.full(keep, 0.02), np.full(keep, 0.3), np.full(keep, 0.25)]
    shapes += [rng.random(keep) * rng.random() for _ in range(300)]
    seen = set()
    for i, shape in enumerate(shapes):
        n = int(rng.integers(1, keep + 1)) if i >= 6 else keep  # windows still filling up too
        sub = np.full(n, float(rng.choice([4, 8, 16])))
        tr = np.round(shape[:n] * sub)
        rstd = rng.random(n) * (0.2 if i % 2 else 0.12)
        start = int(rng.integers(1, 500))
        at = start + (np.arange(n) if i % 3 else np.cumsum(rng.integers(1, 4, n)))  # some with steps missing
        hist = [{"step": int(at[k]), GROUPS_SUBMITTED: sub[k], GROUPS_TRAINABLE: tr[k],
                 TRAINABLE_RATIO: tr[k] / sub[k], CUM_GROUPS_SUBMITTED: sub[:k + 1].sum(),
                 CUM_GROUPS_TRAINABLE: tr[:k + 1].sum(), FRAC_REWARD_ZERO_STD: 1 - tr[k] / sub[k],
                 REWARD_STD: rstd[k], REWARD: 0.5} for k in range(n)]
        wide = pd.DataFrame({c: [r[c] for r in hist] for c in health.ALERT_INPUTS},
                            index=pd.Index([r["step"] for r in hist], name="step"))
        want = {a.kind for a in health.alerts(wide, cfg)}
        assert health.alert_kinds(hist, cfg) == want, (i, want)
        seen |= want
    assert seen == {"zero_trainable", "low_ratio", "low_reward_std", "declining_ratio", "near_zero"}
    assert health.alert_kinds([{"step": 1, REWARD: 0.5}], cfg) is None  # a value missing: ask health.alerts()
    assert health.alert_kinds([{**hist[0], REWARD_STD: float("nan")}], cfg) is None


def test_the_heartbeat_thread_checkpoints_the_wal_while_the_loop_defers(tmp_path, monkeypatch):
    """During run() the loop's connection, which writes the steps, never checkpoints
    (autocheckpoint 0) and the heartbeat thread folds the WAL in; afterwards the loop's
    connection is back to SQLite's default."""
    import threading
    import time
    seen, calls = [], []
    real_checkpoint, real_log_steps = RunStore.checkpoint, RunStore.log_steps

    def counted(self):
        out = real_checkpoint(self)
        calls.append((threading.current_thread().name, out))
        return out

    def spy(self, steps):
        seen.append((threading.current_thread().name, self.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0],
                     len(steps)))
        time.sleep(0.05)  # let a beat happen between steps
        return real_log_steps(self, steps)
    monkeypatch.setattr(RunStore, "checkpoint", counted)
    monkeypatch.setattr(RunStore, "log_steps", spy)
    monkeypatch.setattr(lifecycle.Heartbeat.__init__, "__defaults__", (0.02,))  # a beat every 20 ms, not 2 s
    tr, store = _trainer(tmp_path, ["grpo.steps=4", "log.commit_every_s=0"])  # 4 commits, each between beats
    tr.run()
    assert seen == [("MainThread", 0, 1)] * 4
    assert store.last_step() == 4
    assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    beats = [out for name, out in calls if name == "grpo-heartbeat"]
    assert beats and any(log > 0 and done == log for log, done in beats)  # frames written, all folded in


@pytest.mark.parametrize("schedule,theirs", [("constant", "constant_with_warmup"), ("linear", "linear"),
                                             ("cosine", "cosine")])
def test_the_learning_rate_schedule_is_transformers(schedule, theirs):
    from transformers import get_scheduler
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.5)
    scheduler = get_scheduler(theirs, optimizer, num_warmup_steps=3, num_training_steps=12)
    for step in range(14):
        assert 0.5 * grpo.lr_factor(step, 3, 12, schedule) == pytest.approx(optimizer.param_groups[0]["lr"], abs=1e-15)
        optimizer.step()
        scheduler.step()


def test_the_trainer_logs_the_scheduled_learning_rate(tmp_path):
    tr, store = _trainer(tmp_path, ["grpo.steps=4", "grpo.lr=0.01", "grpo.warmup_steps=2", "grpo.lr_schedule=linear"])
    assert tr.run() == "finished"
    from grpo_core.runs.names import LEARNING_RATE
    logged = store.scalars_wide()[LEARNING_RATE].tolist()
    assert logged == pytest.approx([0.0, 0.005, 0.01, 0.005])
