"""GRPO Health: the Streamlit entry point.

`python -m grpo_core serve` (or `make run`) starts it; `streamlit run app.py` works too.
This script only sets the page up, picks the run (sidebar, or `?run=<id>` in the URL)
and hands over to the page. It never imports torch: training happens in a separate
trainer process that writes the run store this dashboard reads.
"""
import streamlit as st

from grpo_core import live
from grpo_core.safety import require_token
from grpo_core.store import list_runs

st.set_page_config(page_title="GRPO Health", page_icon=":material/monitoring:", layout="wide")
require_token()  # with serve --token / $GRPO_HEALTH_TOKEN: nothing below shows until it matches

# url paths differ from the file names on purpose: Streamlit still knows the old pages/
# directory convention, and a URL that names a file there (e.g. /live) would run that page
# without this script (no run picker) on a fresh server's first request.
PAGES = [
    st.Page("pages/runs.py", title="Runs", icon=":material/list:", url_path="all-runs"),
    st.Page("pages/live.py", title="Live monitor", icon=":material/monitoring:", url_path="monitor", default=True),
    st.Page("pages/analysis.py", title="Analysis", icon=":material/analytics:", url_path="analyze"),
    st.Page("pages/pilot.py", title="Pilot", icon=":material/science:", url_path="pilot-check"),
]


def pick_run():
    """Sidebar run picker. st.session_state["run_id"] is what every page reads; a page that
    wants to switch runs sets st.session_state["goto_run"] and reruns."""
    ss = st.session_state
    runs = list_runs()
    ids = runs["run_id"].tolist()
    status = dict(zip(runs["run_id"], runs["status"]))
    if "goto_run" in ss:
        ss["run_id"] = ss.pop("goto_run")
    if ss.get("run_id") not in ids:
        wanted = st.query_params.get("run")
        ss["run_id"] = wanted if wanted in ids else live.default_run(runs=runs)
    with st.sidebar:
        if ids:
            st.selectbox("Run", ids, key="run_id", format_func=lambda r: f"{r} · {status.get(r, '?')}",
                         help="The run every page shows. Also in the URL: ?run=<id>")
            st.query_params["run"] = ss["run_id"]
        else:
            st.caption("No runs yet: start one on the Runs page.")


pick_run()
st.navigation(PAGES).run()
