"""Reading only what is new in a source: what `watch` polls, and what `import` reads once.

A source is files another trainer writes while it runs; three shapes, one reader each:
- an append-only file (verl's JSONL and console log, TensorBoard event files, a W&B run file):
  `FileTail` reads from the byte where the last read stopped; the caller says how many of
  those bytes made whole records, and the torn rest is read again next time;
- a folder that gains one file per step (verl's rollout dumps, TRL's completions parquet):
  `NewFiles` lists a folder again only when its mtime says an entry was added;
- a file rewritten whole (TRL's trainer_state.json): `Stamp` says whether its size or mtime
  changed since the last read.
A poll with nothing new costs one stat per file and folder and reads no byte. Every read
adds to a `Reads` counter, so a test (and bench/watch_poll.py) can see what a poll cost.

A kind's tail (`SourceTail`: poll, take, run) keeps its rows in `LayeredRows`, which says
which steps a poll changed, so `watch` (follow.py) writes those steps and no other. Each
integration module has its kind's reader (verl.VerlReader, tensorboard_logs.EventsReader,
wandb_file.WandbReader; TRL's is here); `open_tail` picks it, and a kind with none is re-read
whole when its files change (`RereadTail`).
"""
from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_core.integrations.base import SourceRun

PROBE = 64  # bytes just before the offset, compared on each read: a rewritten file shows there


@dataclass
class Reads:
    """What a source's reads cost: bytes read from files, folder listings."""
    bytes: int = 0
    listings: int = 0


class Stamp:
    """Whether a file changed (size, mtime, inode) since `changed` last said so."""

    def __init__(self, path: Path):
        self.path, self.seen = Path(path), None

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        now = (st.st_size, st.st_mtime_ns, st.st_ino)
        if now == self.seen:
            return False
        self.seen = now
        return True


class FileTail:
    """An append-only file, read from where the last whole record ended. A file that shrank,
    or whose bytes before that point changed (verl reopens its file log with "wb" when a job
    resumes), is read again from its start: `read` then says restarted."""

    def __init__(self, path: Path, reads: Reads):
        self.path, self.reads = Path(path), reads
        self.offset, self.probe, self.stamp = 0, b"", Stamp(path)

    def read(self) -> tuple[bytes, bool]:
        """(the bytes after the offset, restarted); b"" when the file has not changed."""
        if not self.stamp.changed():
            return b"", False
        size = self.stamp.seen[0]
        with open(self.path, "rb") as f:
            restarted = size < self.offset or (self.offset > 0 and self._probe(f) != self.probe)
            if restarted:
                self.offset, self.probe = 0, b""
            f.seek(self.offset)
            data = f.read(max(size - self.offset, 0))
        self.reads.bytes += len(data)
        return data, restarted

    def _probe(self, f) -> bytes:
        start = max(self.offset - PROBE, 0)
        f.seek(start)
        got = f.read(self.offset - start)
        self.reads.bytes += len(got)
        return got

    def consumed(self, data: bytes, n: int):
        """The first n bytes of what `read` gave made whole records: start there next time.
        Bytes left over (a record being written) are read again once the file grows."""
        self.probe = (self.probe + data[:n])[-PROBE:]
        self.offset += n


def whole_lines(data: bytes) -> int:
    """How many bytes of `data` are whole lines (up to and with its last newline)."""
    return data.rfind(b"\n") + 1


class NewFiles:
    """Files appearing under a folder (and its subfolders), each given once, in path order. A
    folder is listed again only when its mtime changed, i.e. an entry was added or removed."""

    def __init__(self, root: Path, reads: Reads, wanted: Callable[[Path], bool],
                 descend: Callable[[Path], bool] = lambda folder: True):
        self.root, self.reads, self.wanted, self.descend = Path(root), reads, wanted, descend
        self.folders: dict[Path, int | None] = {self.root: None}
        self.seen: set[str] = set()

    def poll(self) -> list[Path]:
        new: list[Path] = []
        for folder in list(self.folders):
            try:
                mtime = os.stat(folder).st_mtime_ns
            except FileNotFoundError:
                continue
            if mtime != self.folders[folder]:
                self.folders[folder] = mtime
                new += self._list(folder)
        return sorted(new)

    def _list(self, folder: Path) -> list[Path]:
        self.reads.listings += 1
        new = []
        with os.scandir(folder) as entries:
            for e in entries:
                if e.is_dir():
                    if Path(e.path) not in self.folders and self.descend(Path(e.path)):
                        self.folders[Path(e.path)] = os.stat(e.path).st_mtime_ns
                        new += self._list(Path(e.path))
                elif e.path not in self.seen and self.wanted(Path(e.path)):
                    self.seen.add(e.path)
                    new.append(Path(e.path))
        return new


class NumberedFiles:
    """Files a trainer writes one per step into one folder, named by the step (TRL's
    completions_{step:05d}.parquet). The folder is listed once; after that a change of its
    mtime is answered by probing the names after the newest one (a few stats), not by listing
    a folder that holds thousands of them. A change the probe cannot explain (a file out of
    sequence) lists the folder again."""

    def __init__(self, folder: Path, reads: Reads, pattern: str, name: Callable[[int], str]):
        self.folder, self.reads, self.name = Path(folder), reads, name
        self.pattern = re.compile(pattern)
        self.mtime: int | None = None
        self.seen: set[str] = set()
        self.newest: int | None = None
        self.stride: int | None = None  # the smallest gap between two numbers seen: how far the probe looks

    def poll(self) -> list[Path]:
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except FileNotFoundError:
            return []
        if mtime == self.mtime:
            return []
        self.mtime = mtime
        new = self._probe() if self.newest is not None else []
        return new or self._list()

    def _take(self, paths: list[Path]) -> list[Path]:
        numbers = sorted(int(self.pattern.fullmatch(p.name).group(1)) for p in paths)
        known = ([self.newest] if self.newest is not None else []) + numbers
        gaps = [b - a for a, b in zip(known, known[1:]) if b > a]
        if gaps:
            self.stride = min(gaps + ([self.stride] if self.stride else []))
        self.newest = known[-1] if known else None
        self.seen |= {p.name for p in paths}
        return sorted(paths)

    def _probe(self) -> list[Path]:
        found, number, misses = [], self.newest, 0
        while misses < 2 * (self.stride or 1):  # two logging intervals' worth of names past the newest
            number += 1
            path = self.folder / self.name(number)
            if path.name not in self.seen and path.exists():
                found.append(path)
                misses = 0
            else:
                misses += 1
        return self._take(found) if found else []

    def _list(self) -> list[Path]:
        self.reads.listings += 1
        with os.scandir(self.folder) as entries:
            paths = [Path(e.path) for e in entries if e.name not in self.seen and self.pattern.fullmatch(e.name)]
        return self._take(paths)


class LayeredRows:
    """Per-step scalar rows from several parts of a source, merged in a fixed precedence (a
    later layer's value wins: the dumps' own counts over the log's averages), whichever part
    arrived first. Remembers which steps changed since `take`."""

    def __init__(self, layers: tuple[str, ...]):
        self.layers = {name: {} for name in layers}
        self.merged: dict[int, dict] = {}
        self.touched: set[int] = set()
        self.last: int | None = None  # the newest step

    def put(self, layer: str, step: int, row: dict):
        """Set (or add to) one layer's row at a step."""
        mine = self.layers[layer].setdefault(step, {})
        if all(mine.get(k, _MISSING) == v for k, v in row.items()):
            return
        mine.update(row)
        merged = {}
        for rows in self.layers.values():
            merged.update(rows.get(step, {}))
        self.merged[step] = merged
        self.touched.add(step)
        self.last = step if self.last is None else max(self.last, step)

    def take(self) -> list[int]:
        out, self.touched = sorted(self.touched), set()
        return out


_MISSING = object()


class SourceTail:
    """A kind's reader fed incrementally. `poll` reads what is new and says whether there was
    anything; `take` gives the steps whose rows or groups changed since it was last called;
    `run` is everything read so far as a SourceRun (its `scalars` are the merged rows)."""
    reads: Reads

    def poll(self) -> bool:
        raise NotImplementedError

    def take(self) -> list[int]:
        raise NotImplementedError

    def flush(self):
        """Finish what waits for the next poll (a history's newest step): `watch` is ending."""

    def run(self) -> SourceRun:
        raise NotImplementedError


class RereadTail(SourceTail):
    """A kind with no incremental reader: read whole again whenever any of its files changed."""

    def __init__(self, read: Callable[[Path], SourceRun], path: Path):
        self.read, self.path, self.reads = read, Path(path), Reads()
        self.signature, self.current, self.rows = None, None, LayeredRows(("all",))
        self.groups_given: set[int] = set()

    def poll(self) -> bool:
        files = [self.path] if self.path.is_file() else sorted(p for p in self.path.rglob("*") if p.is_file())
        signature = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
        if signature == self.signature:
            return False
        self.signature = signature
        self.reads.bytes += sum(s for _, s, _ in signature)
        self.current = self.read(self.path)
        for step, row in self.current.scalars.items():
            self.rows.put("all", step, row)
        for step in self.current.groups:
            if step not in self.groups_given:
                self.groups_given.add(step)
                self.rows.touched.add(step)
        return True

    def take(self) -> list[int]:
        return self.rows.take()

    def run(self) -> SourceRun:
        self.current.scalars = self.rows.merged
        return self.current


TAILS = {"verl": "verl:VerlReader", "tensorboard": "tensorboard_logs:EventsReader",
         "wandb": "wandb_file:WandbReader", "trl": "trl_tail:TrlReader",
         "trackio": "trackio_source:TrackioTail"}  # kind -> its reader (module:class)


def open_tail(kind: str, path: Path, read: Callable[[Path], SourceRun], **options) -> SourceTail:
    """The kind's incremental reader, or a RereadTail over its `read` (kinds.py's read_path);
    `options`: the kind's options given (trackio's run)."""
    if kind not in TAILS:
        return RereadTail(read, path)
    module, name = TAILS[kind].split(":")
    return getattr(importlib.import_module(f"grpo_core.integrations.{module}"), name)(Path(path), **options)
