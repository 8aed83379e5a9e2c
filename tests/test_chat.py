"""Chat templates (task.chat_template, task.system_prompt): prompts rendered as TRL renders
conversational data, with the real-architecture model's tokenizer (tests/real_model.py); the
rendered prompt is what the model reads and what the store keeps."""
from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from grpo_core.errors import ConfigError
from grpo_core.runs.store import RunStore
from grpo_core.tasks import chat
from grpo_core.tasks.jsonl import load_rows
from grpo_core.tasks.loading import load_config
from grpo_core.train import models
from grpo_core.train.trainer import Trainer
from tests.real_model import build


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return build(tmp_path_factory.mktemp("models"))


def test_a_prompt_renders_through_the_tokenizers_template_as_trl_does(qwen2):
    tok = AutoTokenizer.from_pretrained(qwen2)
    text = chat.render(tok, "2+3=", "auto", "Answer with a number.")
    assert text == ("<|im_start|>system\nAnswer with a number.<|im_end|>\n<|im_start|>user\n2+3=<|im_end|>\n"
                    "<|im_start|>assistant\n")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3="}]
    assert chat.render(tok, messages, "auto", "ignored: the messages have their own") == \
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat.render(tok, "2+3=", "none", "Be brief.") == "Be brief.\n\n2+3="


def test_without_a_template_strings_pass_and_messages_are_refused_in_one_line():
    tok = models.build_tokenizer()  # the built-in char tokenizer has no chat template
    assert chat.render(tok, "2+3=", "auto") == "2+3="
    with pytest.raises(ConfigError, match="list of chat messages but the tokenizer has no chat template"):
        chat.render(tok, [{"role": "user", "content": "2+3="}], "auto")


def test_the_trainer_prompts_with_the_rendered_template_once_and_the_store_keeps_it(tmp_path):
    """A template that writes the tokenizer's own <bos>: the prompt holds it once (tokenized
    without adding special tokens again), and the store's prompt text is the rendered one."""
    data = tmp_path / "chat.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"{i}+1="}], "answer": str(i + 1)} for i in range(4)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = load_config(None, ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                             "model.intermediate_size=64", "model.warm_start_steps=0", "task.name=jsonl",
                             f"task.dataset={data}", "task.system_prompt=Add.", "grpo.prompts_per_step=2",
                             "grpo.group_size=2", "grpo.max_new_tokens=4", "grpo.steps=1", "log.progress=false",
                             "log.checkpoint_every=0"])
    store = RunStore.create("chat", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    tr.tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                  "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    roll = tr.rollout(tr.task.batch(2))
    bos = tr.tokenizer.bos_token_id
    assert roll.prompts[0].startswith("<bos>system: Add.\nuser: ") and roll.prompts[0].endswith("assistant: ")
    assert [int((row[:roll.prompt_len] == bos).sum()) for row in roll.input_ids] == [1] * 4
    assert tr.run() == "finished"
    with RunStore.open(store.path, readonly=True) as s:
        ids = s.groups()["prompt_id"].tolist()
        texts = s.prompt_texts(ids)
    assert set(texts) == set(ids) and all(t.startswith("<bos>system: Add.\nuser: ") for t in texts.values())


def test_a_jsonl_prompt_may_be_messages_and_bad_messages_are_one_line(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": "a"}) + "\n")
    assert load_rows(good, ["exact"])[0]["prompt"] == [{"role": "user", "content": "hi"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [{"role": "user"}], "answer": "a"}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl line 1: field 'prompt' must be a string or a list of messages"):
        load_rows(bad, ["exact"])
    with pytest.raises(ConfigError, match="task.chat_template must be 'auto' or 'none'"):
        load_config(None, ["task.chat_template=chatml"])
