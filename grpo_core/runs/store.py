"""RunStore: one run's SQLite file (WAL), the contract between the trainer and the dashboard.

What it holds here: opening a store, its meta, whole-step writes and the control requests; its
reads are in reads.py (RunReads), its tables in schema.py, where runs live in locations.py.

The trainer writes whole steps (scalars, groups, rollouts, events) in one transaction
(one step, or the steps of its last commit interval: log_steps), so a reader or a crash
never sees half a step. The dashboard only reads, and writes *requests* into `control`;
the trainer claims each pending request exactly once (a conditional UPDATE inside BEGIN
IMMEDIATE), applies it between steps and records the step it took effect or the reason
it was rejected.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable

import pandas as pd

from grpo_core.errors import StoreError, one_line
from grpo_core.runs.live_settings import CONTROL_KINDS
from grpo_core.runs.locations import check_run_id, resolve_db, runs_dir, storage_problem
from grpo_core.runs.reads import RunReads
from grpo_core.runs.run_meta import CREATED, FAILED, FINISHED, PAUSED, RUNNING, STOPPED, RunMeta, display_status
from grpo_core.runs.schema import (
    ADDED_TABLES,
    DB_NAME,
    REQUIRED_TABLES,
    SCHEMA,
    SCHEMA_VERSION,
    V1_SCORE_BLOBS,
    build_store,
    dumps,
    migrate_v1,
)
from grpo_core.runs.step_columns import StepGroups, StepRollouts, group_columns
from grpo_core.runs.step_scores import insert_rows, insert_step_scores, write_step_scores

# A control request's statuses; its kinds (the settings and the lifecycle requests) are live_settings'.
PENDING, APPLYING, APPLIED, REJECTED = "pending", "applying", "applied", "rejected"

# Event kinds (trainer -> readers).
EV_LIFECYCLE, EV_ALERT, EV_CHANGE, EV_REJECTED, EV_CHECKPOINT = (
    "lifecycle", "alert", "change", "rejected", "checkpoint")
EV_AUTOPILOT = "autopilot"  # a move the autopilot decided (its request id and reason)
EV_MEMORY = "memory"  # a step out of memory, retried with a smaller batch (the knob and its new value)


def _finite(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None  # math, not numpy: far cheaper on one float


def _live_elsewhere(meta: dict) -> bool:
    """Another process may be writing this store now (its status is live and its pid or
    heartbeat says so): an older grpo_core mid-run, whose version-1 writes a migration would break."""
    pid = meta.get("pid")
    if pid == os.getpid():
        return False
    shown = display_status(meta)
    return shown in (RUNNING, PAUSED) or (shown == CREATED and bool(pid))


class RunStore(RunReads):
    """One run's SQLite file. Cheap to open; one instance per process/thread."""

    def __init__(self, db_path: str | os.PathLike, *, create: bool = False, readonly: bool = False):
        self.path = Path(db_path)
        self.run_dir = self.path.parent
        self.run_id = self.run_dir.name
        self.version = SCHEMA_VERSION  # 1: a version-1 file opened without migrating it (see _check)
        self.scores_from_json = False  # such a file made before step_scores: its scores are read from the JSON
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
                build_store(run_dir / DB_NAME, meta, exist_ok)
        except (OSError, sqlite3.Error) as e:  # runs dir read-only, full, or a file: one line, not a traceback
            raise StoreError(f"cannot create run {run_id!r} in {run_dir.parent}: "
                             f"{storage_problem(e) or getattr(e, 'strerror', None) or e}; the runs dir must be "
                             "a writable folder (--runs-dir or $GRPO_HEALTH_RUNS_DIR)") from None
        store = cls(run_dir / DB_NAME, create=True)
        if store.get_meta().get("schema_version") is None:
            store.set_meta(**meta)
        return store

    @classmethod
    def open(cls, run: str | os.PathLike, readonly: bool = False) -> "RunStore":
        return cls(resolve_db(run), readonly=readonly)

    def _check(self, create: bool, readonly: bool):
        """The file is a run store of a version this code reads. A version-1 file is migrated to
        version 2 (migrate_v1, one transaction) by an open that may write it, unless another
        process is writing it now (an older trainer mid-run); otherwise (read-only) it is read
        as it is: step_scores where it has them, else the scores JSON (see rollouts)."""
        tables = self.tables()
        if "meta" in tables:
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = json.loads(row[0]) if row and row[0] else None
            if isinstance(version, int) and version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} is a version-{version} run store, newer than this grpo_core reads "
                                 f"(versions 1 to {SCHEMA_VERSION}): open it with the grpo_core that wrote it")
        if create:
            self.conn.executescript(SCHEMA)
            tables = self.tables()
        missing = REQUIRED_TABLES - tables
        if "scores" not in self.rollout_columns():  # version 2
            missing |= {"step_scores"} - tables
        if missing:
            raise StoreError(f"{self.path} is not a run store (missing tables: {', '.join(sorted(missing))})")
        for table, sql in ADDED_TABLES.items() if not readonly else ():
            if table not in tables:
                self.conn.execute(sql)
        if "scores" not in self.rollout_columns():
            return
        meta = self.get_meta()
        if readonly or _live_elsewhere(meta):
            self.version = 1
            self.scores_from_json = not (meta.get(V1_SCORE_BLOBS) and "step_scores" in tables)
            return
        try:
            with self.transaction() as c:
                if "scores" in self.rollout_columns():  # not migrated by another process meanwhile
                    migrate_v1(c)
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
        rows = [(k, dumps(v)) for k, v in values.items()]
        with self.transaction() as c:
            c.executemany("INSERT INTO meta(key, value) VALUES (?, ?) "
                          "ON CONFLICT(key) DO UPDATE SET value = excluded.value", rows)

    def get_meta(self) -> dict:
        return {k: json.loads(v) for k, v in self.conn.execute("SELECT key, value FROM meta")}

    def set_status(self, status: str, error: str | None = None, **extra):
        """Status and, when given, the run's error: stored as one line whatever the writer hands
        over (errors.one_line: a traceback's last line); the traceback belongs in the run's log."""
        values = {"status": status, "status_time": time.time(), **extra}
        if error is not None:
            values["error"] = one_line(error)
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
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (dumps(now),))

    def _write_step(self, c, step, scalars, groups, rollouts, events, now):
        c.executemany("INSERT OR REPLACE INTO scalars(step, name, value) VALUES (?, ?, ?)",
                      [(step, k, _finite(v)) for k, v in scalars.items()])
        if groups is not None and len(groups):
            c.executemany("INSERT OR REPLACE INTO groups VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          groups.rows(step) if isinstance(groups, StepGroups)
                          else zip([step] * len(groups), *group_columns(groups)))
            if isinstance(groups, StepGroups) and groups.prompt_text is not None:
                c.executemany("INSERT OR IGNORE INTO prompts VALUES (?, ?)", zip(groups.prompt_id, groups.prompt_text))
            if isinstance(groups, StepGroups) and groups.outcome is not None:
                c.executemany("INSERT OR REPLACE INTO group_outcomes VALUES (?, ?, ?)",
                              zip([step] * len(groups), groups.group.tolist(), groups.outcome))
        if isinstance(rollouts, StepRollouts):  # the trainer's columns: no dict per rollout
            if len(rollouts):
                insert_rows(c, "rollouts", rollouts.rows(step))
                insert_step_scores(c, step, rollouts)
        elif rollouts is not None:
            rollouts = list(rollouts)
            if rollouts:
                insert_rows(c, "rollouts", [(step, int(r[0]), int(r[1]), r[4]) for r in rollouts])
                write_step_scores(c, step, rollouts)
        if events:
            c.executemany("INSERT INTO events(step, time, kind, payload) VALUES (?, ?, ?, ?)",
                          [(step, now, kind, dumps(p)) for kind, p in events])

    def add_event(self, kind: str, payload: dict, step: int | None = None) -> int:
        with self.transaction() as c:
            cur = c.execute("INSERT INTO events(step, time, kind, payload) VALUES (?, ?, ?, ?)",
                            (step, time.time(), kind, dumps(payload)))
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

    # ---- control: requests, applied exactly once ------------------------------------------
    def request(self, kind: str, payload: dict | None = None, source: str = "ui") -> int:
        if kind not in CONTROL_KINDS:
            raise StoreError(f"unknown control kind {kind!r}; kinds are: {', '.join(CONTROL_KINDS)}")
        status = self.get_meta().get("status")
        if status in (FINISHED, FAILED, STOPPED):
            raise StoreError(f"run {self.run_id} is {status}: control requests apply only to a live run")
        with self.transaction() as c:
            cur = c.execute("INSERT INTO control(time, kind, payload, status, source) VALUES (?, ?, ?, ?, ?)",
                            (time.time(), kind, dumps(payload or {}), PENDING, source))
            return cur.lastrowid

    def has_pending(self) -> bool:
        """A pending control request exists: one indexed read, no write lock (so a trainer can
        ask every step without waiting behind another writer's transaction)."""
        return self.conn.execute("SELECT 1 FROM control WHERE status = ? LIMIT 1", (PENDING,)).fetchone() is not None

    def probe(self) -> tuple:
        """The cheapest "anything new?" read, for the live page's readers: (last scalar step, last
        event id, last control id, the open requests' ids and statuses, every meta row). It
        changes whenever something a LiveState holds changes (a step, an event, a request sent or
        moving pending -> applying -> resolved, a status, heartbeat or settings change). One
        statement (its own short read transaction in autocommit): index lookups and the few meta rows."""
        row = self.conn.execute(
            "SELECT (SELECT MAX(step) FROM scalars), (SELECT MAX(id) FROM events), (SELECT MAX(id) FROM control), "
            "(SELECT group_concat(id || ':' || status) FROM control WHERE status IN (?, ?)), "
            "(SELECT group_concat(key || '=' || value, char(10)) FROM meta)", (PENDING, APPLYING)).fetchone()
        return tuple(row)

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
                       dumps({"request_id": request_id, "kind": kind, "request": json.loads(payload),
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
