"""Page URLs on a fresh Streamlit server, in a real browser.

Streamlit 1.67 still routes by the old pages/ folder convention until the process's
first st.navigation call: on a fresh server the first request is matched against the
file names in pages/. A page URL that names no file there got a "Page not found"
pop-up on top of the right page, and one that names a file ran that file without
app.py (no run picker, no token gate but the page's own). app.py's docstring says how
it is avoided; these tests open each server's very first page.
"""
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers_dashboard import CHROMIUM, CHROMIUM_ARGS, REPO, answers, free_port, synth_run, wait_for

pytestmark = pytest.mark.slow
pytest.importorskip("playwright.sync_api")


if not Path(CHROMIUM).exists():
    pytest.skip("no /usr/bin/chromium (make test installs Debian's chromium)", allow_module_level=True)


@pytest.fixture
def fresh_servers(runs_dir, tmp_path):
    """Two fresh `streamlit run app.py` servers on one runs dir (started together: one wait)."""
    with start_servers(2, runs_dir, tmp_path) as urls:
        yield urls


@pytest.fixture
def fresh_server(runs_dir, tmp_path):
    """One fresh `streamlit run app.py` server."""
    with start_servers(1, runs_dir, tmp_path) as urls:
        yield urls[0]


@contextlib.contextmanager
def start_servers(n: int, runs_dir, tmp_path):
    for i, rid in enumerate(["older-run", "newer-run"]):
        synth_run(runs_dir, rid, 3, status="finished", seed=i).close()
    env = {**os.environ, "GRPO_HEALTH_RUNS_DIR": str(runs_dir)}
    env.pop("GRPO_HEALTH_TOKEN", None)
    servers = []
    try:
        for i in range(n):
            port = free_port()
            log = open(tmp_path / f"streamlit-{i}.log", "w")
            proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                                     "--server.headless", "true"], cwd=REPO, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            servers.append((f"http://127.0.0.1:{port}", proc, log))
        for url, _, _ in servers:
            wait_for(lambda: answers(url), 60,
                     what="Streamlit to answer")
        yield [url for url, _, _ in servers]
    finally:
        for _, proc, log in servers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            log.close()


def first_load(browser, url: str, wait_text: str) -> tuple[str, str]:
    """(body text, final URL) of a new browser context's first load of url, once wait_text shows."""
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_text(wait_text).first.wait_for(timeout=30_000)
    page.wait_for_timeout(500)  # the pop-up, when there is one, comes in the same script run, before the page
    out = page.inner_text("body"), page.url
    ctx.close()
    return out


def test_a_fresh_servers_first_page_is_the_page_asked_for_with_no_page_not_found(fresh_servers):
    from playwright.sync_api import sync_playwright
    root_server, deep_server = fresh_servers
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            body, _ = first_load(browser, root_server + "/", "Live monitor")
            assert "Page not found" not in body
            assert "newer-run" in body  # app.py's run picker, on the newest run

            body, url = first_load(browser, deep_server + "/analysis?run=older-run", "choose another run")
            assert "Page not found" not in body
            assert "Run older-run" in body  # the Analysis page, on the run the link names ...
            assert url.endswith("/analysis?run=older-run")
            # ... through app.py: its navigation (page titles), not legacy routing's file names
            assert "Live monitor" in body and "\nlive\n" not in body
        finally:
            browser.close()


def test_sessions_that_open_a_fresh_server_together_each_get_their_page_through_the_app(fresh_server):
    """Three browser sessions' first requests reach a fresh server at once, while Streamlit still
    routes by file name: each gets the page it asked for, through app.py (the hand-over is
    decided per script run, not by state one session shares with another)."""
    from playwright.sync_api import sync_playwright
    asked = {"/runs": "Start a run", "/analysis?run=older-run": "choose another run",
             "/pilot": "check reward variance before training"}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pages = {}
            for path in asked:  # no waiting in between: the sessions' first script runs overlap
                page = browser.new_context().new_page()
                page.goto(fresh_server + path, wait_until="commit")
                pages[path] = page
            for path, wait_text in asked.items():
                page = pages[path]
                page.get_by_text(wait_text).first.wait_for(timeout=60_000)
                page.wait_for_timeout(500)
                body = page.inner_text("body")
                assert "Page not found" not in body, path
                assert "Live monitor" in body and "\nlive\n" not in body, path  # app.py's navigation
                assert urlsplit(page.url).path == urlsplit(path).path, (path, page.url)  # + ?run=<picked>
            assert "Run older-run" in pages["/analysis?run=older-run"].inner_text("body")
        finally:
            browser.close()
