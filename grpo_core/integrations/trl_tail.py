"""A TRL output dir followed by `watch`, reading only what changed.

TRL writes two things while it trains (trl_state.read_trl_path reads both once, for `import`):
trainer_state.json, rewritten whole at each checkpoint (checkpoint-N/) and at the end (the
dir itself), and completions/completions_{step}.parquet, a new file at each logging step
(log_completions=True). So a poll re-reads the newest trainer_state only when its size or
mtime changed, finds new parquet files by probing the names after the newest one
(source_tail.NumberedFiles: the folder holds one per logging step, thousands on a long run),
and reads each once, with the same parsers as `import`
(trl_state.parse_trl_state, trl_completions.parse_completions); the cumulative group counts
run on from file to file. Steps whose values changed are the ones written again.
"""
from __future__ import annotations

import re
from pathlib import Path

from grpo_core.analysis.step_stats import trainable_ratio
from grpo_core.errors import ConfigError
from grpo_core.integrations.base import ImportReport, SourceRun
from grpo_core.integrations.scalar_history import merge_report
from grpo_core.integrations.source_tail import LayeredRows, NewFiles, NumberedFiles, Reads, SourceTail, Stamp
from grpo_core.integrations.trl_completions import parse_completions, read_frame
from grpo_core.integrations.trl_state import parse_trl_state
from grpo_core.runs import names

CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def _wanted(p: Path) -> bool:
    return p.name == "trainer_state.json"


def state_rank(p: Path) -> int:
    """Which trainer_state is newest: the dir's own (written at the end) over any checkpoint's."""
    m = CHECKPOINT.search(p.parent.name)
    return int(m.group(1)) if m else 1 << 62


class TrlReader(SourceTail):
    def __init__(self, path: Path, groups_per_step: int | None = None):
        self.path, self.gps, self.reads = Path(path), groups_per_step, Reads()
        is_dir = self.path.is_dir()
        self.found = NewFiles(self.path, self.reads, _wanted, lambda d: d.name != "completions") if is_dir else None
        self.completions = NumberedFiles(self.path / "completions", self.reads, r"completions_(\d+)\.parquet",
                                         lambda step: f"completions_{step:05d}.parquet") if is_dir else None
        self.state_path: Path | None = None if self.found else self.path
        self.stamp = Stamp(self.state_path) if self.state_path else None
        self.rows = LayeredRows(("state", "completions"))  # the groups' own counts and means win
        self.state_run: SourceRun | None = None
        self.parquets: list[tuple[Path, Stamp]] = []  # found, not read yet (or being written)
        self.groups, self.cum, self.completions_config = {}, (0.0, 0.0), None
        self.report = ImportReport("trl", str(self.path))
        self.notes: dict[str, str] = {}

    def poll(self, final: bool = False) -> bool:
        before = len(self.rows.touched)
        for p in self.found.poll() if self.found else []:  # trainer_state.json files (checkpoints too)
            if self.state_path is None or state_rank(p) > state_rank(self.state_path):
                self.state_path, self.stamp = p, Stamp(p)
        self.parquets += [(p, Stamp(p)) for p in (self.completions.poll() if self.completions else [])]
        if self.stamp is not None and self.stamp.changed():
            self._read_state()
        self._read_parquets(final)
        return len(self.rows.touched) != before

    def _read_state(self):
        data = self.state_path.read_bytes()
        self.reads.bytes += len(data)
        self.state_run = parse_trl_state(data, str(self.state_path), self.gps)
        for step, row in self.state_run.scalars.items():
            self.rows.put("state", step, row)

    def _read_parquets(self, final: bool):
        waiting = []
        for p, stamp in sorted(self.parquets):
            if not stamp.changed() and not final:
                waiting.append((p, stamp))
                continue
            data = p.read_bytes()
            self.reads.bytes += len(data)
            try:
                run = parse_completions([(str(p), read_frame(data, str(p)))], str(p))
            except ConfigError:
                if final:
                    raise
                waiting.append((p, stamp))  # being written: read again once it changes
                continue
            self._add_completions(run)
        self.parquets = waiting

    def _add_completions(self, run: SourceRun):
        """One file's steps, its cumulative counts run on from the files before it."""
        base_s, base_t = self.cum
        for step in sorted(run.scalars):
            row = dict(run.scalars[step])
            cs = row[names.CUM_GROUPS_SUBMITTED] + base_s
            ct = row[names.CUM_GROUPS_TRAINABLE] + base_t
            row.update({names.CUM_GROUPS_SUBMITTED: cs, names.CUM_GROUPS_TRAINABLE: ct,
                        names.CUM_TRAINABLE_RATIO: trainable_ratio(cs, ct)})
            self.cum = (cs, ct)
            self.rows.put("completions", step, row)
            self.groups[step] = run.groups[step]
            self.rows.touched.add(step)
        self.completions_config = self.completions_config or run.config
        merge_report(self.report, run.report, notes=False)
        for note in run.report.notes:  # a note with a count is replaced by its newer count
            self.notes[re.sub(r"\d+", "#", note)] = note

    def take(self) -> list[int]:
        return self.rows.take()

    def run(self) -> SourceRun:
        if self.state_run is None and not self.groups:
            raise ConfigError(f"{self.path}: no trainer_state.json yet and no completions/*.parquet (TRL writes the "
                              "first at each checkpoint, the second with log_completions=True)")
        base = self.state_run
        report = ImportReport("trl", str(self.path))
        if base is not None:
            merge_report(report, base.report)
        merge_report(report, self.report)
        for note in self.notes.values():
            report.note(note)
        config = dict(base.config) if base else {"source": "trl", "grpo": {}}
        if self.completions_config:  # what the parquet files say of the rewards and groups
            config["reward"] = self.completions_config["reward"]
            config["grpo"] = {**config.get("grpo", {}), "group_size": self.completions_config["grpo"]["group_size"]}
        return SourceRun(self.rows.merged, config, report, base.summary if base else {}, groups=self.groups,
                         lacks=[] if self.groups else ["groups", "rollouts"],
                         finished=base.finished if base else None, last_step=base.last_step if base else None,
                         planned=base.planned if base else None)
