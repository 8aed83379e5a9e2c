"""The live page's refresh (grpo_core.dashboard.refresh) in a real browser: a fragment of a
Streamlit app of its own reruns alone, again and again, and the page asks for each rerun only
once it has drawn the last one: a server (or a browser) slower than the period gets one request
per refresh, where Streamlit's run_every timer would queue one per period; a steady part is not
faded while it reruns. Waits follow the app's run counter, not a wall clock."""
import re
import textwrap
import time

import pytest

from grpo_core.runs.run_meta import FINISHED
from tests.helpers_dashboard import (CHROMIUM, CHROMIUM_ARGS, REPO, streamlit_app, synth_run, trainer_beating,
                                    wait_for)

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")

STALL_S = 120  # no rerun at all for this long: a hung server
PERIOD_S, RUN_S = 0.1, 0.6  # each fragment run takes 6 periods: a timer would ask 6 times per run
# A fragment that reruns itself every PERIOD_S, each run RUN_S long, counting its runs under `name`.
PANEL = textwrap.dedent(f'''
    import time

    import streamlit as st

    from grpo_core.dashboard import refresh


    @st.fragment
    def panel(name):
        n = st.session_state[name] = st.session_state.get(name, 0) + 1
        time.sleep({RUN_S})
        st.markdown(f"{{name}} runs {{n}}")
        refresh.after({PERIOD_S}, key=f"{{name}}_refresh")
''')
APP = PANEL + textwrap.dedent('''

    st.session_state["page"] = st.session_state.get("page", 0) + 1
    st.markdown(f"page runs {st.session_state['page']}")
    panel("fragment")
''')


def counter(page, label: str) -> int:
    m = re.search(label + r" (\d+)", page.inner_text("body"))
    return int(m.group(1)) if m else 0


@pytest.fixture
def served(tmp_path):
    app = tmp_path / "app.py"
    app.write_text(APP)
    with streamlit_app(app, STALL_S) as url:
        yield url


def test_the_fragment_reruns_alone_one_request_per_drawn_refresh(served):
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            sent = []
            page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sent.append(frame)))
            page.goto(served)
            wait_for(lambda: counter(page, "fragment runs") >= 2, STALL_S, what="the first refresh")
            before, first = len(sent), counter(page, "fragment runs")
            wait_for(lambda: counter(page, "fragment runs") >= first + 6, STALL_S, what="six more refreshes")
            runs, asked = counter(page, "fragment runs") - first, len(sent) - before
            assert counter(page, "page runs") == 1  # only the fragment reran
            # one request per refresh drawn (a timer would have sent ~RUN_S / PERIOD_S per refresh);
            # +2: the request in flight now, and a heartbeat the page may have sent meanwhile
            assert asked <= runs + 2, f"{asked} requests for {runs} refreshes"
        finally:
            browser.close()


# The tab's visibility, driven by the test: headless Chromium has no background tabs (its pages
# are always "visible"), so the page's document reports what the test sets, and hears the change.
VISIBILITY_JS = """window.__hidden = false;
Object.defineProperty(document, 'visibilityState', {get: () => (window.__hidden ? 'hidden' : 'visible')});
Object.defineProperty(document, 'hidden', {get: () => window.__hidden});
window.__setHidden = h => { window.__hidden = h; document.dispatchEvent(new Event('visibilitychange')); };"""


def test_a_hidden_page_asks_no_refresh_until_it_is_seen_again(served):
    """A background tab left open costs nothing: no request while hidden (the one in flight when
    it was hidden may finish), a refresh at once when it is seen again."""
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(VISIBILITY_JS)
            page.goto(served)
            wait_for(lambda: counter(page, "fragment runs") >= 2, STALL_S, what="the first refresh")
            start, first = time.monotonic(), counter(page, "fragment runs")
            wait_for(lambda: counter(page, "fragment runs") >= first + 3, STALL_S, what="three more refreshes")
            pace = (time.monotonic() - start) / 3  # this box's time per refresh, now
            page.evaluate("window.__setHidden(true)")
            hidden_at = counter(page, "fragment runs")
            page.wait_for_timeout(int(5 * pace * 1000))  # five refreshes' time: nothing may come
            assert counter(page, "fragment runs") <= hidden_at + 1, "a hidden page kept refreshing"
            shown_at = counter(page, "fragment runs")
            page.evaluate("window.__setHidden(false)")
            wait_for(lambda: counter(page, "fragment runs") >= shown_at + 2, STALL_S, what="refreshes once seen")
            assert counter(page, "page runs") == 1  # still the fragment alone
        finally:
            browser.close()


def test_the_runs_page_polls_while_a_run_is_live_and_stops_when_it_ends(tmp_path, monkeypatch):
    """The Runs page's rows refresh every 3 s while a run is live (or stale: it may come back),
    and stop once none is: each refresh decides from the rows it just read (it decided from the
    page's first read, and polled a finished run forever). Counted: the fragment runs the server
    finished, read from the page's websocket."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    store = synth_run(tmp_path, "r", 5)
    store.heartbeat()  # running: live (then stale, which also polls, past run_meta.STALE_AFTER_S)
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    runs = []

    def count(payload):
        if isinstance(payload, bytes):
            msg = ForwardMsg.FromString(payload)
            if msg.HasField("script_finished") and msg.script_finished == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY:
                runs.append(msg)
    with streamlit_app(REPO / "app.py", STALL_S) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("websocket", lambda ws: ws.on("framereceived", count))
            page.goto(f"{url}/runs")

            def refreshed(n: int) -> bool:
                page.wait_for_timeout(100)  # Playwright hands the frames received meanwhile to count()
                return len(runs) >= n
            wait_for(lambda: refreshed(1), STALL_S, what="a refresh of the run list")
            store.set_status(FINISHED)
            wait_for(lambda: "finished" in page.inner_text("main"), STALL_S, what="the run shown finished")
            done = len(runs)
            # No refresh was asked after the run that showed it finished; the old page asked every 3 s.
            page.wait_for_timeout(2 * 3000 + 1000)
            assert len(runs) <= done + 1, f"{len(runs) - done} refreshes after the run ended"  # +1: one in flight
        finally:
            browser.close()
            store.close()


def test_the_live_page_reruns_only_when_its_run_changed(tmp_path, monkeypatch):
    """Served as `grpo-health serve` serves it (asgi.py: the pages and live_probe's route), the
    live page of a running run with no new step asks the route at each refresh and reruns
    nothing (a rerun redraws the whole page); the run's next step is drawn at the next refresh.
    Counted: the script runs the server finished and the route's answers, from the page's traffic."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    store = synth_run(tmp_path, "r", 20, P=2, G=2, steps_total=1000)
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    runs, probes = [], []

    def count(payload):
        if isinstance(payload, bytes) and ForwardMsg.FromString(payload).HasField("script_finished"):
            runs.append(payload)

    def answered(response):
        if "/grpo-health/live/r" in response.url:
            probes.append(response.status if "viewer=" in response.url else "no viewer id")  # the run's viewers: who asks

    def probed(n: int) -> bool:
        page.wait_for_timeout(100)  # Playwright hands the events received meanwhile to the handlers
        return len(probes) >= n
    try:
        with trainer_beating(store), streamlit_app(REPO / "asgi.py", STALL_S) as url, sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.on("websocket", lambda ws: ws.on("framereceived", count))
                page.on("response", answered)
                page.goto(f"{url}/live?run=r")
                wait_for(lambda: "step 20 of 1000" in page.inner_text("main") and probed(3), STALL_S,
                         what="the live page drawn, and its refreshes asking the route")
                before, asked = len(runs), len(probes)
                wait_for(lambda: probed(asked + 6), STALL_S, what="six more refreshes")
                assert set(probes) == {200}, probes
                assert len(runs) == before, f"{len(runs) - before} reruns of a page whose run had nothing new"
                synth_run(None, "r", 1, store=store, start=21, P=2, G=2)  # the trainer's next step
                asked = len(probes)
                drawn = lambda: "step 21 of 1000" in page.inner_text("main")  # noqa: E731
                wait_for(lambda: drawn() or probed(asked + 4), STALL_S, what="the new step drawn")
                assert drawn(), "the new step was not drawn within 4 refreshes"
            finally:
                browser.close()
    finally:
        store.close()


HANGING_ROUTE = textwrap.dedent('''
    import asyncio

    import streamlit as st
    from starlette.responses import JSONResponse
    from starlette.routing import Route


    async def hang(request):  # a hung server, as the page sees it: no answer within its 10 s
        await asyncio.sleep(20)  # (not forever: the server's shutdown waits for its open requests)
        return JSONResponse({})


    app = st.App("app.py", routes=[Route("/hang", hang)])
''')


def test_a_probe_that_hangs_does_not_stop_the_refreshes(tmp_path):
    """A refresh asks its probe first; a probe that does not answer (a hung server) is given up
    after RETRY periods (10 s at least), and the fragment reruns: the page goes on following
    the run instead of waiting forever on one request (it did: no rerun after the first hang)."""
    (tmp_path / "app.py").write_text(APP.replace(f"refresh.after({PERIOD_S}, key=f\"{{name}}_refresh\")",
                                                 f"refresh.after({PERIOD_S}, key=f\"{{name}}_refresh\", probe=\"/hang\", drawn=\"k\")"))
    (tmp_path / "asgi.py").write_text(HANGING_ROUTE)
    assert 'probe="/hang"' in (tmp_path / "app.py").read_text()
    with streamlit_app(tmp_path / "asgi.py", STALL_S) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            given_up, answered = [], []
            page.on("requestfailed", lambda r: given_up.append(r.url) if r.url.endswith("/hang") else None)
            page.on("requestfinished", lambda r: answered.append(r.url) if r.url.endswith("/hang") else None)
            page.goto(url)
            wait_for(lambda: counter(page, "fragment runs") >= 3, STALL_S, what="two refreshes past hung probes")
            # each refresh gave its probe up (the server answers after 20 s): none waited for the answer
            assert len(given_up) >= 2 and not answered and counter(page, "page runs") == 1
        finally:
            browser.close()


# Two fragments that refresh themselves, each run long enough for Streamlit's fade to start (it
# waits half a second): one in a steady part, one not.
STEADY_APP = PANEL + textwrap.dedent('''

    with refresh.steady("panel"):
        panel("steady")
    panel("plain")
''')
# Each time Streamlit marks an element stale (its fragment reruns), the style it gets: its opacity
# and the transition that would fade it.
STALE_JS = """window.__stale = [];
new MutationObserver(changes => { for (const change of changes) {
  const element = change.target;
  if (element.getAttribute('data-stale') !== 'true') continue;
  const style = getComputedStyle(element);
  window.__stale.push({text: element.innerText.trim(), opacity: style.opacity, fade: style.transitionDuration});
} }).observe(document, {attributes: true, attributeFilter: ['data-stale'], subtree: true});"""


def test_a_steady_part_keeps_its_look_while_it_reruns(tmp_path):
    """refresh.steady: the elements of a part that refreshes itself are not faded while it reruns
    (Streamlit's fade: opacity a third, after 0.5 s, over 1 s), where the same fragment outside
    one is (the contrast: the fade is there to remove)."""
    (tmp_path / "app.py").write_text(STEADY_APP)
    with streamlit_app(tmp_path / "app.py", STALL_S) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(STALE_JS)
            page.goto(url)
            wait_for(lambda: counter(page, "steady runs") >= 3 and counter(page, "plain runs") >= 3, STALL_S,
                     what="both parts refreshed twice")
            stale = page.evaluate("window.__stale")
            steady = [s for s in stale if s["text"].startswith("steady runs")]
            plain = [s for s in stale if s["text"].startswith("plain runs")]
            assert steady and plain, stale
            assert all(s["opacity"] == "1" and s["fade"] == "0s" for s in steady), steady
            assert any(s["fade"] != "0s" for s in plain), plain  # Streamlit's fade, left outside a steady part
        finally:
            browser.close()
