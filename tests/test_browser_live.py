"""The live monitor in a real browser (headless Chromium via Playwright) against a real
`python -m grpo_core serve` with its demo run training.

Slow and few: weight slider -> Apply -> the trainer applies it -> "applied at step N"
and the marker; two browser sessions applying at once; charts moving while the run
trains; closing the browser and restarting the dashboard leave the trainer alone.
GRPO_SCREENSHOTS=1 (make screenshots) saves the README screenshots to docs/screenshots/.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_core.dashboard import processes
from grpo_core.runs.store import RunStore, list_runs, pid_alive
from tests.helpers_dashboard import REPO, free_port, process_tree, wait_for

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
SHOTS = REPO / "docs" / "screenshots"
SCREENSHOTS = os.environ.get("GRPO_SCREENSHOTS") == "1"
# Fast by default (untrained model, tiny steps); the README screenshots use the real demo
# (warm-started model, 8 prompts x G=8) and wait for enough steps to show the curves' shape.
# A budget the run cannot reach while the module runs: the fast demo trains ~35 steps/s on 2 cores.
BUDGET = 1_000_000
# The autopilot off: these tests check the requests the page sends, and the demo's autopilot would
# add its own (bench/demo_story.py drives the shipped demo, autopilot on, in a browser).
DEMO = [f"grpo.steps={BUDGET}", "log.checkpoint_every=0", "autopilot.enabled=false"] + ([] if SCREENSHOTS else [
    "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8"])
MIN_STEPS = 60 if SCREENSHOTS else 3
METRICS = ("answer_f1", "exact", "citation", "format", "length")

if not Path(CHROMIUM).exists():
    pytest.skip("no /usr/bin/chromium (make test installs Debian's chromium)", allow_module_level=True)


class Server:
    """`python -m grpo_core serve` on a free port with its own runs dir."""

    def __init__(self, root: Path):
        self.root, self.port, self.proc = root, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        cmd = [sys.executable, "-m", "grpo_core", "serve", "--port", str(self.port), "--runs-dir", str(self.root)]
        for o in DEMO:
            cmd += ["--set", o]
        self.log = open(self.root / f"serve-{time.time():.0f}.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        import urllib.request
        wait_for(lambda: urllib.request.urlopen(self.url + "/_stcore/health", timeout=2).read() == b"ok",
                 90, what="Streamlit to answer")
        return Path(self.log.name).read_text()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # serve takes its Streamlit down, never the trainer
            self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser-runs")
    server = Server(root)
    server.start()
    rid = wait_for(lambda: processes.live_demo(root), 30, what="the demo run")
    wait_for(lambda: (_store(root, rid).last_step() or 0) >= MIN_STEPS, 240 + 10 * MIN_STEPS,
             what=f"the demo to train {MIN_STEPS} steps")
    yield server, rid
    server.stop()
    processes.terminate_run(rid, root=root, wait_s=30)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _store(root, rid) -> RunStore:
    return RunStore.open(root / rid, readonly=True)


def _control(root, rid):
    with _store(root, rid) as s:
        return s.control()


def open_live(browser, url, rid):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1900})
    page = ctx.new_page()
    page.goto(f"{url}/?run={rid}", wait_until="domcontentloaded")
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 6", timeout=60_000)
    page.get_by_text("What-if trainable ratio").first.wait_for(timeout=60_000)
    return ctx, page


def nudge(page, metric: str, key: str, times: int) -> float:
    """Focus a weight slider's thumb and move it with the keyboard; returns the new value."""
    thumb = page.locator('[data-testid="stSlider"]').filter(has_text=metric).locator('input[type="range"]')
    before = float(thumb.input_value())
    thumb.focus()
    for _ in range(times):
        thumb.press(key)
    want = round(before + (0.01 if key == "ArrowRight" else -0.01) * times, 2)
    page.wait_for_function(f"document.body.innerText.includes('{metric}={want:g}')", timeout=30_000)
    return want


def chart_markers(page) -> list[list[float]]:
    return page.evaluate("""Array.from(document.querySelectorAll('.js-plotly-plot')).map(g =>
        (g.layout.shapes || []).filter(s => (s.name || '').startsWith('change:')).map(s => s.x0))""")


def shot(page, name, below: str | None = None, height: int = 520):
    """Full page, or the `height` pixels from the heading `below` down."""
    if not SCREENSHOTS:
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(1500)  # let plotly finish its transitions
    if below:
        box = page.get_by_text(below).first.bounding_box()
        page.screenshot(path=str(SHOTS / name), full_page=True,
                        clip={"x": 0, "y": box["y"] - 20, "width": 1400, "height": height})
    else:
        page.screenshot(path=str(SHOTS / name), full_page=True)


def test_slider_apply_is_applied_by_the_trainer_and_marked_on_every_chart(served, browser):
    server, rid = served
    ctx, page = open_live(browser, server.url, rid)
    shot(page, "live_monitor.png")
    want = nudge(page, "length", "ArrowRight", 5)
    shot(page, "what_if.png", below="Reward weights, threshold, difficulty")
    assert _control(server.root, rid).empty  # moving a slider sends nothing
    page.get_by_role("button", name="Apply").click()
    def applied():
        c = _control(server.root, rid)
        return c.iloc[-1].to_dict() if len(c) and c.iloc[-1]["status"] == "applied" else None
    row = wait_for(applied, 60, what="the trainer to apply the request")
    assert row["source"] == "ui" and row["payload"]["weights"]["length"] == pytest.approx(want)
    step = int(row["applied_step"])
    page.get_by_text(f"applied at step {step}").wait_for(timeout=30_000)
    page.wait_for_function(f"""Array.from(document.querySelectorAll('.js-plotly-plot')).every(g =>
        (g.layout.shapes || []).some(s => (s.name || '').startsWith('change:') && s.x0 === {step}))""",
                           timeout=30_000)
    assert all(step in m for m in chart_markers(page))
    shot(page, "live_monitor_applied.png")
    ctx.close()


def _weights_in_force(root, rid) -> dict:
    with _store(root, rid) as s:
        row = s.scalars_wide(since_step=s.last_step() - 1).iloc[-1]
    return {m: float(row[f"reward/{m}/weight"]) for m in METRICS}


def test_two_browser_sessions_apply_at_once_both_applied_in_order(served, browser):
    server, rid = served
    n0 = len(_control(server.root, rid))
    (ca, a), (cb, b) = open_live(browser, server.url, rid), open_live(browser, server.url, rid)
    cur = _weights_in_force(server.root, rid)
    wa = nudge(a, "exact", "ArrowLeft", 10)
    wb = nudge(b, "citation", "ArrowRight", 10)
    a.get_by_role("button", name="Apply").click()
    b.get_by_role("button", name="Apply").click()

    def both_applied():
        c = _control(server.root, rid).iloc[n0:]
        return c if len(c) == 2 and (c["status"] == "applied").all() else None
    rows = wait_for(both_applied, 90, what="both requests applied")
    sent = [r["weights"] for r in rows["payload"]]  # in request-id order
    r6 = lambda ws: [{m: round(w, 6) for m, w in x.items()} for x in ws]  # noqa: E731 (slider floats)
    # None lost, none altered. The session that sends second may have seen the first request
    # applied already (its page refreshes every 2 s): its untouched sliders then show the
    # weights in force, so its request keeps the other session's change instead of undoing it.
    a_alone, b_alone, both = {**cur, "exact": wa}, {**cur, "citation": wb}, {**cur, "exact": wa, "citation": wb}
    allowed = [[a_alone, b_alone], [a_alone, both], [b_alone, a_alone], [b_alone, both]]
    assert r6(sent) in [r6(x) for x in allowed], sent
    steps = rows["applied_step"].astype(int).tolist()
    assert steps == sorted(steps)  # applied in request order
    wait_for(lambda: _store(server.root, rid).last_step() >= steps[-1], 60, what="the step it applies at")
    with _store(server.root, rid) as s:
        changes = s.changes()
        logged = s.scalars_wide(since_step=steps[-1] - 1, until_step=steps[-1]).iloc[-1]
    assert [r["weights"] for r in changes["request"].tolist()[-2:]] == sent  # both marked, in order
    for m in METRICS:  # from its step on, the trainer runs with the later request's weights
        assert logged[f"reward/{m}/weight"] == pytest.approx(sent[-1][m])
    for p in (a, b):
        p.get_by_text(re.compile(r"applied at step \d+")).first.wait_for(timeout=30_000)
    ca.close()
    cb.close()


def test_charts_keep_updating_while_the_run_trains(served, browser):
    server, rid = served
    ctx, page = open_live(browser, server.url, rid)
    last_x = "(() => { const x = document.querySelectorAll('.js-plotly-plot')[0]._fullData[0].x; " \
             "return Number(x[x.length - 1]); })()"  # the ratio chart's last step drawn
    first = page.evaluate(last_x)
    assert first >= 3
    page.wait_for_function(f"{last_x} > {first}", timeout=45_000)  # no reload: the fragment refreshed
    step_text = page.get_by_text(re.compile(rf"step \d+ of {BUDGET}")).first.inner_text()
    assert int(re.search(r"step (\d+) of", step_text).group(1)) >= first
    ctx.close()


def _inotify_watches(pid: int) -> int:
    """Inotify watches held by a process and its descendants (Linux /proc)."""
    n = 0
    for p in process_tree(pid):
        for fd in Path(f"/proc/{p}/fd").iterdir():
            try:
                if os.readlink(fd) == "anon_inode:inotify":
                    n += (Path(f"/proc/{p}/fdinfo") / fd.name).read_text().count("inotify wd:")
            except OSError:
                continue  # closed meanwhile
    return n


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc")
def test_the_dashboard_watches_no_source_files(served, browser):
    # Streamlit's default watcher adds an inotify watch per folder of the checkout, .venv
    # included, and on every queue overflow (which the imports of a trainer started from that
    # .venv cause) walks the whole tree again: half a core, and CI's live-page test timed out.
    # `serve` (and .streamlit/config.toml) turn it off.
    server, rid = served
    ctx, _ = open_live(browser, server.url, rid)  # Streamlit starts its watchers with a session
    assert _inotify_watches(server.proc.pid) == 0
    ctx.close()


def test_closing_the_browser_and_restarting_streamlit_leave_the_trainer_alone(served, browser):
    server, rid = served
    ctx, page = open_live(browser, server.url, rid)
    page.goto(f"{server.url}/runs", wait_until="domcontentloaded")
    page.get_by_text(rid).first.wait_for(timeout=30_000)
    shot(page, "runs_page.png")
    ctx.close()  # the browser goes away
    with _store(server.root, rid) as s:
        pid = s.get_meta()["pid"]
    server.stop()  # the dashboard goes away
    step = _store(server.root, rid).last_step()
    assert pid_alive(pid)
    wait_for(lambda: _store(server.root, rid).last_step() > step + 1, 60, what="steps without a dashboard")
    assert list_runs(server.root).set_index("run_id").loc[rid, "status"] == "running"

    out = server.start()  # a fresh dashboard finds the live demo instead of starting another
    wait_for(lambda: "already live" in Path(server.log.name).read_text(), 30, what="serve's demo line")
    assert len(list_runs(server.root)) == 1 and pid_alive(pid), out
    ctx, page = open_live(browser, server.url, rid)
    assert rid in page.inner_text("body")
    ctx.close()


PAGES = {"/": "Live monitor", "/runs": "Runs", "/analysis": "Analysis", "/pilot": "Pilot"}
# Resources a page loads through its DOM (an icon link is fetched by the browser itself, which
# Playwright's request events may not report): every one must be local or inline.
LOADED = """Array.from(document.querySelectorAll('link[href], script[src], img[src], iframe[src], source[src]'))
    .filter(e => e.tagName !== 'LINK' || /icon|stylesheet|preload|font/.test(e.rel))
    .map(e => e.href || e.src)"""


def _external(url: str) -> bool:
    from urllib.parse import urlparse
    u = urlparse(url)
    return u.scheme not in ("data", "blob", "about", "") and u.hostname != "127.0.0.1"


def test_no_request_leaves_the_machine_on_any_page(served, browser):
    # Air-gapped clusters: a font, icon or script from a CDN fails there. Every request of every
    # page, and every resource its DOM names (the favicon), goes to 127.0.0.1 or is inline.
    server, rid = served
    ctx = browser.new_context(viewport={"width": 1400, "height": 1900})
    page = ctx.new_page()
    seen = []
    page.on("request", lambda r: seen.append(r.url))
    outside = []
    for path, title in PAGES.items():
        page.goto(f"{server.url}{path}?run={rid}", wait_until="domcontentloaded")
        page.get_by_role("heading", name=re.compile(title)).first.wait_for(timeout=60_000)
        page.wait_for_timeout(3000)  # charts, icons and fonts load after the heading
        outside += [u for u in page.evaluate(LOADED) if _external(u)]
    assert len(seen) > 10  # the pages did load (scripts, fonts, the websocket)
    outside += [u for u in seen if _external(u)]
    assert outside == []
    ctx.close()
