"""The vLLM engine (grpo_core/train/vllm_engine.py) against the trainer's own log-probs, on the
real-architecture Qwen2 (tests/real_model.py) in float32: the engine's policy is the trainer's
policy before and after weight syncs (full and LoRA), and its sampling keeps the trainer's rules.

Needs vLLM, which the main venv does not have: `make` runs these in .venv-vllm, with
`.venv-vllm/bin/python -m pytest -q tests/test_vllm_engine.py` (the `vllm` marker); elsewhere
they skip, except those that need no vLLM (the one-line errors, the engine's sizing)."""
from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from grpo_core.errors import ConfigError
from grpo_core.runs.config import ModelConfig
from grpo_core.tasks import chat
from grpo_core.tasks.demo import DemoTask
from grpo_core.train import grpo, models, native_sampling, sampling, vllm_engine
from tests.real_model import build

# The engine's log-probs and the trainer's are the same arithmetic in float32 done by different
# kernels (vLLM's packed GEMMs and attention vs torch's), so they differ by rounding only: over
# 4 prompts x 3 completion seeds x 3 temperatures x 24 tokens, before and after training, and on
# sampled rollouts, the largest |delta| was 2e-6 (a few float32 ulps at log-probs near -8).
# 1e-4 leaves 50x for other CPUs' kernels, and is still 4 orders of magnitude below what a
# skipped sync leaves after a few optimizer steps (test_a_skipped_sync_...: about 1).
TOLERANCE = 1e-4
VOCAB_FLOOR = 3  # completions use ids from here up: 0-2 are the special tokens
PREFIX_BLOCK = 128  # vLLM's CPU KV block: the prefix cache keeps whole blocks of a prompt only
LONG_SYSTEM_PROMPT = "Answer the question, then cite the key of the source you used. " * 12


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def engine(qwen2):
    pytest.importorskip("vllm")
    return vllm_engine.VllmEngine(qwen2, dtype="float32", max_model_len=512)


@pytest.fixture
def policy(qwen2, engine):
    """(model, tokenizer), the engine synced to the model's weights."""
    model, tokenizer = models.load_pretrained(str(qwen2), dtype=torch.float32)
    engine.load_weights(model)
    return model, tokenizer


def rendered(tokenizer, n: int = 4, seed: int = 1, system_prompt: str = ""):
    """(examples, texts, ids): demo prompts as the trainer renders them (the chat template)."""
    examples = DemoTask(4, seed=seed).batch(n)
    texts = [chat.render(tokenizer, e["prompt"], system_prompt=system_prompt) for e in examples]
    return examples, texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def random_completions(prompt_ids, length: int, seed: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(VOCAB_FLOOR, vocab, (length,), generator=generator).tolist() for _ in prompt_ids]


def trainer_logprobs(model, prompt_ids, completions, temperature: float, suppress_ids) -> list[torch.Tensor]:
    """grpo.token_logprobs, the trainer's log-probs, row by row."""
    out = []
    with torch.no_grad():
        for prompt, completion in zip(prompt_ids, completions):
            ids = torch.tensor([prompt + completion])
            logp, _ = grpo.token_logprobs(model, ids, torch.ones_like(ids), len(prompt), temperature=temperature,
                                          suppress_ids=suppress_ids)
            out.append(logp[0])
    return out


def max_delta(engine, model, prompt_ids, completions, temperature: float, suppress_ids) -> float:
    ours = engine.score(prompt_ids, completions, temperature, suppress_ids)
    theirs = trainer_logprobs(model, prompt_ids, completions, temperature, suppress_ids)
    return max(float((a - b).abs().max()) for a, b in zip(ours, theirs))


def sgd_steps(model, prompt_ids, steps: int = 3, lr: float = 3e-3):
    """A few AdamW steps of next-token loss on the prompts: the weights move as training moves them."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        for prompt in prompt_ids:
            ids = torch.tensor([prompt])
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


# ---- errors that need no vLLM -----------------------------------------------------------------------
def test_without_vllm_the_engine_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine sets it: restored after the test
    with pytest.raises(ConfigError) as err:
        vllm_engine.VllmEngine("unused")
    assert str(err.value) == vllm_engine.NEEDS_VLLM and "\n" not in str(err.value)
    assert "pip install 'vllm>=0.32,<0.34'" in str(err.value) and "Sample with vLLM" in str(err.value)


def test_a_vllm_whose_internals_moved_is_one_line_naming_its_version(monkeypatch):
    @dataclasses.dataclass
    class EngineArgs:  # an engine without the options the engine sets
        model: str = ""
    fake = types.SimpleNamespace(__version__="0.99.0", EngineArgs=EngineArgs, SamplingParams=object, LLM=object)
    with pytest.raises(ConfigError) as err:
        vllm_engine.check_version(fake)
    message = str(err.value)
    assert message.startswith("vLLM 0.99.0 lacks ") and "\n" not in message
    assert "pip install 'vllm>=0.32,<0.34'" in message


def test_the_engines_context_follows_the_run_and_never_passes_the_models_limit():
    # 2 x the longest prompt + max_new_tokens, in steps of 256: SmolLM2's arithmetic prompt is 45 tokens.
    assert sampling.engine_length(0, 45, 16, 8192) == 256
    assert sampling.engine_length(0, 200, 1024, 8192) == 1536
    assert sampling.engine_length(0, 3000, 4096, 8192) == 8192  # the model's limit caps it
    assert sampling.engine_length(0, 45, 16, None) == 256  # a config without max_position_embeddings
    assert sampling.engine_length(700, 45, 16, 8192) == 700  # grpo.vllm_max_model_length as set
    with pytest.raises(ConfigError, match=r"^grpo.vllm_max_model_length 9000 is above the model's "
                                          r"max_position_embeddings 8192: set it to at most 8192"):
        sampling.engine_length(9000, 45, 16, 8192)


def test_the_cpu_kv_cache_holds_the_steps_sequences_within_a_floor_and_a_share_of_free_memory(monkeypatch):
    per_token = 46080  # SmolLM2-135M in float32: 2 x 30 layers x 3 KV heads x 64 x 4 bytes
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: 16 * 2**30)
    assert vllm_engine.cpu_kv_cache_bytes(per_token, 256, 8) == vllm_engine.CPU_KV_CACHE_BYTES  # the floor
    assert vllm_engine.cpu_kv_cache_bytes(per_token, 256, 64) == 64 * 256 * per_token
    assert vllm_engine.cpu_kv_cache_bytes(per_token, 8192, 64) == 4 * 2**30  # a quarter of the free memory
    monkeypatch.setattr(vllm_engine, "available_memory", lambda: 2**30)
    assert vllm_engine.cpu_kv_cache_bytes(per_token, 8192, 64) == 8192 * per_token  # but room for one sequence


def test_auto_picks_vllm_on_cuda_and_stays_native_on_cpu_where_vllm_was_not_measured_faster(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(sampling, "vllm_installed", lambda: False)
    assert sampling.pick_engine("auto", cuda) == "native"
    assert sampling.pick_engine("vllm", cpu) == "vllm" and sampling.pick_engine("native", cuda) == "native"
    monkeypatch.setattr(sampling, "vllm_installed", lambda: True)
    assert sampling.pick_engine("auto", cuda) == "vllm"
    assert sampling.pick_engine("auto", cpu) == "native"  # docs/benchmarks.md, "Sampling on a real model"


def test_vllms_start_failure_becomes_its_own_words_without_its_advice():
    error = ValueError("To serve at least one request with the model's max seq len (8192), (0.35 GiB KV cache "
                       "is needed, which is larger than the available KV cache memory (0.24 GiB). Based on the "
                       "available memory, the estimated maximum model length is 5632. Try increasing "
                       "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. "
                       "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    line = vllm_engine.meaningful_line(error)
    assert line.startswith("To serve at least one request") and line.endswith("maximum model length is 5632")
    wrapped = RuntimeError("Engine core initialization failed. See root cause above.")
    wrapped.__cause__ = RuntimeError("CPU out of memory\nmore detail")
    assert vllm_engine.meaningful_line(wrapped) == "CPU out of memory"


@pytest.mark.vllm
def test_a_prompt_and_max_new_tokens_beyond_the_engines_context_is_one_line_naming_the_knob(engine, policy):
    """vLLM would cut such completions short without a word: the rollout refuses them first."""
    model, tokenizer = policy
    examples, texts, prompt_ids = rendered(tokenizer, n=2)
    longest = max(map(len, prompt_ids))
    max_new = engine.max_model_len - longest + 1
    with pytest.raises(ConfigError) as err:
        vllm_engine.rollout(engine, tokenizer, examples, 2, max_new_tokens=max_new,
                            eos_ids=native_sampling.eos_token_ids(model, tokenizer), prompts=texts,
                            add_special_tokens=False)
    assert str(err.value) == (f"a prompt of {longest} tokens + grpo.max_new_tokens {max_new} = {longest + max_new} "
                              f"tokens, above the vLLM engine's context of {engine.max_model_len}: set "
                              f"grpo.vllm_max_model_length to at least {longest + max_new} (at most "
                              f"{model.config.max_position_embeddings})")


@pytest.mark.vllm
def test_on_cpu_a_head_size_vllm_has_no_kernel_for_is_one_line(engine, tmp_path):
    if not engine.on_cpu:
        pytest.skip("a CPU backend limit")
    small_heads = build(tmp_path, hidden_size=64, heads=4, kv_heads=2, layers=1)  # heads of 16
    with pytest.raises(ConfigError, match=r"no attention kernel for heads of 16 .*: sample this model natively"):
        vllm_engine.VllmEngine(small_heads)


# ---- the engine's policy is the trainer's -----------------------------------------------------------
@pytest.mark.vllm
def test_the_engines_logprobs_of_fixed_completions_equal_the_trainers(engine, policy):
    model, tokenizer = policy
    _, _, prompt_ids = rendered(tokenizer)
    suppress = models.suppressed_token_ids(tokenizer)
    for seed in range(3):
        completions = random_completions(prompt_ids, 24, seed, model.config.vocab_size)
        for temperature in (0.7, 1.0, 1.3):
            delta = max_delta(engine, model, prompt_ids, completions, temperature, suppress)
            assert delta < TOLERANCE, (seed, temperature)


@pytest.mark.vllm
def test_a_sync_after_optimizer_steps_makes_them_equal_again_and_a_skipped_one_does_not(engine, policy):
    model, tokenizer = policy
    examples, texts, prompt_ids = rendered(tokenizer, system_prompt=LONG_SYSTEM_PROMPT)
    assert min(map(len, prompt_ids)) > PREFIX_BLOCK
    suppress, eos = models.suppressed_token_ids(tokenizer), native_sampling.eos_token_ids(model, tokenizer)
    completions = random_completions(prompt_ids, 24, 0, model.config.vocab_size)
    # Sample once first: the prompts' KV is then in the prefix cache, computed by the old weights.
    vllm_engine.rollout(engine, tokenizer, examples, 2, max_new_tokens=8, eos_ids=eos, suppress_ids=suppress,
                        prompts=texts, add_special_tokens=False)
    sgd_steps(model, prompt_ids)
    skipped = max_delta(engine, model, prompt_ids, completions, 1.0, suppress)
    assert skipped > 1000 * TOLERANCE  # the mismatch a skipped sync leaves
    engine.load_weights(model)
    synced = max_delta(engine, model, prompt_ids, completions, 1.0, suppress)
    assert synced < TOLERANCE
    roll = vllm_engine.rollout(engine, tokenizer, examples, 2, max_new_tokens=8, eos_ids=eos, suppress_ids=suppress,
                               prompts=texts, add_special_tokens=False)
    sampled = rollout_delta(model, roll, 1.0, suppress)
    assert sampled < TOLERANCE  # no stale KV from the prefix cache


@pytest.mark.vllm
def test_a_lora_policy_syncs_merged_and_stays_unmerged_with_adapters_that_train(engine, policy):
    pytest.importorskip("peft")
    from peft.tuners.lora import LoraLayer
    base, tokenizer = policy
    model = models.apply_lora(base, ModelConfig(lora_rank=4, lora_alpha=8.0, lora_dropout=0.0))
    _, _, prompt_ids = rendered(tokenizer)
    suppress = models.suppressed_token_ids(tokenizer)
    completions = random_completions(prompt_ids, 24, 1, base.config.vocab_size)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    sgd_steps(model, prompt_ids, lr=1e-2)
    skipped = max_delta(engine, model, prompt_ids, completions, 1.0, suppress)
    assert skipped > 1000 * TOLERANCE
    engine.load_weights(model)
    synced = max_delta(engine, model, prompt_ids, completions, 1.0, suppress)
    assert synced < TOLERANCE  # the merged model's
    assert not any(m.merged for m in model.modules() if isinstance(m, LoraLayer))
    drift = max(float((p.detach() - frozen[n]).abs().max()) for n, p in model.named_parameters() if n in frozen)
    assert drift < 1e-6  # merge then unmerge leaves the base weights (float rounding aside)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    sgd_steps(model, prompt_ids, steps=1, lr=1e-2)
    assert all(not torch.equal(p, adapters[n]) for n, p in model.named_parameters() if p.requires_grad)
    engine.load_weights(model)
    synced_again = max_delta(engine, model, prompt_ids, completions, 0.8, suppress)
    assert synced_again < TOLERANCE


# ---- sampling -------------------------------------------------------------------------------------
@pytest.mark.vllm
def test_seeded_generation_is_reproducible_and_keeps_the_length_eos_and_suppression_rules(engine, policy):
    model, tokenizer = policy
    _, _, prompt_ids = rendered(tokenizer, n=4)
    group, max_new = 4, 24
    eos = list(range(100, 300))  # ~10% of the vocabulary: most rows end early
    suppress = list(range(300, 1300))  # half of it: would be half the tokens sampled
    kwargs = dict(max_new_tokens=max_new, temperature=1.3, eos_ids=eos, suppress_ids=suppress)
    seeds = list(range(100, 100 + len(prompt_ids) * group))
    ids, logprobs = engine.generate(prompt_ids, group, seeds=seeds, **kwargs)
    again, logprobs_again = engine.generate(prompt_ids, group, seeds=seeds, **kwargs)
    assert ids == again and logprobs == logprobs_again
    other, _ = engine.generate(prompt_ids, group, seeds=[s + 1 for s in seeds], **kwargs)
    assert other != ids
    assert len(ids) == len(prompt_ids) * group and all(1 <= len(row) <= max_new for row in ids)
    for row in ids:
        assert not set(row[:-1]) & set(eos)  # an eos ends the row ...
        assert len(row) == max_new or row[-1] in eos  # ... and is kept in it
        assert not set(row) & set(suppress)
    assert sum(len(row) < max_new for row in ids) >= len(ids) // 2
    rows = [p for p in prompt_ids for _ in range(group)]
    scored = engine.score(rows, ids, 1.3, suppress)
    delta = max(float((torch.tensor(lp) - s).abs().max()) for lp, s in zip(logprobs, scored))
    assert delta < TOLERANCE


@pytest.mark.vllm
def test_top_k_reaches_the_engine(engine, policy):
    """top_k = 1 leaves one token to draw: every row of a group is the same whatever its seed,
    where without it the seeds give different rows."""
    model, tokenizer = policy
    _, _, prompt_ids = rendered(tokenizer, n=2)
    group, seeds = 4, list(range(8))
    kwargs = dict(max_new_tokens=12, temperature=1.0, eos_ids=native_sampling.eos_token_ids(model, tokenizer),
                  suppress_ids=models.suppressed_token_ids(tokenizer), seeds=seeds)
    greedy, _ = engine.generate(prompt_ids, group, top_k=1, **kwargs)
    free, _ = engine.generate(prompt_ids, group, **kwargs)
    groups = lambda ids: [set(map(tuple, ids[i:i + group])) for i in range(0, len(ids), group)]  # noqa: E731
    assert all(len(g) == 1 for g in groups(greedy))
    assert any(len(g) > 1 for g in groups(free))


def rollout_delta(model, roll, temperature: float, suppress) -> float:
    """Largest |sampler log-prob - trainer log-prob| over a rollout's completion tokens."""
    with torch.no_grad():
        logp, _ = grpo.token_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_len,
                                      temperature=temperature, suppress_ids=suppress, group_size=roll.group_size)
    mask = roll.completion_mask.bool()
    return float((logp - roll.sampler_logprobs)[mask].abs().max())


@pytest.mark.vllm
def test_rollout_builds_the_native_samplers_rollouts_with_the_trainers_logprobs(engine, policy):
    model, tokenizer = policy
    examples, texts, _ = rendered(tokenizer, n=3, seed=2)
    group, suppress = 4, models.suppressed_token_ids(tokenizer)
    eos = native_sampling.eos_token_ids(model, tokenizer) + list(range(100, 300))  # ragged completions
    kwargs = dict(max_new_tokens=16, eos_ids=eos, temperature=0.9, suppress_ids=suppress, prompts=texts,
                  add_special_tokens=False)
    torch.manual_seed(0)
    roll = vllm_engine.rollout(engine, tokenizer, examples, group, **kwargs)
    torch.manual_seed(0)
    assert torch.equal(vllm_engine.rollout(engine, tokenizer, examples, group, **kwargs).input_ids, roll.input_ids)
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    lp = enc["input_ids"].shape[1]
    assert roll.prompt_len == lp and (roll.num_prompts, roll.group_size, roll.prompts) == (3, group, texts)
    assert roll.examples == [e for e in examples for _ in range(group)]
    assert torch.equal(roll.input_ids[:, :lp], enc["input_ids"].repeat_interleave(group, 0))
    assert torch.equal(roll.attention_mask[:, :lp], enc["attention_mask"].repeat_interleave(group, 0))
    assert torch.equal(roll.completion_mask, native_sampling.completion_mask(roll.completion_ids, eos))
    assert roll.completion_mask.sum(-1).min() < roll.completion_ids.shape[1]  # some rows end early ...
    assert (roll.completion_ids[roll.completion_mask == 0] == tokenizer.pad_token_id).all()  # ... padded after
    assert roll.texts == tokenizer.batch_decode(roll.completion_ids, skip_special_tokens=True)
    assert roll.sampler_logprobs.dtype == torch.float32 and roll.sampler_logprobs.shape == roll.completion_ids.shape
    assert (roll.sampler_logprobs[roll.completion_mask == 0] == 0).all()
    delta = rollout_delta(model, roll, 0.9, suppress)
    assert delta < TOLERANCE
