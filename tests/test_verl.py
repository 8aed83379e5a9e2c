"""verl's outputs as runs, made by verl's own code: its `Tracking` file logger and console
logger (verl/utils/tracking.py, verl/utils/logger/aggregate_logger.py) and its rollout dump
writer (`RayPPOTrainer._write_generations`, ray_trainer.py). verl itself is not importable
here (its package __init__ pulls Ray and a CUDA torch), so make test installs its files
without dependencies into .venv/verl-src and these tests load those three pieces by path:
the code that writes the logs, not a restatement of it."""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_core.errors import ConfigError
from grpo_core.integrations import follow, source_tail, verl
from grpo_core.runs import names
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import REPO, wait_for

VERL = REPO / ".venv" / "verl-src" / "verl"
pytestmark = pytest.mark.skipif(not VERL.is_dir(), reason="make test installs verl's files into .venv/verl-src")
STEPS, PROMPTS, N = 4, 3, 4


def load(relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, VERL / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_generations():
    """ray_trainer's staticmethod _write_generations, compiled from verl's own source."""
    tree = ast.parse((VERL / "trainer" / "ppo" / "ray_trainer.py").read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    fn.decorator_list = []
    scope = {"os": os, "json": json}
    exec(compile(ast.Module([fn], []), "ray_trainer.py", "exec"), scope)
    return scope["_write_generations"]


def step_metrics(step: int) -> dict:
    return {"critic/score/mean": 0.1 * step, "actor/pg_loss": -0.01 * step, "actor/entropy": 1.5 - 0.1 * step,
            "actor/pg_clipfrac": 0.0, "actor/lr": 1e-6, "response_length/mean": 40.0 + step,
            "timing_s/step": 2.5, "perf/throughput": 1000.0}


def scores_of(step: int) -> list[list[float]]:
    """Per prompt, its N rollouts' scores: prompt 0 always solved (all equal), the others vary."""
    return [[1.0] * N] + [[float((i + step + p) % 2) for i in range(N)] for p in range(1, PROMPTS)]


class Job:
    """A verl job writing its outputs step by step, through verl's own writers: the file logger
    (Tracking, default_backend="file"), the console logger, and the rollout dump writer."""

    def __init__(self, root: Path, metrics=None):
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.metrics, self.out = root, metrics or step_metrics, io.StringIO()
        tracking = load("utils/tracking.py", "verl_tracking")
        self.console = load("utils/logger/aggregate_logger.py", "verl_aggregate_logger").LocalLogger(True)
        os.environ["VERL_FILE_LOGGER_PATH"] = str(root / "exp.jsonl")
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                self.tracker = tracking.Tracking("proj", "exp", default_backend="file")
        finally:
            del os.environ["VERL_FILE_LOGGER_PATH"]
        self.dump = write_generations()

    def log(self, step: int):
        with contextlib.redirect_stdout(self.out):
            self.tracker.log(self.metrics(step), step)
            self.console.log(self.metrics(step), step)

    def write_dump(self, step: int):
        scores = scores_of(step)
        inputs = [f"Q{p}: what is {p}+{step}?" for p in range(PROMPTS) for _ in range(N)]
        flat = [s for row in scores for s in row]
        with contextlib.redirect_stdout(io.StringIO()):
            self.dump(inputs, [f"answer {i}" for i in range(len(inputs))], [None] * len(inputs), flat,
                      {"acc": flat, "pred": [str(s) for s in flat]}, str(self.root / "rollouts"), step)

    def step(self, step: int):
        self.log(step)
        self.write_dump(step)


def make_outputs(root: Path, steps=range(1, STEPS + 1)) -> tuple[Path, str]:
    """A verl job's outputs for `steps`: file log, console transcript, rollout dumps."""
    job = Job(root)
    for step in steps:
        job.step(step)
    job.tracker.finish()
    return root, job.out.getvalue()


def ray_console(lines: str, total: int | None = None, final: bool = False) -> str:
    """The job's stdout as Ray's driver prints it: the trainer runs in the TaskRunner actor, so
    each line comes behind ray._private.worker.print_worker_logs' prefix (colorama: DIM, CYAN,
    `(TaskRunner pid=N)`, RESET_ALL), and the log deduplicator appends a coloured `[repeated Nx
    across cluster]`. `total`: RayPPOTrainer's `print(f"Total training steps: ...")`; `final`:
    fit()'s `pprint(f"Final validation metrics: ...")` after the last step."""
    from pprint import pprint
    before = f"Total training steps: {total}\n" if total else ""
    after = io.StringIO()
    if final:
        with contextlib.redirect_stdout(after):
            pprint(f"Final validation metrics: {None}")
    prefix = "\x1b[2m\x1b[36m(TaskRunner pid=12345)\x1b[0m "
    out = []
    for i, line in enumerate((before + lines + after.getvalue()).splitlines()):
        repeated = " \x1b[32m[repeated 2x across cluster]\x1b[0m" if i % 3 == 1 else ""
        out.append(prefix + line + repeated)
    return "(raylet) some startup noise\n" + "\n".join(out) + "\n"


def test_verls_file_log_console_log_and_dumps_read_as_one_run(tmp_path):
    root, console = make_outputs(tmp_path)
    (root / "train.log").write_text("some startup noise\n" + console)
    run = verl.read_source(root)
    assert sorted(run.scalars) == [1, 2, 3, 4] and sorted(run.groups) == [1, 2, 3, 4]
    row = run.scalars[2]
    assert row[names.LOSS_POLICY] == -0.02 and row[names.LEARNING_RATE] == 1e-6
    assert row[names.COMPLETION_MEAN_LENGTH] == 42.0 and row["verl/perf/throughput"] == 1000.0
    assert row[names.GROUPS_SUBMITTED] == PROMPTS and row[names.GROUPS_TRAINABLE] == PROMPTS - 1
    assert row[names.TRAINABLE_RATIO] == pytest.approx((PROMPTS - 1) / PROMPTS)
    assert row[names.CUM_GROUPS_SUBMITTED] == 2 * PROMPTS
    assert row[names.REWARD] == pytest.approx(np.mean(scores_of(2)))  # the dumps' group means win
    groups, rollouts = run.groups[2]
    assert rollouts.names == ["score", "acc"] and len(rollouts) == PROMPTS * N
    assert groups.prompt_text[1] == "Q1: what is 1+2?" and not groups.trainable[0]
    console_only = verl.read_source(root / "train.log")
    assert console_only.scalars[3][names.LOSS_POLICY] == pytest.approx(-0.03) and not console_only.groups


def test_a_verl_import_works_on_the_live_page_with_what_if(tmp_path):
    from grpo_core.dashboard import advice, live_view
    root, _ = make_outputs(tmp_path / "job")
    rid = follow.follow("verl", root, run_id="v", root=tmp_path / "runs", max_polls=1, log=lambda m: None)
    with RunStore.open(tmp_path / "runs" / rid, readonly=True) as store:
        assert store.last_step() == STEPS and len(store.rollouts()) == STEPS * PROMPTS * N
        assert store.prompt_texts([store.groups()["prompt_id"].iloc[0]])
    state = live_view.load(tmp_path / "runs" / rid)
    assert state.last_step == STEPS
    recorded = np.mean([(PROMPTS - 1) / PROMPTS] * STEPS)
    wi = advice.what_if(state, {"score": 1.0, "acc": 0.0}, 0.0)
    assert wi["available"] and wi["now"] == pytest.approx(recorded)
    assert advice.what_if(state, {"score": 0.0, "acc": 1.0}, 0.0)["predicted"] == pytest.approx(recorded)  # acc = score


def test_import_verl_is_finished_only_on_verls_end_record(tmp_path):
    """verl's file logger writes no end record (finish() closes the file): a job's file log alone
    stopped at its last step, whether it finished unknown; its console says the total (incomplete:
    step N of M) and, after the last step, `Final validation metrics` (finished)."""
    from grpo_core.__main__ import main
    root, console = make_outputs(tmp_path / "job")
    runs = tmp_path / "runs"

    def status(rid):
        assert main(["import", "verl", str(root), "--run-id", rid, "--runs-dir", str(runs)]) == 0
        with RunStore.open(runs / rid, readonly=True) as s:
            meta = s.get_meta()
            assert s.last_step() == STEPS and len(s.groups()) == STEPS * PROMPTS
            return meta["status"], meta.get("status_detail")

    assert status("alone") == ("unknown", f"stopped at step {STEPS}: the source records no end, so whether the run "
                                          "finished is unknown")
    (root / "train.log").write_text(ray_console(console, total=STEPS + 2))
    assert status("short") == ("incomplete", f"incomplete: step {STEPS} of {STEPS + 2}")
    (root / "train.log").write_text(ray_console(console, total=STEPS, final=True))
    assert status("done") == ("finished", None)


def test_a_console_log_printed_under_ray_imports_every_step(tmp_path):
    """Ray's colour codes, `(TaskRunner pid=N)` prefix and dedup note around each line are not
    verl's: the steps and values are the file log's."""
    root, console = make_outputs(tmp_path / "job")
    log = tmp_path / "ray.log"
    log.write_text(ray_console(console, total=STEPS, final=True))
    run, file_log = verl.read_source(log), verl.read_source(root / "exp.jsonl")
    assert sorted(run.scalars) == list(range(1, STEPS + 1)) and run.scalars == file_log.scalars
    assert run.finished and run.planned == STEPS and run.ended
    assert file_log.finished is False and not file_log.ended


def test_verls_filter_groups_counts_map_to_our_names(tmp_path):
    """Dynamic sampling (algorithm.filter_groups): verl's replay buffer logs the groups it
    evicted for equal scores and the surplus it discarded, summed per step (v1/utils.py)."""
    def with_filtering(step):
        return step_metrics(step) | {"training/filter_groups/evicted_samples": float(step),
                                     "training/filter_groups/discarded_surplus_samples": 1.0}
    job = Job(tmp_path / "job", metrics=with_filtering)
    for step in (1, 2):
        job.step(step)
    run = verl.read_source(tmp_path / "job")
    assert run.scalars[2][names.GROUPS_FILTERED] == 2.0 and run.scalars[2][names.GROUPS_SURPLUS] == 1.0
    assert run.report.mapped["training/filter_groups/evicted_samples"] == names.GROUPS_FILTERED
    assert any("filter_groups" in n for n in run.report.notes)


def test_a_watched_job_is_read_once_and_has_every_step_once(tmp_path):
    """`watch`'s loop (follow.write_new after each poll) while verl writes: each step's log line
    in one poll, its dump (verl writes it from a background thread) in the next. The run has
    every step once, with its groups once; a poll with nothing new reads no byte, and a new
    step costs its new line and its dump file, not the old ones."""
    job, runs = Job(tmp_path / "job"), tmp_path / "runs"
    tail, grouped = verl.VerlReader(tmp_path / "job"), set()
    store = RunStore.create("w", {}, root=runs, kind="watch")

    def poll():
        tail.poll()
        follow.write_new(store, tail, tail.run(), grouped)

    log, dumps = tmp_path / "job" / "exp.jsonl", tmp_path / "job" / "rollouts"
    for step in range(1, 7):
        size, before = log.stat().st_size, tail.reads.bytes
        job.log(step)
        poll()
        if step > 1:  # (the first poll also reads the first line once, to tell a file log from other JSONL)
            probe = source_tail.PROBE  # the bytes before the offset, checked: a rewritten file shows there
            assert tail.reads.bytes - before == log.stat().st_size - size + probe  # the new line only
        before = tail.reads.bytes
        job.write_dump(step)
        poll()
        dump_bytes = (dumps / f"{step}.jsonl").stat().st_size
        assert tail.reads.bytes - before == dump_bytes  # the new dump file only
        before = tail.reads.bytes
        assert not tail.poll() and tail.reads.bytes == before  # nothing new: no byte read
        wide = store.scalars_wide()
        assert wide.index.tolist() == list(range(1, step + 1))
        assert len(store.groups()) == step * PROMPTS and len(store.rollouts()) == step * PROMPTS * N
        assert wide.loc[step, names.LOSS_POLICY] == pytest.approx(-0.01 * step)  # from the log line
        assert wide.loc[step, names.REWARD] == pytest.approx(np.mean(scores_of(step)))  # the dump's wins
        assert wide.loc[step, names.CUM_GROUPS_SUBMITTED] == step * PROMPTS
    store.close()
    whole = verl.read_source(tmp_path / "job")  # `import`: the same reader, once
    assert whole.scalars == tail.run().scalars


def test_bad_verl_input_is_one_line(tmp_path):
    bad = tmp_path / "exp.jsonl"
    bad.write_text('{"step": 1, "data": {"a": 1}}\n{"nope": 2}\n{"step": 3, "data": {}}\n')
    with pytest.raises(ConfigError, match=r"exp.jsonl line 2: expected verl's file logger line"):
        verl.read_source(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no verl output found"):
        verl.read_source(empty)


@pytest.mark.slow
def test_watch_follows_a_growing_verl_job_then_shows_it_stale(tmp_path):
    """`python -m grpo_core watch verl DIR`: steps appear as the job writes them; the run is
    running while the outputs grow, stale once they stop (the heartbeat ages)."""
    job, runs = tmp_path / "job", tmp_path / "runs"
    job.mkdir()
    make_outputs(job, steps=[1])
    proc = subprocess.Popen([sys.executable, "-m", "grpo_core", "watch", "verl", str(job), "--run-id", "w",
                             "--runs-dir", str(runs), "--every", "0.2"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def steps():
            try:
                with RunStore.open(runs / "w", readonly=True) as s:
                    return s.last_step() or 0
            except Exception:
                return 0
        wait_for(lambda: steps() >= 1 or None, 60, what="the first step")
        for step in (2, 3):
            make_outputs(job, steps=range(1, step + 1))  # verl rewrites its file log; the dumps add a file
            wait_for(lambda: steps() >= step or None, 30, what=f"step {step}")
            assert list_runs(runs).set_index("run_id").loc["w", "status"] == "running"
        wait_for(lambda: list_runs(runs).set_index("run_id").loc["w", "status"] == "stale" or None, 30,
                 what="stale once the job stops writing")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
