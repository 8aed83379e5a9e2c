"""Concurrency: many writers of requests against one real trainer, and dashboards watching
one run or several.

100 weight requests from 4 processes at random moments during a real trainer run: each
is applied exactly once, in request order, or rejected with a reason; none is lost,
duplicated or altered (control table, events and the logged reward/<m>/weight scalars
agree). Several browser sessions on one run: tests/test_browser_live.py
(test_two_browser_sessions_apply_at_once_both_applied_in_order, real Chromium); one
session watching several runs and independent sessions on different runs: AppTest here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.runs import names, store
from grpo_core.runs.config import DEMO_WEIGHTS
from tests.helpers_dashboard import REPO, app_test, synth_run, wait_for

SENDERS, PER_SENDER = 4, 25
SENDER = r'''
import json, random, sys, time
from pathlib import Path
from grpo_core.runs import requests
from grpo_core.runs.store import RunStore
run, name, go, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
rng = random.Random(100 + name)
metrics = ["answer_f1", "exact", "citation", "format", "length"]
while not go.exists():
    time.sleep(0.01)
sent = []
for i in range(%d):
    time.sleep(rng.uniform(0, 0.25))
    if i %% 6 == 5:  # a bad request written straight into the store (an old or buggy client): the trainer rejects it
        payload = {"weights": {rng.choice(metrics): -1.0}} if i %% 12 == 5 else {"weights": {"exakt": 0.5}}
        with RunStore.open(run) as s:
            rid = s.request("set_weights", payload, source=f"sender{name}")
        sent.append({"id": rid, "payload": payload, "valid": False})
    else:  # distinct values, 1-3 metrics at a time (a partial change keeps the other weights)
        payload = {"weights": {m: round(rng.uniform(0.05, 1.0), 4) for m in rng.sample(metrics, rng.randint(1, 3))}}
        rid = requests.send(run, "set_weights", payload, source=f"sender{name}")
        sent.append({"id": rid, "payload": payload, "valid": True})
out.write_text(json.dumps(sent))
''' % PER_SENDER


def last_step(run) -> int:
    with store.RunStore.open(run, readonly=True) as s:
        return s.last_step() or 0


@pytest.mark.slow
def test_100_weight_requests_from_4_processes_each_applied_once_in_order_or_rejected(runs_dir, tmp_path):
    rid, run = "busy", runs_dir / "busy"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "grpo_core", "train", "--run-id", rid, "--runs-dir", str(runs_dir)]
        + [a for s in ("grpo.steps=100000", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=8",
                       "model.warm_start_steps=0", "log.progress=false", "log.checkpoint_every=0")
           for a in ("--set", s)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "trainer.log", "w"),
        env={**os.environ, "GRPO_HEALTH_TORCH_THREADS": "1"})
    go = tmp_path / "go"
    senders = [subprocess.Popen([sys.executable, "-c", SENDER, str(run), str(k), str(go), str(tmp_path / f"s{k}.json")],
                                cwd=REPO, stderr=subprocess.PIPE, text=True) for k in range(SENDERS)]
    try:
        wait_for(lambda: last_step(run) >= 2, 240, what="the trainer's first steps")
        go.touch()  # all four start sending at once, then at random intervals
        for p in senders:
            assert p.wait(timeout=120) == 0, p.stderr.read()
        sent = sorted((r for k in range(SENDERS) for r in json.loads((tmp_path / f"s{k}.json").read_text())),
                      key=lambda r: r["id"])

        def all_resolved():
            with store.RunStore.open(run, readonly=True) as s:
                c = s.control()
            return c if len(c) == len(sent) and c["status"].isin(["applied", "rejected"]).all() else None
        ctl = wait_for(all_resolved, 120, what="every request resolved")
        with store.RunStore.open(run) as s:
            s.request("stop", {}, source="test")
        assert trainer.wait(timeout=120) == 0
    finally:
        for p in [trainer, *senders]:
            if p.poll() is None:
                p.kill()
                p.wait()

    with store.RunStore.open(run, readonly=True) as s:
        ctl, events, wide = s.control(), s.events(kinds=["change", "rejected"]), s.scalars_wide()
    ctl = ctl[ctl["kind"] == "set_weights"].set_index("id")
    # none lost, none duplicated, none altered
    assert len(sent) == SENDERS * PER_SENDER and sorted(ctl.index) == [r["id"] for r in sent]
    assert [ctl.loc[r["id"], "payload"] for r in sent] == [r["payload"] for r in sent]
    # valid -> applied with a step; invalid -> rejected naming the field
    for r in sent:
        row = ctl.loc[r["id"]]
        if r["valid"]:
            assert row["status"] == "applied" and row["applied_step"] >= 1, row.to_dict()
        else:
            assert row["status"] == "rejected" and row["applied_step"] != row["applied_step"], row.to_dict()
            assert ("must be >= 0" in row["message"]) or ("exakt: unknown metric" in row["message"]), row["message"]
    # applied in request order: applied_step never goes back as the id grows
    steps = ctl.loc[ctl["status"] == "applied", "applied_step"].astype(int).tolist()
    assert steps == sorted(steps) and len(set(steps)) > 5  # spread over many step boundaries
    # exactly one event per request, of the kind its status says
    ev = events.assign(rid=[p["request_id"] for p in events["payload"]])
    ev = ev[ev["rid"].isin(ctl.index)]
    assert sorted(ev["rid"]) == sorted(ctl.index)
    assert all(ev_kind == {"applied": "change", "rejected": "rejected"}[ctl.loc[i, "status"]]
               for i, ev_kind in zip(ev["rid"], ev["kind"]))
    # the weights the trainer logged at every step are the replay of the applied requests in id order
    weights, by_step = dict(DEMO_WEIGHTS), {}
    for i, row in ctl[ctl["status"] == "applied"].iterrows():
        weights = {**weights, **row["payload"]["weights"]}
        by_step[int(row["applied_step"])] = dict(weights)
    current = dict(DEMO_WEIGHTS)
    for step in wide.index:
        current = by_step.get(step, current)
        for m, w in current.items():
            assert wide.loc[step, f"reward/{m}/weight"] == pytest.approx(w), (step, m)
    assert wide.index[-1] >= max(steps)  # the last change was in force for a logged step too
    if os.environ.get("GRPO_HEALTH_CONC_REPORT"):  # numbers for docs/reliability.md
        per_step = ctl[ctl["status"] == "applied"].groupby("applied_step").size()
        Path(os.environ["GRPO_HEALTH_CONC_REPORT"]).write_text(json.dumps({
            "requests": len(sent), "applied": int((ctl["status"] == "applied").sum()),
            "rejected": int((ctl["status"] == "rejected").sum()), "apply_steps": int(per_step.size),
            "most_at_one_step": int(per_step.max()), "steps_logged": int(wide.index[-1]),
            "send_window_s": round(ctl["time"].max() - ctl["time"].min(), 2)}))


# ---- dashboards: one session watching several runs, several sessions on different runs ----------------------
def step_text(at: AppTest) -> str:
    texts = [p.proto.text for p in at.get("progress")]
    assert texts, "no progress bar on the live page"
    return texts[0]


def live(run_id: str) -> AppTest:
    at = app_test()
    at.session_state["run_id"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_one_session_switching_between_live_runs_sees_each_runs_own_data(runs_dir):
    stores = {rid: synth_run(runs_dir, rid, n, steps_total=total, seed=n)
              for rid, n, total in (("a", 5, 100), ("b", 9, 200), ("c", 13, 300))}
    at = live("a")
    for rid, want in (("a", "step 5 of 100"), ("b", "step 9 of 200"), ("c", "step 13 of 300"), ("a", "step 5 of 100")):
        at.sidebar.selectbox[0].set_value(rid).run()
        assert not at.exception and at.session_state["run_id"] == rid
        assert want in step_text(at), (rid, step_text(at))
    for rid, s in stores.items():  # every run grows while the session watches
        synth_run(runs_dir, rid, 3, store=s, start=s.last_step() + 1, steps_total={"a": 100, "b": 200, "c": 300}[rid])
    for rid, want in (("b", "step 12 of 200"), ("a", "step 8 of 100"), ("c", "step 16 of 300")):
        at.sidebar.selectbox[0].set_value(rid).run()
        assert want in step_text(at), (rid, step_text(at))  # no step cached from another run


def test_independent_sessions_on_different_runs_do_not_mix(runs_dir):
    totals = {"a": 100, "b": 200, "c": 300}
    stores = {rid: synth_run(runs_dir, rid, 4 + k, steps_total=totals[rid], seed=k)
              for k, rid in enumerate(totals)}
    sessions = {rid: live(rid) for rid in totals}
    for round_ in range(3):
        for rid, s in stores.items():
            synth_run(runs_dir, rid, 2, store=s, start=s.last_step() + 1, steps_total=totals[rid])
        for rid, at in sessions.items():
            at.run()
            assert not at.exception
            last = stores[rid].last_step()
            assert f"step {last} of {totals[rid]}" in step_text(at), (round_, rid, step_text(at))
            assert at.session_state["run_id"] == rid
    with store.RunStore.open(runs_dir / "a", readonly=True) as s:  # the sessions only read
        assert s.control().empty
    assert names.TRAINABLE_RATIO in stores["a"].scalar_names()
    for s in stores.values():
        s.close()
