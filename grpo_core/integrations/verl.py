"""verl: a job's outputs as a run, after the fact or followed live.

verl's `Tracking` (verl/utils/tracking.py) sends each step's metrics to its backends; two of
them are files this reads while the job runs:
- the file logger (`trainer.logger=[...,'file']`): one JSON line per step,
  {"step": N, "data": {name: value}}, at $VERL_FILE_LOGGER_PATH or <project>/<experiment>.jsonl;
- the console logger: `step:N - name:value - ...` lines in the job's stdout
  (verl.utils.logger.aggregate_logger.concat_dict_to_str).
And `trainer.rollout_data_dir`: a `{step}.jsonl` per step, one row per rollout with `input`,
`output`, `gts`, `score`, `step` and the reward function's extra infos (ray_trainer's
`_write_generations`). GRPO repeats each prompt `rollout.n` times, interleaved, so one
prompt's rows are consecutive: those are its group. A group is trainable when its scores are
not all equal (verl's GRPO advantages are 0 for equal scores: ART's and TRL's rule); the
score is the rollout's total and every numeric extra is a metric, so what-if and the group
inspector work. Names map through names.VERL_NAMES; any other name is kept as verl/<name>."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from grpo_core.analysis import step_stats
from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.runs import names
from grpo_core.runs.step_columns import StepGroups, StepRollouts
from grpo_core.tasks.task import prompt_id

CONSOLE_LINE = re.compile(r"^step:(\d+) - (.*)$")
SCORE = "score"  # the dump's total per rollout


def map_key(key: str) -> str:
    return names.VERL_NAMES.get(key) or names.foreign("verl", key)


def _put_metrics(rows: dict, step: int, data: dict, report: ImportReport):
    row = rows.setdefault(step, {})
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            report.skip(key, "not a number")
            continue
        name = map_key(key)
        if name != names.foreign("verl", key):
            report.mapped[key] = name
        row[name] = float(value)


def parse_file_log(text: str, filename: str, report: ImportReport) -> dict:
    """The file logger's JSONL -> step -> scalars; a line that is not {"step", "data"} is an error."""
    rows: dict = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if n == len(text.splitlines()):  # the job is writing this line now
                report.note("the last line is incomplete (being written): read on the next poll")
                break
            raise ConfigError(f"{filename} line {n}: not JSON; verl's file logger writes "
                              '{"step": N, "data": {...}} per line') from None
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or not isinstance(entry.get("data"), dict):
            raise ConfigError(f"{filename} line {n}: expected verl's file logger line "
                              '{"step": N, "data": {...}}, got ' + line[:60])
        report.entries += 1
        _put_metrics(rows, entry["step"], entry["data"], report)
    return rows


def parse_console_log(text: str, report: ImportReport) -> dict:
    """`step:N - name:value - ...` lines (other output around them is ignored)."""
    rows: dict = {}
    for line in text.splitlines():
        m = CONSOLE_LINE.match(line.strip())
        if not m:
            continue
        report.entries += 1
        data = {}
        for part in m.group(2).split(" - "):
            key, _, value = part.rpartition(":")
            try:
                data[key] = float(value)
            except ValueError:
                report.skip(key or part, "not a number")
        _put_metrics(rows, int(m.group(1)), data, report)
    return rows


def _groups(rows: list[dict]) -> list[list[dict]]:
    """Consecutive rows with the same input: one prompt's group."""
    out: list[list[dict]] = []
    for r in rows:
        if out and out[-1][0].get("input") == r.get("input"):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _metric_names(rows: list[dict]) -> list[str]:
    keys = [k for k, v in rows[0].items() if k not in ("input", "output", "gts", "step", "request_id")
            and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [SCORE] + [k for k in keys if k != SCORE]


def dump_step(rows: list[dict], step: int, cum: tuple[int, int], report: ImportReport):
    """One step's rollout dump -> (scalars, StepGroups, StepRollouts), or None when its groups
    differ in size (a filtered step: not one [P, G] batch)."""
    groups = _groups(rows)
    size = len(groups[0])
    if any(len(g) != size for g in groups):
        report.skip(f"rollouts of step {step}", f"groups of different sizes {sorted({len(g) for g in groups})}")
        return None
    metrics = _metric_names(rows)
    scores = np.array([[[_num(r.get(m)) for m in metrics] for r in g] for g in groups])  # [P, G, K]
    totals = scores[:, :, 0]
    stats = step_stats.group_stats(totals, scores, min_group_std=0.0)
    scalars = step_stats.step_scalars(stats, scores, metrics, dict.fromkeys(metrics, 0.0) | {SCORE: 1.0}, *cum)
    P = len(groups)
    step_groups = StepGroups(np.arange(P), [prompt_id(str(g[0].get("input", ""))) for g in groups], size,
                             stats.mean, stats.std, stats.trainable, stats.phantom,
                             prompt_text=[str(g[0].get("input", "")) for g in groups])
    flat = [r for g in groups for r in g]
    rollouts = StepRollouts(metrics, np.repeat(np.arange(P), size), np.tile(np.arange(size), P), totals.reshape(-1),
                            scores.reshape(P * size, -1), [str(r.get("output", "")) for r in flat], [None] * len(flat))
    return scalars, step_groups, rollouts


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else float("nan")


def read_dumps(folder: Path, report: ImportReport) -> dict:
    """trainer.rollout_data_dir -> step -> (scalars, StepGroups, StepRollouts)."""
    out, cum = {}, (0, 0)
    files = sorted((p for p in folder.glob("*.jsonl") if p.stem.isdigit()), key=lambda p: int(p.stem))
    for path in files:
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        try:
            rows = [json.loads(ln) for ln in lines]
        except json.JSONDecodeError:
            report.note(f"{path.name} is incomplete (being written): read on the next poll")
            break
        if not rows:
            continue
        got = dump_step(rows, int(path.stem), cum, report)
        if got is not None:
            out[int(path.stem)] = got
            cum = (int(got[0][names.CUM_GROUPS_SUBMITTED]), int(got[0][names.CUM_GROUPS_TRAINABLE]))
    return out


def _is_file_log(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as f:
        first = f.readline()
    return first.startswith('{"step"')


def find_outputs(path: Path) -> tuple[list[Path], list[Path], Path | None]:
    """(file logs, console logs, rollout dump folder) at `path`: one of them, or a folder holding them."""
    if path.is_file():
        return ([path], [], None) if _is_file_log(path) else ([], [path], None)
    files = [p for p in sorted(path.rglob("*")) if p.is_file()]
    dumps = sorted({p.parent for p in files if p.suffix == ".jsonl" and p.stem.isdigit()})
    file_logs = [p for p in files if p.suffix == ".jsonl" and not p.stem.isdigit() and _is_file_log(p)]
    consoles = [p for p in files if p.suffix in (".log", ".txt", ".out")]
    return file_logs, consoles, (dumps[0] if dumps else None)


def read_source(path) -> SourceRun:
    """A verl output (a file logger JSONL, a console log, a rollout dump folder, or a folder
    with any of them) -> SourceRun."""
    path = Path(path)
    file_logs, consoles, dumps = find_outputs(path)
    if not (file_logs or consoles or dumps):
        raise ConfigError(f"{path}: no verl output found (a file logger .jsonl with {{\"step\": N, \"data\": ...}} "
                          "lines, a console log with 'step:N - ...' lines, or trainer.rollout_data_dir's {step}.jsonl)")
    report = ImportReport(source="verl", file=str(path))
    scalars: dict = {}
    for p in file_logs:
        for step, row in parse_file_log(p.read_text(encoding="utf-8"), p.name, report).items():
            scalars.setdefault(step, {}).update(row)
    for p in consoles if not file_logs else []:  # the same numbers: the file log when there is one
        for step, row in parse_console_log(p.read_text(encoding="utf-8", errors="replace"), report).items():
            scalars.setdefault(step, {}).update(row)
    groups = {}
    for step, (dump_scalars, step_groups, rollouts) in (read_dumps(dumps, report) if dumps else {}).items():
        scalars.setdefault(step, {}).update(dump_scalars)  # the groups' own counts and means win
        groups[step] = (step_groups, rollouts)
    if not groups:
        report.note("no rollout dumps (trainer.rollout_data_dir): no group counts, what-if or inspector")
    metrics = sorted({m for _, r in groups.values() for m in r.names}) or [SCORE]
    sizes = {len(r) // len(g) for g, r in groups.values()}
    # verl's GRPO trains a group iff its scores are not all equal: min_group_std 0, as for ART and TRL
    config = {"reward": {"weights": dict.fromkeys(metrics, 0.0) | {SCORE: 1.0}},
              "grpo": {"min_group_std": 0.0, **({"group_size": sizes.pop()} if len(sizes) == 1 else {})}}
    return SourceRun(scalars, config, report, groups=groups, lacks=[] if groups else ["groups", "rollouts"])
