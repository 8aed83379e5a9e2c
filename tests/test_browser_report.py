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

from grpo_core.runs import requests
from grpo_core.runs import names
from grpo_core.analysis import report
from grpo_core.runs.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
STEPS = 30


def train_demo(runs_dir: Path) -> Path:
    """The built-in demo, small and without warm-start; one weight change sent from the CLI
    side while it trains (applied by the trainer between steps, as in real use). Sent once
    the trainer says running: its loop claims requests before each of its 30 steps, so the
    change lands however fast the steps go (after step 1 it raced a fast run's end)."""
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", "demo",
           "--set", f"grpo.steps={STEPS}", "--set", "grpo.prompts_per_step=4", "--set", "grpo.group_size=4",
           "--set", "model.warm_start_steps=0", "--set", "log.progress=false", "--set", "log.checkpoint_every=0"]
    log = open(runs_dir / "train.out", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    run = runs_dir / "demo"
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:  # wait for the training loop
            if (run / "run.db").is_file():
                with RunStore.open(run, readonly=True) as s:
                    if s.get_meta().get("status") == "running":
                        break
            time.sleep(0.05)
        requests.send(run, "set_weights", {"weights": {"answer_f1": 0.6, "length": 0.2}}, source="cli")
        proc.wait(timeout=max(5, deadline - time.time()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode == 0, (runs_dir / "train.out").read_text()[-3000:]
    return run


def rows(page, table_id: str) -> list[list[str]]:
    return page.eval_on_selector_all(f"#{table_id} tbody tr",
                                     "trs => trs.map(tr => Array.from(tr.cells).map(td => td.textContent))")


@pytest.mark.slow
def test_html_report_opens_offline_with_charts_and_the_report_numbers(runs_dir, tmp_path):
    from playwright.sync_api import sync_playwright

    run = train_demo(runs_dir)
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
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))

            def guard(route):
                url = route.request.url
                if url.startswith(("file:", "data:", "blob:")):
                    return route.continue_()
                attempted.append(url)
                return route.abort()
            page.route("**/*", guard)
            page.goto(out.as_uri())
            page.wait_for_function(
                "() => { const p = document.querySelectorAll('.js-plotly-plot');"
                " return p.length >= 3 && Array.from(p).every(d => d.querySelector('svg.main-svg')); }",
                timeout=30_000)
            n_plots = page.locator(".js-plotly-plot").count()
            traces = page.evaluate("() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
                                   ".map(d => d.querySelectorAll('g.trace').length)")
            summary, bottlenecks, ledger = rows(page, "summary"), rows(page, "bottlenecks"), rows(page, "ledger")
            steps = rows(page, "steps")
            status = page.text_content("#status")
        finally:
            browser.close()

    assert attempted == [], f"the report tried to load: {attempted[:5]}"
    assert errors == []
    assert n_plots == 3 and all(t > 0 for t in traces)  # ratio, bottlenecks, reward: each drew its traces
    assert status == "finished"
    assert summary == [[label, value] for _, label, value in report.summary_rows(rep)]
    bn = rep.bottlenecks
    assert bottlenecks == [[report.cell(c, r[c]) for c in report.BOTTLENECK_COLS] + [r["why"]] for _, r in bn.iterrows()]
    assert ledger == [[report.cell(c, r[c]) for c in report.LEDGER_SHOW] for _, r in rep.ledger.iterrows()]
    assert steps == [[str(s)] + [report.cell(c, r[c]) for c in report.STEP_COLS] for s, r in rep.steps.iterrows()]
    assert [r[0] for r in bottlenecks] == ["answer_f1", "exact", "citation", "format", "length"]
