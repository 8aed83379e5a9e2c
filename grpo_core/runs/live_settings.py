"""The live settings: what a control request may change in a running run, defined once.

Every reader takes its facts from here: request validation and CLI parsing (control.py), the
trainer's apply and its resume replay, the live page's inputs, the settings summaries, the
change ledger and the chart markers. A new setting of the `grpo` config section that the
trainer reads each step (like `top_p`) is one `NumberSetting` in NUMBER_SETTINGS; nothing
else spells it out.

Kinds with their own payload or their own effect (weights: a dict; difficulty: the task;
autopilot: on/off) are plain `LiveSetting`s: the same descriptive fields, their own checks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LiveSetting:
    kind: str  # the request kind (store.control rows, events, the CLI's action with '-' for '_')
    key: str  # its payload key, and its key in meta "settings" (what is in force)
    label: str  # the live page's label
    what: str  # what it is, in an error message or a help line
    marker: str  # the short label of its chart marker
    colour: str  # its chart marker's colour
    replay: bool = True  # a resume re-applies it when it was applied after the checkpoint

    @property
    def cli(self) -> str:
        return self.kind.replace("_", "-")


@dataclass(frozen=True)
class NumberSetting(LiveSetting):
    """A number in the `grpo` config section (`grpo.<key>`), applied from the next step."""
    integer: bool = False
    lo: float = 0.0
    hi: float = math.inf
    lo_open: bool = False  # lo itself is refused (temperature > 0)
    hi_open: bool = False  # hi itself is refused (min_group_std < 1)
    step: float | None = None  # the input's step (None: Streamlit's default)
    fmt: str | None = None  # the input's format (None: Streamlit's default)
    on_page: bool = True  # shown among the live page's run-setting inputs

    def bounds(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{left}{self.lo:g}, {self.hi:g}{right}"

    def check(self, value) -> int | float:
        """The value as this setting's type; ConfigError naming the key and the bounds."""
        from grpo_core.errors import ConfigError
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        ok = ok and (value == int(value) if self.integer else True)
        ok = ok and (value > self.lo if self.lo_open else value >= self.lo)
        ok = ok and (value < self.hi if self.hi_open else value <= self.hi)
        if not ok and self.integer:
            raise ConfigError(f"{self.key} must be an integer from {int(self.lo)} to {int(self.hi)} ({self.what}), "
                              f"got {value!r}")
        if not ok:
            raise ConfigError(f"{self.key} must be a number in {self.bounds()}, got {value!r}")
        return int(value) if self.integer else float(value)

    def cast(self, value) -> int | float:
        return int(value) if self.integer else float(value)


SET_WEIGHTS, SET_THRESHOLD, SET_DIFFICULTY, SET_AUTOPILOT = (
    "set_weights", "set_threshold", "set_difficulty", "set_autopilot")
SET_GROUP_SIZE, SET_PROMPTS, SET_STEPS, SET_TEMPERATURE, SET_TOP_P = (
    "set_group_size", "set_prompts", "set_steps", "set_temperature", "set_top_p")

SETTINGS = (
    LiveSetting(SET_WEIGHTS, "weights", "Reward weights", "the reward weights, name=value", "w", "#7B2CBF"),
    NumberSetting(SET_THRESHOLD, "min_group_std", "min_group_std", "a group is trainable when its total-reward std "
                  "is above this", "thr", "#E76F51", lo=0.0, hi=1.0, hi_open=True, step=0.005, fmt="%.3f",
                  on_page=False),  # a slider beside the weights, not a run-setting input
    LiveSetting(SET_DIFFICULTY, "level", "difficulty", "the task level", "lvl", "#2A9D8F"),
    NumberSetting(SET_GROUP_SIZE, "group_size", "Group size G", "group size G (GRPO compares completions inside a "
                  "group, so >= 2)", "G", "#264653", integer=True, lo=2, hi=1024),
    NumberSetting(SET_PROMPTS, "prompts_per_step", "Prompts per step", "prompts per step", "P", "#264653",
                  integer=True, lo=1, hi=4096),
    # The budget is not replayed: a resume recomputes it (store.RunMeta.resumed_budget).
    NumberSetting(SET_STEPS, "steps", "Steps (budget)", "step budget", "steps",
                  "#6C757D", integer=True, lo=1, hi=10_000_000, replay=False),
    NumberSetting(SET_TEMPERATURE, "temperature", "Temperature", "the sampling temperature", "temp", "#F4A261",
                  lo=0.0, hi=10.0, lo_open=True, step=0.05, fmt="%.2f"),
    NumberSetting(SET_TOP_P, "top_p", "Top-p", "the nucleus sampling mass", "top_p", "#E9C46A",
                  lo=0.0, hi=1.0, lo_open=True, step=0.05, fmt="%.2f"),
    LiveSetting(SET_AUTOPILOT, "autopilot", "Autopilot", "the autopilot switch, on or off", "auto", "#6C757D"),
)
NUMBER_SETTINGS = tuple(s for s in SETTINGS if isinstance(s, NumberSetting))
BY_KIND = {s.kind: s for s in SETTINGS}
NUMBERS = {s.kind: s for s in NUMBER_SETTINGS}
BY_KEY = {s.key: s for s in NUMBER_SETTINGS}  # by grpo.<key>: the bounds every form shares
KINDS = tuple(s.kind for s in SETTINGS)
REPLAYED = tuple(s.kind for s in SETTINGS if s.replay)
RUN_INPUTS = tuple(s for s in NUMBER_SETTINGS if s.on_page)  # the live page's run-setting inputs, in order
