"""Trainability per prompt: how often each prompt was sampled, how often its group taught something, how its last group ended.

The last outcome is the group's flat cause (flat_causes: names.FLAT_CAUSES' keys, mixed = trainable). A
prompt that is never trainable costs sampling every time it is drawn: the export lists them,
one JSON object per line, to filter a dataset or order a curriculum (charts.prompt_rates_chart
draws the rates). Everything comes from the store's groups (and the prompts table for the
text), so an imported run whose groups carry prompt ids works the same.

Per prompt, the successes of a binary metric (group_successes, prompt_counts) feed the planner
that knows prompts differ (planner.flat_rates): flat_forecast predicts the flat-group share at
any G from them, measured_flat is the share that was flat."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from grpo_core.analysis import planner, step_stats
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



# ---- per-prompt success counts: the planner that knows prompts differ (analysis/planner.py) -------
SUCCESS_AT = 0.5  # a binary metric's score at or above this is a success


def group_successes(groups: pd.DataFrame, rollouts: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One row per group with rollouts: step, group, prompt_id, trials, successes of one binary
    metric (a failed score counts as a failure, as the trainer scores it). A group without a
    prompt id is a prompt of its own ("step:group"): it cannot be tied to any other."""
    cols = ["step", "group", "prompt_id", "trials", "successes"]
    if rollouts.empty or metric not in rollouts.columns:
        return pd.DataFrame(columns=cols)
    ok = (rollouts[metric].fillna(0.0) >= SUCCESS_AT).astype(int).groupby([rollouts["step"], rollouts["group"]])
    per = pd.DataFrame({"trials": ok.size(), "successes": ok.sum()}).reset_index()  # (named .agg: 3x the time)
    keys = ["step", "group", "prompt_id"]
    ids = groups[keys] if len(groups) else pd.DataFrame(columns=keys)
    per = per.merge(ids, on=["step", "group"], how="left")
    own = per["step"].astype(str) + ":" + per["group"].astype(str)
    per["prompt_id"] = per["prompt_id"].astype(object).where(per["prompt_id"].notna(), own)
    return per[cols]


def prompt_counts(per_group: pd.DataFrame) -> pd.DataFrame:
    """group_successes -> one row per prompt: prompt_id, groups, trials, successes."""
    if per_group.empty:
        return pd.DataFrame(columns=["prompt_id", "groups", "trials", "successes"])
    per = per_group.groupby("prompt_id")
    return pd.DataFrame({"groups": per.size(), "trials": per["trials"].sum(),
                         "successes": per["successes"].sum()}).reset_index()


def measured_flat(per_group: pd.DataFrame) -> float | None:
    """Share of the groups whose binary metric did not vary (all successes or none)."""
    if per_group.empty:
        return None
    s, n = per_group["successes"], per_group["trials"]
    return float(((s == 0) | (s == n)).mean())


def flat_forecast(history: pd.DataFrame, G: int, prompts=None) -> dict:
    """The flat-group share predicted for groups of G from a history (group_successes rows):
    "pooled" (one success rate) and "per_prompt" (each prompt's rate shrunk toward the pool,
    planner.flat_rates), plus "p" and the prompt count. prompts: the ids to predict for, each once
    (default: every prompt in the history); one the history lacks gets the prompts' prior."""
    counts = prompt_counts(history)
    out = {"pooled": None, "per_prompt": None, "p": None, "prompts": int(len(counts)), "G": int(G)}
    if counts.empty:
        return out
    s, n = counts["successes"].to_numpy(float), counts["trials"].to_numpy(float)
    prior = planner.beta_prior(s, n)
    rates = planner.flat_rates(s, n, G, prior)
    out.update(pooled=rates["pooled"], p=rates["p"], per_prompt=rates["per_prompt"])
    if prompts is not None and len(prompts) and prior is not None:  # no prior: every prompt at the pooled rate
        known = dict(zip(counts["prompt_id"], zip(s, n)))
        ks, kn = zip(*(known.get(pid, (0.0, 0.0)) for pid in prompts))
        out["per_prompt"] = float(planner.prompt_flat_probabilities(ks, kn, G, prior).mean())
        out["prompts"] = len(prompts)
    return out
