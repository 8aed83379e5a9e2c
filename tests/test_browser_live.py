"""The live monitor in a real browser (headless Chromium via Playwright) against a real
`python -m grpo_core serve` and a demo run this module started itself (a run serve did not
start keeps training when serve stops; tests/test_serve_demo.py has the one it started).

Slow and few: weight slider -> Apply -> the trainer applies it -> "applied at step N"
and the marker; two browser sessions applying at once; charts moving while the run
trains; closing the browser and restarting the dashboard leave the trainer alone.
GRPO_HEALTH_SCREENSHOTS=1 (make screenshots) saves the README screenshots to docs/screenshots/.
"""
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_core.dashboard import processes
from grpo_core.errors import StoreError
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import STALE_AFTER_S, pid_alive
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, REPO, answers, free_port, process_tree, wait_for

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")

SHOTS = REPO / "docs" / "screenshots"
SCREENSHOTS = os.environ.get("GRPO_HEALTH_SCREENSHOTS") == "1"
# Fast by default (untrained model, tiny steps); the README screenshots use the real demo
# (warm-started model, 8 prompts x G=8) and wait for enough steps to show the curves' shape.
# A budget the run cannot reach while the module runs: it is live (and steerable) throughout.
BUDGET = 1_000_000
# The autopilot off: these tests check the requests the page sends, and the demo's autopilot would
# add its own (bench/demo_story.py drives the shipped demo, autopilot on, in a browser).
DEMO = [f"grpo.steps={BUDGET}", "log.checkpoint_every=0", "autopilot.enabled=false"] + ([] if SCREENSHOTS else [
    "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8"])
MIN_STEPS = 60 if SCREENSHOTS else 3
METRICS = ("answer_f1", "exact", "citation", "format", "length")

if not Path(CHROMIUM).exists():
    pytest.skip("no /usr/bin/chromium (make test installs Debian's chromium)", allow_module_level=True)


# Waits follow progress, not a guessed wall clock: a wait on the store gives up once the
# trainer has taken STEPS_PAST steps past the point where the awaited thing should have
# happened; a wait on a page gives up once the page has redrawn its step counter
# REDRAWS_PAST times without showing it; either gives up after STALL_S with no progress at
# all (a hung server or trainer), which holds however slow a loaded machine makes both.
STEPS_PAST = 50
REDRAWS_PAST = 20
CORRECT_AFTER = 4  # page redraws without a slider's value before its key presses are sent again
STALL_S = 240
STEP_TEXT = re.compile(rf"step (\d+) of {BUDGET}")
# The live page's uPlot charts (grpo_core.dashboard.live_chart: each chart's box keeps its chart on its node).
CHARTS = "Array.from(document.querySelectorAll('.live-chart')).map(h => h.chart).filter(c => c)"
# How many chart boxes the page ever made (live_chart.js makes one per chart where the charts element
# is first mounted): charts that moved on the page are mounted again, new boxes with new uPlot charts.
MOUNTS_JS = """window.chartMounts = 0;
new MutationObserver(records => { for (const r of records) for (const n of r.addedNodes)
  if (n.classList && n.classList.contains('live-chart')) window.chartMounts += 1; })
  .observe(document, {childList: true, subtree: true});"""
# A page whose charts draw late, or never: live_chart.js' entry point (grpoHealthLiveChart) wrapped
# before the page's scripts run, each draw held window.holdMs ms (never when null). window.seen: when
# the first chart was drawn and when the rest of the page (its run picker) came, in page ms.
HOLD_JS = """(() => {
  let draw = null;
  Object.defineProperty(globalThis, 'grpoHealthLiveChart', {configurable: true, set(fn) { draw = fn; },
    get() { return draw && (c => { if (window.holdMs !== null) setTimeout(() => draw(c), window.holdMs); }); }});
  window.holdMs = HOLD_MS;
  const seen = window.seen = {};
  new MutationObserver(() => {
    if (!('chart' in seen) && document.querySelector('.live-chart canvas')) seen.chart = performance.now();
    if (!('rest' in seen) && document.querySelector('[data-testid="stSidebar"] [data-testid="stSelectbox"]'))
      seen.rest = performance.now();
  }).observe(document, {childList: true, subtree: true});
})();"""


class Server:
    """`python -m grpo_core serve` on a free port with its own runs dir."""

    def __init__(self, root: Path):
        self.root, self.port, self.proc, self.log = root, free_port(), None, None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        cmd = [sys.executable, "-m", "grpo_core", "serve", "--port", str(self.port), "--runs-dir", str(self.root)]
        for o in DEMO:
            cmd += ["--set", o]
        self.log = open(self.root / f"serve-{time.time():.0f}.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

        def up():
            if self.proc.poll() is not None:  # serve itself failed: no use waiting
                pytest.fail(f"serve exited: {Path(self.log.name).read_text()[-2000:]}")
            return answers(self.url)
        wait_for(up, STALL_S, what="Streamlit to answer")
        return Path(self.log.name).read_text()

    def stop(self):
        """SIGTERM: serve takes its Streamlit down; the demo is the test's, so it keeps training."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # only our own process group: serve and its Streamlit
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log:
            self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A demo run this module started (as a user would: serve finds it live and leaves it be)
    and `serve` on it; both released whatever the tests' outcome."""
    root = tmp_path_factory.mktemp("browser-runs")
    rid, _ = processes.start_demo_if_idle(root, DEMO)
    server = Server(root)
    try:
        server.start()
        until(lambda: (store_step(root, rid)() or 0) >= MIN_STEPS, what=f"the demo to train {MIN_STEPS} steps",
              progress=store_step(root, rid))
        yield server, rid
    finally:
        server.stop()
        processes.stop_and_wait(rid, root=root, request_wait_s=15, signal_wait_s=30)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def new_context(browser):
    """Opens browser contexts for one test and closes every one of them after it, passed or
    failed: a failed test's live pages would otherwise keep redrawing every 2 s."""
    opened = []

    def make():
        opened.append(browser.new_context(viewport={"width": 1400, "height": 1900}))
        return opened[-1]
    try:
        yield make
    finally:
        for ctx in opened:
            try:
                ctx.close()
            except sync_api.Error:
                pass  # already gone with the browser


def _store(root, rid) -> RunStore:
    return RunStore.open(root / rid, readonly=True)


def _control(root, rid):
    with _store(root, rid) as s:
        return s.control()


def until(check, what: str, progress=None, advance: int | None = None, stall_s: float = STALL_S):
    """Poll check() until it returns something true; returns it. progress(): a counter that
    grows while the thing awaited should happen (None when not known yet): give up once it has
    grown `advance` past its first known value, or when it has not grown for stall_s."""
    first, last, moved, error = None, None, time.time(), None
    while True:
        try:
            found = check()
        except (sync_api.Error, StoreError, sqlite3.Error) as e:  # a page mid-navigation, a store mid-write
            found, error = None, e
        if found is not None and found is not False:
            return found
        now = progress() if progress else None
        if now is not None and now != last:
            first, last, moved = (now if first is None else first), now, time.time()
        if advance is not None and first is not None and last - first >= advance:
            raise TimeoutError(f"{what}: not seen while the progress counter went {first} -> {last}"
                               + (f" (last error: {error})" if error else ""))
        if time.time() - moved > stall_s:
            raise TimeoutError(f"{what}: not seen, and no progress for {stall_s:.0f}s (counter at {last})"
                               + (f" (last error: {error})" if error else ""))
        time.sleep(0.25)


def store_step(root, rid):
    """The trainer's progress counter: its last logged step."""
    def last():
        with _store(root, rid) as store:
            return store.last_step()
    return last


def page_redraws(page):
    """The page's progress counter: how many new steps its monitor has drawn since this counter
    was made, each redraw counting once however many steps the trainer took in between (None
    before the page's first draw)."""
    seen = {"step": None, "count": 0}

    def count():
        try:
            found = STEP_TEXT.search(page.inner_text("body"))
        except sync_api.Error:
            found = None
        if found and int(found.group(1)) != seen["step"]:
            seen["count"] += seen["step"] is not None
            seen["step"] = int(found.group(1))
        return None if seen["step"] is None else seen["count"]
    return count


def see(page, text, what: str | None = None):
    """Wait until the page shows `text` (a string or a regex), while it keeps redrawing."""
    locator = page.get_by_text(text).first
    until(lambda: locator.is_visible(), what=what or f"{text!r} on the page", progress=page_redraws(page),
          advance=REDRAWS_PAST)


def see_js(page, expression: str, what: str):
    """Wait until a JS expression is true on the page, while it keeps redrawing."""
    until(lambda: page.evaluate(expression), what=what, progress=page_redraws(page), advance=REDRAWS_PAST)


def open_live(new_context, url, rid):
    page = new_context().new_page()
    page.add_init_script(MOUNTS_JS)
    page.goto(f"{url}/?run={rid}", wait_until="domcontentloaded")
    until(lambda: page.evaluate(f"{CHARTS}.length >= 6"), what="the live page's charts")  # its first draw: no redraw to count yet
    see(page, "What-if trainable ratio")
    return page


def nudge(page, metric: str, key: str, times: int) -> float:
    """Move a weight slider's thumb with the keyboard until the page's what-if names the new
    value; returns it. What counts is the value the server has: when the page has redrawn a
    few times without it (a busy server's redraw put the thumb back, or the value never
    reached it), the missing key presses are sent again, or, when the thumb already shows the
    value, one press away and one back send it again."""
    thumb = page.locator('[data-testid="stSlider"]').filter(has_text=metric).locator('input[type="range"]')
    want = round(float(thumb.input_value()) + (0.01 if key == "ArrowRight" else -0.01) * times, 2)
    redraws = page_redraws(page)
    pressed_at = [None]  # the page's redraw counter when keys were last pressed
    last_press = [None]  # the redraw counter at the last press: the page must have redrawn since

    def press(keys: list[str], again_after: int = CORRECT_AFTER):
        thumb.focus()
        for k in keys:
            thumb.press(k)
        now = redraws()
        last_press[0] = now
        pressed_at[0] = None if now is None else now - CORRECT_AFTER + again_after

    def moved():
        # Done when the thumb shows the value (an Apply click sends what the thumb holds) and a
        # redraw after the last press names it (the server has it, not a stale page).
        at_want = abs(float(thumb.input_value()) - want) < 1e-9
        fresh = last_press[0] is None or (redraws() or 0) > last_press[0]
        if at_want and fresh and page.evaluate(f"document.body.innerText.includes('{metric}={want:g}')"):
            return True
        now = redraws()
        if now is not None and (pressed_at[0] is None or now - pressed_at[0] >= CORRECT_AFTER):
            missing = round((want - float(thumb.input_value())) / 0.01)
            if missing:
                press(["ArrowRight" if missing > 0 else "ArrowLeft"] * abs(missing))
            else:  # one press away now, the one back at the next redraw: the value is sent anew
                press(["ArrowLeft" if key == "ArrowRight" else "ArrowRight"], again_after=1)
        return False
    press([key] * times)
    until(moved, what=f"the slider {metric} at {want:g}", progress=redraws, advance=REDRAWS_PAST)
    return want


def chart_markers(page) -> list[list[float]]:
    return page.evaluate(f"{CHARTS}.map(c => c.spec.vlines.map(v => v.x))")


def shot(page, name, below: str | None = None, height: int = 520):
    """Full page, or the `height` pixels from the heading `below` down."""
    if not SCREENSHOTS:
        return
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(1500)  # let the page settle after its last redraw
    if below:
        box = page.get_by_text(below).first.bounding_box()
        page.screenshot(path=str(SHOTS / name), full_page=True,
                        clip={"x": 0, "y": box["y"] - 20, "width": 1400, "height": height})
    else:
        page.screenshot(path=str(SHOTS / name), full_page=True)


def sent_and_applied(root, rid, n0: int, n: int, what: str):
    """The n requests sent after the first n0, once all are applied: first the page's server
    writes them (a wait on the page's redraws), then the trainer applies each at its next step
    (a wait of STEPS_PAST trainer steps)."""
    until(lambda: len(_control(root, rid)) >= n0 + n, what=f"{what} sent", stall_s=STALL_S)

    def applied():
        rows = _control(root, rid).iloc[n0:]
        return rows if len(rows) == n and (rows["status"] == "applied").all() else None
    return until(applied, what=f"{what} applied", progress=store_step(root, rid), advance=STEPS_PAST)


def marked_on_every_chart(step: int) -> str:
    return f"{CHARTS}.every(c => c.spec.vlines.some(v => v.x === {step}))"


def test_slider_apply_is_applied_by_the_trainer_and_marked_on_every_chart(served, new_context):
    server, rid = served
    page = open_live(new_context, server.url, rid)
    shot(page, "live_monitor.png")
    want = nudge(page, "length", "ArrowRight", 5)
    shot(page, "what_if.png", below="Reward weights, threshold, difficulty")
    assert _control(server.root, rid).empty  # moving a slider sends nothing
    page.get_by_role("button", name="Apply").click()
    row = sent_and_applied(server.root, rid, 0, 1, "the Apply request").iloc[-1].to_dict()
    assert row["source"] == "ui" and row["payload"]["weights"]["length"] == pytest.approx(want)
    step = int(row["applied_step"])
    see(page, f"applied at step {step}")
    see_js(page, marked_on_every_chart(step), what=f"the change marker at step {step} on every chart")
    assert all(step in m for m in chart_markers(page))
    shot(page, "live_monitor_applied.png")


def _weights_in_force(root, rid) -> dict:
    with _store(root, rid) as s:
        row = s.scalars_wide(since_step=s.last_step() - 1).iloc[-1]
    return {m: float(row[f"reward/{m}/weight"]) for m in METRICS}


def test_two_browser_sessions_apply_at_once_both_applied_in_order(served, new_context):
    server, rid = served
    n0 = len(_control(server.root, rid))
    a, b = open_live(new_context, server.url, rid), open_live(new_context, server.url, rid)
    cur = _weights_in_force(server.root, rid)
    wa = nudge(a, "exact", "ArrowLeft", 10)
    wb = nudge(b, "citation", "ArrowRight", 10)
    a.get_by_role("button", name="Apply").click()
    b.get_by_role("button", name="Apply").click()
    rows = sent_and_applied(server.root, rid, n0, 2, "both requests")
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
    until(lambda: store_step(server.root, rid)() >= steps[-1], what="the step it applies at",
          progress=store_step(server.root, rid))
    with _store(server.root, rid) as s:
        changes = s.changes()
        logged = s.scalars_wide(since_step=steps[-1] - 1, until_step=steps[-1]).iloc[-1]
    assert [r["weights"] for r in changes["request"].tolist()[-2:]] == sent  # both marked, in order
    for m in METRICS:  # from its step on, the trainer runs with the later request's weights
        assert logged[f"reward/{m}/weight"] == pytest.approx(sent[-1][m])
    for p in (a, b):
        see(p, re.compile(r"applied at step \d+"))


def test_the_what_if_refreshes_alone_and_a_setting_applied_elsewhere_moves_the_sliders(served, new_context):
    """The steering panel's what-if follows the new rollouts without its controls being redrawn
    (no weight slider is sent again while the what-if refreshes); a weight applied elsewhere (a
    request another tab, the CLI or the autopilot sent) moves the slider of an open page with no
    interaction on it."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    from grpo_core.runs import requests
    server, rid = served
    page = open_live(new_context, server.url, rid)
    seen = {"what_if": 0, "weight_sliders": 0}

    def count(payload):
        if not isinstance(payload, bytes):
            return
        element = ForwardMsg.FromString(payload).delta.new_element
        if element.HasField("metric") and element.metric.label.startswith("What-if trainable ratio"):
            seen["what_if"] += 1
        if element.HasField("slider") and element.slider.label in METRICS:
            seen["weight_sliders"] += 1
    page.on("websocket", lambda ws: ws.on("framereceived", count))
    page.reload(wait_until="domcontentloaded")  # the listener sees the page's websocket from its start
    # page.wait_for_timeout: Playwright hands the frames received meanwhile to count()
    until(lambda: page.wait_for_timeout(100) or seen["what_if"] > 0, what="the steering panel drawn")
    drawn, what_ifs = seen["weight_sliders"], seen["what_if"]  # the what-if comes after the sliders
    until(lambda: page.wait_for_timeout(100) or seen["what_if"] >= what_ifs + 3, what="three what-if refreshes",
          progress=page_redraws(page), advance=REDRAWS_PAST)
    assert drawn == len(METRICS) and seen["weight_sliders"] == drawn, "the what-if's refresh redrew the sliders"

    thumb = page.locator('[data-testid="stSlider"]').filter(has_text="length").locator('input[type="range"]')
    now = _weights_in_force(server.root, rid)["length"]
    want = round(now - 0.05 if now >= 0.05 else now + 0.05, 2)
    n0 = len(_control(server.root, rid))
    requests.send(server.root / rid, "set_weights", {"weights": {"length": want}}, source="cli")
    sent_and_applied(server.root, rid, n0, 1, "the weight sent elsewhere")
    until(lambda: abs(float(thumb.input_value()) - want) < 1e-9, what=f"the length slider at {want}",
          progress=page_redraws(page), advance=REDRAWS_PAST)


def test_charts_keep_updating_while_the_run_trains(served, new_context):
    """The charts follow the run without a reload, each in the element it was first drawn in, from
    the first paint through the whole page and its refreshes (its uPlot chart takes the new data)."""
    server, rid = served
    page = open_live(new_context, server.url, rid)
    last_x = f"{CHARTS}[0].data[0].at(-1)"  # the ratio chart's last step drawn
    first = page.evaluate(last_x)
    assert first >= 3
    # no reload: the fragment redraws the charts; the trainer keeps taking steps meanwhile
    until(lambda: page.evaluate(f"{last_x} > {first}"), what="a chart drawn past its first last step",
          progress=store_step(server.root, rid))
    step_text = page.get_by_text(STEP_TEXT).first.inner_text()
    assert int(STEP_TEXT.search(step_text).group(1)) >= first
    assert page.evaluate("window.chartMounts") == page.evaluate(f"{CHARTS}.length")



def test_a_new_page_asks_for_its_rest_once_its_first_chart_is_drawn(served, new_context):
    """A new page's first paint is the run line and the charts; the rest (the run picker, the cards,
    the steering panel) is asked for once a chart is drawn, so neither its elements nor their scripts
    compete with the first chart for the browser. With every draw held 4 s, the rest still comes
    after the first chart (it came while the charts were drawing before); a page whose charts never
    draw gets the rest all the same, after refresh.js' wait for them (READY_MS)."""
    server, rid = served
    pages = {}
    for name, hold_ms in (("late", "4000"), ("never", "null")):
        pages[name] = new_context().new_page()
        pages[name].add_init_script(HOLD_JS.replace("HOLD_MS", hold_ms))
        pages[name].goto(f"{server.url}/?run={rid}", wait_until="domcontentloaded")
    seen = until(lambda: pages["late"].evaluate("'rest' in window.seen && window.seen"), what="the late page's rest")
    assert "chart" in seen and seen["chart"] < seen["rest"], seen
    until(lambda: pages["never"].evaluate("'rest' in window.seen"), what="the rest of a page that draws no chart")
    assert pages["never"].evaluate("document.querySelector('.live-chart canvas')") is None
    assert pages["never"].locator(".live-chart").count() == 0 and pages["never"].get_by_text(STEP_TEXT).first.is_visible()


def test_the_page_refreshes_its_panels_alone_past_the_heartbeats_stale_age(served, new_context):
    """A new page runs whole twice: its first paint (the run line and the charts), then the whole
    page. Then, while the run trains, each refresh reruns the monitor's or the steering panel's
    fragment alone, also once the page's first read of the run is older than
    run_meta.STALE_AFTER_S (a LiveState's status follows its heartbeat's age: the page keeps a
    bool, not the state)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    server, rid = served
    runs = {"page": 0, "fragment": 0}

    def count(payload):
        if isinstance(payload, bytes):
            msg = ForwardMsg.FromString(payload)
            if msg.HasField("script_finished"):
                if msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                    runs["page"] += 1
                elif msg.script_finished == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY:
                    runs["fragment"] += 1
    page = new_context().new_page()
    page.on("websocket", lambda ws: ws.on("framereceived", count))
    page.goto(f"{server.url}/?run={rid}", wait_until="domcontentloaded")
    until(lambda: page.evaluate(f"{CHARTS}.length >= 6") and runs["page"] >= 1, what="the live page's first paint")
    see(page, "What-if trainable ratio")  # the whole page, which the first paint asked for
    pages, t0 = runs["page"], time.time()
    assert pages == 2  # the first paint (the run line and the charts), then the whole page

    def past_stale_age():
        page.wait_for_timeout(100)  # Playwright hands the frames received meanwhile to count()
        return time.time() - t0 > 2 * STALE_AFTER_S and runs["fragment"] >= 6
    until(past_stale_age, what="refreshes past the heartbeat's stale age", progress=lambda: runs["fragment"])
    assert runs["page"] == pages, f"{runs['page'] - pages} whole-page reruns in {runs['fragment']} refreshes"


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
def test_the_dashboard_watches_no_source_files(served, new_context):
    # Streamlit's default watcher adds an inotify watch per folder of the checkout, .venv
    # included, and on every queue overflow (which the imports of a trainer started from that
    # .venv cause) walks the whole tree again, a steady CPU cost beside the trainer.
    # `serve` (and .streamlit/config.toml) turn it off.
    server, rid = served
    open_live(new_context, server.url, rid)  # Streamlit starts its watchers with a session
    assert _inotify_watches(server.proc.pid) == 0


def test_closing_the_browser_and_restarting_streamlit_leave_the_trainer_alone(served, new_context):
    server, rid = served
    context = new_context()
    page = context.new_page()
    page.goto(f"{server.url}/runs?run={rid}", wait_until="domcontentloaded")
    until(lambda: page.get_by_text(rid).first.is_visible(), what="the run on the Runs page")
    shot(page, "runs_page.png")
    context.close()  # the browser goes away
    with _store(server.root, rid) as s:
        pid = s.get_meta()["pid"]
    server.stop()  # the dashboard goes away
    step = store_step(server.root, rid)()
    assert pid_alive(pid)
    until(lambda: store_step(server.root, rid)() > step + 1, what="steps without a dashboard",
          progress=store_step(server.root, rid))
    assert list_runs(server.root).set_index("run_id").loc[rid, "status"] == "running"

    out = server.start()  # a fresh dashboard finds the live demo instead of starting another
    until(lambda: "already live" in Path(server.log.name).read_text(), what="serve's demo line")
    assert len(list_runs(server.root)) == 1 and pid_alive(pid), out
    page = open_live(new_context, server.url, rid)
    assert rid in page.inner_text("body")


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


def test_no_request_leaves_the_machine_on_any_page(served, new_context):
    # Air-gapped clusters: a font, icon or script from a CDN fails there. Every request of every
    # page, and every resource its DOM names (the favicon), goes to 127.0.0.1 or is inline.
    server, rid = served
    page = new_context().new_page()
    seen = []
    page.on("request", lambda r: seen.append(r.url))
    outside = []
    for path, title in PAGES.items():
        page.goto(f"{server.url}{path}?run={rid}", wait_until="domcontentloaded")
        heading = page.get_by_role("heading", name=re.compile(title)).first
        until(lambda: heading.is_visible(), what=f"the {title} page")
        # charts, icons and fonts load after the heading: wait until the page fetches nothing more
        page.wait_for_load_state("networkidle", timeout=STALL_S * 1000)
        outside += [u for u in page.evaluate(LOADED) if _external(u)]
    assert len(seen) > 10  # the pages did load (scripts, fonts, the websocket)
    outside += [u for u in seen if _external(u)]
    assert outside == []
