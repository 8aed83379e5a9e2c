"""The CLI: `python -m grpo_core ...` as a user runs it (subprocess), and its error paths
in-process. Bad input exits 2 with one line on stderr, never a traceback."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_core.__main__ import main
from grpo_core.analysis import step_stats
from grpo_core.runs import names, run_meta, store

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {"answer_f1": 0.4, "exact": 0.3, "format": 0.1}


def cli(*args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "grpo_core", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def live_run(runs_dir):
    """A running run with two logged steps: 8 groups, 3 then 5 trainable."""
    s = store.RunStore.create("live-1", {"reward": {"weights": WEIGHTS}, "grpo": {"steps": 50}})
    s.set_status(run_meta.RUNNING, pid=os.getpid())
    cum = (0, 0)
    for step, t in enumerate([3, 5]):
        totals = np.zeros((8, 4))
        totals[:t] = [0.0, 1.0, 0.5, 1.0]
        scores = np.repeat(totals[..., None], 3, axis=-1)
        scal = step_stats.step_scalars(step_stats.group_stats(totals, scores), scores, list(WEIGHTS), WEIGHTS, *cum)
        cum = scal[names.CUM_GROUPS_SUBMITTED], scal[names.CUM_GROUPS_TRAINABLE]
        s.log_step(step, scal)
    s.close()
    return "live-1"


def one_error_line(stderr: str, *parts: str):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    for p in parts:
        assert p in lines[0], lines[0]


# ---- as a user runs it ---------------------------------------------------------------------------
@pytest.mark.slow
def test_help():
    r = cli("--help")
    assert r.returncode == 0 and r.stderr == ""
    for sub in ("train", "pilot", "report", "import", "status", "control", "runs", "config"):
        assert sub in r.stdout
    r = cli("control", "--help")
    assert r.returncode == 0 and "set-weights" in r.stdout


@pytest.mark.slow
def test_status_control_and_runs_on_a_real_store(live_run, runs_dir):
    r = cli("status", live_run, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["run_id"] == live_run and out["status"] == run_meta.RUNNING and out["last_step"] == 1
    assert out["steps"] == 50 and out["pending_requests"] == 0
    assert out[names.TRAINABLE_RATIO] == 5 / 8 and out[names.CUM_TRAINABLE_RATIO] == 8 / 16
    assert out[names.CUM_GROUPS_SUBMITTED] == 16 and out[names.CUM_GROUPS_TRAINABLE] == 8

    r = cli("control", live_run, "set-weights", "answer_f1=0.5", "exact=0.2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("request 1 sent: set-weights")
    with store.RunStore.open(live_run, readonly=True) as s:
        ctl = s.control()
    assert ctl[["kind", "status", "source"]].values.tolist() == [["set_weights", "pending", "cli"]]
    assert ctl["payload"].iloc[0] == {"weights": {"answer_f1": 0.5, "exact": 0.2}}

    r = cli("status", runs_dir / live_run)  # a run dir works as well as an id
    assert r.returncode == 0 and "pending_requests: 1" in r.stdout and f"{names.TRAINABLE_RATIO}: 0.625" in r.stdout

    (runs_dir / "broken").mkdir()
    (runs_dir / "broken" / "run.db").write_text("garbage")
    r = cli("runs")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert set(rows) == {live_run, "broken"}
    assert "running" in rows[live_run] and " 1 " in rows[live_run] and " 50 " in rows[live_run]
    assert "unreadable" in rows["broken"] and "not a readable run store" in rows["broken"]


@pytest.mark.slow
@pytest.mark.parametrize("args,parts", [
    (["control", "live-1", "set-weights", "exakt=0.5"], ["reward.weights.exakt: unknown metric", "'exact'"]),
    (["control", "live-1", "set-weights", "exact=nan"], ["reward.weights.exact must be finite"]),
    (["control", "no-such-run", "set-weights", "exact=0.5"], ["no run store at"]),
    (["status", "no-such-run"], ["no run store at"]),
])
def test_bad_input_exits_2_with_one_line(live_run, args, parts):
    r = cli(*args)
    assert r.returncode == 2 and r.stdout == ""
    one_error_line(r.stderr, *parts)
    with store.RunStore.open(live_run, readonly=True) as s:
        assert s.control().empty  # nothing was sent


@pytest.mark.slow
def test_config_lists_every_knob():
    r = cli("config")
    assert r.returncode == 0
    from grpo_core.runs.config import describe
    keys = [line.split()[0] for line in r.stdout.splitlines()]
    assert keys == [k for k, _, _ in describe()] and "grpo.group_size" in keys


# ---- the same paths in-process (fast) ---------------------------------------------------------------
@pytest.mark.parametrize("args,parts", [
    (["control", "live-1", "set-weights", "exakt=0.5"], ["unknown metric (did you mean 'exact'?)"]),
    (["control", "live-1", "set-weights", "exact=nan"], ["must be finite, got nan"]),
    (["control", "live-1", "set-weights", "exact=-1"], ["must be >= 0"]),
    (["control", "live-1", "set-weights", "exact=0", "format=0"], ["all zero"]),
    (["control", "live-1", "set-weights", "exact=abc"], ["weight for 'exact' must be a number, got 'abc'"]),
    (["control", "live-1", "set-weights", "exact"], ["set-weights expects name=value"]),
    (["control", "live-1", "set-weights"], ["set-weights needs name=value pairs"]),
    (["control", "live-1", "set-threshold", "2"], ["min_group_std must be a number in [0, 1), got 2.0"]),
    (["control", "live-1", "set-threshold", "x"], ["set-threshold value must be a number, got 'x'"]),
    (["control", "live-1", "set-difficulty", "9"], ["level must be an integer from 1 to 4, got 9.0"]),
    (["control", "live-1", "pause", "now"], ["pause takes no values, got 'now'"]),
    (["control", "../live-1", "pause"], ["run id '../live-1' is not allowed"]),
    (["control", "missing", "stop"], ["no run store at"]),
    (["status", "missing"], ["no run store at"]),
])
def test_bad_input_in_process(live_run, capsys, args, parts):
    assert main(args) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    one_error_line(cap.err, *parts)


def test_control_requests_in_process(live_run, capsys):
    assert main(["control", live_run, "set-threshold", "0"]) == 0
    assert main(["control", live_run, "set-difficulty", "3"]) == 0
    assert main(["control", live_run, "pause"]) == 0
    with store.RunStore.open(live_run) as s:
        ctl = s.control()
        assert ctl["kind"].tolist() == ["set_threshold", "set_difficulty", "pause"]
        assert ctl["payload"].tolist() == [{"min_group_std": 0.0}, {"level": 3}, {}]
        s.set_status(run_meta.FINISHED)
    capsys.readouterr()
    assert main(["control", live_run, "resume"]) == 2
    one_error_line(capsys.readouterr().err, "is finished: control requests apply only to a live run")


def test_status_and_runs_on_unreadable_store(runs_dir, capsys):
    (runs_dir / "half").mkdir()
    (runs_dir / "half" / "run.db").write_bytes(b"SQLite format 3\x00" + b"\x00" * 50)
    assert main(["status", "half"]) == 2
    one_error_line(capsys.readouterr().err, "half/run.db")
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert "half" in out and "unreadable" in out
    (runs_dir / "half" / "run.db").unlink()
    assert main(["runs"]) == 0 and "no runs yet" in capsys.readouterr().out
