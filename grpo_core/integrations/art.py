"""Watch an OpenPipe ART run live, and import what ART wrote, with the same store, health
metrics and live weights as the embedded trainer.

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

No `art` import at module level: the product works without openpipe-art; only the functions
that read ART's parquet files need pyarrow.
"""
from __future__ import annotations

import asyncio
import atexit
import hashlib
import json
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import health

from grpo_core.runs import names
from grpo_core.errors import ConfigError
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.requests import validate_request
from grpo_core.integrations.importers import ImportReport, Parsed, _derive_counts, _number, _put
from grpo_core.runs.live_settings import SET_THRESHOLD, SET_WEIGHTS
from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.store import (EV_ALERT, FINISHED, PAUSE, PAUSED, RESUME, RUNNING, STOP, STOPPED,
                             RunStore, StepGroups, StepRollouts, new_run_id)
from grpo_core.runs.store import runs_dir as resolve_runs_dir

REWARD_METRIC = "reward"  # the rollout function's own trajectory.reward, kept as a score
NOT_SCORES = ("completion_tokens",)  # ART adds it to trajectory.metrics itself (gather.record_metrics)
PAUSE_POLL_S = 0.5


# ---- one step's groups -> store rows (the live monitor and the trajectory importer share it) ----------
@dataclass
class Rollout:
    total: float  # the reward ART trains on
    scores: dict  # metric -> float | None (None: missing); REWARD_METRIC included
    text: str | None = None


@dataclass
class Group:
    prompt_id: str
    rollouts: list[Rollout]
    exceptions: int = 0  # trajectories that raised (ART's group.exceptions): not rollouts
    prompt: str | None = None


def art_trainable(rewards: list[float]) -> bool:
    """ART's rule (metrics_taxonomy._group_is_trainable), exact comparison included."""
    return len(rewards) > 1 and len(set(rewards)) > 1


def _score(v) -> float:
    x = _number(v) if not isinstance(v, bool) else float(v)
    return np.nan if x is None or not math.isfinite(x) else x


def _arrays(groups: list[Group], metrics: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """totals [P, G] and scores [P, G, K], NaN-padded: ART's groups differ in size."""
    g = max([len(grp.rollouts) for grp in groups] + [1])
    totals = np.full((len(groups), g), np.nan)
    scores = np.full((len(groups), g, len(metrics)), np.nan)
    for i, grp in enumerate(groups):
        for j, r in enumerate(grp.rollouts):
            totals[i, j] = _score(r.total)
            scores[i, j] = [_score(r.scores.get(m)) for m in metrics]
    return totals, scores


def _empty_step(cum: tuple) -> dict:
    return {names.GROUPS_SUBMITTED: 0, names.GROUPS_TRAINABLE: 0, names.CUM_GROUPS_SUBMITTED: cum[0],
            names.CUM_GROUPS_TRAINABLE: cum[1], names.TRAINABLE_RATIO: 0.0,
            names.CUM_TRAINABLE_RATIO: health.trainable_ratio(*cum)}


def step_rows(groups: list[Group], metrics: list[str], weights: dict, cum: tuple = (0, 0),
              min_group_std: float = 0.0, uniform_std: float = 1e-3):
    """-> (scalars, StepGroups, StepRollouts, trainable [P]) for one step, in ART's counts."""
    if not groups:
        return _empty_step(cum), None, None, np.zeros(0, bool)
    totals, scores = _arrays(groups, metrics)
    nonzero = np.array([art_trainable([r.total for r in grp.rollouts]) for grp in groups], bool)
    stats = health.group_stats(totals, scores, min_group_std=min_group_std, uniform_std=uniform_std,
                               nonzero=nonzero)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        scalars = health.step_scalars(stats, scores, metrics, weights, *cum)
        scalars[names.REWARD] = float(np.nanmean(totals))  # ART's train/reward: over every trajectory
    scalars[names.FRAC_REWARD_ZERO_STD] = float(1 - nonzero.mean())  # ART's rule, not std > 1e-8
    scalars[names.MIN_GROUP_STD] = float(min_group_std)
    scalars[names.SCORING_ERRORS] = sum(grp.exceptions for grp in groups) + int(
        sum(not math.isfinite(_score(r.total)) for grp in groups for r in grp.rollouts))
    step_groups = StepGroups(np.arange(len(groups)), [grp.prompt_id for grp in groups],
                             [len(grp.rollouts) for grp in groups], stats.mean, stats.std, stats.trainable,
                             stats.phantom, prompt_text=_prompt_texts(groups))
    return scalars, step_groups, _step_rollouts(groups, metrics, scores), stats.trainable


def _prompt_texts(groups: list[Group]) -> list[str] | None:
    texts = [grp.prompt for grp in groups]
    return None if any(t is None for t in texts) else texts


def _step_rollouts(groups: list[Group], metrics: list[str], scores: np.ndarray) -> StepRollouts:
    where = [(i, j) for i, grp in enumerate(groups) for j in range(len(grp.rollouts))]
    rows = [groups[i].rollouts[j] for i, j in where]
    errors = [", ".join(f"{m}: not in trajectory.metrics" for m in metrics if r.scores.get(m) is None) or None
              for r in rows]
    flat = scores[tuple(zip(*where))] if where else np.zeros((0, len(metrics)))
    return StepRollouts(metrics, [w[0] for w in where], [w[1] for w in where], [r.total for r in rows], flat,
                        [r.text for r in rows], errors)


# ---- ART objects -> Group ---------------------------------------------------------------------------
def _messages(trajectory) -> list[dict]:
    try:
        return [m if isinstance(m, dict) else dict(m) for m in trajectory.messages()]
    except Exception:  # noqa: BLE001 - a message ART itself could not convert: keep the rest readable
        return [{"role": "?", "content": str(m)} for m in getattr(trajectory, "messages_and_choices", [])]


def _split_prompt(messages: list[dict]) -> tuple[str, str]:
    """(prompt: every message up to the first user message, completion: the rest), as text."""
    first = next((k for k, m in enumerate(messages) if m.get("role") == "user"), -1) + 1
    show = lambda ms: "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in ms)  # noqa: E731
    return show(messages[:first]), show(messages[first:])


def _prompt_id(metadata: dict, prompt: str) -> str:
    if metadata.get("scenario_id") is not None:  # ART's own scenario key (metrics_taxonomy)
        return str(metadata["scenario_id"])
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


def _metric_scores(metrics: dict, names_: list[str], base: float) -> dict:
    out = {m: (None if metrics.get(m) is None else _score(metrics[m])) for m in names_ if m != REWARD_METRIC}
    return {REWARD_METRIC: base, **out}


def to_group(group, metrics: list[str], base: dict | None = None, keep_text: bool = True) -> Group:
    """An art.TrajectoryGroup -> Group. base: id(trajectory) -> the reward the rollout function
    gave (before any weights were applied), else trajectory.reward."""
    base = base or {}
    rollouts, prompt, meta = [], "", dict(getattr(group, "metadata", {}) or {})
    for t in group.trajectories:
        prompt, text = _split_prompt(_messages(t))
        own = base.get(id(t), (None, t.reward))[1]
        rollouts.append(Rollout(float(t.reward), _metric_scores(t.metrics, metrics, own), text if keep_text else None))
        meta = meta or dict(t.metadata or {})
    return Group(_prompt_id(meta, prompt), rollouts, len(getattr(group, "exceptions", []) or []), prompt or None)


def metric_names(groups, known: list[str] = ()) -> list[str]:
    """REWARD_METRIC, then `known`, then any other numeric trajectory.metrics key in the order seen."""
    out = [REWARD_METRIC] + [m for m in known if m != REWARD_METRIC]
    for group in groups:
        for t in group.trajectories:
            for k, v in (t.metrics or {}).items():
                if k not in out and k not in NOT_SCORES and _number(float(v) if isinstance(v, bool) else v) is not None:
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

    run_id / runs_dir: where the store goes (default a new id under $GRPO_RUNS_DIR or ./runs).
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
            self.session.fail(error, self.last_step, error.splitlines()[0][:300] if error else "failed",
                              at="the run failed")
            self.store.close()

    def _on_exit(self):
        self.fail("the ART process exited without monitor.finish() (see its log)")

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is not None:
            self.fail(f"{kind.__name__}: {exc}"[:500])
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
                scores = _metric_scores(t.metrics, self.metrics, own)
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
        at = self.last_step + 1
        self.weights = {m: float(payload["weights"].get(m, 0.0)) for m in self.metrics}
        return True, at, f"trajectory.reward = weighted sum {self.weights} from step {at}"

    def _set_threshold(self, payload):
        self.min_group_std = payload["min_group_std"]
        return True, self.last_step + 1, f"min_group_std {self.min_group_std} from step {self.last_step + 1}"

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


# ---- importing what ART wrote ------------------------------------------------------------------------
# Where ART 0.5.18 writes (art.Model.log): <base_path>/<project>/models/<name>/history.jsonl, one JSON
# object a line ({<split>/<metric> or <section>/<metric>: value, "step", "training_step",
# "recorded_at"}, NaN left out), and trajectories/<split>/<step:04d>.parquet; ART before the
# parquet files wrote trajectories/<split>/<step:04d>.jsonl (trajectory_migration.serialize_
# trajectory_groups: one group a line, {"trajectories": [{reward, metrics, metadata,
# messages_and_choices, ...}]}).
HISTORY_SKIP = ("step", "training_step", "recorded_at", "time/wall_clock_sec")
_STEP_FILE = re.compile(r"(\d+)\.(jsonl|parquet)$")


def map_art_key(key: str) -> str:
    """An ART history key -> the stored name: ART_NAMES, then ART's per-metric train means as
    reward/<metric>/mean, then ART's section names that are ours as they are, else art/<key>."""
    if key in names.ART_NAMES:
        return names.ART_NAMES[key]
    if key.startswith("train/") and key.count("/") == 1 and key[6:] not in NOT_SCORES + ("exception_rate",):
        return names.metric_mean(key[6:])
    if key.startswith("data/step_num_groups") or key.startswith("data/cum/num_groups"):
        return key
    return names.foreign("art", key)


def parse_art_history(data: bytes, filename: str) -> Parsed:
    report = ImportReport("art", filename)
    rows: dict = {}
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        report.entries += 1
        entry = _json_line(line, filename, n, "an ART history.jsonl (one JSON object a line, with a 'step')")
        step = entry.get("step", entry.get("training_step"))
        if isinstance(step, bool) or not isinstance(step, int):
            report.skip("history line", "no integer 'step'")
            continue
        for key, v in entry.items():
            _history_value(rows, step, key, v, report)
    _fill_cumulative(rows)
    _derive_counts(rows, "art", report)
    config = {"source": "art", "grpo": {"steps": max(rows) if rows else None}, "reward": {"metrics": sorted(
        {p[0] for r in rows.values() for k in r if (p := names.parse_metric_name(k))})}}
    return Parsed(rows, config, report)


def _json_line(line: str, filename: str, n: int, want: str) -> dict:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        raise ConfigError(f"{filename}: line {n} is not JSON; expected {want}") from None
    if not isinstance(entry, dict):
        raise ConfigError(f"{filename}: line {n} is a {type(entry).__name__}; expected {want}")
    return entry


def _history_value(rows: dict, step: int, key: str, v, report: ImportReport):
    if key in HISTORY_SKIP:
        return
    x = _number(v)
    if x is None:
        report.skip(f"art key {key}", "not a number")
        return
    name = map_art_key(key)
    if name != key:
        report.mapped[key] = name
    _put(rows, step, name, x, report)


def _fill_cumulative(rows: dict):
    """Cumulative group counts where ART's history lacks them (older ART): summed per step."""
    cum = [0.0, 0.0]
    for step in sorted(rows):
        r = rows[step]
        if names.GROUPS_SUBMITTED not in r or names.GROUPS_TRAINABLE not in r:
            continue
        cum = [cum[0] + r[names.GROUPS_SUBMITTED], cum[1] + r[names.GROUPS_TRAINABLE]]
        r.setdefault(names.CUM_GROUPS_SUBMITTED, cum[0])
        r.setdefault(names.CUM_GROUPS_TRAINABLE, cum[1])
        cum = [r[names.CUM_GROUPS_SUBMITTED], r[names.CUM_GROUPS_TRAINABLE]]


def _jsonl_groups(data: bytes, filename: str) -> list[dict]:
    want = "ART trajectory groups (one {\"trajectories\": [...]} object a line)"
    groups = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            entry = _json_line(line, filename, n, want)
            if not isinstance(entry.get("trajectories"), list):
                raise ConfigError(f"{filename}: line {n} has no 'trajectories' list; expected {want}")
            groups.append(entry)
    return groups


def _parquet_groups(source) -> list[dict]:
    """ART's trajectories/<split>/<step>.parquet (utils.trajectory_logging; a path or a file
    object) -> group dicts as the legacy JSONL has them."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading ART's parquet trajectory files needs pyarrow (pip install pyarrow)") from None
    by_group: dict[int, dict] = {}
    for row in pq.read_table(source).to_pylist():
        grp = by_group.setdefault(row["group_index"], {"trajectories": [], "metadata": json.loads(
            row.get("group_metadata") or "{}")})
        grp["trajectories"].append({"reward": row["reward"], "metrics": json.loads(row.get("metrics") or "{}"),
                                    "metadata": json.loads(row.get("metadata") or "{}"),
                                    "messages_and_choices": row.get("messages") or []})
    return [by_group[k] for k in sorted(by_group)]


def _dict_group(d: dict, metrics: list[str], filename: str) -> Group:
    rollouts, prompt, meta = [], "", dict(d.get("metadata") or {})
    for t in d["trajectories"]:
        reward = _number(t.get("reward"))
        if reward is None:
            raise ConfigError(f"{filename}: a trajectory's reward is {t.get('reward')!r}; ART writes a number")
        msgs = [m.get("message", m) if isinstance(m, dict) else {} for m in t.get("messages_and_choices") or []]
        prompt, text = _split_prompt(msgs)
        rollouts.append(Rollout(reward, _metric_scores(t.get("metrics") or {}, metrics, reward), text))
        meta = meta or dict(t.get("metadata") or {})
    return Group(_prompt_id(meta, prompt), rollouts, prompt=prompt or None)


def _dict_metrics(groups: list[dict]) -> list[str]:
    out = [REWARD_METRIC]
    for g in groups:
        for t in g["trajectories"]:
            out += [k for k, v in (t.get("metrics") or {}).items() if k not in out and k not in NOT_SCORES
                    and _number(float(v) if isinstance(v, bool) else v) is not None]
    return out


def trajectory_steps(files: dict[int, list[dict]], filename: str, report: ImportReport):
    """{step: group dicts} -> (scalars by step, step_data, metrics) in ART's counts."""
    metrics = _dict_metrics([g for gs in files.values() for g in gs])
    weights = {m: float(m == REWARD_METRIC) for m in metrics}
    rows, step_data, cum = {}, {}, (0, 0)
    for step in sorted(files):
        groups = [_dict_group(d, metrics, filename) for d in files[step]]
        scalars, step_groups, rollouts, _ = step_rows(groups, metrics, weights, cum)
        cum = (int(scalars[names.CUM_GROUPS_SUBMITTED]), int(scalars[names.CUM_GROUPS_TRAINABLE]))
        rows[step], step_data[step] = scalars, (step_groups, rollouts)
        report.entries += len(groups)
    return rows, step_data, metrics


def _step_of(filename: str) -> int:
    m = _STEP_FILE.search(Path(filename).name)
    if not m:
        raise ConfigError(f"{filename}: an ART trajectory file is named after its step (e.g. 0003.jsonl, as ART "
                          "writes trajectories/train/<step>.jsonl); rename it so")
    return int(m.group(1))


def _art_parsed(rows, step_data, metrics, report, extra_config: dict | None = None) -> Parsed:
    report.note("trainable = ART's rule: more than one trajectory and rewards not all equal; ratio = "
                "trainable / submitted groups; frac_reward_zero_std = 1 - ratio")
    report.note(f"scores per trajectory: {', '.join(metrics)} ('reward' is trajectory.reward itself)")
    config = {"source": "art", "grpo": {"steps": max(rows) if rows else None},
              "reward": {"weights": {m: float(m == REWARD_METRIC) for m in metrics}, "outcome_metric": ""},
              **(extra_config or {})}
    # step_data: step -> (StepGroups, StepRollouts), so what-if and the inspector work on the import.
    return Parsed(rows, config, report, step_data=step_data, lacks=[] if step_data else ["groups", "rollouts"])


def parse_art(data: bytes, filename: str) -> Parsed:
    """The import kind `art`: an ART history.jsonl, or one trajectory file (legacy JSONL or
    parquet) named after its step. Which one: from the content."""
    if data[:4] == b"PAR1":
        import io
        files = {_step_of(filename): _parquet_groups(io.BytesIO(data))}
    else:
        first = next((ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()), "")
        if '"trajectories"' not in first:
            return parse_art_history(data, filename)
        files = {_step_of(filename): _jsonl_groups(data, filename)}
    report = ImportReport("art", filename)
    rows, step_data, metrics = trajectory_steps(files, filename, report)
    return _art_parsed(rows, step_data, metrics, report)


def parse_art_dir(path: str | Path) -> Parsed:
    """An ART model output dir (<base_path>/<project>/models/<name>): history.jsonl for ART's
    own numbers, trajectories/train/* for the groups and rollouts (what-if, inspector). Where
    both give group counts, history's are kept (ART's own; a group every trajectory of which
    raised is in history's count but not in the trajectory files)."""
    root = Path(path)
    traj = sorted(p for p in (root / "trajectories" / "train").glob("*") if _STEP_FILE.search(p.name))
    hist = root / "history.jsonl"
    if not hist.is_file() and not traj:
        raise ConfigError(f"{root}: expected an ART model output dir (history.jsonl and/or trajectories/train/"
                          "<step>.jsonl|parquet), found neither")
    report = ImportReport("art", str(root))
    files = {_step_of(p.name): (_parquet_groups(p) if p.suffix == ".parquet" else
                                _jsonl_groups(p.read_bytes(), str(p))) for p in traj}
    rows, step_data, metrics = trajectory_steps(files, str(root), report) if files else ({}, {}, [REWARD_METRIC])
    if hist.is_file():
        history = parse_art_history(hist.read_bytes(), str(hist))
        _merge_history(rows, history, report)
    return _art_parsed(rows, step_data, metrics, report, {"art": {"output_dir": str(root)}})


def _merge_history(rows: dict, history: Parsed, report: ImportReport):
    report.entries += history.report.entries
    report.mapped.update(history.report.mapped)
    for what, n in history.report.skipped.items():
        report.skipped[what] = report.skipped.get(what, 0) + n
    for step, hrow in history.rows.items():
        row = rows.setdefault(step, {})
        for name in (names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE):
            if name in row and name in hrow and row[name] != hrow[name]:
                report.note(f"step {step}: history.jsonl says {name} {hrow[name]:g}, the trajectory file has "
                            f"{row[name]:g} groups with trajectories; history's counts kept")
        row.update(hrow)
