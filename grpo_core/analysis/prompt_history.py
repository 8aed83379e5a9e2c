"""Trainability per prompt: how often each prompt was sampled, how often its group taught something, how its last group ended.

The last outcome is step_stats.group_outcomes' (mixed, all solved, none solved, uniform). A
prompt that is never trainable costs sampling every time it is drawn: the export lists them,
one JSON object per line, to filter a dataset or order a curriculum (charts.prompt_rates_chart
draws the rates). Everything comes from the store's groups (and the prompts table for the
text), so an imported run whose groups carry prompt ids works the same."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from grpo_core.analysis import step_stats
from grpo_core.runs.store import RunStore

COLUMNS = ["prompt_id", "sampled", "trainable", "trainable_rate", "all_solved", "none_solved", "first_step",
           "last_step", "last_outcome", "prompt"]


def prompt_table(groups: pd.DataFrame, texts: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per prompt id, the least trainable first (then the most sampled)."""
    if groups.empty or groups["prompt_id"].isna().all():
        return pd.DataFrame(columns=COLUMNS)
    g = groups.sort_values(["step", "group"])
    outcome = g["outcome"] if "outcome" in g else pd.Series(None, index=g.index)
    table = g.assign(solved=outcome == step_stats.SOLVED, unsolved=outcome == step_stats.UNSOLVED,
                     outcome=outcome).groupby("prompt_id").agg(
        sampled=("step", "size"), trainable=("trainable", "sum"), all_solved=("solved", "sum"),
        none_solved=("unsolved", "sum"), first_step=("step", "min"), last_step=("step", "max"),
        last_outcome=("outcome", "last"))
    table["trainable"] = table["trainable"].astype(int)
    table["trainable_rate"] = table["trainable"] / table["sampled"]
    table = table.reset_index()
    table["prompt"] = table["prompt_id"].map(texts or {})
    return table.sort_values(["trainable_rate", "sampled"], ascending=[True, False], kind="stable")[COLUMNS] \
        .reset_index(drop=True)


def load(run) -> pd.DataFrame:
    """A run (dir, run.db or open store) -> its prompt table."""
    own = not isinstance(run, RunStore)
    store = RunStore.open(run, readonly=True) if own else run
    try:
        groups = store.groups()
        texts = store.prompt_texts(sorted(set(groups["prompt_id"].dropna()))) if len(groups) else {}
    finally:
        if own:
            store.close()
    return prompt_table(groups, texts)


def never_trainable(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["trainable"] == 0]


def to_jsonl(table: pd.DataFrame) -> str:
    """The prompts as JSON lines: id, text (when kept), counts and last outcome."""
    def plain(v):
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else v.item() if hasattr(v, "item") else v
    rows = [{k: plain(r[k]) for k in COLUMNS} for _, r in table.iterrows()]
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

