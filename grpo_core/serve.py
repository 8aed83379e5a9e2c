"""`python -m grpo_core serve`: the demo run training plus the dashboard, in one command.

Starts the built-in demo run through the runner when no demo run is live (the trainer
is a detached process: stopping the dashboard leaves it training; the Runs page or
`python -m grpo_core control <run> stop` stops it), then runs Streamlit on
127.0.0.1 in the foreground until Ctrl-C.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from grpo_core import runner
from grpo_core.store import runs_dir

APP = Path(__file__).resolve().parent.parent / "app.py"


def streamlit_command(port: int, app: Path = APP) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
            "--server.address", "127.0.0.1", "--server.headless", "true",
            "--browser.gatherUsageStats", "false"]


def serve(port: int = 8501, demo: bool = True, root=None, overrides: list[str] | None = None) -> int:
    if not APP.is_file():
        raise FileNotFoundError(f"dashboard entry point not found: {APP} (run from a source checkout)")
    root = runs_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    if demo:
        rid, started = runner.start_demo_if_idle(root, overrides)
        print(f"demo run {rid} {'started' if started else 'already live'} "
              f"(log: {root / rid / runner.LOG_NAME})", file=sys.stderr, flush=True)
    print(f"dashboard: http://127.0.0.1:{port}  (Ctrl-C stops the dashboard; runs keep training)",
          file=sys.stderr, flush=True)
    env = {**os.environ, "GRPO_RUNS_DIR": str(root)}
    proc = subprocess.Popen(streamlit_command(port), cwd=APP.parent, env=env)

    def on_term(signum, frame):  # `kill <serve pid>` takes its Streamlit down with it, no run
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches Streamlit too (same process group); SIGTERM does not
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


def cli_serve(args) -> int:
    return serve(port=args.port, demo=not args.no_demo, root=args.runs_dir, overrides=args.overrides)
