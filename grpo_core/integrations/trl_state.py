"""TRL's logged names -> ours, and a TRL run's trainer_state.json (or its output dir) as a run.

Names are mapped to names.py's only where the definitions agree. Where they do not, the
value is kept under a distinct name, because two curves with one name and two meanings
is worse than a missing curve:
- TRL's `frac_reward_zero_std` is the share of groups whose reward std is 0, so the
  trainable ratio is 1 - it (TRL's own rule: a group trains iff its rewards are not all
  equal; our default threshold 0.01 is stricter).
- TRL's `reward_std` is, from TRL 0.27, the std over *all* completions of the step, not the
  mean within-group std that `train/reward_std` is -> `trl/reward_std`; where the keys say
  the log is TRL 0.14-0.17's (TrlStyle), it is that group std -> `train/reward_std`.
- `rewards/<fn>/mean|std` (and TRL 0.14-0.16's `rewards/<fn>`) are reward functions; any
  other `rewards/...` key is a user's own scalar, kept under trl/ and reported.
- TRL's `rewards/<fn>/std` likewise -> `reward/<fn>/batch_std`; `rewards/<fn>/mean` is a
  plain mean -> `reward/<fn>/mean`.
- TRL averages every logged value over its logging interval (`logging_steps`); so is
  the ratio here, and cumulative counts weight each entry by the steps it covers. When
  max_steps is not a multiple of logging_steps, the last window's values come in the
  run-totals entry (GRPOTrainer.log merges its metrics into the train_runtime log): they
  are imported at that entry's step, the last one.

The live TRL callback (trl.py), the W&B and TensorBoard readers (scalar_history.py) and the
terminal transcript reader (trl_logs.py) use the same mapping.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun, number, put_value
from grpo_core.integrations.trl_completions import parse_completions, read_frames
from grpo_core.runs import names

TRL_SUMMARY_KEYS = ("train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second",
                    "total_flos")
TRL_FN = re.compile(r"^rewards/(.+)/(mean|std)$")
TRL_FN_OLD = re.compile(r"^rewards/([^/]+)$")  # TRL 0.14-0.16: rewards/<fn> is the function's mean


@dataclass(frozen=True)
class TrlStyle:
    """What a log's keys say about the TRL that wrote it (trainer_state holds no version).
    old_fn_names: `rewards/<fn>` is a reward function's mean (TRL 0.14-0.16 logged that form;
    from 0.17 TRL logs `rewards/<fn>/mean` and `/std`, so a bare `rewards/<x>` is a user's own
    scalar). group_reward_std: `reward_std` is the mean within-group std (TRL 0.14-0.21
    always; 0.22-0.26 with scale_rewards 'group'; the batch std from 0.27): told only where the
    keys pin the version (0.14-0.16's names, or 0.17's /mean keys without the
    frac_reward_zero_std that every TRL from 0.18 logs)."""
    old_fn_names: bool = True
    group_reward_std: bool = False
    era: str | None = None  # "TRL 0.14-0.16" / "TRL 0.17" where the keys say so


def trl_style(keys) -> TrlStyle:
    """The TrlStyle of a log whose keys (over every entry) are `keys`."""
    keys = set(keys)
    new = any(TRL_FN.match(k) for k in keys)
    old = not new and (any(TRL_FN_OLD.match(k) for k in keys) or
                       ("completion_length" in keys and "completions/mean_length" not in keys))
    if old and "reward_std" in keys:
        return TrlStyle(True, True, "TRL 0.14-0.16")
    if new and "reward_std" in keys and "frac_reward_zero_std" not in keys:
        return TrlStyle(False, True, "TRL 0.17")
    return TrlStyle(old_fn_names=not new)


# ---- names in a log entry (trainer_state.json log_history, or TRL's on_log) ----------------------
def trl_reward_fn(key: str, old_names: bool = True) -> tuple[str, str] | None:
    """(function, 'mean'|'std') for TRL's per-function reward keys; the old spelling
    `rewards/<fn>` only where `old_names` (the log is TRL 0.14-0.16's: TrlStyle)."""
    m = TRL_FN.match(key)
    if m:
        return m.group(1), m.group(2)
    m = TRL_FN_OLD.match(key) if old_names else None
    return (m.group(1), "mean") if m else None


def map_trl_key(key: str, live: bool = False, style: TrlStyle | None = None) -> str:
    """A TRL log key -> the stored name. `live`: our own numbers for this step exist (the
    TRL callback computes them from every rollout), so TRL's reward numbers are kept
    alongside under trl/ names rather than overwriting ours. `style`: what the whole log
    says (trl_style); None: one key alone (old reward names counted, reward_std TRL 1.x's)."""
    m = trl_reward_fn(key, style is None or style.old_fn_names)
    if m:
        fn, stat = m
        if stat == "std":
            return names.metric_batch_std(fn)
        return names.foreign("trl", key) if live else names.metric_mean(fn)
    if live and key in ("reward", "frac_reward_zero_std"):
        return names.foreign("trl", key)
    if key == "reward_std" and style is not None and style.group_reward_std and not live:
        return names.REWARD_STD
    return names.TRL_NAMES.get(key) or names.foreign("trl", key)


def is_trl_summary(entry: dict) -> bool:
    return any(k in entry for k in TRL_SUMMARY_KEYS)


def map_trl_entry(entry: dict, report: ImportReport, live: bool = False, style: TrlStyle | None = None,
                  group_size: int | None = None) -> dict[str, float]:
    """One TRL log entry (without `step`) -> {stored name: value}; non-numbers reported.
    Old TRL's reward_std (Bessel-corrected group stds) becomes our population std where
    the group size is known."""
    out = {}
    for key, v in entry.items():
        if key == "step":
            continue
        x = number(v)
        if x is None:
            why = "logged as null (TRL logs null when no value was valid)" if v is None else "not a number"
            report.skip(f"trl key {key}", why)
            continue
        name = map_trl_key(key, live, style)
        if name != key:
            report.mapped[key] = name
        if name == names.REWARD_STD and group_size and group_size > 1:
            x *= math.sqrt((group_size - 1) / group_size)
        out[name] = x
    return out


def style_notes(report: ImportReport, style: TrlStyle, keys: set[str], group_size: int | None):
    """Say what the keys told: which TRL, what reward_std is, which rewards/ keys are not functions."""
    if style.group_reward_std:
        exact = (f"scaled by sqrt((G-1)/G) with group_size {group_size} to our population std" if group_size else
                 "as logged: Bessel-corrected (n-1), so larger than our population std by sqrt(G/(G-1)) "
                 "(1.15 at G=4, 1.03 at G=16; pass group_size = num_generations for the exact value)")
        report.note(f"the keys are {style.era}'s (which logged reward_std as the mean within-group reward std): "
                    f"reward_std stored as {names.REWARD_STD}, {exact}")
    own = sorted(k for k in keys if k.startswith("rewards/") and trl_reward_fn(k, style.old_fn_names) is None)
    if own:
        report.note(f"{', '.join(own)}: not a reward function's key (TRL logs rewards/<fn>/mean and /std, and "
                    "rewards/<fn> only before 0.17): kept as plain scalars under trl/, not counted as reward functions")


def trl_notes(report: ImportReport, fns: list[str], style: TrlStyle | None = None):
    report.note("trainable ratio = 1 - frac_reward_zero_std (TRL's rule: a group trains iff its rewards are "
                "not all equal). That holds for TRL's default scale_rewards='group' (and 'none'); with "
                "scale_rewards='batch' or multi_objective_aggregation='normalize_then_sum' TRL's "
                "frac_reward_zero_std measures the whole batch, not groups")
    if style is None or not style.group_reward_std:
        report.note("TRL's reward_std is the std over all completions of a step from TRL 0.27 (and with "
                    "scale_rewards='batch'); TRL 0.14-0.21, and 0.22-0.26 with scale_rewards='group', logged the "
                    "mean within-group std. Where the keys do not say which TRL wrote them it is kept as "
                    "trl/reward_std, not train/reward_std")
    if fns:
        report.note("TRL's rewards/<fn>/std is the std over all completions, not within groups: kept as "
                    "reward/<fn>/batch_std (no reward/<fn>/group_std: it needs per-group data)")


def derive_trl(rows: dict, report: ImportReport, groups_per_step: int | None, logging_steps: int | None,
               carry: list | None = None):
    """Ratio per step and cumulative from frac_reward_zero_std. Each logged value is TRL's
    mean over the steps since the previous entry, so cumulative sums weight by those steps.
    `carry` (watch: rows come in pieces): [prev, cum_w, cum_t, no_frac] in, and out."""
    prev, cum_w, cum_t, no_frac = carry or (0, 0.0, 0.0, 0)
    for step in sorted(rows):
        row = rows[step]
        frac = row.get(names.FRAC_REWARD_ZERO_STD)
        if frac is None or math.isnan(frac):
            no_frac += 1
            continue
        n = max(step - prev, 1)
        prev = step
        ratio = 1.0 - frac
        cum_w += n
        cum_t += n * ratio
        row[names.TRAINABLE_RATIO] = ratio
        row[names.CUM_TRAINABLE_RATIO] = cum_t / cum_w
        if groups_per_step:  # an entry's counts cover its n steps: sums over entries are the run's totals
            row[names.GROUPS_SUBMITTED] = float(groups_per_step * n)
            row[names.GROUPS_TRAINABLE] = groups_per_step * n * ratio
            row[names.CUM_GROUPS_SUBMITTED] = groups_per_step * cum_w
            row[names.CUM_GROUPS_TRAINABLE] = groups_per_step * cum_t
    if carry is not None:
        carry[:] = [prev, cum_w, cum_t, no_frac]
    if no_frac:
        report.note(f"{no_frac} steps have no frac_reward_zero_std: no trainable ratio at those steps")
    if logging_steps and logging_steps > 1:
        report.note(f"logging_steps = {logging_steps}: each value is TRL's mean over the {logging_steps} steps "
                    "ending at its step; the cumulative ratio weights each entry by the steps it covers")
    if groups_per_step:
        report.note(f"group counts computed with {groups_per_step} groups per step; an entry's counts cover the "
                    "steps since the previous entry, and a ratio averaged over them gives a fractional trainable count")
    elif any(names.TRAINABLE_RATIO in r for r in rows.values()):
        report.note("groups per step unknown: TRL logs only the fraction of zero-std groups, and the file records "
                    "neither num_generations nor the generation batch size, so there are ratios but no group "
                    "counts (pass groups_per_step = generation_batch_size / num_generations to get them)")


def trl_args(config: dict, report: ImportReport) -> dict:
    """What a TRL run's training arguments (transformers logs every one to W&B and
    TensorBoard) tell: groups per optimizer step, logging interval, and whether
    frac_reward_zero_std is a per-group number under its settings."""
    out: dict = {"logging_steps": config.get("logging_steps")}
    scale, agg = config.get("scale_rewards"), config.get("multi_objective_aggregation")
    if scale is False or str(scale) == "batch" or agg == "normalize_then_sum":
        out["group_level"] = False
    g, gbs = config.get("num_generations"), config.get("generation_batch_size")
    ga, spg = config.get("gradient_accumulation_steps") or 1, config.get("steps_per_generation") or 1
    if isinstance(g, int) and isinstance(gbs, int) and g > 0 and gbs % g == 0 and ga % spg == 0 and \
            (config.get("num_iterations") or 1) == 1:
        out["groups_per_step"] = gbs // g * (ga // spg)  # generations per optimizer step = ga / spg
        report.note(f"groups per step = {out['groups_per_step']} from the run's config (generation_batch_size "
                    f"{gbs} / num_generations {g}, {ga // spg} generation(s) per optimizer step)")
    return out


# ---- trainer_state.json: its log_history ---------------------------------------------------------
def parse_trl_state(data: bytes, filename: str, groups_per_step: int | None = None,
                    group_size: int | None = None) -> SourceRun:
    want = "a TRL trainer_state.json (a JSON object with a 'log_history' list)"
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{filename}: expected {want}, but it is not JSON ({type(e).__name__})") from None
    report = ImportReport("trl", filename)
    if isinstance(state, list) and state and all(isinstance(e, dict) for e in state[:50]):
        report.note("a bare log_history list (no trainer_state around it): no max_steps, logging_steps or "
                    "global_step in the file, so whether the run finished cannot be told")
        state = {"log_history": state}
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        keys = ", ".join(list(state)[:6]) if isinstance(state, dict) else type(state).__name__
        raise ConfigError(f"{filename}: expected {want}, or its log_history as a JSON list of entries; "
                          f"found no log_history (top level: {keys})")
    top = {k: v for k, v in state.items() if k != "log_history" and (v is None or isinstance(v, (int, float, str, bool)))}
    return parse_trl_history(state["log_history"], top, report, groups_per_step, group_size)


def history_step(entry, report: ImportReport) -> int | None:
    """A log entry's integer step, or None (reported) when it has none."""
    if not isinstance(entry, dict):
        report.skip("log entry", f"not an object ({type(entry).__name__})")
        return None
    step = entry.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
        report.skip("log entry", "no integer 'step'")
        return None
    return int(step)


def split_summary(entry: dict, summary: dict, report: ImportReport) -> dict | None:
    """The run-totals entry -> its totals into `summary`; returns the last logging window's
    metrics (with the step) where TRL put them there, else None."""
    totals = {k: v for k, v in entry.items() if k in TRL_SUMMARY_KEYS or k.startswith("train_") or k == "epoch"}
    summary.update(totals)
    window = {k: v for k, v in entry.items() if k not in totals}
    if set(window) <= {"step"}:
        report.skip("summary entry", "run totals (train_runtime, train_loss, ...): kept in meta.summary, "
                    "not a training step")
        return None
    report.note(f"the last logging window (the steps after the last log entry, up to step {window['step']}) came "
                "with the run totals (TRL logs it there when max_steps is not a multiple of logging_steps): imported "
                f"at step {window['step']}; the totals are in meta.summary")
    return window


def parse_trl_history(history: list, top: dict, report: ImportReport, groups_per_step: int | None,
                      group_size: int | None = None) -> SourceRun:
    """TRL log entries (each with its `step`) -> SourceRun: trainer_state.json's log_history,
    a bare list, or the dicts of a terminal transcript (trl_logs.py). `top`: what is known
    of the run (max_steps, logging_steps, global_step)."""
    rows: dict = {}
    summary: dict = {}
    fns: set[str] = set()
    eval_entries = no_reward = 0
    keys = {k for e in history if isinstance(e, dict) for k in e if not k.startswith("eval_")}
    style = trl_style(keys)
    for entry in history:
        report.entries += 1
        step = history_step(entry, report)
        if step is None:
            continue
        if is_trl_summary(entry):
            entry = split_summary(entry, summary, report)
            if entry is None:
                continue
        if any(k.startswith("eval_") for k in entry):
            eval_entries += 1  # evaluation metrics: kept under trl/eval_* at their step
        elif not any(k in entry for k in ("reward", "frac_reward_zero_std")):
            no_reward += 1
        fns |= {m[0] for m in (trl_reward_fn(k, style.old_fn_names) for k in entry) if m}
        for name, v in map_trl_entry(entry, report, style=style, group_size=group_size).items():
            put_value(rows, step, name, v, report)
    if eval_entries:
        report.note(f"{eval_entries} evaluation entries: their metrics are kept as trl/eval_* at their step")
    if no_reward:
        report.note(f"{no_reward} training entries carry no reward keys (reward, frac_reward_zero_std)")
    trl_notes(report, sorted(fns), style)
    style_notes(report, style, keys, group_size)
    derive_trl(rows, report, groups_per_step, top.get("logging_steps"))
    config = {"source": "trl", "grpo": {"steps": top.get("max_steps"), "prompts_per_step": groups_per_step},
              "reward": {"metrics": sorted(fns)}, "trl": top}
    if group_size:
        config["grpo"]["group_size"] = group_size
    last, planned = (top.get(k) if isinstance(top.get(k), int) and not isinstance(top.get(k), bool) else None
                     for k in ("global_step", "max_steps"))
    # The end record: the run totals TRL logs when train() returns, or the trainer's own state
    # (global_step, max_steps: not a log that stops) saying every planned step was taken.
    done = bool(summary) or (last is not None and planned is not None and last >= planned)
    return SourceRun(rows, config, report, summary, finished=True if done else None, last_step=last,
                     planned=planned)


# ---- a TRL output dir: the newest trainer_state.json and completions/*.parquet --------------------
def newest_trainer_state(path: Path) -> Path | None:
    """The newest trainer_state.json of a TRL output dir: TRL writes one at each checkpoint
    (checkpoint-N/trainer_state.json) and at the end in the dir itself."""
    states = sorted(path.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    return path / "trainer_state.json" if (path / "trainer_state.json").is_file() else (states[-1] if states else None)


def read_trl_path(path, groups_per_step: int | None = None, group_size: int | None = None) -> SourceRun:
    """A TRL output dir (or its trainer_state.json): the scalars of the newest trainer_state,
    and each step's groups and rollouts from completions/*.parquet (log_completions=True),
    which TRL writes as it logs, between checkpoints too."""
    path = Path(path)
    state = newest_trainer_state(path) if path.is_dir() else path
    has_completions = path.is_dir() and any((path / "completions").glob("completions_*.parquet"))
    if state is None and not has_completions:
        raise ConfigError(f"{path}: no trainer_state.json yet and no completions/*.parquet (TRL writes the first "
                          "at each checkpoint, the second with log_completions=True)")
    if state is not None and not state.is_file():
        raise ConfigError(f"{state}: file not found")
    run = parse_trl_state(state.read_bytes(), str(state), groups_per_step, group_size) if state is not None else None
    if not has_completions:
        return run
    groups = parse_completions(read_frames(path), str(path), group_size)
    if run is None:
        return groups
    for step, row in groups.scalars.items():  # the groups' own counts and means win over TRL's averages
        run.scalars.setdefault(step, {}).update(row)
    run.groups, run.lacks = groups.groups, []
    run.config["reward"] = groups.config["reward"]
    run.config.setdefault("grpo", {}).update({k: v for k, v in groups.config["grpo"].items() if k == "group_size"})
    return run
