"""Starting a pilot from the dashboard: the pilot page's form as a config, and a detached `python -m grpo_core pilot` process.

The process is spawned exactly as processes.start_run spawns a trainer, so a pilot shows
in the runs list, stops and fails the same way; the page polls its store for progress.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from grpo_core.analysis.pilot import DEFAULT_BATCHES
from grpo_core.dashboard import processes
from grpo_core.dashboard.access import check_ui_config
from grpo_core.dashboard.processes import CONFIG_NAME, as_config
from grpo_core.runs.config import DEMO_WEIGHTS, RunConfig, from_dict, validate
from grpo_core.runs.locations import check_run_id, new_run_id, runs_dir
from grpo_core.runs.store import RunStore


def pilot_config(level: int = 1, model_path: str = "", group_size: int = 8, prompts: int = 8,
                 batches: int = DEFAULT_BATCHES, temperature: float = 1.0, weights: dict | None = None,
                 base: RunConfig | dict | None = None) -> RunConfig:
    """The page's form -> a validated RunConfig (grpo.steps = pilot batches). Bad values
    raise ConfigError naming the field."""
    cfg = from_dict(base) if isinstance(base, dict) else (base or RunConfig())
    cfg.task.level, cfg.model.path = int(level), str(model_path or "").strip()
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.steps = int(group_size), int(prompts), int(batches)
    cfg.grpo.temperature = float(temperature)
    cfg.reward.weights = dict(DEMO_WEIGHTS if weights is None else weights)
    cfg.log.progress = False  # a detached process: no terminal for a progress bar
    return validate(cfg)


def pilot_command(run_dir: Path, run_id: str, root: Path, batches: int) -> list[str]:
    return [sys.executable, "-m", "grpo_core", "pilot", "--config", str(run_dir / CONFIG_NAME),
            "--run-id", run_id, "--runs-dir", str(root), "--set", f"grpo.steps={int(batches)}"]


def start_pilot(cfg: RunConfig | dict | None = None, run_id: str | None = None, root=None,
                untrusted: bool = False) -> str:
    """Validate, create the pilot store (status created) and config.toml, spawn
    `python -m grpo_core pilot` detached exactly as processes.start_run spawns a trainer (own
    session, output to trainer.log, pid recorded, child reaped, a start-up crash recorded);
    return the run id. The page polls the store for progress."""
    cfg = as_config(cfg)  # bad input stops here: no store, no process
    root = runs_dir(root)
    if untrusted:  # from the pilot page's form: no custom code, typed paths inside the allowed folders
        cfg = check_ui_config(cfg, root)
    run_id = check_run_id(run_id or new_run_id("pilot"))
    run_dir = root / run_id
    with RunStore.create(run_id, cfg.to_dict(), root=root, kind="pilot") as store:
        (run_dir / CONFIG_NAME).write_text(cfg.to_toml())
        store.set_meta(launched=time.time())
    return processes.spawn(run_dir, run_id, root, pilot_command(run_dir, run_id, root, cfg.grpo.steps))
