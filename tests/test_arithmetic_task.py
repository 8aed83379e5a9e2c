"""The arithmetic task: sums by level, a held-out set no training prompt comes from, its metric
and default weights, its stream in a checkpoint, and its levels as a live setting."""
from __future__ import annotations

import re

import pytest

from grpo_core.errors import ConfigError
from grpo_core.runs.config import TASK_LEVELS
from grpo_core.tasks import make_task
from grpo_core.tasks.arithmetic import LEVELS, ArithmeticTask, held_out_pair
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.rewards import math_answer

SUM = re.compile(r"What is (\d+) \+ (\d+)\?")


def operands(example):
    a, b = SUM.search(example["prompt"]).groups()
    return int(a), int(b)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_each_level_asks_sums_of_its_digits_and_knows_the_answer(level):
    for ex in ArithmeticTask(level=level, seed=1).batch(50):
        a, b = operands(ex)
        assert (len(str(a)), len(str(b))) == LEVELS[level] and ex["answer"] == a + b


def test_the_held_out_set_is_fixed_and_disjoint_from_the_training_stream():
    task = ArithmeticTask(seed=3)
    held = task.held_out(64)
    assert held == ArithmeticTask(seed=3).held_out(64) and len({operands(e) for e in held}) > 50
    trained = {operands(e) for e in task.batch(2000)}
    assert not trained & {operands(e) for e in held}
    assert all(held_out_pair(*operands(e)) for e in held) and not any(held_out_pair(*p) for p in trained)
    share = sum(held_out_pair(a, b) for a in range(10, 100) for b in range(10, 100)) / 90 ** 2
    assert 0.07 < share < 0.13  # one pair in ten is held out


def test_math_answer_reads_the_last_number_of_a_worked_answer():
    ex = ArithmeticTask(seed=0).batch(1)[0]
    a, b = operands(ex)
    assert math_answer(f"{a} + {b} = {a + b}", ex) == 1.0
    assert math_answer(f"The answer is {a + b}.", ex) == 1.0
    assert math_answer(f"{a} + {b} = {a + b + 1}", ex) == 0.0


def test_a_config_for_the_task_gets_its_metric_and_its_levels():
    cfg = load_config(None, ["task.name=arithmetic"])
    assert cfg.reward.weights == {"math_answer": 1.0}
    assert load_config(None, ["task.name=arithmetic", "reward.weights.math_answer=2"]).reward.weights == \
        {"math_answer": 2.0}
    assert TASK_LEVELS["arithmetic"] == ArithmeticTask.levels == len(LEVELS)
    with pytest.raises(ConfigError, match="task.level must be between 1 and 4 for task arithmetic"):
        load_config(None, ["task.name=arithmetic", "task.level=5"])
    assert isinstance(make_task(cfg), ArithmeticTask)


def test_its_stream_and_level_survive_a_checkpoint():
    task = ArithmeticTask(seed=5)
    task.batch(7)
    task.set_level(2)
    again = ArithmeticTask(seed=5)
    again.load_state_dict(task.state_dict())
    assert again.level == 2 and again.batch(5) == task.batch(5)


def test_the_difficulty_request_is_offered_for_a_task_with_levels():
    """accepted_kinds' rule for a store written before runs recorded their handlers."""
    from grpo_core.runs.live_settings import SET_DIFFICULTY
    from grpo_core.runs.requests import accepted_kinds

    def meta(task):
        return {"kind": "train", "source": "grpo_core", "config": {"task": {"name": task}}}
    assert SET_DIFFICULTY in accepted_kinds(meta("arithmetic")) and SET_DIFFICULTY in accepted_kinds(meta("demo"))
    assert SET_DIFFICULTY not in accepted_kinds(meta("jsonl"))
