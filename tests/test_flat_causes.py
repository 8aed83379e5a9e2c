"""Why each flat group is flat (analysis.flat_causes): hand-made groups for every cause and its
precedence, the real trainer's demo run (the counts add up to the flat groups at every step, the
stored causes to the counts), an old run without causes, and the advice that follows the cause."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import flat_causes, health, step_stats
from grpo_core.runs import names
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.step_columns import StepGroups
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train.trainer import Trainer

KINDS = {"exact": "binary", "length": "penalty", "f1": "continuous", "mine": "custom"}
METRICS = ["exact", "length"]
WEIGHTS = {"exact": 1.0, "length": 0.1}
G = 3
BINARY = ["exact", "citation", "format"]  # the demo's binary metrics (config.DEMO_WEIGHTS)


def causes_of(groups: list[dict], outcome: str | None = "exact", weights=WEIGHTS, metrics=METRICS,
              min_group_std: float = 0.01, max_new_tokens: int = 8):
    """Each group: its metric scores per completion (lists of G) and optionally errors, lengths, texts."""
    scores = np.stack([np.stack([np.asarray(gr[m], float) for m in metrics], axis=1) for gr in groups])
    totals = scores @ np.array([weights[m] for m in metrics])
    index = metrics.index(outcome) if outcome else None
    stats = step_stats.group_stats(totals, scores, min_group_std=min_group_std, outcome_index=index)
    sampled = flat_causes.Sampled(
        [e for gr in groups for e in gr.get("errors", [None] * G)],
        np.array([n for gr in groups for n in gr.get("lengths", [3] * G)]), max_new_tokens,
        [t for gr in groups for t in gr.get("texts", [f"text {id(gr)} {i}" for i in range(G)])])
    out = flat_causes.flat_causes(stats, totals, scores, metrics, KINDS, weights, outcome, sampled)
    return out.tolist(), stats


def test_each_cause_from_a_group_made_for_it():
    groups = [
        {"exact": [1, 0, 1], "length": [0, 0, 0]},  # mixed
        {"exact": [0, 0, 0], "length": [0, 0, 0], "errors": ["exact: boom"] * 3},
        {"exact": [1, 1, 1], "length": [0, 0, 0]},
        {"exact": [0.5, 0.5, 0.5], "length": [0, 0, 0], "texts": ["same"] * 3},
        {"exact": [0, 0, 0], "length": [0, 0, 0], "lengths": [8, 8, 9]},
        {"exact": [0, 0, 0], "length": [0, 0, 0]},
        {"exact": [0.5, 0.5, 0.5], "length": [0, -0.1, -0.2]},  # totals std 0.008 < 0.01: shaping under the gate
        {"exact": [0.5, 0.5, 0.5], "length": [0, -1, -0.5]},  # std 0.04 passes, outcome uniform: phantom
        {"exact": [0.5, 0.5, 0.5], "length": [0, 0, 0]},
    ]
    got, stats = causes_of(groups)
    assert got == [names.CAUSE_MIXED, names.CAUSE_ERRORED, names.CAUSE_SOLVED, names.CAUSE_IDENTICAL,
                   names.CAUSE_TRUNCATED, names.CAUSE_UNSOLVED, names.CAUSE_SHAPING, names.CAUSE_SHAPING,
                   names.CAUSE_OTHER]
    assert stats.phantom.tolist() == [False] * 7 + [True, False]


def test_below_threshold_float_noise_and_custom_metrics():
    # no outcome gate and only a continuous metric: a small real spread is below threshold
    f1 = [{"f1": [0.50, 0.51, 0.49]}, {"f1": [0.3, 0.3 + 1e-4, 0.3]}, {"f1": [0.3, 0.3, 0.3]}, {"f1": [0.1, 0.9, 0.5]}]
    got, _ = causes_of(f1, outcome=None, weights={"f1": 1.0}, metrics=["f1"])
    assert got == [names.CAUSE_BELOW_GATE, names.CAUSE_BELOW_GATE, names.CAUSE_OTHER, names.CAUSE_MIXED]
    # a float32 rounding spread (std ~1e-8 x the reward) is noise, not a difference
    rounded = [{"f1": [0.7, float(np.float32(0.7)), 0.7]}]
    assert causes_of(rounded, outcome=None, weights={"f1": 1.0}, metrics=["f1"])[0] == [names.CAUSE_NOISE]
    # a custom metric has no known range: all at 1 is not "all solved"
    custom = [{"mine": [1, 1, 1]}, {"mine": [0, 0, 0]}]
    assert causes_of(custom, outcome=None, weights={"mine": 1.0}, metrics=["mine"])[0] == [names.CAUSE_OTHER] * 2


def test_without_an_outcome_metric_the_binary_checks_judge_solved_and_none_solved():
    demo = ["exact", "f1", "length"]
    weights = {"exact": 0.5, "f1": 0.4, "length": 0.1}
    groups = [{"exact": [0, 0, 0], "f1": [0.3] * 3, "length": [0] * 3},  # partial credit, every check failed
              {"exact": [1, 1, 1], "f1": [0.8] * 3, "length": [-0.5] * 3},  # every check passed
              {"exact": [0, 0, 0], "f1": [0.0] * 3, "length": [-1] * 3},  # the total at its bottom
              {"exact": [0.5] * 3, "f1": [0.0] * 3, "length": [0] * 3}]  # a binary metric at 0.5: neither
    got, _ = causes_of(groups, outcome=None, weights=weights, metrics=demo)
    assert got == [names.CAUSE_UNSOLVED, names.CAUSE_SOLVED, names.CAUSE_UNSOLVED, names.CAUSE_OTHER]
    # a binary metric of weight 0 is not a check the run makes
    got, _ = causes_of(groups[:1], outcome=None, weights={**weights, "exact": 0.0}, metrics=demo)
    assert got == [names.CAUSE_OTHER]


def test_the_precedence_decides_between_causes_that_both_hold():
    both = [
        {"exact": [1, 1, 1], "length": [0, 0, 0], "texts": ["red [S2]"] * 3, "lengths": [8] * 3},  # solved first
        {"exact": [0, 0, 0], "length": [0, 0, 0], "texts": ["xx"] * 3, "lengths": [8] * 3},  # identical before cut
        {"exact": [0, 0, 0], "length": [0, 0, 0], "lengths": [8] * 3, "errors": ["e"] * 3},  # errored before all
        {"exact": [0, 0, 0], "length": [0, 0, 0], "lengths": [8, 8, 2]},  # not every one cut: none solved
        {"exact": [0, 0, 0], "length": [0, 0, 0], "errors": ["e", None, "e"]},  # not every one errored
    ]
    got, _ = causes_of(both)
    assert got == [names.CAUSE_SOLVED, names.CAUSE_IDENTICAL, names.CAUSE_ERRORED, names.CAUSE_UNSOLVED,
                   names.CAUSE_UNSOLVED]
    # unknown evidence is never claimed: no texts, lengths or errors (an import)
    totals = np.zeros((1, G))
    stats = step_stats.group_stats(totals)
    assert flat_causes.flat_causes(stats, totals, None, ["mine"], KINDS, {"mine": 1.0}).tolist() == [names.CAUSE_OTHER]
    # a group of one completion (per-prompt budgets pad it with copies of its row) is not a collapse
    padded = np.array([[0.5, np.nan, np.nan], [0.5, 0.5, 0.5]])
    got = flat_causes.flat_causes(step_stats.group_stats(padded), padded, None, ["mine"], KINDS, {"mine": 1.0},
                                  sampled=flat_causes.Sampled(texts=["a"] * 6))
    assert got.tolist() == [names.CAUSE_OTHER, names.CAUSE_IDENTICAL]
    texts = [None, None, None]  # texts not kept: identical is not claimed
    sampled = flat_causes.Sampled(texts=texts)
    assert flat_causes.flat_causes(stats, totals, None, ["mine"], KINDS, {"mine": 1.0}, sampled=sampled).tolist() == \
        [names.CAUSE_OTHER]


def test_the_counts_name_every_cause_and_add_up():
    causes = np.array([names.CAUSE_MIXED, names.CAUSE_SOLVED, names.CAUSE_SOLVED, names.CAUSE_TRUNCATED], object)
    counts = flat_causes.cause_counts(causes)
    assert set(counts) == set(names.FLAT_CAUSES.values())
    assert counts[names.GROUPS_SOLVED] == 2 and counts[names.FLAT_TRUNCATED] == 1 and sum(counts.values()) == 3


def demo_run(root, run_id: str, steps: int = 4) -> RunStore:
    """A real run of the embedded trainer on the built-in demo task (tiny model, no warm-start)."""
    cfg = load_config(None, ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                             "model.intermediate_size=64", "model.warm_start_steps=0", "grpo.prompts_per_step=4",
                             "grpo.group_size=4", "grpo.max_new_tokens=6", f"grpo.steps={steps}",
                             "log.progress=false", "log.checkpoint_every=0", "log.keep_text=all"])
    store = RunStore.create(run_id, cfg.to_dict(), root=root)
    assert Trainer(cfg, store, log=lambda m: None).run() == "finished"
    return store


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo run's folder (run id "demo"), made once for the tests below."""
    root = tmp_path_factory.mktemp("runs")
    demo_run(root, "demo").close()
    return root


def test_a_demo_runs_cause_counts_add_up_to_its_flat_groups_at_every_step(demo):
    with RunStore.open(demo / "demo", readonly=True) as store:
        wide, groups, rollouts = store.scalars_wide(), store.groups(), store.rollouts()
    counts = wide[list(names.FLAT_CAUSES.values())]
    flat = wide[names.GROUPS_SUBMITTED] - wide[names.GROUPS_TRAINABLE]
    assert len(wide) == 4 and counts.notna().all().all()
    assert (counts.sum(axis=1) == flat).all()  # at every step
    for cause, name in names.FLAT_CAUSES.items():  # the stored causes are the counts
        per_step = groups.groupby("step")["outcome"].apply(lambda o, c=cause: float((o == c).sum()))
        assert per_step.tolist() == wide[name].tolist()
    assert ((groups["outcome"] == names.CAUSE_MIXED) == groups["trainable"]).all()
    assert flat.sum() > 0  # an untrained model: some groups flat, each with a cause
    # each stored cause agrees with the completions kept
    by_group = groups.set_index(["step", "group"])["outcome"]
    for (step, grp), r in rollouts.groupby(["step", "group"]):
        cause, totals = by_group.loc[(step, grp)], r["total"].to_numpy()
        if cause == names.CAUSE_IDENTICAL:
            assert r["completion"].nunique() == 1
        if cause in (names.CAUSE_SOLVED, names.CAUSE_UNSOLVED):  # no outcome metric: the binary checks judge
            assert (r[BINARY] == (1.0 if cause == names.CAUSE_SOLVED else 0.0)).all().all()
        if cause == names.CAUSE_OTHER:
            assert np.ptp(totals) == 0
        if cause in (names.CAUSE_SHAPING, names.CAUSE_BELOW_GATE):
            assert 0 < totals.std() <= 0.01


def test_an_old_run_without_causes_still_loads_and_says_so(tmp_path):
    from grpo_core.analysis import inspector, report
    from grpo_core.analysis.run_data import load_run
    store = RunStore.create("old", {"reward": {"weights": {"exact": 1.0}}}, root=tmp_path)
    for step in (1, 2):
        store.log_step(step, {names.GROUPS_SUBMITTED: 2, names.GROUPS_TRAINABLE: 0, names.TRAINABLE_RATIO: 0.0,
                              names.GROUPS_SOLVED: 1, names.GROUPS_UNSOLVED: 0},
                       StepGroups(np.arange(2), ["a", "b"], 2, np.array([1.0, 0.5]), np.zeros(2),
                                  np.zeros(2, bool), np.zeros(2, bool),
                                  outcome=[step_stats.SOLVED, names.CAUSE_UNRECORDED]))
    store.close()
    with RunStore.open(tmp_path / "old", readonly=True) as s:
        assert s.groups()["outcome"].tolist() == [step_stats.SOLVED, names.CAUSE_UNRECORDED] * 2
        wide = s.scalars_wide()
    assert flat_causes.window_counts(wide, 20) is None  # no causes beyond solved / unsolved: the old advice
    data = load_run(tmp_path / "old")
    view = inspector.inspect_group(data, 2, 1)
    assert "cause not recorded" in view.explanation
    md = report.to_markdown(report.build_report(tmp_path / "old"))
    assert "unknown (the run did not record why" in md


def frame(counts: dict[str, float], n: int = 20) -> pd.DataFrame:
    cols = {names.TRAINABLE_RATIO: [0.1] * n, names.GROUPS_SUBMITTED: [8.0] * n, names.GROUPS_TRAINABLE: [0.8] * n,
            names.REWARD_STD: [0.3] * n}
    cols.update({name: [counts.get(cause, 0.0)] * n for cause, name in names.FLAT_CAUSES.items()})
    return pd.DataFrame(cols, index=pd.Index(range(1, n + 1), name="step"))


@pytest.mark.parametrize("cause,words", [(names.CAUSE_TRUNCATED, "raise grpo.max_new_tokens"),
                                         (names.CAUSE_ERRORED, "fix the reward function"),
                                         (names.CAUSE_IDENTICAL, "raise the sampling temperature"),
                                         (names.CAUSE_SOLVED, "harder prompts")])
def test_the_alert_advice_follows_the_dominant_cause(cause, words):
    counts = {cause: 5.0, names.CAUSE_OTHER: 2.0}
    alerts = {a.kind: a for a in health.alerts(frame(counts), HealthConfig())}
    assert words in alerts["low_ratio"].message
    history = [{"step": s, **row} for s, row in frame(counts).to_dict("index").items()]
    assert "low_ratio" in health.alert_kinds(history, HealthConfig())  # the trainer's fast path reads them too
    assert flat_causes.dominant(flat_causes.window_counts(frame(counts), 20)) == cause
    assert flat_causes.dominant({names.CAUSE_SOLVED: 3.0, names.CAUSE_TRUNCATED: 3.0}) is None  # a tie: no cause


def test_the_demo_runs_causes_are_charted_reported_explained_and_acted_on(demo, monkeypatch):
    from grpo_core.analysis import charts, inspector, report
    from grpo_core.analysis.run_data import load_run
    from grpo_core.dashboard import advice, live_view
    from grpo_core.runs import requests
    from tests.helpers_dashboard import REPO, chart_specs, live_charts, run_page
    with RunStore.open(demo / "demo", readonly=True) as store:
        wide, groups = store.scalars_wide(), store.groups()
    flat = wide[names.GROUPS_SUBMITTED] - wide[names.GROUPS_TRAINABLE]
    # the live chart: one stacked band per cause that occurred, the stack's top = the step's flat groups
    monkeypatch.setattr(charts, "VALIDATE", True)
    fig = dict(charts.live_charts(wide, [], None))["flat"]
    assert {t.stackgroup for t in fig.data} == {"flat"}
    assert {t.name for t in fig.data} == set(groups.loc[~groups["trainable"], "outcome"])
    np.testing.assert_allclose(np.sum([t.y for t in fig.data], axis=0), flat.to_numpy())
    # the report: the table of causes, its counts the run's, and the dominant one in words
    counts = groups.loc[~groups["trainable"], "outcome"].value_counts()
    top = counts.index[0]
    assert top == names.CAUSE_TRUNCATED  # an untrained model, max_new_tokens=6: answers are longer
    rep = report.build_report(demo / "demo")
    md = report.to_markdown(rep)
    assert "## Why groups were flat" in md and f"were {top}: {flat_causes.MEANING[top]}" in md
    html = report.to_html(rep)
    for cause, n in counts.items():
        assert f'<tr data-key="{cause}"><td data-col="cause" class=t>{cause}</td><td data-col="groups">{n:g}</td>' \
            in html
    assert "fig-flat" in html
    # the group inspector: a flat group's recorded cause, in words
    row = groups[groups["outcome"] == top].iloc[0]
    view = inspector.inspect_group(load_run(demo / "demo"), int(row["step"]), int(row["group"]))
    assert view.cause == top and f"Why it was flat: {top}: {flat_causes.MEANING[top]}." in view.explanation
    # the advice: the alert says to raise max_new_tokens, and the first fix is that request
    state = live_view.load(demo / "demo")
    answer = advice.what_to_do(state)
    assert answer["cause"] == top and "raise grpo.max_new_tokens" in answer["alert"].message
    first = answer["fixes"][0]
    assert (first.label, first.kind, first.payload) == ("max_new_tokens 6 -> 12", "set_max_new_tokens",
                                                        {"max_new_tokens": 12})
    requests.validate_request(first.kind, first.payload)  # a request the trainer accepts as it is
    # the live page draws the chart
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(demo))
    monkeypatch.chdir(REPO)
    specs = [s for s in live_charts(run_page("app.py", "demo")) if s["title"] == "Why groups were flat"]
    assert len(specs) == 1 and {t["label"] for t in specs[0]["series"]} == set(counts.index)
    analysis = run_page("pages/analysis.py", "demo")  # and the analysis page, with the report's sentence
    assert any(s["layout"]["title"]["text"] == "Why groups were flat" for s in chart_specs(analysis))
    assert any(f"were {top}" in m.value for m in analysis.markdown)
