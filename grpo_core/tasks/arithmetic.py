"""The arithmetic task: add two numbers, answer checked exactly, a held-out set and four levels.

The task a real instruct model learns under GRPO in minutes on a CPU: SmolLM2-135M-Instruct
answers "What is 23 + 48?" right a few times in a hundred at temperature 1, so most groups
start flat (no signal), a few carry one, and GRPO turns them into a skill (docs/demo.md has the
measured story). The prompt is rendered as a user message by the model's chat template; the metric
is `math_answer` (binary: the completion's last number equals the sum), so "23 + 48 = 71" is
right and the model may show its work.

Levels, harder by digits, both operands of one length (task.level, raised mid-run by the
autopilot's difficulty move or curriculum.mode = auto once most groups are solved):
  1: two digits + two digits (10..99 each)
  2: three digits + three digits
  3: four digits + four digits
  4: five digits + five digits
Operands of unequal length are not a step between them: a policy that learned level 1 gets
three-digit + two-digit sums wrong far more often than three + three (docs/demo.md), so such a
level would leave its groups flat (none solved) instead of giving the next signal.
A pair of numbers belongs to the held-out set or to the training stream by a hash of the
pair, never both: the held-out accuracy measures problems the policy never trained on.
"""
from __future__ import annotations

import hashlib
import random

from grpo_core.tasks.task import StreamTask, prompt_id

LEVELS = {1: (2, 2), 2: (3, 3), 3: (4, 4), 4: (5, 5)}  # digits of the two operands
WEIGHTS = {"math_answer": 1.0}  # the task's metrics and their default weights
HELD_OUT_SHARE = 10  # one pair in this many is held out
PROMPT = "What is {a} + {b}? Answer with the number."


def held_out_pair(a: int, b: int) -> bool:
    digest = hashlib.sha1(f"{a}+{b}".encode()).digest()
    return digest[0] % HELD_OUT_SHARE == 0


def operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10 ** digits - 1)


def make_example(rng: random.Random, level: int, held_out: bool = False) -> dict:
    """A sum of the level's size from the training stream or, held_out, from the held-out set."""
    da, db = LEVELS[level]
    while True:
        a, b = operand(rng, da), operand(rng, db)
        if held_out_pair(a, b) == held_out:
            break
    prompt = PROMPT.format(a=a, b=b)  # a user message through the model's chat template (tasks/chat.py)
    return {"prompt": prompt, "answer": a + b, "prompt_id": prompt_id(f"{a}+{b}"), "level": level}


class ArithmeticTask(StreamTask):
    name = "arithmetic"
    levels = len(LEVELS)

    def __init__(self, level: int = 1, seed: int = 0):
        super().__init__(level, seed, stream=f"arithmetic-{seed}")

    def metrics(self) -> list[str]:
        return list(WEIGHTS)

    def make(self, rng: random.Random) -> dict:
        return make_example(rng, self.level)

    def held_out(self, n: int) -> list[dict]:
        """The first n problems of the held-out set at this level: the same ones every time."""
        rng = random.Random(f"arithmetic-held-out-{self.seed}")
        return [make_example(rng, self.level, held_out=True) for _ in range(n)]

    def target(self, example: dict) -> str:
        return str(example["answer"])

    def cache_key(self) -> dict:
        return {"name": self.name, "seed": self.seed, "level": self.level, "operands": LEVELS[self.level]}
