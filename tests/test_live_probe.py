"""grpo_core.dashboard.live_probe: the live page's "anything new?" route, served by Starlette (the
server Streamlit runs) on real SQLite run stores: its key changes with what the page draws, and only
then; bad input gets one line and its status; a dashboard with a token answers only its ticket."""
import time

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from grpo_core.dashboard import access, live_cache, live_probe
from grpo_core.runs import requests
from grpo_core.runs.names import TIME_STEP
from tests.helpers_dashboard import synth_run


@pytest.fixture
def client(tmp_path, monkeypatch):
    """The route as asgi.py mounts it, over tmp_path's runs; the process-wide state put back after."""
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    monkeypatch.setattr(live_probe, "_mounted", False)
    monkeypatch.setattr(live_cache, "PROBE_S", 0.0)  # every ask probes the store: no waiting in the test
    live_cache.clear()
    with TestClient(Starlette(routes=live_probe.routes())) as http:
        yield http
    live_cache.clear()


def key(client, run_id="r", **params):
    answer = client.get(live_probe.PATH.format(run_id=run_id), params=params)
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"  # a browser never answers from its cache
    return answer.json()["key"]


def test_the_key_changes_with_what_the_page_draws_and_only_then(client, tmp_path):
    store = synth_run(tmp_path, "r", 5, P=2, G=2)
    first = key(client)
    store.heartbeat()  # a heartbeat alone: nothing the page shows
    assert key(client) == key(client) == first
    synth_run(None, "r", 1, store=store, start=6, P=2, G=2)  # a new step
    stepped = key(client)
    assert stepped != first
    requests.send(tmp_path / "r", "pause", {}, source="ui")  # a request row (the page lists it)
    asked = key(client)
    assert asked != stepped
    store.set_meta(heartbeat=time.time() - 3600)  # the trainer went silent: the page shows it stale
    assert key(client).endswith(".stale") and not asked.endswith(".stale")
    store.close()


def test_bad_input_gets_one_line_and_its_status(client, tmp_path):
    synth_run(tmp_path, "r", 3, P=2, G=2).close()
    bad = client.get(live_probe.PATH.format(run_id="a b"))
    assert bad.status_code == 400 and "run id 'a b' is not allowed" in bad.json()["error"]
    missing = client.get(live_probe.PATH.format(run_id="nope"))
    assert missing.status_code == 404 and missing.json()["error"] == f"run nope: no run store under {tmp_path}"
    assert client.post(live_probe.PATH.format(run_id="r")).status_code == 405  # it only answers reads


def test_with_a_token_only_the_runs_ticket_is_answered(client, tmp_path, monkeypatch):
    synth_run(tmp_path, "r", 3, P=2, G=2).close()
    synth_run(tmp_path, "other", 3, P=2, G=2).close()
    monkeypatch.setenv(access.TOKEN_ENV, "s3cret")
    for ticket in ({}, {"ticket": "0" * 64}, {"ticket": live_probe.ticket("other", "s3cret")}):
        refused = client.get(live_probe.PATH.format(run_id="r"), params=ticket)
        assert refused.status_code == 403 and refused.json()["error"].startswith("ticket: missing or wrong")
    url = live_probe.url("r")  # what the page hands its refresh: the ticket, never the token
    assert "s3cret" not in url and url.startswith("/grpo-health/live/r?ticket=")
    assert client.get(url).status_code == 200
    assert client.get(live_probe.url("r", "ab12")).status_code == 200  # the ticket and the viewer


def test_the_pages_that_ask_are_the_runs_viewers(client, tmp_path, monkeypatch):
    """A page that asks the route still watches the run: on a fast run, ten pages that asked for
    their period share its redraws; past the viewers' window, the three that kept asking the route
    (nothing new: no rerun, no period asked) are its viewers, and the seven that stopped are not.
    Ids no page's script run gave, made up on the route, count for nothing."""
    store = synth_run(tmp_path, "r", 5, P=2, G=2)
    for step in range(6, 26):  # half a second per step
        store.log_step(step, {TIME_STEP: 0.5})
    s = live_cache.current(tmp_path / "r")
    assert [live_cache.refresh_interval(s, probed=True, viewer=f"page{i}") for i in range(10)][-1] == \
        pytest.approx(10 / live_cache.redraws_per_s())
    now = time.monotonic()
    clock = [now + live_cache.VIEWERS_WINDOW_S - 1]
    monkeypatch.setattr(live_cache.time, "monotonic", lambda: clock[0])
    for i in range(3):
        assert client.get(live_probe.url("r", f"page{i}")).status_code == 200
    for i in range(100):
        assert client.get(live_probe.url("r", f"madeup{i}")).status_code == 200
    clock[0] = now + live_cache.VIEWERS_WINDOW_S + 1
    assert live_cache.refresh_interval(s, probed=True, viewer="page0") == live_cache.MIN_REFRESH_S  # 3 pages: 2 s
    assert live_cache.refresh_interval(s, probed=True, viewer="page3") == pytest.approx(4 / live_cache.redraws_per_s())
    bad = client.get(live_probe.PATH.format(run_id="r"), params={"viewer": "a/b"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("viewer: ")
    store.close()


def test_the_page_gets_no_url_where_no_server_mounted_the_route(monkeypatch):
    monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    monkeypatch.setattr(live_probe, "_mounted", False)
    assert live_probe.url("r") is None  # app.py served alone: the page reruns at each refresh
    live_probe.routes()
    assert live_probe.url("r") == "/grpo-health/live/r"
    assert live_probe.url("r", "ab12") == "/grpo-health/live/r?viewer=ab12"
