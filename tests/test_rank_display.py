"""A run's rank count (meta "ranks": how many training processes wrote it) as readers show it:
RunMeta, list_runs, `python -m grpo_core status` and the Runs page, against real stores. A store
without the key (written before ranks were recorded) shows unknown, never 1."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.runs.run_index import list_runs
from grpo_core.runs.run_meta import FINISHED, RunMeta, ranks_label
from grpo_core.runs.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


def make_run(runs_dir, run_id: str, **meta) -> str:
    s = RunStore.create(run_id, {"grpo": {"steps": 10}}, root=runs_dir)
    s.set_status(FINISHED, **meta)
    s.close()
    return run_id


def status_cli(runs_dir, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_HEALTH_RUNS_DIR": str(runs_dir)}
    return subprocess.run([sys.executable, "-m", "grpo_core", "status", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value, parsed", [(2, 2), (1, 1), (None, None), (0, None), (-3, None), ("2", None),
                                           (2.0, None), (True, None)])
def test_ranks_parse_to_a_positive_int_or_unknown(value, parsed):
    meta = {} if value is None else {"ranks": value}
    assert RunMeta.parse(meta).ranks == parsed
    assert ranks_label(parsed) == ("unknown" if parsed is None else str(parsed))


def test_list_runs_has_ranks_and_none_when_the_store_does_not_say(runs_dir):
    make_run(runs_dir, "ddp", ranks=2)
    make_run(runs_dir, "old")  # a store from before ranks were written
    ranks = list_runs(runs_dir).set_index("run_id")["ranks"]
    assert ranks["ddp"] == 2 and isinstance(ranks["ddp"], int)
    assert ranks["old"] is None  # unknown: never guessed as 1 or 0
    assert ranks_label(float("nan")) == "unknown"  # as a DataFrame may hold a missing one


def test_status_cli_prints_ranks_or_unknown(runs_dir):
    make_run(runs_dir, "ddp", ranks=2)
    make_run(runs_dir, "old")
    r = status_cli(runs_dir, "ddp")
    assert r.returncode == 0, r.stderr
    assert "ranks: 2" in r.stdout.splitlines()
    r = status_cli(runs_dir, "old")
    assert r.returncode == 0, r.stderr
    assert "ranks: unknown" in r.stdout.splitlines()
    r = status_cli(runs_dir, "ddp", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ranks"] == 2
    r = status_cli(runs_dir, "old", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "ranks" in out and out["ranks"] is None


def test_runs_page_shows_the_rank_count(runs_dir):
    make_run(runs_dir, "ddp", ranks=2)
    make_run(runs_dir, "old")
    at = AppTest.from_file(str(ROOT / "pages" / "runs.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    timing = [c.value for c in at.caption if "ETA" in c.value]  # started / ETA / ranks, one per run
    assert [c.splitlines()[-1] for c in timing] == ["ranks unknown", "ranks 2"], timing  # newest first
