"""A page of the live monitor in headless Chromium at the lowest CPU priority, and what it costs.

bench/live_viewers.py's browser side: the niced browser (`niced_chromium`), a page opened on a URL
(`open_page`), a newcomer's first chart (the page's own, and the one its HTML brings: first_paint)
and where its time went (`first_chart`, from page-side performance.now() marks: MARKS_JS), the
step a page shows (`page_step`), and the CPU time of the processes involved and of the whole box,
read from /proc (`cpu_seconds`, `box_cpu_seconds`).
bench/chart_renderers.py uses them too.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_core.dashboard.live_chart import DRAWN  # noqa: E402
from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, process_tree  # noqa: E402

# Every page really redraws (no background-tab throttling): the worst case for the server.
CHROME_ARGS = CHROMIUM_ARGS + ["--disable-background-timer-throttling", "--disable-renderer-backgrounding",
                               "--disable-backgrounding-occluded-windows"]
# The live page's progress line ("step 1,234 of 10,000 ..."): the step a page shows.
STEP_RE = r"step ([\d,]+) of"
PAGE_STEP_JS = f"""(() => {{ const m = /{STEP_RE}/.exec(document.body ? document.body.textContent : '');
    return m ? Number(m[1].replace(/,/g, '')) : null; }})()"""
# Page-side marks in performance.now() ms since navigation start (installed before any page script).
MARKS_JS = """
(() => {
  const t = window.__marks = {msgs: 0, bytes: 0};
  const mark = k => { if (!(k in t)) t[k] = performance.now(); };
  const Native = window.WebSocket;
  function Wrapped(...a) {
    const ws = new Native(...a);
    mark('ws_created');
    ws.addEventListener('open', () => mark('ws_open'));
    ws.addEventListener('message', e => {
      const size = (e.data && (e.data.byteLength || e.data.size || e.data.length)) || 0;
      mark('ws_first_msg');
      if (!('chart_drawn' in t)) { t.msgs += 1; t.bytes += size; }
      if (size > 20000) mark('ws_first_big_msg');
    });
    return ws;
  }
  Wrapped.prototype = Native.prototype;
  for (const k of ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED']) Wrapped[k] = Native[k];
  window.WebSocket = Wrapped;
  try {  // main-thread tasks > 50 ms until the first chart: the browser's own JS work
    new PerformanceObserver(l => { for (const e of l.getEntries()) if (!('chart_drawn' in t))
      t.longtask_ms = (t.longtask_ms || 0) + e.duration; }).observe({type: 'longtask', buffered: true});
  } catch (e) {}
  // The first chart's paint: the Element Timing API's paint time of its title (uPlot's title is text,
  // painted with the chart's canvas in one frame), marked by the observer below before it is painted.
  // Where the API or the title is missing: the first task after the frame that showed it (late when
  // the page runs other work right after that frame).
  const timed = window.PerformanceObserver && PerformanceObserver.supportedEntryTypes.includes('element');
  // The same for the chart the HTML brings (grpo_core.dashboard.first_paint's preview, before Streamlit's app).
  if (timed) new PerformanceObserver(l => { for (const e of l.getEntries()) {
    if (e.identifier === 'chart' && !('chart_painted' in t)) t.chart_painted = e.renderTime || e.loadTime;
    if (e.identifier === 'preview' && !('preview_painted' in t)) t.preview_painted = e.renderTime || e.loadTime;
  } }).observe({type: 'element', buffered: true});
  let plots = 0;
  new MutationObserver(() => {
    for (const title of document.querySelectorAll('.live-chart .u-title:not([elementtiming])')) title.setAttribute('elementtiming', 'chart');
    for (const title of document.querySelectorAll('#grpo-first-paint .u-title:not([elementtiming])')) title.setAttribute('elementtiming', 'preview');
    if (!('preview_drawn' in t) && document.querySelector('#grpo-first-paint canvas')) mark('preview_drawn');
    if (!('app_mounted' in t) && document.querySelector('[data-testid="stApp"]')) mark('app_mounted');
    if (!('chart_element' in t) && document.querySelector('.live-chart')) mark('chart_element');
    if (!('progress_text' in t) && document.body && /STEP_RE/.test(document.body.textContent)) mark('progress_text');
    const n = Array.from(document.querySelectorAll('.live-chart')).filter(g => g.querySelector('canvas')).length;
    if (n > 0 && !('chart_drawn' in t)) {
      mark('chart_drawn');
      requestAnimationFrame(() => setTimeout(() => { mark('chart_frame_task'); if (!timed || !document.querySelector('.live-chart .u-title')) mark('chart_painted'); }, 0));
    }
    if (n > plots) { plots = n; t.plots = n; t.all_plots = performance.now(); }
  }).observe(document, {childList: true, subtree: true});
})();
""".replace("STEP_RE", STEP_RE)
NAV_JS = """(() => { const n = performance.getEntriesByType('navigation')[0];
  const js = performance.getEntriesByType('resource').filter(r => r.name.split('?')[0].endsWith('.js'));
  const big = js.reduce((a, r) => (!a || r.decodedBodySize > a.decodedBodySize ? r : a), null);
  return {html: n ? n.responseEnd : null, dom: n ? n.domContentLoadedEventEnd : null,
          js_last: js.length ? Math.max(...js.map(r => r.responseEnd)) : null, js_files: js.length,
          js_kb: js.reduce((a, r) => a + r.decodedBodySize, 0) / 1e3,
          big_js: big ? big.responseEnd : null, big_js_kb: big ? big.decodedBodySize / 1e3 : null,
          marks: window.__marks}; })()"""
# The number of charts when every chart container on the page holds a drawn plot, else 0.
ALL_DRAWN_JS = """(() => { const c = document.querySelectorAll('.live-chart');
  const d = Array.from(c).filter(e => e.querySelector('canvas')).length;
  return c.length && d === c.length ? d : 0; })()"""


# ---- CPU time, from /proc ------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU time (user + system) per process, from /proc/<pid>/stat; gone processes are left out."""
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def box_cpu_seconds() -> float:
    """CPU time the whole box has spent busy so far (every core, every process), from /proc/stat:
    what the bench's own processes do not account for shows here."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_share(before: dict, after: dict, seconds: float) -> float:
    """Cores used over `seconds` by the processes present at both ends."""
    return sum(after[p] - before[p] for p in after if p in before) / seconds


def chromium_pids() -> list[int]:
    """This process's Chromium processes: the browsers Playwright started are its descendants."""
    pids = []
    for pid in process_tree(os.getpid()):
        try:
            if b"chrom" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


# ---- pages ---------------------------------------------------------------------------------------
def niced_chromium(tmp: Path, autogroup: bool) -> Path:
    """A wrapper Playwright launches as its browser: Chromium at the lowest CPU priority. With the
    kernel's autogroups on (/proc/sys/kernel/sched_autogroup_enabled), nice only ranks processes
    within one session, and Playwright starts the browser in a session of its own: so the
    wrapper also sets that session's autogroup to nice 19, else the browser would weigh as much
    as the trainer's session."""
    wrapper = tmp / "chromium-nice"
    group = "(echo 19 > /proc/self/autogroup) 2>/dev/null\n" if autogroup else ""
    wrapper.write_text(f'#!/bin/sh\n{group}exec nice -n 19 {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def new_context(browser, marks: bool = False):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1900})
    if marks:
        ctx.add_init_script(MARKS_JS)
    return ctx


def open_page(ctx, url: str, timeout_s: float):
    """A page in `ctx` on `url`; returns (page, seconds to the first drawn chart, None when
    not drawn within timeout_s: the table says so, and the page stays open as a viewer)."""
    from playwright.sync_api import TimeoutError as PageTimeout
    page = ctx.new_page()
    t = time.perf_counter()
    try:
        page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
        page.wait_for_selector(DRAWN, state="attached", timeout=timeout_s * 1000)
    except PageTimeout:
        print(f"no chart drawn within {timeout_s:.0f} s", file=sys.stderr)
        return page, None
    return page, time.perf_counter() - t


def first_chart(ctx, url: str, timeout_s: float, server: list[int]) -> dict:
    """A new viewer's first chart in `ctx` (a context with the marks), and where its time went
    (page-side marks, ms; CPU seconds of the server and of Chromium until that chart). `seconds`
    runs from the bench asking for the page to the frame that painted the first chart, both on
    this machine's clock (the page's performance.timeOrigin + its mark): Playwright's wait
    returns later, once the page's main thread, busy with the rest of the page, runs its check
    (`bench_saw`, in the breakdown). The page is closed after; the context is left open."""
    c0, b0 = cpu_seconds(server), cpu_seconds(chromium_pids())
    t0 = time.time()
    page, seen = open_page(ctx, url, timeout_s)
    cpu = {"server_cpu_s": cpu_share(c0, cpu_seconds(server), 1.0),
           "browser_cpu_s": cpu_share(b0, cpu_seconds(chromium_pids()), 1.0)}
    seconds = preview = None
    if seen is not None:
        page.wait_for_function("window.__marks && 'chart_painted' in window.__marks", timeout=timeout_s * 1000)
        origin = page.evaluate("performance.timeOrigin") / 1e3
        seconds = origin + page.evaluate("window.__marks.chart_painted") / 1e3 - t0
        painted = page.evaluate("window.__marks.preview_painted || window.__marks.preview_drawn || null")
        preview = None if painted is None else origin + painted / 1e3 - t0  # none: a page served without it
        cpu["bench_saw"] = (t0 + seen - origin) * 1e3
    drawn, same = -1, 0
    for _ in range(int(timeout_s / 0.5) if seen is not None else 0):  # every chart of the first script run: the breakdown's last row
        now = page.evaluate(ALL_DRAWN_JS)
        same = same + 1 if now == drawn and now > 0 else 0
        if same >= 2:  # every chart container drawn, and no new one for a second
            break
        drawn = now
        page.wait_for_timeout(500)
    try:
        nav = page.evaluate(NAV_JS)
    except Exception:  # a page still starved after the timeout: no marks
        nav = {"marks": {}}
    page.close()
    return {"seconds": seconds, "preview_seconds": preview, **cpu, **(nav.pop("marks") or {}), **nav}


def first_chart_new_browser(p, wrapper: Path, url: str, timeout_s: float, server: list[int],
                            pause=contextlib.nullcontext) -> dict:
    """A newcomer in a browser process of its own (a new session, so an autogroup of its own at nice 19:
    another machine's browser, not a tab among the viewers'), with a cold HTTP cache. The browser is
    started before the clock runs (a user's browser is already open) and closed after; `pause()` spans
    the page's load only."""
    browser = p.chromium.launch(executable_path=str(wrapper), args=CHROME_ARGS)
    try:
        ctx = new_context(browser, marks=True)
        with pause():
            return first_chart(ctx, url, timeout_s, server)
    finally:
        browser.close()



def median_reading(measure, n: int) -> dict:
    """n readings of `measure()`: the median one (by seconds; no chart counts as the slowest), with
    every reading's seconds as `all_seconds` (the spread the table shows), and the previews' (the
    HTML's first chart) as `all_previews`, None where a page had none."""
    readings = sorted((measure() for _ in range(n)), key=lambda r: math.inf if r["seconds"] is None else r["seconds"])
    return {**readings[(n - 1) // 2], "all_seconds": [r["seconds"] for r in readings],
            "all_previews": [r.get("preview_seconds") for r in readings]}


def page_step(page) -> int | None:
    try:
        return page.evaluate(PAGE_STEP_JS)
    except Exception:  # mid-redraw or navigation: no reading this time
        return None
