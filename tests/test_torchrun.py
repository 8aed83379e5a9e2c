"""`torchrun --nproc_per_node 2 -m grpo_core train`: real torchrun jobs of two gloo processes on
this CPU (grpo_core/train/ranks.py), against the same run on one rank (the plain trainer, run in
the test's process).

- 1 rank and 2 give the same steps: the same groups submitted and trainable, the same rewards,
  and weights equal to float64 round-off (model.dtype=float64: measured ~2e-15 after 4 steps;
  asserted at 1e-9. In float32 the same runs differ by ~5e-7: docs/benchmarks.md), on the
  built-in model and on a locally built Qwen2.
- Requests from the dashboard's path (a weight change, checkpoint, pause, resume, stop) apply
  on both ranks at one step (at every step boundary the ranks compare what they hold and fail
  the run if they differ), while a rank whose groups never train (its metric is flat) runs no
  backward and hangs nothing.
- SIGTERM to a rank stops the job; a killed rank (either) fails it with one line.
- A run stopped on 2 ranks resumes on 1 and ends where the 1-rank run ends.

Each torchrun job costs ~15 s of start-up on this box (the launcher and both workers import
torch and transformers), so one job checks several of these. The jobs are waited on by their
progress in the store (the last step, a request's status), never by a guessed time; each rank is
killed by its pid if the test fails.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from grpo_core.runs import names, requests
from grpo_core.runs.store import RunStore
from grpo_core.train import launch
from grpo_core.train.checkpoints import latest_checkpoint
from grpo_core.train.rank_failure import LOST_RANK
from grpo_core.train.trainer import Trainer
from tests import real_model
from tests.helpers_dashboard import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 300  # a safety bound on a job that makes no progress, not a guess of how long it takes

METRICS = '''
import os


def spread(completion, example):
    """A random-init model's rewards would tie: every group gets a spread from the lengths."""
    return float(len(completion) % 3)


def flat_on_rank_1(completion, example):
    """Flat on rank 1: its groups never train, rank 0's do."""
    return 0.0 if os.environ.get("RANK") == "1" else float(len(completion) % 3)
'''
TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=4", "grpo.group_size=4", "grpo.max_new_tokens=12",
        "grpo.lr=0.01", "model.dtype=float64", "log.progress=false", "log.checkpoint_every=0"]


def _config(tmp_path: Path, metric: str = "spread") -> Path:
    (tmp_path / "rank_metrics.py").write_text(METRICS)
    path = tmp_path / "config.toml"
    path.write_text(f'[reward]\nweights = {{ m = 1.0 }}\ncustom = {{ m = "rank_metrics:{metric}" }}\n')
    return path



def _start(ranks: int, run_id: str, runs: Path, sets: list[str], config: Path) -> subprocess.Popen:
    """`torchrun --nproc_per_node RANKS -m grpo_core train ...`"""
    args = ["train", "--run-id", run_id, "--runs-dir", str(runs), "--config", str(config)]
    for s in sets:
        args += ["--set", s]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
                "127.0.0.1", "--master_port", str(free_port()), "-m", "grpo_core"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GRPO_HEALTH_TORCH_THREADS": "1"}
    return subprocess.Popen(launcher + args, cwd=runs.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _train_here(run_id: str, runs: Path, sets: list[str], config: Path | None = None, resume: bool = False):
    """The 1-rank run in this process, as `python -m grpo_core train` opens and runs it (a
    process of its own would cost its start-up, and one rank is the plain trainer)."""
    args = argparse.Namespace(config=str(config) if config else None, overrides=list(sets), run_id=run_id,
                              runs_dir=str(runs), resume=resume)
    cfg, store = launch.open_run(args)
    try:
        assert Trainer(cfg, store, resume=resume, log=lambda m: None).run() == "finished"
    finally:
        store.close()


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    finally:
        _kill(proc)
    return proc.returncode, out


def _kill(proc: subprocess.Popen):
    """The job, if still running: torchrun starts each rank in a session of its own, so the
    launcher's process group does not hold them; each is killed by its pid."""
    if proc.poll() is not None:
        return
    try:
        ranks = _rank_pids(proc)
    except OSError:  # the launcher ended meanwhile
        ranks = []
    for pid in (*ranks, proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _meta(runs: Path, run_id: str) -> dict:
    with RunStore.open(runs / run_id, readonly=True) as store:
        return store.get_meta()


def _wait(proc: subprocess.Popen, ready, what: str):
    """Until ready() (read from the store) or the job ends or makes no progress for LIMIT_S."""
    deadline = time.monotonic() + LIMIT_S
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {proc.communicate()[0][-3000:]}")
        assert time.monotonic() < deadline, f"no {what} within {LIMIT_S}s"
        time.sleep(0.1)


def _last_step(runs: Path, run_id: str) -> int:
    try:
        with RunStore.open(runs / run_id, readonly=True) as store:
            return store.last_step() or 0
    except Exception:  # not created yet
        return 0


def _rank_pids(proc: subprocess.Popen) -> list[int]:
    """The worker processes torchrun started, by rank."""
    children = [int(p) for task in Path(f"/proc/{proc.pid}/task").iterdir()
                for p in (task / "children").read_text().split()]
    return sorted(children, key=lambda pid: _environ(pid).get("RANK", ""))


def _environ(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # it ended meanwhile
        return {}
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _weights(runs: Path, run_id: str) -> dict:
    return load_file(latest_checkpoint(runs / run_id) / "model.safetensors")


def _steps(runs: Path, run_id: str):
    with RunStore.open(runs / run_id, readonly=True) as store:
        return store.scalars_wide(), store.rollouts(), store.groups()


def _same_run(runs: Path, one: str, two: str, steps: int):
    wide1, roll1, _ = _steps(runs, one)
    wide2, roll2, _ = _steps(runs, two)
    assert wide1.index.tolist() == wide2.index.tolist() == list(range(1, steps + 1))
    for name in (names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE, names.TRAINABLE_RATIO):
        assert wide1[name].tolist() == wide2[name].tolist(), name
    assert wide1[names.GROUPS_TRAINABLE].sum() > 0  # the weights below moved
    np.testing.assert_allclose(roll1["total"], roll2["total"], rtol=0, atol=1e-12)
    w1, w2 = _weights(runs, one), _weights(runs, two)
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-9


def test_one_rank_and_two_train_the_same_qwen2_run(tmp_path):
    runs, config, model = tmp_path / "runs", _config(tmp_path), real_model.build(tmp_path / "models")
    sets = TINY + ["grpo.steps=3", f"model.path={model}"]
    _train_here("one", runs, sets, config)
    rc, out = _finish(_start(2, "two", runs, sets, config))
    assert rc == 0, out[-3000:]
    assert _meta(runs, "one")["ranks"] == 1 and _meta(runs, "two")["ranks"] == 2
    _same_run(runs, "one", "two", 3)
    start, moved = load_file(model / "model.safetensors"), _weights(runs, "two")
    assert all(float((moved[k] - start[k].double()).abs().max()) > 0 for k in moved)  # every weight trained


def _applied(proc, runs: Path, run_id: str, kind: str, payload: dict) -> int:
    """Send a request the dashboard's way, wait until the job applies it; the step it applied at."""
    rid = requests.send(runs / run_id, kind, payload)
    with RunStore.open(runs / run_id, readonly=True) as store:
        row = lambda: store.control().set_index("id").loc[rid]  # noqa: E731
        # "applying" is the claimed-but-not-yet-answered state between the two.
        _wait(proc, lambda: row()["status"] not in ("pending", "applying"), f"an answer to {kind}")
        assert row()["status"] == "applied", row()["message"]
        return int(row()["applied_step"])


def test_live_requests_apply_on_both_ranks_at_one_step_and_a_flat_rank_does_not_hang(tmp_path):
    """A weight change, a checkpoint, pause and resume, then a stop: each applied by both ranks
    at one step boundary (they compare what they hold at every boundary: a rank that missed one
    fails the run). Rank 1's groups never train (its metric is flat, drop_untrainable on)."""
    runs, config = tmp_path / "runs", _config(tmp_path, "flat_on_rank_1")
    proc = _start(2, "live", runs, TINY + ["grpo.steps=100000", "grpo.drop_untrainable=true"], config)
    try:
        _wait(proc, lambda: _last_step(runs, "live") >= 2, "step 2")
        at = _applied(proc, runs, "live", "set_weights", {"weights": {"m": 0.5}})
        saved = _applied(proc, runs, "live", "checkpoint", {})
        paused = _applied(proc, runs, "live", "pause", {})
        assert _meta(runs, "live")["status"] == "paused" and _last_step(runs, "live") == paused
        resumed = _applied(proc, runs, "live", "resume", {})
        _wait(proc, lambda: _last_step(runs, "live") >= resumed + 1, f"step {resumed + 1}")
        stopped = _applied(proc, runs, "live", "stop", {})
        rc, out = _finish(proc)
    finally:
        _kill(proc)
    assert rc == 0, out[-3000:]
    assert (runs / "live" / "checkpoints" / f"step-{saved:06d}").is_dir() and resumed == paused + 1
    wide, _, _ = _steps(runs, "live")
    weight = wide[names.metric_weight("m")]
    assert (weight.loc[:at - 1] == 1.0).all() and (weight.loc[at:] == 0.5).all()
    assert _meta(runs, "live")["status"] == "stopped" and wide.index[-1] == stopped
    assert latest_checkpoint(runs / "live").name == f"step-{stopped:06d}"
    # Rank 1's metric is flat: it never ran a backward while rank 0 did, and nothing hung.
    groups = _steps(runs, "live")[2]
    assert not groups[groups["group"] >= 2]["trainable"].any()  # rank 1's share: groups 2 and 3
    assert groups[groups["group"] < 2]["trainable"].any() and (wide[names.GRAD_NORM] > 0).any()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_killed_rank_fails_the_run_with_one_line(tmp_path, rank):
    runs = tmp_path / "runs"
    proc = _start(2, "kill", runs, TINY + ["grpo.steps=100000"], _config(tmp_path))
    try:
        _wait(proc, lambda: _last_step(runs, "kill") >= 2, "step 2")
        os.kill(_rank_pids(proc)[rank], signal.SIGKILL)
        rc, out = _finish(proc)
    finally:
        _kill(proc)
    assert rc != 0
    meta = _meta(runs, "kill")
    assert meta["status"] == "failed", (meta["status"], out[-3000:])
    with RunStore.open(runs / "kill", readonly=True) as store:
        failed = store.events(kinds=["lifecycle"])["payload"].tolist()[-1]
    assert failed["event"] == "failed" and failed["error"] == LOST_RANK == meta["error"]  # one line, both places


def test_sigterm_to_a_rank_stops_the_job_and_its_checkpoint_resumes_on_one_rank(tmp_path):
    """The built-in model on 2 ranks until SIGTERM to rank 1: both stop after the same step N,
    checkpointed once; its steps are the first N of the same run on 1 rank, and the checkpoint
    resumes on 1 rank to that run's step N + 2."""
    runs, config = tmp_path / "runs", _config(tmp_path)
    proc = _start(2, "two", runs, TINY + ["grpo.steps=100000"], config)
    try:
        _wait(proc, lambda: _last_step(runs, "two") >= 3, "step 3")
        os.kill(_rank_pids(proc)[1], signal.SIGTERM)
        rc, out = _finish(proc)
    finally:
        _kill(proc)
    assert rc == 0, out[-3000:]
    meta, stopped = _meta(runs, "two"), _last_step(runs, "two")
    assert meta["status"] == "stopped" and "SIGTERM (rank 1)" in meta["stop_message"] and meta["ranks"] == 2
    assert [p.name for p in (runs / "two" / "checkpoints").iterdir()] == [f"step-{stopped:06d}"]  # written once
    _train_here("one", runs, TINY + [f"grpo.steps={stopped + 2}", f"log.checkpoint_every={stopped}"], config)
    at_stop = {r: load_file(runs / r / "checkpoints" / f"step-{stopped:06d}" / "model.safetensors")
               for r in ("one", "two")}
    assert max(float((at_stop["one"][k] - at_stop["two"][k]).abs().max()) for k in at_stop["one"]) < 1e-9
    _train_here("two", runs, [f"grpo.steps={stopped + 2}"], resume=True)
    _same_run(runs, "one", "two", stopped + 2)
    meta = _meta(runs, "two")
    assert meta["status"] == "finished" and meta["ranks"] == 1
