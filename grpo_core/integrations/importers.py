"""`import`: a run another trainer logged, written once as a run store.

TRL, ART, verl, W&B, TensorBoard, CSV: the kinds are kinds.py's.

Most imported runs have scalars only: no per-group rows and no rollouts, so no what-if and
no group inspector (TRL's completions parquet, ART's trajectory files and verl's rollout
dumps are the exceptions: they have both). Its meta says so (`lacks`), and `import_report`
says what was read, how every source name was mapped, and everything that was not imported
and why: nothing is dropped silently. How the source ended sets the run's status: failed,
incomplete or finished.

No torch import here: the dashboard's upload form calls `import_run`.
"""
from __future__ import annotations

import re
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from grpo_core.analysis.run_data import INCOMPLETE, UNKNOWN_END
from grpo_core.errors import ConfigError, StoreError
from grpo_core.integrations import kinds
from grpo_core.integrations.base import ImportReport, SourceRun, write_steps
from grpo_core.runs import names
from grpo_core.runs.locations import check_run_id, runs_dir
from grpo_core.runs.run_meta import FAILED, FINISHED
from grpo_core.runs.store import RunStore


def import_run(kind: str, data: bytes, filename: str, run_id: str | None = None, root=None,
               groups_per_step: int | None = None, **options) -> str:
    """Import file bytes (the dashboard's upload form) as a run; returns its id. Options:
    the kind's (kinds.KINDS[kind].options). Raises ConfigError (one line naming the file and
    what was expected) on bad input."""
    return write_run(kinds.parse(kind, data, filename, groups_per_step, **options), kind, run_id, root)


def import_path(kind: str, path, run_id: str | None = None, root=None, groups_per_step: int | None = None,
                **options) -> str:
    """Import a file or folder (a verl job, an ART model dir, a TRL completions/ folder, a
    TensorBoard logdir, a W&B run dir) as a run; returns its id."""
    return write_run(kinds.read(kind, path, groups_per_step, **options), kind, run_id, root)


# ---- writing the store ---------------------------------------------------------------------------
def default_run_id(kind: str, filename: str) -> str:
    stem = Path(filename).name
    for suffix in (".wandb", ".json", ".csv", ".db", ".ipynb"):
        stem = stem.removesuffix(suffix)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "run"
    return f"{kind}-{stem}"[:56]


def source_status(run: SourceRun) -> tuple[str, str | None]:
    """(status, detail) from how the source ended, never guessed: failed where it crashed (a
    W&B exit code != 0); incomplete where it stopped before its planned last step ('incomplete:
    step 200 of 350'); finished only where the source says it ended (its reader found an end
    record: a W&B exit record, TRL's run totals or its trainer state at max_steps, verl's final
    line); else unknown ('stopped at step 200: ... whether it finished is unknown'), since a
    log that simply stops may be a run killed, crashed, or still running."""
    last = run.last_step if run.last_step is not None else (max(run.scalars) if run.scalars else None)
    if run.error:
        return FAILED, f"failed at step {last}: {run.error}"
    if run.planned is not None and last is not None and last < run.planned:
        return INCOMPLETE, f"incomplete: step {last} of {int(run.planned)}"
    if run.finished:
        return FINISHED, None
    return UNKNOWN_END, (f"stopped at step {last}: the source records no end, so whether the run finished "
                         "is unknown")


def new_store(run: SourceRun, kind: str, run_id: str | None, root) -> RunStore:
    """A new store for the run: `run_id`, or the file's name, then -2, -3, ... where taken."""
    base = runs_dir(root)
    explicit = run_id is not None
    rid = check_run_id(run_id) if explicit else default_run_id(kind, run.report.file)
    for n in range(1, 1000):
        try:
            return RunStore.create(rid if n == 1 else f"{rid}-{n}", run.config, root=base, kind="import")
        except StoreError:
            if explicit:
                raise
    raise StoreError(f"run ids {rid}-2 .. {rid}-999 are all taken in {base}")


def write_run(run: SourceRun, kind: str, run_id: str | None, root) -> str:
    """Every step of the source, its meta and how it ended, into a new run; returns its id.
    Nothing half-imported is left behind."""
    filename, rep = run.report.file, run.report
    if not run.scalars:
        raise ConfigError(f"{filename}: no training steps with numbers in it; nothing to import "
                          f"({'; '.join(rep.lines()[1:4]) or 'empty'})")
    store = new_store(run, kind, run_id, root)
    try:
        write_steps(store, run)
        rep.steps = len(run.scalars)
        rep.values = sum(len(row) for row in run.scalars.values())
        store.set_meta(source=kind, lacks=run.lacks, import_report=asdict(rep), summary=run.summary,
                       imported_from=filename, imported_at=time.time())
        store.add_event("lifecycle", {"event": "imported", "source": kind, "file": filename,
                                      "steps": rep.steps, "skipped": rep.skipped, "notes": rep.notes},
                        step=max(run.scalars))
        status, detail = source_status(run)
        store.set_status(status, error=run.error, status_detail=detail)
    except BaseException:
        store.close()
        shutil.rmtree(store.run_dir, ignore_errors=True)  # no half-imported run left behind
        raise
    store.close()
    return store.run_id


# ---- the CLI verb ----------------------------------------------------------------------------------
def cli_options(args) -> dict:
    """The CLI's flags -> import options (reward weights as fn=w,fn=w)."""
    out = {k: getattr(args, k, None) for k in ("logging_steps", "group_size", "run")}
    if getattr(args, "reward_funcs", None):
        out["reward_funcs"] = [x.strip() for x in args.reward_funcs.split(",") if x.strip()]
    if getattr(args, "reward_weights", None):
        try:
            out["reward_weights"] = {k.strip(): float(v) for k, v in
                                     (x.split("=", 1) for x in args.reward_weights.split(",") if x.strip())}
        except ValueError:
            raise ConfigError(f"--reward-weights {args.reward_weights!r}: expected fn=weight,fn=weight") from None
    return out


def cli_import(args) -> int:
    run_id = import_path(args.kind, args.file, args.run_id, args.runs_dir,
                         getattr(args, "groups_per_step", None), **cli_options(args))
    with RunStore.open(runs_dir(args.runs_dir) / run_id, readonly=True) as s:
        meta = s.get_meta()
        rep = ImportReport(**meta["import_report"])
    what = ("scalars only: no per-group data, so no what-if, no inspector" if meta.get("lacks")
            else "with per-group data: what-if and the inspector work")
    print(f"imported {args.file} as run {run_id} ({what}); status {meta.get('status_detail') or meta['status']}")
    for line in rep.lines():
        print("  " + line)
    return 0


# ---- the name-mapping table, as docs/integrations.md prints it (a test keeps them equal) ----------
NAMES_BEGIN, NAMES_END = "<!-- names.py tables: begin -->", "<!-- names.py tables: end -->"


def name_table_markdown() -> str:
    """names.FOREIGN_NAMES (TRL / ART / verl -> ours) as one Markdown table. Regenerate the
    doc's copy with: python -c "from grpo_core.integrations.importers import name_table_markdown;
    print(name_table_markdown())"."""
    lines = ["| source | source name | stored as |", "|---|---|---|"]
    for source, table in names.FOREIGN_NAMES.items():
        for key, ours in table.items():
            lines.append(f"| {source} | `{key}` | `{ours}` |")
    lines.append("| any | a name not listed | `<source>/<name>` (kept under the source's name) |")
    return "\n".join(lines)
