"""W&B mirror: a real offline wandb run written by WandbMirror, read back by the importer
from its run-*.wandb file, gives the same scalars; tables, changes and failures behave."""
from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest

from grpo_core.errors import ConfigError
from grpo_core.integrations.importers import import_path
from grpo_core.integrations.wandb import WandbMirror
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

METRICS = ["answer_f1", "exact"]


def _step_data(rng, step):
    scalars = {names.GROUPS_SUBMITTED: 4, names.GROUPS_TRAINABLE: int(rng.integers(0, 5)), names.REWARD: float(rng.random()),
               names.REWARD_STD: float(rng.random() / 3), names.FRAC_REWARD_ZERO_STD: float(rng.random()),
               names.TRAINABLE_RATIO: float(rng.random()), names.LOSS_POLICY: float(rng.normal()),
               names.TIME_STEP: float(rng.random())}
    for m in METRICS:
        scalars[names.metric_mean(m)] = float(rng.random())
        scalars[names.metric_group_std(m)] = float(rng.random())
        scalars[names.metric_weight(m)] = 0.5 if step < 6 else (0.8 if m == "exact" else 0.2)
    groups = pd.DataFrame({"group": range(4), "prompt_id": [f"p{i}" for i in range(4)], "size": 2,
                           "reward_mean": rng.random(4), "reward_std": rng.random(4),
                           "trainable": [True, False, True, True], "phantom": False})
    rollouts = [(g, i, float(rng.random()), {m: float(rng.random()) for m in METRICS}, f"answer {g}.{i} [S1]", None)
                for g in range(4) for i in range(2)]
    return scalars, groups, rollouts


def test_offline_mirror_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    run_dir = tmp_path / "runs" / "mirror-run"
    mirror = WandbMirror("offline", "grpo-health-test", "mirror-run", run_dir,
                         {"grpo": {"steps": 12, "group_size": 2}, "reward": {"weights": {"answer_f1": 0.5, "exact": 0.5}}},
                         table_every=5)
    logged = {}
    for step in range(1, 13):
        scalars, groups, rollouts = _step_data(rng, step)
        mirror.log_step(step, scalars, groups, rollouts)
        logged[step] = scalars
        if step == 6:
            mirror.event("change", {"request_id": 1, "kind": "set_weights", "source": "ui",
                                    "request": {"weights": {"answer_f1": 0.2, "exact": 0.8}},
                                    "message": "applied at step 6"}, 6)
            mirror.event("alert", {"kind": "low_ratio", "severity": "warning", "message": "ratio 0.2 < 0.3"}, 6)
    mirror.finish()
    assert mirror.error is None

    folders = list((run_dir / "wandb").glob("offline-run-*-mirror-run"))  # offline: nothing sent anywhere
    assert len(folders) == 1
    tables = folders[0] / "files" / "media" / "table"
    groups_tables = sorted(tables.glob("groups_*.table.json"))
    assert len(groups_tables) == 2 and len(list(tables.glob("rollouts_*.table.json"))) == 2  # steps 5, 10
    t = json.loads(groups_tables[0].read_text())
    assert {"group", "prompt_id", "trainable", "step"} <= set(t["columns"]) and len(t["data"]) == 4
    changes = json.loads(next(tables.glob("changes_summary_*.table.json")).read_text())
    assert changes["data"][0][:2] == [6, "set_weights"]

    rid = import_path("wandb", folders[0], root=tmp_path / "imported")  # a run folder works too
    with RunStore.open(tmp_path / "imported" / rid, readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide.index.tolist() == list(range(1, 13))
    for step, scalars in logged.items():  # the same scalars, every one, exactly
        assert {k: wide.loc[step, k] for k in scalars} == scalars
    assert set(wide.columns) == set(logged[1])  # TRL aliases and tables are not extra metrics
    rep = meta["import_report"]
    assert rep["skipped"]["reward: alias the mirror logs for TRL-named charts (same values as train/reward)"] == 12
    assert rep["skipped"]["groups: not a scalar (table): only scalars are imported"] == 2
    assert meta["config"]["grpo"] == {"steps": 12, "group_size": 2} and meta["config"]["wandb"]["style"] == "grpo_core"
    assert meta["lacks"] == ["groups", "rollouts"]


def test_mirror_logs_trl_names_for_the_same_numbers(tmp_path):
    """The TRL-named aliases are in the W&B history itself (read with the importer's reader)."""
    from wandb.proto import wandb_internal_pb2

    from grpo_core.integrations.base import ImportReport
    from grpo_core.integrations.wandb_file import history_row, wandb_records

    mirror = WandbMirror("offline", "p", "alias-run", tmp_path, {})
    mirror.log_step(1, {names.REWARD: 0.25, names.REWARD_STD: 0.125, names.FRAC_REWARD_ZERO_STD: 0.5})
    mirror.finish()
    data = next(tmp_path.glob("wandb/offline-run-*/run-alias-run.wandb")).read_bytes()
    rows = []
    for blob in wandb_records(data, "f", ImportReport("wandb", "f")):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(blob)
        if rec.WhichOneof("record_type") == "history":
            rows.append(history_row(rec.history.item))
    assert len(rows) == 1
    assert rows[0]["reward"] == 0.25 and rows[0]["reward_std"] == 0.125 and rows[0]["frac_reward_zero_std"] == 0.5


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'offline' or 'online'"):
        WandbMirror("off", "p", "r", tmp_path, {})


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "grpo_core.integrations.wandb"
            and r.levelno == logging.WARNING]


def test_a_wandb_failure_disables_the_mirror_not_the_run(tmp_path, caplog):
    mirror = WandbMirror("offline", "p", "failing-run", tmp_path, {})

    def boom(*a, **k):
        raise OSError("disk full")

    mirror.run.log = boom
    mirror.log_step(1, {names.REWARD: 1.0})
    assert _warnings(caplog) == ["W&B mirror disabled after an error: OSError: disk full"]
    assert mirror.error == "OSError: disk full" and mirror.run is None
    mirror.log_step(2, {names.REWARD: 1.0})  # a no-op now, no second warning
    mirror.event("change", {"kind": "set_weights"}, 2)
    mirror.finish()
    assert len(_warnings(caplog)) == 1


def test_a_step_going_backwards_is_said_not_lost_quietly(tmp_path, caplog):
    mirror = WandbMirror("offline", "p", "back-run", tmp_path, {})
    mirror.log_step(3, {names.REWARD: 1.0})
    mirror.log_step(2, {names.REWARD: 1.0})
    assert _warnings(caplog) == ["W&B mirror: step 2 after step 3 is not logged (W&B steps must increase)"]
    mirror.finish()


# ---- project and entity: as wandb.init resolves them ---------------------------------------------
@pytest.mark.parametrize("configured, env, expected", [
    ("", None, "grpo-health"),  # nothing set: our default
    ("", "team-proj", "team-proj"),  # $WANDB_PROJECT beats our default
    ("mine", "team-proj", "mine"),  # a project in the config beats the env, as wandb.init(project=...) does
])
def test_the_project_is_the_configs_else_wandb_project_else_ours(tmp_path, monkeypatch, configured, env, expected):
    if env is None:
        monkeypatch.delenv("WANDB_PROJECT", raising=False)
    else:
        monkeypatch.setenv("WANDB_PROJECT", env)
    monkeypatch.setenv("WANDB_ENTITY", "my-team")
    mirror = WandbMirror("offline", configured, "proj-run", tmp_path, {})
    try:
        assert mirror.run.project == expected
        assert mirror.run.entity == "my-team"  # $WANDB_ENTITY, read when this mirror starts
    finally:
        mirror.finish()
