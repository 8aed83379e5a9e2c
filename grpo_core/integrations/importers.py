"""Import a run another trainer logged -> a run store: TRL's trainer_state.json (or its
log_history saved as a bare JSON list), a TRL/Unsloth terminal transcript (trl_logs.py),
TRL's log_completions parquet files (trl_completions.py), TensorBoard event files
(tensorboard_logs.py), a W&B run file (run-*.wandb, read locally) or a CSV exported from
the W&B UI.

Most imported runs have scalars only: no per-group rows and no rollouts, so no what-if and
no group inspector (TRL's completions parquet is the exception: it has both). Its meta says so (`lacks`), and `import_report` says what was read,
how every source name was mapped, and everything that was not imported and why:
nothing is dropped silently.

Names are mapped to names.py's only where the definitions agree. Where they do not, the
value is kept under a distinct name, because two curves with one name and two meanings
is worse than a missing curve:
- TRL's `frac_reward_zero_std` is the share of groups whose reward std is 0, so the
  trainable ratio is 1 - it (TRL's own rule: a group trains iff its rewards are not all
  equal; our default threshold 0.01 is stricter).
- TRL 1.x's `reward_std` is the std over *all* completions of the step, not the mean
  within-group std that `train/reward_std` is -> `trl/reward_std`.
- TRL's `rewards/<fn>/std` likewise -> `reward/<fn>/batch_std`; `rewards/<fn>/mean` is a
  plain mean -> `reward/<fn>/mean`.
- TRL averages every logged value over its logging interval (`logging_steps`); so is
  the ratio here, and cumulative counts weight each entry by the steps it covers.

No torch import here: the dashboard's upload form calls `import_run`.
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
import shutil
import struct
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_core.runs import names
from grpo_core.errors import ConfigError
from grpo_core.errors import StoreError
from grpo_core.runs.store import FAILED, FINISHED, RunStore, check_run_id, runs_dir

KINDS = ("trl", "wandb", "csv", "art", "trl-log", "trl-completions", "tensorboard", "verl")
LACKS = ["groups", "rollouts"]  # what an imported run never has


# ---- the report: everything read, mapped, skipped ---------------------------------------
@dataclass
class ImportReport:
    source: str
    file: str
    entries: int = 0  # log entries / history rows / CSV rows read
    steps: int = 0  # steps written
    values: int = 0  # scalar values written
    mapped: dict = field(default_factory=dict)  # source name -> stored name (only where they differ)
    skipped: dict = field(default_factory=dict)  # "what: reason" -> count
    notes: list = field(default_factory=list)

    def skip(self, what: str, reason: str, n: int = 1):
        key = f"{what}: {reason}"
        self.skipped[key] = self.skipped.get(key, 0) + n

    def note(self, text: str):
        if text not in self.notes:
            self.notes.append(text)

    def lines(self) -> list[str]:
        out = [f"read {self.entries} entries from {self.file}; wrote {self.steps} steps, {self.values} values"]
        out += [f"not imported ({n}x) {what}" for what, n in self.skipped.items()]
        out += [f"note: {t}" for t in self.notes]
        return out


@dataclass
class Parsed:
    rows: dict  # step -> {name: value}
    config: dict
    report: ImportReport
    summary: dict = field(default_factory=dict)
    step_data: dict = field(default_factory=dict)  # step -> (groups, rollouts) where the source has them
    lacks: list = field(default_factory=lambda: list(LACKS))
    # How the source ended: error (crashed: the run is failed), finished False (stopped
    # before its planned last step: incomplete), None (cannot tell: finished).
    error: str | None = None
    finished: bool | None = None
    last_step: int | None = None  # the source's last trainer step (may be past the last logged one)
    planned: int | None = None  # max_steps, where the source records it (else config grpo.steps)


def _number(v) -> float | None:
    """A JSON value -> float, or None when it is not a number (bool, str, dict, None)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _put(rows: dict, step: int, name: str, value: float, report: ImportReport):
    """Merge one value into a step; two different values for one name at one step are
    reported (the later one wins, as in the source's own charts)."""
    row = rows.setdefault(step, {})
    old = row.get(name)
    if old is not None and old != value and not (math.isnan(old) and math.isnan(value)):
        report.skip(name, "logged twice at the same step with different values; the later value kept")
    row[name] = value


# ---- TRL: names in a log entry (trainer_state.json log_history, or TRL's on_log) ----------
TRL_SUMMARY_KEYS = ("train_runtime", "train_loss", "train_samples_per_second", "train_steps_per_second",
                    "total_flos")
_TRL_FN = re.compile(r"^rewards/(.+)/(mean|std)$")
_TRL_FN_OLD = re.compile(r"^rewards/([^/]+)$")  # TRL < 0.17: rewards/<fn> is the function's mean


def trl_reward_fn(key: str) -> tuple[str, str] | None:
    """(function, 'mean'|'std') for TRL's per-function reward keys, old and new spellings."""
    m = _TRL_FN.match(key)
    if m:
        return m.group(1), m.group(2)
    m = _TRL_FN_OLD.match(key)
    return (m.group(1), "mean") if m else None


def map_trl_key(key: str, live: bool = False) -> str:
    """A TRL log key -> the stored name. `live`: our own numbers for this step exist (the
    TRL callback computes them from every rollout), so TRL's reward numbers are kept
    alongside under trl/ names rather than overwriting ours."""
    m = trl_reward_fn(key)
    if m:
        fn, stat = m
        if stat == "std":
            return names.metric_batch_std(fn)
        return names.foreign("trl", key) if live else names.metric_mean(fn)
    if live and key in ("reward", "frac_reward_zero_std"):
        return names.foreign("trl", key)
    return names.TRL_NAMES.get(key) or names.foreign("trl", key)


def is_trl_summary(entry: dict) -> bool:
    return any(k in entry for k in TRL_SUMMARY_KEYS)


def map_trl_entry(entry: dict, report: ImportReport, live: bool = False) -> dict[str, float]:
    """One TRL log entry (without `step`) -> {stored name: value}; non-numbers reported."""
    out = {}
    for key, v in entry.items():
        if key == "step":
            continue
        x = _number(v)
        if x is None:
            why = "logged as null (TRL logs null when no value was valid)" if v is None else "not a number"
            report.skip(f"trl key {key}", why)
            continue
        name = map_trl_key(key, live)
        if name != key:
            report.mapped[key] = name
        out[name] = x
    return out


def _trl_notes(report: ImportReport, fns: list[str]):
    report.note("trainable ratio = 1 - frac_reward_zero_std (TRL's rule: a group trains iff its rewards are "
                "not all equal). That holds for TRL's default scale_rewards='group' (and 'none'); with "
                "scale_rewards='batch' or multi_objective_aggregation='normalize_then_sum' TRL's "
                "frac_reward_zero_std measures the whole batch, not groups")
    report.note("TRL's reward_std is the std over all completions of a step (TRL 1.x; older TRL logged the "
                "mean within-group std, Bessel-corrected): kept as trl/reward_std, not train/reward_std")
    if fns:
        report.note("TRL's rewards/<fn>/std is the std over all completions, not within groups: kept as "
                    "reward/<fn>/batch_std (no reward/<fn>/group_std: it needs per-group data)")


def _derive_trl(rows: dict, report: ImportReport, groups_per_step: int | None, logging_steps: int | None):
    """Ratio per step and cumulative from frac_reward_zero_std. Each logged value is TRL's
    mean over the steps since the previous entry, so cumulative sums weight by those steps."""
    prev, cum_w, cum_t, no_frac = 0, 0.0, 0.0, 0
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


def parse_trl_state(data: bytes, filename: str, groups_per_step: int | None = None) -> Parsed:
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
    return parse_trl_history(state["log_history"], top, report, groups_per_step)


def parse_trl_history(history: list, top: dict, report: ImportReport, groups_per_step: int | None) -> Parsed:
    """TRL log entries (each with its `step`) -> Parsed: trainer_state.json's log_history,
    a bare list, or the dicts of a terminal transcript (trl_logs.py). `top`: what is known
    of the run (max_steps, logging_steps, global_step)."""
    rows: dict = {}
    summary: dict = {}
    fns: set[str] = set()
    eval_entries = no_reward = 0
    for entry in history:
        report.entries += 1
        if not isinstance(entry, dict):
            report.skip("log entry", f"not an object ({type(entry).__name__})")
            continue
        step = entry.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
            report.skip("log entry", "no integer 'step'")
            continue
        step = int(step)
        if is_trl_summary(entry):
            summary.update({k: v for k, v in entry.items() if k != "step"})
            report.skip("summary entry", "run totals (train_runtime, train_loss, ...): kept in meta.summary, "
                        "not a training step")
            continue
        if any(k.startswith("eval_") for k in entry):
            eval_entries += 1  # evaluation metrics: kept under trl/eval_* at their step
        elif not any(k in entry for k in ("reward", "frac_reward_zero_std")):
            no_reward += 1
        fns |= {m[0] for m in map(trl_reward_fn, entry) if m}
        for name, v in map_trl_entry(entry, report).items():
            _put(rows, step, name, v, report)
    if eval_entries:
        report.note(f"{eval_entries} evaluation entries: their metrics are kept as trl/eval_* at their step")
    if no_reward:
        report.note(f"{no_reward} training entries carry no reward keys (reward, frac_reward_zero_std)")
    _trl_notes(report, sorted(fns))
    _derive_trl(rows, report, groups_per_step, top.get("logging_steps"))
    config = {"source": "trl", "grpo": {"steps": top.get("max_steps"), "prompts_per_step": groups_per_step},
              "reward": {"metrics": sorted(fns)}, "trl": top}
    last, planned = (top.get(k) if isinstance(top.get(k), int) and not isinstance(top.get(k), bool) else None
                     for k in ("global_step", "max_steps"))
    return Parsed(rows, config, report, summary, finished=True if summary else None, last_step=last,
                  planned=planned)


# ---- W&B: recognise ART's, TRL's and our own names in a history row -------------------------
OUR_NAMES = {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)}
MIRROR_ALIASES = {"reward": names.REWARD, "reward_std": names.REWARD_STD}  # what WandbMirror adds for TRL-named charts
STEP_KEYS = ("train/global_step", "global_step", "training_step")  # x-axes other than W&B's _step


def _is_ours(key: str) -> bool:
    return key in OUR_NAMES or names.parse_metric_name(key) is not None or (
        key.startswith("reward/") and key.endswith("/batch_std"))


def detect_style(keys: set[str], config: dict | None = None) -> str:
    """Who logged these names: grpo_core (our mirror), trl (transformers' W&B callback
    prefixes train/ and eval/), art, or generic."""
    if (config or {}).get("grpo_health") or names.TRAINABLE_RATIO in keys or names.CUM_TRAINABLE_RATIO in keys:
        return "grpo_core"
    if "train/frac_reward_zero_std" in keys or "train/global_step" in keys or any(
            k.startswith("train/rewards/") for k in keys):
        return "trl"
    if any(k.startswith("data/step_num_groups") or k.startswith("data/cum/") for k in keys) or any(
            k in names.ART_NAMES for k in keys if k != "train/reward"):
        return "art"
    return "generic"


def map_wandb_key(key: str, style: str, report: ImportReport) -> str | None:
    """A W&B key -> stored name, or None (reported) when it is not imported."""
    if key.startswith("_") or key in STEP_KEYS:
        report.skip(key, "W&B bookkeeping / step axis")
        return None
    if style == "grpo_core" and key in MIRROR_ALIASES:
        report.skip(key, f"alias the mirror logs for TRL-named charts (same values as {MIRROR_ALIASES[key]})")
        return None
    if style == "trl":
        if key.startswith("train/"):
            name = map_trl_key(key[len("train/"):])
        elif key.startswith("eval/"):
            name = names.foreign("trl", key)
        else:
            name = key if _is_ours(key) else names.foreign("wandb", key)
    elif style == "art" and key in names.ART_NAMES:
        name = names.ART_NAMES[key]
    else:
        name = key if _is_ours(key) else names.foreign("wandb", key)
    if name != key:
        report.mapped[key] = name
    return name


def _derive_counts(rows: dict, style: str, report: ImportReport):
    """Ratios from group counts where only counts were logged (ART), and ART's 'not all
    equal' rule gives frac_reward_zero_std = 1 - ratio."""
    for step in sorted(rows):
        r = rows[step]
        s, t = r.get(names.GROUPS_SUBMITTED), r.get(names.GROUPS_TRAINABLE)
        if names.TRAINABLE_RATIO not in r and s and t is not None:
            r[names.TRAINABLE_RATIO] = t / s
            if style == "art" and names.FRAC_REWARD_ZERO_STD not in r:
                r[names.FRAC_REWARD_ZERO_STD] = 1 - t / s
        cs, ct = r.get(names.CUM_GROUPS_SUBMITTED), r.get(names.CUM_GROUPS_TRAINABLE)
        if names.CUM_TRAINABLE_RATIO not in r and cs and ct is not None:
            r[names.CUM_TRAINABLE_RATIO] = ct / cs
    if style == "art":
        report.note("ART counts a group trainable when its rewards are not all equal: "
                    "frac_reward_zero_std = 1 - trainable ratio")


def trl_args(config: dict, report: ImportReport) -> dict:
    """What a TRL run's W&B config (transformers logs every training argument) tells:
    groups per optimizer step, logging interval, and whether frac_reward_zero_std is a
    per-group number under its settings."""
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


def _finish_rows(raw: dict, style: str, report: ImportReport, config: dict | None,
                 summary: dict | None = None) -> dict:
    """raw step -> {source key: number} -> mapped and derived rows. TRL's run totals
    (train/train_runtime, ...: logged once, at the last step) go to `summary`, and a row
    left with no values (a W&B row carrying only its step and epoch) is no step."""
    rows: dict = {}
    for step, items in raw.items():
        for key, v in items.items():
            if style == "trl" and key.startswith("train/") and key[6:] in TRL_SUMMARY_KEYS:
                if summary is not None:
                    summary[key[6:]] = v
                report.skip(key, "run total: kept in meta.summary, not a training step value")
                continue
            name = map_wandb_key(key, style, report)
            if name is not None:
                _put(rows, step, name, v, report)
    _drop_empty_rows(raw, rows, report)
    if style == "trl":
        fns = sorted({m[0] for k in report.mapped if k.startswith("train/") for m in [trl_reward_fn(k[6:])] if m})
        _trl_notes(report, fns)
        args = trl_args(config or {}, report)
        if args.get("group_level", True):
            _derive_trl(rows, report, args.get("groups_per_step"), args.get("logging_steps"))
        else:
            report.note("no trainable ratio: with this run's settings TRL's frac_reward_zero_std is not a "
                        "per-group measure (kept as frac_reward_zero_std)")
    else:
        _derive_counts(rows, style, report)
    report.note(f"names recognised as {style}'s" if style != "generic" else
                "no known trainer's names recognised: metrics kept under wandb/<name>")
    return rows


EPOCH_ONLY = ("epoch",)  # a row whose only values are these (and its step) carries nothing to chart


def _drop_empty_rows(raw: dict, rows: dict, report: ImportReport):
    """Steps with no value of their own (only a step key, or only the epoch) are not steps."""
    empty = [s for s in raw if s not in rows]
    empty += [s for s, r in rows.items() if r and all(n.rsplit("/", 1)[-1] in EPOCH_ONLY for n in r)]
    for s in empty:
        rows.pop(s, None)
    if empty:
        report.skip("row", "carries only a step key (or the epoch), no values: not a step", len(empty))


# ---- W&B run file: LevelDB log format holding protobuf Records --------------------------------
_WB_IDENT, _WB_MAGIC = b":W&B", 0xBEE1
_BLOCK, _HDR = 32768, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(data: bytes, filename: str, report: ImportReport) -> list[bytes]:
    """The records of a .wandb transaction log (the format of wandb's datastore: a 7-byte
    file header, then 32 KiB blocks of CRC-checked chunks). A torn tail (a run killed
    mid-write) or a damaged chunk is reported, not fatal."""
    if len(data) < _HDR or data[:4] != _WB_IDENT:
        raise ConfigError(f"{filename}: expected a W&B run file (run-*.wandb, which starts with ':W&B'); "
                          "for a CSV exported from the W&B UI use kind csv")
    _, magic, version = struct.unpack("<4sHB", data[:_HDR])
    if magic != _WB_MAGIC or version > 1:
        raise ConfigError(f"{filename}: W&B run file of an unknown format (magic {magic:#x}, version {version})")
    out, parts, pos = [], None, _HDR
    while pos < len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HDR:
            pos += room  # block trailer: zero padding
            continue
        if pos + _HDR > len(data):
            report.skip("W&B file tail", f"torn chunk header ({len(data) - pos} bytes)")
            break
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0:
            pos += room  # zero-filled rest of a block
            continue
        chunk = data[pos + _HDR:pos + _HDR + length]
        pos += _HDR + length
        if len(chunk) < length:
            report.skip("W&B file tail", "torn record (the run was stopped mid-write)")
            break
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            report.skip("W&B record", "checksum mismatch (damaged file)")
            parts = None
            continue
        if kind == _FULL:
            out.append(chunk)
        elif kind == _FIRST:
            parts = [chunk]
        elif kind in (_MIDDLE, _LAST) and parts is not None:
            parts.append(chunk)
            if kind == _LAST:
                out.append(b"".join(parts))
                parts = None
        else:
            report.skip("W&B record", f"chunk of unknown type {kind} or out of order")
    if parts:
        report.skip("W&B file tail", "record begun but never finished (the run was stopped mid-write)")
    return out


def wandb_file_finished(path) -> bool:
    """Whether a .wandb file already ends with its exit record. Reads only the last block:
    chunks never cross a block boundary, so a block parses on its own."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = max((size - 1) // _BLOCK * _BLOCK, 0)
            f.seek(start)
            block = f.read()
    except OSError:
        return False
    from wandb.proto import wandb_internal_pb2 as pb
    pos = _HDR if start == 0 else 0
    while pos + _HDR <= len(block):
        crc, length, kind = struct.unpack_from("<IHB", block, pos)
        chunk = block[pos + _HDR:pos + _HDR + length]
        pos += _HDR + length
        if kind != _FULL or len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
            continue
        rec = pb.Record()
        try:
            rec.ParseFromString(chunk)
        except Exception:  # noqa: BLE001 - not this one
            continue
        if rec.WhichOneof("record_type") == "exit":
            return True
    return False


def _item_key_value(item) -> tuple[list[str], object]:
    keys = list(item.nested_key) or [item.key]
    which = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    if which and which != "json":
        value = None if which == "none" else getattr(item, which)
    else:
        raw = item.json if which == "json" else item.value_json
        try:
            value = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            value = raw
    return keys, value


def _history_row(items, report: ImportReport) -> dict[str, object]:
    """History items -> {key: value}; nested keys of one media/table object folded back."""
    row: dict[str, object] = {}
    for item in items:
        keys, value = _item_key_value(item)
        if len(keys) == 1:
            row[keys[0]] = value
        else:  # a logged dict: wandb flattens it ({"groups": Table} -> groups/_type, groups/path, ...)
            obj = row.setdefault(keys[0], {})
            if isinstance(obj, dict):
                obj[".".join(keys[1:])] = value
    return row


def _split_numeric(row: dict, report: ImportReport) -> dict[str, float]:
    out = {}
    for key, v in row.items():
        x = _number(v)
        if x is None:
            what = "table" if isinstance(v, dict) and "table" in str(v.get("_type", "")) else (
                "media or nested object" if isinstance(v, dict) else "text or list" if v is not None else "null")
            report.skip(key, f"not a scalar ({what}): only scalars are imported")
            continue
        out[key] = x
    return out


def parse_wandb_run(data: bytes, filename: str) -> Parsed:
    report = ImportReport("wandb", filename)
    records = wandb_records(data, filename, report)
    try:
        from wandb.proto import wandb_internal_pb2 as pb
    except ImportError:
        raise ConfigError(f"{filename}: reading a W&B run file needs the wandb package "
                          "(pip install wandb), or export a CSV from the W&B UI and use kind csv") from None
    raw: dict[int, dict] = {}
    config: dict = {}
    run_info: dict = {}
    exit_code = None
    for blob in records:
        rec = pb.Record()
        try:
            rec.ParseFromString(blob)
        except Exception:  # protobuf's DecodeError: a damaged record, reported
            report.skip("W&B record", "not a readable protobuf record")
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            report.entries += 1
            row = _split_numeric(_history_row(rec.history.item, report), report)
            step = next((int(row[k]) for k in STEP_KEYS
                         if k in row and math.isfinite(row[k]) and row[k] == int(row[k])), None)
            if step is None:
                step = int(rec.history.step.num) if rec.history.HasField("step") else int(row.get("_step", -1))
            if step < 0:
                report.skip("history row", "no step")
                continue
            raw.setdefault(step, {}).update(row)
        elif kind in ("run", "config"):
            src = rec.run.config if kind == "run" else rec.config
            for item in src.update:
                keys, value = _item_key_value(item)
                config[".".join(keys)] = value
            if kind == "run":
                run_info = {"run_id": rec.run.run_id, "project": rec.run.project,
                            "name": rec.run.display_name, "entity": rec.run.entity}
        elif kind == "exit":
            exit_code = rec.exit.exit_code
    if not records:
        raise ConfigError(f"{filename}: a W&B run file with no readable records")
    config.pop("_wandb", None)
    mirrored = config.pop("grpo_health", None)
    keys = {k for r in raw.values() for k in r}
    style = detect_style(keys, {"grpo_health": mirrored})
    summary: dict = {}
    rows = _finish_rows(raw, style, report, config, summary)
    if exit_code is None:
        report.note("the W&B run has no exit record: it was still running or was killed")
    elif exit_code != 0:
        report.note(f"the W&B run exited with code {exit_code}")
    if style == "grpo_core":
        report.note("per-group and rollout tables in the file are samples (every N steps), not every "
                    "rollout's scores: not imported, so no what-if and no inspector")
        cfg = config if "grpo" in config else {}
    elif style == "trl":
        fns = sorted({k.split("/")[1] for r in rows.values() for k in r
                      if k.startswith("reward/") and k.endswith("/mean")})
        cfg = {"grpo": {"steps": config.get("max_steps"), "group_size": config.get("num_generations"),
                        "prompts_per_step": trl_args(config, ImportReport("wandb", filename)).get("groups_per_step"),
                        "beta": config.get("beta"), "lr": config.get("learning_rate")},
               "reward": {"metrics": fns}}
        if config.get("reward_weights") is None and fns:  # TRL's default: every function weighs 1
            cfg["reward"]["weights"] = {f: 1.0 for f in fns}
    else:
        cfg = {}
    out_config = {**cfg, "source": "wandb", "wandb": {**run_info, "style": style, "config": config}}
    planned = out_config.setdefault("grpo", {}).get("steps")
    out_config["grpo"]["steps"] = planned or (max(rows) if rows else None)
    error = f"the W&B run exited with code {exit_code} (crashed)" if exit_code not in (None, 0) else None
    return Parsed(rows, out_config, report, summary, error=error, finished=exit_code is not None,
                  last_step=max(raw) if raw else None, planned=planned)


# ---- CSV exported from the W&B UI (chart CSV or run.history()) ---------------------------------
CSV_STEP_COLUMNS = ("Step", "_step", "step", "train/global_step", "global_step", "training_step")
_RUN_PREFIX = re.compile(r"^(.+?) - (.+)$")


def parse_wandb_csv(data: bytes, filename: str) -> Parsed:
    want = "a CSV exported from W&B (a chart's CSV or run.history()), with a Step or _step column"
    try:
        text = data.decode("utf-8-sig")
        table = list(csv.reader(io.StringIO(text)))
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{filename}: expected {want}; it is not text CSV ({type(e).__name__})") from None
    if "\x00" in text or not table or len(table[0]) < 2:
        raise ConfigError(f"{filename}: expected {want}; found no columns")
    header, body = table[0], table[1:]
    step_col = next((c for c in CSV_STEP_COLUMNS if c in header), None)
    if step_col is None:
        if "Name" in header and "State" in header:
            raise ConfigError(f"{filename}: this is the W&B runs table (one row per run, no history); "
                              "export a chart's CSV or run.history() instead")
        raise ConfigError(f"{filename}: expected {want}; no step column (one of {', '.join(CSV_STEP_COLUMNS)}) "
                          f"among: {', '.join(header[:8])}")
    report = ImportReport("csv", filename)
    si = header.index(step_col)
    columns: dict[int, str] = {}
    prefixes = set()
    for j, col in enumerate(header):
        if j == si:
            continue
        m = _RUN_PREFIX.match(col)
        if m:
            prefixes.add(m.group(1))
    if len(prefixes) > 1:
        raise ConfigError(f"{filename}: holds {len(prefixes)} runs ({', '.join(sorted(prefixes)[:4])}); "
                          "import one run at a time (export a chart with one run visible)")
    for j, col in enumerate(header):
        if j == si:
            continue
        m = _RUN_PREFIX.match(col)
        key = m.group(2) if (m and prefixes) else col
        if key.endswith("__MIN") or key.endswith("__MAX"):
            report.skip(col, "min/max band of a W&B chart (the value column is imported)", len(body))
            continue
        columns[j] = key
    raw: dict[int, dict] = {}
    empty = 0
    for row in body:
        report.entries += 1
        if not any(cell.strip() for cell in row):
            report.skip("row", "empty")
            continue
        try:
            step = float(row[si])
        except (ValueError, IndexError):
            report.skip("row", f"step {row[si] if si < len(row) else ''!r} is not a number")
            continue
        if not math.isfinite(step) or step != int(step):
            report.skip("row", "step is not an integer")
            continue
        vals = raw.setdefault(int(step), {})
        for j, key in columns.items():
            cell = row[j].strip() if j < len(row) else ""
            if not cell:
                empty += 1  # W&B leaves a cell empty where the metric was not logged at that step
                continue
            try:
                vals[key] = float(cell)
            except ValueError:
                report.skip(key, "not a number")
    if empty:
        report.note(f"{empty} empty cells: the metric was not logged at that step")
    style = detect_style({k for r in raw.values() for k in r})
    rows = _finish_rows(raw, style, report, None)
    config = {"source": "csv", "grpo": {"steps": max(rows) if rows else None}, "wandb": {"style": style}}
    return Parsed(rows, config, report)


# ---- writing the store ---------------------------------------------------------------------------
def _default_run_id(kind: str, filename: str) -> str:
    stem = Path(filename).name
    for suffix in (".wandb", ".json", ".csv"):
        stem = stem.removesuffix(suffix)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "run"
    return f"{kind}-{stem}"[:56]


def source_status(parsed: Parsed) -> tuple[str, str | None]:
    """(status, detail) from how the source ended: failed where it crashed (a W&B exit code
    != 0), incomplete where it stopped before its planned last step ('incomplete: step 200
    of 350'; 'incomplete: last step 200' where max_steps is unknown but the source says it
    did not end), else finished. An imported run must not read 'finished' when it was not."""
    from grpo_core.analysis.report import INCOMPLETE
    last = parsed.last_step if parsed.last_step is not None else (max(parsed.rows) if parsed.rows else None)
    planned = parsed.planned or (parsed.config.get("grpo") or {}).get("steps")
    if parsed.error:
        return FAILED, f"failed at step {last}: {parsed.error}"
    if isinstance(planned, (int, float)) and last is not None and last < planned and parsed.planned is not None:
        return INCOMPLETE, f"incomplete: step {last} of {int(planned)}"
    if parsed.finished is False:
        return INCOMPLETE, f"incomplete: last step {last} (the source has no end record)"
    return FINISHED, None


def _write(parsed: Parsed, kind: str, filename: str, run_id: str | None, root) -> str:
    if not parsed.rows:
        raise ConfigError(f"{filename}: no training steps with numbers in it; nothing to import "
                          f"({'; '.join(parsed.report.lines()[1:4]) or 'empty'})")
    base = runs_dir(root)
    explicit = run_id is not None
    rid = check_run_id(run_id) if explicit else _default_run_id(kind, filename)
    for n in range(1, 1000):
        candidate = rid if n == 1 else f"{rid}-{n}"
        try:
            store = RunStore.create(candidate, parsed.config, root=base, kind="import")
            break
        except StoreError:
            if explicit:
                raise
    else:
        raise StoreError(f"run ids {rid}-2 .. {rid}-999 are all taken in {base}")
    try:
        rep = parsed.report
        for step in sorted(parsed.rows):
            row = parsed.rows[step]
            store.log_step(step, row, *getattr(parsed, "step_data", {}).get(step, ()))  # ART: groups, rollouts
            rep.steps += 1
            rep.values += len(row)
        store.set_meta(source=kind, lacks=getattr(parsed, "lacks", LACKS), import_report=asdict(rep),
                       summary=parsed.summary, imported_from=filename, imported_at=time.time())
        store.add_event("lifecycle", {"event": "imported", "source": kind, "file": filename,
                                      "steps": rep.steps, "skipped": rep.skipped, "notes": rep.notes},
                        step=max(parsed.rows))
        status, detail = source_status(parsed)
        store.set_status(status, error=parsed.error, status_detail=detail)
    except BaseException:
        store.close()
        shutil.rmtree(store.run_dir, ignore_errors=True)  # no half-imported run left behind
        raise
    store.close()
    return store.run_id


def parse_art(data: bytes, filename: str) -> Parsed:
    from grpo_core.integrations.art import parse_art as parse  # art.py imports this module
    return parse(data, filename)


def parse_trl_log(data: bytes, filename: str, groups_per_step: int | None = None,
                  logging_steps: int | None = None) -> Parsed:
    from grpo_core.integrations.trl_logs import parse_transcript
    return parse_transcript(data, filename, groups_per_step, logging_steps)


def parse_trl_completions(data: bytes, filename: str, group_size: int | None = None,
                          reward_funcs: list[str] | None = None, reward_weights: dict | None = None) -> Parsed:
    from grpo_core.integrations.trl_completions import _frame, parse_completions
    return parse_completions([(filename, _frame(data, filename))], filename, group_size, reward_funcs,
                             reward_weights)


def parse_tensorboard(data: bytes, filename: str) -> Parsed:
    from grpo_core.integrations.tensorboard_logs import parse_event_bytes
    return parse_event_bytes(data, filename)


PARSERS = {"trl": parse_trl_state, "wandb": parse_wandb_run, "csv": parse_wandb_csv, "art": parse_art,
           "trl-log": parse_trl_log, "trl-completions": parse_trl_completions, "tensorboard": parse_tensorboard}
# What one uploaded file of each kind is (the Runs page's import form offers these; a folder,
# such as a verl job or an ART model dir, is imported from the command line).
FILE_KINDS = {"trl": "TRL trainer_state.json (or a bare log_history list)", "wandb": "W&B run file (run-*.wandb)",
              "csv": "W&B CSV export", "trl-log": "TRL / Unsloth terminal transcript",
              "trl-completions": "TRL completions parquet (log_completions)", "tensorboard": "TensorBoard event file",
              "art": "ART history.jsonl or trajectory file"}
# The options each kind takes (import_run/import_path keyword arguments, the CLI's flags).
OPTIONS = {"trl": ("groups_per_step",), "trl-log": ("groups_per_step", "logging_steps"),
           "trl-completions": ("group_size", "reward_funcs", "reward_weights")}  # tensorboard: the file's args say it


def _options(kind: str, options: dict) -> dict:
    """The options given (None: not given) that this kind takes; one it does not take, or a
    bad value, is refused with one line naming the option and the fix."""
    given = {k: v for k, v in options.items() if v is not None}
    for k, v in given.items():
        if k not in OPTIONS.get(kind, ()):
            takes = ", ".join(OPTIONS.get(kind, ())) or "no options"
            raise ConfigError(f"import {kind}: option {k} does not apply (it takes {takes})")
        if k in ("groups_per_step", "logging_steps", "group_size") and (
                isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{k} must be a positive integer, got {v!r}")
    return given


def parse(kind: str, data: bytes, filename: str, groups_per_step: int | None = None, **options) -> Parsed:
    if kind not in KINDS:
        raise ConfigError(f"import kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not data:
        raise ConfigError(f"{filename}: the file is empty")
    return PARSERS[kind](data, filename, **_options(kind, {"groups_per_step": groups_per_step, **options}))


def import_run(kind: str, data: bytes, filename: str, run_id: str | None = None, root=None,
               groups_per_step: int | None = None, **options) -> str:
    """Import file bytes (the dashboard's upload form) as a run; returns its id. Options:
    OPTIONS[kind]. Raises ConfigError (one line naming the file and what was expected) on
    bad input."""
    return _write(parse(kind, data, filename, groups_per_step, **options), kind, filename, run_id, root)


def _parse_dir(kind: str, p: Path, options: dict) -> Parsed | None:
    """Folders: TRL's completions/ (or its output dir) and a TensorBoard logdir."""
    if kind == "trl-completions":
        from grpo_core.integrations.trl_completions import parse_completions, read_frames
        o = _options(kind, options)
        return parse_completions(read_frames(p), str(p), o.get("group_size"), o.get("reward_funcs"),
                                 o.get("reward_weights"))
    if kind == "tensorboard":
        from grpo_core.integrations.tensorboard_logs import parse_logdir
        return parse_logdir(p, **_options(kind, options))
    return None


def import_path(kind: str, path, run_id: str | None = None, root=None, groups_per_step: int | None = None,
                **options) -> str:
    p = Path(path)
    if p.is_dir() and kind in ("trl-completions", "tensorboard"):
        return _write(_parse_dir(kind, p, {"groups_per_step": groups_per_step, **options}), kind, str(p), run_id,
                      root)
    if kind == "verl":  # a file logger JSONL, a console log, rollout dumps, or a folder with them
        from grpo_core.integrations.verl import read_source
        run = read_source(p)
        return _write(Parsed(run.scalars, run.config, run.report, step_data=run.groups, lacks=run.lacks), kind,
                      str(p), run_id, root)
    if p.is_dir() and kind == "art":  # an ART model output dir: history.jsonl + trajectories/train/
        from grpo_core.integrations.art import parse_art_dir
        return _write(parse_art_dir(p), kind, str(p), run_id, root)
    if p.is_dir() and kind == "wandb":  # a W&B run folder: its one run-*.wandb file
        found = sorted(p.glob("*.wandb"))
        if len(found) != 1:
            raise ConfigError(f"{p}: expected one run-*.wandb file in the folder, found {len(found)}")
        p = found[0]
    if not p.is_file():
        raise ConfigError(f"{p}: file not found")
    return import_run(kind, p.read_bytes(), str(p), run_id, root, groups_per_step, **options)


def _cli_options(args) -> dict:
    """The CLI's flags -> import options (reward weights as fn=w,fn=w)."""
    out = {k: getattr(args, k, None) for k in ("logging_steps", "group_size")}
    if getattr(args, "reward_funcs", None):
        out["reward_funcs"] = [x.strip() for x in args.reward_funcs.split(",") if x.strip()]
    if getattr(args, "reward_weights", None):
        try:
            out["reward_weights"] = {k.strip(): float(v) for k, v in
                                     (x.split("=", 1) for x in args.reward_weights.split(",") if x.strip())}
        except ValueError:
            raise ConfigError(f"--reward-weights {args.reward_weights!r}: expected fn=weight,fn=weight") from None
    return out


def cli_import(args) -> int:
    run_id = import_path(args.kind, args.file, args.run_id, args.runs_dir,
                         getattr(args, "groups_per_step", None), **_cli_options(args))
    with RunStore.open(runs_dir(args.runs_dir) / run_id, readonly=True) as s:
        meta = s.get_meta()
        rep = ImportReport(**meta["import_report"])
    what = ("scalars only: no per-group data, so no what-if, no inspector" if meta.get("lacks")
            else "with per-group data: what-if and the inspector work")
    print(f"imported {args.file} as run {run_id} ({what}); status {meta.get('status_detail') or meta['status']}")
    for line in rep.lines():
        print("  " + line)
    return 0


# ---- the name-mapping table, as docs/integrations.md prints it (a test keeps them equal) ----------
NAMES_BEGIN, NAMES_END = "<!-- names.py tables: begin -->", "<!-- names.py tables: end -->"


def name_table_markdown() -> str:
    """names.FOREIGN_NAMES (TRL / ART / verl -> ours) as one Markdown table. Regenerate the
    doc's copy with: python -c "from grpo_core.integrations.importers import name_table_markdown as t; print(t())"."""
    lines = ["| source | source name | stored as |", "|---|---|---|"]
    for source, table in names.FOREIGN_NAMES.items():
        for key, ours in table.items():
            lines.append(f"| {source} | `{key}` | `{ours}` |")
    lines.append("| any | a name not listed | `<source>/<name>` (kept under the source's name) |")
    return "\n".join(lines)
