"""What one step logs: its scored groups, why the flat ones were flat, and its scalars.

Trainer.train_step samples, scores and updates; the numbers the store, the mirrors and the
pages read from a step are built here, from what the step produced, so a new number lands
in this module and not in the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_core.analysis import flat_causes, step_stats
from grpo_core.runs import names
from grpo_core.train import gpu_memory, grpo
from grpo_core.train.step_batch import StepBatch

LOSS_SCALARS = {"policy": names.LOSS_POLICY, "kl": names.LOSS_KL, "entropy": names.LOSS_ENTROPY,
                "grad_norm": names.GRAD_NORM, "clip_ratio": names.CLIP_RATIO}  # train_on's keys -> logged names


@dataclass
class ScoredGroups:
    """A step's scores by group, every rank's: what the advantages and the health numbers read."""
    row_totals: np.ndarray  # [N] weighted total reward, row by row (what the store keeps)
    totals: np.ndarray  # [P, G] the same by group (groups of different sizes padded with NaN)
    scores: np.ndarray  # [P, G, M] each metric's raw score
    stats: step_stats.GroupStats  # per group: std, trainable, phantom, ...
    adv: np.ndarray  # [P, G] advantages (0 in a group that does not train)


@dataclass
class StepTimes:
    """Seconds the step spent, by phase."""
    step_s: float  # the whole step
    generate_s: float  # sampling (this rank's)
    score_s: float  # the reward metrics, group statistics and advantages
    train_s: float  # forward, backward and the optimizer step
    sync_s: float | None  # grpo.engine=vllm: the weights pushed into the engine (None: no update)
    log_s: float  # the previous step's store and mirror writes


def score_groups(trainer, sample: StepBatch) -> ScoredGroups:
    """The step's scores as groups, which groups can teach (group_stats) and the advantages."""
    g, raw = trainer.cfg.grpo, sample.scored.raw
    row_totals = trainer.reward.totals(raw)
    totals = sample.grouped(row_totals, g.group_size)
    scores = sample.grouped(raw, g.group_size)
    stats = step_stats.group_stats(totals, scores, min_group_std=g.min_group_std, outcome_index=trainer.outcome_index,
                                   uniform_std=trainer.cfg.health.uniform_std)
    adv = grpo.advantages(totals, stats.trainable, g.scale, std=g.advantage_std, sizes=sample.sizes)
    return ScoredGroups(row_totals, totals, scores, stats, adv)


def flat_outcomes(trainer, sample: StepBatch, groups: ScoredGroups) -> list:
    """Why each flat group is flat (flat_causes.py), from its texts, lengths and scoring errors."""
    g, done, rew = trainer.cfg.grpo, sample.scored, trainer.reward
    errors, lengths, texts = sample.padded_rows(done.errors, done.lengths, done.texts)  # [P x largest group]
    sampled = flat_causes.Sampled(errors, lengths, g.max_new_tokens, texts)
    return flat_causes.flat_causes(groups.stats, groups.totals, groups.scores, rew.names, trainer.metric_kinds,
                                   rew.weights, trainer.cfg.reward.outcome_metric or None, sampled,
                                   trainer.cfg.health.uniform_std)


def step_scalars(trainer, sample: StepBatch, groups: ScoredGroups, outcomes: list, loss: dict | None, lr: float,
                 times: StepTimes) -> dict:
    """Every scalar of the step: the health numbers and their running totals, the flat groups'
    causes, the waste, the loss (none at all when nothing trained), timings and throughput, the
    sampling's own numbers, the sampler/trainer mismatch, CUDA memory."""
    g, done = trainer.cfg.grpo, sample.scored
    scalars = step_stats.step_scalars(groups.stats, groups.scores, trainer.reward.names, trainer.reward.weights,
                                      trainer.cum_submitted, trainer.cum_trainable)
    scalars.update(flat_causes.cause_counts(outcomes))
    scalars.update(step_stats.wasted_compute(sample.grouped(done.lengths, g.group_size, 0), groups.stats.trainable,
                                             times.generate_s, trainer.cum_tokens))
    n_tokens = int(done.lengths.sum())
    scalars.update({
        names.COMPLETION_MEAN_LENGTH: n_tokens / len(done.texts),
        names.TIME_STEP: times.step_s, names.TIME_GENERATE: times.generate_s, names.TIME_SCORE: times.score_s,
        names.TIME_TRAIN: times.train_s, names.TIME_LOG: times.log_s,
        names.THROUGHPUT_TOKENS: n_tokens / max(times.step_s, 1e-9),
        names.MIN_GROUP_STD: g.min_group_std, names.DIFFICULTY: float(trainer.task.level),
        names.SCORING_ERRORS: float(sum(e is not None for e in done.errors)),
        names.SAMPLING_BATCHES: float(sample.batches), **sample.scalars,
    })
    if loss is not None:  # the pilot's steps train nothing: they log no loss at all rather than empty values
        scalars.update({name: loss[key] for key, name in LOSS_SCALARS.items()})
        scalars[names.LEARNING_RATE] = lr
        scalars.update(loss.get("mismatch") or {})  # an engine-sampled step: sampler vs trainer log-probs
    scalars.update(gpu_memory.step_scalars(trainer.device))  # CUDA only: absent on CPU
    if times.sync_s is not None:
        scalars[names.TIME_WEIGHT_SYNC] = times.sync_s
    return scalars
