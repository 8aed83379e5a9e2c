"""The built-in model: char tokenizer, tiny Llama, save/load through from_pretrained (the
code path a real hub model takes), special-token suppression, warm-start cache, errors."""
import json

import pytest
import torch

from grpo_core.errors import ConfigError
from grpo_core.runs.config import ModelConfig
from grpo_core.train import models

torch.set_num_threads(1)  # tiny matrices: extra threads only spin against other jobs (see models.set_threads)
SMALL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, warm_start_steps=0)


@pytest.fixture(scope="module")
def tok():
    return models.build_tokenizer()


def test_char_tokenizer_keeps_every_character_and_space(tok):
    text = "Q: sun?  sun=hot [S1] A: "
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == len(text) + 1  # one token per character, after <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4


def test_left_padding(tok):
    b = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    assert b["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    assert b["input_ids"][0, 0].item() == tok.pad_token_id


def test_suppressed_ids_are_specials_but_not_eos(tok):
    ids = models.suppressed_token_ids(tok)
    assert {tok.pad_token_id, tok.bos_token_id, tok.unk_token_id} <= set(ids)
    assert tok.eos_token_id not in ids


def test_save_and_load_round_trip_through_from_pretrained(tok, tmp_path):
    model = models.build_tiny_model(SMALL, tok, seed=3)
    models.save_pretrained(model, tok, tmp_path / "m")
    loaded, tok2 = models.load_pretrained(str(tmp_path / "m"))
    assert type(loaded).__name__ == "LlamaForCausalLM"
    text = "Q: ice? ice=red [S1] A: "
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.decode(tok2(text)["input_ids"], skip_special_tokens=True) == text  # spaces survive
    assert tok2.padding_side == "left"
    x = tok([text], return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(model(**x).logits, loaded(**x).logits, atol=1e-6)


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="no such folder"):
        models.load_pretrained(str(tmp_path / "missing"))
    (tmp_path / "notok").mkdir()
    tok = models.build_tokenizer()
    models.build_tiny_model(SMALL, tok).save_pretrained(tmp_path / "notok")  # model only, no tokenizer
    with pytest.raises(ConfigError, match="no tokenizer files"):
        models.load_pretrained(str(tmp_path / "notok"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        models.load_pretrained(str(tmp_path / "empty"))


def test_device_choice():
    dev, dtype = models.pick_device(ModelConfig())
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert dtype == (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            models.pick_device(ModelConfig(device="cuda"))


def test_sampling_never_emits_suppressed_tokens(tok):
    """Even a model that strongly prefers <pad>/<unk>/<bos> samples none of them."""
    from grpo_core.train.native_sampling import rollout
    model = models.build_tiny_model(SMALL, tok)
    bad = models.suppressed_token_ids(tok)

    def boost(module, inputs, out):
        out = out.clone()
        out[..., bad] += 50.0
        return out
    model.lm_head.register_forward_hook(boost)
    torch.manual_seed(0)
    roll = rollout(model, tok, [{"prompt": "Q: a? a=b [S1] A: "}] * 2, 4, max_new_tokens=8,
                   suppress_ids=bad)
    generated = roll.completion_ids[roll.completion_mask.bool()]
    assert generated.numel() > 0
    assert not torch.isin(generated, torch.tensor(bad)).any()


def test_warm_start_is_cached(tmp_path):
    from grpo_core.tasks.demo import DemoTask
    cfg = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, warm_start_steps=6)
    m1, _, info1 = models.load_policy(cfg, DemoTask(1, 0), tmp_path)
    assert info1["cached"] is False and info1["warm_steps"] == 6
    cache = tmp_path / ".cache"
    assert [p.name.startswith("warm-") for p in cache.iterdir()] == [True]  # no temp dir left behind
    m2, _, info2 = models.load_policy(cfg, DemoTask(1, 0), tmp_path)
    assert info2["cached"] is True and info2["warm_start"] == info1["warm_start"]
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    # another task config -> another cache entry
    models.load_policy(cfg, DemoTask(2, 0), tmp_path)
    assert len(list(cache.iterdir())) == 2
    assert json.loads((cache / next(cache.iterdir()).name / "config.json").read_text())["model_type"] == "llama"


@pytest.mark.slow
def test_warm_start_stops_once_answers_are_right(tok):
    """Warm-start ends at the success target, not at the step cap."""
    from grpo_core.tasks.demo import DemoTask
    cfg = ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256)
    torch.manual_seed(0)
    model = models.build_tiny_model(cfg, tok, seed=0)
    losses, rate = models.warm_start(model, tok, DemoTask(1, 0), max_steps=150, target=0.3)
    assert rate >= 0.3
    assert len(losses) < 150
    assert losses[-1] < losses[0]
