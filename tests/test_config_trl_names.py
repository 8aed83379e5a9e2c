"""TRL's GRPOConfig names as aliases (runs/trl_names.py): in TOML and --set, their values
translated, unmapped names one line, every name a real field of the installed trl.GRPOConfig."""
from __future__ import annotations

import dataclasses

import pytest

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.runs import config
from grpo_core.runs import trl_names
from grpo_core.runs.trl_names import ALIASES, UNMAPPED, names_for
from grpo_core.tasks.loading import load_config


def write(tmp_path, text: str):
    p = tmp_path / "run.toml"
    p.write_text(text)
    return p


def test_every_name_is_a_field_of_trls_grpoconfig_and_every_target_a_knob():
    from trl import GRPOConfig
    trl_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert set(ALIASES) - trl_fields == set() and set(UNMAPPED) - trl_fields == set()
    knobs = {k for k, _, _ in config.describe()}
    assert {t for a in ALIASES.values() for t in a.targets} <= knobs


def test_set_and_toml_accept_trl_names(tmp_path):
    cfg = load_config(None, ["num_generations=4", "max_completion_length=64", "learning_rate=1e-6",
                             "scale_rewards=false", "loss_type=dr_grpo", "top_k=20", "epsilon=0.3",
                             "epsilon_high=0.28", "beta=0.04", "num_iterations=2", "temperature=0.7"])
    g = cfg.grpo
    assert (g.group_size, g.max_new_tokens, g.lr, g.scale, g.loss_type) == (4, 64, 1e-6, "none", "dr_grpo")
    assert (g.epsilon_low, g.epsilon_high, g.beta, g.num_iterations, g.temperature) == (0.3, 0.28, 0.04, 2, 0.7)
    assert g.top_k == 20 and load_config(None, ["top_k=-1"]).grpo.top_k == 0  # TRL's -1: off, as 0
    assert load_config(None, ["vllm_max_model_length=2048"]).grpo.vllm_max_model_length == 2048
    assert trl_names.translate("vllm_max_model_length", None) == [("grpo", "vllm_max_model_length", 0)]
    p = write(tmp_path, 'num_generations = 6\nscale_rewards = "batch"\nbf16 = true\nepsilon = 0.25\n'
                        '[grpo]\nmax_completion_length = 32\nloss_type = "grpo"\nlr = 1e-5\n')
    cfg = load_config(p)
    assert (cfg.grpo.group_size, cfg.grpo.scale, cfg.grpo.max_new_tokens, cfg.grpo.loss_type) == (6, "batch", 32,
                                                                                                  "sequence")
    assert (cfg.grpo.epsilon_low, cfg.grpo.epsilon_high, cfg.model.dtype) == (0.25, 0.25, "bfloat16")
    assert load_config(p, ["num_generations=3"]).grpo.group_size == 3  # --set wins over the file, as for our names
    assert load_config(p, ["grpo.num_generations=5"]).grpo.group_size == 5


def test_scale_rewards_takes_trls_values():
    for value, ours in [("true", "group"), ("false", "none"), ('"group"', "group"), ('"batch"', "batch"),
                        ('"none"', "none")]:
        assert load_config(None, [f"scale_rewards={value}"]).grpo.scale == ours
    with pytest.raises(ConfigError, match="scale_rewards = 'mean': accepted values here are 'group', 'batch'"):
        load_config(None, ["scale_rewards=mean"])


@pytest.mark.parametrize("sets, message", [
    (["per_device_train_batch_size=8"], "per_device_train_batch_size: TRL's per_device_train_batch_size has no "
                                        "equivalent here: TRL counts completions per device"),
    (["mask_truncated_completions=true"], "mask_truncated_completions: TRL's mask_truncated_completions has no "
                                          "equivalent here: not implemented here"),
    (["top_k=-2"], "grpo.top_k must be >= 0 (0 = off), got -2"),
    (["loss_type=sapo"], "grpo.loss_type: TRL's 'sapo' is not implemented here"),
    (["num_generation=8"], "--set expects section.key=value (e.g. grpo.group_size=8) or a TRL GRPOConfig name"),
])
def test_a_name_or_value_that_does_not_map_is_one_line(sets, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, sets)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_trl_name_and_our_key_set_apart_in_one_file_is_an_error(tmp_path):
    p = write(tmp_path, "num_generations = 4\n[grpo]\ngroup_size = 8\n")
    with pytest.raises(ConfigError, match=r"num_generations \(TRL's name for grpo.group_size\) = 4 and "
                                          r"grpo.group_size = 8 are both set: keep one"):
        load_config(p)
    p = write(tmp_path, "[grpo]\nper_device_train_batch_size = 4\n")
    with pytest.raises(ConfigError, match="TRL's per_device_train_batch_size has no equivalent here"):
        load_config(p)


def test_config_shows_the_trl_name_beside_each_knob(capsys):
    assert main(["config"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "[TRL: num_generations]" in lines["grpo.group_size"]
    assert "[TRL: max_completion_length]" in lines["grpo.max_new_tokens"]
    assert "[TRL: epsilon, epsilon_high]" in lines["grpo.epsilon_high"]
    assert "TRL:" not in lines["grpo.min_group_std"]
    assert names_for("grpo.scale") == ["scale_rewards"]
