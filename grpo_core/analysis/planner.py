"""The binary planner: how likely a group of G binary rewards is to have both outcomes, and the smallest G that reaches a target."""
from __future__ import annotations

import numpy as np


def p_trainable_binary(p, G):
    """Probability that a group of G binary rewards with success rate p is not all equal:
    1 - p^G - (1-p)^G. Broadcasts over arrays."""
    pa, ga = np.asarray(p, dtype=np.float64), np.asarray(G)
    if np.any(~np.isfinite(pa)) or np.any((pa < 0) | (pa > 1)):
        raise ValueError(f"success rate p must be in [0, 1], got {p!r}")
    if np.any(ga < 1) or np.any(ga != np.round(ga)):
        raise ValueError(f"group size G must be an integer >= 1, got {G!r}")
    out = np.clip(1.0 - pa ** ga - (1.0 - pa) ** ga, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def min_group_size(p: float, target: float, g_max: int = 256) -> int | None:
    """Smallest G >= 2 whose binary trainable probability reaches target; None if no G <= g_max does."""
    if not 0 < target <= 1:
        raise ValueError(f"target probability must be in (0, 1], got {target!r}")
    g = np.arange(2, max(int(g_max), 2) + 1)
    ok = np.flatnonzero(p_trainable_binary(p, g) >= target)
    return int(g[ok[0]]) if len(ok) else None
