"""Live page with real browsers: what 0, 1, 3 and 10 open viewers cost a run that keeps training.

Issue 29's table, regenerated. A run of `--history-steps` steps (default 10,000) is trained once
by the real trainer (`python -m grpo_core train`, a cheap config: the built-in model on the demo
task, 2 prompts x G=4, 8 new tokens) and cached under --cache-dir with its final checkpoint. Each
bench copies it and resumes it (`train --resume`, a budget it cannot reach), so the real trainer
keeps writing the run from that step on while `python -m grpo_core serve --no-demo` serves it and
headless Chromium (one browser process, started under `nice -n 19` through a wrapper script,
standing in for browsers on other machines) opens one page per viewer on the run's live page.

Per phase (viewers already open: 0, 1, 3, 10), over --phase-s seconds after the pages settled:
- trainer steps/s, from the store's last step at the window's ends (and against 0 viewers);
- with viewers open, the trainer's steps/s paired: --pairs pairs (--target-pairs with 10 viewers: the
  target's reading) of PAIR_S windows with the viewers' browser drawing and stopped (SIGSTOP; the box's
  drift cancels within a pair; the pairs' spread gives the reading's uncertainty, and the report decides
  the target outside it);
- the dashboard server's CPU (serve and its Streamlit, /proc utime + stime), total and per viewer;
- the lag from a step being readable in the store to the first viewer's page showing "step N of":
  the bench polls both every POLL_S;
- then a new page's first chart, with the others open, --repeats times (the median and the range): from
  asking for the page to the frame that painted its first chart (live_chart's uPlot canvas and title:
  the title's paint time from the Element Timing API), in a
  browser process of its own (a cold HTTP cache) and as a new tab of the viewers' browser, and where
  its time went (page-side performance.now() marks: the HTML, the JS bundle, the websocket, its first
  message, the first large message (a chart's data), the first chart element, its canvas, the frame
  that painted it, when Playwright saw it, every chart drawn);
- the same two on Streamlit's floor page (FLOOR_APP: one line and one chart, a Streamlit of its own),
  right after: what any Streamlit page costs a browser in that place, beside the trainer and the viewers.

Targets (issue 29): first chart < 2 s, server < 5% of a core per viewer, 10 viewers slow the trainer
by < 5%, lag < 2 refresh intervals. Writes the "Live page: viewers" section of docs/benchmarks.md.
The pages and their marks are bench/live_viewers_pages.py; the section's text, bench/live_viewers_report.py.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from live_viewers_pages import (CHROME_ARGS, box_cpu_seconds, chromium_pids, cpu_seconds, cpu_share, first_chart,  # noqa: E402
                                first_chart_new_browser, median_reading, new_context, niced_chromium, open_page,
                                page_step)
from live_viewers_report import HEADING, section  # noqa: E402
from perf_common import publish, scratch_dir  # noqa: E402

from grpo_core.runs.store import RunStore  # noqa: E402
from tests.helpers_dashboard import CHROMIUM, answers, free_port, process_tree, streamlit_app, wait_for  # noqa: E402

# The trainer's config, the same for the history and every phase.
TRAIN_SET = ["grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8", "log.checkpoint_every=0",
             "log.progress=false", "autopilot.enabled=false"]
BUDGET = 10_000_000  # the resumed run's budget (the largest allowed): it keeps training through every phase
POLL_S = 0.2  # how often the bench reads the store's last step and the watched page's step
# One half of a paired trainer reading (`paired`): short, so the box's drift moves both halves alike,
# and within a stopped browser's websocket grace (Streamlit pings every 30 s and waits 30 s for the pong).
PAIR_S = 8.0
TARGET_VIEWERS = 10  # the phase whose paired reading decides the target (10 viewers slow the trainer by < 5%)

# Streamlit's own floor: a page of one progress-like line and one chart in the live page's element,
# a minimal app of its own (the same marks apply: its text matches STEP_RE, its chart is a .live-chart).
FLOOR_APP = """
import numpy as np
import pandas as pd
import streamlit as st

from grpo_core.analysis import charts
from grpo_core.dashboard import live_chart
from grpo_core.runs import names

steps = np.arange(10_000)
ratio = 0.5 + 0.4 * np.sin(steps / 50.0)
st.markdown("step 10,000 of 10,000")
df = pd.DataFrame({names.TRAINABLE_RATIO: ratio, names.CUM_TRAINABLE_RATIO: np.cumsum(ratio) / (steps + 1)}, index=steps)
live_chart.draw(live_chart.encode(live_chart.spec(charts.ratio_chart(df))), key="ratio")
live_chart.load()
"""

# ---- the run: history once (cached), then the real trainer resumed --------------------------------
def history(cache: Path, steps: int) -> tuple[Path, str]:
    """(runs dir, run id) of a finished run of `steps` steps with its final checkpoint; trained once."""
    key = hashlib.sha1(" ".join(TRAIN_SET).encode()).hexdigest()[:8]
    root, rid = cache / f"h{steps}-{key}", "history"
    if (root / ".complete").exists():
        return root, rid
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t = time.time()
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", rid, "--runs-dir", str(root),
           "--set", f"grpo.steps={steps}"] + [a for s in TRAIN_SET for a in ("--set", s)]
    print(f"training the {steps:,}-step history once into {root} ...", file=sys.stderr)
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the history's trainer failed ({out.returncode}): {out.stderr[-2000:]}")
    (root / ".complete").write_text(f"{time.time() - t:.0f}")
    return root, rid


def history_seconds(root: Path) -> float:
    return float((root / ".complete").read_text())


def last_step(run_dir: Path) -> int:
    with RunStore.open(run_dir, readonly=True) as store:
        return int(store.last_step() or -1)


class Processes:
    """The trainer and `serve` this bench started (each in its own process group); stop() ends
    both by PID, whatever state they are in."""

    def __init__(self, work: Path):
        self.work, self.procs, self.logs = work, [], []

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def check(self):
        """Fail with the log's last lines when one of them exited."""
        for proc, log in zip(self.procs, self.logs):
            if proc.poll() is not None:
                log.flush()
                raise SystemExit(f"{Path(log.name).stem} exited ({proc.returncode}): "
                                 f"{Path(log.name).read_text()[-1500:]}")

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: the process and its children
                proc.wait()
        for log in self.logs:
            log.close()


# ---- the trainer's rate ------------------------------------------------------------------------
def commit_rate(run_dir: Path, seconds: float) -> tuple[float, float]:
    """(steps, seconds) between the first and the last commit the bench saw in `seconds` of polling:
    the trainer commits every second or so, so counting from the window's ends would be off by up
    to a commit's steps; counting between commits is off by a poll at most."""
    seen: list[tuple[float, int]] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s = last_step(run_dir)
        if not seen or s > seen[-1][1]:
            seen.append((time.perf_counter(), s))
        time.sleep(POLL_S)
    if len(seen) < 3:  # the window's first reading is not a commit the bench saw happen
        return 0.0, 0.0
    return float(seen[-1][1] - seen[1][1]), seen[-1][0] - seen[1][0]


@contextlib.contextmanager
def stopped(pids: list[int]):
    """The processes stopped (SIGSTOP) while the block runs, continued (SIGCONT) however it ends."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def cpu_reading(server: list[int]) -> tuple:
    """Where the CPU time stands now: the server's processes, the viewers' browser's, the whole box's,
    and the clock."""
    return cpu_seconds(server), cpu_seconds(chromium_pids()), box_cpu_seconds(), time.perf_counter()


def cpu_spent(before: tuple, after: tuple) -> list[float]:
    """CPU seconds of the server, the browser and the whole box between two readings, and the wall seconds."""
    return [cpu_share(before[0], after[0], 1.0), cpu_share(before[1], after[1], 1.0), after[2] - before[2], after[3] - before[3]]


def paired(run_dir: Path, pairs: int, server: list[int]) -> dict:
    """The trainer's steps/s with the open viewers drawing and with their browser stopped (no page
    draws, so none asks the server for a refresh: the viewers cost nothing), in `pairs` pairs of
    PAIR_S windows, alternately ordered (ABBA): the box's drift, which moves the trainer alone by
    20-80% over a bench, moves both halves of a pair alike, and a steady drift cancels out. Each
    pair's change (drawing / stopped - 1) is kept: their spread is the reading's own uncertainty.
    Per kind of half, the cores the server, the viewers' browser and the whole box used: what a
    stopped half still costs the trainer is what the pairs cannot see."""
    totals = {True: [0.0, 0.0], False: [0.0, 0.0]}  # drawing? -> [steps, seconds]
    used = {True: [0.0, 0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0, 0.0]}  # drawing? -> CPU s: server, browser, box; wall s
    changes = []
    for i in range(pairs):
        pair = {}
        for drawing in ((True, False) if i % 2 == 0 else (False, True)):
            with (contextlib.nullcontext() if drawing else stopped(chromium_pids())):
                before = cpu_reading(server)
                steps, seconds = commit_rate(run_dir, PAIR_S)
                after = cpu_reading(server)
            used[drawing] = [u + d for u, d in zip(used[drawing], cpu_spent(before, after))]
            totals[drawing][0] += steps
            totals[drawing][1] += seconds
            pair[drawing] = steps / seconds if seconds else 0.0
        if pair[True] and pair[False]:  # a half without two commits seen has no rate
            changes.append(pair[True] / pair[False] - 1)
    rate = {k: (v[0] / v[1] if v[1] else None) for k, v in totals.items()}
    cores = {("drawing" if k else "stopped"): dict(zip(("server", "browser", "box"), (c / v[3] for c in v[:3])))
             for k, v in used.items()}
    return {"drawing": rate[True], "stopped": rate[False], "pairs": pairs, "changes": changes, "cores": cores}


# ---- one phase ---------------------------------------------------------------------------------
def newcomers(p, wrapper: Path, warm, url: str, server: list[int], args) -> dict:
    """A new page's first chart on `url`, --repeats times each: "first" in a browser process of its
    own (a cold HTTP cache), "warm" as a new tab of `warm` (a context that loaded the page before)."""
    return {"first": median_reading(lambda: first_chart_new_browser(p, wrapper, url, args.timeout_s, server), args.repeats),
            "warm": median_reading(lambda: first_chart(warm, url, args.timeout_s, server), args.repeats)}


def watch(run_dir: Path, page, seconds: float) -> dict:
    """Poll the store's last step and (with a page) the page's step for `seconds`: the trainer's
    rate and the store-to-page lag of each new step the page shows."""
    seen_at: dict[int, float] = {}  # a store step -> when the bench first read it (or a later one)
    lags, shown, redraws = [], None, []
    t0 = time.perf_counter()
    s0 = last_step(run_dir)
    while (now := time.perf_counter()) - t0 < seconds:
        s = last_step(run_dir)
        if not seen_at or s > max(seen_at):
            seen_at[s] = now
        if page is not None:
            p = page_step(page)
            if p is not None and (shown is None or p > shown):
                if shown is not None:  # the first reading is not a redraw the bench saw happen
                    # the store read just before this one may have missed a commit in between: lag ~0
                    first = min((t for st, t in seen_at.items() if st >= p), default=time.perf_counter())
                    if p > s0:  # a step already stored before the window: its store time is unknown
                        lags.append(time.perf_counter() - first)
                    redraws.append(time.perf_counter())
                shown = p
        time.sleep(POLL_S)
    steps = last_step(run_dir) - s0
    gaps = [b - a for a, b in zip(redraws, redraws[1:])]
    return {"steps_per_s": steps / (time.perf_counter() - t0), "lags": lags,
            "redraw_s": statistics.median(gaps) if gaps else None}


def phase(p, wrapper: Path, browser, warm, pages: list, n: int, url: str, run_dir: Path, server_pid: int,
          floor: "Floor", args) -> dict:
    """Viewers open: `n` (pages added to reach it); measure the window, then a newcomer's first
    chart, --repeats times each: in a browser of its own (cold HTTP cache) and as a new tab of `warm`
    in the viewers' browser (a context that has loaded the page before: its cache holds the app's JS);
    then the same two on Streamlit's floor page, in the same place (the same viewers open)."""
    opening = []
    while len(pages) < n:
        page, seconds = open_page(new_context(browser), url, args.timeout_s)
        pages.append(page)
        opening.append(seconds)
    time.sleep(args.settle_s)  # the openings' own work out of the window
    server = [p for p in process_tree(server_pid)]
    c0, b0, w0 = cpu_seconds(server), cpu_seconds(chromium_pids()), time.perf_counter()
    w = watch(run_dir, pages[0] if pages else None, args.phase_s)
    elapsed = time.perf_counter() - w0
    out = {"viewers": n, **w, "server_cpu": cpu_share(c0, cpu_seconds(server), elapsed),
           "browser_cpu": cpu_share(b0, cpu_seconds(chromium_pids()), elapsed), "opening": opening,
           "load": os.getloadavg()[0]}
    pairs = args.target_pairs if n >= TARGET_VIEWERS else args.pairs
    if n and pairs:
        out["paired"] = paired(run_dir, pairs, server)
    out.update(newcomers(p, wrapper, warm, url, server, args))
    out["floor"] = newcomers(p, wrapper, floor.warm, floor.url, [], args)
    print(f"{n} viewers: {out['steps_per_s']:.2f} steps/s, server {out['server_cpu']:.0%} of a core, "
          f"browser {out['browser_cpu']:.0%}, first chart in the HTML {out['first']['all_previews']} s "
          f"(new tab {out['warm']['all_previews']} s), the page's {out['first']['all_seconds']} s "
          f"(new tab {out['warm']['all_seconds']} s), floor {out['floor']['first']['all_seconds']} s "
          f"(new tab {out['floor']['warm']['all_seconds']} s), lags {[round(x, 2) for x in out['lags']]}, "
          f"paired {out.get('paired')}", file=sys.stderr)
    return out


def first_chart_trainer_paused(p, wrapper: Path, warm, url: str, trainer: subprocess.Popen, server: list[int], args) -> dict:
    """A new page's first chart with the trainer stopped (SIGSTOP) while it loads: what the page
    itself costs when its browser and the server do not share the CPU with training (a browser
    on another machine; on this 2-core box the trainer otherwise takes both cores). The trainer
    continues (SIGCONT) after each page, whatever happens; the run stays live (one page loads
    well within run_meta.STALE_AFTER_S)."""
    @contextlib.contextmanager
    def paused():
        with stopped(process_tree(trainer.pid)):
            time.sleep(0.5)  # the trainer's last write settles
            yield
        time.sleep(3)  # a heartbeat and a few steps before the next page

    def tab():
        with paused():
            return first_chart(warm, url, args.timeout_s, server)
    out = {"first": median_reading(lambda: first_chart_new_browser(p, wrapper, url, args.timeout_s, server, paused), args.repeats),
           "warm": median_reading(tab, args.repeats)}
    print(f"trainer paused: first chart {out['first']['all_seconds']} s (new tab {out['warm']['all_seconds']} s)", file=sys.stderr)
    return out


class Floor:
    """Streamlit's own floor: FLOOR_APP served by a Streamlit of its own beside the running trainer,
    and a context of the viewers' browser that loaded it once (its new tabs find the JS cached).
    Each phase reads a newcomer's first chart on it (`newcomers`) with that phase's viewers open:
    what any Streamlit page costs a starved browser there (its JS, its websocket, one element of
    each kind)."""

    def __init__(self, browser, work: Path, args):
        app = work / "floor_app.py"
        app.write_text(FLOOR_APP)
        self.stack = contextlib.ExitStack()
        self.url = self.stack.enter_context(streamlit_app(app, 120))
        self.warm = new_context(browser, marks=True)
        open_page(self.warm, self.url, args.timeout_s)[0].close()  # fills its HTTP cache

    def close(self):
        self.stack.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--viewers", type=int, nargs="+", default=[0, 1, 3, 10], help="viewers open, one phase each (ascending)")
    ap.add_argument("--phase-s", type=float, default=45.0, help="seconds measured per phase")
    ap.add_argument("--settle-s", type=float, default=5.0, help="seconds after the pages opened before measuring")
    ap.add_argument("--history-steps", type=int, default=10_000, help="steps of the run before the viewers open")
    ap.add_argument("--cache-dir", default=str(ROOT / "bench" / ".cache" / "live_viewers"),
                    help="where the trained history is kept between benches")
    ap.add_argument("--pairs", type=int, default=12, help=f"per phase with viewers, pairs of {PAIR_S:.0f}-s trainer readings with "
                    "the viewers' browser drawing and stopped (0: none)")
    ap.add_argument("--target-pairs", type=int, default=96, help=f"the same pairs with {TARGET_VIEWERS} viewers or more, "
                    "the target's reading: a pair's change spreads by about 10%% on a shared 2-core box, so 12 pairs "
                    "rarely decide a 5%% target and 96 pairs do (0: none)")
    ap.add_argument("--repeats", type=int, default=3, help="a newcomer's first chart: readings per kind and phase (the table shows their median and range)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="give up waiting on a page's first chart after this")
    ap.add_argument("--browser-priority", choices=["autogroup", "nice"], default="autogroup",
                    help="autogroup: nice 19 and the browser session's autogroup at nice 19 (the lowest); "
                         "nice: `nice -n 19` alone (under autogroups it ranks only within the browser's session)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    args.viewers = sorted(set(args.viewers))
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no {CHROMIUM}: install Debian's chromium (make test does)")
    from playwright.sync_api import sync_playwright

    # SIGTERM (`timeout`, a CI runner) ends the bench through its `finally`, like Ctrl-C: the trainer,
    # serve and the browser run in sessions of their own and would outlive it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.time()
    hist_root, rid = history(Path(args.cache_dir), args.history_steps)
    work = scratch_dir("grpo-live-viewers-")
    procs = Processes(work)
    try:
        shutil.copytree(hist_root / rid, work / rid)
        run_dir, start_step = work / rid, last_step(work / rid)
        trainer = procs.start("trainer", [sys.executable, "-m", "grpo_core", "train", "--run-id", rid, "--runs-dir", str(work),
                                "--resume", "--set", f"grpo.steps={BUDGET}"] + [a for s in TRAIN_SET for a in ("--set", s)])
        port = free_port()
        server = procs.start("serve", [sys.executable, "-m", "grpo_core", "serve", "--no-demo", "--port", str(port),
                                       "--runs-dir", str(work)])
        url = f"http://127.0.0.1:{port}"

        wait_for(lambda: procs.check() or answers(url), 120, every=POLL_S, what="Streamlit to answer")
        wait_for(lambda: procs.check() or last_step(run_dir) > start_step + 5, 300, every=POLL_S, what="the resumed trainer's first steps")
        results = []
        with sync_playwright() as p:
            wrapper = niced_chromium(work, args.browser_priority == "autogroup")
            browser = p.chromium.launch(executable_path=str(wrapper), args=CHROME_ARGS)
            try:
                pages: list = []
                warm = new_context(browser, marks=True)
                open_page(warm, f"{url}/?run={rid}", args.timeout_s)[0].close()  # fills its HTTP cache
                floor = Floor(browser, work, args)
                try:
                    for n in args.viewers:
                        results.append(phase(p, wrapper, browser, warm, pages, n, f"{url}/?run={rid}", run_dir,
                                             server.pid, floor, args))
                finally:
                    floor.close()
                for page in pages:  # the viewers' own load out of the readings below
                    page.context.close()
                time.sleep(args.settle_s)
                alone_after = watch(run_dir, None, args.phase_s)["steps_per_s"]  # the box's drift over the phases
                print(f"trainer alone again: {alone_after:.2f} steps/s", file=sys.stderr)
                paused = first_chart_trainer_paused(p, wrapper, warm, f"{url}/?run={rid}", trainer,
                                                    process_tree(server.pid), args)
            finally:
                browser.close()
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = section(results, paused, args, {"hist_steps": args.history_steps, "hist_s": history_seconds(hist_root),
                                                  "start_step": start_step, "minutes": (time.time() - t_start) / 60,
                                                  "train_set": TRAIN_SET, "budget": BUDGET, "poll_s": POLL_S, "pair_s": PAIR_S,
                                                  "alone_after": alone_after})
    publish(HEADING, text, write=not args.no_write)


if __name__ == "__main__":
    main()
