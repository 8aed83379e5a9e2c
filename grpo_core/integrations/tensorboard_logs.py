"""Import TensorBoard event files (events.out.tfevents.*), and follow them as they grow.

transformers' TensorBoardCallback (TRL's `report_to="tensorboard"`) writes every logged
number as a scalar `train/<key>` at the global step, the run totals (train_runtime, ...)
once at the last step, and the training arguments as JSON text (`args/text_summary`):
num_generations, generation_batch_size, logging_steps, max_steps. So the names go through
the W&B path's TRL mapping (`train/` prefix), and the arguments give the groups per step
and max_steps. Scalars are float32 in the file (TensorBoard's simple_value), so the ratio
is 1 - the float32 frac_reward_zero_std.

An event file is a TFRecord file: records of (length, its masked CRC32C, an Event proto, its
CRC). `EventsReader` reads the records after the last whole one (source_tail.FileTail), so
`watch` reads only new events and `import` reads the same way once; the length's CRC is
checked (a damaged file is refused), the payload's is not (tensorboard's pure-Python CRC32C
would cost more than the rest of the import), a payload that does not parse is reported.

Needs the `tensorboard` package (pip install tensorboard, or the tensorboard extra), not
TensorFlow, for the Event protobuf; it is imported only here, when a TensorBoard file is read.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.scalar_history import HistoryRows, merge_report
from grpo_core.integrations.source_tail import FileTail, LayeredRows, NewFiles, Reads, SourceTail
from grpo_core.integrations.wandb_file import copy_report

SKIPPED_KINDS = {"image": "image", "audio": "audio", "histo": "histogram"}
TEXT_TAGS = ("args/text_summary", "model_config/text_summary")


def _protos(filename: str):
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    except ImportError:
        raise ConfigError(f"{filename}: reading TensorBoard files needs the tensorboard package "
                          "(pip install tensorboard; TensorFlow is not needed)") from None
    return event_pb2, masked_crc32c


def split_records(data: bytes, filename: str) -> tuple[list[bytes], int]:
    """TFRecords in `data` -> (the whole ones, bytes they take); a record cut short is left."""
    _, masked_crc32c = _protos(filename)
    out, pos = [], 0
    while pos + 12 <= len(data):
        (length,), (crc,) = struct.unpack_from("<Q", data, pos), struct.unpack_from("<I", data, pos + 8)
        if masked_crc32c(data[pos:pos + 8]) != crc:
            raise ConfigError(f"{filename}: not a readable TensorBoard event file (a record's length fails its "
                              "checksum)")
        end = pos + 12 + length + 4
        if end > len(data):
            break
        out.append(data[pos + 12:pos + 12 + length])
        pos = end
    return out, pos


def event_files(path: Path) -> list[Path]:
    return sorted(p for p in Path(path).rglob("*tfevents*") if p.is_file())


class EventsReader(SourceTail):
    """A logdir (TRL's <output_dir>/runs/<date_host>/, or its parent holding one run) or an
    event file, read as it grows. Several event files of one run directory (a resumed run) are
    merged; a logdir with several runs is refused: import one run at a time."""

    def __init__(self, path: Path):
        self.path, self.reads = Path(path), Reads()
        self.found = NewFiles(self.path, self.reads, lambda p: "tfevents" in p.name) if self.path.is_dir() else None
        self.tails: dict[Path, FileTail] = {} if self.found else {self.path: FileTail(self.path, self.reads)}
        self.report = ImportReport("tensorboard", str(self.path))
        self.history, self.rows, self.names = HistoryRows("wandb"), LayeredRows(("all",)), set()
        self.args: dict = {}
        self.skipped_tags: set[str] = set()

    def poll(self, final: bool = False) -> bool:
        for p in self.found.poll() if self.found else []:
            self.tails[p] = FileTail(p, self.reads)
            dirs = sorted({f.parent for f in self.tails})
            if len(dirs) > 1:
                raise ConfigError(f"{self.path}: holds {len(dirs)} TensorBoard runs "
                                  f"({', '.join(d.name for d in dirs[:4])}); import one run's folder")
        new = False
        for p, tail in self.tails.items():
            data, _ = tail.read()
            new |= self.feed(data, str(p), tail)
        return self.finish(flush=final or not new) or new

    def flush(self):
        self.finish(flush=True)

    def finish(self, flush: bool) -> bool:
        """Finish the history rows ready now (all where `flush`); True when there were any."""
        rows = self.history.finish(self.args, flush=flush)
        for step, row in rows.items():
            self.rows.put("all", step, row)
            self.names |= row.keys()
        return bool(rows)

    def feed(self, data: bytes, filename: str, tail: FileTail | None = None) -> bool:
        """Parse an event file's new bytes; True when it held whole records."""
        if not data:
            return False
        records, used = split_records(data, filename)
        if tail is not None:
            tail.consumed(data, used)
        event_pb2, _ = _protos(filename)
        raw: dict[int, dict] = {}
        for rec in records:
            try:
                event = event_pb2.Event.FromString(rec)
            except Exception:  # noqa: BLE001 - protobuf's DecodeError: a damaged record, reported
                self.report.skip("event", "not a readable Event record (damaged file)")
                continue
            if event.HasField("summary"):
                self._summary(event, raw)
        self.history.add(raw)
        return bool(records)

    def _summary(self, event, raw: dict):
        for value in event.summary.value:
            which = value.WhichOneof("value")
            if which == "simple_value":
                self.report.entries += 1
                raw.setdefault(int(event.step), {})[value.tag] = float(value.simple_value)
            elif which == "tensor" and value.tag in TEXT_TAGS:
                if value.tag == "args/text_summary":
                    self.args = _args_text(value.tensor) or self.args
            elif f"{which} {value.tag}" not in self.skipped_tags:
                self.skipped_tags.add(f"{which} {value.tag}")
                what = SKIPPED_KINDS.get(which, which)
                self.report.skip(f"{what} {value.tag}", "not a scalar: only scalars are imported")

    def take(self) -> list[int]:
        return self.rows.take()

    def run(self) -> SourceRun:
        label = str(self.path)
        if not self.tails:
            raise ConfigError(f"{label}: no TensorBoard event files (events.out.tfevents.*) under the folder")
        if not self.history.raw:
            raise ConfigError(f"{label}: a TensorBoard file with no scalars; nothing to import")
        report = copy_report(self.report)
        merge_report(report, self.history.report)
        args, summary, style = self.args, self.history.summary, self.history.style
        if args:
            report.note("training arguments read from the file's args/text_summary (transformers writes them)")
        max_steps = args.get("max_steps")
        planned = max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        fns = sorted({k.split("/")[1] for k in self.names if k.startswith("reward/") and k.endswith("/mean")})
        config = {"source": "tensorboard", "grpo": {"steps": planned or self.rows.last,
                                                    "group_size": args.get("num_generations")},
                  "reward": {"metrics": fns}, "tensorboard": {"style": style, "args": args}}
        return SourceRun(self.rows.merged, config, report, summary, finished=True if summary else None,
                         last_step=max(self.history.raw), planned=planned)


def _args_text(tensor) -> dict:
    """transformers' `args/text_summary`: the training arguments as JSON ({} when unreadable)."""
    try:
        out = json.loads(tensor.string_val[0].decode("utf-8"))
    except (IndexError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return out if isinstance(out, dict) else {}


def parse_logdir(path) -> SourceRun:
    """A logdir or an event file -> SourceRun: the reader `watch` polls, read once."""
    p = Path(path)
    if p.is_dir() and not event_files(p):
        raise ConfigError(f"{p}: no TensorBoard event files (events.out.tfevents.*) under the folder")
    reader = EventsReader(p)
    reader.poll(final=True)
    return reader.run()


def parse_event_bytes(data: bytes, filename: str) -> SourceRun:
    """One event file's bytes (the upload form)."""
    if len(data) < 12:
        raise ConfigError(f"{filename}: expected a TensorBoard event file (events.out.tfevents.*); too short")
    reader = EventsReader(Path(filename))
    reader.report.file = filename
    reader.feed(data, filename)
    reader.finish(flush=True)
    return reader.run()
