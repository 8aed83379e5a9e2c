"""GPU memory per step: what torch's CUDA allocator holds at a step's end, and its peak since the last.

The trainer (and the pilot) log these with each step on CUDA; on a CPU (or MPS) device there
is no such number, so the names are absent, never zero. Both count the tensors torch
allocated on this process's device, not the allocator's cache nor other processes (what
nvidia-smi adds), so they are what the memory model (memory_model.py) estimates.
"""
from __future__ import annotations

import torch

from grpo_core.runs import names
from grpo_core.train.memory_model import GIB


def step_scalars(device: torch.device) -> dict[str, float]:
    """{gpu/memory_allocated_gb, gpu/max_memory_allocated_gb} on a CUDA device ({} elsewhere), in
    GiB; the peak is reset, so the next step's peak is that step's alone (with what ran between)."""
    if device.type != "cuda":
        return {}
    out = {names.GPU_MEMORY_ALLOCATED: torch.cuda.memory_allocated(device) / GIB,
           names.GPU_MAX_MEMORY_ALLOCATED: torch.cuda.max_memory_allocated(device) / GIB}
    torch.cuda.reset_peak_memory_stats(device)
    return out
