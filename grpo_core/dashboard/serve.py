"""`python -m grpo_core serve`: the demo run training plus the dashboard, in one command.

Starts the built-in demo run through the runner when no demo run is live (the trainer
is a detached process: stopping the dashboard leaves it training; the Runs page or
`python -m grpo_core control <run> stop` stops it), then runs Streamlit on
127.0.0.1 in the foreground until Ctrl-C.

`--host 0.0.0.0` listens on every interface (the Docker image does, inside its
container): anyone who reaches the port can start and stop runs, so it prints a warning,
and `--token` / $GRPO_HEALTH_TOKEN makes every page ask for a token first (access.py).
Streamlit's XSRF protection stays on (.streamlit/config.toml); nothing here turns it off.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from grpo_core.dashboard import processes, access
from grpo_core.errors import ConfigError
from grpo_core.errors import StoreError
from grpo_core.runs.store import runs_dir

APP = Path(__file__).resolve().parents[2] / "app.py"


def streamlit_command(port: int, app: Path = APP, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
            "--server.address", host, "--server.headless", "true",
            "--server.fileWatcherType", "none",  # see .streamlit/config.toml
            "--browser.gatherUsageStats", "false"]


def serve(port: int = 8501, demo: bool = True, root=None, overrides: list[str] | None = None,
          host: str = "127.0.0.1", token: str | None = None) -> int:
    if not APP.is_file():
        raise FileNotFoundError(f"dashboard entry point not found: {APP} (run from a source checkout)")
    token = token if token is not None else access.expected_token()
    if token and len(token) < 8:
        raise ConfigError("--token / $GRPO_HEALTH_TOKEN must be at least 8 characters")
    if not access.is_loopback(host):
        print(f"WARNING: listening on {host}:{port}, not only this machine: whoever reaches this port can "
              "start, steer and stop runs. " + ("Every browser must give the token first." if token else
              "No token set: use --token or $GRPO_HEALTH_TOKEN, or publish the port on loopback only."),
              file=sys.stderr, flush=True)
    root = runs_dir(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"runs dir {root} cannot be created: {e.strerror}; give a writable folder "
                         "(--runs-dir or $GRPO_RUNS_DIR)") from None
    if demo:
        rid, started = processes.start_demo_if_idle(root, overrides)
        print(f"demo run {rid} {'started' if started else 'already live'} "
              f"(log: {root / rid / processes.LOG_NAME})", file=sys.stderr, flush=True)
    print(f"dashboard: http://{'127.0.0.1' if access.is_loopback(host) else host}:{port}  "
          "(Ctrl-C stops the dashboard; runs keep training)", file=sys.stderr, flush=True)
    env = {**os.environ, "GRPO_RUNS_DIR": str(root)}
    if token:
        env[access.TOKEN_ENV] = token  # the app reads it; never on Streamlit's command line
    proc = subprocess.Popen(streamlit_command(port, host=host), cwd=APP.parent, env=env)

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
    return serve(port=args.port, demo=not args.no_demo, root=args.runs_dir, overrides=args.overrides,
                 host=args.host, token=args.token)
