"""A live page's refresh, paced by the page: the next one is asked once the last one was drawn.

Streamlit's `st.fragment(run_every=...)` asks for a rerun on a fixed browser timer, drawn or not:
a page whose browser is short of CPU (many tabs, beside a trainer) queues answers faster than it
draws them and shows the run ever later (docs/benchmarks.md "Live page: viewers"). `after` mounts
a components-v2 element (assets/refresh.js) as the fragment's last element; in the page it waits
`seconds` after the frame that painted the fragment, then reruns that fragment alone. The pace is
then the run's (live_cache.refresh_interval, given anew at each refresh) or the page's, whichever
is slower, and a page that cannot keep up costs its browser less instead of more.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
COMPONENT = "grpo_health_refresh"


@cache
def _component():
    import streamlit as st
    return st.components.v2.component(COMPONENT, js=(ASSETS / "refresh.js").read_text())


def after(seconds: float | None, key: str) -> None:
    """Rerun the current fragment `seconds` after the page drew this run of it (None: no more
    refreshes, e.g. the run has ended). Call it last in the fragment; `key` is one per fragment.
    Outside any fragment it reruns the whole page (the live page's first paint asks so for the rest)."""
    if seconds is None:
        return
    import streamlit as st
    count = st.session_state.get(f"{key}_count", 0) + 1  # new data at each refresh: the page's script runs
    st.session_state[f"{key}_count"] = count
    _component()(data={"every": float(seconds), "n": count}, key=key, on_due_change=lambda: None)
