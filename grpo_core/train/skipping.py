"""Skip before sampling (grpo.skip_zero_variance): PromptSkipper, GRESO's rule for prompts that taught nothing.

A prompt whose last groups taught nothing is likely to teach nothing again, so it is skipped
before any completion is sampled for it, and another prompt is drawn in its place.

The rule is GRESO's (arXiv 2506.02177, "Act Only When It Pays"): a prompt whose last z groups
in a row were not trainable (zero reward variance, or no outcome spread under the outcome
gate) is kept with probability explore ** z and skipped otherwise. The paper's finding is
that a zero-variance prompt stays zero-variance from one epoch to the next, the more surely the
longer its streak, so the keep probability falls with the streak instead of staying at one
value; a trainable group resets the streak to 0 (always kept). Two departures, both for a
small embedded trainer: the base probability is a fixed knob (grpo.skip_explore) where
GRESO adapts it toward a target zero-variance share, and it never falls below
grpo.skip_min_explore, so a prompt the policy has forgotten (or learnt to solve partly) is
still drawn now and then and its streak can reset. A step draws at most grpo.skip_max_extra
prompts beyond its own; past that cap the skipped ones fill the batch (first skipped first),
so a step always samples prompts_per_step groups, also once every prompt is solved.

The decisions come from the skipper's own seeded random.Random (drawn from only for a prompt
with a streak), so switching skipping on never shifts torch's, numpy's or the task's
generators; its state, the streaks and the cumulative count go into the trainer's
checkpoint, so a resumed run skips exactly what the uninterrupted one would have.
"""
from __future__ import annotations

import random
from typing import Callable

from grpo_core.runs import names

MAX_TRACKED = 100_000  # prompt ids with a streak kept; past it the least recently updated is forgotten


class PromptSkipper:
    def __init__(self, enabled: bool = False, explore: float = 0.5, min_explore: float = 0.05,
                 max_extra: int = 32, seed: int = 0):
        self.enabled, self.explore, self.min_explore, self.max_extra = enabled, explore, min_explore, max_extra
        self.rng = random.Random(f"skip-{seed}")
        self.streaks: dict[str, int] = {}  # prompt id -> non-trainable groups in a row (only ids with >= 1)
        self.step_skipped = 0  # skipped since the last after_step (a step may draw several batches)
        self.cum_skipped = 0

    @classmethod
    def from_config(cls, g) -> "PromptSkipper":
        return cls(g.skip_zero_variance, g.skip_explore, g.skip_min_explore, g.skip_max_extra, g.seed)

    def keep_probability(self, prompt_id) -> float:
        z = self.streaks.get(prompt_id, 0)
        return 1.0 if z == 0 else max(self.explore ** z, self.min_explore)

    def skip(self, prompt_id) -> bool:
        """One decision for one drawn prompt (no random draw for a prompt without a streak)."""
        p = self.keep_probability(prompt_id)
        return p < 1.0 and self.rng.random() >= p

    def draw(self, batch: Callable[[int], list[dict]], n: int) -> list[dict]:
        """n examples from the task's batch(k): drawn one at a time, skipped ones replaced, at most
        max_extra extra draws, then the skipped ones fill the rest. Off: batch(n) as it is."""
        if not self.enabled:
            return batch(n)
        kept, skipped, draws = [], [], 0
        while len(kept) < n and draws < n + self.max_extra:
            ex = batch(1)[0]
            draws += 1
            (skipped if self.skip(ex.get("prompt_id")) else kept).append(ex)
        fill = skipped[:n - len(kept)]
        self.step_skipped += len(skipped) - len(fill)
        return kept + fill

    def after_step(self, examples: list[dict], trainable) -> dict[str, float]:
        """Streaks updated from the step's groups (one example per group, in order); returns the
        step's skipping scalars (none when skipping is off)."""
        if not self.enabled:
            return {}
        for ex, ok in zip(examples, trainable):
            pid = ex.get("prompt_id")
            if pid is None:
                continue
            z = self.streaks.pop(pid, 0)
            if not ok:
                self.streaks[pid] = z + 1  # re-inserted: the dict's order is least recently updated first
        while len(self.streaks) > MAX_TRACKED:
            del self.streaks[next(iter(self.streaks))]
        self.cum_skipped += self.step_skipped
        out = {names.SKIPPED_PROMPTS: float(self.step_skipped), names.CUM_SKIPPED_PROMPTS: float(self.cum_skipped)}
        self.step_skipped = 0
        return out

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "streaks": dict(self.streaks), "cum_skipped": self.cum_skipped}

    def load_state_dict(self, state: dict | None):
        if not state:  # a checkpoint written without the skipper's state: nothing skipped yet
            return
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.streaks = dict(state.get("streaks", {}))
        self.cum_skipped = int(state.get("cum_skipped", 0))
