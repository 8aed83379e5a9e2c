"""The ART monitor and the ART importers, on the real openpipe-art package (0.5.18): its
TrajectoryGroup/Trajectory types, gather_trajectory_groups with after_each, its own trainable
count (metrics_taxonomy.summarize_trajectory_groups) and its own writers (Model.log writes
history.jsonl and the parquet trajectory files offline; trajectory_migration writes the legacy
JSONL). No backend, no model, no GPU: the rollout function is a stub."""
from __future__ import annotations

import asyncio
import os
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch of its price list
from transformers import masking_utils  # noqa: E402

_MASK_ARGUMENTS = masking_utils._preprocess_mask_arguments
art = pytest.importorskip("art")
# `import art` replaces transformers' masking_utils._preprocess_mask_arguments for its own
# backend, with a signature of an older transformers: every later model forward in this
# pytest process would fail. Nothing here runs a model, so the original goes back.
masking_utils._preprocess_mask_arguments = _MASK_ARGUMENTS

from grpo_core.dashboard import advice, live_cards, live_view  # noqa: E402
from grpo_core.errors import ConfigError  # noqa: E402
from grpo_core.integrations.art import ArtMonitor  # noqa: E402
from grpo_core.integrations.art_steps import REWARD_METRIC  # noqa: E402
from grpo_core.integrations.importers import import_path  # noqa: E402
from grpo_core.runs import names, requests  # noqa: E402
from grpo_core.runs.store import RunStore  # noqa: E402

G = 4  # trajectories per group


async def rollout(scenario: int, i: int, step: int) -> "art.Trajectory":
    """A stub agent: scenario s answers right on trajectory i when (i + s + step) % (s + 1) == 0,
    so some groups are all right or all wrong (not trainable, by ART's rule) and some mixed."""
    correct = float((i + scenario + step) % (scenario + 1) == 0) if scenario else 1.0
    fmt = float(i % 2)
    return art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{scenario}"},
                              {"role": "assistant", "content": f"answer {i} to q{scenario}"}],
        reward=correct, metrics={"correct": correct, "format": fmt, "completion_tokens": 3},
        metadata={"scenario_id": f"s{scenario}"})


async def gather(step: int, monitor: ArtMonitor | None = None, scenarios: int = 5):
    groups = (art.TrajectoryGroup(rollout(s, i, step) for i in range(G)) for s in range(scenarios))
    return await art.gather_trajectory_groups(groups, pbar_desc=None,
                                              after_each=monitor.after_each if monitor else None)


def art_counts(groups) -> tuple[int, int]:
    from art.metrics_taxonomy import summarize_trajectory_groups
    s = summarize_trajectory_groups(groups)
    return s.num_groups_submitted, s.num_groups_trainable


def run_loop(monitor: ArtMonitor, steps: int, trained: list | None = None) -> list:
    """The ART loop: gather, monitor.step before model.train (here: remember what would train)."""
    seen = []
    for step in range(steps):
        groups = asyncio.run(gather(step, monitor))
        seen.append(art_counts(groups))
        kept = monitor.step(groups)
        if monitor.should_stop:
            break
        if trained is not None:
            trained.append(kept)
    return seen


@pytest.fixture
def art_run(runs_dir):
    monitor = ArtMonitor(run_id="art-run", runs_dir=runs_dir, steps=3)
    counts = run_loop(monitor, 3)
    monitor.finish()
    return runs_dir / "art-run", counts


def test_groups_rollouts_and_scalars_match_arts_own_counts(art_run):
    run, counts = art_run
    with RunStore.open(run, readonly=True) as s:
        wide = s.scalars_wide()
        groups, rollouts = s.groups(), s.rollouts(with_text=True)
        meta = s.get_meta()
    assert list(wide.index) == [1, 2, 3] and meta["status"] == "finished" and meta["kind"] == "art"
    for step, (submitted, trainable) in zip(wide.index, counts):
        row = wide.loc[step]
        assert row[names.GROUPS_SUBMITTED] == submitted and row[names.GROUPS_TRAINABLE] == trainable
        assert row[names.TRAINABLE_RATIO] == trainable / submitted
        assert row[names.FRAC_REWARD_ZERO_STD] == pytest.approx(1 - trainable / submitted)
    assert wide[names.CUM_GROUPS_SUBMITTED].iloc[-1] == sum(c[0] for c in counts)
    assert len(groups) == 15 and len(rollouts) == 15 * G
    assert {"reward", "correct", "format"} <= set(rollouts.columns)  # completion_tokens is not a score
    assert rollouts["completion"].str.contains("assistant: answer").all()
    assert set(groups["prompt_id"]) == {f"s{k}" for k in range(5)}  # ART's scenario_id
    assert wide[names.metric_weight(REWARD_METRIC)].eq(1).all() and wide[names.metric_weight("correct")].eq(0).all()


def test_live_page_shows_the_run_with_what_if_at_the_recorded_ratio(art_run):
    run, _ = art_run
    state = live_view.load(str(run))
    caps = live_cards.capabilities(state)
    assert caps["what_if"] and not caps["imported"] and state.metrics[:1] == [REWARD_METRIC]
    cur = live_view.current_settings(state)
    wi = advice.what_if(state, cur["weights"], cur["min_group_std"])
    with RunStore.open(run, readonly=True) as s:
        wide = s.scalars_wide(since_step=state.last_step - wi["steps"])
    recorded = wide[names.GROUPS_TRAINABLE].sum() / wide[names.GROUPS_SUBMITTED].sum()
    assert wi["available"] and wi["now"] == pytest.approx(recorded)
    # what the format metric alone would have given: it varies in every group
    assert advice.what_if(state, {"format": 1.0}, 0.0)["predicted"] == 1.0


def test_a_weight_request_recomputes_trajectory_reward_from_the_named_metrics(runs_dir):
    monitor = ArtMonitor(run_id="w", runs_dir=runs_dir, apply_weights=True)
    run_loop(monitor, 1)
    rid = requests.send(runs_dir / "w", "set_weights", {"weights": {"reward": 0.0, "correct": 1.0, "format": 0.5}})
    groups = asyncio.run(gather(1, monitor))
    monitor.step(groups)
    for t in (t for g in groups for t in g.trajectories):  # the trajectories the loop trains on
        assert t.reward == t.metrics["correct"] + 0.5 * t.metrics["format"]
    monitor.finish()
    with RunStore.open(runs_dir / "w", readonly=True) as s:
        req = s.control().set_index("id").loc[rid]
        wide, rollouts = s.scalars_wide(), s.rollouts()
    assert req["status"] == "applied" and req["applied_step"] == 2
    assert wide.loc[2, names.metric_weight("format")] == 0.5 and wide.loc[1, names.metric_weight("format")] == 0
    step2 = rollouts[rollouts["step"] == 2]
    assert np.allclose(step2["total"], step2["correct"] + 0.5 * step2["format"])
    assert (step2["reward"] == step2["correct"]).all()  # the rollout function's own reward, kept as a score
    assert wide.loc[2, names.TRAINABLE_RATIO] == 1.0  # format varies in every group


def test_weights_are_refused_without_apply_weights(runs_dir):
    monitor = ArtMonitor(run_id="nw", runs_dir=runs_dir)
    rid = requests.send(runs_dir / "nw", "set_weights", {"weights": {"reward": 1.0}})
    groups = asyncio.run(gather(0))
    monitor.step(groups)
    monitor.finish()
    with RunStore.open(runs_dir / "nw", readonly=True) as s:
        req = s.control().set_index("id").loc[rid]
        assert s.get_meta()["accepts"] == ["set_threshold", "pause", "resume", "stop"]
    assert req["status"] == "rejected" and "apply_weights=True" in req["message"]
    assert {t.reward for g in groups for t in g.trajectories} == {0.0, 1.0}  # untouched


def test_drop_untrainable_returns_only_trainable_groups(runs_dir):
    monitor = ArtMonitor(run_id="d", runs_dir=runs_dir, drop_untrainable=True)
    groups = asyncio.run(gather(0, monitor))
    submitted, trainable = art_counts(groups)  # after_each dropped the untrainable ones already
    kept = monitor.step()  # the staged groups: every group gathered is recorded
    monitor.finish()
    assert trainable == submitted == len(kept) and 0 < len(kept) < 5
    with RunStore.open(runs_dir / "d", readonly=True) as s:
        assert s.scalars_wide().loc[1, names.GROUPS_SUBMITTED] == 5


def test_pause_blocks_between_steps_and_stop_ends_the_loop(runs_dir):
    monitor = ArtMonitor(run_id="p", runs_dir=runs_dir)
    run_loop(monitor, 1)
    db = runs_dir / "p"
    requests.send(db, "pause", {})
    done = []
    worker = threading.Thread(target=lambda: done.append(run_loop(monitor, 3)))
    worker.start()
    deadline = time.time() + 20
    while not monitor.paused and time.time() < deadline:
        time.sleep(0.05)
    with RunStore.open(db, readonly=True) as s:
        assert s.get_meta()["status"] == "paused" and s.last_step() == 1  # blocked before step 2 trains
    requests.send(db, "stop", {})
    worker.join(timeout=20)
    assert done and monitor.should_stop
    monitor.finish()
    with RunStore.open(db, readonly=True) as s:
        assert s.get_meta()["status"] == "stopped" and s.last_step() == 1
        assert list(s.control()["status"]) == ["applied", "applied"]


def test_astep_in_an_async_loop_and_a_reused_run_id_is_refused(runs_dir):
    async def loop():
        monitor = ArtMonitor(run_id="a", runs_dir=runs_dir)
        for step in range(2):
            await monitor.astep(await gather(step))
        monitor.finish()
    asyncio.run(loop())
    with RunStore.open(runs_dir / "a", readonly=True) as s:
        assert s.last_step() == 2
    with pytest.raises(ConfigError, match="already has 2 steps"):
        ArtMonitor(run_id="a", runs_dir=runs_dir)
    resumed = ArtMonitor(run_id="a", runs_dir=runs_dir, resume=True)
    resumed.step(asyncio.run(gather(2)))
    resumed.finish()
    with RunStore.open(runs_dir / "a", readonly=True) as s:
        assert s.scalars_wide()[names.CUM_GROUPS_SUBMITTED].tolist() == [5, 10, 15]


def test_bad_input_is_one_line_naming_the_field(runs_dir):
    with pytest.raises(ConfigError, match="apply_weights=True"):
        ArtMonitor(run_id="b1", runs_dir=runs_dir, weights={"correct": 1.0})
    monitor = ArtMonitor(run_id="b2", runs_dir=runs_dir)
    with pytest.raises(ConfigError, match="expected art.TrajectoryGroup"):
        monitor.step([{"reward": 1}])
    bad = art.TrajectoryGroup([art.Trajectory(messages_and_choices=[], reward=1.0, metrics={"reward": 1.0})])
    with pytest.raises(ConfigError, match="metric named 'reward'"):
        monitor.step([bad])
    monitor.finish()


# ---- importers, on files ART's own code wrote -------------------------------------------------------
def write_art_outputs(tmp_path, steps: int = 3):
    """ART's Model.log (a plain art.Model: no backend) writes history.jsonl and
    trajectories/train/<step>.parquet; the legacy JSONL comes from ART's own serializer."""
    from art.utils.trajectory_migration import serialize_trajectory_groups
    model = art.Model(name="m", project="p", base_path=str(tmp_path / ".art"), report_metrics=[])
    counts = {}
    for step in range(1, steps + 1):
        groups = asyncio.run(gather(step))
        counts[step] = art_counts(groups)
        asyncio.run(model.log(groups, split="train", step=step))
        (tmp_path / f"{step:04d}.jsonl").write_text(serialize_trajectory_groups(groups))
    return tmp_path / ".art" / "p" / "models" / "m", counts


def _check_ratio(run, counts):
    with RunStore.open(run, readonly=True) as s:
        wide = s.scalars_wide()
    for step, (submitted, trainable) in counts.items():
        assert wide.loc[step, names.GROUPS_SUBMITTED] == submitted
        assert wide.loc[step, names.TRAINABLE_RATIO] == trainable / submitted
        assert wide.loc[step, names.FRAC_REWARD_ZERO_STD] == pytest.approx(1 - trainable / submitted)
    return wide


def test_history_jsonl_imports_with_ratio_trainable_over_submitted(tmp_path, runs_dir):
    out, counts = write_art_outputs(tmp_path)
    rid = import_path("art", out / "history.jsonl")
    wide = _check_ratio(runs_dir / rid, counts)
    assert wide.loc[3, names.CUM_GROUPS_SUBMITTED] == 15
    assert names.metric_mean("correct") in wide.columns and names.REWARD in wide.columns


def test_trajectory_files_and_the_output_dir_import_with_groups(tmp_path, runs_dir):
    out, counts = write_art_outputs(tmp_path)
    rid = import_path("art", tmp_path / "0002.jsonl")  # legacy JSONL: one step
    _check_ratio(runs_dir / rid, {2: counts[2]})
    rid = import_path("art", out / "trajectories" / "train" / "0003.parquet")
    _check_ratio(runs_dir / rid, {3: counts[3]})
    rid = import_path("art", out)  # the model output dir: history + every step's trajectories
    _check_ratio(runs_dir / rid, counts)
    with RunStore.open(runs_dir / rid, readonly=True) as s:
        assert len(s.groups()) == 15 and len(s.rollouts()) == 15 * G and s.get_meta()["lacks"] == []
    state = live_view.load(str(runs_dir / rid))
    assert advice.what_if(state, {"reward": 1.0}, 0.0)["available"]


def test_a_wrong_art_file_is_refused_with_one_line(tmp_path):
    bad = tmp_path / "history.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ConfigError, match="line 1 is not JSON"):
        import_path("art", bad)
    (tmp_path / "traj.jsonl").write_text('{"trajectories": []}\n')
    with pytest.raises(ConfigError, match="named after its step"):
        import_path("art", tmp_path / "traj.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="expected an ART model output dir"):
        import_path("art", tmp_path / "empty")


def test_docs_art_example_runs_as_written(tmp_path):
    """docs/integrations.md's ART example (its ```py block), offline: a stub rollout, no backend."""
    import re
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    text = (repo / "docs" / "integrations.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"```py\n(.*?)```", text, re.S)
    (tmp_path / "example.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(repo), "GRPO_HEALTH_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with RunStore.open(tmp_path / "runs" / "art-demo", readonly=True) as s:
        assert s.get_meta()["status"] == "finished" and s.last_step() == 3 and len(s.groups()) == 18
