"""Tasks: where prompts come from and which metrics score them; `make_task` and `build_metrics`.

The task classes are in task.py (the base), demo.py (the built-in task), arithmetic.py (sums,
for a real model) and jsonl.py (a dataset); rewards.py holds the metrics, metrics.py their records, and chat.py renders prompts as the model reads them.
"""
from __future__ import annotations

from grpo_core.errors import ConfigError
from grpo_core.runs.config import TASK_LEVELS, RunConfig
from grpo_core.tasks.arithmetic import ArithmeticTask
from grpo_core.tasks.demo import DemoTask
from grpo_core.tasks.jsonl import JsonlTask
from grpo_core.tasks.metrics import BUILTIN, KINDS, unknown_metric
from grpo_core.tasks.rewards import MetricFn, add_import_dirs, load_metric
from grpo_core.tasks.task import Task


def build_metrics(names: list[str], custom: dict[str, str]) -> tuple[dict[str, MetricFn], dict[str, str]]:
    """Metric name -> function (built-in or 'module:function' from reward.custom) and -> kind."""
    fns, kinds = {}, {}
    for name in names:
        if name in custom:
            fns[name], kinds[name] = load_metric(custom[name], name), "custom"
        elif name in BUILTIN:
            fns[name], kinds[name] = BUILTIN[name], KINDS.get(name, "custom")
        else:
            raise unknown_metric(name)
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
        return DemoTask(level=cfg.task.level, seed=cfg.task.seed)
    if cfg.task.name == "arithmetic":
        return ArithmeticTask(level=cfg.task.level, seed=cfg.task.seed)
    if cfg.task.name == "jsonl":
        metric_names = list(cfg.reward.weights) + [n for n in cfg.reward.custom if n not in cfg.reward.weights]
        return JsonlTask(cfg.task.dataset, metric_names, custom=set(cfg.reward.custom), seed=cfg.task.seed)
    raise ConfigError(f"task.name must be one of {', '.join(TASK_LEVELS)}, got {cfg.task.name!r}")
