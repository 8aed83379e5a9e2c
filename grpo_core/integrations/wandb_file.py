"""A W&B run file (run-*.wandb, read locally: no network, no W&B account) as a run.

The file is wandb's transaction log: LevelDB's log format (a 7-byte header, then 32 KiB
blocks of CRC-checked chunks) holding protobuf Records. History rows become steps (their
names recognised by scalar_history.py), the run's config says what TRL's arguments were,
and the exit record says how the run ended. Needs the wandb package for the protobuf
classes, imported only when a file is read.
"""
from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun, number
from grpo_core.integrations.scalar_history import STEP_KEYS, HistoryRows, merge_report
from grpo_core.integrations.source_tail import FileTail, LayeredRows, Reads, SourceTail
from grpo_core.integrations.trl_state import trl_args

WANDB_IDENT, WANDB_MAGIC = b":W&B", 0xBEE1
BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4  # chunk types: a whole record, or its first/middle/last part


# ---- the transaction log ------------------------------------------------------------------------
def wandb_records(data: bytes, filename: str, report: ImportReport) -> list[bytes]:
    """The records of a whole .wandb transaction log. A torn tail (a run killed mid-write) or
    a damaged chunk is reported, not fatal."""
    return read_chunks(data, 0, filename, report, final=True)[0]


def read_chunks(data: bytes, base: int, filename: str, report: ImportReport, final: bool) -> tuple[list[bytes], int]:
    """The whole records in `data`, the file's bytes from offset `base` (0, or where the last
    whole record ended) -> (records, the offset after the last whole record). A record begun
    but not finished is read again next time; `final` (import): it is reported instead."""
    if base == 0:
        if len(data) < HEADER or data[:4] != WANDB_IDENT:
            if not final and WANDB_IDENT.startswith(data[:4]) and len(data) < HEADER:
                return [], 0  # the header is being written
            raise ConfigError(f"{filename}: expected a W&B run file (run-*.wandb, which starts with ':W&B'); "
                              "for a CSV exported from the W&B UI use kind csv")
        _, magic, version = struct.unpack("<4sHB", data[:HEADER])
        if magic != WANDB_MAGIC or version > 1:
            raise ConfigError(f"{filename}: W&B run file of an unknown format (magic {magic:#x}, version {version})")
    out, parts = [], None
    pos = end = max(base, HEADER)
    stop = base + len(data)
    while pos < stop:
        room = BLOCK - pos % BLOCK
        if room < HEADER:
            pos += room  # block trailer: zero padding
            end = min(pos, stop) if parts is None else end
            continue
        if pos + HEADER > stop:
            if final:
                report.skip("W&B file tail", f"torn chunk header ({stop - pos} bytes)")
            break
        crc, length, kind = struct.unpack_from("<IHB", data, pos - base)
        if kind == 0:
            pos += room  # zero-filled rest of a block
            end = min(pos, stop) if parts is None else end
            continue
        chunk = data[pos - base + HEADER:pos - base + HEADER + length]
        if len(chunk) < length:
            if final:
                report.skip("W&B file tail", "torn record (the run was stopped mid-write)")
            break
        pos += HEADER + length
        if zlib.crc32(bytes([kind]) + chunk) != crc:
            report.skip("W&B record", "checksum mismatch (damaged file)")
            parts, end = None, pos
            continue
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            parts = [chunk]
        elif kind in (MIDDLE, LAST) and parts is not None:
            parts.append(chunk)
            if kind == LAST:
                out.append(b"".join(parts))
                parts = None
        else:
            report.skip("W&B record", f"chunk of unknown type {kind} or out of order")
        end = pos if parts is None else end
    if parts and final:
        report.skip("W&B file tail", "record begun but never finished (the run was stopped mid-write)")
    return out, end


def wandb_file_finished(path) -> bool:
    """Whether a .wandb file already ends with its exit record. Reads only the last block:
    chunks never cross a block boundary, so a block parses on its own."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = max((size - 1) // BLOCK * BLOCK, 0)
            f.seek(start)
            block = f.read()
    except OSError:
        return False
    from wandb.proto import wandb_internal_pb2
    pos = HEADER if start == 0 else 0
    while pos + HEADER <= len(block):
        crc, length, kind = struct.unpack_from("<IHB", block, pos)
        chunk = block[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind != FULL or len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) != crc:
            continue
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(chunk)
        except Exception:  # noqa: BLE001 - not this one
            continue
        if rec.WhichOneof("record_type") == "exit":
            return True
    return False


# ---- a record's contents --------------------------------------------------------------------------
def item_key_value(item) -> tuple[list[str], object]:
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


def history_row(items) -> dict[str, object]:
    """History items -> {key: value}; nested keys of one media/table object folded back."""
    row: dict[str, object] = {}
    for item in items:
        keys, value = item_key_value(item)
        if len(keys) == 1:
            row[keys[0]] = value
        else:  # a logged dict: wandb flattens it ({"groups": Table} -> groups/_type, groups/path, ...)
            obj = row.setdefault(keys[0], {})
            if isinstance(obj, dict):
                obj[".".join(keys[1:])] = value
    return row


def split_numeric(row: dict, report: ImportReport) -> dict[str, float]:
    out = {}
    for key, v in row.items():
        x = number(v)
        if x is None:
            what = "table" if isinstance(v, dict) and "table" in str(v.get("_type", "")) else (
                "media or nested object" if isinstance(v, dict) else "text or list" if v is not None else "null")
            report.skip(key, f"not a scalar ({what}): only scalars are imported")
            continue
        out[key] = x
    return out


def history_step(rec, row: dict) -> int:
    """A history record's step: a trainer's own step key, else W&B's step (-1: none)."""
    step = next((int(row[k]) for k in STEP_KEYS if k in row and math.isfinite(row[k]) and row[k] == int(row[k])),
                None)
    if step is None:
        step = int(rec.history.step.num) if rec.history.HasField("step") else int(row.get("_step", -1))
    return step


def read_records(records: list[bytes], report: ImportReport) -> tuple[dict, dict, dict, int | None]:
    """Records -> (raw step -> {key: number}, the run's config, who/where it is, exit code)."""
    from wandb.proto import wandb_internal_pb2
    raw: dict[int, dict] = {}
    config: dict = {}
    run_info: dict = {}
    exit_code = None
    for blob in records:
        rec = wandb_internal_pb2.Record()
        try:
            rec.ParseFromString(blob)
        except Exception:  # protobuf's DecodeError: a damaged record, reported
            report.skip("W&B record", "not a readable protobuf record")
            continue
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            report.entries += 1
            row = split_numeric(history_row(rec.history.item), report)
            step = history_step(rec, row)
            if step < 0:
                report.skip("history row", "no step")
                continue
            raw.setdefault(step, {}).update(row)
        elif kind in ("run", "config"):
            for item in (rec.run.config if kind == "run" else rec.config).update:
                keys, value = item_key_value(item)
                config[".".join(keys)] = value
            if kind == "run":
                run_info = {"run_id": rec.run.run_id, "project": rec.run.project,
                            "name": rec.run.display_name, "entity": rec.run.entity}
        elif kind == "exit":
            exit_code = rec.exit.exit_code
    return raw, config, run_info, exit_code


# ---- the run ---------------------------------------------------------------------------------------
class WandbReader(SourceTail):
    """A W&B run file (or the run folder holding one) read as it grows: each poll parses the
    records after the last whole one, and finishes their history rows (HistoryRows)."""

    def __init__(self, path: Path | None = None):
        self.path, self.reads = path, Reads()
        self.file: Path | None = path if path is not None and path.is_file() else None
        self.tail = FileTail(self.file, self.reads) if self.file else None
        self._reset()

    def _reset(self):
        self.report = ImportReport("wandb", str(self.file or self.path))
        self.history, self.rows, self.names = HistoryRows("wandb"), LayeredRows(("all",)), set()
        self.config, self.run_info, self.exit_code, self.records, self.mirrored = {}, {}, None, 0, None

    def poll(self, final: bool = False) -> bool:
        if self.tail is None:
            found = sorted(self.path.rglob("*.wandb"))
            if len(found) > 1:
                raise ConfigError(f"{self.path}: expected one run-*.wandb file under the folder, found {len(found)}")
            if not found:
                return False
            self.file, self.tail = found[0], FileTail(found[0], self.reads)
            self.report.file = str(self.file)
        data, restarted = self.tail.read()
        if restarted:
            self._reset()
        return self.feed(data, self.tail.offset, final, self.tail)

    def feed(self, data: bytes, base: int, final: bool, tail: FileTail | None = None) -> bool:
        """Parse the file's bytes from offset `base`; True when steps were finished."""
        filename = str(self.file or self.path)
        records, end = read_chunks(data, base, filename, self.report, final)
        if tail is not None:
            tail.consumed(data, end - base)
        if records:
            _need_wandb(filename)
            raw, config, run_info, exit_code = read_records(records, self.report)
            self.records += len(records)
            self.mirrored = config.pop("grpo_health", self.mirrored)
            config.pop("_wandb", None)
            self.config.update(config)
            self.run_info = run_info or self.run_info
            self.exit_code = exit_code if exit_code is not None else self.exit_code
            self.history.add(raw)
        return self._finish(flush=final or not records or self.exit_code is not None) or bool(records)

    def _finish(self, flush: bool) -> bool:
        """Finish the history rows ready now (all where `flush`); True when there were any."""
        config = {**self.config, "grpo_health": self.mirrored} if self.mirrored else self.config
        rows = self.history.finish(config, flush=flush)
        for step, row in rows.items():
            self.rows.put("all", step, row)
            self.names |= row.keys()
        return bool(rows)

    def take(self) -> list[int]:
        return self.rows.take()

    def flush(self):
        self._finish(flush=True)

    def run(self) -> SourceRun:
        filename = str(self.file or self.path)
        if self.file is None:
            raise ConfigError(f"{self.path}: expected one run-*.wandb file under the folder, found 0")
        if not self.records:
            raise ConfigError(f"{filename}: a W&B run file with no readable records")
        report, exit_code, style = copy_report(self.report), self.exit_code, self.history.style
        merge_report(report, self.history.report)
        if exit_code is None:
            report.note("the W&B run has no exit record: it was still running or was killed")
        elif exit_code != 0:
            report.note(f"the W&B run exited with code {exit_code}")
        out_config = {**run_config(style, self.config, self.names, report, filename), "source": "wandb",
                      "wandb": {**self.run_info, "style": style, "config": self.config}}
        planned = out_config.setdefault("grpo", {}).get("steps")
        out_config["grpo"]["steps"] = planned or self.rows.last
        error = f"the W&B run exited with code {exit_code} (crashed)" if exit_code not in (None, 0) else None
        raw_last = max(self.history.raw) if self.history.raw else None
        return SourceRun(self.rows.merged, out_config, report, self.history.summary, error=error,
                         finished=exit_code is not None, last_step=raw_last, planned=planned,
                         ended=exit_code is not None)


def _need_wandb(filename: str):
    try:
        import wandb.proto  # noqa: F401 - the protobuf classes read_records needs
    except ImportError:
        raise ConfigError(f"{filename}: reading a W&B run file needs the wandb package "
                          "(pip install wandb), or export a CSV from the W&B UI and use kind csv") from None


def copy_report(report: ImportReport) -> ImportReport:
    return ImportReport(report.source, report.file, report.entries, report.steps, report.values,
                        dict(report.mapped), dict(report.skipped), list(report.notes))


def parse_wandb_run(data: bytes, filename: str) -> SourceRun:
    """A whole .wandb file's bytes -> SourceRun: the reader `watch` polls, fed once."""
    reader = WandbReader(Path(filename))
    reader.file = Path(filename)
    reader.report.file = filename
    reader.feed(data, 0, final=True)
    return reader.run()


def run_config(style: str, config: dict, names_seen: set, report: ImportReport, filename: str) -> dict:
    """The stored config's grpo and reward sections, from what the W&B run's config says."""
    if style == "grpo_core":
        report.note("per-group and rollout tables in the file are samples (every N steps), not every "
                    "rollout's scores: not imported, so no what-if and no inspector")
        return config if "grpo" in config else {}
    if style != "trl":
        return {}
    fns = sorted({k.split("/")[1] for k in names_seen if k.startswith("reward/") and k.endswith("/mean")})
    cfg = {"grpo": {"steps": config.get("max_steps"), "group_size": config.get("num_generations"),
                    "prompts_per_step": trl_args(config, ImportReport("wandb", filename)).get("groups_per_step"),
                    "beta": config.get("beta"), "lr": config.get("learning_rate")},
           "reward": {"metrics": fns}}
    if config.get("reward_weights") is None and fns:  # TRL's default: every function weighs 1
        cfg["reward"]["weights"] = {f: 1.0 for f in fns}
    return cfg


def read_wandb_path(path) -> SourceRun:
    """A W&B run file, or a run dir (wandb/run-*/) holding one."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.rglob("*.wandb"))
        if len(found) != 1:
            raise ConfigError(f"{path}: expected one run-*.wandb file under the folder, found {len(found)}")
        path = found[0]
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    return parse_wandb_run(path.read_bytes(), str(path))
