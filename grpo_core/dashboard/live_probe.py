"""The live page's "anything new?" route: a refresh asks it before it reruns its fragment.

A fragment's rerun costs its browser a redraw of every element on the page, whether or not the
run changed (Streamlit renders the page's elements again at each fragment run: docs/benchmarks.md
"Live page: the "anything new?" route"), and a run of a step a minute changed at one refresh in
six. So the page hands its refresh element (refresh.after) this route's URL and the key of the run
it drew; when due, the element GETs the route (a few bytes, answered from live_cache's shared
probe: no store read of its own, no script run) and reruns the fragment only if the key differs.
A viewer of a run with nothing new costs its browser one small request per period. The URL names
the page's viewer id too: a page that asks still watches the run (live_cache counts a run's viewers,
who share its redraws, by who asked lately), and a closed or hidden page, which asks nothing, drops
out.

The route is mounted by asgi.py (`grpo-health serve` runs it); a dashboard served from app.py alone
has no route, `url` says so (None) and the page reruns at each refresh as before. With an access
token (access.py) the URL carries a ticket: the token's HMAC of the run id, so the route answers
only pages that were given the token, and the token itself never reaches the browser's script.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from urllib.parse import urlencode

from grpo_core.dashboard import access, live_cache
from grpo_core.dashboard.live_view import LiveState
from grpo_core.errors import StoreError
from grpo_core.runs.locations import check_run_id, runs_dir
from grpo_core.runs.schema import DB_NAME

PATH = "/grpo-health/live/{run_id}"  # outside Streamlit's own /_stcore/ and the pages' paths
VIEWER_RE = re.compile(r"[A-Za-z0-9]{1,32}")  # a page's viewer id (the live page's: 16 hex digits)
_mounted = False  # routes() was asked for in this process: the server answers PATH


def key(state: LiveState) -> str:
    """What the live page draws from, in one string: a new step, event or request row (version),
    the what-if window's rollouts (rollout_step), the run's status (stale once its heartbeat ages)."""
    return f"{state.version}.{state.rollout_step}.{state.status}"


def ticket(run_id: str, token: str) -> str:
    """The token's HMAC of the run id: what a page given the token proves to the route."""
    return hmac.new(token.encode(), run_id.encode(), hashlib.sha256).hexdigest()


def url(run_id: str, viewer: str | None = None) -> str | None:
    """The route's URL for `run_id` (with its ticket when the dashboard has a token, and the asking
    page's viewer id: live_cache counts the run's viewers by who asks); None when this server has no
    route (app.py served alone)."""
    if not _mounted:
        return None
    token = access.expected_token()
    params = {"ticket": ticket(run_id, token) if token else None, "viewer": viewer}
    query = urlencode({name: value for name, value in params.items() if value})
    return PATH.format(run_id=run_id) + (f"?{query}" if query else "")


def answer(run_id: str, given_ticket: str | None, viewer: str | None = None) -> tuple[int, dict]:
    """(HTTP status, JSON body): {"key": key(state)} for a run under the runs dir, else
    {"error": one line naming what is wrong}. `viewer`: the asking page, still watching the run."""
    try:
        check_run_id(run_id)
    except StoreError as e:
        return 400, {"error": str(e)}
    if viewer is not None and not VIEWER_RE.fullmatch(viewer):
        return 400, {"error": "viewer: 1 to 32 letters or digits (the page's own id; reload the page)"}
    token = access.expected_token()
    if token and not hmac.compare_digest(given_ticket or "", ticket(run_id, token)):
        return 403, {"error": "ticket: missing or wrong for this run (reload the page after entering the token)"}
    run_dir = runs_dir() / run_id
    if not (run_dir / DB_NAME).is_file():  # before live_cache: a made-up id must not evict a real run's view
        return 404, {"error": f"run {run_id}: no run store under {runs_dir()}"}
    try:
        state = live_cache.current(run_dir)
    except StoreError as e:
        return 404, {"error": str(e)}
    if viewer:
        live_cache.saw_viewer(run_dir, viewer)
    return 200, {"key": key(state)}


def endpoint(request):
    """The route's handler (a plain function: Starlette runs it in its thread pool, off the
    event loop, like the store read it may trigger). Never cached by the browser."""
    from starlette.responses import JSONResponse
    status, body = answer(request.path_params["run_id"], request.query_params.get("ticket"),
                          request.query_params.get("viewer"))
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def routes() -> list:
    """The routes asgi.py mounts beside Streamlit's (st.App(routes=...))."""
    global _mounted
    from starlette.routing import Route
    _mounted = True
    return [Route(PATH, endpoint, methods=["GET"])]
