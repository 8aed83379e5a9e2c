"""The processes of one run under torchrun: which rank this is, each rank's share of a step, and the collectives the ranks agree through.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK (and the rendezvous); `from_environment` joins
the process group. A process started without torchrun (or with one process) is `SINGLE`: every
collective is the identity, so a single-process run is the same code with nothing added.

What the ranks agree on, and how:
- The step's prompts: every rank draws the same global batch from the same seeded task stream
  and keeps its `share` (a contiguous block in prompt order), so the global batch is the same
  on 1 rank or N and gathering in rank order gives it back.
- Each group's random draws: `group_seeds` seeds them from (run seed, step, draw, global prompt
  index), so a prompt's completions do not depend on which rank samples it or with whom.
- Requests, stop signals, the autopilot: rank 0 reads the store and `broadcast`s what it read;
  every rank applies it at the same step boundary.
- The gradient: each rank accumulates its micro-batches locally, each loss divided by the
  step's global counts, and one `sum_gradients` after the last micro-batch adds them up: the
  single-process gradient, whatever each rank's micro-batch count.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from grpo_core.errors import ConfigError


@dataclass(frozen=True)
class Ranks:
    rank: int = 0  # this process's rank (0 writes the store)
    size: int = 1  # how many processes train the run (torch.distributed's world size)
    local_rank: int = 0  # its rank on this machine: which GPU it takes
    backend: str = ""  # "gloo", or "cpu:gloo,cuda:nccl" (a GPU per local rank); "" for a single process

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def share(self, n: int) -> slice:
        """This rank's contiguous block of n items (the first n % size ranks take one more)."""
        base, extra = divmod(n, self.size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def _device(self, tensor: torch.Tensor) -> torch.device:
        """Where a tensor goes through a collective: its GPU with NCCL, else the CPU (gloo)."""
        return tensor.device if tensor.is_cuda and "nccl" in self.backend else torch.device("cpu")

    def broadcast(self, obj):
        """Rank 0's `obj`, on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, device=torch.device("cpu"))
        return box[0]

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    def sum(self, values) -> np.ndarray:
        """The element-wise sum over ranks of a float vector (float64)."""
        array = np.asarray(values, dtype=np.float64)
        if not self.distributed:
            return array
        tensor = torch.as_tensor(array)
        torch.distributed.all_reduce(tensor)
        return tensor.cpu().numpy()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any."""
        return bool(self.sum([float(flag)])[0] > 0) if self.distributed else bool(flag)

    def sum_gradients(self, params: list[torch.nn.Parameter]):
        """Each parameter's gradient summed over ranks, in one all-reduce. A rank that did no
        backward (no group of its own trained) adds zeros; a parameter no rank has a gradient
        for keeps none (the optimizer then skips it, as in a single process)."""
        if not self.distributed or not params:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.float32)
        torch.distributed.all_reduce(has)
        device = self._device(params[0])
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(device)
                          for p in params])
        torch.distributed.all_reduce(flat)
        offset = 0
        for p, anywhere in zip(params, has.tolist()):
            n = p.numel()
            if anywhere:
                p.grad = flat[offset:offset + n].view_as(p).to(p.device, p.dtype).clone()
            offset += n

    def same_parameters(self, model: torch.nn.Module):
        """Every rank starts from rank 0's weights (as DDP does when it wraps a model)."""
        if not self.distributed:
            return
        for tensor in list(model.parameters()) + list(model.buffers()):
            moved = tensor.data.to(self._device(tensor))
            torch.distributed.broadcast(moved, src=0)
            tensor.data.copy_(moved)

    def close(self):
        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


SINGLE = Ranks()


def group_seeds(seed: int, step: int, draw: int, first: int, count: int) -> list[int]:
    """The seeds of `count` groups from global prompt index `first`, in draw `draw` (dynamic
    sampling draws more than one batch) of step `step`: the same on whichever rank samples them."""
    return [int(np.random.SeedSequence([seed, step, draw, first + i]).generate_state(1)[0]) for i in range(count)]


def from_environment() -> Ranks:
    """The run's ranks from torchrun's environment, the process group joined. On CUDA each rank
    takes cuda:LOCAL_RANK (torch.cuda.set_device, so model.device auto/cuda means it) and the
    gradients go over NCCL when every local rank has a GPU of its own; everything else (and
    ranks sharing a GPU, which NCCL refuses) goes over gloo."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return SINGLE
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        torch.cuda.set_device(local_rank % gpus)
    backend = "cpu:gloo,cuda:nccl" if gpus >= local_size else "gloo"
    torch.distributed.init_process_group(backend)
    return Ranks(rank, size, local_rank, backend)


def check_config(cfg, ranks: Ranks):
    """What a run on `ranks` needs of its config: ConfigError naming the knob."""
    if not ranks.distributed:
        return
    if cfg.model.device.startswith("cuda:"):
        raise ConfigError(f"model.device={cfg.model.device} puts every rank on one GPU: use model.device=auto or "
                          "cuda (each rank takes cuda:LOCAL_RANK)")
    if cfg.grpo.prompts_per_step < ranks.size:
        raise ConfigError(f"grpo.prompts_per_step={cfg.grpo.prompts_per_step} is below the {ranks.size} ranks: each "
                          f"rank samples whole groups; set grpo.prompts_per_step to at least {ranks.size}")


def lost_peer(error: BaseException) -> bool:
    """Whether `error` is a collective that failed because another rank is gone (killed or failed)."""
    dist_error = getattr(torch.distributed, "DistError", ())
    text = str(error)
    return isinstance(error, dist_error) or any(k in text for k in ("Connection closed by peer", "Connection reset",
                                                                    "Broken pipe", "gloo", "NCCL"))
