"""The trainer's fast paths against the reference they replace: the sampling loop against
`model.generate` (same tokens under the same seed), the shared-prompt forward against one
forward over every row (same log-probs, entropies and gradients), and the thread rule."""
from __future__ import annotations

import pytest
import torch

from grpo_core import models
from grpo_core import trainer as T
from grpo_core.config import ModelConfig, RunConfig

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


def _generate(model, tok, prompts, G, n, temperature, top_p, suppress):
    enc = tok(prompts, return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=n,
                         num_return_sequences=G, suppress_tokens=suppress, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    return out[:, enc["input_ids"].shape[1]:]


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_sampler_returns_generates_tokens_under_the_same_seed(model, tok, temperature, top_p):
    """Prompts of different lengths (left padding), G rows each, eos mid-way, suppressed
    specials, temperature and nucleus: token for token what generate samples."""
    suppress = models.suppressed_token_ids(tok)
    torch.manual_seed(7)
    ref = _generate(model, tok, PROMPTS, 4, 12, temperature, top_p, suppress)
    torch.manual_seed(7)
    roll = T.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 4, max_new_tokens=12, temperature=temperature,
                     top_p=top_p, suppress_ids=suppress)
    assert torch.equal(roll.completion_ids, ref)
    ended = (ref == tok.eos_token_id).any(1)
    assert 0 < int(ended.sum()) < len(ended)  # the case is exercised: some rows end early, some run out
    assert roll.texts == tok.batch_decode(ref, skip_special_tokens=True)


def test_rows_are_masked_after_eos_and_groups_share_their_prompt(model, tok):
    torch.manual_seed(0)
    roll = T.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 5, max_new_tokens=10,
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
    roll = T.rollout(m, tok, [{"prompt": PROMPTS[0]}], 3, max_new_tokens=16)
    assert roll.completion_ids.shape[1] == 1 and (roll.completion_ids == tok.eos_token_id).all()
    assert roll.texts == ["", "", ""]


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_shared_prompt_forward_equals_one_forward_over_all_rows(model, tok, temperature):
    """Same log-probs, entropies and gradients, with padded prompts and ended rows; also on a
    subset of whole groups (what train_on keeps when it drops untrainable groups)."""
    suppress = models.suppressed_token_ids(tok)
    torch.manual_seed(3)
    roll = T.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 4, max_new_tokens=10, suppress_ids=suppress)
    for rows in (torch.arange(12), torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])):
        ids, attn, lp = T.trim(roll.input_ids[rows], roll.attention_mask[rows], roll.prompt_len)
        out = {}
        for G in (1, 4):
            model.zero_grad()
            logp, ent = T.token_logprobs(model, ids, attn, lp, temperature=temperature, suppress_ids=suppress,
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
    roll = T.rollout(model, tok, [{"prompt": p} for p in PROMPTS], 2, max_new_tokens=8, temperature=1e-3,
                     suppress_ids=suppress)
    ids, attn, lp = T.trim(roll.input_ids, roll.attention_mask, roll.prompt_len)
    logp, _ = T.token_logprobs(model, ids, attn, lp, temperature=1e-3, suppress_ids=suppress, group_size=2)
    mask = attn[:, lp:].bool()
    assert torch.allclose(logp[mask], torch.zeros_like(logp[mask]), atol=1e-3)  # each token had probability ~1


def test_thread_rule(monkeypatch):
    old = torch.get_num_threads()
    try:
        monkeypatch.delenv("GRPO_TORCH_THREADS", raising=False)
        T.set_threads(RunConfig())
        assert torch.get_num_threads() == 1  # built-in model: one thread
        T.set_threads()
        assert torch.get_num_threads() == 1
        cfg = RunConfig()
        cfg.model.path = "/some/model"
        T.set_threads(cfg)
        assert torch.get_num_threads() == max(1, min(4, __import__("os").cpu_count() or 1))
        monkeypatch.setenv("GRPO_TORCH_THREADS", "2")
        T.set_threads(RunConfig())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
