"""load_config: a run's config from its TOML file and --set overrides, with its task's default weights.

A JSONL task whose config names no reward weights gets the metrics its rows can feed, the
arithmetic task its own (math_answer).

Here, in the tasks wing, because only the task knows which row field feeds which metric
(jsonl.default_weights); runs/config.py holds the knobs and their checks.
"""
from __future__ import annotations

from pathlib import Path

from grpo_core.runs.config import (
    RunConfig,
    apply_overrides,
    from_dict,
    parse_table_override,
    read_toml,
    settle_reward,
    validate,
)
from grpo_core.tasks import arithmetic
from grpo_core.tasks.jsonl import default_weights


def with_task_weights(data: dict, overrides: list[str]) -> dict:
    """A JSONL task with no weights table (in the file or a whole `--set reward.weights={...}`)
    starts from the metrics its rows can feed (jsonl.default_weights), not the demo's, and the
    arithmetic task from its own (arithmetic.WEIGHTS);
    `--set reward.weights.NAME=W` then changes those."""
    reward = data.get("reward") if isinstance(data.get("reward"), dict) else {}
    parsed = [parse_table_override(t) for t in overrides]
    if "weights" in reward or any(sec == "reward" and key == "weights" and whole for sec, key, _, whole in parsed):
        return data
    merged = apply_overrides(data, overrides)
    task = merged.get("task") if isinstance(merged.get("task"), dict) else {}
    if task.get("name") == "arithmetic":
        return {**data, "reward": {**reward, "weights": dict(arithmetic.WEIGHTS)}}
    if task.get("name") != "jsonl" or not isinstance(task.get("dataset"), str) or not task["dataset"]:
        return data
    custom = (merged.get("reward") or {}).get("custom") if isinstance(merged.get("reward"), dict) else None
    weights = default_weights(task["dataset"], custom if isinstance(custom, dict) else {})
    return {**data, "reward": {**reward, "weights": weights}}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """TOML file (optional) + `--set` overrides -> validated RunConfig (a JSONL task's default
    weights from its rows; weight-0 metrics dropped; custom metric folders recorded)."""
    overrides = list(overrides or [])
    data = with_task_weights(read_toml(path), overrides)
    return settle_reward(validate(from_dict(apply_overrides(data, overrides))), path)
