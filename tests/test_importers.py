"""Importers: TRL trainer_state.json (the real public fixture), W&B CSV exports, W&B run
files, bad input. Real files in, real run stores out; every number checked against the
source file, and everything not imported is in the report."""
from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from grpo_core.__main__ import main
from grpo_core.errors import ConfigError
from grpo_core.integrations.importers import import_path, import_run
from grpo_core.integrations.kinds import parse
from grpo_core.runs import names
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore

# A real TRL run's state, copied unchanged from shared/fixtures (see tests/fixtures/README.md).
FIXTURE = Path(__file__).parent / "fixtures" / "trl" / "chaos-economy-trainer_state.json"
FNS = ["diversity_reward_fn", "format_reward_fn", "oversight_reward_fn", "pnl_reward_fn", "risk_reward_fn"]


@pytest.fixture(autouse=True)
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def _open(runs, rid):
    return RunStore.open(runs / rid, readonly=True)


def _history():
    return json.loads(FIXTURE.read_text())["log_history"]


# ---- TRL: the real fixture -----------------------------------------------------------------------
def test_trl_fixture_every_step_and_ratio(runs):
    rid = import_path("trl", FIXTURE)
    hist = _history()
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
        assert s.groups().empty and s.rollouts().empty
    assert wide.index.tolist() == list(range(5, 201, 5)) and len(hist) == 40
    for e in hist:
        row = wide.loc[e["step"]]
        assert row[names.TRAINABLE_RATIO] == pytest.approx(1 - e["frac_reward_zero_std"])
        assert row[names.FRAC_REWARD_ZERO_STD] == e["frac_reward_zero_std"]
        assert row[names.REWARD] == e["reward"]
        assert row[names.TRL_REWARD_STD] == e["reward_std"]  # TRL's batch std: under its own name
        for fn in FNS:
            assert row[names.metric_mean(fn)] == e[f"rewards/{fn}/mean"]
            assert row[names.metric_batch_std(fn)] == e[f"rewards/{fn}/std"]
        assert row[names.GRAD_NORM] == e["grad_norm"] and row[names.LOSS_KL] == e["kl"]
        assert row[names.LEARNING_RATE] == e["learning_rate"]
    assert names.REWARD_STD not in wide and not any(c.endswith("/group_std") for c in wide)
    # equal 5-step intervals: the cumulative ratio is the running mean of the logged ratios
    running = np.cumsum([1 - e["frac_reward_zero_std"] for e in hist]) / np.arange(1, 41)
    np.testing.assert_allclose(wide[names.CUM_TRAINABLE_RATIO].to_numpy(), running)
    assert 0 < wide[names.TRAINABLE_RATIO].min() < 1  # the run has steps with zero-std groups
    assert meta["source"] == "trl" and meta["status"] == "finished" and meta["kind"] == "import"
    assert meta["lacks"] == ["groups", "rollouts"]
    assert meta["config"]["grpo"]["steps"] == 200 and meta["config"]["reward"]["metrics"] == FNS
    rep = meta["import_report"]
    assert rep["entries"] == 40 and rep["steps"] == 40 and rep["skipped"] == {}
    assert any("groups per step unknown" in n for n in rep["notes"])
    assert any("logging_steps = 5" in n for n in rep["notes"])
    # every numeric key of every entry is stored (33 per entry, less `step`), plus 2 derived
    assert rep["values"] == sum(len(e) - 1 for e in hist) - 40 + 40 * 2  # completion_length = mean_length


def test_trl_groups_per_step_gives_counts(runs):
    rid = import_path("trl", FIXTURE, run_id="chaos", groups_per_step=2)
    with _open(runs, rid) as s:
        wide = s.scalars_wide()
    ratio = 1 - np.array([e["frac_reward_zero_std"] for e in _history()])
    assert rid == "chaos"
    assert (wide[names.GROUPS_SUBMITTED] == 10).all()  # each entry covers 5 steps of 2 groups
    np.testing.assert_allclose(wide[names.GROUPS_TRAINABLE], 10 * ratio)
    assert wide[names.CUM_GROUPS_SUBMITTED].iloc[-1] == 400  # 200 steps x 2 groups
    np.testing.assert_allclose(wide[names.CUM_GROUPS_TRAINABLE].iloc[-1], 2 * 5 * ratio.sum())


def test_trl_quirks_are_counted_not_dropped(runs, tmp_path):
    hist = _history()[:6]
    quirky = hist[:3] + [
        {"loss": 0.5, "grad_norm": 0.1, "learning_rate": 1e-5, "epoch": 0.1, "step": 16},  # no reward keys
        {"eval_loss": 0.7, "eval_reward": 0.3, "epoch": hist[2]["epoch"], "step": 15},  # an eval entry
        {"reward": None, "frac_reward_zero_std": 0.25, "step": 17},  # TRL logs null when no value was valid
        {"reward": 1.0},  # no step
        "garbage",
    ] + hist[3:] + [{"train_runtime": 12.5, "train_loss": 0.01, "total_flos": 0.0, "epoch": 1.0, "step": 30}]
    state = {**json.loads(FIXTURE.read_text()), "log_history": quirky}
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps(state))
    rid = import_path("trl", p)
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    rep = meta["import_report"]
    assert rep["entries"] == len(quirky)
    assert rep["skipped"] == {
        "trl key reward: logged as null (TRL logs null when no value was valid)": 1,
        "log entry: no integer 'step'": 1,
        "log entry: not an object (str)": 1,
        "summary entry: run totals (train_runtime, train_loss, ...): kept in meta.summary, not a training step": 1,
    }
    assert meta["summary"] == {"train_runtime": 12.5, "train_loss": 0.01, "total_flos": 0.0, "epoch": 1.0}
    assert wide.loc[15, "trl/eval_reward"] == 0.3 and wide.loc[15, "trl/eval_loss"] == 0.7
    assert wide.loc[16, "trl/loss"] == 0.5 and math.isnan(wide.loc[16, names.TRAINABLE_RATIO])
    assert wide.loc[17, names.TRAINABLE_RATIO] == 0.75 and math.isnan(wide.loc[17, names.REWARD])
    assert any("1 evaluation entries" in n for n in rep["notes"])
    assert any("no reward keys" in n for n in rep["notes"])
    assert "trl/train_runtime" not in wide and "trl/train_loss" not in wide  # the summary is not a step


@pytest.mark.parametrize("kind, content, expect", [
    ("trl", b"Step,train/reward\n1,0.5\n", "this is a CSV exported from W&B: use `import csv`"),
    ("trl", b"Step;train/reward\n1;0.5\n", "expected a TRL trainer_state.json"),
    ("trl", b'{"global_step": 10, "epoch": 1}', "found no log_history"),
    ("trl", b"[1, 2, 3]", "found no log_history"),
    ("trl", b"", "the file is empty"),
    ("wandb", bytes(range(256)) * 8, "expected a W&B run file"),
    ("wandb", b'{"log_history": []}', "this is a TRL trainer_state.json: use `import trl`"),
    ("csv", bytes([0xff, 0xfe, 0x00, 0x81]) * 50, "expected a CSV exported from W&B"),
    ("csv", b"a,b\n1,2\n", "no step column"),
    ("csv", b"Name,State,train/reward\nrun1,finished,0.5\n", "W&B runs table"),
    ("trl", json.dumps({"log_history": [{"loss": 1.0}]}).encode(), "no training steps"),
])
def test_bad_input_is_one_line_naming_the_file(runs, kind, content, expect):
    with pytest.raises(ConfigError) as e:
        import_run(kind, content, f"upload.{kind}")
    msg = str(e.value)
    assert expect in msg and "upload." in msg and "\n" not in msg
    assert list_runs(runs).empty  # nothing half-imported left behind


def test_cli_import_and_bad_file_exit_codes(runs, tmp_path, capsys):
    assert main(["import", "trl", str(FIXTURE), "--run-id", "cli-run"]) == 0
    out = capsys.readouterr().out
    assert "imported" in out and "cli-run" in out and "groups per step unknown" in out
    bad = tmp_path / "export.csv"
    bad.write_text("Step,x\n1,2\n")
    assert main(["import", "trl", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "export.csv" in err and len(err.splitlines()) == 1
    assert main(["import", "trl", str(tmp_path / "missing.json")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert main(["import", "trl", str(FIXTURE), "--run-id", "cli-run"]) == 2  # taken id: refused, not overwritten
    assert list_runs(runs)["run_id"].tolist() == ["cli-run"]


def test_default_run_ids_do_not_collide(runs):
    a, b = import_path("trl", FIXTURE), import_path("trl", FIXTURE)
    assert a == "trl-chaos-economy-trainer_state" and b == a + "-2"


# ---- W&B CSV exports --------------------------------------------------------------------------------
def test_csv_chart_export_trl_names(runs):
    csv = ("Step,myrun - train/reward,myrun - train/reward__MIN,myrun - train/reward__MAX,"
           "myrun - train/frac_reward_zero_std,myrun - train/reward_std,myrun - train/rewards/fmt/mean\n"
           "1,0.5,0.4,0.6,0.25,0.3,1.0\n2,0.7,0.6,0.8,0.5,,0.5\n3,,,,0.0,0.2,\n")
    rid = import_run("csv", csv.encode(), "chart.csv")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide[names.TRAINABLE_RATIO].tolist() == [0.75, 0.5, 1.0]
    assert wide[names.REWARD].tolist()[:2] == [0.5, 0.7] and math.isnan(wide.loc[3, names.REWARD])
    assert wide.loc[1, names.TRL_REWARD_STD] == 0.3 and wide.loc[1, names.metric_mean("fmt")] == 1.0
    assert names.REWARD_STD not in wide
    rep = meta["import_report"]
    assert rep["skipped"] == {"myrun - train/reward__MIN: min/max band of a W&B chart (the value column is "
                              "imported)": 3, "myrun - train/reward__MAX: min/max band of a W&B chart (the value "
                              "column is imported)": 3}
    assert any("3 empty cells" in n for n in rep["notes"]) and meta["config"]["wandb"]["style"] == "trl"


def test_csv_history_art_names(runs):
    csv = ("_step,data/step_num_groups_submitted,data/step_num_groups_trainable,data/cum/num_groups_submitted,"
           "data/cum/num_groups_trainable,train/reward,train/exception_rate,_runtime\n"
           "0,8,6,8,6,0.5,0.0,1.0\n1,8,2,16,8,0.6,0.1,2.0\n")
    rid = import_run("csv", csv.encode(), "history.csv")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide[names.TRAINABLE_RATIO].tolist() == [0.75, 0.25]
    assert wide[names.FRAC_REWARD_ZERO_STD].tolist() == [0.25, 0.75]  # ART's rule: not all equal
    assert wide[names.CUM_TRAINABLE_RATIO].tolist() == [0.75, 0.5]
    assert wide["wandb/train/exception_rate"].tolist() == [0.0, 0.1]
    assert meta["import_report"]["skipped"] == {"_runtime: W&B bookkeeping / step axis": 2}


def test_csv_with_two_runs_is_refused(runs):
    csv = b"Step,a - train/reward,b - train/reward\n1,0.1,0.2\n"
    with pytest.raises(ConfigError, match="holds 2 runs"):
        import_run("csv", csv, "two.csv")


# ---- W&B run file: the reader on crafted files (the real format is tested in test_wandb_mirror) -----
def wandb_log(records: list[bytes]) -> bytes:
    """Write records in W&B's transaction-log format (LevelDB log: 32 KiB blocks)."""
    out = bytearray(struct.pack("<4sHB", b":W&B", 0xBEE1, 0))
    for data in records:
        first = True
        while True:
            room = 32768 - len(out) % 32768
            if room < 7:
                out += b"\0" * room
                continue
            chunk, data = data[:room - 7], data[room - 7:]
            kind = (1 if not data else 2) if first else (4 if not data else 3)
            out += struct.pack("<IHB", zlib.crc32(bytes([kind]) + chunk), len(chunk), kind) + chunk
            first = False
            if not data:
                break
    return bytes(out)


def history_record(step: int, values: dict) -> bytes:
    from wandb.proto import wandb_internal_pb2
    r = wandb_internal_pb2.Record()
    r.history.step.num = step
    for k, v in values.items():
        item = r.history.item.add()
        item.nested_key.append(k)
        item.value_json = json.dumps(v)
    return r.SerializeToString()


def test_wandb_reader_spans_blocks_and_reports_a_torn_tail(runs):
    big = "x" * 70000  # a record across three blocks
    recs = [history_record(s, {"train/reward": s / 10, "health/trainable_ratio": 0.5, "note": big if s == 2 else "",
                                "_step": s}) for s in range(5)]
    data = wandb_log(recs)
    rid = import_run("wandb", data, "run-abc.wandb")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide[names.REWARD].tolist() == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert meta["import_report"]["skipped"]["note: not a scalar (text or list): only scalars are imported"] == 5
    torn = import_run("wandb", data[:-20], "run-torn.wandb")
    with _open(runs, torn) as s:
        rep = s.get_meta()["import_report"]
        assert s.scalars_wide()[names.REWARD].tolist() == [0.0, 0.1, 0.2, 0.3]
    assert rep["skipped"] == {"W&B file tail: torn record (the run was stopped mid-write)": 1,
                              "note: not a scalar (text or list): only scalars are imported": 4,
                              "_step: W&B bookkeeping / step axis": 4}
    damaged = bytearray(data)
    damaged[20] ^= 0xFF  # inside the first record
    with _open(runs, import_run("wandb", bytes(damaged), "run-bad.wandb")) as s:
        assert s.get_meta()["import_report"]["skipped"]["W&B record: checksum mismatch (damaged file)"] == 1
        assert s.scalars_wide().index.tolist() == [1, 2, 3, 4]


def test_parse_reports_every_name_mapping():
    p = parse("trl", FIXTURE.read_bytes(), FIXTURE.name)
    m = p.report.mapped
    assert m["reward_std"] == names.TRL_REWARD_STD and m["rewards/pnl_reward_fn/std"] == "reward/pnl_reward_fn/batch_std"
    assert m["completion_length"] == names.COMPLETION_MEAN_LENGTH and m["loss"] == "trl/loss"


def _run_record(config: dict) -> bytes:
    from wandb.proto import wandb_internal_pb2
    r = wandb_internal_pb2.Record()
    r.run.run_id = "abc"
    for k, v in config.items():
        item = r.run.config.update.add()
        item.key = k
        item.value_json = json.dumps(v)
    return r.SerializeToString()


@pytest.mark.parametrize("scale, ratio", [("group", [0.5, 1.0]), ("batch", None)])
def test_trl_in_wandb_uses_the_run_config(runs, scale, ratio):
    """transformers logs TRL's arguments into the W&B config: they give the groups per step,
    and say when frac_reward_zero_std is not a per-group number (scale_rewards='batch')."""
    cfg = {"num_generations": 4, "generation_batch_size": 16, "gradient_accumulation_steps": 2,
           "steps_per_generation": 2, "num_iterations": 1, "scale_rewards": scale, "max_steps": 2,
           "reward_weights": None, "logging_steps": 1}
    recs = [_run_record(cfg)] + [history_record(s, {"train/global_step": s, "train/reward": 0.5,
                                                      "train/frac_reward_zero_std": f, "train/rewards/fmt/mean": 0.5})
                                 for s, f in ((1, 0.5), (2, 0.0))]
    rid = import_run("wandb", wandb_log(recs), "run-abc.wandb")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert meta["config"]["grpo"]["group_size"] == 4 and meta["config"]["reward"]["weights"] == {"fmt": 1.0}
    if ratio is None:
        assert names.TRAINABLE_RATIO not in wide and names.GROUPS_SUBMITTED not in wide
        assert any("not a per-group measure" in n for n in meta["import_report"]["notes"])
    else:
        assert wide[names.TRAINABLE_RATIO].tolist() == ratio
        assert wide[names.GROUPS_SUBMITTED].tolist() == [4, 4] and wide[names.CUM_GROUPS_TRAINABLE].tolist() == [2, 6]


# ---- older TRL names, bare lists ------------------------------------------------------------------
def test_old_trl_names_are_per_function_metrics(runs, tmp_path):
    """TRL < 0.17 logged rewards/<fn> (no /mean), completion_length and one clip_ratio."""
    hist = [{"loss": 0.1, "rewards/accuracy": 0.25, "rewards/format": 1.0, "reward": 1.25, "reward_std": 0.5,
             "completion_length": 40.0, "clip_ratio": 0.01, "kl": 0.002, "frac_reward_zero_std": 0.5, "step": s}
            for s in (1, 2)]
    rid = import_run("trl", json.dumps(hist).encode(), "old.json")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide[names.metric_mean("accuracy")].tolist() == [0.25, 0.25]
    assert wide[names.COMPLETION_MEAN_LENGTH].tolist() == [40.0, 40.0] and wide[names.CLIP_RATIO].iloc[0] == 0.01
    assert meta["config"]["reward"]["metrics"] == ["accuracy", "format"]
    assert wide[names.TRAINABLE_RATIO].tolist() == [0.5, 0.5] and not any(c.startswith("trl/rewards") for c in wide)


# ---- the report on imported runs (issue 19, item 5) ---------------------------------------------------
def test_fractional_counts_stay_floats_and_match_the_cumulative(runs):
    from grpo_core.analysis import report, run_tables, windows
    rid = import_path("trl", FIXTURE, groups_per_step=2)
    rep = report.build_report(runs / rid)
    with _open(runs, rid) as s:
        wide = s.scalars_wide()
    cum_s, cum_t = wide[names.CUM_GROUPS_SUBMITTED].iloc[-1], wide[names.CUM_GROUPS_TRAINABLE].iloc[-1]
    assert rep.summary["submitted"] == cum_s == 400 and rep.summary["trainable"] == pytest.approx(cum_t)
    ratio, t, s_, k = windows.window_ratio(wide, 20)
    assert k == 4 and s_ == 40 and t == pytest.approx(wide[names.GROUPS_TRAINABLE].iloc[-4:].sum())
    steps = rep.steps.iloc[:2].copy()
    steps[["submitted", "trainable"]] = [[4.0, 2.5], [4.0, 0.25]]
    assert run_tables.trainability(steps)["trainable"] == 2.75  # int(sum) said 2
    two = wide.iloc[:2].assign(**{names.GROUPS_SUBMITTED: [4.0, 4.0], names.GROUPS_TRAINABLE: [2.5, 0.25]})
    assert windows.window_ratio(two, 20)[1:3] == (2.75, 8.0)


def test_windows_are_trainer_steps_with_the_entries_stated(runs):
    from grpo_core.analysis import report
    rid = import_path("trl", FIXTURE)
    rep = report.build_report(runs / rid, window=20)
    hist = _history()
    last4 = np.mean([1 - e["frac_reward_zero_std"] for e in hist[-4:]])  # 20 steps = 4 entries at every 5
    assert rep.steps["ratio_rolling"].iloc[-1] == pytest.approx(last4)
    assert rep.summary["window_entries"] == 4
    ratio_check = next(c for c in rep.verdict.checks if c.name == "trainable_ratio")
    assert "over 20 steps (4 logged entries)" in ratio_check.text
    assert "20 trainer steps (4 logged entries)" in report.to_markdown(rep)


def test_zero_trainable_streak_counts_trainer_steps(runs):
    """3 entries with no trainable group at logging_steps 5 are 15 steps, not 3."""
    from grpo_core.analysis import health
    from grpo_core.runs.config import HealthConfig
    hist = [{"frac_reward_zero_std": 0.5 if s < 30 else 1.0, "reward": 0.1, "step": s} for s in range(5, 45, 5)]
    rid = import_run("trl", json.dumps({"log_history": hist, "logging_steps": 5, "max_steps": 40}).encode(), "z.json")
    with _open(runs, rid) as s:
        wide = s.scalars_wide()
    al = {a.kind: a for a in health.alerts(wide, HealthConfig())}
    assert al["zero_trainable"].message.startswith("15 steps with zero trainable groups")
    cfg = HealthConfig(zero_trainable_steps=16)
    assert "zero_trainable" not in {a.kind for a in health.alerts(wide, cfg)}


def _exit_record(code: int) -> bytes:
    from wandb.proto import wandb_internal_pb2
    r = wandb_internal_pb2.Record()
    r.exit.exit_code = code
    return r.SerializeToString()


def _trl_wandb(steps, max_steps=350, tail=()):
    cfg = {"num_generations": 4, "generation_batch_size": 8, "max_steps": max_steps, "logging_steps": 1}
    recs = [_run_record(cfg)] + [history_record(s, {"train/global_step": s, "train/reward": 0.5,
                                                      "train/frac_reward_zero_std": 0.25}) for s in steps]
    return wandb_log(recs + list(tail))


def test_status_from_the_source(runs):
    from grpo_core.analysis import report
    crashed = import_run("wandb", _trl_wandb(range(1, 201), tail=[_exit_record(255)]), "run-crash.wandb")
    cut = import_run("wandb", _trl_wandb(range(1, 201)), "run-cut.wandb")  # no exit record: stopped partway
    done = import_run("wandb", _trl_wandb(range(1, 11), max_steps=10, tail=[_exit_record(0)]), "run-ok.wandb")
    with _open(runs, crashed) as s:
        m = s.get_meta()
    assert m["status"] == "failed" and "exited with code 255" in m["error"]
    with _open(runs, cut) as s:
        m = s.get_meta()
    assert m["status"] == "incomplete" and m["status_detail"] == "incomplete: step 200 of 350"
    with _open(runs, done) as s:
        assert s.get_meta()["status"] == "finished"
    rep = report.build_report(runs / cut)
    assert "incomplete: step 200 of 350" in report.to_markdown(rep)
    assert any(n.level == "warning" and "incomplete: step 200 of 350" in n.text for n in rep.notices)
    assert any(n.level == "error" for n in report.build_report(runs / crashed).notices)
    partial = json.loads(FIXTURE.read_text())
    partial.update(global_step=100, max_steps=350, log_history=partial["log_history"][:20])
    rid = import_run("trl", json.dumps(partial).encode(), "checkpoint-100/trainer_state.json")
    with _open(runs, rid) as s:
        assert s.get_meta()["status_detail"] == "incomplete: step 100 of 350"


def test_a_row_with_only_a_step_key_is_not_a_step(runs):
    tail = [history_record(201, {"train/global_step": 201, "train/epoch": 1.0}),  # transformers' last row
            history_record(202, {"_step": 202}), _exit_record(0)]
    rid = import_run("wandb", _trl_wandb(range(1, 201), max_steps=200, tail=tail), "run-tail.wandb")
    with _open(runs, rid) as s:
        wide, meta = s.scalars_wide(), s.get_meta()
    assert wide.index.max() == 200 and len(wide) == 200
    assert meta["import_report"]["skipped"]["row: carries only a step key (or the epoch), no values: not a step"] == 2


# ---- docs: the name table is names.py's ---------------------------------------------------------------
def test_the_docs_name_table_is_names_py():
    from grpo_core.integrations.importers import NAMES_BEGIN, NAMES_END, name_table_markdown
    doc = (Path(__file__).parents[1] / "docs" / "integrations.md").read_text()
    assert NAMES_BEGIN in doc and NAMES_END in doc
    table = doc.split(NAMES_BEGIN)[1].split(NAMES_END)[0].strip()
    assert table == name_table_markdown(), (
        "docs/integrations.md's name table differs from names.py: regenerate it with "
        "python -c 'from grpo_core.integrations.importers import name_table_markdown; print(name_table_markdown())'")


def test_the_runs_pages_upload_form_offers_every_file_kind():
    from streamlit.testing.v1 import AppTest

    from grpo_core.integrations.kinds import KINDS, file_kinds
    from tests.helpers_dashboard import REPO
    assert all(KINDS[k].parse is not None for k in file_kinds())  # each is readable from bytes
    at = AppTest.from_file(str(REPO / "pages" / "runs.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="import_kind").options == list(file_kinds().values())
