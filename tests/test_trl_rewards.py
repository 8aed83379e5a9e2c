"""TRL-signature reward functions (`f(completions, **kwargs) -> list[float | None]`) as metrics:
called with what TRL 1.16's own `GRPOTrainer._calculate_rewards` passes (checked by calling that
method on the same rows), None as "not scored", wrong returns as one line naming the function,
and the same functions in the embedded trainer and the pilot."""
from __future__ import annotations

import json
import logging
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.runs.store import RunStore
from grpo_core.tasks.rewards import CompositeReward, load_metric, token_f1
from grpo_core.tasks.trl_rewards import TrlRewardFunction, as_metric, is_trl_style

FAST = ["--set", "model.warm_start_steps=0", "--set", "log.progress=false"]


def _record(calls: list):
    def reward(completions, **kwargs):
        calls.append({"completions": completions, **kwargs})
        return [None if i % 3 == 0 else float(i) for i in range(len(completions))]
    return reward


def test_the_kind_is_read_from_the_signature_or_the_marker():
    def trl(completions, **kwargs):
        return [0.0] * len(completions)

    def trl_with_columns(prompts, completions, answer, **kwargs):
        return [0.0] * len(completions)

    def anything(*args, **kwargs):
        return [0.0]
    assert is_trl_style(trl) and is_trl_style(trl_with_columns)
    assert not is_trl_style(token_f1) and not is_trl_style(anything) and not is_trl_style(math.sqrt)
    anything.reward_style = "trl"
    assert isinstance(as_metric(anything, "x"), TrlRewardFunction)
    trl.reward_style = "metric"
    assert as_metric(trl, "x") is trl
    trl.reward_style = "batched"
    with pytest.raises(ConfigError, match="reward.custom.x: reward_style must be 'trl' or 'metric'"):
        is_trl_style(trl, "x")


ROWS = [{"prompt": "2+2=", "answer": "4", "prompt_id": "a", "level": 1},
        {"prompt": [{"role": "user", "content": "3+3="}], "answer": "6", "prompt_id": "b", "level": 2}]


def _trls_kwargs(fn, rows: list[dict], texts: list[str], ids: list[list[int]], monkeypatch):
    """What TRL's own _calculate_rewards passes fn (one process: its gather is the identity)."""
    from transformers import TrainerState
    from trl.trainer import grpo_trainer
    monkeypatch.setattr(grpo_trainer, "gather", lambda t: t)
    monkeypatch.setattr(grpo_trainer, "logger", logging.getLogger("trl-under-test"))  # no accelerate state here
    calls = []

    def recorder(**kwargs):
        calls.append(kwargs)
        return fn(**kwargs)
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device=torch.device("cpu"), is_main_process=True), reward_funcs=[recorder],
        reward_processing_classes=[None], reward_func_names=["f"], state=TrainerState(global_step=3, max_steps=10),
        _log_completion_extra=lambda *a: None, _log_metric=lambda *a: None, environments=None,
        args=types.SimpleNamespace(report_to=[]))
    prompts = [r["prompt"] for r in rows]
    completions = [[{"role": "assistant", "content": t}] if isinstance(p, list) else t for p, t in zip(prompts, texts)]
    out = grpo_trainer.GRPOTrainer._calculate_rewards(trainer, rows, prompts, completions, ids)
    return calls[0], out[:, 0]


def _ours(fn, rows, texts, ids) -> tuple[dict, CompositeReward, np.ndarray]:
    calls = []

    def recorder(completions, **kwargs):
        calls.append({"completions": completions, **kwargs})
        return fn(completions=completions, **kwargs)
    reward = CompositeReward({"f": as_metric(recorder, "f")}, {"f": 1.0})
    mask = torch.tensor([[1] * len(i) + [0] * (3 - len(i)) for i in ids])
    roll = types.SimpleNamespace(texts=texts, completion_ids=torch.tensor([i + [0] * (3 - len(i)) for i in ids]),
                                 completion_mask=mask)
    reward.at_step(3, 10, roll)
    scored = reward.score(texts, [dict(r) for r in rows])
    return calls[0], reward, scored.raw[:, 0]


def test_kwargs_and_scores_are_what_trls_calculate_rewards_gives(monkeypatch):
    """A standard prompt (completion: a string) and a conversational one (completion: an
    assistant message), the dataset's other columns as lists, trainer_state, completion_ids."""
    rows = [ROWS[0], ROWS[0], ROWS[1], ROWS[1]]
    texts, ids = ["4", " 5", "6", "six"], [[7], [8, 9], [10], [11, 12, 13]]

    def judge(completions, answer, completion_ids, trainer_state, **kwargs):
        text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        return [None if len(i) == 3 else float(t.strip() == a) + trainer_state.global_step
                for t, a, i in zip(text, answer, completion_ids)]
    theirs, trl_scores = _trls_kwargs(judge, rows, texts, ids, monkeypatch)
    ours, reward, our_scores = _ours(judge, rows, texts, ids)
    assert set(ours) == set(theirs) == {"prompts", "completions", "completion_ids", "answer", "prompt_id", "level",
                                        "trainer_state", "log_extra", "log_metric"}
    for key in set(theirs) - {"trainer_state", "log_extra", "log_metric"}:
        assert ours[key] == theirs[key], key
    assert ours["completions"][2] == [{"role": "assistant", "content": "6"}]
    # Not transformers' TrainerState itself (tasks/ never imports transformers): its fields a reward reads.
    assert ours["trainer_state"].max_steps == theirs["trainer_state"].max_steps
    assert ours["trainer_state"].global_step == theirs["trainer_state"].global_step == 3
    np.testing.assert_array_equal(np.isnan(our_scores), torch.isnan(trl_scores).numpy())
    np.testing.assert_allclose(our_scores, trl_scores.double().numpy(), equal_nan=True)
    assert np.isnan(our_scores[3]) and our_scores[0] == 4.0  # None: not scored


def test_none_is_not_scored_and_adds_nothing_to_the_total():
    """TRL's total: (rewards_per_func * weights).nansum(dim=1); a None is NaN in its column."""
    calls = []
    reward = CompositeReward({"f": as_metric(_record(calls), "f"), "exact": lambda c, e: float(c == e["answer"])},
                             {"f": 0.5, "exact": 2.0})
    texts = ["4", "4", "5", "4"]
    scored = reward.score(texts, [ROWS[0]] * 4)
    f = scored.raw[:, 0]
    assert np.isnan(f[0]) and np.isnan(f[3]) and list(f[1:3]) == [1.0, 2.0]
    trl_total = (torch.tensor(scored.raw) * torch.tensor([0.5, 2.0])).nansum(dim=1)
    np.testing.assert_allclose(scored.totals, trl_total.numpy())
    assert scored.totals[0] == 2.0 and scored.num_errors == 0


@pytest.mark.parametrize("out, message", [
    ([1.0], "returned 1 values for 3 completions"),
    ("1.0", "returned str '1.0'"),
    (1.0, "returned float 1.0"),
    ([1.0, "2", None], "returned str '2' for completion 1"),
    ([1.0, float("inf"), None], "returned an infinite value"),
])
def test_a_wrong_return_is_one_line_naming_the_function(out, message):
    def bad(completions, **kwargs):
        return out
    reward = CompositeReward({"judge": as_metric(bad, "judge", "my_rewards:bad")}, {"judge": 1.0})
    with pytest.raises(ConfigError) as e:
        reward.score(["a", "b", "c"], [ROWS[0]] * 3)
    assert str(e.value).startswith("reward.custom.judge (my_rewards:bad, a TRL-style reward function) ")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_function_that_raises_marks_the_batch_and_the_step_goes_on():
    def broken(completions, **kwargs):
        raise KeyError("answer")
    reward = CompositeReward({"judge": as_metric(broken, "judge"), "exact": lambda c, e: 1.0},
                             {"judge": 1.0, "exact": 1.0})
    scored = reward.score(["a", "b"], [ROWS[0]] * 2)
    assert scored.errors == ["judge: KeyError: 'answer'"] * 2
    assert list(scored.raw[:, 0]) == [0.0, 0.0] and list(scored.totals) == [1.0, 1.0]


def test_load_metric_wraps_a_trl_function_from_a_module(tmp_path, monkeypatch):
    (tmp_path / "trl_style_rewards.py").write_text(
        "def n_chars(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_metric("trl_style_rewards:n_chars", "chars")
    assert isinstance(fn, TrlRewardFunction)
    assert list(fn(["ab", "c"], [ROWS[0]] * 2)) == [2.0, 1.0]


REWARDS_MODULE = '''
import json, os

def correct(completions, answer, completion_ids, trainer_state, prompts, **kwargs):
    """TRL-style: 1 when the completion contains the answer; None (not scored) for about half of them."""
    with open(os.environ["TRL_REWARD_LOG"], "a") as f:
        f.write(json.dumps({"step": trainer_state.global_step, "n": len(completions), "prompts": prompts[:1],
                            "lengths": [len(i) for i in completion_ids], "texts": completions}) + "\\n")
    return [None if sum(map(ord, c)) % 2 == 0 else float(a in c) for c, a in zip(completions, answer)]
'''


@pytest.fixture
def trl_rewards_data(tmp_path, monkeypatch):
    (tmp_path / "my_trl_rewards.py").write_text(REWARDS_MODULE)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("TRL_REWARD_LOG", str(log))
    monkeypatch.delitem(sys.modules, "my_trl_rewards", raising=False)
    return tmp_path, log


def _args(tmp_path: Path) -> list[str]:
    return ["--set", "task.name=jsonl", "--set", f"task.dataset={tmp_path / 'sums.jsonl'}",
            "--set", "reward.weights={correct = 1.0}", "--set", "reward.custom.correct=my_trl_rewards:correct",
            "--set", f"reward.custom_dirs=['{tmp_path}']", "--set", "num_generations=4",
            "--set", "max_completion_length=6", "--set", "grpo.prompts_per_step=2", *FAST]


def _check_calls(log: Path, steps: int, store: RunStore):
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["step"] for c in calls] == list(range(steps)) and all(c["n"] == 8 for c in calls)
    assert all(0 < n <= 6 for c in calls for n in c["lengths"])  # token ids, eos included, no padding
    assert isinstance(calls[0]["prompts"][0], str) and calls[0]["prompts"][0].endswith("=")
    r = store.rollouts()
    assert len(r) == 8 * steps and sorted(r["completion"]) == sorted(t for c in calls for t in c["texts"])
    unscored = r["completion"].map(lambda c: sum(map(ord, c)) % 2 == 0)
    assert 0 < unscored.sum() < len(r)
    assert (r["correct"].isna() == unscored).all()  # None: stored as not scored (NaN), not as 0
    assert set(r["correct"][~unscored]) <= {0.0, 1.0}


def test_a_trl_function_in_the_embedded_trainer(trl_rewards_data, runs_dir):
    tmp_path, log = trl_rewards_data
    assert main(["train", *_args(tmp_path), "--set", "grpo.steps=2", "--run-id", "trl-fns"]) == 0
    with RunStore.open("trl-fns", readonly=True) as store:
        assert store.config["grpo"]["group_size"] == 4 and store.config["grpo"]["max_new_tokens"] == 6
        _check_calls(log, 2, store)


def test_a_trl_function_in_the_pilot(trl_rewards_data, runs_dir):
    tmp_path, log = trl_rewards_data
    assert main(["pilot", *_args(tmp_path), "--set", "grpo.steps=1", "--run-id", "trl-pilot"]) == 0
    with RunStore.open("trl-pilot", readonly=True) as store:
        assert store.get_meta().get("kind") == "pilot"
        _check_calls(log, 1, store)
