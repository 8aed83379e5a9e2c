"""Mirror a run into Weights & Biases, for people whose dashboards already live there.

The store stays the source of truth; the mirror is a copy that may lag or fail without
touching training: a W&B error disables the mirror (recorded in `self.error`, warned
once) instead of raising into the trainer.

- Every scalar under names.py's names, plus TRL's names for the same numbers where TRL
  has one (`reward`, `reward_std`, `frac_reward_zero_std`), so a W&B workspace built for
  TRL runs shows these charts too. Note: `reward_std` here is the mean within-group std
  (`train/reward_std`); TRL 1.x logs the std over all completions under that name.
  ART's `data/...` names are already ours.
- A per-group table and a rollout sample every `table_every` steps (wandb.Table).
- Events: weight/threshold changes and health alerts go to a `changes` / `alerts` table
  in the run summary; only an *online* run also raises a W&B alert (an email/Slack
  notice), since offline has nobody to notify.

Offline is the default and touches no network: WANDB_MODE=offline, files under
`<run_dir>/wandb/`, to be uploaded later with `wandb sync` if wanted. wandb is imported
only when a mirror is created.

Project and entity as wandb.init itself resolves them: a project set in the config
(log.wandb_project) wins, else $WANDB_PROJECT, else "grpo-health"; the entity is
$WANDB_ENTITY, else the account's default (read at each mirror's start: wandb itself reads its
environment once per process).
"""
from __future__ import annotations

import json
import logging
import os
import time

import pandas as pd

from grpo_core.errors import ConfigError
from grpo_core.integrations.wandb_file import wandb_file_finished
from grpo_core.runs import names
from grpo_core.runs.store import EV_ALERT, EV_CHANGE, EV_CHECKPOINT, EV_REJECTED

MODES = ("offline", "online")
DEFAULT_PROJECT = "grpo-health"  # when neither the config nor $WANDB_PROJECT names one
TRL_ALIASES = {names.REWARD: "reward", names.REWARD_STD: "reward_std"}  # frac_reward_zero_std is already TRL's name
ROLLOUT_TEXT_CHARS = 500  # enough to read a completion in a W&B table, not a megabyte per step


logger = logging.getLogger(__name__)


def project_name(configured: str | None) -> str:
    """The W&B project: the config's, else $WANDB_PROJECT, else DEFAULT_PROJECT. An explicit
    project beats the environment, as in wandb.init(project=...)."""
    return configured or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT


class WandbMirror:
    def __init__(self, mode: str = "offline", project: str | None = None, run_id: str | None = None,
                 run_dir: str | os.PathLike = ".", config: dict | None = None, table_every: int = 10,
                 max_table_rollouts: int = 64):
        if mode not in MODES:
            raise ConfigError(f"log.wandb must be 'offline' or 'online' for the mirror, got {mode!r}")
        self.mode, self.table_every, self.max_table_rollouts = mode, max(int(table_every), 1), max_table_rollouts
        self.error: str | None = None
        self._changes: list[list] = []
        self._alerts: list[list] = []
        self._last_step = -1
        self._last_event = 0  # the last store event mirrored (stored_step)
        # Set before importing wandb: it reads these at import and init. Offline never dials out.
        os.environ["WANDB_MODE"] = mode
        os.environ["WANDB_SILENT"] = "true"
        os.makedirs(run_dir, exist_ok=True)
        import wandb  # lazy: only runs that mirror pay for it

        self._wandb = wandb
        self.run = wandb.init(
            project=project_name(project), entity=os.environ.get("WANDB_ENTITY") or None,
            id=run_id, name=run_id, dir=str(run_dir), mode=mode,
            config={**(config or {}), "grpo_health": {"run_id": run_id, "mirror": 1}},
            reinit="create_new",  # never finish a run the user (or TRL's callback) already has open
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False,
                                    disable_git=True, x_save_requirements=False))

    # ---- the three calls the trainer makes -------------------------------------------------------
    def log_step(self, step: int, scalars: dict, groups: pd.DataFrame | None = None, rollouts=None):
        """One step: scalars (names.py names), and every `table_every` steps the groups frame
        (store columns) and a rollout sample (store tuples (group, idx, total, scores, text, error)
        or RunStore.rollouts()-style frame)."""
        if self.run is None:
            return
        if step <= self._last_step:  # W&B drops non-increasing steps; say so instead of losing them quietly
            self._warn(f"W&B mirror: step {step} after step {self._last_step} is not logged (W&B steps must increase)")
            return
        data = {k: float(v) for k, v in scalars.items() if v is not None}
        for ours, trl in TRL_ALIASES.items():
            if ours in data:
                data[trl] = data[ours]
        if step % self.table_every == 0:
            if groups is not None and len(groups):
                data["groups"] = self._wandb.Table(dataframe=groups.assign(step=step).reset_index(drop=True))
            table = self._rollout_table(step, rollouts)
            if table is not None:
                data["rollouts"] = table
        self._call(lambda: self.run.log(data, step=step))
        self._last_step = step

    def stored_step(self, store, step: int, scalars: dict, groups, rollouts):
        """The embedded trainer's step just stored, and every event stored since the last one
        (applied and rejected requests come from the store: the mirror sees what readers see)."""
        self.log_step(step, scalars, groups.frame(), rollouts)
        ev = store.events(since_id=self._last_event, kinds=[EV_CHANGE, EV_REJECTED, EV_ALERT, EV_CHECKPOINT])
        for kind, payload, at in zip(ev["kind"], ev["payload"], ev["step"]):
            self.event(kind, payload, None if at != at else int(at))
        if len(ev):
            self._last_event = int(ev["id"].iloc[-1])

    def event(self, kind: str, payload: dict, step: int | None = None):
        """A store event. Changes (weights, threshold, difficulty) and alerts go to summary
        tables; online runs also raise a W&B alert for them."""
        if self.run is None:
            return
        text = payload.get("message") or json.dumps(payload.get("request", payload), default=str)[:1000]
        if kind == "change":
            self._changes.append([step, payload.get("kind", ""), json.dumps(payload.get("request", {}), default=str),
                                  payload.get("source", ""), text])
            table = self._wandb.Table(columns=["step", "kind", "request", "source", "message"], data=self._changes)
            self._call(lambda: self.run.summary.update({"changes": table, "last_change_step": step}))
            self._alert(f"{payload.get('kind', 'change')} applied at step {step}", text, "INFO")
        elif kind == "alert":
            self._alerts.append([step, payload.get("kind", ""), payload.get("severity", ""), text])
            table = self._wandb.Table(columns=["step", "kind", "severity", "message"], data=self._alerts)
            self._call(lambda: self.run.summary.update({"alerts": table}))
            level = "ERROR" if payload.get("severity") == "critical" else "WARN"
            self._alert(f"GRPO health: {payload.get('kind', 'alert')} at step {step}", text, level)
        else:  # lifecycle, rejected, checkpoint: a line in the summary is enough
            self._call(lambda: self.run.summary.update({f"event/{kind}": f"step {step}: {text}"}))

    def finish(self, exit_code: int = 0, wait_s: float = 10.0):
        """Close the W&B run. wandb-core writes the run file a moment after finish() returns,
        so wait (bounded) for its exit record: an import right after sees the whole run."""
        if self.run is not None:
            run, self.run = self.run, None
            try:
                sync_file = run.settings.sync_file
                run.finish(exit_code=exit_code)
                deadline = time.monotonic() + wait_s
                while sync_file and not wandb_file_finished(sync_file) and time.monotonic() < deadline:
                    time.sleep(0.02)
            except Exception as e:  # noqa: BLE001 - the mirror never fails the run
                self._warn(f"W&B mirror: finish failed: {type(e).__name__}: {e}")

    # ---- helpers ---------------------------------------------------------------------------------
    def _rollout_table(self, step: int, rollouts):
        if rollouts is None:
            return None
        if isinstance(rollouts, pd.DataFrame):
            df = rollouts.head(self.max_table_rollouts).copy()
        else:
            rows = []
            for gi, idx, total, scores, text, err in list(rollouts)[: self.max_table_rollouts]:
                rows.append({"group": gi, "idx": idx, "total": total, "completion": text, "error": err,
                             **(scores or {})})
            df = pd.DataFrame(rows)
        if df.empty:
            return None
        if "completion" in df:
            df["completion"] = df["completion"].fillna("").astype(str).str.slice(0, ROLLOUT_TEXT_CHARS)
        if "error" in df:
            df["error"] = df["error"].fillna("").astype(str)
        df = df.drop(columns=[c for c in ("scores",) if c in df]).assign(step=step)
        return self._wandb.Table(dataframe=df.reset_index(drop=True))

    def _alert(self, title: str, text: str, level: str):
        if self.mode == "online":
            self._call(lambda: self.run.alert(title=title[:64], text=text, level=getattr(
                self._wandb.AlertLevel, level, self._wandb.AlertLevel.INFO)))

    def _call(self, fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a W&B failure must never stop training
            self.error = f"{type(e).__name__}: {e}"
            self._warn(f"W&B mirror disabled after an error: {self.error}")
            run, self.run = self.run, None
            try:
                if run is not None:
                    run.finish(exit_code=1)
            except Exception:  # noqa: BLE001
                pass

    @staticmethod
    def _warn(msg: str):
        logger.warning(msg)

