"""The shipped demo, served as `make run` serves it, watched in a browser for thirty minutes.

Starts `python -m grpo_core serve` (the demo as shipped: processes.demo_config, no overrides) in a
fresh runs dir, opens the live page in headless Chromium (Debian's /usr/bin/chromium) at 1, 10
and 30 minutes after the start, and checks each time: the run is running, the steering sliders
are enabled, the ratio chart shows the story (the smoothed ratio below the healthy line before
the first autopilot move, a marker at the move, higher after it: as the page opens, and with
every step drawn, one click on Every step (raw)), and, from the run store, the
demo stays healthy: once the rolling ratio (the health window) is back above the line after the
first move (the first recovery), it has stayed above it. Saves the screenshots under
docs/screenshots/ and writes its figures into docs/demo.md (between the demo_story markers).
Not part of `make test` (it takes ~31 minutes):

    .venv/bin/python bench/demo_story.py [--minutes 1 10 30]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.perf_common import scratch_dir  # noqa: E402
from grpo_core.dashboard import processes  # noqa: E402
from grpo_core.runs import names  # noqa: E402
from grpo_core.runs.config import HealthConfig  # noqa: E402
from grpo_core.runs.store import EV_ALERT, RunStore  # noqa: E402
from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, answers, wait_for  # noqa: E402

SHOTS = ROOT / "docs" / "screenshots"
DOC = ROOT / "docs" / "demo.md"
START, END = "<!-- demo_story -->", "<!-- /demo_story -->"
LINE = processes.demo_config().health.min_trainable_ratio  # the demo's own line: its alert, the autopilot acts there
FLOOR = HealthConfig().min_trainable_ratio  # the default line (0.3): the demo stays above it once recovered
WINDOW = 20  # steps of the rolling ratio (the health window)


def serve(root: Path, port: int, demo: str = "builtin") -> subprocess.Popen:
    log = open(root / "serve.log", "w")
    cmd = [sys.executable, "-m", "grpo_core", "serve", "--demo", demo, "--port", str(port), "--runs-dir", str(root)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait_for(lambda: answers(f"http://127.0.0.1:{port}"), 180, every=1.0, what="Streamlit to answer")
    return proc


# The live page's charts are uPlot charts (grpo_core.dashboard.live_chart) kept on their element's node.
CHARTS = "Array.from(document.querySelectorAll('.live-chart')).map(h => h.chart).filter(c => c)"
PAGE_STATE = """(() => {
  const plots = CHARTS;
  const i = plots[0] ? plots[0].series.findIndex(s => s.label === 'per step') : -1;
  const ratio = i > 0 ? plots[0].data[0].map((x, j) => [x, plots[0].data[i][j]]).filter(p => p[1] != null) : null;
  return {plots: plots.length,
          sliders: Array.from(document.querySelectorAll('[data-testid="stSlider"]'))
                     .filter(s => !s.innerText.includes('smoothing'))  // the steering sliders, not the chart's
                     .map(s => { const e = s.querySelector('input[type="range"]');
                                 return !!e && !e.disabled && e.getAttribute('aria-disabled') !== 'true'; }),
          markers: plots[0] ? plots[0].spec.vlines.map(v => v.x) : [],
          x: ratio ? ratio.map(p => p[0]) : [], y: ratio ? ratio.map(p => p[1]) : [],
          running: document.body.innerText.includes('running'),
          steps_text: (document.body.innerText.match(/step \\d+ of \\d+[^\\n]*/) || [''])[0]};
})()""".replace("CHARTS", CHARTS)


RATIO_POINTS_ABOVE = """(n) => { const c = CHARTS[0]; if (!c) return false;
  const i = c.series.findIndex(s => s.label === 'per step');
  return i > 0 && c.data[i].filter(v => v != null).length !== n; }""".replace("CHARTS", CHARTS)


def look(browser, url: str, rid: str, minute: float) -> dict:
    """Open the live page, wait for the charts and the sliders, read what it draws, screenshot it."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    ctx = browser.new_context(viewport={"width": 1400, "height": 1500})
    page = ctx.new_page()
    page.goto(f"{url}/?run={rid}", wait_until="domcontentloaded")
    page.wait_for_function(f"{CHARTS}.length >= 6", timeout=90_000)
    page.get_by_text("What-if trainable ratio").first.wait_for(timeout=90_000)
    page.wait_for_timeout(2500)  # a redraw or two after the first
    state = page.evaluate(PAGE_STATE)
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"demo_story_{int(minute):02d}min.png"
    page.screenshot(path=str(path))
    # one click away: every step (the default view bins history older than 500 steps, so after ~10
    # minutes the smoothed line's dip before the first move is a bin mean; its min/max line keeps it)
    binned = len(state["x"])
    page.get_by_text("Every step (raw)").first.click()
    try:
        page.wait_for_function(RATIO_POINTS_ABOVE, arg=binned, timeout=90_000)
        page.wait_for_timeout(2500)
        raw = page.evaluate(PAGE_STATE)
    except PlaywrightTimeout:  # the look still counts as opened: its row says the every-step view was not seen
        raw = {**page.evaluate(PAGE_STATE), "x": [], "y": [], "markers": []}
        toggles = page.evaluate("Array.from(document.querySelectorAll('[data-testid=\"stCheckbox\"] input')).map(i => i.checked)")
        print(f"{minute:g} min: every step not drawn within 90 s of the click (toggles checked: {toggles}; "
              f"{raw['steps_text']}; {binned} ratio points as opened)", flush=True)
    ctx.close()
    return {**state, "raw": raw, "shot": path.relative_to(ROOT).as_posix(), "minute": minute}


def story_on_page(state: dict) -> dict:
    """The story as the page draws it: the smoothed ratio's low before the first marker and its
    high after it (the ratio chart's 'per step' line at the page's default smoothing)."""
    x, y, marks = np.array(state["x"]), np.array(state["y"]), sorted(state["markers"])
    if not marks or not len(x):
        return {"first_marker": None, "low_before": None, "high_after": None, "ok": False}
    before, after = y[x < marks[0]], y[x >= marks[0]]
    low = float(np.nanmin(before[-60:])) if len(before) else None
    high = float(np.nanmax(after)) if len(after) else None
    ok = low is not None and high is not None and low < LINE < high
    return {"first_marker": marks[0], "low_before": low, "high_after": high, "ok": ok}


def healthy_since_recovery(root: Path, rid: str) -> dict:
    """From the run store, now: the first autopilot move, the first recovery (the first step after
    it at which the rolling ratio over the health window is back above the demo's line), the
    rolling ratio's low since then (ok when above FLOOR, the default line), and what the flat groups of the last window
    were (the health/flat_* causes, per step)."""
    with RunStore.open(root / rid, readonly=True) as s:
        wide, changes = s.scalars_wide(), s.changes()
    # the last complete step: a look can land while the newest step's scalars are being written
    wide = wide.dropna(subset=[names.TRAINABLE_RATIO])
    roll = wide[names.TRAINABLE_RATIO].rolling(WINDOW, min_periods=WINDOW).mean()
    auto = changes[changes["source"] == "autopilot"]
    out = {"step": int(wide.index[-1]), "ratio": float(roll.iloc[-1]) if roll.notna().any() else None,
           "level": int(wide[names.DIFFICULTY].dropna().iloc[-1]) if names.DIFFICULTY in wide else None,
           "first_move": int(auto["step"].min()) if len(auto) else None, "recovered_at": None, "low_since": None,
           "ok": False}
    tail = wide.tail(WINDOW)
    causes = {c: float(tail[n].mean()) for c, n in names.FLAT_CAUSES.items() if n in tail and tail[n].mean() > 0}
    out["flat"] = dict(sorted(causes.items(), key=lambda kv: -kv[1]))
    if out["first_move"] is None:  # still before its first dip: healthy so far when above the line
        out["ok"] = out["ratio"] is not None and out["ratio"] > LINE
        return out
    above = roll[(roll.index >= out["first_move"] + WINDOW - 1) & (roll > LINE)]  # a window wholly after it
    if len(above):
        out["recovered_at"] = int(above.index[0])
        out["low_since"] = float(roll.loc[out["recovered_at"]:].min())
        out["ok"] = out["low_since"] > FLOOR
    return out


def store_figures(root: Path, rid: str) -> dict:
    """From the run store: when the alert fired, each autopilot move, the rolling ratio around it."""
    with RunStore.open(root / rid, readonly=True) as s:
        wide, changes, alerts = s.scalars_wide(), s.changes(), s.events(kinds=[EV_ALERT])
        meta = s.get_meta()
    roll = wide[names.TRAINABLE_RATIO].rolling(WINDOW, min_periods=WINDOW).mean()
    low = alerts[[p.get("kind") == "low_ratio" for p in alerts["payload"]]] if len(alerts) else alerts
    moves = []
    for r in changes.itertuples(index=False):
        st = int(r.step)
        moves.append({"step": st, "what": r.message, "source": r.source,
                      "before": float(roll.loc[:st - 1].iloc[-1]) if len(roll.loc[:st - 1].dropna()) else None,
                      "after_best": float(roll.loc[st + WINDOW:st + 150].max()) if len(roll.loc[st + WINDOW:]) else None})
    dt = wide[names.TIME_STEP].dropna()
    return {"last": int(wide.index[-1]), "status": meta.get("status"), "moves": moves,
            "low_ratio_alert": int(low["step"].iloc[0]) if len(low) else None,
            "min_roll_before_fix": float(roll.loc[:moves[0]["step"]].min()) if moves else float(roll.min()),
            "step_s": {k: float(dt.iloc[lo:hi].median()) for k, (lo, hi) in
                       {"first 100 steps": (0, 100), "last 100 steps": (-100, None)}.items() if len(dt)}}


def _f(v, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def section(checks: list[dict], fig: dict, loads: tuple, started: float) -> str:
    rows = []
    for c in checks:
        st, raw, name = c["story"], c["story_raw"], Path(c["shot"]).name
        rows.append(f"| {c['minute']:g} min | {c['steps_text'] or '?'} | {'running' if c['running'] else 'NOT running'}"
                    f" | {sum(c['sliders'])} of {len(c['sliders'])} | {len(c['markers'])} | {_f(st['low_before'])} -> "
                    f"{_f(st['high_after'])} | {'yes' if st['ok'] else 'no'} | {_f(raw['low_before'])} -> {_f(raw['high_after'])} "
                    f"| {'yes' if raw['ok'] else 'no'} | [{name}](screenshots/{name}) |")
    moves = [f"| {m['step']} | {m['what']} | {m['source']} | {_f(m['before'])} | {_f(m['after_best'])} |"
             for m in fig["moves"]]
    health = []
    for c in checks:
        h = c["health"]
        flat = ", ".join(f"{k} {v:.1f}" for k, v in h["flat"].items()) or "none"
        health.append(f"| {c['minute']:g} min | {h['step']} | {h['level']} | {_f(h['ratio'])} | {h['first_move']} | "
                      f"{h['recovered_at'] if h['recovered_at'] is not None else 'not yet'} | {_f(h['low_since'])} | "
                      f"{'yes' if h['ok'] else 'NO'} | {flat} | {c['load']:.1f} |")
    return "\n".join([
        START, "## The demo's story, live (bench/demo_story.py)", "",
        "Written by `bench/demo_story.py` (do not edit by hand): `python -m grpo_core serve` with the demo as "
        "shipped (`processes.demo_config`), a fresh runs dir (so the warm-start is built inside the timing), the "
        "live page opened in headless Chromium at each time after the start.", "",
        f"Machine: {os.cpu_count()} CPU cores **shared with other engineers' jobs** (a loaded box: the pace below "
        f"is pessimistic), load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end; run on "
        f"{time.strftime('%Y-%m-%d', time.localtime(started))}.", "",
        "The smoothed ratio (the chart's line at the page's default smoothing): its low before the first marker "
        "and its high after, as the page opens (history older than 500 steps binned, each bin's min and max on "
        "the faint line) and after one click on **Every step (raw)**.", "",
        "| opened at | progress | status | sliders enabled | markers | smoothed ratio, as opened: low before -> "
        "high after | story visible | every step: low before -> high after | story visible | screenshot |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        f"The low-ratio alert fired at step {fig['low_ratio_alert']}; the rolling {WINDOW}-step ratio's low before "
        f"the first fix was {fig['min_roll_before_fix']:.2f} (the demo's line {LINE:g}). Moves (rolling ratio just "
        f"before the move, and its best over the 150 steps after its first window):", "",
        "| step | change | source | ratio before | best after |", "|---|---|---|---|---|", *moves, "",
        f"Healthy after the first recovery, from the run store at each look: the rolling {WINDOW}-step ratio now, "
        f"the first autopilot move, the first recovery (the first step after it with the rolling ratio back above "
        f"the demo's line {LINE:g}), the rolling ratio's low since then (the bar: above {FLOOR:g}), and why the "
        f"groups of the last {WINDOW} steps were flat (health/flat_* causes, groups per step of 8):", "",
        "| opened at | step | level | ratio now | first move | first recovery | low since | above the line | "
        "flat groups per step (last 20 steps) | load average |", "|---|---|---|---|---|---|---|---|---|---|",
        *health, "",
        "Step time (median): " + ", ".join(f"{k} {v:.3f} s" for k, v in fig["step_s"].items())
        + f"; at the end: step {fig['last']}, status {fig['status']}.", "", END])


def write_doc(text: str):
    doc = DOC.read_text()
    if START in doc and END in doc:
        doc = doc[:doc.index(START)] + text + doc[doc.index(END) + len(END):]
    else:  # after the title line
        head, _, rest = doc.partition("\n")
        doc = f"{head}\n\n{text}\n{rest}"
    DOC.write_text(doc)


def watch(url: str, root: Path, minutes: list[float], t0: float) -> tuple[str, list[dict]]:
    from playwright.sync_api import sync_playwright
    rid = None
    while rid is None and time.time() - t0 < 60:
        rid = processes.live_demo(root)
        time.sleep(0.5)
    checks = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for m in minutes:
            time.sleep(max(0.0, t0 + 60 * m - time.time()))
            c = look(browser, url, rid, m)
            c["load"] = os.getloadavg()[0]
            c["story"], c["story_raw"] = story_on_page(c), story_on_page(c["raw"])
            c["health"] = healthy_since_recovery(root, rid)
            print(f"{m:g} min: {c['steps_text']} running={c['running']} sliders={sum(c['sliders'])}/"
                  f"{len(c['sliders'])} markers={c['markers']} story={c['story']} every-step story={c['story_raw']} "
                  f"health={c['health']}", flush=True)
            checks.append(c)
        browser.close()
    return rid, checks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 10, 30])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/demo.md as it is")
    args = ap.parse_args()
    def on_term(signum, frame):  # `kill <pid>` still stops the server, and with it the demo run (finally below)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    root = scratch_dir("demo-story-")
    load0, t0 = os.getloadavg()[0], time.time()
    proc = serve(root, args.port)
    try:
        rid, checks = watch(f"http://127.0.0.1:{args.port}", root, args.minutes, t0)
        fig = store_figures(root, rid)
    finally:
        proc.send_signal(signal.SIGTERM)  # serve stops its Streamlit and the demo run it started (checkpoint first)
        proc.wait(timeout=120)
    text = section(checks, fig, (load0, os.getloadavg()[0]), t0)
    print(text)
    if not args.no_write:
        write_doc(text)
    # A look before the first move has no story on the page yet: it passes when the run is still above the line.
    # The story counts when the page shows it as it opens or one click away (Every step: binned history's
    # smoothed line is a line of bin means, its dips on the faint min/max line).
    ok = all(c["running"] and c["sliders"] and all(c["sliders"]) and c["health"]["ok"]
             and (c["story"]["ok"] or c["story_raw"]["ok"] or c["health"]["first_move"] is None) for c in checks)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
