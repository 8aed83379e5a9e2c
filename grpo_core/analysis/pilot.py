"""The pilot's summary, verdict and planner: from a pilot store, whether training would get a learning signal, and what to change first.

A pilot is a training run without the update: G completions for N prompts, scored by the
same composite reward, logged into a run store of kind "pilot" in exactly the format the
trainer logs (steps = batches of prompts), so every chart and report reads it. From it,
`pilot_summary` says whether training would get a learning signal: the measured trainable
ratio (the prediction for the first training steps), which metrics are uniform inside
groups, how large G must be for a binary metric to vary (1 - p^G - (1-p)^G at the pooled
rate, and from each prompt's own rate shrunk toward it: planner.prompt_flat_curve, which the
group-size advice follows, since prompts that differ leave more groups flat than one pooled
rate predicts), which weights would do better, and a verdict: ready to train, or what to
change first.

Pure numpy/pandas over the store: the pilot process is grpo_core/train/pilot.py, starting one
from the dashboard grpo_core/dashboard/pilot_start.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from grpo_core.analysis import prompt_history
from grpo_core.analysis.planner import beta_prior, min_group_size, p_trainable_binary, prompt_flat_curve
from grpo_core.analysis.reweighting import suggest_weights
from grpo_core.analysis.rollout_stats import metric_columns, per_metric_group_std, rollout_arrays, uniform_fraction
from grpo_core.analysis.run_tables import MOST_GROUPS
from grpo_core.analysis.step_stats import trainable_ratio
from grpo_core.runs.config import TASK_LEVELS
from grpo_core.runs.run_meta import RunMeta, display_status, error_line
from grpo_core.runs.store import RunStore
from grpo_core.tasks.metrics import KINDS

DEFAULT_BATCHES = 8  # pilot batches unless --set grpo.steps=N (a config's steps is its training length)
PLANNER_G_MAX = 64  # the planner's curve runs G = 2 .. this; a G beyond it is a difficulty problem
MAX_G_FACTOR = 4  # a G beyond 4x the pilot's for the key metric: a level change is the cheaper fix
EASY_SHARE = 0.5  # half the groups all-solved (or all-failed), far more than chance: the level is wrong, not G
MIN_DIVERSITY = 0.5  # fewer distinct completions per group than this: sampling too cold

KIND_LABEL = {"weights": "the reward weights", "group_size": "the group size",
              "difficulty": "the task difficulty", "temperature": "the sampling temperature"}


@dataclass
class Plan:
    """Group-size planner for one binary metric."""
    metric: str
    p: float  # measured success rate
    weight: float
    current_g: int
    current_p_trainable: float  # 1 - p^G - (1-p)^G at the pilot's G
    measured_vary: float  # share of pilot groups in which the metric varied
    g_needed: int | None  # smallest G with P(trainable) >= target (None: none up to 256)
    curve: pd.DataFrame  # columns G, p_trainable, p_trainable_prompts (G = 2 .. PLANNER_G_MAX)
    # The planner that knows prompts differ (planner.prompt_flat_curve): each prompt's own rate,
    # shrunk toward p; the pooled formula above under-predicts the flat groups when prompts differ.
    prompts: int = 0  # prompts with rollouts of this metric
    prompts_p_trainable: float | None = None  # per-prompt predicted P(trainable) at current_g
    prompts_g_needed: int | None = None  # smallest G the per-prompt curve brings to the target (None: none <= 64)


@dataclass
class Action:
    kind: str  # "weights" | "group_size" | "difficulty" | "temperature"
    text: str  # a full sentence with the numbers
    settings: dict  # what to set: {"weights": {...}} | {"group_size": 8} | {"level": 3} | {"temperature": 1.5}
    predicted_ratio: float | None = None
    metric: str | None = None  # the metric the change is about (group size, difficulty)


@dataclass
class PilotVerdict:
    ready: bool
    headline: str  # "ready to train" | "change the group size first" | ... | "no pilot data yet"
    reasons: list[str]  # the checks, with numbers
    actions: list[Action]  # what to change, the first one first


@dataclass
class PilotSummary:
    run_id: str
    status: str  # display status: created / running / finished / failed / stopped / stale
    error: str | None
    batches_done: int
    batches: int | None
    config: dict
    metrics: list[str]
    weights: dict
    group_size: int
    target: float  # the trainable ratio the plan aims for
    values: pd.DataFrame  # rollouts: step, group, idx, total, <metric>... (histograms)
    metric_table: pd.DataFrame  # index metric: kind, weight, mean, min, max, within_group_std,
    #                              uniform_fraction, uniform, success_rate
    submitted: int
    trainable: int
    ratio: float | None  # measured trainable ratio: the prediction for training
    reward_std: float | None  # mean group reward std
    uniform_metrics: list[str]
    phantom_groups: int
    solved_share: float | None  # groups where the key binary metric is 1 for every completion
    failed_share: float | None  # ... 0 for every completion
    key_metric: str | None
    diversity: float | None  # mean share of distinct completions in a group
    plans: list[Plan]
    suggestions: list[dict]  # reweighting.suggest_weights
    verdict: PilotVerdict = field(default_factory=lambda: PilotVerdict(False, "no pilot data yet", [], []))


def _metric_names(rollouts: pd.DataFrame, weights: dict) -> list[str]:
    cols = metric_columns(rollouts)
    return [m for m in weights if m in cols] + [c for c in cols if c not in weights]


def is_binary(name: str, values: np.ndarray) -> bool:
    if name in KINDS:
        return KINDS[name] == "binary"
    return len(values) > 0 and bool(np.isin(values, (0.0, 1.0)).all())


def _within_group(arrays, uniform_std: float):
    """(mean within-group std [K], share of groups where each metric is uniform [K])."""
    return (np.asarray(per_metric_group_std(arrays), dtype=float),
            np.asarray(uniform_fraction(arrays, uniform_std), dtype=float))


def planner_curve(p: float, g_max: int = PLANNER_G_MAX) -> pd.DataFrame:
    """P(a group of G has both outcomes) for G = 2 .. g_max, from planner.p_trainable_binary."""
    g = np.arange(2, g_max + 1)
    return pd.DataFrame({"G": g, "p_trainable": np.asarray(p_trainable_binary(p, g), dtype=float)})


def prompt_plan(groups: pd.DataFrame, rollouts: pd.DataFrame, metric: str, curve: pd.DataFrame,
                group_size: int, target: float) -> dict:
    """The per-prompt fields of a Plan, from each prompt's successes of `metric` in the pilot; the
    curve gets p_trainable_prompts, 1 - the per-prompt predicted flat share at each G."""
    counts = prompt_history.prompt_counts(prompt_history.group_successes(groups, rollouts, metric))
    if counts.empty:
        curve["p_trainable_prompts"] = np.nan
        return {}
    s, n = counts["successes"].to_numpy(float), counts["trials"].to_numpy(float)
    prior = beta_prior(s, n)
    curve["p_trainable_prompts"] = 1.0 - prompt_flat_curve(s, n, curve["G"].to_numpy(), prior)
    reach = curve.loc[curve["p_trainable_prompts"] >= target, "G"]
    return {"prompts": int(len(counts)), "prompts_g_needed": int(reach.iloc[0]) if len(reach) else None,
            "prompts_p_trainable": float(1.0 - prompt_flat_curve(s, n, [group_size], prior)[0])}


def _group_shares(rollouts: pd.DataFrame, metric: str) -> tuple[float, float]:
    g = rollouts.groupby(["step", "group"])[metric]
    lo, hi = g.min(), g.max()
    return float((lo >= 1.0).mean()), float((hi <= 0.0).mean())


def _diversity(rollouts: pd.DataFrame) -> float | None:
    if "completion" not in rollouts.columns or rollouts["completion"].isna().all():
        return None
    r = rollouts.dropna(subset=["completion"])
    g = r.groupby(["step", "group"])["completion"]
    return float((g.nunique() / g.size()).mean())


def _open(store) -> tuple[RunStore, bool]:
    if isinstance(store, RunStore):
        return store, False
    return RunStore.open(store, readonly=True), True


def pilot_summary(store, target: float | None = None, g_max: int = PLANNER_G_MAX) -> PilotSummary:
    """Everything the pilot page shows, from a pilot store (RunStore, run dir, db or run id).

    target: the trainable ratio to plan for (default: health.min_trainable_ratio)."""
    s, owned = _open(store)
    try:
        meta = s.get_meta()
        cfg = RunMeta.parse(meta).config
        rollouts = s.rollouts(with_text=True)
        groups = s.groups()
        run_id = s.run_id
    finally:
        if owned:
            s.close()
    grpo, reward, health = cfg.get("grpo") or {}, cfg.get("reward") or {}, cfg.get("health") or {}
    weights = {k: float(v) for k, v in (reward.get("weights") or {}).items()}
    target = float(health.get("min_trainable_ratio", 0.3) if target is None else target)
    uniform_std = float(health.get("uniform_std", 1e-3))
    metrics = _metric_names(rollouts, weights) if len(rollouts) else []
    group_size = int(groups["size"].max()) if len(groups) else int(grpo.get("group_size", 8))
    out = PilotSummary(
        run_id=run_id, status=display_status(meta), error=error_line(meta), batches_done=int(groups["step"].nunique()),
        batches=grpo.get("steps"), config=cfg, metrics=metrics, weights=weights, group_size=group_size,
        target=target, values=rollouts, metric_table=pd.DataFrame(), submitted=len(groups),
        trainable=int(groups["trainable"].sum()) if len(groups) else 0, ratio=None, reward_std=None,
        uniform_metrics=[], phantom_groups=int(groups["phantom"].sum()) if len(groups) else 0,
        solved_share=None, failed_share=None, key_metric=None, diversity=None, plans=[], suggestions=[])
    if not len(groups) or not metrics:
        return out
    out.ratio = trainable_ratio(out.submitted, out.trainable)
    out.reward_std = float(groups["reward_std"].mean())

    arrays = rollout_arrays(rollouts, metrics)  # ragged groups allowed (imported runs)
    vals = arrays.scores  # [N, K], missing scores as 0 (as the trainer scores a failed metric)
    wstd, ufrac = _within_group(arrays, uniform_std)
    binary = [is_binary(m, vals[:, k]) for k, m in enumerate(metrics)]
    table = pd.DataFrame({
        "kind": [KINDS.get(m, "binary" if b else "continuous") for m, b in zip(metrics, binary)],
        "weight": [weights.get(m, 0.0) for m in metrics],
        "mean": vals.mean(axis=0), "min": vals.min(axis=0), "max": vals.max(axis=0),
        "within_group_std": wstd, "uniform_fraction": ufrac,
        "uniform": (ufrac > MOST_GROUPS) | (wstd <= uniform_std),  # run_tables.bottlenecks' rule
        "success_rate": np.where(binary, vals.mean(axis=0), np.nan),
    }, index=pd.Index(metrics, name="metric"))
    out.metric_table = table
    out.uniform_metrics = [m for m in metrics if table.at[m, "uniform"] and table.at[m, "weight"] > 0]
    out.diversity = _diversity(rollouts)

    for k, m in enumerate(metrics):
        if not binary[k]:
            continue
        p = float(table.at[m, "success_rate"])
        curve = planner_curve(p, g_max)
        out.plans.append(Plan(m, p, weights.get(m, 0.0), group_size,
                              float(p_trainable_binary(p, group_size)), float(1.0 - ufrac[k]),
                              min_group_size(p, target), curve,
                              **prompt_plan(groups, rollouts, m, curve, group_size, target)))
    weighted_binary = [pl for pl in out.plans if pl.weight > 0]
    outcome = reward.get("outcome_metric") or ""
    key = next((pl for pl in weighted_binary if pl.metric == outcome), None) or \
        max(weighted_binary, key=lambda pl: pl.weight, default=None)
    if key is not None:
        out.key_metric = key.metric
        out.solved_share, out.failed_share = _group_shares(rollouts, key.metric)

    if any(w > 0 for w in weights.values()):
        scored = {m: w for m, w in weights.items() if m in metrics}
        out.suggestions = list(suggest_weights(arrays, scored, min_group_std=float(grpo.get("min_group_std", 0.01)),
                                                 outcome_metric=outcome or None, uniform_std=uniform_std))
    out.verdict = pilot_verdict(out)
    return out


def _fmt_weights(w: dict) -> str:
    return ", ".join(f"{k}={v:.2f}" for k, v in w.items())


def pilot_verdict(s: PilotSummary) -> PilotVerdict:
    """Ready when the measured ratio reaches the target and the mean group reward std the
    health threshold (the two checks training's health verdict makes). Otherwise the changes
    in the order to try them, first the one to make first."""
    if s.ratio is None:
        return PilotVerdict(False, "no pilot data yet", [], [])
    min_std = float((s.config.get("health") or {}).get("min_reward_std", 0.1))
    ratio_ok, std_ok = s.ratio >= s.target, s.reward_std > min_std
    reasons = [f"trainable ratio {s.ratio:.2f} ({s.trainable} of {s.submitted} groups) "
               f"{'>=' if ratio_ok else '<'} target {s.target:.2f}",
               f"mean group reward std {s.reward_std:.3f} {'>' if std_ok else '<='} {min_std:g}"]
    if s.uniform_metrics:
        reasons.append(f"uniform inside most groups (variance bottleneck): {', '.join(s.uniform_metrics)}")
    if s.phantom_groups:
        reasons.append(f"{s.phantom_groups} phantom groups: their variance is shaping terms only "
                       f"(the outcome metric is uniform in them)")
    if ratio_ok and std_ok:
        return PilotVerdict(True, "ready to train", reasons, [])
    actions = _ratio_actions(s) if not ratio_ok else _std_actions(s, min_std)
    if not actions:
        return PilotVerdict(False, "no single change reaches the target: raise the group size and the "
                            "weights of continuous metrics, or change the task", reasons, [])
    return PilotVerdict(False, f"change {KIND_LABEL[actions[0].kind]} first", reasons, actions)


def _difficulty(s: PilotSummary, easy: bool, what: str, metric: str) -> Action:
    task = s.config.get("task") or {}
    level, new_level = int(task.get("level", 1)), int(task.get("level", 1)) + (1 if easy else -1)
    if 1 <= new_level <= TASK_LEVELS.get(task.get("name", "demo"), 1):
        return Action("difficulty", f"{'raise' if easy else 'lower'} task.level from {level} to {new_level}: {what}",
                      {"level": new_level}, metric=metric)
    return Action("difficulty", f"use {'harder' if easy else 'easier'} prompts: {what}", {}, metric=metric)


def _temperature(s: PilotSummary) -> Action | None:
    """Completions repeat inside a group, so no metric can vary."""
    temp = float((s.config.get("grpo") or {}).get("temperature", 1.0))
    if s.diversity is None or s.diversity >= MIN_DIVERSITY or temp >= 2.0:
        return None
    new_t = round(min(2.0, temp + 0.5), 2)
    return Action("temperature", f"raise grpo.temperature from {temp:g} to {new_t:g}: only {s.diversity:.0%} of "
                  f"the completions in a group are distinct, so rewards cannot differ", {"temperature": new_t})


def _g_needed(pl: Plan) -> int | None:
    """The G the plan asks for: the per-prompt planner's when the pilot has per-prompt counts."""
    return pl.prompts_g_needed if pl.prompts else pl.g_needed


def _p_at(pl: Plan, g: int) -> float:
    """P(trainable) at G = g: the per-prompt curve's when there is one, else the pooled formula."""
    if pl.prompts:
        at = pl.curve.loc[pl.curve["G"] == g, "p_trainable_prompts"]
        if len(at):
            return float(at.iloc[0])
        if g == pl.current_g and pl.prompts_p_trainable is not None:
            return pl.prompts_p_trainable
    return float(p_trainable_binary(pl.p, g))


def _ratio_actions(s: PilotSummary) -> list[Action]:
    """Too few trainable groups: weights (free) when a suggestion reaches the target, then the
    group size (binary planner), the difficulty (success rate extreme, or decided by the
    prompt rather than by luck), the temperature (completions repeat)."""
    first, later = [], []
    best = max(s.suggestions, key=lambda d: d["predicted_ratio"], default=None)
    if best is not None and best["predicted_ratio"] > s.ratio + 0.02:
        a = Action("weights", f"set the weights to {_fmt_weights(best['weights'])}: predicted ratio "
                   f"{best['predicted_ratio']:.2f} (now {s.ratio:.2f}); {best.get('why', '')}".rstrip("; "),
                   {"weights": dict(best["weights"])}, float(best["predicted_ratio"]))
        (first if best["predicted_ratio"] >= s.target else later).append(a)

    G = s.group_size
    cands = [pl for pl in s.plans if pl.weight > 0 and 0 < pl.p < 1 and _g_needed(pl)
             and G < _g_needed(pl) <= PLANNER_G_MAX]
    hetero = False
    if cands:
        pl = min(cands, key=_g_needed)
        g_new = _g_needed(pl)
        now, new = _p_at(pl, G), _p_at(pl, g_new)
        text = (f"raise grpo.group_size from {G} to {g_new}: {pl.metric} succeeds {pl.p:.0%} of the time, "
                f"so a group of {G} has both outcomes with probability {now:.2f}, a group of "
                f"{g_new} with {new:.2f} (target {s.target:.2f}); it costs {g_new / G:.1f}x the "
                f"rollouts per prompt")
        if pl.prompts and abs(now - pl.current_p_trainable) >= 0.05:
            text += (f" (each of the {pl.prompts} prompts at its own rate; one pooled rate would promise "
                     f"{pl.current_p_trainable:.2f} at G = {G})")
        hetero = pl.measured_vary < 0.5 * pl.current_p_trainable
        if hetero:
            text += (f"; but {pl.metric} varied in only {pl.measured_vary:.0%} of the pilot's groups against "
                     f"{pl.current_p_trainable:.0%} expected: success depends on the prompt, so a larger group "
                     f"helps less than the formula says")
        (later if hetero else first).append(Action("group_size", text, {"group_size": g_new}, new, pl.metric))

    # Difficulty, about the key binary metric: a success rate so extreme that no G up to
    # PLANNER_G_MAX reaches the target, or far more groups all-solved/all-failed than a
    # common success rate would give (it depends on the prompt: a larger G does not help).
    key = next((pl for pl in s.plans if pl.metric == s.key_metric), None)
    if key is not None:
        extreme = key.g_needed is None or key.g_needed > MAX_G_FACTOR * G
        easy = key.p >= 0.5 if extreme else s.solved_share >= s.failed_share
        share, expected = (s.solved_share, key.p ** G) if easy else (s.failed_share, (1 - key.p) ** G)
        word = "solve" if easy else "fail"
        what = None
        if extreme:
            need = "no G up to 256" if key.g_needed is None else \
                f"G = {key.g_needed}, {key.g_needed / G:.1f}x the rollouts per prompt"
            what = (f"{key.metric} succeeds {key.p:.0%} of the time ({share:.0%} of groups {word} it in every "
                    f"completion); reaching the target ratio would take {need}")
        elif max(s.solved_share, s.failed_share) >= EASY_SHARE and key.measured_vary < 0.5 * key.current_p_trainable:
            what = (f"{share:.0%} of groups {word} {key.metric} in every completion, where a common success rate "
                    f"of {key.p:.0%} would give {expected:.0%}: it depends on the prompt, and no group size "
                    f"changes that")
        if what:  # before the group size when G cannot do it cheaply or the formula does not hold
            a = _difficulty(s, easy, what, key.metric)
            if not cands or hetero or extreme:
                at = next((i for i, x in enumerate(first) if x.kind == "group_size"), len(first))
                first.insert(at, a)
            else:
                later.append(a)

    t = _temperature(s)
    if t is not None:
        (later if first else first).append(t)
    return first + later


def _std_actions(s: PilotSummary, min_std: float) -> list[Action]:
    """Enough groups vary, but by little: the key metric's level, the temperature, then
    more weight on the metrics that do vary (the threshold is on the weighted total)."""
    out = []
    key = next((pl for pl in s.plans if pl.metric == s.key_metric), None)
    if key is not None and not 0.1 < key.p < 0.9:
        easy = key.p >= 0.9
        out.append(_difficulty(s, easy, f"{key.metric} succeeds {key.p:.0%} of the time, so it rarely separates "
                               f"the completions of a prompt and the group reward std stays at {s.reward_std:.3f}",
                               key.metric))
    t = _temperature(s)
    if t is not None:
        out.append(t)
    t = s.metric_table
    varying = (t["within_group_std"] * t["weight"].where(t["weight"] > 0, 0)).sort_values(ascending=False)
    top = [m for m in varying.index[:2] if varying[m] > 0] or list(t["within_group_std"].nlargest(2).index)
    out.append(Action("weights", "give more weight to the metrics that vary inside groups ("
                      + ", ".join(f"{m}: within-group std {t.at[m, 'within_group_std']:.3f}" for m in top)
                      + f"): the mean group reward std {s.reward_std:.3f} is at or below {min_std:g}, and it is "
                      "measured on the weighted total", {}))
    return out


def flat_shares(plan: Plan) -> dict:
    """The share of flat groups (the metric all 0 or all 1) at the pilot's G: measured, predicted
    from one pooled rate, predicted from each prompt's own rate (None without prompt counts)."""
    per = None if plan.prompts_p_trainable is None else 1.0 - plan.prompts_p_trainable
    return {"measured": 1.0 - plan.measured_vary, "pooled": 1.0 - plan.current_p_trainable, "per_prompt": per}


def planner_focus(s: PilotSummary) -> str | None:
    """The binary metric the planner should show first: the one the group-size change is
    about, else the heaviest weighted one that sometimes succeeds, else the key metric."""
    for a in s.verdict.actions:
        if a.kind == "group_size":
            return a.metric
    mixed = [pl for pl in s.plans if 0 < pl.p < 1]
    if mixed:
        return max(mixed, key=lambda pl: pl.weight).metric
    return s.key_metric or (s.plans[0].metric if s.plans else None)


def training_defaults(s: PilotSummary, weights: dict | None = None, group_size: int | None = None,
                      level: int | None = None, temperature: float | None = None) -> dict:
    """What "Start training with these settings" hands to the runs page's start form
    (st.session_state["start_form_defaults"]): the pilot's settings with the chosen changes.
    Plain keys for the form's widgets, plus `overrides` as `--set` strings for the same."""
    cfg = s.config
    model, task, grpo, reward = (cfg.get(k) or {} for k in ("model", "task", "grpo", "reward"))
    out = {
        "task": task.get("name", "demo"), "level": int(level if level is not None else task.get("level", 1)),
        "dataset": task.get("dataset", ""), "model_path": model.get("path", ""),
        "group_size": int(group_size if group_size is not None else s.group_size),
        "prompts_per_step": int(grpo.get("prompts_per_step", 8)),
        "temperature": float(temperature if temperature is not None else grpo.get("temperature", 1.0)),
        "weights": {k: float(v) for k, v in (weights if weights is not None else s.weights).items()},
        "custom": dict(reward.get("custom") or {}), "outcome_metric": reward.get("outcome_metric", ""),
        "from_pilot": s.run_id,
    }
    sets = {"task.name": out["task"], "task.level": out["level"], "task.dataset": out["dataset"],
            "model.path": out["model_path"], "grpo.group_size": out["group_size"],
            "grpo.prompts_per_step": out["prompts_per_step"], "grpo.temperature": out["temperature"],
            "reward.outcome_metric": out["outcome_metric"],
            **{f"reward.custom.{k}": v for k, v in out["custom"].items()},
            **{f"reward.weights.{k}": v for k, v in out["weights"].items()}}
    out["overrides"] = [f"{k}={v}" for k, v in sets.items() if v != ""]
    return out
