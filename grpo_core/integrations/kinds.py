"""The source kinds `import` and `watch` read: one record each, and reading a source through it.

A record says what the kind reads, how, its options, and whether `watch` can follow it.

Every reader asks this registry: the `import` verb (importers.py), `watch` (follow.py) and
the Runs page's upload form (`file_kinds`). A kind reads one file's bytes (`parse`: what an
upload gives), a path (`read_path`: a folder, such as a verl job or an ART model dir, or any
path where the kind has no `parse`), or both.

A file given as the wrong kind is named for what it is (`sniff`: the first bytes' signature,
one function for every kind): "this is a TRL trainer_state.json: use `import trl`", before
the kind's reader can say something true but misleading ("no scalars"). A folder that a
kind cannot read is sniffed the same way on its error path.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_core.errors import ConfigError
from grpo_core.integrations import (
    art_files,
    notebook,
    tensorboard_logs,
    trackio_source,
    trl_completions,
    trl_state,
    verl,
    wandb_csv,
    wandb_file,
)
from grpo_core.integrations.base import SourceRun

POSITIVE_INT_OPTIONS = ("groups_per_step", "logging_steps", "group_size")


@dataclass(frozen=True)
class SourceKind:
    name: str  # the CLI's KIND
    reads: str  # what FILE (or SOURCE) is, as the CLI's help says it
    parse: Callable[..., SourceRun] | None = None  # (bytes, filename, **options) -> SourceRun: one file
    read_path: Callable[..., SourceRun] | None = None  # (path, **options) -> SourceRun: a folder, or any path
    label: str | None = None  # one uploaded file of it (the Runs page's form); None: not offered there
    options: tuple[str, ...] = ()  # the keyword options it takes (import_run/import_path, the CLI's flags)
    watch: bool = False  # `watch` can follow it: read_path re-read while the source grows
    locate: Callable[[str], Path] | None = None  # SOURCE as given -> the path to read (a name looked up); None: the path itself

    def check_options(self, options: dict) -> dict:
        """The options given (None: not given) that this kind takes; one it does not take, or a
        bad value, is refused with one line naming the option and the fix."""
        given = {k: v for k, v in options.items() if v is not None}
        for k, v in given.items():
            if k not in self.options:
                takes = ", ".join(self.options) or "no options"
                raise ConfigError(f"import {self.name}: option {k} does not apply (it takes {takes})")
            if k in POSITIVE_INT_OPTIONS and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{k} must be a positive integer, got {v!r}")
        return given


KINDS = {kind.name: kind for kind in (
    SourceKind("trl", "trainer_state.json or a bare log_history list; watch: the output dir (its newest "
               "trainer_state.json and completions/*.parquet)", trl_state.parse_trl_state, trl_state.read_trl_path,
               "TRL trainer_state.json (or a bare log_history list)", ("groups_per_step", "group_size"), watch=True),
    SourceKind("wandb", "a run file (run-*.wandb) or its run folder", wandb_file.parse_wandb_run,
               wandb_file.read_wandb_path, "W&B run file (run-*.wandb)", watch=True),
    SourceKind("csv", "a CSV exported from the W&B UI (a chart's CSV or run.history())", wandb_csv.parse_wandb_csv,
               label="W&B CSV export"),
    SourceKind("art", "history.jsonl, a trajectory file or the model output dir", art_files.parse_art,
               art_files.parse_art_dir, "ART history.jsonl or trajectory file"),
    SourceKind("trl-log", "a TRL / Unsloth terminal transcript, or a Jupyter / Colab notebook (.ipynb) saved with "
               "its outputs", notebook.parse_trl_log, label="TRL / Unsloth terminal transcript or notebook (.ipynb)",
               options=("groups_per_step", "logging_steps", "group_size")),
    SourceKind("trl-completions", "a completions_*.parquet or its folder (log_completions=True)",
               trl_completions.parse_completions_file, trl_completions.read_completions,
               "TRL completions parquet (log_completions)", ("group_size", "reward_funcs", "reward_weights")),
    SourceKind("tensorboard", "an event file or a logdir (the file's args say the rest)",
               tensorboard_logs.parse_event_bytes, tensorboard_logs.parse_logdir, "TensorBoard event file",
               watch=True),
    SourceKind("verl", "its file logger JSONL, console log or rollout dumps, or a folder with them",
               read_path=verl.read_source, watch=True),
    SourceKind("trackio", "a Trackio project: its .db file (under $TRACKIO_DIR, default ~/.cache/huggingface/trackio) "
               "or its name; --run NAME where it has several runs", read_path=trackio_source.read_trackio_path,
               locate=trackio_source.resolve_db,
               options=("run",), watch=True),
)}


def source_kind(name: str) -> SourceKind:
    if name not in KINDS:
        raise ConfigError(f"import kind must be one of {', '.join(KINDS)}, got {name!r}")
    return KINDS[name]


def file_kinds() -> dict[str, str]:
    """kind -> what one uploaded file of it is: the kinds the Runs page's upload form offers."""
    return {kind.name: kind.label for kind in KINDS.values() if kind.label}


def watch_kinds() -> list[str]:
    return [kind.name for kind in KINDS.values() if kind.watch]


def kinds_help(watch: bool = False) -> str:
    """What each kind reads, for the CLI's help."""
    return "; ".join(f"{kind.name}: {kind.reads}" for kind in KINDS.values() if kind.watch or not watch)


# ---- what a file is, whatever kind it was given as ------------------------------------------------
HEAD = 65536  # the bytes a signature is read from (a trainer_state.json names log_history in its first 1 KiB)
TRL_KEYS = re.compile(rb'"(loss|reward|learning_rate|frac_reward_zero_std|train_runtime|grad_norm)"\s*:')
TRL_PRINTED = re.compile(r"\{'(loss|reward|train_runtime|grad_norm|learning_rate)': ")
VERL_CONSOLE = re.compile(r"(?:^|\s)step:\d+ - [\w/@.-]+:", re.M)


def _first_json_line(text: str):
    for line in text.splitlines()[:5]:
        if line.strip():
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _sniff_json(head: bytes, text: str) -> tuple[str, str] | None:
    start = head.lstrip()[:1]
    if start == b"[" and b'"step"' in head and TRL_KEYS.search(head):
        return "trl", "a TRL log_history list"
    if start != b"{":
        return None
    if b'"cells"' in head and b'"nbformat"' in head:
        return "trl-log", "a Jupyter notebook (.ipynb)"
    if b'"log_history"' in head:
        return "trl", "a TRL trainer_state.json"
    d = _first_json_line(text)
    if not isinstance(d, dict):
        return None
    if isinstance(d.get("step"), int) and isinstance(d.get("data"), dict):
        return "verl", "verl's file-logger JSONL ({\"step\": N, \"data\": ...} lines)"
    if "trajectories" in d:
        return "art", "an ART trajectory file"
    if "step" in d and ("recorded_at" in d or "training_step" in d):
        return "art", "an ART history.jsonl"
    return None


def _sniff_parquet(data: bytes) -> tuple[str, str] | None:
    try:
        import io

        import pyarrow.parquet as pq
        cols = set(pq.read_schema(io.BytesIO(data)).names)
    except Exception:  # noqa: BLE001 - pyarrow missing, or a torn file: no signature
        return None
    if {"prompt", "completion", "advantage"} <= cols:
        return "trl-completions", "TRL's completions parquet (log_completions)"
    return None


def sniff(data: bytes) -> tuple[str, str] | None:
    """(kind, what the file is) from a file's bytes (the first HEAD are enough but for
    parquet, whose schema is at the end); None where no kind's signature matches."""
    head = data[:HEAD]
    if head[:4] == b":W&B":
        return "wandb", "a W&B run file (run-*.wandb)"
    if b"brain.Event:" in head[:64]:
        return "tensorboard", "a TensorBoard event file"
    if head[:4] == b"PAR1":
        return _sniff_parquet(data)
    if b"\x00" in head:
        return None
    text = head.decode("utf-8", errors="replace")
    found = _sniff_json(head, text)
    if found:
        return found
    first = text.lstrip("\ufeff").split("\n", 1)[0]
    if "," in first and "{" not in first and any(c.strip().strip('"') in wandb_csv.CSV_STEP_COLUMNS
                                                  for c in first.split(",")):
        return "csv", "a CSV exported from W&B"
    if TRL_PRINTED.search(text):
        return "trl-log", "a TRL / Unsloth terminal transcript"
    if VERL_CONSOLE.search(text):
        return "verl", "a verl console log"
    return None


def sniff_folder(p: Path) -> tuple[str, str] | None:
    """(kind, what the folder is) from the files a trainer leaves in it; None if unknown."""
    if (p / "trainer_state.json").is_file() or any(p.glob("checkpoint-*/trainer_state.json")):
        return "trl", "a TRL output dir"
    if any(p.glob("completions/completions_*.parquet")) or any(p.glob("completions_*.parquet")):
        return "trl-completions", "a TRL output dir with completions parquet files"
    if any(p.glob("events.out.tfevents.*")) or any(p.glob("*/events.out.tfevents.*")):
        return "tensorboard", "a TensorBoard logdir"
    if any(p.glob("run-*.wandb")) or any(p.glob("*/run-*.wandb")):
        return "wandb", "a W&B run folder"
    if (p / "history.jsonl").is_file() or (p / "trajectories").is_dir():
        return "art", "an ART model dir"
    return None


def sniff_path(p: Path) -> tuple[str, str] | None:
    """sniff() of a file on disk, reading only its head (a parquet file: its schema, at the end)."""
    with open(p, "rb") as f:
        head = f.read(HEAD)
    return sniff(p.read_bytes() if head[:4] == b"PAR1" else head)


def check_kind(kind: str, found: tuple[str, str] | None, label: str, verb: str = "import"):
    """Refuse a source that is another kind's, naming that kind."""
    if found and found[0] != kind:
        use = verb if found[0] in watch_kinds() or verb == "import" else "import"  # watch follows only some kinds
        raise ConfigError(f"{label}: this is {found[1]}: use `{use} {found[0]}` "
                          f"({verb} {kind} reads {KINDS[kind].reads})")


def parse(kind: str, data: bytes, filename: str, groups_per_step: int | None = None, **options) -> SourceRun:
    """One file's bytes (the dashboard's upload form) -> SourceRun."""
    source = source_kind(kind)
    if source.parse is None:
        raise ConfigError(f"{filename}: import {kind} reads a path, not one file's bytes: "
                          f"python -m grpo_core import {kind} PATH")
    if not data:
        raise ConfigError(f"{filename}: the file is empty")
    check_kind(kind, sniff(data), filename)
    return source.parse(data, filename, **source.check_options({"groups_per_step": groups_per_step, **options}))


def read(kind: str, path, groups_per_step: int | None = None, **options) -> SourceRun:
    """A file or folder -> SourceRun: a folder (or any path, for a kind with no one-file
    reader) through read_path, a file through parse."""
    source = source_kind(kind)
    p = Path(path)
    if source.read_path is not None and (p.is_dir() or source.parse is None):
        if p.is_file():
            check_kind(kind, sniff_path(p), str(p))
        try:
            return source.read_path(p, **source.check_options({"groups_per_step": groups_per_step, **options}))
        except ConfigError:
            if p.is_dir():
                check_kind(kind, sniff_folder(p), str(p))
            raise
    if p.is_dir():
        raise ConfigError(f"{p}: import {kind} reads a file, not a folder")
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    return parse(kind, p.read_bytes(), str(p), groups_per_step, **options)


def watch_reader(kind: str) -> Callable[[Path], SourceRun]:
    """read(path) -> SourceRun for `watch`, re-run while the source grows."""
    if kind not in watch_kinds():
        raise ConfigError(f"watch kind must be one of {', '.join(watch_kinds())}, got {kind!r}")
    return KINDS[kind].read_path
