"""The report: every analysis of one run in one object, and its export as self-contained HTML, Markdown or CSV.

build_report reads the run once (run_data.load_run) and gathers, in the order a reader
needs them: the notices, trainability, the variance bottlenecks, the change ledger, the
reward trend, the held-out evaluations and example groups. The HTML inlines plotly.js, so it
opens offline; its figures are charts.py's, as on the analysis page. The page
(pages/analysis.py) and the CLI (`python -m grpo_core report RUN`) only call these; nothing
here imports torch.
"""
from __future__ import annotations

import html
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from grpo_core.analysis import charts, flat_causes, health
from grpo_core.analysis.formatting import cell, fmt
from grpo_core.analysis.inspector import GroupView, inspect_group
from grpo_core.analysis.ledger import change_ledger
from grpo_core.analysis.run_data import DEFAULT_WINDOW, Notice, ReportError, RunData, load_run, notices
from grpo_core.analysis.run_tables import (
    bottleneck_summary,
    bottlenecks,
    eval_table,
    reward_trend,
    steps_table,
    trainability,
    wasted_sampling,
)
from grpo_core.errors import ConfigError
from grpo_core.runs.config import HealthConfig, from_dict
from grpo_core.runs.names import FLAT_CAUSES, GROUPS_SOLVED
from grpo_core.runs.schema import DB_NAME


@dataclass
class Report:
    data: RunData
    window: int
    notices: list[Notice]
    steps: pd.DataFrame
    summary: dict
    bottlenecks: pd.DataFrame
    bottleneck_text: str
    ledger: pd.DataFrame
    trend: dict
    verdict: object | None
    examples: list[GroupView] = field(default_factory=list)
    evaluation: pd.DataFrame = field(default_factory=pd.DataFrame)  # eval_table(data)
    flat: pd.DataFrame | None = None  # flat_causes.summary: why the flat groups were flat (None: not recorded)


def build_report(run, window: int = DEFAULT_WINDOW, examples: bool = True) -> Report:
    """Everything the report shows for one run (a run dir, run.db, open store or RunData)."""
    if int(window) < 1:
        raise ConfigError(f"window must be >= 1 step, got {window}")
    data = load_run(run, window=int(window))
    steps = steps_table(data, window)
    summary = trainability(steps, window)
    bn = bottlenecks(data)
    ledger = change_ledger(data, steps, window)
    min_pts = int(data.cfg("health", "min_trend_points", 5) or 5)
    trend = reward_trend(steps, window, min_pts)
    ver = _verdict(data)
    rep = Report(data, window, notices(data), steps, summary, bn, bottleneck_summary(bn), ledger, trend, ver)
    if examples:
        rep.examples = _example_groups(data)
    rep.evaluation = eval_table(data)
    rep.flat = flat_causes.summary(data.wide, window)
    return rep


def _verdict(data: RunData):
    if data.wide.empty:
        return None
    try:
        hcfg = from_dict({"health": data.config.get("health") or {}}).health
    except ConfigError:
        hcfg = HealthConfig()  # an imported config of another shape: the defaults
    return health.verdict(data.wide, hcfg, data.cfg("reward", "outcome_metric", "") or None)


def _example_groups(data: RunData) -> list[GroupView]:
    """From the last step with rollouts: one trainable, one not trainable, one phantom group."""
    g = data.groups
    if g.empty or data.rollouts.empty:
        return []
    have = set(zip(data.rollouts["step"], data.rollouts["group"]))
    g = g[[(s, k) in have for s, k in zip(g["step"], g["group"])]]
    out = []
    for mask in (g["trainable"], ~g["trainable"] & ~g["phantom"], g["phantom"]):
        pick = g[mask]
        if len(pick):
            row = pick.iloc[-1]
            out.append(inspect_group(data, int(row["step"]), int(row["group"])))
    return out


SUMMARY_ROWS = [("steps", "steps logged"), ("last_step", "last step"), ("submitted", "groups submitted"),
                ("trainable", "groups trainable"), ("ratio", "trainable ratio (pooled)"),
                ("final_ratio", "trainable ratio, last window"), ("phantom", "phantom-variance groups"),
                ("zero_trainable_steps", "steps with zero trainable groups")]
BOTTLENECK_COLS = ["metric", "weight", "mean_group_std", "contribution", "uniform_fraction", "bottleneck"]
LEDGER_SHOW = ["step", "kind", "source", "change", "before", "after", "ratio_before", "ratio_after", "ratio_diff",
               "reward_before", "reward_after", "reward_diff", "reward_std_before", "reward_std_after",
               "reward_std_diff", "reward_diff_same_weights", "reuse", "note", "reason"]
STEP_COLS = ["submitted", "trainable", "ratio", "cum_ratio", "ratio_rolling", "phantom", "reward", "reward_std"]


def unknown(what: str) -> str:
    """What a report cell says for a number the run never logged: never 'none' or 0."""
    return f"unknown (the source did not log {what})"


NO_RATIO = "a trainable ratio: no frac_reward_zero_std, no group counts"
NO_COUNTS = "group counts, only a ratio (pass groups_per_step to the import for counts)"
NO_GROUPS = "per-group data"


def _summary_value(rep: Report, key: str) -> str:
    """One summary cell: the number, or 'unknown (...)' where the source did not log it, so
    an empty list ('none') or a dash is said only of what was logged."""
    s, steps = rep.summary, rep.steps
    has_ratio = bool(steps["ratio"].notna().any())
    v = s.get(key)
    if key in ("submitted", "trainable") and v is None:
        return unknown(NO_COUNTS if has_ratio else NO_RATIO)
    if key in ("ratio", "final_ratio", "zero_trainable_steps") and not has_ratio:
        return unknown(NO_RATIO)
    if key == "phantom" and v is None:
        return unknown(NO_GROUPS)
    return fmt(v)


def summary_rows(rep: Report) -> list[tuple[str, str, str]]:
    """(key, label, formatted value) for the summary table."""
    rows = [(k, label, _summary_value(rep, k)) for k, label in SUMMARY_ROWS]
    t, s = rep.trend, rep.summary
    no_reward = not rep.steps["reward"].notna().any()
    rows += [("reward_final", "reward, final step", unknown("a reward") if no_reward else fmt(t.get("final"))),
             ("reward_best", "reward, best step", unknown("a reward") if no_reward else fmt(t.get("best"))),
             ("trend_run", "reward trend, whole run", unknown("a reward") if no_reward else t["run_text"]),
             ("trend_last", f"reward trend, last {rep.window} steps", unknown("a reward") if no_reward
              else t["last_text"])]
    wasted = wasted_sampling(rep.data)
    if wasted is not None:
        rows.append(("wasted_sampling", "sampling that taught nothing", wasted))
    if not s.get("every_step", True):  # logged every few steps: say what a window holds
        rows.append(("window", "window", f"{rep.window} trainer steps ({s['window_entries']} logged entries)"))
    if rep.verdict is not None:
        rows.append(("verdict", "health verdict (last window)", rep.verdict.status))
    return rows


FLAT_HEADER = ["cause", "groups", "share of flat groups", "last window", "what it means"]


def flat_text(rep: Report) -> str:
    """Why the run's flat groups were flat, in a sentence: the dominant cause, or unknown."""
    flat = rep.flat
    if flat is None:
        return "unknown (the run did not record why each flat group was flat" + (
            ": it logged only all solved / none solved)" if GROUPS_SOLVED in rep.data.wide.columns else ")")
    total = flat["groups"].sum()
    if not total:
        return "No flat groups: every group the run submitted could train."
    top = flat.iloc[0]
    return (f"{fmt(total)} flat groups over the run; the most, {top['share']:.0%}, were {top['cause']}: "
            f"{top['meaning']}. One cause per group: the first that holds, in the order "
            + " > ".join(FLAT_CAUSES) + ".")


def _flat_rows(flat) -> list[list[str]]:
    return [[r["cause"], fmt(r["groups"]), f"{r['share']:.0%}", fmt(r["last_window"]), r["meaning"]]
            for _, r in flat.iterrows()]


def no_changes_text(rep: Report) -> str:
    """An imported run's source records no setting changes: unknown, not 'no changes'."""
    if rep.data.imported:
        return "No changes recorded: the source does not log setting changes, so whether any were made is unknown."
    return "No applied changes."


def steps_csv(rep: Report) -> str:
    """The per-step table plus every logged scalar (names.* columns)."""
    extra = rep.data.wide.drop(columns=[c for c in rep.data.wide.columns if c in STEP_COLS], errors="ignore")
    df = rep.steps.join(extra.reindex(rep.steps.index))
    buf = io.StringIO()
    df.to_csv(buf, index_label="step")
    return buf.getvalue()


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _status_text(d: RunData) -> str:
    """The status, with the importer's detail ('incomplete: step 200 of 350')."""
    return d.meta.get("status_detail") or d.status


def to_markdown(rep: Report) -> str:
    d = rep.data
    out = [f"# GRPO Health report: {d.run_id}", "",
           f"status: **{_status_text(d)}** · source: {d.source} · window: {rep.window} steps", ""]
    out += [f"> **{n.level}**: {n.text}" for n in rep.notices] + ([""] if rep.notices else [])
    if not len(rep.steps):
        return "\n".join(out) + "\n"
    out += ["## Trainability", "", _md_table(["", "value"], [[lab, v] for _, lab, v in summary_rows(rep)]), ""]
    if rep.verdict is not None:
        out += [f"- {c.text}" for c in rep.verdict.checks] + [f"- alert ({a.severity}): {a.message}"
                                                              for a in rep.verdict.alerts] + [""]
    out += ["## Why groups were flat", "", flat_text(rep), ""]
    if rep.flat is not None:
        out += [_md_table(FLAT_HEADER, _flat_rows(rep.flat)), ""]
    out += ["## Variance bottlenecks", "", rep.bottleneck_text, ""]
    if len(rep.bottlenecks):
        out += [_md_table(BOTTLENECK_COLS + ["why"], [[cell(c, r[c]) for c in BOTTLENECK_COLS] + [r["why"]]
                                                      for _, r in rep.bottlenecks.iterrows()]), ""]
    out += ["## Change ledger", "", f"Windows: up to {rep.window} steps before / from each change, never across "
            "a neighbouring change.", ""]
    if len(rep.ledger):
        out += [_md_table(LEDGER_SHOW, [[cell(c, r[c]) for c in LEDGER_SHOW] for _, r in rep.ledger.iterrows()]), ""]
    else:
        out += [no_changes_text(rep), ""]
    if len(rep.evaluation):
        cols = list(rep.evaluation.columns)
        out += ["## Held-out evaluation", "", _md_table(["step"] + cols, [[str(s)] + [fmt(r[c]) for c in cols]
                                                                          for s, r in rep.evaluation.iterrows()]), ""]
    if rep.examples:
        out += ["## Example groups (last step with rollouts)", ""]
        for gv in rep.examples:
            out += [f"**step {gv.step}, group {gv.group}** — {gv.explanation}", ""]
            if gv.prompt:
                out += ["```text", gv.prompt, "```", ""]
    out += ["## Per step", "", _md_table(["step"] + STEP_COLS, [[str(s)] + [cell(c, r[c]) for c in STEP_COLS]
                                                                for s, r in rep.steps.iterrows()]), ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.notice{padding:.5em 1em;margin:.3em 0;border-left:4px solid}
.info{border-color:#3182bd;background:#eef5fb}.warning{border-color:#e6550d;background:#fdf1e8}
.error{border-color:#a50f15;background:#fbe9ea}.why{font-size:.9em;color:#555}
pre{white-space:pre-wrap;margin:0}.wrap{overflow-x:auto}td.t,th{text-align:left}td:not(.t){white-space:nowrap}"""


def _html_table(table_id: str, cols: list[str], rows: list[list[str]], keys: list[str] | None = None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        key = f' data-key="{e(keys[i])}"' if keys else ""
        tds = "".join(f'<td data-col="{e(c)}"{"" if _numeric(v) else " class=t"}>{e(v)}</td>'
                      for c, v in zip(cols, r))
        body.append(f"<tr{key}>{tds}</tr>")
    return (f'<div class="wrap"><table id="{e(table_id)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _numeric(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return text == "—"


def _fig_html(fig, div_id: str, first: bool) -> str:
    # plotly.js inlined once (the report must open offline; no CDN), no logo link.
    return fig.to_html(full_html=False, include_plotlyjs=bool(first), div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def to_html(rep: Report) -> str:
    """One self-contained HTML file: no external scripts, styles, fonts or links."""
    d, e = rep.data, html.escape
    parts = [f"<h1>GRPO Health report: {e(d.run_id)}</h1>",
             f"<p>status: <b id='status'>{e(_status_text(d))}</b> · source: {e(d.source)} · window: {rep.window} steps</p>"]
    parts += [f'<div class="notice {e(n.level)}">{e(n.text)}</div>' for n in rep.notices]
    if len(rep.steps):
        rows = summary_rows(rep)
        parts += ["<h2>Trainability</h2>",
                  _html_table("summary", ["", "value"], [[lab, v] for _, lab, v in rows], [k for k, _, _ in rows])]
        if rep.verdict is not None:
            parts.append("<ul>" + "".join(f"<li>{e(c.text)}</li>" for c in rep.verdict.checks)
                         + "".join(f"<li><b>{e(a.severity)}</b>: {e(a.message)}</li>" for a in rep.verdict.alerts)
                         + "</ul>")
        parts.append(_fig_html(charts.trainability_chart(rep.steps, rep.ledger), "fig-ratio", True))
        parts += ["<h2>Why groups were flat</h2>", f"<p id='flat-text'>{e(flat_text(rep))}</p>"]
        if rep.flat is not None:
            parts += [_html_table("flat-causes", FLAT_HEADER, _flat_rows(rep.flat), list(rep.flat["cause"])),
                      _fig_html(charts.flat_causes_chart(d.wide, rep.ledger), "fig-flat", False)]
        parts += ["<h2>Variance bottlenecks</h2>", f"<p id='bottleneck-text'>{e(rep.bottleneck_text)}</p>"]
        if len(rep.bottlenecks):
            parts.append(_html_table("bottlenecks", BOTTLENECK_COLS + ["why"],
                                     [[cell(c, r[c]) for c in BOTTLENECK_COLS] + [r["why"]]
                                      for _, r in rep.bottlenecks.iterrows()], list(rep.bottlenecks["metric"])))
            if rep.bottlenecks["uniform_fraction"].notna().any():
                parts.append(_fig_html(charts.bottlenecks_chart(rep.bottlenecks), "fig-bottlenecks", False))
        parts += ["<h2>Change ledger</h2>", f"<p>Windows: up to {rep.window} steps before / from each change, never "
                  "across a neighbouring change; step N is the first step under the new setting.</p>"]
        if len(rep.ledger):
            parts.append(_html_table("ledger", LEDGER_SHOW, [[cell(c, r[c]) for c in LEDGER_SHOW]
                                                             for _, r in rep.ledger.iterrows()],
                                     [str(i) for i in range(len(rep.ledger))]))
        else:
            parts.append(f"<p>{e(no_changes_text(rep))}</p>")
        parts += ["<h2>Reward</h2>", _fig_html(charts.reward_trend_chart(rep.steps, rep.trend, rep.ledger), "fig-reward", False)]
        if len(rep.evaluation):
            cols = list(rep.evaluation.columns)
            parts += ["<h2>Held-out evaluation</h2>", _fig_html(charts.eval_chart(d.wide, rep.ledger), "fig-eval", False),
                      _html_table("evaluation", ["step"] + cols, [[str(s)] + [fmt(r[c]) for c in cols]
                                                                  for s, r in rep.evaluation.iterrows()])]
        if rep.examples:
            parts.append("<h2>Example groups (last step with rollouts)</h2>")
            for gv in rep.examples:
                cols = list(gv.table.columns)
                text = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)  # noqa: E731
                parts += [f"<h3>step {gv.step}, group {gv.group}</h3>", f"<p class='why'>{e(gv.explanation)}</p>",
                          f"<pre class='prompt'>{e(gv.prompt)}</pre>" if gv.prompt else "",
                          _html_table(f"group-{gv.step}-{gv.group}", cols,
                                      [[text(r[c]) if c in ("completion", "error") else cell(c, r[c]) for c in cols]
                                       for _, r in gv.table.iterrows()])]
        parts += ["<h2>Per step</h2><details><summary>table</summary>",
                  _html_table("steps", ["step"] + STEP_COLS, [[str(s)] + [cell(c, r[c]) for c in STEP_COLS]
                                                              for s, r in rep.steps.iterrows()]), "</details>"]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>GRPO Health report: {e(d.run_id)}</title><style>{_CSS}</style></head><body>"
            + "\n".join(parts) + "</body></html>")


def cli_report(args) -> int:
    """`python -m grpo_core report RUN [--out report.html|report.md|steps.csv]`: Markdown to stdout, or the file."""
    out = getattr(args, "out", None)
    suffix = Path(out).suffix.lower() if out else None
    if out and suffix not in (".html", ".htm", ".md", ".csv"):
        raise ConfigError(f"--out must end in .html, .md or .csv (the format is taken from the suffix), got {out!r}")
    try:
        rep = build_report(args.run, window=getattr(args, "window", None) or DEFAULT_WINDOW)
    except ReportError as e:
        raise ConfigError(str(e)) from None
    if not out:
        try:
            print(to_markdown(rep))
        except BrokenPipeError:  # `report RUN | head`: the reader left, not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return 0
    text = to_html(rep) if suffix in (".html", ".htm") else to_markdown(rep) if suffix == ".md" else steps_csv(rep)
    path = Path(out)
    if path.parent and not path.parent.is_dir():
        raise ConfigError(f"--out: folder {str(path.parent)!r} does not exist")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # never a half-written report
    print(f"wrote {path} ({len(text.encode()) // 1024} KiB)")
    for n in rep.notices:
        print(f"{n.level}: {n.text}")
    return 0


def store_stamp(run) -> tuple:
    """(mtime_ns, size) of a run's store file and of its write-ahead log, None for one that
    is not there: it changes whenever the trainer writes, so a report cached under it (the
    analysis page's st.cache_data) is rebuilt for a live run's new steps. run: a run dir or
    its store file."""
    p = Path(run)
    db = p if p.suffix == ".db" else p / DB_NAME
    out = []
    for f in (db, db.with_name(db.name + "-wal")):  # SQLite's WAL file: the db's name + "-wal"
        try:
            s = os.stat(f)
            out.append((s.st_mtime_ns, s.st_size))
        except OSError:
            out.append(None)
    return tuple(out)
