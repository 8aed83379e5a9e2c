"""docs/screenshots/worked_example_eval.png: the live page's "Held-out evaluation" chart of a
finished worked-example run. Starts the dashboard (no demo run) on a free 127.0.0.1 port,
drives Debian's chromium with Playwright, stops the dashboard it started.

    .venv/bin/python docs/examples/arithmetic/screenshot.py runs arithmetic
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "docs" / "screenshots" / "worked_example_eval.png"


def main(runs_dir: str, run_id: str) -> int:
    from playwright.sync_api import sync_playwright
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "grpo_core", "serve", "--no-demo", "--port", str(port),
                               "--runs-dir", str(Path(runs_dir).resolve())], cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                if urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                        args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 2400})
            page.goto(f"{url}/?run={run_id}", wait_until="domcontentloaded")
            chart = page.locator(".js-plotly-plot").filter(has_text="Held-out evaluation").first
            chart.wait_for(timeout=90_000)
            chart.scroll_into_view_if_needed()
            page.wait_for_timeout(1500)  # let plotly finish its transitions
            chart.screenshot(path=str(OUT))
            browser.close()
    finally:
        server.send_signal(signal.SIGTERM)  # only the dashboard this script started
        server.wait(timeout=30)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
