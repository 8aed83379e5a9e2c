"""GRPOHealthCallback: a TRL GRPOTrainer run watched with the embedded trainer's store, health and weights.

The way to use GRPO Health at scale (accelerate, DeepSpeed, many GPUs). Added like any
transformers callback:

    trainer = GRPOTrainer(model=..., reward_funcs=[f1, f2], args=GRPOConfig(...), train_dataset=ds,
                          callbacks=[GRPOHealthCallback(run_id="my-run")])
    trainer.train()

(`GRPOHealthCallback.attach(trainer, run_id=...)` does the same for a trainer already built.)

How it reaches the trainer: transformers' CallbackHandler hands callbacks the model,
optimizer and dataloaders but never the trainer, and fires every event from a Trainer
method; so at `on_init_end` (the end of Trainer.__init__, before train()) the callback
takes the trainer from the calling frame whose `callback_handler` holds this very
callback (`find_trainer`). From there it uses TRL's public attributes only: `reward_funcs`,
`reward_weights`, `reward_func_names`, `num_generations`, `accelerator`.

Where it hooks, and why there (TRL 1.16):
- Scores: trl_scores.ScoreTap (wraps the reward functions in `trainer.reward_funcs`;
  gathers every process's slice at step end, in TRL's group order, so that rank 0 sees each
  completion exactly once with its group). A reward model needs TRL's private
  `_calculate_rewards`: checked against the installed TRL when the callback binds.
- Weights: TRL reads `trainer.reward_weights` (a [K] tensor) each time it scores. Rank 0
  claims weight requests from the store at `on_step_begin`, before that step generates,
  and broadcasts the decision so that every process applies the same weights.
- Only rank 0 touches the store; a heartbeat thread keeps a slow step from looking stale.
- A training error is recorded as the run's failure: the callback wraps the instance's
  public `train` when it binds (before train() is called).

"Trainable" here defaults to TRL's own rule, in TRL's own arithmetic (`trl_rewards`: float32
sums, unscorable completions left out, the Bessel std's isclose-to-0 test), so the store's
trainable ratio equals 1 - TRL's logged frac_reward_zero_std at every step; pass
min_group_std > 0 for the stricter product rule on top. Beside it, `health/float_noise_groups`
counts the groups TRL trains whose spread is float rounding (step_stats.float_noise).
"""
from __future__ import annotations

import atexit
import inspect
import math
import time
import warnings

import numpy as np
import pandas as pd
import torch
from transformers import TrainerCallback

from grpo_core.analysis import health, step_stats
from grpo_core.errors import ConfigError, exception_line
from grpo_core.integrations.base import ImportReport
from grpo_core.integrations.trl_scores import ScoreTap
from grpo_core.integrations.trl_state import is_trl_summary, map_trl_entry
from grpo_core.runs import live_settings, names
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.live_settings import CHECKPOINT, PAUSE, RESUME, SET_DIFFICULTY, SET_THRESHOLD, SET_WEIGHTS, STOP
from grpo_core.runs.locations import new_run_id, runs_dir
from grpo_core.runs.requests import validate_request
from grpo_core.runs.run_meta import FINISHED, PAUSED, RUNNING
from grpo_core.runs.store import EV_ALERT, EV_LIFECYCLE, RunStore

PAUSE_POLL_S = 0.5


def find_trainer(callback):
    """The Trainer whose callbacks hold `callback`: the `self` of the Trainer method up the
    stack that fired this event (see the module docstring)."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            obj = frame.f_locals.get("self")
            handler = getattr(obj, "callback_handler", None)
            if handler is not None and any(c is callback for c in getattr(handler, "callbacks", ())):
                return obj
            frame = frame.f_back
    finally:
        del frame
    raise ConfigError("GRPOHealthCallback could not find the trainer that called it: pass it to "
                      "GRPOTrainer(callbacks=[...]) or use GRPOHealthCallback.attach(trainer)")


def trl_rewards(scores: torch.Tensor, weights: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL 1.16's reward arithmetic (GRPOTrainer._generate_and_score_completions, the default
    sum_then_normalize): scores [N, K] and weights [K] in float32 -> (rewards [N], zero [P]).

    A reward is the weighted nansum in float32; a completion every function returned None
    for is NaN and left out of its group's mean and std. A group is zero-std, the groups that
    `frac_reward_zero_std` counts, when torch.isclose(its Bessel-corrected nanstd, 0), i.e.
    std <= 1e-8; a group with fewer than two scorable completions has a NaN std, which TRL
    does not count as zero."""
    from trl.trainer.utils import nanstd

    rewards = (scores * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(scores).all(dim=1)] = torch.nan
    std = nanstd(rewards.view(-1, group_size), dim=1)
    return rewards, torch.isclose(std, torch.zeros_like(std))


class GRPOHealthCallback(TrainerCallback):
    def __init__(self, run_id: str | None = None, root=None, *, min_group_std: float = 0.0,
                 outcome_metric: str | None = None, keep_text: str = "all", text_sample_groups: int = 2,
                 health_config: HealthConfig | None = None, config: dict | None = None):
        if run_id is not None and not isinstance(run_id, str):
            raise ConfigError(f"GRPOHealthCallback's first argument is the run id, got a {type(run_id).__name__}: "
                              "GRPOTrainer(..., callbacks=[GRPOHealthCallback(run_id=...)]), or "
                              "GRPOHealthCallback.attach(trainer, run_id=...)")
        if keep_text not in ("all", "sample"):
            raise ConfigError(f"keep_text must be 'all' or 'sample', got {keep_text!r}")
        self.outcome_metric = outcome_metric
        self.min_group_std = float(min_group_std)
        self.keep_text, self.text_sample_groups = keep_text, text_sample_groups
        self.health_cfg = health_config or HealthConfig()
        self.extra_config = config or {}
        self.run_id = run_id or new_run_id("trl")
        self.root = runs_dir(root)
        self.trainer = None  # bound at on_init_end (or attach, or on_train_begin)
        self.tap: ScoreTap | None = None
        self.store: RunStore | None = None
        self._cum = [0, 0]  # cumulative submitted, trainable groups
        self._alert_kinds: set[str] = set()
        self.session: RunSession | None = None  # rank 0, from on_train_begin
        self._paused = False
        self._at, self._decision = (1, 0), {}  # while requests are answered: (first step affected, last step run)

    @classmethod
    def attach(cls, trainer, run_id: str | None = None, root=None, **kw) -> "GRPOHealthCallback":
        """Create the callback for a trainer already built and add it; returns it (its run id:
        `.run_id`). The same as passing it in GRPOTrainer(callbacks=[...])."""
        cb = cls(run_id, root, **kw)
        cb._bind(trainer)
        trainer.add_callback(cb)
        return cb

    def _bind(self, trainer):
        """Check `trainer` (a TRL GRPOTrainer, and the private TRL code a reward model needs) and
        keep it. Errors here surface from GRPOTrainer(...) itself, before any training."""
        if trainer is self.trainer:
            return
        if self.trainer is not None:
            raise ConfigError(f"this GRPOHealthCallback (run {self.run_id!r}) already watches another trainer: "
                              "create one callback per trainer")
        missing = [a for a in ("reward_funcs", "reward_weights", "reward_func_names", "num_generations",
                               "accelerator") if not hasattr(trainer, a)]
        if missing:
            raise ConfigError(f"GRPOHealthCallback needs a TRL GRPOTrainer, got {type(trainer).__name__} "
                              f"(no {', '.join(missing)})")
        self.names = list(trainer.reward_func_names)
        if self.outcome_metric and self.outcome_metric not in self.names:
            raise ConfigError(f"outcome_metric {self.outcome_metric!r} is not a reward function "
                              f"({', '.join(self.names)})")
        self.outcome_index = self.names.index(self.outcome_metric) if self.outcome_metric else None
        self.tap = ScoreTap(trainer)
        self.trainer, self.main = trainer, trainer.accelerator.is_main_process
        self._wrap_train()

    def on_init_end(self, args, state, control, **kw):
        self._bind(find_trainer(self))

    def _wrap_train(self):
        """A training error is recorded as the run's failure (else the run would show 'running')."""
        trainer, orig = self.trainer, self.trainer.train

        def train(*args, **kwargs):
            try:
                return orig(*args, **kwargs)
            except BaseException as e:
                self._fail(exception_line(e))  # one line: the traceback is the user's own process's to print
                raise
            finally:
                self.tap.remove()  # the trainer's reward functions as they were

        trainer.train = train

    def _fail(self, error: str):
        if self.session is not None and self.store.get_meta().get("status") in (RUNNING, PAUSED):
            self.session.fail(error, None, at="the run failed")

    # ---- lifecycle ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kw):
        if self.trainer is None:  # added with trainer.add_callback after the trainer was built
            self._bind(find_trainer(self))
        self.tap.install()  # on every process: each scores its own slice
        if not self.main:
            return
        t = self.trainer
        weights = dict(zip(self.names, map(float, t.reward_weights.tolist())))
        g = t.num_generations
        config = {
            "source": "trl",
            "model": {"path": getattr(getattr(t.model, "config", None), "_name_or_path", "")},
            "reward": {"weights": weights, "outcome_metric": self.names[self.outcome_index]
                       if self.outcome_index is not None else ""},
            "grpo": {"steps": state.max_steps, "group_size": g,
                     "prompts_per_step": args.generation_batch_size // g,  # groups per generation batch
                     "min_group_std": self.min_group_std, "beta": args.beta, "lr": args.learning_rate,
                     "temperature": args.temperature, "max_new_tokens": args.max_completion_length,
                     "loss_type": str(args.loss_type), "scale": str(args.scale_rewards)},
            "health": vars(self.health_cfg),
            "trl": {"num_processes": t.accelerator.num_processes, "steps_per_generation": args.steps_per_generation,
                    "num_iterations": args.num_iterations,
                    "multi_objective_aggregation": str(getattr(args, "multi_objective_aggregation", "")),
                    "output_dir": args.output_dir},
            **self.extra_config,
        }
        store = RunStore.create(self.run_id, config, root=self.root, kind="trl", exist_ok=True)
        last = store.last_step()
        if last is not None and state.global_step == 0:  # never mix two trainings in one store
            store.close()
            raise ConfigError(f"run {self.run_id!r} already has {last} steps in {self.root}: pick another run_id, "
                              "or resume TRL from a checkpoint to continue it")
        store.set_meta(ranks=int(t.accelerator.num_processes))  # the training processes (world size)
        if last is not None:  # resumed from a checkpoint: continue the cumulative counts
            row = store.scalars(since_step=-1, until_step=state.global_step,
                                names=[names.CUM_GROUPS_SUBMITTED, names.CUM_GROUPS_TRAINABLE])
            cum = row.groupby("name")["value"].last()
            self._cum = [int(cum.get(names.CUM_GROUPS_SUBMITTED, 0)), int(cum.get(names.CUM_GROUPS_TRAINABLE, 0))]
            store.add_event(EV_LIFECYCLE, {"event": "resumed", "step": state.global_step}, step=state.global_step)
        self.store = store
        notes = []
        if str(args.scale_rewards) == "batch" or str(getattr(args, "multi_objective_aggregation", "")) == \
                "normalize_then_sum":
            notes.append("TRL's frac_reward_zero_std measures the whole batch under this setting; the store's "
                         "trainable ratio is computed per group")
        self.session = self._new_session(store)
        self.session.start(state.global_step, {"event": "started", "source": "trl", "notes": notes}, source="trl")
        atexit.register(self._on_exit)

    def _on_exit(self):
        """The process ends without on_train_end (killed, or train() never returned)."""
        self._fail("the TRL process exited before training ended (see its log)")

    def on_train_end(self, args, state, control, **kw):
        self.tap.remove()
        if not self.main or self.store is None:
            return
        self.session.finish(FINISHED, state.global_step, at="the run finished before applying this request")

    # ---- control: claimed on rank 0, decided once, applied on every rank -----------------------------
    # Requests are claimed twice per step, both between steps as far as TRL is concerned:
    # at on_step_end (after step N is written) for requests that came during step N, and at
    # on_step_begin for any that came after that, e.g. from a later callback. Either way a
    # weight change reaches step N+1's scoring. A stop claimed at on_step_end ends training
    # right there; one claimed at on_step_begin lets that step finish (transformers checks
    # should_training_stop only after the step).
    def on_step_begin(self, args, state, control, **kw):
        self._control(state, control, running=True)

    def _control(self, state, control, running: bool):
        decision = self._claim(state.global_step, running) if self.main else None
        if self.trainer.accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list
            box = [decision]
            broadcast_object_list(box, from_process=0)
            decision = box[0]
        if not decision:
            return
        if decision.get("weights") is not None:
            with torch.no_grad():
                self.trainer.reward_weights.copy_(torch.tensor(decision["weights"], dtype=torch.float32))
        if decision.get("min_group_std") is not None:
            self.min_group_std = decision["min_group_std"]
        if decision.get("stop"):
            control.should_training_stop = True
        if decision.get("save"):
            control.should_save = True

    def _claim(self, done: int, running: bool) -> dict:
        """Apply every pending request in order (`done`: steps completed; `running`: step
        done+1 is about to run) through the session's handlers below. A pause blocks here
        until resume or stop. -> what every rank applies."""
        self._at = (done + 1, done + 1 if running else done)  # the first step a change affects; the last to run
        self._decision = {}
        self.session.serve()
        while self._paused:
            time.sleep(PAUSE_POLL_S)
            self.session.serve()
        return self._decision

    def _new_session(self, store: RunStore) -> RunSession:
        """The callback's requests are these handlers (control.TRL_KINDS for older stores)."""
        handlers = {SET_WEIGHTS: self._set_weights, SET_THRESHOLD: self._set_threshold, STOP: self._stop,
                    CHECKPOINT: self._checkpoint, PAUSE: self._pause, RESUME: self._resume}
        return RunSession(store, {k: self._checked(h) for k, h in handlers.items()}, self._refuse)

    def _checked(self, handler):
        """handler(payload), once the payload passed validate_request; else rejected, saying why."""
        def handle(req):
            try:
                payload = validate_request(req["kind"], req["payload"], self.names)
            except ConfigError as e:
                return False, self._at[0], str(e)
            return handler(payload)
        return handle

    def _set_weights(self, payload):
        setting, step = live_settings.BY_KIND[SET_WEIGHTS], self._at[0]
        old = self._decision.get("weights") or list(map(float, self.trainer.reward_weights.tolist()))
        old = dict(zip(self.names, old))
        new = setting.after(old, setting.value(payload))  # the metrics a request does not name keep their weight
        self._decision["weights"] = [new[n] for n in self.names]
        return True, step, setting.applied_text(self, old, new, step)

    def _set_threshold(self, payload):
        setting, step = live_settings.BY_KIND[SET_THRESHOLD], self._at[0]
        old, new = self._decision.get("min_group_std", self.min_group_std), setting.value(payload)
        self._decision["min_group_std"] = new
        return True, step, setting.applied_text(self, old, new, step)

    def _stop(self, payload):
        last, paused, self._paused = self._at[1], self._paused, False
        self._decision["stop"] = True
        if paused:
            self.store.set_status(RUNNING)
            return True, last, f"stopped while paused: training stops after step {last}"
        return True, last, f"training stops after step {last}"

    def _checkpoint(self, payload):
        self._decision["save"] = True
        return True, self._at[1], f"TRL saves a checkpoint at the end of step {self._at[1]}"

    def _pause(self, payload):
        if self._paused:
            return False, self._at[0], "already paused"
        self._paused = True
        self.store.set_status(PAUSED)
        return True, self._at[0], f"paused before step {self._at[0]}"

    def _resume(self, payload):
        if not self._paused:
            return False, self._at[0], "the run is not paused"
        self._paused = False
        self.store.set_status(RUNNING)
        return True, self._at[0], f"resumed before step {self._at[0]}"

    def _refuse(self, req):
        if req["kind"] == SET_DIFFICULTY:
            return False, self._at[0], ("a TRL run trains on a fixed dataset: difficulty requests apply to the "
                                        "built-in trainer only")
        return False, self._at[0], f"{req['kind']} is not supported for TRL runs"

    # ---- one step: groups, rollouts, health scalars ------------------------------------------------------
    def on_step_end(self, args, state, control, **kw):
        batches = self.tap.take()  # on every process (a collective); the batches on rank 0
        if self.main and batches:
            self._write_step(state, batches)
        self._control(state, control, running=False)

    def _write_step(self, state, batches: list):
        """batches: trl_scores.ScoreTap.take's, the step's generation batches over every process."""
        g = self.trainer.num_generations
        rows = [r for b in batches for r in b[1]]
        scores32 = torch.cat([b[0] for b in batches])
        if scores32.shape[0] % g:
            raise RuntimeError(f"GRPO health: {scores32.shape[0]} completions is not a multiple of "
                               f"num_generations={g}")
        # Each generation batch with the weights it was scored with, in TRL's arithmetic.
        views = [trl_rewards(b[0], b[2], g) for b in batches]
        totals = torch.cat([v[0] for v in views]).numpy().astype(np.float64)
        zero = torch.cat([v[1] for v in views]).numpy()
        scores = scores32.numpy().astype(np.float64)
        weights = batches[-1][2].numpy().astype(np.float64)
        errors = [None if np.isfinite(s).all() else ", ".join(
            f"{n}: returned None" for n, v in zip(self.names, s) if not np.isfinite(v)) for s in scores]
        p = scores.shape[0] // g
        stats = step_stats.group_stats(totals.reshape(p, g), scores.reshape(p, g, -1), min_group_std=self.min_group_std,
                                   outcome_index=self.outcome_index, uniform_std=self.health_cfg.uniform_std,
                                   nonzero=~zero)
        wdict = dict(zip(self.names, map(float, weights)))
        scalars = step_stats.step_scalars(stats, scores.reshape(p, g, -1), self.names, wdict, *self._cum)
        self._cum = [int(scalars[names.CUM_GROUPS_SUBMITTED]), int(scalars[names.CUM_GROUPS_TRAINABLE])]
        with warnings.catch_warnings():  # a step no function could score: NaN, as TRL logs it
            warnings.simplefilter("ignore", RuntimeWarning)
            scalars[names.REWARD] = float(np.nanmean(totals))  # TRL's: over the scorable completions
        scalars[names.FRAC_REWARD_ZERO_STD] = float(zero.mean())
        scalars[names.MIN_GROUP_STD] = self.min_group_std
        scalars[names.SCORING_ERRORS] = sum(e is not None for e in errors)
        groups = pd.DataFrame({"group": np.arange(p), "prompt_id": [rows[i * g][0] for i in range(p)],
                               "size": g, "reward_mean": stats.mean, "reward_std": stats.std,
                               "trainable": stats.trainable, "phantom": stats.phantom})
        keep = set(range(p)) if self.keep_text == "all" else set(range(min(p, self.text_sample_groups)))
        rollouts = [(i // g, i % g, float(totals[i]),
                     {n: (None if not math.isfinite(v) else float(v)) for n, v in zip(self.names, scores[i])},
                     rows[i][1] if i // g in keep else None, errors[i]) for i in range(len(rows))]
        events = self._alerts(state.global_step, scalars)
        self.store.log_step(state.global_step, scalars, groups, rollouts, events)

    def _alerts(self, step: int, scalars: dict) -> list[tuple[str, dict]]:
        """New health alerts (a kind not already raised at the previous step) as events."""
        if not hasattr(health, "alerts"):
            return []
        wide = self.store.scalars_wide(since_step=step - self.health_cfg.trend_window - 1)
        row = pd.DataFrame([scalars], index=pd.Index([step], name="step"))
        wide = pd.concat([wide[wide.index != step], row]).sort_index()
        found = health.alerts(wide, self.health_cfg)
        kinds = {a.kind for a in found}
        new = [(EV_ALERT, {"kind": a.kind, "severity": a.severity, "message": a.message, "step": a.step})
               for a in found if a.kind not in self._alert_kinds]
        self._alert_kinds = kinds
        return new

    # ---- TRL's own numbers: kept beside ours (trl/...), loss and timing under our names --------------------
    def on_log(self, args, state, control, logs=None, **kw):
        if not self.main or self.store is None or not logs:
            return
        if is_trl_summary(logs):
            self.store.set_meta(summary={k: v for k, v in logs.items() if isinstance(v, (int, float, str))})
            return
        scalars = map_trl_entry(logs, ImportReport("trl", "live"), live=True)
        if scalars:
            self.store.log_step(state.global_step, scalars)
