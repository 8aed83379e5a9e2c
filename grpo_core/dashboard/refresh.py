"""A live page's refresh, paced by the page: the next one is asked once the last one was drawn.

Streamlit's `st.fragment(run_every=...)` asks for a rerun on a fixed browser timer, drawn or not:
a page whose browser is short of CPU (many tabs, beside a trainer) queues answers faster than it
draws them and shows the run ever later (docs/benchmarks.md "Live page: viewers"). `after` mounts
a components-v2 element (assets/refresh.js) as the fragment's last element; in the page it waits
`seconds` after the frame that painted the fragment, then reruns that fragment alone. The pace is
then the run's (live_cache.refresh_interval, given anew at each refresh) or the page's, whichever
is slower, and a page that cannot keep up costs its browser less instead of more. A page nobody
can see (a background tab, a minimised window) asks for nothing until it is seen again. Given a
probe (live_probe's route), a refresh asks it first and reruns only when the run changed.

`steady(key)` holds a refreshing part's elements: they keep their look while it reruns. Streamlit
fades a rerunning fragment's elements (to a third, from half a second on): the fade, started and
called off on every element at each refresh, costs an open page's browser, and a refresh that took
longer (a slow server, a large view) would dim the part each time (docs/benchmarks.md "Live page:
a newcomer's server"). The refresh element brings the rule (STEADY_CSS): it is in every such part.

`guarded(what)` wraps a refreshing panel's body: an error nobody foresaw (a bug) shows one line
instead of Streamlit's traceback, which ended the page's refreshes (nothing after it ran, so no
next refresh was asked for); the traceback goes to the server's log, and the refreshes go on.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from functools import cache
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
COMPONENT = "grpo_health_refresh"
STEADY_PREFIX = "steady_"  # a steady part's container key: its element carries the class st-key-steady_<key>
STEADY_CSS = f"""[class*="st-key-{STEADY_PREFIX}"] .stElementContainer[data-stale="true"] {{
  opacity: 1; transition: none; }}
"""
logger = logging.getLogger(__name__)


@cache
def _component():
    import streamlit as st
    # Not isolated: the rule applies to the page (the element draws nothing of its own).
    return st.components.v2.component(COMPONENT, js=(ASSETS / "refresh.js").read_text(), css=STEADY_CSS,
                                      isolate_styles=False)


def steady(key: str):
    """A container for a part that refreshes itself (its fragment's elements, the refresh element
    among them): its elements keep their look while the part reruns (STEADY_CSS)."""
    import streamlit as st
    return st.container(key=STEADY_PREFIX + key)


def after(seconds: float | None, key: str, probe: str | None = None, drawn: str | None = None,
          ready: str | None = None) -> None:
    """Rerun the current fragment `seconds` after the page drew this run of it (None: no more
    refreshes, e.g. the run has ended). Call it last in the fragment; `key` is one per fragment.
    Outside any fragment it reruns the whole page (the live page's first paint asks so for the rest).
    With `probe` (a URL answering {"key": ...}, live_probe's) and `drawn` (the key this run drew),
    each refresh asks the URL first and reruns only when its key differs (or it cannot answer: an
    error, or no answer within 3 periods, 10 s at least); else it waits `seconds` again. With
    `ready` (a CSS selector), the wait starts once the page holds an element it matches (15 s at
    most): the live page asks for its rest once its first chart is drawn, not while it draws."""
    if seconds is None:
        return
    import streamlit as st
    count = st.session_state.get(f"{key}_count", 0) + 1  # new data at each refresh: the page's script runs
    st.session_state[f"{key}_count"] = count
    data = {"every": float(seconds), "n": count}
    if probe is not None:
        data.update(probe=probe, drawn=drawn)
    if ready is not None:
        data["ready"] = ready
    _component()(data=data, key=key, on_due_change=lambda: None)


@contextmanager
def guarded(what: str):
    """Run a refreshing panel's body; an unexpected exception (Streamlit's own rerun and stop are
    not Exceptions) is logged with its traceback and shown as one line naming `what` and the error.
    The caller's refresh.after still runs: the next refresh may well succeed."""
    import streamlit as st
    try:
        yield
    except Exception as error:
        logger.exception("drawing %s failed", what)
        st.error(failure_line(what, error))


def failure_line(what: str, error: Exception) -> str:
    """The one line `guarded` shows: what failed, the error's type and first line, what happens next."""
    first = (str(error).strip().splitlines() or [""])[0]
    return (f"Could not draw {what}: {type(error).__name__}: {first or 'no message'}. This is a bug: the "
            "traceback is in the dashboard's log; the page tries again at its next refresh.")
