"""The types every source reader shares (ImportReport, SourceRun) and writing a source's steps.

ImportReport says what was read, mapped and left out; SourceRun holds a source's steps. Here
too: the helpers that fill a SourceRun's rows, and writing its steps into a run store.

A reader (one per source kind: kinds.py) turns a file or an output folder into a SourceRun;
`import` writes it once (importers.py), `watch` re-reads it while it grows and appends the
new steps (follow.py). Nothing here imports torch or another integration module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_core.runs import names
from grpo_core.runs.store import RunStore

LACKS = ["groups", "rollouts"]  # what a source with scalars only never has


@dataclass
class ImportReport:
    source: str
    file: str
    entries: int = 0  # log entries / history rows / CSV rows read
    steps: int = 0  # steps written
    values: int = 0  # scalar values written
    mapped: dict = field(default_factory=dict)  # source name -> stored name (only where they differ)
    skipped: dict = field(default_factory=dict)  # "what: reason" -> count
    notes: list = field(default_factory=list)

    def skip(self, what: str, reason: str, n: int = 1):
        key = f"{what}: {reason}"
        self.skipped[key] = self.skipped.get(key, 0) + n

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def lines(self) -> list[str]:
        out = [f"read {self.entries} entries from {self.file}; wrote {self.steps} steps, {self.values} values"]
        out += [f"not imported ({n}x) {what}" for what, n in self.skipped.items()]
        out += [f"note: {t}" for t in self.notes]
        return out


@dataclass
class SourceRun:
    """A source as steps of a run: scalars under names.py's names and, where the source has
    them, each step's groups and rollouts (what-if and the group inspector then work)."""
    scalars: dict  # step -> {name: value}
    config: dict
    report: ImportReport
    summary: dict = field(default_factory=dict)  # run totals (TRL's train_runtime, ...): not a step
    groups: dict = field(default_factory=dict)  # step -> (StepGroups, StepRollouts)
    lacks: list = field(default_factory=lambda: list(LACKS))  # what the source never has
    # How the source ended: error (crashed: the run is failed), finished True (the reader found
    # an end record: finished), False or None (no end record: incomplete where the last step is
    # before `planned`, else unknown: importers.source_status).
    error: str | None = None
    finished: bool | None = None
    last_step: int | None = None  # the source's last trainer step (may be past the last logged one)
    planned: int | None = None  # max_steps, where the source records it (else config grpo.steps)
    ended: bool = False  # the source says the run is over (a W&B file's exit record): `watch` stops


def number(v) -> float | None:
    """A JSON value -> float, or None when it is not a number (bool, str, dict, None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def put_value(rows: dict, step: int, name: str, value: float, report: ImportReport):
    """Merge one value into a step; two different values for one name at one step are
    reported (the later one wins, as in the source's own charts)."""
    row = rows.setdefault(step, {})
    old = row.get(name)
    if old is not None and old != value and not (math.isnan(old) and math.isnan(value)):
        report.skip(name, "logged twice at the same step with different values; the later value kept")
    row[name] = value


def derive_counts(rows: dict, style: str, report: ImportReport):
    """Ratios from group counts where only counts were logged (ART), and ART's 'not all
    equal' rule gives frac_reward_zero_std = 1 - ratio."""
    for step in sorted(rows):
        r = rows[step]
        if style == "art":  # ART's PipelineTrainer counts only the batch it trained (names.ART_NAMES)
            for count, dropped, ratio in ((names.GROUPS_SUBMITTED, names.GROUPS_FILTERED, names.TRAINABLE_RATIO),
                                          (names.CUM_GROUPS_SUBMITTED, names.CUM_GROUPS_FILTERED,
                                           names.CUM_TRAINABLE_RATIO)):
                if count in r and dropped in r and ratio not in r:  # once: the ratio below marks it done
                    r[count] += r[dropped]
        s, t = r.get(names.GROUPS_SUBMITTED), r.get(names.GROUPS_TRAINABLE)
        if names.TRAINABLE_RATIO not in r and s and t is not None:
            r[names.TRAINABLE_RATIO] = t / s
            if style == "art" and names.FRAC_REWARD_ZERO_STD not in r:
                r[names.FRAC_REWARD_ZERO_STD] = 1 - t / s
        cs, ct = r.get(names.CUM_GROUPS_SUBMITTED), r.get(names.CUM_GROUPS_TRAINABLE)
        if names.CUM_TRAINABLE_RATIO not in r and cs and ct is not None:
            r[names.CUM_TRAINABLE_RATIO] = ct / cs
    if style == "art":
        report.note("ART counts a group trainable when its rewards are not all equal: "
                    "frac_reward_zero_std = 1 - trainable ratio")
        if any(names.GROUPS_FILTERED in r for r in rows.values()):
            report.note("ART's PipelineTrainer dropped zero-variance groups before training: they are added to "
                        "the groups submitted (ART's own count is the batch trained on)")


def steps_after(run: SourceRun, last: int | None) -> list[int]:
    return sorted(s for s in set(run.scalars) | set(run.groups) if last is None or s > last)


def write_steps(store: RunStore, run: SourceRun, last: int | None = None) -> int | None:
    """Write the source's steps after `last` (None: every step) in one transaction, so a
    reader sees all or none; returns the new last step."""
    todo = steps_after(run, last)
    if todo:
        batch = []
        for step in todo:
            groups, rollouts = run.groups.get(step, (None, None))
            batch.append((step, dict(run.scalars.get(step, {})), groups, rollouts, ()))
        store.log_steps(batch)
    return todo[-1] if todo else last
