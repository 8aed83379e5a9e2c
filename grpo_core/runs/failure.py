"""A run's failure: one line in its store, on its terminal and on every page; its traceback in the run's log.

Every process behind a run that fails (the trainer failing to start or mid-run, a torchrun rank,
the pilot) ends the same way: failure_line appends the traceback to `<run_dir>/trainer.log` and
returns the one line, which is stored (meta.error and the failed event: record_failure) and
printed. Why a log file and not meta.error: a traceback (a vLLM engine's is a hundred lines) is a
wall on a page and in the report, while the one line says what failed and where to read more.
The log is append-only and the same file the dashboard sends a trainer's output to, so a run
started there has its output and its tracebacks in one place. Stores written before this keep a
traceback in meta.error: readers show errors.one_line of it (its last line), nothing migrates.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from grpo_core.errors import ConfigError, exception_line

LOG_NAME = "trainer.log"  # the run's log: the trainer's output (a dashboard start) and every traceback


def log_traceback(run_dir, error: BaseException, who: str = "") -> Path | None:
    """Append `error`'s traceback to the run's log; its path, or None when none could be written
    (no run folder on this machine, a full disk: the line then names no log)."""
    run_dir = Path(run_dir) if run_dir is not None else None
    if run_dir is None or not run_dir.is_dir():  # never create a run folder just for a log
        return None
    path = run_dir / LOG_NAME
    head = f"---- {time.strftime('%Y-%m-%d %H:%M:%S')} {who or 'pid ' + str(os.getpid())} failed:\n"
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(head + "".join(traceback.format_exception(error)))
    except OSError:
        return None
    return path


def failure_line(error: BaseException, run_dir, line: str | None = None, who: str = "") -> str:
    """The one line for a run that failed with `error`, its traceback logged first (log_traceback).
    `line`: a clearer line the caller has (a full disk, out of memory, a lost rank), used as it is.
    Else the exception's line (errors.exception_line), naming the log unless it is a user's
    mistake (a ConfigError names the field and the fix; the traceback is of our code)."""
    path = log_traceback(run_dir, error, who)
    if line:
        return line
    text = exception_line(error)
    return text if path is None or isinstance(error, ConfigError) else f"{text} (traceback in {path})"


def record_failure(session, line: str, step: int | None, disk_full: bool = False,
                   at: str = "run failed at step {step}") -> bool:
    """Fail the run in its store with `line` (RunSession.fail); False when the store refused.
    A full disk may refuse the status write: the WAL is then folded into the db, which frees the
    pages that write needs, and it is tried once more."""
    for attempt in range(2):
        try:
            session.fail(line, step, at=at)
            return True
        except Exception:  # the store is the run's only record: a second try, never a second error
            if attempt or not disk_full:
                return False
            try:
                session.store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except Exception:
                return False
    return False
