"""The live page's first paint (grpo_core.dashboard.first_paint) in a real browser, served as
`grpo-health serve` serves it (asgi.py): the run's first chart is drawn from the HTML before
Streamlit's app has drawn anything, lets clicks through, defines nothing the page's own charts
use, and goes once the page has drawn its charts; the other pages' HTML is Streamlit's. Waits follow
what the page draws, not a wall clock."""
import pytest

from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_app, synth_run, wait_for

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")

STALL_S = 120  # nothing drawn for this long: a hung server
# What the page showed, and when (performance.now()), seen by a MutationObserver from the start.
MARKS = """window.marks = {};
new MutationObserver(() => {
  const m = window.marks, box = document.getElementById('grpo-first-paint');
  if (!('preview' in m) && box && box.querySelector('canvas')) {
    m.preview = performance.now();
    m.title = (box.querySelector('.u-title') || {}).textContent;
    m.clicks = getComputedStyle(box).pointerEvents;
    m.global = typeof window.grpoHealthLiveChart;
    m.streamlit = document.getElementById('root').childElementCount;
  }
  if (!('page' in m) && document.querySelector('#root .live-chart canvas')) m.page = performance.now();
  if (!('gone' in m) && 'preview' in m && !box) m.gone = performance.now();
}).observe(document, {childList: true, subtree: true});"""


def test_the_first_chart_comes_with_the_html_and_goes_when_the_page_draws_its_own(tmp_path, monkeypatch):
    # finished: no "no heartbeat" warning above the charts on a slow box (an alert takes the preview away too)
    synth_run(tmp_path, "r", 40, P=2, G=2, steps_total=1000, status="finished").close()
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    with streamlit_app(REPO / "asgi.py", STALL_S) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(MARKS)
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/?run=r", wait_until="commit")
            marks = wait_for(lambda: "gone" in (m := page.evaluate("window.marks")) and m, STALL_S,
                             what="the preview drawn, then the page's own charts")
            assert marks["title"] == "Trainable ratio" and marks["clicks"] == "none"
            assert marks["global"] == "undefined"  # the page's charts element finds only the library's drawing
            assert marks["streamlit"] == 0  # drawn before Streamlit's app had mounted anything
            assert marks["preview"] < marks["page"] <= marks["gone"], marks
            assert page.locator("#root .live-chart canvas").count() >= 1 and "step 40 of 1000" in page.inner_text("main")
            assert not errors, errors

            assert 'id="grpo-first-paint"' in page.request.get(f"{url}/?run=r").text()
            assert "grpo-first-paint" not in page.request.get(f"{url}/runs?run=r").text()  # Streamlit's own HTML
        finally:
            browser.close()
