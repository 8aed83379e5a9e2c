"""GRPO Health as an ASGI app: the Streamlit dashboard (app.py, pages/) and the live page's routes.

`python -m grpo_core serve` (or `make run`) runs `streamlit run asgi.py`: Streamlit finds `app`,
serves app.py and pages/ as ever, and answers beside them live_probe's "anything new?" route, which
the live page's refreshes ask before they rerun, and first_paint's: the live page's HTML with its
run's first chart drawn before Streamlit's app loads (grpo_core.dashboard.live_probe and
first_paint say why). `streamlit run app.py` serves the same pages without either: their refreshes
then always rerun, and a new page shows its run once Streamlit has drawn it.
"""
import streamlit as st

from grpo_core.dashboard import first_paint, live_probe

app = st.App("app.py", routes=live_probe.routes() + first_paint.routes())
