"""The demo's story at a compressed pace: the real trainer with the shipped demo's autopilot
settings (processes.demo_config; its line at the default 0.3 and no level move, see _config)
tells collapse -> alert -> fix -> recovery in ~60 small steps.

What compresses it: the demo's collapse comes from learning (level 1 solved, groups turn
uniform, after ~270 steps); here a reward stands in for that learning on a schedule, so the
test holds on any machine whatever the model samples: each completion fails with probability
0.5 for the first STEPS_EASY steps (groups disagree), then 0.04 (a task the model has mostly
solved: most groups of 4 all pass). Only the reward's own seeded draws decide what the
trainable ratio is, never a learned outcome, so the sequence is the same on every CPU (and
with ATEN_CPU_CAPABILITY=avx2); the tolerances below are binomial spreads, not fitted ones
(docs/demo.md, "The story at a compressed pace").
"""
import random
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_core.dashboard import processes
from grpo_core.runs import names
from grpo_core.runs.store import EV_ALERT, RunStore

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, G0, STEPS, STEPS_EASY = 8, 4, 70, 12
FAIL_EASY, FAIL_SOLVED = 0.5, 0.04
HEALTHY = 0.3  # the default health.min_trainable_ratio (the demo's own line is above it)
_rng = random.Random(0)
_calls = [0]


def solved(completion, example) -> float:
    """1 unless this completion 'fails': the schedule above, by call count (the trainer scores
    every completion once, in a fixed order)."""
    _calls[0] += 1
    easy = _calls[0] <= STEPS_EASY * PROMPTS * G0
    return 0.0 if _rng.random() < (FAIL_EASY if easy else FAIL_SOLVED) else 1.0


def p_vary(p: float, g: int) -> float:
    return 1 - p ** g - (1 - p) ** g


def _config(tmp: Path) -> Path:
    cfg = processes.demo_config([f"grpo.steps={STEPS}", "model.warm_start_steps=0", "grpo.max_new_tokens=4",
                              f"grpo.prompts_per_step={PROMPTS}", f"grpo.group_size={G0}", "log.checkpoint_every=0",
                              "reward.weights={solved = 1.0}", "reward.custom.solved='tests.test_demo_story:solved'",
                              # the stand-in reward ignores the task level: a level move could not help here
                              'autopilot.moves=["weights", "group_size", "temperature"]',
                              # the default line: at the demo's 0.4 the schedule's abrupt drop has the autopilot
                              # act on a window that still holds easy steps, and judge its move against that
                              # mixed ratio (the real demo's ratio declines over ~100 steps: docs/demo.md)
                              f"health.min_trainable_ratio={HEALTHY}", f"autopilot.target_ratio={HEALTHY}"])
    assert cfg.autopilot.enabled and cfg.grpo.steps == STEPS  # the demo's autopilot, as shipped
    path = tmp / "story.toml"
    path.write_text(cfg.to_toml())
    return path


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("story")
    out = subprocess.run([sys.executable, "-m", "grpo_core", "train", "--config", str(_config(tmp)), "--run-id",
                          "story", "--runs-dir", str(tmp)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with RunStore.open(tmp / "story", readonly=True) as s:
        yield s.scalars_wide(), s.events(kinds=[EV_ALERT]), s.changes(), s.control()


def _pooled(wide, lo, hi) -> float:
    w = wide.loc[lo:hi]
    return float(w[names.GROUPS_TRAINABLE].sum() / w[names.GROUPS_SUBMITTED].sum())


def test_the_ratio_collapses_and_the_low_ratio_alert_fires_before_any_fix(story):
    wide, alerts, changes, _ = story
    first_fix = int(changes["step"].min())
    low = [int(st) for st, p in zip(alerts["step"], alerts["payload"]) if p["kind"] == "low_ratio"]
    assert low and STEPS_EASY < low[0] < first_fix  # the alert is up before the fix applies
    # healthy while easy (expected 0.875 at G=4), then below the line (expected 0.15): 160 and 80 groups
    assert _pooled(wide, 1, STEPS_EASY) > 0.7
    assert _pooled(wide, first_fix - 10, first_fix - 1) < HEALTHY


def test_the_autopilot_fixes_it_with_a_larger_group_and_the_ratio_recovers(story):
    wide, _, changes, control = story
    moves = control[control["source"] == "autopilot"]
    assert len(moves) >= 1 and set(moves["status"]) == {"applied"}
    assert moves.iloc[0]["kind"] == "set_group_size" and moves.iloc[0]["payload"]["group_size"] == 2 * G0
    sizes = [G0] + [int(p["group_size"]) for k, p in zip(moves["kind"], moves["payload"]) if k == "set_group_size"]
    assert sizes == sorted(sizes) and len(changes) == len(moves)  # every fix marked, G only ever up
    # Recovery: over the last 20 steps (160 groups) above the line. At the final G the expected
    # ratio is p_vary(0.04, G) (0.48 at G=16, 0.72 at 32); minus 3 binomial sds, still above 0.3.
    g = sizes[-1]
    expected = p_vary(FAIL_SOLVED, g)
    sd = (expected * (1 - expected) / (20 * PROMPTS)) ** 0.5
    last = _pooled(wide, STEPS - 19, STEPS)
    assert g >= 16 and expected - 3 * sd > HEALTHY
    assert last > HEALTHY and abs(last - expected) < 4 * sd, (g, last, expected)


def test_the_shipped_demo_runs_until_stopped_and_acts_on_the_alerts_own_line():
    cfg = processes.demo_config()
    a, h = cfg.autopilot, cfg.health
    assert cfg.grpo.steps == processes.UNTIL_STOPPED and "stop" not in a.moves  # a page finds it running
    assert a.enabled and a.target_ratio == h.min_trainable_ratio and a.window == h.trend_window  # alert, then fix
    # ... on a line above the default one, so that later moves come before the ratio reaches 0.3
    assert h.min_trainable_ratio > HEALTHY and "difficulty" in a.moves and "group_size" in a.moves
    assert cfg.grpo.beta > 0  # the KL term that keeps level 2's sampling from collapsing
    assert cfg.log.keep_text == "sample" and cfg.log.checkpoint_every >= 500  # bounded disk while it runs
    assert processes.demo_config(["grpo.steps=7"]).grpo.steps == 7  # serve --set still passes the knobs
