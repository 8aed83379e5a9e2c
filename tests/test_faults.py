"""Faults, black-box: the real trainer (`python -m grpo_core train`) SIGKILLed at random and
targeted moments, a disk that fills up, a runs dir that cannot be written, damaged stores.

After every kill: the store opens and passes integrity_check, holds every committed step
whole (each step's groups and rollouts, steps contiguous from 1; none the store showed before the kill is lost,
but for those a resume redoes after its checkpoint), shows stale within 10 s,
every checkpoint folder under its final name is complete, and `--resume` continues from
the newest complete checkpoint. GRPO_HEALTH_FAULT_KILLS=20 runs the 20-kill version
(docs/reliability.md has its numbers); the default suite does 5.
Streamlit restarted during a run: tests/test_browser_live.py
(test_closing_the_browser_and_restarting_streamlit_leave_the_trainer_alone).
"""
from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_core.__main__ import main
from grpo_core.analysis import report
from grpo_core.errors import StoreError
from grpo_core.runs import names as run_names
from grpo_core.runs import run_index, store
from tests.helpers_dashboard import REPO, app_test, live_charts, synth_run, wait_for

P, G = 2, 4
SMALL = ["grpo.steps=400", f"grpo.prompts_per_step={P}", f"grpo.group_size={G}", "grpo.max_new_tokens=8",
         "model.warm_start_steps=0", "log.progress=false", "log.checkpoint_every=1"]
TINY_MODEL = ["model.hidden_size=32", "model.intermediate_size=64"]  # small checkpoints for the disk tests
# The kill test: 8 x 8 rollouts of 16 tokens, so a step is mostly generate (~50%) and backward (~35%),
# with a checkpoint every 2 steps (~10%): a random moment lands where a real run spends its time.
KP, KG = 8, 8
KILL_RUN = [f"grpo.prompts_per_step={KP}", f"grpo.group_size={KG}", "grpo.max_new_tokens=16",
            "log.checkpoint_every=2"]
KILLS = int(os.environ.get("GRPO_HEALTH_FAULT_KILLS", "5"))
MODES = ["random", "checkpoint", "store-write", "startup", "random"]
CKPT_FILES = ("config.json", "model.safetensors", "state.pt", "tokenizer.json")
REPORT = os.environ.get("GRPO_HEALTH_FAULT_REPORT")  # a path: write each kill's record there as JSON (for the docs)


SPAWNED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_trainer_left_behind():
    yield
    while SPAWNED:  # a failed test must not leave a 400-step trainer running
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def spawn(root: Path, run_id: str, *, resume=False, sets=(), preexec=None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", run_id, "--runs-dir", str(root)]
    cmd += ["--resume"] if resume else [a for s in SMALL + list(sets) for a in ("--set", s)]
    log = open(root / f"{run_id}.cli.log", "ab")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,
                            env={**os.environ, "GRPO_HEALTH_RUNS_DIR": str(root), "GRPO_HEALTH_TORCH_THREADS": "1"})
    log.close()
    SPAWNED.append(proc)
    return proc


def read(root: Path, run_id: str):
    return store.RunStore.open(root / run_id, readonly=True)


def last_step(root, run_id) -> int:
    try:
        with read(root, run_id) as s:
            return s.last_step() or 0
    except StoreError:
        return 0


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps of checkpoint folders under their final name; each must be complete."""
    root = run_dir / "checkpoints"
    steps = []
    for d in sorted(root.glob("step-*")) if root.is_dir() else []:
        missing = [f for f in CKPT_FILES if not (d / f).is_file()]
        assert not missing, f"{d.name} is visible but lacks {missing}"
        steps.append(int(d.name.split("-")[1]))
    return sorted(steps)


def assert_whole_steps(root: Path, run_id: str, P: int = P, G: int = G) -> int:
    """integrity_check ok; steps 1..N each with P groups, P*G rollouts and the same scalar names."""
    with store.RunStore.open(root / run_id) as s:  # read-write open, as a resuming trainer does
        assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        steps = [r[0] for r in s.conn.execute("SELECT DISTINCT step FROM scalars ORDER BY step")]
        assert steps == list(range(1, len(steps) + 1)), steps
        groups = dict(s.conn.execute("SELECT step, COUNT(*) FROM groups GROUP BY step").fetchall())
        rolls = dict(s.conn.execute("SELECT step, COUNT(*) FROM rollouts GROUP BY step").fetchall())
        # The periodic template-collapse check adds its own names every health.collapse_every steps.
        periodic = (run_names.COLLAPSE_RETRIEVAL, run_names.COLLAPSE_CHANCE, run_names.COLLAPSE_SKILL,
                    run_names.COLLAPSE_MI, run_names.TIME_COLLAPSE)
        names = {n for (n,) in s.conn.execute("SELECT COUNT(*) FROM scalars WHERE name NOT IN (?, ?, ?, ?, ?) "
                                              "GROUP BY step", periodic)}
        assert all(groups.get(k) == P and rolls.get(k) == P * G for k in steps), (groups, rolls)
        assert len(names) <= 1, names  # every step has the same scalars
    return len(steps)


def resumes(root, run_id) -> list[dict]:
    with read(root, run_id) as s:
        return [p for p in s.events(kinds=["lifecycle"])["payload"] if p.get("event") == "resumed"]


def wait_new_step(root, run_id, after: int, proc, timeout=120):
    wait_for(lambda: last_step(root, run_id) > after or proc.poll() is not None, timeout, every=0.05,
             what="a new step")
    assert proc.poll() is None, (root / f"{run_id}.cli.log").read_text()[-2000:]


def kill_at(mode: str, root: Path, rid: str, proc, rng: random.Random) -> str:
    """Wait for the moment `mode` names, SIGKILL; returns what the kill interrupted."""
    run_dir, ckpts = root / rid, root / rid / "checkpoints"
    if mode == "startup":  # imports, model load, checkpoint load or the first step
        time.sleep(rng.uniform(0.5, 6.0))
        what = "start-up"
    else:
        wait_new_step(root, rid, last_step(root, rid), proc)
        if mode == "checkpoint":  # the moment this trainer's checkpoint temp folder appears
            deadline = time.time() + 60
            while not any(ckpts.glob(f".tmp-*-{proc.pid}")) and time.time() < deadline and proc.poll() is None:
                pass
            what = "checkpoint write"
        elif mode == "store-write":  # the moment the WAL changes (a step or heartbeat commit)
            wal = run_dir / "run.db-wal"
            st = lambda: (wal.stat().st_size, wal.stat().st_mtime_ns) if wal.exists() else None  # noqa: E731
            before, deadline = st(), time.time() + 30
            while st() == before and time.time() < deadline:
                pass
            what = "store write"
        else:  # anywhere in the next few steps (a step is ~0.15 s on an idle core)
            time.sleep(rng.uniform(0, 0.5))
            what = "random"
    os.kill(proc.pid, signal.SIGKILL)
    if any(ckpts.glob(f".tmp-*-{proc.pid}")):
        what += " (inside a checkpoint write: its temp folder is left half-written)"
    return what


@pytest.mark.slow
@pytest.mark.timeout(300 + 45 * KILLS)
def test_sigkill_at_random_moments_never_loses_a_step_or_loads_a_half_checkpoint(runs_dir):
    rng = random.Random(1234)
    rid, records = "killed", []
    proc = spawn(runs_dir, rid, sets=KILL_RUN)
    wait_new_step(runs_dir, rid, 0, proc, timeout=180)
    resumed_at = None  # the checkpoint step the running trainer resumes from (None: a fresh start)
    for i in range(KILLS):
        mode = MODES[i % len(MODES)]
        if mode != "startup":
            # `or None`: an empty list counts as found in wait_for; a kill inside the first checkpoint
            # write would leave nothing to resume from (seen on a loaded box)
            wait_for(lambda: complete_checkpoints(runs_dir / rid) or None, 60, what="a first checkpoint")
        seen = last_step(runs_dir, rid)
        if mode == "startup" and resumed_at is not None:
            # a resume truncates the steps after its checkpoint (it redoes them) before it records
            # the event; a start-up kill can land after that, so only the checkpoint's steps are owed
            seen = min(seen, resumed_at)
        what = kill_at(mode, runs_dir, rid, proc, rng)
        t_kill = time.time()
        # the dashboard's view, before anyone reaps the process (a zombie is not a live trainer)
        status = wait_for(lambda: (st := run_index.list_runs(runs_dir).set_index("run_id").loc[rid, "status"]) in
                          ("stale", "failed") and st, 10, every=0.05, what="stale or failed")
        stale_s = time.time() - t_kill
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        steps = assert_whole_steps(runs_dir, rid, KP, KG)
        assert steps >= seen  # no finished step lost
        ckpts = complete_checkpoints(runs_dir / rid)
        half = sorted(p.name for p in (runs_dir / rid / "checkpoints").glob(".tmp-*"))
        n_before = len(resumes(runs_dir, rid))
        proc, resumed_at = spawn(runs_dir, rid, resume=True), ckpts[-1]
        resumed = lambda: (resumes(runs_dir, rid)[n_before:] or [None])[0]  # noqa: E731
        if MODES[(i + 1) % len(MODES)] == "startup" and i + 1 < KILLS:
            ev = None  # the next kill may land before the resume is recorded: checked on the one after
        else:
            ev = wait_for(resumed, 120, what="the resumed event")
            assert Path(ev["from"]).name == f"step-{ckpts[-1]:06d}"  # the newest complete one, never a temp
            assert ev["steps_redone"] == steps - ckpts[-1]
        records.append({"kill": i + 1, "mode": mode, "interrupted": what, "steps_before": steps,
                        "checkpoints": ckpts, "temp_folders": half, "shown": status,
                        "shown_after_s": round(stale_s, 2), "resumed_from": ev and Path(ev["from"]).name})
    # the last resume trains on and stops cleanly; the temp folders of killed trainers are gone
    before = last_step(runs_dir, rid)
    wait_new_step(runs_dir, rid, before, proc, timeout=180)
    assert main(["control", str(runs_dir / rid), "stop"]) == 0
    assert proc.wait(timeout=120) == 0
    assert run_index.list_runs(runs_dir).set_index("run_id").loc[rid, "status"] == "stopped"
    final = assert_whole_steps(runs_dir, rid, KP, KG)
    assert not list((runs_dir / rid / "checkpoints").glob(".tmp-*"))
    if REPORT:  # with where a step's time goes, i.e. where a random kill lands
        with read(runs_dir, rid) as s:
            t = s.scalars_wide()[["time/step_s", "time/generate_s", "time/score_s", "time/train_s", "time/log_s"]]
        Path(REPORT).write_text(json.dumps({"kills": records, "final_steps": final,
                                            "time_per_step": t.median().round(4).to_dict()}, indent=1))
    assert len(records) == KILLS and max(r["shown_after_s"] for r in records) < 10


# ---- a bug: one line in the store, on the terminal and in the report; the traceback in trainer.log ----------
# A custom metric module is imported by the trainer itself (preflight), so its import can plant a bug in the
# real process started exactly as a user starts one: at start-up (an engine that does not load, as vLLM's
# "Engine core initialization failed") or at step 3 (a KeyError deep in a step).
FAULTY_METRIC = """
import os
from grpo_core.train.trainer import Trainer


def short(completion, example):
    return float(len(completion.strip()) <= 2)


def fail_to_start(self):
    raise RuntimeError("\\nEngine core initialization failed. See root cause above.\\nFailed core proc(s): {}")


train_step = Trainer.train_step


def fail_at_step_3(self, *args, **kwargs):
    if self.step == 2:
        raise KeyError("rollout 7")
    return train_step(self, *args, **kwargs)


if os.environ["FAULT_AT"] == "start":
    Trainer.prepare_model = fail_to_start
else:
    Trainer.train_step = fail_at_step_3
"""
FAULT_RUN = ["grpo.steps=5", f"grpo.prompts_per_step={P}", f"grpo.group_size={G}", "grpo.max_new_tokens=8",
             "model.warm_start_steps=0", "log.progress=false", "log.checkpoint_every=0"] + TINY_MODEL


@pytest.mark.parametrize("verb, fault_at, line", [
    ("train", "start", "RuntimeError: Engine core initialization failed. See root cause above."),
    ("train", "step", "KeyError: 'rollout 7'"),
    ("pilot", "step", "KeyError: 'rollout 7'")])
def test_a_bug_is_one_line_everywhere_and_its_traceback_is_in_the_runs_log(tmp_path, verb, fault_at, line):
    (tmp_path / "faulty.py").write_text(FAULTY_METRIC)
    (tmp_path / "run.toml").write_text('[reward.custom]\nshort = "faulty:short"\n')
    runs, rid = tmp_path / "runs", f"{verb}-{fault_at}"
    cmd = [sys.executable, "-m", "grpo_core", verb, "--config", str(tmp_path / "run.toml"), "--run-id", rid,
           "--runs-dir", str(runs)] + [a for s in FAULT_RUN for a in ("--set", s)]
    env = {**os.environ, "FAULT_AT": fault_at, "GRPO_HEALTH_TORCH_THREADS": "1"}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    log = runs / rid / "trainer.log"
    stored = f"{line} (traceback in {log})"  # the exception's type and first meaningful line, and where to read on
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1] == f"error: {stored}", r.stderr[-3000:]
    with read(runs, rid) as s:
        meta, failed = s.get_meta(), s.events(kinds=["lifecycle"])["payload"].tolist()
        assert meta["status"] == "failed" and meta["error"] == stored
        assert s.last_step() == (None if fault_at == "start" else 2)  # the steps before the bug are kept
    if fault_at == "step":
        assert failed[-1] == {"event": "failed", "error": stored}
    assert run_index.list_runs(runs).set_index("run_id").loc[rid, "error"] == stored
    text = log.read_text()  # the whole traceback, once, in the run's folder
    assert text.count("Traceback (most recent call last)") == 1
    assert ("in fail_to_start" if fault_at == "start" else "in fail_at_step_3") in text
    assert "Failed core proc(s)" in text if fault_at == "start" else "KeyError: 'rollout 7'" in text
    notices = [n.text for n in report.build_report(runs / rid).notices if n.level == "error"]
    assert len(notices) == 1 and f": {stored}. " in notices[0], notices


# ---- disk full (RLIMIT_FSIZE) and a runs dir that cannot be written ---------------------------------------
def file_size_limit(nbytes: int):
    """preexec_fn: no file may grow past nbytes (EFBIG; Python ignores SIGXFSZ), like a full disk."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_a_kill_while_a_checkpoint_is_deleted_leaves_no_half_checkpoint(tmp_path, monkeypatch):
    """The test above once found a step's folder visible without its tokenizer: the trainer was
    killed while deleting an old checkpoint, file by file. A checkpoint that goes is renamed out
    of sight first, so such a kill leaves a hidden .tmp- folder (no checkpoint lists it, the next
    trainer's write removes it) and every folder under a step's name stays complete."""
    import shutil

    from grpo_core.runs.config import ModelConfig
    from grpo_core.train import checkpoints, models
    tokenizer = models.build_tokenizer()
    model = models.build_tiny_model(ModelConfig(), tokenizer)
    for step in (2, 4):
        checkpoints.write_checkpoint(tmp_path, step, model, tokenizer, {})
    real_rmtree = shutil.rmtree

    def killed(path, ignore_errors=False):  # the trainer dies after deleting one file of `path`
        if Path(path).exists():
            (Path(path) / "tokenizer.json").unlink()  # as the test above found it
            raise SystemExit("killed")
    monkeypatch.setattr(checkpoints.shutil, "rmtree", killed)
    with pytest.raises(SystemExit):
        checkpoints.write_checkpoint(tmp_path, 6, model, tokenizer, {})  # step 6 written, step 2 pruned
    assert complete_checkpoints(tmp_path) == [4, 6]
    with pytest.raises(SystemExit):
        checkpoints.write_checkpoint(tmp_path, 6, model, tokenizer, {})  # a resumed run writes step 6 again
    assert complete_checkpoints(tmp_path) == [4]  # the old step 6 went out of sight, whole
    assert [d.name for d in checkpoints.checkpoint_dirs(tmp_path)] == ["step-000004"]
    hidden = sorted(d.name for d in (tmp_path / "checkpoints").glob(".tmp-*"))
    assert hidden == [f".tmp-step-000002-old-{os.getpid()}", f".tmp-step-000006-{os.getpid()}",
                      f".tmp-step-000006-old-{os.getpid()}"]
    monkeypatch.setattr(checkpoints.shutil, "rmtree", real_rmtree)
    monkeypatch.setattr(checkpoints, "pid_alive", lambda pid: False)  # the next trainer: this one is gone
    checkpoints.write_checkpoint(tmp_path, 6, model, tokenizer, {})
    assert complete_checkpoints(tmp_path) == [4, 6] and not list((tmp_path / "checkpoints").glob(".tmp-*"))


@pytest.mark.slow
def test_disk_full_stops_with_one_clear_line_and_leaves_nothing_corrupt(runs_dir):
    # "store": tiny checkpoints (~100 kB) fit, the store's WAL hits 400 kB after some steps;
    # "ckpt": the first checkpoint's weights file (~550 kB, default model) does not fit in 300 kB.
    procs = {"store": spawn(runs_dir, "store", sets=TINY_MODEL, preexec=file_size_limit(250_000)),
             "ckpt": spawn(runs_dir, "ckpt", preexec=file_size_limit(300_000))}
    for rid, proc in procs.items():
        assert proc.wait(timeout=240) == 1, rid
        out = (runs_dir / f"{rid}.cli.log").read_text()
        assert "Traceback" not in out
        last = out.strip().splitlines()[-1]
        assert last.startswith(f"error: cannot write to {runs_dir / rid} ("), last
        assert ("--resume" in last) == (rid == "store") and ("start the run again" in last) == (rid == "ckpt")
        row = run_index.list_runs(runs_dir).set_index("run_id").loc[rid]
        assert row["status"] == "failed" and row["error"].strip().splitlines()[-1] == last[len("error: "):]
        steps = assert_whole_steps(runs_dir, rid)
        assert f"stopped after step {steps}" in last
        assert not list((runs_dir / rid / "checkpoints").glob(".tmp-*"))  # the failed write cleaned up
    assert complete_checkpoints(runs_dir / "ckpt") == []
    ckpts = complete_checkpoints(runs_dir / "store")
    assert ckpts and assert_whole_steps(runs_dir, "store") >= 2
    # space again: the run continues from its newest complete checkpoint; nothing to resume from
    # where no checkpoint could be written (one line, exit 2)
    proc, nothing = spawn(runs_dir, "store", resume=True), spawn(runs_dir, "ckpt", resume=True)
    wait_new_step(runs_dir, "store", ckpts[-1], proc, timeout=180)
    proc.kill()
    proc.wait()
    assert Path(resumes(runs_dir, "store")[-1]["from"]).name == f"step-{ckpts[-1]:06d}"
    assert nothing.wait(timeout=120) == 2
    assert (runs_dir / "ckpt.cli.log").read_text().strip().splitlines()[-1].startswith(
        "error: --resume: run ckpt has no complete checkpoint")


@pytest.fixture
def a_file(tmp_path) -> Path:
    f = tmp_path / "not-a-dir"
    f.write_text("a file where the runs dir should be")
    return f


@pytest.mark.parametrize("where", ["file", "/proc", "/sys"])
def test_unwritable_runs_dir_is_one_line_and_creates_nothing(a_file, capsys, where):
    # As root, chmod cannot make a folder read-only; these are dirs no one can create runs in:
    # a regular file, /proc (ENOENT) and sysfs (EPERM).
    root = {"file": a_file, "/proc": Path("/proc/grpo-runs"), "/sys": Path("/sys/grpo-runs")}[where]
    assert main(["train", "--runs-dir", str(root), "--run-id", "x", "--set", "model.warm_start_steps=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot create run 'x' in {root}"), err
    assert "writable folder" in err[0]
    assert main(["serve", "--no-demo", "--runs-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs dir" in err[0] and str(root) in err[0], err
    assert a_file.read_text() == "a file where the runs dir should be"


def test_unwritable_runs_dir_on_the_runs_page_is_one_line(a_file, monkeypatch):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(a_file))
    at = app_test()
    at.run()
    at.switch_page("pages/runs.py").run()
    at.button(key="start_demo").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and errs[0].startswith("cannot create run") and "writable folder" in errs[0]


# ---- damaged stores on the runs page ---------------------------------------------------------------------
def test_truncated_and_foreign_stores_are_listed_unreadable_and_other_runs_still_work(runs_dir):
    synth_run(runs_dir, "good", 6, status="finished").close()
    synth_run(runs_dir, "victim", 40, status="finished").close()
    raw = (runs_dir / "victim" / "run.db").read_bytes()
    damaged = {"truncated": raw[: len(raw) // 3], "header-only": raw[:100], "text": b"hello, not sqlite\n" * 40,
               "empty": b""}
    for rid, data in damaged.items():
        (runs_dir / rid).mkdir()
        (runs_dir / rid / "run.db").write_bytes(data)
    (runs_dir / "victim" / "run.db").write_bytes(raw[: len(raw) // 2])  # cut mid-file after being listed
    at = app_test()
    at.session_state["run_id"] = "good"
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    errs = [e.value for e in at.error]
    runs = run_index.list_runs(runs_dir).set_index("run_id")
    for rid in (*damaged, "victim"):
        assert runs.loc[rid, "status"] == "unreadable", rid
        reason = runs.loc[rid, "error"]
        assert reason and f"unreadable: {reason}" in errs, rid  # the page shows the reason
        assert str(runs_dir / rid) in reason or "run.db" in reason or "malformed" in reason, reason
    assert runs.loc["good", "status"] == "finished"
    at.button(key="open_good").click().run()  # the other runs still open
    assert not at.exception and at.session_state["run_id"] == "good" and len(live_charts(at)) >= 4
    at.switch_page("pages/analysis.py").run()
    assert not at.exception
