"""One run's store read once for analysis (RunData), and the notices a reader must see before trusting its numbers.

Everything the analysis page, the report and the comparison show is plain pandas over a
RunData: one read of the store (scalars and changes whole; the rollouts of a large run
for a sample of its steps), so nothing downstream touches SQLite again except the
inspector, which reads one group's completion text. Nothing here imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis.rollout_stats import ROLLOUT_COLUMNS
from grpo_core.analysis.windows import column, ratio_series
from grpo_core.runs import names
from grpo_core.runs.run_meta import FAILED, FINISHED, STALE, STOPPED, RunMeta, display_status, error_line
from grpo_core.runs.store import RunStore

INCOMPLETE = "incomplete"  # an imported run whose source stopped before its planned last step
UNKNOWN_END = "unknown"  # an imported run whose source records no end: whether it finished is unknown
DEFAULT_WINDOW = 20


class ReportError(ValueError):
    """A report request that cannot be answered (e.g. a step/group not in the run)."""


# =============================================================================================
@dataclass
class RunData:
    run_id: str
    db_path: Path
    meta: dict
    config: dict
    status: str  # display status (stale derived from the heartbeat)
    wide: pd.DataFrame  # scalars: index step, columns names.*
    groups: pd.DataFrame
    rollouts: pd.DataFrame  # no completion text (the inspector reads text per group)
    changes: pd.DataFrame
    metrics: list[str]
    # A large run read in part (see load_run): {"steps_read", "steps", "rollouts"}; None: all of it.
    sampled: dict | None = None

    @property
    def error(self) -> str | None:
        return error_line(self.meta)  # one line, an older store's traceback included

    @property
    def source(self) -> str:
        return self.meta.get("source") or ("import" if self.meta.get("kind") == "import" else "grpo_core")

    @property
    def imported(self) -> bool:
        """Written by an importer (a finished log of another trainer), not by a live process."""
        return self.meta.get("kind") == "import"

    def cfg(self, section: str, key: str, default=None):
        return (self.config.get(section) or {}).get(key, default)


ROLLOUT_BUDGET = 100_000  # rollouts one report reads at most; a larger run's are sampled by step
GROUP_SCALARS = (names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE, names.PHANTOM_GROUPS, names.REWARD, names.REWARD_STD)


def sample_steps(store: RunStore, wide: pd.DataFrame, changes: pd.DataFrame, window: int,
                 budget: int) -> tuple[list[int] | None, int, int]:
    """(steps to read or None for all, steps with rollouts, estimated rollouts). A run whose
    rollouts fit the budget is read whole. A larger one (reading and reducing every rollout of a
    long run takes minutes) is read at: its last `window` steps (examples, inspector), the
    before/after windows of every change (the ledger's like-for-like rewards) and evenly
    spaced steps for the rest of the budget. What the rollouts feed there are means over
    groups (within-group std, uniform share, variance share), which a step sample estimates."""
    lo, hi, per_step = store.rollout_extent()
    if hi is None or per_step == 0:
        return None, 0, 0
    steps = np.asarray(wide.index, dtype=np.int64) if len(wide) else np.arange(lo, hi + 1)
    steps = steps[(steps >= lo) & (steps <= hi)]
    est = len(steps) * per_step
    if est <= budget or not len(steps):
        return None, len(steps), est
    have = set(steps.tolist())
    want = set(steps[-window:].tolist())
    for c in changes["step"].dropna().astype(int):  # +-1: a change may be recorded a step early
        want |= have & set(range(c - window - 1, c + window + 2))
    rest = max(budget // per_step - len(want), 0)
    if rest:
        want |= set(steps[np.linspace(0, len(steps) - 1, rest).astype(int)].tolist())
    return sorted(want), len(steps), est


def load_run(run, window: int = DEFAULT_WINDOW, budget: int | None = None) -> RunData:
    """A run dir, run.db path, run id, or an open RunStore -> RunData (read once). Scalars and
    changes are read whole; rollouts (and groups, when the per-step counts are logged) of a
    run with more than `budget` (default ROLLOUT_BUDGET) rollouts are read for a sample of
    steps (sample_steps)."""
    if isinstance(run, RunData):
        return run
    own = not isinstance(run, RunStore)
    store = RunStore.open(run, readonly=True) if own else run
    try:
        meta = store.get_meta()
        wide = store.scalars_wide()
        changes = store.changes()
        sample, n_steps, est = sample_steps(store, wide, changes, window,
                                            ROLLOUT_BUDGET if budget is None else budget)
        counts_logged = all(column(wide, n) is not None for n in GROUP_SCALARS)
        groups = store.groups(steps=sample if counts_logged else None)  # else steps_table counts them
        rollouts = store.rollouts(with_text=False, steps=sample)
    finally:
        if own:
            store.close()
    config = RunMeta.parse(meta).config
    metrics = list(meta.get("metric_names") or [])  # the trainer records its metrics in order
    metrics += [m for m in (config.get("reward") or {}).get("weights") or {} if m not in metrics]
    for col in rollouts.columns:  # metrics scored but not in the config (custom, imported)
        if col not in ROLLOUT_COLUMNS and col not in metrics:
            metrics.append(col)
    for col in wide.columns:
        parsed = names.parse_metric_name(col)
        if parsed and parsed[0] not in metrics:
            metrics.append(parsed[0])
    return RunData(run_id=store.run_id, db_path=store.path, meta=meta, config=config,
                   status=display_status(meta), wide=wide, groups=groups, rollouts=rollouts,
                   changes=changes, metrics=metrics,
                   sampled=None if sample is None else {"steps_read": len(sample), "steps": n_steps, "rollouts": est})


def steps_index(data: RunData) -> pd.Index:
    """Every step the run logged, as scalars or as groups."""
    steps = set(int(s) for s in data.wide.index)
    if len(data.groups):
        steps |= set(int(s) for s in data.groups["step"].unique())
    return pd.Index(sorted(steps), name="step", dtype="int64")


@dataclass
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


def notices(data: RunData) -> list[Notice]:
    out = []
    steps = steps_index(data)
    last = int(steps[-1]) if len(steps) else None
    planned = data.cfg("grpo", "steps")
    of = f" of {planned}" if planned else ""
    if data.status == FAILED:
        at = f" at step {last}" if last is not None else " before its first step"
        error = (data.error or "no error text recorded").rstrip(".")  # the sentence ends here, once
        out.append(Notice("error", f"Run failed{at}: {error}. "
                                   "The analysis covers the steps logged before the failure."))
    elif data.status == STALE:
        where = f"at step {last}{of}" if last is not None else "before its first step"
        out.append(Notice("warning", f"The trainer stopped reporting (no heartbeat) {where}: "
                                     "it may have been killed. The analysis covers the steps logged."))
    elif data.status == INCOMPLETE:
        out.append(Notice("warning", f"{data.meta.get('status_detail') or INCOMPLETE}: the source stopped before "
                                     "its planned last step (killed, crashed or still running when it was "
                                     "imported). The analysis covers the steps logged."))
    elif data.status == UNKNOWN_END:
        out.append(Notice("info", f"{data.meta.get('status_detail') or UNKNOWN_END}. The analysis covers the "
                                  "steps logged."))
    elif data.status not in (FINISHED, STOPPED) and not data.imported:
        where = f"step {last}{of}" if last is not None else "no step logged yet"
        out.append(Notice("info", f"Run still in progress ({data.status}, {where}): the analysis "
                                  "covers the steps so far; reload for newer ones."))
    elif data.status == STOPPED:
        out.append(Notice("info", f"Run stopped by request at step {last}{of}."))
    if not len(steps):
        out.append(Notice("warning", "No steps logged yet: there is nothing to analyse in this run."))
        return out
    if len(steps) == 1:
        out.append(Notice("warning", f"Only one step logged (step {last}): the reward trend and the "
                                     "before/after windows need at least two steps."))
    if data.groups.empty and data.rollouts.empty:
        ratio_from = ratio_series(data.wide).text
        out.append(Notice("warning", f"No per-group or per-rollout records in this run (source: {data.source}): "
                                     "the variance shares, uniform fractions, phantom counts and the rollout "
                                     f"inspector are unavailable; the trainable ratio comes from {ratio_from}."))
    elif data.rollouts.empty:
        out.append(Notice("warning", "Groups are recorded but no rollouts: variance shares, uniform fractions "
                                     "and the rollout inspector are unavailable."))
    if data.sampled:
        sm = data.sampled
        out.append(Notice("info", f"Large run (~{sm['rollouts']:,} rollouts): variance shares, uniform fractions, "
                                  "like-for-like rewards and the rollout inspector use the rollouts of "
                                  f"{sm['steps_read']:,} of its {sm['steps']:,} steps (the last ones, the windows "
                                  "around each change, evenly spaced others); trainability, rewards and ratios "
                                  "use every step."))
    return out

