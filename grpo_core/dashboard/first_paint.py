"""The live page's first paint in its HTML: the run's first chart before Streamlit's app has loaded.

A new live page shows nothing of its run until Streamlit's app has loaded (2.6 MB of script in 109
files), opened its websocket, run the page's script and rendered what it sent: about a second on a
free CPU, two to three and a half on a box that trains and serves other pages, where a Streamlit
page of one chart takes as long (docs/benchmarks.md "Live page: viewers"). So the live page's URL
(/, the start page) is answered here rather than by Streamlit's static files: the same index.html
with a preview in it, the run's line (its id, status and step) and its first chart, drawn by the
page's own chart code (live_chart.js and uPlot, inline) from that chart's bytes in the HTML
(live_chart.encode of live_cache.chart_specs, which the page's first script run then takes from the
same memo). The preview covers the page, letting clicks through, until the page draws its own
charts (assets/first_paint.js removes it then, or when the page shows an error or alert, or another
page; CSS hides it after EXPIRE_S whatever happens).

No preview where it would show more than the page or could mislead: a dashboard with an access
token (its pages show only the token box until it is typed), no run, a run with no chart yet, a
run that cannot be read. The HTML is then Streamlit's own; a preview that fails is logged and
the page served without it.
"""
from __future__ import annotations

import base64
import html
import logging
from functools import cache
from importlib import resources

from grpo_core.analysis import charts
from grpo_core.dashboard import access, live_cache, live_cards, live_chart, run_list
from grpo_core.dashboard.live_chart import ASSETS
from grpo_core.runs.locations import runs_dir

logger = logging.getLogger(__name__)

PATH = "/"  # the live page's URL: the start page (frame.pages)
EXPIRE_S = 30  # the preview hides after this long whatever the page did (CSS: no script needed)
ROOT = '<div id="root"></div>'  # where Streamlit's app mounts, in its index.html; the preview follows it
BOX = "grpo-first-paint"  # the preview's element id (assets/first_paint.js removes it)

STYLE = """<style>
#grpo-first-paint { position: fixed; inset: 0; z-index: 1000000; overflow: hidden; pointer-events: none;
  background: #fff; color: #31333f; font-family: "Source Sans", "Source Sans Pro", sans-serif; padding: 4.5rem 5rem 0;
  animation: grpo-first-paint-expire 0s linear %(expire)ss forwards; }
@keyframes grpo-first-paint-expire { to { visibility: hidden; } }
@media (min-width: 768px) { #grpo-first-paint { padding-left: calc(300px + 5rem); }
  #grpo-first-paint::before { content: ""; position: absolute; left: 0; top: 0; bottom: 0; width: 300px;
    background: #f0f2f6; } }
#grpo-first-paint h2 { font-size: 2.25rem; font-weight: 600; margin: 0 0 1rem; }
#grpo-first-paint p { margin: 0 0 1rem; }
%(uplot_css)s
%(grid_css)s</style>"""


@cache
def index_html() -> str | None:
    """Streamlit's own index.html, as its static files serve it (the file its package ships: no
    Streamlit API names it); None where this Streamlit has none there, or one without the places
    the preview goes (ROOT, </head>), and then `routes` mounts nothing: Streamlit answers PATH itself."""
    path = resources.files("streamlit") / "static" / "index.html"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    return text if ROOT in text and "</head>" in text else None


@cache
def script() -> str:
    """uPlot, live_chart.js and first_paint.js in one function scope, whose `globalThis` is its own:
    the page's charts register live_chart.js' entry point themselves. Inline in the HTML: a script
    of its own, even cached, came a tenth of a second later (fetched behind Streamlit's 60 module
    preloads)."""
    parts = [(ASSETS / name).read_text(encoding="utf-8") for name in ("uPlot.iife.min.js", "live_chart.js", "first_paint.js")]
    body = "(function (globalThis) {\n" + "\n".join(parts) + "\n})({});\n"
    if "</script" in body.lower():  # would end the HTML's script element early
        raise ValueError("first_paint.script: '</script' in the preview's script")
    return body


@cache
def style() -> str:
    """The preview's CSS: its box, uPlot's and the page's chart grid's."""
    return STYLE % {"expire": EXPIRE_S, "uplot_css": (ASSETS / "uPlot.min.css").read_text(encoding="utf-8"),
                    "grid_css": live_chart.GRID_CSS}


def preview(run_id: str) -> str | None:
    """The preview's HTML for the run `run_id` (under the runs dir), None when it has no chart yet."""
    run_dir = runs_dir() / run_id
    state = live_cache.current(run_dir)
    drawn = [chart for _, chart in live_cache.chart_specs(run_dir, state, charts.DEFAULT_SMOOTHING) if chart is not None]
    if not drawn:
        return None
    done, _, _ = live_cards.progress(state)
    total = state.steps_total
    # not the page's own "step N of M": tests and benches find the page's progress by that text
    step = "" if done is None else f" · {done}" + (f" / {total}" if total else "") + " steps"
    data = base64.b64encode(live_chart.encode(drawn[0])).decode()
    return (f'<div id="{BOX}" data-run="{html.escape(run_id)}" data-expire-s="{EXPIRE_S}"><h2>Live monitor</h2>'
            f"<p><b>{html.escape(run_id)}</b> · {html.escape(state.status)}{step}</p>"
            '<div class="live-charts"><div class="first-paint-chart"><div class="plot"></div>'
            '<div class="change-note"></div></div></div>'
            f'<script type="application/octet-stream" id="{BOX}-data">{data}</script>'
            f"<script>{script()}</script></div>")


def page(from_url: str | None) -> str:
    """The live page's HTML: Streamlit's index.html, with the preview of the run the page will show
    (?run=<id> if it exists, else the default run: frame.pick_run's choice for a new session)."""
    base = index_html()
    if access.expected_token():
        return base
    run_id = None
    try:
        run_id = run_list.resolve_run(None, from_url)
        box = preview(run_id) if run_id else None
    except Exception:  # the preview is optional: the page itself reads the run and says what is wrong
        logger.exception("first paint: no preview of run %s", run_id or from_url)
        return base
    if box is None:
        return base
    return base.replace("</head>", style() + "</head>", 1).replace(ROOT, ROOT + box, 1)


def endpoint(request):
    """The live page's HTML (a plain function: Starlette runs it in its thread pool, off the event
    loop, like the store read it may trigger). Never cached: it holds the run's last step."""
    from starlette.responses import HTMLResponse
    return HTMLResponse(page(request.query_params.get("run")), headers={"Cache-Control": "no-store"})


def routes() -> list:
    """The route asgi.py mounts beside Streamlit's (st.App(routes=...)): its routes come first, so
    PATH is answered here rather than by Streamlit's static files."""
    from starlette.routing import Route
    if index_html() is None:
        logger.warning("first paint: no index.html with a root element in Streamlit's package: no preview")
        return []
    return [Route(PATH, endpoint, methods=["GET"])]
