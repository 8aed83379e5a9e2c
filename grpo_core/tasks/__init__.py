"""Tasks: where prompts come from and which metrics score them.

A task yields batches of examples (dicts with at least "prompt" and "prompt_id", plus the
fields its metrics read, e.g. "answer", "source") from a seeded stream, names its metrics
(`metrics()`), and gives the supervised target for the built-in model's warm-start
(`target(example)`). The demo task can change difficulty mid-run (`set_level`); its
stream state is part of a checkpoint (`state_dict` / `load_state_dict`).
"""
from __future__ import annotations

import hashlib

from grpo_core.errors import ConfigError

from grpo_core.runs.config import RunConfig, _suggest
from grpo_core.tasks.rewards import BUILTIN, KINDS, MetricFn, add_import_dirs, load_metric


def prompt_id(prompt: str) -> str:
    """Stable id from the prompt text: the same prompt drawn twice shares it."""
    return hashlib.sha1(prompt.encode()).hexdigest()[:10]


class Task:
    name = "task"
    levels = 1  # how many difficulty levels it has (1 = none)

    def __init__(self, level: int = 1, seed: int = 0):
        self.level = level
        self.seed = seed

    def batch(self, n: int) -> list[dict]:
        raise NotImplementedError

    def warm_batch(self, n: int) -> list[dict]:
        """Examples for the supervised warm-start: a separate stream, so warming up never
        shifts the GRPO prompt stream."""
        raise NotImplementedError

    def target(self, example: dict) -> str:
        raise NotImplementedError

    def set_level(self, level: int):
        if not 1 <= level <= self.levels:
            raise ConfigError(f"level must be an integer from 1 to {self.levels} for task {self.name!r}, got {level}")
        self.level = int(level)

    def cache_key(self) -> dict:
        """What the warm-start depends on (the cache folder is keyed by it)."""
        return {"name": self.name, "seed": self.seed}

    def state_dict(self) -> dict:
        return {"level": self.level}

    def load_state_dict(self, state: dict):
        self.level = int(state.get("level", self.level))


def build_metrics(names: list[str], custom: dict[str, str]) -> tuple[dict[str, MetricFn], dict[str, str]]:
    """Metric name -> function (built-in or 'module:function' from reward.custom) and -> kind."""
    fns, kinds = {}, {}
    for name in names:
        if name in custom:
            fns[name], kinds[name] = load_metric(custom[name], name), "custom"
        elif name in BUILTIN:
            fns[name], kinds[name] = BUILTIN[name], KINDS.get(name, "custom")
        else:
            raise ConfigError(f"reward.weights.{name}: no such metric{_suggest(name, BUILTIN)}; built-in metrics "
                              f"are {', '.join(BUILTIN)}, others go in reward.custom.{name} = 'module:function'")
    for name in custom:
        if name not in fns:
            fns[name], kinds[name] = load_metric(custom[name], name), "custom"
    return fns, kinds


def make_task(cfg: RunConfig) -> Task:
    """The config's task. It also puts reward.custom_dirs on the import path (load_config fills
    them with the config file's folder and the working dir), so the custom metrics that
    build_metrics imports next are found wherever the run was started from or resumed."""
    if cfg.reward.custom:
        add_import_dirs(cfg.reward.custom_dirs)
    if cfg.task.name == "demo":
        from grpo_core.tasks.demo import DemoTask
        return DemoTask(level=cfg.task.level, seed=cfg.task.seed)
    if cfg.task.name == "jsonl":
        from grpo_core.tasks.jsonl import JsonlTask
        metric_names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
        return JsonlTask(cfg.task.dataset, metric_names, custom=set(cfg.reward.custom), seed=cfg.task.seed)
    raise ConfigError(f"task.name must be 'demo' or 'jsonl', got {cfg.task.name!r}")
