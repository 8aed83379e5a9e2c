"""BatchedWrites: the training loop's store writes, committed several whole steps at a time.

Why: a step's write is mostly fixed cost: BEGIN, COMMIT, and the WAL copy of every page the
commit touched. `scalars` is keyed by (name, step) (docs/design.md), so each metric's newest page is
rewritten by every commit: a step committed alone copies many more WAL pages than its share of a
batch (docs/benchmarks.md). Committing the steps of the last log.commit_every_s together pays the
fixed part once per batch; each step stays whole (a reader sees all of a batch or none of it).
What it costs: a reader sees a step up to commit_every_s (plus one step) later, and a killed
trainer loses the uncommitted steps, which a resume redoes from its checkpoint anyway (a
checkpoint flushes first). Slow steps (longer than commit_every_s) are committed as they come.

What the trainer relies on:
- Whole steps, in order: the kept steps go to RunStore.log_steps in submit order.
- flush() returns once everything submitted is committed. A checkpoint at step N flushes
  first, so it implies steps <= N are in the store (--resume and truncate_after rely on it).
- A failure is never silent: flush() raises the failing step's error (a full disk, a bad
  score) after committing every step before it, so a full disk reads as it does with a commit
  per step (locations.storage_problem follows it).
"""
from __future__ import annotations

import time

from grpo_core.runs.store import RunStore


class BatchedWrites:
    """The loop's own store writes, batched by time: submit() keeps a step and commits every kept
    step once commit_every_s has passed since the last commit. The trainer flushes wherever
    something must see the steps so far (a request's answer, a checkpoint, the autopilot, the
    W&B mirror, the end of the run)."""

    def __init__(self, store: RunStore, commit_every_s: float):
        self.store, self.every_s = store, commit_every_s
        self.kept: list[tuple] = []
        self.last_commit = time.monotonic()
        self.calls = 0  # steps committed

    def submit(self, name: str, *args):
        if name != "log_step":
            raise ValueError(f"BatchedWrites takes log_step calls only, not {name!r}")
        self.kept.append((*args, time.time()))  # the events keep the time of their step
        if time.monotonic() - self.last_commit >= self.every_s:
            self.flush()

    def busy(self) -> bool:
        """Some submitted step is not committed yet."""
        return bool(self.kept)

    def flush(self):
        """Commit every kept step (one transaction). When that fails, the steps are written one
        by one, so every step before the one that fails is kept (as commits per step would keep
        them) and that step's error (a full disk, a bad score) is raised here; the failed step
        and those after it stay kept, never half written."""
        if self.kept:
            try:
                self.store.log_steps(self.kept)
                self.calls += len(self.kept)
            except Exception:
                if len(self.kept) == 1:
                    raise
                while self.kept:
                    self.store.log_steps(self.kept[:1])
                    del self.kept[0]
                    self.calls += 1
            self.kept = []
        self.last_commit = time.monotonic()

    def close(self, raise_error: bool = True):
        try:
            self.flush()
        except BaseException:
            if raise_error:
                raise
