"""Every figure: the live monitor's charts, the analysis page's and the report's, and the pilot page's.

The live builders take a wide frame (index step, columns names.*: `RunStore.scalars_wide()`
or `live.chart_frame()`) and the applied changes (`RunStore.changes()`), and returns a
`plotly.graph_objects.Figure`, or None when the run logged nothing the chart needs (an
imported run has no group counts: the page says so instead of drawing an empty chart). The
live page draws these figures with uPlot (dashboard.live_chart reads them) from their plain
dicts (each live builder's `.plain`: no plotly Figure built); the other pages and the report
draw theirs with plotly.
Every applied weight/threshold/difficulty change is a dotted vertical line on every
chart, labelled at the top, so a change in a curve can be read against its cause.
A measured series is drawn as a faint raw line under a smoothed line (`smoothing`, W&B's
debiased EMA, `ema`): a per-step ratio over 8 groups jumps by 1/8 from step to step, and the
trend is what a reader acts on; the raw line stays so that no smoothing hides a step. Where a
chart frame's old history arrives binned, the faint line runs through each bin's minimum and
maximum (its envelope columns, downsample.envelope_names), so a spike inside a bin still shows.
Every line is cut to at most MAX_POINTS points by min/max per bucket (downsample.m4), which
keeps its shape: a frame of every step of a long run (live_view.raw_frame) draws as it is.
The analysis page's and the report's figures take a run's tables (run_tables.py) and its
change ledger; the pilot page's (at the end) a pilot.PilotSummary's tables and plans.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from grpo_core.analysis.downsample import envelope_names, m4
from grpo_core.runs import live_settings
from grpo_core.runs.names import (
    COLLAPSE_CHANCE,
    COLLAPSE_RETRIEVAL,
    CUM_TRAINABLE_RATIO,
    EVAL_PASS,
    EVAL_REWARD,
    FLAT_CAUSES,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SOLVED,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    GROUPS_UNSOLVED,
    NOISE_GROUPS,
    PHANTOM_GROUPS,
    REWARD,
    REWARD_STD,
    SAMPLER_LOGP_DIFF_MAX,
    SAMPLER_LOGP_DIFF_MEAN,
    TRAINABLE_RATIO,
    metric_group_std,
    metric_mean,
    metric_weight,
)

# One colour per metric, stable across charts and pages (plotly's qualitative palette).
PALETTE = ["#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880",
           "#FF97FF", "#FECB52"]
TOTAL_COLOUR = "#222222"
# Changes that alter what a step trains on, each with its marker's colour and label (the settings
# registry); pause/resume/stop/checkpoint, the step budget and the autopilot switch are not drawn.
_MARKED = [s for s in live_settings.SETTINGS if s.kind not in (live_settings.SET_STEPS, live_settings.SET_AUTOPILOT)]
MARKED = tuple(s.kind for s in _MARKED)
MARKER_COLOURS = {s.kind: s.colour for s in _MARKED}
MARKER_LABELS = {s.kind: s.marker for s in _MARKED}
HEIGHT = 300
# Points per line at most (min/max per bucket beyond): a live chart frame has ~2,000 rows, a frame
# of every step ("every step" on the live page) has the run's steps; a 20,000-step run draws whole.
MAX_POINTS = 20_000


def metric_colour(metrics: list[str], m: str) -> str:
    return PALETTE[metrics.index(m) % len(PALETTE)] if m in metrics else "#888888"


def _has(df: pd.DataFrame, *names: str) -> bool:
    return df is not None and all(n in df.columns and df[n].notna().any() for n in names)


def _line(df: pd.DataFrame, name: str, label: str, colour: str | None = None, dash: str | None = None,
          width: float = 1.6) -> dict:
    x, y = _points(df.index.to_numpy(), df[name].to_numpy(np.float64))
    return {"type": "scatter", "mode": "lines", "x": x, "y": y, "name": label,
            "line": {"color": colour, "dash": dash, "width": width}, "connectgaps": True}


def ema(values, smoothing: float) -> np.ndarray:
    """W&B's (and TensorBoard's) debiased exponential moving average: last = s * last + (1 - s) * y,
    shown as last / (1 - s^n) after n finite points, so the first points are not pulled toward 0.
    NaN points stay NaN and are skipped (the average carries over them); smoothing 0 is the raw
    series, 0.99 a very long memory."""
    y = np.asarray(values, np.float64)
    s = float(smoothing)
    if not 0.0 <= s < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    finite = np.isfinite(y)
    if s == 0.0 or not finite.any():
        return np.where(finite, y, np.nan)
    # pandas' adjusted EWM is the same average: sum of s^i x_(t-i) over sum of s^i, which is
    # last / (1 - s^n); ignore_na: the weights count finite points only. It runs in C: the page
    # redraws every series of a long run at every refresh, and a Python loop here would hold
    # the server up while sliders wait.
    smoothed = pd.Series(np.where(finite, y, np.nan)).ewm(alpha=1.0 - s, adjust=True, ignore_na=True).mean()
    return np.where(finite, smoothed.to_numpy(), np.nan)


def _series(df: pd.DataFrame, name: str, label: str, colour: str | None, smoothing: float,
            dash: str | None = None, width: float = 1.6) -> list[dict]:
    """A measured series: its raw values as a faint line (named '<label> (raw)', hidden from the
    legend, toggled with the line; through each bin's min and max where the frame is binned,
    `_extremes`) under the smoothed line (named `label`), both cut to MAX_POINTS by min/max
    per bucket. A line, not markers: one SVG path however many points, where each marker is an
    element the browser redraws at every refresh."""
    x, y = df.index.to_numpy(), df[name].to_numpy(np.float64)
    rx, ry = _points(*_extremes(df, name))
    raw = {"type": "scatter", "mode": "lines", "x": rx, "y": ry, "name": f"{label} (raw)", "legendgroup": label,
           "showlegend": False, "opacity": RAW_OPACITY, "line": {"color": colour, "width": 1},
           "connectgaps": True, "hoverinfo": "skip"}
    lx, ly = _points(x, ema(y, smoothing))
    line = {"type": "scatter", "mode": "lines", "x": lx, "y": ly, "name": label, "legendgroup": label,
            "line": {"color": colour, "dash": dash, "width": width}, "connectgaps": True}
    return [raw, line]


def _points(x, y) -> tuple[np.ndarray, np.ndarray]:
    """A line's points as sent to the browser: at most MAX_POINTS (min/max per bucket), as float32:
    plotly sends numpy arrays as base64 typed arrays, so 4 bytes a number instead of 8 halve every
    refresh's message, and 7 digits are more than a chart or its hover shows (steps stay exact
    up to 16 million)."""
    x, y = m4(x, y, MAX_POINTS)
    return x.astype(np.float32), y.astype(np.float32)


def _extremes(df: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The raw line's points in step order: a raw row's value; a binned row's (a chart frame's
    old history) minimum then maximum, both at the bin's mid step: at a pixel's width, what
    drawing every step would show."""
    x, y = df.index.to_numpy(), df[name].to_numpy(np.float64)
    low_name, high_name = envelope_names(name)
    if low_name not in df.columns or high_name not in df.columns:
        return x, y
    low, high = df[low_name].to_numpy(np.float64), df[high_name].to_numpy(np.float64)
    spread = np.isfinite(low) & np.isfinite(high) & (low != high)  # two points; else the value alone
    first = np.where(spread, low, y)
    keep = np.column_stack([np.ones(len(x), bool), spread]).ravel()
    return np.repeat(x, 2)[keep], np.column_stack([first, high]).ravel()[keep]


def _top(df: pd.DataFrame, names: list[str]) -> float:
    """The largest value of `names` drawn (bin maxima included), for a y range from 0."""
    cols = [c for n in names for c in (n, envelope_names(n)[1]) if c in df.columns]
    top = df[cols].max().max() if cols else float("nan")
    return max(1.0, float(top) * 1.1) if np.isfinite(top) else 1.0


def _complement(df: pd.DataFrame, name: str) -> pd.DataFrame:
    """1 - a series, as a frame with its envelope (a bin's minimum is 1 - its maximum)."""
    low, high = envelope_names(name)
    out = pd.DataFrame({"r": 1.0 - df[name]})
    if low in df.columns and high in df.columns:
        out[envelope_names("r")[0]], out[envelope_names("r")[1]] = 1.0 - df[high], 1.0 - df[low]
    return out


RAW_OPACITY = 0.3
DEFAULT_SMOOTHING = 0.6  # the live page's slider starts here (TensorBoard's default)


def _hline(y: float, colour: str, text: str = "", dash: str = "dash") -> tuple[dict, dict | None]:
    shape = {"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": y, "y1": y,
             "line": {"color": colour, "dash": dash, "width": 1}, "name": "threshold"}
    note = {"x": 1, "y": y, "xref": "paper", "yref": "y", "xanchor": "right", "yanchor": "top", "text": text,
            "showarrow": False, "font": {"size": 10, "color": colour}} if text else None
    return shape, note


def _figure_dict(traces: list[dict], title: str, y_title: str, y_range=None, key: str = "",
                 hlines: list[tuple[dict, dict | None]] = (), changes=None) -> dict:
    """plotly's plain figure dict (data, layout) of a chart: its traces, title, y axis, threshold
    lines and change markers."""
    shapes = [h[0] for h in hlines]
    notes = [h[1] for h in hlines if h[1]]
    ms, mn = marker_specs(changes)
    layout = {"title": {"text": title, "font": {"size": 14}}, "height": HEIGHT,
              "margin": {"l": 50, "r": 10, "t": 40, "b": 35}, "xaxis": {"title": {"text": "step"}},
              "yaxis": {"title": {"text": y_title}, **({"range": y_range} if y_range else {})},
              "legend": {"orientation": "h", "y": -0.25, "font": {"size": 10}},
              "hovermode": "x unified", "uirevision": key or title,
              "shapes": shapes + ms, "annotations": notes + mn}
    return {"data": traces, "layout": layout}


def _figure(*args, **kwargs) -> go.Figure:
    """_figure_dict's figure, assembled without plotly's per-property validation: the specs are
    fixed here (tests/test_charts.py builds them validated), and validation is most of its cost."""
    return go.Figure(_figure_dict(*args, **kwargs), _validate=VALIDATE)


def _plotly(builder):
    """A live chart's builder, which returns its plain figure dict (or None), as one that returns a
    plotly Figure (the analysis page, the report, the tests); the plain one stays `.plain`. The live
    page draws with uPlot, whose reader (dashboard.live_chart.spec) takes the dict as it is, and a
    Figure deep-copies every trace and marker it is given: most of the figures' time at each new step."""
    @functools.wraps(builder)
    def figure(*args, **kwargs) -> go.Figure | None:
        plain = builder(*args, **kwargs)
        return None if plain is None else go.Figure(plain, _validate=VALIDATE)
    figure.plain = builder
    return figure


VALIDATE = False  # tests switch it on to check every spec against plotly's schema
def marker_specs(changes: pd.DataFrame | None, kinds=MARKED) -> tuple[list[dict], list[dict]]:
    """(shapes, annotations): a dotted vertical line per applied change at its step,
    labelled at the top (hover the label for what changed)."""
    shapes, notes = [], []
    if changes is None or len(changes) == 0:
        return shapes, notes
    for row in changes.itertuples(index=False):
        step = getattr(row, "step")
        kind = getattr(row, "kind")
        if step is None or (isinstance(step, float) and math.isnan(step)) or (kinds and kind not in kinds):
            continue
        colour = MARKER_COLOURS.get(kind, "#555555")
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
                       "line": {"color": colour, "width": 1.2, "dash": "dot"}, "name": f"change:{kind}"})
        notes.append({"x": step, "y": 1.0, "xref": "x", "yref": "paper", "yanchor": "bottom",
                      "text": MARKER_LABELS.get(kind, kind), "showarrow": False,
                      "font": {"size": 9, "color": colour}, "name": f"change:{kind}",
                      "hovertext": f"step {int(step)}: {_hover(row, kind)}"})
    return shapes, notes


def _hover(row, kind: str) -> str:
    """What a marker's label says on hover: a ledger row's own text (old -> new), else the request's."""
    return getattr(row, "change", None) or live_settings.describe(kind, getattr(row, "request", None) or {})


def add_markers(fig: go.Figure, changes: pd.DataFrame | None, kinds=MARKED) -> go.Figure:
    """Add the change markers to any figure (e.g. one the analysis page built itself);
    kinds=None marks every applied request (pause, resume, stop, checkpoint too)."""
    shapes, notes = marker_specs(changes, kinds)
    if shapes:
        fig.update_layout(shapes=list(fig.layout.shapes or []) + shapes,
                          annotations=list(fig.layout.annotations or []) + notes)
    return fig


# ---- the charts ----------------------------------------------------------------------------------
@_plotly
def ratio_chart(df, changes=None, min_ratio: float = 0.3, smoothing: float = 0.0) -> dict | None:
    """Trainable ratio per step (smoothed over its raw points) and cumulative (a running total:
    drawn as is), with the healthy line."""
    traces = []
    if _has(df, TRAINABLE_RATIO):
        traces += _series(df, TRAINABLE_RATIO, "per step", PALETTE[0], smoothing)
    elif _has(df, FRAC_REWARD_ZERO_STD):  # TRL logs only the complement
        traces += _series(_complement(df, FRAC_REWARD_ZERO_STD), "r", "per step (1 − frac_reward_zero_std)",
                          PALETTE[0], smoothing)
    if _has(df, CUM_TRAINABLE_RATIO):
        traces.append(_line(df, CUM_TRAINABLE_RATIO, "cumulative", TOTAL_COLOUR, width=2.2))
    if not traces:
        return None
    return _figure_dict(traces, "Trainable ratio", "trainable / submitted groups", [0, 1.05], "ratio",
                        [_hline(min_ratio, "#C0392B", f"healthy > {min_ratio:g}")], changes)


@_plotly
def groups_chart(df, changes=None, smoothing: float = 0.0) -> dict | None:
    """Groups submitted vs trainable per step: the compute spent (a setting: drawn as is) vs the
    compute that taught (smoothed, filled)."""
    if not _has(df, GROUPS_SUBMITTED, GROUPS_TRAINABLE):
        return None
    raw, line = _series(df, GROUPS_TRAINABLE, "trainable", PALETTE[2], smoothing)
    traces = [raw, {**line, "fill": "tozeroy"}, _line(df, GROUPS_SUBMITTED, "submitted", "#555555", dash="dash")]
    for name, label, colour in ((GROUPS_SOLVED, "all solved", PALETTE[0]), (GROUPS_UNSOLVED, "none solved", PALETTE[1])):
        if _has(df, name):  # why the others taught nothing (step_stats.group_outcomes)
            traces += _series(df, name, label, colour, smoothing, dash="dot")
    top = _top(df, [GROUPS_SUBMITTED, GROUPS_TRAINABLE])
    return _figure_dict(traces, "Groups submitted vs trainable", "groups per step", [0, top], key="groups",
                        changes=changes)


# One colour per flat-group cause (names.FLAT_CAUSES' keys), stable across the live page and the report.
CAUSE_COLOURS = dict(zip(FLAT_CAUSES, ["#A50F15", PALETTE[0], PALETTE[3], PALETTE[4], PALETTE[1], PALETTE[5],
                                       PALETTE[7], "#BBBBBB", "#777777"]))


@_plotly
def flat_causes_chart(df, changes=None, smoothing: float = 0.0) -> dict | None:
    """Why the flat groups were flat, per step: one stacked band per cause (analysis.flat_causes), so
    the stack's top is the step's flat groups (submitted - trainable). A run that logged only all
    solved / none solved (or no causes) gets None: the groups chart draws those two."""
    have = [(c, n) for c, n in FLAT_CAUSES.items() if _has(df, n)]
    if not any(n not in (GROUPS_SOLVED, GROUPS_UNSOLVED) for _, n in have):
        return None
    traces = [{"type": "scatter", "mode": "lines", "x": df.index.to_numpy(), "name": c, "stackgroup": "flat",
               "y": ema(df[n].fillna(0.0).to_numpy(np.float64), smoothing),
               "line": {"color": CAUSE_COLOURS[c], "width": 0.8}}
              for c, n in have if df[n].fillna(0.0).any()]  # a cause no step had: no band (the legend stays short)
    top = max(1.0, float(df[[n for _, n in have]].sum(axis=1).max()) * 1.1)
    return _figure_dict(traces, "Why groups were flat", "flat groups per step", [0, top], key="flat", changes=changes)


@_plotly
def metric_std_chart(df, metrics: list[str], changes=None, uniform_std: float = 1e-3,
                     smoothing: float = 0.0) -> dict | None:
    """Per-metric within-group std: a line near 0 is a uniform metric (a variance bottleneck)."""
    have = [m for m in metrics if _has(df, metric_group_std(m))]
    if not have:
        return None
    traces = [t for m in have for t in _series(df, metric_group_std(m), m, metric_colour(metrics, m), smoothing)]
    return _figure_dict(traces, "Within-group std per metric", "mean within-group std", key="metric_std",
                        hlines=[_hline(uniform_std, "#999999", "uniform", "dot")], changes=changes)


@_plotly
def reward_chart(df, metrics: list[str], changes=None, smoothing: float = 0.0) -> dict | None:
    """Total reward (weighted) and each metric's raw mean."""
    traces = _series(df, REWARD, "total (weighted)", TOTAL_COLOUR, smoothing, width=2.4) if _has(df, REWARD) else []
    traces += [t for m in metrics if _has(df, metric_mean(m))
               for t in _series(df, metric_mean(m), m, metric_colour(metrics, m), smoothing, dash="dot")]
    if not traces:
        return None
    return _figure_dict(traces, "Reward: total and per-metric means", "reward", key="reward", changes=changes)


@_plotly
def reward_std_chart(df, changes=None, min_reward_std: float = 0.1, smoothing: float = 0.0) -> dict | None:
    """Mean within-group std of the total reward: the signal GRPO's advantages are made of."""
    if not _has(df, REWARD_STD):
        return None
    return _figure_dict(_series(df, REWARD_STD, "mean group reward std", PALETTE[3], smoothing), "Group reward std",
                        "std of total reward", key="reward_std",
                        hlines=[_hline(min_reward_std, "#C0392B", f"healthy > {min_reward_std:g}")], changes=changes)


@_plotly
def phantom_chart(df, changes=None, outcome_metric: str | None = None, smoothing: float = 0.0) -> dict | None:
    """Groups that pass the std gate only through shaping terms (outcome metric uniform), and
    those that pass it on float rounding alone (a TRL run's near-ties: TRL trains them).
    Without an outcome gate (reward.outcome_metric) there are no phantoms, and the title says so."""
    if not _has(df, PHANTOM_GROUPS):
        return None
    have = [n for n in (PHANTOM_GROUPS, NOISE_GROUPS) if _has(df, n)]
    top = _top(df, have)
    title = (f"Phantom groups (pass the std gate, {outcome_metric} uniform)" if outcome_metric else
             "Phantom groups (no outcome gate set: reward.outcome_metric)")
    traces = _series(df, PHANTOM_GROUPS, "phantom groups", PALETTE[4], smoothing)
    if _has(df, NOISE_GROUPS):
        traces += _series(df, NOISE_GROUPS, "float-noise groups (spread is rounding)", PALETTE[5], smoothing)
    return _figure_dict(traces, title, "groups per step", [0, top], key="phantom", changes=changes)


def weights_chart(df, metrics: list[str], changes=None) -> go.Figure | None:
    """Each metric's weight in force per step: the ledger of changes as a picture."""
    have = [m for m in metrics if _has(df, metric_weight(m))]
    if not have:
        return None
    traces = [{**_line(df, metric_weight(m), m, metric_colour(metrics, m)), "line_shape": "hv"} for m in have]
    return _figure(traces, "Reward weights in force", "weight", key="weights", changes=changes)


@_plotly
def eval_chart(df, changes=None) -> dict | None:
    """Held-out evaluation: reward and pass@1 on prompts the policy never trains on (a point
    per evaluation, eval.every steps apart)."""
    have = [(n, label, colour, dash) for n, label, colour, dash in
            ((EVAL_REWARD, "held-out reward", TOTAL_COLOUR, None), (EVAL_PASS, "held-out pass@1", PALETTE[2], "dash"))
            if _has(df, n)]
    if not have:
        return None
    traces = []
    for n, label, colour, dash in have:
        s = df[n].dropna()  # the evaluated steps only: a line through them
        traces.append({"type": "scatter", "mode": "lines+markers", "x": s.index.to_numpy(), "y": s.to_numpy(),
                       "name": label, "line": {"color": colour, "dash": dash, "width": 1.8}, "marker": {"size": 6}})
    return _figure_dict(traces, "Held-out evaluation", "reward / pass@1", key="eval", changes=changes)


@_plotly
def collapse_chart(df, changes=None) -> dict | None:
    """The template-collapse check (health.collapse_every): the share of sampled completions their own
    prompt scores best, a point per check, over the chance line 1/N (completions that ignore their
    prompt). Falling to the chance line is collapse the trainable ratio does not show."""
    if not _has(df, COLLAPSE_RETRIEVAL):
        return None
    checked = df[[n for n in (COLLAPSE_RETRIEVAL, COLLAPSE_CHANCE) if n in df.columns]].dropna(subset=[COLLAPSE_RETRIEVAL])
    x = checked.index.to_numpy()
    traces = [{"type": "scatter", "mode": "lines+markers", "x": x, "y": checked[COLLAPSE_RETRIEVAL].to_numpy(),
               "name": "retrieval accuracy", "line": {"color": PALETTE[0], "width": 1.8}, "marker": {"size": 6}}]
    if COLLAPSE_CHANCE in checked.columns:  # a line, not a constant: N is the step's distinct prompts (up to the knob)
        traces.append({"type": "scatter", "mode": "lines", "x": x, "y": checked[COLLAPSE_CHANCE].to_numpy(),
                       "name": "chance (1/N): completions ignore their prompt",
                       "line": {"color": "#C0392B", "dash": "dash", "width": 1.2, "shape": "hv"}})
    return _figure_dict(traces, "Template collapse: does a completion find its prompt?", "retrieval accuracy",
                        [0, 1.05], key="collapse", changes=changes)


@_plotly
def sampler_chart(df, changes=None, max_diff: float = 0.1, smoothing: float = 0.0) -> dict | None:
    """grpo.engine=vllm: how far the sampling engine's token log-probs are from the trainer's
    (mean and max |difference|): ~0 while the engine holds the trainer's weights."""
    if not _has(df, SAMPLER_LOGP_DIFF_MEAN):
        return None
    traces = _series(df, SAMPLER_LOGP_DIFF_MEAN, "mean |log-prob difference|", PALETTE[0], smoothing)
    if _has(df, SAMPLER_LOGP_DIFF_MAX):
        traces += _series(df, SAMPLER_LOGP_DIFF_MAX, "max |log-prob difference|", PALETTE[4], smoothing)
    return _figure_dict(traces, "Sampler vs trainer", "|trainer - sampler| log-prob per token", key="sampler",
                        hlines=[_hline(max_diff, "#C0392B", f"alert > {max_diff:g}")], changes=changes)


def live_charts(df: pd.DataFrame, metrics: list[str], changes=None, health_cfg=None,
                outcome_metric: str | None = None, smoothing: float = 0.0,
                plain: bool = False) -> list[tuple[str, go.Figure | dict | None]]:
    """The live page's charts in display order: (key, figure or None when there is no data);
    smoothing: the EMA of every measured series (the page's slider); plain: plotly's figure
    dicts, not Figures (the live page: dashboard.live_chart reads them as they are)."""
    min_ratio = getattr(health_cfg, "min_trainable_ratio", 0.3)
    min_std = getattr(health_cfg, "min_reward_std", 0.1)
    uni = getattr(health_cfg, "uniform_std", 1e-3)
    sm = smoothing
    built = {"ratio": (ratio_chart, (df, changes, min_ratio, sm)),
             "groups": (groups_chart, (df, changes, sm)),
             "flat": (flat_causes_chart, (df, changes, sm)),
             "metric_std": (metric_std_chart, (df, metrics, changes, uni, sm)),
             "reward": (reward_chart, (df, metrics, changes, sm)),
             "reward_std": (reward_std_chart, (df, changes, min_std, sm)),
             "phantom": (phantom_chart, (df, changes, outcome_metric, sm)),
             "eval": (eval_chart, (df, changes)),
             "collapse": (collapse_chart, (df, changes)),
             "sampler": (sampler_chart, (df, changes, getattr(health_cfg, "max_sampler_logp_diff", 0.1), sm))}
    return [(key, (chart.plain if plain else chart)(*args)) for key, (chart, args) in built.items()]

CHART_HELP = {
    "ratio": "Share of groups whose rewards differ enough to give a gradient (per step and cumulative).",
    "groups": "Groups sampled per step (compute spent) vs groups that carried a learning signal, and why the "
              "others did not: every completion right (all solved) or none (none solved).",
    "flat": "Why each flat group taught nothing, one cause per group (the first that holds: all errored, all "
            "solved, identical completions, all truncated at max_new_tokens, none solved, shaping terms only, below "
            "the threshold, float noise, other uniform), stacked: the top is the step's flat groups.",
    "metric_std": "Per metric, the mean std of its raw score inside a group; ~0 = uniform = bottleneck.",
    "reward": "Weighted total reward and each metric's raw mean.",
    "reward_std": "Mean within-group std of the total reward; GRPO's advantages are made of it.",
    "eval": "Reward and pass@1 on held-out prompts the policy never trains on (eval.every > 0).",
    "collapse": "Template collapse (health.collapse_every > 0): each of N sampled completions scored under every "
                "prompt of the sample; the share whose own prompt scores it best. Near 1: completions depend on "
                "their prompt; at the dashed chance line (1/N): they no longer do, whatever the trainable ratio says.",
    "sampler": "grpo.engine=vllm: the mean and max |trainer - sampler| log-prob of the sampled tokens; near 0 "
               "while the engine holds the trainer's weights, high when a weight sync failed or went stale.",
    "phantom": "Groups trainable only through shaping terms while the outcome metric is uniform, and groups "
               "counted trainable whose reward spread is float rounding (TRL trains those).",
}


# ---- a run's tables: the analysis page and the report ------------------------------------------
# These take run_tables' frames (index step) and a change ledger (ledger.change_ledger), whose
# setting changes are marked as on the live charts.
def trainability_chart(steps: pd.DataFrame, ledger: pd.DataFrame | None = None) -> go.Figure:
    """The trainable ratio per step (bars), pooled over the trailing window, and cumulative."""
    bars = {"type": "bar", "x": steps.index.to_numpy(), "y": steps["ratio"].to_numpy(),
            "name": "trainable ratio (step)", "marker": {"color": "#9ecae1"}}
    traces = [bars, _line(steps, "ratio_rolling", "rolling ratio", "#08519c"),
              _line(steps, "cum_ratio", "cumulative ratio", "#636363", dash="dot")]
    return _figure(traces, "Trainable ratio over time", "trainable groups / groups", [0, 1.05], "an_ratio",
                   changes=ledger)


def reward_trend_chart(steps: pd.DataFrame, trend: dict | None = None,
                       ledger: pd.DataFrame | None = None) -> go.Figure:
    """The reward and the mean group reward std per step, with the whole run's OLS fit
    (run_tables.reward_trend's "run" Trend)."""
    traces = [_line(steps, "reward", "reward", "#31a354"), _line(steps, "reward_std", "mean group reward std", "#fd8d3c")]
    fit = (trend or {}).get("run")
    reward = steps["reward"].dropna()
    if fit is not None and fit.slope is not None and len(reward) >= 2:
        x = reward.index.to_numpy(np.float64)
        y0 = float(reward.mean()) - fit.slope * float(x.mean())
        traces.append({"type": "scatter", "mode": "lines", "x": [x[0], x[-1]],
                       "y": [y0 + fit.slope * x[0], y0 + fit.slope * x[-1]], "name": "OLS fit",
                       "line": {"color": "#006d2c", "dash": "dash"}})
    return _figure(traces, "Reward and within-group reward std", "reward", key="an_reward", changes=ledger)


def bottlenecks_chart(bottlenecks: pd.DataFrame) -> go.Figure:
    """Per metric: the share of groups in which it was uniform (red: a bottleneck) and its share
    of the within-group variance (run_tables.bottlenecks)."""
    metrics = bottlenecks["metric"].to_numpy()
    traces = [{"type": "bar", "x": metrics, "y": bottlenecks["uniform_fraction"].to_numpy(),
               "name": "share of groups where uniform",
               "marker": {"color": ["#de2d26" if b else "#bdbdbd" for b in bottlenecks["bottleneck"]]}},
              {"type": "bar", "x": metrics, "y": bottlenecks["contribution"].to_numpy(),
               "name": "share of within-group variance", "marker": {"color": "#3182bd"}}]
    fig = _figure(traces, "Per-metric variance (red: bottleneck)", "share", [0, 1.05], "an_bottlenecks")
    fig.layout.barmode = "group"
    fig.layout.xaxis.title.text = "metric"
    return fig


def compare_ratio_chart(ratios: dict[str, pd.Series], window: int) -> go.Figure:
    """Runs side by side: each run's trainable ratio pooled over `window` steps (run id -> series)."""
    traces = [{"type": "scatter", "mode": "lines", "x": s.index.to_numpy(), "y": s.to_numpy(), "name": run,
               "line": {"color": PALETTE[i % len(PALETTE)]}} for i, (run, s) in enumerate(ratios.items())]
    return _figure(traces, f"Trainable ratio (rolling {window} steps)", "trainable groups / groups", [0, 1.05],
                   "an_compare")


def compare_eval_chart(evaluations: dict[str, pd.DataFrame]) -> go.Figure | None:
    """Each run's held-out reward (solid) and pass@1 (dashed), run id -> run_tables.eval_table;
    None when no run evaluated."""
    traces = []
    for i, (run, table) in enumerate(evaluations.items()):
        for col, dash in (("reward", None), ("pass@1", "dash")):
            if col in table.columns:
                s = table[col].dropna()
                traces.append({"type": "scatter", "mode": "lines+markers", "x": s.index.to_numpy(), "y": s.to_numpy(),
                               "name": f"{run} {col}", "line": {"color": PALETTE[i % len(PALETTE)], "dash": dash}})
    return _figure(traces, "Held-out evaluation", "reward / pass@1", key="an_compare_eval") if traces else None


def prompt_rates_chart(prompts: pd.DataFrame) -> go.Figure:
    """How many prompts train how often: the distribution of per-prompt trainable rates
    (prompt_history.prompt_table)."""
    trace = {"type": "histogram", "x": prompts["trainable_rate"].to_numpy(),
             "xbins": {"start": 0, "end": 1.0001, "size": 0.1}, "marker": {"color": "#3182bd"}, "name": "prompts"}
    fig = _figure([trace], "Prompts by how often their group was trainable", "prompts", key="an_prompts")
    fig.layout.xaxis.title.text = "trainable rate"
    return fig


# ---- the pilot page --------------------------------------------------------------------------------
UNIFORM_COLOURS = {True: "#d62728", False: "#1f77b4"}  # a metric uniform inside groups: red


def pilot_histograms(values: pd.DataFrame, metrics: list[str]) -> go.Figure:
    """The pilot's score distribution, one histogram per metric (values: pilot.PilotSummary.values)."""
    import plotly.express as px  # here: the live page never needs it
    long = values[metrics].melt(var_name="metric", value_name="score")
    fig = px.histogram(long, x="score", facet_col="metric", facet_col_wrap=min(len(metrics), 5), nbins=20)
    fig.update_yaxes(matches=None, title=None)
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=")[-1]))
    fig.update_layout(height=260, margin=dict(t=30, b=10, l=10, r=10), bargap=0.05)
    return fig


def pilot_metric_std(table: pd.DataFrame) -> go.Figure:
    """Within-group std per metric, the uniform ones in red (table: PilotSummary.metric_table)."""
    import plotly.express as px
    fig = px.bar(table.reset_index(), x="metric", y="within_group_std", color="uniform",
                 color_discrete_map=UNIFORM_COLOURS)
    fig.update_layout(height=260, margin=dict(t=10, b=10, l=10, r=10))
    return fig


def pilot_planner(plan, target: float) -> go.Figure:
    """P(group trainable) against the group size for one binary metric (a pilot.Plan), the
    target line, the pilot's measured share and the G the target needs."""
    c = plan.curve
    fig = go.Figure(go.Scatter(x=c["G"], y=c["p_trainable"], mode="lines", name=f"pooled p = {plan.p:.2f}"))
    if "p_trainable_prompts" in c and c["p_trainable_prompts"].notna().any():  # each prompt at its own rate
        fig.add_trace(go.Scatter(x=c["G"], y=c["p_trainable_prompts"], mode="lines", name="per prompt"))
    fig.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:.2f}")
    fig.add_trace(go.Scatter(x=[plan.current_g], y=[plan.measured_vary], mode="markers",
                             name=f"pilot: varied in {plan.measured_vary:.0%} of groups"))
    if plan.g_needed and plan.g_needed <= c["G"].max():
        fig.add_vline(x=plan.g_needed, line_dash="dot", annotation_text=f"G = {plan.g_needed}")
    fig.update_layout(height=300, margin=dict(t=30, b=10, l=10, r=10), xaxis_title="group size G",
                      yaxis_title="P(group trainable)", yaxis_range=[0, 1.02])
    return fig
