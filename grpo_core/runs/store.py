"""The run store: one SQLite file per run (WAL), the one contract between the
trainer process and the dashboard. This module owns the schema; nothing else
spells out a table or column.

Layout: `<runs_dir>/<run_id>/run.db` (+ config.toml, trainer.log, checkpoints/).
The trainer writes whole steps (scalars, groups, rollouts, events) in one transaction
(one step, or the steps of its last commit interval: log_steps), so a reader or a crash
never sees half a step. The dashboard only reads, and writes *requests* into `control`;
the trainer claims each pending request exactly once (a conditional UPDATE inside BEGIN
IMMEDIATE), applies it between steps and records the step it took effect or the reason
it was rejected.

Schema versions (meta schema_version): 2 keeps a rollout's numbers (total, every metric's score,
the error text) once, in step_scores, and its text in rollouts. A version-1 file (scores JSON in
rollouts, and since some point step_scores too) is migrated in place by the first open that may
write it (one transaction; nothing lost), and read as it is by a read-only open. A file newer
than SCHEMA_VERSION is refused.
"""
from __future__ import annotations

from grpo_core.errors import StoreError  # noqa: F401  (raised here; defined at the bottom)

import functools
import itertools
import json
import math
import operator
import os
import re
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from grpo_core.runs import live_settings

SCHEMA_VERSION = 2
DB_NAME = "run.db"

# Run status (meta.status). "stale" is never stored: readers derive it from the heartbeat.
CREATED, RUNNING, PAUSED, FINISHED, FAILED, STOPPED = (
    "created", "running", "paused", "finished", "failed", "stopped")
STALE = "stale"
LIVE_STATUSES = (CREATED, RUNNING, PAUSED)
STALE_AFTER_S = 10.0  # a live run whose heartbeat is older than this shows as stale

# Control request kinds (dashboard/CLI -> trainer) and statuses. The settings' kinds are defined
# with everything else about them in live_settings.py (the trainer records those in force in meta
# "settings"); the lifecycle kinds here.
PAUSE, RESUME, STOP, CHECKPOINT = "pause", "resume", "stop", "checkpoint"
CONTROL_KINDS = live_settings.KINDS + (PAUSE, RESUME, STOP, CHECKPOINT)
PENDING, APPLYING, APPLIED, REJECTED = "pending", "applying", "applied", "rejected"

# Event kinds (trainer -> readers).
EV_LIFECYCLE, EV_ALERT, EV_CHANGE, EV_REJECTED, EV_CHECKPOINT = (
    "lifecycle", "alert", "change", "rejected", "checkpoint")
EV_AUTOPILOT = "autopilot"  # a move the autopilot decided (its request id and reason)
EV_MEMORY = "memory"  # a step out of memory, retried with a smaller batch (the knob and its new value)

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

_STEP_SCORES = ("CREATE TABLE IF NOT EXISTS step_scores (\n"
                "    step INTEGER PRIMARY KEY, metrics TEXT, grp BLOB, idx BLOB, total BLOB, scores BLOB, errors TEXT)")
_ROLLOUTS = ("CREATE TABLE IF NOT EXISTS rollouts (\n"
             "    step INTEGER NOT NULL, grp INTEGER NOT NULL, idx INTEGER NOT NULL, completion TEXT,\n"
             "    PRIMARY KEY (step, grp, idx)) WITHOUT ROWID")
# Each prompt's text as the model read it (a rendered chat template), once per prompt id. Added
# after version 2 without a version bump: an older reader ignores the table, and a writable open
# of a store without it adds it.
_PROMPTS = "CREATE TABLE IF NOT EXISTS prompts (prompt_id TEXT PRIMARY KEY, text TEXT) WITHOUT ROWID"
# Why each non-trainable group taught nothing (health.group_outcomes: all solved / none solved /
# uniform; mixed = trainable), added the same way.
_OUTCOMES = ("CREATE TABLE IF NOT EXISTS group_outcomes (step INTEGER NOT NULL, grp INTEGER NOT NULL, outcome TEXT, "
             "PRIMARY KEY (step, grp)) WITHOUT ROWID")
_ADDED = {"prompts": _PROMPTS, "group_outcomes": _OUTCOMES}
_SCHEMA = """
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
""" + _ROLLOUTS + ";\n" + _STEP_SCORES + ";\n" + _PROMPTS + ";\n" + _OUTCOMES + ";\n"
# A rollout's numbers are stored once, in step_scores: one row per step with the step's rollouts
# as arrays in (group, idx) order: grp/idx little-endian int32, total and the scores float64 (exact:
# what-if under the recorded weights must give the recorded ratio; NaN: a failed metric or a
# non-finite total), metric names once (JSON list), errors as JSON [position, text] pairs.
# `rollouts` keeps one row per rollout with its text (NULL: not kept). Why this form and not the
# scores as JSON in `rollouts` (version 1 kept both): the reads that need every score of a step
# range (what-if, bottlenecks, the autopilot) take one row per step instead of one row and one
# JSON object per rollout. Measured (64 x 8 rollouts, 5 metrics, 2 loaded cores; docs/benchmarks.md,
# "Store at scale"): a 50-step window in 2-6 ms from the arrays against 88-133 ms from the JSON;
# a step's write 0.5 ms with the arrays only against 1.4 ms with the JSON only (1.4-1.6 ms both).
V1_SCORE_BLOBS = "score_blobs"  # version-1 meta key: this v1 store wrote step_scores for every step


# errno values and library messages that mean "this disk/folder takes no more writes".
_NO_WRITE_ERRNOS = {28: "no space left on device", 27: "file size limit reached", 30: "read-only file system",
                    122: "disk quota exceeded"}
_NO_WRITE_TEXT = {"no space left": "no space left on device", "file too large": "file size limit reached",
                  "database or disk is full": "disk full", "disk i/o error": "disk I/O error (disk full?)",
                  "read-only file system": "read-only file system", "readonly database": "read-only database"}


def storage_problem(exc: BaseException | None) -> str | None:
    """Why a write failed when it is the disk's fault (full, size limit, read-only,
    permissions), in a few words; None for any other error. Follows the cause chain
    (torch, safetensors and sqlite wrap the OSError in their own types)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_WRITE_ERRNOS:
            return _NO_WRITE_ERRNOS[exc.errno]
        text = str(exc).lower()
        for needle, why in _NO_WRITE_TEXT.items():
            if needle in text:
                return why
        exc = exc.__cause__ or exc.__context__
    return None


def runs_dir(path: str | os.PathLike | None = None) -> Path:
    """The runs directory: explicit path, else $GRPO_RUNS_DIR, else ./runs."""
    return Path(path or os.environ.get("GRPO_RUNS_DIR") or "runs").resolve()


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


def _dumps(obj: Any) -> str:
    """json.dumps(obj, default=_json_default, allow_nan=False), with the encoder built once
    (json.dumps builds one per call when given options: a fifth of log_step's JSON time)."""
    return _ENCODER.encode(obj)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _score_row(scores: dict, names: list[str], where: str) -> list[float]:
    try:  # None (a metric that failed) -> NaN, as the JSON null reads back
        return [np.nan if (v := scores.get(n)) is None else float(v) for n in names]
    except (TypeError, ValueError):
        bad = next(n for n in names if not isinstance(scores.get(n), (int, float, np.number, type(None))))
        raise StoreError(f"score {bad!r} of {where} is {scores[bad]!r}: a metric's score must be a number "
                         "(or None when the metric failed)") from None


GROUP_COLUMNS = ("group", "prompt_id", "size", "reward_mean", "reward_std", "trainable", "phantom")


def _group_columns(g: pd.DataFrame) -> list[list]:
    """The groups' columns as Python lists, in the table's order. Series.tolist() gives native
    ints, floats and bools; a column held as objects (numpy scalars, say) or the prompt ids
    are converted value by value."""
    cols = []
    for name, kind in zip(GROUP_COLUMNS, (int, str, int, float, float, int, int)):
        col = g[name]
        cols.append([kind(v) for v in col] if kind is str or col.dtype == object
                    else col.tolist())
    return cols


class StepGroups:
    """One step's groups as columns (the groups table's, in order), the shape a trainer has
    them in: log_step writes them without a pandas frame, whose construction and conversion
    cost more than the insert itself (docs/benchmarks.md). frame() gives the frame (the W&B
    mirror's table); g["trainable"] a column (a numpy array; prompt_id a list of str)."""

    __slots__ = GROUP_COLUMNS + ("prompt_text", "outcome")

    def __init__(self, group, prompt_id, size, reward_mean, reward_std, trainable, phantom, prompt_text=None,
                 outcome=None):
        self.group = np.asarray(group, np.int64)
        n = len(self.group)
        self.prompt_id = [str(p) for p in prompt_id]
        self.size = np.broadcast_to(np.asarray(size, np.int64), (n,))
        self.reward_mean, self.reward_std = np.asarray(reward_mean, np.float64), np.asarray(reward_std, np.float64)
        self.trainable, self.phantom = np.asarray(trainable, bool), np.asarray(phantom, bool)
        # Each prompt's text as the model read it (the store's prompts table keeps it once per prompt id).
        self.prompt_text = None if prompt_text is None else [str(p) for p in prompt_text]
        if self.prompt_text is not None and len(self.prompt_text) != n:
            raise ValueError(f"StepGroups: {len(self.prompt_text)} prompt texts for {n} groups")
        self.outcome = None if outcome is None else [str(o) for o in outcome]  # health.group_outcomes
        lengths = {c: len(self[c]) for c in GROUP_COLUMNS}
        if set(lengths.values()) != {n}:
            raise ValueError(f"StepGroups: columns of different lengths {lengths}")

    def __len__(self) -> int:
        return len(self.group)

    def __getitem__(self, name: str):
        if name not in GROUP_COLUMNS:
            raise KeyError(name)
        return getattr(self, name)

    def rows(self, step: int) -> list[tuple]:
        return list(zip([step] * len(self), self.group.tolist(), self.prompt_id, self.size.tolist(),
                        self.reward_mean.tolist(), self.reward_std.tolist(), self.trainable.tolist(),
                        self.phantom.tolist()))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({c: self[c] for c in GROUP_COLUMNS})


class StepRollouts:
    """One step's rollouts as columns, the shape a trainer has them in: log_step writes these
    without building a dict per rollout. Iterating gives the
    tuples (group, idx, total, scores dict, completion, error) that log_step also takes, so a
    consumer of tuples (the W&B mirror) needs no change.

    group, idx: int [n]; total: float [n]; scores: float [n, K] (column k is metric names[k]);
    texts, errors: n strings or None each (None text: not kept)."""

    __slots__ = ("names", "group", "idx", "total", "scores", "texts", "errors")

    def __init__(self, names, group, idx, total, scores, texts, errors):
        self.names = list(names)
        self.group, self.idx = np.asarray(group, np.int64), np.asarray(idx, np.int64)
        self.total = np.asarray(total, np.float64)
        self.scores = np.asarray(scores, np.float64).reshape(len(self.group), len(self.names))
        self.texts, self.errors = list(texts), list(errors)
        n = len(self.group)
        if not (len(self.idx) == len(self.total) == len(self.texts) == len(self.errors) == n):
            raise ValueError(f"StepRollouts: columns of different lengths (group {n}, idx {len(self.idx)}, "
                             f"total {len(self.total)}, texts {len(self.texts)}, errors {len(self.errors)})")

    def __len__(self) -> int:
        return len(self.group)

    def __iter__(self):
        names = self.names
        for g, i, t, row, text, err in zip(self.group.tolist(), self.idx.tolist(), self.total.tolist(),
                                          self.scores.tolist(), self.texts, self.errors):
            yield g, i, t, dict(zip(names, row)), text, err

    def rows(self, step: int) -> list[tuple]:
        """The rollouts table's rows (step, group, idx, text); the numbers go to step_scores."""
        return list(zip([step] * len(self), self.group.tolist(), self.idx.tolist(), self.texts))


def _write_step_scores(c: sqlite3.Connection, step: int, rollouts: list[tuple]):
    """One step's rollouts (tuples as log_step takes them) as arrays into step_scores, rows in
    (group, idx) order. A step written twice (TRL logs a step per generation batch) merges as
    INSERT OR REPLACE does in `rollouts`: the later write of a (group, idx) wins. A score that is
    None or not finite is stored as NaN (a failed metric), as StepRollouts' are."""
    old = c.execute("SELECT metrics, grp, idx, total, scores, errors FROM step_scores WHERE step = ?",
                    (step,)).fetchone()
    merged = _decode_step(*old) if old is not None else {}
    merged.update({(int(r[0]), int(r[1])): r for r in rollouts})
    rollouts = [merged[k] for k in sorted(merged)]
    dicts = [r[3] for r in rollouts]
    names = list(dicts[0])
    try:  # the trainer's case, at C speed: every rollout has the same metrics; None -> NaN
        if any(len(d) != len(names) for d in dicts):
            raise KeyError
        get = operator.itemgetter(*names) if names else (lambda d: ())  # one name: a value, the reshape copes
        scores = np.array(list(map(get, dicts)), np.float64).reshape(len(dicts), len(names))
    except (KeyError, TypeError, ValueError):
        names = list(dict.fromkeys(n for d in dicts for n in d))
        scores = np.array([_score_row(r[3], names, f"rollout (group {int(r[0])}, idx {int(r[1])}) of step {step}")
                           for r in rollouts], np.float64).reshape(len(dicts), len(names))
    if not np.isfinite(scores).all():
        scores[~np.isfinite(scores)] = np.nan
    total = np.array([np.nan if r[2] is None else r[2] for r in rollouts], np.float64)
    total[~np.isfinite(total)] = np.nan
    errors = [[pos, r[5]] for pos, r in enumerate(rollouts) if r[5] is not None]
    c.execute("INSERT OR REPLACE INTO step_scores VALUES (?, ?, ?, ?, ?, ?, ?)",
              (step, json.dumps(names), np.array([r[0] for r in rollouts], "<i4").tobytes(),
               np.array([r[1] for r in rollouts], "<i4").tobytes(), total.astype("<f8").tobytes(),
               scores.astype("<f8").tobytes(), json.dumps(errors) if errors else None))


def _insert_step_scores(c: sqlite3.Connection, step: int, r: StepRollouts):
    """StepRollouts into step_scores straight from its arrays, in few numpy calls (each costs
    microseconds on the cold caches after a backward pass). A step already there (a resumed or
    TRL run writing a step twice) merges through _write_step_scores, as tuples would."""
    # Rows in (group, idx) order, as _write_step_scores keeps them (the trainer's already are).
    key = r.group * (int(r.idx.max(initial=0)) + 1) + r.idx
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        order = np.lexsort((r.idx, r.group))
        r = StepRollouts(r.names, r.group[order], r.idx[order], r.total[order], r.scores[order],
                         [r.texts[k] for k in order], [r.errors[k] for k in order])
    total = r.total if np.isfinite(r.total).all() else np.where(np.isfinite(r.total), r.total, np.nan)
    scores = r.scores if np.isfinite(r.scores).all() else np.where(np.isfinite(r.scores), r.scores, np.nan)
    errors = [[pos, e] for pos, e in enumerate(r.errors) if e is not None]
    f8 = np.dtype("<f8")  # float64 arrays are stored as they are on a little-endian machine (no copy)
    try:
        c.execute("INSERT INTO step_scores VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (step, _names_json(tuple(r.names)), r.group.astype("<i4").tobytes(), r.idx.astype("<i4").tobytes(),
                   total.astype(f8, copy=False).tobytes(), scores.astype(f8, copy=False).tobytes(),
                   json.dumps(errors) if errors else None))
    except sqlite3.IntegrityError:  # the step is there: merge (the later write of a (group, idx) wins)
        _write_step_scores(c, step, list(r))


@functools.lru_cache(maxsize=64)
def _names_json(names: tuple) -> str:
    return json.dumps(list(names))


# Multi-row INSERT statements: one statement step inserts many rows, where executemany steps a
# one-row statement per row (~30% cheaper for a step's 64 rollouts; not for the scalars, whose
# rows land on a different page each). SQLite binds at most 32766 parameters per statement.
ROWS_PER_STATEMENT = 256


@functools.lru_cache(maxsize=64)
def _insert_sql(table: str, width: int, n: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return f"INSERT OR REPLACE INTO {table} VALUES " + ", ".join([row] * n)


def _insert_rows(c: sqlite3.Connection, table: str, rows: list[tuple]):
    """INSERT OR REPLACE rows into table, ROWS_PER_STATEMENT rows per statement. Rows apply in
    order, so a later row replaces an earlier one with the same key, as with executemany."""
    for k in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[k:k + ROWS_PER_STATEMENT]
        c.execute(_insert_sql(table, len(chunk[0]), len(chunk)), [v for row in chunk for v in row])


def _decode_step(metrics, grp, idx, total, scores, errors) -> dict:
    """A step_scores row back into {(group, idx): (group, idx, total, scores, None, error)}."""
    names = json.loads(metrics)
    g, i = np.frombuffer(grp, "<i4"), np.frombuffer(idx, "<i4")
    sc = np.frombuffer(scores, "<f8").reshape(len(g), len(names))
    err = dict(json.loads(errors)) if errors else {}
    return {(int(g[k]), int(i[k])): (int(g[k]), int(i[k]), float(total_k),
                                     {n: (None if np.isnan(v) else float(v)) for n, v in zip(names, sc[k])},
                                     None, err.get(k))
            for k, total_k in enumerate(np.frombuffer(total, "<f8"))}


def _texts_in_order(df: pd.DataFrame, texts: list[tuple]) -> list:
    """rollouts rows (step, grp, idx, completion) -> the completion of each row of df (a
    step_scores frame). Both are in (step, group, idx) order and hold the same rollouts (one
    transaction writes both), so this is the completions as they come; should they differ,
    matched by key (None where rollouts has no row)."""
    if len(texts) == len(df):
        st, gr, ix, comp = zip(*texts)
        if (np.array_equal(df["step"].to_numpy(), st) and np.array_equal(df["group"].to_numpy(), gr)
                and np.array_equal(df["idx"].to_numpy(), ix)):
            return list(comp)
    by_key = {(s, g, i): t for s, g, i, t in texts}
    return [by_key.get(k) for k in zip(df["step"].tolist(), df["group"].tolist(), df["idx"].tolist())]


def _group_only(row: tuple, group: int) -> tuple | None:
    """A step_scores row (step, metrics, grp, idx, total, scores, errors) cut to one group's
    rollouts; None when the step has none of them."""
    g = np.frombuffer(row[2], "<i4")
    keep = np.flatnonzero(g == group)
    if len(keep) == len(g):
        return row
    if not len(keep):
        return None
    scores = np.frombuffer(row[5], "<f8").reshape(len(g), len(json.loads(row[1])))
    new_pos = {int(p): n for n, p in enumerate(keep)}
    errors = [[new_pos[p], e] for p, e in json.loads(row[6]) if p in new_pos] if row[6] else []
    return (row[0], row[1], g[keep].tobytes(), np.frombuffer(row[3], "<i4")[keep].tobytes(),
            np.frombuffer(row[4], "<f8")[keep].tobytes(), scores[keep].tobytes(),
            json.dumps(errors) if errors else None)


def _blob_frame(rows: list[tuple]) -> pd.DataFrame:
    """step_scores rows (step, metrics, grp, idx, total, scores, errors) -> the frame
    RunStore.rollouts(with_text=False) returns: a few concatenations, no per-rollout Python."""
    n = np.array([len(r[2]) // 4 for r in rows])
    start = np.concatenate([[0], np.cumsum(n)[:-1]])
    df = pd.DataFrame({
        "step": np.repeat(np.array([r[0] for r in rows], np.int64), n),
        "group": np.frombuffer(b"".join(r[2] for r in rows), "<i4").astype(np.int64),
        "idx": np.frombuffer(b"".join(r[3] for r in rows), "<i4").astype(np.int64),
        "total": np.frombuffer(b"".join(r[4] for r in rows), "<f8").astype(np.float64)})
    error = np.full(len(df), None, dtype=object)
    for r, s in zip(rows, start):
        if r[6]:
            for pos, msg in json.loads(r[6]):
                error[s + pos] = msg
    df["error"] = error
    metric_sets = {r[1] for r in rows}
    if len(metric_sets) == 1:  # what a trainer writes: the same metrics every step
        names = json.loads(rows[0][1])
        sc = np.frombuffer(b"".join(r[5] for r in rows), "<f8").reshape(len(df), len(names)).astype(np.float64)
    else:  # the union, in order of first appearance (as the JSON path builds it)
        per_row = [json.loads(r[1]) for r in rows]
        names = list(dict.fromkeys(m for ms in per_row for m in ms))
        sc = np.full((len(df), len(names)), np.nan)
        for r, ms, s, k in zip(rows, per_row, start, n):
            if ms:
                sc[s:s + k, [names.index(m) for m in ms]] = np.frombuffer(r[5], "<f8").reshape(k, len(ms))
    return pd.concat([df, pd.DataFrame(sc, columns=names)], axis=1)


_ENCODER = json.JSONEncoder(default=_json_default, allow_nan=False)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None  # math, not numpy: ~20x cheaper on one float (45 per step)


def _build_store(db: Path, meta: dict, exist_ok: bool):
    """Schema and meta go into a side file that is then linked in as run.db, so a reader
    (the runs list, a live page polling for a run just started) never opens a store
    that has no tables yet."""
    tmp = db.with_name(f".{db.name}.{os.getpid()}.{os.urandom(3).hex()}")
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # stored in the file; WAL is folded in on close
        conn.executescript(_SCHEMA)
        conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [(k, _dumps(v)) for k, v in meta.items()])
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


def _json_scores_to_step_scores(c: sqlite3.Connection, rows: list[tuple]):
    """Version-1 rollouts rows (step, grp, idx, total, scores JSON, error), in (step, grp, idx)
    order, into step_scores: a migration's steps, and a read-only open's TEMP table."""
    for step, rs in itertools.groupby(rows, key=operator.itemgetter(0)):
        _write_step_scores(c, step, [(g, i, t, json.loads(sc) if sc else {}, None, e) for _, g, i, t, sc, e in rs])


def _migrate_v1(c: sqlite3.Connection):
    """A version-1 store to version 2, inside the caller's transaction, losing nothing. Every
    step's numbers end in step_scores: a v1 store written since step_scores exists (meta
    score_blobs) holds them there already, exactly, and a step whose row holds all of its
    rollouts is kept as it is; any other step (a store made before step_scores) is built from
    its rollouts' JSON. Then rollouts is rebuilt with only its key and text."""
    c.execute(_STEP_SCORES)
    have = dict(c.execute("SELECT step, length(grp) / 4 FROM step_scores").fetchall())
    redo = [st for st, n in c.execute("SELECT step, COUNT(*) FROM rollouts GROUP BY step").fetchall()
            if have.get(st) != n]
    for st in redo:
        c.execute("DELETE FROM step_scores WHERE step = ?", (st,))
        _json_scores_to_step_scores(c, c.execute("SELECT step, grp, idx, total, scores, error FROM rollouts "
                                                 "WHERE step = ? ORDER BY grp, idx", (st,)).fetchall())
    c.execute("ALTER TABLE rollouts RENAME TO rollouts_v1")
    c.execute(_ROLLOUTS)
    c.execute("INSERT INTO rollouts SELECT step, grp, idx, completion FROM rollouts_v1")
    c.execute("DROP TABLE rollouts_v1")
    c.execute("DELETE FROM meta WHERE key = ?", (V1_SCORE_BLOBS,))
    c.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
              "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (_dumps(SCHEMA_VERSION),))


def _live_elsewhere(meta: dict) -> bool:
    """Another process may be writing this store now (its status is live and its pid or
    heartbeat says so): an older grpo_core mid-run, whose version-1 writes a migration would break."""
    pid = meta.get("pid")
    if pid == os.getpid():
        return False
    shown = display_status(meta)
    return shown in (RUNNING, PAUSED) or (shown == CREATED and bool(pid))


class RunStore:
    """One run's SQLite file. Cheap to open; one instance per process/thread."""

    def __init__(self, db_path: str | os.PathLike, *, create: bool = False, readonly: bool = False):
        self.path = Path(db_path)
        self.run_dir = self.path.parent
        self.run_id = self.run_dir.name
        self.version = SCHEMA_VERSION  # 1: a version-1 file opened without migrating it (see _check)
        self._json_scores = False  # such a file made before step_scores: its scores are read from the JSON
        self._readonly = readonly
        if not create and not self.path.is_file():
            raise StoreError(f"no run store at {self.path}")
        try:
            if readonly:
                uri = f"file:{self.path}?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None,
                                            check_same_thread=False)
            else:
                self.conn = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                            check_same_thread=False)
                self.conn.execute("PRAGMA journal_mode=WAL")
                self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoint, never corrupt
            self.conn.execute("PRAGMA busy_timeout=30000")
            self._check(create, readonly)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path} is not a readable run store: {e}") from None

    # ---- lifecycle ---------------------------------------------------------------
    @classmethod
    def create(cls, run_id: str, config: dict, *, root: str | os.PathLike | None = None,
               kind: str = "train", exist_ok: bool = False) -> "RunStore":
        run_dir = runs_dir(root) / check_run_id(run_id)
        if (run_dir / DB_NAME).exists() and not exist_ok:
            raise StoreError(f"run {run_id!r} already exists in {run_dir.parent}")
        meta = dict(schema_version=SCHEMA_VERSION, config=config, status=CREATED,
                    kind=kind, created=time.time(), run_id=run_id)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            if not (run_dir / DB_NAME).exists():
                _build_store(run_dir / DB_NAME, meta, exist_ok)
        except (OSError, sqlite3.Error) as e:  # runs dir read-only, full, or a file: one line, not a traceback
            raise StoreError(f"cannot create run {run_id!r} in {run_dir.parent}: "
                             f"{storage_problem(e) or getattr(e, 'strerror', None) or e}; the runs dir must be "
                             "a writable folder (--runs-dir or $GRPO_RUNS_DIR)") from None
        store = cls(run_dir / DB_NAME, create=True)
        if store.get_meta().get("schema_version") is None:
            store.set_meta(**meta)
        return store

    @classmethod
    def open(cls, run: str | os.PathLike, readonly: bool = False) -> "RunStore":
        return cls(resolve_db(run), readonly=readonly)

    def _tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table'")}

    def _rollout_columns(self) -> list[str]:
        return [r[1] for r in self.conn.execute("PRAGMA main.table_info(rollouts)")]

    def _check(self, create: bool, readonly: bool):
        """The file is a run store of a version this code reads. A version-1 file is migrated to
        version 2 (_migrate_v1, one transaction) by an open that may write it, unless another
        process is writing it now (an older trainer mid-run); otherwise (read-only) it is read
        as it is: step_scores where it has them, else the scores JSON (see rollouts)."""
        tables = self._tables()
        if "meta" in tables:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = json.loads(row[0]) if row and row[0] else None
            if isinstance(version, int) and version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} is a version-{version} run store, newer than this grpo_core reads "
                                 f"(versions 1 to {SCHEMA_VERSION}): open it with the grpo_core that wrote it")
        if create:
            self.conn.executescript(_SCHEMA)
            tables = self._tables()
        missing = {"meta", "scalars", "groups", "rollouts", "events", "control"} - tables
        if "scores" not in self._rollout_columns():  # version 2
            missing |= {"step_scores"} - tables
        if missing:
            raise StoreError(f"{self.path} is not a run store (missing tables: {', '.join(sorted(missing))})")
        for table, sql in _ADDED.items() if not readonly else ():
            if table not in tables:
                self.conn.execute(sql)
        if "scores" not in self._rollout_columns():
            return
        meta = self.get_meta()
        if readonly or _live_elsewhere(meta):
            self.version = 1
            self._json_scores = not (meta.get(V1_SCORE_BLOBS) and "step_scores" in tables)
            return
        try:
            with self.transaction() as c:
                if "scores" in self._rollout_columns():  # not migrated by another process meanwhile
                    _migrate_v1(c)
        except (sqlite3.Error, StoreError) as e:
            raise StoreError(f"cannot migrate {self.path} from store version 1 to {SCHEMA_VERSION} (it is left "
                             f"as it was): {storage_problem(e) or e}") from None

    def _check_writes_steps(self):
        if self.version < SCHEMA_VERSION:
            why = (f"another process (pid {self.get_meta().get('pid')}) is writing it" if not self._readonly
                   else "opened read-only")
            raise StoreError(f"{self.path} is a version-{self.version} run store not migrated ({why}): this "
                             f"grpo_core writes steps in version {SCHEMA_VERSION} only; open it for writing once no "
                             "older process writes it, which migrates it")

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextmanager
    def transaction(self):
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, all or nothing."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        try:
            self.conn.execute("COMMIT")
        except BaseException:  # e.g. disk full at COMMIT: never leave the connection mid-transaction
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    # ---- meta --------------------------------------------------------------------
    def set_meta(self, **values):
        rows = [(k, _dumps(v)) for k, v in values.items()]
        with self.transaction() as c:
            c.executemany("INSERT INTO meta(key, value) VALUES (?, ?) "
                          "ON CONFLICT(key) DO UPDATE SET value = excluded.value", rows)

    def get_meta(self) -> dict:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def set_status(self, status: str, error: str | None = None, **extra):
        values = {"status": status, "status_time": time.time(), **extra}
        if error is not None:
            values["error"] = error
        self.set_meta(**values)

    def heartbeat(self, **extra):
        self.set_meta(heartbeat=time.time(), **extra)

    # ---- WAL checkpoints off the writer's path ------------------------------------------
    def defer_checkpoints(self, defer: bool = True):
        """defer: this connection's commits never fold the WAL into the db (SQLite does it
        in the commit that crosses 1000 pages, an fsync'd copy the trainer would wait for);
        another connection calls checkpoint() instead. False: SQLite's default again."""
        self.conn.execute(f"PRAGMA wal_autocheckpoint={0 if defer else 1000}")

    def checkpoint(self) -> tuple[int, int]:
        """Fold what it can of the WAL into the db without blocking writers or readers
        (PASSIVE). Returns (WAL frames, frames checkpointed)."""
        _, log, done = self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(log), int(done)

    @property
    def config(self) -> dict:
        return self.run_meta().config

    def run_meta(self) -> RunMeta:
        return RunMeta.parse(self.get_meta())

    # ---- the trainer's write: whole steps, one transaction ---------------------------
    def log_step(self, step: int, scalars: dict[str, float], groups: pd.DataFrame | StepGroups | None = None,
                 rollouts: Iterable[tuple] | StepRollouts | None = None, events: Iterable[tuple[str, dict]] = ()):
        """Write step `step` atomically.

        groups: frame with columns group, prompt_id, size, reward_mean, reward_std, trainable, phantom,
            or a StepGroups (the same, as columns).
        rollouts: tuples (group, idx, total, scores: dict, completion: str|None, error: str|None),
            or a StepRollouts (the same, as columns).
        events: (kind, payload) pairs.
        """
        self.log_steps([(step, scalars, groups, rollouts, events)])

    def log_steps(self, steps: list[tuple]):
        """Several whole steps, each (step, scalars, groups, rollouts, events[, time of its
        events]) as log_step takes them, in one transaction: one commit, and one WAL copy of
        the pages the steps share, instead of one per step. A reader sees all or none."""
        self._check_writes_steps()
        now = time.time()
        with self.transaction() as c:
            for step, scalars, groups, rollouts, events, *when in steps:
                self._write_step(c, step, scalars, groups, rollouts, events, when[0] if when else now)
            c.execute("INSERT INTO meta(key, value) VALUES ('heartbeat', ?) "
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (_dumps(now),))

    def _write_step(self, c, step, scalars, groups, rollouts, events, now):
        c.executemany("INSERT OR REPLACE INTO scalars(step, name, value) VALUES (?, ?, ?)",
                      [(step, k, _finite(v)) for k, v in scalars.items()])
        if groups is not None and len(groups):
            c.executemany("INSERT OR REPLACE INTO groups VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          groups.rows(step) if isinstance(groups, StepGroups)
                          else zip([step] * len(groups), *_group_columns(groups)))
            if isinstance(groups, StepGroups) and groups.prompt_text is not None:
                c.executemany("INSERT OR IGNORE INTO prompts VALUES (?, ?)", zip(groups.prompt_id, groups.prompt_text))
            if isinstance(groups, StepGroups) and groups.outcome is not None:
                c.executemany("INSERT OR REPLACE INTO group_outcomes VALUES (?, ?, ?)",
                              zip([step] * len(groups), groups.group.tolist(), groups.outcome))
        if isinstance(rollouts, StepRollouts):  # the trainer's columns: no dict per rollout
            if len(rollouts):
                _insert_rows(c, "rollouts", rollouts.rows(step))
                _insert_step_scores(c, step, rollouts)
        elif rollouts is not None:
            rollouts = list(rollouts)
            if rollouts:
                _insert_rows(c, "rollouts", [(step, int(r[0]), int(r[1]), r[4]) for r in rollouts])
                _write_step_scores(c, step, rollouts)
        if events:
            c.executemany("INSERT INTO events(step, time, kind, payload) VALUES (?, ?, ?, ?)",
                          [(step, now, kind, _dumps(p)) for kind, p in events])

    def add_event(self, kind: str, payload: dict, step: int | None = None) -> int:
        with self.transaction() as c:
            cur = c.execute("INSERT INTO events(step, time, kind, payload) VALUES (?, ?, ?, ?)",
                            (step, time.time(), kind, _dumps(payload)))
            return cur.lastrowid

    def truncate_after(self, step: int) -> int:
        """Delete scalars, groups and rollouts of steps > `step` (a resumed run redoes the steps
        after its checkpoint; events and control history stay). Returns the steps dropped."""
        self._check_writes_steps()
        with self.transaction() as c:
            n = c.execute("SELECT COUNT(DISTINCT step) FROM scalars WHERE step > ?", (step,)).fetchone()[0]
            for table in ("scalars", "groups", "rollouts", "step_scores", "group_outcomes"):
                c.execute(f"DELETE FROM {table} WHERE step > ?", (step,))
        return int(n)

    # ---- reads (incremental: "what changed since step N") -----------------------------
    def last_step(self) -> int | None:
        row = self.conn.execute("SELECT MAX(step) FROM scalars").fetchone()
        return row[0]

    def scalars(self, since_step: int = -1, names: list[str] | None = None,
                until_step: int | None = None) -> pd.DataFrame:
        """Long frame (step, name, value) for steps > since_step."""
        q = "SELECT step, name, value FROM scalars WHERE step > ?"
        args: list = [since_step]
        if until_step is not None:
            q += " AND step <= ?"
            args.append(until_step)
        if names:
            q += f" AND name IN ({','.join('?' * len(names))})"
            args += list(names)
        return pd.read_sql_query(q + " ORDER BY step", self.conn, params=args)

    def scalars_wide(self, since_step: int = -1, names: list[str] | None = None,
                     until_step: int | None = None) -> pd.DataFrame:
        """One row per step, one column per metric name (index: step). One index range read per
        name (the (name, step) key): numbers only reach Python, never a name string per row,
        and no pivot (2-3x faster than a long read + pivot for a live page's reads)."""
        rng, args = "step > ?", [since_step]
        if until_step is not None:
            rng += " AND step <= ?"
            args.append(until_step)
        if not names:  # every name (as scalars()); a bounded range: from the step index, not a pass over all
            src = "scalars" if since_step < 0 and until_step is None else "scalars INDEXED BY scalars_step"
            names = [r[0] for r in self.conn.execute(f"SELECT DISTINCT name FROM {src} WHERE {rng}", args)]
        parts = []
        for name in sorted(set(names)):
            rows = self.conn.execute(f"SELECT step, value FROM scalars WHERE name = ? AND {rng} ORDER BY step",
                                     [name, *args]).fetchall()
            if rows:
                st, v = zip(*rows)
                parts.append((name, np.array(st, np.int64), np.array(v, np.float64)))
        if not parts:
            return pd.DataFrame(index=pd.Index([], name="step", dtype="int64"))
        index = np.unique(np.concatenate([p[1] for p in parts]))
        cols = {}
        for name, st, v in parts:
            cols[name] = np.full(len(index), np.nan)
            cols[name][np.searchsorted(index, st)] = v
        df = pd.DataFrame(cols, index=pd.Index(index, name="step"))
        df.columns.name = "name"  # as the pivot it replaces
        return df

    def groups(self, since_step: int = -1, until_step: int | None = None,
               steps: list[int] | None = None) -> pd.DataFrame:
        """steps: only these steps (an index lookup per step; a large run's report reads a sample)."""
        with_outcome = "group_outcomes" in self._tables()
        q = ('SELECT g.step, g.grp AS "group", prompt_id, size, reward_mean, reward_std, trainable, phantom'
             + (", o.outcome FROM groups g LEFT JOIN group_outcomes o ON o.step = g.step AND o.grp = g.grp"
                if with_outcome else ", NULL AS outcome FROM groups g") + " WHERE g.step > ?")
        args: list = [since_step]
        if until_step is not None:
            q += " AND g.step <= ?"
            args.append(until_step)
        if steps is not None:
            q += f" AND g.step IN ({','.join('?' * len(steps))})"
            args += [int(x) for x in steps]
        df = pd.read_sql_query(q + " ORDER BY g.step, g.grp", self.conn, params=args)
        df["trainable"] = df["trainable"].astype(bool)
        df["phantom"] = df["phantom"].astype(bool)
        return df

    def prompt_texts(self, prompt_ids: list[str]) -> dict[str, str]:
        """prompt id -> the text the model was prompted with (a store from before the prompts
        table, or a trainer that logs none: {})."""
        if "prompts" not in self._tables() or not prompt_ids:
            return {}
        marks = ",".join("?" * len(prompt_ids))
        return dict(self.conn.execute(f"SELECT prompt_id, text FROM prompts WHERE prompt_id IN ({marks})",
                                      [str(p) for p in prompt_ids]).fetchall())

    def rollouts(self, since_step: int = -1, until_step: int | None = None,
                 step: int | None = None, group: int | None = None, with_text: bool = True,
                 steps: list[int] | None = None) -> pd.DataFrame:
        """Frame (step, group, idx, total, error[, completion], <metric>...), rows in (step, group,
        idx) order, one float column per metric (NaN: a failed metric, or one a rollout lacks):
        the numbers from step_scores (one row per step), the texts from rollouts. steps: only
        these steps (index lookups); group: that group's rows."""
        where, args = "step > ?", [since_step]
        for cond, val in (("step <= ?", until_step), ("step = ?", step)):
            if val is not None:
                where += f" AND {cond}"
                args.append(val)
        if steps is not None:
            where += f" AND step IN ({','.join('?' * len(steps))})"
            args += [int(x) for x in steps]
        with self._snapshot():  # the numbers and the texts of the same commit
            if self._json_scores:
                self._temp_step_scores(where, args)
            rows = self.conn.execute("SELECT step, metrics, grp, idx, total, scores, errors FROM step_scores "
                                     f"WHERE {where} ORDER BY step", args).fetchall()
            texts = self.conn.execute(f"SELECT step, grp, idx, completion FROM rollouts WHERE {where}"
                                      + (" AND grp = ?" if group is not None else "") + " ORDER BY step, grp, idx",
                                      args + ([group] if group is not None else [])).fetchall() if with_text else []
        if group is not None:  # the frame is built from the group's rollouts only (its metrics, its errors)
            rows = [r for r in (_group_only(r, group) for r in rows) if r is not None]
        df = _blob_frame(rows) if rows else None
        if df is None or df.empty:
            cols = ("step", "group", "idx", "total", "error") + (("completion",) if with_text else ())
            return pd.DataFrame({c: pd.Series(dtype="int64" if c in ("step", "group", "idx") else
                                              "float64" if c == "total" else object) for c in cols})
        if with_text:
            df.insert(5, "completion", _texts_in_order(df, texts))
        return df

    @contextmanager
    def _snapshot(self):
        """Reads inside one read transaction (WAL: one commit's view, no lock on writers)."""
        if self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN")
        try:
            yield
        finally:
            if self.conn.in_transaction:
                self.conn.execute("COMMIT")

    def _temp_step_scores(self, where: str, args: list):
        """A version-1 store made before step_scores, opened without migrating (read-only): the
        steps of this read, from their scores JSON into a TEMP step_scores (this connection's
        only), which the read then takes as a version-2 store's. Made again for each read, so a
        step an older writer adds or completes meanwhile is read as it is now."""
        c = self.conn
        if "scores" not in self._rollout_columns():  # a writer migrated the file meanwhile: its step_scores
            c.execute("DROP TABLE IF EXISTS temp.step_scores")
            self._json_scores, self.version = False, SCHEMA_VERSION
            return
        c.execute(_STEP_SCORES.replace("step_scores", "temp.step_scores", 1))
        c.execute("DELETE FROM temp.step_scores")
        _json_scores_to_step_scores(c, c.execute("SELECT step, grp, idx, total, scores, error FROM rollouts "
                                                 f"WHERE {where} ORDER BY step, grp, idx", args).fetchall())

    def rollout_extent(self) -> tuple[int | None, int | None, int]:
        """(first step, last step, rollouts at the last step) from the primary key alone:
        how big a run's rollouts are, without counting ten million rows."""
        # Two queries: SQLite answers a lone MIN() or MAX() from the index, not both in one.
        lo = self.conn.execute("SELECT MIN(step) FROM rollouts").fetchone()[0]
        hi = self.conn.execute("SELECT MAX(step) FROM rollouts").fetchone()[0]
        n = self.conn.execute("SELECT COUNT(*) FROM rollouts WHERE step = ?", (hi,)).fetchone()[0] if hi is not None else 0
        return lo, hi, int(n)

    def events(self, since_id: int = 0, kinds: list[str] | None = None) -> pd.DataFrame:
        q, args = "SELECT id, step, time, kind, payload FROM events WHERE id > ?", [since_id]
        if kinds:
            q += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        df = pd.read_sql_query(q + " ORDER BY id", self.conn, params=args)
        df["payload"] = [json.loads(p) if p else {} for p in df["payload"]]
        return df

    # ---- control: requests, applied exactly once ------------------------------------------
    def request(self, kind: str, payload: dict | None = None, source: str = "ui") -> int:
        if kind not in CONTROL_KINDS:
            raise StoreError(f"unknown control kind {kind!r}; kinds are: {', '.join(CONTROL_KINDS)}")
        status = self.get_meta().get("status")
        if status in (FINISHED, FAILED, STOPPED):
            raise StoreError(f"run {self.run_id} is {status}: control requests apply only to a live run")
        with self.transaction() as c:
            cur = c.execute("INSERT INTO control(time, kind, payload, status, source) VALUES (?, ?, ?, ?, ?)",
                            (time.time(), kind, _dumps(payload or {}), PENDING, source))
            return cur.lastrowid

    def has_pending(self) -> bool:
        """A pending control request exists: one indexed read, no write lock (so a trainer can
        ask every step without waiting behind another writer's transaction)."""
        return self.conn.execute("SELECT 1 FROM control WHERE status = ? LIMIT 1", (PENDING,)).fetchone() is not None

    def claim_pending(self) -> list[dict]:
        """Take every pending request (in id order) for applying. Two claimers racing for
        the same rows: the conditional UPDATE lets exactly one of them have each row."""
        with self.transaction() as c:
            rows = c.execute("SELECT id, time, kind, payload, source FROM control "
                             "WHERE status = ? ORDER BY id", (PENDING,)).fetchall()
            claimed = []
            for rid, t, kind, payload, source in rows:
                if c.execute("UPDATE control SET status = ? WHERE id = ? AND status = ?",
                             (APPLYING, rid, PENDING)).rowcount == 1:
                    claimed.append({"id": rid, "time": t, "kind": kind,
                                    "payload": json.loads(payload), "source": source})
        return claimed

    def resolve_request(self, request_id: int, applied: bool, step: int | None, message: str = ""):
        """Mark a claimed request applied at `step` or rejected with `message`, and log the event."""
        status = APPLIED if applied else REJECTED
        with self.transaction() as c:
            n = c.execute("UPDATE control SET status = ?, applied_step = ?, message = ? "
                          "WHERE id = ? AND status = ?", (status, step, message, request_id, APPLYING)).rowcount
            if n != 1:
                raise StoreError(f"control request {request_id} was not claimed (already resolved?)")
            kind, payload, source = c.execute("SELECT kind, payload, source FROM control WHERE id = ?",
                                              (request_id,)).fetchone()
            c.execute("INSERT INTO events(step, time, kind, payload) VALUES (?, ?, ?, ?)",
                      (step, time.time(), EV_CHANGE if applied else EV_REJECTED,
                       _dumps({"request_id": request_id, "kind": kind, "request": json.loads(payload),
                               "source": source, "message": message})))

    def reject_open_requests(self, reason: str):
        """On run end: nothing stays pending forever."""
        with self.transaction() as c:
            c.execute("UPDATE control SET status = ?, message = ? WHERE status IN (?, ?)",
                      (REJECTED, reason, PENDING, APPLYING))

    def control(self, since_id: int = 0) -> pd.DataFrame:
        df = pd.read_sql_query("SELECT id, time, kind, payload, status, applied_step, message, source "
                               "FROM control WHERE id > ? ORDER BY id", self.conn, params=[since_id])
        df["payload"] = [json.loads(p) if p else {} for p in df["payload"]]
        return df

    def changes(self) -> pd.DataFrame:
        """Applied changes (weights/threshold/difficulty/...): step + request, for chart markers."""
        ev = self.events(kinds=[EV_CHANGE])
        if ev.empty:
            return pd.DataFrame(columns=["step", "kind", "request", "source", "message"])
        return pd.DataFrame({"step": ev["step"], "kind": [p["kind"] for p in ev["payload"]],
                             "request": [p["request"] for p in ev["payload"]],
                             "source": [p.get("source") for p in ev["payload"]],
                             "message": [p.get("message", "") for p in ev["payload"]]})

    # ---- reads for long runs (dashboard): bounded, index-driven ---------------------------------
    def scalar_names(self, step: int | None = None) -> list[str]:
        """Names logged at `step` (default: the last step); uses the step index, so it
        stays cheap on a 20,000-step run where SELECT DISTINCT would scan everything."""
        step = self.last_step() if step is None else step
        if step is None:
            return []
        return [r[0] for r in self.conn.execute("SELECT name FROM scalars WHERE step = ? ORDER BY name", (step,))]

    def scalars_binned(self, names: list[str], bin_size: int, until_step: int,
                       since_step: int = -1) -> pd.DataFrame:
        """Long frame (bin, name, total, count): SUM and COUNT of non-null values per
        bin = step // bin_size over since_step < step <= until_step, one (name, step) index
        range per name. Lets a chart show a long history with bounded memory. Per name, not
        one GROUP BY name, bin: SQLite sorts the groups in a temp b-tree either way, and many
        small ones cost half of one big one (20,000 steps x 41 names: 0.68 s against 1.31 s)."""
        cols = ["bin", "name", "total", "count"]
        if not names:
            return pd.DataFrame(columns=cols)
        q = ("SELECT step / ? AS bin, SUM(value), COUNT(value) FROM scalars "
             "WHERE name = ? AND step > ? AND step <= ? GROUP BY bin")
        rows = [(b, name, t, c) for name in sorted(set(names))
                for b, t, c in self.conn.execute(q, (int(bin_size), name, since_step, until_step))]
        if not rows:
            return pd.DataFrame(columns=cols)
        b, name, t, c = zip(*rows)
        return pd.DataFrame({"bin": np.array(b, np.int64), "name": list(name), "total": np.array(t, np.float64),
                             "count": np.array(c, np.int64)})


# ---- the runs index ---------------------------------------------------------------------
def pid_alive(pid: int | None) -> bool:
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

    @classmethod
    def parse(cls, meta: dict) -> "RunMeta":
        accepts = meta.get("accepts")
        return cls(meta.get("status"), meta.get("kind") or "train", meta.get("source") or "grpo_core",
                   meta.get("config") or {}, meta.get("settings") or {},
                   None if accepts is None else tuple(accepts))

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


def steps_budget(meta: dict) -> int | None:
    return RunMeta.parse(meta).steps_budget


def status_label(status: str, stop_reason: str | None) -> str:
    """'stopped (autopilot)' for a run the autopilot stopped (meta stop_reason), else the status."""
    return f"{status} ({stop_reason})" if status == STOPPED and stop_reason == "autopilot" else status


def list_runs(root: str | os.PathLike | None = None) -> pd.DataFrame:
    """Every run under the runs dir: id, status (incl. stale/unreadable), last step, steps,
    heartbeat, created, error. An unreadable store is listed with the reason, never raised."""
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
                           error=meta.get("error"), source=parsed.source,
                           stop_reason=meta.get("stop_reason"))
        except (StoreError, sqlite3.DatabaseError, ValueError) as e:
            row.update(status="unreadable", error=str(e))
        rows.append(row)
    cols = ["run_id", "status", "last_step", "steps", "kind", "created", "heartbeat", "error", "source", "path",
            "stop_reason"]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values("created", ascending=False, na_position="last").reset_index(drop=True)
