"""Pilot: the summary, the planner and the verdict on constructed stores; the real pilot
process on the demo and on a binary metric whose success rate we control."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import pilot, planner, reweighting, step_stats, windows
from grpo_core.dashboard import pilot_start
from grpo_core.runs import names
from grpo_core.runs.config import RunConfig, from_dict
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- a pilot store built the way the trainer logs one ------------------------------------------
def make_pilot_store(run_id: str, scores: np.ndarray, metrics: list[str], weights: dict, *,
                     texts=None, config: dict | None = None, status: str = "finished") -> str:
    """scores [B, P, G, K] -> a finished pilot store of B batches (steps 1..B, as the trainer). texts: None
    (every completion distinct) or a function (b, p, g) -> str."""
    cfg = from_dict({"reward": {"weights": weights}, **(config or {})}).to_dict()
    cfg["grpo"]["steps"] = scores.shape[0]
    B, Pn, G, K = scores.shape
    w = np.array([weights.get(m, 0.0) for m in metrics])
    with RunStore.create(run_id, cfg, kind="pilot") as s:
        cs = ct = 0
        for b in range(B):
            sc = scores[b]
            stats = step_stats.group_stats(sc @ w, sc, min_group_std=cfg["grpo"]["min_group_std"])
            scal = step_stats.step_scalars(stats, sc, metrics, weights, cs, ct)
            cs, ct = int(scal[names.CUM_GROUPS_SUBMITTED]), int(scal[names.CUM_GROUPS_TRAINABLE])
            groups = pd.DataFrame({"group": range(Pn), "prompt_id": [f"p{b}-{i}" for i in range(Pn)],
                                   "size": G, "reward_mean": stats.mean, "reward_std": stats.std,
                                   "trainable": stats.trainable, "phantom": stats.phantom})
            rolls = [(i, j, float(sc[i, j] @ w), dict(zip(metrics, map(float, sc[i, j]))),
                      texts(b, i, j) if texts else f"c{b}-{i}-{j}", None)
                     for i in range(Pn) for j in range(G)]
            s.log_step(b + 1, scal, groups, rolls)
        s.set_status(status)
    return run_id


def bernoulli_scores(rng, B, Pn, G, ps):
    """[B, P, G, K] of independent Bernoulli(p_k) draws."""
    return (rng.random((B, Pn, G, len(ps))) < np.asarray(ps)).astype(float)


# ---- planner ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.5, 0.9, 0.97])
def test_planner_curve_matches_formula_and_seeded_simulation(p):
    curve = pilot.planner_curve(p, g_max=32)
    assert curve["G"].tolist() == list(range(2, 33))
    formula = 1 - p ** curve["G"] - (1 - p) ** curve["G"]
    np.testing.assert_allclose(curve["p_trainable"], formula, rtol=0, atol=1e-12)
    # Simulation: 20,000 groups of G Bernoulli(p) draws; share of groups not all equal.
    rng = np.random.default_rng(0)
    for G in (2, 4, 8, 16, 32):
        draws = rng.random((20_000, G)) < p
        sim = float((draws.any(axis=1) & ~draws.all(axis=1)).mean())
        pt = float(curve.loc[curve["G"] == G, "p_trainable"].iloc[0])
        se = np.sqrt(pt * (1 - pt) / 20_000)
        assert abs(sim - pt) <= 4 * se + 1e-9, (G, sim, pt)


def test_planner_g_is_the_smallest_reaching_the_target():
    for p, target in [(0.9, 0.3), (0.9, 0.5), (0.97, 0.5), (0.5, 0.9)]:
        g = planner.min_group_size(p, target)
        curve = pilot.planner_curve(p, g_max=256).set_index("G")["p_trainable"]
        assert curve[g] >= target and (g == 2 or curve[g - 1] < target)


# ---- summary and verdict on constructed stores ------------------------------------------------------------
def test_summary_of_an_easy_pilot_names_the_uniform_metrics(runs_dir):
    rng = np.random.default_rng(1)
    metrics = ["answer_f1", "exact", "format"]
    sc = np.empty((3, 8, 4, 3))
    sc[..., 0] = np.where(rng.random((3, 8, 4)) < 0.05, 0.5, 1.0)  # nearly always right
    sc[..., 1] = 1.0  # always exact: uniform
    sc[..., 2] = 1.0  # always formatted: uniform
    make_pilot_store("easy", sc, metrics, {"answer_f1": 0.5, "exact": 0.3, "format": 0.2},
                     config={"task": {"level": 1}})
    s = pilot.pilot_summary("easy")
    groups = RunStore.open("easy").groups()
    assert s.submitted == 24 and s.batches_done == 3 and s.group_size == 4
    assert s.ratio == pytest.approx(groups["trainable"].mean())
    # Uniform = uniform in most groups or mean within-group std ~0 (the report's bottleneck rule).
    f1_uniform_share = (sc[..., 0].reshape(24, 4).std(axis=1) <= 1e-3).mean()
    assert f1_uniform_share > 0.5
    assert s.uniform_metrics == ["answer_f1", "exact", "format"]
    assert s.metric_table.at["answer_f1", "uniform_fraction"] == pytest.approx(f1_uniform_share)
    t = s.metric_table
    assert t.at["exact", "success_rate"] == 1.0 and np.isnan(t.at["answer_f1", "success_rate"])
    np.testing.assert_allclose(t["within_group_std"], sc.reshape(24, 4, 3).std(axis=1).mean(axis=0))
    assert s.solved_share == 1.0 and s.key_metric == "exact"
    assert not s.verdict.ready
    kinds = [a.kind for a in s.verdict.actions]
    assert kinds[0] == "difficulty" and s.verdict.actions[0].settings == {"level": 2}
    assert "change the task difficulty first" == s.verdict.headline
    assert any("answer_f1, exact, format" in r for r in s.verdict.reasons)


def test_binary_metric_at_p09_plans_a_larger_group(runs_dir):
    rng = np.random.default_rng(2)
    sc = bernoulli_scores(rng, 4, 64, 2, [0.9])
    make_pilot_store("coin", sc, ["coin"], {"coin": 1.0}, config={"grpo": {"group_size": 2}})
    s = pilot.pilot_summary("coin", target=0.3)
    (plan,) = s.plans
    assert plan.metric == "coin" and plan.p == pytest.approx(sc.mean())
    assert plan.current_p_trainable == pytest.approx(1 - plan.p ** 2 - (1 - plan.p) ** 2)
    assert plan.g_needed == planner.min_group_size(plan.p, 0.3) and plan.g_needed > 2
    # The measured ratio is the pilot's groups; the planner's prediction at G=2 agrees with it.
    assert abs(s.ratio - plan.current_p_trainable) < 4 * np.sqrt(0.2 * 0.8 / 256)
    assert s.verdict.actions[0].kind == "group_size"
    assert s.verdict.actions[0].settings == {"group_size": plan.g_needed}
    assert s.verdict.headline == "change the group size first"


def test_prompt_dependent_success_asks_for_the_difficulty_not_a_larger_group(runs_dir):
    """Half the prompts always solved, half never: p = 0.5 overall, so the formula promises
    P(trainable) ~ 0.94 at G = 4, but no group varies. The verdict blames the prompts."""
    rng = np.random.default_rng(6)
    solved = rng.random((3, 16)) < 0.5
    sc = np.repeat(solved[:, :, None, None], 4, axis=2).astype(float)  # [3, 16, 4, 1]
    make_pilot_store("split", sc, ["exact"], {"exact": 1.0}, config={"grpo": {"group_size": 4}})
    s = pilot.pilot_summary("split")
    (plan,) = s.plans
    assert s.ratio == 0.0 and plan.measured_vary == 0.0 and plan.current_p_trainable > 0.8
    first = s.verdict.actions[0]
    assert first.kind == "difficulty" and "depends on the prompt" in first.text
    # More all-solved groups: raise the level; more all-failed: level 1 cannot go lower, so "easier prompts".
    assert first.settings == ({"level": 2} if s.solved_share >= s.failed_share else {})
    assert s.solved_share + s.failed_share == 1.0


def test_a_costly_group_size_puts_the_level_first(runs_dir):
    """exact right 99% of the time at G = 4: the target needs G ~ 36 (9x the rollouts), so the
    verdict raises the level first and keeps the group size as the alternative."""
    sc = bernoulli_scores(np.random.default_rng(10), 4, 64, 4, [0.99])
    make_pilot_store("solved", sc, ["exact"], {"exact": 1.0}, config={"grpo": {"group_size": 4}})
    s = pilot.pilot_summary("solved")
    assert s.plans[0].g_needed > 4 * 4
    assert [a.kind for a in s.verdict.actions] == ["difficulty", "group_size"]
    assert s.verdict.actions[0].settings == {"level": 2}


def test_weights_first_when_a_suggestion_reaches_the_target(runs_dir):
    rng = np.random.default_rng(3)
    sc = np.empty((2, 16, 4, 2))
    sc[..., 0] = 1.0  # uniform binary, carries most weight
    sc[..., 1] = rng.random((2, 16, 4))  # continuous, varies everywhere but weighted tiny
    make_pilot_store("w", sc, ["exact", "answer_f1"], {"exact": 1.0, "answer_f1": 0.005})
    s = pilot.pilot_summary("w")
    assert s.ratio < 0.3
    first = s.verdict.actions[0]
    assert first.kind == "weights" and first.predicted_ratio >= 0.3
    assert first.settings["weights"]["answer_f1"] > 0.005
    assert reweighting.what_if(s.values, first.settings["weights"]) == pytest.approx(first.predicted_ratio)


def test_temperature_when_completions_repeat(runs_dir):
    sc = np.zeros((2, 8, 4, 1))  # every completion of a group is the same text, so the same score
    make_pilot_store("cold", sc, ["answer_f1"], {"answer_f1": 1.0}, texts=lambda b, p, g: f"same{p}")
    s = pilot.pilot_summary("cold")
    assert s.diversity == pytest.approx(0.25) and s.ratio == 0.0
    assert [a.kind for a in s.verdict.actions] == ["temperature"]
    assert s.verdict.actions[0].settings == {"temperature": 1.5}


def test_groups_that_vary_by_little_get_std_actions_not_ratio_actions(runs_dir):
    """Every group is trainable, but the mean group reward std is below health.min_reward_std:
    the verdict is about that (a rarely-succeeding key metric: lower the level; then weights),
    never 'raise G to reach the ratio' (it is reached)."""
    rng = np.random.default_rng(9)
    sc = np.empty((3, 16, 4, 2))
    sc[..., 0] = 0.4 + 0.1 * rng.permuted(np.tile(np.arange(4) / 3, (3, 16, 1)), axis=2)  # a little, everywhere
    sc[..., 1] = rng.random((3, 16, 4)) < 0.05  # binary, rarely right
    make_pilot_store("flat", sc, ["answer_f1", "exact"], {"answer_f1": 0.5, "exact": 0.3},
                     config={"task": {"level": 2}})
    s = pilot.pilot_summary("flat")
    assert s.ratio == 1.0 and s.reward_std < 0.1 and not s.verdict.ready
    kinds = [a.kind for a in s.verdict.actions]
    assert kinds == ["difficulty", "weights"] and "group_size" not in kinds
    assert s.verdict.actions[0].settings == {"level": 1}
    assert s.verdict.headline == "change the task difficulty first"
    assert "answer_f1" in s.verdict.actions[1].text and "std" in s.verdict.actions[1].text


def test_ready_when_the_ratio_and_reward_std_pass(runs_dir):
    rng = np.random.default_rng(4)
    sc = rng.random((2, 8, 4, 2))
    make_pilot_store("ok", sc, ["answer_f1", "length"], {"answer_f1": 1.0, "length": 0.5})
    s = pilot.pilot_summary("ok")
    assert s.ratio == 1.0 and s.verdict.ready and s.verdict.headline == "ready to train"
    assert s.verdict.actions == []


def test_summary_of_a_pilot_without_steps(runs_dir):
    with RunStore.create("empty", RunConfig().to_dict(), kind="pilot"):
        pass
    s = pilot.pilot_summary("empty")
    assert s.ratio is None and s.submitted == 0 and s.plans == [] and not s.verdict.ready
    assert s.verdict.headline == "no pilot data yet" and s.status == "created"


def test_training_defaults_carry_the_chosen_settings(runs_dir):
    rng = np.random.default_rng(5)
    make_pilot_store("d", rng.random((1, 4, 4, 2)), ["answer_f1", "exact"], {"answer_f1": 0.6, "exact": 0.4},
                     config={"task": {"level": 3}, "grpo": {"temperature": 0.8}})
    s = pilot.pilot_summary("d")
    d = pilot.training_defaults(s, weights={"answer_f1": 0.7, "exact": 0.3}, group_size=12)
    assert d["group_size"] == 12 and d["level"] == 3 and d["temperature"] == 0.8
    assert d["weights"] == {"answer_f1": 0.7, "exact": 0.3} and d["from_pilot"] == "d"
    # The --set form of the same loads into a config with exactly these values.
    from grpo_core.tasks.loading import load_config
    cfg = load_config(None, d["overrides"])
    assert cfg.grpo.group_size == 12 and cfg.task.level == 3 and cfg.grpo.temperature == 0.8
    assert cfg.reward.weights["answer_f1"] == 0.7 and cfg.reward.weights["exact"] == 0.3


def test_pilot_module_does_not_import_torch():
    code = "import sys, grpo_core.analysis.pilot; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---- the real pilot process -------------------------------------------------------------------------
_COIN = random.Random(int(os.environ.get("PILOT_COIN_SEED", "0")))


def coin(completion: str, example: dict) -> float:
    """A binary metric with a success rate we control (PILOT_COIN_P), whatever the model says:
    the planner's p without a model that has to be trained to it."""
    return float(_COIN.random() < float(os.environ.get("PILOT_COIN_P", "0.9")))


def _coin_config(path, group_size: int) -> str:
    path.write_text(f"""
[reward]
weights = {{ coin = 1.0 }}
custom = {{ coin = "tests.test_pilot:coin" }}
[grpo]
group_size = {group_size}
prompts_per_step = 128
max_new_tokens = 2
[model]
warm_start_steps = 0
[log]
progress = false
""")
    return str(path)


@pytest.mark.slow
def test_planned_group_size_gives_a_pilot_that_meets_the_target(runs_dir, tmp_path, monkeypatch):
    """p = 0.9, G = 2: the planner (fed the pilot's measured p) picks G for target 0.3; a pilot
    at that G, started the way the page starts one, measures a ratio that meets the target."""
    env = {**os.environ, "PILOT_COIN_P": "0.9", "PILOT_COIN_SEED": "1", "GRPO_HEALTH_TORCH_THREADS": "1"}
    cmd = [sys.executable, "-m", "grpo_core", "pilot", "--config", _coin_config(tmp_path / "g2.toml", 2),
           "--set", "grpo.steps=8"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (rid,) = list_runs()["run_id"]
    assert rid.startswith("pilot-")  # never "demo-...": that prefix marks the live demo run
    s = pilot.pilot_summary(rid, target=0.3)
    assert s.status == "finished" and s.submitted == 1024 and s.batches_done == 8
    (plan,) = s.plans
    assert abs(plan.p - 0.9) < 3 * np.sqrt(0.09 / 2048)  # the measured success rate
    assert abs(s.ratio - plan.current_p_trainable) < 3 * np.sqrt(0.18 * 0.82 / 1024)
    g = plan.g_needed
    assert g == planner.min_group_size(0.9, 0.3) == 4
    assert s.verdict.actions[0].settings == {"group_size": g}
    assert "loss/policy" not in RunStore.open(rid).scalar_names()  # nothing was trained

    # The second pilot goes through start_pilot (the page's path): a detached process.
    from grpo_core.tasks.loading import load_config
    cfg = load_config(_coin_config(tmp_path / "g.toml", g), ["grpo.steps=8"])
    monkeypatch.setenv("PILOT_COIN_P", "0.9")
    monkeypatch.setenv("PILOT_COIN_SEED", "2")
    monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "1")
    monkeypatch.chdir(ROOT)
    rid = pilot_start.start_pilot(cfg)
    deadline = time.time() + 300
    while (s2 := pilot.pilot_summary(rid, target=0.3)).status in ("created", "running") and time.time() < deadline:
        time.sleep(0.5)
    assert s2.status == "finished", (s2.status, s2.error)
    assert s2.group_size == g and s2.submitted == 1024
    assert s2.ratio >= 0.3, s2.ratio
    assert abs(s2.ratio - planner.p_trainable_binary(0.9, g)) < 3 * np.sqrt(0.34 * 0.66 / 1024)


@pytest.mark.parametrize("argv, message", [
    (["--set", "grpo.group_size=1"], "error: grpo.group_size must be >= 2"),
    (["--set", "grpo.steps=0"], "error: grpo.steps must be >= 1"),
    (["--config", "nope.toml"], "error: config file not found: nope.toml"),
    (["--set", "grpo.group_sise=4"], "error: unknown key 'grpo.group_sise' (did you mean 'group_size'?)"),
])
def test_pilot_cli_bad_input_is_one_line_and_exit_2(argv, message, runs_dir, capsys):
    from grpo_core.__main__ import main
    assert main(["pilot", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err
    assert not any(runs_dir.iterdir())  # no store left behind


@pytest.mark.slow
def test_pilot_applies_stop_and_rejects_other_requests(runs_dir, tmp_path, monkeypatch):
    """Requests sent before the pilot's first batch: set_weights is rejected with a reason,
    stop is applied, and the pilot ends 'stopped' with its store readable (in-process CLI)."""
    import argparse

    import torch

    from grpo_core.tasks.loading import load_config
    from grpo_core.train.pilot import cli_pilot
    monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "1")
    threads = torch.get_num_threads()
    cfg = load_config(_coin_config(tmp_path / "c.toml", 2), ["grpo.steps=50"])
    with RunStore.create("stopme", cfg.to_dict(), kind="pilot") as s:
        (s.run_dir / "config.toml").write_text(cfg.to_toml())
        s.request("set_weights", {"weights": {"coin": 2.0}})
        s.request("stop", {})
    args = argparse.Namespace(config=str(runs_dir / "stopme" / "config.toml"), overrides=["grpo.steps=50"],
                              run_id="stopme", runs_dir=None)
    import signal
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert cli_pilot(args) == 0
    finally:  # the pilot installs its stop handlers and sets torch threads: give pytest its own back
        for sig, h in saved.items():
            signal.signal(sig, h)
        torch.set_num_threads(threads)
    with RunStore.open("stopme") as s:
        meta, ctl = s.get_meta(), s.control()
    assert meta["status"] == "stopped" and meta["kind"] == "pilot"
    assert ctl["status"].tolist() == ["rejected", "applied"]
    assert "a pilot takes no changes" in ctl["message"].iloc[0]
    assert pilot.pilot_summary("stopme").verdict.headline == "no pilot data yet"


# ---- the demo: easy level vs harder level, and the pilot vs the first training steps -------------------
# Seeded runs of the tiny model follow different trajectories on different float kernels (AVX2 vs
# AVX-512, thread counts: issue 15), so nothing below asserts a learned outcome beyond a tolerance from
# its spread: the expert trains *until* it reaches its level, and the ratios are compared within
# 3 binomial standard errors. Measured (experts of seeds 0-2, pilot/training seeds 0-3, plain AVX-512
# and ATEN_CPU_CAPABILITY=avx2, 26 runs): numbers in the comments below.
EXPERT_LEVEL = 0.97  # share of sampled level-1 answers right: a model that has learned level 1
EXPERT_CHECK_EVERY = 20  # warm-start steps between two checks of that share (256 samples each)
EXPERT_LR = 5e-3  # measured: level reached after 100-140 steps (seeds 0-7, both kernels); at 1e-2 the
#                   trajectory is chaotic (seed 4: 0.66 after 600 steps) and a fixed 200 steps gave 0.99
#                   on AVX-512 but 0.83 on AVX2
EXPERT_MAX_STEPS = 600  # the cap: over 4x the most steps measured
PROMPTS = 8  # per batch / step: the demo's default
PILOT_BATCHES = 20  # 20 x 8 prompts = 160 groups per pilot: SE of a ratio near 0.4 is 0.039
FIRST_STEPS = 4  # training steps the pilot's ratio predicts: the policy has moved little yet (below)
SIGMAS = 3


def diff_se(p1: float, n1: int, p2: float, n2: int) -> float:
    """Standard error of p1 - p2 for two binomial proportions over n1 and n2 groups, pooled (the
    two-proportion z-test's: it stays > 0 when one ratio is 0 or 1)."""
    p = (p1 * n1 + p2 * n2) / (n1 + n2)
    return float(np.sqrt(p * (1 - p) * (1 / n1 + 1 / n2)))


@pytest.fixture(scope="module")
def level1_expert(tmp_path_factory):
    """A built-in model that has learned demo level 1: the trainer's own warm-start, trained until
    >= 97% of 256 sampled answers are right (checked every 20 steps, at most 600 steps) instead
    of stopping at 30%. The model a user has after training on level 1, without paying for that
    GRPO run in a test. Trained to a level, not for a number of steps: how many steps that takes
    depends on the float kernels."""
    import torch

    from grpo_core.runs.config import ModelConfig
    from grpo_core.tasks.demo import DemoTask
    from grpo_core.train import models
    path = tmp_path_factory.mktemp("expert") / "level1"
    tok = models.build_tokenizer()
    model = models.build_tiny_model(ModelConfig(), tok, seed=0)
    task = DemoTask(level=1, seed=0)
    match_rate = models.target_match_rate

    def match_rate_256(policy, tokenizer, demo, n=None):  # warm_start's stop check, on 256 samples not 64
        return match_rate(policy, tokenizer, demo, n=256)
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("GRPO_HEALTH_TORCH_THREADS", "1")))  # tiny model, shared box: 1
    try:
        with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng(devices=[]):
            mp.setattr(models, "WARM_CHECK_EVERY", EXPERT_CHECK_EVERY)
            mp.setattr(models, "target_match_rate", match_rate_256)
            torch.manual_seed(0)
            losses, rate = models.warm_start(model, tok, task, EXPERT_MAX_STEPS, lr=EXPERT_LR, target=EXPERT_LEVEL)
    finally:
        torch.set_num_threads(threads)
    assert rate >= EXPERT_LEVEL, (
        f"the level-1 expert did not reach its level: {rate:.1%} of 256 sampled answers right (needs "
        f"{EXPERT_LEVEL:.0%}) after {len(losses)} warm-start steps (the cap is {EXPERT_MAX_STEPS}), "
        f"last loss {losses[-1]:.4f}")
    models.save_pretrained(model, tok, path)
    return str(path)


def _run(cmd: str, run_id: str, *sets: str):
    argv = [sys.executable, "-m", "grpo_core", cmd, "--run-id", run_id, "--set", "log.progress=false"]
    for s in sets:
        argv += ["--set", s]
    # tiny model, shared cores: one thread is fastest (GRPO_HEALTH_TORCH_THREADS=N to measure another kernel)
    env = {**os.environ, "GRPO_HEALTH_TORCH_THREADS": os.environ.get("GRPO_HEALTH_TORCH_THREADS", "1")}
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.slow
def test_demo_pilot_easy_vs_harder_level_and_the_first_training_steps(runs_dir, level1_expert):
    """With a model that has learned level 1: a pilot of level 1 predicts a ratio below the
    health threshold, names the metrics uniform inside groups and what to change; the
    same model on level 2 predicts a higher ratio (by more than 3 SE), and the first 4 training
    steps with the same settings (the demo's learning rate) measure a ratio within 3 SE of it:
    a pilot predicts the policy it sampled, and training moves the policy (over 20 steps the
    ratio fell by 0.13 on average, 2.3 SE: no prediction for those). Batch 1 of the pilot and
    step 1 of training are the same rollouts (same seed, same prompts, no update yet)."""
    common = (f"model.path={level1_expert}", "grpo.group_size=4", f"grpo.prompts_per_step={PROMPTS}")
    _run("pilot", "easy", "task.level=1", f"grpo.steps={PILOT_BATCHES}", *common)
    easy = pilot.pilot_summary("easy")
    # measured 0.069-0.138 (mean 0.11) over 160 groups: 0.3 is 6 SE (0.027) above the highest
    assert easy.ratio < 0.3 and not easy.verdict.ready, easy.ratio
    assert {"exact", "citation", "format"} <= set(easy.uniform_metrics)
    # What to change: a larger G for exact (the planner) or, when that costs > 4x, the next level.
    assert easy.verdict.actions[0].kind in ("group_size", "difficulty")
    assert easy.verdict.actions[0].metric == "exact"

    _run("pilot", "hard", "task.level=2", f"grpo.steps={PILOT_BATCHES}", *common)
    hard = pilot.pilot_summary("hard")
    assert easy.submitted == hard.submitted == PROMPTS * PILOT_BATCHES
    # measured: hard - easy = 0.22-0.58, 4.6-10.6 SE (3 SE = 0.14-0.16)
    se = diff_se(hard.ratio, hard.submitted, easy.ratio, easy.submitted)
    assert hard.ratio - easy.ratio > SIGMAS * se, (easy.ratio, hard.ratio, se)

    _run("train", "train", "task.level=2", f"grpo.steps={FIRST_STEPS}", "log.checkpoint_every=0", *common)
    with RunStore.open("train") as t, RunStore.open("hard") as h:
        measured, _, submitted, steps = windows.window_ratio(t.scalars_wide(), FIRST_STEPS)
        assert steps == FIRST_STEPS and submitted == PROMPTS * FIRST_STEPS
        g_train, g_pilot = t.groups(until_step=1), h.groups(until_step=1)
        r_train, r_pilot = t.rollouts(step=1), h.rollouts(step=1)
    # measured: training - pilot = -1.97 .. +1.82 SE over the first 4 steps (3 SE = 0.28-0.29); over
    # 6 steps -3.6 .. +3.0 SE, over 20 steps -0.13 (-2.3 SE) on average: the policy has moved
    se = diff_se(hard.ratio, hard.submitted, measured, submitted)
    assert abs(hard.ratio - measured) <= SIGMAS * se, (hard.ratio, measured, se)
    pd.testing.assert_frame_equal(g_train, g_pilot)
    assert r_train["completion"].tolist() == r_pilot["completion"].tolist()
