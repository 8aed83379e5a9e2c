"""The live page's server work per new version of a run, part by part (issue 29).

Every open live page shares this work (grpo_core.dashboard.live_cache: once per version of the run,
for all viewers), so with one viewer open it is most of what that viewer costs the server, and with
a run that makes a step faster than the page refreshes, every refresh pays it. A synthetic run of
10,000 steps (tests.helpers_dashboard.synth_run: every per-step scalar, rollouts for the last 50
steps, 8 prompts x G=8, 5 metrics) grows by a few steps before each reading; each part is timed in
process CPU as the page calls it: the store read (live_cache.current; the rollouts apart, read at
the steering panel's period, live_cache.ROLLOUTS_S), the health cards and the
top alert's fix (advice.what_to_do), the chart frame, charts.live_charts' figures (plain dicts, as
the page builds them), live_chart.spec and live_chart.encode (the charts' bytes); and the steering
panel's flat-group forecast and what-if (its own fragment, every 5 s). No browser,
no Streamlit: bench/live_viewers.py measures those.

Writes the "Live page: the work of a new step" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from perf_common import TABLE_HEAD, machine, publish, scratch_dir, table_row  # noqa: E402

HEADING = "## Live page: the work of a new step"
# the charts' fragment, then the steering panel
MONITOR = ["store read", "health cards", "top alert's fix", "chart frame", "figures", "uPlot specs", "encode"]
STEER = ["rollouts read", "flat-group forecast", "what-if"]


def measure(history: int, versions: int, grow: int) -> tuple[dict[str, list[float]], int]:
    """CPU seconds per part, one entry per version (the first two dropped: warm-up), and the
    charts' bytes at the last version."""
    root = str(scratch_dir("live-step-cost-"))
    os.environ["GRPO_HEALTH_RUNS_DIR"] = root
    from grpo_core.analysis import charts
    from grpo_core.dashboard import advice, live_cache, live_cards, live_chart, live_view
    from tests.helpers_dashboard import synth_run
    t = time.time()
    store = synth_run(root, "r", history, rollouts_last=50, steps_total=10 * history)
    print(f"built {history} steps in {time.time() - t:.0f} s", file=sys.stderr)
    run_dir, step, parts, sent = os.path.join(root, "r"), history + 1, {}, 0

    def timed(name, fn):
        start = time.process_time()
        value = fn()
        parts.setdefault(name, []).append(time.process_time() - start)
        return value

    for _ in range(versions + 2):
        synth_run(root, "r", grow, rollouts_last=grow, store=store, start=step, steps_total=10 * history)
        step += grow
        live_cache.expire(run_dir)
        live_cache.ROLLOUTS_S = 1e9  # a refresh of the charts between two of the steering panel's
        s = timed("store read", lambda: live_cache.current(run_dir))
        c = timed("health cards", lambda: live_cards.cards(s))
        timed("top alert's fix", lambda: advice.what_to_do(s, c))
        frame = timed("chart frame", lambda: live_view.chart_frame(s))
        cur = live_view.current_settings(s)
        figs = timed("figures", lambda: charts.live_charts(frame, s.metrics, s.changes, live_view.health_config(s.meta),
                                                             cur["outcome_metric"], smoothing=charts.DEFAULT_SMOOTHING,
                                                             plain=True))
        specs = timed("uPlot specs", lambda: [live_chart.spec(f) for _, f in figs if f is not None])
        sent = sum(len(b) for b in timed("encode", lambda: [live_chart.encode(x) for x in specs]))
        live_cache.expire(run_dir)
        live_cache.ROLLOUTS_S = 0.0  # the steering panel's refresh: the rollouts of the steps since its last
        s = timed("rollouts read", lambda: live_cache.current(run_dir))
        timed("flat-group forecast", lambda: advice.flat_forecast(s, 8))
        timed("what-if", lambda: advice.what_if(s, cur["weights"], cur["min_group_std"]))
    store.close()
    return {k: v[2:] for k, v in parts.items()}, sent


def report(parts: dict[str, list[float]], sent: int, args) -> str:
    monitor = [sum(p) for p in zip(*(parts[k] for k in MONITOR))]
    rows = [table_row(k, parts[k]) for k in MONITOR] + [table_row("**the charts' fragment, all of the above**", monitor)]
    rows += [table_row(f"steering panel: {k}", parts[k]) for k in STEER]
    return "\n".join([
        HEADING, "",
        "The server's work for a new version of a live run (new steps since the last refresh), done once for all "
        "viewers of the run (`grpo_core.dashboard.live_cache`): with one viewer it is most of what that viewer costs the "
        f"server. A synthetic run of {args.history:,} steps grows by {args.grow} steps before each of "
        f"{args.versions} readings; process CPU per part, as the live page calls it. No browser and no Streamlit "
        "(`bench/live_viewers.py` measures those). The steering panel's parts run at its own period (5 s).", "",
        f"- Command: `.venv/bin/python bench/live_step_cost.py --history {args.history} --versions {args.versions} "
        f"--grow {args.grow}`",
        f"- Machine: {machine()}",
        f"- Measured: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "- Target: none of its own; issue 29's is the server's CPU per viewer (< 5% of a core), which this is the most "
        "of with one viewer open.", "",
        *TABLE_HEAD, *rows, "",
        f"The charts' bytes at the last version (every chart's data, as a new page is sent them; a page that holds the version before is sent the new rows: `live_chart.update`): {sent / 1000:.0f} kB.",
    ])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=int, default=10_000, help="steps of the run before the readings")
    ap.add_argument("--versions", type=int, default=20, help="readings, each after the run grew")
    ap.add_argument("--grow", type=int, default=5, help="steps added before each reading")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = ap.parse_args()
    parts, sent = measure(args.history, args.versions, args.grow)
    publish(HEADING, report(parts, sent, args), write=not args.no_write)


if __name__ == "__main__":
    main()
