"""RunSession and Heartbeat: the run machinery every process behind a run shares.

The session starts a run, answers its requests and ends it; the heartbeat thread has its own
connection, so a long step never looks dead."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

from grpo_core.errors import one_line
from grpo_core.runs.live_settings import CONTROL_KINDS
from grpo_core.runs.run_meta import FAILED, RUNNING
from grpo_core.runs.store import EV_LIFECYCLE, RunStore


class Heartbeat(threading.Thread):
    """Also folds the WAL into the db every beat, so the training loop's own writes never
    wait for that (the loop's connection defers checkpoints while this thread runs;
    docs/benchmarks.md, "Behind the code")."""

    def __init__(self, db_path: Path, every: float = 2.0, *, fold_wal: bool = True):
        super().__init__(daemon=True, name="grpo-heartbeat")
        self.db_path, self.every, self.fold_wal, self.done = db_path, every, fold_wal, threading.Event()

    def run(self):
        store = RunStore(self.db_path)
        try:
            while True:
                try:
                    store.heartbeat()
                    if self.fold_wal:
                        store.checkpoint()
                except Exception:  # a busy db for a moment: the next beat will do
                    pass
                if self.done.wait(self.every):
                    return
        finally:
            store.close()

    def stop(self):
        self.done.set()
        self.join(timeout=5)


Handler = Callable[[dict], "tuple[bool, int | None, str]"]  # request -> (applied, step it acts at, message)


class RunSession:
    """A run's life in its store, the same for the built-in trainer, the pilot and the TRL
    callback: it starts (meta, status running, the started event, a heartbeat), it answers
    requests between steps, and it ends (finished, stopped or failed: the event, the requests
    still open rejected, the status).

    A run accepts exactly the request kinds it has handlers for: they are written to meta
    "accepts" when it starts (the live page offers those controls, control.accepted_kinds), and
    a request of any other kind is answered by `refuse`, with the reason that run gives."""

    def __init__(self, store: RunStore, handlers: dict[str, Handler], refuse: Handler, *,
                 fold_wal: bool = True):
        self.store, self.handlers, self.refuse = store, handlers, refuse
        self.fold_wal = fold_wal  # the heartbeat folds the WAL; this process's commits never wait for it
        self.beat: Heartbeat | None = None

    @property
    def accepts(self) -> tuple[str, ...]:
        return tuple(k for k in CONTROL_KINDS if k in self.handlers)

    def start(self, step: int, event: dict, **meta):
        """Status running with `meta`, the lifecycle event `event` at `step`, the heartbeat on."""
        self.store.set_meta(pid=os.getpid(), host=os.uname().nodename, started=time.time(), error=None,
                            accepts=list(self.accepts), **meta)
        self.store.set_status(RUNNING, stop_reason=None)
        self.store.add_event(EV_LIFECYCLE, event, step=step)
        self.beat = Heartbeat(self.store.path, fold_wal=self.fold_wal)
        self.beat.start()
        if self.fold_wal:
            self.store.defer_checkpoints()

    def serve(self, claimed: list[dict] | None = None) -> list[tuple[dict, bool, int | None, str]]:
        """Answer each request, in order, with its kind's handler: `claimed` (already claimed by
        the caller), else the pending ones, claimed now. Returns (request, applied, step,
        message) per request."""
        done = []
        for req in self.store.claim_pending() if claimed is None else claimed:
            applied, step, message = self.handlers.get(req["kind"], self.refuse)(req)
            self.store.resolve_request(req["id"], applied, step, message)
            done.append((req, applied, step, message))
        return done

    def stop_heartbeat(self):
        if self.beat is not None:
            self.beat.stop()
            self.beat = None
            if self.fold_wal:
                self.store.defer_checkpoints(False)

    def finish(self, status: str, step: int, reason: str | None = None, at: str = "run {status} at step {step}",
               **status_meta):
        """The run ended normally: finished or stopped at `step` (`reason`: why it stopped). `at`
        tells a request still open why it was not applied."""
        self.stop_heartbeat()
        self.store.add_event(EV_LIFECYCLE, {"event": status, "reason": reason}, step=step)
        self.store.reject_open_requests(at.format(status=status, step=step))
        self.store.set_status(status, **status_meta)

    def fail(self, error: str, step: int | None, at: str = "run failed at step {step}"):
        """The run failed: `error`, as one line (errors.one_line; runs/failure.py makes it and logs
        the traceback), in the failed event and in meta.error alike. `at` tells a request still
        open why it was not applied."""
        line = one_line(error) or "failed"
        self.stop_heartbeat()
        self.store.add_event(EV_LIFECYCLE, {"event": FAILED, "error": line}, step=step)
        self.store.reject_open_requests(at.format(step=step))
        self.store.set_status(FAILED, error=line)
