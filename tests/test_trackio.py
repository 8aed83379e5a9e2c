"""Trackio: runs the real trackio package writes (in a child process, into a temporary
TRACKIO_DIR) import and are watched with TRL's names mapped, what was not logged left unknown,
and never called finished (trackio records no end); the embedded trainer's Trackio mirror
writes a project that trackio's own reader shows with our step scalars, and a trackio failure
disables the mirror, not the run."""
from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from grpo_core.errors import ConfigError
from grpo_core.integrations.follow import follow
from grpo_core.integrations.importers import import_path
from grpo_core.integrations.trackio_source import TrackioTail, read_trackio_path
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

pytest.importorskip("trackio")


@pytest.fixture
def tdir(tmp_path, monkeypatch):
    """trackio's folder for this test: children write there, project names resolve there."""
    d = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(d))
    return d


def child(code: str, *args, timeout: float = 120) -> str:
    """Run `code` in a new Python process (trackio reads TRACKIO_DIR when imported)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# TRL's GRPOTrainer logs through transformers' own TrackioCallback: one window every 2 steps, the
# last (step 5) inside the end-of-training summary, and TRL's profiling timings logged by trl.extras
# .profiling straight to trackio at the trainer's step.
TRL_VIA_CALLBACK = '''
import sys, trackio
from transformers import TrainerControl, TrainerState, TrainingArguments
from transformers.integrations.integration_utils import TrackioCallback

def window(step):
    return {"loss": 0.01 * step, "grad_norm": 0.5 + step, "learning_rate": 1e-6 * (6 - step),
            "num_tokens": 100.0 * step, "completions/mean_length": 7.0 + step, "rewards/has_e/mean": 0.1 * step, "rewards/has_e/std": 0.3,
            "reward": 0.1 * step, "reward_std": 0.25, "frac_reward_zero_std": 0.2 * (step % 3), "kl": 0.001 * step,
            "entropy": 2.0, "clip_ratio/region_mean": 0.0, "epoch": step / 5}

args = TrainingArguments(output_dir=sys.argv[1], project="trl-proj", run_name="grpo-run", max_steps=5,
                         logging_steps=2, report_to="none")
state, control, cb = TrainerState(max_steps=5), TrainerControl(), TrackioCallback()
cb.on_train_begin(args, state, control)
for step in range(1, 6):
    trackio.log({"profiling/Time taken: GRPOTrainer._prepare_inputs": 0.01 * step}, step=state.global_step)
    state.global_step = step
    if step % 2 == 0:
        cb.on_log(args, state, control, logs=window(step))
cb.on_log(args, state, control, logs={"train_runtime": 3.0, "train_samples_per_second": 1.0,
          "train_steps_per_second": 1.0, "total_flos": 0.0, "train_loss": 0.02, **window(5)})
cb.on_train_end(args, state, control)
'''


@pytest.mark.slow  # transformers' import alone takes seconds
def test_a_trl_run_logged_through_transformers_trackio_callback_imports_with_trl_names(tdir, tmp_path):
    child(TRL_VIA_CALLBACK, tmp_path / "out")
    rid = import_path("trackio", "trl-proj", root=tmp_path / "runs")  # the project's name, under TRACKIO_DIR
    with RunStore.open(tmp_path / "runs" / rid, readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide.index.tolist() == [2, 4, 5]  # train/global_step, not trackio's count of log calls
    for step in (2, 4, 5):
        row = wide.loc[step]
        assert row[names.REWARD] == pytest.approx(0.1 * step)
        assert row[names.FRAC_REWARD_ZERO_STD] == pytest.approx(0.2 * (step % 3))
        assert row[names.TRAINABLE_RATIO] == pytest.approx(1 - 0.2 * (step % 3))
        assert row[names.metric_mean("has_e")] == pytest.approx(0.1 * step)
        assert row[names.metric_batch_std("has_e")] == pytest.approx(0.3)
        assert row[names.LOSS_KL] == pytest.approx(0.001 * step) and row[names.GRAD_NORM] == pytest.approx(0.5 + step)
        assert row[names.COMPLETION_MEAN_LENGTH] == pytest.approx(7 + step)
    # Not logged, so unknown: no within-group reward std, no group counts (no num_generations in the config)
    assert names.REWARD_STD not in wide and names.GROUPS_SUBMITTED not in wide
    assert not any(c.startswith("trackio/profiling") for c in wide)
    rep = meta["import_report"]
    assert rep["skipped"]["row without train/global_step: its trackio step counts log calls, not trainer steps"] == 5
    assert "train_runtime" not in json.dumps(wide.columns.tolist())
    # trackio records no end: not "finished", although the last step is max_steps
    assert meta["status"] != "finished" and "records no end" in meta["status_detail"]
    cfg = meta["config"]
    assert cfg["source"] == "trackio" and cfg["trackio"]["run"] == "grpo-run" and cfg["trackio"]["style"] == "trl"
    assert cfg["grpo"]["steps"] == 5 and cfg["trackio"]["config"]["logging_steps"] == 2


LOG_RUNS = '''
import math, trackio
for run, scale in (("a", 1.0), ("b", 10.0)):
    trackio.init(project="plain", name=run, embed=False, auto_log_cpu=False, auto_log_gpu=False, config={"lr": 0.1})
    for step in range(3):
        trackio.log({"train/loss": scale * step, "odd": math.nan if step == 1 else step,
                     "note": "text", "tbl": trackio.Table(data=[[1, 2]], columns=["x", "y"])}, step=step)
    trackio.finish()
trackio.init(project="plain", name="a", embed=False, auto_log_cpu=False, auto_log_gpu=False)  # a second run named a
trackio.log({"train/loss": 99.0}, step=0)
trackio.finish()
'''


def test_runs_are_picked_by_name_or_id_never_guessed(tdir, tmp_path):
    child(LOG_RUNS)
    db = tdir / "plain.db"
    with pytest.raises(ConfigError, match=r"has 3 runs \(a, b, a\): pick one with --run NAME"):
        read_trackio_path(db)
    with pytest.raises(ConfigError, match="2 runs are named 'a'"):
        read_trackio_path(db, run="a")
    with pytest.raises(ConfigError, match="no run 'c'"):
        read_trackio_path("plain", run="c")
    b = read_trackio_path(tdir, run="b")  # the folder holding the one project
    assert sorted(b.scalars) == [0, 1, 2]
    assert [b.scalars[s]["trackio/train/loss"] for s in range(3)] == [0.0, 10.0, 20.0]
    assert math.isnan(b.scalars[1]["trackio/odd"]) and b.scalars[2]["trackio/odd"] == 2.0  # trackio's "NaN" string
    assert b.report.skipped["tbl: not a scalar (media or table): only scalars are imported"] == 3
    assert b.report.skipped["note: not a scalar (text or list): only scalars are imported"] == 3
    first_a = sqlite3.connect(db).execute("SELECT run_id FROM metrics WHERE run_name = 'a' ORDER BY id").fetchone()[0]
    a = read_trackio_path(db, run=first_a)
    assert [a.scalars[s]["trackio/train/loss"] for s in range(3)] == [0.0, 1.0, 2.0]
    assert a.config["trackio"]["config"] == {"lr": 0.1} and a.finished is False


def test_a_missing_project_or_a_file_that_is_not_trackios_says_so(tdir, tmp_path):
    child(LOG_RUNS)
    with pytest.raises(ConfigError, match=r"no Trackio project of that name in .*trackio \(projects there: plain;"):
        read_trackio_path("nope")
    bad = tmp_path / "x.db"
    bad.write_text("not sqlite at all, just text " * 40)
    with pytest.raises(ConfigError, match="x.db: not a Trackio project database"):
        read_trackio_path(bad)


# Logs one step (and a profiling row) each time the test writes a line; trackio's thread writes it.
STEP_ON_REQUEST = '''
import sys, trackio
trackio.init(project="live", name="r", embed=False, auto_log_cpu=False, auto_log_gpu=False,
             config={"output_dir": "o", "logging_steps": 1, "max_steps": 100})
for line in sys.stdin:
    step = int(line)
    trackio.log({"train/frac_reward_zero_std": 0.25, "train/reward": step / 10, "train/global_step": step})
    trackio.log({"profiling/Time taken: x": 0.1}, step=step)
    print("logged", step, flush=True)
trackio.finish()
'''


def wait_for(cond, what: str, limit_s: float = 60):
    """Poll until cond() is true (progress, not a guessed duration); fail after limit_s."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_watch_reads_only_new_rows_while_trackio_writes(tdir, tmp_path):
    code = textwrap.dedent(STEP_ON_REQUEST)
    writer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=os.environ.copy())
    try:
        def log_step(step):
            writer.stdin.write(f"{step}\n")
            writer.stdin.flush()
            while not writer.stdout.readline().startswith("logged"):  # trackio prints its own lines too
                assert writer.poll() is None, "the trackio writer exited"

        log_step(1)
        db = tdir / "live.db"
        wait_for(db.exists, "trackio's project db")
        tail = None

        def tail_has(step):
            nonlocal tail
            if tail is None:
                try:
                    tail = TrackioTail(db)
                except ConfigError:  # no run with metrics yet
                    return False
            tail.poll()
            return step in tail.run().scalars

        wait_for(lambda: tail_has(1), "step 1")
        assert tail.take() == [1]
        # A reader holding a read transaction open does not block the writer (WAL, read-only).
        reader = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM metrics").fetchone()
        for step in range(2, 6):
            log_step(step)
            wait_for(lambda: tail_has(step), f"step {step}")
            assert tail.take() == [step]  # only the new step changed
        reader.rollback()
        reader.close()
        rows_before, bytes_before = tail.reader.rows_read, tail.reads.bytes
        assert tail.poll() is False and tail.take() == []  # nothing new: no row and no byte read
        assert (tail.reader.rows_read, tail.reads.bytes) == (rows_before, bytes_before)
        assert rows_before == 10  # every row read once: 5 steps + 5 profiling rows
        run = tail.run()
        assert sorted(run.scalars) == [1, 2, 3, 4, 5] and run.ended is False
        assert run.scalars[3][names.TRAINABLE_RATIO] == 0.75 and run.scalars[3][names.REWARD] == pytest.approx(0.3)
        rid = follow("trackio", "live", root=tmp_path / "runs", every_s=0.01, max_polls=2, run="r")  # by project name
        with RunStore.open(tmp_path / "runs" / rid, readonly=True) as s:
            assert s.scalars_wide().index.tolist() == [1, 2, 3, 4, 5]
            assert s.get_meta()["status"] == "running"  # no end record: the heartbeat ages into stale
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)


# ---- the mirror -------------------------------------------------------------------------------------
MIRROR = '''
import json, sys, warnings
import numpy as np
from grpo_core.integrations.trackio_mirror import TrackioMirror
from grpo_core.runs import names
rng = np.random.default_rng(0)
mirror = TrackioMirror("mirror-proj", "run-m", {"grpo": {"steps": 6, "group_size": 2}})
logged = {}
for step in range(1, 7):
    scalars = {names.REWARD: float(rng.random()), names.TRAINABLE_RATIO: float(rng.random()),
               names.GROUPS_SUBMITTED: 4.0, names.GROUPS_TRAINABLE: float(rng.integers(0, 5)),
               names.metric_weight("exact"): 0.5, names.TIME_STEP: float(rng.random())}
    mirror.log_step(step, scalars)
    logged[step] = scalars
mirror.event("alert", {"kind": "low_ratio", "severity": "critical", "message": "ratio 0.1 < 0.3"}, 4)
mirror.event("change", {"kind": "set_weights", "request": {"weights": {"exact": 1.0}}}, 5)
mirror.finish()
print(json.dumps({"error": mirror.error, "logged": logged}))
'''


def test_mirror_round_trip_through_trackios_own_reader(tdir, tmp_path):
    out = json.loads(child(MIRROR).splitlines()[-1])
    assert out["error"] is None
    logged = {int(k): v for k, v in out["logged"].items()}
    # trackio's own reader API sees our steps and scalars
    seen = json.loads(child('''
        import json, trackio
        from trackio.sqlite_storage import SQLiteStorage
        runs = trackio.Api().runs("mirror-proj")
        print(json.dumps({"runs": [r.name for r in runs], "config": runs[0].config,
                          "logs": SQLiteStorage.get_logs("mirror-proj", "run-m"),
                          "alerts": [(a["title"], a["level"]) for a in runs[0].alerts()]}, default=str))
    ''').splitlines()[-1])
    assert seen["runs"] == ["run-m"] and seen["config"]["grpo_health"]["run_id"] == "run-m"
    assert {e["step"]: {k: e[k] for k in logged[e["step"]]} for e in seen["logs"]} == logged
    assert sorted(map(tuple, seen["alerts"])) == [("GRPO health: low_ratio at step 4", "error"),
                                                 ("set_weights applied at step 5", "info")]
    # and our importer reads it back as ours: the same numbers under the same names
    back = read_trackio_path("mirror-proj")
    assert back.config["trackio"]["style"] == "grpo_core" and back.config["grpo"] == {"steps": 6, "group_size": 2}
    assert {s: {k: back.scalars[s][k] for k in logged[s]} for s in logged} == logged


def test_a_trackio_failure_disables_the_mirror_not_the_run(tdir, tmp_path, monkeypatch):
    out = child('''
        import warnings
        from grpo_core.integrations.trackio_mirror import TrackioMirror
        mirror = TrackioMirror("p", "failing", {})
        def boom(*a, **k):
            raise OSError("disk full")
        mirror.run.log = boom
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            mirror.log_step(1, {"train/reward": 1.0})
            mirror.log_step(2, {"train/reward": 1.0})  # a no-op now, no second warning
            mirror.event("alert", {"kind": "x"}, 2)
            mirror.finish()
        print([str(x.message) for x in w if issubclass(x.category, RuntimeWarning)], mirror.error, mirror.run)
    ''')
    assert out.strip().splitlines()[-1] == \
        "['Trackio mirror disabled after an error: OSError: disk full'] OSError: disk full None"
    # trackio cannot write where it keeps projects: it would only warn from its thread; the mirror says so
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TRACKIO_DIR", str(blocker / "trackio"))
    out = child('''
        import warnings
        warnings.simplefilter("ignore")
        from grpo_core.integrations.trackio_mirror import TrackioMirror
        mirror = TrackioMirror("p", "r", {})
        mirror.log_step(1, {"train/reward": 1.0})
        mirror.finish()
        print(mirror.error)
    ''')
    assert "Not a directory" in out.strip().splitlines()[-1]


def test_a_bad_project_name_or_no_trackio_is_one_line(tmp_path):
    from grpo_core.integrations.trackio_mirror import TrackioMirror
    with pytest.raises(ConfigError, match="log.trackio must be a trackio project name"):
        TrackioMirror("  ", "r")


@pytest.mark.slow
def test_the_embedded_trainer_mirrors_every_step_to_trackio(tdir, runs_dir):
    args = [sys.executable, "-m", "grpo_core", "train", "--run-id", "to-trackio", "--runs-dir", str(runs_dir),
            "--set", "grpo.steps=4", "--set", "grpo.prompts_per_step=2", "--set", "grpo.group_size=4",
            "--set", "grpo.max_new_tokens=8", "--set", "model.warm_start_steps=0", "--set", "log.checkpoint_every=0",
            "--set", "log.progress=false", "--set", "log.trackio=grpo-health-test"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-2000:]
    with RunStore.open(runs_dir / "to-trackio", readonly=True) as s:
        ours, meta = s.scalars_wide(), s.get_meta()
    assert meta["status"] == "finished"
    seen = json.loads(child('''
        import json
        from trackio.sqlite_storage import SQLiteStorage
        print(json.dumps(SQLiteStorage.get_logs("grpo-health-test", "to-trackio")))
    ''').splitlines()[-1])
    assert [e["step"] for e in seen] == [1, 2, 3, 4]
    for e in seen:
        for name in (names.TRAINABLE_RATIO, names.REWARD, names.CUM_GROUPS_TRAINABLE, names.metric_weight("exact")):
            assert e[name] == pytest.approx(ours.loc[e["step"], name], rel=1e-6)


REAL_TRL = '''
import json, sys
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

def has_e(completions, **kw):
    return [float("e" in c) for c in completions]

def length(completions, **kw):
    return [len(c) / 8 for c in completions]

model_dir, out = sys.argv[1:3]
args = GRPOConfig(output_dir=out, per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                  max_steps=5, logging_steps=2, report_to="trackio", project="real-trl", run_name="tiny",
                  use_cpu=True, save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0)
trainer = GRPOTrainer(model=model_dir, reward_funcs=[has_e, length], args=args,
                      train_dataset=Dataset.from_list([{"prompt": f"q{i}:"} for i in range(64)]),
                      processing_class=AutoTokenizer.from_pretrained(model_dir))
trainer.train()
print(json.dumps(trainer.state.log_history))
'''


@pytest.mark.slow
def test_a_real_trl_grpo_run_with_report_to_trackio_imports_step_by_step(tdir, tmp_path):
    from tests.test_trl_integration import build_tiny_model
    model_dir = build_tiny_model(tmp_path / "model")
    history = json.loads(child(REAL_TRL, model_dir, tmp_path / "out", timeout=600).splitlines()[-1])
    logged = {e["step"]: e for e in history if "frac_reward_zero_std" in e}
    assert sorted(logged) == [2, 4, 5]  # the last window (step 5) TRL logs with its end-of-training summary
    rid = import_path("trackio", tdir / "real-trl.db", root=tmp_path / "runs")
    with RunStore.open(tmp_path / "runs" / rid, readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide.index.tolist() == [2, 4, 5]
    for step, e in logged.items():
        assert wide.loc[step, names.TRAINABLE_RATIO] == pytest.approx(1 - e["frac_reward_zero_std"], abs=1e-9)
        assert wide.loc[step, names.REWARD] == pytest.approx(e["reward"], abs=1e-9)
        for fn in ("has_e", "length"):
            assert wide.loc[step, names.metric_mean(fn)] == pytest.approx(e[f"rewards/{fn}/mean"], abs=1e-9)
    # TRL's config in the trackio run: 8 completions / 4 generations = 2 groups per step
    assert wide.loc[2, names.GROUPS_SUBMITTED] == 2 * 2  # the entry covers 2 steps
    assert meta["config"]["grpo"]["group_size"] == 4 and meta["config"]["reward"]["metrics"] == ["has_e", "length"]
    assert meta["status"] != "finished"


def test_both_mirrors_on_are_fed_as_one():
    from grpo_core.integrations.trackio_mirror import Mirrors, together
    calls = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def stored_step(self, store, step, scalars, groups, rollouts):
            calls.append((self.name, step))

        def finish(self):
            calls.append((self.name, "finish"))

    one, two = Recorder("trackio"), Recorder("wandb")
    assert together(None, None) is None and together(None, two) is two
    both = together(one, two)
    assert isinstance(both, Mirrors)
    both.stored_step(None, 3, {}, None, None)
    both.finish()
    assert calls == [("trackio", 3), ("wandb", 3), ("trackio", "finish"), ("wandb", "finish")]
