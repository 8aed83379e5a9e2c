"""Reward metrics and the composite reward.

A metric is `fn(completion: str, example: dict) -> float`, or a TRL reward function
`fn(completions, **kwargs) -> list[float | None]` scored a batch at a time (trl_rewards.py; its
None is NaN: not scored, left out of the metric's stats, 0 in the total as TRL's nansum). The built-in ones cover the
kinds real GRPO runs combine: continuous credit (token F1), binary outcomes (exact
match, citation, format, math answer, JSON validity) and graduated penalties (length in
characters, length in tokens); metrics.py holds each one's record (its kind, the row fields it
reads, its default weight). `CompositeReward` scores
N completions into an N x K matrix of raw scores and the weighted totals; weights can
change between steps. A metric that raises or returns a non-finite value for one
completion scores 0 there and is recorded as that rollout's scoring error: one bad
completion never crashes a step.
"""
from __future__ import annotations

import functools
import importlib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np

from grpo_core.errors import ConfigError, suggest
from grpo_core.runs.live_settings import check_weights
from grpo_core.tasks.trl_rewards import TrainerStateView, as_metric, completion_id_lists

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


# ---- math: the final answer, numerically -----------------------------------------------------
_BOXED = "\\boxed{"
_FINAL = re.compile(r"####\s*([^\n]+)")
_NUM = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:/\d+|[eE][-+]?\d+)?")
_FRAC = re.compile(r"^\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")


def last_boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}` (braces inside it balanced), or None."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def final_answer(text: str, last_number: bool = True) -> str:
    r"""The answer part of a solution: the last `\boxed{}`, else what follows the last `####`
    (GSM8K), else (`last_number`) the last number in the text, else the whole text."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    final = _FINAL.findall(text)
    if final:
        return final[-1].strip()
    numbers = _NUM.findall(text) if last_number else []
    return numbers[-1] if numbers else text.strip()


_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def as_number(text) -> Fraction | None:
    r"""'1,234', '-3.5', '3/4', '\frac{3}{4}', '50%', '$12' -> an exact number; None if it is not one."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return Fraction(text) if math.isfinite(text) else None
    s = re.sub(r"\\!|\\\$|\$|\s", "", str(text)).rstrip(".")
    s = s.removesuffix("\\%").removesuffix("%")
    frac = _FRAC.match(s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    if "," in s:
        if not _THOUSANDS.fullmatch(s):
            return None
        s = s.replace(",", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _normal(text: str) -> str:
    return re.sub(r"\s+|\\left|\\right|\\!|\$", "", str(text)).rstrip(".").lower()


def math_answer(completion: str, example: dict) -> float:
    r"""Binary: the completion's final answer (its last `\boxed{}`, else what follows `####`, else
    its last number) equals `answer`: a number, or a string (its `\boxed{}` or `####` part when
    it has one, e.g. a GSM8K solution). Numbers compare exactly as numbers (1,000 = 1000.0,
    3/4 = 0.75 = \frac{3}{4}); anything else as text, spaces and case ignored."""
    gold = example["answer"]
    gold_text = str(gold) if isinstance(gold, str) else None
    want = as_number(gold) if gold_text is None else as_number(final_answer(gold_text, last_number=False))
    got_text = final_answer(completion)
    got = as_number(got_text)
    if want is not None or got is not None:
        return float(want is not None and got == want)
    return float(_normal(got_text) == _normal(final_answer(gold_text, last_number=False)))


# ---- JSON: valid, and valid against the row's schema ---------------------------------------------
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.S)


@functools.lru_cache(maxsize=64)
def schema_validator(schema_json: str):
    """A jsonschema validator for the schema (its `$schema` draft, else the latest). jsonschema
    comes with Streamlit (through Altair): no dependency of ours."""
    import jsonschema
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def json_valid(completion: str, example: dict) -> float:
    """Binary: the completion (surrounding space and one ``` fence allowed) is JSON and, when the
    row has a `schema` (a JSON Schema object), valid against it."""
    text = completion.strip()
    fence = _FENCE.match(text)
    try:
        value = json.loads(fence.group(1) if fence else text)
    except ValueError:
        return 0.0
    schema = example.get("schema")
    if schema is None:
        return 1.0
    return float(schema_validator(json.dumps(schema, sort_keys=True)).is_valid(value))


# ---- length in tokens -------------------------------------------------------------------------
_PIECE = re.compile(r"\w+|[^\w\s]")
DEFAULT_MAX_TOKENS = 256


def count_tokens(text: str) -> int:
    """Words and punctuation marks: a tokenizer-free token count (a metric sees text only),
    close to a BPE count for English prose, below it for digits and rare words."""
    return len(_PIECE.findall(text))


def token_length_penalty(completion: str, example: dict) -> float:
    """Graduated penalty in [-1, 0]: 0 up to `max_tokens` tokens (default 256, words and
    punctuation marks), then falling linearly to -1 at twice that."""
    limit = max(1, int(example.get("max_tokens", DEFAULT_MAX_TOKENS)))
    return 0.0 - min(1.0, max(0, count_tokens(completion) - limit) / limit)


def repetition_penalty(completion: str, example: dict) -> float:
    """Graduated penalty in [-1, 0]: minus the share of the completion's word n-grams (n =
    `ngram_size`, default 3) that repeat an earlier one, as open-r1's repetition penalty reward
    with max_penalty -1; 0 for a completion shorter than n words."""
    n = max(1, int(example.get("ngram_size", 3)))
    words = completion.lower().split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return -(1.0 - len(set(grams)) / len(grams)) if grams else 0.0


def _import_failure(module: str, e: Exception) -> str:
    """Why `module` did not import, where, and the fix."""
    missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if missing and (module == missing or module.startswith(missing + ".")):
        return (f"no module named {missing!r} (searched the config file's folder, the working dir and sys.path); "
                f"put {missing.replace('.', '/')}.py or the package folder {missing.split('.')[0]}/ next to the "
                "config file or in the working dir, pip install it, or list its folder in reward.custom_dirs")
    if isinstance(e, SyntaxError):
        what, at = f"SyntaxError: {e.msg}", f" ({Path(e.filename or '?').name} line {e.lineno})"
    else:
        tb = e.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        at = f" ({Path(tb.tb_frame.f_code.co_filename).name} line {tb.tb_lineno})" if tb is not None else ""
        what = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    fix = "pip install it, or fix the module" if missing else "fix the module"
    return f"importing {module!r} raised {what}{at}; {fix} and start again"


def add_import_dirs(dirs) -> list[str]:
    """Append these folders to sys.path (once each) so reward.custom modules found there import;
    appended, not prepended, so a user's file never shadows an installed module. Returns them."""
    added = []
    for d in (dirs.split(",") if isinstance(dirs, str) else dirs or []):
        if not isinstance(d, str) or not d.strip():
            continue
        d = str(Path(d).expanduser().resolve())
        if d not in sys.path:
            sys.path.append(d)
        added.append(d)
    return added


def load_metric(target: str, name: str | None = None) -> MetricFn:
    """'package.module:function' -> the function (user metrics come from the config, on the
    trainer's side only; nothing typed in the browser is ever imported or executed). Every
    failure is one line naming the metric, the module and the fix."""
    where = f"reward.custom.{name}: " if name else ""
    if not isinstance(target, str) or ":" not in target:
        raise ConfigError(f"{where}custom metric must be 'module:function', got {target!r}")
    module, func = target.split(":", 1)
    head = f"{where}custom metric {target!r} cannot be loaded"
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # missing, or the user's module raised while importing: one line, no traceback
        raise ConfigError(f"{head}: {_import_failure(module, e)}") from None
    fn = getattr(mod, func, None)
    if fn is None:
        found = sorted(n for n, v in vars(mod).items() if callable(v) and not n.startswith("_"))[:8]
        raise ConfigError(f"{head}: module {module!r} has no {func!r}" + suggest(func, found) +
                          (f" (it has: {', '.join(found)})" if found else ""))
    if not callable(fn):
        raise ConfigError(f"{where}custom metric {target!r} is not callable")
    return as_metric(fn, name or func, target)  # a TRL-signature function: scored a batch at a time


# ---- composite -------------------------------------------------------------------------------
@dataclass
class Scored:
    raw: np.ndarray  # [N, K] raw metric scores (0 where a metric failed, NaN where a TRL function returned None)
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
        self.state = TrainerStateView()  # the step TRL-style functions see as trainer_state (at_step)
        self.rollouts = None  # the Rollouts scored next: TRL-style functions' completion_ids come from them

    def at_step(self, step: int, max_steps: int, rollouts=None):
        """The training step scored next (0 = the first) and its Rollouts, for TRL functions'
        trainer_state and completion_ids."""
        self.state.global_step, self.state.max_steps = int(step), int(max_steps)
        self.rollouts = rollouts

    def set_weights(self, weights: dict[str, float]) -> dict[str, float]:
        """Validate and apply; metrics not named keep weight 0. Returns the new weights."""
        clean = check_weights(weights, self.names)
        self.weights = {n: clean.get(n, 0.0) for n in self.names}
        self.w = np.array([self.weights[n] for n in self.names], dtype=np.float64)
        return dict(self.weights)

    def totals(self, raw: np.ndarray, weights: dict[str, float] | None = None) -> np.ndarray:
        w = self.w if weights is None else np.array([weights.get(n, 0.0) for n in self.names])
        return np.where(np.isnan(raw), 0.0, raw) @ w  # NaN (not scored) adds nothing: TRL's nansum

    def score(self, completions: list[str], examples: list[dict], rollouts=None) -> Scored:
        """`rollouts` (the sampler's Rollouts; default: those at_step gave, when these completions
        are theirs) gives TRL-style functions their completion_ids."""
        if rollouts is None and getattr(self.rollouts, "texts", None) is completions:
            rollouts = self.rollouts
        n, k = len(completions), len(self.names)
        raw = np.zeros((n, k), dtype=np.float64)
        errors: list[str | None] = [None] * n
        ids = None
        for j, name in enumerate(self.names):
            fn = self.metrics[name]
            if getattr(fn, "batched", False):
                ids = ids if ids is not None or rollouts is None else completion_id_lists(rollouts)
                raw[:, j] = self._score_batch(name, fn, completions, examples, ids, errors)
                continue
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
        return Scored(raw, self.totals(raw), errors)

    def _score_batch(self, name: str, fn, completions, examples, ids, errors: list) -> np.ndarray:
        """A TRL-style function over the batch; when it raises, every completion gets the error and 0."""
        try:
            return fn(completions, examples, ids, self.state)
        except ConfigError:  # a wrong return: the same every step, one line
            raise
        except Exception as e:  # as a metric raising for one completion: recorded, 0, the step goes on
            msg = f"{name}: {type(e).__name__}: {e}"[:300]
            errors[:] = [msg if err is None else f"{err}; {msg}" for err in errors]
            return np.zeros(len(completions))
