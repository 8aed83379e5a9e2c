"""The run store's schema: every table and column, its versions and the migration from version 1.

Also how a value is stored as JSON (dumps). Nothing else creates a table.

Schema versions (meta schema_version): 2 keeps a rollout's numbers (total, every metric's score,
the error text) once, in step_scores (step_scores.py), and its text in rollouts. A version-1 file
(scores JSON in rollouts, and since some point step_scores too) is migrated in place by the first
open that may write it (one transaction; nothing lost), and read as it is by a read-only open. A
file newer than SCHEMA_VERSION is refused.
"""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from grpo_core.errors import StoreError
from grpo_core.runs.step_scores import json_scores_to_step_scores

SCHEMA_VERSION = 2
DB_NAME = "run.db"
V1_SCORE_BLOBS = "score_blobs"  # version-1 meta key: this v1 store wrote step_scores for every step

STEP_SCORES_TABLE = ("CREATE TABLE IF NOT EXISTS step_scores (\n"
                     "    step INTEGER PRIMARY KEY, metrics TEXT, grp BLOB, idx BLOB, total BLOB, scores BLOB, "
                     "errors TEXT)")
ROLLOUTS_TABLE = ("CREATE TABLE IF NOT EXISTS rollouts (\n"
                  "    step INTEGER NOT NULL, grp INTEGER NOT NULL, idx INTEGER NOT NULL, completion TEXT,\n"
                  "    PRIMARY KEY (step, grp, idx)) WITHOUT ROWID")
# Each prompt's text as the model read it (a rendered chat template), once per prompt id. Added
# after version 2 without a version bump: an older reader ignores the table, and a writable open
# of a store without it adds it.
PROMPTS_TABLE = "CREATE TABLE IF NOT EXISTS prompts (prompt_id TEXT PRIMARY KEY, text TEXT) WITHOUT ROWID"
# Why each non-trainable group taught nothing (analysis.flat_causes: names.FLAT_CAUSES' keys; mixed =
# trainable; "uniform" in a run from before the causes), added the same way.
OUTCOMES_TABLE = ("CREATE TABLE IF NOT EXISTS group_outcomes (step INTEGER NOT NULL, grp INTEGER NOT NULL, "
                  "outcome TEXT, PRIMARY KEY (step, grp)) WITHOUT ROWID")
ADDED_TABLES = {"prompts": PROMPTS_TABLE, "group_outcomes": OUTCOMES_TABLE}
REQUIRED_TABLES = {"meta", "scalars", "groups", "rollouts", "events", "control"}  # + step_scores in version 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS scalars (
    step INTEGER NOT NULL, name TEXT NOT NULL, value REAL,
    PRIMARY KEY (name, step)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS scalars_step ON scalars (step);
CREATE TABLE IF NOT EXISTS groups (
    step INTEGER NOT NULL, grp INTEGER NOT NULL, prompt_id TEXT, size INTEGER,
    reward_mean REAL, reward_std REAL, trainable INTEGER, phantom INTEGER,
    PRIMARY KEY (step, grp)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER, time REAL, kind TEXT, payload TEXT);
CREATE TABLE IF NOT EXISTS control (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, kind TEXT, payload TEXT,
    status TEXT, applied_step INTEGER, message TEXT, source TEXT);
CREATE INDEX IF NOT EXISTS control_status ON control (status, id);
""" + ";\n".join((ROLLOUTS_TABLE, STEP_SCORES_TABLE, PROMPTS_TABLE, OUTCOMES_TABLE)) + ";\n"


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


_ENCODER = json.JSONEncoder(default=_json_default, allow_nan=False)


def dumps(obj: Any) -> str:
    """A meta value, event payload or request as stored: json.dumps(obj, allow_nan=False) with numpy
    scalars and arrays as numbers and lists. The encoder is built once (json.dumps builds one per
    call when given options)."""
    return _ENCODER.encode(obj)


def build_store(db: Path, meta: dict, exist_ok: bool):
    """Schema and meta go into a side file that is then linked in as run.db, so a reader
    (the runs list, a live page polling for a run just started) never opens a store
    that has no tables yet."""
    tmp = db.with_name(f".{db.name}.{os.getpid()}.{os.urandom(3).hex()}")
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # stored in the file; WAL is folded in on close
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [(k, dumps(v)) for k, v in meta.items()])
    finally:
        conn.close()
    try:
        os.link(tmp, db)  # never replaces: of two creators racing, one wins
    except FileExistsError:
        if not exist_ok:
            raise StoreError(f"run {db.parent.name!r} already exists in {db.parent.parent}") from None
    except OSError:  # a filesystem without hard links
        os.replace(tmp, db)
    finally:
        tmp.unlink(missing_ok=True)


def migrate_v1(c: sqlite3.Connection):
    """A version-1 store to version 2, inside the caller's transaction, losing nothing. Every
    step's numbers end in step_scores: a v1 store written since step_scores exists (meta
    score_blobs) holds them there already, exactly, and a step whose row holds all of its
    rollouts is kept as it is; any other step (a store made before step_scores) is built from
    its rollouts' JSON. Then rollouts is rebuilt with only its key and text."""
    c.execute(STEP_SCORES_TABLE)
    have = dict(c.execute("SELECT step, length(grp) / 4 FROM step_scores").fetchall())
    redo = [st for st, n in c.execute("SELECT step, COUNT(*) FROM rollouts GROUP BY step").fetchall()
            if have.get(st) != n]
    for st in redo:
        c.execute("DELETE FROM step_scores WHERE step = ?", (st,))
        json_scores_to_step_scores(c, c.execute("SELECT step, grp, idx, total, scores, error FROM rollouts "
                                                "WHERE step = ? ORDER BY grp, idx", (st,)).fetchall())
    c.execute("ALTER TABLE rollouts RENAME TO rollouts_v1")
    c.execute(ROLLOUTS_TABLE)
    c.execute("INSERT INTO rollouts SELECT step, grp, idx, completion FROM rollouts_v1")
    c.execute("DROP TABLE rollouts_v1")
    c.execute("DELETE FROM meta WHERE key = ?", (V1_SCORE_BLOBS,))
    c.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
              "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (dumps(SCHEMA_VERSION),))

