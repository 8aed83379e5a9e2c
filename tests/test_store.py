"""The run store under real processes: a live reader beside the writer, a writer killed
mid-step, two processes racing for control requests, broken files in the runs dir."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from grpo_core.errors import MAX_LINE, ConfigError, StoreError, exception_line
from grpo_core.runs.live_settings import PAUSE, SET_WEIGHTS, STOP
from grpo_core.runs.locations import check_run_id, new_run_id, resolve_db
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import CREATED, FAILED, FINISHED, RUNNING, STALE, STOPPED, display_status, error_line
from grpo_core.runs.schema import SCHEMA_VERSION
from grpo_core.runs.step_columns import StepGroups, StepRollouts
from grpo_core.runs.step_scores import ROWS_PER_STATEMENT
from grpo_core.runs.store import APPLIED, EV_CHANGE, EV_REJECTED, REJECTED, RunStore

ROOT = Path(__file__).resolve().parents[1]
P, G = 4, 3  # groups per step, rollouts per group
SCALARS = ["train/reward", "train/reward_std", "health/trainable_ratio", "loss/policy"]

# One step as the trainer writes it; shared by this process and the child scripts.
STEP_CODE = r'''
import numpy as np, pandas as pd
def write_step(store, step, p, g, text_len=20):
    scal = {name: step + k / 10 for k, name in enumerate(%r)}
    groups = pd.DataFrame({"group": range(p), "prompt_id": [f"q{i}" for i in range(p)], "size": g,
                           "reward_mean": 0.5, "reward_std": 0.1, "trainable": True, "phantom": False})
    rollouts = [(gi, i, 0.5, {"exact": float(i %% 2), "answer_f1": 0.25}, "x" * text_len, None)
                for gi in range(p) for i in range(g)]
    store.log_step(step, scal, groups, rollouts, events=[("lifecycle", {"step": step})])
''' % (SCALARS,)
STEP_NAMES: dict = {}
exec(STEP_CODE, STEP_NAMES)
write_step = STEP_NAMES["write_step"]


def child(code: str, *args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", STEP_CODE + code, *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for(path: Path, timeout=60.0):
    end = time.time() + timeout
    while not path.exists():
        assert time.time() < end, f"timed out waiting for {path}"
        time.sleep(0.01)


def complete_steps(store: RunStore) -> dict[int, tuple[int, int, int]]:
    """step -> (scalars, groups, rollouts) counts."""
    q = lambda t: dict(store.conn.execute(f"SELECT step, COUNT(*) FROM {t} GROUP BY step").fetchall())  # noqa: E731
    sc, gr, ro = q("scalars"), q("groups"), q("rollouts")
    return {s: (sc.get(s, 0), gr.get(s, 0), ro.get(s, 0)) for s in set(sc) | set(gr) | set(ro)}


# ---- processes ------------------------------------------------------------------------------------
WRITER = r'''
import sys, time, os
from pathlib import Path
from grpo_core.runs.store import RunStore
run_id, steps, ready = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
s = RunStore.create(run_id, {"grpo": {"steps": steps}})
s.set_status("running", pid=os.getpid())
end = time.time() + 60
while not ready.exists():
    if time.time() > end:
        sys.exit("the reader never opened the store")
    time.sleep(0.01)
for step in range(steps):
    write_step(s, step, %d, %d)
    time.sleep(0.04)
s.set_status("finished")
''' % (P, G)

READER = r'''
import sys, time, json
from pathlib import Path
from grpo_core.runs.store import RunStore
db, steps, ready = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
while not db.exists():
    time.sleep(0.01)
s = RunStore.open(db, readonly=True)
ready.touch()
last, seen, bad, end = -1, [], [], time.time() + 60
while last < steps - 1 and time.time() < end:
    sc = s.scalars(since_step=last)
    if len(sc):
        new = int(sc["step"].max())
        gr = s.groups(since_step=last, until_step=new)
        ro = s.rollouts(since_step=last, until_step=new, with_text=False)
        for st in range(last + 1, new + 1):
            counts = ((sc["step"] == st).sum(), (gr["step"] == st).sum(), (ro["step"] == st).sum())
            if counts != (%d, %d, %d):
                bad.append([st, *map(int, counts)])
        seen.append(new)
        last = new
    time.sleep(0.005)
print(json.dumps({"seen": seen, "bad": bad}))
''' % (len(SCALARS), P, P * G)


@pytest.mark.slow
def test_reader_process_sees_steps_appear_while_writer_process_writes(runs_dir, tmp_path):
    steps, ready = 25, tmp_path / "reader-ready"
    writer = child(WRITER, "live", steps, ready)
    reader = child(READER, runs_dir / "live" / "run.db", steps, ready)
    w_out, w_err = writer.communicate(timeout=120)
    r_out, r_err = reader.communicate(timeout=120)
    assert writer.returncode == 0, w_err
    assert reader.returncode == 0, r_err
    got = json.loads(r_out)
    assert got["bad"] == []  # never a half-written step
    assert got["seen"][-1] == steps - 1
    assert len(got["seen"]) >= 3, got  # it saw the run grow, not only the end
    assert got["seen"] == sorted(got["seen"])


KILLED = r'''
import sys, os
from grpo_core.runs.store import RunStore
s = RunStore.create(sys.argv[1], {})
s.set_status("running", pid=os.getpid())
step = 0
while True:
    write_step(s, step, 16, 16, text_len=2000)  # big steps: the kill lands inside one
    print(step, flush=True)
    step += 1
'''


@pytest.mark.slow
def test_writer_killed_mid_run_leaves_every_committed_step_and_no_half_step(runs_dir):
    proc = child(KILLED, "killed")
    committed = -1
    while committed < 6:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        committed = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    committed = max([committed] + [int(x) for x in rest.split()])
    assert proc.returncode == -signal.SIGKILL
    db = runs_dir / "killed" / "run.db"
    # the dashboard's way first: read-only, straight after the crash
    with RunStore.open(db, readonly=True) as ro:
        assert ro.last_step() >= committed
    runs = list_runs()
    assert runs.set_index("run_id").loc["killed", "status"] == STALE  # pid gone: not "running"
    with RunStore.open(db) as s:
        assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        counts = complete_steps(s)
        assert sorted(counts) == list(range(max(counts) + 1))
        assert max(counts) >= committed
        assert set(counts.values()) == {(len(SCALARS), 16, 256)}


CLAIMER = r'''
import sys, os, time, json
from pathlib import Path
from grpo_core.runs.store import RunStore
db, name, ready, stop, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
s = RunStore.open(db)
ready.touch()
mine = []
while True:
    stopping = stop.exists()  # read before claiming: every request was sent before stop appeared
    got = s.claim_pending()
    for r in got:
        s.resolve_request(r["id"], True, step=len(mine), message=name)
    mine += [r["id"] for r in got]
    if stopping and not got:
        break
    time.sleep(0.001)
out.write_text(json.dumps(mine))
'''


@pytest.mark.slow
def test_two_claimer_processes_apply_each_request_exactly_once(runs_dir, tmp_path):
    store = RunStore.create("race", {"reward": {"weights": {"exact": 1.0}}})
    store.set_status(RUNNING)
    stop = tmp_path / "stop"
    procs = [child(CLAIMER, store.path, f"c{i}", tmp_path / f"ready{i}", stop, tmp_path / f"out{i}")
             for i in range(2)]
    for i in range(2):
        wait_for(tmp_path / f"ready{i}")
    ids = []
    for i in range(300):  # spread over ~1 s so both claimers are polling while requests arrive
        ids.append(store.request(SET_WEIGHTS, {"weights": {"exact": 1.0 + i}}, source="test"))
        time.sleep(0.003)
    stop.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    a, b = (set(json.loads((tmp_path / f"out{i}").read_text())) for i in range(2))
    assert not a & b  # nobody applied a request the other applied
    assert a | b == set(ids)  # and none was lost
    assert a and b, "both claimers should have won some requests"
    ctl = store.control()
    assert (ctl["status"] == APPLIED).all()
    changes = store.events(kinds=[EV_CHANGE])
    assert sorted(p["request_id"] for p in changes["payload"]) == sorted(ids)  # one event each


# ---- in-process behaviour ----------------------------------------------------------------------------
def test_claim_and_resolve_are_exactly_once_in_process(runs_dir):
    s = RunStore.create("ctl", {})
    s.set_status(RUNNING)
    r1 = s.request(SET_WEIGHTS, {"weights": {"exact": 2.0}})
    r2 = s.request(PAUSE)
    claimed = s.claim_pending()
    assert [c["id"] for c in claimed] == [r1, r2] and claimed[0]["payload"] == {"weights": {"exact": 2.0}}
    assert s.claim_pending() == []
    s.resolve_request(r1, True, step=7, message="applied at step 7")
    s.resolve_request(r2, False, step=7, message="already paused")
    with pytest.raises(StoreError, match="was not claimed"):
        s.resolve_request(r1, True, step=8)
    ctl = s.control().set_index("id")
    assert ctl.loc[r1, "status"] == APPLIED and ctl.loc[r1, "applied_step"] == 7
    assert ctl.loc[r2, "status"] == REJECTED and ctl.loc[r2, "message"] == "already paused"
    ch = s.changes()
    assert ch["step"].tolist() == [7] and ch["request"].iloc[0] == {"weights": {"exact": 2.0}}
    assert s.events(kinds=[EV_REJECTED])["payload"].iloc[0]["message"] == "already paused"
    r3 = s.request(STOP)
    s.reject_open_requests("run ended")
    assert s.control(since_id=r2)["status"].tolist() == [REJECTED] and r3 > r2
    with pytest.raises(StoreError, match="unknown control kind 'explode'"):
        s.request("explode")


@pytest.mark.parametrize("status", [FINISHED, FAILED, STOPPED])
def test_request_to_an_ended_run_is_refused(runs_dir, status):
    s = RunStore.create("done", {})
    s.set_status(status)
    with pytest.raises(StoreError, match=f"run done is {status}: control requests apply only to a live run"):
        s.request(SET_WEIGHTS, {"weights": {"exact": 1.0}})
    assert s.control().empty


@pytest.mark.parametrize("bad", ["../evil", "a/../../b", "..", "a/b", "", ".hidden", "x" * 65, "a b", "run..1"])
def test_bad_run_ids_are_rejected(runs_dir, bad):
    with pytest.raises(StoreError, match="is not allowed"):
        RunStore.create(bad, {})
    with pytest.raises(StoreError):
        RunStore.open(bad)
    assert not (runs_dir.parent / "evil").exists() and not list(runs_dir.iterdir())


def test_good_run_ids_and_resolve(runs_dir):
    assert check_run_id("run-2026.01_a") == "run-2026.01_a"
    s = RunStore.create(new_run_id("demo"), {})
    assert resolve_db(s.run_id) == s.path == resolve_db(s.run_dir)
    assert not [p.name for p in s.run_dir.iterdir() if not p.name.startswith("run.db")]  # no side file left
    with pytest.raises(StoreError, match="already exists"):
        RunStore.create(s.run_id, {})
    again = RunStore.create(s.run_id, {"other": 1}, exist_ok=True)  # reopen, meta untouched
    assert again.config == {} and again.get_meta()["status"] == CREATED
    with pytest.raises(StoreError, match="no run store"):
        RunStore.open("missing-run")


def test_incremental_reads_since_step(runs_dir):
    s = RunStore.create("inc", {})
    for step in range(5):
        write_step(s, step, P, G)
    assert s.last_step() == 4
    assert s.scalars(since_step=2)["step"].unique().tolist() == [3, 4]
    assert len(s.scalars(since_step=2)) == 2 * len(SCALARS)
    assert s.scalars(since_step=0, until_step=2, names=["loss/policy"])["value"].tolist() == [1.3, 2.3]
    wide = s.scalars_wide(since_step=3)
    assert wide.index.tolist() == [4] and sorted(wide.columns) == sorted(SCALARS)
    assert s.groups(since_step=3)["step"].unique().tolist() == [4] and len(s.groups(since_step=3)) == P
    ro = s.rollouts(since_step=1, until_step=3)
    assert ro["step"].unique().tolist() == [2, 3] and len(ro) == 2 * P * G
    assert {"exact", "answer_f1", "completion", "total"} <= set(ro.columns)
    assert "completion" not in s.rollouts(since_step=3, with_text=False).columns
    assert len(s.rollouts(step=2, group=1)) == G
    ev = s.events()
    assert [p["step"] for p in s.events(since_id=int(ev["id"].iloc[2]))["payload"]] == [3, 4]
    assert s.scalars(since_step=4).empty and s.rollouts(since_step=4).empty and s.groups(since_step=4).empty
    assert s.scalars_wide(since_step=4).empty


def test_a_failing_step_write_leaves_nothing(runs_dir):
    s = RunStore.create("atomic", {})
    write_step(s, 0, P, G)
    bad_rollouts = [(0, 0, 0.5, {"exact": "yes"}, None, None)]  # not a number: the write fails
    with pytest.raises(StoreError, match="must be a number"):
        s.log_step(1, {"train/reward": 1.0}, rollouts=bad_rollouts)
    assert s.last_step() == 0 and set(complete_steps(s)) == {0}
    s.log_step(1, {"train/reward": float("inf")})  # a non-finite scalar is stored as missing
    assert s.scalars(since_step=0)["value"].isna().all()


def test_list_runs_lists_unreadable_stores_with_a_reason(runs_dir):
    good = RunStore.create("good", {"grpo": {"steps": 10}})
    write_step(good, 0, P, G)
    good.set_status(FINISHED)
    good.close()
    raw = (runs_dir / "good" / "run.db").read_bytes()
    (runs_dir / "truncated").mkdir()
    (runs_dir / "truncated" / "run.db").write_bytes(raw[:3000])
    (runs_dir / "text").mkdir()
    (runs_dir / "text" / "run.db").write_text("this is not a database\n")
    (runs_dir / "empty").mkdir()
    (runs_dir / "empty" / "run.db").write_bytes(b"")
    (runs_dir / "other").mkdir()
    with sqlite3.connect(runs_dir / "other" / "run.db") as c:
        c.execute("CREATE TABLE t (x)")
    (runs_dir / "no-db").mkdir()  # a folder without a store is not a run
    runs = list_runs().set_index("run_id")
    assert sorted(runs.index) == ["empty", "good", "other", "text", "truncated"]
    assert runs.loc["good", "status"] == FINISHED and runs.loc["good", "last_step"] == 0
    assert runs.loc["good", "steps"] == 10
    for rid in ("truncated", "text", "empty", "other"):
        assert runs.loc[rid, "status"] == "unreadable"
        assert str(runs.loc[rid, "error"]).startswith(str(runs_dir / rid / "run.db")), runs.loc[rid, "error"]
    assert "not a database" in runs.loc["text", "error"]
    assert "missing tables" in runs.loc["other", "error"]
    assert list(runs.index).index("good") == 0  # readable runs first (newest created)
    assert list_runs(runs_dir / "nowhere").empty


def test_a_runs_error_is_stored_and_read_as_one_line(runs_dir):
    """set_status stores any error as one line; a store from before (its whole traceback in
    meta.error, written raw here) reads as its last line: list_runs and error_line, no migration."""
    tb = ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    boom()\n'
          'ValueError: bad reward\n\n')
    new = RunStore.create("new", {})
    new.set_status(FAILED, error=tb)
    assert new.get_meta()["error"] == "ValueError: bad reward"
    new.set_status(FAILED, error="\n  first line\nsecond line")
    assert new.get_meta()["error"] == "first line"
    old = RunStore.create("old", {})
    old.set_status(FAILED)
    old.set_meta(error=tb)
    assert old.get_meta()["error"] == tb  # the store as it is: nothing rewritten
    assert error_line(old.get_meta()) == "ValueError: bad reward" and error_line({"error": None}) is None
    runs = list_runs(runs_dir).set_index("run_id")
    assert runs.loc["old", "error"] == "ValueError: bad reward" and runs.loc["new", "error"] == "first line"


def test_an_exception_is_one_line_naming_its_type_and_its_first_meaningful_line():
    assert exception_line(RuntimeError("\n\nEngine core initialization failed.\nFailed core proc(s): {}")) == \
        "RuntimeError: Engine core initialization failed."
    assert exception_line(KeyError("rollout 7")) == "KeyError: 'rollout 7'" and exception_line(MemoryError()) == \
        "MemoryError"
    assert exception_line(ConfigError("grpo.group_size must be >= 2, got 1")) == "grpo.group_size must be >= 2, got 1"
    nested = RuntimeError("worker died:\nTraceback (most recent call last):\n  File 'w.py'\nOSError: no GPU\n")
    assert exception_line(nested) == "RuntimeError: OSError: no GPU"  # a traceback carried in the message: its end
    long = exception_line(ValueError("x" * 2000))
    assert len(long) <= MAX_LINE + len("ValueError: ") and long.endswith("…")


def test_display_status_derives_stale():
    now = time.time()
    assert display_status({"status": RUNNING, "heartbeat": now}, now) == RUNNING
    assert display_status({"status": RUNNING, "heartbeat": now - 60}, now) == STALE
    assert display_status({"status": FINISHED, "heartbeat": 0}, now) == FINISHED
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert display_status({"status": RUNNING, "heartbeat": now, "pid": dead.pid}, now) == STALE
    assert display_status({"status": RUNNING, "heartbeat": now, "pid": os.getpid()}, now) == RUNNING


def _odd_steps(s: RunStore):
    """Steps 0-3 as the trainer writes them, then every odd case the rollouts reads must keep:
    a failed metric (None), a failed rollout (error text), a non-finite total, rows out of
    order, a step logged twice (TRL: one call per generation batch) with a replaced rollout and
    a new metric, a step without metrics, a NaN score given as a tuple, a step without rollouts."""
    for step in range(4):
        write_step(s, step, P, G)
    odd = [(1, 1, float("nan"), {"exact": None, "answer_f1": 0.25}, None, "answer_f1: timeout"),
           (1, 0, 0.1 + 0.2, {"exact": 1.0, "answer_f1": 1 / 3}, "x", None),
           (0, 0, 0.5, {"exact": True, "answer_f1": 0.0}, None, None)]
    s.log_step(4, {"train/reward": 0.5}, rollouts=odd)
    s.log_step(4, {"train/reward": 0.6}, rollouts=[(1, 0, 0.7, {"exact": 0.0, "answer_f1": 0.5, "fmt": 1.0},
                                                    "again", None), (2, 0, 0.2, {"fmt": 0.0}, None, None)])
    s.log_step(5, {"train/reward": 0.5}, rollouts=[(0, 0, 0.5, {}, None, None)])  # no metrics at all
    s.log_step(6, {"train/reward": 0.5}, rollouts=[(0, i, 0.5, {"exact": i / 3 if i else float("nan")}, f"t{i}", None)
                                                   for i in range(3)])
    s.log_step(7, {"train/reward": 0.1})  # scalars only


READS = ({}, {"since_step": 1, "until_step": 3}, {"step": 4}, {"steps": [0, 4, 5, 6]}, {"since_step": 9},
         {"step": 4, "group": 1}, {"group": 0}, {"step": 2, "group": 9}, {"steps": []})


def test_rollouts_reads_in_every_case(runs_dir):
    s = RunStore.create("blobs", {})
    _odd_steps(s)
    for kw in READS:
        text, bare = s.rollouts(**kw), s.rollouts(with_text=False, **kw)
        assert list(text.columns[:6]) == ["step", "group", "idx", "total", "error", "completion"], kw
        pd.testing.assert_frame_equal(text.drop(columns="completion"), bare, check_exact=True)
    four = s.rollouts(step=4)
    assert four[["group", "idx"]].values.tolist() == [[0, 0], [1, 0], [1, 1], [2, 0]]
    assert list(four.columns[6:]) == ["exact", "answer_f1", "fmt"]
    assert four["answer_f1"].tolist()[1] == 0.5 and np.isnan(four["fmt"].iloc[0])
    assert four["error"].isna().tolist() == [True, True, False, True] and np.isnan(four["total"].iloc[2])
    assert four["error"].iloc[2] == "answer_f1: timeout" and four["exact"].tolist()[0] == 1.0
    assert four["completion"].isna().tolist() == [True, False, True, True] and four["completion"].iloc[1] == "again"
    assert s.rollouts(step=6)["exact"].isna().tolist() == [True, False, False]  # a NaN score: a failed metric
    assert list(s.rollouts(step=5).columns) == ["step", "group", "idx", "total", "error", "completion"]
    one = s.rollouts(step=4, group=1)
    assert one["idx"].tolist() == [0, 1] and one["completion"].iloc[0] == "again" and one["completion"].isna().iloc[1]
    assert s.rollouts(step=2, group=9).empty and s.rollouts(steps=[]).empty
    assert s.truncate_after(2) == 5
    assert s.rollouts(with_text=False)["step"].max() == 2 and s.conn.execute(
        "SELECT MAX(step) FROM step_scores").fetchone()[0] == 2
    assert SCHEMA_VERSION == 2 and s.get_meta()["schema_version"] == 2 and "score_blobs" not in s.get_meta()
    assert "scores" not in [r[1] for r in s.conn.execute("PRAGMA table_info(rollouts)")]  # one form: step_scores


# ---- schema versions: a version-1 file is migrated (read as it is when read-only), a newer one refused ----
V1_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS scalars (
    step INTEGER NOT NULL, name TEXT NOT NULL, value REAL,
    PRIMARY KEY (name, step)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS scalars_step ON scalars (step);
CREATE TABLE IF NOT EXISTS groups (
    step INTEGER NOT NULL, grp INTEGER NOT NULL, prompt_id TEXT, size INTEGER,
    reward_mean REAL, reward_std REAL, trainable INTEGER, phantom INTEGER,
    PRIMARY KEY (step, grp)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollouts (
    step INTEGER NOT NULL, grp INTEGER NOT NULL, idx INTEGER NOT NULL,
    total REAL, scores TEXT, completion TEXT, error TEXT,
    PRIMARY KEY (step, grp, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, step INTEGER, time REAL, kind TEXT, payload TEXT);
CREATE TABLE IF NOT EXISTS control (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL, kind TEXT, payload TEXT,
    status TEXT, applied_step INTEGER, message TEXT, source TEXT);
CREATE INDEX IF NOT EXISTS control_status ON control (status, id);
"""
V1_STEP_SCORES = """CREATE TABLE IF NOT EXISTS step_scores (
    step INTEGER PRIMARY KEY, metrics TEXT, grp BLOB, idx BLOB, total BLOB, scores BLOB, errors TEXT);"""


def _v1_rollouts() -> dict:
    """The final version-1 rows of the rollouts _odd_steps and write_step log, keyed by (step,
    group, idx): each log_step call's rows replace the same keys' (INSERT OR REPLACE), as v1 did."""
    final = {}
    for step in range(4):
        for gi in range(P):
            for i in range(G):
                final[(step, gi, i)] = (0.5, {"exact": float(i % 2), "answer_f1": 0.25}, "x" * 20, None)
    calls = {4: [[(1, 1, None, {"exact": None, "answer_f1": 0.25}, None, "answer_f1: timeout"),
                  (1, 0, 0.1 + 0.2, {"exact": 1.0, "answer_f1": 1 / 3}, "x", None),
                  (0, 0, 0.5, {"exact": True, "answer_f1": 0.0}, None, None)],
                 [(1, 0, 0.7, {"exact": 0.0, "answer_f1": 0.5, "fmt": 1.0}, "again", None),
                  (2, 0, 0.2, {"fmt": 0.0}, None, None)]],
             5: [[(0, 0, 0.5, {}, None, None)]],
             6: [[(0, i, 0.5, {"exact": i / 3 if i else None}, f"t{i}", None) for i in range(3)]]}
    for step, writes in calls.items():
        for rows in writes:
            for gi, i, t, sc, text, err in rows:
                final[(step, gi, i)] = (t, sc, text, err)
    return final


def _v1_blob(rows: list[tuple]) -> tuple:
    """One step's v1 step_scores row (metrics, grp, idx, total, scores, errors) from its final
    rows [(group, idx, total, scores, error)] in (group, idx) order, as version 1 wrote it."""
    names = list(dict.fromkeys(n for r in rows for n in r[3]))
    sc = np.array([[np.nan if r[3].get(n) is None else float(r[3][n]) for n in names] for r in rows], "<f8")
    errors = [[pos, r[4]] for pos, r in enumerate(rows) if r[4] is not None]
    return (json.dumps(names), np.array([r[0] for r in rows], "<i4").tobytes(),
            np.array([r[1] for r in rows], "<i4").tobytes(),
            np.array([np.nan if r[2] is None else r[2] for r in rows], "<f8").tobytes(),
            sc.reshape(len(rows), len(names)).tobytes(), json.dumps(errors) if errors else None)


def _write_v1_file(db: Path, ref: RunStore, with_step_scores: bool):
    """A version-1 run.db written with raw sqlite3 and the v1 DDL: the rollouts as version 1 kept
    them (scores JSON, total, text, error) and, with_step_scores, its step_scores rows too (a v1
    store made since step_scores existed; without: one made before). The tables version 2 did not
    change (scalars, groups, events, control, meta) hold the reference store's rows."""
    db.parent.mkdir(parents=True)
    c = sqlite3.connect(db, isolation_level=None)
    c.execute("PRAGMA journal_mode=WAL")
    c.executescript(V1_DDL + (V1_STEP_SCORES if with_step_scores else ""))
    for table in ("scalars", "groups", "events", "control"):
        rows = ref.conn.execute(f"SELECT * FROM {table}").fetchall()
        if rows:
            c.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    meta = {**ref.get_meta(), "schema_version": 1, **({"score_blobs": 1} if with_step_scores else {})}
    c.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
    final = _v1_rollouts()
    c.executemany("INSERT INTO rollouts VALUES (?, ?, ?, ?, ?, ?, ?)",
                  [(st, gi, i, t, json.dumps(sc), text, err)
                   for (st, gi, i), (t, sc, text, err) in sorted(final.items())])
    if with_step_scores:
        for step in sorted({k[0] for k in final}):
            rows = [(gi, i, t, sc, err) for (st, gi, i), (t, sc, _, err) in sorted(final.items()) if st == step]
            c.execute("INSERT INTO step_scores VALUES (?, ?, ?, ?, ?, ?, ?)", (step, *_v1_blob(rows)))
    c.close()


def _every_read(s: RunStore) -> list:
    return ([s.get_meta(), s.scalars(), s.scalars_wide(), s.groups(), s.events(), s.control(), s.last_step(),
             s.rollout_extent()] + [s.rollouts(**kw) for kw in READS]
            + [s.rollouts(with_text=False, **kw) for kw in READS])


def _assert_same_reads(got: list, want: list):
    for a, b in zip(got, want, strict=True):
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        else:
            assert a == b


def _reference(runs_dir) -> RunStore:
    ref = RunStore.create("v2", {"grpo": {"steps": 8}})
    _odd_steps(ref)
    ref.set_status(FINISHED)
    return ref


@pytest.mark.parametrize("with_step_scores", [True, False], ids=["v1 with step_scores", "v1 before step_scores"])
def test_a_version_1_file_is_read_as_it_is_read_only_and_migrated_whole_by_a_writable_open(runs_dir,
                                                                                        with_step_scores):
    ref = _reference(runs_dir)
    db = runs_dir / "v1" / "run.db"
    _write_v1_file(db, ref, with_step_scores)
    want = _every_read(ref)
    bytes_before = db.read_bytes()
    with RunStore.open(db, readonly=True) as ro:  # the dashboard's open: reads it as it is, changes nothing
        assert ro.version == 1
        _assert_same_reads(_every_read(ro)[1:], want[1:])
        assert ro.get_meta()["schema_version"] == 1
        with pytest.raises(StoreError, match=r"version-1 run store not migrated \(opened read-only\)"):
            ro.log_step(9, {"train/reward": 1.0})
    assert db.read_bytes() == bytes_before
    with RunStore.open(db) as s:  # a writable open migrates it, in one transaction
        assert s.version == 2
        got = _every_read(s)
        assert got[0]["schema_version"] == 2 and "score_blobs" not in got[0]
        _assert_same_reads(got, want)
        for table in ("scalars", "groups", "rollouts", "step_scores", "events", "control"):  # meta: got[0]
            assert _table(s, table) == _table(ref, table), table
        schema = "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
        assert s.conn.execute(schema).fetchall() == ref.conn.execute(schema).fetchall()  # the v2 schema
        assert s.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        write_step(s, 8, P, G)  # and it goes on as a version-2 store
        assert s.rollouts(step=8)["completion"].tolist() == ["x" * 20] * (P * G)
    with RunStore.open(db, readonly=True) as ro:
        assert ro.version == 2 and ro.last_step() == 8


def test_a_version_1_file_another_process_is_writing_is_not_migrated_under_it(runs_dir):
    ref = _reference(runs_dir)
    db = runs_dir / "v1-live" / "run.db"
    _write_v1_file(db, ref, with_step_scores=False)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # an older trainer, mid-run
    try:
        with sqlite3.connect(db) as c:
            c.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [("status", json.dumps(RUNNING)),
                          ("pid", json.dumps(other.pid)), ("heartbeat", json.dumps(time.time()))])
        with RunStore.open(db) as s:  # e.g. the dashboard sending it a request
            assert s.version == 1
            pd.testing.assert_frame_equal(s.rollouts(), ref.rollouts(), check_exact=True)
            with pytest.raises(StoreError, match=rf"not migrated \(another process \(pid {other.pid}\) is writing"):
                s.log_step(9, {"train/reward": 1.0})
            assert "scores" in s.rollout_columns()
    finally:
        other.kill()
        other.wait()
    with RunStore.open(db) as s:  # that process is gone: migrated now
        assert s.version == 2 and s.get_meta()["schema_version"] == 2
        pd.testing.assert_frame_equal(s.rollouts(), ref.rollouts(), check_exact=True)


def test_a_migration_that_fails_leaves_the_version_1_file_as_it_was(runs_dir):
    ref = _reference(runs_dir)
    db = runs_dir / "v1-bad" / "run.db"
    _write_v1_file(db, ref, with_step_scores=False)
    with sqlite3.connect(db) as c:  # a score version 1 took as JSON but no number (it read back as an error)
        c.execute("""UPDATE rollouts SET scores = '{"exact": "yes"}' WHERE step = 6 AND idx = 2""")
    with pytest.raises(StoreError, match=r"cannot migrate .* from store version 1 to 2 \(it is left as it was\): "
                                         r"score 'exact' of rollout \(group 0, idx 2\) of step 6 is 'yes'"):
        RunStore.open(db)
    with RunStore.open(db, readonly=True) as ro:
        assert ro.version == 1 and ro.get_meta()["schema_version"] == 1 and "scores" in ro.rollout_columns()
        pd.testing.assert_frame_equal(ro.rollouts(steps=[4, 5]), ref.rollouts(steps=[4, 5]), check_exact=True)


def test_a_store_newer_than_this_code_is_refused_with_one_line_naming_its_version(runs_dir):
    s = RunStore.create("future", {})
    s.set_meta(schema_version=3)
    s.close()
    for readonly in (False, True):
        with pytest.raises(StoreError) as e:
            RunStore.open("future", readonly=readonly)
        msg = str(e.value)
        assert "\n" not in msg and "version-3 run store, newer than this grpo_core reads (versions 1 to 2)" in msg
    runs = list_runs().set_index("run_id")
    assert runs.loc["future", "status"] == "unreadable" and "version-3" in runs.loc["future", "error"]


def test_a_score_that_is_not_a_number_is_refused_naming_it(runs_dir):
    s = RunStore.create("nan-text", {})
    with pytest.raises(StoreError, match=r"score 'exact' of rollout \(group 0, idx 1\) of step 0 is 'yes'"):
        s.log_step(0, {"train/reward": 1.0}, rollouts=[(0, 0, 1.0, {"exact": 1.0}, None, None),
                                                       (0, 1, 1.0, {"exact": "yes"}, None, None)])
    assert s.last_step() is None and s.rollouts().empty  # nothing half-written


def test_groups_frame_of_any_column_types_is_written_as_the_table_wants(runs_dir):
    s = RunStore.create("grp-types", {})
    g = pd.DataFrame({"group": np.arange(2), "prompt_id": [7, 8], "size": [4, 4],
                      "reward_mean": np.array([np.float64(0.5), np.float32(0.25)], dtype=object),
                      "reward_std": [0.1, 0.0], "trainable": [True, False], "phantom": np.array([0, 1], dtype=object)})
    s.log_step(0, {"train/reward": 0.4}, g)
    back = s.groups()
    assert back["prompt_id"].tolist() == ["7", "8"] and back["reward_mean"].tolist() == [0.5, 0.25]
    assert back["trainable"].tolist() == [True, False] and back["phantom"].tolist() == [False, True]


def _table(s: RunStore, table: str) -> list[tuple]:
    return s.conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3").fetchall()


def test_the_trainers_columns_store_exactly_what_tuples_and_frames_store(runs_dir):
    """StepRollouts / StepGroups (the trainer's fast path) against tuples and a frame: the same
    rows in every table, byte for byte (the score arrays included), and the same frames back."""
    names = ["answer_f1", "exact", "length"]
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.random((6, 3)), [[0.1 + 0.2, -0.0, 1e-300], [1 / 3, 1.0, -2.5e17]]])
    group, idx = np.repeat(np.arange(4), 2), np.tile(np.arange(2), 4)
    total = scores @ np.array([1.0, 0.5, 0.1])
    total[3] = np.inf  # a non-finite total is stored as NULL either way
    texts = [f"t{k}" if k < 4 else None for k in range(8)]
    errors = [None] * 5 + ["exact: boom", None, None]
    mean, std = rng.random(4), rng.random(4)
    trainable, phantom = np.array([True, False, True, True]), np.array([False, False, True, False])
    fast, slow = RunStore.create("fast", {}), RunStore.create("slow", {})
    for step in (1, 2):
        fast.log_step(step, {"train/reward": 0.5},
                      StepGroups(np.arange(4), [f"q{i}" for i in range(4)], 2, mean, std, trainable, phantom),
                      StepRollouts(names, group, idx, total, scores, texts, errors))
        slow.log_step(step, {"train/reward": 0.5},
                      pd.DataFrame({"group": np.arange(4), "prompt_id": [f"q{i}" for i in range(4)], "size": 2,
                                    "reward_mean": mean, "reward_std": std, "trainable": trainable,
                                    "phantom": phantom}),
                      [(int(g), int(i), float(t), dict(zip(names, map(float, row))), x, e)
                       for g, i, t, row, x, e in zip(group, idx, total, scores, texts, errors)])
    for table in ("scalars", "groups", "rollouts", "step_scores"):
        assert _table(fast, table) == _table(slow, table), table
    for text in (True, False):
        pd.testing.assert_frame_equal(fast.rollouts(with_text=text), slow.rollouts(with_text=text), check_exact=True)
    pd.testing.assert_frame_equal(fast.groups(), slow.groups())
    # iterating the columns gives the tuples (what the W&B mirror reads)
    r = StepRollouts(names, group, idx, total, scores, texts, errors)
    assert list(r)[7] == (3, 1, total[7], dict(zip(names, scores[7].tolist())), None, None) and len(r) == 8
    # rows out of (group, idx) order and a step written twice merge as tuples do
    order = np.array([7, 0, 5, 2, 1, 6, 3, 4])
    fast.log_step(3, {}, None, StepRollouts(names, group[order], idx[order], total[order], scores[order],
                                              [texts[k] for k in order], [errors[k] for k in order]))
    slow.log_step(3, {}, None, [(int(group[k]), int(idx[k]), float(total[k]), dict(zip(names, scores[k].tolist())),
                                 texts[k], errors[k]) for k in order])
    again = np.array([1, 4])
    fast.log_step(3, {}, None, StepRollouts(names, group[again], idx[again], total[again] + 1, scores[again] / 2,
                                              ["new", "new"], [None, "late"]))
    slow.log_step(3, {}, None, [(int(group[k]), int(idx[k]), float(total[k] + 1), dict(zip(names, (scores[k] / 2).tolist())),
                                 "new", e) for k, e in zip(again, [None, "late"])])
    for table in ("rollouts", "step_scores"):
        assert _table(fast, table) == _table(slow, table), table
    assert fast.rollouts(step=3, with_text=False)["error"].tolist()[4] == "late"
    # a non-finite score in the columns is stored as NaN, as a failed metric (None) is
    nan_scores = scores.copy()
    nan_scores[0, 1], nan_scores[1, 1] = np.nan, np.inf
    fast.log_step(4, {}, None, StepRollouts(names, group, idx, total, nan_scores, texts, errors))
    slow.log_step(4, {}, None, [(int(g), int(i), float(t), dict(zip(names, row)), x, e)
                                for g, i, t, row, x, e in zip(group, idx, total, nan_scores.tolist(), texts, errors)])
    assert _table(fast, "step_scores") == _table(slow, "step_scores")
    assert fast.rollouts(step=4, with_text=False)["exact"].isna().tolist()[:3] == [True, True, False]
    with pytest.raises(ValueError, match="different lengths"):
        StepRollouts(names, group, idx, total, scores, texts[:3], errors)
    with pytest.raises(ValueError, match="different lengths"):
        StepGroups(np.arange(4), ["q"], 2, mean, std, trainable, phantom)


def test_several_steps_in_one_transaction_are_all_there_or_none(runs_dir):
    s = RunStore.create("batch", {})
    good = [(k, {"train/reward": k / 10}, None, [(0, 0, 0.5, {"exact": 1.0}, "x", None)], [("lifecycle", {"k": k})])
            for k in (1, 2)]
    bad = (3, {"train/reward": 0.3}, None, [(0, 0, 0.5, {"exact": "yes"}, "x", None)], [])
    with pytest.raises(StoreError, match="must be a number"):
        s.log_steps(good + [bad])
    assert s.last_step() is None and s.rollouts().empty and s.events().empty  # nothing of the batch
    s.log_steps(good + [(5, {"train/reward": 0.5}, None, None, [("lifecycle", {"k": 5})], 123.0)])
    assert s.scalars_wide()["train/reward"].tolist() == [0.1, 0.2, 0.5]
    ev = s.events()
    assert ev["step"].tolist() == [1, 2, 5] and ev["time"].iloc[2] == 123.0  # a step's own event time, when given


def test_a_step_larger_than_one_insert_statement_is_stored_whole(runs_dir):
    """More rollouts than one multi-row statement takes (ROWS_PER_STATEMENT): every row, in
    order, as the tuples store them."""
    n = 2 * ROWS_PER_STATEMENT + 7
    group, idx = np.arange(n) // 8, np.arange(n) % 8
    scores = np.random.default_rng(1).random((n, 2))
    fast, slow = RunStore.create("big-fast", {}), RunStore.create("big-slow", {})
    fast.log_step(1, {}, None, StepRollouts(["a", "b"], group, idx, scores.sum(1), scores, ["t"] * n, [None] * n))
    slow.log_step(1, {}, None, [(int(g), int(i), float(a + b), {"a": float(a), "b": float(b)}, "t", None)
                                for g, i, (a, b) in zip(group, idx, scores)])
    assert len(_table(fast, "rollouts")) == n and _table(fast, "rollouts") == _table(slow, "rollouts")
    assert _table(fast, "step_scores") == _table(slow, "step_scores")
