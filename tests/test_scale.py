"""Large runs: the store's step-list reads and size probe, and the report reading a large
run's rollouts for a sample of steps (same tables where they need every rollout of a window,
close estimates where they are means over groups, a notice saying so)."""
from __future__ import annotations

import numpy as np
import pytest

from grpo_core.analysis import ledger, report, run_data, run_tables
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import synth_run

CHANGE_AT = 60
NEW_W = {"answer_f1": 0.2, "exact": 0.5, "citation": 0.1, "format": 0.1, "length": 0.1}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    store = synth_run(root, "big", 120, P=8, G=4, changes={CHANGE_AT: NEW_W})
    store.close()
    return root / "big"


def test_step_list_reads_and_extent(run):
    with RunStore.open(run, readonly=True) as s:
        assert s.rollout_extent() == (1, 120, 32)
        part = s.rollouts(steps=[3, 50, 120], with_text=False)
        assert sorted(part["step"].unique()) == [3, 50, 120] and len(part) == 3 * 32
        full = s.rollouts(with_text=False)
        assert part.reset_index(drop=True).equals(full[full["step"].isin([3, 50, 120])].reset_index(drop=True))
        g = s.groups(steps=[7, 8])
        assert sorted(g["step"].unique()) == [7, 8] and len(g) == 16
        assert s.rollouts(steps=[], with_text=False).empty


def test_a_small_run_is_read_whole(run):
    data = run_data.load_run(run)
    assert data.sampled is None and len(data.rollouts) == 120 * 32


def test_a_large_run_is_read_at_sampled_steps_with_a_notice(run):
    window = 5
    full = run_data.load_run(run, window=window)
    part = run_data.load_run(run, window=window, budget=40 * 32)
    assert part.sampled == {"steps_read": len(part.rollouts["step"].unique()), "steps": 120, "rollouts": 120 * 32}
    read = set(part.rollouts["step"].unique())
    assert set(range(116, 121)) <= read  # the last window
    assert set(range(CHANGE_AT - window - 1, CHANGE_AT + window + 2)) <= read  # around the change
    assert 30 <= len(read) <= 45
    assert set(part.groups["step"].unique()) == read  # counts are logged: groups follow the sample
    # Every step still counts for trainability; the ledger's like-for-like reward reads whole windows.
    assert run_tables.steps_table(full, window).equals(run_tables.steps_table(part, window))
    lf, lp = ledger.change_ledger(full, window=window), ledger.change_ledger(part, window=window)
    assert lf.drop(columns="note").equals(lp.drop(columns="note"))
    # Means over groups: estimates from a third of the steps land near the whole run's values.
    bf, bp = run_tables.bottlenecks(full).set_index("metric"), run_tables.bottlenecks(part).set_index("metric")
    for col in ("mean_group_std", "uniform_fraction"):
        assert np.allclose(bf[col], bp[col], atol=0.08), col
    notes = [n.text for n in run_data.notices(part)]
    assert any("Large run" in t and "of its 120 steps" in t for t in notes)
    assert not any("Large run" in n.text for n in run_data.notices(full))


def test_build_report_on_a_sampled_run_has_examples_from_the_last_step(run, monkeypatch):
    monkeypatch.setattr(run_data, "ROLLOUT_BUDGET", 30 * 32)
    rep = report.build_report(run, window=5)
    assert rep.data.sampled is not None
    assert rep.examples and all(ex.step == 120 for ex in rep.examples)
