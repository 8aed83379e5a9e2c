"""The pilot process (`python -m grpo_core pilot`): sample and score batches with the model training would start from, no update, into a run store of kind "pilot".

It runs the trainer's own code (loading, warm-start cache, seeds, rollout and scoring), so a
pilot predicts what training's first steps will see. The config is read and checked before
the trainer (and torch) is imported: bad input is one line, fast. What the pilot's numbers
say is grpo_core.analysis.pilot; starting one from the dashboard is dashboard/pilot_start.py.
"""
from __future__ import annotations

import copy
import os
import sys

from grpo_core.analysis.pilot import DEFAULT_BATCHES, pilot_summary
from grpo_core.errors import USER_ERRORS
from grpo_core.runs import failure
from grpo_core.runs.lifecycle import RunSession
from grpo_core.runs.live_settings import STOP
from grpo_core.runs.locations import new_run_id, storage_problem
from grpo_core.runs.run_meta import FAILED, FINISHED, STOPPED
from grpo_core.tasks.loading import load_config


def _explicit_steps(overrides: list[str]) -> bool:
    return any(o.split("=", 1)[0].strip() == "grpo.steps" for o in overrides)


def _pilot_line(e: BaseException, store, batch: int) -> str:
    """The one line of a pilot that failed at `batch` (runs/failure.py: the traceback goes to its log)."""
    why = storage_problem(e)
    clear = (f"cannot write to {store.run_dir} ({why}): the pilot stopped after batch {batch}; free space "
             "and pilot again") if why else None
    return failure.failure_line(e, store.run_dir, clear)


def _pilot_failed(e: BaseException, line: str) -> int:
    """The exit code of a pilot that failed with its one `line` (its store says failed already)."""
    if isinstance(e, KeyboardInterrupt):
        return 130
    if not isinstance(e, Exception):
        raise e
    print(f"error: {line}", file=sys.stderr)
    return 2 if isinstance(e, USER_ERRORS) else 1  # bad input exits 2, as the CLI's other verbs


def cli_pilot(args) -> int:
    """Sample and score grpo.steps batches (DEFAULT_BATCHES unless --set grpo.steps=N) of
    grpo.prompts_per_step prompts x grpo.group_size completions with the model the trainer
    would start from (same loading, warm-start cache, seeds, rollout and scoring: the
    trainer's own code), no update; log each batch as a step of a "pilot" run store."""
    overrides = list(getattr(args, "overrides", None) or [])
    steps = load_config(args.config, overrides).grpo.steps  # bad input: one line, before torch loads
    if not _explicit_steps(overrides):  # a training config's steps is its length, not the pilot's
        overrides.append(f"grpo.steps={min(steps, DEFAULT_BATCHES)}")
    from grpo_core.train import launch
    from grpo_core.train.models import set_threads
    from grpo_core.train.trainer import Trainer

    args = copy.copy(args)
    args.overrides, args.resume = overrides, False
    args.run_id = args.run_id or new_run_id("pilot")  # not "demo-...": that prefix is the live demo run's
    cfg, store = launch.open_run(args)  # new store, or the one start_pilot created
    # kind, and our pid before the (maybe long) model load: a pilot killed while starting shows stale.
    store.set_meta(kind="pilot", pid=os.getpid(), host=os.uname().nodename)
    set_threads(cfg)
    print(f"pilot {store.run_id}: {store.run_dir}", file=sys.stderr, flush=True)
    sampling = copy.deepcopy(cfg)
    sampling.grpo.beta = 0.0  # no update: a reference model would only cost memory
    sampling.grpo.budget_pilot = 0  # the planner reads uniform groups of G: per-prompt budgets would skew them
    try:
        trainer = Trainer(sampling, store)
    except BaseException as e:
        line = _pilot_line(e, store, 0)
        store.reject_open_requests("pilot failed to start")
        store.set_status(FAILED, error=line)
        return _pilot_failed(e, line)
    launch.install_stop_signals(trainer)  # SIGTERM / Ctrl-C: finish the batch, status stopped

    def stop(req):
        trainer.stop_reason = f"stop request {req['id']}"
        return True, trainer.step, f"stopping after batch {trainer.step}"

    def refuse(req):  # a pilot changes nothing mid-way: only a stop applies
        return False, trainer.step, "a pilot takes no changes: start a new pilot with the new settings"

    session = RunSession(store, {STOP: stop}, refuse)
    session.start(0, {"event": "started", "pilot": True, "batches": cfg.grpo.steps, "model": trainer.model_info},
                  metric_names=trainer.reward.names, metric_kinds=trainer.metric_kinds, model=trainer.model_info,
                  device=str(trainer.device))
    try:
        while trainer.step < cfg.grpo.steps and not trainer.stop_reason:
            session.serve()
            trainer.stop_reason = trainer.stop_reason or trainer.signal_reason  # a signal: finish the batch, stop
            if trainer.stop_reason:
                break
            scalars, groups, rollouts = trainer.train_step(update=False)
            trainer.step += 1
            store.log_step(trainer.step, scalars, groups, rollouts)
    except BaseException as e:
        line = _pilot_line(e, store, trainer.step)
        failure.record_failure(session, line, trainer.step, disk_full=bool(storage_problem(e)),
                               at="pilot failed at batch {step}")
        return _pilot_failed(e, line)
    status = STOPPED if trainer.stop_reason else FINISHED
    session.finish(status, trainer.step, trainer.stop_reason, at="pilot {status} at batch {step}")
    s = pilot_summary(store)
    if s.ratio is not None:
        print(f"pilot {store.run_id} {status}: {s.submitted} groups of {s.group_size}, trainable ratio "
              f"{s.ratio:.2f}; {s.verdict.headline}", file=sys.stderr)
        for a in s.verdict.actions[:1]:
            print(f"  {a.text}", file=sys.stderr)
    store.close()
    return 0
