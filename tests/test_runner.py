"""grpo_core.dashboard.processes: real trainer processes started, steered and stopped the way the
dashboard does it."""
import os
import subprocess
import sys
import tomllib

import pytest

from grpo_core.dashboard import processes
from grpo_core.errors import ConfigError, StoreError
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import pid_alive
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import synth_run, wait_for

SMALL = {"grpo": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 8},
         "model": {"warm_start_steps": 0}, "log": {"progress": False, "checkpoint_every": 0}}


def _small(steps: int, **grpo) -> dict:
    return {**SMALL, "grpo": {**SMALL["grpo"], "steps": steps, **grpo}}


def _meta(runs_dir, rid):
    with RunStore.open(runs_dir / rid, readonly=True) as s:
        return s.get_meta(), s.last_step()


def _status(runs_dir, rid):
    return list_runs(runs_dir).set_index("run_id").loc[rid, "status"]


# ---- bad input: one line, nothing created ------------------------------------------------------
@pytest.mark.parametrize("cfg, match", [
    ({"grpo": {"group_size": 1}}, "grpo.group_size must be >= 2"),
    ({"grpo": {"grup_size": 4}}, "did you mean 'group_size'"),
    ({"reward": {"weights": {"answer_f1": -1}}}, "reward.weights.answer_f1 must be >= 0"),
])
def test_bad_config_starts_nothing(runs_dir, cfg, match):
    with pytest.raises(ConfigError, match=match):
        processes.start_run(cfg, root=runs_dir)
    assert list(runs_dir.iterdir()) == []


def test_bad_or_taken_run_id_starts_nothing(runs_dir):
    with pytest.raises(StoreError, match="not allowed"):
        processes.start_run(SMALL, run_id="../escape", root=runs_dir)
    synth_run(runs_dir, "taken", 2).close()
    with pytest.raises(StoreError, match="already exists"):
        processes.start_run(SMALL, run_id="taken", root=runs_dir)
    with pytest.raises(StoreError, match="nothing to resume|still live"):
        processes.start_run(run_id="taken", root=runs_dir, resume=True)  # its "trainer" (us) is alive


# ---- real trainers -----------------------------------------------------------------------------
@pytest.mark.slow
def test_start_run_trains_to_the_end_detached(runs_dir):
    rid = processes.start_run(_small(4), root=runs_dir)
    run_dir = runs_dir / rid
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    assert cfg["grpo"]["steps"] == 4 and cfg["model"]["warm_start_steps"] == 0
    meta, _ = _meta(runs_dir, rid)
    pid = meta["launcher_pid"]
    assert meta["pid"] == pid and os.getpgid(pid) == pid  # its own session and process group
    wait_for(lambda: _status(runs_dir, rid) == "finished", 240, what="the run to finish")
    meta, last = _meta(runs_dir, rid)
    assert last == 4 and meta["pid"] == pid  # the trainer recorded the same process
    wait_for(lambda: not pid_alive(pid), 30, what="the trainer to exit")
    tail = processes.log_tail(rid, 3, root=runs_dir)
    assert 0 < len(tail.splitlines()) <= 3 and "finished at step 4" in processes.log_tail(rid, 50, root=runs_dir)


@pytest.mark.slow
def test_pause_resume_stop_then_resume_from_checkpoint_then_terminate(runs_dir):
    rid = processes.start_run(_small(2000), root=runs_dir)
    wait_for(lambda: (_meta(runs_dir, rid)[1] or 0) >= 2, 240, what="two steps")
    processes.pause_run(rid, root=runs_dir)
    wait_for(lambda: _status(runs_dir, rid) == "paused", 60, what="paused")
    held = _meta(runs_dir, rid)[1]
    wait_for(lambda: _meta(runs_dir, rid)[0]["heartbeat"] > _meta(runs_dir, rid)[0]["status_time"] + 2.5, 30,
             what="heartbeats while paused")
    assert _meta(runs_dir, rid)[1] == held and _status(runs_dir, rid) == "paused"  # alive, not stepping
    processes.resume_run(rid, root=runs_dir)
    wait_for(lambda: (_meta(runs_dir, rid)[1] or 0) > held, 60, what="steps after resume")
    processes.stop_run(rid, root=runs_dir)
    wait_for(lambda: _status(runs_dir, rid) == "stopped", 60, what="stopped")
    stopped_at = _meta(runs_dir, rid)[1]
    with pytest.raises(StoreError, match="stopped"):
        processes.pause_run(rid, root=runs_dir)  # a finished run takes no requests

    processes.start_run(run_id=rid, root=runs_dir, resume=True)  # from the checkpoint written at stop
    wait_for(lambda: (_meta(runs_dir, rid)[1] or 0) > stopped_at and _status(runs_dir, rid) == "running", 240,
             what="the resumed run to step")
    pid = _meta(runs_dir, rid)[0]["pid"]
    assert processes.terminate_run(rid, root=runs_dir, wait_s=60) is True
    assert not pid_alive(pid) and _status(runs_dir, rid) == "stopped"


@pytest.mark.slow
def test_a_trainer_that_cannot_start_shows_failed_with_its_error(runs_dir):
    rid = processes.start_run({**SMALL, "model": {"path": str(runs_dir / "no-such-model")}}, root=runs_dir)
    wait_for(lambda: _status(runs_dir, rid) == "failed", 240, what="failed")
    assert "no-such-model" in _meta(runs_dir, rid)[0]["error"]


def test_a_crash_before_the_trainer_records_anything_is_recorded_by_the_runner(runs_dir, monkeypatch):
    crash = [sys.executable, "-c", "import sys; print('ImportError: no module named torch'); sys.exit(3)"]
    monkeypatch.setattr(processes, "train_command", lambda *a, **k: crash)
    rid = processes.start_run(SMALL, root=runs_dir)
    wait_for(lambda: _status(runs_dir, rid) == "failed", 30, what="failed")
    assert _meta(runs_dir, rid)[0]["error"] == "trainer exited with code 3: ImportError: no module named torch"


def test_terminate_never_signals_a_process_that_is_not_our_trainer(runs_dir):
    store = synth_run(runs_dir, "r", 2)
    other = subprocess.Popen(["sleep", "60"])
    try:
        store.set_meta(pid=other.pid)
        assert processes.terminate_run("r", root=runs_dir, wait_s=1) is False
        assert other.poll() is None and _status(runs_dir, "r") == "running"
    finally:
        other.kill()
        other.wait()
    assert processes.terminate_run("r", root=runs_dir, wait_s=1) is False  # gone: nothing to signal
    assert _status(runs_dir, "r") == "stopped"  # ... and the run no longer shows as live


def test_demo_is_started_only_when_none_is_live(runs_dir, monkeypatch):
    started = []
    monkeypatch.setattr(processes, "start_run", lambda cfg, **kw: started.append((cfg, kw)) or "demo-new")
    synth_run(runs_dir, "demo-old", 2, status="finished").close()
    assert processes.start_demo_if_idle(runs_dir, ["grpo.steps=7"]) == ("demo-new", True)
    cfg, kw = started[0]
    assert cfg.grpo.steps == 7 and kw["prefix"] == "demo" and not cfg.log.progress
    synth_run(runs_dir, "demo-live", 2).close()  # running, heartbeat fresh, pid = this process
    assert processes.start_demo_if_idle(runs_dir) == ("demo-live", False)
    assert len(started) == 1


def test_serve_with_a_bad_demo_setting_exits_2_with_one_line_and_starts_nothing(runs_dir):
    out = subprocess.run([sys.executable, "-m", "grpo_core", "serve", "--port", "1", "--runs-dir", str(runs_dir),
                          "--set", "grpo.group_size=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: grpo.group_size must be >= 2") and "got 1" in lines[0]
    assert list_runs(runs_dir).empty


def test_each_demo_has_its_own_live_run_and_settings(runs_dir, monkeypatch):
    """The built-in demo and SmolLM2's are told apart by their run ids: a live SmolLM2 demo does not
    stand for the built-in one, nor the other way round; an unknown demo is one line."""
    started = []
    monkeypatch.setattr(processes, "start_run", lambda cfg, **kw: started.append((cfg, kw)) or "demo-smollm2-new")
    synth_run(runs_dir, "demo-live", 2).close()
    assert processes.start_demo_if_idle(runs_dir, which="smollm2") == ("demo-smollm2-new", True)
    cfg, kw = started[0]
    assert kw["prefix"] == "demo-smollm2" and cfg.model.path == "smollm2" and cfg.task.name == "arithmetic"
    assert cfg.reward.weights == {"math_answer": 1.0} and cfg.autopilot.enabled and cfg.eval.every > 0
    synth_run(runs_dir, "demo-smollm2-live", 2).close()
    assert processes.live_demo(runs_dir, "smollm2") == "demo-smollm2-live"
    assert processes.live_demo(runs_dir) == "demo-live"
    with pytest.raises(ConfigError, match="--demo 'smolm2': no such demo.*smollm2"):
        processes.demo_config(which="smolm2")
