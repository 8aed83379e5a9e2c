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

The app is the checkout's asgi.py (app.py and pages/, with the live page's route) when grpo_core
runs from a source checkout, else the copy an installed wheel carries (grpo_core/streamlit_app,
pyproject.toml says how).
Streamlit reads .streamlit/config.toml only from its working dir and the home dir, so serve
passes every setting in that file as a command-line flag: an installed serve, started from any
folder, behaves like `make run`. Streamlit runs in serve's own working dir (the folder a
relative path typed in a form is read against).
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from grpo_core.dashboard import access, live_cache, processes
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.locations import env, runs_dir, source_checkout

logger = logging.getLogger(__name__)

INSTALLED_APP = Path(__file__).resolve().parents[1] / "streamlit_app"  # where the wheel puts it
PORT_ENV = "GRPO_HEALTH_PORT"
DEFAULT_PORT = 8501


def app_dir() -> Path:
    """The folder holding asgi.py, app.py, pages/ and .streamlit/config.toml: the source
    checkout's, else the installed wheel's copy."""
    for folder in (source_checkout(), INSTALLED_APP):
        if folder and (folder / "asgi.py").is_file():
            return folder
    raise FileNotFoundError(f"dashboard entry point not found: no asgi.py in a source checkout nor in {INSTALLED_APP} "
                            "(reinstall grpo-health from its wheel)")


def streamlit_settings(folder: Path) -> dict[str, object]:
    """.streamlit/config.toml as Streamlit option names: {"server.headless": True, ...}."""
    data = tomllib.loads((folder / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    return {f"{section}.{key}": value for section, keys in data.items() for key, value in keys.items()}


def streamlit_command(port: int, app: Path | None = None, host: str = "127.0.0.1") -> list[str]:
    """The Streamlit command line: config.toml's settings as flags, this serve's port and
    address in place of the file's."""
    folder = app.parent if app else app_dir()
    settings = {**streamlit_settings(folder), "server.port": port, "server.address": host}
    flags = [arg for name, value in settings.items() for item in _flag_values(value) for arg in (f"--{name}", item)]
    return [sys.executable, "-m", "streamlit", "run", str(folder / "asgi.py"), *flags]


def _flag_values(value) -> list[str]:
    """A setting's values as flags: a list's items each with the flag, as Streamlit's CLI takes them.
    An empty list has no flag to say it: Streamlit reads it from the config.toml beside asgi.py."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value).lower() if isinstance(value, bool) else str(value)]


def serve_port(port: int | None) -> int:
    """--port, else $GRPO_HEALTH_PORT, else 8501."""
    if port is not None:
        if not 0 < port < 65536:
            raise ConfigError(f"--port must be a port number (1-65535), got {port}")
        return port
    text = env(PORT_ENV, str(DEFAULT_PORT))
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"${PORT_ENV} must be a port number (1-65535), got {text!r}")
    return int(text)


def check_port_free(host: str, port: int):
    """Streamlit's own bind, tried before any run starts: a port in use or an address this
    machine does not have is one line here, not Streamlit's traceback after the demo started.
    SO_REUSEADDR as Tornado binds, so a port left in TIME_WAIT by a dashboard just stopped is free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address of this machine ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is in use (another dashboard?): choose another with --port "
                                  f"or ${PORT_ENV}") from None
            raise ConfigError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None


def check_access(host: str, port: int, token: str | None):
    """A short token is refused; listening off loopback prints a warning."""
    if token and len(token) < 8:
        raise ConfigError("--token / $GRPO_HEALTH_TOKEN must be at least 8 characters")
    if not access.is_loopback(host):
        logger.warning(f"listening on {host}:{port}, not only this machine: whoever reaches this port can "
                       "start, steer and stop runs. " + ("Every browser must give the token first." if token else
                       "No token set: use --token or $GRPO_HEALTH_TOKEN, or publish the port on loopback only."))


def make_runs_dir(root) -> Path:
    root = runs_dir(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"runs dir {root} cannot be created: {e.strerror}; give a writable folder "
                         "(--runs-dir or $GRPO_HEALTH_RUNS_DIR)") from None
    return root


def banner(host: str, port: int, own_demo: str | None) -> str:
    url = f"http://{'127.0.0.1' if access.is_loopback(host) else host}:{port}"
    if own_demo:
        return (f"dashboard: {url}  (Ctrl-C stops the dashboard and the demo run {own_demo} it started, after a "
                "checkpoint; runs you started yourself keep training)")
    return f"dashboard: {url}  (Ctrl-C stops the dashboard; runs keep training)"


def run_streamlit(command: list[str], env: dict) -> int:
    """Streamlit in the foreground until it exits, Ctrl-C or SIGTERM (then it is stopped too)."""
    proc = subprocess.Popen(command, env=env)

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
    logger.info(f"stopping demo run {run_id} (finishing its step, checkpoint) ...")
    try:
        gone = processes.stop_and_wait(run_id, root)
    except KeyboardInterrupt:  # impatient: the stop request is in the store, the trainer acts on it
        logger.info(f"demo run {run_id}: stop requested, not waited for")
        return
    log = root / run_id / processes.LOG_NAME
    logger.info(f"demo run {run_id} {'stopped' if gone else f'did not stop: see {log}'}")


def serve(port: int | None = None, demo: bool = True, root=None, overrides: list[str] | None = None,
          host: str = "127.0.0.1", token: str | None = None, redraws_per_s: str | None = None,
          which: str = "builtin") -> int:
    port = serve_port(port)
    check_port_free(host, port)  # before anything starts: a busy port fails here, not after the demo started
    processes.check_demo(which)  # before anything starts: a misspelt demo fails here
    redraws = live_cache.redraws_per_s(redraws_per_s)  # before anything starts: a bad value fails here
    command = streamlit_command(port, host=host)  # before anything starts: a missing app fails here
    token = token if token is not None else access.expected_token()
    check_access(host, port, token)
    root = make_runs_dir(root)
    own_demo = None  # the demo run this serve started: it stops when serve does
    if demo:
        rid, started = processes.start_demo_if_idle(root, overrides, which)
        own_demo = rid if started else None
        logger.info(f"demo run {rid} {'started' if started else 'already live'} "
                    f"(log: {root / rid / processes.LOG_NAME})")
    logger.info(banner(host, port, own_demo))
    child_env = {**os.environ, "GRPO_HEALTH_RUNS_DIR": str(root), live_cache.REDRAWS_ENV: str(redraws)}
    if token:
        child_env[access.TOKEN_ENV] = token  # the app reads it; never on Streamlit's command line
    try:
        return run_streamlit(command, child_env)
    finally:
        if own_demo:
            stop_own_demo(own_demo, root)


def cli_serve(args) -> int:
    return serve(port=args.port, demo=not args.no_demo, root=args.runs_dir, overrides=args.overrides,
                 host=args.host, token=args.token, redraws_per_s=args.redraws_per_s, which=args.demo)
