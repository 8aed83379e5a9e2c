"""Checkpoint folders: each written to a temporary folder, then renamed into place.

So a half-written one is never loaded; the last CKPT_KEEP complete ones are kept. One that goes
(an older one, or one a resumed run writes again) is renamed out of sight before it is deleted, so
a trainer killed while deleting it leaves a hidden temporary folder, never a half checkpoint under
a step's name. A trainer's checkpoint holds its weights (the folder) and its training state
(`training_state`: the optimizer, the task's stream, the settings in force, the cumulative counts,
the alert and curriculum state), which `restore_training_state` puts back on every rank of a
resumed run."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from grpo_core.analysis.autopilot import AutopilotState
from grpo_core.runs import live_settings
from grpo_core.runs.run_meta import pid_alive
from grpo_core.train import models

CKPT_PREFIX = "step-"
CKPT_KEEP = 2  # complete checkpoints kept on disk


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first (a temp dir is never listed)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CKPT_PREFIX)
            and (p / "state.pt").is_file() and ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())]
    return sorted(done, key=lambda p: int(p.name[len(CKPT_PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] if dirs else None


def rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict):
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def write_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict) -> Path:
    """The model, its tokenizer and `state` (state.pt) as checkpoint `step` of the run; returns
    its folder. A failed write (disk full) leaves no half checkpoint behind."""
    root = Path(run_dir) / "checkpoints"
    final = root / f"{CKPT_PREFIX}{step:06d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    for old in root.glob(".tmp-*") if root.is_dir() else []:  # left by a killed trainer (never loaded)
        pid = old.name.rsplit("-", 1)[-1]
        if old == tmp or not (pid.isdigit() and pid_alive(int(pid))):
            shutil.rmtree(old, ignore_errors=True)
    try:
        models.save_pretrained(model, tokenizer, tmp)
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / "state.pt")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        _remove(final)
    os.rename(tmp, final)  # atomic: the folder is complete or absent
    for old in checkpoint_dirs(run_dir)[:-CKPT_KEEP]:
        _remove(old)
    return final


def _remove(folder: Path):
    """Rename a checkpoint out of sight (atomic), then delete it: a kill in between or during the
    deletion leaves a .tmp- folder, which the next write removes once this process is gone."""
    hidden = folder.with_name(f".tmp-{folder.name}-old-{os.getpid()}")
    shutil.rmtree(hidden, ignore_errors=True)  # an earlier removal of this name that did not finish
    try:
        os.rename(folder, hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)


def read_state(ckpt: Path) -> dict:
    """A checkpoint's state.pt (restore_training_state restores its random generators)."""
    return torch.load(Path(ckpt) / "state.pt", weights_only=False)


def training_state(trainer) -> dict:
    """What a checkpoint of the embedded trainer holds besides its weights."""
    return {"optimizer": trainer.optimizer.state_dict(), "task": trainer.task.state_dict(),
            "weights": dict(trainer.reward.weights), "cum": [trainer.cum_submitted, trainer.cum_trainable],
            "cum_tokens": list(trainer.cum_tokens), "skipper": trainer.skipper.state_dict(),
            "budget_history": trainer.history.state_dict(),
            "curriculum_streak": trainer.curriculum.streak, **trainer.alerts.state_dict(),
            "autopilot": trainer.autopilot.to_dict(), "autopilot_on": trainer.autopilot_on,
            "grpo_settings": {s.key: getattr(trainer.cfg.grpo, s.key)  # steps: RunMeta.resumed_budget
                              for s in live_settings.NUMBER_SETTINGS if s.replay}}


def restore_training_state(trainer, state: dict):
    """`training_state` (and "budget": the resumed step budget) back on `trainer`, its random
    generators too."""
    set_rng_state(state["rng"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.task.load_state_dict(state["task"])
    trainer.reward.set_weights(state["weights"])
    if "min_group_std" in state:  # a checkpoint written before grpo_settings held it
        trainer.cfg.grpo.min_group_std = state["min_group_std"]
    trainer.cum_submitted, trainer.cum_trainable = state["cum"]
    trainer.cum_tokens = tuple(state.get("cum_tokens", (0, 0)))
    trainer.skipper.load_state_dict(state.get("skipper"))
    trainer.history.load_state_dict(state.get("budget_history"))
    trainer.curriculum.streak = state.get("curriculum_streak", 0)
    trainer.alerts.load_state_dict(state, int(state["step"]))
    for k, v in state.get("grpo_settings", {}).items():  # changed mid-run by requests (steps: the budget)
        setattr(trainer.cfg.grpo, k, v)
    trainer.cfg.grpo.steps = state["budget"]
    trainer.autopilot = AutopilotState.from_dict(state.get("autopilot"))
    trainer.autopilot.stopped = False  # resuming is the user's call: the autopilot may act again
    trainer.autopilot_on = state.get("autopilot_on", trainer.autopilot_on)
    trainer.step = trainer.last_ckpt_step = int(state["step"])


def storage_message(store, why: str, runs_root) -> str:
    """The one line a run stopped by its disk ends with: where it stopped and how to go on."""
    try:  # the last step written, not the trainer's step (its write may be the one that failed)
        last = store.last_step() or 0
    except Exception:
        last = "?"
    if latest_checkpoint(store.run_dir) is None:
        return (f"cannot write to {store.run_dir} ({why}): stopped after step {last}, before any "
                "complete checkpoint; free space, then start the run again")
    return (f"cannot write to {store.run_dir} ({why}): stopped after step {last}; every step up to "
            f"it is kept. Free space, then continue: python -m grpo_core train --resume "
            f"--run-id {store.run_id} --runs-dir {runs_root}")
