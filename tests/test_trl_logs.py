"""TRL's other outputs, made by a real TRL GRPOTrainer (CPU, the built-in tiny model, no
callback of ours): its terminal transcript (stdout + stderr as `python train.py 2>&1 | tee`
would keep them), its trainer_state.json, its log_history as a bare list, its
log_completions parquet files and its TensorBoard event files (report_to="tensorboard").
Each imports with the ratio equal to 1 - frac_reward_zero_std wherever the source logs it."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.integrations.importers import import_path, import_run
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

pytest.importorskip("trl")
pytest.importorskip("tensorboard")
pytestmark = pytest.mark.slow

STEPS = 5


@pytest.fixture(scope="module")
def trl_out(tmp_path_factory):
    """One real TRL run: 5 steps, logging every step, log_completions, TensorBoard."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    sys.path.insert(0, str(Path(__file__).parent))
    from test_trl_integration import build_tiny_model
    tmp = tmp_path_factory.mktemp("trl-logs")
    model = build_tiny_model(tmp / "model")

    def has_e(completions, **kw):  # binary: often the same for a whole group
        return [float("e" in c) for c in completions]

    def length(completions, **kw):  # mostly at the length cap: many uniform groups
        return [min(len(c), 4) / 4 for c in completions]

    ds = Dataset.from_list([{"prompt": f"q{i}:"} for i in range(64)])
    args = GRPOConfig(output_dir=str(tmp / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=STEPS, logging_steps=1, report_to="tensorboard",
                      use_cpu=True, save_strategy="no", seed=0, learning_rate=1e-3, log_completions=True,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(model), reward_funcs=[has_e, length], args=args, train_dataset=ds,
                          processing_class=AutoTokenizer.from_pretrained(model))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        trainer.train()
    (tmp / "train.log").write_text(buf.getvalue())
    trainer.state.save_to_json(str(tmp / "trainer_state.json"))
    (tmp / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    sys.path.remove(str(Path(__file__).parent))
    hist = {e["step"]: e for e in trainer.state.log_history if "frac_reward_zero_std" in e}
    return {"tmp": tmp, "out": tmp / "out", "hist": hist, "text": buf.getvalue()}


@pytest.fixture(autouse=True)
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def _load(runs, rid):
    with RunStore.open(runs / rid, readonly=True) as s:
        return s.scalars_wide(), s.get_meta(), s.groups(), s.rollouts()


def _check_ratio(wide, hist, exact=True):
    assert wide.index.tolist() == sorted(hist)
    for step, e in hist.items():
        want = 1 - e["frac_reward_zero_std"]
        got = wide.loc[step, names.TRAINABLE_RATIO]
        assert got == want if exact else got == pytest.approx(want, abs=1e-6), step


def test_the_run_has_uniform_groups(trl_out):
    fr = [e["frac_reward_zero_std"] for e in trl_out["hist"].values()]
    assert len(fr) == STEPS and max(fr) > 0  # the ratio check below is not all 1s


def test_transcript_imports_with_steps_and_ratio(trl_out, runs):
    text = trl_out["text"]
    assert "{'loss': " in text and "'frac_reward_zero_std': '" in text  # transformers prints '{v:.4g}' strings
    rid = import_path("trl-log", trl_out["tmp"] / "train.log")
    wide, meta, groups, _ = _load(runs, rid)
    printed = {s: {**e, "frac_reward_zero_std": float(f"{e['frac_reward_zero_std']:.4g}")}
               for s, e in trl_out["hist"].items()}
    _check_ratio(wide, printed)  # 1 - the printed value, at the step TRL logged it
    rep = meta["import_report"]
    assert rep["steps"] == STEPS and meta["summary"]["train_runtime"] > 0 and meta["status"] == "finished"
    assert any("'Step N' panels" in n for n in rep["notes"]) and groups.empty
    assert wide.loc[2, names.REWARD] == pytest.approx(trl_out["hist"][2]["reward"], rel=1e-3)


def test_transcript_without_panels_infers_steps_from_logging_steps(trl_out, runs):
    """PrinterCallback-style output: the dicts alone, no step anywhere; logging_steps given."""
    lines = [ln for ln in trl_out["text"].splitlines() if ln.startswith("{'")]
    rid = import_run("trl-log", "\n".join(lines).encode(), "plain.log", logging_steps=5)
    wide, meta, _, _ = _load(runs, rid)
    assert wide.index.tolist() == [5 * k for k in range(1, STEPS + 1)]
    assert any("entry k is step k x logging_steps, logging_steps = 5 given" in n
               for n in meta["import_report"]["notes"])


def test_transcript_steps_from_a_real_tqdm_bar(trl_out, runs):
    """A terminal's bar (tqdm's own output) between the dicts: logging_steps and max_steps
    inferred from it; a run cut at step 3 of 8 reads incomplete."""
    from tqdm import tqdm
    dicts = [ln for ln in trl_out["text"].splitlines() if ln.startswith("{'loss'")][:3]
    out = io.StringIO()
    bar = tqdm(total=8, file=out, mininterval=0, ascii=False)
    for d in dicts:
        bar.update(1)
        bar.refresh()
        out.write("\n" + d + "\n")
    rid = import_run("trl-log", out.getvalue().encode(), "cut.log")
    wide, meta, _, _ = _load(runs, rid)
    assert wide.index.tolist() == [1, 2, 3] and meta["status"] == "incomplete"
    assert meta["status_detail"] == "incomplete: step 3 of 8"


def test_trainer_state_and_bare_list_import_exactly(trl_out, runs):
    for f in ("trainer_state.json", "log_history.json"):
        rid = import_path("trl", trl_out["tmp"] / f)
        wide, meta, _, _ = _load(runs, rid)
        _check_ratio(wide, trl_out["hist"])
        assert meta["status"] == "finished"
    assert any("bare log_history list" in n for n in meta["import_report"]["notes"])


def test_completions_parquet_gives_groups_rollouts_and_the_ratio(trl_out, runs):
    files = sorted((trl_out["out"] / "completions").glob("completions_*.parquet"))
    assert [int(f.stem.split("_")[1]) for f in files] == list(range(1, STEPS + 1))
    rid = import_path("trl-completions", trl_out["out"])  # the output dir: its completions/ folder
    wide, meta, groups, rollouts = _load(runs, rid)
    _check_ratio(wide, trl_out["hist"])  # TRL's rule in TRL's arithmetic, on its own rewards
    assert meta["lacks"] == [] and meta["config"]["reward"]["metrics"] == ["has_e", "length"]
    assert len(groups) == STEPS * 2 and (groups["size"] == 4).all()
    assert len(rollouts) == STEPS * 8 and {"has_e", "length"} <= set(rollouts.columns)
    for step, e in trl_out["hist"].items():
        assert wide.loc[step, names.metric_mean("length")] == pytest.approx(e["rewards/length/mean"])
        assert wide.loc[step, names.REWARD] == pytest.approx(e["reward"])
    one = import_run("trl-completions", files[1].read_bytes(), files[1].name)
    assert _load(runs, one)[0].index.tolist() == [2]


def test_completions_run_works_in_what_if_and_the_inspector(trl_out, runs):
    from grpo_core.analysis import inspector, report, run_data
    rid = import_path("trl-completions", trl_out["out"] / "completions")
    data = run_data.load_run(runs / rid)
    view = inspector.inspect_group(data, 1, 0)
    assert len(view.table) == 4 and data.metrics == ["has_e", "length"]
    rep = report.build_report(runs / rid)
    assert not any("No per-group" in n.text for n in rep.notices)


def test_tensorboard_logdir_imports_with_ratio_and_config(trl_out, runs):
    rid = import_path("tensorboard", trl_out["out"] / "runs")
    wide, meta, _, _ = _load(runs, rid)
    _check_ratio(wide, trl_out["hist"], exact=False)  # TensorBoard stores float32
    f32 = {s: 1 - float(np.float32(e["frac_reward_zero_std"])) for s, e in trl_out["hist"].items()}
    assert wide[names.TRAINABLE_RATIO].to_dict() == f32  # exactly 1 - the value in the file
    assert (wide[names.GROUPS_SUBMITTED] == 2).all()  # groups per step from the args in the file
    assert meta["config"]["grpo"]["steps"] == STEPS and meta["status"] == "finished"
    assert "train_runtime" in meta["summary"] and "trl/train_runtime" not in wide


def test_cli_kinds_and_bad_input(trl_out, runs, capsys, tmp_path):
    assert main(["import", "tensorboard", str(trl_out["out"] / "runs"), "--run-id", "tb"]) == 0
    assert "tb" in capsys.readouterr().out
    assert main(["import", "trl-completions", str(trl_out["out"]), "--group-size", "3"]) == 2
    assert "multiple of group_size 3" in capsys.readouterr().err
    bad = tmp_path / "notes.txt"
    bad.write_text("no dicts here\n")
    assert main(["import", "trl-log", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "notes.txt" in err and "found none" in err and len(err.splitlines()) == 1
    with pytest.raises(ConfigError, match="not a parquet file"):
        import_run("trl-completions", b"PAR1 not really", "x.parquet")
    with pytest.raises(ConfigError, match="option logging_steps does not apply"):
        import_run("trl", b"[]", "x.json", logging_steps=5)


def test_watch_follows_a_trl_output_dir_and_its_tensorboard_logdir(trl_out, runs):
    """`watch trl OUT`: the completions parquet gives groups and rollouts (no checkpoint was
    saved, so no trainer_state yet); `watch tensorboard OUT/runs`: the scalars. Both give
    TRL's ratio at every step."""
    from grpo_core.integrations import follow
    rid = follow.follow("trl", trl_out["out"], run_id="watched", root=runs, max_polls=1, log=lambda m: None)
    wide, meta, groups, rollouts = _load(runs, rid)
    _check_ratio(wide, trl_out["hist"], exact=False)
    assert len(groups) and len(rollouts) and meta["lacks"] == []
    tb = follow.follow("tensorboard", trl_out["out"] / "runs", run_id="tb", root=runs, max_polls=1,
                       log=lambda m: None)
    _check_ratio(_load(runs, tb)[0], trl_out["hist"], exact=False)
