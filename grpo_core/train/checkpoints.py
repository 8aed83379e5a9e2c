"""Checkpoint folders: each written to a temporary folder, then renamed into place.

So a half-written one is never loaded; the last CKPT_KEEP complete ones are kept. What goes
into a checkpoint's state is the trainer's business (Trainer.save_checkpoint); the folder
rules are here."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

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
        shutil.rmtree(final)
    os.rename(tmp, final)  # atomic: the folder is complete or absent
    for old in checkpoint_dirs(run_dir)[:-CKPT_KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(ckpt: Path) -> dict:
    """A checkpoint's state.pt; the random generators are restored from it."""
    state = torch.load(Path(ckpt) / "state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return state


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
