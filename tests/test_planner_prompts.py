"""The planner that knows prompts differ: the beta-binomial flat probability, the prompts' prior,
the per-prompt prediction against the pooled one, in the pilot's summary and verdict, and on a
real trainer run (its store, the live what-if's forecast) with a reward whose rate is set per prompt."""
from __future__ import annotations

import hashlib
import math
import random

import numpy as np
import pytest

from grpo_core.analysis import charts, pilot, planner, prompt_history
from grpo_core.dashboard import advice, live_view
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from tests.test_pilot import make_pilot_store


def beta_flat_by_integration(a: float, b: float, G: int) -> float:
    """E[p^G + (1-p)^G] for p ~ Beta(a, b), by the midpoint rule on a fine grid."""
    x = (np.arange(200_000) + 0.5) / 200_000
    log_pdf = (a - 1) * np.log(x) + (b - 1) * np.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return float(np.mean(np.exp(log_pdf) * (x ** G + (1 - x) ** G)))


@pytest.mark.parametrize("a,b,G", [(2.0, 3.0, 4), (1.5, 1.5, 8), (5.0, 1.2, 16), (3.0, 7.0, 1)])
def test_flat_probability_is_the_beta_binomial_one(a, b, G):
    assert planner.flat_probability_beta(a, b, G) == pytest.approx(beta_flat_by_integration(a, b, G), abs=2e-4)
    # A prior so strong the rate is known: the pooled formula.
    p = a / (a + b)
    strong = planner.flat_probability_beta(p * 1e7, (1 - p) * 1e7, G)
    assert strong == pytest.approx(1 - planner.p_trainable_binary(p, G), abs=1e-5)


def draw_counts(rng, rates, G: int, groups: int = 1):
    n = np.full(len(rates), G * groups)
    return rng.binomial(n, rates), n


def test_prompts_that_differ_leave_more_groups_flat_than_the_pooled_rate_predicts():
    """Rates spread over prompts (Beta(0.4, 0.6)): one group of 8 per prompt as the history, a
    fresh group per prompt measured. The per-prompt prediction lands on the measured share; the
    pooled one (p^G + (1-p)^G at the pooled p) is far below it."""
    rng = np.random.default_rng(3)
    rates = rng.beta(0.4, 0.6, 600)
    s, n = draw_counts(rng, rates, 8)
    fresh, _ = draw_counts(rng, rates, 8)
    measured = float(np.mean((fresh == 0) | (fresh == 8)))
    f = planner.flat_rates(s, n, 8)
    se = math.sqrt(measured * (1 - measured) / len(rates))
    assert abs(f["per_prompt"] - measured) < 3 * se + 0.02
    assert f["pooled"] < measured - 0.3  # Jensen: the pooled rate under-predicts
    a, b = f["prior"]
    assert a + b < 5  # a wide prior: the prompts really differ


def test_equal_prompts_give_the_pooled_prediction():
    rng = np.random.default_rng(4)
    s, n = draw_counts(rng, np.full(500, 0.3), 8)
    f = planner.flat_rates(s, n, 8)
    assert sum(f["prior"]) > 200  # no spread found: a strong prior
    assert f["per_prompt"] == pytest.approx(f["pooled"], abs=0.01)
    assert planner.prompt_flat_curve(s, n, [2, 8, 32]) == pytest.approx(
        [1 - planner.p_trainable_binary(f["p"], g) for g in (2, 8, 32)], abs=0.01)


def test_a_prompt_seen_once_is_shrunk_toward_the_pool_not_read_as_never_solved():
    rng = np.random.default_rng(5)
    s, n = draw_counts(rng, rng.beta(2, 2, 200), 8, groups=4)
    s, n = np.append(s, 0), np.append(n, 8)  # one prompt, one group, no success
    prior = planner.beta_prior(s, n)
    one = planner.prompt_flat_probabilities(s, n, 8, prior)[-1]
    assert 0.0 < one < 0.99  # not p = 0 (which would make its next group flat for sure)
    assert (prior[0] / (prior[0] + prior[1] + 8)) > 0  # its posterior mean rate
    # An unseen prompt gets the prior's flat probability.
    unseen = planner.prompt_flat_probabilities([0], [0], 8, prior)[0]
    assert unseen == pytest.approx(planner.flat_probability_beta(*prior, 8))


@pytest.mark.parametrize("s,n", [([3], [2]), ([-1], [4]), ([1, 2], [4]), ([np.nan], [4])])
def test_bad_counts_are_refused(s, n):
    with pytest.raises(ValueError, match="successes"):
        planner.flat_rates(s, n, 4)


def test_all_solved_or_none_leaves_no_spread_to_fit():
    assert planner.beta_prior([8, 8], [8, 8]) is None
    assert planner.flat_rates([0, 0], [8, 8], 4)["per_prompt"] == 1.0
    assert planner.flat_rates([], [], 4)["pooled"] is None


# ---- the pilot: summary, page numbers and verdict ----------------------------------------------------
def two_kinds_of_prompt(rng, batches: int, P: int, G: int, easy: float, hard: float) -> np.ndarray:
    """[B, P, G, 1] exact scores: even prompts succeed at `easy`, odd ones at `hard`."""
    rates = np.where(np.arange(P) % 2 == 0, easy, hard)
    return (rng.random((batches, P, G, 1)) < rates[None, :, None, None]).astype(float)


def test_pilot_shows_the_per_prompt_prediction_beside_the_pooled_one_and_the_measured(runs_dir):
    rng = np.random.default_rng(7)
    sc = two_kinds_of_prompt(rng, 6, 32, 4, easy=0.97, hard=0.06)
    make_pilot_store("mixed", sc, ["exact"], {"exact": 1.0}, config={"grpo": {"group_size": 4}})
    (plan,) = pilot.pilot_summary("mixed").plans
    flat = pilot.flat_shares(plan)
    assert plan.prompts == 6 * 32  # every group a prompt of its own id
    assert flat["measured"] > 0.7 and flat["pooled"] < 0.2  # p ~ 0.5: the pooled formula expects ~0.13
    assert abs(flat["per_prompt"] - flat["measured"]) < 0.08
    assert plan.curve["p_trainable_prompts"].is_monotonic_increasing
    assert (plan.curve["p_trainable_prompts"] <= plan.curve["p_trainable"] + 1e-9).all()
    fig = charts.pilot_planner(plan, 0.3)
    assert [t.name for t in fig.data][:2] == [f"pooled p = {plan.p:.2f}", "per prompt"]
    assert list(fig.data[1].y) == pytest.approx(list(plan.curve["p_trainable_prompts"]))


def test_the_group_size_advice_follows_the_per_prompt_planner(runs_dir):
    """Prompts at 0.98 and 0.7: the pooled rate (~0.85) promises the target at a smaller G (6) than
    the prompts give (15); the verdict asks for the per-prompt G and says what the pooled one promised."""
    rng = np.random.default_rng(8)
    sc = two_kinds_of_prompt(rng, 8, 32, 2, easy=0.98, hard=0.7)
    make_pilot_store("spread", sc, ["exact"], {"exact": 1.0}, config={"grpo": {"group_size": 2}})
    s = pilot.pilot_summary("spread", target=0.6)
    (plan,) = s.plans
    assert plan.prompts_g_needed is not None and plan.g_needed is not None
    assert plan.prompts_g_needed > plan.g_needed
    action = next(a for a in s.verdict.actions if a.kind == "group_size")
    assert action.settings == {"group_size": plan.prompts_g_needed}
    assert "one pooled rate would promise" in action.text
    reached = plan.curve.set_index("G").at[plan.prompts_g_needed, "p_trainable_prompts"]
    assert action.predicted_ratio == pytest.approx(reached) and reached >= 0.6


def test_the_live_what_if_shows_measured_pooled_and_per_prompt_flat_shares(runs_dir):
    rng = np.random.default_rng(9)
    make_pilot_store("live", two_kinds_of_prompt(rng, 5, 16, 4, easy=0.95, hard=0.05), ["exact"], {"exact": 1.0},
                     config={"grpo": {"group_size": 4}})
    state = live_view.load("live")
    for G in (4, 16):
        out = advice.flat_forecast(state, G)
        assert out["available"] and out["metric"] == "exact" and out["G"] == G and out["steps"] == 5
        assert out["per_prompt"] > out["pooled"] + 0.3
    (plan,) = pilot.pilot_summary("live").plans
    assert out["measured"] == pytest.approx(1 - plan.measured_vary)
    assert advice.flat_forecast(state, 4)["per_prompt"] == pytest.approx(1 - plan.prompts_p_trainable)


# ---- a real trainer run, the store's groups and the live what-if ---------------------------------
_DRAWS = random.Random(0)


def split(completion: str, example: dict) -> float:
    """A binary metric whose success rate is set by the prompt, whatever the model says: a
    prompt whose hash is even succeeds 95% of the time, an odd one 5%."""
    even = int(hashlib.sha256(example["prompt"].encode()).hexdigest(), 16) % 2 == 0
    return float(_DRAWS.random() < (0.95 if even else 0.05))


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    from grpo_core.train.trainer import Trainer
    root = tmp_path_factory.mktemp("runs")
    cfg = load_config(None, ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                             "model.intermediate_size=64", "model.warm_start_steps=0", "grpo.prompts_per_step=8",
                             "grpo.group_size=4", "grpo.max_new_tokens=4", "grpo.steps=16", "log.progress=false",
                             "log.checkpoint_every=0", "reward.weights={split = 1.0}",
                             'reward.custom={split = "tests.test_planner_prompts:split"}',
                             "reward.outcome_metric=split"])
    store = RunStore.create("split", cfg.to_dict(), root=root)
    assert Trainer(cfg, store, log=lambda m: None).run() == "finished"
    yield store
    store.close()


@pytest.mark.slow
def test_a_real_runs_groups_give_the_counts_and_the_per_prompt_forecast_is_closer(split_run):
    groups, rollouts = split_run.groups(), split_run.rollouts(with_text=False)
    per = prompt_history.group_successes(groups, rollouts, "split")
    assert len(per) == len(groups) == 16 * 8 and (per["trials"] == 4).all()
    sums = rollouts.groupby(["step", "group"])["split"].sum().to_numpy()
    assert (per["successes"].to_numpy() == sums).all()
    # The outcome gate: a group trains exactly when split varies in it.
    assert prompt_history.measured_flat(per) == pytest.approx(1 - groups["trainable"].mean())
    # Predict steps 9..16 from steps 1..8 (no peeking): the per-prompt forecast is nearer.
    past, now = per[per["step"] <= 8], per[per["step"] > 8]
    f = prompt_history.flat_forecast(past, 4, prompts=list(now["prompt_id"]))
    measured = prompt_history.measured_flat(now)
    assert measured > 0.6 and f["pooled"] < 0.3
    assert abs(f["per_prompt"] - measured) < abs(f["pooled"] - measured)
    assert abs(f["per_prompt"] - measured) < 0.15


@pytest.mark.slow
def test_the_live_what_if_on_a_real_run(split_run):
    state = live_view.load(split_run.run_dir)
    out = advice.flat_forecast(state, 8)
    per = prompt_history.group_successes(split_run.groups(), state.rollouts, "split")
    expected = prompt_history.flat_forecast(per, 8, prompts=list(per["prompt_id"].unique()))
    assert out["available"] and out["metric"] == "split" and out["G"] == 8
    assert out["measured"] == pytest.approx(prompt_history.measured_flat(per))
    assert (out["pooled"], out["per_prompt"]) == pytest.approx((expected["pooled"], expected["per_prompt"]))
    assert out["per_prompt"] > out["pooled"] + 0.3  # at G = 8 the pooled rate expects almost no flat group


def test_the_live_page_shows_the_flat_forecast_beside_the_what_if(runs_dir):
    from tests.helpers_dashboard import app_test, synth_run
    synth_run(runs_dir, "r", 12)
    at = app_test()
    at.session_state["run_id"] = "r"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    line = next(c.value for c in at.caption if c.value.startswith("Flat groups (exact"))
    state = live_view.load("r")
    f = advice.flat_forecast(state, 8)
    assert f"measured **{f['measured']:.0%}**" in line and f"pooled rate **{f['pooled']:.0%}**" in line
    assert f"own rate **{f['per_prompt']:.0%}**" in line and "G = 8" in line


def test_the_pilot_page_shows_measured_pooled_and_per_prompt_flat_shares(runs_dir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.helpers_dashboard import REPO
    monkeypatch.chdir(REPO)
    rng = np.random.default_rng(10)
    make_pilot_store("page", two_kinds_of_prompt(rng, 4, 16, 4, easy=0.95, hard=0.05), ["exact"], {"exact": 1.0},
                     config={"grpo": {"group_size": 4}})
    at = AppTest.from_file(str(REPO / "pages" / "pilot.py"), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    (plan,) = pilot.pilot_summary("page").plans
    flat = pilot.flat_shares(plan)
    shown = {m.label: m.value for m in at.metric}
    assert shown["Flat groups, measured (G = 4)"] == f"{flat['measured']:.0%}"
    assert shown["Predicted, one pooled rate"] == f"{flat['pooled']:.0%}"
    assert shown["Predicted, per prompt"] == f"{flat['per_prompt']:.0%}"
    assert len(at.get("plotly_chart")) == 3  # histograms, within-group std, the planner with both curves
