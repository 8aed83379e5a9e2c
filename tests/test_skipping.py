"""Skip before sampling (grpo_core/train/skipping.py): streaks and keep probabilities by hand, the
draw with its cap and fill, and the real trainer on a small JSONL whose prompts repeat: the
skipped counts are logged, a prompt that is always zero-variance is drawn less often, and a
resumed run skips what the uninterrupted one skipped."""
import zlib

import numpy as np
import pytest

from grpo_core.errors import ConfigError
from grpo_core.runs.names import CUM_SKIPPED_PROMPTS, SKIPPED_PROMPTS
from grpo_core.runs.run_meta import RUNNING
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train.skipping import PromptSkipper
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=4", "grpo.max_new_tokens=6",
        "log.progress=false", "log.checkpoint_every=0"]


def fixed_or_coin(completion: str, example: dict) -> float:
    """Rows marked "fixed" score 1 whatever the completion (every group zero-variance); the
    others a coin from a hash of the completion (their groups nearly always vary)."""
    if example.get("fixed"):
        return 1.0
    return float(zlib.crc32((example["prompt"] + completion).encode()) % 2)


def _ex(pid):
    return {"prompt": pid, "prompt_id": pid}


# ---- the rule by hand -------------------------------------------------------------------------------
def test_streaks_count_non_trainable_groups_in_a_row_and_a_trainable_one_resets():
    sk = PromptSkipper(enabled=True, explore=0.5, min_explore=0.1)
    sk.after_step([_ex("a"), _ex("b"), _ex("c")], np.array([False, True, False]))
    assert sk.streaks == {"a": 1, "c": 1}
    sk.after_step([_ex("a"), _ex("c")], [False, True])
    sk.after_step([_ex("a"), _ex("b")], [False, False])
    assert sk.streaks == {"a": 3, "b": 1}
    assert sk.keep_probability("a") == pytest.approx(0.125)  # 0.5 ** 3
    assert sk.keep_probability("b") == pytest.approx(0.5)
    assert sk.keep_probability("c") == 1.0  # reset by its trainable group: always kept
    sk.after_step([_ex("a")], [False])
    assert sk.keep_probability("a") == pytest.approx(0.1)  # 0.5 ** 4 = 0.0625, floored at min_explore


def test_the_draw_replaces_skipped_prompts_and_counts_them():
    stream = iter(_ex(p) for p in "abcdefgh" * 4)
    batch = lambda k: [next(stream) for _ in range(k)]  # noqa: E731
    sk = PromptSkipper(enabled=True, explore=1e-9, min_explore=0.0)  # a streak means skipped
    sk.streaks = {"a": 1, "c": 2}
    got = sk.draw(batch, 3)
    assert [e["prompt_id"] for e in got] == ["b", "d", "e"]  # a and c skipped, two more drawn
    scal = sk.after_step(got, [True, True, False])
    assert scal == {SKIPPED_PROMPTS: 2.0, CUM_SKIPPED_PROMPTS: 2.0}
    assert sk.streaks == {"a": 1, "c": 2, "e": 1}


def test_past_the_cap_the_skipped_prompts_fill_the_batch():
    stream = iter(_ex(p) for p in "abcdef")
    batch = lambda k: [next(stream) for _ in range(k)]  # noqa: E731
    sk = PromptSkipper(enabled=True, explore=1e-9, min_explore=0.0, max_extra=2)
    sk.streaks = dict.fromkeys("abcd", 1)  # the first four would all be skipped
    got = sk.draw(batch, 3)  # 3 + 2 draws: a b c d skipped, e kept; then a and b fill
    assert [e["prompt_id"] for e in got] == ["e", "a", "b"]
    assert sk.after_step(got, [True] * 3)[SKIPPED_PROMPTS] == 2.0  # c and d were not sampled


def test_off_the_draw_is_the_task_batch_and_nothing_is_logged():
    calls = []
    sk = PromptSkipper(enabled=False)
    sk.streaks = {"a": 5}
    assert sk.draw(lambda k: calls.append(k) or [_ex("a")] * k, 4) == [_ex("a")] * 4
    assert calls == [4] and sk.after_step([_ex("a")], [False]) == {} and sk.streaks == {"a": 5}


def test_state_round_trip_gives_the_same_decisions():
    sk = PromptSkipper(enabled=True, explore=0.5, min_explore=0.05, seed=3)
    sk.after_step([_ex(p) for p in "abc"], [False, False, True])
    sk.cum_skipped = 7
    copy = PromptSkipper(enabled=True, explore=0.5, min_explore=0.05, seed=99)
    copy.load_state_dict(sk.state_dict())
    assert copy.streaks == sk.streaks and copy.cum_skipped == 7
    assert [sk.skip(p) for p in "abab" * 10] == [copy.skip(p) for p in "abab" * 10]


def test_the_knobs_are_validated():
    with pytest.raises(ConfigError, match="grpo.skip_explore must be in"):
        load_config(None, ["grpo.skip_explore=0"])
    with pytest.raises(ConfigError, match="grpo.skip_max_extra must be >= 0"):
        load_config(None, ["grpo.skip_max_extra=-1"])
    assert load_config(None, []).grpo.skip_zero_variance is False  # off by default


# ---- the real trainer ----------------------------------------------------------------------------
def _jsonl_trainer(tmp_path, extra=(), run_id="r", resume=False):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "qa.jsonl"
    rows = [('{"prompt": "Q: k%d? A: ", "answer": "v", "fixed": %s}' % (i, "true" if i < 3 else "false"))
            for i in range(6)]
    data.write_text("\n".join(rows) + "\n")
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = '{data}'\n[reward.weights]\nmine = 1.0\n"
                    "[reward.custom]\nmine = 'tests.test_skipping:fixed_or_coin'\n")
    cfg = load_config(toml, TINY + list(extra))
    store = RunStore.create(run_id, cfg.to_dict(), root=tmp_path / "runs", exist_ok=True)
    return Trainer(cfg, store, resume=resume, log=lambda m: None), store


def _sampled_by_kind(store, task):
    fixed = {r["prompt_id"] for r in task.rows if r["fixed"]}
    ids = store.groups()["prompt_id"]
    return int(ids.isin(fixed).sum()), int((~ids.isin(fixed)).sum())


def test_a_real_run_skips_zero_variance_prompts_over_several_epochs(tmp_path):
    off, st_off = _jsonl_trainer(tmp_path / "off", ["grpo.steps=30"])
    off.run()
    on, st_on = _jsonl_trainer(tmp_path / "on", ["grpo.steps=30", "grpo.skip_zero_variance=true"])
    on.run()
    assert SKIPPED_PROMPTS not in st_off.scalars_wide().columns  # off: nothing new logged
    fixed_off, coin_off = _sampled_by_kind(st_off, off.task)
    assert fixed_off == coin_off == 30  # 60 groups = 10 epochs of the 6 rows, each row once per epoch
    w = st_on.scalars_wide()
    skipped = w[SKIPPED_PROMPTS]
    assert skipped.sum() > 10 and (skipped >= 0).all()
    np.testing.assert_array_equal(w[CUM_SKIPPED_PROMPTS].to_numpy(), np.cumsum(skipped.to_numpy()))
    fixed_on, coin_on = _sampled_by_kind(st_on, on.task)
    assert fixed_on + coin_on == 60  # every step still samples prompts_per_step groups
    assert fixed_on < coin_on / 2  # the always-zero-variance rows are drawn far less often
    assert all(on.skipper.streaks.get(r["prompt_id"], 0) >= 1 for r in on.task.rows if r["fixed"])


def test_never_skipping_draws_the_same_stream_as_off(tmp_path):
    """Drawn one at a time and never skipped (explore 1): the same prompts and samples as off."""
    off, st_off = _jsonl_trainer(tmp_path / "off", ["grpo.steps=6"])
    off.run()
    on, st_on = _jsonl_trainer(tmp_path / "on", ["grpo.steps=6", "grpo.skip_zero_variance=true",
                                                 "grpo.skip_explore=1.0", "grpo.skip_min_explore=1.0"])
    on.run()
    assert st_on.rollouts()["completion"].tolist() == st_off.rollouts()["completion"].tolist()
    assert st_on.scalars_wide()[SKIPPED_PROMPTS].sum() == 0


def test_resume_reproduces_the_uninterrupted_skipping_run(tmp_path):
    on = ["grpo.skip_zero_variance=true"]
    straight, st_a = _jsonl_trainer(tmp_path / "a", on + ["grpo.steps=12"])
    straight.run()
    part, st_b = _jsonl_trainer(tmp_path / "b", on + ["grpo.steps=6", "log.checkpoint_every=6"])
    part.run()
    st_b.set_status(RUNNING)
    resumed, _ = _jsonl_trainer(tmp_path / "b", on + ["grpo.steps=12"], resume=True)
    resumed.run()
    wa, wb = st_a.scalars_wide(), st_b.scalars_wide()
    assert wa[SKIPPED_PROMPTS].sum() > 0
    assert st_a.groups()["prompt_id"].tolist() == st_b.groups()["prompt_id"].tolist()
    assert st_a.rollouts()["completion"].tolist() == st_b.rollouts()["completion"].tolist()
    np.testing.assert_array_equal(wa[CUM_SKIPPED_PROMPTS].to_numpy(), wb[CUM_SKIPPED_PROMPTS].to_numpy())
    assert resumed.skipper.streaks == straight.skipper.streaks


def test_the_demo_task_runs_with_skipping_and_logs_the_counts(tmp_path):
    cfg = load_config(None, TINY + ["grpo.steps=4", "grpo.skip_zero_variance=true"])
    store = RunStore.create("d", cfg.to_dict(), root=tmp_path / "runs")
    Trainer(cfg, store, log=lambda m: None).run()
    w = store.scalars_wide()
    assert w.index.tolist() == [1, 2, 3, 4] and (w[SKIPPED_PROMPTS] >= 0).all()
