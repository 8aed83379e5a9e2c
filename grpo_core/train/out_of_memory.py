"""A step that runs out of memory is retried with half the batch, not lost.

CUDA raises torch.OutOfMemoryError, the host allocator a RuntimeError ("DefaultCPUAllocator:
can't allocate memory"), Python a MemoryError. The trainer runs its sampling and its
forward/backward through `halving`: on one of these it frees what it can, halves the batch
(grpo.sample_batch_groups, grpo.micro_batch_groups), says so (an event in the store), and
tries again; at one group per batch there is nothing left to halve and the run fails with one
line naming the knobs that lower memory."""
from __future__ import annotations

import gc

import torch

LOWER_MEMORY = ("lower grpo.group_size or grpo.max_new_tokens, or set model.gradient_checkpointing=true, "
                "model.lora_rank=16 or a smaller grpo.logit_chunk_mb")


class OutOfMemory(RuntimeError):
    """Even one group per batch does not fit; the message says what to change."""


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def free_memory():
    gc.collect()  # the failed attempt's tensors are garbage once its frames are gone
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def halving(attempt, groups: int, *, stage: str, knob: str, on_retry):
    """attempt(groups) until it fits: on out-of-memory, `groups` halves (on_retry(new groups,
    error) is told first) down to 1; then OutOfMemory with the one-line fix."""
    while True:
        try:
            return attempt(groups)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            message = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        free_memory()  # outside the except block: the traceback (and the attempt's tensors) is gone
        if groups <= 1:
            raise OutOfMemory(f"out of memory in {stage} with {knob}=1 (one group per batch): "
                              f"{LOWER_MEMORY} ({message})")
        groups = max(1, groups // 2)
        on_retry(groups, message)
