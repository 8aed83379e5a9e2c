"""The live settings: one object per setting a request may change in a running run, and the lifecycle requests.

Each setting parses its CLI words, checks a payload (one line naming the field on bad input),
reads and applies its value on the embedded trainer, describes a request and a change in words,
and knows its bounds, its label, its chart marker and whether a resume replays it. Every reader
asks it: the requests module and the CLI, the trainer's apply and resume, the live page's inputs,
the autopilot, the report's ledger, the chart markers and both integrations. A new number that the
trainer reads from its `grpo` config section each step is one `NumberSetting` in SETTINGS.

Four shapes: a number (`grpo.<key>`), the reward weights (a dict merged into those in force), the
task's difficulty level, and a switch (the autopilot). Pause, resume, stop and checkpoint act on
the run rather than a setting: they are `LifecycleRequest`s in LIFECYCLE, beside the settings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from grpo_core.errors import ConfigError, suggest

ON_OFF = {"on": True, "off": False, "true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def format_value(value) -> str:
    """A setting's value in words: whole numbers as they are, others to 4 significant digits."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        whole = math.isfinite(value) and float(value).is_integer()
        return str(int(value)) if whole else f"{value:.4g}"
    return "?" if value is None else str(value)


def check_weights(weights, known: list[str] | None) -> dict[str, float]:
    """Reward weights: finite, >= 0, not all zero, naming known metrics (when known is given)."""
    if not isinstance(weights, dict) or not weights:
        raise ConfigError("reward.weights must name at least one metric, e.g. answer_f1 = 1.0")
    out = {}
    for name, w in weights.items():
        if known is not None and name not in known:
            raise ConfigError(f"reward.weights.{name}: unknown metric{suggest(name, known)}; "
                              f"metrics are: {', '.join(known)}")
        try:
            w = float(w)
        except (TypeError, ValueError):
            raise ConfigError(f"reward.weights.{name} must be a number, got {w!r}") from None
        if not math.isfinite(w):
            raise ConfigError(f"reward.weights.{name} must be finite, got {w}")
        if w < 0:
            raise ConfigError(f"reward.weights.{name} must be >= 0, got {w}")
        out[name] = w
    if sum(out.values()) <= 0:
        raise ConfigError("reward.weights are all zero: give at least one metric a positive weight")
    return out


@dataclass(frozen=True)
class RequestContext:
    """What a check needs to know about the run it is sent to."""
    metric_names: list[str] | None = None  # the run's reward metrics (None: not known, any name passes)
    max_level: int = 4  # the task's top difficulty level


@dataclass(frozen=True)
class LiveSetting:
    kind: str  # the request kind (store.control rows, events, the CLI's action with '-' for '_')
    key: str  # its key in meta "settings" (what is in force), and in the payload unless `field` says otherwise
    label: str  # the live page's label
    what: str  # what it is, in an error message or a help line
    marker: str  # the short label of its chart marker
    colour: str  # its chart marker's colour
    replay: bool = True  # a resume re-applies it when it was applied after the checkpoint
    field: str = ""  # the payload key when it differs from `key`
    config: tuple[str, str] = ()  # its (section, key) in the run's config; () = ("grpo", key)

    @property
    def cli(self) -> str:
        return self.kind.replace("_", "-")

    @property
    def payload_key(self) -> str:
        return self.field or self.key

    def value(self, payload: dict) -> Any:
        return (payload or {}).get(self.payload_key)

    def config_path(self) -> tuple[str, str]:
        """Where the run's config holds the value it starts with."""
        return self.config or ("grpo", self.key)

    def after(self, old, value) -> Any:
        """The value in force after a request for `value` when `old` was (None: the request named none)."""
        return old if value is None else value

    def payload(self, value) -> dict:
        return {self.payload_key: value}

    def cli_values(self) -> str:
        """The CLI's help for this setting's values."""
        return self.key

    def parse_cli(self, values: list[str]) -> dict:
        """The CLI's words -> an unchecked payload (one number; a whole one stays a float here, so
        a level of 2.5 is refused by name in check)."""
        return self.payload(self.parse_number(values))

    def parse_number(self, values: list[str]) -> float:
        """The CLI's one word as a number; ConfigError naming the action otherwise."""
        if len(values) != 1:
            raise ConfigError(f"{self.cli} takes one value, got {len(values)}")
        try:
            return float(values[0])
        except ValueError:
            raise ConfigError(f"{self.cli} value must be a number, got {values[0]!r}") from None

    def check(self, payload: dict, context: RequestContext = RequestContext()) -> dict:
        """The payload normalised; ConfigError naming the field otherwise."""
        raise NotImplementedError

    def available(self, run) -> bool:
        """Whether the embedded trainer `run` can apply it."""
        return True

    def current(self, run) -> Any:
        """The value in force on the embedded trainer `run`."""
        raise NotImplementedError

    def apply(self, run, value) -> Any:
        """Put a checked value in force on `run`; returns the value now in force."""
        raise NotImplementedError

    def refusal(self, run, value) -> str | None:
        """Why `run` cannot take this value now (None: it can)."""
        return None

    def applied_text(self, run, old, new, next_step: int) -> str:
        """The trainer's message for an applied request."""
        return f"{self.change_text(old, new)} from step {next_step}"

    def text(self, value) -> str:
        """A request for this value, in words."""
        return f"{self.key} {format_value(value)}"

    def change_text(self, old, new) -> str:
        """The change from old to new, in words."""
        return f"{self.key} {format_value(old)} -> {format_value(new)}"


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
    not_below_step: bool = False  # a value below the run's current step is refused (the step budget)
    per_rank: bool = False  # at least one per training process (each rank samples whole groups)

    def bounds(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{left}{self.lo:g}, {self.hi:g}{right}"

    def check_value(self, value) -> int | float:
        """The value as this setting's type; ConfigError naming the key and the bounds."""
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

    def check(self, payload, context=RequestContext()) -> dict:
        return self.payload(self.check_value(self.value(payload)))

    def cli_values(self) -> str:
        return self.key + (" (not below the current step)" if self.not_below_step else "")

    def parse_cli(self, values):
        v = self.parse_number(values)
        return self.payload(int(v) if self.integer and v.is_integer() else v)  # 2.5 stays, to be refused by name

    def cast(self, value) -> int | float:
        return int(value) if self.integer else float(value)

    def current(self, run):
        return getattr(run.cfg.grpo, self.key)

    def apply(self, run, value):
        setattr(run.cfg.grpo, self.key, value)
        return value

    def applied_text(self, run, old, new, next_step):
        if self.not_below_step:  # a budget has no "from": it says whether this step is the last
            return self.change_text(old, new) + (" (ends after this step)" if new == run.step else "")
        return super().applied_text(run, old, new, next_step)

    def refusal(self, run, value):
        if self.not_below_step and value < run.step:
            return f"{self.key} {format_value(value)} is below the current step {run.step}"
        if self.per_rank and value < run.ranks.size:
            return (f"{self.key} {format_value(value)} is below the run's {run.ranks.size} ranks: each rank samples "
                    "whole groups, so a step needs at least one prompt per rank")
        return None


@dataclass(frozen=True)
class BudgetSetting(NumberSetting):
    """grpo.budget_pilot (per-prompt budgets, train/budgets.py): 0 is off; on, it needs a pilot that
    can vary, room below group_size to commit, the native sampler and no dynamic sampling."""

    def problem(self, pilot: int, g, engine: str) -> str | None:
        """Why a run with grpo config `g` sampling with `engine` cannot take this pilot (None: it can)."""
        if not pilot:
            return None
        if pilot < 2:
            return f"grpo.budget_pilot must be 0 (off) or >= 2 (a pilot of one completion cannot vary), got {pilot}"
        if pilot >= g.group_size:
            return (f"grpo.budget_pilot={pilot} leaves nothing to commit: it must be below grpo.group_size "
                    f"({g.group_size})")
        if g.budget_max_group and g.budget_max_group <= pilot:
            return f"grpo.budget_max_group={g.budget_max_group} must be 0 or above grpo.budget_pilot ({pilot})"
        if engine == "vllm":
            return (f"grpo.budget_pilot={pilot} needs grpo.engine=native: the vllm engine samples one group size "
                    "per step; set grpo.engine=native or grpo.budget_pilot=0")
        if g.dynamic_sampling:
            return ("grpo.budget_pilot and grpo.dynamic_sampling do not combine (each decides where a step's "
                    "rollouts go): set one of them off")
        return None

    def refusal(self, run, value):
        return super().refusal(run, value) or self.problem(value, run.cfg.grpo, run.sampler.name)


@dataclass(frozen=True)
class WeightsSetting(LiveSetting):
    """The reward weights: a request names some metrics; the others keep their weight."""

    def cli_values(self) -> str:
        return "name=value ..."

    def parse_cli(self, values):
        if not values:
            raise ConfigError(f"{self.cli} needs name=value pairs, e.g. answer_f1=0.5 citation=0.2")
        weights = {}
        for pair in values:
            if "=" not in pair:
                raise ConfigError(f"{self.cli} expects name=value, got {pair!r} (e.g. answer_f1=0.5)")
            name, v = pair.split("=", 1)
            try:
                weights[name.strip()] = float(v)
            except ValueError:
                raise ConfigError(f"weight for {name.strip()!r} must be a number, got {v!r}") from None
        return self.payload(weights)

    def check(self, payload, context=RequestContext()):
        return self.payload(check_weights(self.value(payload), context.metric_names))

    def after(self, old, value):
        return {**(old or {}), **{m: float(w) for m, w in (value or {}).items()}}

    def current(self, run):
        return dict(run.reward.weights)

    def apply(self, run, value):
        return dict(run.reward.set_weights(self.after(run.reward.weights, value)))

    def text(self, value):
        return "weights " + ", ".join(f"{m}={format_value(w)}" for m, w in (value or {}).items())

    def change_text(self, old, new):
        old, new = dict(old or {}), dict(new or {})
        changed = [m for m in new if old.get(m) != new[m]]
        return "weights " + (", ".join(f"{m} {format_value(old.get(m))} -> {format_value(new[m])}" for m in changed)
                             or "unchanged")


@dataclass(frozen=True)
class LevelSetting(LiveSetting):
    """The task's difficulty level, 1 to the task's top level (tasks without levels refuse it)."""

    def cli_values(self) -> str:
        return "N"

    def check(self, payload, context=RequestContext()):
        v = self.value(payload)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == int(v) and 1 <= v <= context.max_level
        if not ok:
            raise ConfigError(f"{self.key} must be an integer from 1 to {context.max_level}, got {v!r}")
        return self.payload(int(v))

    def available(self, run):
        return run.task.levels >= 2

    def current(self, run):
        return run.task.level

    def apply(self, run, value):
        run.task.set_level(value)
        return run.task.level

    def refusal(self, run, value):
        return None if self.available(run) else f"task {run.task.name!r} has no difficulty levels"

    def text(self, value):
        return f"difficulty level {format_value(value)}"

    def change_text(self, old, new):
        return f"difficulty level {format_value(old)} -> {format_value(new)}"


@dataclass(frozen=True)
class SwitchSetting(LiveSetting):
    """On or off (the payload's `field` is true or false); `attribute` is the trainer's flag."""
    attribute: str = ""

    def cli_values(self) -> str:
        return "on|off"

    def parse_cli(self, values):
        if len(values) != 1 or values[0].lower() not in ON_OFF:
            raise ConfigError(f"{self.cli} takes on or off, got {' '.join(values)!r}")
        return self.payload(ON_OFF[values[0].lower()])

    def check(self, payload, context=RequestContext()):
        v = self.value(payload)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.payload_key} must be true or false, got {v!r}")
        return self.payload(v)

    def current(self, run):
        return getattr(run, self.attribute)

    def apply(self, run, value):
        setattr(run, self.attribute, value)
        return value

    def text(self, value):
        return f"{self.key} {format_value(bool(value))}"


@dataclass(frozen=True)
class LifecycleRequest:
    """A request that acts on the run itself, after the last finished step."""
    kind: str
    what: str  # what it does, for help lines

    @property
    def cli(self) -> str:
        return self.kind.replace("_", "-")

    def parse_cli(self, values: list[str]) -> dict:
        if values:
            raise ConfigError(f"{self.cli} takes no values, got {' '.join(values)!r}")
        return {}


SET_WEIGHTS, SET_THRESHOLD, SET_DIFFICULTY, SET_AUTOPILOT = (
    "set_weights", "set_threshold", "set_difficulty", "set_autopilot")
SET_GROUP_SIZE, SET_PROMPTS, SET_STEPS, SET_TEMPERATURE, SET_TOP_P, SET_MAX_NEW_TOKENS = (
    "set_group_size", "set_prompts", "set_steps", "set_temperature", "set_top_p", "set_max_new_tokens")
SET_BUDGET_PILOT = "set_budget_pilot"
PAUSE, RESUME, STOP, CHECKPOINT = "pause", "resume", "stop", "checkpoint"

SETTINGS = (
    WeightsSetting(SET_WEIGHTS, "weights", "Reward weights", "the reward weights, name=value", "w", "#7B2CBF",
                   config=("reward", "weights")),
    NumberSetting(SET_THRESHOLD, "min_group_std", "min_group_std", "a group is trainable when its total-reward std "
                  "is above this", "thr", "#E76F51", lo=0.0, hi=1.0, hi_open=True, step=0.005, fmt="%.3f",
                  on_page=False),  # a slider beside the weights, not a run-setting input
    LevelSetting(SET_DIFFICULTY, "level", "difficulty", "the task level", "lvl", "#2A9D8F", config=("task", "level")),
    NumberSetting(SET_GROUP_SIZE, "group_size", "Group size G", "group size G (GRPO compares completions inside a "
                  "group, so >= 2)", "G", "#264653", integer=True, lo=2, hi=1024),
    NumberSetting(SET_PROMPTS, "prompts_per_step", "Prompts per step", "prompts per step", "P", "#264653",
                  integer=True, lo=1, hi=4096, per_rank=True),
    # The budget is not replayed: a resume recomputes it (runs.run_meta.RunMeta.resumed_budget).
    NumberSetting(SET_STEPS, "steps", "Steps (budget)", "step budget", "steps",
                  "#6C757D", integer=True, lo=1, hi=10_000_000, replay=False, not_below_step=True),
    NumberSetting(SET_TEMPERATURE, "temperature", "Temperature", "the sampling temperature", "temp", "#F4A261",
                  lo=0.0, hi=10.0, lo_open=True, step=0.05, fmt="%.2f"),
    NumberSetting(SET_TOP_P, "top_p", "Top-p", "the nucleus sampling mass", "top_p", "#E9C46A",
                  lo=0.0, hi=1.0, lo_open=True, step=0.05, fmt="%.2f"),
    NumberSetting(SET_MAX_NEW_TOKENS, "max_new_tokens", "Max new tokens", "the most tokens sampled per completion",
                  "len", "#8D99AE", integer=True, lo=1, hi=32_768),
    BudgetSetting(SET_BUDGET_PILOT, "budget_pilot", "Budget pilot", "the per-prompt budgets' pilot completions "
                  "(0 = off: every group gets group_size)", "pilot", "#A8DADC", integer=True, lo=0, hi=1024),
    SwitchSetting(SET_AUTOPILOT, "autopilot", "Autopilot", "the autopilot switch, on or off", "auto", "#6C757D",
                  field="enabled", config=("autopilot", "enabled"), attribute="autopilot_on"),
)
LIFECYCLE = (
    LifecycleRequest(PAUSE, "pause after the current step"),
    LifecycleRequest(RESUME, "resume a paused run"),
    LifecycleRequest(STOP, "stop after the current step (checkpointed)"),
    LifecycleRequest(CHECKPOINT, "write a checkpoint after the current step"),
)
NUMBER_SETTINGS = tuple(s for s in SETTINGS if isinstance(s, NumberSetting))
BUDGET = next(s for s in SETTINGS if isinstance(s, BudgetSetting))
BY_KIND = {s.kind: s for s in SETTINGS}
NUMBERS = {s.kind: s for s in NUMBER_SETTINGS}
BY_KEY = {s.key: s for s in NUMBER_SETTINGS}  # by grpo.<key>: the bounds every form shares
KINDS = tuple(s.kind for s in SETTINGS)
LIFECYCLE_KINDS = tuple(r.kind for r in LIFECYCLE)
CONTROL_KINDS = KINDS + LIFECYCLE_KINDS  # every request kind a run store accepts
REPLAYED = tuple(s.kind for s in SETTINGS if s.replay)
RUN_INPUTS = tuple(s for s in NUMBER_SETTINGS if s.on_page)  # the live page's run-setting inputs, in order
REQUESTS = {**BY_KIND, **{r.kind: r for r in LIFECYCLE}}


def describe(kind: str, payload: dict | None) -> str:
    """Any request in words: 'group_size 16', 'weights a=0.5, b=0.2', 'autopilot on', 'pause'."""
    setting = BY_KIND.get(kind)
    return setting.text(setting.value(payload or {})) if setting else kind


def describe_change(kind: str, old, new) -> str:
    """A change of a setting in words: 'group_size 8 -> 16'; a lifecycle request is its kind."""
    setting = BY_KIND.get(kind)
    return setting.change_text(old, new) if setting else kind
