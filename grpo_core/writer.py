"""How the trainer's steps reach the run store when the loop does not write each one itself:
BatchedWrites (the default: the loop writes, several steps per commit) and StoreWriter (opt-in,
log.background_writes: the training thread hands each step over, a thread commits it).

BatchedWrites. Why: a step's write is mostly fixed cost: BEGIN, COMMIT, and the WAL copy of every
page the commit touched. `scalars` is keyed by (name, step) (DESIGN.md), so each metric's newest
page is rewritten by every commit: a demo step committed alone writes 50-70 WAL pages, a step in
a 1 s batch about 11 (docs/benchmarks.md). Committing the steps of the last log.commit_every_s
together pays the fixed part once per batch; each step stays whole (a reader sees all of a
batch or none of it). What it costs: a reader sees a step up to commit_every_s (plus one step)
later, and a killed trainer loses the uncommitted steps, which a resume redoes from its
checkpoint anyway (a checkpoint flushes first). Slow steps (longer than commit_every_s) are
committed as they come, as before.

StoreWriter. Why: writing a step (every scalar, group and rollout with its scores JSON-encoded and its
text) cost ~2.5 ms of a ~70-140 ms demo step in the training loop (docs/benchmarks.md,
"Monitoring overhead"). SQLite releases the GIL while it works and torch releases it in its
ops, so a thread with its own connection commits step N while the trainer samples step N+1;
the JSON encoding happens in that thread too (inside RunStore.log_step).

What the trainer relies on (BatchedWrites gives the first two and raises a failure from flush):
- Whole steps, in order: each submitted call is one RunStore method call (log_step: one
  transaction per step), run in submit order by one thread.
- flush() returns once everything submitted is committed. A checkpoint at step N flushes
  first, so it implies steps <= N are in the store (--resume and truncate_after rely on it).
- Back-pressure: the queue holds at most `maxsize` steps; submit() waits while it is full,
  so a writer that falls behind slows the trainer instead of growing its memory.
- A failure is never silent: the first exception stops all writing (nothing after a failed
  step is written, so the stored steps stay contiguous) and the same exception object is
  raised in the training thread by the next submit(), flush() or close(), so a full disk
  reads exactly as it did when the loop wrote itself (store.storage_problem follows it).
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from grpo_core import store as S

QUEUE_STEPS = 4  # steps that may wait for the writer (each is a few hundred kB at most)
GATE_WAIT_S = 0.25  # gated: a step is written by then even if the gate stays shut (a long sampling pass)


class BatchedWrites:
    """The loop's own store writes, batched by time: submit() keeps a step and commits every kept
    step once commit_every_s has passed since the last commit. The trainer flushes wherever
    something must see the steps so far (a request's answer, a checkpoint, the autopilot, the
    W&B mirror, the end of the run). Same calls as StoreWriter; no thread."""

    threaded = False

    def __init__(self, store: S.RunStore, commit_every_s: float):
        self.store, self.every_s = store, commit_every_s
        self.kept: list[tuple] = []
        self.last_commit = time.monotonic()
        self.calls = 0
        self.cpu_s = 0.0  # nothing runs off the loop

    def submit(self, name: str, *args):
        if name != "log_step":
            raise ValueError(f"BatchedWrites takes log_step calls only, not {name!r}")
        self.kept.append((*args, time.time()))  # the events keep the time of their step
        if time.monotonic() - self.last_commit >= self.every_s:
            self.flush()

    def go(self):
        """Commits happen in submit() and flush(), where the loop times its store writes."""

    def busy(self) -> bool:
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


class StoreWriter:
    """gated=True: a submitted call waits for go() (or a flush, close, full queue, or
    GATE_WAIT_S) before it is written, so the owner can choose when the thread runs: the
    trainer opens the gate as its backward pass starts, a long stretch in which torch holds
    no GIL, so the writer's Python (row tuples, JSON) does not take turns with the loop's."""

    threaded = True

    def __init__(self, db_path: str | Path, maxsize: int = QUEUE_STEPS, gated: bool = False,
                 gate_wait_s: float = GATE_WAIT_S):
        self.q: queue.Queue = queue.Queue(maxsize)
        self.gated, self.gate_wait_s = gated, gate_wait_s
        self.submitted = self.released = 0  # calls submitted / allowed to be written
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self.reported = False  # the error was raised in the training thread already
        self.cpu_s = 0.0  # this thread's CPU seconds spent in store calls (the benchmarks report it)
        self.calls = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(Path(db_path), ready), daemon=True,
                                       name="grpo-writer")
        self.thread.start()
        ready.wait()
        self._raise()  # the store could not be opened: say so now, not at the first step

    def _run(self, db_path: Path, ready: threading.Event):
        try:
            store = S.RunStore(db_path)
            store.defer_checkpoints()  # the heartbeat thread folds the WAL in (trainer.Heartbeat)
        except BaseException as e:
            self.error = e
            ready.set()
            return
        ready.set()
        try:
            while True:
                item = self.q.get()
                try:
                    if item is None:
                        return
                    seq, name, args, kwargs = item
                    with self.cv:  # the gate, or at most gate_wait_s: a slow step never delays what readers see
                        self.cv.wait_for(lambda: self.released >= seq, timeout=self.gate_wait_s)
                    if self.error is None:  # after a failure the queue is drained, never written
                        t = time.thread_time()
                        getattr(store, name)(*args, **kwargs)
                        self.cpu_s += time.thread_time() - t
                        self.calls += 1
                except BaseException as e:
                    self.error = e
                finally:
                    self.q.task_done()
        finally:
            store.close()

    def _raise(self):
        if self.error is not None and not self.reported:
            self.reported = True
            raise self.error

    def submit(self, name: str, *args, **kwargs):
        """Queue store.<name>(*args, **kwargs) (e.g. "log_step"); waits while the queue is full.
        The arguments must not be changed afterwards (the writer reads them later)."""
        self._raise()
        if not self.thread.is_alive():
            raise RuntimeError("the store writer is closed")
        if self.q.full():
            self.go()  # never wait for a gate that only this thread can open
        self.submitted += 1
        self.q.put((self.submitted, name, args, kwargs))
        if not self.gated:
            self.go()

    def go(self):
        """Let the thread write everything submitted so far."""
        with self.cv:
            self.released = self.submitted
            self.cv.notify()

    def busy(self) -> bool:
        """Something submitted is not committed yet."""
        return self.q.unfinished_tasks > 0

    def flush(self):
        """Wait until everything submitted is committed; raises the writer's error."""
        if self.thread.is_alive():
            self.go()
            self.q.join()
        self._raise()

    def close(self, raise_error: bool = True):
        """Drain the queue (every submitted step is committed), end the thread, join it.
        raise_error=False: for a close while another exception is on its way out."""
        if self.thread.is_alive():
            self.go()
            self.q.put(None)
            self.thread.join()
        if raise_error:
            self._raise()
