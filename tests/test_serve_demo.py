"""The demo ends with its dashboard: `python -m grpo_core serve` started as a real process
starts the built-in demo run; Ctrl-C (SIGINT to serve's process group, as a terminal sends
it) or SIGTERM (to serve alone) stops serve and that demo run with it, after a checkpoint,
leaving no trainer process behind. A demo serve did not start keeps training (the restart in
tests/test_browser_live.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from grpo_core.dashboard import processes
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import REPO, answers, free_port, wait_for

pytestmark = pytest.mark.slow

FAST_DEMO = ["model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8",
             "log.checkpoint_every=0"]
STALL_S = 240  # ceilings only: each wait ends as soon as what it waits for happens


def meta_and_step(root, rid) -> tuple[dict, int]:
    with RunStore.open(root / rid, readonly=True) as store:
        return store.get_meta(), store.last_step() or 0


def pid_gone(pid: int) -> bool:
    """No such process, or a zombie (exited, not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.fixture
def serve_process(runs_dir, tmp_path):
    """Starts `serve` on a free loopback port; whatever the test's outcome, serve's own process
    group and the demo trainer it recorded are gone afterwards."""
    started = {}

    def start() -> subprocess.Popen:
        port = free_port()
        cmd = [sys.executable, "-m", "grpo_core", "serve", "--port", str(port), "--runs-dir", str(runs_dir)]
        for override in FAST_DEMO:
            cmd += ["--set", override]
        log = open(tmp_path / "serve.log", "w")
        started["proc"] = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True)
        log.close()

        def up():
            if started["proc"].poll() is not None:  # serve itself failed: no use waiting
                pytest.fail(f"serve exited: {(tmp_path / 'serve.log').read_text()[-2000:]}")
            return answers(f"http://127.0.0.1:{port}")
        wait_for(up, STALL_S, what="serve's Streamlit to answer")
        return started["proc"]
    try:
        yield start
    finally:
        proc = started.get("proc")
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rid = processes.live_demo(runs_dir)
        if rid:
            processes.stop_and_wait(rid, root=runs_dir, request_wait_s=10, signal_wait_s=20)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_serve_stops_the_demo_it_started_with_a_checkpoint_when_it_exits(serve_process, runs_dir, tmp_path, how):
    proc = serve_process()
    rid = wait_for(lambda: processes.live_demo(runs_dir), STALL_S, what="the demo run")
    wait_for(lambda: (lambda m, s: m.get("status") == "running" and s >= 2)(*meta_and_step(runs_dir, rid)),
             STALL_S, what="the demo trainer to run two steps")
    pid = meta_and_step(runs_dir, rid)[0]["pid"]
    assert not pid_gone(pid)
    banner = (tmp_path / "serve.log").read_text()
    assert f"the demo run {rid} it started" in banner and "runs you started yourself keep training" in banner

    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: serve and its Streamlit, not the trainer
    else:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=STALL_S)  # serve waits for the trainer: a stop request, then a signal
    assert pid_gone(pid), "the demo trainer outlived serve"
    meta, step = meta_and_step(runs_dir, rid)
    assert meta["status"] == "stopped" and step >= 2
    checkpoints = sorted((runs_dir / rid / "checkpoints").glob("*"))
    assert checkpoints, "no checkpoint written on the way out"
    assert processes.live_demo(runs_dir) is None
    assert f"demo run {rid} stopped" in (tmp_path / "serve.log").read_text()
