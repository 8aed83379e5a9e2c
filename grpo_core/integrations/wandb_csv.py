"""A CSV exported from the W&B UI (a chart's CSV, or run.history()) as a run of scalars.

A chart's CSV names each column `<run name> - <metric>` (plus __MIN/__MAX band columns);
run.history() names them as logged. One run per file: a chart with several runs visible
is refused. The names are recognised as in a W&B run file (scalar_history.py).
"""
from __future__ import annotations

import csv
import io
import math
import re

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.scalar_history import detect_style, finish_rows

CSV_STEP_COLUMNS = ("Step", "_step", "step", "train/global_step", "global_step", "training_step")
RUN_PREFIX = re.compile(r"^(.+?) - (.+)$")
WANT = "a CSV exported from W&B (a chart's CSV or run.history()), with a Step or _step column"


def read_table(data: bytes, filename: str) -> tuple[list[str], list[list[str]], str]:
    """(header, body, step column) of the CSV; one line naming what is wrong otherwise."""
    try:
        text = data.decode("utf-8-sig")
        table = list(csv.reader(io.StringIO(text)))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{filename}: expected {WANT}; it is not text CSV ({type(e).__name__})") from None
    if "\x00" in text or not table or len(table[0]) < 2:
        raise ConfigError(f"{filename}: expected {WANT}; found no columns")
    header, body = table[0], table[1:]
    step_col = next((c for c in CSV_STEP_COLUMNS if c in header), None)
    if step_col is None:
        if "Name" in header and "State" in header:
            raise ConfigError(f"{filename}: this is the W&B runs table (one row per run, no history); "
                              "export a chart's CSV or run.history() instead")
        raise ConfigError(f"{filename}: expected {WANT}; no step column (one of {', '.join(CSV_STEP_COLUMNS)}) "
                          f"among: {', '.join(header[:8])}")
    return header, body, step_col


def value_columns(header: list[str], si: int, rows: int, filename: str, report: ImportReport) -> dict[int, str]:
    """column index -> metric name, the run-name prefix and the min/max bands left out."""
    prefixes = {m.group(1) for j, col in enumerate(header) if j != si and (m := RUN_PREFIX.match(col))}
    if len(prefixes) > 1:
        raise ConfigError(f"{filename}: holds {len(prefixes)} runs ({', '.join(sorted(prefixes)[:4])}); "
                          "import one run at a time (export a chart with one run visible)")
    columns: dict[int, str] = {}
    for j, col in enumerate(header):
        if j == si:
            continue
        m = RUN_PREFIX.match(col)
        key = m.group(2) if (m and prefixes) else col
        if key.endswith("__MIN") or key.endswith("__MAX"):
            report.skip(col, "min/max band of a W&B chart (the value column is imported)", rows)
            continue
        columns[j] = key
    return columns


def read_rows(body: list[list[str]], si: int, columns: dict[int, str], report: ImportReport) -> dict[int, dict]:
    """step -> {metric: number}; empty cells (not logged at that step) counted in a note."""
    raw: dict[int, dict] = {}
    empty = 0
    for row in body:
        report.entries += 1
        if not any(cell.strip() for cell in row):
            report.skip("row", "empty")
            continue
        try:
            step = float(row[si])
        except (ValueError, IndexError):
            report.skip("row", f"step {row[si] if si < len(row) else ''!r} is not a number")
            continue
        if not math.isfinite(step) or step != int(step):
            report.skip("row", "step is not an integer")
            continue
        vals = raw.setdefault(int(step), {})
        for j, key in columns.items():
            cell = row[j].strip() if j < len(row) else ""
            if not cell:
                empty += 1  # W&B leaves a cell empty where the metric was not logged at that step
                continue
            try:
                vals[key] = float(cell)
            except ValueError:
                report.skip(key, "not a number")
    if empty:
        report.note(f"{empty} empty cells: the metric was not logged at that step")
    return raw


def parse_wandb_csv(data: bytes, filename: str) -> SourceRun:
    header, body, step_col = read_table(data, filename)
    report = ImportReport("csv", filename)
    si = header.index(step_col)
    raw = read_rows(body, si, value_columns(header, si, len(body), filename, report), report)
    style = detect_style({k for r in raw.values() for k in r})
    rows = finish_rows(raw, style, report, None)
    config = {"source": "csv", "grpo": {"steps": max(rows) if rows else None}, "wandb": {"style": style}}
    return SourceRun(rows, config, report)
