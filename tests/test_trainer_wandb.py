"""The embedded trainer with `log.wandb = "offline"`: a real trainer process mirrors every
step into a local W&B run, which imports back with the store's scalars. Nothing is sent
anywhere (offline)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from grpo_core.integrations.importers import import_path
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

pytestmark = pytest.mark.slow


def test_trainer_mirrors_every_step_to_an_offline_wandb_run(runs_dir):
    args = [sys.executable, "-m", "grpo_core", "train", "--run-id", "mirrored", "--runs-dir", str(runs_dir),
            "--set", "grpo.steps=4", "--set", "grpo.prompts_per_step=2", "--set", "grpo.group_size=4",
            "--set", "grpo.max_new_tokens=8", "--set", "model.warm_start_steps=0",
            "--set", "log.checkpoint_every=0", "--set", "log.progress=false", "--set", "log.wandb=offline"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    folders = list((runs_dir / "mirrored" / "wandb").glob("offline-run-*"))
    assert len(folders) == 1  # offline: a local run folder, nothing uploaded
    with RunStore.open(runs_dir / "mirrored", readonly=True) as s:
        ours = s.scalars_wide()
    back = import_path("wandb", folders[0], run_id="mirrored-back")
    with RunStore.open(back, readonly=True) as s:
        theirs = s.scalars_wide()
    assert list(theirs.index) == [1, 2, 3, 4]
    for name in (names.TRAINABLE_RATIO, names.CUM_GROUPS_TRAINABLE, names.REWARD, names.REWARD_STD, names.metric_weight("exact")):
        np.testing.assert_allclose(theirs[name].to_numpy(), ours[name].to_numpy(), rtol=1e-6)
