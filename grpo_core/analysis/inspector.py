"""The rollout inspector: one group's completions ranked by reward, and why the group was (not) trainable."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.analysis.flat_causes import MEANING
from grpo_core.analysis.run_data import ReportError, RunData
from grpo_core.analysis.step_stats import STD_EPS
from grpo_core.analysis.windows import column
from grpo_core.runs import names
from grpo_core.runs.live_settings import SET_THRESHOLD
from grpo_core.runs.store import RunStore


@dataclass
class GroupView:
    step: int
    group: int
    prompt_id: str | None
    table: pd.DataFrame  # rank, idx, total, <metric>..., completion, error
    std: float | None
    threshold: float
    trainable: bool | None
    phantom: bool | None
    varied: dict  # metric -> within-group std, for metrics that varied
    explanation: str
    prompt: str | None = None  # the prompt as the model read it (the store's prompts table), if kept
    cause: str | None = None  # why a flat group was flat, as recorded (flat_causes; None: not recorded)


def _threshold_at(data: RunData, step: int) -> float:
    s = column(data.wide, names.MIN_GROUP_STD)
    if s is not None and step in s.index and pd.notna(s.loc[step]):
        return float(s.loc[step])
    thr = data.cfg("grpo", "min_group_std", 0.01)
    ch = data.changes
    if ch is not None and len(ch):
        for c in ch[(ch["kind"] == SET_THRESHOLD) & (ch["step"] <= step)].itertuples():
            thr = (c.request or {}).get("min_group_std", thr)
    return float(thr if thr is not None else 0.01)


def group_index(data: RunData) -> pd.DataFrame:
    """Groups to choose from in the inspector (from the groups table, else from rollouts)."""
    if len(data.groups):
        return data.groups
    if len(data.rollouts):
        return (data.rollouts.groupby(["step", "group"]).size().rename("size").reset_index())
    return pd.DataFrame(columns=["step", "group"])


def inspect_group(data: RunData, step: int, group: int) -> GroupView:
    """One group's completions ranked by total reward, and why it was (not) trainable."""
    step, group = int(step), int(group)
    grow = data.groups[(data.groups["step"] == step) & (data.groups["group"] == group)] if len(data.groups) \
        else data.groups
    with RunStore(data.db_path, readonly=True) as store:
        r = store.rollouts(step=step, group=group)
        text = store.prompt_texts([str(grow["prompt_id"].iloc[0])]) if len(grow) else {}
    if r.empty and grow.empty:
        idx = group_index(data)
        where = (f"steps {int(idx['step'].min())}–{int(idx['step'].max())}" if len(idx) else "no groups recorded")
        raise ReportError(f"step {step}, group {group} is not in run {data.run_id} ({where})")
    thr = _threshold_at(data, step)
    unif = float(data.cfg("health", "uniform_std", 1e-3) or 1e-3)
    outcome = data.cfg("reward", "outcome_metric", "") or ""
    rec_tr = bool(grow["trainable"].iloc[0]) if len(grow) else None
    rec_ph = bool(grow["phantom"].iloc[0]) if len(grow) else None
    prompt = str(grow["prompt_id"].iloc[0]) if len(grow) else None
    if r.empty:
        expl = (f"No rollouts were recorded for step {step}, group {group}: the group was "
                f"{'trainable' if rec_tr else 'not trainable'} (recorded std {grow['reward_std'].iloc[0]:.4f}), "
                "but its completions cannot be shown.") + _cause_text(grow, rec_tr)
        return GroupView(step, group, prompt, pd.DataFrame(), None, thr, rec_tr, rec_ph, {}, expl, text.get(prompt),
                         _cause(grow))
    metrics = [m for m in data.metrics if m in r.columns]
    table = r.sort_values("total", ascending=False, kind="stable").reset_index(drop=True)
    table.insert(0, "rank", np.arange(1, len(table) + 1))
    extra = [c for c in ("completion", "error") if c in table and table[c].notna().any()]  # only when kept / any
    table = table[["rank", "idx", "total", *metrics, *extra]]
    totals = table["total"].to_numpy(np.float64)
    std = float(totals.std())
    mstd = {m: float(table[m].to_numpy(np.float64).std()) for m in metrics}
    varied = {m: v for m, v in mstd.items() if v > max(unif, STD_EPS)}
    passes = std > max(thr, STD_EPS)
    outcome_varies = (outcome in varied) if outcome else True
    trainable = rec_tr if rec_tr is not None else bool(passes and outcome_varies)
    phantom = rec_ph if rec_ph is not None else bool(passes and not outcome_varies)
    expl = _explain(len(table), totals, std, thr, varied, metrics, outcome, table, trainable, phantom)
    if rec_tr is not None and rec_tr != bool(passes and outcome_varies):
        expl += (f" (Recorded as {'trainable' if rec_tr else 'not trainable'} by the trainer; recomputing from "
                 "the stored rollouts gives the opposite: the threshold or the rollouts kept may differ.)")
    expl += _cause_text(grow, trainable)
    return GroupView(step, group, prompt, table, std, thr, trainable, phantom, varied, expl, text.get(prompt),
                     _cause(grow))


def _cause(grow: pd.DataFrame) -> str | None:
    cause = grow["outcome"].iloc[0] if len(grow) and "outcome" in grow else None
    return None if cause is None or pd.isna(cause) else str(cause)


def _cause_text(grow: pd.DataFrame, trainable: bool | None) -> str:
    """The recorded cause of a flat group, in words (flat_causes.MEANING); nothing for a trainable one."""
    cause = _cause(grow)
    if trainable or cause is None or cause == names.CAUSE_MIXED:  # not recorded (an import): the numbers above say it
        return ""
    return f" Why it was flat: {cause}: {MEANING.get(cause, 'a cause this version does not know')}."


def _explain(n, totals, std, thr, varied, metrics, outcome, table, trainable, phantom) -> str:
    var_txt = ", ".join(f"{m} (std {v:.3f})" for m, v in varied.items())
    uniform = [m for m in metrics if m not in varied]
    uni_txt = (f"; uniform: {', '.join(uniform)}" if uniform else "")
    if phantom:
        vals = sorted(set(np.round(table[outcome].to_numpy(np.float64), 6))) if outcome in table else []
        return (f"Not trainable (phantom variance): the total-reward std {std:.4f} passes the threshold {thr:g}, "
                f"but the outcome metric '{outcome}' was uniform (every completion scored "
                f"{', '.join(f'{v:g}' for v in vals)}), so the variance came only from shaping terms: "
                f"{', '.join(m for m in varied) or 'none'}.")
    if trainable:
        gate = f" and the outcome metric '{outcome}' varied" if outcome else ""
        return (f"Trainable: the total-reward std {std:.4f} of its {n} completions is above the threshold "
                f"{thr:g}{gate}. Metrics that varied: {var_txt or 'none'}{uni_txt}.")
    if np.ptp(totals) <= 1e-12:
        why = ("no metric varied" if not varied else f"the metrics that varied ({var_txt}) cancel out or "
               "carry no weight in the total")
        return (f"Not trainable: all {n} completions got the same total reward {totals[0]:.4f} (std 0 <= "
                f"threshold {thr:g}); {why}. Every advantage would be 0.")
    if std <= thr:
        return (f"Not trainable: the total-reward std {std:.4f} is at or below the threshold {thr:g}; "
                f"only {var_txt or 'no metric'} varied, too little after weighting{uni_txt}.")
    gate = f" the outcome metric '{outcome}' did not vary" if outcome else " it was masked by the trainer"
    return f"Not trainable: std {std:.4f} is above the threshold {thr:g}, but{gate}."
