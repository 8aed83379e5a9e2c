"""A step that runs out of memory: the real trainer on a real store, with the device's limit
played by a hook on the model's decoder that raises what CUDA raises (torch.OutOfMemoryError)
for a forward over more rows than the limit, the way a GPU fails a batch too large for it.
The trainer halves the batch and goes on (an event says so), or, at one group per batch,
fails with one line naming the knobs and keeps every finished step."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_core.__main__ import main
from grpo_core.runs.run_meta import FAILED
from grpo_core.runs.store import EV_MEMORY, RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.rewards import Scored
from grpo_core.train import out_of_memory
from grpo_core.train.out_of_memory import OutOfMemory, halving, is_out_of_memory
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=4", "grpo.group_size=4", "grpo.max_new_tokens=8",
        "grpo.drop_untrainable=false", "log.progress=false", "log.checkpoint_every=0", "grpo.steps=3"]


def device_limit(model, *, training: bool, max_rows: int, when=lambda: True):
    """Forward passes (in train or eval mode) over more than max_rows rows raise CUDA's error."""
    def check(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training == training and ids is not None and ids.shape[0] > max_rows and when():
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate for {ids.shape[0]} rows")
    return model.get_decoder().register_forward_pre_hook(check, with_kwargs=True)


def spread_rewards(tr):
    """A random-init model's rewards tie (nothing to train on): give every group a spread."""
    def varied(completions, examples):
        raw = np.zeros((len(completions), len(tr.reward.names)))
        raw[:, 0] = [i % 2 for i in range(len(completions))]
        return Scored(raw, tr.reward.totals(raw), [None] * len(completions))
    tr.reward.score = varied


def trainer(tmp_path, extra=()):
    cfg = load_config(None, TINY + list(extra))
    store = RunStore.create("r", cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    spread_rewards(tr)
    return tr, store


def memory_events(store):
    return list(store.events(kinds=[EV_MEMORY])["payload"])


def test_a_training_step_too_large_is_retried_with_half_the_micro_batch(tmp_path):
    tr, store = trainer(tmp_path)
    device_limit(tr.model, training=True, max_rows=8)  # 2 groups of 4 fit, the step's 4 do not
    assert tr.run() == "finished" and store.last_step() == 3
    events = memory_events(store)
    assert [(e["knob"], e["groups"]) for e in events] == [("grpo.micro_batch_groups", 2)]  # then it stays
    assert "CUDA out of memory" in events[0]["error"] and tr.cfg.grpo.micro_batch_groups == 2


def test_sampling_too_large_is_retried_in_smaller_batches(tmp_path):
    tr, store = trainer(tmp_path)
    device_limit(tr.model, training=False, max_rows=4)  # the decode batch is P x G = 16 rows
    assert tr.run() == "finished" and store.last_step() == 3
    assert [(e["knob"], e["groups"]) for e in memory_events(store)] == [("grpo.sample_batch_groups", 2),
                                                                        ("grpo.sample_batch_groups", 1)]
    assert len(store.rollouts()) == 3 * 16  # every group sampled, in batches of one


def test_a_step_that_fits_nowhere_fails_in_one_line_and_keeps_the_finished_steps(tmp_path, monkeypatch, capsys):
    """Through the CLI: from step 3 on not even one group's forward fits."""
    prepare = Trainer.prepare_model

    def with_limit(self):
        prepare(self)
        spread_rewards(self)
        device_limit(self.model, training=True, max_rows=2, when=lambda: self.step >= 2)
    monkeypatch.setattr(Trainer, "prepare_model", with_limit)
    args = ["train", "--run-id", "oom", "--runs-dir", str(tmp_path)] + [a for s in TINY for a in ("--set", s)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: out of memory in training with grpo.micro_batch_groups=1")
    assert "model.gradient_checkpointing=true" in err[-1] and "steps up to 2 are kept" in err[-1]
    assert not any("Traceback" in line for line in err)
    with RunStore.open(tmp_path / "oom", readonly=True) as store:
        assert store.last_step() == 2 and store.get_meta()["status"] == FAILED
        assert [e["groups"] for e in memory_events(store)] == []  # the halvings of the failed step: not a step
        assert store.get_meta()["error"] == err[-1][len("error: "):]  # the line the terminal ends with
    assert "OutOfMemory: out of memory" in (tmp_path / "oom" / "trainer.log").read_text()  # its traceback


def test_what_counts_as_out_of_memory_and_nothing_else_is_retried():
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    try:
        torch.empty(2 ** 50, dtype=torch.uint8)  # the host allocator's own error: a RuntimeError
    except RuntimeError as error:
        assert is_out_of_memory(error)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    calls = []

    def attempt(groups):
        calls.append(groups)
        raise ValueError("not memory")
    with pytest.raises(ValueError):
        halving(attempt, 8, stage="training", knob="grpo.micro_batch_groups", on_retry=lambda *a: None)
    assert calls == [8]


def test_halving_goes_down_to_one_group_then_names_the_fix():
    tried, told = [], []

    def attempt(groups):
        tried.append(groups)
        raise torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(OutOfMemory, match="grpo.micro_batch_groups=1 .*lower grpo.group_size"):
        halving(attempt, 6, stage="training", knob="grpo.micro_batch_groups", on_retry=lambda g, e: told.append(g))
    assert tried == [6, 3, 1] and told == [3, 1]
    assert out_of_memory.LOWER_MEMORY in str(pytest.raises(OutOfMemory, halving, attempt, 1, stage="s", knob="k",
                                                          on_retry=print).value)
