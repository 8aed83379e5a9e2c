"""How steps reach the store (grpo_core/runs/writer.py), on real run stores, alone and inside the
real trainer loop: the default batched commits (steps kept until commit_every_s has passed,
one transaction for them, a failure that keeps every step before it) and a commit per step.
For both: the same failed status as when the loop commits each step itself, checkpoints and
control answers never ahead of the steps they refer to, and every step stored before the
final status."""
import time

import pandas as pd
import pytest
import torch

from grpo_core.errors import StoreError
from grpo_core.runs import names
from grpo_core.runs.live_settings import PAUSE, SET_THRESHOLD
from grpo_core.runs.run_meta import FAILED, FINISHED, RUNNING, STOPPED
from grpo_core.runs.store import EV_ALERT, EV_CHANGE, RunStore
from grpo_core.runs.writer import BatchedWrites
from grpo_core.tasks.loading import load_config
from grpo_core.train import checkpoints, trainer

torch.set_num_threads(1)

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=6",
        "log.progress=false", "log.checkpoint_every=0"]


def _store(tmp_path, run_id="w") -> RunStore:
    return RunStore.create(run_id, {}, root=tmp_path)


def _step(k: int, score=0.5):
    groups = pd.DataFrame({"group": [0], "prompt_id": ["p"], "size": [2], "reward_mean": [0.5], "reward_std": [0.5],
                           "trainable": [True], "phantom": [False]})
    rollouts = [(0, i, float(i), {"exact": score}, f"text {k}.{i}", None) for i in range(2)]
    return {names.REWARD: 0.1 * k}, groups, rollouts, [(EV_ALERT, {"kind": "x", "step": k})]


def _reader(store: RunStore) -> RunStore:
    return RunStore.open(store.path, readonly=True)


def test_has_pending_requests_reads_without_the_write_lock(tmp_path):
    store = _store(tmp_path)
    store.set_status(RUNNING)
    assert not store.has_pending()
    rid = store.request(PAUSE, {})
    blocker = RunStore(store.path)
    blocker.conn.execute("BEGIN IMMEDIATE")  # a writer mid-transaction does not hold the check up
    assert store.has_pending()
    blocker.conn.execute("ROLLBACK")
    blocker.close()
    assert [r["id"] for r in store.claim_pending()] == [rid] and not store.has_pending()


def test_batched_writes_commit_the_kept_steps_together_once_their_time_is_up(tmp_path, monkeypatch):
    store = _store(tmp_path)
    commits = []
    real = RunStore.log_steps
    monkeypatch.setattr(RunStore, "log_steps", lambda self, steps: (commits.append([s[0] for s in steps]),
                                                                     real(self, steps))[1])
    w = BatchedWrites(store, commit_every_s=3600)
    for k in range(1, 4):
        w.submit("log_step", k, *_step(k))
        time.sleep(0.01)
    with _reader(store) as r:
        assert r.last_step() is None and w.busy()  # kept: nothing committed before its time
    w.flush()
    assert commits == [[1, 2, 3]] and not w.busy() and w.calls == 3  # one transaction for the three
    with _reader(store) as r:
        assert r.scalars_wide()[names.REWARD].round(3).tolist() == [0.1, 0.2, 0.3]
        assert r.rollouts()["completion"].tolist() == [f"text {k}.{i}" for k in (1, 2, 3) for i in range(2)]
        ev = r.events(kinds=[EV_ALERT])
        assert ev["step"].tolist() == [1, 2, 3] and ev["time"].is_monotonic_increasing
        assert ev["time"].iloc[2] - ev["time"].iloc[0] >= 0.015  # each event keeps its own step's time
    now = BatchedWrites(store, commit_every_s=0)  # 0: a commit per step
    now.submit("log_step", 4, *_step(4))
    assert store.last_step() == 4 and commits[-1] == [4]
    soon = BatchedWrites(store, commit_every_s=0.05)
    soon.submit("log_step", 5, *_step(5))
    time.sleep(0.06)
    soon.submit("log_step", 6, *_step(6))  # the time is up: 5 and 6 go together
    assert commits[-1] == [5, 6] and store.last_step() == 6
    with pytest.raises(ValueError, match="log_step calls only"):
        soon.submit("add_event", "x", {})


def test_a_failed_batch_keeps_every_step_before_the_bad_one_and_raises_its_error(tmp_path):
    store = _store(tmp_path)
    w = BatchedWrites(store, commit_every_s=3600)
    w.submit("log_step", 1, *_step(1))
    w.submit("log_step", 2, *_step(2))
    w.submit("log_step", 3, *_step(3, score=object()))  # the store refuses it (not a number)
    w.submit("log_step", 4, *_step(4))
    with pytest.raises(Exception) as e:
        w.flush()
    assert "not JSON serialisable" in str(e.value) or "must be a number" in str(e.value)
    assert store.last_step() == 2  # 1 and 2 kept, nothing after the failed step: contiguous
    assert [k[0] for k in w.kept] == [3, 4] and w.busy()  # the failed step and those after it, not lost silently
    assert w.calls == 2  # the two steps written one by one are counted
    w.close(raise_error=False)  # a close while the error is on its way out does not raise again
    assert store.last_step() == 2


# ---- inside the trainer loop -----------------------------------------------------------------------
# How the loop's steps reach the store: batched commits (10 s: nothing commits on time in these
# short runs, only where the trainer flushes), a commit per step.
WRITES = {"batched": ["log.commit_every_s=10"], "per step": ["log.commit_every_s=0"]}


def _trainer(tmp_path, extra=(), run_id="r"):
    cfg = load_config(None, TINY + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path, exist_ok=True)
    return trainer.Trainer(cfg, store, log=lambda m: None), store


@pytest.fixture
def slow_writes(monkeypatch):
    """A slow disk: every write of steps takes 60 ms."""
    real = RunStore.log_steps

    def slow(self, *a, **kw):
        time.sleep(0.06)
        return real(self, *a, **kw)
    monkeypatch.setattr(RunStore, "log_steps", slow)


@pytest.mark.parametrize("writes", list(WRITES))
def test_checkpoints_and_control_answers_are_never_ahead_of_the_stored_steps(tmp_path, monkeypatch, slow_writes,
                                                                              writes):
    tr, store = _trainer(tmp_path, ["grpo.steps=6", "log.checkpoint_every=2"] + WRITES[writes])
    reader = _reader(store)
    at_ckpt, at_answer, at_status = [], [], []
    save = trainer.models.save_pretrained
    monkeypatch.setattr(trainer.models, "save_pretrained", lambda *a, **k: (at_ckpt.append((tr.step, reader.last_step())),
                                                                     save(*a, **k))[1])
    resolve = RunStore.resolve_request
    monkeypatch.setattr(RunStore, "resolve_request", lambda self, *a, **k: (
        at_answer.append((tr.step, reader.last_step())), resolve(self, *a, **k))[1])
    set_status = RunStore.set_status
    monkeypatch.setattr(RunStore, "set_status", lambda self, status, *a, **k: (
        at_status.append((status, tr.step, reader.last_step())), set_status(self, status, *a, **k))[1])
    step = tr.train_step

    def step_and_ask():  # the dashboard asks while step 3 trains
        if tr.step == 2:
            RunStore(store.path).request(SET_THRESHOLD, {"min_group_std": 0.02})
        return step()
    tr.train_step = step_and_ask
    assert tr.run() == FINISHED
    assert tr.writer is None  # closed and joined
    assert at_ckpt == [(2, 2), (4, 4), (6, 6)]  # a checkpoint at step N: steps <= N are in the store
    assert at_answer == [(3, 3)]  # answered at the boundary after step 3, with step 3 stored
    assert at_status[-1] == (FINISHED, 6, 6)  # the final status after the last step is committed
    ev = store.events(kinds=[EV_CHANGE])
    assert ev["step"].tolist() == [4] and store.scalars_wide()[names.MIN_GROUP_STD].tolist() == [0.01] * 3 + [0.02] * 3
    reader.close()


@pytest.mark.parametrize("writes", list(WRITES))
def test_a_stop_commits_every_step_before_the_final_status(tmp_path, monkeypatch, slow_writes, writes):
    tr, store = _trainer(tmp_path, ["grpo.steps=50"] + WRITES[writes])
    step = tr.train_step

    def step_then_signal():  # SIGTERM during step 4: the handler sets stop_reason
        out = step()
        if tr.step == 3:
            tr.stop_reason = "SIGTERM"
        return out
    tr.train_step = step_then_signal
    assert tr.run() == STOPPED
    assert store.last_step() == 4 and store.get_meta()["status"] == STOPPED
    assert checkpoints.latest_checkpoint(store.run_dir).name == "step-000004"


@pytest.mark.parametrize("writes", list(WRITES))
def test_a_failed_write_fails_the_run_as_the_loop_writing_itself_does(tmp_path, writes):
    """The store refuses step 3 (in a batch with steps 1-2, or in the loop): status failed, the
    same last error line, steps 1-2 kept, the open request rejected, and no checkpoint past step 2."""
    tr, store = _trainer(tmp_path, ["grpo.steps=8", "log.checkpoint_every=3"] + WRITES[writes])
    step = tr.train_step

    def bad_step3():
        scalars, groups, rollouts = step()
        if tr.step == 2:  # the step being made is step 3: as tuples, one with a score that is not a number
            rollouts = list(rollouts)
            rollouts[0] = rollouts[0][:3] + ({**rollouts[0][3], "exact": object()},) + rollouts[0][4:]
        return scalars, groups, rollouts
    tr.train_step = bad_step3
    with pytest.raises(StoreError):
        tr.run_safely()
    meta = store.get_meta()
    assert meta["status"] == FAILED and store.last_step() == 2
    line = meta["error"]  # one line, the same whichever way the step was written; the traceback in the log
    assert "\n" not in line and line.startswith("score 'exact' of rollout (group 0, idx 0) of step 3 is <object"), line
    assert line.endswith(f"(traceback in {store.run_dir / 'trainer.log'})"), line
    assert checkpoints.latest_checkpoint(store.run_dir) is None  # the step-3 checkpoint never happened
    assert tr.writer is None


def test_every_way_of_writing_stores_what_a_commit_per_step_stores(tmp_path):
    """Same seed, same steps: the stored scalars (but timings), groups, rollouts (with and
    without text: the rollouts table and step_scores) and events are equal."""
    runs = {}
    for name, extra in WRITES.items():
        tr, store = _trainer(tmp_path / name.replace(" ", "-"), ["grpo.steps=4", "health.zero_trainable_steps=1"]
                             + extra)
        assert tr.run() == FINISHED
        w = store.scalars_wide()
        runs[name] = (w[[c for c in w.columns if not c.startswith(("time/", "throughput/"))]],
                      store.groups(), store.rollouts(), store.rollouts(with_text=False),
                      [(k, p) for k, p in zip(store.events()["kind"], store.events()["payload"]) if k != "checkpoint"])
    strip = lambda evs: [(k, {x: y for x, y in p.items() if x not in ("model",)}) for k, p in evs]  # noqa: E731
    base = runs["per step"]
    for got, want in zip(runs["batched"][:4], base[:4]):
        pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert strip(runs["batched"][4]) == strip(base[4])
    assert len(base[2]) == 4 * 2 * 4 and base[4]  # 4 steps of 2 x 4 rollouts, and alerts to compare
