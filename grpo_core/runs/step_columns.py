"""One step's groups and rollouts as columns: StepGroups and StepRollouts.

The shape a trainer has them in, and the shape log_step writes without a frame or a dict per rollout."""
from __future__ import annotations

import numpy as np
import pandas as pd

GROUP_COLUMNS = ("group", "prompt_id", "size", "reward_mean", "reward_std", "trainable", "phantom")


def group_columns(g: pd.DataFrame) -> list[list]:
    """The groups' columns as Python lists, in the table's order. Series.tolist() gives native
    ints, floats and bools; a column held as objects (numpy scalars, say) or the prompt ids
    are converted value by value."""
    cols = []
    for name, kind in zip(GROUP_COLUMNS, (int, str, int, float, float, int, int)):
        col = g[name]
        cols.append([kind(v) for v in col] if kind is str or col.dtype == object
                    else col.tolist())
    return cols


class StepGroups:
    """One step's groups as columns (the groups table's, in order), the shape a trainer has
    them in: log_step writes them without a pandas frame, whose construction and conversion
    cost more than the insert itself (docs/benchmarks.md). frame() gives the frame (the W&B
    mirror's table); g["trainable"] a column (a numpy array; prompt_id a list of str)."""

    __slots__ = GROUP_COLUMNS + ("prompt_text", "outcome")

    def __init__(self, group, prompt_id, size, reward_mean, reward_std, trainable, phantom, prompt_text=None,
                 outcome=None):
        self.group = np.asarray(group, np.int64)
        n = len(self.group)
        self.prompt_id = [str(p) for p in prompt_id]
        self.size = np.broadcast_to(np.asarray(size, np.int64), (n,))
        self.reward_mean, self.reward_std = np.asarray(reward_mean, np.float64), np.asarray(reward_std, np.float64)
        self.trainable, self.phantom = np.asarray(trainable, bool), np.asarray(phantom, bool)
        # Each prompt's text as the model read it (the store's prompts table keeps it once per prompt id).
        self.prompt_text = None if prompt_text is None else [str(p) for p in prompt_text]
        if self.prompt_text is not None and len(self.prompt_text) != n:
            raise ValueError(f"StepGroups: {len(self.prompt_text)} prompt texts for {n} groups")
        self.outcome = None if outcome is None else [str(o) for o in outcome]  # flat_causes' cause, or mixed
        lengths = {c: len(self[c]) for c in GROUP_COLUMNS}
        if set(lengths.values()) != {n}:
            raise ValueError(f"StepGroups: columns of different lengths {lengths}")

    def __len__(self) -> int:
        return len(self.group)

    def __getitem__(self, name: str):
        if name not in GROUP_COLUMNS:
            raise KeyError(name)
        return getattr(self, name)

    def rows(self, step: int) -> list[tuple]:
        return list(zip([step] * len(self), self.group.tolist(), self.prompt_id, self.size.tolist(),
                        self.reward_mean.tolist(), self.reward_std.tolist(), self.trainable.tolist(),
                        self.phantom.tolist()))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({c: self[c] for c in GROUP_COLUMNS})


class StepRollouts:
    """One step's rollouts as columns, the shape a trainer has them in: log_step writes these
    without building a dict per rollout. Iterating gives the
    tuples (group, idx, total, scores dict, completion, error) that log_step also takes, so a
    consumer of tuples (the W&B mirror) needs no change.

    group, idx: int [n]; total: float [n]; scores: float [n, K] (column k is metric names[k]);
    texts, errors: n strings or None each (None text: not kept)."""

    __slots__ = ("names", "group", "idx", "total", "scores", "texts", "errors")

    def __init__(self, names, group, idx, total, scores, texts, errors):
        self.names = list(names)
        self.group, self.idx = np.asarray(group, np.int64), np.asarray(idx, np.int64)
        self.total = np.asarray(total, np.float64)
        self.scores = np.asarray(scores, np.float64).reshape(len(self.group), len(self.names))
        self.texts, self.errors = list(texts), list(errors)
        n = len(self.group)
        if not (len(self.idx) == len(self.total) == len(self.texts) == len(self.errors) == n):
            raise ValueError(f"StepRollouts: columns of different lengths (group {n}, idx {len(self.idx)}, "
                             f"total {len(self.total)}, texts {len(self.texts)}, errors {len(self.errors)})")

    def __len__(self) -> int:
        return len(self.group)

    def __iter__(self):
        names = self.names
        for g, i, t, row, text, err in zip(self.group.tolist(), self.idx.tolist(), self.total.tolist(),
                                          self.scores.tolist(), self.texts, self.errors):
            yield g, i, t, dict(zip(names, row)), text, err

    def rows(self, step: int) -> list[tuple]:
        """The rollouts table's rows (step, group, idx, text); the numbers go to step_scores."""
        return list(zip([step] * len(self), self.group.tolist(), self.idx.tolist(), self.texts))

