"""The live page's header: health cards, progress and ETA, status badges, what a run can show.

Also the wasted-compute line, and the request kinds the process behind a run accepts
(imported runs carry scalars only and accept none)."""
from __future__ import annotations

from dataclasses import dataclass

from grpo_core.analysis import health, windows
from grpo_core.dashboard.live_view import LiveState, current_settings, health_config, last_value
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    CUM_SAMPLED_TOKENS,
    CUM_TRAINABLE_RATIO,
    CUM_WASTED_TOKENS,
    REWARD,
    TIME_STEP,
)
from grpo_core.runs.requests import accepted_kinds, unsupported_note


@dataclass
class Cards:
    status: str
    step: int | None
    steps: int | None
    progress: float  # 0..1
    eta_s: float | None
    ratio: float | None  # last step
    ratio_source: str  # where the ratio came from (analysis.windows.ratio_series), in words
    cum_ratio: float | None
    reward: float | None
    reward_std: float | None  # mean over the health window
    trend: int  # +1 / 0 / -1
    trend_text: str
    submitted: int | None  # cumulative groups
    trainable: int | None
    verdict: str  # healthy | warning | critical | unknown
    colour: str
    checks: list
    alerts: list


VERDICT_COLOURS = {"healthy": "green", "warning": "orange", "critical": "red", "unknown": "gray"}


def wasted_text(state: LiveState) -> str | None:
    """"62% of this run's sampling taught nothing (...)": the sampled tokens spent on groups
    with no learning signal (step_stats.wasted_compute); None when the run does not log it."""
    total, wasted = last_value(state, CUM_SAMPLED_TOKENS), last_value(state, CUM_WASTED_TOKENS)
    if not total or wasted is None:
        return None
    return (f"{wasted / total:.0%} of this run's sampling taught nothing ({wasted:,.0f} of {total:,.0f} completion "
            "tokens went to groups whose rewards did not differ)")


# A run status's colour (display_status, plus list_runs' "unreadable"), on the Live and Runs pages.
STATUS_COLOURS = {"running": "green", "paused": "orange", "created": "blue", "finished": "gray", "stopped": "gray",
                  "failed": "red", "stale": "red", "unreadable": "red"}


def status_badge(status: str, text: str | None = None) -> str:
    """Streamlit markdown for a status in its colour: ':green[running]' (text: what to show
    instead of the status itself, e.g. store.status_label's 'stopped (autopilot)')."""
    return f":{STATUS_COLOURS.get(status, 'gray')}[{status if text is None else text}]"


TREND_ARROWS = {1: "↑", 0: "→", -1: "↓"}


def progress(state: LiveState) -> tuple[int | None, float, float | None]:
    """(steps done, fraction, ETA seconds) from the last step and the recent step time."""
    total = state.steps_total
    if state.last_step < 0:
        return None, 0.0, None
    done = state.last_step  # the trainer numbers steps from 1: the last step is the count done
    if not total:
        return done, 0.0, None
    frac = min(1.0, done / total)
    eta = None
    if state.is_live and TIME_STEP in state.recent.columns:
        dt = state.recent[TIME_STEP].dropna().tail(20)
        if len(dt):
            eta = max(0.0, (total - done) * float(dt.mean()))
    return done, frac, eta


def cards(state: LiveState) -> Cards:
    cfg = health_config(state.meta)
    window = state.recent.tail(max(cfg.trend_window, cfg.near_zero_steps, cfg.zero_trainable_steps) + 5)
    v = health.verdict(window.dropna(axis=1, how="all"), cfg, current_settings(state)["outcome_metric"] or None)
    done, frac, eta = progress(state)
    rstd = next((c.value for c in v.checks if c.name == "reward_std"), None)
    trend_check = next((c for c in v.checks if c.name == "reward_trend"), None)
    sub, tr = last_value(state, CUM_GROUPS_SUBMITTED), last_value(state, CUM_GROUPS_TRAINABLE)
    source = windows.ratio_series(state.recent)  # the same source order as the alerts and the report
    ratio = float(source.ratio.iloc[-1]) if len(source.ratio) else None
    return Cards(status=state.status, step=done, steps=state.steps_total, progress=frac, eta_s=eta,
                 ratio=ratio, ratio_source=source.text, cum_ratio=last_value(state, CUM_TRAINABLE_RATIO),
                 reward=last_value(state, REWARD), reward_std=rstd, trend=v.trend.sign,
                 trend_text=trend_check.text if trend_check else "",
                 submitted=None if sub is None else int(sub), trainable=None if tr is None else int(tr),
                 verdict=v.status, colour=VERDICT_COLOURS.get(v.status, "gray"), checks=v.checks,
                 alerts=v.alerts)


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


def capabilities(state: LiveState) -> dict:
    """What this run can show. Imported runs carry scalars only: say so instead of empty charts.
    accepts: the request kinds the process behind the run applies (control.accepted_kinds), so
    the page offers only those controls; accepts_note says which ones it lacks and why."""
    has_rollouts = not state.rollouts.empty
    # A TRL (ART) run writes source "trl" ("art") like a log imported from a file, but its callback
    # (monitor) is live and applies requests: only a run with no process of ours behind it is "imported".
    imported = state.source != "grpo_core" and state.meta.get("kind") not in ("trl", "art")
    why = ""
    if imported and has_rollouts:  # ART's trajectory files carry every rollout's scores
        why = (f"Imported from {state.source}: it cannot be steered (no trainer of ours is attached); its "
               "rollout scores are kept.")
    elif imported:
        why = (f"Imported from {state.source}: this run has logged scalars only, no per-rollout scores, "
               "so there is no what-if, no weight suggestion and no rollout inspector; it cannot be "
               "steered either (no trainer of ours is attached).")
    elif state.last_step >= 0 and not has_rollouts:
        why = "No rollout scores in the last steps: the what-if needs them."
    return {"imported": imported, "what_if": has_rollouts, "steer": state.is_live and not imported,
            "message": why, "accepts": accepted_kinds(state.meta), "accepts_note": unsupported_note(state.meta)}

