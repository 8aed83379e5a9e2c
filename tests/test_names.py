"""Newer trainers' names (names.py): ART's PipelineTrainer `discarded/*` and `queue/*`, SkyRL's
`async/*`, prime-rl's solve rates, each read by a real importer from a file written the way the
trainer's logger writes it (a W&B history CSV, ART's history.jsonl, SkyRL's TensorBoard events
through torch's own SummaryWriter). Every expected number is computed here from the source's."""
from __future__ import annotations

import json

import pytest

from grpo_core.integrations.importers import import_path, import_run
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

# Three steps of ART's PipelineTrainer as its history rows have them (art/pipeline_trainer/trainer.py):
# data/* counts cover the batch trained on; discarded/* the groups dropped before it.
ART_PIPELINE = [
    {"batch": 8, "trainable": 8, "zero_variance": 4, "stale": 0, "reward": 0.41},
    {"batch": 8, "trainable": 7, "zero_variance": 1, "stale": 2, "reward": 0.52},
    {"batch": 6, "trainable": 6, "zero_variance": 6, "stale": 1, "reward": 0.47},
]


@pytest.fixture(autouse=True)
def runs(tmp_path, monkeypatch):
    for var in ("GRPO_RUNS_DIR", "GRPO_HEALTH_RUNS_DIR"):  # the old name and the new: whichever the tree reads
        monkeypatch.setenv(var, str(tmp_path / "runs"))
    return tmp_path / "runs"


def _read(runs, rid):
    with RunStore.open(runs / rid, readonly=True) as s:
        return s.scalars_wide(), s.get_meta()


def _art_pipeline_rows() -> list[dict]:
    """The rows, with the cumulative counts and rates ART's pipeline logs beside them."""
    out, cum = [], {"batch": 0, "trainable": 0, "zero_variance": 0, "stale": 0}
    for step, s in enumerate(ART_PIPELINE, 1):
        cum = {k: cum[k] + s[k] for k in cum}
        generated = cum["batch"] + cum["zero_variance"] + cum["stale"]
        out.append({
            "step": step, "train/reward": s["reward"],
            "data/step_num_groups_submitted": s["batch"], "data/step_num_groups_trainable": s["trainable"],
            "data/cum/num_groups_submitted": cum["batch"], "data/cum/num_groups_trainable": cum["trainable"],
            "discarded/step/zero_variance_groups": s["zero_variance"], "discarded/step/stale_groups": s["stale"],
            "discarded/cum/zero_variance_groups": cum["zero_variance"], "discarded/cum/stale_groups": cum["stale"],
            "discarded/rate/zero_variance_groups": cum["zero_variance"] / generated,
            "queue/put_wait_s": 0.25 * step,
            "queue/actual_stale_fraction": s["stale"] / (s["batch"] + s["zero_variance"] + s["stale"]),
        })
    return out


def _check_art_pipeline(wide, keep: str):
    """Submitted = the batch + the zero-variance groups dropped before it; stale groups apart."""
    cum_sub = cum_tr = 0
    for step, s in enumerate(ART_PIPELINE, 1):
        submitted = s["batch"] + s["zero_variance"]
        cum_sub, cum_tr = cum_sub + submitted, cum_tr + s["trainable"]
        assert wide.loc[step, names.GROUPS_SUBMITTED] == submitted
        assert wide.loc[step, names.TRAINABLE_RATIO] == pytest.approx(s["trainable"] / submitted)
        assert wide.loc[step, names.FRAC_REWARD_ZERO_STD] == pytest.approx(1 - s["trainable"] / submitted)
        assert wide.loc[step, names.CUM_GROUPS_SUBMITTED] == cum_sub
        assert wide.loc[step, names.CUM_TRAINABLE_RATIO] == pytest.approx(cum_tr / cum_sub)
        assert wide.loc[step, names.GROUPS_FILTERED] == s["zero_variance"]
        assert wide.loc[step, names.GROUPS_STALE] == s["stale"]
        assert wide.loc[step, f"{keep}/queue/put_wait_s"] == 0.25 * step  # plumbing: kept, under ART's name
    assert f"{keep}/discarded/rate/zero_variance_groups" in wide
    # Without the dropped groups the ratio would read 1.0 at step 1 (8 of 8): the pipeline's filter hides it.
    assert wide.loc[1, names.TRAINABLE_RATIO] < 1


def test_art_pipeline_trainer_in_a_wandb_history_csv(runs):
    rows = _art_pipeline_rows()
    keys = [k for k in rows[0] if k != "step"]
    csv = "_step," + ",".join(keys) + "\n" + "".join(
        f"{r['step']}," + ",".join(repr(float(r[k])) for k in keys) + "\n" for r in rows)
    wide, meta = _read(runs, import_run("csv", csv.encode(), "history.csv"))
    _check_art_pipeline(wide, "wandb")
    assert meta["config"]["wandb"]["style"] == "art"
    assert any("PipelineTrainer dropped zero-variance groups" in n for n in meta["import_report"]["notes"])


def test_art_pipeline_trainer_history_jsonl(runs, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({**r, "training_step": r["step"], "recorded_at": "2026-01-01T00:00:00"})
                            + "\n" for r in _art_pipeline_rows()))
    wide, _ = _read(runs, import_path("art", path))
    _check_art_pipeline(wide, "art")


def test_skyrl_async_names_from_its_tensorboard_writer(runs, tmp_path):
    """SkyRL's tensorboard backend is torch's SummaryWriter, one add_scalar per key (tracking.py)."""
    from torch.utils.tensorboard import SummaryWriter
    steps = {1: (16, 3), 2: (16, 0), 3: (16, 9)}  # step: (mini_batch_size groups kept, groups dropped)
    writer = SummaryWriter(str(tmp_path / "tensorboard_log"))
    for step, (kept, dropped) in steps.items():
        metrics = {"async/num_groups_dropped": dropped, "async/keep_rate": kept / (kept + dropped),
                   "async/staleness_mean": 0.5, "trainer/global_step": step}
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
    writer.close()
    wide, meta = _read(runs, import_path("tensorboard", tmp_path / "tensorboard_log"))
    for step, (kept, dropped) in steps.items():
        assert wide.loc[step, names.GROUPS_FILTERED] == dropped
        assert wide.loc[step, names.TRAINABLE_RATIO] == pytest.approx(kept / (kept + dropped), abs=1e-6)
    assert "wandb/async/staleness_mean" in wide or "tensorboard/async/staleness_mean" in wide
    assert any("skyrl" in n for n in meta["import_report"]["notes"])


@pytest.mark.parametrize("none_key, all_key", [
    ("reward/solve_none", "reward/solve_all"),  # prime-rl 2025
    ("solve_none/all", "solve_all/all"),  # 2026, to June
    ("train/agg/all/default/solved_none", "train/agg/all/default/solved_all"),  # since: per agent
])
def test_prime_rl_solve_rates_are_shares_and_no_ratio_is_guessed(runs, none_key, all_key):
    rates = {1: (0.25, 0.125), 2: (0.5, 0.0), 3: (0.0, 0.75)}
    csv = f"step,{none_key},{all_key},progress/tokens\n" + "".join(
        f"{s},{n},{a},{1000 * s}\n" for s, (n, a) in rates.items())
    wide, meta = _read(runs, import_run("csv", csv.encode(), "prime.csv"))
    for step, (none, all_) in rates.items():
        assert wide.loc[step, names.SHARE_NONE_SOLVED] == none
        assert wide.loc[step, names.SHARE_ALL_SOLVED] == all_
    # 1 - none - all is the trainable ratio only for 0/1 rewards, which the log does not say: unknown.
    for unknown in (names.TRAINABLE_RATIO, names.FRAC_REWARD_ZERO_STD, names.GROUPS_SUBMITTED):
        assert unknown not in wide
    assert meta["config"]["wandb"]["style"] == "prime-rl"
    assert wide["wandb/progress/tokens"].tolist() == [1000.0, 2000.0, 3000.0]


def test_a_pattern_key_fills_the_same_slot_and_a_longer_key_is_not_listed():
    assert names.foreign_name("trl", "rewards/acc/mean") == names.metric_mean("acc")
    assert names.foreign_name("prime-rl", "train/agg/all/coder/solved_all") == names.SHARE_ALL_SOLVED
    assert names.foreign_name("prime-rl", "train/agg/all/a/b/solved_all") is None
    assert names.foreign_name("prime-rl", "eval/agg/all/coder/solved_all") is None  # eval: not the training step
    assert names.foreign_name("skyrl", "async/keep_rate") == names.TRAINABLE_RATIO


def test_art_pipeline_dir_with_its_trajectory_files(runs, tmp_path):
    """The trajectory files hold the batch trained on; history's submitted count (with the dropped
    groups added) is kept, and the batch it was trained on is no contradiction to report."""
    root = tmp_path / "models" / "pipeline"
    (root / "trajectories" / "train").mkdir(parents=True)
    batch = [[0.0, 1.0], [0.5, 1.0]]  # the two groups trained on: both with signal
    (root / "trajectories" / "train" / "0001.jsonl").write_text("".join(
        json.dumps({"trajectories": [{"reward": r, "metrics": {}, "messages_and_choices": []} for r in g]}) + "\n"
        for g in batch))
    (root / "history.jsonl").write_text(json.dumps({
        "step": 1, "train/reward": 0.625, "data/step_num_groups_submitted": 2, "data/step_num_groups_trainable": 2,
        "discarded/step/zero_variance_groups": 3, "discarded/cum/zero_variance_groups": 3}) + "\n")
    wide, meta = _read(runs, import_path("art", root))
    assert wide.loc[1, names.GROUPS_SUBMITTED] == 2 + 3
    assert wide.loc[1, names.TRAINABLE_RATIO] == pytest.approx(2 / 5)
    assert not [n for n in meta["import_report"]["notes"] if "history.jsonl says" in n]


def test_skyrl_async_names_from_a_real_wandb_run_file(runs, tmp_path):
    """SkyRL's wandb backend: wandb.init, then wandb.log(metrics, step=global_step) per step."""
    import time

    import wandb

    from grpo_core.integrations.wandb_file import wandb_file_finished
    steps = {1: (8, 8), 2: (8, 2)}  # step: (groups kept, groups dropped)
    run = wandb.init(project="skyrl", dir=str(tmp_path), mode="offline", reinit="create_new",
                     settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
    sync_file = run.settings.sync_file
    for step, (kept, dropped) in steps.items():
        run.log({"async/num_groups_dropped": dropped, "async/keep_rate": kept / (kept + dropped),
                 "trainer/global_step": step}, step=step)
    run.finish()
    deadline = time.monotonic() + 30
    while not wandb_file_finished(sync_file) and time.monotonic() < deadline:  # wandb-core writes it after finish
        time.sleep(0.05)
    wide, meta = _read(runs, import_path("wandb", next(tmp_path.glob("wandb/offline-run-*"))))
    assert wide[names.GROUPS_FILTERED].to_dict() == {s: float(d) for s, (_, d) in steps.items()}
    assert wide[names.TRAINABLE_RATIO].to_dict() == {s: k / (k + d) for s, (k, d) in steps.items()}
    assert meta["config"]["wandb"]["style"] == "skyrl"
