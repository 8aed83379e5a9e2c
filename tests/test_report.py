"""Post-run analysis (grpo_core/analysis/report.py) on real SQLite run stores written the way the
trainer writes them: RunStore.log_step with groups and rollouts, changes recorded as
request + claim_pending + resolve_request. Every expected number below is worked out
by hand from the scores the builder writes (see the comments)."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import comparison, inspector, ledger, report, run_data, run_tables, step_stats
from grpo_core.errors import ConfigError
from grpo_core.runs import names
from grpo_core.runs.config import RunConfig
from grpo_core.runs.store import RunStore

ROOT = Path(__file__).resolve().parents[1]


# ---- a run written like the trainer writes one ---------------------------------------------
def make_run(run_id: str, *, steps: int, weights: dict, scores, changes=(), min_group_std: float = 0.01,
             outcome: str = "", groups: int = 4, group_size: int = 4, status: str = "finished",
             error: str | None = None, config: dict | None = None, texts: bool = True) -> Path:
    """scores(step, group, idx) -> {metric: raw score}. changes: (step, kind, payload, source):
    requested while the run is live, claimed and resolved as applied at `step`, and in force
    from that step on (set_weights / set_threshold change what the builder computes)."""
    cfg = RunConfig()
    cfg.reward.weights = dict(weights)
    cfg.reward.outcome_metric = outcome
    cfg.grpo.steps, cfg.grpo.group_size, cfg.grpo.prompts_per_step = steps, group_size, groups
    cfg.grpo.min_group_std = min_group_std
    for key, value in (config or {}).items():
        sec, k = key.split(".")
        setattr(getattr(cfg, sec), k, value)
    store = RunStore.create(run_id, cfg.to_dict())
    store.set_status("running", pid=os.getpid())
    metrics, w, thr, level = list(weights), dict(weights), min_group_std, cfg.task.level
    cum_s = cum_t = 0
    for step in range(steps):
        events = []
        for at, kind, payload, source in changes:
            if at + 1 == step and source == "curriculum":  # logged with the step before, in force now
                level = payload["level"]
        for at, kind, payload, source in changes:
            if at == step and source == "curriculum":  # as the trainer's auto curriculum writes it
                events.append(("change", {"kind": kind, "request": payload, "source": source, "message": ""}))
            elif at == step:
                store.request(kind, payload, source=source)
                (claimed,) = store.claim_pending()
                store.resolve_request(claimed["id"], True, step)
                if kind == "set_weights":
                    w = {**w, **payload["weights"]}
                if kind == "set_threshold":
                    thr = payload["min_group_std"]
                if kind == "set_difficulty":
                    level = payload["level"]
        raw = np.array([[[scores(step, g, i)[m] for m in metrics] for i in range(group_size)]
                        for g in range(groups)], dtype=float)  # [P, G, K]
        totals = raw @ np.array([w[m] for m in metrics])
        stats = step_stats.group_stats(totals, raw, min_group_std=thr,
                                   outcome_index=metrics.index(outcome) if outcome else None)
        sc = step_stats.step_scalars(stats, raw, metrics, w, cum_s, cum_t)
        sc[names.MIN_GROUP_STD], sc[names.DIFFICULTY] = thr, level
        sc[names.TIME_STEP] = 0.5
        cum_s, cum_t = int(sc[names.CUM_GROUPS_SUBMITTED]), int(sc[names.CUM_GROUPS_TRAINABLE])
        gdf = pd.DataFrame({"group": range(groups), "prompt_id": [f"p{step}-{g}" for g in range(groups)],
                            "size": group_size, "reward_mean": stats.mean, "reward_std": stats.std,
                            "trainable": stats.trainable, "phantom": stats.phantom})
        rolls = [(g, i, totals[g, i], dict(zip(metrics, raw[g, i])), f"answer s{step} g{g} i{i}" if texts else None,
                  None) for g in range(groups) for i in range(group_size)]
        store.log_step(step, sc, gdf, rolls, events)
    if status != "running":
        store.set_status(status, error=error)
    store.close()
    return Path(os.environ["GRPO_HEALTH_RUNS_DIR"]) / run_id


# Bottleneck run: `exact` is 0 for every completion (uniform in every group); answer_f1 is
# 0.1*i (+0.05*g), so its within-group std is std([0, .1, .2, .3]) = sqrt(0.0125) = 0.1118.
def bottleneck_scores(step, g, i):
    return {"answer_f1": 0.1 * i + 0.05 * g, "exact": 0.0}


# Change run (4 groups x 4). exact: g0 = 0,1,0,1; g1 = 0; g2 = g3 = 1. f1: 0.5+0.1i, 0.6+0.1i,
# 0.7+0.1i, 1.0 (uniform in g3).
#  before (exact 1, f1 0): only g0 varies -> ratio 1/4; reward = (0.5 + 0 + 1 + 1)/4 = 0.625
#  after  (exact .5, f1 .5): g0, g1, g2 vary -> ratio 3/4;
#         reward = (0.25+0.325, 0+0.375, 0.5+0.425, 0.5+0.5)/4 = 2.875/4 = 0.71875
def change_scores(step, g, i):
    exact = [i % 2, 0, 1, 1][g]
    f1 = [0.5 + 0.1 * i, 0.6 + 0.1 * i, 0.7 + 0.1 * i, 1.0][g]
    return {"exact": float(exact), "f1": f1}


CHANGE_AT_50 = [(50, "set_weights", {"weights": {"exact": 0.5, "f1": 0.5}}, "ui")]


# ---- 1. trainability ----------------------------------------------------------------------
def test_trainability_counts_and_zero_steps():
    # exact alone (weight 1): step 3 has no varying group at all -> zero trainable there.
    def scores(step, g, i):
        return {"exact": float(i % 2) if (g == 0 and step != 3) else 1.0, "f1": 0.5}
    run = make_run("zero", steps=6, weights={"exact": 1.0, "f1": 0.0}, scores=scores)
    rep = report.build_report(run)
    s = rep.summary
    assert (s["submitted"], s["trainable"]) == (24, 5)  # 6 steps x 4 groups; g0 trainable except step 3
    assert s["ratio"] == pytest.approx(5 / 24)
    assert s["zero_trainable_steps"] == [3]
    assert rep.steps.loc[3, "ratio"] == 0 and rep.steps.loc[2, "ratio"] == 0.25
    assert rep.steps.loc[5, "cum_ratio"] == pytest.approx(5 / 24)


# ---- 2. variance bottlenecks --------------------------------------------------------------
def test_uniform_binary_metric_is_named_the_bottleneck():
    run = make_run("bn", steps=10, weights={"answer_f1": 0.5, "exact": 0.5}, scores=bottleneck_scores)
    rep = report.build_report(run)
    bn = rep.bottlenecks.set_index("metric")
    assert bool(bn.loc["exact", "bottleneck"]) and not bool(bn.loc["answer_f1", "bottleneck"])
    assert bn.loc["exact", "uniform_fraction"] == 1.0 and bn.loc["answer_f1", "uniform_fraction"] == 0.0
    assert bn.loc["exact", "mean_group_std"] == pytest.approx(0.0, abs=1e-12)
    assert bn.loc["answer_f1", "mean_group_std"] == pytest.approx(np.sqrt(0.0125))
    assert bn.loc["answer_f1", "contribution"] == pytest.approx(1.0)  # all the variance is answer_f1's
    assert bn.loc["exact", "contribution"] == pytest.approx(0.0, abs=1e-12)
    assert rep.bottleneck_text.startswith("Variance bottleneck: exact (uniform in 100% of groups")
    assert "answer_f1" not in rep.bottleneck_text
    assert rep.summary["ratio"] == 1.0  # answer_f1 alone keeps every group trainable


def test_zero_weight_uniform_metric_is_not_flagged_and_phantoms_counted():
    # outcome gate on exact: g0 varies in exact (trainable); g1..g3 exact uniform, f1 varies -> phantom.
    def scores(step, g, i):
        return {"exact": float(i % 2) if g == 0 else 1.0, "f1": 0.1 * i, "length": 0.0}
    run = make_run("ph", steps=5, weights={"exact": 0.5, "f1": 0.5, "length": 0.0}, scores=scores,
                   outcome="exact")
    rep = report.build_report(run)
    bn = rep.bottlenecks.set_index("metric")
    assert bn.loc["length", "uniform_fraction"] == 1.0 and not bool(bn.loc["length", "bottleneck"])
    assert "weight is 0" in bn.loc["length", "why"]
    assert bn.loc["exact", "uniform_fraction"] == 0.75 and bool(bn.loc["exact", "bottleneck"])
    assert rep.summary["phantom"] == 15 and rep.summary["trainable"] == 5


# ---- 3. weight-change ledger ----------------------------------------------------------------
def test_weight_change_at_50_lifts_ratio_and_is_marked_reuse():
    run = make_run("chg", steps=100, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    rep = report.build_report(run)
    assert len(rep.ledger) == 1
    row = rep.ledger.iloc[0]
    assert (row["step"], row["kind"], row["source"]) == (50, "set_weights", "ui")
    assert (row["before"], row["after"], row["n_before"], row["n_after"]) == ("30–49", "50–69", 20, 20)
    assert row["old"] == {"exact": 1.0, "f1": 0.0} and row["new"] == {"exact": 0.5, "f1": 0.5}
    assert row["change"] == "weights exact 1 -> 0.5, f1 0 -> 0.5"
    assert row["ratio_before"] == pytest.approx(0.25) and row["ratio_after"] == pytest.approx(0.75)
    assert row["ratio_diff"] == pytest.approx(0.5)
    assert row["reward_before"] == pytest.approx(0.625) and row["reward_after"] == pytest.approx(0.71875)
    assert row["reward_diff"] == pytest.approx(0.09375)
    # group reward std: before only g0 varies (std 0.5) -> 0.125; after g0 std 0.2795, g1 = g2 = 0.0559
    assert row["reward_std_before"] == pytest.approx(0.125)
    assert row["reward_std_after"] == pytest.approx((np.sqrt(0.078125) + 2 * 0.5 * np.sqrt(0.0125)) / 4)
    # the scores do not drift, so re-scoring the before window under the new weights gives the same reward
    assert row["reward_diff_same_weights"] == pytest.approx(0.0, abs=1e-12)
    assert bool(row["reuse"])
    # a narrower window: 5 steps on each side
    row5 = ledger.change_ledger(run_data.load_run(run), window=5).iloc[0]
    assert (row5["before"], row5["after"]) == ("45–49", "50–54")


def test_windows_clip_at_neighbouring_changes_and_run_end():
    changes = CHANGE_AT_50 + [(60, "set_threshold", {"min_group_std": 0.2}, "cli"),
                              (70, "pause", {}, "ui"), (95, "set_difficulty", {"level": 2}, "autopilot")]
    run = make_run("clip", steps=100, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=changes)
    led = report.build_report(run).ledger
    assert list(led["step"]) == [50, 60, 70, 95]
    assert list(led["source"]) == ["ui", "cli", "ui", "autopilot"]
    assert list(led["before"]) == ["30–49", "50–59", "60–69", "75–94"]
    assert list(led["after"]) == ["50–59", "60–69", "70–89", "95–99"]
    thr = led.iloc[1]
    assert thr["change"] == "min_group_std 0.01 -> 0.2"
    # threshold 0.2: only g0 (std 0.2795) stays trainable -> 3/4 to 1/4, the change is not a reuse
    assert thr["ratio_before"] == pytest.approx(0.75) and thr["ratio_after"] == pytest.approx(0.25)
    assert not bool(thr["reuse"])
    assert not bool(led.iloc[2]["reuse"])  # a pause is never a reuse, whatever the numbers
    assert led.iloc[3]["change"] == "difficulty level 1 -> 2"


def test_curriculum_change_recorded_a_step_early_is_placed_where_it_took_effect():
    # the auto curriculum logs its change event with the step just finished (29); level 2 from step 30
    changes = [(29, "set_difficulty", {"level": 2}, "curriculum")]
    run = make_run("cur", steps=50, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=changes)
    row = report.build_report(run).ledger.iloc[0]
    assert (row["step"], row["source"], row["change"]) == (30, "curriculum", "difficulty level 1 -> 2")
    assert (row["before"], row["after"]) == ("10–29", "30–49")
    assert row["note"] == "recorded at step 29; the logged setting changes at step 30"


def test_ledger_rejects_bad_window():
    run = make_run("w", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    with pytest.raises(ConfigError, match="window"):
        ledger.change_ledger(run_data.load_run(run), window=0)


# ---- 4. reward trend ------------------------------------------------------------------------
def test_reward_trend_rising_and_short():
    def scores(step, g, i):
        return {"f1": 0.01 * step + 0.1 * i + 0.003 * ((step * 7) % 5)}  # rising, with noise
    rep = report.build_report(make_run("trend", steps=30, weights={"f1": 1.0}, scores=scores))
    t = rep.trend["run"]
    assert t.sign == 1 and t.slope == pytest.approx(0.01, abs=0.002) and t.p_value < 0.05
    assert rep.trend["run_text"].startswith("rising: slope +0.01")
    short = run_tables.reward_trend(rep.steps.head(3))
    assert short["run"].sign == 0 and "at least 5 steps" in short["run_text"]


# ---- 5. rollout inspector -------------------------------------------------------------------
def test_inspector_trainable_and_not_trainable():
    run = make_run("insp", steps=12, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    data = run_data.load_run(run)
    tr = inspector.inspect_group(data, 10, 0)
    assert tr.trainable and not tr.phantom
    assert list(tr.table["total"]) == [1.0, 1.0, 0.0, 0.0] and list(tr.table["idx"]) == [1, 3, 0, 2]
    assert list(tr.table["rank"]) == [1, 2, 3, 4]
    assert tr.table["completion"].iloc[0] == "answer s10 g0 i1"
    assert tr.std == pytest.approx(0.5)
    assert tr.explanation.startswith("Trainable: the total-reward std 0.5000 of its 4 completions is above "
                                     "the threshold 0.01")
    assert "exact (std 0.500)" in tr.explanation and "f1 (std 0.112)" in tr.explanation
    no = inspector.inspect_group(data, 10, 1)  # exact all 0, f1 varies but has weight 0
    assert no.trainable is False
    assert no.explanation.startswith("Not trainable: all 4 completions got the same total reward 0.0000")
    assert "f1 (std 0.112)" in no.explanation and "carry no weight" in no.explanation
    with pytest.raises(run_data.ReportError, match="step 99, group 0 is not in run insp"):
        inspector.inspect_group(data, 99, 0)


def test_inspector_small_std_and_phantom():
    def scores(step, g, i):
        return {"exact": float(i % 2) if g == 0 else 1.0, "f1": [0.1 * i, 0.01 * i, 0.1 * i, 0.0][g]}
    run = make_run("insp2", steps=2, weights={"exact": 0.5, "f1": 0.5}, scores=scores, outcome="exact")
    data = run_data.load_run(run)
    ph = inspector.inspect_group(data, 1, 2)  # exact uniform 1, f1 varies: std 0.0559 > 0.01 but the outcome gate fails
    assert ph.phantom and not ph.trainable
    assert ph.explanation.startswith("Not trainable (phantom variance): the total-reward std 0.0559 passes")
    assert "outcome metric 'exact' was uniform (every completion scored 1)" in ph.explanation
    assert ph.explanation.endswith("shaping terms: f1.")
    small = inspector.inspect_group(data, 1, 1)  # 0.5 * std(0, .01, .02, .03) = 0.0056 <= 0.01
    assert not small.trainable and not small.phantom
    assert small.explanation.startswith("Not trainable: the total-reward std 0.0056 is at or below the threshold 0.01")
    gated = inspector.inspect_group(data, 1, 0)
    assert gated.trainable and "the outcome metric 'exact' varied" in gated.explanation


# ---- 6. comparison -----------------------------------------------------------------------
def test_comparison_shows_only_differing_config_keys():
    a = make_run("cmp-a", steps=8, weights={"answer_f1": 0.5, "exact": 0.5}, scores=bottleneck_scores)
    b = make_run("cmp-b", steps=12, weights={"answer_f1": 0.5, "exact": 0.5}, scores=bottleneck_scores,
                 config={"grpo.lr": 5e-3, "task.level": 3})
    summary, diff = comparison.compare_runs([a, b])
    assert set(diff.index) == {"grpo.lr", "grpo.steps", "task.level"}
    assert diff.loc["grpo.lr"].tolist() == [RunConfig().grpo.lr, 5e-3]  # a keeps the default
    assert diff.loc["task.level"].tolist() == [1, 3]
    assert summary.loc["cmp-a", "steps"] == 8 and summary.loc["cmp-b", "steps"] == 12
    assert summary.loc["cmp-a", "ratio"] == 1.0
    assert summary.loc["cmp-b", "train_time_s"] == pytest.approx(6.0)  # 12 steps x time/step_s 0.5
    assert summary.loc["cmp-a", "reward_final"] == pytest.approx(0.5 * (0.15 + 0.075))  # mean f1 0.15, g 0.075
    with pytest.raises(run_data.ReportError, match="at least two runs"):
        comparison.compare_runs([a])


# ---- run states: each a clear message, never a traceback -------------------------------
def test_empty_run():
    store = RunStore.create("empty", RunConfig().to_dict())
    store.close()
    rep = report.build_report("empty")
    assert [n.text for n in rep.notices if "No steps logged" in n.text]
    assert rep.summary["steps"] == 0 and rep.ledger.empty
    assert "No steps logged yet" in report.to_markdown(rep) and "No steps logged yet" in report.to_html(rep)


def test_one_step_failed_run():
    run = make_run("fail1", steps=1, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="failed",
                   error="CUDA out of memory at generate")
    rep = report.build_report(run)
    texts = [n.text for n in rep.notices]
    assert any(t.startswith("Run failed at step 0: CUDA out of memory at generate") for t in texts)
    assert any("Only one step logged" in t for t in texts)
    assert rep.trend["run"].slope is None and "not enough steps" in rep.trend["run_text"]
    report.to_html(rep), report.to_markdown(rep), report.steps_csv(rep)


OLD_TRACEBACK = ('Traceback (most recent call last):\n  File "grpo_core/train/trainer.py", line 80, in __init__\n'
                 '    self.sampler = sampling.make_sampler(...)\n'
                 'RuntimeError: Engine core initialization failed. See root cause above.\n')


def test_an_older_stores_traceback_is_one_line_in_the_report():
    """Stores written before errors were one line keep a whole traceback in meta.error (written raw
    here: set_status stores one line now): the report shows its last line, nothing more."""
    run = make_run("old-fail", steps=2, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="failed")
    with RunStore.open(run) as s:
        s.set_meta(error=OLD_TRACEBACK)
    rep = report.build_report(run)
    assert [n.text for n in rep.notices if n.level == "error"] == [
        "Run failed at step 1: RuntimeError: Engine core initialization failed. See root cause above. "
        "The analysis covers the steps logged before the failure."]
    for text in (report.to_markdown(rep), report.to_html(rep)):
        assert "Traceback" not in text and "trainer.py" not in text


def test_running_run_says_in_progress():
    run = make_run("live", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="running")
    with RunStore.open(run) as s:
        s.heartbeat()
    rep = report.build_report(run)
    assert rep.data.status == "running"
    assert any(n.text.startswith("Run still in progress (running, step 2 of 3)") for n in rep.notices)


def test_run_whose_trainer_died_is_stale():
    run = make_run("dead", steps=3, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, status="running")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with RunStore.open(run) as s:
        s.set_meta(pid=gone.pid)
    rep = report.build_report(run)
    assert rep.data.status == "stale"
    assert rep.notices[0].level == "warning"
    assert rep.notices[0].text.startswith("The trainer stopped reporting (no heartbeat) at step 2 of 3")


def make_imported(run_id: str = "imported") -> Path:
    """Scalars only, as an importer of a TRL log writes them: no groups, no rollouts."""
    store = RunStore.create(run_id, {"source": "trl"}, kind="import")
    store.set_meta(source="trl", status="finished")
    for step, (rew, z) in enumerate([(0.2, 0.75), (0.3, 0.5), (0.35, 0.5), (0.5, 0.25)]):
        store.log_step(step * 5, {names.REWARD: rew, names.REWARD_STD: 0.1, names.FRAC_REWARD_ZERO_STD: z,
                                  names.metric_group_std("fmt"): 0.0, names.metric_group_std("acc"): 0.2})
    store.close()
    return Path(os.environ["GRPO_HEALTH_RUNS_DIR"]) / run_id


def test_imported_run_without_groups_says_what_is_missing():
    rep = report.build_report(make_imported())
    msg = " ".join(n.text for n in rep.notices)
    assert "No per-group or per-rollout records" in msg and "rollout inspector are unavailable" in msg
    assert "frac_reward_zero_std" in msg
    assert rep.summary["submitted"] is None
    assert list(rep.steps["ratio"]) == [0.25, 0.5, 0.5, 0.75]
    assert rep.summary["ratio"] == pytest.approx(0.5)
    bn = rep.bottlenecks.set_index("metric")  # the logged per-metric group std still names fmt
    assert bool(bn.loc["fmt", "bottleneck"]) and not bool(bn.loc["acc", "bottleneck"])
    assert bn.loc["fmt", "mean_group_std"] == 0.0 and np.isnan(bn.loc["fmt", "uniform_fraction"])
    assert np.isnan(bn.loc["fmt", "weight"])  # an import does not say its weights
    assert rep.bottleneck_text == "Variance bottleneck: fmt (std ~0 in the logged scalars, weight unknown)."
    report.to_html(rep), report.to_markdown(rep)


# ---- exports ---------------------------------------------------------------------------------
def _outside_scripts(text: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "", text, flags=re.S)


def test_html_is_self_contained_and_has_the_tables():
    run = make_run("html", steps=60, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    rep = report.build_report(run)
    text = report.to_html(rep)
    assert text.count("<script") >= 3 and "plotly" in text  # plotly.js inlined + 3 figures
    assert not re.search(r"<script[^>]*\bsrc=", text)  # plotly.js is inlined, not fetched
    outside = _outside_scripts(text)  # (the plotly.js bundle itself holds URL strings it never fetches here)
    assert not re.search(r"<link\b|<img\b|<iframe\b|@import|url\(|https?://", outside)
    assert '<table id="ledger">' in text and '<table id="summary">' in text
    assert '<td data-col="ratio_diff">+0.500</td>' in text


def test_markdown_and_csv():
    run = make_run("md", steps=60, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    rep = report.build_report(run)
    md = report.to_markdown(rep)
    assert md.startswith("# GRPO Health report: md")
    assert "| 50 | set_weights | ui | weights exact 1 -> 0.5, f1 0 -> 0.5 | 30–49 | 50–59 |" in md
    csv = pd.read_csv(io.StringIO(report.steps_csv(rep)), index_col="step")
    assert len(csv) == 60 and csv.loc[49, "ratio"] == 0.25 and csv.loc[50, "ratio"] == 0.75
    assert csv.loc[50, names.metric_weight("f1")] == 0.5  # every logged scalar comes along


# ---- CLI -------------------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "grpo_core", "report", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=os.environ.copy())


def test_cli_writes_html_and_md(tmp_path):
    run = make_run("cli", steps=60, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores, changes=CHANGE_AT_50)
    html_out, md_out = tmp_path / "r.html", tmp_path / "r.md"
    p = _cli(str(run), "--out", str(html_out))
    assert p.returncode == 0, p.stderr
    assert f"wrote {html_out}" in p.stdout
    assert html_out.read_text().startswith("<!DOCTYPE html>")
    p = _cli("cli", "--out", str(md_out))  # by run id under $GRPO_HEALTH_RUNS_DIR
    assert p.returncode == 0, p.stderr
    assert md_out.read_text() == report.to_markdown(report.build_report(run))
    p = _cli(str(run))
    assert p.returncode == 0 and p.stdout.startswith("# GRPO Health report: cli")


def test_cli_bad_suffix_and_missing_run(tmp_path):
    run = make_run("cli2", steps=2, weights={"exact": 1.0, "f1": 0.0}, scores=change_scores)
    p = _cli(str(run), "--out", str(tmp_path / "r.pdf"))
    assert p.returncode == 2 and p.stderr.startswith("error: --out must end in .html, .md or .csv")
    assert "Traceback" not in p.stderr and not (tmp_path / "r.pdf").exists()
    p = _cli(str(tmp_path / "nope"))
    assert p.returncode == 2 and p.stderr.startswith("error:") and "Traceback" not in p.stderr


def test_report_does_not_import_torch():
    code = ("import sys, grpo_core.analysis.report, grpo_core.runs.config; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
