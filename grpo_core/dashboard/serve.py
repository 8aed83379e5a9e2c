"""`python -m grpo_core serve`: the demo run training plus the dashboard, in one command.

Starts the built-in demo run when no demo run is live, then runs Streamlit on 127.0.0.1 in
the foreground until Ctrl-C or SIGTERM. The demo ends with its dashboard: a demo run this
serve started is stopped when serve exits (a stop request through the store, so the trainer
finishes its step and checkpoints; a signal if it does not exit in time). Every other run,
a demo that was already live included, is a detached process that keeps training; the Runs
page or `python -m grpo_core control <run> stop` stops it.

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

from grpo_core.dashboard import access, processes
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.locations import runs_dir

APP = Path(__file__).resolve().parents[2] / "app.py"


def streamlit_command(port: int, app: Path = APP, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
            "--server.address", host, "--server.headless", "true",
            "--server.fileWatcherType", "none",  # see .streamlit/config.toml
            "--browser.gatherUsageStats", "false"]


def check_access(host: str, port: int, token: str | None):
    """A short token is refused; listening off loopback prints a warning."""
    if token and len(token) < 8:
        raise ConfigError("--token / $GRPO_HEALTH_TOKEN must be at least 8 characters")
    if not access.is_loopback(host):
        print(f"WARNING: listening on {host}:{port}, not only this machine: whoever reaches this port can "
              "start, steer and stop runs. " + ("Every browser must give the token first." if token else
              "No token set: use --token or $GRPO_HEALTH_TOKEN, or publish the port on loopback only."),
              file=sys.stderr, flush=True)


def make_runs_dir(root) -> Path:
    root = runs_dir(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"runs dir {root} cannot be created: {e.strerror}; give a writable folder "
                         "(--runs-dir or $GRPO_RUNS_DIR)") from None
    return root


def banner(host: str, port: int, own_demo: str | None) -> str:
    url = f"http://{'127.0.0.1' if access.is_loopback(host) else host}:{port}"
    if own_demo:
        return (f"dashboard: {url}  (Ctrl-C stops the dashboard and the demo run {own_demo} it started, after a "
                "checkpoint; runs you started yourself keep training)")
    return f"dashboard: {url}  (Ctrl-C stops the dashboard; runs keep training)"


def run_streamlit(command: list[str], env: dict) -> int:
    """Streamlit in the foreground until it exits, Ctrl-C or SIGTERM (then it is stopped too)."""
    proc = subprocess.Popen(command, cwd=APP.parent, env=env)

    def on_term(signum, frame):  # `kill <serve pid>` takes its Streamlit down with it
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


def stop_own_demo(run_id: str, root: Path):
    """The demo run this serve started stops with it: a stop request (step finished, checkpoint),
    then a signal if its trainer does not exit in time. A second Ctrl-C leaves it to the request."""
    print(f"stopping demo run {run_id} (finishing its step, checkpoint) ...", file=sys.stderr, flush=True)
    try:
        gone = processes.stop_and_wait(run_id, root)
    except KeyboardInterrupt:  # impatient: the stop request is in the store, the trainer acts on it
        print(f"demo run {run_id}: stop requested, not waited for", file=sys.stderr, flush=True)
        return
    print(f"demo run {run_id} {'stopped' if gone else 'did not stop: see ' + str(root / run_id / processes.LOG_NAME)}",
          file=sys.stderr, flush=True)


def serve(port: int = 8501, demo: bool = True, root=None, overrides: list[str] | None = None,
          host: str = "127.0.0.1", token: str | None = None) -> int:
    if not APP.is_file():
        raise FileNotFoundError(f"dashboard entry point not found: {APP} (run from a source checkout)")
    token = token if token is not None else access.expected_token()
    check_access(host, port, token)
    root = make_runs_dir(root)
    own_demo = None  # the demo run this serve started: it stops when serve does
    if demo:
        rid, started = processes.start_demo_if_idle(root, overrides)
        own_demo = rid if started else None
        print(f"demo run {rid} {'started' if started else 'already live'} "
              f"(log: {root / rid / processes.LOG_NAME})", file=sys.stderr, flush=True)
    print(banner(host, port, own_demo), file=sys.stderr, flush=True)
    env = {**os.environ, "GRPO_RUNS_DIR": str(root)}
    if token:
        env[access.TOKEN_ENV] = token  # the app reads it; never on Streamlit's command line
    try:
        return run_streamlit(streamlit_command(port, host=host), env)
    finally:
        if own_demo:
            stop_own_demo(own_demo, root)


def cli_serve(args) -> int:
    return serve(port=args.port, demo=not args.no_demo, root=args.runs_dir, overrides=args.overrides,
                 host=args.host, token=args.token)
