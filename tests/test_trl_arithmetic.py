"""Our GRPO arithmetic against TRL 1.16's own code, in float64, on batches where every group
is trainable: advantages, the loss for each loss type we map to one of TRL's, and the
gradients, equal within 1e-8.

The loss is TRL's own `GRPOTrainer._compute_loss`, called on a stand-in for the trainer that
carries the attributes the method reads and hands it our log-probs. TRL computes its
advantages inline in `_generate_and_score_completions` (not a function one can call), so
`trl_advantages` restates those lines (trl/trainer/grpo_trainer.py, the sum_then_normalize
branch) around TRL's own `nanstd`. The callback's reward arithmetic (`trl_rewards`) is checked
against the same lines."""
from __future__ import annotations

import types
from collections import defaultdict

import numpy as np
import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

from grpo_core.analysis import step_stats
from grpo_core.integrations.trl import trl_rewards
from grpo_core.runs.config import GRPOConfig, ModelConfig
from grpo_core.train import models
from grpo_core.train.grpo import advantages, grpo_loss, token_logprobs, train_on, trim

# Our loss types and the TRL loss types they equal (dapo: on one process, one accumulation step).
LOSS_TYPES = [("token", "bnpo"), ("token", "dapo"), ("sequence", "grpo")]


def trl_advantages(rewards: torch.Tensor, group_size: int, scale: str, std_fn=nanstd) -> torch.Tensor:
    """TRL's advantages, as `_generate_and_score_completions` computes them (sum_then_normalize)."""
    mean = torch.nanmean(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
    if scale in ("group", "none"):
        std = std_fn(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size, dim=0)
    else:
        std = std_fn(rewards).expand_as(rewards)
    adv = rewards - mean
    if scale != "none":
        adv = adv / (std + 1e-4)
    return torch.nan_to_num(adv, nan=0.0)


def trl_loss(loss_type: str, logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, *, old=None, ref=None,
             beta: float = 0.0, eps_low: float = 0.2, eps_high: float = 0.2) -> torch.Tensor:
    """TRL's `GRPOTrainer._compute_loss` on one process, one accumulation step, no vLLM."""
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=1,
        max_completion_length=mask.shape[1], _entropy_bonus_enabled=False, aux_loss_enabled=False,
        accelerator=types.SimpleNamespace(num_processes=1, reduce=lambda t, reduction: t, gather=lambda t: t),
        _metrics=defaultdict(lambda: defaultdict(list)))
    b = mask.shape[0]
    inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    return GRPOTrainer._compute_loss(trainer, None, inputs)


def _batch(seed=0, P=3, G=4, L=6):
    """Rewards with every group trainable, log-probs, a ragged completion mask."""
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.rand(P * G, generator=gen, dtype=torch.float64)
    logp = -torch.rand(P * G, L, generator=gen, dtype=torch.float64) * 3
    lengths = torch.randint(1, L + 1, (P * G,), generator=gen)
    mask = (torch.arange(L)[None] < lengths[:, None]).long()
    return rewards, logp, mask


def exact_std(x: torch.Tensor, dim=None) -> torch.Tensor:
    """The Bessel-corrected std with every step in float64 (torch.std, as verl divides by)."""
    return torch.std(x) if dim is None else torch.std(x, dim=dim)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_equal_trls(scale):
    rewards, _, _ = _batch()
    ours = advantages(rewards.numpy().reshape(3, 4), np.ones(3, bool), scale).reshape(-1)
    np.testing.assert_allclose(ours, trl_advantages(rewards, 4, scale, exact_std).numpy(), rtol=0, atol=1e-12)
    # TRL's nanstd computes its Bessel factor n / (n - 1) from integer counts, which torch divides
    # in float32: its float64 std carries that factor's rounding, at most 2^-24 relative on the
    # variance, so 2^-25 (3e-8) on the std and the advantages. Within it, ours are TRL's.
    np.testing.assert_allclose(ours, trl_advantages(rewards, 4, scale).numpy(), rtol=2 ** -25, atol=1e-12)


@pytest.mark.parametrize("ours,theirs", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("off_policy", [False, True])
def test_loss_and_gradient_equal_trls(ours, theirs, beta, off_policy):
    """off_policy: old log-probs other than the current ones, so that the ratio clips."""
    rewards, logp0, mask = _batch(seed=1)
    gen = torch.Generator().manual_seed(2)
    old = logp0 + 0.4 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64) if off_policy else None
    ref = logp0 + 0.3 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64)
    adv = trl_advantages(rewards, 4, "group")

    logp_trl = logp0.clone().requires_grad_(True)
    loss_trl = trl_loss(theirs, logp_trl, adv, mask, old=old, ref=ref if beta else None, beta=beta,
                        eps_low=0.2, eps_high=0.28)
    loss_trl.backward()
    logp_ours = logp0.clone().requires_grad_(True)
    loss_ours, _ = grpo_loss(logp_ours, logp_ours.detach() if old is None else old, adv, mask, eps_low=0.2,
                             eps_high=0.28, loss_type=ours, ref_logp=ref, beta=beta)
    loss_ours.backward()
    assert loss_ours.dtype == torch.float64
    assert abs(loss_ours.item() - loss_trl.item()) < 1e-8
    assert float((logp_ours.grad - logp_trl.grad).abs().max()) < 1e-8
    assert float(logp_trl.grad.abs().max()) > 1e-3  # a gradient that can differ


@pytest.fixture(scope="module")
def policy64():
    tok = models.build_tokenizer()
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return models.build_tiny_model(cfg, tok, seed=0).double(), tok


@pytest.mark.parametrize("ours,theirs", LOSS_TYPES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_a_train_on_update_has_trls_parameter_gradient(policy64, ours, theirs, beta):
    """The whole update on a real model in float64: our advantages and train_on against TRL's
    advantages and _compute_loss on the same rollouts, parameter by parameter."""
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train.native_sampling import rollout
    model, tok = policy64
    torch.manual_seed(0)
    roll = rollout(model, tok, DemoTask(2, 0).batch(3), 4, max_new_tokens=8)
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ref = type(model)(model.config).double()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))

    adv = advantages(rewards.numpy().reshape(3, 4), np.ones(3, bool), "group")
    cfg = GRPOConfig(loss_type=ours, beta=beta, max_grad_norm=0)
    train_on(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, adv, np.ones(3, bool), cfg,
             ref_model=ref if beta else None)
    ours_grad = [p.grad.clone() for p in model.parameters()]

    model.zero_grad(set_to_none=True)
    args = (roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp, _ = token_logprobs(model, *args)
    with torch.no_grad():
        ref_logp, _ = token_logprobs(ref, *args)
    trl_loss(theirs, logp, trl_advantages(rewards, 4, "group"), roll.completion_mask, ref=ref_logp if beta else None,
             beta=beta).backward()
    worst = max(float((a - p.grad).abs().max()) for a, p in zip(ours_grad, model.parameters()))
    assert worst < 1e-8
    assert max(float(g.abs().max()) for g in ours_grad) > 1e-4


def test_the_callbacks_reward_arithmetic_is_trls():
    """trl_rewards on the three edge cases of issue 15, next to what TRL's own lines give."""
    nan = float("nan")
    scores = torch.tensor([[nan, nan, nan], [1.0, 0, 0], [1.0, 0, 0], [1.0, 0, 0],  # one unscorable row
                           [0.1, 0.2, 0.4], [0.1, 0.4, 0.2], [0.1, 0.2, 0.4], [0.1, 0.4, 0.2],  # permuted credits
                           [1.0, 0, 0], [1.0, 5e-8, 0], [1.0, 0, 0], [1.0, 5e-8, 0],  # a 5e-8 shaping term
                           [0.0, 0, 0], [1.0, 0, 0], [0.5, 0, 0], [0.0, 0, 0]], dtype=torch.float32)
    weights = torch.ones(3)
    rewards, zero = trl_rewards(scores, weights, 4)
    # TRL: rewards NaN where every function returned None, nanstd of each group, isclose to 0
    expected = (scores * weights).nansum(dim=1)
    expected[torch.isnan(scores).all(dim=1)] = torch.nan
    std = nanstd(expected.view(-1, 4), dim=1)
    assert torch.equal(torch.isnan(rewards), torch.isnan(expected))
    assert zero.tolist() == torch.isclose(std, torch.zeros_like(std)).tolist() == [True, False, True, False]
    assert 1e-8 < std[1] < 1e-7  # permuted credits: float32 rounding alone, and TRL trains the group
    # The store's view of the same groups: TRL's verdict, and the float-noise count beside it.
    totals = rewards.numpy().astype(np.float64).reshape(4, 4)
    stats = step_stats.group_stats(totals, scores.numpy().astype(np.float64).reshape(4, 4, 3), min_group_std=0.0,
                               nonzero=~zero.numpy())
    assert stats.trainable.tolist() == [False, True, False, True]
    assert stats.noise.tolist() == [False, True, False, False]
    assert stats.mean[0] == 1.0  # the unscorable completion is left out of its group's mean


@pytest.mark.parametrize("loss_type", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_micro_batches_give_the_one_batch_gradient(policy64, loss_type, beta):
    """grpo.micro_batch_groups: the step's forward/backward in micro-batches of whole groups,
    each divided by the whole step's counts: the same gradient and stats as one batch (float64),
    a non-trainable group included (dropped with beta 0, forwarded with a KL term)."""
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train.native_sampling import rollout
    model, tok = policy64
    torch.manual_seed(1)
    roll = rollout(model, tok, DemoTask(2, 0).batch(4), 4, max_new_tokens=10)
    totals = torch.rand(4, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64).numpy()
    totals[1] = 0.5  # a constant group
    trainable = np.array([True, False, True, True])
    adv = advantages(totals, trainable, "group")
    ref = type(model)(model.config).double()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    grads, stats = {}, {}
    for groups in (0, 1, 3):
        cfg = GRPOConfig(loss_type=loss_type, beta=beta, max_grad_norm=0, micro_batch_groups=groups)
        stats[groups] = train_on(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, adv, trainable, cfg,
                                 ref_model=ref if beta else None)
        grads[groups] = [p.grad.clone() for p in model.parameters()]
    for groups in (1, 3):
        worst = max(float((a - b).abs().max()) for a, b in zip(grads[0], grads[groups]))
        assert worst < 1e-12, (groups, worst)
        for key in ("policy", "kl", "clip_ratio", "entropy", "rows", "tokens"):
            assert stats[groups][key] == pytest.approx(stats[0][key], abs=1e-12), key
    assert stats[0]["rows"] == (16 if beta else 12)


def test_activation_checkpointing_gives_the_same_gradient(policy64):
    """model.gradient_checkpointing: the layers' activations recomputed in the backward pass
    give the same gradient as keeping them (float64, the same forward: with checkpointing a
    group's prompt is forwarded per row, which moves sums at the float32 level of the model's
    RMSNorm, so the comparison is row by row both ways), train_on runs with it, and sampling
    keeps its KV cache (eval mode)."""
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train import models
    from grpo_core.train.native_sampling import mode, rollout
    model, tok = policy64
    torch.manual_seed(2)
    roll = rollout(model, tok, DemoTask(2, 0).batch(3), 4, max_new_tokens=10)
    weights = torch.rand(roll.completion_ids.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    grads = []
    for on in (False, True):
        if on:
            models.enable_checkpointing(model)
        model.zero_grad(set_to_none=True)
        with mode(model, training=True):
            logp, _ = token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len, group_size=1)
            (logp * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    try:
        assert model.is_activation_checkpointing
        adv = advantages(torch.rand(3, 4, dtype=torch.float64).numpy(), np.ones(3, bool), "group")
        st = train_on(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, adv, np.ones(3, bool), GRPOConfig())
        assert st["rows"] == 12 and st["grad_norm"] > 0
        torch.manual_seed(2)
        again = rollout(model, tok, DemoTask(2, 0).batch(3), 4, max_new_tokens=10)  # the cache still works
        assert torch.equal(again.input_ids, roll.input_ids)
    finally:
        model.activation_checkpointing_disable()
    assert max(float((a - b).abs().max()) for a, b in zip(*grads)) < 1e-12


@pytest.mark.parametrize("ours,theirs", LOSS_TYPES)
def test_two_passes_per_batch_are_trls_num_iterations(policy64, ours, theirs):
    """grpo.num_iterations = 2 against TRL's: the old log-probs are the sampling policy's, taken
    before the first update, so the second pass's ratio moves off 1 and clips. Each pass is one
    SGD step with TRL's _compute_loss gradient (float64), parameter by parameter."""
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train.native_sampling import rollout
    model, tok = policy64
    torch.manual_seed(3)
    roll = rollout(model, tok, DemoTask(2, 0).batch(3), 4, max_new_tokens=8)
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    adv = advantages(rewards.numpy().reshape(3, 4), np.ones(3, bool), "group")
    start = {k: v.clone() for k, v in model.state_dict().items()}
    lr = 2.0  # large enough that the second pass's ratio leaves [0.8, 1.28] for some tokens

    stats = train_on(model, torch.optim.SGD(model.parameters(), lr=lr), roll, adv, np.ones(3, bool),
                     GRPOConfig(loss_type=ours, num_iterations=2, max_grad_norm=0, epsilon_high=0.28))
    ours_after = {k: v.clone() for k, v in model.state_dict().items()}

    model.load_state_dict(start)
    args = trim(roll.input_ids, roll.attention_mask, roll.prompt_len)
    with torch.no_grad():  # the forward train_on takes (trimmed, each prompt once per group): the losses alone differ
        old, _ = token_logprobs(model, *args, group_size=4)
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(2):
        sgd.zero_grad()
        logp, _ = token_logprobs(model, *args, group_size=4)
        trl_loss(theirs, logp, trl_advantages(rewards, 4, "group"), args[1][:, args[2]:], old=old,
                 eps_high=0.28).backward()
        sgd.step()
    worst = max(float((ours_after[k] - v).abs().max()) for k, v in model.state_dict().items())
    moved = max(float((ours_after[k] - start[k]).abs().max()) for k in start)
    model.load_state_dict(start)
    # The model's RMSNorm computes in float32 even in a float64 model: its rounding (~1e-7
    # relative) scales with the update; a wrong ratio or old policy moves weights by ~1e-2.
    assert worst < 1e-6 * moved and moved > 1e-2
    assert stats["clip_ratio"] > 0  # the second pass clipped: the mean over the passes is off 0
