"""The live page's charts drawn by plotly (what the page drew until issue 29), by Apache ECharts
(Streamlit's st.echarts_chart) and by uPlot (grpo_core.dashboard.live_chart, what the page draws):
a new page's first chart, the browser's CPU and the bytes sent while the charts redraw, and
whether a reader's zoom survives a redraw.

All pages draw the same figures, charts.live_charts of the live_viewers bench's cached
10,000-step run (trained once by bench/live_viewers.py), two per row, in a fragment that
redraws every 2 s (live_cache.MIN_REFRESH_S, a fast run's period) with the last point moved,
as a new step moves it. The ECharts page draws each figure's lines only (no threshold or
change-marker lines, no filled areas): a lower bound of what it would cost for these charts.
One headless Chromium, not niced, on a box the bench has to itself (no trainer): the renderers'
own costs. Per renderer: --loads new pages (a new browser context each), the time
from navigation to the first chart drawn; then one page watched for --watch-s seconds
(Chromium's CPU from /proc, the websocket's bytes); then a drag across its first chart and two
redraws. Writes "Live charts: plotly, ECharts, uPlot" in docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from live_viewers import history  # noqa: E402
from live_viewers_pages import CHROME_ARGS, chromium_pids, cpu_seconds, cpu_share, new_context  # noqa: E402
from perf_common import machine, publish  # noqa: E402

from grpo_core.dashboard import live_cache  # noqa: E402
from tests.helpers_dashboard import CHROMIUM, answers, free_port, wait_for  # noqa: E402

HEADING = "## Live charts: plotly, ECharts, uPlot"
JS = ROOT / "grpo_core" / "dashboard" / "assets" / "live_chart.js"  # the uPlot element's script
# The page both renderers share; RENDER draws one figure (`fig`, key `key`) in column `col`.
PAGE = '''import sys, time
import numpy as np
import streamlit as st
from grpo_core.analysis import charts
from grpo_core.dashboard import live_chart, live_view
st.set_page_config(layout="wide")
state = live_view.load(sys.argv[1])
frame = live_view.chart_frame(state)


def echarts(fig):
    series = [{{"type": "line", "name": t.name, "showSymbol": False, "connectNulls": True, "animation": False,
                "data": [[x, y if y == y else None] for x, y in zip(np.asarray(t.x, float).tolist(), np.asarray(t.y, float).tolist())],
                "lineStyle": {{"width": 1 if t.opacity else 1.6, "opacity": t.opacity or 1}}}} for t in fig.data]
    return {{"title": {{"text": fig.layout.title.text}}, "animation": False, "tooltip": {{"trigger": "axis"}},
            "xAxis": {{"type": "value", "name": "step"}}, "yAxis": {{"type": "value"}}, "legend": {{"bottom": 0}},
            "grid": {{"left": 50, "right": 10, "top": 40, "bottom": 50}}, "series": series}}


@st.fragment(run_every={refresh})
def charts_now():
    st.progress(0.5, text=f"redrawn at {{time.time():.1f}}")
    moved = frame.copy()
    moved.iloc[-1] = moved.iloc[-1] * (1 + (time.time() % 7) / 100)  # a new step moves the last point
    figs = [(k, f) for k, f in charts.live_charts(moved, state.metrics, state.changes, live_view.health_config(state.meta),
                                                  None, smoothing=0.6) if f is not None]
    cols = st.columns(2)
    for i, (key, fig) in enumerate(figs):
        with cols[i % 2]:
            {render}


charts_now()
{after}
'''
RENDERERS = {  # name -> (the draw call, the selector of a drawn chart, JS: the first chart's x range or null, page end)
    "plotly": ('st.plotly_chart(fig, key=key, width="stretch")', ".js-plotly-plot .main-svg",
               "(() => { const g = document.querySelector('.js-plotly-plot'); return g && g._fullLayout.xaxis.range.map(Number); })()",
               ""),
    "ECharts": ('st.echarts_chart(echarts(fig), key=key, height=300)', "[data-testid=stEChartsChart] canvas", "null", ""),
    "uPlot": ('live_chart.draw(live_chart.encode(live_chart.spec(fig)), key=key)', ".live-chart canvas",
              "(() => { const c = document.querySelector('.live-chart').chart; return [c.scales.x.min, c.scales.x.max]; })()",
              "live_chart.load()  # as the live page: uPlot once, outside the fragment"),
}


def zoom_kept(page, selector: str, x_range: str, refresh_s: float) -> bool | None:
    """Drag across the first chart (both libraries zoom the x axis on a drag), wait two redraws:
    whether the range the drag set is still shown. None: the chart did not zoom (ECharts: no
    dataZoom configured; with one, Streamlit's notMerge would reset it)."""
    box = page.locator(selector).first.bounding_box()
    before = page.evaluate(x_range)
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.4)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=8)
    page.mouse.up()
    zoomed = page.evaluate(x_range)
    if zoomed is None or zoomed == before:
        return None
    page.wait_for_timeout(2.5 * refresh_s * 1000)
    after = page.evaluate(x_range)
    return all(abs(a - z) < 1e-6 * max(1.0, abs(z)) for a, z in zip(after, zoomed))


def measure(name: str, run_dir: Path, work: Path, args) -> dict:
    """Serve the page with one renderer; first-chart times of --loads new pages, then the browser's
    CPU share while one page watches."""
    from playwright.sync_api import sync_playwright
    render, selector, x_range, after = RENDERERS[name]
    app = work / f"{name}.py"
    app.write_text(PAGE.format(refresh=live_cache.MIN_REFRESH_S, render=render, after=after))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true",
                               "--server.fileWatcherType", "none", "--browser.gatherUsageStats", "false",
                               "--runner.postScriptGC", "false", "--", str(run_dir)],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(url), 120, every=0.2, what="Streamlit to answer")
        firsts = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROME_ARGS)
            try:
                for _ in range(args.loads):
                    ctx = new_context(browser)
                    page = ctx.new_page()
                    t = time.perf_counter()
                    page.goto(url, wait_until="commit")
                    page.wait_for_selector(selector, state="attached", timeout=120_000)
                    firsts.append(time.perf_counter() - t)
                    if len(firsts) < args.loads:
                        ctx.close()
                received = []  # websocket bytes while watched: what each redraw sends
                page.on("websocket", lambda ws: ws.on("framereceived", lambda f: received.append(len(f))))
                page.reload(wait_until="commit")
                page.wait_for_selector(selector, state="attached", timeout=120_000)
                page.wait_for_timeout(args.settle_s * 1000)  # the last page stays open: its redraws are watched
                received.clear()  # (Playwright delivers the frames during its own calls: waits, not sleeps)
                b0 = cpu_seconds(chromium_pids())
                page.wait_for_timeout(args.watch_s * 1000)
                browser_cpu = cpu_share(b0, cpu_seconds(chromium_pids()), args.watch_s)
                sent_kb_s = sum(received) / 1e3 / args.watch_s
                kept = zoom_kept(page, selector, x_range, live_cache.MIN_REFRESH_S)
            finally:
                browser.close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    print(f"{name}: first chart {[round(s, 2) for s in firsts]} s, browser {browser_cpu:.1%} of a core, "
          f"{sent_kb_s:.0f} kB/s, zoom kept {kept}", file=sys.stderr)
    return {"name": name, "firsts": firsts, "browser_cpu": browser_cpu, "sent_kb_s": sent_kb_s, "zoom_kept": kept}


def section(results: list[dict], args, minutes: float) -> str:
    cmd = "`.venv/bin/python bench/chart_renderers.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "") + "`"
    kept = {True: "kept", False: "reset", None: "no zoom (none configured)"}
    rows = [f"| {r['name']} | {statistics.median(r['firsts']):.2f} s ({min(r['firsts']):.2f}-{max(r['firsts']):.2f}) | "
            f"{r['browser_cpu']:.1%} of a core | {r['sent_kb_s']:.0f} kB/s | {kept[r['zoom_kept']]} |" for r in results]
    return "\n".join([
        HEADING, "",
        "Issue 29's remaining targets (first chart, lag with many viewers) are set by the browser's work. This bench "
        "draws the live page's figures (charts.live_charts of the live_viewers bench's 10,000-step run, the last point "
        f"moved at every {live_cache.MIN_REFRESH_S:g} s redraw as a new step moves it) three ways: with plotly, as the "
        "page did until issue 29; with Apache ECharts (`st.echarts_chart`, shipped with Streamlit: a 1.2 MB chunk "
        "against plotly's 4.7 MB, drawn on a canvas; each figure's lines only, no threshold or change-marker lines, "
        "no filled areas: a lower bound for it); and as the page draws them now, `grpo_core.dashboard.live_chart`: "
        "uPlot 1.6.32 (51 kB, MIT, a canvas) in a Streamlit components-v2 element whose script runs in the page (no "
        "iframe) and, at each redraw, gives the same chart new data (`setData`) instead of building it again, the "
        "whole figure (fills, stacks, threshold lines, change markers). Headless Chromium, not niced, no "
        f"trainer: the renderers' own costs. First chart: {args.loads} new pages each (a new browser context); then "
        f"one page watched for {args.watch_s:.0f} s (Chromium's CPU from /proc, the websocket's bytes); then a drag "
        "across its first chart (a zoom on x in plotly and uPlot) and two redraws: is the zoom still shown?",
        "",
        f"- Command: {cmd} ({minutes:.1f} min)",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| renderer | a new page's first chart (median, range) | Chromium while one page redraws every 2 s | "
        "sent to the page while it redraws | a reader's zoom after two redraws |",
        "| --- | --- | --- | --- | --- |",
        *rows,
        "",
        "Readings: plotly's zoom does not survive a redraw in Streamlit's element (the figure's `uirevision` "
        "notwithstanding), so the plotly live page could not be zoomed while its run trained; Streamlit's ECharts "
        "element would reset one too (it applies each option with `setOption(option, {notMerge: true})`, read in its "
        "frontend bundle). The uPlot element keeps it: its script owns the chart and swaps the data only. Its bytes "
        "are the charts' data (`live_chart.encode`: a JSON header, the steps as float64, the values as float32) and "
        f"a 0.3 kB script of each chart element; live_chart.js ({JS.stat().st_size / 1000:.0f} kB) travels with uPlot in an "
        "element of its own outside the fragment, sent once per page.",
        "",
    ])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loads", type=int, default=5, help="new pages per renderer (first-chart times)")
    ap.add_argument("--watch-s", type=float, default=30.0, help="seconds one page is watched while it redraws")
    ap.add_argument("--settle-s", type=float, default=4.0, help="seconds after the last page opened before watching")
    ap.add_argument("--history-steps", type=int, default=10_000, help="steps of the run drawn (live_viewers' cache)")
    ap.add_argument("--cache-dir", default=str(ROOT / "bench" / ".cache" / "live_viewers"),
                    help="where live_viewers keeps the trained history")
    ap.add_argument("--renderers", nargs="+", choices=list(RENDERERS), default=list(RENDERERS), help="which to measure")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no {CHROMIUM}: install Debian's chromium (make test does)")
    t0 = time.time()
    root, rid = history(Path(args.cache_dir), args.history_steps)
    with tempfile.TemporaryDirectory(prefix="grpo-chart-renderers-") as work:
        results = [measure(name, root / rid, Path(work), args) for name in args.renderers]
    publish(HEADING, section(results, args, (time.time() - t0) / 60), write=not args.no_write)


if __name__ == "__main__":
    main()
