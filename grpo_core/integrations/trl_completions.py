"""Import TRL's `log_completions` parquet files: per-group data for a TRL run.

With `GRPOConfig(log_completions=True)` TRL 1.x writes, at every logging step s,
`<output_dir>/completions/completions_{s:05d}.parquet` (GRPOTrainer.log): one row per
completion of the *last generation batch* before s (its `_logs` deques hold
generation_batch_size rows), columns `step, prompt, completion, <one per reward
function>, <log_extra columns>, advantage`. The rows are in TRL's group order: the
num_generations completions of a prompt are consecutive (RepeatSampler), which is how TRL
itself groups them (`rewards.view(-1, num_generations)`).

So a step's groups, rollouts and per-function scores can be rebuilt, and what-if and the
group inspector work on the run. Trainability is TRL's rule in TRL's arithmetic (float32
weighted nansum, Bessel nanstd, zero-std when within 1e-8 of 0), so the ratio equals
1 - frac_reward_zero_std that TRL logged for that step when one generation batch makes the
step (logging_steps 1, steps_per_generation = gradient_accumulation_steps, TRL's default).

What the files do not say, and the importer asks for or assumes (reported): the reward
weights (TRL's default: 1 each), and which numeric columns are reward functions rather
than log_extra columns (default: every numeric column between `completion` and
`advantage`).
"""
from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from grpo_core.analysis import step_stats
from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.runs import names
from grpo_core.runs.step_columns import StepGroups, StepRollouts

FIXED = ("step", "prompt", "completion", "advantage")


def read_frames(path: Path) -> list[tuple[str, object]]:
    """A completions_*.parquet, a completions/ folder or a TRL output dir -> [(file, frame)]."""
    p = Path(path)
    if p.is_dir():
        d = p / "completions" if (p / "completions").is_dir() else p
        files = sorted(d.glob("completions_*.parquet"))
        if not files:
            raise ConfigError(f"{p}: no completions_*.parquet (TRL writes them to <output_dir>/completions/ "
                              "with log_completions=True)")
        return [(str(f), read_frame(f.read_bytes(), str(f))) for f in files]
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    return [(str(p), read_frame(p.read_bytes(), str(p)))]


def read_frame(data: bytes, filename: str) -> pd.DataFrame:
    try:
        import pyarrow  # noqa: F401 - pandas reads parquet through it
    except ImportError:
        raise ConfigError(f"{filename}: reading parquet needs pyarrow (pip install pyarrow; TRL's datasets "
                          "dependency installs it)") from None
    try:
        return pd.read_parquet(io.BytesIO(data))
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not parquet
        raise ConfigError(f"{filename}: expected TRL's completions parquet (log_completions=True), but it is "
                          f"not a parquet file ({type(e).__name__})") from None


def reward_columns(df, filename: str, wanted: list[str] | None) -> list[str]:
    """The reward-function columns: `wanted`, or every numeric column between completion
    and advantage (TRL writes rewards there, then log_extra columns)."""
    missing = [c for c in ("step", "prompt", "completion", "advantage") if c not in df.columns]
    if missing:
        raise ConfigError(f"{filename}: expected TRL's completions parquet (columns step, prompt, completion, "
                          f"<reward functions>, advantage); missing {', '.join(missing)}")
    if wanted:
        absent = [c for c in wanted if c not in df.columns]
        if absent:
            raise ConfigError(f"{filename}: reward function(s) {', '.join(absent)} not among the columns "
                              f"({', '.join(map(str, df.columns))}); fix reward_funcs")
        return list(wanted)
    cols = list(df.columns)
    between = cols[cols.index("completion") + 1:cols.index("advantage")]
    fns = [c for c in between if df[c].dtype.kind in "fiub"]
    if not fns:
        raise ConfigError(f"{filename}: no numeric reward columns between completion and advantage")
    return fns


def group_size(prompts: list[str], filename: str, given: int | None) -> int:
    """num_generations: given, or the gcd of the runs of equal consecutive prompts (two
    groups of one prompt side by side make a run of 2G: the gcd is still G)."""
    n = len(prompts)
    if given:
        if n % given:
            raise ConfigError(f"{filename}: {n} rows is not a multiple of group_size {given}; fix group_size")
        return given
    runs, start = [], 0
    for i in range(1, n + 1):
        if i == n or prompts[i] != prompts[start]:
            runs.append(i - start)
            start = i
    g = 0
    for r in runs:
        g = math.gcd(g, r)
    if g < 2:
        raise ConfigError(f"{filename}: cannot tell the group size (a prompt appears once in a row); "
                          "pass group_size = num_generations")
    return g


def trl_zero_std(totals32: np.ndarray) -> np.ndarray:
    """[P, G] float32 rewards -> [P] bool: TRL's zero-std test (torch.isclose(nanstd, 0):
    Bessel-corrected std over the scorable completions within 1e-8 of 0; fewer than two
    scorable: NaN std, not zero)."""
    x = totals32.astype(np.float32)
    count = np.isfinite(x).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nansum(x, axis=1, dtype=np.float32) / count.astype(np.float32)
        var = np.nansum((x - mean[:, None]) ** 2, axis=1, dtype=np.float32) / count.astype(np.float32)
        var = np.where(count > 1, var * (count / np.maximum(count - 1, 1)).astype(np.float32), np.nan)
    std = np.sqrt(var)
    return np.abs(std) <= 1e-8


def step_data(df, fns: list[str], weights: dict, g: int, report, cum: list[float]):
    """One step's rows -> (scalars, StepGroups, StepRollouts), TRL's rule for trainable."""
    scores = df[fns].to_numpy(np.float64)
    w = np.array([weights.get(f, 1.0) for f in fns], np.float32)
    s32 = scores.astype(np.float32)
    totals = np.nansum(s32 * w[None, :], axis=1, dtype=np.float32)
    totals[np.isnan(s32).all(axis=1)] = np.nan
    p = len(df) // g
    zero = trl_zero_std(totals.reshape(p, g))
    t64 = totals.astype(np.float64)
    stats = step_stats.group_stats(t64.reshape(p, g), scores.reshape(p, g, -1), min_group_std=0.0, nonzero=~zero)
    scalars = step_stats.step_scalars(stats, scores.reshape(p, g, -1), fns, {f: float(x) for f, x in zip(fns, w)},
                                  *cum)
    cum[:] = [scalars[names.CUM_GROUPS_SUBMITTED], scalars[names.CUM_GROUPS_TRAINABLE]]
    scalars[names.FRAC_REWARD_ZERO_STD] = float(zero.mean())
    with np.errstate(all="ignore"):
        scalars[names.REWARD] = float(np.nanmean(t64)) if np.isfinite(t64).any() else math.nan
    prompts = [str(x) for x in df["prompt"].tolist()]
    groups = StepGroups(np.arange(p), [prompt_hash(prompts[i * g]) for i in range(p)], g, stats.mean, stats.std,
                        stats.trainable, stats.phantom, prompt_text=[prompts[i * g] for i in range(p)])
    errors = [None if np.isfinite(r).all() else ", ".join(f"{f}: returned None" for f, v in zip(fns, r)
                                                           if not np.isfinite(v)) for r in scores]
    rollouts = StepRollouts(fns, np.arange(len(df)) // g, np.arange(len(df)) % g, t64, scores,
                            [str(c) for c in df["completion"].tolist()], errors)
    return scalars, groups, rollouts


def prompt_hash(prompt: str) -> str:
    return hashlib.sha1(prompt.encode()).hexdigest()[:12]


def _text(x) -> str:
    """A prompt/completion as TRL wrote it (a string, or a conversation: a list of messages)."""
    if isinstance(x, str):
        return x
    try:
        msgs = list(x)
    except TypeError:
        return str(x)
    if msgs and all(isinstance(m, dict) and "content" in m for m in msgs):
        return "\n".join(str(m.get("content", "")) for m in msgs)
    return str(x)


def parse_completions_file(data: bytes, filename: str, group_size: int | None = None,
                           reward_funcs: list[str] | None = None, reward_weights: dict | None = None) -> SourceRun:
    """One completions_*.parquet's bytes (the upload form) -> SourceRun."""
    return parse_completions([(filename, read_frame(data, filename))], filename, group_size, reward_funcs,
                             reward_weights)


def read_completions(path, group_size: int | None = None, reward_funcs: list[str] | None = None,
                     reward_weights: dict | None = None) -> SourceRun:
    """A completions_*.parquet, a completions/ folder or a TRL output dir -> SourceRun."""
    return parse_completions(read_frames(path), str(path), group_size, reward_funcs, reward_weights)


def parse_completions(frames: list, label: str, group_size_: int | None = None,
                      reward_funcs: list[str] | None = None, reward_weights: dict | None = None) -> SourceRun:
    """[(file, frame)] -> SourceRun with per-step groups and rollouts (SourceRun.groups)."""
    report = ImportReport("trl-completions", label)
    rows, data, cum, fns, g = {}, {}, [0.0, 0.0], None, None
    for filename, df in frames:
        fns = reward_columns(df, filename, reward_funcs) if fns is None else fns
        df = df.assign(prompt=[_text(x) for x in df["prompt"]], completion=[_text(x) for x in df["completion"]])
        for step, part in sorted(df.groupby("step", sort=True), key=lambda kv: int(kv[0])):
            report.entries += len(part)
            g = group_size(part["prompt"].tolist(), filename, group_size_)
            step = int(step)
            if step in data:
                report.skip(f"step {step}", "in two files: the later file kept")
            scalars, groups, rollouts = step_data(part.reset_index(drop=True), fns, reward_weights or {}, g,
                                                  report, cum)
            rows[step], data[step] = scalars, (groups, rollouts)
    extra = [c for df in frames[:1] for c in df[1].columns if c not in FIXED and c not in fns]
    if extra:
        report.skip(f"columns {', '.join(map(str, extra))}", "not reward functions (log_extra columns?): not "
                    "imported; pass reward_funcs to count them as rewards")
    _notes(report, fns, reward_weights, g, len(rows))
    config = {"source": "trl-completions", "grpo": {"steps": max(rows) if rows else None, "group_size": g},
              "reward": {"metrics": fns, "weights": {f: float((reward_weights or {}).get(f, 1.0)) for f in fns}}}
    return SourceRun(rows, config, report, groups=data, lacks=[])


def _notes(report, fns, reward_weights, g, n_steps):
    report.note(f"reward functions: {', '.join(fns)} (the numeric columns between completion and advantage, "
                "unless reward_funcs was given)")
    if not reward_weights:
        report.note("reward weights 1 each (TRL's default): the parquet does not record reward_weights; pass "
                    "them if the run set others")
    report.note(f"group size {g}: consecutive rows with the same prompt (TRL's group order)")
    report.note(f"{n_steps} steps with completions: TRL writes the last generation batch at each logging step "
                "only, so with logging_steps > 1 the steps between are not in the files and cumulative counts "
                "cover the logged batches; trainable = TRL's rule (rewards not all equal, float32, std <= 1e-8)")
