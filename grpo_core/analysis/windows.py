"""Windows of logged steps, and the trainable ratio from whatever a run logged, with the name of its source.

A window is counted in *trainer* steps, not logged entries: an imported run that logs every
logging_steps steps has 4 entries in a 20-step window at logging_steps 5.

The trainable ratio has one order of sources, used by every reader (alerts, the verdict,
the report; the first source the run logged wins):
  1. the logged group counts       (data/num_groups_trainable / data/num_groups_submitted):
                                    exact, and they pool over a window (5 of 28 groups is 5/28);
  2. the logged ratio              (data/trainable_ratio): exact per step, but a window can
                                    only average it;
  3. the logged cumulative counts  (ART's running totals): exact counts, recovered by
                                    differencing, so they pool like 1;
  4. 1 - frac_reward_zero_std      (TRL's share of zero-std groups): TRL's rule (std == 0, no
                                    min_group_std), so it comes last.
A step with no groups has no ratio (0 of 0 is not 0): it is left out, and a window whose
counts hold no group falls through to the next source.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd

from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    TRAINABLE_RATIO,
)

COUNTS, RATIO, CUMULATIVE, ZERO_STD = "counts", "ratio", "cumulative counts", "1 - frac_reward_zero_std"
# Each source, in the order they are tried, with how a sentence names it.
RATIO_SOURCES = {
    COUNTS: "the logged group counts",
    RATIO: f"the logged {TRAINABLE_RATIO}",
    CUMULATIVE: "the logged cumulative group counts",
    ZERO_STD: f"1 - {FRAC_REWARD_ZERO_STD} (TRL's share of zero-std groups)",
}
NO_RATIO = "nothing (no ratio was logged)"


def column(wide: pd.DataFrame, name: str) -> pd.Series | None:
    """A logged scalar as floats (index step), or None when it is absent or never has a value."""
    if name not in wide.columns:
        return None
    s = wide[name]
    if not pd.api.types.is_float_dtype(s.dtype):  # float columns (the store's, the trainer's) need no parsing
        s = pd.to_numeric(s, errors="coerce")
    return s if not np.isnan(s.to_numpy(np.float64, na_value=np.nan)).all() else None


@dataclass
class RatioSeries:
    """The per-step trainable ratio and where it came from."""
    ratio: pd.Series  # index step, no NaN (a step with no groups has no ratio)
    source: str | None  # a key of RATIO_SOURCES; None when the run logged none of them
    submitted: pd.Series | None = None  # the group counts behind the ratio (count sources only),
    trainable: pd.Series | None = None  # every logged step, zero-group ones included

    @property
    def text(self) -> str:
        """How a sentence names the source: 'the logged group counts', ..."""
        return RATIO_SOURCES.get(self.source, NO_RATIO)


def _from_counts(submitted: pd.Series, trainable: pd.Series, source: str) -> RatioSeries:
    """Two columns of one frame (one index): the steps where both are logged, the ratio where a
    group was submitted. In numpy: the health verdict asks for it several times per refresh."""
    s, t = submitted.to_numpy(np.float64), trainable.to_numpy(np.float64)
    both = ~(np.isnan(s) | np.isnan(t))
    index, s, t = submitted.index[both], s[both], t[both]
    some = s > 0
    return RatioSeries(pd.Series(t[some] / s[some], index[some]), source, pd.Series(s, index), pd.Series(t, index))


def ratio_sources(wide: pd.DataFrame) -> Iterator[RatioSeries]:
    """Each ratio source the run logged, in RATIO_SOURCES' order (lazily: the first is usually enough)."""
    sub, tr = column(wide, GROUPS_SUBMITTED), column(wide, GROUPS_TRAINABLE)
    if sub is not None and tr is not None:
        yield _from_counts(sub, tr, COUNTS)
    ratio = column(wide, TRAINABLE_RATIO)
    if ratio is not None:
        yield RatioSeries(ratio.dropna(), RATIO)
    csub, ctr = column(wide, CUM_GROUPS_SUBMITTED), column(wide, CUM_GROUPS_TRAINABLE)
    if csub is not None and ctr is not None:
        cum = pd.DataFrame({"s": csub, "t": ctr}).dropna()
        step = cum.diff()
        step.iloc[0] = cum.iloc[0]  # first row: the run so far (exact when the frame starts at step 0)
        yield _from_counts(step["s"], step["t"], CUMULATIVE)
    zero = column(wide, FRAC_REWARD_ZERO_STD)
    if zero is not None:
        yield RatioSeries((1.0 - zero).dropna(), ZERO_STD)


def ratio_series(wide: pd.DataFrame) -> RatioSeries:
    """The per-step trainable ratio from the first source (RATIO_SOURCES' order) that has one."""
    first = next((r for r in ratio_sources(wide) if len(r.ratio)), None)
    return first or RatioSeries(pd.Series(dtype=np.float64), None)


def in_window(steps, window: int) -> np.ndarray:
    """[n] bool: the entries inside the last `window` *trainer* steps (step > last - window).
    An imported run logs every logging_steps steps: 20 steps there are 4 entries at
    logging_steps 5, not 20 entries (100 steps); on a run logged every step it is tail(window)."""
    steps = np.asarray(steps, np.float64)
    if window <= 0 or not len(steps):
        return np.zeros(len(steps), bool)
    return steps > steps[-1] - window


def last_steps(s: pd.Series, window: int) -> pd.Series:
    """The entries of a step-indexed series inside its last `window` trainer steps."""
    s = s.dropna()
    return s[in_window(s.index.to_numpy(), window)]


def dense(steps) -> bool:
    """Whether these entries are consecutive steps (a run that logs every step)."""
    steps = np.asarray(steps, np.float64)
    return len(steps) < 2 or bool((np.diff(steps) == 1).all())


def trailing_run(mask: np.ndarray) -> int:
    """Length of the run of True at the end of mask (no loop)."""
    false_at = np.flatnonzero(~mask)
    return int(len(mask) - (false_at[-1] + 1 if len(false_at) else 0))


def trailing_steps(mask: np.ndarray, steps) -> int:
    """The trailing run of True in `mask`, counted in trainer steps: an entry covers the
    steps since the previous entry (the first one: as many as the first gap). Logged every
    step, it is the number of entries."""
    n, steps = trailing_run(np.asarray(mask, bool)), np.asarray(steps, np.float64)
    if n == 0:
        return 0
    if n < len(steps):
        return int(steps[-1] - steps[-n - 1])
    first = steps[1] - steps[0] if len(steps) > 1 else 1.0
    return int(steps[-1] - steps[0] + max(first, 1.0))


def window_ratio(wide: pd.DataFrame, window: int) -> tuple[float | None, float | None, float | None, int]:
    """Trainable ratio over the last `window` trainer steps: (ratio, trainable, submitted,
    entries), entries = the logged entries in the window (= steps when the run logs every step),
    from the first source (RATIO_SOURCES' order) with a value in the window.

    From counts it is pooled (sum of trainable / sum of submitted), so 5 of 28 groups reads
    5/28 whatever the step sizes; from a logged ratio it is the mean, and the counts are None.
    Counts stay floats: an imported entry averaged over logging_steps carries fractional
    counts (2.5 of 4), and int() of their sum would lose groups."""
    for source in ratio_sources(wide):
        if source.submitted is not None:
            keep = in_window(source.submitted.index.to_numpy(), window)
            s, t = float(source.submitted[keep].sum()), float(source.trainable[keep].sum())
            if s > 0:
                return t / s, t, s, int(keep.sum())
            continue
        r = last_steps(source.ratio, window)
        if len(r):
            return float(r.mean()), None, None, len(r)
    return None, None, None, 0
