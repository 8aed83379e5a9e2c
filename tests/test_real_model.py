"""The trainer on a real-architecture model loaded like a hub model: a Qwen2 config with a
byte-level BPE tokenizer, a chat template and two eos ids (tests/real_model.py), through
`model.path`, `AutoModelForCausalLM` and `AutoTokenizer`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core import grpo
from grpo_core.checkpoints import latest_checkpoint
from grpo_core.config import load_config
from grpo_core.rewards import Scored
from grpo_core.store import RunStore
from grpo_core.trainer import Trainer
from tests.real_model import build


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build(tmp_path_factory.mktemp("models"))


def test_the_model_folder_loads_as_a_hub_model_does(qwen2):
    model, tok = AutoModelForCausalLM.from_pretrained(qwen2), AutoTokenizer.from_pretrained(qwen2)
    assert type(model).__name__ == "Qwen2ForCausalLM" and len(tok) == 2048
    assert model.generation_config.eos_token_id == [tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id]
    assert grpo.eos_token_ids(model, tok) == model.generation_config.eos_token_id
    chat = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert len(tok("the key of the source")["input_ids"]) < len("the key of the source") / 2  # BPE merges words


@pytest.mark.parametrize("dtype,extra", [("float32", []), ("bfloat16", ["model.gradient_checkpointing=true",
                                                                         "grpo.micro_batch_groups=1"])])
def test_it_trains_every_parameter_and_its_checkpoint_reloads(qwen2, tmp_path, monkeypatch, dtype, extra):
    cfg = load_config(None, extra + [f"model.path={qwen2}", f"model.dtype={dtype}", "grpo.steps=3", "grpo.prompts_per_step=2",
                             "grpo.group_size=4", "grpo.max_new_tokens=12", "grpo.lr=1e-3", "grpo.min_group_std=0",
                             "log.progress=false", "log.checkpoint_every=0"])
    store = RunStore.create("qwen2", cfg.to_dict(), root=tmp_path)
    monkeypatch.setenv("GRPO_TORCH_THREADS", "1")
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
    from grpo_core import models, names
    cfg = load_config(None, [f"model.path={qwen2}", "model.lora_rank=4", "grpo.beta=0.04", "grpo.steps=3",
                             "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=12", "grpo.lr=5e-3",
                             "grpo.min_group_std=0", "log.progress=false", "log.checkpoint_every=0"])
    store = RunStore.create("lora", cfg.to_dict(), root=tmp_path)
    monkeypatch.setenv("GRPO_TORCH_THREADS", "1")
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
