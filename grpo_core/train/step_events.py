"""What a finished step sets off in the embedded trainer: alerts that start at it, and the curriculum's level raise.

Both keep a little state across steps (in the checkpoint: `state_dict`). Under torchrun the
curriculum runs on every rank (it changes the task every rank draws from, from the step's
global numbers, so all decide alike); alerts only on rank 0, which writes them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from grpo_core.analysis import health
from grpo_core.runs import names
from grpo_core.runs.live_settings import SET_DIFFICULTY
from grpo_core.runs.store import EV_ALERT, EV_CHANGE

ALERT_REARM = 10  # steps an alert must stay quiet before it may fire (and be logged) again


class AlertWatch:
    """The alerts of the run so far: which hold, and the recent steps they are judged on."""

    def __init__(self, health_cfg, outcome_metric: str | None):
        self.cfg, self.outcome = health_cfg, outcome_metric
        self.active: dict[str, int] = {}  # alert kind -> last step it held
        self.history: list[dict] = []  # recent steps' scalars

    def new_alerts(self, step: int, scalars: dict) -> list[tuple[str, dict]]:
        """Alert events for alerts that start at this step. An ongoing alert is not repeated, and
        one that went quiet for fewer than ALERT_REARM steps is the same episode (a trend alert
        near its significance line flaps on and off every few steps)."""
        h = self.cfg
        keep = max(h.trend_window, h.near_zero_steps, h.zero_trainable_steps) + 1
        self.history.append({"step": step, **scalars})
        del self.history[:-keep]
        held = health.alert_kinds(self.history, h, self.outcome)
        is_new = lambda kind: step - self.active.get(kind, -ALERT_REARM - 1) > ALERT_REARM  # noqa: E731
        if held is not None and not any(map(is_new, held)):  # nothing starts: no message to write
            self.active.update(dict.fromkeys(held, step))
            return []
        # An alert starts (or the window has gaps): health.alerts() writes the messages.
        # Only the columns alerts() reads: building a frame of every logged name cost more than the alerts.
        columns = health.alert_columns(h, self.outcome)
        wide = pd.DataFrame({n: [r.get(n, np.nan) for r in self.history] for n in columns},
                            index=pd.Index([r["step"] for r in self.history], name="step"))
        now = health.alerts(wide, h, self.outcome)
        events = [(EV_ALERT, {"kind": a.kind, "severity": a.severity, "message": a.message, "step": a.step})
                  for a in now if is_new(a.kind)]
        self.active.update({a.kind: step for a in now})
        return events

    def state_dict(self) -> dict:
        return {"active_alerts": self.active, "history": self.history}

    def load_state_dict(self, state: dict, step: int):
        seen = state.get("active_alerts", {})
        self.active = seen if isinstance(seen, dict) else dict.fromkeys(seen, step)  # an old list of kinds
        self.history = state.get("history", [])


class Curriculum:
    """curriculum.mode auto: the task's level goes up after `window` steps that were too easy."""

    def __init__(self, curriculum_cfg, task, log):
        self.cfg, self.task, self.log = curriculum_cfg, task, log
        self.streak = 0

    def after_step(self, step: int, scalars: dict) -> list[tuple[str, dict]]:
        """The change event when the level goes up after `step` (it takes effect at the next)."""
        c = self.cfg
        if c.mode != "auto" or self.task.levels < 2:
            return []
        easy = scalars[names.TRAINABLE_RATIO] < c.raise_ratio and scalars[names.REWARD] > c.raise_reward
        self.streak = self.streak + 1 if easy else 0
        top = min(c.max_level, self.task.levels)
        if self.streak < c.window or self.task.level >= top:
            return []
        old = self.task.level
        self.task.set_level(old + 1)
        self.streak = 0
        msg = (f"curriculum: level {old} -> {self.task.level} from step {step + 1} (ratio < {c.raise_ratio:g} "
               f"and reward > {c.raise_reward:g} for {c.window} steps)")
        self.log(msg)
        return [(EV_CHANGE, {"kind": SET_DIFFICULTY, "request": {"level": self.task.level},
                             "source": "curriculum", "message": msg})]
