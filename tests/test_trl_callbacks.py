"""GRPOHealthCallback the way TRL users add callbacks: `GRPOTrainer(..., callbacks=[...])` with
TRL-signature reward functions (dataset columns through kwargs, None for rows a function
cannot score, an async one), a live weight change from the store, a reward model (the one
case that still wraps private TRL code, checked against the installed TRL), and one-line
errors for a wrong trainer or a changed TRL. Real TRL GRPOTrainer runs on the tiny local model."""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_trl_integration import _logged, build_tiny_model

G = 4
NAMES = ["contains_target", "graded_length", "short"]
W0, W1 = [1.0, 1.0, 1.0], [2.0, 0.0, 1.0]  # W1 sent at the end of step 2: in force from step 3


def contains_target(completions, target, **kwargs):  # a dataset column, as TRL passes it
    return [float(t in c) for c, t in zip(completions, target)]


def graded_length(completions, kind, **kwargs):  # None: this row is not this function's to score
    return [None if k == "open" else len(c) / 8 for c, k in zip(completions, kind)]


async def short(completions, **kwargs):  # TRL runs async reward functions in its own event loop
    return [float(len(c) < 6) for c in completions]


def _row(i: int) -> dict:
    return {"prompt": f"q{i}:", "prompt_id": f"p{i}", "target": "aeiou"[i % 5],
            "kind": "open" if i % 3 == 0 else "graded"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("trl-cb") / "model")


def _args(out, steps, **kw):
    from trl import GRPOConfig
    return GRPOConfig(output_dir=str(out), per_device_train_batch_size=3 * G, num_generations=G,
                      max_completion_length=8, max_steps=steps, logging_steps=1, report_to="none", use_cpu=True,
                      save_strategy="no", seed=0, learning_rate=1e-3, disable_tqdm=True, **kw)


def _dataset(n=64):
    from datasets import Dataset
    return Dataset.from_list([_row(i) for i in range(n)])


@pytest.mark.slow
def test_callbacks_list_trl_reward_functions_and_a_live_weight_change(model_dir, tmp_path):
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs import requests
    from grpo_core.runs.store import RunStore
    run = tmp_path / "runs" / "cb"

    class Dashboard(TrainerCallback):  # a weight change sent mid-run, as the live page sends it
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2 and state.is_world_process_zero:
                # `short` not named: it keeps its weight
                requests.send(run, "set_weights", {"weights": dict(zip(NAMES[:2], W1))}, source="test")

    funcs = [contains_target, graded_length, short]
    # An evaluation every 2 steps calls the same reward functions: those batches are not training steps.
    args = _args(tmp_path / "out", 5, reward_weights=W0, eval_strategy="steps", eval_steps=2,
                 per_device_eval_batch_size=2 * G)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=funcs, args=args, train_dataset=_dataset(),
                          eval_dataset=_dataset(4),
                          callbacks=[GRPOHealthCallback(run_id="cb", root=tmp_path / "runs"), Dashboard()])
    trainer.train()

    assert trainer.reward_weights.tolist() == W1  # the request reached TRL's own weights
    assert trainer.reward_funcs == [contains_target, graded_length, short] and funcs[0] is contains_target
    logged = _logged(trainer.state.log_history)
    with RunStore.open(run, readonly=True) as s:
        wide, groups, rollouts, changes, meta = s.scalars_wide(), s.groups(), s.rollouts(), s.changes(), s.get_meta()
    assert meta["status"] == "finished" and changes["step"].tolist() == [3]
    assert any("eval_reward" in e for e in trainer.state.log_history)  # the evaluations did score
    assert sorted(logged) == wide.index.tolist() == [1, 2, 3, 4, 5]
    fracs = [e["frac_reward_zero_std"] for e in logged.values()]
    assert 0 < np.mean(fracs) < 1, f"the run should mix trainable and untrainable groups, got {fracs}"
    for step, e in logged.items():
        assert wide.loc[step, "health/trainable_ratio"] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-6)
        assert wide.loc[step, "train/reward"] == pytest.approx(e["reward"], abs=1e-6)
        assert [wide.loc[step, f"reward/{n}/weight"] for n in NAMES] == (W0 if step < 3 else W1)

    # Every completion once, with the scores TRL's functions gave it and its own dataset row.
    assert len(rollouts) == 5 * 3 * G and (groups.groupby("step")["prompt_id"].nunique() == 3).all()
    r = rollouts.merge(groups[["step", "group", "prompt_id"]], on=["step", "group"])
    row = r["prompt_id"].str[1:].astype(int).map(_row)
    assert (r["contains_target"] == [float(x["target"] in c) for x, c in zip(row, r["completion"])]).all()
    assert (r["graded_length"].isna() == [x["kind"] == "open" for x in row]).all()
    assert r["error"].notna().sum() == r["graded_length"].isna().sum()
    w = np.where((r["step"] < 3).to_numpy()[:, None], W0, W1)
    np.testing.assert_allclose(r["total"], np.nansum(r[NAMES].to_numpy(float) * w, axis=1), atol=1e-6)


def test_one_line_errors_for_a_wrong_trainer_or_a_wrong_call(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from trl import GRPOTrainer

    from grpo_core.errors import ConfigError
    from grpo_core.integrations.trl import GRPOHealthCallback
    with pytest.raises(ConfigError, match="first argument is the run id"):
        GRPOHealthCallback(object())
    args = TrainingArguments(output_dir=str(tmp_path / "plain"), use_cpu=True, report_to="none")
    with pytest.raises(ConfigError, match="needs a TRL GRPOTrainer, got Trainer"):
        Trainer(model=AutoModelForCausalLM.from_pretrained(model_dir), args=args,
                callbacks=[GRPOHealthCallback(run_id="x", root=tmp_path)])
    with pytest.raises(ConfigError, match="outcome_metric 'nope' is not a reward function"):
        GRPOTrainer(model=str(model_dir), reward_funcs=[contains_target], args=_args(tmp_path / "o", 1),
                    train_dataset=_dataset(8), callbacks=[GRPOHealthCallback(run_id="y", outcome_metric="nope")])
    cb = GRPOHealthCallback(run_id="z", root=tmp_path)
    GRPOTrainer(model=str(model_dir), reward_funcs=[contains_target], args=_args(tmp_path / "o", 1),
                train_dataset=_dataset(8), callbacks=[cb])
    assert cb.names == ["contains_target"]
    with pytest.raises(ConfigError, match="already watches another trainer"):
        GRPOTrainer(model=str(model_dir), reward_funcs=[contains_target], args=_args(tmp_path / "o", 1),
                    train_dataset=_dataset(8), callbacks=[cb])


def test_a_reward_model_checks_trls_private_scoring_against_the_installed_trl(model_dir, tmp_path, monkeypatch):
    """Callables need no private TRL code; a reward model does, and a TRL whose
    _calculate_rewards changed is refused in one line naming the TRL version."""
    import torch
    import trl
    from trl import GRPOTrainer

    from grpo_core.errors import ConfigError
    from grpo_core.integrations.trl import GRPOHealthCallback

    def build(reward_funcs):
        return GRPOTrainer(model=str(model_dir), reward_funcs=reward_funcs, args=_args(tmp_path / "o", 1),
                           train_dataset=_dataset(8), callbacks=[GRPOHealthCallback(run_id="m", root=tmp_path)])

    def renamed(self, inputs, prompts, completions, completion_ids):  # a newer TRL, say
        return torch.zeros(len(prompts), len(self.reward_funcs))

    def local_only(self, inputs, prompts, completions, completion_ids_list):  # same signature, no gather
        return torch.zeros(len(prompts), len(self.reward_funcs))

    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", renamed)
    with pytest.raises(ConfigError) as err:
        build([str(model_dir), contains_target])
    msg = str(err.value)
    assert f"TRL {trl.__version__}" in msg and "changed GRPOTrainer._calculate_rewards" in msg
    assert "completion_ids'" in msg and "\n" not in msg
    build([contains_target])  # reward functions only: the changed private method is never used
    monkeypatch.setattr(GRPOTrainer, "_calculate_rewards", local_only)
    with pytest.raises(ConfigError, match=f"TRL {trl.__version__} .*no longer gathers"):
        build([str(model_dir), contains_target])
    monkeypatch.undo()
    assert isinstance(build([str(model_dir), contains_target]), GRPOTrainer)  # the installed TRL passes


@pytest.mark.slow
def test_a_reward_model_run_added_with_add_callback(model_dir, tmp_path):
    """A reward model beside a function, the callback added after the trainer was built: the
    store still holds every completion with both scores, at TRL's ratio."""
    from trl import GRPOTrainer

    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs.store import RunStore
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[str(model_dir), contains_target],
                          args=_args(tmp_path / "out", 3), train_dataset=_dataset())
    trainer.add_callback(GRPOHealthCallback(run_id="rm", root=tmp_path / "runs"))
    trainer.train()
    assert "_calculate_rewards" not in vars(trainer)  # the instance is left as TRL built it
    logged = _logged(trainer.state.log_history)
    with RunStore.open(tmp_path / "runs" / "rm", readonly=True) as s:
        wide, rollouts = s.scalars_wide(), s.rollouts()
    assert sorted(logged) == wide.index.tolist() == [1, 2, 3] and len(rollouts) == 3 * 3 * G
    for step, e in logged.items():
        assert wide.loc[step, "health/trainable_ratio"] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-6)
        r = rollouts[rollouts["step"] == step]
        for name in trainer.reward_func_names:  # "model" (the reward model's folder) and contains_target
            assert r[name].mean() == pytest.approx(e[f"rewards/{name}/mean"], abs=1e-5)


@pytest.mark.slow
def test_a_crash_inside_train_marks_the_run_failed_and_restores_the_reward_functions(model_dir, tmp_path):
    from trl import GRPOTrainer

    from grpo_core.integrations.trl import GRPOHealthCallback
    from grpo_core.runs.store import RunStore
    calls = []

    def flaky(completions, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ZeroDivisionError("reward server down")
        return [float(len(c) > 4) for c in completions]

    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[flaky], args=_args(tmp_path / "out", 4),
                          train_dataset=_dataset(), callbacks=[GRPOHealthCallback(run_id="crash", root=tmp_path)])
    with pytest.raises(ZeroDivisionError):
        trainer.train()
    assert trainer.reward_funcs == [flaky]
    with RunStore.open(tmp_path / "crash", readonly=True) as s:
        meta, last = s.get_meta(), s.last_step()
    assert last == 2 and meta["status"] == "failed" and "ZeroDivisionError: reward server down" in meta["error"]
