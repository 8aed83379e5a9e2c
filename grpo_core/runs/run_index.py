"""The runs index: every run under the runs dir, one row each (list_runs).

A store it cannot read is listed with the reason, never raised."""
from __future__ import annotations

import os
import sqlite3

import pandas as pd

from grpo_core.errors import StoreError
from grpo_core.runs.locations import runs_dir
from grpo_core.runs.run_meta import RunMeta, display_status, error_line
from grpo_core.runs.schema import DB_NAME
from grpo_core.runs.store import RunStore


def list_runs(root: str | os.PathLike | None = None) -> pd.DataFrame:
    """Every run under the runs dir: id, status (incl. stale/unreadable), last step, steps,
    heartbeat, created, error (one line: error_line), ranks (how many training processes; None
    when the store does not say). An unreadable store is listed with the reason, never raised."""
    base = runs_dir(root)
    rows = []
    for db in sorted(base.glob(f"*/{DB_NAME}")) if base.is_dir() else []:
        row = {"run_id": db.parent.name, "path": str(db.parent)}
        try:
            with RunStore(db, readonly=True) as s:
                meta = s.get_meta()
                parsed = RunMeta.parse(meta)
                row.update(status=display_status(meta), last_step=s.last_step(),
                           steps=parsed.steps_budget, kind=parsed.kind,
                           created=meta.get("created"), heartbeat=meta.get("heartbeat"),
                           error=error_line(meta), source=parsed.source,
                           stop_reason=meta.get("stop_reason"), ranks=parsed.ranks)
        except (StoreError, sqlite3.DatabaseError, ValueError) as e:
            row.update(status="unreadable", error=str(e))
        rows.append(row)
    cols = ["run_id", "status", "last_step", "steps", "kind", "created", "heartbeat", "error", "source", "path",
            "stop_reason", "ranks"]
    df = pd.DataFrame(rows, columns=cols)
    df["ranks"] = pd.Series([r.get("ranks") for r in rows], index=df.index, dtype=object)  # 2 or None, not 2.0/NaN
    return df.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)
