"""The live page's charts element: figures of grpo_core.analysis.charts drawn by uPlot in the page.

charts.py stays the one definition of what a chart shows (plotly figures, also drawn as such by
the Analysis page and the HTML report). `spec` reads such a figure into uPlot's terms: one column
of steps shared by every line, each line's values at its own steps (None elsewhere: lines span
the gaps), fills, stacked bands, threshold lines and change markers. `draw_charts` mounts the
page's charts in one Streamlit components-v2 element (one element, one message per refresh, where
a chart per element made seven), whose script (assets/live_chart.js, sent once per page with
uPlot: `load`) runs in the page, lays the charts out two per row, keeps each one's uPlot chart
across refreshes and hands it the new columns only, so a reader's zoom survives a refresh; uPlot
(assets/uPlot.iife.min.js, MIT) is 51 kB against plotly.js' 4.7 MB, and draws on a canvas
(bench/chart_renderers.py: docs/benchmarks.md "Live charts"). `encode` makes a chart's bytes: a
short JSON header and the columns as raw little-endian floats (steps float64; values float32, or
float64 for a chart whose values float32 cannot hold), so neither Python nor the browser formats
or parses a number as text; `decode` reads them back (tests; assets/live_chart.js reads them in
the page). `pack` puts the charts' bytes in one message.

A refresh sends each chart only the rows it lacks (`update`): a new step appends rows to every
chart and changes none before them (old history is folded into bins 500 steps at a time), so the
bytes are the rows after the first one that changed, on top of the rows the chart holds (`apply`:
what the page does); a chart the page holds already is sent nothing. A chart that does not hold
what an update was made for (a page reloaded, a message replaced before it was sent) asks for
itself whole instead.
"""
from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).parent / "assets"
COMPONENT = "grpo_health_live_chart"
LIBRARY = "grpo_health_uplot"
FILL_ALPHA = 0.25  # a filled area under its line (plotly's fill='tozeroy', a stacked band)
FLOAT32_MAX = float(np.finfo(np.float32).max)  # a chart with a larger value sends its values as float64
DRAWN = ".live-chart canvas"  # a chart drawn in the page (assets/live_chart.js: uPlot's canvas in the chart's box)
SEND_RATE = 250_000  # bytes/s of chart data a live page is sent at most: a larger view refreshes less often


def spec(fig, height: int | None = None) -> dict:
    """uPlot's terms for a figure of charts.py, a plotly Figure or its plain dict (a live builder's
    `.plain`, what the live page draws) (scatter traces with lines, markers or both;
    `fill`, `stackgroup`, `line.shape == 'hv'`, `opacity`, `showlegend`, `legendgroup`; layout
    title, y title and range, threshold shapes across the plot and change markers at a step)."""
    # plotly's own plain dicts (BaseFigure._data, _layout), read not written: its public accessors
    # validate at every attribute read and to_plotly_json copies and base64-encodes every array, each
    # costlier than all of spec, which runs at every new step. tests/test_live_chart.py checks what
    # spec reads against the public accessors.
    traces, layout = (fig["data"], fig["layout"]) if isinstance(fig, dict) else (fig._data, fig._layout)
    lines = [_points(t["x"], t["y"]) for t in traces]
    stacked = any(t.get("stackgroup") for t in traces)
    if stacked:  # a stack draws running sums, the top band first so each lower one paints over it
        lines, traces = _stack(traces, lines)
    steps = np.unique(np.concatenate([x for x, _ in lines])) if lines else np.array([])
    yaxis = layout.get("yaxis", {})
    y_range = yaxis.get("range")
    columns = [_column(steps, x, y) for x, y in lines]
    return {"title": _text(layout.get("title")), "y_title": _text(yaxis.get("title")),
            "y_range": [float(v) for v in y_range] if y_range else None,
            "height": int(height or layout.get("height") or 300),
            "x": steps, "y": columns, "dtype": _dtype(columns),
            "series": [_series(t, stacked) for t in traces],
            "hlines": _hlines(layout), "vlines": _vlines(layout), "token": _token()}


def _token() -> int:
    """This chart's (this version's) token: 48 random bits, not a count, so no later chart can carry
    an old one's; an update names the token of the data it is made for (`update`)."""
    return int.from_bytes(os.urandom(6), "little")


def _text(title) -> str:
    return (title or {}).get("text") or ""


def encode(chart: dict, keep: int = 0, base: int = 0) -> bytes:
    """A chart (`spec`'s dict) as the page receives it: the byte length of a UTF-8 JSON header
    (uint32), the header (everything but the columns, with the values' "dtype" and the chart's
    "token", plus "n" rows sent, "lines", and "keep", "base": see `update`), padding to 8 bytes,
    the steps (float64), then each line's values (NaN: no point): its rows from `keep` on."""
    x = np.asarray(chart["x"], "<f8")[keep:]
    ys = [np.asarray(y, np.float64)[keep:] for y in chart["y"]]
    kind = chart["dtype"]
    head = {k: v for k, v in chart.items() if k not in ("x", "y")}
    head.update(n=len(x), lines=len(ys), keep=keep, base=base, token=chart.get("token", 0))
    text = json.dumps(head, allow_nan=False, separators=(",", ":")).encode()
    pad = b"\0" * (_columns_at(len(text)) - 4 - len(text))
    return b"".join([struct.pack("<I", len(text)), text, pad, x.tobytes(), *(y.astype("<" + kind).tobytes() for y in ys)])


def _dtype(columns: list[np.ndarray]) -> str:
    """The values' type on the wire (`spec`'s "dtype", decided once per chart for every viewer):
    float32 unless a value is beyond float32's range."""
    big = any(np.any(np.abs(y[np.isfinite(y)]) > FLOAT32_MAX) for y in columns)
    return "f8" if big else "f4"


def decode(data: bytes) -> dict:
    """`encode`'s bytes back as a dict: "x" the steps, "y" each line's values with None where it
    has no point (what assets/live_chart.js hands uPlot), and the header's "keep", "base", "token"."""
    head, size = _head(data)
    n, lines, dtype = head.pop("n"), head.pop("lines"), "<" + head.pop("dtype")
    at = _columns_at(size)
    x = np.frombuffer(data, "<f8", n, at)
    at += 8 * n
    width = np.dtype(dtype).itemsize * n
    ys = [np.frombuffer(data, dtype, n, at + i * width).astype(np.float64) for i in range(lines)]
    return {**head, "x": x.tolist(), "y": [[None if np.isnan(v) else v for v in y.tolist()] for y in ys]}


@dataclass(frozen=True)
class Sent:
    """What a page's chart was last sent: the chart (`spec`'s dict) and the bytes."""
    chart: dict
    data: bytes

    @property
    def token(self) -> int:
        """The token the data carries: the chart's."""
        return self.chart["token"]


def _now(key, fn):
    return fn()


def update(chart: dict, sent: Sent | None, memo: Callable[[tuple, Callable[[], Sent]], Sent] = _now) -> Sent:
    """What to send a page's chart that was last sent `sent` (None: nothing yet, or it asked for
    itself whole) so that it draws `chart`: `sent` itself when it is the chart sent (`draw_charts`
    then sends it nothing), else the rows from the first one that changed ("keep" rows kept) for
    the data carrying token "base", or the whole chart (keep 0).
    They depend on the chart and the one sent alone, so every viewer holding the same version is
    sent the same bytes: `memo(key, fn)` gives fn() or the answer of an earlier call with the same
    key (the live page's: live_cache.chart_update, made once for every viewer)."""
    if sent is not None and sent.chart is chart:
        return sent
    return memo((None if sent is None else sent.token, chart["token"]), lambda: _update(chart, sent))


def _update(chart: dict, sent: Sent | None) -> Sent:
    keep = 0 if sent is None else kept_rows(sent.chart, chart)
    return Sent(chart, encode(chart, keep=keep, base=sent.token if keep else 0))


def kept_rows(old: dict, new: dict) -> int:
    """How many leading rows (a step and every line's value at it) `new` shares with `old`: 0 when
    its lines are not old's (other series, values of another type on the wire)."""
    if old["series"] != new["series"] or len(old["y"]) != len(new["y"]) or old["dtype"] != new["dtype"]:
        return 0
    n = min(len(old["x"]), len(new["x"]))
    same = np.asarray(old["x"][:n]) == np.asarray(new["x"][:n])
    for a, b in zip(old["y"], new["y"]):
        a, b = np.asarray(a[:n], np.float64), np.asarray(b[:n], np.float64)
        same &= (a == b) | (np.isnan(a) & np.isnan(b))
    return int(n if same.all() else np.argmin(same))


def apply(held: dict | None, received: dict) -> dict | None:
    """What a page's chart draws once it receives `received` (`decode`'s dict) holding `held` (the
    last it drew, or None): the chart itself when whole (keep 0); its rows after the first "keep"
    of held when made for held (base == held's token); else None: the chart asks for itself whole
    (assets/live_chart.js does the same in the page)."""
    keep = received["keep"]
    if not keep:
        return received
    if held is None or held["token"] != received["base"] or len(held["x"]) < keep:
        return None
    return {**received, "x": held["x"][:keep] + received["x"],
            "y": [old[:keep] + new for old, new in zip(held["y"], received["y"])]}


def _head(data: bytes):
    """The JSON that `encode`'s and `pack`'s bytes open with (after its uint32 byte length), and that length."""
    (size,) = struct.unpack_from("<I", data)
    return json.loads(data[4:4 + size]), size


def _columns_at(header_size: int) -> int:
    """Where the columns start: after the uint32 and the header, at a multiple of 8 (the steps are
    viewed as a Float64Array in the page, which needs an aligned offset)."""
    return 4 + header_size + (-(4 + header_size) % 8)


def specs(figures: list[tuple[str, object]]) -> list[tuple[str, dict | None]]:
    """charts.live_charts' (key, figure or its dict, or None) as (key, its `spec` or None)."""
    return [(key, None if fig is None else spec(fig)) for key, fig in figures]


def payloads(figures: list[tuple[str, object]]) -> list[tuple[str, bytes | None]]:
    """charts.live_charts' (key, figure or its dict, or None) as (key, the whole chart's bytes or None)."""
    return [(key, None if chart is None else encode(chart)) for key, chart in specs(figures)]


def paced(period: float | None, sent: int) -> float | None:
    """A live page's refresh period for charts of `sent` bytes: `period` (the run's pace; None: no
    more refreshes), or longer for a view too large to resend that often: every step of a
    12,000-step run is megabytes, every 2 s a tab's whole link (an SSH tunnel) and its browser's work."""
    return None if period is None else max(period, sent / SEND_RATE)


def _points(x, y) -> tuple[np.ndarray, np.ndarray]:
    """A trace's (steps, values) in float64. A bin's min and max share its mid step: the second
    of equal steps moves 1e-3 of a step right, so both stay points of the line."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if len(x) > 1:
        x = x + np.concatenate([[0.0], np.where(np.diff(x) == 0, 1e-3, 0.0)])
    return x, y


def _stack(traces, lines):
    """Stacked traces as running sums (plotly's stackgroup), listed top first; other traces after."""
    stacked = [i for i, t in enumerate(traces) if t.get("stackgroup")]
    total, sums = 0.0, {}
    for i in stacked:
        x, y = lines[i]
        total = total + np.nan_to_num(y)
        sums[i] = (x, total.copy())
    order = stacked[::-1] + [i for i in range(len(traces)) if i not in sums]
    return [sums.get(i, lines[i]) for i in order], [traces[i] for i in order]


def _column(steps: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A line's values on the chart's steps: NaN where it has no point or no finite value
    (vectorised: this runs for every line at every new step)."""
    col = np.full(len(steps), np.nan)
    col[np.searchsorted(steps, x)] = y
    col[~np.isfinite(col)] = np.nan  # an infinite value is not a point uPlot can draw
    return col


def _rgba(colour: str | None, alpha: float) -> str | None:
    if not colour or not colour.startswith("#") or len(colour) != 7:
        return colour
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _series(trace: dict, stacked: bool) -> dict:
    line = trace.get("line", {})
    colour = line.get("color") or "#888888"
    filled = trace.get("fill") in ("tozeroy", "tonexty") or (stacked and bool(trace.get("stackgroup")))
    opacity = trace.get("opacity")
    return {"label": trace.get("name") or "", "stroke": colour, "width": float(line.get("width") or 1.6),
            "dash": line.get("dash") or None, "alpha": float(1.0 if opacity is None else opacity),
            "fill": _rgba(colour, FILL_ALPHA) if filled else None, "step": line.get("shape") == "hv",
            "points": "markers" in (trace.get("mode") or ""), "legend": trace.get("showlegend") is not False,
            "group": trace.get("legendgroup") or None}


def _hlines(layout: dict) -> list[dict]:
    """Lines across the plot at a y (xref 'paper'), each with the label charts._hline put at its y."""
    notes = {round(float(a["y"]), 9): a.get("text", "") for a in layout.get("annotations", ())
             if a.get("xref") == "paper" and a.get("yref") == "y"}
    return [{"y": float(s["y0"]), "colour": s["line"].get("color"), "dash": s["line"].get("dash") or "dash",
             "text": notes.get(round(float(s["y0"]), 9), "")}
            for s in layout.get("shapes", ()) if s.get("xref") == "paper" and s.get("yref") == "y"]


def _vlines(layout: dict) -> list[dict]:
    """Change markers: dotted lines at a step (yref 'paper'), with charts.marker_specs' label and
    hover text."""
    notes = {(a.get("name"), float(a["x"])): a for a in layout.get("annotations", ())
             if a.get("yref") == "paper" and a.get("xref") == "x"}
    out = []
    for s in layout.get("shapes", ()):
        if s.get("yref") != "paper" or s.get("xref") != "x":
            continue
        note = notes.get((s.get("name"), float(s["x0"])), {})
        out.append({"x": float(s["x0"]), "colour": s["line"].get("color"), "label": note.get("text", ""),
                    "hover": note.get("hovertext") or f"step {int(s['x0'])}"})
    return out


# The charts two per row (Streamlit's st.columns(2): its small gap; one per row on a narrow screen,
# as Streamlit's columns stack there), and a change marker's note under its chart.
GRID_CSS = """.live-charts { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 1rem; }
@media (max-width: 640px) { .live-charts { grid-template-columns: minmax(0, 1fr); } }
.live-chart .change-note { font-size: 11px; min-height: 14px; }
"""

# The charts element's own script: the drawing is live_chart.js's, which the library element defines
# once per page; a components-v2 element's script travels with each of its updates (live_chart.js'
# 8 kB at every refresh, were it the charts element's own).
CHART_JS = """export default function draw(component) {
  if (!globalThis.grpoHealthLiveChart) {  // the library element (live_chart.load) defines it: wait
    requestAnimationFrame(() => draw(component));
    return;
  }
  globalThis.grpoHealthLiveChart(component);
}
"""


@cache
def _components():
    """(the library, the charts element), registered once per process. The library is an element
    of its own, mounted once per page (`load`) with the same message each time: uPlot, the charts'
    drawing (assets/live_chart.js) and their CSS, which then do not travel with the charts' data
    at every refresh (a components-v2 element's script and CSS are part of each of its messages);
    the charts element's own script only hands its data to the drawing. Inline CSS spans two lines
    (a one-line string reads as a file path)."""
    import streamlit as st
    js = "\n".join([(ASSETS / "uPlot.iife.min.js").read_text(), "globalThis.uPlot = uPlot;",
                    (ASSETS / "live_chart.js").read_text(), "export default function () {}", ""])
    css = (ASSETS / "uPlot.min.css").read_text() + "\n" + GRID_CSS
    library = st.components.v2.component(LIBRARY, js=js, css=css, isolate_styles=False)
    charts = st.components.v2.component(COMPONENT, js=CHART_JS, isolate_styles=False)  # no shadow DOM: the CSS applies
    return library, charts


def load():
    """Mount uPlot and the charts' drawing on the page (once per page, anywhere: a chart waits for
    it). Before the charts, a new page's first chart comes sooner: the browser evaluates uPlot
    while the charts' data is on its way, where after them every chart waited for it
    (docs/benchmarks.md "Live page: viewers")."""
    _components()[0](key="uplot_library")


def pack(charts: list[tuple[str, int, bytes | None]]) -> bytes:
    """The charts element's data: (name, token, bytes or None) per chart, in the order drawn. The
    byte length of a UTF-8 JSON directory (uint32), the directory (each chart's "key", "token" and
    "size", 0 for a chart sent nothing: the element holds that token already), then each sent
    chart's bytes (`encode`'s, whole or an `update`'s) one after another."""
    head = json.dumps([{"key": name, "token": token, "size": len(data or b"")} for name, token, data in charts],
                      separators=(",", ":")).encode()
    return b"".join([struct.pack("<I", len(head)), head, *(data for _, _, data in charts if data)])


def unpack(data: bytes) -> list[dict]:
    """`pack`'s bytes back: each chart's "key", "token" and "data" (its bytes, or None)."""
    directory, size = _head(data)
    at, out = 4 + size, []
    for entry in directory:
        out.append({"key": entry["key"], "token": entry["token"], "data": data[at:at + entry["size"]] or None})
        at += entry["size"]
    return out


def draw(chart: bytes, key: str):
    """Mount one chart's bytes (`encode`'s) as a charts element of its own (`key`), drawn whole at
    each run (benches and tests: a page of one chart). The page calls `load` too."""
    token = _head(chart)[0]["token"]
    return _components()[1](data=pack([(key, token, chart)]), key=key, on_resend_change=lambda: None)


def draw_charts(charts: list[tuple[str, dict]], key: str, held: MutableMapping,
                memo: Callable[[tuple, Callable[[], Sent]], Sent] = _now) -> int:
    """Draw `charts` ((name, `spec`'s dict), in the order shown: two per row) in one element `key`,
    sending each only what it lacks: `held` is the session's record of what each chart was sent
    (name -> Sent), kept across refreshes; a chart the element holds already is sent nothing; a
    chart the element asks to have whole is dropped from it (`forget`), so the next run sends it
    whole. `memo` as `update`'s. The bytes sent."""
    entries = []
    for name, chart in charts:
        before = held.get(name)
        sent = held[name] = update(chart, before, memo)
        entries.append((name, sent.token, None if sent is before else sent.data))
    data = pack(entries)
    _components()[1](data=data, key=key, on_resend_change=lambda: forget(held, _asked(key)))
    return len(data)


def forget(held: MutableMapping, names: list[str] | None):
    """Drop what the element was sent of the charts `names` (None: of every chart)."""
    for name in list(held) if names is None else names:
        held.pop(name, None)


def _asked(key: str) -> list[str] | None:
    """The charts the element `key` asked to have whole (its "resend" trigger: assets/live_chart.js),
    read in the callback of the run it started; None when it did not name them."""
    import streamlit as st
    names = (st.session_state.get(key) or {}).get("resend")
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
