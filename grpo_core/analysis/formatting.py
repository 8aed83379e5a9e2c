"""How a number, a setting or a difference is written in every report table and export (the browser test compares HTML cells with these)."""
from __future__ import annotations

import math

import numpy as np


def fmt(v, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        if not math.isfinite(v):
            return "—"
        return str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else f"{v:.{digits}f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={fmt(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt(x) for x in v) if v else "none"
    return str(v)


def fmt_diff(v, digits: int = 3) -> str:
    if v is None or not isinstance(v, (int, float, np.number)) or not math.isfinite(v):
        return "—"
    return f"{v:+.{digits}f}"


def cell(col: str, v) -> str:
    """How a table cell is written in every export."""
    if col.endswith("_diff") or col == "reward_diff_same_weights":
        return fmt_diff(v)
    if col in ("uniform_fraction", "contribution") and isinstance(v, float) and math.isfinite(v):
        return f"{v:.3f}"
    return fmt(v, 4 if col in ("mean_group_std",) else 3)

