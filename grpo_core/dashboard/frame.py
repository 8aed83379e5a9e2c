"""The frame around every page: navigation, token gate, run picker and legacy-routing guard.

A page opens with one call, `open_page()`, and is layout and widgets after it.

`main()` is the app (app.py calls it): page config, token gate, run picker, st.navigation.
Streamlit 1.67 still knows the old `pages/` folder convention: until the process's first
st.navigation call (a fresh server's first request) it routes by file name, and a URL that
names no file in pages/ gets a "Page not found" pop-up on top of the right page. So the page
URLs are the file names (/runs, /analysis, /pilot; the live monitor is the start page, /, and
a link to one run is /?run=<id>), and a page file that legacy routing runs on its own hands
over to main() (`open_page` -> `through_app`).

How a page knows, with public API and plain Python only: main() runs the page inside
`IN_APP` (a context variable: its value belongs to the thread running this session's script,
and main() resets it on the way out, however the page ends), so a page that finds it unset
was not run by main() in this script run. Then either Streamlit's legacy routing ran it with
app.py as the entry point, or the page file itself is the entry point
(AppTest.from_file("pages/x.py")); st.Page resolves a relative path against the entry
point's folder and raises when no such file is there, which tells the two apart.
"""
from __future__ import annotations

import contextvars

import streamlit as st
from streamlit.errors import StreamlitAPIException

from grpo_core.dashboard import run_list, widget_state
from grpo_core.dashboard.access import require_token
from grpo_core.runs.run_index import list_runs

# An emoji favicon is drawn in the browser (a data: URL); a ":material/...:" one is fetched from
# fonts.gstatic.com, a request that would leave the machine (the dashboard runs air-gapped).
FAVICON = "📈"

# True while main() runs the page st.navigation picked. A ContextVar, not a module global:
# the module is shared by every session's script thread, a context variable's value is not.
IN_APP = contextvars.ContextVar("grpo_health_in_app", default=False)


LIVE_TITLE = "Live monitor"  # the live page's title in the menu (main() tells its first paint by it)
SHOWN = "page_shown"  # the url path of the page the session's last whole run showed
ENTERED = "page_entered"  # this whole run shows another page than the last (entered_page)


def pages() -> list:
    """New Page objects each run (st.navigation marks the one it returns as runnable once).
    url paths are the file names, as legacy routing infers them, except the live monitor's:
    it is the start page (URL /), and a page is also asked for by a hash of its url path (a
    rerun, a reconnecting tab, AppTest); "monitor" names no file, so legacy routing answers
    that hash with app.py rather than with pages/live.py on its own."""
    return [
        st.Page("pages/runs.py", title="Runs", icon=":material/list:", url_path="runs"),
        st.Page("pages/live.py", title=LIVE_TITLE, icon=":material/monitoring:", url_path="monitor", default=True),
        st.Page("pages/analysis.py", title="Analysis", icon=":material/analytics:", url_path="analysis"),
        st.Page("pages/pilot.py", title="Pilot", icon=":material/science:", url_path="pilot"),
    ]


def pick_run(show: bool = True):
    """Sidebar run picker (`show` False: the run is picked, the box drawn at a later run).
    st.session_state["run_id"] is what every page reads; a page that wants to switch runs sets
    st.session_state["goto_run"] and reruns."""
    ss = st.session_state
    runs = list_runs()
    ids = runs["run_id"].tolist()
    status = dict(zip(runs["run_id"], runs["status"]))
    if "goto_run" in ss:
        ss["run_id"] = ss.pop("goto_run")
    if ss.get("run_id") not in ids:
        wanted = st.query_params.get("run")
        ss["run_id"] = wanted if wanted in ids else run_list.default_run(runs=runs)
    with st.sidebar:
        if ids and show:
            st.selectbox("Run", ids, key="run_id", format_func=lambda r: f"{r} · {status.get(r, '?')}",
                         help="The run every page shows. Also in the URL: ?run=<id>")
        if ids:
            st.query_params["run"] = ss["run_id"]
        else:
            st.caption("No runs yet: start one on the Runs page.")


def main():
    """The app: page config, the token gate (nothing below shows until it matches), the run
    picker, then the page st.navigation picks, run inside IN_APP. The live page's first paint
    (pages/live.py: the run line and the charts, the rest at the rerun its browser asks for once
    it painted them) leaves the run picker's box to that rerun too: a select box is a large part of
    a new page's work before its first chart (docs/benchmarks.md "Live page: viewers")."""
    st.set_page_config(page_title="GRPO Health", page_icon=FAVICON, layout="wide")
    require_token()
    page = st.navigation(pages())  # its menu tops the sidebar, above the run picker
    st.session_state[ENTERED] = st.session_state.get(SHOWN) != page.url_path
    st.session_state[SHOWN] = page.url_path
    pick_run(show=page.title != LIVE_TITLE or bool(st.session_state.get(widget_state.PAINTED)))
    token = IN_APP.set(True)
    try:
        page.run()
    finally:  # st.stop / st.rerun / st.switch_page / an error in the page: unset all the same
        IN_APP.reset(token)


def entered_page() -> bool:
    """Whether this run shows its page anew: the session's last whole run showed another page, or
    none. The browser then mounts the page's elements anew, holding nothing sent to them on an
    earlier visit (the live page's charts). A page file run as its own app is always new."""
    return st.session_state.get(ENTERED, True)


def app_is_the_entry_point() -> bool:
    """Whether this session's entry point is app.py (`streamlit run app.py`, AppTest of
    app.py) rather than a page file run as its own app (AppTest of pages/x.py): a relative
    st.Page path resolves against the entry point's folder, StreamlitAPIException when no
    such file is there. Builds Page objects only; st.navigation never sees them."""
    try:
        st.Page("app.py")
        st.Page("pages/live.py")
    except StreamlitAPIException:
        return False
    return True


def through_app() -> bool:
    """A page file that Streamlit's legacy pages/ routing ran on its own (a fresh server's
    first request, before any st.navigation call) runs the app instead, which runs this page
    through st.navigation in the same script run. True when it did: what the page would draw
    has been drawn. False when main() is running this page, or when the page file is the
    entry point itself."""
    if IN_APP.get() or not app_is_the_entry_point():
        return False
    main()  # its st.navigation ends legacy routing, for this and every later session
    return True


def open_page() -> str | None:
    """The first line of every page: hand over to the app when legacy routing ran the page on
    its own (then stop: the app has drawn it), ask for the token (a page file opened directly
    meets the gate too), and return the run the page shows: the run picker's, else ?run=<id>,
    else the default run (None: no run yet)."""
    if through_app():
        st.stop()
    require_token()
    return run_list.resolve_run(st.session_state.get("run_id"), st.query_params.get("run"))
