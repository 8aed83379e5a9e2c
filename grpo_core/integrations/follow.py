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

from grpo_core.errors import ConfigError
from grpo_core.integrations.importers import ImportReport
from grpo_core.runs.store import FINISHED, RUNNING, STOPPED, RunStore, check_run_id, runs_dir


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
    """An importer's Parsed as a SourceRun (its per-step groups too, where it has them)."""
    return SourceRun(parsed.rows, parsed.config, parsed.report, dict(parsed.step_data), list(parsed.lacks),
                     ended=parsed.error is not None)


def _trainer_state(path: Path) -> Path | None:
    """The newest trainer_state.json of a TRL output dir: TRL writes one at each checkpoint
    (checkpoint-N/trainer_state.json) and at the end in the dir itself."""
    states = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    return path / "trainer_state.json" if (path / "trainer_state.json").is_file() else (states[-1] if states else None)


def read_trl(path: Path) -> SourceRun:
    """A TRL output dir (or its trainer_state.json): the scalars of the newest trainer_state,
    and each step's groups and rollouts from completions/*.parquet (log_completions=True),
    which TRL writes as it logs, between checkpoints too."""
    from grpo_core.integrations.importers import parse
    state = _trainer_state(path) if path.is_dir() else path
    has_completions = path.is_dir() and any((path / "completions").glob("completions_*.parquet"))
    if state is None and not has_completions:
        raise ConfigError(f"{path}: no trainer_state.json yet and no completions/*.parquet (TRL writes the first "
                          "at each checkpoint, the second with log_completions=True)")
    run = from_parsed(parse("trl", state.read_bytes(), str(state))) if state is not None else None
    if not has_completions:
        return run
    from grpo_core.integrations.trl_completions import parse_completions, read_frames
    groups = from_parsed(parse_completions(read_frames(path), str(path)))
    if run is None:
        return groups
    for step, row in groups.scalars.items():  # the groups' own counts and means win over TRL's averages
        run.scalars.setdefault(step, {}).update(row)
    run.groups, run.lacks = groups.groups, []
    run.config["reward"] = groups.config["reward"]
    run.config.setdefault("grpo", {}).update({k: v for k, v in groups.config["grpo"].items() if k == "group_size"})
    return run


def read_tensorboard(path: Path) -> SourceRun:
    """A TensorBoard logdir of one run (TRL's <output_dir>/runs/<date_host>/) or an event file."""
    from grpo_core.integrations.tensorboard_logs import parse_logdir
    return from_parsed(parse_logdir(path))


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


READERS = {"trl": read_trl, "wandb": read_wandb, "tensorboard": read_tensorboard, "verl": read_verl}


def cli_watch(args) -> int:
    if args.kind not in READERS:
        raise ConfigError(f"watch kind must be one of {', '.join(READERS)}, got {args.kind!r}")
    rid = follow(args.kind, args.source, READERS[args.kind], run_id=args.run_id, root=args.runs_dir,
                 every_s=args.every, max_polls=args.polls)
    print(f"run {rid}: {runs_dir(args.runs_dir) / rid}")
    return 0
