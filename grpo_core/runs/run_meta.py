"""A run's status and meta as readers see them: the statuses, display_status and RunMeta.

display_status derives "stale" from the heartbeat and the pid; RunMeta is a run's meta, parsed once
(ranks: how many training processes wrote it, None when the store does not say); error_line is
its error as one line."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from grpo_core.errors import one_line

# Run status (meta.status). "stale" is never stored: readers derive it from the heartbeat.
CREATED, RUNNING, PAUSED, FINISHED, FAILED, STOPPED = (
    "created", "running", "paused", "finished", "failed", "stopped")
STALE = "stale"
LIVE_STATUSES = (CREATED, RUNNING, PAUSED)
STALE_AFTER_S = 10.0  # a live run whose heartbeat is older than this shows as stale


def pid_alive(pid: int | None) -> bool:
    """A process with this pid runs on this host (a zombie does not count)."""
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive for us.
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def display_status(meta: dict, now: float | None = None) -> str:
    """Stored status, or 'stale' for a live run whose process is gone or silent."""
    status = meta.get("status", CREATED)
    if status not in LIVE_STATUSES:
        return status
    now = time.time() if now is None else now
    beat = meta.get("heartbeat") or meta.get("created") or 0
    same_host = meta.get("host") in (None, os.uname().nodename)
    if meta.get("pid") and same_host and not pid_alive(meta.get("pid")):
        return STALE
    if status != CREATED and now - beat > STALE_AFTER_S:
        return STALE
    return status


@dataclass(frozen=True)
class RunMeta:
    """A run's meta, parsed once (RunMeta.parse, RunStore.run_meta): what readers ask of it."""
    status: str | None  # as stored (display_status derives "stale")
    kind: str  # train | pilot | trl | import
    source: str  # who wrote the steps: grpo_core, trl, wandb, ...
    config: dict  # the run's config (RunConfig.to_dict() for our runs; what an importer found)
    settings: dict  # what the process behind the run has in force now (meta "settings")
    accepts: tuple[str, ...] | None  # the request kinds its session handles (None: a store from before)
    ranks: int | None = None  # training processes (torch.distributed world size); None: unknown

    @classmethod
    def parse(cls, meta: dict) -> "RunMeta":
        accepts, ranks = meta.get("accepts"), meta.get("ranks")
        return cls(meta.get("status"), meta.get("kind") or "train", meta.get("source") or "grpo_core",
                   meta.get("config") or {}, meta.get("settings") or {},
                   None if accepts is None else tuple(accepts),
                   # a positive int, else unknown: a store from before ranks were written never reads as 1
                   ranks if isinstance(ranks, int) and not isinstance(ranks, bool) and ranks > 0 else None)

    def cfg(self, section: str, key: str, default=None):
        """A config value, `default` when the section or key is missing."""
        return (self.config.get(section) or {}).get(key, default)

    @property
    def configured_steps(self) -> int | None:
        return self.cfg("grpo", "steps")

    @property
    def steps_budget(self) -> int | None:
        """The step budget in force: a set_steps request changes it mid-run (meta "settings"),
        else the config's grpo.steps."""
        steps = self.settings.get("steps")
        return steps if steps is not None else self.configured_steps

    def resumed_budget(self, steps: int) -> int:
        """The step budget a resumed run trains to: the one in force when it stopped (a set_steps
        request changes it mid-run; meta "settings" records it, as the runs list shows it), unless
        this resume sets grpo.steps itself (`--set grpo.steps=N`: then it differs from the stored
        config, which the trainer rewrites with the budget in force at each start)."""
        budget = self.steps_budget
        return int(budget) if budget is not None and steps == self.configured_steps else steps


def error_line(meta: dict) -> str | None:
    """A run's error as every reader shows it: one line (errors.one_line), None when there is none.
    Stores written before errors were kept as one line hold a whole traceback: its last line,
    the exception, is what they show (read so, never migrated; runs/failure.py)."""
    return one_line(meta.get("error")) or None


def ranks_label(ranks) -> str:
    """A run's rank count for display: "2", or "unknown" for None (or NaN, as a DataFrame holds it)."""
    return "unknown" if ranks is None or ranks != ranks else str(int(ranks))


def steps_budget(meta: dict) -> int | None:
    return RunMeta.parse(meta).steps_budget


def status_label(status: str, stop_reason: str | None) -> str:
    """'stopped (autopilot)' for a run the autopilot stopped (meta stop_reason), else the status."""
    return f"{status} ({stop_reason})" if status == STOPPED and stop_reason == "autopilot" else status

