"""End to end: a real (short) demo training run -> the HTML report -> headless Chromium.

The report must open offline: every request that is not the file itself is blocked and
recorded, and none may be attempted. Its plotly charts must render (an svg in every
.js-plotly-plot) and every number in its tables must be report.py's number."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_core.analysis import formatting, report
from grpo_core.runs import names, requests
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30


STALL_S = 240  # a wait gives up only after this long without progress (a hung trainer)


def store_progress(run: Path) -> tuple[str | None, int]:
    """(status, last step) of the run, (None, 0) before its store exists."""
    if not (run / "run.db").is_file():
        return None, 0
    with RunStore.open(run, readonly=True) as s:
        return s.get_meta().get("status"), s.last_step() or 0


@pytest.fixture
def trainer(runs_dir):
    """Starts the built-in demo trainer, small and without warm-start; whatever the test's
    outcome, the process is gone afterwards."""
    procs = []

    def start() -> subprocess.Popen:
        cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", "demo",
               "--set", f"grpo.steps={STEPS}", "--set", "grpo.prompts_per_step=4", "--set", "grpo.group_size=4",
               "--set", "model.warm_start_steps=0", "--set", "log.progress=false", "--set", "log.checkpoint_every=0"]
        with open(runs_dir / "train.out", "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()))
        return procs[-1]
    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def wait_while_progressing(proc: subprocess.Popen, run: Path, done) -> None:
    """Wait until done() or the trainer exits, giving up only when the store shows no progress
    (status or step) for STALL_S."""
    last, moved = None, time.time()
    while not done() and proc.poll() is None:
        now = store_progress(run)
        if now != last:
            last, moved = now, time.time()
        if time.time() - moved > STALL_S:
            raise TimeoutError(f"the trainer made no progress for {STALL_S}s (at {last})")
        time.sleep(0.05)


def train_demo(trainer, runs_dir: Path) -> Path:
    """The built-in demo, small and without warm-start; one weight change sent from the CLI
    side while it trains (applied by the trainer between steps, as in real use). Sent once
    the trainer says running: its loop claims requests before each of its 30 steps, so the
    change lands however fast the steps go."""
    proc = trainer()
    run = runs_dir / "demo"
    wait_while_progressing(proc, run, lambda: store_progress(run)[0] == "running")
    requests.send(run, "set_weights", {"weights": {"answer_f1": 0.6, "length": 0.2}}, source="cli")
    wait_while_progressing(proc, run, lambda: False)  # to the trainer's exit
    assert proc.wait() == 0, (runs_dir / "train.out").read_text()[-3000:]
    return run


@pytest.fixture
def browser_page():
    """A headless Chromium page; the browser is closed whatever the test's outcome."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def rows(page, table_id: str) -> list[list[str]]:
    return page.eval_on_selector_all(f"#{table_id} tbody tr",
                                     "trs => trs.map(tr => Array.from(tr.cells).map(td => td.textContent))")


@pytest.mark.slow
def test_html_report_opens_offline_with_charts_and_the_report_numbers(runs_dir, tmp_path, trainer, browser_page):
    run = train_demo(trainer, runs_dir)
    rep = report.build_report(run)
    # the report reads what the trainer logged: its per-step ratio is the trainer's own scalar
    with RunStore.open(run, readonly=True) as s:
        logged = s.scalars_wide()[names.TRAINABLE_RATIO]
    assert list(rep.steps.index) == list(range(1, STEPS + 1))
    assert rep.steps["ratio"].tolist() == pytest.approx(logged.tolist())
    assert rep.data.status == "finished" and not [n for n in rep.notices if n.level != "info"]
    assert len(rep.ledger) == 1 and rep.ledger.iloc[0]["source"] == "cli"
    out = tmp_path / "report.html"
    out.write_text(report.to_html(rep), encoding="utf-8")

    attempted, errors = [], []
    page = browser_page
    page.on("pageerror", lambda e: errors.append(str(e)))

    def guard(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            return route.continue_()
        attempted.append(url)
        return route.abort()
    page.route("**/*", guard)
    page.goto(out.as_uri())
    page.wait_for_function(  # a static file: drawn as soon as plotly has run, ceiling only
        "() => { const p = document.querySelectorAll('.js-plotly-plot');"
        " return p.length >= 4 && Array.from(p).every(d => d.querySelector('svg.main-svg')); }",
        timeout=STALL_S * 1000)
    n_plots = page.locator(".js-plotly-plot").count()
    traces = page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
                           ".map(d => d.querySelectorAll('g.trace').length)")
    summary, bottlenecks, ledger = rows(page, "summary"), rows(page, "bottlenecks"), rows(page, "ledger")
    steps = rows(page, "steps")
    status = page.text_content("#status")

    assert attempted == [], f"the report tried to load: {attempted[:5]}"
    assert errors == []
    assert n_plots == 4 and all(t > 0 for t in traces)  # ratio, why flat, bottlenecks, reward: each drew its traces
    assert status == "finished"
    assert summary == [[label, value] for _, label, value in report.summary_rows(rep)]
    bn = rep.bottlenecks
    assert bottlenecks == [[formatting.cell(c, r[c]) for c in report.BOTTLENECK_COLS] + [r["why"]] for _, r in bn.iterrows()]
    assert ledger == [[formatting.cell(c, r[c]) for c in report.LEDGER_SHOW] for _, r in rep.ledger.iterrows()]
    assert steps == [[str(s)] + [formatting.cell(c, r[c]) for c in report.STEP_COLS] for s, r in rep.steps.iterrows()]
    assert [r[0] for r in bottlenecks] == ["answer_f1", "exact", "citation", "format", "length"]
