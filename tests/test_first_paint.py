"""grpo_core.dashboard.first_paint: the live page's HTML with its run's first chart in it, served by
Starlette (the server Streamlit runs) over real SQLite run stores: the preview is the page's own
first chart of the run the page will show, made once for both; nothing of a run reaches a dashboard
with a token, and a run with no chart, no run or an unreadable one leaves Streamlit's HTML as it is."""
import base64
import logging
import re

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from grpo_core.analysis import charts
from grpo_core.dashboard import access, first_paint, live_cache, live_chart
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import synth_run

DATA = re.compile(r'<script type="application/octet-stream" id="grpo-first-paint-data">([^<]*)</script>')


@pytest.fixture
def client(tmp_path, monkeypatch):
    """The route as asgi.py mounts it, over tmp_path's runs; the process-wide state put back after."""
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    live_cache.clear()
    with TestClient(Starlette(routes=first_paint.routes())) as http:
        yield http
    live_cache.clear()


def served(client, query: str = "") -> str:
    answer = client.get("/" + query)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html"), answer.text[:200]
    assert answer.headers["cache-control"] == "no-store"  # it holds the run's last step
    return answer.text


def previewed_chart(text: str) -> dict:
    return live_chart.decode(base64.b64decode(DATA.search(text).group(1)))


def test_the_page_holds_the_first_chart_the_page_itself_then_draws(client, tmp_path, monkeypatch):
    synth_run(tmp_path, "r", 30, P=2, G=2, steps_total=500, status="finished").close()  # no heartbeat to age
    builds = []
    build = charts.live_charts
    monkeypatch.setattr(charts, "live_charts", lambda *a, **k: builds.append(1) or build(*a, **k))
    text = served(client)
    streamlit = first_paint.index_html()
    assert text.startswith(streamlit[:streamlit.index("</head>")]) and text.count('<div id="root"></div>') == 1
    assert '<div id="grpo-first-paint" data-run="r"' in text and "<b>r</b> · finished · 30 / 500 steps" in text
    assert "step 30 of" not in text  # the page's own progress text is the page's (tests and benches find it)
    assert f"<script>{first_paint.script()}</script>" in text  # the chart's drawing, inline
    state = live_cache.current(tmp_path / "r")
    specs = live_cache.chart_specs(tmp_path / "r", state, charts.DEFAULT_SMOOTHING)  # the page's first paint
    assert len(builds) == 1  # made once, for the preview and the page
    first = next(chart for _, chart in specs if chart is not None)
    shown = previewed_chart(text)
    assert shown["title"] == first["title"] == "Trainable ratio"
    assert shown["x"] == first["x"].tolist() and len(shown["y"]) == len(first["y"]) and shown["x"][-1] == 30


def test_the_preview_is_of_the_run_the_page_will_show(client, tmp_path):
    synth_run(tmp_path, "old", 5, P=2, G=2, status="finished").close()
    synth_run(tmp_path, "new", 8, P=2, G=2).close()
    assert 'data-run="new"' in served(client)  # the default: the newest live run
    assert 'data-run="old"' in served(client, "?run=old")
    assert 'data-run="new"' in served(client, "?run=nope")  # an unknown id: the default, as the page does
    assert 'data-run="new"' in served(client, "?run=../x")


def test_streamlits_own_page_where_there_is_nothing_to_preview(client, tmp_path, monkeypatch, caplog):
    assert served(client) == first_paint.index_html()  # no run yet
    store = RunStore.create("empty", synth_run(tmp_path, "r", 3, P=2, G=2).config, root=tmp_path)
    store.close()
    assert served(client, "?run=empty") == first_paint.index_html()  # no step: no chart yet
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.db").write_bytes(b"not a database at all" * 100)
    with caplog.at_level(logging.ERROR, logger=first_paint.__name__):
        assert served(client, "?run=broken") == first_paint.index_html()  # unreadable: the page says why
    assert "first paint: no preview of run broken" in caplog.text
    monkeypatch.setenv(access.TOKEN_ENV, "s3cret")
    assert served(client, "?run=r") == first_paint.index_html()  # a token: no run data before it is typed


def test_only_the_live_page_is_answered_here(client):
    assert client.post("/").status_code == 405
    assert client.get("/runs").status_code == 404  # Streamlit's static files answer the other pages


def test_the_script_is_one_scope_that_leaves_the_pages_global_alone():
    body = first_paint.script()
    assert body.startswith("(function (globalThis) {") and body.rstrip().endswith("})({});")
    assert "</script" not in body.lower()
