"""A torchrun job that loses a rank: the run ends failed in the store with one line, never left "running".

A rank that is killed (or fails) closes its connections; every other rank's next collective then
fails. Rank 0 records the failure itself (Trainer.run_safely). When rank 0 is the one gone, the
next rank that sees it and can reach the run's folder records it instead, once the store shows
rank 0 gone (its process dead on this machine, or its heartbeat silent): torchrun's own output
says which rank failed and why.
"""
from __future__ import annotations

import time
from pathlib import Path

from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.run_meta import LIVE_STATUSES, STALE, STALE_AFTER_S, display_status
from grpo_core.runs.schema import DB_NAME
from grpo_core.runs.store import RunStore

LOST_RANK = "a rank of this torchrun job ended before the run did (killed, or failed: torchrun's output names it)"


def record_lost_main(run_dir: Path) -> bool:
    """Fail the run for a rank 0 that is gone, with LOST_RANK as its one line (the rank that saw it
    logged its traceback: runs/failure.py); True when this call recorded it. Returns at once
    when the store says the run already ended (rank 0 recorded it), and gives up after
    STALE_AFTER_S when rank 0 looks alive (it will record it)."""
    db = Path(run_dir) / DB_NAME
    if not db.is_file():  # another machine than rank 0's, without the runs folder shared
        return False
    deadline = time.monotonic() + STALE_AFTER_S
    with RunStore(db) as store:
        while True:
            meta = store.get_meta()
            if meta.get("status") not in LIVE_STATUSES:
                return False
            if display_status(meta) == STALE:
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        RunSession(store, {}, None).fail(LOST_RANK, store.last_step())
    return True
