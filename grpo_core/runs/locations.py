"""Where runs live on disk: the runs dir, run ids, a run's db path, why a write there failed, our env vars.

Layout: `<runs_dir>/<run_id>/run.db` (+ config.toml, trainer.log, checkpoints/).

Every environment variable GRPO Health reads is GRPO_HEALTH_*, read through env(); the names
some had before (GRPO_RUNS_DIR, ...) are still read when the new one is not set.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from grpo_core.errors import StoreError
from grpo_core.runs.schema import DB_NAME

logger = logging.getLogger(__name__)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# errno values and library messages that mean "this disk/folder takes no more writes".
NO_WRITE_ERRNOS = {28: "no space left on device", 27: "file size limit reached", 30: "read-only file system",
                   122: "disk quota exceeded"}
NO_WRITE_TEXT = {"no space left": "no space left on device", "file too large": "file size limit reached",
                 "database or disk is full": "disk full", "disk i/o error": "disk I/O error (disk full?)",
                 "read-only file system": "read-only file system", "readonly database": "read-only database"}


def storage_problem(exc: BaseException | None) -> str | None:
    """Why a write failed when it is the disk's fault (full, size limit, read-only,
    permissions), in a few words; None for any other error. Follows the cause chain
    (torch, safetensors and sqlite wrap the OSError in their own types)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_WRITE_ERRNOS:
            return NO_WRITE_ERRNOS[exc.errno]
        text = str(exc).lower()
        for needle, why in NO_WRITE_TEXT.items():
            if needle in text:
                return why
        exc = exc.__cause__ or exc.__context__
    return None


# The env vars that had another name: new name -> old name, still read when the new one is unset.
OLD_ENV_NAMES = {"GRPO_HEALTH_RUNS_DIR": "GRPO_RUNS_DIR", "GRPO_HEALTH_TORCH_THREADS": "GRPO_TORCH_THREADS",
                 "GRPO_HEALTH_ALLOWED_DIRS": "GRPO_ALLOWED_DIRS"}
warned_old_names: set[str] = set()


def env(name: str, default: str | None = None) -> str | None:
    """$name (a GRPO_HEALTH_* variable), else the old name it replaced, else default. An empty
    value counts as unset (`VAR= cmd` clears a setting)."""
    value = os.environ.get(name)
    old = OLD_ENV_NAMES.get(name)
    if not value and old and os.environ.get(old):
        value = os.environ[old]
        if old not in warned_old_names:  # once per process: it still works, the new name is the one to use
            warned_old_names.add(old)
            logger.warning("$%s is the old name of $%s; it still works, but set $%s", old, name, name)
    return value or default


def runs_dir(path: str | os.PathLike | None = None) -> Path:
    """The runs directory: explicit path, else $GRPO_HEALTH_RUNS_DIR, else ./runs."""
    return Path(path or env("GRPO_HEALTH_RUNS_DIR") or "runs").resolve()


def source_checkout() -> Path | None:
    """The source checkout this grpo_core was imported from (pyproject.toml and app.py beside the
    package), or None when it is an installed copy (a wheel: no checkout, no repository)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "app.py").is_file() else None


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id) or ".." in run_id:
        raise StoreError(f"run id {run_id!r} is not allowed: use letters, digits, '_', '-', '.' "
                         "(at most 64, no '..' or '/')")
    return run_id


def new_run_id(prefix: str = "run") -> str:
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}"


def resolve_db(run: str | os.PathLike) -> Path:
    """A run dir, a run.db path, or a run id under the runs dir -> the db path."""
    p = Path(run)
    if p.is_dir():
        return p / DB_NAME
    if p.suffix == ".db" or p.is_file():
        return p
    return runs_dir() / check_run_id(str(run)) / DB_NAME
