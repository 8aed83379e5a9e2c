"""Downsampling a series for display while keeping its shape: min/max per bucket (M4), so no spike or dip is lost.

A chart that draws 20,000 steps into 600 pixels shows, per pixel column, the first, lowest,
highest and last value that falls in it; M4 (Jugel et al., VLDB 2014) keeps exactly those four
points per bucket of x, so the drawn line is the same picture with at most `max_points`
points, where a mean or every k-th point would flatten a one-step collapse of the trainable
ratio. It is also how the live page's binned history keeps its extremes: a chart frame
(dashboard.live_view.chart_frame) carries, besides each name's bin means, the bins' minimum
and maximum in the columns `envelope_names(name)`.
"""
from __future__ import annotations

import numpy as np

LOW, HIGH = "|min", "|max"  # suffixes of a chart frame's envelope columns ('|' is in no metric name)


def envelope_names(name: str) -> tuple[str, str]:
    """The chart-frame columns that hold the smallest and largest value of `name` per bin."""
    return name + LOW, name + HIGH


def m4(x, y, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with at most `max_points` points: x's range cut into max_points // 4 equal buckets,
    each keeping its first, minimum, maximum and last point, in x order. The first and last
    points and every bucket's extremes (the whole series' too) are kept. At most max_points
    points in: returned as they are (NaNs included, so a line breaks where it did); more:
    points with a NaN x or y are dropped first (they draw nothing). x is sorted if it is not."""
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    x, y = np.asarray(x), np.asarray(y, np.float64)  # x keeps its dtype: integer steps stay integers
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length: {len(x)} and {len(y)}")
    if len(x) <= max_points:
        return x, y
    finite = np.isfinite(x) & np.isfinite(y)
    x, y = x[finite], y[finite]
    if len(x) <= max_points:
        return x, y
    if np.any(x[1:] < x[:-1]):
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
    n_buckets = max_points // 4
    xf = x.astype(np.float64)
    span = xf[-1] - xf[0]
    bucket = np.zeros(len(x), np.int64) if span <= 0 else \
        np.minimum(((xf - xf[0]) / span * n_buckets).astype(np.int64), n_buckets - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    ends = np.r_[starts[1:], len(x)] - 1
    by_value = np.lexsort((y, bucket))  # within each bucket's run of positions: lowest first, highest last
    keep = np.unique(np.concatenate([starts, ends, by_value[starts], by_value[ends]]))
    return x[keep], y[keep]
