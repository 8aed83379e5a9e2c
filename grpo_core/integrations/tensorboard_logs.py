"""Import TensorBoard event files (events.out.tfevents.*) with tensorboard's own reader.

transformers' TensorBoardCallback (TRL's `report_to="tensorboard"`) writes every logged
number as a scalar `train/<key>` at the global step, the run totals (train_runtime, ...)
once at the last step, and the training arguments as JSON text (`args/text_summary`):
num_generations, generation_batch_size, logging_steps, max_steps. So the names go through
the W&B path's TRL mapping (`train/` prefix), and the arguments give the groups per step
and max_steps. Scalars are float32 in the file (TensorBoard's simple_value), so the ratio
is 1 - the float32 frac_reward_zero_std.

Needs the `tensorboard` package (pip install tensorboard, or the tensorboard extra), not
TensorFlow; it is imported only here, when a TensorBoard file is imported.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.scalar_history import detect_style, finish_rows


def _accumulator(path: str, filename: str):
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ConfigError(f"{filename}: reading TensorBoard files needs the tensorboard package "
                          "(pip install tensorboard; TensorFlow is not needed)") from None
    ea = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})  # 0: keep every event
    try:
        ea.Reload()
    except Exception as e:  # noqa: BLE001 - tensorboard raises several kinds for a damaged file
        raise ConfigError(f"{filename}: not a readable TensorBoard event file ({type(e).__name__}: {e})") from None
    return ea


def _args_text(ea) -> dict:
    """transformers' `args/text_summary`: the training arguments as JSON ({} when absent)."""
    if "args/text_summary" not in ea.Tags().get("tensors", []):
        return {}
    try:
        raw = ea.Tensors("args/text_summary")[-1].tensor_proto.string_val[0].decode("utf-8")
        out = json.loads(raw)
    except (IndexError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return out if isinstance(out, dict) else {}


def read_scalars(ea, report: ImportReport) -> dict[int, dict]:
    """step -> {tag: value}; non-finite values are kept (NaN), other summaries reported."""
    raw: dict[int, dict] = {}
    tags = ea.Tags()
    for tag in tags.get("scalars", []):
        for ev in ea.Scalars(tag):
            report.entries += 1
            raw.setdefault(int(ev.step), {})[tag] = float(ev.value)
    for kind in ("images", "audio", "histograms", "distributions"):
        for tag in tags.get(kind, []):
            report.skip(f"{kind[:-1] if kind.endswith('s') else kind} {tag}", "not a scalar: only scalars are imported")
    for tag in tags.get("tensors", []):
        if tag not in ("args/text_summary", "model_config/text_summary"):
            report.skip(f"tensor {tag}", "not a scalar: only scalars are imported")
    return raw


def parse_accumulators(accs: list, label: str) -> SourceRun:
    """Event accumulators of one run -> SourceRun (TRL's names when the tags are TRL's)."""
    report = ImportReport("tensorboard", label)
    raw: dict[int, dict] = {}
    args: dict = {}
    for ea in accs:
        for step, vals in read_scalars(ea, report).items():
            raw.setdefault(step, {}).update(vals)
        args = args or _args_text(ea)
    if not raw:
        raise ConfigError(f"{label}: a TensorBoard file with no scalars; nothing to import")
    style = detect_style({k for r in raw.values() for k in r})
    summary: dict = {}
    rows = finish_rows(raw, style, report, args, summary)
    if args:
        report.note("training arguments read from the file's args/text_summary (transformers writes them)")
    planned = args.get("max_steps") if isinstance(args.get("max_steps"), int) and args.get("max_steps") > 0 else None
    fns = sorted({k.split("/")[1] for r in rows.values() for k in r if k.startswith("reward/") and k.endswith("/mean")})
    config = {"source": "tensorboard", "grpo": {"steps": planned or (max(rows) if rows else None),
                                                "group_size": args.get("num_generations")},
              "reward": {"metrics": fns}, "tensorboard": {"style": style, "args": args}}
    return SourceRun(rows, config, report, summary, finished=True if summary else None,
                     last_step=max(raw), planned=planned)


def event_files(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*tfevents*") if p.is_file())


def parse_logdir(path) -> SourceRun:
    """A logdir (TRL's <output_dir>/runs/<date_host>/, or its parent holding one run) or an
    event file. Several event files of one run directory (a resumed run) are merged; a
    logdir with several runs is refused: import one run at a time."""
    p = Path(path)
    files = event_files(p) if p.is_dir() else [p]
    if not files:
        raise ConfigError(f"{p}: no TensorBoard event files (events.out.tfevents.*) under the folder")
    dirs = sorted({f.parent for f in files})
    if len(dirs) > 1:
        raise ConfigError(f"{p}: holds {len(dirs)} TensorBoard runs ({', '.join(d.name for d in dirs[:4])}); "
                          "import one run's folder")
    return parse_accumulators([_accumulator(str(f), str(f)) for f in files], str(p))


def parse_event_bytes(data: bytes, filename: str) -> SourceRun:
    """One event file's bytes (the upload form): written to a temporary file for the reader."""
    if len(data) < 12:
        raise ConfigError(f"{filename}: expected a TensorBoard event file (events.out.tfevents.*); too short")
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "events.out.tfevents.upload")
        with open(f, "wb") as out:
            out.write(data)
        parsed = parse_accumulators([_accumulator(f, filename)], filename)
    return parsed
