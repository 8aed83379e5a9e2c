"""Per-prompt rollout budgets (grpo.budget_pilot): a small pilot group per prompt, then the step's remaining rollouts committed where the pilot and the prompt's history predict a signal.

The idea is Pilot-Commit's (arXiv 2605.26606): sample every prompt a little first and spend the
rest of the budget where the pilot saw signal; the allocation of one fixed budget across prompts
by predicted value is Knapsack RL's (arXiv 2509.25849). The step's budget is the uniform step's,
prompts_per_step x group_size completions. Each prompt first gets a pilot of grpo.budget_pilot
completions; the rest, budget - prompts x pilot, is committed by this rule:

- A prompt's predicted signal is 1 when its pilot group is trainable (the step's own gate:
  step_stats.group_stats, outcome gate included): a pilot that varies is a group that varies.
- A flat pilot (all solved, none solved, uniform) and a history of groups of this prompt: the
  share of those groups that were trainable. The history is the prompts table's count
  (analysis/prompt_history.py: groups sampled and trainable per prompt id), kept by the trainer
  itself (BudgetHistory: every rank alike, in the checkpoint) since only rank 0 holds the store. A prompt whose pilot is flat and whose every past
  group was flat (all solved or none solved, as its pilot says again) gets nothing more, nor does
  one whose signal is below grpo.budget_min_signal (benchmarked at 0.25 with groups of at most
  group_size: docs/benchmarks.md, "Per-prompt budgets").
- A flat pilot and no history: UNSEEN_SIGNAL (a pilot of 2 is flat half the time at p = 0.5).
- The committed completions go one at a time to the prompt with the highest
  signal / (committed so far + 1) (D'Hondt's rule: shares proportional to the signals, in whole
  completions, deterministic), never past grpo.budget_max_group completions in a group. What no
  prompt with a signal can take is not sampled: those rollouts are saved, not spent on groups
  that are predicted to teach nothing.

So a step's groups have different sizes (Rollouts.sizes; group g's rows follow group g-1's): the
advantages (grpo.advantages with sizes), the loss (whole-step counts, as before), the health
counts (step_stats over totals NaN-padded to the largest group) and the store's groups (their
size column) all take each group's own rows. Every rank computes the allocation from the
gathered pilot scores and the same history, so the groups are the same on 1 rank or N; each
rank samples its own prompts' commits. Not supported, refused by config.validate_budgets: the
vLLM engine (its rollouts take one group size) and dynamic sampling (its own batches).
"""
from __future__ import annotations

import heapq
import time

import numpy as np
import torch

from grpo_core.analysis import step_stats
from grpo_core.errors import ConfigError
from grpo_core.runs import live_settings, names
from grpo_core.train import step_batch
from grpo_core.train.native_sampling import Rollouts, concat_rollouts
from grpo_core.train.ranks import group_seeds

UNSEEN_SIGNAL = 0.5  # a flat pilot of a prompt never seen before: as likely to vary as not
COMMIT_DRAW = 1 << 20  # the commits' draw index in ranks.group_seeds: never a dynamic-sampling batch's
MAX_TRACKED = 100_000  # prompt ids with a history kept; past it the least recently updated is forgotten


class BudgetHistory:
    """Per prompt id: its groups so far and how many of them were trainable (every step, budgets
    on or off, so switching them on mid-run starts from what the run has seen)."""

    def __init__(self):
        self.seen: dict[str, tuple[int, int]] = {}  # prompt id -> (groups, trainable groups)

    def after_step(self, examples: list[dict], trainable):
        for ex, ok in zip(examples, trainable):
            pid = ex.get("prompt_id")
            if pid is None:
                continue
            n, t = self.seen.pop(str(pid), (0, 0))
            self.seen[str(pid)] = (n + 1, t + int(bool(ok)))  # re-inserted: least recently updated first
        while len(self.seen) > MAX_TRACKED:
            del self.seen[next(iter(self.seen))]

    def of(self, example: dict) -> tuple[int, int]:
        pid = example.get("prompt_id")
        return (0, 0) if pid is None else self.seen.get(str(pid), (0, 0))

    def state_dict(self) -> dict:
        return {"seen": {k: list(v) for k, v in self.seen.items()}}

    def load_state_dict(self, state: dict | None):
        self.seen = {k: (int(v[0]), int(v[1])) for k, v in ((state or {}).get("seen") or {}).items()}


def signals(pilot_trainable: np.ndarray, history: list[tuple[int, int]]) -> np.ndarray:
    """[P] each prompt's predicted signal in [0, 1] (the module's rule)."""
    out = np.empty(len(history), np.float64)
    for i, (ok, (n, t)) in enumerate(zip(np.asarray(pilot_trainable, bool), history)):
        out[i] = 1.0 if ok else (t / n if n else UNSEEN_SIGNAL)
    return out


def commit(signal: np.ndarray, budget: int, room: int) -> np.ndarray:
    """[P] completions committed to each prompt: `budget` handed out one at a time to the prompt
    with the highest signal / (its committed + 1), at most `room` each; none to a zero signal."""
    extra = np.zeros(len(signal), np.int64)
    heap = [(-float(s), i) for i, s in enumerate(signal) if s > 0]
    heapq.heapify(heap)
    for _ in range(max(int(budget), 0)):
        while heap and extra[heap[0][1]] >= room:
            heapq.heappop(heap)
        if not heap:
            break
        _, i = heapq.heappop(heap)
        extra[i] += 1
        if extra[i] < room:
            heapq.heappush(heap, (-float(signal[i]) / (extra[i] + 1), i))
    return extra


def check_engine(gcfg, engine: str):
    """At the start, the engine resolved (auto may be vllm): live_settings.BUDGET's rule, as ConfigError."""
    why = live_settings.BUDGET.problem(gcfg.budget_pilot, gcfg, engine)
    if why:
        raise ConfigError(why)


def max_group(gcfg) -> int:
    """The most completions one group may get (grpo.budget_max_group; 0: twice group_size)."""
    return gcfg.budget_max_group or 2 * gcfg.group_size


def row_order(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Row indices into cat(A, B), where A has first[g] rows and B second[g] rows for group g, that
    put each group's A rows, then its B rows, group after group."""
    a_start = np.concatenate([[0], np.cumsum(first)[:-1]]).astype(np.int64)
    b_start = int(np.sum(first)) + np.concatenate([[0], np.cumsum(second)[:-1]]).astype(np.int64)
    return np.concatenate([np.concatenate([np.arange(a, a + n), np.arange(b, b + m)])
                           for a, n, b, m in zip(a_start, first, b_start, second)] or [np.zeros(0, np.int64)])


def merge_rollouts(pilot: Rollouts, extra: Rollouts | None, pilot_size: int, more: np.ndarray, pad_id: int) -> Rollouts:
    """This rank's groups: each prompt's pilot rows, then its committed rows (more[g] of them)."""
    if extra is None:
        return pilot
    joined = concat_rollouts([pilot, extra], pad_id)
    order = row_order(np.full(pilot.num_prompts, pilot_size), more)
    pick = torch.as_tensor(order, device=joined.input_ids.device)
    sizes = [int(pilot_size + m) for m in more]
    return Rollouts(joined.input_ids[pick], joined.attention_mask[pick], joined.prompt_len,
                    [joined.texts[i] for i in order], [joined.examples[i] for i in order], pilot.num_prompts,
                    max(sizes), list(pilot.prompts),
                    None if joined.sampler_logprobs is None else joined.sampler_logprobs[pick], sizes)


def merge_scored(pilot: step_batch.Scored, extra: step_batch.Scored, pilot_size: int,
                 more: np.ndarray) -> step_batch.Scored:
    """The step's scores (every rank's) in the merged rollouts' row order."""
    joined = step_batch.Scored.join([pilot, extra])
    order = row_order(np.full(len(pilot.prompts), pilot_size), more)
    return step_batch.Scored(list(pilot.prompts), [joined.texts[i] for i in order], joined.lengths[order],
                             joined.raw[order], [joined.errors[i] for i in order])


def _score(trainer, roll: Rollouts | None, width: int) -> step_batch.Scored:
    """This rank's rollouts scored (none: an empty part), then every rank's gathered."""
    if roll is None:
        mine = step_batch.Scored([], [], np.zeros(0, np.int64), np.zeros((0, width)), [])
    else:
        trainer.reward.at_step(trainer.step, trainer.cfg.grpo.steps, roll)
        local = trainer.reward.score(roll.texts, roll.examples)
        mine = step_batch.Scored.of(roll, local.raw, local.errors)
    return step_batch.gather(trainer.ranks, mine)


def sample_step(trainer) -> step_batch.StepBatch:
    """The embedded trainer's step with per-prompt budgets: draw, pilot, score, commit, score."""
    g, ranks = trainer.cfg.grpo, trainer.ranks
    k, width = g.budget_pilot, len(trainer.reward.names)
    drawn = trainer.skipper.draw(trainer.task.batch, g.prompts_per_step)
    P, share = len(drawn), ranks.share(len(drawn))
    t0 = time.perf_counter()
    pilot = trainer.rollout(drawn[share], group_size=k,
                            seeds=group_seeds(g.seed, trainer.step + 1, 0, share.start, share.stop - share.start))
    t1 = time.perf_counter()
    pilot_scored = _score(trainer, pilot, width)
    t2 = time.perf_counter()
    stats = step_stats.group_stats(trainer.reward.totals(pilot_scored.raw).reshape(P, k),
                                   pilot_scored.raw.reshape(P, k, width), min_group_std=g.min_group_std,
                                   outcome_index=trainer.outcome_index, uniform_std=trainer.cfg.health.uniform_std)
    signal = signals(stats.trainable, [trainer.history.of(e) for e in drawn])
    signal[signal < g.budget_min_signal] = 0.0  # too unlikely to vary: its pilot is all it gets
    more = commit(signal, P * g.group_size - P * k, max_group(g) - k)
    chosen = [i for i in range(share.start, share.stop) if more[i] > 0]
    extra = None
    if chosen:
        seeds = [group_seeds(g.seed, trainer.step + 1, COMMIT_DRAW, i, 1)[0] for i in chosen]
        extra = trainer.rollout([drawn[i] for i in chosen], group_size=[int(more[i]) for i in chosen], seeds=seeds)
    t3 = time.perf_counter()
    extra_scored = _score(trainer, extra, width)
    t4 = time.perf_counter()
    roll = merge_rollouts(pilot, extra, k, more[share], trainer.tokenizer.pad_token_id)
    sizes = k + more
    scalars = {names.BUDGET_ROLLOUTS: float(sizes.sum()), names.BUDGET_PILOT_SIGNAL: float(stats.trainable.sum())}
    return step_batch.StepBatch(roll, np.arange(share.start, share.stop), drawn,
                                merge_scored(pilot_scored, extra_scored, k, more), 1,
                                (t1 - t0) + (t3 - t2), (t2 - t1) + (t4 - t3), sizes=sizes, scalars=scalars)
