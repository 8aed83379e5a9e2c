"""Alert rules as data (grpo_core/alert_rules.toml and a run's [[health.rules]]): one
evaluator for the trainer, the pages, the report and imported runs; the advice follows the
solved / unsolved split; the noisy-verifier rule. Hand-computed frames."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import alert_rules, health
from grpo_core.errors import ConfigError
from grpo_core.runs import names
from grpo_core.runs.config import HealthConfig
from grpo_core.tasks.loading import load_config


def frame(ratio, solved=None, unsolved=None, outcome=None, extra=None) -> pd.DataFrame:
    n = len(ratio)
    cols = {names.TRAINABLE_RATIO: ratio, names.GROUPS_SUBMITTED: [8.0] * n,
            names.GROUPS_TRAINABLE: [8.0 * r for r in ratio], names.REWARD_STD: [0.3] * n}
    if solved is not None:
        cols[names.GROUPS_SOLVED], cols[names.GROUPS_UNSOLVED] = solved, unsolved
    if outcome is not None:
        cols[names.metric_mean("exact")] = outcome
    return pd.DataFrame({**cols, **(extra or {})}, index=pd.Index(range(1, n + 1), name="step"))


def kinds(alerts):
    return {a.kind: a for a in alerts}


def test_the_builtin_rules_are_the_toml_file():
    assert [r.kind for r in alert_rules.BUILTIN] == ["zero_trainable", "low_ratio", "low_reward_std",
                                                     "declining_ratio", "near_zero", "noisy_verifier",
                                                     "sampler_mismatch", "template_collapse"]
    assert all(r.input in alert_rules.INPUTS or r.metric for r in alert_rules.BUILTIN)


def test_a_sampler_that_drifts_from_the_trainer_is_critical_and_an_in_step_one_is_quiet():
    """The mismatch rule reads the step's mean |trainer - sampler| log-prob (grpo.engine=vllm)."""
    healthy = [0.5] * 20
    synced = frame(healthy, extra={names.SAMPLER_LOGP_DIFF_MEAN: [1e-6] * 20})
    stale = frame(healthy, extra={names.SAMPLER_LOGP_DIFF_MEAN: [1e-6] * 19 + [0.4]})
    assert "sampler_mismatch" not in kinds(health.alerts(synced, HealthConfig()))
    assert "sampler_mismatch" not in kinds(health.alerts(frame(healthy), HealthConfig()))  # native: not logged
    alert = kinds(health.alerts(stale, HealthConfig()))["sampler_mismatch"]
    assert alert.severity == "critical" and "0.400" in alert.message and "weight sync" in alert.message


def test_the_advice_follows_the_solved_or_unsolved_split():
    low = [0.1] * 20
    solved = kinds(health.alerts(frame(low, solved=[6.0] * 20, unsolved=[1.0] * 20), HealthConfig()))
    unsolved = kinds(health.alerts(frame(low, solved=[1.0] * 20, unsolved=[6.0] * 20), HealthConfig()))
    unknown = kinds(health.alerts(frame(low), HealthConfig()))
    assert "harder prompts or turn on the curriculum" in solved["low_ratio"].message
    assert "easier prompts, raise the group size or the sampling temperature" in unsolved["low_ratio"].message
    assert unknown["low_ratio"].message.endswith("raise the group size or the weights of continuous metrics, "
                                                 "or change the task difficulty")


def test_noisy_verifier_fires_when_the_ratio_rises_and_the_outcome_stays_flat():
    rising = list(np.linspace(0.2, 0.8, 20))
    flat = [0.5 + 0.001 * ((-1) ** i) for i in range(20)]
    learning = list(np.linspace(0.2, 0.9, 20))
    cfg = HealthConfig()
    noisy = kinds(health.alerts(frame(rising, outcome=flat), cfg, "exact"))
    assert "noisy_verifier" in noisy and "outcome metric exact's mean stays flat" in noisy["noisy_verifier"].message
    assert "noisy_verifier" not in kinds(health.alerts(frame(rising, outcome=learning), cfg, "exact"))
    assert "noisy_verifier" not in kinds(health.alerts(frame(rising, outcome=flat), cfg))  # no outcome metric
    history = [{"step": s, **row} for s, row in frame(rising, outcome=flat).to_dict("index").items()]
    assert "noisy_verifier" in health.alert_kinds(history, cfg, "exact")  # the trainer's fast path agrees


def test_a_runs_own_rule_reads_any_metric_and_bad_rules_are_one_line():
    rule = {"kind": "long_completions", "metric": names.COMPLETION_MEAN_LENGTH, "stat": "mean", "window": 5,
            "comparator": ">", "threshold": 100, "severity": "warning", "advice": "lower grpo.max_new_tokens"}
    cfg = load_config(None, [f"health.rules=[{{kind = 'long_completions', metric = '{names.COMPLETION_MEAN_LENGTH}', "
                             "stat = 'mean', window = 5, comparator = '>', threshold = 100, advice = 'lower grpo.max_new_tokens'}]"]).health
    assert cfg.rules[0]["kind"] == "long_completions"
    wide = frame([0.5] * 10, extra={names.COMPLETION_MEAN_LENGTH: [50.0] * 5 + [150.0] * 5})
    fired = kinds(health.alerts(wide, cfg))
    assert fired["long_completions"].message == "long_completions: 150 > 100; lower grpo.max_new_tokens"
    assert health.alert_kinds([{"step": 1}], cfg) is None  # the fast path leaves a run's own rules to alerts()
    assert "long_completions" not in kinds(health.alerts(frame([0.5] * 10, extra={
        names.COMPLETION_MEAN_LENGTH: [50.0] * 10}), cfg))
    for bad, message in [({**rule, "stat": "median"}, "stat must be one of mean, last, min, max, slope"),
                         ({**rule, "input": "ratio"}, "give either input"),
                         ({**rule, "threshold": "min_reward_std"}, "threshold must be a number or a health"),
                         ({**rule, "colour": "red"}, "unknown field 'colour'")]:
        with pytest.raises(ConfigError, match=message):
            alert_rules.parse_rule(bad, "health.rules[0]")
    del rule["kind"]
    with pytest.raises(ConfigError, match=r"health.rules\[0\]: field 'kind' is missing"):
        alert_rules.user_rules(load_config(None, ["health.rules=[{metric = 'x', comparator = '>', threshold = 1}]"]).health)
