"""Run config: TOML in/out, --set overrides, and errors that name the field and the fix."""
import dataclasses
import math

import pytest

from grpo_core.errors import ConfigError
from grpo_core.runs import config, live_settings
from grpo_core.tasks.loading import load_config


def write(tmp_path, text, name="run.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_defaults_are_valid_and_every_knob_has_help():
    cfg = load_config()
    assert cfg.grpo.group_size == 8 and cfg.grpo.min_group_std == 0.01
    assert cfg.reward.weights == config.DEMO_WEIGHTS and cfg.reward.weights is not config.DEMO_WEIGHTS
    knobs = config.describe()
    n_fields = sum(len(dataclasses.fields(type(getattr(cfg, s.name)))) for s in dataclasses.fields(cfg))
    assert len(knobs) == n_fields
    assert all(help_.strip() for _, _, help_ in knobs), [k for k, _, h in knobs if not h.strip()]


def test_toml_file_loads_and_coerces(tmp_path):
    p = write(tmp_path, """
[grpo]
group_size = 4
lr = 1e-4
min_group_std = 0
drop_untrainable = false
[reward]
outcome_metric = "exact"
[reward.weights]
exact = 1
answer_f1 = 0.25
[health]
near_zero_steps = 7
""")
    cfg = load_config(p)
    assert cfg.grpo.group_size == 4 and isinstance(cfg.grpo.group_size, int)
    assert cfg.grpo.lr == 1e-4 and cfg.grpo.min_group_std == 0.0 and isinstance(cfg.grpo.min_group_std, float)
    assert cfg.grpo.drop_untrainable is False
    assert cfg.reward.weights == {"exact": 1, "answer_f1": 0.25}  # a file's table replaces the demo weights
    assert cfg.reward.outcome_metric == "exact" and cfg.health.near_zero_steps == 7
    assert cfg.grpo.steps == config.GRPOConfig().steps  # untouched knobs keep their defaults


def test_toml_round_trip(tmp_path):
    cfg = load_config(None, ["grpo.group_size=6", "reward.weights.citation=0.7", "task.level=3"])
    again = load_config(write(tmp_path, cfg.to_toml()))
    assert again == cfg


def test_set_overrides(tmp_path):
    p = write(tmp_path, "[grpo]\ngroup_size = 4\n[reward.weights]\nexact = 1.0\nformat = 0.5\n")
    cfg = load_config(p, ["grpo.group_size=16", "grpo.temperature=0.7", "log.keep_text=sample",
                          "reward.weights.format=0.25", "log.progress=false"])
    assert cfg.grpo.group_size == 16 and cfg.grpo.temperature == 0.7 and cfg.log.keep_text == "sample"
    assert cfg.reward.weights == {"exact": 1.0, "format": 0.25}  # merged into the file's table
    assert cfg.log.progress is False
    # without a file, one weight override keeps the other demo weights
    cfg = load_config(None, ["reward.weights.answer_f1=0.5"])
    assert cfg.reward.weights == {**config.DEMO_WEIGHTS, "answer_f1": 0.5}
    # later overrides win
    assert load_config(None, ["grpo.steps=5", "grpo.steps=9"]).grpo.steps == 9


@pytest.mark.parametrize("override,message", [
    ("grpo.group_sise=4", "unknown key 'grpo.group_sise' (did you mean 'group_size'?)"),
    ("grop.group_size=4", "unknown config section 'grop' (did you mean 'grpo'?)"),
    ("reward.weight.answer_f1=0.5", "unknown key 'reward.weight' (did you mean 'weights'?)"),
    ("grpo.group_size=1", "grpo.group_size must be >= 2, got 1"),
    ("grpo.group_size=eight", "grpo.group_size must be an integer, got 'eight'"),
    ("grpo.group_size=2.5", "grpo.group_size must be an integer, got 2.5"),
    ("grpo.group_size=true", "grpo.group_size must be an integer, got True"),
    ("grpo.lr=fast", "grpo.lr must be a number, got 'fast'"),
    ("grpo.temperature=nan", "grpo.temperature must be > 0, got nan"),
    ("grpo.top_p=1.5", "grpo.top_p must be in (0, 1], got 1.5"),
    ("log.progress=maybe", "log.progress must be true or false, got 'maybe'"),
    ("task.name=5", "task.name must be a string, got 5"),
    ("task.name=csv", "task.name must be one of demo, arithmetic, jsonl, got 'csv'"),
    ("reward.weights=3", "reward.weights must be a table"),
    ("reward.weights.answer_f1=nan", "reward.weights.answer_f1 must be finite, got nan"),
    ("reward.weights.answer_f1=-1", "reward.weights.answer_f1 must be >= 0, got -1.0"),
    ("reward.weights.answer_f1=abc", "reward.weights.answer_f1 must be a number, got 'abc'"),
    ("reward.outcome_metric=exakt", "reward.outcome_metric 'exakt' is not a metric in reward.weights"),
    ("health.near_zero_ratio=2", "health.near_zero_ratio must be in [0, 1], got 2.0"),
    ("health.zero_trainable_steps=0", "health.zero_trainable_steps must be >= 1, got 0"),
    ("health.min_reward_std=inf", "health.min_reward_std must be a finite number >= 0, got inf"),
    ("log.commit_every_s=-1", "log.commit_every_s must be between 0 and 10 seconds, got -1.0 (0 = a commit per step)"),
    ("grpo.group_size", "--set expects section.key=value"),
    ("group_size=4", "--set expects section.key=value (e.g. grpo.group_size=8)"),
])
def test_bad_overrides_name_the_field(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_all_zero_weights_and_bad_files(tmp_path):
    zero = write(tmp_path, "[reward.weights]\nexact = 0\nformat = 0.0\n")
    with pytest.raises(ConfigError, match="all zero"):
        load_config(zero)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[grpo\ngroup_size = 4", "broken.toml"))
    with pytest.raises(ConfigError, match=r"\[grpo\] must be a table"):
        load_config(write(tmp_path, "grpo = 4", "flat.toml"))
    with pytest.raises(ConfigError, match="unknown key 'grpo.groupsize' \\(did you mean 'group_size'"):
        load_config(write(tmp_path, "[grpo]\ngroupsize = 4", "typo.toml"))
    with pytest.raises(ConfigError, match="task.dataset must name a JSONL file"):
        load_config(None, ["task.name=jsonl"])


def test_check_weights():
    assert live_settings.check_weights({"a": 1, "b": "0.5"}, ["a", "b"]) == {"a": 1.0, "b": 0.5}
    with pytest.raises(ConfigError, match="unknown metric \\(did you mean 'answer_f1'\\?\\)"):
        live_settings.check_weights({"answer_f2": 1.0}, ["answer_f1", "exact"])
    for bad, msg in [({"a": math.inf}, "finite"), ({"a": -0.1}, ">= 0"), ({"a": 0.0}, "all zero"),
                     ({}, "at least one metric"), ({"a": None}, "must be a number")]:
        with pytest.raises(ConfigError, match=msg):
            live_settings.check_weights(bad, None)


def test_the_config_keeps_rules_as_data_and_train_checks_them_before_the_model_loads(tmp_path, capsys):
    """The runs wing holds a run's own alert rules as tables; the analysis wing parses them, and
    `train` asks it before a store exists or a model loads: a bad rule is one line, exit 2."""
    bad = "health.rules=[{metric = 'x', comparator = '>', threshold = 1}]"
    assert load_config(None, [bad]).health.rules == [{"metric": "x", "comparator": ">", "threshold": 1}]
    with pytest.raises(ConfigError, match=r"health.rules must be a list of rule tables"):
        load_config(None, ["health.rules='x'"])
    from grpo_core.__main__ import main
    runs = tmp_path / "runs"
    assert main(["train", "--runs-dir", str(runs), "--set", bad, "--set", "log.progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: health.rules[0]: field 'kind' is missing"], err
    assert not runs.exists() or not any(runs.iterdir())  # no run was created
    bad_toml = write(tmp_path, "[[health.rules]]\nkind = 'k'\nmetric = 'x'\ncomparator = '~'\nthreshold = 1\n")
    assert main(["train", "--runs-dir", str(runs), "--config", str(bad_toml)]) == 2
    assert "health.rules[0]: comparator must be one of" in capsys.readouterr().err
