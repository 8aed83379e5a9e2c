"""verl: a job's outputs as a run, after the fact (`import`) or followed live (`watch`).

verl's `Tracking` (verl/utils/tracking.py) sends each step's metrics to its backends; two of
them are files this reads while the job runs:
- the file logger (`trainer.logger=[...,'file']`): one JSON line per step,
  {"step": N, "data": {name: value}}, at $VERL_FILE_LOGGER_PATH or <project>/<experiment>.jsonl;
  it writes no end record (finish() only closes the file);
- the console logger: `step:N - name:value - ...` lines in the job's stdout
  (verl.utils.logger.aggregate_logger.concat_dict_to_str). Under Ray the trainer runs in the
  TaskRunner actor, so Ray prints each line behind its worker prefix `(TaskRunner pid=N)` (with
  `, ip=...` from another node), in ANSI colours, and may append `[repeated Nx across
  cluster]`: those are stripped. The console also says how the job ends: `Total training
  steps: N` at the start and `Final validation metrics: ...` (pprint) when fit() returns after
  its last step, the only end record verl writes. Without it (or the last step reaching the
  total) a run is "incomplete: last step N", never finished.
And `trainer.rollout_data_dir`: a `{step}.jsonl` per step, one row per rollout with `input`,
`output`, `gts`, `score`, `step` and the reward function's extra infos (ray_trainer's
`_write_generations`). GRPO repeats each prompt `rollout.n` times, interleaved, so one
prompt's rows are consecutive: those are its group. A group is trainable when its scores are
not all equal (verl's GRPO advantages are 0 for equal scores: ART's and TRL's rule); the
score is the rollout's total and every numeric extra is a metric, so what-if and the group
inspector work. Names map through names.VERL_NAMES; any other name is kept as verl/<name>.

`VerlReader` is the one reader: `import` polls it once, `watch` polls it every few seconds and
it reads only what is new (byte offsets into the logs, new dump files: source_tail.py)."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from grpo_core.analysis import step_stats
from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.source_tail import FileTail, LayeredRows, NewFiles, Reads, SourceTail, Stamp, whole_lines
from grpo_core.runs import names
from grpo_core.runs.step_columns import StepGroups, StepRollouts
from grpo_core.tasks.task import prompt_id

CONSOLE_LINE = re.compile(r"^step:(\d+) - (.*)$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour codes (Ray's colorama prefix, a coloured terminal)
RAY_PREFIX = re.compile(r"^\((?:[\w.-]+ )?pid=\d+(?:, ip=[^)]*)?\)\s?")  # ray._private.worker.print_worker_logs
RAY_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")  # Ray's log deduplicator
TOTAL_STEPS = re.compile(r"Total training steps: (\d+)")  # RayPPOTrainer._create_dataloader
FINAL = "Final validation metrics:"  # RayPPOTrainer.fit, after the last step
SCORE = "score"  # the dump's total per rollout
CONSOLE_SUFFIXES = (".log", ".txt", ".out")


def map_key(key: str) -> str:
    return names.VERL_NAMES.get(key) or names.foreign("verl", key)


def map_metrics(data: dict, report: ImportReport) -> dict:
    """One step's {verl name: value} -> {stored name: value}; non-numbers reported."""
    row = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            report.skip(key, "not a number")
            continue
        name = map_key(key)
        if name != names.foreign("verl", key):
            report.mapped[key] = name
        if name == names.GROUPS_FILTERED:
            report.note("verl's dynamic sampling (algorithm.filter_groups) dropped groups whose scores were all "
                        f"equal: {names.GROUPS_FILTERED} counts them per step; the rollout dumps hold only the "
                        "groups kept for training")
        row[name] = float(value)
    return row


def parse_file_log(text: str, filename: str, report: ImportReport, first_line: int = 1) -> dict:
    """The file logger's JSONL -> step -> {verl name: value}; a line that is not {"step", "data"}
    is an error, except a last line without its newline that is not JSON yet (being written)."""
    rows: dict = {}
    lines = text.split("\n")
    for n, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if n == first_line + len(lines) - 1:  # no newline after it: the job is writing this line now
                report.note("the last line is incomplete (being written): read on the next poll")
                break
            raise ConfigError(f"{filename} line {n}: not JSON; verl's file logger writes "
                              '{"step": N, "data": {...}} per line') from None
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or \
                not isinstance(entry.get("data"), dict):
            raise ConfigError(f"{filename} line {n}: expected verl's file logger line "
                              '{"step": N, "data": {...}}, got ' + line[:60])
        report.entries += 1
        rows.setdefault(entry["step"], {}).update(entry["data"])
    return rows


def console_text(line: str) -> str:
    """A console line as verl printed it: Ray's worker prefix, colour codes and dedup note removed."""
    return RAY_REPEATED.sub("", RAY_PREFIX.sub("", ANSI.sub("", line).strip()))


def parse_console_log(text: str, report: ImportReport, marks: dict | None = None) -> dict:
    """`step:N - name:value - ...` lines -> step -> {verl name: value} (other output around them
    is ignored). `marks` gets what the console says of the job: total_steps, ended."""
    rows: dict = {}
    for raw in text.splitlines():
        line = console_text(raw)
        if marks is not None:
            if FINAL in line:
                marks["ended"] = True
            elif m := TOTAL_STEPS.search(line):
                marks["total_steps"] = int(m.group(1))
        m = CONSOLE_LINE.match(line)
        if not m:
            continue
        report.entries += 1
        data = {}
        for part in m.group(2).split(" - "):
            key, _, value = part.rpartition(":")
            try:
                data[key] = float(value)
            except ValueError:
                report.skip(key or part, "not a number")
        rows.setdefault(int(m.group(1)), {}).update(data)
    return rows


def _groups(rows: list[dict]) -> list[list[dict]]:
    """Consecutive rows with the same input: one prompt's group."""
    out: list[list[dict]] = []
    for r in rows:
        if out and out[-1][0].get("input") == r.get("input"):
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _metric_names(rows: list[dict]) -> list[str]:
    keys = [k for k, v in rows[0].items() if k not in ("input", "output", "gts", "step", "request_id")
            and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return [SCORE] + [k for k in keys if k != SCORE]


def dump_step(rows: list[dict], step: int, cum: tuple[int, int], report: ImportReport):
    """One step's rollout dump -> (scalars, StepGroups, StepRollouts), or None when its groups
    differ in size (a filtered step: not one [P, G] batch)."""
    groups = _groups(rows)
    size = len(groups[0])
    if any(len(g) != size for g in groups):
        report.skip(f"rollouts of step {step}", f"groups of different sizes {sorted({len(g) for g in groups})}")
        return None
    metrics = _metric_names(rows)
    scores = np.array([[[_num(r.get(m)) for m in metrics] for r in g] for g in groups])  # [P, G, K]
    totals = scores[:, :, 0]
    stats = step_stats.group_stats(totals, scores, min_group_std=0.0)
    scalars = step_stats.step_scalars(stats, scores, metrics, dict.fromkeys(metrics, 0.0) | {SCORE: 1.0}, *cum)
    P = len(groups)
    step_groups = StepGroups(np.arange(P), [prompt_id(str(g[0].get("input", ""))) for g in groups], size,
                             stats.mean, stats.std, stats.trainable, stats.phantom,
                             prompt_text=[str(g[0].get("input", "")) for g in groups])
    flat = [r for g in groups for r in g]
    rollouts = StepRollouts(metrics, np.repeat(np.arange(P), size), np.tile(np.arange(size), P), totals.reshape(-1),
                            scores.reshape(P * size, -1), [str(r.get("output", "")) for r in flat], [None] * len(flat))
    return scalars, step_groups, rollouts


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else float("nan")


def parse_dump(data: bytes, path: Path, cum: tuple[int, int], report: ImportReport, final: bool):
    """One dump file's bytes -> dump_step's triple; None when it is empty or its groups differ in
    size; "partial" while it is being written (under `import`: reported, then None)."""
    text = data.decode("utf-8", errors="replace")
    try:
        rows = [json.loads(ln) for ln in text.splitlines() if ln.strip()]
    except json.JSONDecodeError:
        rows = None
    if rows is None or (text and not text.endswith("\n") and not final):
        if final:
            report.note(f"{path.name} is incomplete (being written): read on the next poll")
        return None if final else "partial"
    return dump_step(rows, int(path.stem), cum, report) if rows else None


def is_file_log(first_line: bytes) -> bool:
    return first_line.startswith(b'{"step"')


class VerlReader(SourceTail):
    """A verl output (a file logger JSONL, a console log, a rollout dump folder, or a folder with
    any of them), read incrementally: logs from where the last read stopped, dump files once."""

    def __init__(self, path: Path):
        self.path, self.reads = Path(path), Reads()
        self.report = ImportReport(source="verl", file=str(self.path))
        self.rows = LayeredRows(("console", "log", "dump"))  # the dumps' own counts and means win
        self.logs: dict[Path, tuple[str, FileTail]] = {}  # file -> ("log" | "console", its tail)
        self.lines: dict[Path, int] = {}
        self.unsorted: dict[Path, Stamp] = {}  # .jsonl files not known yet to be a file log
        self.dumps: dict[int, tuple[Path, Stamp]] = {}  # waiting to be read (written, or being written)
        self.dump_folder: Path | None = None
        self.groups: dict = {}
        self.cum, self.metrics, self.sizes = (0, 0), {SCORE}, set()
        self.marks: dict = {}
        self.found = NewFiles(self.path, self.reads, self._wanted) if self.path.is_dir() else None
        if self.found is None:
            self.unsorted[self.path] = Stamp(self.path)

    @staticmethod
    def _wanted(p: Path) -> bool:
        return p.suffix == ".jsonl" or p.suffix in CONSOLE_SUFFIXES

    def poll(self, final: bool = False) -> bool:
        """Read what is new; `final` (import): what is half-written now is read as it stands."""
        before = (self.reads.bytes, len(self.rows.touched))
        for p in self.found.poll() if self.found else []:
            self._sort(p)
        for p, stamp in list(self.unsorted.items()):
            self._classify(p, stamp)
        for p, (kind, tail) in self.logs.items():
            self._read_log(p, kind, tail, final)
        self._read_dumps(final)
        return (self.reads.bytes, len(self.rows.touched)) != before

    def take(self) -> list[int]:
        return self.rows.take()

    def _sort(self, p: Path):
        if p.suffix == ".jsonl" and p.stem.isdigit():
            self.dump_folder = self.dump_folder or p.parent
            if p.parent == self.dump_folder:
                self.dumps[int(p.stem)] = (p, Stamp(p))
            else:
                self.report.skip(f"rollout dumps in {p.parent.name}", f"a second dump folder ({self.dump_folder} read)")
        elif p.suffix == ".jsonl":
            self.unsorted[p] = Stamp(p)
        else:
            self.logs[p] = ("console", FileTail(p, self.reads))

    def _classify(self, p: Path, stamp: Stamp):
        """A file logger's JSONL starts with {"step"; a JSONL that does not is not verl's; an
        empty one waits for its first line. A lone file that is not JSONL is a console log."""
        if not stamp.changed():
            return
        with open(p, "rb") as f:
            first = f.readline()
        self.reads.bytes += len(first)
        if not first.strip():
            return
        del self.unsorted[p]
        if is_file_log(first):
            self.logs[p] = ("log", FileTail(p, self.reads))
        elif self.found is None:  # the path given is this file: its console output
            self.logs[p] = ("console", FileTail(p, self.reads))

    def _read_log(self, p: Path, kind: str, tail: FileTail, final: bool):
        data, restarted = tail.read()
        if restarted:  # verl reopens its file log with "wb" when a job resumes: every line again
            self.lines[p] = 0
            self.report.note(f"{p.name} was rewritten (a resumed job): read again from its start")
        n = len(data) if final else whole_lines(data)
        if not n:
            return
        text = data[:n].decode("utf-8", errors="replace")
        if kind == "log":
            rows = parse_file_log(text, p.name, self.report, self.lines.get(p, 0) + 1)
        else:
            rows = parse_console_log(text, self.report, self.marks)
        tail.consumed(data, n)
        self.lines[p] = self.lines.get(p, 0) + text.count("\n")
        for step, data_ in rows.items():
            self.rows.put(kind, step, map_metrics(data_, self.report))

    def _read_dumps(self, final: bool):
        """Dumps in step order (the cumulative counts run through them); one being written
        stops the rest until the next poll."""
        for step in sorted(self.dumps):
            p, stamp = self.dumps[step]
            if not stamp.changed() and not final:
                break  # unchanged since it was last found half-written
            data = p.read_bytes()
            self.reads.bytes += len(data)
            got = parse_dump(data, p, self.cum, self.report, final)
            if got == "partial":
                break
            del self.dumps[step]
            if got is None:
                continue
            scalars, step_groups, rollouts = got
            self.cum = (int(scalars[names.CUM_GROUPS_SUBMITTED]), int(scalars[names.CUM_GROUPS_TRAINABLE]))
            self.groups[step] = (step_groups, rollouts)
            self.metrics |= set(rollouts.names)
            self.sizes.add(len(rollouts) // len(step_groups))
            self.rows.put("dump", step, scalars)
            self.rows.touched.add(step)  # its groups are new even where the scalars are not

    def run(self) -> SourceRun:
        """Everything read so far as a SourceRun."""
        if not (self.logs or self.groups or self.dumps):
            raise ConfigError(f"{self.path}: no verl output found (a file logger .jsonl with {{\"step\": N, "
                              "\"data\": ...}} lines, a console log with 'step:N - ...' lines, or "
                              "trainer.rollout_data_dir's {step}.jsonl)")
        no_dumps = "no rollout dumps (trainer.rollout_data_dir): no group counts, what-if or inspector"
        if not self.groups:
            self.report.note(no_dumps)
        elif no_dumps in self.report.notes:
            self.report.notes.remove(no_dumps)
        metrics = sorted(self.metrics)
        # verl's GRPO trains a group iff its scores are not all equal: min_group_std 0, as for ART and TRL
        planned = self.marks.get("total_steps")
        config = {"reward": {"weights": dict.fromkeys(metrics, 0.0) | {SCORE: 1.0}},
                  "grpo": {"min_group_std": 0.0, "steps": planned,
                           **({"group_size": next(iter(self.sizes))} if len(self.sizes) == 1 else {})}}
        last = self.rows.last
        ended = bool(self.marks.get("ended"))
        finished = True if ended else (None if planned and last is not None and last >= planned else False)
        return SourceRun(self.rows.merged, config, self.report, groups=self.groups,
                         lacks=[] if self.groups else ["groups", "rollouts"], finished=finished,
                         last_step=last, planned=planned, ended=ended)


def read_source(path) -> SourceRun:
    """A verl output (a file logger JSONL, a console log, a rollout dump folder, or a folder
    with any of them) -> SourceRun: the reader `watch` polls, read once."""
    reader = VerlReader(Path(path))
    reader.poll(final=True)
    return reader.run()
