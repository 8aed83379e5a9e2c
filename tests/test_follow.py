"""`watch` on the sources besides verl (tests/test_verl.py): a TRL output dir (its newest
checkpoint's trainer_state.json, a real TRL run's) and a W&B run file that ends with its exit
record (the run then finishes)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.integrations import follow, trl_state
from grpo_core.runs import names
from grpo_core.runs.run_meta import FINISHED, RUNNING
from grpo_core.runs.store import RunStore
from tests.test_importers import FIXTURE, history_record, wandb_log


def test_a_trl_output_dir_is_read_from_its_newest_checkpoint(tmp_path):
    out = tmp_path / "out"
    for step in (5, 10):
        (out / f"checkpoint-{step}").mkdir(parents=True)
    shutil.copy(FIXTURE, out / "checkpoint-10" / "trainer_state.json")
    (out / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"log_history": []}))
    assert main(["watch", "trl", str(out), "--run-id", "t", "--runs-dir", str(tmp_path / "runs"), "--polls", "1"]) == 0
    entries = [e for e in json.loads(FIXTURE.read_text())["log_history"] if "frac_reward_zero_std" in e]
    with RunStore.open(tmp_path / "runs" / "t", readonly=True) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert meta["status"] == RUNNING and meta["source"] == "trl"  # a TRL dir says nothing of its end
    for e in entries:
        assert wide.loc[e["step"], names.TRAINABLE_RATIO] == pytest.approx(1 - e["frac_reward_zero_std"])


def test_a_wandb_run_that_has_ended_finishes_the_watched_run(tmp_path):
    from wandb.proto import wandb_internal_pb2
    exit_record = wandb_internal_pb2.Record()
    exit_record.exit.exit_code = 0
    recs = [history_record(s, {"train/reward": s / 10, "_step": s}) for s in range(1, 4)]
    run_dir = tmp_path / "wandb" / "offline-run-1"
    run_dir.mkdir(parents=True)
    (run_dir / "run-1.wandb").write_bytes(wandb_log(recs + [exit_record.SerializeToString()]))
    rid = follow.follow("wandb", run_dir, root=tmp_path / "runs", log=lambda m: None)
    with RunStore.open(tmp_path / "runs" / rid, readonly=True) as s:
        assert s.get_meta()["status"] == FINISHED and s.scalars_wide()[names.REWARD].tolist() == [0.1, 0.2, 0.3]


def test_watch_errors_are_one_line(tmp_path, capsys):
    assert main(["watch", "nope", str(tmp_path)]) == 2
    assert "watch kind must be one of trl, wandb, tensorboard, verl" in capsys.readouterr().err
    assert main(["watch", "trl", str(tmp_path / "missing")]) == 2
    assert "no such file or folder to watch" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no trainer_state.json yet and no completions"):
        trl_state.read_trl_path(Path(tmp_path))
