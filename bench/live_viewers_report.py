"""bench/live_viewers.py's section of docs/benchmarks.md: its readings as the table, the breakdown of
a new page's first chart, and what limits each target. Formatting only: live_viewers measures."""
from __future__ import annotations

import math
import os
import statistics
import sys
import time

from perf_common import machine

from grpo_core.dashboard import live_cache

HEADING = "## Live page: viewers"
BREAKDOWN = [  # (label, key): cumulative ms since navigation start
    ("HTML received", "html"), ("the HTML's first chart painted (first_paint's preview)", "preview_painted"), ("DOMContentLoaded", "dom"), ("largest JS file received", "big_js"), ("last JS file received", "js_last"),
    ("Streamlit app mounted", "app_mounted"), ("websocket created", "ws_created"), ("websocket open", "ws_open"),
    ("first message from the server", "ws_first_msg"), ("first large message (> 20 kB: a figure)", "ws_first_big_msg"),
    ("progress text \"step N of\" shown", "progress_text"), ("first chart element in the DOM", "chart_element"),
    ("first chart drawn (its uPlot canvas)", "chart_drawn"), ("first chart painted (its title's paint time)", "chart_painted"),
    ("the bench saw it (Playwright's wait returned)", "bench_saw"), ("every chart drawn", "all_plots")]

KINDS = (("new browser", "first"), ("new tab", "warm"))  # a newcomer's two readings: (label, key)
LEVEL = 0.95  # the paired reading's interval holds the median change with at least this confidence


def ok(good: bool) -> str:
    return " ✓" if good else " ✗"


def seconds_cell(s: float | None, timeout_s: float) -> str:
    return f"> {timeout_s:.0f} s ✗" if s is None else f"{s:.1f} s{ok(s < 2)}"


def reading_cell(reading: dict, timeout_s: float) -> str:
    """A newcomer's median first chart, with the range of its readings."""
    seen = [x for x in reading["all_seconds"] if x is not None]
    spread = f" ({min(seen):.1f}–{max(seen):.1f})" if len(reading["all_seconds"]) > 1 and seen else ""
    return seconds_cell(reading["seconds"], timeout_s) + spread


def preview_cell(reading: dict) -> str:
    """The first chart the page's HTML brings (first_paint), the median of its readings and their
    range; "—" where the page had none (Streamlit's floor page, a page served without it)."""
    seen = sorted(x for x in reading.get("all_previews", []) if x is not None)
    if not seen:
        return "—"
    middle = statistics.median(seen)
    return f"{middle:.1f} s{ok(middle < 2)}" + (f" ({seen[0]:.1f}–{seen[-1]:.1f})" if len(seen) > 1 else "")


def alone(results: list[dict], run: dict) -> float | None:
    """The trainer's steps/s with no viewer open: the mean of the 0-viewer phase (the first) and of
    the reading after the last phase (its viewers closed), which the box's own drift over the
    bench moves as much as any viewer; None without a 0-viewer phase."""
    base = next((r["steps_per_s"] for r in results if r["viewers"] == 0), None)
    after = run.get("alone_after")
    return base if base is None or after is None else (base + after) / 2


def median_interval(changes: list[float]) -> tuple[float, float] | None:
    """A distribution-free interval for the median of the pairs' changes (the sign test's): the k-th
    smallest and the k-th largest change, k the largest rank at which the interval holds the median
    with at least LEVEL confidence (each pair falls on either side of the median with probability
    1/2). A burst on the box moves each end by one rank at most, where it would move a mean and its
    standard error by its full size. None with fewer than 6 pairs: no such interval exists."""
    n = len(changes)

    def outside(k: int) -> float:  # P(the median lies outside [x(k), x(n+1-k)])
        return 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
    k = 0
    while k < n // 2 and outside(k + 1) <= 1 - LEVEL:
        k += 1
    ordered = sorted(changes)
    return (ordered[k - 1], ordered[n - k]) if k else None


def paired_change(p: dict) -> tuple[float, tuple[float, float] | None]:
    """The trainer's change with the viewers drawing: the median of the pairs' changes with its
    interval (None with fewer than 6 pairs), else the totals' ratio alone."""
    changes = p.get("changes") or []
    if not changes:
        return p["drawing"] / p["stopped"] - 1, None
    return statistics.median(changes), median_interval(changes)


def slowdown_verdict(interval: tuple[float, float] | None) -> str:
    """The 10-viewer target (slower by < 5%), decided only where the whole interval lies on one side."""
    if interval is None:
        return " undecided"
    low, high = interval
    if low > -0.05:
        return " ✓"
    return " ✗" if high < -0.05 else " undecided"


def paired_cell(r: dict) -> str:
    """The trainer with the viewers drawing against their browser stopped, pair by pair (the target's
    reading: 10 viewers slow the trainer by < 5%): the median change [its interval]."""
    p = r.get("paired")
    if not p or not p["drawing"] or not p["stopped"]:
        return "—"
    change, interval = paired_change(p)
    spread = "" if interval is None else f" [{interval[0]:+.1%}, {interval[1]:+.1%}]"
    verdict = slowdown_verdict(interval) if r["viewers"] >= 10 else ""
    return f"{change:+.1%}{spread}{verdict} ({p['drawing']:.1f} / {p['stopped']:.1f})"


def halves(r: dict) -> str:
    """The cores the paired halves used, drawing / stopped: the server, the viewers' browser and the
    whole box (the trainer included). A stopped half whose box stays above the trainer's own share
    holds a cost the pairs cannot see."""
    p = r.get("paired") or {}
    if not p.get("cores"):
        return ""
    d, s = p["cores"]["drawing"], p["cores"]["stopped"]
    return (f" (drawing / stopped halves: server {d['server']:.1%} / {s['server']:.1%} of a core, Chromium "
            f"{d['browser']:.0%} / {s['browser']:.0%}, the whole box {d['box']:.2f} / {s['box']:.2f} cores)")


def rows(results: list[dict], refresh_s: float, timeout_s: float, alone_rate: float | None) -> list[str]:
    base = next((r for r in results if r["viewers"] == 0), None)
    idle_server = base["server_cpu"] if base else 0.0
    out = ["| viewers open | trainer steps/s | vs 0 viewers | trainer, viewers drawing vs their browser stopped (paired) | server CPU (serve + Streamlit) | server per viewer "
           "(above 0 viewers) | Chromium CPU (nice 19) | a new page's first chart, in its HTML: new browser / new tab | "
           "the page's own first chart (Streamlit's): new browser / new tab | Streamlit's floor "
           "page, same place: new browser / new tab | lag store -> page (median, max) | page redraw every | load avg |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        n = r["viewers"]
        slow = "—" if not alone_rate or n == 0 else f"{r['steps_per_s'] / alone_rate - 1:+.1%}"
        per = "—" if n == 0 else f"{(r['server_cpu'] - idle_server) / n:.1%}" + ok((r["server_cpu"] - idle_server) / n < 0.05)
        lag = "—" if not r["lags"] else (f"{statistics.median(r['lags']):.2f} s, {max(r['lags']):.2f} s"
                                         + ok(max(r["lags"]) < 2 * live_cache.fast_period(n)))
        if n and not r["lags"]:
            lag = "no redraw seen ✗"
        redraw = "—" if r["redraw_s"] is None else f"{r['redraw_s']:.1f} s"
        out.append(f"| {n} | {r['steps_per_s']:.2f} | {slow} | {paired_cell(r)} | {r['server_cpu']:.1%} of a core | {per} | "
                   f"{r['browser_cpu']:.0%} of a core | {preview_cell(r['first'])} / {preview_cell(r['warm'])} | "
                   f"{reading_cell(r['first'], timeout_s)} / {reading_cell(r['warm'], timeout_s)} | "
                   f"{reading_cell(r['floor']['first'], timeout_s)} / {reading_cell(r['floor']['warm'], timeout_s)} | "
                   f"{lag} | {redraw} | {r['load']:.2f} |")
    return out


def breakdown(results: list[dict]) -> list[str]:
    cols = [(f"{r['viewers']} open, {kind}", r[key]) for r in results for kind, key in KINDS]
    out = ["| a new page, ms since navigation start | " + " | ".join(c for c, _ in cols) + " |",
           "| --- |" + " --- |" * len(cols)]
    for label, key in BREAKDOWN:
        cells = [f.get(key) for _, f in cols]
        out.append(f"| {label} | " + " | ".join("—" if c is None else f"{c:,.0f}" for c in cells) + " |")
    out.append("| JS files / kB (largest kB) | " + " | ".join(
        f"{f.get('js_files', '?')} / {f.get('js_kb') or 0:,.0f} ({f.get('big_js_kb') or 0:,.0f})" for _, f in cols) + " |")
    out.append("| CPU s until the first chart: server / Chromium (all its pages) / page main thread in long tasks | "
               + " | ".join(f"{f['server_cpu_s']:.2f} / {f['browser_cpu_s']:.2f} / {(f.get('longtask_ms') or 0) / 1e3:.2f}"
                            for _, f in cols) + " |")
    out.append("| charts drawn / websocket messages / kB received until the first chart | " + " | ".join(
        f"{f.get('plots', '?')} / {f.get('msgs', '?')} / {f.get('bytes', 0) / 1e3:,.0f}" for _, f in cols) + " |")
    return out


def first_chart_limit(r: dict, kind: str, key: str) -> str:
    f = r[key]
    if f["seconds"] is None:
        return (f"- First chart ({r['viewers']} open, {kind}): not drawn within the timeout; Chromium at the lowest "
                f"priority got too little CPU on this box to load the page (its main thread "
                f"{(f.get('longtask_ms') or 0) / 1e3:.1f} s in long tasks).")
    server_part, drawn = (f.get("ws_first_big_msg") or 0) / 1e3, (f.get("chart_drawn") or 0) / 1e3
    return (f"- First chart ({r['viewers']} open, {kind}, {f['seconds']:.1f} s): the server's first chart "
            f"arrived {server_part:.1f} s after navigation (session start, script run, store read, chart data), "
            f"the first chart was drawn {drawn - server_part:.1f} s later (the browser: React applying "
            f"{f.get('msgs', '?')} websocket messages, the charts drawing); until then the server used "
            f"{f['server_cpu_s']:.2f} CPU s, Chromium {f['browser_cpu_s']:.2f} CPU s at nice 19 "
            f"(the page's main thread {(f.get('longtask_ms') or 0) / 1e3:.2f} s in long tasks).")


def limits(results: list[dict], refresh_s: float, alone_rate: float | None) -> list[str]:
    """What the numbers say limits each target, computed from this bench's readings."""
    most = results[-1]
    out = [f"- The first chart in the HTML ({most['viewers']} open: new browser {preview_cell(most['first'])}, new tab "
           f"{preview_cell(most['warm'])}) waits on the server's answer to the page's URL (the run's state and charts, "
           f"shared with the page's first script run) and the browser's parse of the HTML and draw of one chart: none "
           f"of Streamlit's app. The page's own first charts then come as below."]
    out += [first_chart_limit(most, kind, key) for kind, key in KINDS]
    if most["viewers"]:
        out.append(f"- With {most['viewers']} viewers open, a newcomer's browser shares the CPU with theirs (Chromium at "
                   f"nice 19 took {most['browser_cpu']:.0%} of a core to redraw them) and with the trainer; a new tab "
                   f"also waits on its own browser's other {most['viewers']} pages. Viewers on other machines would "
                   f"take neither; with the CPU free (the trainer paused, no viewer) the page itself needs the "
                   f"seconds above the breakdown.")
    for r in results:
        for kind, key in KINDS:
            ours, floor = r[key]["seconds"], r["floor"][key]["seconds"]
            if ours is None or floor is None:
                continue
            box = "Streamlit's own page misses 2 s there too (this box); " if floor >= 2 else ""
            paint = (f"the live page's first paint (the sidebar, the run line, its progress and 7 charts; "
                     f"{r[key].get('msgs', '?')} websocket messages against {r['floor'][key].get('msgs', '?')}) ")
            cost = (f"costs the browser {ours - floor:.1f} s more." if ours >= floor else  # the medians of a few readings
                    f"did not cost more in this reading: the floor page's median was {floor - ours:.1f} s slower "
                    f"(a loaded box; see the range in the table).")
            out.append(f"- First chart ({r['viewers']} open, {kind}): {ours:.1f} s against {floor:.1f} s for Streamlit's "
                       f"floor page in the same place (one line and one chart): {box}{paint}{cost}")
    base = results[0]
    for r in results[1:]:
        n = r["viewers"]
        per = (r["server_cpu"] - (base["server_cpu"] if base["viewers"] == 0 else 0)) / n
        period = r["redraw_s"] or refresh_s  # each page asks for its next refresh once it drew the last one
        out.append(f"- {n} viewer{'s' if n > 1 else ''}: the server used {per:.1%} of a core per viewer, {per * period * 1e3:.0f} ms "
                   f"of CPU per viewer per refresh (one per {period:.1f} s); Chromium used {r['browser_cpu']:.0%} of a core; "
                   f"trainer {r['steps_per_s']:.2f} steps/s against {alone_rate or base['steps_per_s']:.2f} alone, "
                   f"{paired_cell(r)} paired{halves(r)} "
                   f"(load average {r['load']:.1f} on {len(os.sched_getaffinity(0))} cores: the trainer, the server, "
                   "Chromium and other work share them).")
    lags = [x for r in results for x in r["lags"]]
    if lags:
        out.append(f"- Lag (max {max(lags):.2f} s over all phases): a step is readable once the trainer commits "
                   f"(`log.commit_every_s`, 1 s by default), then shown at the page's next refresh, which the page asks "
                   f"for `live_cache.MIN_REFRESH_S` = {refresh_s:g} s (a fast run's period; with n viewers at least "
                   f"n / `serve --redraws-per-s` = n / {live_cache.redraws_per_s():g} s) after it drew the last one "
                   f"(grpo_core/dashboard/refresh.py), plus the server's run and the browser's draw.")
    return out


def ends(results: list[dict]) -> list[dict]:
    """The first and the last phase (fewest and most viewers), once each."""
    return results[:1] + results[1:][-1:]


def section(results: list[dict], paused: dict, args, run: dict) -> str:
    """The section: `run` says how the bench ran (hist_steps, hist_s, start_step, minutes, train_set,
    budget, poll_s); args are its command-line arguments."""
    refresh_s = live_cache.MIN_REFRESH_S  # a fast run's poll period (live_cache.refresh_interval)
    alone_rate = alone(results, run)
    priority = (", its session's autogroup at nice 19 too (with autogroups on, nice alone ranks only within "
                "a session)" if args.browser_priority == "autogroup" else
                " only (`--browser-priority nice`; with autogroups on, the browser's session then weighs as much "
                "as the trainer's)")
    cmd = "`.venv/bin/python bench/live_viewers.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "") + "`"
    return "\n".join([
        HEADING, "",
        f"Issue 29's table, regenerated: the real trainer keeps training a run of {run['hist_steps']:,} steps "
        f"while `python -m grpo_core serve --no-demo` serves it to headless Chromium pages on its live page. "
        f"The history was trained once by `python -m grpo_core train` ({run['hist_s']:.0f} s, cached under "
        f"`{args.cache_dir}`) with the config every phase uses ({', '.join(f'`{s}`' for s in run['train_set'])}; the "
        f"built-in model on the demo task), then each bench copies it and resumes it (`train --resume`, "
        f"budget {run['budget']:,}) from step {run['start_step']:,}: one trainer process through all phases. The browsers stand "
        f"in for browsers on other machines: one browser process at `nice -n 19`{priority}; the trainer and "
        f"serve run in sessions of their own; one context per viewer, "
        f"background throttling off (every page redraws). Per phase, {args.phase_s:.0f} s after the pages "
        f"settled ({args.settle_s:.0f} s): trainer steps/s from the store's last step; the server's CPU from "
        f"/proc (serve and its Streamlit; the trainer is not counted), per viewer above the 0-viewer "
        f"phase; the lag from a step being readable in the store to the first viewer's progress text "
        f"showing it (both polled every {run['poll_s']} s); then a new page's first chart with the others open, "
        f"{args.repeats} times each (the median, and the range in brackets): in a browser process of its own "
        f"(*new browser*: another machine's browser, its own session at nice 19, a cold HTTP cache) and as a new tab "
        f"in the viewers' browser, in a context that loaded the page before (*new tab*: the app's JS cached). A first "
        f"chart runs from the bench asking for the page to the frame that painted the chart (the page's "
        f"`performance.timeOrigin` plus the paint time the Element Timing API gives the chart's title, which uPlot "
        f"paints with its canvas, on this machine's clock; before 2026-12-05 15:50 UTC, the first task after that "
        f"frame, which a page that draws its other charts right after the first counts late): Playwright's own "
        f"wait returns later, once the page's busy main thread runs its check (the breakdown's \"bench saw it\" row). "
        f"Since 2026-12-06 the live page's HTML brings its run's first chart (`grpo_core.dashboard.first_paint`: "
        f"drawn before Streamlit's app has loaded, shown until the page has drawn its own): its column is read the same "
        f"way, from that chart's title; the page's own first chart, drawn by Streamlit's app, is the next column "
        f"(the only one before).",
        "",
        f"- Command: {cmd} ({run['minutes']:.1f} min)",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Targets (issue 29): first chart < 2 s, server < 5% of a core per viewer, 10 viewers slow the "
        f"trainer by < 5%, lag < 2 refresh intervals (a fast run's: `live_cache.MIN_REFRESH_S` = {refresh_s:g} s, or "
        f"n / `serve --redraws-per-s` = n / {live_cache.redraws_per_s():g} s with n viewers where that is longer)",
        "",
        *rows(results, refresh_s, args.timeout_s, alone_rate),
        "",
        *([f"The trainer alone: {results[0]['steps_per_s']:.2f} steps/s in the 0-viewer phase (the first), "
           f"{run['alone_after']:.2f} in {args.phase_s:.0f} s after the last phase (its viewers closed); the \"vs 0 "
           f"viewers\" column compares with their mean, {alone_rate:.2f}: their difference is the box's own "
           f"drift over the bench.", ""] if run.get("alone_after") and results[0]["viewers"] == 0 else []),
        *([f"The 10-viewer target is read from the paired column: per phase with viewers, {args.pairs} pairs "
           f"({args.target_pairs} with 10 viewers: a pair's change spreads by about 10% on a shared box) of "
           f"{run['pair_s']:.0f}-s windows (in ABBA order) with the viewers' browser drawing and stopped (SIGSTOP: no "
           f"page draws, so none asks the server for a refresh), the trainer's steps/s counted between the commits "
           f"the bench saw in each (drawing / stopped in brackets, over all pairs): the box's drift moves both halves of "
           f"a pair alike. The cell is the median of the pairs' changes and, in square brackets, the interval that holds "
           f"it with at least {LEVEL:.0%} confidence (the sign test's: between the k-th smallest and the k-th largest "
           f"change, no assumption on how the box spreads them, and one burst pair moves each end by a rank at most). "
           f"The target is decided only where the whole interval lies on one side of -5% (else \"undecided\": more "
           f"pairs, `--target-pairs`, narrow it).", ""]
          if args.pairs or args.target_pairs else []),
        f"With the trainer paused while the page loads (SIGSTOP, no viewer open: what the page itself costs when "
        f"its browser and the server have the CPU, as a browser on another machine would), a new page's first chart: "
        f"in its HTML, new browser {preview_cell(paused['first'])}, new tab {preview_cell(paused['warm'])}; the page's own, "
        f"new browser {reading_cell(paused['first'], args.timeout_s)}, new tab "
        f"{reading_cell(paused['warm'], args.timeout_s)}. Streamlit's floor page (the table's column): a minimal "
        f"app of its own, served by a Streamlit of its own beside the running trainer (one line of text and one "
        f"chart in the live page's element, `FLOOR_APP`), opened the same two ways right after the live page in "
        f"each phase: what any Streamlit page costs a browser in that place. The last columns below are the paused "
        f"trainer's and the floor's breakdowns.",
        "",
        "Where a new page's first chart goes (page-side `performance.now()` marks; the websocket is "
        "Streamlit's, wrapped by an init script; each row is cumulative):",
        "",
        *breakdown(results + [{"viewers": "trainer paused, 0", **paused}]
                   + [{"viewers": f"Streamlit floor, {r['viewers']}", **r["floor"]} for r in ends(results)]),
        "",
        "What limits each (computed from these readings; one run on a shared box: a distribution would need repeats):",
        "",
        *limits(results, refresh_s, alone_rate),
        "",
    ])
