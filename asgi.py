"""GRPO Health as an ASGI app: the Streamlit dashboard (app.py, pages/) and the live page's route.

`python -m grpo_core serve` (or `make run`) runs `streamlit run asgi.py`: Streamlit finds `app`,
serves app.py and pages/ as ever, and answers live_probe's "anything new?" route beside them, which
the live page's refreshes ask before they rerun (grpo_core.dashboard.live_probe says why).
`streamlit run app.py` serves the same pages without the route; their refreshes then always rerun.
"""
import streamlit as st

from grpo_core.dashboard import live_probe

app = st.App("app.py", routes=live_probe.routes())
