"""What ART wrote (history.jsonl, trajectory files), imported as a run.

history.jsonl has ART's own numbers; the trajectory files have every group and rollout, so
what-if and the group inspector work.

Where ART 0.5.18 writes (art.Model.log): <base_path>/<project>/models/<name>/history.jsonl, one
JSON object a line ({<split>/<metric> or <section>/<metric>: value, "step", "training_step",
"recorded_at"}, NaN left out), and trajectories/<split>/<step:04d>.parquet; ART before the
parquet files wrote trajectories/<split>/<step:04d>.jsonl (trajectory_migration.serialize_
trajectory_groups: one group a line, {"trajectories": [{reward, metrics, metadata,
messages_and_choices, ...}]}). Only the parquet files need pyarrow.
"""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations.art_steps import (
    NOT_SCORES,
    REWARD_METRIC,
    Group,
    Rollout,
    metric_scores,
    prompt_key,
    split_prompt,
    step_rows,
)
from grpo_core.integrations.base import ImportReport, SourceRun, derive_counts, number, put_value
from grpo_core.runs import names

HISTORY_SKIP = ("step", "training_step", "recorded_at", "time/wall_clock_sec")
STEP_FILE = re.compile(r"(\d+)\.(jsonl|parquet)$")


def map_art_key(key: str) -> str:
    """An ART history key -> the stored name: ART_NAMES, then ART's per-metric train means as
    reward/<metric>/mean, then ART's section names that are ours as they are, else art/<key>."""
    if key in names.ART_NAMES:
        return names.ART_NAMES[key]
    if key.startswith("train/") and key.count("/") == 1 and key[6:] not in NOT_SCORES + ("exception_rate",):
        return names.metric_mean(key[6:])
    if key.startswith("data/step_num_groups") or key.startswith("data/cum/num_groups"):
        return key
    return names.foreign("art", key)


def parse_art_history(data: bytes, filename: str) -> SourceRun:
    report = ImportReport("art", filename)
    rows: dict = {}
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        report.entries += 1
        entry = _json_line(line, filename, n, "an ART history.jsonl (one JSON object a line, with a 'step')")
        step = entry.get("step", entry.get("training_step"))
        if isinstance(step, bool) or not isinstance(step, int):
            report.skip("history line", "no integer 'step'")
            continue
        for key, v in entry.items():
            _history_value(rows, step, key, v, report)
    _fill_cumulative(rows)
    derive_counts(rows, "art", report)
    config = {"source": "art", "grpo": {"steps": max(rows) if rows else None}, "reward": {"metrics": sorted(
        {p[0] for r in rows.values() for k in r if (p := names.parse_metric_name(k))})}}
    return SourceRun(rows, config, report)


def _json_line(line: str, filename: str, n: int, want: str) -> dict:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        raise ConfigError(f"{filename}: line {n} is not JSON; expected {want}") from None
    if not isinstance(entry, dict):
        raise ConfigError(f"{filename}: line {n} is a {type(entry).__name__}; expected {want}")
    return entry


def _history_value(rows: dict, step: int, key: str, v, report: ImportReport):
    if key in HISTORY_SKIP:
        return
    x = number(v)
    if x is None:
        report.skip(f"art key {key}", "not a number")
        return
    name = map_art_key(key)
    if name != key:
        report.mapped[key] = name
    put_value(rows, step, name, x, report)


def _fill_cumulative(rows: dict):
    """Cumulative group counts where ART's history lacks them (older ART): summed per step."""
    cum = [0.0, 0.0]
    for step in sorted(rows):
        r = rows[step]
        if names.GROUPS_SUBMITTED not in r or names.GROUPS_TRAINABLE not in r:
            continue
        cum = [cum[0] + r[names.GROUPS_SUBMITTED], cum[1] + r[names.GROUPS_TRAINABLE]]
        r.setdefault(names.CUM_GROUPS_SUBMITTED, cum[0])
        r.setdefault(names.CUM_GROUPS_TRAINABLE, cum[1])
        cum = [r[names.CUM_GROUPS_SUBMITTED], r[names.CUM_GROUPS_TRAINABLE]]


def _jsonl_groups(data: bytes, filename: str) -> list[dict]:
    want = "ART trajectory groups (one {\"trajectories\": [...]} object a line)"
    groups = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if line.strip():
            entry = _json_line(line, filename, n, want)
            if not isinstance(entry.get("trajectories"), list):
                raise ConfigError(f"{filename}: line {n} has no 'trajectories' list; expected {want}")
            groups.append(entry)
    return groups


def _parquet_groups(source) -> list[dict]:
    """ART's trajectories/<split>/<step>.parquet (utils.trajectory_logging; a path or a file
    object) -> group dicts as the legacy JSONL has them."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError("reading ART's parquet trajectory files needs pyarrow (pip install pyarrow)") from None
    by_group: dict[int, dict] = {}
    for row in pq.read_table(source).to_pylist():
        grp = by_group.setdefault(row["group_index"], {"trajectories": [], "metadata": json.loads(
            row.get("group_metadata") or "{}")})
        grp["trajectories"].append({"reward": row["reward"], "metrics": json.loads(row.get("metrics") or "{}"),
                                    "metadata": json.loads(row.get("metadata") or "{}"),
                                    "messages_and_choices": row.get("messages") or []})
    return [by_group[k] for k in sorted(by_group)]


def _dict_group(d: dict, metrics: list[str], filename: str) -> Group:
    rollouts, prompt, meta = [], "", dict(d.get("metadata") or {})
    for t in d["trajectories"]:
        reward = number(t.get("reward"))
        if reward is None:
            raise ConfigError(f"{filename}: a trajectory's reward is {t.get('reward')!r}; ART writes a number")
        msgs = [m.get("message", m) if isinstance(m, dict) else {} for m in t.get("messages_and_choices") or []]
        prompt, text = split_prompt(msgs)
        rollouts.append(Rollout(reward, metric_scores(t.get("metrics") or {}, metrics, reward), text))
        meta = meta or dict(t.get("metadata") or {})
    return Group(prompt_key(meta, prompt), rollouts, prompt=prompt or None)


def _dict_metrics(groups: list[dict]) -> list[str]:
    out = [REWARD_METRIC]
    for g in groups:
        for t in g["trajectories"]:
            out += [k for k, v in (t.get("metrics") or {}).items() if k not in out and k not in NOT_SCORES
                    and number(float(v) if isinstance(v, bool) else v) is not None]
    return out


def trajectory_steps(files: dict[int, list[dict]], filename: str, report: ImportReport):
    """{step: group dicts} -> (scalars by step, step_data, metrics) in ART's counts."""
    metrics = _dict_metrics([g for gs in files.values() for g in gs])
    weights = {m: float(m == REWARD_METRIC) for m in metrics}
    rows, step_data, cum = {}, {}, (0, 0)
    for step in sorted(files):
        groups = [_dict_group(d, metrics, filename) for d in files[step]]
        scalars, step_groups, rollouts, _ = step_rows(groups, metrics, weights, cum)
        cum = (int(scalars[names.CUM_GROUPS_SUBMITTED]), int(scalars[names.CUM_GROUPS_TRAINABLE]))
        rows[step], step_data[step] = scalars, (step_groups, rollouts)
        report.entries += len(groups)
    return rows, step_data, metrics


def _step_of(filename: str) -> int:
    m = STEP_FILE.search(Path(filename).name)
    if not m:
        raise ConfigError(f"{filename}: an ART trajectory file is named after its step (e.g. 0003.jsonl, as ART "
                          "writes trajectories/train/<step>.jsonl); rename it so")
    return int(m.group(1))


def _art_parsed(rows, step_data, metrics, report, extra_config: dict | None = None) -> SourceRun:
    report.note("trainable = ART's rule: more than one trajectory and rewards not all equal; ratio = "
                "trainable / submitted groups; frac_reward_zero_std = 1 - ratio")
    report.note(f"scores per trajectory: {', '.join(metrics)} ('reward' is trajectory.reward itself)")
    config = {"source": "art", "grpo": {"steps": max(rows) if rows else None},
              "reward": {"weights": {m: float(m == REWARD_METRIC) for m in metrics}, "outcome_metric": ""},
              **(extra_config or {})}
    # step_data: step -> (StepGroups, StepRollouts), so what-if and the inspector work on the import.
    return SourceRun(rows, config, report, groups=step_data, lacks=[] if step_data else ["groups", "rollouts"])


def parse_art(data: bytes, filename: str) -> SourceRun:
    """The import kind `art`: an ART history.jsonl, or one trajectory file (legacy JSONL or
    parquet) named after its step. Which one: from the content."""
    if data[:4] == b"PAR1":
        files = {_step_of(filename): _parquet_groups(io.BytesIO(data))}
    else:
        first = next((ln for ln in data.decode("utf-8", errors="replace").splitlines() if ln.strip()), "")
        if '"trajectories"' not in first:
            return parse_art_history(data, filename)
        files = {_step_of(filename): _jsonl_groups(data, filename)}
    report = ImportReport("art", filename)
    rows, step_data, metrics = trajectory_steps(files, filename, report)
    return _art_parsed(rows, step_data, metrics, report)


def parse_art_dir(path: str | Path) -> SourceRun:
    """An ART model output dir (<base_path>/<project>/models/<name>): history.jsonl for ART's
    own numbers, trajectories/train/* for the groups and rollouts (what-if, inspector). Where
    both give group counts, history's are kept (ART's own; a group every trajectory of which
    raised is in history's count but not in the trajectory files)."""
    root = Path(path)
    traj = sorted(p for p in (root / "trajectories" / "train").glob("*") if STEP_FILE.search(p.name))
    hist = root / "history.jsonl"
    if not hist.is_file() and not traj:
        raise ConfigError(f"{root}: expected an ART model output dir (history.jsonl and/or trajectories/train/"
                          "<step>.jsonl|parquet), found neither")
    report = ImportReport("art", str(root))
    files = {_step_of(p.name): (_parquet_groups(p) if p.suffix == ".parquet" else
                                _jsonl_groups(p.read_bytes(), str(p))) for p in traj}
    rows, step_data, metrics = trajectory_steps(files, str(root), report) if files else ({}, {}, [REWARD_METRIC])
    if hist.is_file():
        history = parse_art_history(hist.read_bytes(), str(hist))
        _merge_history(rows, history, report)
    return _art_parsed(rows, step_data, metrics, report, {"art": {"output_dir": str(root)}})


def _merge_history(rows: dict, history: SourceRun, report: ImportReport):
    report.entries += history.report.entries
    report.mapped.update(history.report.mapped)
    for what, n in history.report.skipped.items():
        report.skipped[what] = report.skipped.get(what, 0) + n
    for step, hrow in history.scalars.items():
        row = rows.setdefault(step, {})
        for name in (names.GROUPS_SUBMITTED, names.GROUPS_TRAINABLE):
            # The trajectory files hold the batch trained on: not the groups a PipelineTrainer dropped.
            said = hrow.get(name, 0) - (hrow.get(names.GROUPS_FILTERED, 0) if name == names.GROUPS_SUBMITTED else 0)
            if name in row and name in hrow and row[name] != said:
                report.note(f"step {step}: history.jsonl says {name} {said:g}, the trajectory file has "
                            f"{row[name]:g} groups with trajectories; history's counts kept")
        row.update(hrow)
