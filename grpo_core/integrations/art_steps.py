"""One ART step's trajectory groups -> store rows, in ART's own counts.

The live monitor (art.py) and the trajectory-file importer (art_files.py) share it.

Each trajectory is a rollout; its metrics are per-metric scores, and the reward the rollout
function gave is kept as a score too, metric `reward` (REWARD_METRIC). "Trainable" is ART's
own rule (art.metrics_taxonomy._group_is_trainable: more than one trajectory and rewards not
all equal, exact float comparison), so the store's ratio is ART's
data/step_num_groups_trainable / data/step_num_groups_submitted.
"""
from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass

import numpy as np

from grpo_core.analysis import step_stats
from grpo_core.integrations.base import number
from grpo_core.runs import names
from grpo_core.runs.step_columns import StepGroups, StepRollouts

REWARD_METRIC = "reward"  # the rollout function's own trajectory.reward, kept as a score
NOT_SCORES = ("completion_tokens",)  # ART adds it to trajectory.metrics itself (gather.record_metrics)


@dataclass
class Rollout:
    total: float  # the reward ART trains on
    scores: dict  # metric -> float | None (None: missing); REWARD_METRIC included
    text: str | None = None


@dataclass
class Group:
    prompt_id: str
    rollouts: list[Rollout]
    exceptions: int = 0  # trajectories that raised (ART's group.exceptions): not rollouts
    prompt: str | None = None


def art_trainable(rewards: list[float]) -> bool:
    """ART's rule (metrics_taxonomy._group_is_trainable), exact comparison included."""
    return len(rewards) > 1 and len(set(rewards)) > 1


def score(v) -> float:
    x = number(v) if not isinstance(v, bool) else float(v)
    return np.nan if x is None or not math.isfinite(x) else x


def _arrays(groups: list[Group], metrics: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """totals [P, G] and scores [P, G, K], NaN-padded: ART's groups differ in size."""
    g = max([len(grp.rollouts) for grp in groups] + [1])
    totals = np.full((len(groups), g), np.nan)
    scores = np.full((len(groups), g, len(metrics)), np.nan)
    for i, grp in enumerate(groups):
        for j, r in enumerate(grp.rollouts):
            totals[i, j] = score(r.total)
            scores[i, j] = [score(r.scores.get(m)) for m in metrics]
    return totals, scores


def _empty_step(cum: tuple) -> dict:
    return {names.GROUPS_SUBMITTED: 0, names.GROUPS_TRAINABLE: 0, names.CUM_GROUPS_SUBMITTED: cum[0],
            names.CUM_GROUPS_TRAINABLE: cum[1], names.TRAINABLE_RATIO: 0.0,
            names.CUM_TRAINABLE_RATIO: step_stats.trainable_ratio(*cum)}


def step_rows(groups: list[Group], metrics: list[str], weights: dict, cum: tuple = (0, 0),
              min_group_std: float = 0.0, uniform_std: float = 1e-3):
    """-> (scalars, StepGroups, StepRollouts, trainable [P]) for one step, in ART's counts."""
    if not groups:
        return _empty_step(cum), None, None, np.zeros(0, bool)
    totals, scores = _arrays(groups, metrics)
    nonzero = np.array([art_trainable([r.total for r in grp.rollouts]) for grp in groups], bool)
    stats = step_stats.group_stats(totals, scores, min_group_std=min_group_std, uniform_std=uniform_std,
                               nonzero=nonzero)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scalars = step_stats.step_scalars(stats, scores, metrics, weights, *cum)
        scalars[names.REWARD] = float(np.nanmean(totals))  # ART's train/reward: over every trajectory
    scalars[names.FRAC_REWARD_ZERO_STD] = float(1 - nonzero.mean())  # ART's rule, not std > 1e-8
    scalars[names.MIN_GROUP_STD] = float(min_group_std)
    scalars[names.SCORING_ERRORS] = sum(grp.exceptions for grp in groups) + int(
        sum(not math.isfinite(score(r.total)) for grp in groups for r in grp.rollouts))
    step_groups = StepGroups(np.arange(len(groups)), [grp.prompt_id for grp in groups],
                             [len(grp.rollouts) for grp in groups], stats.mean, stats.std, stats.trainable,
                             stats.phantom, prompt_text=_prompt_texts(groups))
    return scalars, step_groups, _step_rollouts(groups, metrics, scores), stats.trainable


def _prompt_texts(groups: list[Group]) -> list[str] | None:
    texts = [grp.prompt for grp in groups]
    return None if any(t is None for t in texts) else texts


def _step_rollouts(groups: list[Group], metrics: list[str], scores: np.ndarray) -> StepRollouts:
    where = [(i, j) for i, grp in enumerate(groups) for j in range(len(grp.rollouts))]
    rows = [groups[i].rollouts[j] for i, j in where]
    errors = [", ".join(f"{m}: not in trajectory.metrics" for m in metrics if r.scores.get(m) is None) or None
              for r in rows]
    flat = scores[tuple(zip(*where))] if where else np.zeros((0, len(metrics)))
    return StepRollouts(metrics, [w[0] for w in where], [w[1] for w in where], [r.total for r in rows], flat,
                        [r.text for r in rows], errors)


# ---- what a trajectory says ---------------------------------------------------------------------------
def split_prompt(messages: list[dict]) -> tuple[str, str]:
    """(prompt: every message up to the first user message, completion: the rest), as text."""
    first = next((k for k, m in enumerate(messages) if m.get("role") == "user"), -1) + 1
    show = lambda ms: "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in ms)  # noqa: E731
    return show(messages[:first]), show(messages[first:])


def prompt_key(metadata: dict, prompt: str) -> str:
    if metadata.get("scenario_id") is not None:  # ART's own scenario key (metrics_taxonomy)
        return str(metadata["scenario_id"])
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


def metric_scores(metrics: dict, names_: list[str], base: float) -> dict:
    out = {m: (None if metrics.get(m) is None else score(metrics[m])) for m in names_ if m != REWARD_METRIC}
    return {REWARD_METRIC: base, **out}
