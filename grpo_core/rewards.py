"""Reward metrics and the composite reward.

A metric is `fn(completion: str, example: dict) -> float`. The built-in ones cover the
kinds real GRPO runs combine: continuous credit (token F1), binary outcomes (exact
match, citation, format) and graduated penalties (length). `CompositeReward` scores
N completions into an N x K matrix of raw scores and the weighted totals; weights can
change between steps. A metric that raises or returns a non-finite value for one
completion scores 0 there and is recorded as that rollout's scoring error: one bad
completion never crashes a step.
"""
from __future__ import annotations

import importlib
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np

from grpo_core.config import ConfigError, validate_weights

MetricFn = Callable[[str, dict], float]

_WORD = re.compile(r"\w+")


def _tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


# ---- built-in metric functions ------------------------------------------------------------
def token_f1(completion: str, example: dict) -> float:
    """Continuous: SQuAD-style token F1 between the completion's answer part and `answer`.
    The citation (`[S3]`) is not part of the answer, so it neither helps nor hurts F1."""
    pred = _tokens(strip_citations(completion))
    gold = _tokens(str(example["answer"]))
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def exact_match(completion: str, example: dict) -> float:
    """Binary: the answer part equals `answer` (case and surrounding space ignored)."""
    return float(" ".join(_tokens(strip_citations(completion))) == " ".join(_tokens(str(example["answer"]))))


_CITE = re.compile(r"\[([A-Za-z]*\d+)\]")


def strip_citations(text: str) -> str:
    return _CITE.sub(" ", text)


def citation(completion: str, example: dict) -> float:
    """Binary: the completion cites exactly the expected source id, e.g. `[S2]`."""
    cited = _CITE.findall(completion)
    return float(cited == [str(example["source"])])


def format_check(completion: str, example: dict) -> float:
    """Binary: the completion matches the example's `format` regex (default: `answer [Sn]`)."""
    pattern = example.get("format") or r"^\s*\w[\w ]*\s\[S\d+\]\s*$"
    return float(re.fullmatch(pattern, completion) is not None)


def length_penalty(completion: str, example: dict) -> float:
    """Graduated penalty in [-1, 0]: 0 up to `max_len` characters (default 12), then -0.1 per
    extra character. Graduated so a slightly-too-long answer is still better than a very
    long one: that difference is signal a binary check would throw away."""
    limit = int(example.get("max_len", 12))
    return -min(1.0, 0.1 * max(0, len(completion.strip()) - limit))


BUILTIN: dict[str, MetricFn] = {
    "answer_f1": token_f1,
    "exact": exact_match,
    "citation": citation,
    "format": format_check,
    "length": length_penalty,
}

KINDS = {"answer_f1": "continuous", "exact": "binary", "citation": "binary", "format": "binary",
         "length": "penalty"}


def load_metric(target: str) -> MetricFn:
    """'package.module:function' -> the function (user metrics come from the config, on the
    trainer's side only; nothing typed in the browser is ever imported or executed)."""
    if not isinstance(target, str) or ":" not in target:
        raise ConfigError(f"custom metric must be 'module:function', got {target!r}")
    module, func = target.split(":", 1)
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"custom metric {target!r} cannot be loaded: {e}") from None
    if not callable(fn):
        raise ConfigError(f"custom metric {target!r} is not callable")
    return fn


# ---- composite -------------------------------------------------------------------------------
@dataclass
class Scored:
    raw: np.ndarray  # [N, K] raw metric scores (0 where a metric failed)
    totals: np.ndarray  # [N] weighted totals
    errors: list[str | None]  # per rollout: "metric: what went wrong", or None

    @property
    def num_errors(self) -> int:
        return sum(e is not None for e in self.errors)


class CompositeReward:
    """Named metrics combined with weights: total = sum_k w_k * raw_k."""

    def __init__(self, metrics: dict[str, MetricFn], weights: dict[str, float]):
        if not metrics:
            raise ConfigError("a composite reward needs at least one metric")
        self.metrics = dict(metrics)
        self.names = list(self.metrics)
        self.set_weights(weights)

    def set_weights(self, weights: dict[str, float]) -> dict[str, float]:
        """Validate and apply; metrics not named keep weight 0. Returns the new weights."""
        clean = validate_weights(weights, self.names)
        self.weights = {n: clean.get(n, 0.0) for n in self.names}
        self.w = np.array([self.weights[n] for n in self.names], dtype=np.float64)
        return dict(self.weights)

    def totals(self, raw: np.ndarray, weights: dict[str, float] | None = None) -> np.ndarray:
        w = self.w if weights is None else np.array([weights.get(n, 0.0) for n in self.names])
        return raw @ w

    def score(self, completions: list[str], examples: list[dict]) -> Scored:
        n, k = len(completions), len(self.names)
        raw = np.zeros((n, k), dtype=np.float64)
        errors: list[str | None] = [None] * n
        for j, name in enumerate(self.names):
            fn = self.metrics[name]
            for i in range(n):
                try:
                    out = fn(completions[i], examples[i])
                    if not isinstance(out, (bool, int, float, np.number, np.bool_)):
                        raise TypeError(f"returned {type(out).__name__} {out!r:.40}, expected a number")
                    v = float(out)
                    if not math.isfinite(v):
                        raise ValueError(f"returned {v}")
                except Exception as e:  # one bad completion/metric must not crash the step
                    msg = f"{name}: {type(e).__name__}: {e}"[:300]
                    errors[i] = msg if errors[i] is None else f"{errors[i]}; {msg}"  # keep every metric's
                    v = 0.0
                raw[i, j] = v
        return Scored(raw, raw @ self.w, errors)
