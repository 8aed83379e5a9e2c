"""End to end: the real `python -m grpo_core train` process, read through its run store
the way the dashboard reads it. A tiny model without warm-start keeps each test short;
what is tested is the process contract, not learning (bench/demo_curves.py is that)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from grpo_core.errors import StoreError
from grpo_core.runs import names, requests
from grpo_core.runs.run_meta import FINISHED, RUNNING, STALE, STOPPED, display_status
from grpo_core.runs.store import EV_CHANGE, EV_LIFECYCLE, RunStore

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=4", "grpo.group_size=4", "grpo.max_new_tokens=10",
        "log.progress=false"]


def start(runs_dir: Path, run_id: str, *sets: str, resume=False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", run_id, "--runs-dir", str(runs_dir)]
    for s in TINY + list(sets):
        cmd += ["--set", s]
    if resume:
        cmd.append("--resume")
    log = open(runs_dir / f"{run_id}-{'resume' if resume else 'start'}.log", "w")
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def wait_for(cond, proc, timeout=60.0, what="condition"):
    t0 = time.time()
    while time.time() - t0 < timeout:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            value = cond()
            if value:
                return value
            raise AssertionError(f"trainer exited ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def last_step(db: Path):
    try:
        with RunStore(db, readonly=True) as s:
            return s.last_step()
    except StoreError:
        return None


def test_weight_request_mid_run_is_applied_exactly_once_and_sigterm_stops_cleanly(runs_dir):
    db = runs_dir / "w" / "run.db"
    # A budget the run cannot reach here: on a fast box 300 steps were done before the test saw
    # the step after the change (steps are committed a second at a time), and the SIGTERM then
    # met a process already shutting down (returncode -15).
    proc = start(runs_dir, "w", "grpo.steps=1000000", "log.checkpoint_every=0")
    try:
        wait_for(lambda: (last_step(db) or 0) >= 3, proc, what="step 3")
        new = {"answer_f1": 0.0, "exact": 1.0, "citation": 0.0, "format": 0.0, "length": 0.0}
        rid = requests.send(db, "set_weights", {"weights": new}, source="test")
        store = RunStore(db, readonly=True)

        def applied_step():
            row = store.control().set_index("id").loc[rid]
            return int(row["applied_step"]) if row["status"] == "applied" else None
        applied = wait_for(applied_step, proc, what="the request applied")
        wait_for(lambda: (last_step(db) or 0) >= applied + 1, proc, what="a step after the change")
        proc.send_signal(signal.SIGTERM)  # what the dashboard's Stop / Ctrl-C does: finish the step, checkpoint
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    meta = store.get_meta()
    assert meta["status"] == STOPPED and display_status(meta) == STOPPED
    changes = store.events(kinds=[EV_CHANGE])
    assert [p["request_id"] for p in changes["payload"]].count(rid) == 1  # applied once, logged once
    w = store.scalars_wide()
    assert w.loc[applied - 1, names.metric_weight("exact")] == 0.3  # before: the config's weights
    for step in w.index[w.index >= applied]:
        for m, v in new.items():
            assert w.loc[step, names.metric_weight(m)] == v
    ro = store.rollouts(step=applied)
    np.testing.assert_allclose(ro["total"], ro["exact"])  # the step it took effect is scored by the new weights
    assert store.control().set_index("id").loc[rid, "applied_step"] == applied
    assert (runs_dir / "w" / "checkpoints" / f"step-{int(w.index[-1]):06d}").is_dir()  # stop checkpoints
    assert [p["event"] for p in store.events(kinds=[EV_LIFECYCLE])["payload"]][-1] == STOPPED


def test_kill_9_leaves_a_readable_store_and_resume_continues_from_the_checkpoint(runs_dir):
    db = runs_dir / "k" / "run.db"
    proc = start(runs_dir, "k", "grpo.steps=1000000", "log.checkpoint_every=10")  # killed long before the end
    try:
        wait_for(lambda: (last_step(db) or 0) >= 24, proc, what="step 24")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    store = RunStore(db, readonly=True)
    meta = store.get_meta()
    assert meta["status"] == RUNNING  # nobody wrote "stopped" ...
    assert display_status(meta) == STALE  # ... and readers see that the process is gone
    killed_at = store.last_step()
    w = store.scalars_wide()
    assert w.index.tolist() == list(range(1, killed_at + 1))  # every committed step, no gap
    cols = [n for n in names.STEP_SCALARS if n != names.LOSS_ENTROPY]  # entropy is empty on a zero-trainable step
    assert set(names.STEP_SCALARS) <= set(w.columns) and w[cols].notna().all().all()
    assert store.groups()["step"].value_counts().eq(4).all()
    assert store.rollouts(with_text=False)["step"].value_counts().eq(16).all()
    ckpt = max(int(p.name.split("-")[1]) for p in (runs_dir / "k" / "checkpoints").glob("step-*"))
    assert ckpt % 10 == 0 and ckpt <= killed_at
    before = w.loc[:ckpt]

    end = ckpt + 12
    proc = start(runs_dir, "k", f"grpo.steps={end}", resume=True)
    assert proc.wait(90) == 0
    store = RunStore(db, readonly=True)
    meta = store.get_meta()
    assert meta["status"] == FINISHED and display_status(meta) == FINISHED
    w = store.scalars_wide()
    assert w.index.tolist() == list(range(1, end + 1))
    after = w.loc[:ckpt, before.columns]
    assert np.allclose(after.fillna(-1).to_numpy(), before.fillna(-1).to_numpy())  # history before the checkpoint kept
    resumed = [p for p in store.events(kinds=[EV_LIFECYCLE])["payload"] if p["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["from"].endswith(f"step-{ckpt:06d}")
    assert resumed[0]["steps_redone"] == killed_at - ckpt
