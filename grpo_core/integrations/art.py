"""ArtMonitor: an OpenPipe ART run watched live, with the embedded trainer's store, health and weights.

Importing what ART wrote afterwards is art_files.py.

    monitor = ArtMonitor(run_id="my-run", apply_weights=True, drop_untrainable=True)
    for step in range(await model.get_step(), 50):
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios),
            after_each=monitor.after_each)           # optional: stages each group as it arrives
        groups = await monitor.astep(groups)         # log, apply requests, pause here if asked
        if monitor.should_stop:                      # a stop request from the dashboard or CLI
            break
        await model.train(groups)
    monitor.finish()

Why these hooks (ART 0.5.18): ART has no trainer callback. The user's loop holds each step's
`TrajectoryGroup`s between `gather_trajectory_groups` and `model.train`, so that is where a
step is whole: every group scored, nothing trained yet. `gather_trajectory_groups(after_each=)`
calls an async `group -> group | None | list` once per group as it finishes (None drops it),
which is per group, not per step: `after_each` only stages groups, `step`/`astep` writes them.

What is recorded: each trajectory is a rollout; `trajectory.metrics` are its per-metric scores,
`trajectory.reward` the total ART trains on. The reward the rollout function gave is kept as a
score too, metric `reward` (REWARD_METRIC), so the weights in force are {reward: 1, every
other metric: 0} until a weight request says otherwise, and the what-if under them gives the
recorded ratio exactly. "Trainable" is ART's own rule (art.metrics_taxonomy._group_is_trainable:
more than one trajectory and rewards not all equal, exact float comparison), so the store's
ratio is ART's data/step_num_groups_trainable / data/step_num_groups_submitted; min_group_std
> 0 adds the product's stricter std gate on top.

Requests: set_weights only with apply_weights=True, because applying one *mutates the
trajectories the user trains on*: `trajectory.reward` becomes sum(weight x score) over the
named metrics (`reward`, the rollout function's own reward, is one of them; unnamed: 0).
set_threshold, pause (blocks in step/astep, before the step trains, until resume or stop) and
stop (`should_stop` turns True; that step is not recorded, as it is not trained). ART saves a
checkpoint every train step by itself: checkpoint requests are refused.

No `art` import at module level: the product works without openpipe-art.
"""
from __future__ import annotations

import asyncio
import atexit
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import health
from grpo_core.errors import ConfigError, exception_line
from grpo_core.integrations.art_steps import (
    NOT_SCORES,
    REWARD_METRIC,
    Group,
    Rollout,
    metric_scores,
    prompt_key,
    split_prompt,
    step_rows,
)
from grpo_core.integrations.base import number
from grpo_core.runs import live_settings, names
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.live_settings import PAUSE, RESUME, SET_THRESHOLD, SET_WEIGHTS, STOP
from grpo_core.runs.locations import new_run_id
from grpo_core.runs.locations import runs_dir as resolve_runs_dir
from grpo_core.runs.requests import validate_request
from grpo_core.runs.run_meta import FINISHED, PAUSED, RUNNING, STOPPED
from grpo_core.runs.store import EV_ALERT, RunStore

PAUSE_POLL_S = 0.5


# ---- ART objects -> Group ---------------------------------------------------------------------------
def _messages(trajectory) -> list[dict]:
    try:
        return [m if isinstance(m, dict) else dict(m) for m in trajectory.messages()]
    except Exception:  # noqa: BLE001 - a message ART itself could not convert: keep the rest readable
        return [{"role": "?", "content": str(m)} for m in getattr(trajectory, "messages_and_choices", [])]


def to_group(group, metrics: list[str], base: dict | None = None, keep_text: bool = True) -> Group:
    """An art.TrajectoryGroup -> Group. base: id(trajectory) -> the reward the rollout function
    gave (before any weights were applied), else trajectory.reward."""
    base = base or {}
    rollouts, prompt, meta = [], "", dict(getattr(group, "metadata", {}) or {})
    for t in group.trajectories:
        prompt, text = split_prompt(_messages(t))
        own = base.get(id(t), (None, t.reward))[1]
        rollouts.append(Rollout(float(t.reward), metric_scores(t.metrics, metrics, own), text if keep_text else None))
        meta = meta or dict(t.metadata or {})
    return Group(prompt_key(meta, prompt), rollouts, len(getattr(group, "exceptions", []) or []), prompt or None)


def metric_names(groups, known: list[str] = ()) -> list[str]:
    """REWARD_METRIC, then `known`, then any other numeric trajectory.metrics key in the order seen."""
    out = [REWARD_METRIC] + [m for m in known if m != REWARD_METRIC]
    for group in groups:
        for t in group.trajectories:
            for k, v in (t.metrics or {}).items():
                if k not in out and k not in NOT_SCORES and number(float(v) if isinstance(v, bool) else v) is not None:
                    out.append(k)
    return out


def _check_groups(groups) -> list:
    groups = list(groups)
    bad = next((g for g in groups if not hasattr(g, "trajectories")), None)
    if bad is not None:
        raise ConfigError(f"ArtMonitor.step: expected art.TrajectoryGroup objects (the list gather_trajectory_groups "
                          f"returns), got {type(bad).__name__}")
    named = next((t for g in groups for t in g.trajectories if REWARD_METRIC in (t.metrics or {})), None)
    if named is not None:
        raise ConfigError(f"trajectory.metrics has a metric named {REWARD_METRIC!r}: that name is trajectory.reward's "
                          "(ART logs both as train/reward); rename the metric")
    return groups


# ---- the live monitor --------------------------------------------------------------------------------
@dataclass
class _Staged:
    groups: list = field(default_factory=list)
    base: dict = field(default_factory=dict)  # id(trajectory) -> (trajectory, the rollout function's reward)


class ArtMonitor:
    """Records an ART run's steps into a run store and answers the dashboard's requests.

    run_id / runs_dir: where the store goes (default a new id under $GRPO_HEALTH_RUNS_DIR or ./runs).
    metrics: the trajectory.metrics keys to record as scores (default: every numeric one).
    apply_weights: accept set_weights, recomputing trajectory.reward (see the module doc);
        weights: the weights to start with (needs apply_weights).
    drop_untrainable: step/astep return only the trainable groups (after_each drops them too).
    min_group_std: > 0 adds a std gate on top of ART's rule. steps: the planned step count
        (the live page's progress). resume: continue a store that already has steps."""

    def __init__(self, run_id: str | None = None, runs_dir: str | Path | None = None, *, model=None,
                 metrics: list[str] | None = None, weights: dict | None = None, apply_weights: bool = False,
                 drop_untrainable: bool = False, min_group_std: float = 0.0, steps: int | None = None,
                 keep_text: bool = True, resume: bool = False, health_config: HealthConfig | None = None,
                 config: dict | None = None):
        if weights is not None and not apply_weights:
            raise ConfigError("ArtMonitor(weights=...) changes trajectory.reward: pass apply_weights=True with it")
        if not isinstance(min_group_std, (int, float)) or min_group_std < 0:
            raise ConfigError(f"min_group_std must be a number >= 0, got {min_group_std!r}")
        self.metrics = metric_names([], metrics or [])
        self._fixed_metrics = metrics is not None
        self.weights = self._initial_weights(weights)
        self.apply_weights, self.drop_untrainable, self.keep_text = apply_weights, drop_untrainable, keep_text
        self.min_group_std = float(min_group_std)
        self.health_cfg = health_config or HealthConfig()
        self.run_id = run_id or new_run_id("art")
        self._staged, self._paused, self._stop, self._ended = _Staged(), False, False, False
        self._alert_kinds: set[str] = set()
        self.store = RunStore.create(self.run_id, self._config(model, steps, config or {}),
                                     root=resolve_runs_dir(runs_dir), kind="art", exist_ok=True)
        self.last_step, self._cum = self._resume(resume)
        self.session = self._new_session()
        self.session.start(self.last_step, {"event": "resumed" if self.last_step else "started", "source": "art"},
                           source="art")
        atexit.register(self._on_exit)

    def _initial_weights(self, weights: dict | None) -> dict:
        if weights is None:
            return {m: float(m == REWARD_METRIC) for m in self.metrics}
        for m in weights:
            if m not in self.metrics:
                self.metrics.append(m)
        clean = validate_request(SET_WEIGHTS, {"weights": weights}, self.metrics)["weights"]
        return {m: clean.get(m, 0.0) for m in self.metrics}

    def _config(self, model, steps, extra: dict) -> dict:
        return {"source": "art", "model": {"path": getattr(model, "base_model", "") or getattr(model, "name", "")},
                "reward": {"weights": dict(self.weights), "outcome_metric": ""},
                "grpo": {"steps": steps, "min_group_std": self.min_group_std},
                "health": vars(self.health_cfg),
                "art": {"apply_weights": self.apply_weights, "drop_untrainable": self.drop_untrainable,
                        "project": getattr(model, "project", None), "name": getattr(model, "name", None)},
                **extra}

    def _resume(self, resume: bool) -> tuple[int, list[int]]:
        last = self.store.last_step()
        if last is None:
            return 0, [0, 0]
        if not resume:
            self.store.close()
            raise ConfigError(f"run {self.run_id!r} already has {last} steps: pick another run_id, or pass "
                              "resume=True to continue it")
        wide = self.store.scalars_wide(since_step=last - 1, names=[names.CUM_GROUPS_SUBMITTED,
                                                                    names.CUM_GROUPS_TRAINABLE])
        row = wide.iloc[-1] if len(wide) else {}
        return last, [int(row.get(names.CUM_GROUPS_SUBMITTED, 0)), int(row.get(names.CUM_GROUPS_TRAINABLE, 0))]

    # ---- the loop's calls -----------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once a stop request was applied: break out of the loop before model.train."""
        return self._stop

    @property
    def paused(self) -> bool:
        return self._paused

    async def after_each(self, group):
        """gather_trajectory_groups(after_each=monitor.after_each): stages the group for the
        next step/astep (every group, so the counts stay ART's), applies the weights in force
        (apply_weights), and returns None for a group that cannot train (drop_untrainable)."""
        _check_groups([group])
        self._staged.groups.append(group)
        if self.apply_weights:
            self._reweight([group])
        if self.drop_untrainable and not self._trainable([group])[0]:
            return None
        return group

    def step(self, groups=None, step: int | None = None) -> list:
        """Record one step (groups: this step's TrajectoryGroups; None: those after_each staged)
        and return the groups to train on. Blocks while the run is paused."""
        self.session.serve()
        while self._paused:
            time.sleep(PAUSE_POLL_S)
            self.session.serve()
        return self._record(groups, step)

    async def astep(self, groups=None, step: int | None = None) -> list:
        """step() for an async loop: a pause waits with asyncio.sleep, the event loop runs on."""
        self.session.serve()
        while self._paused:
            await asyncio.sleep(PAUSE_POLL_S)
            self.session.serve()
        return self._record(groups, step)

    def finish(self, status: str | None = None):
        """End the run: stopped after a stop request, else finished (status overrides)."""
        if self._ended:
            return
        self._ended = True
        status = status or (STOPPED if self._stop else FINISHED)
        self.session.finish(status, self.last_step, "stop requested" if self._stop else None,
                            at="the run ended before applying this request")
        self.store.close()

    def fail(self, error: str):
        if not self._ended:
            self._ended = True
            self.session.fail(error or "failed", self.last_step, at="the run failed")  # stored as one line
            self.store.close()

    def _on_exit(self):
        self.fail("the ART process exited without monitor.finish() (see its log)")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None:
            self.fail(exception_line(exc))
        else:
            self.finish()

    # ---- one step ---------------------------------------------------------------------------------------
    def _record(self, groups, step: int | None) -> list:
        """Every group gathered (after_each's, else `groups`) is recorded; returns those to train:
        `groups` (or the staged ones) less the untrainable when drop_untrainable."""
        given = None if groups is None else _check_groups(groups)
        every = self._staged.groups or given or []
        try:
            if self._stop:  # stopped before this step trains: not recorded, nothing to train
                return []
            if not self._fixed_metrics:
                self._add_metrics(every)
            if self.apply_weights:
                self._reweight(every)
            keep = self._write(every, self.last_step + 1 if step is None else int(step))
        finally:
            self._staged = _Staged()
        kept = [g for g, k in zip(every, keep) if k or not self.drop_untrainable]
        return kept if given is None else [g for g in given if any(g is k for k in kept)]

    def _add_metrics(self, groups):
        new = [m for m in metric_names(groups, self.metrics) if m not in self.metrics]
        if new:
            self.metrics += new
            self.weights.update({m: 0.0 for m in new})
            config = dict(self.store.config)
            reward = dict(config.get("reward") or {})
            reward["weights"] = {**reward.get("weights", {}), **{m: 0.0 for m in new}}
            self.store.set_meta(config={**config, "reward": reward})  # the live page's metric list

    def _reweight(self, groups):
        """trajectory.reward = sum(weight x score) over the weights in force; the rollout
        function's own reward (REWARD_METRIC) is remembered the first time, so this is idempotent."""
        for group in groups:
            for t in group.trajectories:
                own = self._staged.base.setdefault(id(t), (t, float(t.reward)))[1]
                scores = metric_scores(t.metrics, self.metrics, own)
                t.reward = float(sum(w * scores[m] for m, w in self.weights.items()
                                     if w and scores.get(m) is not None and math.isfinite(scores[m])))

    def _trainable(self, groups) -> np.ndarray:
        rows = [to_group(g, self.metrics, self._staged.base, keep_text=False) for g in groups]
        return step_rows(rows, self.metrics, self.weights, (0, 0), self.min_group_std,
                         self.health_cfg.uniform_std)[3]

    def _write(self, groups, step: int) -> np.ndarray:
        rows = [to_group(g, self.metrics, self._staged.base, self.keep_text) for g in groups]
        scalars, step_groups, rollouts, trainable = step_rows(rows, self.metrics, self.weights, tuple(self._cum),
                                                              self.min_group_std, self.health_cfg.uniform_std)
        self._cum = [int(scalars[names.CUM_GROUPS_SUBMITTED]), int(scalars[names.CUM_GROUPS_TRAINABLE])]
        self.store.log_step(step, scalars, step_groups, rollouts, self._alerts(step, scalars))
        self.last_step = step
        return trainable

    def _alerts(self, step: int, scalars: dict) -> list[tuple[str, dict]]:
        """New health alerts (a kind not raised at the previous step) as events."""
        wide = self.store.scalars_wide(since_step=step - self.health_cfg.trend_window - 1)
        row = pd.DataFrame([scalars], index=pd.Index([step], name="step"))
        wide = pd.concat([wide[wide.index != step], row]).sort_index()
        found = health.alerts(wide, self.health_cfg)
        new = [(EV_ALERT, {"kind": a.kind, "severity": a.severity, "message": a.message, "step": a.step})
               for a in found if a.kind not in self._alert_kinds]
        self._alert_kinds = {a.kind for a in found}
        return new

    # ---- requests (answered between steps, in step/astep) ----------------------------------------------
    def _new_session(self) -> RunSession:
        handlers = {SET_THRESHOLD: self._set_threshold, STOP: self._stop_req, PAUSE: self._pause,
                    RESUME: self._resume_req}
        if self.apply_weights:
            handlers[SET_WEIGHTS] = self._set_weights
        return RunSession(self.store, {k: self._checked(h) for k, h in handlers.items()}, self._refuse)

    def _checked(self, handler):
        def handle(req):
            try:
                payload = validate_request(req["kind"], req["payload"], self.metrics)
            except ConfigError as e:
                return False, self.last_step + 1, str(e)
            return handler(payload)
        return handle

    def _set_weights(self, payload):
        setting, at, old = live_settings.BY_KIND[SET_WEIGHTS], self.last_step + 1, dict(self.weights)
        self.weights = setting.after(old, setting.value(payload))  # the metrics a request does not name keep theirs
        return True, at, setting.applied_text(self, old, self.weights, at) + " (trajectory.reward = the weighted sum)"

    def _set_threshold(self, payload):
        setting, at, old = live_settings.BY_KIND[SET_THRESHOLD], self.last_step + 1, self.min_group_std
        self.min_group_std = setting.value(payload)
        return True, at, setting.applied_text(self, old, self.min_group_std, at)

    def _stop_req(self, payload):
        if self._paused:
            self._paused = False
            self.store.set_status(RUNNING)
        self._stop = True
        return True, self.last_step, f"training stops after step {self.last_step} (should_stop is True)"

    def _pause(self, payload):
        if self._paused:
            return False, self.last_step + 1, "already paused"
        self._paused = True
        self.store.set_status(PAUSED)
        return True, self.last_step + 1, f"paused before step {self.last_step + 1} trains"

    def _resume_req(self, payload):
        if not self._paused:
            return False, self.last_step + 1, "the run is not paused"
        self._paused = False
        self.store.set_status(RUNNING)
        return True, self.last_step + 1, f"resumed before step {self.last_step + 1} trains"

    def _refuse(self, req):
        why = {SET_WEIGHTS: "weight requests need ArtMonitor(apply_weights=True): they rewrite trajectory.reward",
               "checkpoint": "ART saves a checkpoint at every model.train step itself"}
        return False, self.last_step + 1, why.get(req["kind"], f"{req['kind']} is not supported for ART runs "
                                                                "(group size, prompts and sampling are the loop's)")
