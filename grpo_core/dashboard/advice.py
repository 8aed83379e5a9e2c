"""What to do now: the what-if, weight suggestions and the top alert's fix as one request.

All over the recent rollouts (the share of flat groups too, measured and predicted at any G,
pooled and per prompt); the fixes are judged by the autopilot's own move functions."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from grpo_core.analysis import autopilot, flat_causes, prompt_history, reweighting, rollout_stats, windows
from grpo_core.dashboard.live_cards import Cards, cards
from grpo_core.dashboard.live_view import LiveState, config_section, current_settings, health_config
from grpo_core.runs import live_settings, names
from grpo_core.runs.config import AutopilotConfig
from grpo_core.runs.run_meta import RunMeta
from grpo_core.runs.store import RunStore
from grpo_core.tasks.metrics import KINDS


def rollout_arrays(state: LiveState):
    if state.arrays_cache is not None and state.arrays_cache[0] == (state.rollout_step, len(state.rollouts)):
        return state.arrays_cache[1]
    a = rollout_stats.rollout_arrays(state.rollouts, state.metrics) if not state.rollouts.empty else None
    state.arrays_cache = ((state.rollout_step, len(state.rollouts)), a)
    return a


def what_if(state: LiveState, weights: dict, min_group_std: float) -> dict:
    """Trainable ratio of the recent window under the settings in force and under the
    slider settings. Raises ConfigError for weights that could not be applied either."""
    a = rollout_arrays(state)
    cur = current_settings(state)
    if a is None or a.n_groups == 0:
        return {"available": False, "steps": 0, "groups": 0, "now": None, "predicted": None}
    steps = int(len(np.unique(a.group_step)))
    now = reweighting.what_if(a, cur["weights"], cur["min_group_std"], cur["outcome_metric"])
    pred = reweighting.what_if(a, weights, min_group_std, cur["outcome_metric"])
    return {"available": True, "steps": steps, "groups": int(a.n_groups), "now": now, "predicted": pred}


def suggestions(state: LiveState, weights: dict | None = None, min_group_std: float | None = None,
                n: int = 3) -> list[dict]:
    a = rollout_arrays(state)
    if a is None:
        return []
    cur = current_settings(state)
    return reweighting.suggest_weights(a, weights or cur["weights"],
                                  cur["min_group_std"] if min_group_std is None else min_group_std,
                                  n=n, outcome_metric=cur["outcome_metric"])



# ---- what to do now: the top alert's fix as one request ---------------------------------------------
# The fix each alert asks for, in the order tried (the autopilot's move functions decide whether
# it applies and predict its effect, so the page offers what the autopilot would do, one click away).
ADVICE_S = 5.0  # the top alert's fix is judged again for new rollouts at most this often (what_to_do)
ALERT_FIXES = {"zero_trainable": ("group_size", "weights", "temperature"),
               "low_ratio": ("difficulty", "group_size", "weights", "temperature"),
               "declining_ratio": ("difficulty", "group_size", "temperature"),
               "near_zero": ("difficulty", "group_size", "weights", "temperature"),
               "low_reward_std": ("temperature", "group_size", "weights"),
               "template_collapse": ("temperature",)}  # completions that ignore their prompt: sample wider
# The moves tried first when most of the window's flat groups share a cause (flat_causes.dominant): the
# fix the cause asks for ahead of the alert's own order. Truncated and errored groups ask for what no
# autopilot move does: a longer max_new_tokens (offered as its request), a fixed reward function (said).
CAUSE_FIXES = {names.CAUSE_SOLVED: ("difficulty",), names.CAUSE_UNSOLVED: ("group_size", "temperature"),
               names.CAUSE_IDENTICAL: ("temperature",), names.CAUSE_SHAPING: ("group_size", "temperature"),
               names.CAUSE_BELOW_GATE: ("weights",)}
UNPREDICTABLE = {"difficulty": "not predictable: a new level changes the prompts themselves",
                 "temperature": "not predictable from past rollouts: wider sampling changes the completions"}


@dataclass
class Fix:
    """One request that answers an alert: what it changes, and what it is predicted to do."""
    move: str  # weights | group_size | temperature | difficulty
    label: str  # "G 8 -> 16", "difficulty 1 -> 2"
    kind: str  # the request kind
    payload: dict
    now: float | None  # the window's trainable ratio
    predicted: float | None  # None: cannot be predicted (see note)
    note: str  # the prediction in words, or why there is none
    reason: str  # the evidence, as the autopilot would write it


def _fix_settings(state: LiveState) -> dict:
    """The settings the autopilot's move functions read (as the trainer fills them)."""
    cur, run = current_settings(state), RunMeta.parse(state.meta)
    return {**cur, "max_level": int(run.cfg("curriculum", "max_level", 4) or 4), "user_weights": cur["weights"],
            "uniform_std": health_config(state.meta).uniform_std,
            "steps": state.steps_total, "prompts_per_step": cur.get("prompts_per_step") or 1,
            "user_rollouts": int(run.cfg("grpo", "group_size", 8)) * int(run.cfg("grpo", "prompts_per_step", 8))}


def _fix_label(move: str, before: dict, payload: dict) -> str:
    if move == "group_size":
        return f"G {before.get('group_size')} -> {payload['group_size']}"
    if move == "difficulty":
        return f"difficulty {before.get('level')} -> {payload['level']}"
    if move == "temperature":
        return f"temperature {before.get('temperature'):g} -> {payload['temperature']:g}"
    changed = [m for m, w in payload["weights"].items() if abs(w - before["weights"].get(m, w)) > 1e-4]
    return "weights " + ", ".join(f"{m} {before['weights'][m]:.2f} -> {payload['weights'][m]:.2f}" for m in changed)


def autopilot_config(state: LiveState) -> AutopilotConfig:
    """The run's [autopilot] section as the trainer reads it (its defaults where the run set none)."""
    return config_section(state.meta, "autopilot", AutopilotConfig)


def autopilot_note(state: LiveState, offered: list[Fix]) -> str | None:
    """What the autopilot will do about the offered fixes (None: it is off): only the moves in
    its autopilot.moves are its to make, the others are the user's."""
    if not current_settings(state)["autopilot"]:
        return None
    allowed = autopilot_config(state).moves
    ours = [f.label for f in offered if f.move in allowed]
    yours = [f.label for f in offered if f.move not in allowed]
    if not yours:
        return "The autopilot is on: it makes such a move itself once the ratio stays below its target."
    moves = ", ".join(m.replace("_", " ") for m in allowed if m != "stop") or "none"
    also = f"it makes {', '.join(ours)} itself once the ratio stays below its target; " if ours else ""
    return (f"The autopilot is on, with moves: {moves}; {also}{' and '.join(yours)} "
            f"{'is' if len(yours) == 1 else 'are'} yours to make.")


def fixes(state: LiveState, moves=("difficulty", "group_size", "weights", "temperature")) -> tuple[list[Fix], list[str]]:
    """(fixes that apply now, why each other move does not), over the health window's rollouts,
    computed by the autopilot's own move functions with the run's autopilot bounds (G within its
    rollout budget, temperature within its cap, one level up) but no rate limit."""
    a = rollout_arrays(state)
    if a is None or a.n_groups == 0:
        return [], ["no rollout scores in the recent steps"]
    hcfg = health_config(state.meta)
    acfg = autopilot_config(state)
    last = state.recent.tail(hcfg.trend_window)
    ro = state.rollouts[state.rollouts["step"].isin(last.index)]
    ratio, *_ = windows.window_ratio(last, hcfg.trend_window)
    ratio = 0.0 if ratio is None else ratio
    s, out, why_not = _fix_settings(state), [], []
    for move in moves:
        mv, why = autopilot.TRIES[move](ro, last, s, acfg, ratio, f"ratio {ratio:.2f} over {len(last)} steps")
        if mv is None:
            why_not.append(f"{move.replace('_', ' ')}: {why}")
            continue
        pred = None if move in UNPREDICTABLE else mv.predicted_ratio
        note = UNPREDICTABLE.get(move) or f"predicted trainable ratio {pred:.0%} (now {ratio:.0%})"
        payload = {k: v for k, v in mv.payload.items() if k != "reason"}
        out.append(Fix(move, _fix_label(move, mv.before or s, payload), mv.kind, payload, ratio, pred, note, mv.reason))
    return out, why_not


def what_to_do(state: LiveState, c: Cards | None = None) -> dict | None:
    """The top alert (critical first) and the fixes it asks for, first the one to click; None
    when no alert is up. A healthy run, or one whose alerts no move answers, says so instead."""
    c = c or cards(state)
    # Judged again at once for a new set of alerts or weights, but for new rollouts at most every
    # ADVICE_S: a fast run brings new rollouts at each of the page's refreshes (2 s), and the move
    # functions' cost at each would compete with the sliders' own messages for the server.
    key = (tuple(sorted(a.kind for a in c.alerts)), tuple(sorted(current_settings(state)["weights"].items())))
    now, cached = time.monotonic(), state.advice_cache
    if cached is not None and cached[0] == key and (cached[1] == state.rollout_step or now - cached[2] < ADVICE_S):
        return cached[3]
    out = None
    if c.alerts:
        top = sorted(c.alerts, key=lambda x: x.severity != "critical")[0]
        moves = ALERT_FIXES.get(top.kind, ("group_size", "weights"))
        window = health_config(state.meta).trend_window
        counts = flat_causes.window_counts(state.recent, window) if top.kind in ALERT_FIXES else None
        cause = flat_causes.dominant(counts)
        found, why_not = fixes(state, tuple(dict.fromkeys(CAUSE_FIXES.get(cause, ()) + moves)))
        found = _cause_fix(state, cause, counts, window) + found
        if cause == names.CAUSE_ERRORED:
            why_not.insert(0, f"{counts[cause]:g} flat groups over the last {window} steps failed to score: no "
                              "setting fixes that; fix the reward function (the group inspector shows each error)")
        out = {"alert": top, "fixes": found, "why_not": why_not, "cause": cause}
    state.advice_cache = (key, state.rollout_step, now, out)
    return out


def _cause_fix(state: LiveState, cause: str | None, counts: dict | None, window: int) -> list[Fix]:
    """Most flat groups cut at max_new_tokens: the request that doubles it (within the setting's bounds)."""
    cur = current_settings(state).get("max_new_tokens")
    setting = live_settings.BY_KIND[live_settings.SET_MAX_NEW_TOKENS]
    if cause != names.CAUSE_TRUNCATED or not cur or int(cur) >= setting.hi:
        return []
    new = min(2 * int(cur), int(setting.hi))
    reason = (f"{counts[cause]:g} of {sum(counts.values()):g} flat groups over the last {window} steps had every "
              f"completion cut at max_new_tokens {int(cur)}")
    return [Fix("max_new_tokens", f"max_new_tokens {int(cur)} -> {new}", setting.kind, setting.payload(new), None, None,
                "not predictable from past rollouts: longer completions change what is scored", reason)]


def what_would_help(state: LiveState) -> str:
    """What the page says when Suggest weights finds nothing: the moves other than a reweight
    that would make groups vary (a harder level, a larger G, wider sampling), else why none can."""
    found, why_not = fixes(state, ("difficulty", "group_size", "temperature"))
    if found:
        return "What would help instead: " + "; ".join(f"**{f.label}** ({f.note})" for f in found) + "."
    return "Nothing else applies now either: " + "; ".join(why_not) + "."


# ---- flat groups: measured, and predicted pooled and per prompt (analysis/planner.py) ---------------
@functools.lru_cache(maxsize=8)
def _window_prompts(db: str, lo: int, hi: int) -> pd.DataFrame:
    """(step, group, prompt_id) of the window's groups (read once per window: steps are committed whole)."""
    with RunStore.open(db, readonly=True) as s:
        return s.groups(since_step=lo, until_step=hi)[["step", "group", "prompt_id"]]


def binary_metric(state: LiveState) -> str | None:
    """The metric flat groups are judged by: the outcome metric, else the heaviest-weighted binary one."""
    cur = current_settings(state)
    if cur["outcome_metric"] in state.metrics:
        return cur["outcome_metric"]
    binary = [m for m in state.metrics if KINDS.get(m) == "binary" and cur["weights"].get(m, 0.0) > 0]
    return max(binary, key=lambda m: cur["weights"][m], default=None)


def flat_forecast(state: LiveState, group_size: int) -> dict:
    """Over the what-if window: the share of groups whose binary metric was flat (all 0 or all 1),
    and the share predicted at group_size from one pooled rate and from each prompt's own rate
    (prompt_history.flat_forecast, for the window's prompts). available False without rollouts or
    a binary metric."""
    metric = binary_metric(state)
    if metric is None or state.rollouts.empty or metric not in state.rollouts.columns:
        return {"available": False, "metric": metric}
    steps = state.rollouts["step"]
    ids = _window_prompts(state.db, int(steps.min()) - 1, int(steps.max()))
    per_group = prompt_history.group_successes(ids, state.rollouts, metric)
    f = prompt_history.flat_forecast(per_group, int(group_size), prompts=list(per_group["prompt_id"].unique()))
    return {"available": True, "metric": metric, "steps": int(steps.nunique()), "G": int(group_size),
            "measured": prompt_history.measured_flat(per_group), "pooled": f["pooled"],
            "per_prompt": f["per_prompt"], "prompts": f["prompts"]}
