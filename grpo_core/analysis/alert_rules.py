"""Alert rules as data: the built-in ones (alert_rules.toml), a run's own ([[health.rules]]), and one evaluator for all.

health.py computes the inputs over a window (streaks and ratios in trainer steps, the
ratio's trend, ...); a rule compares one of them, or a stat of any logged scalar, with a
threshold and writes its message."""
from __future__ import annotations

import operator
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.errors import ConfigError
from grpo_core.runs.names import CAUSE_SOLVED, CAUSE_UNSOLVED

COMPARATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
STATS = ("mean", "last", "min", "max", "slope")
SEVERITIES = ("warning", "critical")
# What health.py computes for the built-in rules (health.AlertInputs -> rule_inputs).
INPUTS = ("zero_streak", "ratio", "reward_std", "ratio_trend", "near_zero_streak", "ratio_rising_outcome_flat")


@dataclass(frozen=True)
class Rule:
    kind: str
    severity: str
    comparator: str
    threshold: float | str  # a number, or "health.<knob>"
    message: str
    advice: str = ""
    advice_solved: str = ""
    advice_unsolved: str = ""
    input: str = ""  # one of INPUTS, or
    metric: str = ""  # a logged scalar, with
    stat: str = "mean"
    window: int = 0  # steps (0: health.trend_window)


def parse_rule(d: dict, where: str) -> Rule:
    """A rule table -> Rule; a bad one is one line naming the field and the fix."""
    known = set(Rule.__dataclass_fields__)
    extra = sorted(set(d) - known)
    if extra:
        raise ConfigError(f"{where}: unknown field {extra[0]!r} (rule fields: {', '.join(sorted(known))})")
    for key in ("kind", "comparator", "threshold"):
        if key not in d:
            raise ConfigError(f"{where}: field {key!r} is missing")
    if bool(d.get("input")) == bool(d.get("metric")):
        raise ConfigError(f"{where}: give either input (one of {', '.join(INPUTS)}) or metric (a logged name)")
    if d.get("input") and d["input"] not in INPUTS:
        raise ConfigError(f"{where}: input {d['input']!r} is not one of {', '.join(INPUTS)}")
    checks = (("comparator", COMPARATORS), ("stat", STATS), ("severity", SEVERITIES))
    for key, allowed in checks:
        if key in d and d[key] not in allowed:
            raise ConfigError(f"{where}: {key} must be one of {', '.join(allowed)}, got {d[key]!r}")
    thr = d["threshold"]
    if not isinstance(thr, (int, float, str)) or isinstance(thr, bool) or (isinstance(thr, str) and not thr.startswith("health.")):
        raise ConfigError(f"{where}: threshold must be a number or a health.* knob, got {thr!r}")
    defaults = {"severity": "warning", "message": f"{d['kind']}: {{value:.4g}} {d['comparator']} {{threshold:g}}"
                + ("; {advice}" if d.get("advice") else "")}
    return Rule(**{**defaults, **d})


def _toml() -> dict:
    return tomllib.loads((Path(__file__).parent / "alert_rules.toml").read_text(encoding="utf-8"))


def builtin() -> list[Rule]:
    return [parse_rule(r, f"alert_rules.toml rule {i + 1}") for i, r in enumerate(_toml()["rule"])]


BUILTIN = builtin()
CAUSE_ADVICE = _toml().get("flat_cause_advice", {})  # flat-group cause -> advice (names.FLAT_CAUSES' keys)


def user_rules(cfg) -> list[Rule]:
    return [parse_rule(dict(r), f"health.rules[{i}]") for i, r in enumerate(getattr(cfg, "rules", None) or [])]


def threshold(rule: Rule, cfg) -> float:
    if isinstance(rule.threshold, str):
        key = rule.threshold.removeprefix("health.")
        if not hasattr(cfg, key):
            raise ConfigError(f"alert rule {rule.kind}: threshold {rule.threshold!r} is not a health knob")
        return float(getattr(cfg, key))
    return float(rule.threshold)


def metric_value(wide: pd.DataFrame | None, rule: Rule, cfg) -> tuple[float | None, dict]:
    """A user rule's stat of its metric over the last `window` steps."""
    if wide is None or rule.metric not in wide.columns:
        return None, {}
    window = rule.window or cfg.trend_window
    s = pd.to_numeric(wide[rule.metric], errors="coerce").dropna()
    s = s[s.index > s.index.max() - window] if len(s) else s
    if not len(s):
        return None, {}
    if rule.stat == "slope":
        value = float(np.polyfit(s.index.to_numpy(np.float64), s.to_numpy(), 1)[0]) if len(s) > 1 else None
    else:
        value = float(getattr(s, {"last": "iloc"}.get(rule.stat, rule.stat))[-1] if rule.stat == "last"
                      else getattr(s, rule.stat)())
    return value, {"over": f"the last {window} steps", "metric": rule.metric}


def advice_for(rule: Rule, split: str | None) -> str:
    """split: the dominant cause of the window's flat groups (flat_causes.dominant), or "solved" /
    "unsolved" (a run that logged only those two)."""
    if split in ("solved", CAUSE_SOLVED) and rule.advice_solved:
        return rule.advice_solved
    if split in ("unsolved", CAUSE_UNSOLVED) and rule.advice_unsolved:
        return rule.advice_unsolved
    if split in CAUSE_ADVICE and (rule.advice_solved or rule.advice_unsolved):  # a rule about flat groups
        return CAUSE_ADVICE[split]
    return rule.advice


def evaluate(rules: list[Rule], inputs: dict[str, tuple[float | None, dict]], cfg, *, wide=None,
             split: str | None = None):
    """[(rule, message)] for the rules that fire. inputs: input name -> (value, template fields)."""
    fired = []
    for rule in rules:
        value, fields = inputs.get(rule.input, (None, {})) if rule.input else metric_value(wide, rule, cfg)
        if value is None or (isinstance(value, float) and not np.isfinite(value)):
            continue
        thr = threshold(rule, cfg)
        if COMPARATORS[rule.comparator](value, thr):
            context = {**fields, "value": value, "threshold": thr, "advice": advice_for(rule, split)}
            fired.append((rule, rule.message.format(**context)))
    return fired
