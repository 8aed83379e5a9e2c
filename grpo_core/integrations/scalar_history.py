"""A scalar history by step (W&B, its CSV export, TensorBoard) -> store rows under our names.

Whose names they are (ours, TRL's, ART's) and how each maps, with the ratios derived.

A name is recognised per source style: `grpo_core` (our W&B mirror), `trl` (transformers'
W&B and TensorBoard callbacks prefix train/ and eval/), `art`, or `generic` (kept under
wandb/<name>). Every name that is not imported is counted in the ImportReport with why.
"""
from __future__ import annotations

import re

from grpo_core.integrations.base import ImportReport, derive_counts, put_value
from grpo_core.integrations.trl_state import (
    TRL_SUMMARY_KEYS,
    TrlStyle,
    derive_trl,
    map_trl_key,
    style_notes,
    trl_args,
    trl_notes,
    trl_reward_fn,
    trl_style,
)
from grpo_core.runs import names

OUR_NAMES = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
MIRROR_ALIASES = {"reward": names.REWARD, "reward_std": names.REWARD_STD}  # what WandbMirror adds for TRL-named charts
STEP_KEYS = ("train/global_step", "global_step", "training_step")  # x-axes other than W&B's _step
EPOCH_ONLY = ("epoch",)  # a row whose only values are these (and its step) carries nothing to chart


def is_ours(key: str) -> bool:
    return key in OUR_NAMES or names.parse_metric_name(key) is not None or (
        key.startswith("reward/") and key.endswith("/batch_std"))


def detect_style(keys: set[str], config: dict | None = None) -> str:
    """Who logged these names: grpo_core (our mirror), trl (transformers' W&B callback
    prefixes train/ and eval/), art, skyrl, prime-rl, or generic."""
    if (config or {}).get("grpo_health") or names.TRAINABLE_RATIO in keys or names.CUM_TRAINABLE_RATIO in keys:
        return "grpo_core"
    if "train/frac_reward_zero_std" in keys or "train/global_step" in keys or any(
            k.startswith("train/rewards/") for k in keys):
        return "trl"
    if any(k.startswith("data/step_num_groups") or k.startswith("data/cum/") for k in keys) or any(
            k in names.ART_NAMES for k in keys if k != "train/reward"):
        return "art"
    for source in ("skyrl", "prime-rl"):  # names only these trainers log (names.FOREIGN_NAMES)
        if any(names.foreign_name(source, k) for k in keys):
            return source
    return "generic"


def train_keys(keys) -> set[str]:
    """TRL's own names among W&B/TensorBoard keys: the train/ prefix transformers adds, removed."""
    return {k[len("train/"):] for k in keys if k.startswith("train/")}


def map_wandb_key(key: str, style: str, report: ImportReport, source: str = "wandb",
                  trl: TrlStyle | None = None) -> str | None:
    """A W&B key (or trackio's: `source`, the namespace of names kept as logged) -> stored
    name, or None (reported) when it is not imported. `trl`: what the whole log's TRL keys
    say (trl_style: which rewards/ keys are functions, what reward_std is)."""
    if key.startswith("_") or key in STEP_KEYS:
        report.skip(key, f"{'W&B' if source == 'wandb' else source} bookkeeping / step axis")
        return None
    if style == "grpo_core" and key in MIRROR_ALIASES:
        report.skip(key, f"alias the mirror logs for TRL-named charts (same values as {MIRROR_ALIASES[key]})")
        return None
    if style == "trl":
        if key.startswith("train/"):
            name = map_trl_key(key[len("train/"):], style=trl)
        elif key.startswith("eval/"):
            name = names.foreign("trl", key)
        else:
            name = key if is_ours(key) else names.foreign(source, key)
    elif style in ("art", "skyrl", "prime-rl") and names.foreign_name(style, key):
        name = names.foreign_name(style, key)
    else:
        name = key if is_ours(key) else names.foreign(source, key)
    if name != key:
        report.mapped[key] = name
    return name


def finish_rows(raw: dict, style: str, report: ImportReport, config: dict | None,
                summary: dict | None = None, source: str = "wandb", carry: list | None = None,
                keys: set | None = None) -> dict:
    """raw step -> {source key: number} -> mapped and derived rows. TRL's run totals
    (train/train_runtime, ...: logged once, at the last step) go to `summary`, and a row
    left with no values (a W&B row carrying only its step and epoch) is no step. `carry`:
    the cumulative sums from the rows before these (HistoryRows: a history in pieces);
    `keys`: every key of the whole history (default: these rows'), whose TRL names say
    which TRL logged them."""
    keys = keys if keys is not None else {k for items in raw.values() for k in items}
    trl = trl_style(train_keys(keys)) if style == "trl" else None
    rows: dict = {}
    for step, items in raw.items():
        for key, v in items.items():
            if style == "trl" and key.startswith("train/") and key[6:] in TRL_SUMMARY_KEYS:
                if summary is not None:
                    summary[key[6:]] = v
                report.skip(key, "run total: kept in meta.summary, not a training step value")
                continue
            name = map_wandb_key(key, style, report, source, trl)
            if name is not None:
                put_value(rows, step, name, v, report)
    drop_empty_rows(raw, rows, report)
    if style == "trl":
        fns = sorted({m[0] for k in report.mapped if k.startswith("train/")
                      for m in [trl_reward_fn(k[6:], trl.old_fn_names)] if m})
        trl_notes(report, fns, trl)
        style_notes(report, trl, train_keys(keys), None)
        args = trl_args(config or {}, report)
        if args.get("group_level", True):
            derive_trl(rows, report, args.get("groups_per_step"), args.get("logging_steps"), carry)
        else:
            report.note("no trainable ratio: with this run's settings TRL's frac_reward_zero_std is not a "
                        "per-group measure (kept as frac_reward_zero_std)")
    else:
        derive_counts(rows, style, report)
    report.note(f"names recognised as {style}'s" if style != "generic" else
                f"no known trainer's names recognised: metrics kept under {source}/<name>")
    return rows


def drop_empty_rows(raw: dict, rows: dict, report: ImportReport):
    """Steps with no value of their own (only a step key, or only the epoch) are not steps."""
    empty = [s for s in raw if s not in rows]
    empty += [s for s, r in rows.items() if r and all(n.rsplit("/", 1)[-1] in EPOCH_ONLY for n in r)]
    for s in empty:
        rows.pop(s, None)
    if empty:
        report.skip("row", "carries only a step key (or the epoch), no values: not a step", len(empty))


class HistoryRows:
    """A scalar history that arrives in pieces (W&B records, TensorBoard events: `watch` reads
    only what is new), finished piece by piece with finish_rows: each raw value is mapped
    once and TRL's cumulative ratio carries over. The newest step waits (its other values may
    be in the next piece) unless `flush`; a change in who logged the names (the style) or
    in the run's config finishes everything again."""

    def __init__(self, source: str = "wandb"):
        self.source, self.raw, self.keys = source, {}, set()
        self.pending: set[int] = set()
        self.newest: int | None = None
        self.rows: dict[int, dict] = {}
        self.summary: dict = {}
        self._restart(None, None)

    def _restart(self, style, config):
        self.style, self.config, self.carry = style, config, []
        self.trl = trl_style(train_keys(self.keys)) if style == "trl" else None
        self.report = ImportReport(self.source, "")  # what finishing mapped and skipped
        self.notes: dict[str, str] = {}
        self.pending |= set(self.raw)

    def add(self, raw: dict):
        for step, values in raw.items():
            self.raw.setdefault(step, {}).update(values)
            self.keys |= values.keys()
            self.pending.add(step)
            self.newest = step if self.newest is None else max(self.newest, step)

    def finish(self, config: dict | None, flush: bool = False) -> dict[int, dict]:
        """Finish the steps ready now -> {step: row} (rows with no values left out)."""
        style = detect_style(self.keys, config)
        trl = trl_style(train_keys(self.keys)) if style == "trl" else None
        if (style, config, trl) != (self.style, self.config, self.trl):  # who logged it: all finished again
            self._restart(style, dict(config or {}))
        ready = sorted(s for s in self.pending if flush or s != self.newest)
        if not ready:
            return {}
        self.pending -= set(ready)
        piece = ImportReport(self.source, "")
        rows = finish_rows({s: self.raw[s] for s in ready}, style, piece, config, self.summary, self.source,
                           self.carry, self.keys)
        merge_report(self.report, piece, notes=False)
        for note in piece.notes:  # a note with a count is replaced by its newer count
            self.notes[re.sub(r"\d+", "#", note)] = note
        self.report.notes = list(self.notes.values())
        self.rows.update(rows)
        return rows


def merge_report(into: ImportReport, other: ImportReport, notes: bool = True):
    """Add what `other` read, mapped and skipped to `into`."""
    into.entries += other.entries
    into.mapped.update(other.mapped)
    for what, n in other.skipped.items():
        into.skipped[what] = into.skipped.get(what, 0) + n
    for note in other.notes if notes else ():
        into.note(note)
