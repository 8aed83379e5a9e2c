"""What another trainer's outputs say, as steps of a run store: read once (an import) or
followed while they grow (`python -m grpo_core watch KIND PATH`).

A reader turns a source (a file or an output folder) into a SourceRun: per-step scalars under
names.py's names and, where the source has them, each step's groups and rollouts (what-if
and the group inspector then work). Following re-reads the source every `every_s` seconds
and appends the steps it has not written yet; while the source grows the store's heartbeat
is kept fresh, so the live page shows the run running, and once it stops growing the
heartbeat ages and the page shows it stale. A source that says it has ended (a W&B run file
with its exit record) finishes the run. Nothing here imports torch."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_core.config import ConfigError
from grpo_core.integrations.importers import ImportReport
from grpo_core.store import FINISHED, RUNNING, STOPPED, RunStore, check_run_id, runs_dir


@dataclass
class SourceRun:
    scalars: dict  # step -> {name: value}
    config: dict
    report: ImportReport
    groups: dict = field(default_factory=dict)  # step -> (StepGroups, StepRollouts)
    lacks: list = field(default_factory=lambda: ["groups", "rollouts"])  # what the source never has
    ended: bool = False  # the source says the run is over


def steps_after(run: SourceRun, last: int) -> list[int]:
    return sorted(s for s in set(run.scalars) | set(run.groups) if s > last)


def append_steps(store: RunStore, run: SourceRun, last: int) -> int:
    """Write the source's steps after `last` (each whole, one transaction); returns the new last step."""
    todo = steps_after(run, last)
    if todo:
        batch = []
        for step in todo:
            groups, rollouts = run.groups.get(step, (None, None))
            batch.append((step, dict(run.scalars.get(step, {})), groups, rollouts, ()))
        store.log_steps(batch)
    return todo[-1] if todo else last


def _signature(path: Path) -> tuple:
    """Changes whenever the source grows: size and mtime of every file under it."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)


def open_store(kind: str, source: Path, run: SourceRun, run_id: str | None, root) -> RunStore:
    rid = check_run_id(run_id) if run_id else f"{kind}-{source.stem or source.name}"[:56]
    store = RunStore.create(rid, run.config, root=runs_dir(root), kind="watch")
    store.set_meta(source=kind, lacks=run.lacks, watched=str(source), import_report=asdict(run.report),
                   pid=os.getpid(), host=os.uname().nodename)
    store.set_status(RUNNING)
    return store


def follow(kind: str, path, read, *, run_id: str | None = None, root=None, every_s: float = 2.0,
           max_polls: int | None = None, log=print) -> str:
    """Follow `path` with `read(path) -> SourceRun` into a new run; returns the run id. Ends
    when the source says so, after max_polls polls, or on Ctrl-C (status stopped)."""
    source = Path(path).expanduser()
    if not source.exists():
        raise ConfigError(f"{source}: no such file or folder to watch")
    run = read(source)
    store = open_store(kind, source, run, run_id, root)
    last, seen, polls = 0, None, 0
    try:
        while True:
            sig = _signature(source)
            if sig != seen:  # grew (or first look): read it again, append, and say we are alive
                run = read(source) if seen is not None else run
                last, seen = append_steps(store, run, last), sig
                store.heartbeat()
                store.set_meta(import_report=asdict(run.report))
            polls += 1
            if run.ended or (max_polls is not None and polls >= max_polls):
                break
            time.sleep(every_s)
    except KeyboardInterrupt:
        store.set_status(STOPPED, stop_reason="watch ended (Ctrl-C)")
        store.close()
        return store.run_id
    store.set_status(FINISHED if run.ended else RUNNING)
    log(f"watched {source} into run {store.run_id}: {last} steps")
    store.close()
    return store.run_id


# ---- readers: KIND -> read(path) -> SourceRun -------------------------------------------------
def from_parsed(parsed) -> SourceRun:
    """An importer's Parsed (scalars only) as a SourceRun."""
    return SourceRun(parsed.rows, parsed.config, parsed.report)


def read_trl(path: Path) -> SourceRun:
    """A TRL output dir: the newest trainer_state.json (TRL writes it at each checkpoint,
    checkpoint-N/trainer_state.json, and at the end in the dir itself), or that file."""
    from grpo_core.integrations.importers import parse
    if path.is_dir():
        states = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
        states = ([path / "trainer_state.json"] if (path / "trainer_state.json").is_file() else []) + states[::-1]
        if not states:
            raise ConfigError(f"{path}: no trainer_state.json yet (TRL writes one at each checkpoint: "
                              "set save_steps, or watch the W&B run dir / TensorBoard logdir instead)")
        path = states[0]
    return from_parsed(parse("trl", path.read_bytes(), str(path)))


def read_wandb(path: Path) -> SourceRun:
    """A W&B run dir (wandb/run-*/) or its run-*.wandb file; ended once the file has its exit record."""
    from grpo_core.integrations.importers import parse, wandb_file_finished
    if path.is_dir():
        found = sorted(path.rglob("*.wandb"))
        if len(found) != 1:
            raise ConfigError(f"{path}: expected one run-*.wandb file under the folder, found {len(found)}")
        path = found[0]
    run = from_parsed(parse("wandb", path.read_bytes(), str(path)))
    run.ended = wandb_file_finished(path)
    return run


def read_verl(path: Path) -> SourceRun:
    from grpo_core.integrations.verl import read_source
    return read_source(path)


READERS = {"trl": read_trl, "wandb": read_wandb, "verl": read_verl}


def cli_watch(args) -> int:
    if args.kind not in READERS:
        raise ConfigError(f"watch kind must be one of {', '.join(READERS)}, got {args.kind!r}")
    rid = follow(args.kind, args.source, READERS[args.kind], run_id=args.run_id, root=args.runs_dir,
                 every_s=args.every, max_polls=args.polls)
    print(f"run {rid}: {runs_dir(args.runs_dir) / rid}")
    return 0
