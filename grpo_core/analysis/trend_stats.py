"""The trend of a series over steps: its OLS slope and the slope's two-sided t-test (no scipy in the dashboard)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Trend:
    slope: float | None  # per step (per index unit of a Series)
    sign: int  # +1 / -1 / 0 (flat, not significant, or window too short)
    p_value: float | None
    n: int


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (no scipy in the dashboard's environment)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with df degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def reward_trend(values: np.ndarray | pd.Series, min_points: int = 5, alpha: float = 0.05) -> Trend:
    """OLS slope over the window; a sign only with >= min_points values and p < alpha.

    A Series is regressed on its (numeric) index, so the slope is per step; NaNs are dropped."""
    if isinstance(values, pd.Series):
        y = pd.to_numeric(values, errors="coerce").to_numpy(np.float64)
        try:
            x = np.asarray(values.index, dtype=np.float64)
        except (TypeError, ValueError):
            x = np.arange(len(y), dtype=np.float64)
    else:
        y = np.asarray(values, dtype=np.float64).ravel()
        x = np.arange(len(y), dtype=np.float64)
    keep = np.isfinite(y) & np.isfinite(x)
    x, y = x[keep], y[keep]
    n = len(y)
    if n < 2 or np.ptp(x) == 0:
        return Trend(None, 0, None, n)
    xc = x - x.mean()
    sxx = float(xc @ xc)
    slope = float(xc @ (y - y.mean())) / sxx
    if n < 3:
        return Trend(slope, 0, None, n)
    resid = y - y.mean() - slope * xc
    sse = float(resid @ resid)
    scale = max(abs(float(y.mean())), float(np.abs(y).max()), 1e-300)
    if sse <= (1e-12 * scale) ** 2 * n:  # an exact line (or a constant): no noise to test against
        p = 1.0 if abs(slope) * np.ptp(x) <= 1e-12 * scale else 0.0
    else:
        p = t_two_sided_p(slope / math.sqrt(sse / (n - 2) / sxx), n - 2)
    sign = int(np.sign(slope)) if n >= max(min_points, 3) and p < alpha else 0
    return Trend(slope, sign, p, n)

