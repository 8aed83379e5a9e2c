"""`watch`: another trainer's outputs followed while they grow, appended as steps of a run.

`python -m grpo_core watch KIND PATH`.

The kind's tail (source_tail.open_tail: verl, TensorBoard, W&B and TRL read incrementally;
another kind is re-read whole when its files change) turns the source (a file or an output
folder) into steps: per-step scalars under names.py's names and, where the source has them,
each step's groups and rollouts (what-if and the group inspector then work). Every `every_s`
seconds a poll reads only what is new (bytes after the last offset, new files) and writes the
steps it changed: a step is written when it first appears and again (its scalars upserted)
when a later part of the source adds to it (a rollout dump after the log line), its groups
once. While the source grows the store's heartbeat is kept fresh, so the live page shows the
run running; once it stops growing the heartbeat ages and the page shows it stale. A source
that says it has ended (a W&B run file's exit record, verl's final line) finishes the run.
Nothing here imports torch."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations import kinds
from grpo_core.integrations.base import SourceRun
from grpo_core.integrations.source_tail import SourceTail, open_tail
from grpo_core.runs.locations import check_run_id, runs_dir
from grpo_core.runs.run_meta import FINISHED, RUNNING, STOPPED
from grpo_core.runs.store import RunStore

logger = logging.getLogger(__name__)


def open_store(kind: str, source: Path, run: SourceRun, run_id: str | None, root) -> RunStore:
    rid = check_run_id(run_id) if run_id else f"{kind}-{source.stem or source.name}"[:56]
    store = RunStore.create(rid, run.config, root=runs_dir(root), kind="watch")
    store.set_meta(source=kind, lacks=run.lacks, watched=str(source), import_report=asdict(run.report),
                   pid=os.getpid(), host=os.uname().nodename)
    store.set_status(RUNNING)
    return store


def write_new(store: RunStore, tail: SourceTail, run: SourceRun, grouped: set) -> int:
    """Write the steps the last polls changed, in one transaction: each step's scalars (an
    upsert: a step written before gets the names added since) and its groups once. Returns
    how many steps were written."""
    batch = []
    for step in tail.take():
        groups, rollouts = run.groups.get(step, (None, None)) if step not in grouped else (None, None)
        if groups is not None:
            grouped.add(step)
        batch.append((step, dict(run.scalars.get(step, {})), groups, rollouts, ()))
    if batch:
        store.log_steps(batch)
    return len(batch)


def follow(kind: str, path, *, run_id: str | None = None, root=None, every_s: float = 2.0,
           max_polls: int | None = None, log=None, **options) -> str:
    """Follow `path` (read with the kind's tail) into a new run; returns the run id. Ends
    when the source says so, after max_polls polls, or on Ctrl-C (status stopped)."""
    read = kinds.watch_reader(kind)
    locate = kinds.source_kind(kind).locate
    source = locate(path) if locate else Path(path).expanduser()
    if not source.exists():
        raise ConfigError(f"{source}: no such file or folder to watch")
    if source.is_file():
        kinds.check_kind(kind, kinds.sniff_path(source), str(source), verb="watch")
    tail = open_tail(kind, source, read, **kinds.source_kind(kind).check_options(options))
    try:
        tail.poll()
        run = tail.run()
    except ConfigError:
        if source.is_dir():  # another trainer's folder: say whose, not only what is missing
            kinds.check_kind(kind, kinds.sniff_folder(source), str(source), verb="watch")
        raise
    store = open_store(kind, source, run, run_id, root)
    grouped: set = set()
    polls, grew = 0, True
    try:
        while True:
            if grew:  # something new (or the first look): append it and say we are alive
                run = tail.run()
                write_new(store, tail, run, grouped)
                store.heartbeat()
                store.set_meta(import_report=asdict(run.report), lacks=run.lacks)
            polls += 1
            if run.ended or (max_polls is not None and polls >= max_polls):
                tail.flush()  # what waited for a next poll (a history's newest step) is written now
                write_new(store, tail, tail.run(), grouped)
                break
            time.sleep(every_s)
            grew = tail.poll()
    except KeyboardInterrupt:
        store.set_status(STOPPED, stop_reason="watch ended (Ctrl-C)")
        store.close()
        return store.run_id
    store.set_status(FINISHED if run.ended else RUNNING)
    (log or logger.info)(f"watched {source} into run {store.run_id}: {len(run.scalars)} steps")
    store.close()
    return store.run_id


def cli_watch(args) -> int:
    rid = follow(args.kind, args.source, run_id=args.run_id, root=args.runs_dir, every_s=args.every,
                 max_polls=args.polls, run=getattr(args, "run", None))
    print(f"run {rid}: {runs_dir(args.runs_dir) / rid}")
    return 0
