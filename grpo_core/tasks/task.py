"""The Task base class (a seeded stream of examples, its metrics and levels) and prompt ids.

A task yields batches of examples (dicts with at least "prompt" and "prompt_id", plus the
fields its metrics read, e.g. "answer", "source") from a seeded stream, names its metrics
(`metrics()`), and gives the supervised target for the built-in model's warm-start
(`target(example)`). The built-in tasks (StreamTask: demo, arithmetic) can change difficulty
mid-run (`set_level`); their stream state is part of a checkpoint (`state_dict` /
`load_state_dict`).
"""
from __future__ import annotations

import hashlib
import random

from grpo_core.errors import ConfigError


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

    def held_out(self, n: int) -> list[dict]:
        """n prompts for held-out evaluation, the same ones at every call, none of them trained on."""
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


class StreamTask(Task):
    """A task whose examples a seeded random stream makes (`make`), with a stream of its own for
    the warm-start; the level and the stream's state are part of a checkpoint."""

    def __init__(self, level: int = 1, seed=0, stream=None):  # seed: an int, or a string for a stream of its own
        super().__init__(level, seed)
        self.set_level(level)
        self.rng = random.Random(seed if stream is None else stream)
        self.warm_rng = random.Random(f"warm-{seed}")

    def make(self, rng: random.Random) -> dict:
        """One example at the current level."""
        raise NotImplementedError

    def batch(self, n: int) -> list[dict]:
        return [self.make(self.rng) for _ in range(n)]

    def warm_batch(self, n: int) -> list[dict]:
        return [self.make(self.warm_rng) for _ in range(n)]

    def state_dict(self) -> dict:
        return {"level": self.level, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict):
        self.set_level(int(state["level"]))
        if "rng" in state:
            version, internal, gauss = state["rng"]
            self.rng.setstate((version, tuple(internal), gauss))
