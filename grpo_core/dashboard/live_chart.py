"""The live page's chart element: a figure of grpo_core.analysis.charts drawn by uPlot in the page.

charts.py stays the one definition of what a chart shows (plotly figures, also drawn as such by
the Analysis page and the HTML report). `spec` reads such a figure into uPlot's terms: one column
of steps shared by every line, each line's values at its own steps (None elsewhere: lines span
the gaps), fills, stacked bands, threshold lines and change markers. `draw` mounts it in a
Streamlit components-v2 element (assets/live_chart.js) whose script runs in the page, keeps its
uPlot chart across refreshes and hands it the new columns only, so a reader's zoom survives a
refresh; uPlot (assets/uPlot.iife.min.js, MIT) is 51 kB against plotly.js' 4.7 MB, and draws on a
canvas (bench/chart_renderers.py: docs/benchmarks.md "Live charts").
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).parent / "assets"
COMPONENT = "grpo_health_live_chart"
LIBRARY = "grpo_health_uplot"
FILL_ALPHA = 0.25  # a filled area under its line (plotly's fill='tozeroy', a stacked band)
DIGITS = 6  # significant digits sent per value: more than a chart or its legend shows


def spec(fig, height: int | None = None) -> dict:
    """uPlot's terms for a plotly figure of charts.py (scatter traces with lines, markers or both;
    `fill`, `stackgroup`, `line.shape == 'hv'`, `opacity`, `showlegend`, `legendgroup`; layout
    title, y title and range, threshold shapes across the plot and change markers at a step)."""
    traces = list(fig.data)
    stacked = [t for t in traces if getattr(t, "stackgroup", None)]
    lines = [_points(t) for t in traces]
    if stacked:  # a stack draws running sums, the top band first so each lower one paints over it
        lines, traces = _stack(traces, lines)
    steps = np.unique(np.concatenate([x for x, _ in lines])) if lines else np.array([])
    y_range = fig.layout.yaxis.range
    return {"title": fig.layout.title.text or "", "y_title": fig.layout.yaxis.title.text or "",
            "y_range": [float(v) for v in y_range] if y_range else None,
            "height": int(height or fig.layout.height or 300),
            "x": steps.tolist(), "y": [_column(steps, x, y) for x, y in lines],
            "series": [_series(t, bool(stacked)) for t in traces],
            "hlines": _hlines(fig.layout), "vlines": _vlines(fig.layout)}


def _points(trace) -> tuple[np.ndarray, np.ndarray]:
    """A trace's (steps, values) in float64. A bin's min and max share its mid step: the second
    of equal steps moves 1e-3 of a step right, so both stay points of the line."""
    x = np.asarray(trace.x, np.float64)
    y = np.asarray(trace.y, np.float64)
    if len(x) > 1:
        x = x + np.concatenate([[0.0], np.where(np.diff(x) == 0, 1e-3, 0.0)])
    return x, y


def _stack(traces, lines):
    """Stacked traces as running sums (plotly's stackgroup), listed top first; other traces after."""
    stacked = [i for i, t in enumerate(traces) if getattr(t, "stackgroup", None)]
    total, sums = 0.0, {}
    for i in stacked:
        x, y = lines[i]
        total = total + np.nan_to_num(y)
        sums[i] = (x, total.copy())
    order = stacked[::-1] + [i for i in range(len(traces)) if i not in sums]
    return [sums.get(i, lines[i]) for i in order], [traces[i] for i in order]


def _column(steps: np.ndarray, x: np.ndarray, y: np.ndarray) -> list:
    col = np.full(len(steps), np.nan)
    col[np.searchsorted(steps, x)] = y
    col = np.where(np.isfinite(col), col, np.nan)
    return [None if v != v else float(f"{v:.{DIGITS}g}") for v in col.tolist()]


def _rgba(colour: str | None, alpha: float) -> str | None:
    if not colour or not colour.startswith("#") or len(colour) != 7:
        return colour
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _series(trace, stacked: bool) -> dict:
    line = trace.line
    colour = line.color or "#888888"
    filled = trace.fill in ("tozeroy", "tonexty") or (stacked and bool(trace.stackgroup))
    return {"label": trace.name or "", "stroke": colour, "width": float(line.width or 1.6),
            "dash": line.dash or None, "alpha": float(trace.opacity if trace.opacity is not None else 1.0),
            "fill": _rgba(colour, FILL_ALPHA) if filled else None, "step": line.shape == "hv",
            "points": "markers" in (trace.mode or ""), "legend": trace.showlegend is not False,
            "group": trace.legendgroup or None}


def _hlines(layout) -> list[dict]:
    """Lines across the plot at a y (xref 'paper'), each with the label charts._hline put at its y."""
    notes = {round(float(a.y), 9): a.text for a in layout.annotations or () if a.xref == "paper" and a.yref == "y"}
    return [{"y": float(s.y0), "colour": s.line.color, "dash": s.line.dash or "dash",
             "text": notes.get(round(float(s.y0), 9), "")}
            for s in layout.shapes or () if s.xref == "paper" and s.yref == "y"]


def _vlines(layout) -> list[dict]:
    """Change markers: dotted lines at a step (yref 'paper'), with charts.marker_specs' label and
    hover text."""
    notes = {(a.name, float(a.x)): a for a in layout.annotations or () if a.yref == "paper" and a.xref == "x"}
    out = []
    for s in layout.shapes or ():
        if s.yref != "paper" or s.xref != "x":
            continue
        note = notes.get((s.name, float(s.x0)))
        out.append({"x": float(s.x0), "colour": s.line.color, "label": note.text if note else "",
                    "hover": (note.hovertext if note else None) or f"step {int(s.x0)}"})
    return out


@cache
def _components():
    """(uPlot, the chart element), registered once per process. uPlot is an element of its own,
    mounted once per page (`load`) with the same message each time, which Streamlit's message
    cache then sends as a reference: the 51 kB library does not travel with each chart's data at
    every refresh. Inline CSS spans two lines (a one-line string reads as a file path)."""
    import streamlit as st
    library = st.components.v2.component(
        LIBRARY, js=(ASSETS / "uPlot.iife.min.js").read_text() + "\nglobalThis.uPlot = uPlot;\nexport default function () {}\n")
    css = (ASSETS / "uPlot.min.css").read_text() + "\n.live-chart .change-note { font-size: 11px; min-height: 14px; }\n"
    chart = st.components.v2.component(COMPONENT, js=(ASSETS / "live_chart.js").read_text(), css=css, isolate_styles=False)
    return library, chart


def load():
    """Mount uPlot on the page (once per page, anywhere: a chart waits for it)."""
    _components()[0](key="uplot_library")


def draw(chart: dict, key: str):
    """Mount a chart (`spec`'s dict) in the current Streamlit container; `key` keeps it the same
    element, and the same uPlot chart, from one refresh to the next. The page calls `load` too."""
    return _components()[1](data=chart, key=key)
