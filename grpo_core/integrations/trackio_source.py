"""A Trackio run (Hugging Face's local-first tracker: one SQLite file per project) as a run.

trackio writes `<TRACKIO_DIR>/<project>.db` (TRACKIO_DIR defaults to $HF_HOME/trackio; the
file name is the project's name with every character but letters, digits, - and _ dropped).
Its `metrics` table holds one row per trackio.log() call: run_id, run_name, trackio's step,
and the logged dict as JSON (NaN and infinities as the strings "NaN", "Infinity"); `configs`
holds each run's trackio.init config (older trackio had no run_id column and no configs).
Read here with sqlite3 alone (no trackio import), read-only: trackio writes in WAL mode, and
a reader never blocks the writer.

Steps: transformers' TrackioCallback (TRL's `report_to="trackio"`) logs each log dict under
TRL's names with `train/global_step` and lets trackio number the rows (a count of log
calls, not the trainer's step), so a row's trainer step key wins; where no row has one (our
mirror, a plain trackio.log(step=...)) trackio's step is the step. Names map as W&B's do
(scalar_history.py). How a run ended: trackio records nothing at trackio.finish(), so an
imported run is never "finished" (incomplete at its last step; under `watch`, stale).
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun, number
from grpo_core.integrations.scalar_history import STEP_KEYS, detect_style, finish_rows
from grpo_core.integrations.source_tail import LayeredRows, Reads, SourceTail, Stamp
from grpo_core.integrations.wandb_file import run_config as trl_run_config

DB_EXT = ".db"
RUN_INFO_KEYS = ("_Username", "_Created", "_Group")  # what trackio.init adds to every run's config
TRAINER_ARGS = {"output_dir", "logging_steps"}  # a transformers Trainer's config (TrackioCallback logs its arguments)
SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # trackio's JSON for non-finite floats


# ---- where a project lives ----------------------------------------------------------------------
def trackio_dir() -> Path:
    """Where trackio keeps its projects: $TRACKIO_DIR, else $HF_HOME/trackio (HF_HOME as
    huggingface_hub resolves it)."""
    if os.environ.get("TRACKIO_DIR"):
        return Path(os.environ["TRACKIO_DIR"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(hf_home).expanduser() / "trackio"


def project_file(project: str) -> str:
    """The db file trackio writes for a project name (its canonical_project_name)."""
    safe = "".join(c for c in project if c.isalnum() or c in "-_")
    return f"{safe or 'default'}{DB_EXT}"


def project_dbs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob(f"*{DB_EXT}") if not p.name.startswith("registry-"))


def resolve_db(source) -> Path:
    """A project's .db file, a folder holding one project, or a project's name (looked up
    under trackio_dir())."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        found = project_dbs(path)
        if len(found) != 1:
            listed = ", ".join(p.stem for p in found) or "none"
            raise ConfigError(f"{path}: expected one Trackio project (.db) in the folder, found {listed}: "
                              "give the project's .db file")
        return found[0]
    db = trackio_dir() / project_file(str(source))
    if db.is_file():
        return db
    known = ", ".join(p.stem for p in project_dbs(trackio_dir())) or "none"
    raise ConfigError(f"{source}: no such file, and no Trackio project of that name in {trackio_dir()} "
                      f"(projects there: {known}; set TRACKIO_DIR where trackio wrote it)")


def connect(db: Path) -> sqlite3.Connection:
    """Read-only: no write lock, no checkpoint, never in the writer's way."""
    try:
        conn = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, timeout=10)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise ConfigError(f"{db}: not a Trackio project database ({e})") from None
    if not columns(conn, "metrics"):
        conn.close()
        raise ConfigError(f"{db}: not a Trackio project database (no metrics table)")
    return conn


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


# ---- which run ------------------------------------------------------------------------------------
def list_runs(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(run_id, run name) of every run with metrics, oldest first (old trackio: the id is the name)."""
    key = "run_id" if "run_id" in columns(conn, "metrics") else "run_name"
    return [(rid, name) for rid, name in conn.execute(
        f"SELECT {key}, MAX(run_name) FROM metrics GROUP BY {key} ORDER BY MIN(id)")]


def pick_run(conn: sqlite3.Connection, db: Path, run: str | None) -> tuple[str, str]:
    """The run asked for (by name or id), or the project's only run; never a guess among several."""
    runs = list_runs(conn)
    if not runs:
        raise ConfigError(f"{db}: the Trackio project has no runs with metrics yet")
    if run is None:
        if len(runs) > 1:
            raise ConfigError(f"{db}: the project has {len(runs)} runs ({', '.join(n for _, n in runs)}): "
                              "pick one with --run NAME")
        return runs[0]
    hits = [r for r in runs if run in r]
    if not hits:
        raise ConfigError(f"{db}: no run {run!r} in the project (runs: {', '.join(n for _, n in runs)})")
    if len(hits) > 1:  # trackio lets two runs share a name; its id tells them apart
        raise ConfigError(f"{db}: {len(hits)} runs are named {run!r} (ids {', '.join(i for i, _ in hits)}): "
                          "give the id with --run ID")
    return hits[0]


# ---- reading rows ---------------------------------------------------------------------------------
class TrackioReader:
    """One trackio run, read incrementally: each read() fetches only the metric rows after the
    last one seen (trackio's row id) and returns the whole run so far as a SourceRun."""

    def __init__(self, source, run: str | None = None):
        self.db = resolve_db(source)
        with closing(connect(self.db)) as conn:
            self.run_id, self.run_name = pick_run(conn, self.db, run)
            self.key = "run_id" if "run_id" in columns(conn, "metrics") else "run_name"
        self.last_id = 0  # the last metrics row read
        self.rows_read = 0  # metric rows fetched, every read together (a read with nothing new adds none)
        self.bytes_read = 0  # their logged JSON's bytes
        self.touched: set[int] = set()  # steps the reads since the last take_touched() added to
        self.stepped: dict[int, dict] = {}  # trainer step key's step -> {name: number}
        self.unstepped: dict[int, dict] = {}  # trackio's step -> {name: number}, rows without a step key
        self.unstepped_rows = 0
        self.skipped = ImportReport("trackio", str(self.db))  # what reading the rows left out
        self.config: dict | None = None
        self.run_info: dict = {}

    def read(self) -> SourceRun:
        with closing(connect(self.db)) as conn:
            if self.config is None:
                self.read_config(conn)
            rows = conn.execute(f"SELECT id, step, metrics FROM metrics WHERE {self.key} = ? AND id > ? ORDER BY id",
                                (self.run_id, self.last_id)).fetchall()
        for row_id, step, blob in rows:
            self.add_row(int(step), blob)
            self.last_id = row_id
            self.bytes_read += len(blob or b"")
        self.rows_read += len(rows)
        return self.source_run()

    def take_touched(self) -> set[int]:
        out, self.touched = self.touched, set()
        return out

    def read_config(self, conn: sqlite3.Connection):
        self.config = {}
        if "config" not in columns(conn, "configs"):
            return
        row = conn.execute(f"SELECT config FROM configs WHERE {self.key} = ? ORDER BY id DESC LIMIT 1",
                           (self.run_id,)).fetchone()
        if row is None or not row[0]:
            self.config = None  # trackio writes it with the first logged row: look again next read
            return
        try:
            config = json.loads(row[0])
        except ValueError:
            config = None
        if not isinstance(config, dict):
            self.skipped.skip("run config", "not a readable JSON object (damaged row)")
            return
        self.run_info = {k.strip("_").lower(): config.pop(k, None) for k in RUN_INFO_KEYS}
        self.config = config

    def add_row(self, step: int, blob):
        self.skipped.entries += 1
        try:
            logged = json.loads(blob)
        except (ValueError, TypeError):
            logged = None
        if not isinstance(logged, dict):
            self.skipped.skip("metrics row", "not a readable JSON object (damaged row)")
            return
        values = {}
        for key, v in logged.items():
            x = number(SPECIAL.get(v, v) if isinstance(v, str) else v)
            if x is None:
                what = "media or table" if isinstance(v, dict) else "text or list" if v is not None else "null"
                self.skipped.skip(key, f"not a scalar ({what}): only scalars are imported")
                continue
            values[key] = x
        own = next((values[k] for k in STEP_KEYS if k in values and math.isfinite(values[k])
                    and values[k] == int(values[k])), None)
        if own is None:
            self.unstepped.setdefault(step, {}).update(values)
            self.unstepped_rows += 1
        else:
            step = int(own)
            self.stepped.setdefault(step, {}).update(values)
        self.touched.add(step)

    def steps(self, report: ImportReport) -> dict[int, dict]:
        """step -> values: a row's trainer step key (train/global_step) where rows have one
        (or will: a transformers Trainer's run, its TrainingArguments the config); else
        trackio's own step. In a run whose rows have one, rows without it are not imported:
        trackio numbers them by log call (TRL's profiling timings are such rows, logged at the
        step before the one they time)."""
        if not self.stepped and not TRAINER_ARGS <= set(self.config or ()):
            return {s: dict(v) for s, v in self.unstepped.items()}
        if self.unstepped_rows:
            report.skip("row without train/global_step", "its trackio step counts log calls, not trainer steps",
                        self.unstepped_rows)
        return {s: dict(v) for s, v in self.stepped.items()}

    def source_run(self) -> SourceRun:
        """The run so far, mapped afresh (the cumulative ratios need every step)."""
        report = ImportReport("trackio", str(self.db), entries=self.skipped.entries, skipped=dict(self.skipped.skipped))
        raw = self.steps(report)
        config = dict(self.config or {})
        style = detect_style({k for r in raw.values() for k in r}, {"grpo_health": config.pop("grpo_health", None)})
        rows = finish_rows(raw, style, report, config, {}, source="trackio")
        report.note("trackio records no end of a run (trackio.finish() writes nothing to the project): "
                    "the run is not called finished")
        out = self.run_config(style, config, rows, report)
        planned = (out.get("grpo") or {}).get("steps")
        planned = planned if isinstance(planned, int) and planned > 0 else None
        if "grpo" in out:
            out["grpo"]["steps"] = planned or (max(rows) if rows else None)
        return SourceRun(rows, out, report, finished=False, last_step=max(raw) if raw else None, planned=planned)

    def run_config(self, style: str, config: dict, rows: dict, report: ImportReport) -> dict:
        """The stored config: ours as it was (our mirror), TRL's arguments read as the W&B
        reader reads them, else none; and the trackio run's own."""
        if style == "grpo_core":
            out = dict(config) if "grpo" in config else {}
        elif style == "trl":
            out = trl_run_config(style, config, {k for r in rows.values() for k in r}, report, str(self.db))
        else:
            out = {}
        return {**out, "source": "trackio",
                "trackio": {"project_file": self.db.name, "run": self.run_name, "run_id": self.run_id,
                            **self.run_info, "style": style, "config": config}}


class TrackioTail(SourceTail):
    """`watch trackio`: a poll reads the project's rows after the last one seen, and only when
    the db or its write-ahead log changed (a stat each, no byte read otherwise)."""

    def __init__(self, path, run: str | None = None):
        self.reader = TrackioReader(path, run)
        self.reads = Reads()
        db = self.reader.db
        self.stamps = (Stamp(db), Stamp(db.with_name(db.name + "-wal")))
        self.rows = LayeredRows(("all",))
        self.current: SourceRun | None = None

    def poll(self) -> bool:
        changed = [stamp.changed() for stamp in self.stamps]  # every stamp looked at: each remembers
        if self.current is not None and not any(changed):
            return False
        rows, nbytes = self.reader.rows_read, self.reader.bytes_read
        self.current = self.reader.read()
        self.reads.bytes += self.reader.bytes_read - nbytes
        touched = self.reader.take_touched()
        for step in touched:  # a step's derived values depend on it and the steps before: older steps stay
            if step in self.current.scalars:
                self.rows.put("all", step, self.current.scalars[step])
        return self.reader.rows_read > rows

    def take(self) -> list[int]:
        return self.rows.take()

    def run(self) -> SourceRun:
        self.current.scalars = self.rows.merged
        return self.current


def read_trackio_path(path, run: str | None = None) -> SourceRun:
    """A Trackio project (its .db file, its folder, or its name) -> one run's steps."""
    return TrackioReader(path, run).read()
