"""The live charts element (grpo_core.dashboard.live_chart) in a real browser: a Streamlit app of
its own whose fragment redraws two charts.py figures in one element at each refresh, one with one
more step each time, one that never changes. The chart draws the figure's lines, threshold and
change marker; each refresh reaches the same chart (new data, no rebuild), so a reader's
drag-zoom survives refreshes and a double-click gives the chart back to the data. A refresh sends
the rows a chart lacks and nothing to a chart that holds its version; a chart that does not hold
what it was sent for asks for itself, and only itself, whole. Waits follow the app's refresh
counter, not a wall clock."""
import re
import textwrap
from contextlib import contextmanager

import numpy as np
import pytest

from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, streamlit_app, wait_for

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api")

STALL_S = 120  # no refresh at all for this long: a hung server
APP = textwrap.dedent('''
    import numpy as np
    import pandas as pd
    import streamlit as st

    from grpo_core.analysis import charts
    from grpo_core.dashboard import live_chart, refresh
    from grpo_core.runs import names

    CHANGES = pd.DataFrame({"step": [12], "kind": ["set_weights"], "request": [{"weights": {"exact": 0.7}}],
                            "source": ["ui"], "message": [""]})


    @st.fragment
    def draw():
        n = st.session_state["n"] = st.session_state.get("n", -1) + 1
        steps = np.arange(40 + n)
        ratio = 0.5 + 0.4 * np.sin(steps / 5.0)
        df = pd.DataFrame({names.TRAINABLE_RATIO: ratio, names.CUM_TRAINABLE_RATIO: np.cumsum(ratio) / (steps + 1)},
                          index=steps)
        st.markdown(f"refresh {n}")
        chart = live_chart.spec(charts.ratio_chart(df, CHANGES, 0.3, smoothing=0.0))
        if "steady" not in st.session_state:  # a chart that never changes: sent once, then nothing
            st.session_state["steady"] = live_chart.spec(charts.ratio_chart(df.iloc[:30], smoothing=0.0))
        live_chart.draw_charts([("ratio", chart), ("steady", st.session_state["steady"])], "charts",
                               st.session_state.setdefault("held", {}))  # the rows each lacks
        refresh.after(0.5, key="refresh")  # as on the live page: the next refresh once this one is drawn


    draw()
    live_chart.load()  # after the charts (the live page mounts it first): they wait for it
''')
REFRESH = re.compile(r"refresh (\d+)")
CHART = "document.querySelector('.live-chart[data-key=ratio]').chart"
STEADY = "document.querySelector('.live-chart[data-key=steady]').chart"


@contextmanager
def served(tmp_path, source: str, height: int):
    """`source` served as a Streamlit app of its own, and a new browser page (not on it yet): (URL, page).
    The server and the browser are stopped on the way out, however the caller ends."""
    app = tmp_path / "app.py"
    app.write_text(source)
    with streamlit_app(app, STALL_S) as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield url, browser.new_page(viewport={"width": 1000, "height": height})
        finally:
            browser.close()


@pytest.fixture
def page(tmp_path):
    with served(tmp_path, APP, 700) as (url, pg):
        pg.resends = []  # the page's messages to the server that ask for a whole chart
        pg.on("websocket", lambda ws: ws.on("framesent", lambda d: pg.resends.append(d)
                                             if isinstance(d, bytes) and b"resend" in d else None))
        pg.goto(url)
        pg.wait_for_selector(".live-chart canvas", state="attached", timeout=STALL_S * 1000)
        yield pg


def refresh_count(pg) -> int:
    found = REFRESH.search(pg.inner_text("body"))
    return int(found.group(1)) if found else -1


def after_refreshes(pg, n: int) -> int:
    """Wait until the app has refreshed n more times and the chart holds that refresh's data (the
    last step is 39 + the refresh count); the count reached."""
    start = refresh_count(pg)
    return wait_for(lambda: (c := refresh_count(pg)) >= start + n
                    and pg.evaluate(f"{CHART}.data[0].at(-1)") >= 39 + c and c, STALL_S, what=f"{n} refreshes")


def x_range(pg) -> list[float]:
    return pg.evaluate(f"[{CHART}.scales.x.min, {CHART}.scales.x.max]")


def test_the_chart_draws_the_figure_and_keeps_a_readers_zoom_across_refreshes(page):
    count = after_refreshes(page, 1)
    chart = page.evaluate(f"(() => {{ const c = {CHART}; return {{labels: c.series.map(s => s.label), "
                          "hlines: c.spec.hlines, vlines: c.spec.vlines, last: c.data[0].at(-1)}; })()")
    assert chart["labels"] == ["step", "per step (raw)", "per step", "cumulative"]
    assert [h["text"] for h in chart["hlines"]] == ["healthy > 0.3"]
    assert [v["x"] for v in chart["vlines"]] == [12] and "exact=0.7" in chart["vlines"][0]["hover"]
    assert chart["last"] >= 39 + count
    # The element decoded live_chart.encode's floats (the last refresh sent the new rows only, which
    # the chart joined to the rows it held): each line's values at its steps.
    assert page.evaluate(f"{CHART}.spec.keep") >= 39 and not page.resends
    steps, raw, line, cumulative = (np.array(col, float) for col in page.evaluate(f"{CHART}.data"))
    np.testing.assert_array_equal(steps, np.arange(len(steps)))
    np.testing.assert_allclose(raw, 0.5 + 0.4 * np.sin(steps / 5.0), rtol=1e-6)  # float32: 7 digits
    np.testing.assert_allclose(line, raw, rtol=1e-6)  # smoothing 0: the line is the raw series
    np.testing.assert_allclose(cumulative, np.cumsum(raw) / (steps + 1), rtol=1e-5)

    # Hovering the change marker names the change under the chart.
    over = page.locator(".live-chart[data-key=ratio] .u-over").bounding_box()
    marker_x = page.evaluate(f"{CHART}.valToPos(12, 'x')")
    page.mouse.move(over["x"] + marker_x, over["y"] + over["height"] / 2)
    wait_for(lambda: "exact=0.7" in page.inner_text(".live-chart[data-key=ratio] .change-note"), STALL_S, what="the change's note")

    # A drag zooms on x; two refreshes later (each with a new step) the zoom is still shown.
    page.mouse.move(over["x"] + over["width"] * 0.2, over["y"] + over["height"] / 2)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.5, over["y"] + over["height"] / 2, steps=6)
    page.mouse.up()
    zoomed = x_range(page)
    last = page.evaluate(f"{CHART}.data[0].at(-1)")
    assert zoomed[1] < last - 5
    count = after_refreshes(page, 2)
    assert page.evaluate(f"{CHART}.data[0].at(-1)") > last  # new data reached the same chart
    assert x_range(page) == zoomed

    # A double-click gives the chart back to the data: it follows the new steps again.
    page.mouse.dblclick(over["x"] + over["width"] * 0.5, over["y"] + over["height"] / 2)
    after_refreshes(page, 2)
    assert x_range(page)[1] == page.evaluate(f"{CHART}.data[0].at(-1)")


def test_a_chart_that_does_not_hold_what_an_update_was_made_for_asks_for_the_whole_chart(page):
    """An update made for data the chart does not hold (here: its token changed in the page, as
    when an update was lost on the way) is not drawn on top of it: the chart asks for itself whole,
    the next refresh sends it, and the chart holds every step again. The element's other chart is
    not named, and keeps its uPlot chart and what it holds."""
    after_refreshes(page, 1)
    assert not page.resends
    page.evaluate(f"{STEADY}.mark = 'kept'; {CHART}.spec.token = -1")
    steady = page.evaluate(f"{STEADY}.spec.token")
    count = after_refreshes(page, 3)
    assert page.resends, "the chart did not ask for the whole chart"
    assert all(b"ratio" in d and b"steady" not in d for d in page.resends)
    steps, raw = (np.array(col, float) for col in page.evaluate(f"{CHART}.data")[:2])
    np.testing.assert_array_equal(steps, np.arange(40 + count))  # every step, none twice
    np.testing.assert_allclose(raw, 0.5 + 0.4 * np.sin(steps / 5.0), rtol=1e-6)
    assert page.evaluate(f"[{STEADY}.mark, {STEADY}.spec.token]") == ["kept", steady]


def test_a_chart_sent_nothing_that_does_not_hold_its_version_asks_for_itself_whole(page):
    """A chart that did not change is sent nothing at a refresh, only its version's token: the
    page keeps drawing what it holds. One that does not hold that version (its token changed in the
    page) asks for itself whole, and holds its steps again; the other chart goes on with its rows."""
    after_refreshes(page, 2)
    steady = page.evaluate(f"{STEADY}.spec.token")
    page.evaluate(f"{STEADY}.mark = 'kept'")
    after_refreshes(page, 2)
    assert page.evaluate(f"[{STEADY}.mark, {STEADY}.spec.token]") == ["kept", steady] and not page.resends
    page.evaluate(f"{STEADY}.spec.token = -1")
    wait_for(lambda: page.evaluate(f"{STEADY}.spec.token") == steady, STALL_S, what="the chart sent whole")
    assert page.resends and all(b"steady" in d and b"ratio" not in d for d in page.resends)
    assert page.evaluate(f"{STEADY}.data[0]") == list(range(30)) and page.evaluate(f"{STEADY}.spec.keep") == 0
    after_refreshes(page, 1)
    assert page.evaluate(f"{CHART}.spec.keep") >= 39  # the other chart: the new rows only


MANY = textwrap.dedent('''
    import numpy as np
    import pandas as pd
    import streamlit as st

    from grpo_core.analysis import charts
    from grpo_core.dashboard import live_chart
    from grpo_core.runs import names

    live_chart.load()  # first, as on the live page
    steps = np.arange(500)
    df = pd.DataFrame({names.TRAINABLE_RATIO: 0.5 + 0.4 * np.sin(steps / 5.0), names.CUM_TRAINABLE_RATIO: 0.5},
                      index=steps)
    live_chart.draw_charts([(key, live_chart.spec(charts.ratio_chart(df))) for key in ("a", "b", "c")], "charts", {})
''')
# At the first frame after a chart's canvas appears (an animation frame callback runs before its
# paint): how many charts have one.
FRAMES_JS = """(() => { new MutationObserver((_, observer) => {
  if (!document.querySelector('.live-chart canvas')) return;
  observer.disconnect();
  requestAnimationFrame(() => { window.__atFirstFrame = document.querySelectorAll('.live-chart canvas').length; });
}).observe(document, {childList: true, subtree: true}); })()"""


def test_a_page_shows_its_first_chart_before_it_draws_the_others(tmp_path):
    """A page that mounts several charts at once (the live page's first paint) draws the first at
    once and the others only after the frame that shows it: the first chart is on the screen
    without waiting for the rest, and every chart is drawn."""
    with served(tmp_path, MANY, 1400) as (url, page):
        page.add_init_script(FRAMES_JS)
        page.goto(url)
        wait_for(lambda: page.evaluate("document.querySelectorAll('.live-chart canvas').length") == 3, STALL_S,
                 what="the three charts drawn")
        assert page.evaluate("window.__atFirstFrame") == 1
