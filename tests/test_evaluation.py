"""Held-out evaluation in the real trainer on a real store: eval/... scalars after step 1,
every eval.every steps and after the last; the same prompts each time; greedy pass@1; and
evaluating never shifts the training stream (the run's own numbers are those of a run
without it)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from grpo_core.errors import ConfigError
from grpo_core.runs import names
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train import evaluation
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=3", "grpo.group_size=4", "grpo.max_new_tokens=10",
        "log.progress=false", "log.checkpoint_every=0", "grpo.steps=5"]


def run(tmp_path, run_id, extra=()):
    cfg = load_config(None, TINY + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path)
    tr = Trainer(cfg, store, log=lambda m: None)
    assert tr.run() == "finished"
    return tr, store.scalars_wide()


def test_eval_scalars_at_the_due_steps_and_the_training_stream_untouched(tmp_path):
    tr, wide = run(tmp_path, "with", ["eval.every=2", "eval.prompts=6"])
    _, plain = run(tmp_path, "without")
    evaluated = wide[names.EVAL_REWARD].dropna().index.tolist()
    assert evaluated == [1, 2, 4, 5]
    assert tr.held_out.pass_metric == "exact" and len(tr.held_out.examples) == 6
    for name in (names.EVAL_PASS, names.TIME_EVAL, names.eval_metric_mean("citation")):
        assert wide[name].dropna().index.tolist() == evaluated
    assert wide[names.EVAL_PASS].dropna().between(0, 1).all()
    train_cols = [names.REWARD, names.TRAINABLE_RATIO, names.LOSS_POLICY]
    assert np.allclose(wide[train_cols].to_numpy(), plain[train_cols].to_numpy(), equal_nan=True)


def test_greedy_evaluation_is_the_same_on_the_same_policy(tmp_path):
    tr, _ = run(tmp_path, "r", ["eval.every=1", "eval.prompts=4", "grpo.steps=1"])
    first, again = tr.evaluate(), tr.evaluate()
    first.pop(names.TIME_EVAL), again.pop(names.TIME_EVAL)
    assert first == again
    roll = tr.rollout(tr.held_out.examples, 1, 0.0)
    scored = tr.reward.score(roll.texts, roll.examples)
    assert first == evaluation.scalars(scored.raw, tr.reward, "exact")


def test_a_held_out_file_is_read_in_order_and_scored_with_the_pass_metric(tmp_path):
    data = tmp_path / "train.jsonl"
    rows = [{"prompt": f"Q{i}: ", "answer": "a" if i % 2 else "b"} for i in range(8)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    held = tmp_path / "held.jsonl"
    held.write_text("\n".join(json.dumps({"prompt": f"H{i}: ", "answer": "a"}) for i in range(5)) + "\n")
    weights = "reward.weights={exact = 1.0}"
    tr, wide = run(tmp_path, "j", ["task.name=jsonl", f"task.dataset={data}", weights, f"eval.dataset={held}",
                                   "eval.every=2", "eval.prompts=3", "grpo.steps=2"])
    assert [e["prompt"] for e in tr.held_out.examples] == ["H0: ", "H1: ", "H2: "]
    assert wide[names.EVAL_PASS].dropna().index.tolist() == [1, 2]


def test_a_jsonl_task_without_a_held_out_file_is_told_how(tmp_path):
    data = tmp_path / "x.jsonl"
    data.write_text('{"prompt": "Q: ", "answer": "a"}\n')
    with pytest.raises(ConfigError, match="eval.dataset.*--set eval.dataset=held_out.jsonl"):
        load_config(None, ["task.name=jsonl", f"task.dataset={data}", "eval.every=5"])
    with pytest.raises(ConfigError, match="eval.pass_metric 'nope' is not a metric"):
        load_config(None, ["eval.pass_metric=nope"])


def test_the_eval_curve_is_on_the_live_page_the_analysis_page_and_the_report(tmp_path, monkeypatch):
    from grpo_core.analysis import comparison, report
    from tests.helpers_dashboard import REPO, chart_specs, live_charts, run_page, series
    run(tmp_path, "ev", ["eval.every=2", "eval.prompts=4"])
    run(tmp_path, "plain")
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    monkeypatch.chdir(REPO)
    held = [s for s in live_charts(run_page("app.py", "ev")) if s["title"] == "Held-out evaluation"]
    assert len(held) == 1 and held[0]["series"][0]["points"]
    assert [x for x, _ in series(held[0], held[0]["series"][0]["label"])] == [1, 2, 4, 5]  # a point per evaluation

    titles = [s["layout"]["title"]["text"] for s in chart_specs(run_page("pages/analysis.py", "ev"))]
    assert "Held-out evaluation" in titles

    rep = report.build_report(tmp_path / "ev")
    assert rep.evaluation.index.tolist() == [1, 2, 4, 5] and list(rep.evaluation.columns) == ["reward", "pass@1"]
    assert "## Held-out evaluation" in report.to_markdown(rep) and 'id="fig-eval"' in report.to_html(rep)
    summary, _ = comparison.compare_runs([tmp_path / "ev", tmp_path / "plain"])
    assert summary.loc["ev", "eval_reward_final"] == pytest.approx(rep.evaluation["reward"].iloc[-1])
    assert summary.loc["plain", "eval_reward_final"] is None or np.isnan(summary.loc["plain", "eval_reward_final"])
    assert comparison.eval_figure([tmp_path / "plain", tmp_path / "plain"]) is None
