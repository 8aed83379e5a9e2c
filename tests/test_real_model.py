"""The trainer on a real-architecture model loaded like a hub model: a Qwen2 config with a
byte-level BPE tokenizer, a chat template and two eos ids (tests/real_model.py), through
`model.path`, `AutoModelForCausalLM` and `AutoTokenizer`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.rewards import Scored
from grpo_core.train import grpo, native_sampling
from grpo_core.train.checkpoints import latest_checkpoint
from grpo_core.train.trainer import Trainer
from tests.real_model import build


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build(tmp_path_factory.mktemp("models"))


def test_the_model_folder_loads_as_a_hub_model_does(qwen2):
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2), AutoTokenizer.from_pretrained(qwen2)
    assert type(model).__name__ == "Qwen2ForCausalLM" and len(tok) == 2048
    assert model.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    assert native_sampling.eos_token_ids(model, tok) == model.generation_config.eos_token_id
    chat = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert len(tok("the key of the source")["input_ids"]) < len("the key of the source") / 2  # BPE merges words


@pytest.mark.parametrize("dtype,extra", [("float32", []), ("bfloat16", ["model.gradient_checkpointing=true",
                                                                         "grpo.micro_batch_groups=1",
                                                                         "grpo.logit_chunk_mb=0.05"])])
def test_it_trains_every_parameter_and_its_checkpoint_reloads(qwen2, tmp_path, monkeypatch, dtype, extra):
    cfg = load_config(None, extra + [f"model.path={qwen2}", f"model.dtype={dtype}", "grpo.steps=3", "grpo.prompts_per_step=2",
                             "grpo.group_size=4", "grpo.max_new_tokens=12", "grpo.lr=1e-3", "grpo.min_group_std=0",
                             "log.progress=false", "log.checkpoint_every=0"])
    store = RunStore.create("qwen2", cfg.to_dict(), root=tmp_path)
    monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "1")
    tr = Trainer(cfg, store, log=lambda m: None)

    def varied(completions, examples):  # a random-init model's rewards would tie: give every group a spread
        raw = np.zeros((len(completions), len(tr.reward.names)))
        raw[:, 0] = [i % 2 + len(c) % 3 for i, c in enumerate(completions)]
        return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
    monkeypatch.setattr(tr.reward, "score", varied)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert tr.run() == "finished" and store.last_step() == 3
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    unmoved = [n for n, p in tr.model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unmoved == []
    reloaded = AutoModelForCausalLM.from_pretrained(latest_checkpoint(store.run_dir))
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), tr.model.state_dict().values()))
    rollouts = store.rollouts(with_text=True)
    assert len(rollouts) == 3 * 8 and rollouts["completion"].notna().all()
    store.close()


def test_lora_trains_only_the_adapters_resumes_and_exports_a_merged_model(qwen2, tmp_path, monkeypatch):
    """model.lora_rank: peft adapters on the real-architecture model. Only the adapters are in
    the optimizer and move; with beta > 0 the reference is the same model with its adapters off
    (no second copy), so the KL is 0 at the first step and not after it; the checkpoint holds the
    adapter, a resume loads it, and `export` writes a merged folder from_pretrained loads."""
    from grpo_core.__main__ import main
    from grpo_core.runs import names
    from grpo_core.train import models
    cfg = load_config(None, [f"model.path={qwen2}", "model.lora_rank=4", "grpo.beta=0.04", "grpo.steps=3",
                             "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=12", "grpo.lr=5e-3",
                             "grpo.min_group_std=0", "log.progress=false", "log.checkpoint_every=0"])
    store = RunStore.create("lora", cfg.to_dict(), root=tmp_path)
    monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "1")
    tr = Trainer(cfg, store, log=lambda m: None)

    def varied(completions, examples):
        raw = np.zeros((len(completions), len(tr.reward.names)))
        raw[:, 0] = [i % 2 + len(c) % 3 for i, c in enumerate(completions)]
        return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
    monkeypatch.setattr(tr.reward, "score", varied)
    named = dict(tr.model.named_parameters())
    adapters = {n for n in named if "lora_" in n}
    trained = [p for g in tr.optimizer.param_groups for p in g["params"]]
    assert adapters and {id(p) for p in trained} == {id(named[n]) for n in adapters}
    assert isinstance(tr.ref_model, models.AdaptersOff)
    before = {n: p.detach().clone() for n, p in named.items()}
    assert tr.run() == "finished"
    moved = {n for n, p in tr.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved and moved <= adapters  # the base weights never move
    kl = store.scalars_wide()[names.LOSS_KL]
    assert kl.loc[1] == 0 and kl.loc[3] > 0
    ckpt = latest_checkpoint(store.run_dir)
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "config.json").is_file()
    # resume: a fresh base, the checkpoint's adapters
    resumed = Trainer(cfg, store, resume=True, log=lambda m: None)
    assert resumed.step == 3 and all(torch.equal(p, dict(tr.model.named_parameters())[n])
                                     for n, p in resumed.model.named_parameters())
    # export: one plain folder, the adapters merged
    assert main(["export", str(store.run_dir), "--out", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    ids = AutoTokenizer.from_pretrained(tmp_path / "merged")("the key of the source", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, tr.model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    store.close()


def _rollout(model, tok, rows_per_prompt=3, seed=0):
    torch.manual_seed(seed)
    examples = [{"prompt": p} for p in ("the key of", "2 + 3 =", "say something long about the source")]
    return native_sampling.rollout(model, tok, examples, rows_per_prompt, max_new_tokens=10)


@pytest.mark.parametrize("group_size,lora", [(1, False), (3, False), (3, True)])
def test_chunked_logprobs_give_the_unchunked_values_and_gradient(qwen2, group_size, lora):
    """Float64: the head over a few completion tokens at a time (recomputed in backward) gives
    the log-probs, entropy and every parameter's gradient of the model's own full logits."""
    from grpo_core.runs.config import ModelConfig
    from grpo_core.train import models
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2).double(), AutoTokenizer.from_pretrained(qwen2)
    if lora:
        model = models.apply_lora(model, ModelConfig(lora_rank=4, lora_target_modules="all-linear"))
        for n, p in model.named_parameters():  # adapters at init are a no-op (B = 0): give them a value
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    roll = _rollout(model, tok)
    args = (roll.input_ids, roll.attention_mask, roll.prompt_len)
    results = []
    for chunk, on_hidden in ((None, False), (None, True), (3, True)):
        if not on_hidden:  # the model's own logits: the path a model with softcapped logits takes
            head_of, grpo.head_of = grpo.head_of, lambda m: None
        try:
            model.zero_grad()
            logp, ent = grpo.token_logprobs(model, *args, with_entropy=True, group_size=group_size, chunk=chunk,
                                            suppress_ids=[tok.convert_tokens_to_ids("<|im_start|>")])
            (logp * torch.linspace(-1, 1, logp.numel(), dtype=logp.dtype).view_as(logp)).sum().backward()
        finally:
            if not on_hidden:
                grpo.head_of = head_of
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent, grads))
    (lp0, ent0, g0), *rest = results
    assert (roll.completion_mask.sum() > 3 * 3) and set(g0) and (lp0 != 0).any()
    for lp, ent, grads in rest:
        torch.testing.assert_close(lp, lp0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ent, ent0, rtol=1e-12, atol=1e-12)
        assert grads.keys() == g0.keys()
        for n in g0:
            torch.testing.assert_close(grads[n], g0[n], rtol=1e-10, atol=1e-12)
    if lora:  # the reference: the same model with its adapters off, through the same chunked path
        ref, _ = grpo.token_logprobs(models.AdaptersOff(model), *args, chunk=3)
        with model.disable_adapter():
            plain, _ = grpo.token_logprobs(model, *args)
        torch.testing.assert_close(ref, plain, rtol=1e-12, atol=1e-12)
        assert not torch.allclose(ref, lp0)


def test_the_head_never_sees_more_than_a_chunk_of_tokens(qwen2):
    """The memory promise: no [rows, tokens, vocab] logits tensor, only [chunk, vocab] ones,
    in the forward and in the recompute of the backward; the trainer's chunk follows the knob."""
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2), AutoTokenizer.from_pretrained(qwen2)
    roll = _rollout(model, tok)
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    chunk = grpo.chunk_tokens(0.05, grpo.vocab_size(model))  # 0.05 MB of fp32 logits: 6 tokens of 2048
    assert chunk == 6
    logp, _ = grpo.token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len, group_size=3,
                                  chunk=chunk, with_entropy=True)
    logp.sum().backward()
    hook.remove()
    tokens = int(roll.completion_mask.sum())
    assert tokens > 4 * chunk
    assert max(s[0] for s in seen) <= chunk and all(s[-1] == 2048 for s in seen)
    assert len(seen) == 2 * -(-tokens // chunk)  # each chunk once forward, once recomputed in backward


def test_a_model_whose_logits_are_not_its_heads_uses_its_own_logits(qwen2):
    model = AutoModelForCausalLM.from_pretrained(qwen2)
    assert grpo.head_of(model) is model.get_output_embeddings()
    model.config.final_logit_softcapping = 30.0  # as Gemma 2: logits = 30 tanh(head / 30)
    assert grpo.head_of(model) is None


def test_sampling_in_batches_of_groups_holds_one_batch_and_keeps_the_rows_in_order(qwen2):
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2), AutoTokenizer.from_pretrained(qwen2)
    rows = []
    hook = model.get_decoder().register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]),
                                                         with_kwargs=True)
    examples = [{"prompt": p, "i": i} for i, p in enumerate(("the key", "2 + 3 =", "a much longer prompt about it"))]
    roll = native_sampling.rollout(model, tok, examples, 4, max_new_tokens=6, batch_groups=1)
    hook.remove()
    assert max(rows) == 4 and roll.num_prompts == 3 and [e["i"] for e in roll.examples] == [0] * 4 + [1] * 4 + [2] * 4
    assert roll.texts == tok.batch_decode(roll.completion_ids.masked_fill(roll.completion_mask == 0, tok.pad_token_id),
                                          skip_special_tokens=True)
    prompts = tok.batch_decode(roll.input_ids[:, :roll.prompt_len], skip_special_tokens=True)
    assert prompts == [e["prompt"] for e in roll.examples]  # left padding to the longest prompt of all batches


def test_a_micro_batch_budget_in_mb_sets_the_groups_per_forward(qwen2):
    """grpo.micro_batch_mb: the memory model's activation estimate of one group picks the
    micro-batch (whole groups); the knob micro_batch_groups wins when set; 0 = the whole step."""
    from grpo_core.runs.config import GRPOConfig
    from grpo_core.train import memory_model
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2), AutoTokenizer.from_pretrained(qwen2)
    roll = _rollout(model, tok)  # 3 groups of 3
    step = memory_model.Step(rows=3, prompt_tokens=roll.prompt_len, group_size=3, device="cpu",
                             completion_tokens=int(roll.completion_mask.sum(-1).max()), compute_dtype="float32")
    est = memory_model.estimate(memory_model.Architecture.from_config(model.config), step)
    per_group_mb = (est.activations + est.logprob_chunk) / 2 ** 20
    pick = lambda **kw: grpo.micro_batch_groups(model, roll, 3, GRPOConfig(**kw), torch.float32)  # noqa: E731
    assert pick(micro_batch_mb=2.5 * per_group_mb) == 2 and pick(micro_batch_mb=0.5 * per_group_mb) == 1
    assert pick(micro_batch_mb=0) == 3 and pick(micro_batch_mb=100 * per_group_mb) == 3
    assert pick(micro_batch_mb=0.5 * per_group_mb, micro_batch_groups=3) == 3
    rows = []
    hook = model.get_decoder().register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]),
                                                         with_kwargs=True)
    adv = grpo.advantages(np.random.default_rng(0).random((3, 3)), np.ones(3, bool), "group")
    grpo.train_on(model, torch.optim.SGD(model.parameters(), lr=0.0), roll, adv, np.ones(3, bool),
                  GRPOConfig(micro_batch_mb=2.5 * per_group_mb))
    hook.remove()
    assert max(rows) == 6  # two groups of three rows, then one
