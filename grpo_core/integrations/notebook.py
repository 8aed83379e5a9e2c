"""A Jupyter / Colab notebook (.ipynb) of a TRL or Unsloth run: the training table in its outputs.

In a notebook transformers swaps the tqdm bar for `NotebookProgressCallback`
(transformers/utils/notebook.py): one HTML display, updated in place, that the saved
notebook keeps as a `display_data` output (nbformat 4: {"output_type": "display_data",
"data": {"text/html": [...], "text/plain": [...]}}) holding a `<progress value max>` bar
(max = max_steps) and a table whose first column is `Step`, then `Training Loss`, one row
per logging step, floats written `{:.6f}`. transformers' own table has the loss only;
Unsloth's (unsloth_zoo PatchRLStatistics) adds TRL's metrics as columns, `/` written ` / `
(`rewards / correctness / mean`), and leaves frac_reward_zero_std out. Missing cells are ""
(Unsloth) or "No Log" (transformers): not logged, never zero.

Everything else the cells printed (stream text, text/plain results) is a terminal
transcript: `!python train.py` output, PrinterCallback's dicts, and the `TrainOutput(...)`
that `trainer.train()` returns, whose metrics dict is the run totals (with the last logging
window when max_steps is not a multiple of logging_steps). Without a table the text is read
as a transcript (trl_logs.py); with one, the table's rows are the steps and the text gives
the totals. Kind trl-log reads both (parse_trl_log). No torch, no notebook packages: the JSON
and the HTML are read with the stdlib.
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.trl_logs import find_entries, parse_transcript, transcript_run
from grpo_core.integrations.trl_state import is_trl_summary, parse_trl_history

MISSING = ("", "No Log", "No log")  # a cell with no value: the metric was not logged at that step
TRAIN_OUTPUT = re.compile(r"TrainOutput\(global_step=(\d+)")
COLUMN_KEYS = {"Training Loss": "loss", "Validation Loss": "eval_loss"}


def is_notebook(data: bytes) -> bool:
    """A Jupyter notebook's JSON: an object with a `cells` list and `nbformat`."""
    head = data[:4096].lstrip()
    if not head.startswith(b"{") or b'"cells"' not in data or b'"nbformat"' not in data:
        return False
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(nb, dict) and isinstance(nb.get("cells"), list) and "nbformat" in nb


class _Tables(HTMLParser):
    """The tables (rows of cell texts) and progress bars (value, max) of an HTML output."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.bars: list[tuple[int | None, int | None]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables and self.tables[-1]:
            self._cell = []
        elif tag == "progress":
            self.bars.append((_int(a.get("value")), _int(a.get("max"))))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _int(v) -> int | None:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return None


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else str(x or "")


def outputs(nb: dict, filename: str) -> tuple[str, list, list, list[str]]:
    """(the text the cells printed, [(cell, table rows)], [(value, max) bars], errors)."""
    text, tables, bars, errors = [], [], [], []
    for n, cell in enumerate(nb.get("cells") or [], 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs") or []:
            if not isinstance(out, dict):
                continue
            kind = out.get("output_type")
            if kind == "stream":
                text.append(_text(out.get("text")))
            elif kind in ("display_data", "execute_result", "update_display_data"):
                data = out.get("data") or {}
                if "text/html" in data:
                    p = _Tables()
                    p.feed(_text(data["text/html"]))
                    tables += [(n, t) for t in p.tables]
                    bars += p.bars
                elif "text/plain" in data:
                    text.append(_text(data["text/plain"]) + "\n")
            elif kind == "error":
                errors.append(f"cell {n} raised {out.get('ename')}: {str(out.get('evalue'))[:80]}")
    return "\n".join(text), tables, bars, errors


def _value(cell: str):
    try:
        return float(cell)
    except ValueError:
        return cell


def table_entries(rows: list[list[str]], report: ImportReport) -> list[dict]:
    """A training table (header Step | Training Loss | ...) -> TRL log entries with their step."""
    header = [COLUMN_KEYS.get(h, h.replace(" / ", "/")) for h in rows[0]]
    out = []
    for row in rows[1:]:
        cells = dict(zip(header, row))
        step = _int(cells.pop("Step", None))
        if step is None:
            report.skip("table row", "no integer Step")
            continue
        entry = {k: _value(v) for k, v in cells.items() if v.strip() not in MISSING}
        if "eval_loss" in header:  # transformers' evaluation table: the loss column repeats the last logged loss
            entry = {("eval_" + k if k not in ("loss", "eval_loss") else k): v for k, v in entry.items() if k != "loss"}
        out.append({**entry, "step": step})
    return out


def training_table(tables: list, report: ImportReport, filename: str):
    """(cell, rows) of the notebook's training table: the last one with a Step column."""
    found = [(n, t) for n, t in tables if t and t[0][:1] == ["Step"] and len(t) > 1]
    epochs = [n for n, t in tables if t and t[0][:1] == ["Epoch"]]
    if epochs:
        report.skip("table", f"per-epoch evaluation table (cell {epochs[0]}): rows are epochs, not steps", len(epochs))
    if len(found) > 1:
        report.note(f"{len(found)} training tables (cells {', '.join(str(n) for n, _ in found)}: trainer.train() "
                    f"ran more than once): the last one, cell {found[-1][0]}, imported")
    return found[-1] if found else None


def parse_trl_log(data: bytes, filename: str, groups_per_step: int | None = None,
                  logging_steps: int | None = None, group_size: int | None = None) -> SourceRun:
    """Kind trl-log: a notebook's outputs, or a terminal transcript (trl_logs.py)."""
    if is_notebook(data):
        return parse_notebook(data, filename, groups_per_step, logging_steps, group_size)
    return parse_transcript(data, filename, groups_per_step, logging_steps, group_size)


def parse_notebook(data: bytes, filename: str, groups_per_step: int | None = None,
                   logging_steps: int | None = None, group_size: int | None = None) -> SourceRun:
    """A notebook's bytes -> SourceRun (kind trl-log: the same names and notes as a transcript)."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{filename}: expected a Jupyter notebook (.ipynb JSON); it is not JSON "
                          f"({type(e).__name__})") from None
    report = ImportReport("trl-log", filename)
    text, tables, bars, errors = outputs(nb, filename)
    table = training_table(tables, report, filename)
    for e in errors:
        report.note(f"the notebook's {e}")
    if table is None:
        if not text.strip():
            raise ConfigError(f"{filename}: a notebook with no training output (no Step | Training Loss table from "
                              "transformers' notebook callback, no printed log dicts): run its cells and save it "
                              "with their outputs")
        report.note("no training table in the outputs: the cells' printed text read as a terminal transcript")
        try:
            run = transcript_run(text, filename, report, groups_per_step, logging_steps, group_size)
        except ConfigError as e:
            raise ConfigError(str(e).replace("expected a terminal transcript", "expected a notebook whose outputs "
                                             "have a training table or")) from None
        return _ended(run, errors)
    cell, rows = table
    report.note(f"steps from the training table of cell {cell} (transformers' notebook callback: one row per "
                "logging step, floats printed with 6 decimals, so values are as printed)")
    history = table_entries(rows, report)
    if "frac_reward_zero_std" not in rows[0]:
        report.note("the table has no frac_reward_zero_std column (transformers' table shows the loss only; "
                    "Unsloth's leaves that column out): the trainable ratio is unknown")
    totals = [d for d, _ in find_entries(text, report) if is_trl_summary(d)]
    gs = TRAIN_OUTPUT.findall(text)
    value, top_max = bars[-1] if bars else (None, None)
    last = max([d["step"] for d in history] + ([int(gs[-1])] if gs else []))
    if totals:
        history.append({**totals[-1], "step": int(gs[-1]) if gs else last})
    top = {"logging_steps": logging_steps, "max_steps": top_max, "global_step": last}
    run = parse_trl_history(history, top, report, groups_per_step, group_size)
    run.config["source"] = "trl-log"
    run.finished = bool(run.summary) or (value is not None and top_max is not None and value >= top_max)
    return _ended(run, errors)


def _ended(run: SourceRun, errors: list[str]) -> SourceRun:
    """A cell that raised (KeyboardInterrupt, an OOM) after training started: not finished."""
    if errors and not run.summary:
        run.finished = False
    return run
