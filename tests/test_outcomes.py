"""Why a group taught nothing (all solved / none solved / uniform) and the sampling it
wasted: hand-computed groups, then the real trainer's store."""
from __future__ import annotations

import numpy as np
import pytest

from grpo_core.analysis import step_stats
from grpo_core.runs import names
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train.trainer import Trainer

KINDS = {"exact": "binary", "f1": "continuous", "length": "penalty", "mine": "custom"}


def test_outcomes_by_the_outcome_metric_and_by_the_totals_range():
    # 4 groups of 3: solved, unsolved, mixed (trainable), a middling constant
    exact = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 1], [0.5, 0.5, 0.5]], float)
    length = np.array([[0, 0, 0], [-1, -1, -1], [0, 0, -0.5], [0, 0, 0]], float)
    scores = np.stack([exact, length], axis=2)
    trainable = np.array([False, False, True, False])
    names_ = ["exact", "length"]
    by_outcome = step_stats.group_outcomes(trainable, exact, scores, names_, KINDS, {"exact": 1, "length": 1}, "exact")
    assert by_outcome.tolist() == [step_stats.SOLVED, step_stats.UNSOLVED, step_stats.MIXED, step_stats.UNIFORM]
    totals = exact + 0.5 * length  # range [-0.5, 1]: 1 at the top, -0.5 at the bottom
    by_total = step_stats.group_outcomes(trainable, totals, scores, names_, KINDS, {"exact": 1, "length": 0.5})
    assert by_total.tolist() == [step_stats.SOLVED, step_stats.UNSOLVED, step_stats.MIXED, step_stats.UNIFORM]
    unknown = step_stats.group_outcomes(trainable, totals, scores, ["exact", "mine"], KINDS, {"exact": 1, "mine": 1})
    assert unknown.tolist() == [step_stats.UNIFORM, step_stats.UNIFORM, step_stats.MIXED, step_stats.UNIFORM]  # custom: no range
    assert step_stats.outcome_counts(by_outcome) == {names.GROUPS_SOLVED: 1.0, names.GROUPS_UNSOLVED: 1.0}


def test_wasted_compute_counts_the_tokens_of_groups_that_taught_nothing():
    tokens = np.array([[4, 6], [10, 10], [1, 1]])
    out = step_stats.wasted_compute(tokens, np.array([True, False, False]), 3.2, (100, 40))
    assert out[names.WASTED_TOKENS] == 22 and out[names.WASTED_SAMPLING_S] == pytest.approx(3.2 * 22 / 32)
    assert out[names.CUM_SAMPLED_TOKENS] == 132 and out[names.CUM_WASTED_TOKENS] == 62
    assert out[names.WASTED_SHARE] == pytest.approx(62 / 132)


def trained(root, run_id: str) -> RunStore:
    """A real 3-step run of the tiny built-in model (no warm-start): its open store."""
    cfg = load_config(None, ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                             "model.intermediate_size=64", "model.warm_start_steps=0", "grpo.prompts_per_step=3",
                             "grpo.group_size=4", "grpo.max_new_tokens=6", "grpo.steps=3", "log.progress=false",
                             "log.checkpoint_every=0"])
    store = RunStore.create(run_id, cfg.to_dict(), root=root)
    assert Trainer(cfg, store, log=lambda m: None).run() == "finished"
    return store


def test_the_trainer_logs_outcomes_per_group_and_wasted_compute_per_step(tmp_path):
    store = trained(tmp_path, "o")
    groups, wide = store.groups(), store.scalars_wide()
    assert groups["outcome"].notna().all()
    assert (groups["outcome"] == step_stats.MIXED).tolist() == groups["trainable"].tolist()
    per_step = groups.groupby("step")["outcome"].apply(lambda o: float((o == step_stats.SOLVED).sum()))
    assert wide[names.GROUPS_SOLVED].tolist() == per_step.tolist()
    lengths = store.scalars_wide()[names.COMPLETION_MEAN_LENGTH] * 12
    assert wide[names.CUM_SAMPLED_TOKENS].tolist() == pytest.approx(lengths.cumsum().tolist())
    untrainable = 1 - wide[names.TRAINABLE_RATIO]
    assert ((wide[names.WASTED_TOKENS] > 0) == (untrainable > 0)).all()
    store.close()
    from grpo_core.__main__ import main
    from grpo_core.analysis import prompt_history
    table = prompt_history.load(tmp_path / "o")
    assert table["sampled"].sum() == 9 and table["prompt"].notna().all()
    out = tmp_path / "never.jsonl"
    assert main(["prompts", str(tmp_path / "o"), "--never-trainable", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == int((table["trainable"] == 0).sum())
    from streamlit.testing.v1 import AppTest

    from tests.helpers_dashboard import REPO
    page = AppTest.from_file(str(REPO / "pages" / "analysis.py"), default_timeout=60)
    page.session_state["run_id"] = "o"
    import os
    os.environ["GRPO_HEALTH_RUNS_DIR"] = str(tmp_path)
    try:
        page.run()
    finally:
        del os.environ["GRPO_HEALTH_RUNS_DIR"]
    assert not page.exception, [e.value for e in page.exception]
    shown = [d.value for d in page.dataframe if "trainable_rate" in d.value.columns]
    assert len(shown) == 1 and shown[0]["sampled"].sum() == 9


def test_the_prompt_table_counts_each_prompts_groups_and_exports_the_never_trainable(tmp_path):
    import json

    import pandas as pd

    from grpo_core.analysis import prompt_history
    groups = pd.DataFrame({"step": [1, 1, 2, 2, 3], "group": [0, 1, 0, 1, 0], "prompt_id": ["a", "b", "a", "c", "a"],
                           "trainable": [False, True, False, True, False],
                           "outcome": [step_stats.SOLVED, step_stats.MIXED, step_stats.SOLVED, step_stats.MIXED, step_stats.UNSOLVED]})
    table = prompt_history.prompt_table(groups, {"a": "2+2=", "b": "3+3="})
    assert table["prompt_id"].tolist() == ["a", "b", "c"]  # the never trainable first
    a = table.iloc[0]
    assert (a["sampled"], a["trainable"], a["all_solved"], a["none_solved"], a["last_outcome"], a["prompt"]) == \
        (3, 0, 2, 1, step_stats.UNSOLVED, "2+2=")
    lines = prompt_history.to_jsonl(prompt_history.never_trainable(table)).splitlines()
    assert [json.loads(x)["prompt_id"] for x in lines] == ["a"] and json.loads(lines[0])["sampled"] == 3
    assert prompt_history.prompt_table(groups.iloc[:0]).empty


def test_the_report_says_how_much_sampling_taught_nothing(tmp_path):
    from grpo_core.analysis import report
    store = RunStore.create("w", {}, root=tmp_path)
    for step, (sampled, wasted) in enumerate([(100, 60), (220, 140)], 1):
        store.log_step(step, {names.CUM_SAMPLED_TOKENS: sampled, names.CUM_WASTED_TOKENS: wasted,
                              names.WASTED_SAMPLING_S: 1.5, names.TRAINABLE_RATIO: 0.5})
    store.close()
    rep = report.build_report(tmp_path / "w")
    rows = {k: v for k, _, v in report.summary_rows(rep)}
    assert rows["wasted_sampling"] == "64% of the sampled tokens (140 of 220, 3 s of sampling)"
    assert "sampling that taught nothing" in report.to_markdown(rep)


def test_the_live_page_says_how_much_sampling_taught_nothing_and_charts_the_split(tmp_path, monkeypatch):
    """A real trainer run: the groups chart carries all-solved / none-solved, the live page
    the wasted share in words."""
    from grpo_core.dashboard import live_cards, live_view
    from tests.helpers_dashboard import REPO, live_charts, run_page
    store = trained(tmp_path, "lw")
    wide = store.scalars_wide()
    store.close()
    text = live_cards.wasted_text(live_view.load(tmp_path / "lw"))
    share = wide[names.CUM_WASTED_TOKENS].iloc[-1] / wide[names.CUM_SAMPLED_TOKENS].iloc[-1]
    assert text.startswith(f"{share:.0%} of this run's sampling taught nothing")
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    at = run_page("app.py", "lw")
    assert any(c.value == text for c in at.caption)
    groups = [s for s in live_charts(at) if s["title"] == "Groups submitted vs trainable"]
    assert {"all solved", "none solved"} <= {t["label"] for t in groups[0]["series"]}
