"""Every TRL 1.16 loss type we accept (grpo.loss_type = grpo | bnpo | dapo | dr_grpo, and ours:
token | sequence | dr_grpo) against TRL's own `GRPOTrainer._compute_loss`, in float64: the loss
and its gradient on the same tensors, and a whole train_on update on a real model whose
completions are shorter than max_completion_length (where dr_grpo's constant normaliser
differs from every other type's). TRL's loss types we do not have are one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_core.errors import ConfigError
from grpo_core.runs.config import GRPOConfig
from grpo_core.runs.trl_names import LOSS_TYPES, LOSS_TYPES_ELSEWHERE, loss_type
from grpo_core.tasks.loading import load_config
from grpo_core.train.grpo import advantages, grpo_loss, token_logprobs, train_on
from tests import test_trl_arithmetic
from tests.test_trl_arithmetic import _batch, trl_advantages

policy64 = test_trl_arithmetic.policy64  # a fixture

TRL_NAMES = ["grpo", "bnpo", "dapo", "dr_grpo"]


def trl_loss(loss_type: str, logp, adv, mask, *, max_completion_length: int | None = None, **kw):
    """TRL's own _compute_loss (tests/test_trl_arithmetic.py's stand-in trainer), with TRL's
    max_completion_length (the config value: dr_grpo divides by it) other than the mask's width."""
    if max_completion_length is None:
        return test_trl_arithmetic.trl_loss(loss_type, logp, adv, mask, **kw)
    wide = torch.zeros(mask.shape[0], max_completion_length, dtype=mask.dtype)
    wide[:, :mask.shape[1]] = mask  # TRL pads to the batch's longest; the padding is masked out either way
    def pad(t):
        return None if t is None else torch.nn.functional.pad(t, (0, max_completion_length - t.shape[1]))
    kw = {k: pad(v) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    return test_trl_arithmetic.trl_loss(loss_type, pad(logp), adv, wide, **kw)

def test_trl_names_are_accepted_as_values_and_stored_as_ours():
    for theirs in TRL_NAMES:
        cfg = load_config(None, [f"grpo.loss_type={theirs}"])
        assert cfg.grpo.loss_type == LOSS_TYPES[theirs]
    assert load_config(None, ["loss_type=grpo"]).grpo.loss_type == "sequence"  # the TRL knob name too
    assert set(TRL_NAMES) <= set(LOSS_TYPES)


def test_trls_loss_types_list_is_what_we_map_or_name():
    """Every loss type TRL's _compute_loss knows is mapped or named as not implemented here."""
    import inspect

    from trl import GRPOTrainer
    source = inspect.getsource(GRPOTrainer._compute_loss)
    trl_types = {t for t in ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
                 if f'"{t}"' in source}
    assert trl_types == set(TRL_NAMES) | set(LOSS_TYPES_ELSEWHERE)


@pytest.mark.parametrize("theirs", LOSS_TYPES_ELSEWHERE)
def test_trl_loss_types_we_lack_are_one_line(theirs):
    with pytest.raises(ConfigError, match=f"TRL's '{theirs}' is not implemented here") as e:
        loss_type(theirs)
    assert "\n" not in str(e.value) and "dr_grpo" in str(e.value)
    with pytest.raises(ConfigError, match="must be one of token"):
        load_config(None, ["grpo.loss_type=tokens"])


@pytest.mark.parametrize("theirs", TRL_NAMES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("off_policy", [False, True])
def test_loss_and_gradient_equal_trls(theirs, beta, off_policy):
    """The TRL name, mapped as config maps it, on TRL's tensors: a batch with a ragged mask and one
    group all zero advantage (its rows still count in dr_grpo's and grpo's denominators)."""
    rewards, logp0, mask = _batch(seed=4)
    rewards[:4] = 0.5  # group 0 uniform: advantage 0
    gen = torch.Generator().manual_seed(5)
    old = logp0 + 0.4 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64) if off_policy else None
    ref = logp0 + 0.3 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64)
    adv = trl_advantages(rewards, 4, "group")

    logp_trl = logp0.clone().requires_grad_(True)
    loss_trl = trl_loss(theirs, logp_trl, adv, mask, old=old, ref=ref if beta else None, beta=beta, eps_high=0.28)
    loss_trl.backward()
    logp_ours = logp0.clone().requires_grad_(True)
    loss_ours, _ = grpo_loss(logp_ours, logp_ours.detach() if old is None else old, adv, mask, eps_high=0.28,
                             loss_type=loss_type(theirs), ref_logp=ref, beta=beta)
    loss_ours.backward()
    assert abs(loss_ours.item() - loss_trl.item()) < 1e-10
    assert float((logp_ours.grad - logp_trl.grad).abs().max()) < 1e-10
    assert float(logp_trl.grad.abs().max()) > 1e-3


def test_dr_grpo_differs_from_the_token_mean():
    """The test above can fail: dr_grpo's loss is not bnpo's on a ragged mask."""
    rewards, logp, mask = _batch(seed=4)
    adv = trl_advantages(rewards, 4, "group")
    dr, _ = grpo_loss(logp, logp + 0.1, adv, mask, loss_type="dr_grpo")
    tok, _ = grpo_loss(logp, logp + 0.1, adv, mask, loss_type="token")
    assert abs(dr.item() / tok.item() - float(mask.sum()) / mask.numel()) < 1e-12


@pytest.mark.parametrize("theirs", TRL_NAMES)
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_a_train_on_update_has_trls_parameter_gradient(policy64, theirs, beta):
    """train_on (micro-batches of one group, the non-trainable group dropped when beta = 0) against
    _compute_loss on the whole batch, TRL's max_completion_length = grpo.max_new_tokens longer than
    the batch's padded width (dr_grpo divides by the config's length, not the tensor's)."""
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train.native_sampling import rollout
    model, tok = policy64
    torch.manual_seed(0)
    max_new = 16  # the config's; the batch is sampled with 12 (an engine pads to the batch's longest)
    roll = rollout(model, tok, DemoTask(1, 0).batch(3), 4, max_new_tokens=12)
    assert roll.completion_mask.shape[1] < max_new and roll.completion_mask.sum() < roll.completion_mask.numel()
    rewards = torch.rand(12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    rewards[4:8] = 1.0  # group 1 not trainable
    trainable = np.array([True, False, True])
    ref = type(model)(model.config).double()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))

    adv = advantages(rewards.numpy().reshape(3, 4), trainable, "group")
    cfg = load_config(None, [f"grpo.loss_type={theirs}", f"grpo.beta={beta}", "grpo.max_grad_norm=0",
                             f"grpo.max_new_tokens={max_new}", "grpo.micro_batch_groups=1"]).grpo
    assert isinstance(cfg, GRPOConfig)
    model.zero_grad(set_to_none=True)
    train_on(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, adv, trainable, cfg,
             ref_model=ref if beta else None)
    ours_grad = [p.grad.clone() for p in model.parameters()]

    model.zero_grad(set_to_none=True)
    args = (roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp, _ = token_logprobs(model, *args)
    with torch.no_grad():
        ref_logp, _ = token_logprobs(ref, *args)
    trl_loss(theirs, logp, torch.as_tensor(adv.reshape(-1)), roll.completion_mask, ref=ref_logp if beta else None,
             beta=beta, max_completion_length=max_new).backward()
    worst = max(float((a - p.grad).abs().max()) for a, p in zip(ours_grad, model.parameters()))
    assert worst < 1e-8  # float64 sums in another order (micro-batches), as tests/test_trl_arithmetic.py
    assert max(float(g.abs().max()) for g in ours_grad) > 1e-4
