"""Why each flat group is flat: one cause per non-trainable group, from a fixed precedence, so a step's cause counts add up to its flat groups.

The causes, their stored values and their per-step counts are names.FLAT_CAUSES, in the order
they are tried; the first that holds names the group:

1. all errored: every rollout's scoring raised or gave NaN/inf. The rewards are the reward
   function's failure, not the policy's: nothing else can be read from them.
2. all solved: the outcome at the top of its range for every completion: reward.outcome_metric,
   else the weighted total (step_stats.group_outcomes) or every weighted binary metric (each check
   passed). Only a harder prompt makes such a group vary. It comes before
   the collapse and the cut: a right answer given with confidence is short and one text (the
   demo's "red [S2]"), and a cut completion that still scored right was right.
3. identical: every completion the same text. The G rollouts were one sample and no reward
   could split them; a higher temperature can, an easier prompt may not.
4. all truncated: every completion reached grpo.max_new_tokens. The scores judge cut-off text,
   so a wrong answer may only be an unfinished one: raise max_new_tokens before calling the
   prompt too hard. (A completion whose eos fell on the last allowed token counts as cut: the
   step's token counts do not tell the two apart.)
5. none solved: the outcome at the bottom for every completion (without an outcome metric: the
   total at its bottom, or every weighted binary metric at 0 whatever the partial credit or the
   length penalty): the prompt is too hard.
6. shaping only: the totals vary beyond float rounding but the outcome (reward.outcome_metric,
   else every weighted binary metric) does not: the spread is shaping terms (a length penalty),
   under the gate or masked by the outcome gate (a phantom group).
7. below threshold: the totals vary beyond rounding, the outcome with them (or no outcome can be
   told apart), by no more than grpo.min_group_std.
8. float noise: the totals differ, by float rounding only (step_stats.float_noise).
9. other uniform: the rest. The same middling total for every completion (partial credit), or a
   reward whose range is unknown (a custom metric), so solved / none solved cannot be judged.

Causes 1-5 say what was sampled and what the model can do; 6-9 read the reward's spread, and
only once the outcome is neither all right nor all wrong. A cause whose evidence a source did
not give (no errors, lengths or texts: an imported run) is never claimed; its groups fall
through to the causes the numbers show. Vectorised over groups, as step_stats.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.analysis import step_stats
from grpo_core.analysis.windows import column, last_steps
from grpo_core.runs.names import (
    CAUSE_BELOW_GATE,
    CAUSE_ERRORED,
    CAUSE_IDENTICAL,
    CAUSE_MIXED,
    CAUSE_NOISE,
    CAUSE_OTHER,
    CAUSE_SHAPING,
    CAUSE_SOLVED,
    CAUSE_TRUNCATED,
    CAUSE_UNRECORDED,
    CAUSE_UNSOLVED,
    FLAT_CAUSES,
)

# What each cause means, in a sentence (the inspector, the report, the chart's hover).
MEANING = {
    CAUSE_ERRORED: "the reward function failed on every completion",
    CAUSE_SOLVED: "every completion was right: the prompt is too easy",
    CAUSE_IDENTICAL: "every completion was the same text: one sample, G times",
    CAUSE_TRUNCATED: "every completion was cut at max_new_tokens",
    CAUSE_UNSOLVED: "no completion was right: the prompt is too hard",
    CAUSE_SHAPING: "the outcome was uniform; only shaping terms varied",
    CAUSE_BELOW_GATE: "the rewards varied, but their std was at or below min_group_std",
    CAUSE_NOISE: "the totals differed by float rounding only",
    CAUSE_OTHER: "every completion got the same middling total (or a reward whose range is unknown)",
    CAUSE_UNRECORDED: "flat, neither all solved nor none solved (a run from before flat causes: cause not recorded)",
}


@dataclass
class Sampled:
    """What the sampler knows of a step's P x G rollouts; None: not known (never claimed)."""
    errors: list | None = None  # [P*G] the scoring error per rollout, or None where it scored
    lengths: np.ndarray | None = None  # [P*G] completion tokens
    max_new_tokens: int | None = None
    texts: list | None = None  # [P*G] the completions (None entries: not kept)


def flat_causes(stats: step_stats.GroupStats, totals: np.ndarray, scores: np.ndarray | None,
                metric_names: list[str], kinds: dict[str, str], weights: dict[str, float],
                outcome_metric: str | None = None, sampled: Sampled | None = None,
                uniform_std: float = 1e-3) -> np.ndarray:
    """[P] each group's cause (names.FLAT_CAUSES' keys), "mixed" for a trainable one. totals
    [P, G] and scores [P, G, K] as step_stats.group_stats took them, stats its result."""
    totals = np.asarray(totals, np.float64)
    p, g = totals.shape
    s = sampled or Sampled()
    judged = step_stats.group_outcomes(stats.trainable, totals, scores, metric_names, kinds, weights, outcome_metric)
    top, bottom = (judged == CAUSE_SOLVED), (judged == CAUSE_UNSOLVED)
    if not outcome_metric and scores is not None:  # no outcome named: the binary checks judge too
        b_top, b_bottom = _binary_ends(np.asarray(scores, np.float64), metric_names, kinds, weights)
        top, bottom = top | b_top, (bottom | b_bottom) & ~(top | b_top)
    real = ~step_stats.float_noise(totals, stats.std)  # a spread beyond rounding
    cut = None if s.lengths is None or s.max_new_tokens is None else np.asarray(s.lengths) >= s.max_new_tokens
    holds = {
        CAUSE_ERRORED: _every(None if s.errors is None else [e is not None for e in s.errors], p, g),
        CAUSE_SOLVED: top,
        CAUSE_IDENTICAL: _identical(s.texts, p, g) & (np.isfinite(totals).sum(axis=1) >= 2),  # one is not a copy
        CAUSE_TRUNCATED: _every(cut, p, g),
        CAUSE_UNSOLVED: bottom,
        CAUSE_SHAPING: real & _outcome_uniform(stats, metric_names, kinds, weights, outcome_metric, uniform_std),
        CAUSE_BELOW_GATE: real,
        CAUSE_NOISE: np.asarray(stats.std) > 0,  # NaN (nothing scorable) is not noise: other
        CAUSE_OTHER: np.ones(p, bool),
    }
    out = np.full(p, CAUSE_MIXED, dtype=object)
    left = ~np.asarray(stats.trainable, bool)
    for cause in FLAT_CAUSES:  # the precedence: the first cause that holds names the group
        hit = left & holds[cause]
        out[hit] = cause
        left &= ~hit
    return out


def _every(flags, p: int, g: int) -> np.ndarray:
    """[P] every rollout of the group flagged; all False when the flags are unknown."""
    if flags is None:
        return np.zeros(p, bool)
    return np.asarray(flags, bool).reshape(p, g).all(axis=1)


def _identical(texts: list | None, p: int, g: int) -> np.ndarray:
    """[P] two or more completions, every one kept and the same text."""
    if texts is None or g < 2:
        return np.zeros(p, bool)
    arr = np.empty(p * g, dtype=object)
    arr[:] = texts
    arr = arr.reshape(p, g)
    kept = np.array([t is not None for t in texts], bool).reshape(p, g).all(axis=1)
    return kept & (arr == arr[:, :1]).all(axis=1)


def _binary_ends(scores: np.ndarray, metric_names, kinds, weights) -> tuple[np.ndarray, np.ndarray]:
    """([P] every weighted binary metric at 1 for every completion, [P] every one at 0); both
    all False without a weighted binary metric."""
    cols = [k for k, m in enumerate(metric_names) if kinds.get(m) == "binary" and weights.get(m, 0.0)]
    if not cols:
        return np.zeros(len(scores), bool), np.zeros(len(scores), bool)
    values = scores[:, :, cols].reshape(len(scores), -1)
    return step_stats.at_ends(values, 0.0, 1.0)


def _outcome_uniform(stats, metric_names, kinds, weights, outcome_metric, uniform_std) -> np.ndarray:
    """[P] the outcome did not vary: reward.outcome_metric, else every weighted binary metric
    (uniform as the outcome gate judges it); all False when there is no outcome to read."""
    p = len(stats.trainable)
    if stats.metric_std is None:
        return np.zeros(p, bool)
    cols = ([metric_names.index(outcome_metric)] if outcome_metric in metric_names else
            [k for k, m in enumerate(metric_names) if kinds.get(m) == "binary" and weights.get(m, 0.0)])
    if not cols:
        return np.zeros(p, bool)
    return (stats.metric_std[:, cols] <= max(uniform_std, step_stats.STD_EPS)).all(axis=1)


def cause_counts(causes: np.ndarray) -> dict[str, float]:
    """The step's count of each cause under its name (every cause, zeros too: they sum to the flat groups)."""
    causes = np.asarray(causes, dtype=object)
    return {name: float(np.sum(causes == cause)) for cause, name in FLAT_CAUSES.items()}


# ---- over a window: the dominant cause (the alert advice follows it) ----------------------------------
def window_counts(wide: pd.DataFrame | None, window: int) -> dict[str, float] | None:
    """cause -> flat groups over the last `window` steps of a scalars frame; None when the run
    logged no cause beyond all solved / none solved (a run from before the causes, an import)."""
    if wide is None:
        return None
    out = {}
    for cause, name in FLAT_CAUSES.items():
        s = column(wide, name)
        if s is not None and s.notna().any():
            out[cause] = float(last_steps(s.dropna(), window).sum())
    return out if set(out) - {CAUSE_SOLVED, CAUSE_UNSOLVED} else None


def history_counts(history: list[dict], keep: np.ndarray) -> dict[str, float] | None:
    """window_counts over the trainer's recent steps (dicts of one step's scalars; keep: the window's)."""
    out = {}
    for cause, name in FLAT_CAUSES.items():
        v = np.array([r.get(name, np.nan) for r in history], np.float64)[keep]
        if np.isfinite(v).any():
            out[cause] = float(np.nansum(v))
    return out if set(out) - {CAUSE_SOLVED, CAUSE_UNSOLVED} else None


def dominant(counts: dict[str, float] | None) -> str | None:
    """The cause with the most flat groups (None: none counted, or a tie at the top)."""
    if not counts:
        return None
    ranked = sorted(counts.values(), reverse=True)
    if ranked[0] <= 0 or (len(ranked) > 1 and ranked[0] == ranked[1]):
        return None
    return max(counts, key=counts.get)


def summary(wide: pd.DataFrame | None, window: int) -> pd.DataFrame | None:
    """One row per cause over a run (the report): its flat groups, its share of them, its groups
    in the last `window` steps and what it means; None when the run logged no causes."""
    last = window_counts(wide, window)
    if last is None:
        return None
    whole = window_counts(wide, int(wide.index.max() - wide.index.min()) + 1) or {}  # every step
    total = sum(whole.values())
    rows = [{"cause": c, "groups": whole.get(c, 0.0), "share": whole.get(c, 0.0) / total if total else float("nan"),
             "last_window": last.get(c, 0.0), "meaning": MEANING[c]} for c in FLAT_CAUSES if c in whole]
    return pd.DataFrame(rows).sort_values("groups", ascending=False, kind="stable").reset_index(drop=True)
