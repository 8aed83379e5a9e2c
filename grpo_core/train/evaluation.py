"""Held-out evaluation: the policy on prompts it never trains on, logged as eval/... scalars.

It runs after step 1, every eval.every steps and after the last one, and its scalars are
logged with the step they follow.

The same prompts each time (a held-out file's first eval.prompts rows, or, on a built-in task,
its held-out prompts: `Task.held_out`), so the curve moves with the policy and not with the
draw. Greedy by default (eval.samples = 1: pass@1 is the share of prompts answered right);
with several samples each is drawn at the training temperature from a fixed seed, and pass@1
is the mean over them. "Right" is the pass metric scoring 1: eval.pass_metric, else the
outcome metric, else the first binary metric; with none, only the rewards are logged. The
draws run on a forked random state: evaluating never shifts the training stream."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from grpo_core.runs import names
from grpo_core.runs.config import RunConfig
from grpo_core.tasks.rewards import CompositeReward

PASS_SCORE = 1.0 - 1e-9  # a binary metric's 1, read through float rounding


@dataclass
class HeldOut:
    examples: list[dict]
    every: int
    samples: int
    pass_metric: str | None
    seed: int

    def due(self, step: int, total_steps: int) -> bool:
        return step == 1 or step % self.every == 0 or step == total_steps

    def run(self, rollout, reward: CompositeReward, temperature: float, device: torch.device) -> dict[str, float]:
        """rollout(examples, group_size, temperature) -> native_sampling.Rollouts; returns the eval scalars."""
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            roll = rollout(self.examples, self.samples, 0.0 if self.samples == 1 else temperature)
        reward.rollouts = roll  # TRL-style reward functions' completion_ids
        scored = reward.score(roll.texts, roll.examples)
        return scalars(scored.raw, reward, self.pass_metric)


def scalars(raw: np.ndarray, reward: CompositeReward, pass_metric: str | None) -> dict[str, float]:
    """raw [N, K] scores of the held-out completions -> eval/reward, eval/<metric>/mean, eval/pass@1."""
    out = {names.EVAL_REWARD: float(np.nanmean(reward.totals(raw)))}
    for k, metric in enumerate(reward.names):
        out[names.eval_metric_mean(metric)] = float(np.nanmean(raw[:, k]))
    if pass_metric is not None:
        out[names.EVAL_PASS] = float(np.mean(raw[:, reward.names.index(pass_metric)] >= PASS_SCORE))
    return out


def pass_metric(cfg: RunConfig, metric_names: list[str], kinds: dict[str, str]) -> str | None:
    chosen = cfg.eval.pass_metric or cfg.reward.outcome_metric
    if chosen:
        return chosen
    return next((m for m in metric_names if kinds.get(m) == "binary"), None)


def held_out(cfg: RunConfig, task, metric_names: list[str], kinds: dict[str, str]) -> HeldOut | None:
    """The run's held-out set (None: eval.every = 0)."""
    e = cfg.eval
    if not e.every:
        return None
    if e.dataset:
        from grpo_core.tasks.jsonl import JsonlTask
        rows = JsonlTask(e.dataset, metric_names, custom=set(cfg.reward.custom)).rows[:e.prompts]
        examples = [dict(r) for r in rows]
    else:
        examples = task.held_out(e.prompts)
    return HeldOut(examples, e.every, e.samples, pass_metric(cfg, metric_names, kinds), cfg.grpo.seed)
