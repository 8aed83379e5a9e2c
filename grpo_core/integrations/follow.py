"""`watch`: another trainer's outputs followed while they grow, appended as steps of a run.

`python -m grpo_core watch KIND PATH`.

The kind's reader (its read_path: kinds.py) turns the source (a file or an output folder) into
a SourceRun: per-step scalars under names.py's names and, where the source has them, each
step's groups and rollouts (what-if and the group inspector then work). Following re-reads
the source every `every_s` seconds and appends the steps it has not written yet; while the
source grows the store's heartbeat is kept fresh, so the live page shows the run running,
and once it stops growing the heartbeat ages and the page shows it stale. A source that says
it has ended (a W&B run file with its exit record) finishes the run. Nothing here imports
torch."""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations import kinds
from grpo_core.integrations.base import SourceRun, write_steps
from grpo_core.runs.locations import check_run_id, runs_dir
from grpo_core.runs.run_meta import FINISHED, RUNNING, STOPPED
from grpo_core.runs.store import RunStore


def source_signature(path: Path) -> tuple:
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


def follow(kind: str, path, *, run_id: str | None = None, root=None, every_s: float = 2.0,
           max_polls: int | None = None, log=print) -> str:
    """Follow `path` (read with the kind's reader) into a new run; returns the run id. Ends
    when the source says so, after max_polls polls, or on Ctrl-C (status stopped)."""
    read = kinds.watch_reader(kind)
    source = Path(path).expanduser()
    if not source.exists():
        raise ConfigError(f"{source}: no such file or folder to watch")
    run = read(source)
    store = open_store(kind, source, run, run_id, root)
    last, seen, polls = 0, None, 0
    try:
        while True:
            sig = source_signature(source)
            if sig != seen:  # grew (or first look): read it again, append, and say we are alive
                run = read(source) if seen is not None else run
                last, seen = write_steps(store, run, last), sig
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


def cli_watch(args) -> int:
    rid = follow(args.kind, args.source, run_id=args.run_id, root=args.runs_dir, every_s=args.every,
                 max_polls=args.polls)
    print(f"run {rid}: {runs_dir(args.runs_dir) / rid}")
    return 0
