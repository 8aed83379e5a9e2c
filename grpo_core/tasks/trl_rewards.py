"""TRL-signature reward functions as metrics: `f(completions, **kwargs) -> list[float | None]`.

Which kind a reward.custom function is, is read from its signature: a parameter named
`completions` makes it a TRL reward function (TRL calls every one by keyword), anything else is
a metric `f(completion, example) -> float`. An explicit marker wins over the signature:
`f.reward_style = "trl"` or `"metric"` (for a function taking `*args, **kwargs`, say).

A TRL function is called once per scored batch with what TRL 1.16's
`GRPOTrainer._calculate_rewards` passes, by keyword:
  prompts         each completion's prompt as the data has it: a string, or chat messages;
  completions     strings, or, when the prompt is chat messages (TRL's `is_conversational`),
                  `[{"role": "assistant", "content": text}]` per completion;
  completion_ids  each completion's token ids (eos included, padding not);
  every other column of the rows, as a list (TRL's `reward_kwargs`; `prompt_id` is ours);
  trainer_state   a transformers TrainerState with global_step and max_steps;
  log_extra, log_metric  TRL's logging hooks: accepted, their values logged at debug level only.
It returns one value per completion: a number, or None for "not scored" (TRL's NaN), which is
kept as NaN in that metric's column (left out of its means and stds) and adds nothing to the
total (TRL's nansum). A wrong return (not a list, the wrong length, a string) is one line
naming the function; a function that raises marks every completion of the batch with that
scoring error and 0, as a metric that raises does for one completion.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from typing import Callable

import numpy as np

from grpo_core.errors import ConfigError

logger = logging.getLogger(__name__)

STYLES = ("trl", "metric")
NOT_PASSED = ("prompt", "completion", "completion_ids")  # row columns TRL does not pass on as kwargs


def is_trl_style(fn: Callable, name: str = "") -> bool:
    """Whether fn is a TRL reward function: its `reward_style` marker, else a `completions` parameter."""
    style = getattr(fn, "reward_style", None)
    if style is not None:
        if style not in STYLES:
            raise ConfigError(f"reward.custom.{name}: reward_style must be 'trl' or 'metric', got {style!r}")
        return style == "trl"
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: a metric
        return False


@dataclasses.dataclass
class TrainerStateView:
    """The fields of transformers' TrainerState a reward function reads (global_step,
    max_steps, epoch). Not TrainerState itself: tasks/ sits below the trainer and never
    imports transformers (tests/test_floor_plan.py)."""
    global_step: int = 0
    max_steps: int = 0
    epoch: float | None = None


class TrlRewardFunction:
    """A TRL reward function as a batched metric of CompositeReward (`batched`: scored once per batch)."""
    batched = True

    def __init__(self, fn: Callable, name: str, target: str = ""):
        self.fn, self.name, self.target = fn, name, target or getattr(fn, "__name__", name)

    def __repr__(self):
        return f"TrlRewardFunction({self.target!r})"

    def kwargs(self, completions: list[str], examples: list[dict], completion_ids, state: TrainerStateView) -> dict:
        prompts = [e.get("prompt") for e in examples]
        chat = [isinstance(p, list) for p in prompts]
        columns = dict.fromkeys(k for e in examples for k in e if k not in NOT_PASSED)
        out = {"prompts": prompts,
               "completions": [[{"role": "assistant", "content": c}] if is_chat else c
                               for c, is_chat in zip(completions, chat)],
               "completion_ids": completion_ids if completion_ids is not None else [None] * len(completions)}
        out.update({k: [e.get(k) for e in examples] for k in columns})
        out.update(trainer_state=dataclasses.replace(state),  # a copy: the function may write to it
                   log_extra=self._log, log_metric=self._log)
        return out

    def _log(self, *args, **kwargs):
        logger.debug("reward function %s logged %r %r (not stored)", self.target, args, kwargs)

    def __call__(self, completions: list[str], examples: list[dict], completion_ids=None,
                 state: TrainerStateView | None = None) -> np.ndarray:
        """[N] float64 scores, NaN where the function returned None. Raises ConfigError for a
        wrong return; lets the function's own exception through (the caller records it)."""
        out = self.fn(**self.kwargs(completions, examples, completion_ids, state or TrainerStateView()))
        return self.check(out, len(completions))

    def check(self, out, n: int) -> np.ndarray:
        head = f"reward.custom.{self.name} ({self.target}, a TRL-style reward function)"
        if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
            raise ConfigError(f"{head} returned {type(out).__name__} {out!r:.40}: it must return a list with one "
                              f"float (or None) per completion, {n} here")
        if len(out) != n:
            raise ConfigError(f"{head} returned {len(out)} values for {n} completions: it must return one "
                              "float (or None) per completion, in the order of `completions`")
        values = np.full(n, np.nan)
        for i, v in enumerate(out):
            if v is None:
                continue
            if isinstance(v, (str, bytes)) or not isinstance(v, (bool, int, float, np.number, np.bool_)):
                raise ConfigError(f"{head} returned {type(v).__name__} {v!r:.40} for completion {i}: each value "
                                  "must be a float, or None for a completion it does not score")
            values[i] = float(v)
        if not all(math.isfinite(v) or math.isnan(v) for v in values):
            raise ConfigError(f"{head} returned an infinite value: return a finite float, or None to leave a "
                              "completion unscored")
        return values


def completion_id_lists(rollouts) -> list[list[int]] | None:
    """Each completion's token ids without padding (TRL's completion_ids), from Rollouts."""
    if rollouts is None:
        return None
    ids, mask = rollouts.completion_ids, rollouts.completion_mask.bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]


def as_metric(fn: Callable, name: str, target: str = ""):
    """fn as CompositeReward takes it: a TRL function wrapped, a metric as it is."""
    return TrlRewardFunction(fn, name, target) if is_trl_style(fn, name) else fn
