"""Shared helpers for the dashboard tests and bench/dashboard_bench.py.

`synth_run` fills a real store through RunStore.log_step with synthetic but
self-consistent steps (scalars computed by grpo_core.analysis.health from the same scores
that are stored as rollouts), for tests that need long or special runs the real
trainer would take too long to produce. `trained_run` runs the real trainer once per
test session (cached under pytest's base temp dir) for the tests that must see what
the trainer really writes.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import step_stats
from grpo_core.runs import names
from grpo_core.runs.config import DEMO_WEIGHTS, RunConfig
from grpo_core.runs.run_meta import RUNNING
from grpo_core.runs.store import RunStore

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
CHROMIUM = "/usr/bin/chromium"  # Debian's, driven by Playwright (make test installs it)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # nothing reaches out, no GPU


def synth_scores(rng: np.random.Generator, P: int, G: int, step: int, steps: int) -> np.ndarray:
    """[P, G, 5] scores for the demo metrics: f1 continuous, exact/citation/format binary,
    length a graduated penalty; success rises with the step like a learning run."""
    p = 0.2 + 0.6 * step / max(steps, 1)
    f1 = np.clip(rng.beta(2 + 4 * p, 3, size=(P, G)), 0, 1)
    exact = (rng.random((P, G)) < p * 0.8).astype(float)
    cite = (rng.random((P, G)) < 0.5 + 0.4 * p).astype(float)
    fmt = np.ones((P, G))  # uniform: the variance bottleneck the dashboard should name
    length = -np.round(np.clip(rng.normal(0.1, 0.1, size=(P, G)), 0, 1), 1)
    out = np.stack([f1, exact, cite, fmt, length], axis=-1)
    solved = rng.random(P) < 0.3 + 0.5 * step / max(steps, 1)  # solved prompts: identical rewards
    out[solved, :, :4] = 1.0  # ... except the length penalty: signal only a higher weight can use
    return out


def synth_run(root, run_id: str, steps: int, *, rollouts_last: int | None = None, P: int = 8, G: int = 8,
              status: str = RUNNING, seed: int = 0, start: int = 1, changes: dict | None = None,
              store: RunStore | None = None, steps_total: int | None = None) -> RunStore:
    """Create (or extend, with `store`) a run with `steps` synthetic steps from `start`.

    Steps are numbered from 1, as the trainer numbers them.
    rollouts_last: only the last N steps get rollouts (None: all). changes: {step: weights}
    recorded as applied set_weights requests at that step (markers)."""
    metrics = list(DEMO_WEIGHTS)
    cfg = RunConfig()
    cfg.grpo.steps = steps_total or (start + steps - 1)
    cfg.grpo.prompts_per_step, cfg.grpo.group_size = P, G
    if store is None:
        store = RunStore.create(run_id, cfg.to_dict(), root=root)
        store.set_meta(pid=os.getpid(), host=os.uname().nodename)
        store.set_status(status)
    rng = np.random.default_rng(seed + start)
    weights = dict(store.config["reward"]["weights"])
    last = store.last_step()
    wide = store.scalars_wide(since_step=last - 1, names=[names.CUM_GROUPS_SUBMITTED, names.CUM_GROUPS_TRAINABLE]) \
        if last is not None else pd.DataFrame()
    cs = int(wide[names.CUM_GROUPS_SUBMITTED].iloc[-1]) if len(wide) else 0
    ct = int(wide[names.CUM_GROUPS_TRAINABLE].iloc[-1]) if len(wide) else 0
    w = np.array([weights[m] for m in metrics])
    end = start + steps
    for step in range(start, end):
        events = []
        if changes and step in changes:
            rid = store.request("set_weights", {"weights": changes[step]}, source="test")
            store.claim_pending()
            store.resolve_request(rid, True, step, f"applied at step {step}")
            weights = dict(changes[step])
            w = np.array([weights[m] for m in metrics])
        scores = synth_scores(rng, P, G, step, cfg.grpo.steps)
        totals = scores @ w
        stats = step_stats.group_stats(totals, scores, min_group_std=0.01)
        sc = step_stats.step_scalars(stats, scores, metrics, weights, cs, ct)
        cs, ct = int(sc[names.CUM_GROUPS_SUBMITTED]), int(sc[names.CUM_GROUPS_TRAINABLE])
        sc.update({names.MIN_GROUP_STD: 0.01, names.DIFFICULTY: 1, names.TIME_STEP: 0.5 + 0.01 * rng.random(),
                   names.LOSS_POLICY: float(rng.normal()), names.LOSS_KL: 0.0, names.GRAD_NORM: float(rng.random()),
                   names.COMPLETION_MEAN_LENGTH: 10.0, names.TIME_GENERATE: 0.3, names.TIME_TRAIN: 0.2})
        groups = pd.DataFrame({"group": np.arange(P), "prompt_id": [f"p{step}-{g}" for g in range(P)],
                               "size": G, "reward_mean": stats.mean, "reward_std": stats.std,
                               "trainable": stats.trainable, "phantom": stats.phantom})
        rolls = None
        if rollouts_last is None or step >= end - rollouts_last:
            rolls = [(g, i, float(totals[g, i]), dict(zip(metrics, scores[g, i].tolist())), None, None)
                     for g in range(P) for i in range(G)]
        store.log_step(step, sc, groups, rolls, events)
    return store


# Ports free_port hands out: below Linux's ephemeral range (32768-60999, where bind(("", 0)) and
# outgoing connections take theirs), in a block of their own per pytest-xdist worker (gw0, gw1, ...),
# so two workers never pick the same port between checking it and their server binding it.
PORT_BASE, PORT_BLOCK, PORT_BLOCKS = 20_000, 1_000, 12
_ports_given = 0


def free_port() -> int:
    """A local port nothing listens on, a new one at each call: the next free one of this
    process's block (the worker's, at an offset from its PID, so two test runs at once start apart)."""
    global _ports_given
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    block = PORT_BASE + PORT_BLOCK * ((int(worker) if worker.isdigit() else 0) % PORT_BLOCKS)
    for _ in range(PORT_BLOCK):
        port = block + (os.getpid() * 7 + _ports_given) % PORT_BLOCK
        _ports_given += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken (by another process, or a connection of ours in TIME_WAIT)
                continue
            return port
    raise RuntimeError(f"no free port in {block}-{block + PORT_BLOCK - 1}")


def process_tree(pid: int) -> list[int]:
    """A process and its descendants (Linux /proc); a process or thread that exits while it is
    read (a browser's helpers come and go) is left out, not an error."""
    out = [pid]
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return out
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except FileNotFoundError:
            continue
        for child in children:
            out += process_tree(int(child))
    return out


def answers(url: str) -> bool:
    """Whether the Streamlit server at url answers its health check (raises while it cannot)."""
    return urllib.request.urlopen(url + "/_stcore/health", timeout=2).read() == b"ok"


@contextmanager
def streamlit_app(app: Path, timeout: float = 120):
    """`streamlit run app` on a free local port, from the repository: its URL once it answers.
    Its process group is stopped on the way out, however the caller ends."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
                               "--server.address", "127.0.0.1", "--server.headless", "true",
                               "--browser.gatherUsageStats", "false"],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.poll() is None and answers(url), timeout, what="Streamlit to answer")
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:  # a shutdown waiting on a request that never ends: not left behind
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


@contextmanager
def trainer_beating(store: RunStore):
    """The trainer's heartbeat every second: the run stays running (not stale, which hides the
    steering) however long the app's reruns take on a loaded box."""
    alive = threading.Event()
    alive.set()

    def beat():
        while alive.is_set():
            store.heartbeat()
            time.sleep(1.0)
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        alive.clear()
        thread.join()


def wait_for(pred, timeout: float, every: float = 0.25, what: str = "condition"):
    """Poll pred() until it returns something other than None/False (exceptions: not yet)."""
    deadline = time.time() + timeout
    last_exc = None
    while time.time() < deadline:
        try:
            v = pred()
            if v is not None and v is not False:  # frames and rows count as found, whatever they hold
                return v
        except Exception as e:  # the thing we wait for may not exist yet
            last_exc = e
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


# ---- the real trainer, once per session ------------------------------------------------------------
TRAINED_STEPS = 12


def trained_run(base: Path) -> tuple[Path, str]:
    """(runs_dir, run_id) of a finished real trainer run, trained once per test session.

    Cached under pytest's base temp dir: every test module that asks gets the same run."""
    root = base / "trained-runs"
    run_id = "trained"
    db = root / run_id / "run.db"
    done = root / run_id / ".done"
    if done.exists():
        return root, run_id
    root.mkdir(parents=True, exist_ok=True)
    cmd = [PY, "-m", "grpo_core", "train", "--run-id", run_id, "--runs-dir", str(root),
           "--set", f"grpo.steps={TRAINED_STEPS}", "--set", "grpo.prompts_per_step=4",
           "--set", "grpo.group_size=4", "--set", "log.progress=false", "--set", "model.warm_start_steps=0"]
    env = {**os.environ, "GRPO_HEALTH_RUNS_DIR": str(root)}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0 or not db.exists():
        raise RuntimeError(f"trainer failed ({out.returncode}): {out.stderr[-2000:]}")
    done.write_text("ok")
    return root, run_id


def app_test(path: str = "app.py", timeout: float = 60):
    """AppTest of app.py (or a page file) as a session past the live page's first paint, which
    shows the run line and the charts alone (pages/live.py; tests/test_app.py checks it)."""
    from streamlit.testing.v1 import AppTest

    from grpo_core.dashboard import widget_state
    at = AppTest.from_file(str(REPO / path), default_timeout=timeout)
    at.session_state[widget_state.PAINTED] = True
    return at


def run_page(path: str, run_id: str):
    """A Streamlit page (app.py or pages/*.py) run in AppTest on `run_id`; fails on any exception.
    The runs dir is $GRPO_HEALTH_RUNS_DIR (the caller sets it)."""
    at = app_test(path)
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart_specs(at) -> list[dict]:
    """The page's plotly figures as plain dicts (the Analysis, Pilot and Compare pages)."""
    import json
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def live_chart_messages(at) -> list[bytes]:
    """The data of the live page's charts element (live_chart.pack's bytes), one per element drawn."""
    from grpo_core.dashboard import live_chart
    return [e.proto.bytes for e in at.get("bidi_component") if e.proto.component_name == live_chart.COMPONENT]


def live_chart_entries(at) -> list[dict]:
    """The live page's charts as its charts element is sent them (live_chart.unpack's entries: the
    chart's key and token, and its bytes, None when the page holds it already)."""
    from grpo_core.dashboard import live_chart
    return [entry for data in live_chart_messages(at) for entry in live_chart.unpack(data)]


def live_chart_bytes(at) -> list[bytes]:
    """The bytes the live page's charts are sent (live_chart.encode's, whole or an update's)."""
    return [e["data"] for e in live_chart_entries(at) if e["data"] is not None]


def live_charts(at) -> list[dict]:
    """The live page's charts sent something, as the page receives them (live_chart.spec's dicts, decoded)."""
    from grpo_core.dashboard import live_chart
    return [live_chart.decode(b) for b in live_chart_bytes(at)]


def series(chart: dict, label: str) -> list[tuple[float, float]]:
    """One line of a live chart as (step, value) points, its gaps left out."""
    i = [s["label"] for s in chart["series"]].index(label)
    return [(x, y) for x, y in zip(chart["x"], chart["y"][i]) if y is not None]
