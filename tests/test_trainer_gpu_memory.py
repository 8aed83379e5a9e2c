"""gpu/memory_allocated_gb and gpu/max_memory_allocated_gb: each step's allocated memory and its
peak on CUDA, absent on CPU. No GPU here: torch.cuda's allocator calls are replaced by a fake
allocator whose peak behaves as CUDA's does (reset_peak_memory_stats drops it to the current)."""
from __future__ import annotations

import pytest
import torch

from grpo_core.runs import names
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train import gpu_memory
from grpo_core.train.memory_model import GIB
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=4",
        "log.progress=false", "log.checkpoint_every=0", "grpo.steps=3"]


class FakeAllocator:
    """What torch.cuda's allocator reports, in bytes: now, and the peak since the last reset."""

    def __init__(self):
        self.now = self.peak = 0
        self.devices: list[torch.device] = []

    def hold(self, n_bytes: int):  # allocate (or free, negative) like a step does
        self.now += n_bytes
        self.peak = max(self.peak, self.now)

    def install(self, monkeypatch):
        def seen(fn):
            def call(device=None):
                self.devices.append(device)
                return fn()
            return call
        monkeypatch.setattr(torch.cuda, "memory_allocated", seen(lambda: self.now))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", seen(lambda: self.peak))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", seen(lambda: setattr(self, "peak", self.now)))


def test_each_step_reports_what_is_held_and_its_own_peak(monkeypatch):
    alloc = FakeAllocator()
    alloc.install(monkeypatch)
    cuda = torch.device("cuda", 0)
    alloc.hold(3 * GIB)          # weights and optimizer state
    alloc.hold(2 * GIB)          # the step's activations...
    alloc.hold(-2 * GIB)         # ...freed after the backward pass
    first = gpu_memory.step_scalars(cuda)
    assert first == {names.GPU_MEMORY_ALLOCATED: 3.0, names.GPU_MAX_MEMORY_ALLOCATED: 5.0}
    alloc.hold(GIB // 2)         # a smaller step: its peak is its own, not the first step's
    alloc.hold(-(GIB // 2))
    assert gpu_memory.step_scalars(cuda) == {names.GPU_MEMORY_ALLOCATED: 3.0, names.GPU_MAX_MEMORY_ALLOCATED: 3.5}
    assert set(alloc.devices) == {cuda}  # the trainer's device, not whichever is current


def test_a_cpu_device_reports_nothing_and_asks_cuda_nothing(monkeypatch):
    alloc = FakeAllocator()
    alloc.install(monkeypatch)
    assert gpu_memory.step_scalars(torch.device("cpu")) == {}
    assert alloc.devices == []


@pytest.fixture
def trainer(runs_dir):
    store = RunStore.create("gpu", {}, root=runs_dir)
    return Trainer(load_config(None, TINY), store, log=lambda m: None), store


def test_a_cpu_run_logs_no_gpu_memory(trainer):
    tr, store = trainer
    assert tr.device.type == "cpu" and tr.run() == "finished"
    logged = set(store.scalars_wide().columns)
    assert names.TRAINABLE_RATIO in logged
    assert not {n for n in logged if n.startswith("gpu/")}  # absent, not zero


def test_the_trainer_logs_its_devices_memory_with_every_step(trainer, monkeypatch):
    """The trainer's wiring: every step asks about its own device and stores the answer. The
    device is CPU here, so the fake allocator answers as if it were a GPU's."""
    tr, store = trainer
    alloc = FakeAllocator()
    alloc.install(monkeypatch)
    real = gpu_memory.step_scalars
    asked: list[torch.device] = []

    def as_if_cuda(device):
        asked.append(device)
        alloc.hold(GIB * (len(asked) + 1))  # each step holds a little more, then frees its activations
        alloc.hold(-GIB)
        return real(torch.device("cuda", 0))
    monkeypatch.setattr(gpu_memory, "step_scalars", as_if_cuda)
    assert tr.run() == "finished"
    wide = store.scalars_wide()
    assert asked == [tr.device] * 3
    assert wide[names.GPU_MEMORY_ALLOCATED].tolist() == [1.0, 3.0, 6.0]
    assert wide[names.GPU_MAX_MEMORY_ALLOCATED].tolist() == [2.0, 4.0, 7.0]
