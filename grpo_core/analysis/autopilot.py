"""The autopilot: act on the health verdict by sending requests, never by touching the trainer.

`decide(wide, rollouts, state, cfg)` is a pure policy over store frames (no torch, no I/O):
given the steps since the last change, it returns at most one setting move (or a
checkpoint + stop) with the numbers that justify it. `step_hook` is the thin part the
trainer calls after each step: it reads those frames from the run store, calls `decide`,
and writes each move as a control request with source "autopilot" plus an "autopilot"
event. The trainer applies them like any other request (exactly once, at the next step
boundary, in the ledger with their before/after effect), so the user sees, undoes or
overrides every move the same way as their own.

When it acts: the health verdict over the last `autopilot.window` steps since the last
change fails its trainable-ratio check, drawn at `autopilot.target_ratio` (0.6 by default:
above the verdict's alarm line health.min_trainable_ratio = 0.3, so it acts while the run
still learns rather than after the signal is gone). It then tries,
in the order practice recommends (cheapest and least intrusive first):
  1. weights     - move weight toward metrics that vary inside groups (reweighting.suggest_weights
                   on the window, floors honoured), if the what-if ratio gains >= min_gain;
  1b. budgets    - (opt-in: not in the default autopilot.moves until budgets meet their benchmark)
                   turn per-prompt budgets on (grpo.budget_pilot, train/budgets.py) when most of the
                   window's flat groups are all solved or none solved, and both kinds are there: the
                   prompts differ (some learned, some out of reach), so no global lever fits (a larger
                   G is spent on the solved ones, a harder level on the unsolved ones) while a budget
                   per prompt moves the same rollouts to the prompts whose pilot varies. Judged on the
                   share of sampled tokens that went to trainable groups, not the ratio (a pilot-only
                   group stays flat by design);
  2. group_size  - raise G (x group_size_factor, capped by max_group_size), if the binary
                   planner predicts a gain, within a compute budget: G x prompts stays within
                   rollout_budget x what the user set (and max_rollouts_per_step);
  2b. temperature - once G is at its budget and groups still show rare outcomes: sample more
                   widely (x TEMPERATURE_FACTOR up to max_temperature), at no extra rollouts;
  3. difficulty  - raise the task level when most groups are uniform because they are solved
                   (high and uniform rewards): there is nothing left to learn at this level.
                   It changes the task itself, so only once the verdict's own ratio check
                   fails (health.min_trainable_ratio), not just the autopilot's target; then
                   it comes before group_size: a larger G finds rare successes in a task the
                   model fails, but few failures in one it has learned. Not with under
                   LEVEL_WINDOWS_LEFT windows left: a harder level needs steps to be learned;
  4. stop        - the verdict's near-zero alert (ratio <= health.near_zero_ratio for
                   health.near_zero_steps steps since the last change) and no move above
                   applies: checkpoint, then stop (status stopped, meta stop_reason "autopilot").
Every setting move is on trial: after its first `window` steps, if the ratio did not rise by
at least min_gain / 2 over the ratio that made it act (or, for a raised level, the reward fell
below level_keep_reward of what it was, judged after LEVEL_CHECK_STEPS steps: too big a
step), the autopilot takes it back (an undo: that kind of move is not made again in this run).
No setting move in the last `window` steps of the run: it could not be judged.
Bounds: one move per decision, none until `window` steps have passed since the last change
(its own or the user's), at most max_moves setting moves per per_steps steps, G, the
temperature and the level only ever go up (never below what the user set), every weight keeps its floors and stays in
its band around the user's weight, and a move kind that was undone (by the user, or taken
back as not helping) is never made again in this run.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from grpo_core.analysis import flat_causes, health, planner, reweighting, rollout_stats, step_stats, windows
from grpo_core.runs import live_settings, names
from grpo_core.runs.config import AutopilotConfig, HealthConfig
from grpo_core.runs.live_settings import (
    CHECKPOINT,
    SET_AUTOPILOT,
    SET_BUDGET_PILOT,
    SET_DIFFICULTY,
    SET_GROUP_SIZE,
    SET_PROMPTS,
    SET_STEPS,
    SET_TEMPERATURE,
    SET_WEIGHTS,
    STOP,
)
from grpo_core.runs.store import EV_AUTOPILOT

SOURCE = "autopilot"
LEVEL_CHECK_STEPS = 2  # steps on a raised level before its reward is judged (see review)
TEMPERATURE_FACTOR = 1.25  # each temperature move multiplies it by this, up to autopilot.max_temperature
# A harder level is learned over many steps, and a level taken back costs the policy some of
# the level it knew (docs/benchmarks.md, "Behind the code"): no level raise with fewer than
# this many windows left.
LEVEL_WINDOWS_LEFT = 5
BUDGET_PILOT = 2  # the pilot the budgets move turns on: the benchmark's (docs/benchmarks.md, "Per-prompt budgets")
BUDGET_EXTREME_SHARE = 2 / 3  # budgets: at least this share of the window's flat groups all solved or none solved,
BUDGET_MIXED_SHARE = 0.2  # ... and each of the two at least this share of those: the prompts differ
MOVE_KINDS = {"weights": SET_WEIGHTS, "budgets": SET_BUDGET_PILOT, "group_size": SET_GROUP_SIZE,
              "temperature": SET_TEMPERATURE, "difficulty": SET_DIFFICULTY}
# Requests that leave what a step measures as it was: evidence from before them still holds
# (any other applied request restarts the evidence window).
NO_EVIDENCE_RESET = (SET_STEPS, SET_AUTOPILOT, STOP, CHECKPOINT, "pause", "resume")


@dataclass
class Move:
    move: str  # "weights" | "group_size" | "difficulty" | "revert" (a move taken back) | "stop"
    kind: str  # the control request kind (set_weights, set_group_size, set_difficulty, checkpoint, stop)
    payload: dict  # the request payload, "reason" included
    reason: str
    before: dict = field(default_factory=dict)  # the setting before the move (what Undo restores)
    predicted_ratio: float | None = None
    ratio: float | None = None  # the window's ratio that made it act (a move is judged against it)
    reward: float | None = None  # the window's mean reward then (a raised level is judged against it too)


@dataclass
class AutopilotState:
    """What the autopilot remembers between steps (saved in checkpoints). `settings` is what is
    in force, filled by the trainer each step: weights, group_size, prompts_per_step,
    min_group_std, level, max_level, outcome_metric, uniform_std, metric_max."""
    settings: dict = field(default_factory=dict)
    last_change_step: int = 0  # first step under the latest change (any source); evidence starts here
    move_steps: list = field(default_factory=list)  # steps at which it made setting moves (rate limit)
    moves: list = field(default_factory=list)  # {"request_id", "move", "step"} of every move it sent
    vetoed: list = field(default_factory=list)  # move kinds the user undid: never again in this run
    user_weights: dict | None = None  # the user's weights (config, or their last change): the bands' centre
    user_rollouts: int | None = None  # the user's G x prompts (config, or their last change): the budget's base
    trial: dict | None = None  # the last setting move, until its first window is judged (see review)
    stopped: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "AutopilotState":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (d or {}).items() if k in known})


# =============================================================================================
# The policy
# =============================================================================================
def decide(wide: pd.DataFrame, rollouts: pd.DataFrame, state: AutopilotState, cfg: AutopilotConfig,
           health_cfg: HealthConfig | None = None) -> list[Move]:
    """Moves to make now (usually none). wide: RunStore.scalars_wide() up to the last step;
    rollouts: RunStore.rollouts() of at least the last `cfg.window` steps (no text needed)."""
    hcfg = health_cfg or HealthConfig()
    if state.stopped or wide is None or wide.empty:
        return []
    wide = wide.sort_index()
    step = int(wide.index[-1])
    ev = wide[wide.index >= state.last_change_step]  # only steps under the settings in force
    if state.trial is not None:  # first judge the last move on the steps after it
        revert = review(ev, state.trial, cfg)
        if revert is not None:
            return [revert]
    if len(ev) < cfg.window:
        return []
    # The verdict the user sees, over the autopilot's window (ratio check) and since the change (alerts).
    v = health.verdict(ev, dataclasses.replace(hcfg, trend_window=cfg.window, min_trainable_ratio=cfg.target_ratio))
    ratio_check = next((c for c in v.checks if c.name == "trainable_ratio"), None)
    if ratio_check is None or ratio_check.ok is not False:
        return []
    win_steps = ev.index[-cfg.window:]
    ro = rollouts[rollouts["step"].isin(win_steps)] if len(rollouts) else rollouts
    evidence = f"ratio {ratio_check.value:.2f} <= {cfg.target_ratio:g} for {cfg.window} steps"
    skipped: list[str] = []
    rate_ok = sum(s > step - cfg.per_steps for s in state.move_steps) < cfg.max_moves
    left = int(state.settings.get("steps") or 0) - step
    if not rate_ok:
        skipped.append(f"rate limit ({cfg.max_moves} moves per {cfg.per_steps} steps)")
    elif state.settings.get("steps") and left < cfg.window:
        skipped.append(f"{left} steps left: a move could not be judged (window {cfg.window})")
    else:
        for name in _order(cfg.moves, ro, state.settings, cfg):
            if name == "stop":
                continue
            if name in state.vetoed:
                skipped.append(f"{name}: undone earlier in this run")
                continue
            why = evidence
            if name == "difficulty":  # it changes the task itself: only once the verdict's own check fails
                if ratio_check.value > hcfg.min_trainable_ratio:
                    skipped.append(f"difficulty: ratio above the verdict's line {hcfg.min_trainable_ratio:g}")
                    continue
                why = f"ratio {ratio_check.value:.2f} <= {hcfg.min_trainable_ratio:g} for {cfg.window} steps"
            settings = {**state.settings, "user_weights": state.user_weights or state.settings.get("weights")}
            settings["user_rollouts"] = state.user_rollouts
            move, why_not = TRIES[name](ro, ev, settings, cfg, ratio_check.value, why)
            if move is not None:
                return [move]
            skipped.append(f"{name}: {why_not}")
    near = next((a for a in v.alerts if a.kind == "near_zero"), None)
    if near is None or "stop" not in cfg.moves or "stop" in state.vetoed:
        return []
    why = (f"{near.message.split(':')[0]} since the last change (no move left: {'; '.join(skipped)})"
           if skipped else near.message.split(":")[0] + " since the last change")
    return [Move("stop", CHECKPOINT, {"reason": f"before stopping: {why}"}, f"checkpoint before stopping: {why}"),
            Move("stop", STOP, {"reason": why}, f"{why}: checkpoint and stop")]


def review(ev: pd.DataFrame, trial: dict, cfg: AutopilotConfig) -> Move | None:
    """The inverse of the last move when it did not deliver, else None (judged again next step
    until a full window is in). A move is taken back (and, as an undo, never made again in this
    run) when over its first window the ratio did not rise by at least min_gain / 2 over the
    ratio that made it act (weights that only looked better on past rollouts, a G that found
    nothing), or, for a raised level, as soon as LEVEL_CHECK_STEPS steps earn under
    level_keep_reward of the reward before: a level the model mostly fails shows at once, and
    every step on it pulls the policy away from the level it had learned."""
    if trial.get("ratio") is None:
        return None
    rew = float(ev[names.REWARD].tail(cfg.window).mean()) if names.REWARD in ev.columns and len(ev) else None
    too_hard = (trial["move"] == "difficulty" and trial.get("reward") is not None and rew is not None
                and len(ev) >= min(LEVEL_CHECK_STEPS, cfg.window) and rew < cfg.level_keep_reward * trial["reward"])
    if len(ev) < cfg.window and not too_hard:
        return None
    after, _, _, k = (useful_share(ev, cfg.window) if trial["move"] == "budgets"
                      else windows.window_ratio(ev, cfg.window))
    need = trial["ratio"] + cfg.min_gain / 2
    if after is None or (after >= need and not too_hard):
        return None
    inv = undo_request(trial)
    if inv is None:
        return None
    kind, payload = inv
    back = live_settings.describe(kind, payload)
    why = (f"reward {trial['reward']:.2f} -> {rew:.2f} over {len(ev.tail(cfg.window))} steps at the new level "
           f"(< {cfg.level_keep_reward:.0%} of before: too big a step)" if too_hard else
           f"{'useful token share' if trial['move'] == 'budgets' else 'ratio'} {trial['ratio']:.2f} -> {after:.2f} "
           f"over {k} steps (needed >= {need:.2f})")
    reason = f"autopilot move #{trial['request_id']} did not help: {why}: back to {back}"
    return Move("revert", kind, {**payload, "reason": reason}, reason, dict(trial.get("after") or {}), None, after)


def _order(moves: list[str], ro: pd.DataFrame, s: dict, cfg: AutopilotConfig) -> list[str]:
    """The configured order, except that when most groups are uniform because they are solved,
    harder tasks come before a larger group: a larger G finds rare successes in a task the model
    fails, but few failures in one it has learned."""
    moves = list(moves)
    if "difficulty" in moves and "group_size" in moves and ro is not None and len(ro) \
            and solved_share(ro, s, cfg.solved_reward)[0] >= cfg.solved_share:
        moves.remove("difficulty")
        moves.insert(moves.index("group_size"), "difficulty")
    return moves


def _arrays(ro: pd.DataFrame, metrics: list[str]):
    if ro is None or ro.empty or any(m not in ro.columns for m in metrics):
        return None
    a = rollout_stats.rollout_arrays(ro, metrics)
    return a if a.n_groups else None


def try_weights(ro, ev, s: dict, cfg: AutopilotConfig, ratio: float, evidence: str):
    """Reweight toward the metrics that vary: the smallest suggested change that reaches 2/3 of
    the best predicted gain, the total weight unchanged, each metric inside its band: at least
    its floors (min_weights, weight_floor x total) and within weight_band x the user's weight
    (the config's, or the user's last change) either way, so the autopilot can shift emphasis
    but never trade the user's objective for a shaping term that happens to vary."""
    weights = {m: float(w) for m, w in (s.get("weights") or {}).items()}
    if len(weights) < 2:
        return None, "one metric only"
    a = _arrays(ro, list(weights))
    if a is None:
        return None, "no rollout scores in the window"
    thr, outcome, ustd = s.get("min_group_std", 0.01), s.get("outcome_metric") or None, s.get("uniform_std", 1e-3)
    cur = reweighting.what_if(a, weights, thr, outcome, ustd)
    user = {m: float(v) for m, v in (s.get("user_weights") or weights).items()}
    total = sum(weights.values())
    lo = {m: max(float(cfg.min_weights.get(m, 0.0)), user.get(m, 0.0) / cfg.weight_band) for m in weights}
    hi = {m: max(user.get(m, 0.0) * cfg.weight_band, lo[m]) for m in weights}
    if sum(lo.values()) > total + 1e-9 or sum(hi.values()) < total - 1e-9:
        return None, f"no room inside the weight bands (total {total:g})"
    cands = []
    for sg in reweighting.suggest_weights(a, weights, thr, floor=cfg.weight_floor, n=8, outcome_metric=outcome,
                                     uniform_std=ustd):
        w = bound_weights(sg["weights"], lo, hi, total)
        if w is None or all(abs(w[m] - weights[m]) < 1e-4 for m in w):
            continue
        pred = reweighting.what_if(a, w, thr, outcome, ustd)
        if pred >= cur + cfg.min_gain - 1e-12:
            cands.append((pred, sum(abs(w[m] - weights[m]) for m in w), w))
    if not cands:
        return None, f"no reweighting inside the bands gains {cfg.min_gain:g} (what-if on {a.n_groups} groups)"
    best = max(c[0] for c in cands)
    pred, _, w = min((c for c in cands if c[0] - cur >= (best - cur) * 2 / 3 - 1e-12), key=lambda c: c[1])
    uf = dict(zip(a.metric_names, rollout_stats.uniform_fraction(a, ustd)))
    donors = sorted((m for m in w if w[m] < weights[m] - 1e-9), key=lambda m: w[m] - weights[m])
    uni = ", ".join(f"{m} uniform in {uf[m]:.0%} of groups" for m in donors[:2])
    changed = sorted((m for m in w if abs(w[m] - weights[m]) > 1e-9), key=lambda m: -abs(w[m] - weights[m]))
    moves = ", ".join(f"{m} {weights[m]:.2f} -> {w[m]:.2f}" for m in changed[:4])
    reason = f"{evidence}{', ' + uni if uni else ''}: {moves}, predicted ratio {pred:.2f} (now {cur:.2f})"
    return Move("weights", SET_WEIGHTS, {"weights": w, "reason": reason}, reason, {"weights": weights}, pred,
                ratio), ""


def bound_weights(w: dict[str, float], lo: dict[str, float], hi: dict[str, float],
                  total: float) -> dict[str, float] | None:
    """w moved inside [lo, hi] per metric with the same total: metrics outside are pinned to
    the bound they crossed, the rest share what is left in proportion to w; None when the
    bounds cannot hold the total. (A bound never adds weight overall: that would raise every
    group's std and game the threshold.)"""
    if sum(lo.values()) > total + 1e-9 or sum(hi.values()) < total - 1e-9:
        return None
    w = {m: max(float(v), 0.0) for m, v in w.items()}
    pinned: dict[str, float] = {}
    for _ in range(2 * len(w) + 1):
        free = [m for m in w if m not in pinned]
        left = total - sum(pinned.values())
        mass = sum(w[m] for m in free)
        out = {**pinned, **{m: (w[m] * left / mass if mass > 0 else left / max(len(free), 1)) for m in free}}
        low = [m for m in free if out[m] < lo[m] - 1e-12]
        high = [m for m in free if out[m] > hi[m] + 1e-12]
        if not low and not high:
            return {m: round(out[m], 4) for m in w}
        pinned.update({m: lo[m] for m in low} if low else {m: hi[m] for m in high})
    return None


def minority_rates(ro: pd.DataFrame) -> np.ndarray:
    """Per group: the share of rollouts whose total differs from the group's most common total."""
    tot = ro["total"].round(6)
    keys = [ro["step"].to_numpy(), ro["group"].to_numpy()]
    counts = tot.groupby(keys + [tot.to_numpy()]).size()
    top = counts.groupby(level=[0, 1]).max()
    size = counts.groupby(level=[0, 1]).sum()
    return (1.0 - top / size).to_numpy(np.float64)


def predicted_ratio_gain(ro: pd.DataFrame, g_old: int, g_new: int) -> tuple[float, float]:
    """(gain, pooled minority rate): the binary planner (1 - p^G - (1-p)^G) per group, p the
    group's minority rate shrunk halfway toward the pooled one (as many pseudo-counts as the
    group has rollouts): a group seen uniform at G may still vary at a larger G when other
    groups show rare outcomes, but less likely than one that already showed one."""
    m = minority_rates(ro)
    if not len(m):
        return 0.0, 0.0
    pooled = float(m.mean())
    p = (m + pooled) / 2
    gain = float(np.mean(planner.p_trainable_binary(p, g_new) - planner.p_trainable_binary(p, g_old)))
    return gain, pooled


def rollout_budget(s: dict, cfg: AutopilotConfig) -> int:
    """Rollouts per step the autopilot may spend: rollout_budget x what the user set (G x prompts,
    from the config or their last change), never above max_rollouts_per_step."""
    base = int(s.get("user_rollouts") or int(s.get("group_size", 0)) * int(s.get("prompts_per_step", 1)))
    return int(min(cfg.max_rollouts_per_step, math.floor(cfg.rollout_budget * base + 1e-9)))


def try_group_size(ro, ev, s: dict, cfg: AutopilotConfig, ratio: float, evidence: str):
    """G x group_size_factor, as far as max_group_size and the compute budget allow at the same
    prompts per step. (Fewer prompts paying for a larger G would raise the ratio, not the signal:
    at a fixed budget, for the rare failures of a learned task, more prompts with smaller groups
    give more prompts with a trainable group: docs/benchmarks.md, "Behind the code".)"""
    g, p = int(s.get("group_size", 0)), int(s.get("prompts_per_step", 1))
    budget = rollout_budget(s, cfg)
    cap = min(cfg.max_group_size, budget // max(p, 1))
    new = min(max(g + 1, math.ceil(g * cfg.group_size_factor)), cap)
    if new <= g:
        return None, f"G {g} is at the cap {cap} (max_group_size {cfg.max_group_size}, budget {budget} rollouts " \
                     f"per step over {p} prompts)"
    if ro is None or ro.empty or "total" not in ro.columns:
        return None, "no rollouts in the window"
    gain, pooled = predicted_ratio_gain(ro, g, new)
    if gain < cfg.min_gain:
        return None, f"G {g} -> {new} predicts +{gain:.2f} (minority rate {pooled:.3f})"
    pred = min(1.0, ratio + gain)
    reason = (f"{evidence}, rare outcomes in groups (minority rate {pooled:.3f}): group size {g} -> {new} "
              f"({new * p} rollouts per step, budget {budget}), predicted ratio {pred:.2f}")
    return Move("group_size", SET_GROUP_SIZE, {"group_size": new, "reason": reason}, reason, {"group_size": g},
                pred, ratio), ""


def try_temperature(ro, ev, s: dict, cfg: AutopilotConfig, ratio: float, evidence: str):
    """Sample more widely (temperature x TEMPERATURE_FACTOR, up to max_temperature) when G is at
    its budget and groups still show rare outcomes: a policy that answers alike in most groups
    explores again, at no extra rollouts, and each group that then varies trains it to be right
    under wider sampling too. Judged like a larger G: taken back if the ratio did not rise."""
    t = float(s.get("temperature") or 1.0)
    new = round(min(cfg.max_temperature, t * TEMPERATURE_FACTOR), 4)
    if new <= t + 1e-9:
        return None, f"temperature {t:g} is at the cap {cfg.max_temperature:g}"
    if ro is None or ro.empty or "total" not in ro.columns:
        return None, "no rollouts in the window"
    pooled = float(minority_rates(ro).mean())
    if pooled <= 0:  # every group alike, to the last rollout: no rare outcome for wider sampling to find
        return None, "no group shows a rare outcome (minority rate 0)"
    reason = (f"{evidence}, G at its budget, rare outcomes in groups (minority rate {pooled:.3f}): sampling "
              f"temperature {t:g} -> {new:g}")
    return Move("temperature", SET_TEMPERATURE, {"temperature": new, "reason": reason}, reason, {"temperature": t},
                None, ratio), ""


def solved_share(ro: pd.DataFrame, s: dict, frac: float) -> tuple[float, float]:
    """(share of groups solved, best reachable total). A group is solved when its total's std
    <= min_group_std and its mean >= frac x the best reachable total: the sum of weight x each
    metric's top score (metric_max in the settings, else the best seen in the window)."""
    weights = s.get("weights") or {}
    tops = s.get("metric_max") or {}
    best = 0.0
    for m, w in weights.items():
        top = tops.get(m)
        if top is None:
            top = max(float(ro[m].max()), 0.0) if m in ro.columns else 0.0
        best += float(w) * float(top)
    if best <= 0:
        return 0.0, best
    g = ro.groupby(["step", "group"])["total"]
    uniform = g.std(ddof=0) <= max(float(s.get("min_group_std", 0.01)), step_stats.STD_EPS)
    return float((uniform & (g.mean() >= frac * best)).mean()), best


def try_difficulty(ro, ev, s: dict, cfg: AutopilotConfig, ratio: float, evidence: str):
    level, top = int(s.get("level", 1)), int(s.get("max_level", 1))
    if level >= top:
        return None, f"level {level} is the highest"
    left = int(s.get("steps") or 0) - int(ev.index[-1]) if len(ev) else None
    if s.get("steps") and left < LEVEL_WINDOWS_LEFT * cfg.window:
        return None, f"{left} steps left: too few to learn a harder level ({LEVEL_WINDOWS_LEFT} windows)"
    if ro is None or ro.empty:
        return None, "no rollouts in the window"
    share, best = solved_share(ro, s, cfg.solved_reward)
    if share < cfg.solved_share:
        return None, f"{share:.0%} of groups solved (< {cfg.solved_share:.0%})"
    reward = float(ev[names.REWARD].tail(cfg.window).mean()) if names.REWARD in ev.columns else float("nan")
    reason = (f"{evidence}, {share:.0%} of groups uniform at >= {cfg.solved_reward:.0%} of the best reward "
              f"{best:.2f} (reward {reward:.2f}): tasks too easy, level {level} -> {level + 1}")
    return Move("difficulty", SET_DIFFICULTY, {"level": level + 1, "reason": reason}, reason, {"level": level},
                None, ratio, reward if reward == reward else None), ""


def useful_share(ev: pd.DataFrame, window: int) -> tuple[float | None, None, None, int]:
    """(share of the sampled completion tokens that went to trainable groups over the last `window`
    steps, None, None, steps counted), shaped as windows.window_ratio: what per-prompt budgets aim
    at (a flat group's tokens are wasted compute), from the stored token counts."""
    if names.CUM_SAMPLED_TOKENS not in ev.columns or names.WASTED_TOKENS not in ev.columns:
        return None, None, None, 0
    tail = ev[[names.CUM_SAMPLED_TOKENS, names.WASTED_TOKENS]].dropna().tail(window + 1)
    sampled = tail[names.CUM_SAMPLED_TOKENS].diff().iloc[1:]  # the first row is the step before the window's
    total = float(sampled.sum())
    if total <= 0:
        return None, None, None, 0
    return 1.0 - float(tail[names.WASTED_TOKENS].iloc[1:].sum()) / total, None, None, len(sampled)


def try_budgets(ro, ev, s: dict, cfg: AutopilotConfig, ratio: float, evidence: str):
    """Per-prompt budgets on (grpo.budget_pilot = BUDGET_PILOT) when the window's flat groups are
    mostly all solved or none solved, both kinds at least BUDGET_MIXED_SHARE of them (the flat
    causes, analysis/flat_causes.py): the prompts differ, so the same rollouts per step are better
    spent per prompt. Not when the run cannot take it (the settings' budget_refusal: the engine,
    dynamic sampling, G too small) or has it on already."""
    if int(s.get("budget_pilot") or 0):
        return None, f"per-prompt budgets already on (pilot {s['budget_pilot']})"
    if s.get("budget_refusal"):
        return None, str(s["budget_refusal"])
    counts = flat_causes.window_counts(ev, cfg.window)
    if counts is None:
        return None, "no flat-cause counts in the window"
    solved, unsolved = counts.get(names.CAUSE_SOLVED, 0.0), counts.get(names.CAUSE_UNSOLVED, 0.0)
    flat, extreme = sum(counts.values()), solved + unsolved
    if flat <= 0 or extreme < BUDGET_EXTREME_SHARE * flat:
        return None, f"{extreme:.0f} of {flat:.0f} flat groups all solved or none solved (< {BUDGET_EXTREME_SHARE:.0%})"
    if min(solved, unsolved) < BUDGET_MIXED_SHARE * extreme:
        return None, (f"flat groups not mixed across prompts ({solved:.0f} all solved, {unsolved:.0f} none solved): "
                      "a global lever fits")
    useful = useful_share(ev, cfg.window)[0]
    reason = (f"{evidence}, flat groups mixed across prompts ({solved:.0f} all solved, {unsolved:.0f} none solved "
              f"of {flat:.0f} flat): per-prompt budgets on, a pilot of {BUDGET_PILOT} per prompt and the rest of "
              "the step's rollouts where a pilot varies"
              + (f" (useful token share {useful:.2f})" if useful is not None else ""))
    return Move("budgets", SET_BUDGET_PILOT, {"budget_pilot": BUDGET_PILOT, "reason": reason}, reason,
                {"budget_pilot": 0}, None, useful), ""


TRIES = {"weights": try_weights, "budgets": try_budgets, "group_size": try_group_size, "temperature": try_temperature,
         "difficulty": try_difficulty}


# =============================================================================================
# Bookkeeping (the trainer calls these; they change only the state)
# =============================================================================================
def note_applied(state: AutopilotState, req: dict, applied_step: int):
    """A request was applied, taking effect at applied_step: evidence restarts there; an undo
    of one of the autopilot's moves vetoes that kind of move for the rest of the run."""
    if req["kind"] not in NO_EVIDENCE_RESET:
        state.last_change_step = max(state.last_change_step, int(applied_step))
    if req.get("source") != SOURCE and req["kind"] not in NO_EVIDENCE_RESET:
        state.trial = None  # the user changed something since: the move can no longer be judged alone
        if req["kind"] == SET_WEIGHTS:
            state.user_weights = None  # the user chose weights: the next step reads them as the new centre
        if req["kind"] in (SET_GROUP_SIZE, SET_PROMPTS):
            state.user_rollouts = None  # the user chose G or prompts: the budget is counted from them
    undo = (req.get("payload") or {}).get("undo_of")
    if undo is not None:
        for m in state.moves:
            if m.get("request_id") == undo and m["move"] not in state.vetoed:
                state.vetoed.append(m["move"])


def record(state: AutopilotState, moves: list[Move], step: int, request_ids: list[int]):
    for mv, rid in zip(moves, request_ids):
        state.moves.append({"request_id": rid, "move": mv.move, "step": step})
        if mv.move in MOVE_KINDS:  # a setting move: on trial until its first window is judged
            state.trial = {"request_id": rid, "move": mv.move, "kind": mv.kind, "before": mv.before,
                           "after": {k: v for k, v in mv.payload.items() if k != "reason"}, "ratio": mv.ratio,
                           "reward": mv.reward}
        elif mv.move == "revert":
            state.trial = None
    if any(m.move in MOVE_KINDS for m in moves):  # reverts and stops are not rate-limited
        state.move_steps.append(step)
    if any(m.kind == STOP for m in moves):
        state.stopped = True
    state.last_change_step = max(state.last_change_step, step + 1)  # no new decision on the old evidence


def metric_max(metric_kinds: dict[str, str]) -> dict[str, float | None]:
    """Top score per metric kind: binary/continuous 1, penalty 0; custom: unknown (the window's best)."""
    return {m: {"binary": 1.0, "continuous": 1.0, "penalty": 0.0}.get(k) for m, k in metric_kinds.items()}


def step_hook(store, step: int, state: AutopilotState, cfg: AutopilotConfig, health_cfg: HealthConfig) -> list[int]:
    """After step `step` was logged: read the window, decide, send each move as a request with
    source "autopilot" and an "autopilot" event. Returns the request ids sent."""
    need = max(cfg.window, health_cfg.near_zero_steps) + 1
    since = max(state.last_change_step - 1, step - need)
    wide = store.scalars_wide(since_step=since)
    ro = store.rollouts(since_step=max(since, step - cfg.window), with_text=False)
    if state.user_weights is None:
        state.user_weights = dict(state.settings.get("weights") or {})
    if state.user_rollouts is None:
        state.user_rollouts = int(state.settings.get("group_size", 0)) * int(state.settings.get("prompts_per_step", 1))
    judged = state.trial is not None and int((wide.index >= state.last_change_step).sum()) >= cfg.window
    moves = decide(wide, ro, state, cfg, health_cfg)
    if judged and not any(m.move == "revert" for m in moves):
        state.trial = None  # the move helped: it stays
    ids = []
    for mv in moves:
        rid = store.request(mv.kind, mv.payload, source=SOURCE)
        ids.append(rid)
        store.add_event(EV_AUTOPILOT, {"request_id": rid, "move": mv.move, "kind": mv.kind, "reason": mv.reason,
                                       "before": mv.before, "request": mv.payload,
                                       "predicted_ratio": mv.predicted_ratio}, step=step)
    if moves:
        record(state, moves, step, ids)
    return ids


# =============================================================================================
# Undo (the live page's button): the inverse request of one move
# =============================================================================================
def undo_request(event_payload: dict) -> tuple[str, dict] | None:
    """(kind, payload) that restores the setting before an autopilot move, or None (a stop or
    checkpoint cannot be undone)."""
    kind, before, rid = event_payload.get("kind"), event_payload.get("before") or {}, event_payload.get("request_id")
    if kind not in MOVE_KINDS.values() or not before:
        return None
    return kind, {**before, "undo_of": int(rid), "reason": f"undo of autopilot move #{rid}"}
