"""The source kinds `import` and `watch` read: one record each, and reading a source through it.

A record says what the kind reads, how, its options, and whether `watch` can follow it.

Every reader asks this registry: the `import` verb (importers.py), `watch` (follow.py) and
the Runs page's upload form (`file_kinds`). A kind reads one file's bytes (`parse`: what an
upload gives), a path (`read_path`: a folder, such as a verl job or an ART model dir, or any
path where the kind has no `parse`), or both.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_core.errors import ConfigError
from grpo_core.integrations import (
    art_files,
    tensorboard_logs,
    trl_completions,
    trl_logs,
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
               "TRL trainer_state.json (or a bare log_history list)", ("groups_per_step",), watch=True),
    SourceKind("wandb", "a run file (run-*.wandb) or its run folder", wandb_file.parse_wandb_run,
               wandb_file.read_wandb_path, "W&B run file (run-*.wandb)", watch=True),
    SourceKind("csv", "a CSV exported from the W&B UI (a chart's CSV or run.history())", wandb_csv.parse_wandb_csv,
               label="W&B CSV export"),
    SourceKind("art", "history.jsonl, a trajectory file or the model output dir", art_files.parse_art,
               art_files.parse_art_dir, "ART history.jsonl or trajectory file"),
    SourceKind("trl-log", "a TRL / Unsloth terminal transcript", trl_logs.parse_transcript,
               label="TRL / Unsloth terminal transcript", options=("groups_per_step", "logging_steps")),
    SourceKind("trl-completions", "a completions_*.parquet or its folder (log_completions=True)",
               trl_completions.parse_completions_file, trl_completions.read_completions,
               "TRL completions parquet (log_completions)", ("group_size", "reward_funcs", "reward_weights")),
    SourceKind("tensorboard", "an event file or a logdir (the file's args say the rest)",
               tensorboard_logs.parse_event_bytes, tensorboard_logs.parse_logdir, "TensorBoard event file",
               watch=True),
    SourceKind("verl", "its file logger JSONL, console log or rollout dumps, or a folder with them",
               read_path=verl.read_source, watch=True),
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


def parse(kind: str, data: bytes, filename: str, groups_per_step: int | None = None, **options) -> SourceRun:
    """One file's bytes (the dashboard's upload form) -> SourceRun."""
    source = source_kind(kind)
    if source.parse is None:
        raise ConfigError(f"{filename}: import {kind} reads a path, not one file's bytes: "
                          f"python -m grpo_core import {kind} PATH")
    if not data:
        raise ConfigError(f"{filename}: the file is empty")
    return source.parse(data, filename, **source.check_options({"groups_per_step": groups_per_step, **options}))


def read(kind: str, path, groups_per_step: int | None = None, **options) -> SourceRun:
    """A file or folder -> SourceRun: a folder (or any path, for a kind with no one-file
    reader) through read_path, a file through parse."""
    source = source_kind(kind)
    p = Path(path)
    if source.read_path is not None and (p.is_dir() or source.parse is None):
        return source.read_path(p, **source.check_options({"groups_per_step": groups_per_step, **options}))
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
