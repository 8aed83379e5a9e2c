"""What an open live page costs with and without the "anything new?" route: Chromium and the server, per page.

The live_viewers bench's 10,000-step run, resumed: first training (every refresh finds new steps:
what the route adds to each refresh), then paused (its trainer keeps its heartbeat, no step comes:
a paused run, or a slow run between two steps). The same pages on two servers of the same
checkout, in alternating rounds: `streamlit run asgi.py` (what `serve` runs: each refresh asks
live_probe's route and reruns only when the run changed) and `streamlit run app.py` (no route:
each refresh reruns its fragment, which redraws the whole page). Per round: --pages pages opened in
a new context of one Chromium (at nice 19, as in live_viewers), --settle seconds for their second
run and first refreshes, then the CPU time of every Chromium process and of the server over
--seconds. Target: a viewer of a run with nothing new costs next to nothing; one of a training
run costs no more with the route.

    .venv/bin/python bench/live_idle.py [--pages 3] [--rounds 3] [--seconds 30] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
import live_viewers  # noqa: E402
import live_viewers_pages as pages  # noqa: E402
from perf_common import publish, scratch_dir  # noqa: E402

from grpo_core.dashboard import serve  # noqa: E402
from grpo_core.runs import requests  # noqa: E402
from grpo_core.runs.run_meta import PAUSED  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402
from tests.helpers_dashboard import answers, free_port, process_tree, wait_for  # noqa: E402

HEADING = "## Live page: the \"anything new?\" route"
SERVERS = {"route (asgi.py, serve's)": "asgi.py", "no route (app.py alone)": "app.py"}


def resumed_run(procs: live_viewers.Processes, work: Path) -> Path:
    """The history resumed in `work`, training (a few steps taken): its run dir."""
    hist_root, rid = live_viewers.history(ROOT / "bench" / ".cache" / "live_viewers", 10_000)
    run_dir = work / rid
    shutil.copytree(hist_root / rid, run_dir)
    start = live_viewers.last_step(run_dir)
    procs.start("trainer", [sys.executable, "-m", "grpo_core", "train", "--run-id", rid, "--runs-dir", str(work),
                            "--resume", "--set", f"grpo.steps={live_viewers.BUDGET}"]
                + [a for s in live_viewers.TRAIN_SET for a in ("--set", s)])
    wait_for(lambda: procs.check() or live_viewers.last_step(run_dir) > start + 5, 300, every=0.2, what="the trainer")
    return run_dir


def pause(procs: live_viewers.Processes, run_dir: Path):
    """Pause the run through a request, as the page's Pause button does; wait until it is paused."""
    requests.send(run_dir, "pause", {}, source="bench")

    def paused():
        with RunStore.open(run_dir, readonly=True) as store:
            return store.get_meta().get("status") == PAUSED
    wait_for(lambda: procs.check() or paused(), 120, every=0.2, what="the run paused")


def start_server(procs: live_viewers.Processes, name: str, script: str) -> tuple[str, list[int]]:
    """Streamlit on `script` with serve's flags; its URL and PID."""
    port = free_port()
    cmd = serve.streamlit_command(port)
    cmd[cmd.index("run") + 1] = str(ROOT / script)
    proc = procs.start(name, cmd)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: procs.check() or answers(url), 120, every=0.2, what=f"Streamlit on {script}")
    return url, proc.pid


def one_round(browser, url: str, server_pid: int, run_id: str, args) -> tuple[float, float]:
    """(Chromium, server) cores per open page over args.seconds, args.pages pages open."""
    ctx = pages.new_context(browser)
    try:
        for _ in range(args.pages):
            page, seconds = pages.open_page(ctx, f"{url}/live?run={run_id}", 120)
            if seconds is None:
                raise SystemExit("a page drew no chart in 120 s")
        time.sleep(args.settle)
        server = process_tree(server_pid)
        c0, s0 = pages.cpu_seconds(pages.chromium_pids()), pages.cpu_seconds(server)
        time.sleep(args.seconds)
        chromium = pages.cpu_share(c0, pages.cpu_seconds(pages.chromium_pids()), args.seconds)
        return chromium / args.pages, pages.cpu_share(s0, pages.cpu_seconds(server), args.seconds) / args.pages
    finally:
        ctx.close()


def report(readings: dict, args) -> str:
    rows = []
    for (phase, name), got in readings.items():
        cell = lambda xs: f"{statistics.median(xs):.1%} [{min(xs):.1%}, {max(xs):.1%}]"  # noqa: E731
        rows.append(f"| {phase} | {name} | {cell([c for c, _ in got])} | {cell([s for _, s in got])} |")
    return "\n".join([
        HEADING, "",
        f"`.venv/bin/python bench/live_idle.py --pages {args.pages} --rounds {args.rounds} --seconds {args.seconds:g}`"
        f" on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: the 10,000-step run "
        "training, then paused (heartbeat on, no new step); either way the live page refreshes every 2 s, its "
        f"what-if every 5 s; {args.pages} pages per round, Chromium at nice 19; median [min, max] over "
        f"{args.rounds} rounds per server and phase, the servers alternating. Targets: next to nothing per "
        "viewer of a run with nothing new; no more with the route while the run trains.", "",
        "| the run | server | Chromium, % of a core per open page | Streamlit server, % of a core per open page |",
        "|---|---|---|---|", *rows])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=3, help="live pages open per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per server and phase (the servers alternating)")
    ap.add_argument("--seconds", type=float, default=30.0, help="CPU measured over this long per round")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds after the pages opened before measuring")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    work = scratch_dir("live-idle-")
    procs = live_viewers.Processes(work)
    os.environ["GRPO_HEALTH_RUNS_DIR"] = str(work)  # the servers' runs dir (they inherit it)
    try:
        run_dir = resumed_run(procs, work)
        servers = {name: start_server(procs, f"serve-{i}", script) for i, (name, script) in enumerate(SERVERS.items())}
        readings = {}
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(pages.niced_chromium(work, True)), args=pages.CHROME_ARGS)
            for phase in ("training", "paused"):
                if phase == "paused":
                    pause(procs, run_dir)
                for r in range(args.rounds):
                    for name, (url, pid) in servers.items():
                        got = readings.setdefault((phase, name), [])
                        got.append(one_round(browser, url, pid, run_dir.name, args))
                        print(f"{phase} round {r + 1} {name}: Chromium {got[-1][0]:.1%}, "
                              f"server {got[-1][1]:.1%} of a core per page", file=sys.stderr)
            browser.close()
        publish(HEADING, report(readings, args), write=not args.no_write)
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
