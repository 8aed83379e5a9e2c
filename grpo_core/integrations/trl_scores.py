"""The TRL callback's scores: each completion's per-function scores from every process, in TRL's group order.

Two ways in (TRL 1.16, trl/trainer/grpo_trainer.py):
- Reward functions that are Python callables, TRL's documented interface
  (`f(prompts=, completions=, completion_ids=, **dataset_columns) -> list[float | None]`):
  ScoreTap wraps them in `trainer.reward_funcs`, the public list TRL reads each time it
  scores. No private TRL code is touched. Each process sees only its own slice of the
  generation batch, so `take` gathers the slices at step end (every process calls
  on_step_end: the gather is collective) in rank order, which is the order TRL itself
  groups by: its `gather(rewards_per_func)` concatenates the processes' slices the same way
  before `view(-1, num_generations)`. Rank 0 so sees each completion exactly once.
- A reward model (an nn.Module in `reward_funcs`) is called inside TRL on tokenised text:
  no public hook gives its score beside the completion and its prompt. Then the private
  `GRPOTrainer._calculate_rewards` is wrapped on the instance (it returns the scores
  [N, K] already gathered across processes, so the prompt ids and texts are gathered there
  too), after `check_private` verified that the installed TRL still has it as this was
  written for; else one line names the TRL version and what changed.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import threading

import numpy as np
import torch

from grpo_core.errors import ConfigError

WRITTEN_FOR = "TRL 1.16"
PRIVATE_PARAMS = ("inputs", "prompts", "completions", "completion_ids_list")


def text_of(x) -> str:
    """A TRL prompt/completion (string, or a conversation: list of messages) -> text."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and x and isinstance(x[-1], dict) and "content" in x[-1]:
        return "\n".join(str(m.get("content", "")) for m in x)
    return json.dumps(x, default=str)


def prompt_id(example: dict, prompt) -> str:
    """The dataset's `prompt_id` (or `id`) column, else a hash of the prompt's text."""
    for key in ("prompt_id", "id"):
        if key in example:
            return str(example[key])
    return hashlib.sha1(text_of(prompt).encode()).hexdigest()[:12]


def trl_version() -> str:
    import trl
    return f"TRL {trl.__version__}"


def _code_names(fn) -> tuple:
    return getattr(getattr(inspect.unwrap(fn), "__code__", None), "co_names", ())


def check_private(trainer):
    """The private TRL code ScoreTap wraps for reward models, checked against the installed TRL:
    `_calculate_rewards(inputs, prompts, completions, completion_ids_list)` exists, gathers
    across processes, and `_generate_and_score_completions` scores through it."""
    where = f"{trl_version()} (GRPOHealthCallback was written for {WRITTEN_FOR})"
    fix = "use reward functions that are Python callables, or install trl==1.16.*"
    method = getattr(trainer, "_calculate_rewards", None)
    if method is None:
        raise ConfigError(f"{where} has no GRPOTrainer._calculate_rewards, where the callback reads a reward "
                          f"model's scores: {fix}")
    params = tuple(inspect.signature(method).parameters)
    if params != PRIVATE_PARAMS:
        raise ConfigError(f"{where} changed GRPOTrainer._calculate_rewards{params}, expected {PRIVATE_PARAMS}, "
                          f"where the callback reads a reward model's scores: {fix}")
    if "gather" not in _code_names(type(trainer)._calculate_rewards):
        raise ConfigError(f"{where}: GRPOTrainer._calculate_rewards no longer gathers the scores across processes, "
                          f"which the callback relies on to see each completion once: {fix}")
    if "_calculate_rewards" not in _code_names(getattr(type(trainer), "_generate_and_score_completions", None)):
        raise ConfigError(f"{where}: GRPOTrainer._generate_and_score_completions no longer scores through "
                          f"_calculate_rewards, where the callback reads a reward model's scores: {fix}")


class ScoreTap:
    """One trainer's scored generation batches since the last step end. `install` before
    training, `take` at every step end (on every process), `remove` after training."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.k = len(trainer.reward_funcs)
        self.private = any(isinstance(f, torch.nn.Module) for f in trainer.reward_funcs)
        if self.private:
            check_private(trainer)
        self._lock = threading.Lock()  # async reward functions report from TRL's event-loop thread
        self._originals: list | None = None
        self.reset()

    def reset(self):
        self._open: dict[int, np.ndarray] = {}  # function index -> its scores, for the batch being scored
        self._rows: list | None = None
        self._batches: list[tuple] = []  # (scores [n, K] float32, rows [(prompt id, text)], weights [K])

    def install(self):
        self.reset()
        if self._originals is not None:
            return
        t = self.trainer
        if self.private:
            self._originals = [t.__dict__.get("_calculate_rewards")]
            t._calculate_rewards = self._wrap_private(t._calculate_rewards)
        else:
            self._originals = list(t.reward_funcs)
            # A new list: the user's own list (TRL keeps that object) is left as it was.
            t.reward_funcs = [self._wrap(i, f) for i, f in enumerate(t.reward_funcs)]

    def remove(self):
        if self._originals is None:
            return
        t = self.trainer
        if self.private:
            if self._originals[0] is None:
                del t._calculate_rewards  # back to the class's method
            else:
                t._calculate_rewards = self._originals[0]
        else:
            t.reward_funcs = self._originals
        self._originals = None

    # ---- reward functions: each process's own slice --------------------------------------------------
    def _wrap(self, index: int, fn):
        from trl.trainer.utils import is_async_callable

        if is_async_callable(fn):
            async def scored(*args, **kw):
                out = await fn(*args, **kw)
                self._scored(index, out, kw)
                return out
        else:
            def scored(*args, **kw):
                out = fn(*args, **kw)
                self._scored(index, out, kw)
                return out
        try:
            functools.update_wrapper(scored, fn)
        except AttributeError:  # a callable instance without a __dict__
            pass
        return scored

    def _scored(self, index: int, out, kw: dict):
        if not self.trainer.model.training:  # evaluation batches are not training steps
            return
        if "completions" not in kw or "prompts" not in kw:
            raise ConfigError(f"{trl_version()} called reward function {self.trainer.reward_func_names[index]!r} "
                              f"without prompts=/completions= keywords ({WRITTEN_FOR} passes them): install "
                              "trl==1.16.*")
        # None -> NaN in float32, as TRL converts them.
        values = np.array([np.nan if v is None else v for v in out], dtype=np.float32)
        with self._lock:
            if index in self._open:
                raise RuntimeError(f"GRPO health: {trl_version()} called reward function "
                                   f"{self.trainer.reward_func_names[index]!r} twice for one generation batch")
            self._open[index] = values
            if self._rows is None:
                ids = kw.get("prompt_id", kw.get("id"))
                self._rows = [(str(ids[j]) if ids is not None else prompt_id({}, p), text_of(c))
                              for j, (p, c) in enumerate(zip(kw["prompts"], kw["completions"]))]
            if len(self._open) == self.k:
                self._close()

    def _close(self):
        scores = np.stack([self._open[j] for j in range(self.k)], axis=1)
        if len(scores) != len(self._rows):
            raise RuntimeError(f"GRPO health: {len(scores)} scores for {len(self._rows)} completions")
        self._batches.append((scores, self._rows, self._weights()))
        self._open, self._rows = {}, None

    def _weights(self) -> np.ndarray:
        # Kept in float32, as TRL computes with them: the health counts must be TRL's, rounding included.
        return self.trainer.reward_weights.detach().float().cpu().numpy().copy()

    # ---- a reward model: TRL's gathered scores --------------------------------------------------------
    def _wrap_private(self, orig):
        def calculate_rewards(inputs, prompts, completions, completion_ids_list):
            scores = orig(inputs, prompts, completions, completion_ids_list)  # [N_all, K], gathered
            if self.trainer.model.training:
                self._record_gathered(scores, inputs, prompts, completions)
            return scores
        return calculate_rewards

    def _record_gathered(self, scores: torch.Tensor, inputs, prompts, completions):
        from accelerate.utils import gather_object

        acc = self.trainer.accelerator
        local = [(prompt_id(ex, p), text_of(c)) for ex, p, c in zip(inputs, prompts, completions)]
        rows = gather_object(local) if acc.num_processes > 1 else local  # collective: every process is here
        if not acc.is_main_process:
            return
        if len(rows) != scores.shape[0]:
            raise ConfigError(f"{trl_version()}: GRPOTrainer._calculate_rewards returned {scores.shape[0]} scores "
                              f"for {len(rows)} completions over all processes ({WRITTEN_FOR} gathers them): "
                              "install trl==1.16.*")
        self._batches.append((scores.detach().float().cpu().numpy(), rows, self._weights()))

    # ---- step end ---------------------------------------------------------------------------------------
    def take(self) -> list[tuple[torch.Tensor, list, torch.Tensor]]:
        """The step's scored batches, called by every process at step end -> on the main process
        [(scores [N, K] float32, rows [(prompt id, text)], weights [K] float32)], each batch over
        every process in TRL's group order; [] on the others."""
        if self._open:
            raise RuntimeError(f"GRPO health: {trl_version()} scored a generation batch with only "
                               f"{len(self._open)} of its {self.k} reward functions")
        local, self._batches = self._batches, []
        acc = self.trainer.accelerator
        if self.private or acc.num_processes == 1:
            per_rank = [local]  # private: already gathered, on the main process only
        else:
            from accelerate.utils import gather_object
            per_rank = gather_object([local])  # one list per process, in rank order
        if not acc.is_main_process:
            return []
        if len({len(r) for r in per_rank}) > 1:
            raise RuntimeError("GRPO health: the processes scored different numbers of generation batches "
                               f"this step ({[len(r) for r in per_rank]})")
        return [(torch.from_numpy(np.concatenate([r[j][0] for r in per_rank])),
                 [row for r in per_rank for row in r[j][1]], torch.from_numpy(per_rank[0][j][2]))
                for j in range(len(per_rank[0]))]
