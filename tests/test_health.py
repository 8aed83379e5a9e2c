"""Health metrics on hand cases and on runs written through a real RunStore."""
import math

import numpy as np
import pandas as pd
import pytest

from grpo_core.analysis import health, planner, reweighting, rollout_stats, step_stats, trend_stats, windows
from grpo_core.errors import ConfigError
from grpo_core.runs.config import HealthConfig
from grpo_core.runs.names import (
    CUM_GROUPS_SUBMITTED,
    CUM_GROUPS_TRAINABLE,
    CUM_TRAINABLE_RATIO,
    FRAC_REWARD_ZERO_STD,
    GROUPS_SUBMITTED,
    GROUPS_TRAINABLE,
    PHANTOM_GROUPS,
    REWARD,
    REWARD_STD,
    TRAINABLE_RATIO,
)
from grpo_core.runs.store import RunStore

NAMES = ["answer_f1", "exact", "format"]


# ---- helpers: write steps the way the trainer does ------------------------------------------
def log_scored_step(store, step, scores, names, weights, cum, min_group_std=0.01, outcome_index=None):
    """scores [P, G, K] -> group_stats -> one store step (scalars, groups, rollouts); returns new cum."""
    w = np.array([weights[n] for n in names])
    totals = scores @ w
    st = step_stats.group_stats(totals, scores, min_group_std=min_group_std, outcome_index=outcome_index)
    scal = step_stats.step_scalars(st, scores, names, weights, *cum)
    p, g, _ = scores.shape
    groups = pd.DataFrame({"group": range(p), "prompt_id": [f"q{step}-{i}" for i in range(p)], "size": g,
                           "reward_mean": st.mean, "reward_std": st.std, "trainable": st.trainable,
                           "phantom": st.phantom})
    rollouts = [(gi, i, totals[gi, i], dict(zip(names, scores[gi, i].tolist())), f"c{gi}.{i}", None)
                for gi in range(p) for i in range(g)]
    store.log_step(step, scal, groups, rollouts)
    return scal[CUM_GROUPS_SUBMITTED], scal[CUM_GROUPS_TRAINABLE]


def random_scores(rng, p, g):
    """A realistic mix: continuous F1, a binary outcome that is often uniform, a format check."""
    f1 = np.round(rng.beta(2, 2, (p, g)), 3)
    succ = rng.random((p, 1)) * 1.2 - 0.1  # some prompts always/never solved
    exact = (rng.random((p, g)) < succ).astype(float)
    fmt = (rng.random((p, g)) < 0.9).astype(float)
    f1[rng.random(p) < 0.3] = 0.5  # some groups uniform in f1 too
    return np.stack([f1, exact, fmt], axis=-1)


def make_run(tmp_path, monkeypatch, steps=6, sizes=(4, 6), weights=None, seed=0, **kw):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    weights = weights or {"answer_f1": 0.02, "exact": 0.5, "format": 0.1}
    rng = np.random.default_rng(seed)
    store = RunStore.create("r1", {"reward": {"weights": weights}})
    cum = (0, 0)
    for step in range(steps):
        scores = random_scores(rng, 5, sizes[step % len(sizes)])  # group size differs between steps
        cum = log_scored_step(store, step, scores, NAMES, weights, cum, **kw)
    return store, weights


def wide_from(rows: dict[str, list], start=0) -> pd.DataFrame:
    n = len(next(iter(rows.values())))
    return pd.DataFrame(rows, index=pd.Index(range(start, start + n), name="step"))


# ---- reference cases ---------------------------------------------------------------------------
def test_reference_groups_default_threshold():
    st = step_stats.group_stats(np.array([[0.93, 0.92, 0.94], [0.4, 0.8, 0.1]]))
    assert st.trainable.tolist() == [False, True]
    assert st.std[0] == pytest.approx(np.std([0.93, 0.92, 0.94]))


def test_min_group_std_zero_is_not_all_equal():
    st = step_stats.group_stats(np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.000001]]), min_group_std=0.0)
    assert st.trainable.tolist() == [False, True]
    # float noise in a "constant" group must not count as variance
    noisy = np.array([[0.1 + 0.2, 0.3, 0.3]])
    assert step_stats.group_stats(noisy, min_group_std=0.0).trainable.tolist() == [False]


def test_cumulative_names_are_arts():
    assert CUM_GROUPS_SUBMITTED == "data/cum/num_groups_submitted"
    assert CUM_GROUPS_TRAINABLE == "data/cum/num_groups_trainable"


def test_28_groups_5_trainable_ratio_and_low_ratio_alert(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    store = RunStore.create("r28", {})
    cum, trainable_per_step = (0, 0), [2, 1, 0, 2]  # 4 steps x 7 groups = 28, 5 trainable
    for step, t in enumerate(trainable_per_step):
        totals = np.zeros((7, 4))
        totals[:t] = [0.0, 1.0, 0.0, 1.0]
        scores = totals[..., None]
        st = step_stats.group_stats(totals, scores)
        scal = step_stats.step_scalars(st, scores, ["exact"], {"exact": 1.0}, *cum)
        cum = scal[CUM_GROUPS_SUBMITTED], scal[CUM_GROUPS_TRAINABLE]
        store.log_step(step, scal)
    wide = store.scalars_wide()
    assert wide[CUM_GROUPS_SUBMITTED].iloc[-1] == 28 and wide[CUM_GROUPS_TRAINABLE].iloc[-1] == 5
    assert wide[CUM_TRAINABLE_RATIO].iloc[-1] == pytest.approx(5 / 28)
    cfg = HealthConfig()
    low = [a for a in health.alerts(wide, cfg) if a.kind == "low_ratio"]
    assert len(low) == 1 and low[0].severity == "warning" and low[0].step == 3
    assert "0.18" in low[0].message and "5 of 28 groups" in low[0].message
    v = health.verdict(wide, cfg)
    check = next(c for c in v.checks if c.name == "trainable_ratio")
    assert check.ok is False and check.value == pytest.approx(5 / 28)
    assert v.status in ("warning", "critical")
    # the same from ART-style cumulative counts only, and from TRL's frac_reward_zero_std only
    only_cum = wide[[CUM_GROUPS_SUBMITTED, CUM_GROUPS_TRAINABLE]]
    assert windows.window_ratio(only_cum, 20)[:3] == (5 / 28, 5, 28)
    trl = pd.DataFrame({FRAC_REWARD_ZERO_STD: 1 - wide[TRAINABLE_RATIO]})
    assert windows.ratio_series(trl).ratio.to_numpy() == pytest.approx(wide[TRAINABLE_RATIO].to_numpy())


def test_the_trainable_ratio_has_one_order_of_sources():
    """counts -> the logged ratio -> cumulative counts -> 1 - frac_reward_zero_std: each source
    disagrees with the others here, so the number says which one was read, and the name matches."""
    steps = pd.Index([1, 2, 3], name="step")
    sources = {
        windows.COUNTS: {GROUPS_SUBMITTED: [4.0, 4.0, 4.0], GROUPS_TRAINABLE: [1.0, 1.0, 1.0]},  # 0.25
        windows.RATIO: {TRAINABLE_RATIO: [0.5, 0.5, 0.5]},
        windows.CUMULATIVE: {CUM_GROUPS_SUBMITTED: [4.0, 8.0, 12.0], CUM_GROUPS_TRAINABLE: [3.0, 6.0, 9.0]},  # 0.75
        windows.ZERO_STD: {FRAC_REWARD_ZERO_STD: [0.0, 0.0, 0.0]},  # 1.0
    }
    values = {windows.COUNTS: 0.25, windows.RATIO: 0.5, windows.CUMULATIVE: 0.75, windows.ZERO_STD: 1.0}
    assert list(sources) == list(windows.RATIO_SOURCES)  # the test walks the documented order
    order = list(sources)
    for i, first in enumerate(order):
        logged = {name: v for source in order[i:] for name, v in sources[source].items()}
        wide = pd.DataFrame(logged, index=steps)
        found = windows.ratio_series(wide)
        assert found.source == first and found.text == windows.RATIO_SOURCES[first]
        assert found.ratio.tolist() == pytest.approx([values[first]] * 3)
        assert windows.window_ratio(wide, 20)[0] == pytest.approx(values[first])
        ratio_check = next(c for c in health.verdict(wide, HealthConfig()).checks if c.name == "trainable_ratio")
        assert ratio_check.value == pytest.approx(values[first])
    nothing = windows.ratio_series(pd.DataFrame({REWARD: [0.1]}, index=pd.Index([1], name="step")))
    assert nothing.source is None and nothing.text == windows.NO_RATIO and nothing.ratio.empty
    # a window whose counts hold no group falls through to the next source (ART's empty steps log ratio 0)
    empty = pd.DataFrame({GROUPS_SUBMITTED: [0.0], GROUPS_TRAINABLE: [0.0], TRAINABLE_RATIO: [0.0]},
                         index=pd.Index([1], name="step"))
    assert windows.ratio_series(empty).source == windows.RATIO and windows.window_ratio(empty, 20)[:3] == (0.0, None, None)


def test_outcome_gate_and_phantom_groups():
    # group 0: outcome varies (trainable); group 1: only the shaping metric varies (phantom);
    # group 2: nothing varies.
    scores = np.array([[[1, 0.5], [0, 0.5], [1, 0.5]],
                       [[1, 0.0], [1, 1.0], [1, 0.5]],
                       [[0, 0.2], [0, 0.2], [0, 0.2]]], dtype=float)
    totals = scores @ np.array([1.0, 0.5])
    gated = step_stats.group_stats(totals, scores, outcome_index=0)
    assert gated.trainable.tolist() == [True, False, False]
    assert gated.phantom.tolist() == [False, True, False]
    plain = step_stats.group_stats(totals, scores)
    assert plain.trainable.tolist() == [True, True, False] and not plain.phantom.any()
    scal = step_stats.step_scalars(gated, scores, ["exact", "format"], {"exact": 1.0, "format": 0.5}, 0, 0)
    assert scal[PHANTOM_GROUPS] == 1 and scal[GROUPS_TRAINABLE] == 1
    a = rollout_stats.dense_arrays(scores)
    a.metric_names = ["exact", "format"]
    w = {"exact": 1.0, "format": 0.5}
    assert reweighting.what_if(a, w, outcome_metric="exact") == pytest.approx(1 / 3)
    assert reweighting.what_if(a, w) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="outcome metric 'nope'"):
        reweighting.what_if(a, w, outcome_metric="nope")


# ---- alerts and verdict -------------------------------------------------------------------------
ZERO_MSG = "3 steps with zero trainable groups: raise the group size or the weights of continuous metrics"


def test_zero_trainable_alert_after_configured_streak():
    cfg = HealthConfig()
    rows = {GROUPS_SUBMITTED: [8] * 5, GROUPS_TRAINABLE: [4, 3, 0, 0, 0]}
    al = [a for a in health.alerts(wide_from(rows), cfg) if a.kind == "zero_trainable"]
    assert [(a.message, a.severity, a.step) for a in al] == [(ZERO_MSG, "critical", 4)]
    # two zero steps: not yet; a trainable step breaks the streak
    rows[GROUPS_TRAINABLE] = [0, 0, 1, 0, 0]
    assert not [a for a in health.alerts(wide_from(rows), cfg) if a.kind == "zero_trainable"]
    cfg.zero_trainable_steps = 2
    assert [a.message for a in health.alerts(wide_from(rows), cfg) if a.kind == "zero_trainable"] == \
        [ZERO_MSG.replace("3 steps", "2 steps")]


def test_near_zero_suggests_stopping():
    cfg = HealthConfig(near_zero_steps=6)
    ratios = [0.5, 0.4] + [0.03, 0.0, 0.05, 0.01, 0.02, 0.04]
    al = {a.kind: a for a in health.alerts(wide_from({TRAINABLE_RATIO: ratios}), cfg)}
    assert al["near_zero"].severity == "critical" and "6 steps" in al["near_zero"].message
    assert "stop" in al["near_zero"].message
    ratios[-1] = 0.06  # just above near_zero_ratio breaks the streak
    assert "near_zero" not in {a.kind for a in health.alerts(wide_from({TRAINABLE_RATIO: ratios}), cfg)}


def test_declining_ratio_suggests_harder_tasks():
    rng = np.random.default_rng(1)
    cfg = HealthConfig(trend_window=20, min_trainable_ratio=0.0)
    falling = np.clip(np.linspace(0.9, 0.35, 30) + rng.normal(0, 0.03, 30), 0, 1)
    al = {a.kind: a for a in health.alerts(wide_from({TRAINABLE_RATIO: falling}), cfg)}
    assert "declining_ratio" in al and "harder tasks" in al["declining_ratio"].message
    assert "curriculum" in al["declining_ratio"].message and "20 steps" in al["declining_ratio"].message
    flat = 0.6 + rng.normal(0, 0.03, 30)
    assert "declining_ratio" not in {a.kind for a in health.alerts(wide_from({TRAINABLE_RATIO: flat}), cfg)}


def test_low_reward_std_alert():
    cfg = HealthConfig()
    al = health.alerts(wide_from({REWARD_STD: [0.05, 0.04, 0.03], TRAINABLE_RATIO: [0.8, 0.8, 0.8]}), cfg)
    assert [a.kind for a in al] == ["low_reward_std"] and "0.040" in al[0].message
    assert not health.alerts(wide_from({REWARD_STD: [0.3, 0.2], TRAINABLE_RATIO: [0.8, 0.8]}), cfg)


def test_verdict_healthy_warning_critical_unknown():
    cfg = HealthConfig()
    rng = np.random.default_rng(2)
    n = 25
    good = {REWARD: np.linspace(0.2, 0.7, n) + rng.normal(0, 0.02, n), REWARD_STD: np.full(n, 0.25),
            GROUPS_SUBMITTED: np.full(n, 8), GROUPS_TRAINABLE: np.full(n, 6)}
    v = health.verdict(wide_from(good), cfg)
    assert v.status == "healthy" and v.trend.sign == 1 and not v.alerts
    assert [c.name for c in v.checks] == ["reward_std", "trainable_ratio", "reward_trend"]
    assert all(c.ok for c in v.checks)
    flat = dict(good, **{REWARD: 0.5 + rng.normal(0, 0.02, n)})
    v = health.verdict(wide_from(flat), cfg)
    assert v.status == "warning" and next(c for c in v.checks if c.name == "reward_trend").ok is False
    dead = dict(good, **{GROUPS_TRAINABLE: np.r_[np.full(n - 3, 6), [0, 0, 0]]})
    assert health.verdict(wide_from(dead), cfg).status == "critical"
    short = health.verdict(wide_from({k: v_[:3] for k, v_ in good.items()}), cfg)
    assert next(c for c in short.checks if c.name == "reward_trend").ok is None
    assert short.status == "healthy"  # the known checks pass; the trend is not judged yet
    assert health.verdict(pd.DataFrame(), cfg).status == "unknown"


def test_reward_trend():
    assert trend_stats.reward_trend([0.1, 0.2, 0.3, 0.4]).sign == 0  # below min_points
    assert trend_stats.reward_trend([0.1, 0.2, 0.3, 0.4], min_points=3).sign == 1
    rise = trend_stats.reward_trend(np.linspace(0, 1, 12) + np.random.default_rng(3).normal(0, 0.05, 12))
    assert rise.sign == 1 and rise.p_value < 0.05 and rise.n == 12 and rise.slope == pytest.approx(1 / 11, rel=0.2)
    noisy = trend_stats.reward_trend(np.array([0.5, 0.9, 0.1, 0.6, 0.4, 0.8, 0.2, 0.55, 0.45, 0.6]))
    assert noisy.sign == 0 and noisy.p_value > 0.05
    assert trend_stats.reward_trend(np.full(10, 0.3)).sign == 0
    assert trend_stats.reward_trend(np.linspace(1, 0, 8)).sign == -1
    s = pd.Series([0.1, 0.2, np.nan, 0.4, 0.5, 0.6], index=[10, 20, 30, 40, 50, 60])
    t = trend_stats.reward_trend(s)
    assert t.n == 5 and t.slope == pytest.approx(0.01) and t.sign == 1  # per step, NaN dropped
    # the p-value against a textbook t table: t = 2.228 with 10 df is the two-sided 5% point
    assert trend_stats.t_two_sided_p(2.228, 10) == pytest.approx(0.05, abs=2e-4)
    assert trend_stats.t_two_sided_p(0.0, 7) == pytest.approx(1.0)


# ---- per-metric variance -------------------------------------------------------------------------
def test_per_metric_std_uniform_fraction_and_ragged_equals_dense():
    scores = np.array([[[1, 0.0], [1, 1.0]], [[0, 0.5], [1, 0.5]]], dtype=float)
    assert rollout_stats.per_metric_group_std(scores) == pytest.approx([0.25, 0.25])
    assert rollout_stats.uniform_fraction(scores) == pytest.approx([0.5, 0.5])
    rng = np.random.default_rng(4)
    dense = rng.random((7, 5, 3))
    frame = pd.DataFrame({"step": 0, "group": np.repeat(np.arange(7), 5), "idx": np.tile(np.arange(5), 7)})
    for k, m in enumerate(NAMES):
        frame[m] = dense[..., k].ravel()
    shuffled = frame.sample(frac=1.0, random_state=0)  # unsorted input is sorted first
    for x in (frame, shuffled):
        assert rollout_stats.per_metric_group_std(x) == pytest.approx(dense.std(axis=1).mean(axis=0))
        assert rollout_stats.variance_contribution(x, dict(zip(NAMES, [0.2, 0.3, 0.5]))) == \
            pytest.approx(rollout_stats.variance_contribution(dense, np.array([0.2, 0.3, 0.5])))


def test_variance_contribution_hand_example():
    # one group; x1, x2 uncorrelated: Var(2 x1 + x2) = 4*0.25 + 0.25 -> shares 0.8 / 0.2
    scores = np.array([[[1, 0], [0, 0], [1, 1], [0, 1]]], dtype=float)
    assert rollout_stats.variance_contribution(scores, np.array([2.0, 1.0])) == pytest.approx([0.8, 0.2])
    # perfectly correlated metrics share in proportion to their weights
    same = np.array([[[1, 1], [0, 0], [1, 1]]], dtype=float)
    assert rollout_stats.variance_contribution(same, np.array([2.0, 1.0])) == pytest.approx([2 / 3, 1 / 3])
    # ragged random groups: shares sum to 1; a uniform metric explains nothing
    rng = np.random.default_rng(5)
    sizes = rng.integers(2, 9, 40)
    frame = pd.DataFrame({"step": 0, "group": np.repeat(np.arange(40), sizes)})
    frame["idx"] = frame.groupby("group").cumcount()
    frame["a"], frame["b"] = rng.random(len(frame)), rng.random(len(frame)) > 0.5
    frame["u"] = np.repeat(rng.random(40), sizes)
    share = rollout_stats.variance_contribution(frame, {"a": 0.5, "b": 0.3, "u": 0.2})
    assert share.sum() == pytest.approx(1.0) and share[2] == pytest.approx(0.0, abs=1e-12)
    # no variance at all: nothing to explain
    assert rollout_stats.variance_contribution(np.ones((3, 4, 2)), np.array([1.0, 1.0])).tolist() == [0.0, 0.0]


# ---- what-if and suggestions ------------------------------------------------------------------------
def test_what_if_recorded_weights_equals_recorded_ratio(tmp_path, monkeypatch):
    store, weights = make_run(tmp_path, monkeypatch, steps=8)
    wide = store.scalars_wide()
    recorded = wide[CUM_GROUPS_TRAINABLE].iloc[-1] / wide[CUM_GROUPS_SUBMITTED].iloc[-1]
    assert 0 < recorded < 1  # the case is not degenerate
    ro = store.rollouts()
    assert reweighting.what_if(ro, weights) == recorded
    per_step = reweighting.what_if_per_step(ro, weights)
    assert per_step.index.tolist() == wide.index.tolist()
    assert per_step.to_numpy().tolist() == wide[TRAINABLE_RATIO].to_numpy().tolist()
    # group by group it agrees with the groups table too
    a = rollout_stats.rollout_arrays(ro, NAMES)
    ok = reweighting.trainable_groups(a, np.array([weights[m] for m in NAMES]), 0.01, None, 1e-3)
    assert ok.tolist() == store.groups()["trainable"].tolist()
    # and a weight change moves it: only the binary outcome -> ratio = share of mixed groups
    g = ro.groupby(["step", "group"])["exact"].agg(["min", "max"])
    assert reweighting.what_if(ro, {"exact": 1.0}) == pytest.approx((g["min"] != g["max"]).mean())


def test_what_if_with_outcome_gate_matches_recorded(tmp_path, monkeypatch):
    store, weights = make_run(tmp_path, monkeypatch, steps=5, outcome_index=1, seed=7)
    wide = store.scalars_wide()
    assert wide[PHANTOM_GROUPS].sum() > 0
    recorded = wide[CUM_GROUPS_TRAINABLE].iloc[-1] / wide[CUM_GROUPS_SUBMITTED].iloc[-1]
    assert reweighting.what_if(store.rollouts(), weights, outcome_metric="exact") == recorded


def test_what_if_ragged_groups_against_a_plain_reference():
    rng = np.random.default_rng(6)
    sizes = rng.integers(1, 7, 60)
    frame = pd.DataFrame({"step": np.repeat(np.arange(60) // 10, sizes), "group": np.repeat(np.arange(60) % 10, sizes)})
    frame["idx"] = frame.groupby(["step", "group"]).cumcount()
    frame["x"] = (rng.random(len(frame)) < 0.6).astype(float)
    frame["y"] = np.round(rng.random(len(frame)), 2)
    w = {"x": 0.7, "y": 0.05}
    frame["t"] = frame["x"] * 0.7 + frame["y"] * 0.05
    ref = frame.groupby(["step", "group"])["t"].agg(lambda s: np.std(s.to_numpy()) > 0.01)
    assert reweighting.what_if(frame.drop(columns="t"), w) == pytest.approx(ref.mean())
    per_step = reweighting.what_if_per_step(frame.drop(columns="t"), w)
    assert per_step.to_numpy() == pytest.approx(ref.groupby(level="step").mean().to_numpy())


def test_what_if_bad_input():
    frame = pd.DataFrame({"step": [0, 0], "group": [0, 0], "idx": [0, 1], "exact": [0.0, 1.0]})
    with pytest.raises(ConfigError, match="unknown metric"):
        reweighting.what_if(frame, {"exakt": 1.0})
    with pytest.raises(ConfigError, match="finite"):
        reweighting.what_if(frame, {"exact": math.nan})
    with pytest.raises(ValueError, match="no scores for metric"):
        rollout_stats.rollout_arrays(frame, ["citation"])
    empty = frame.iloc[:0]
    assert reweighting.what_if(empty, {"exact": 1.0}) == 0.0 and reweighting.what_if_per_step(empty, {"exact": 1.0}).empty


def uniform_binary_case(tmp_path, monkeypatch):
    """'exact' is always 1 (uniform: solved every time) and carries most of the weight;
    'answer_f1' varies a little, so its small weight leaves most groups under min_group_std."""
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path))
    weights = {"answer_f1": 0.1, "exact": 0.8, "format": 0.1}
    rng = np.random.default_rng(8)
    store = RunStore.create("sugg", {"reward": {"weights": weights}})
    cum = (0, 0)
    for step in range(4):
        f1 = np.clip(0.6 + rng.normal(0, 1, (8, 6)) * rng.uniform(0.01, 0.2, (8, 1)), 0, 1)
        scores = np.stack([f1, np.ones((8, 6)), np.ones((8, 6))], axis=-1)
        cum = log_scored_step(store, step, scores, NAMES, weights, cum)
    return store, weights


def test_suggest_weights_raises_ratio_respects_floor_and_is_what_if(tmp_path, monkeypatch):
    store, weights = uniform_binary_case(tmp_path, monkeypatch)
    ro = store.rollouts()
    current = reweighting.what_if(ro, weights)
    assert current < 0.5
    assert rollout_stats.uniform_fraction(ro)[NAMES.index("exact")] == 1.0
    sugg = reweighting.suggest_weights(ro, weights, floor=0.05, n=3)
    assert 1 <= len(sugg) <= 3
    fresh = RunStore.open(store.path, readonly=True).rollouts()  # recompute from scratch
    for s in sugg:
        w = s["weights"]
        assert set(w) == set(weights) and sum(w.values()) == pytest.approx(sum(weights.values()))
        assert min(w.values()) >= 0.05 * sum(weights.values()) - 1e-12
        assert s["predicted_ratio"] == reweighting.what_if(fresh, w)
        assert s["predicted_ratio"] > current and s["current_ratio"] == current
        assert w["answer_f1"] > weights["answer_f1"] and "answer_f1 +" in s["why"]
    assert sugg[0]["predicted_ratio"] == max(s["predicted_ratio"] for s in sugg)
    # a trade-off: each next suggestion gains less but changes the weights less
    moved = [sum(abs(s["weights"][m] - weights[m]) for m in weights) for s in sugg]
    assert moved == sorted(moved, reverse=True)
    assert reweighting.suggest_weights(ro, weights, n=3) == sugg  # seeded: same answer twice
    # a floor that pins every metric leaves nothing to suggest; and nothing beats a perfect ratio
    assert reweighting.suggest_weights(ro, weights, floor=0.5) == []


def test_suggest_weights_when_nothing_helps(tmp_path, monkeypatch):
    rows = pd.DataFrame({"step": 0, "group": np.repeat([0, 1], 3), "idx": np.tile([0, 1, 2], 2),
                         "exact": 1.0, "format": 0.0})
    assert reweighting.suggest_weights(rows, {"exact": 0.5, "format": 0.5}) == []  # no metric ever varies
    with pytest.raises(ConfigError):
        reweighting.suggest_weights(rows, {"exact": -1.0, "format": 0.5})


# ---- planner ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p,G", [(0.5, 2), (0.1, 8), (0.9, 4), (0.3, 16), (0.02, 32)])
def test_binary_planner_matches_monte_carlo(p, G):
    rng = np.random.default_rng(int(p * 1000) + G)
    rewards = (rng.random((40_000, G)) < p).astype(float)
    simulated = step_stats.group_stats(rewards, min_group_std=0.0).trainable.mean()
    assert planner.p_trainable_binary(p, G) == pytest.approx(simulated, abs=0.01)


def test_binary_planner_edges_and_min_group_size():
    assert planner.p_trainable_binary(0.0, 8) == 0.0 and planner.p_trainable_binary(1.0, 8) == 0.0
    assert planner.p_trainable_binary(0.5, 1) == 0.0
    grid = planner.p_trainable_binary(np.array([[0.1], [0.5]]), np.array([2, 4]))
    assert grid.shape == (2, 2) and grid[1, 0] == pytest.approx(0.5)
    g = planner.min_group_size(0.1, 0.5)
    assert planner.p_trainable_binary(0.1, g) >= 0.5 > planner.p_trainable_binary(0.1, g - 1)
    assert planner.min_group_size(0.5, 0.5) == 2
    assert planner.min_group_size(0.0, 0.5) is None and planner.min_group_size(0.001, 0.9, g_max=64) is None
    with pytest.raises(ValueError, match="p must be in"):
        planner.p_trainable_binary(1.5, 4)
    with pytest.raises(ValueError, match="group size"):
        planner.p_trainable_binary(0.5, 0)
    with pytest.raises(ValueError, match="target"):
        planner.min_group_size(0.5, 0)


@pytest.mark.parametrize("outcome", [None, "exact"])
def test_candidate_ranking_agrees_with_what_if(tmp_path, monkeypatch, outcome):
    """suggest_weights ranks candidates by a covariance shortcut; it must agree with what_if."""
    store, _ = make_run(tmp_path, monkeypatch, steps=6, seed=11)
    a = rollout_stats.rollout_arrays(store.rollouts(), NAMES)
    cand = np.random.default_rng(12).dirichlet(np.ones(3), 40) * np.array([[0.3, 1.0, 0.5]])
    fast = reweighting.candidate_ratios(a, [0, 1, 2], cand, 0.01, outcome, 1e-3)
    slow = [reweighting.what_if(a, dict(zip(NAMES, c)), outcome_metric=outcome) for c in cand]
    assert fast.tolist() == slow and len(set(slow)) > 1  # and the candidates do differ


def test_suggest_weights_with_outcome_gate(tmp_path, monkeypatch):
    store, weights = uniform_binary_case(tmp_path, monkeypatch)
    ro = store.rollouts()
    # the outcome (exact) never varies: no weights can make a group trainable under the gate
    assert reweighting.what_if(ro, weights, outcome_metric="exact") == 0.0
    assert reweighting.suggest_weights(ro, weights, outcome_metric="exact") == []
    gated = reweighting.suggest_weights(ro, weights, outcome_metric="answer_f1")
    assert gated and all(s["predicted_ratio"] == reweighting.what_if(ro, s["weights"], outcome_metric="answer_f1")
                         for s in gated)
