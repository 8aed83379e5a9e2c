"""Where a finished step goes on rank 0: the sinks the trainer's loop hands each step to.

In order: the store, the W&B and Trackio mirrors, the autopilot, the progress bar, the
periodic checkpoint. Each is a sink with `after_step(trainer, record)` and `close()`;
`open_sinks` lists the ones a run's config asks for, so a new destination is a class here and a
line in that list, and the trainer's loop (Trainer.one_step) only calls them in order. A sink
that `logs` is timed into the next step's time/log_s (the store's and the mirrors' writes).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from grpo_core.runs import names
from grpo_core.runs.step_columns import StepGroups, StepRollouts


@dataclass
class StepRecord:
    """One finished step as the sinks receive it."""
    step: int
    scalars: dict
    groups: StepGroups
    rollouts: StepRollouts
    events: list[tuple]


class StepSink:
    logs = False  # its time counts in the next step's time/log_s

    def after_step(self, trainer, record: StepRecord):
        raise NotImplementedError

    def close(self):
        """At the run's end, whatever its outcome."""


class StoreSink(StepSink):
    """The step into the run store (batched commits in run(): Trainer.log_step)."""
    logs = True

    def after_step(self, trainer, record: StepRecord):
        trainer.log_step(record.scalars, record.groups, record.rollouts, record.events)


class MirrorSink(StepSink):
    """The W&B mirror (log.wandb offline/online) and the Trackio mirror (log.trackio), each
    imported only when asked for (both optional); both on, fed as one."""
    logs = True

    def __init__(self, mirror):
        self.mirror = mirror

    @classmethod
    def open(cls, trainer) -> "MirrorSink | None":
        cfg, store = trainer.cfg, trainer.store
        from grpo_core.integrations.trackio_mirror import TrackioMirror, together
        trackio = TrackioMirror(cfg.log.trackio, store.run_id, cfg.to_dict()) if cfg.log.trackio else None
        wandb = None
        if cfg.log.wandb != "off":
            from grpo_core.integrations.wandb import WandbMirror
            wandb = WandbMirror(cfg.log.wandb, cfg.log.wandb_project, store.run_id, store.run_dir, cfg.to_dict())
        mirror = together(trackio, wandb)
        return cls(mirror) if mirror is not None else None

    def after_step(self, trainer, record: StepRecord):
        trainer.flush_writes()  # the mirror reads this step's events back from the store
        self.mirror.stored_step(trainer.store, record.step, record.scalars, record.groups, record.rollouts)

    def close(self):
        self.mirror.finish()


class AutopilotSink(StepSink):
    """The autopilot reads the steps so far and sends its moves as requests (applied at the next
    step boundary, like the user's); off while autopilot.enabled is (set_autopilot switches it)."""

    def after_step(self, trainer, record: StepRecord):
        if trainer.autopilot_on and not trainer.stop_reason and record.step < trainer.cfg.grpo.steps:
            trainer.flush_writes()  # the autopilot reads the window from the store
            trainer.run_autopilot()


class ProgressBarSink(StepSink):
    """tqdm's bar on the terminal (log.progress)."""

    def __init__(self, trainer):
        from tqdm import tqdm
        self.bar = tqdm(total=trainer.cfg.grpo.steps, initial=trainer.step, desc=trainer.store.run_id,
                        file=sys.stderr, dynamic_ncols=True, mininterval=0.5)

    def after_step(self, trainer, record: StepRecord):
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{record.scalars[names.REWARD]:.3f}",
                             ratio=f"{record.scalars[names.TRAINABLE_RATIO]:.2f}", level=trainer.task.level,
                             refresh=False)

    def close(self):
        self.bar.close()


class CheckpointSink(StepSink):
    """A checkpoint every log.checkpoint_every steps (the run's last is written by run() itself)."""

    def after_step(self, trainer, record: StepRecord):
        every = trainer.cfg.log.checkpoint_every
        if every and record.step % every == 0 and record.step < trainer.cfg.grpo.steps:
            trainer.save_checkpoint("periodic")


def open_sinks(trainer) -> list[StepSink]:
    """The sinks of this run, in the order a step reaches them."""
    mirror = MirrorSink.open(trainer)
    return [StoreSink(), *([mirror] if mirror else []), AutopilotSink(),
            *([ProgressBarSink(trainer)] if trainer.cfg.log.progress else []), CheckpointSink()]


def close_sinks(sinks: list[StepSink]):
    """Every sink closed, the rest still when one raises (the first error goes on)."""
    error = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as e:  # noqa: BLE001 - close the others, then raise the first
            error = error or e
    if error is not None:
        raise error
