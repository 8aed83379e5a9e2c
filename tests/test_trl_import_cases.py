"""TRL imports that never guess (issue 27): the Map bars, the last logging window, custom
rewards/ keys, unknown vs none in the report, old TRL's reward_std, notebooks, wrong kinds.

The sources are written by the real code that writes them: transformers' ProgressCallback
(the tqdm bar and the printed dicts), TrainerState.save_to_json, datasets' Dataset.map bar,
transformers' NotebookProgressCallback (its HTML, kept as nbformat 4 JSON), TrainOutput,
tensorboard's EventFileWriter, W&B's record format. The log values follow GRPOTrainer.log:
each entry is the mean over the steps since the last one, and with max_steps not a multiple
of logging_steps the last window's means are merged into the run totals."""
from __future__ import annotations

import contextlib
import io
import json
import math
import sys
import time
import types
from pathlib import Path

import pandas as pd
import pytest

from grpo_core.errors import ConfigError
from grpo_core.integrations import kinds
from grpo_core.integrations.importers import import_path, import_run
from grpo_core.runs import names
from grpo_core.runs.store import RunStore

FIXTURE = Path(__file__).parent / "fixtures" / "trl" / "chaos-economy-trainer_state.json"


@pytest.fixture(autouse=True)
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def _load(runs, rid):
    with RunStore.open(runs / rid, readonly=True) as s:
        return s.scalars_wide(), s.get_meta()


# ---- a run as transformers and TRL log it --------------------------------------------------------
def step_metrics(s: int) -> dict:
    """What GRPOTrainer appends to _metrics at step s (one generation batch a step)."""
    return {"reward": 0.1 * s, "reward_std": 0.5, "frac_reward_zero_std": 0.25 if s % 2 else 0.5,
            "rewards/fmt/mean": 0.05 * s, "rewards/fmt/std": 0.2, "completions/mean_length": 10.0 + s,
            "kl": 0.001 * s}


def trl_run(max_steps: int, logging_steps: int, callback=None, metrics=step_metrics, stop_at: int | None = None):
    """Drive a transformers callback through a run as Trainer + GRPOTrainer.log do; returns
    (TrainerState, TrainOutput). Printing callbacks print to the current stdout/stderr.
    stop_at: killed during that step (no totals, no on_train_end)."""
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_utils import IntervalStrategy, TrainOutput
    state = TrainerState(max_steps=max_steps, logging_steps=logging_steps, num_train_epochs=1)
    args, control = types.SimpleNamespace(eval_strategy=IntervalStrategy.NO), TrainerControl()
    pending: dict[str, list] = {}

    def log(logs):  # GRPOTrainer.log: merge the means since the last log, then Trainer.log
        logs.update({k: sum(v) / len(v) for k, v in pending.items()})
        pending.clear()
        state.log_history.append({**logs, "step": state.global_step})
        if callback:
            callback.on_log(args, state, control, logs=dict(logs))

    if callback:
        callback.on_train_begin(args, state, control)
        if getattr(callback, "training_bar", None) is not None:
            callback.training_bar.mininterval = 0  # a GRPO step takes > 0.1 s: the bar shows every step
    for s in range(1, stop_at or max_steps + 1):
        for k, v in metrics(s).items():
            pending.setdefault(k, []).append(v)
        state.global_step, state.epoch = s, s / max_steps
        if callback:
            callback.on_step_end(args, state, control)
        if s % logging_steps == 0:
            log({"loss": 0.01 * s, "grad_norm": 0.3, "learning_rate": 1e-5, "num_tokens": 100.0 * s,
                 "epoch": state.epoch})
    if stop_at:
        return state, None
    totals = {"train_runtime": 12.5, "train_samples_per_second": 3.2, "train_steps_per_second": 0.4,
              "total_flos": 0.0, "train_loss": 0.02, "epoch": 1.0}
    log(totals)
    if callback:
        callback.on_train_end(args, state, control)
    return state, TrainOutput(max_steps, 0.02, totals)


def window_means(lo: int, hi: int) -> dict:
    ms = [step_metrics(s) for s in range(lo, hi + 1)]
    return {k: sum(m[k] for m in ms) / len(ms) for k in ms[0]}


def terminal(max_steps: int, logging_steps: int, map_rows: int = 7000, stop_at: int | None = None) -> str:
    """stdout + stderr of `python train.py 2>&1 | tee train.log`: datasets' Map bar over the
    dataset, then the Trainer's tqdm bar and its printed log dicts."""
    from datasets import Dataset
    from transformers.trainer_callback import ProgressCallback
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        Dataset.from_list([{"q": i} for i in range(map_rows)]).map(lambda r: {"prompt": f"q{r['q']}"})
        trl_run(max_steps, logging_steps, ProgressCallback(), stop_at=stop_at)
    return buf.getvalue()


# ---- 1. the Map bars are not the trainer's ----------------------------------------------------------
def test_map_bars_before_training_do_not_set_the_steps_or_the_total(runs):
    text = terminal(200, 5)
    assert "Map: 100%" in text and "7000/7000" in text and "200/200 [" in text
    rid = import_run("trl-log", text.encode(), "train.log")
    wide, meta = _load(runs, rid)
    assert wide.index.tolist() == list(range(5, 201, 5))  # not 35x: 7000 // 200 entries
    assert meta["config"]["grpo"]["steps"] == 200 and meta["status"] == "finished"
    assert wide.loc[10, names.REWARD] == pytest.approx(window_means(6, 10)["reward"], rel=1e-3)
    notes = meta["import_report"]["notes"]
    assert any("not the trainer's (Map)" in n for n in notes)
    assert any("logging_steps = 5 inferred from the trainer's progress bar (200 steps, 40 entries)" in n
               for n in notes)


def test_entries_that_fit_several_logging_steps_are_refused_not_guessed(runs):
    """A run killed at step 7 of 20 with logging_steps 5: one entry, the bar at 7: the entry
    could be step 4, 5, 6 or 7, so the importer asks rather than picks."""
    cut = terminal(20, 5, map_rows=10, stop_at=8)  # killed during step 8: the bar last showed 7/20
    assert "7/20 [" in cut and "8/20 [" not in cut and cut.count("{'loss'") == 1
    with pytest.raises(ConfigError, match=r"cut.log: cannot tell the steps of the log entries \(1 entries over 7 "
                                          r"trainer steps fit logging_steps 4, 5, 6, 7\); pass logging_steps"):
        import_run("trl-log", cut.encode(), "cut.log")
    wide, meta = _load(runs, import_run("trl-log", cut.encode(), "cut.log", logging_steps=5))
    assert wide.index.tolist() == [5] and meta["status_detail"] == "incomplete: step 7 of 20"


# ---- 2. the last logging window, printed with the run totals ----------------------------------------
def test_last_window_in_trainer_state_is_imported_at_the_last_step(runs, tmp_path):
    state, _ = trl_run(7, 5)
    assert "reward" in state.log_history[-1] and "train_runtime" in state.log_history[-1]  # GRPOTrainer's merge
    state.save_to_json(str(tmp_path / "trainer_state.json"))
    rid = import_path("trl", tmp_path / "trainer_state.json")
    wide, meta = _load(runs, rid)
    assert wide.index.tolist() == [5, 7]
    last = window_means(6, 7)
    assert wide.loc[7, names.REWARD] == pytest.approx(last["reward"])
    assert wide.loc[7, names.TRAINABLE_RATIO] == pytest.approx(1 - last["frac_reward_zero_std"])
    # the cumulative ratio weights the last entry by the 2 steps it covers
    want = (5 * (1 - window_means(1, 5)["frac_reward_zero_std"]) + 2 * (1 - last["frac_reward_zero_std"])) / 7
    assert wide.loc[7, names.CUM_TRAINABLE_RATIO] == pytest.approx(want)
    assert meta["summary"]["train_runtime"] == 12.5 and "reward" not in meta["summary"]
    assert "trl/train_runtime" not in wide and meta["status"] == "finished"
    assert any("last logging window" in n for n in meta["import_report"]["notes"])


def test_last_window_in_a_transcript_is_imported_at_the_bar_s_last_step(runs):
    text = terminal(7, 5, map_rows=50)
    rid = import_run("trl-log", text.encode(), "train.log")
    wide, meta = _load(runs, rid)
    assert wide.index.tolist() == [5, 7]  # 1 entry + a window over 7 steps: 4, 5 or 6; the epochs say 5
    assert any("and the printed epochs" in n for n in meta["import_report"]["notes"])
    assert wide.loc[7, names.REWARD] == pytest.approx(window_means(6, 7)["reward"], rel=1e-3)
    assert meta["summary"]["train_runtime"] == 12.5
    plain = "\n".join(ln for ln in text.splitlines() if ln.startswith("{'"))  # no bar: the window's step unknown
    wide, meta = _load(runs, import_run("trl-log", plain.encode(), "plain.log", logging_steps=5))
    assert wide.index.tolist() == [5]
    assert any("last logging window" in k and "step is unknown" in k for k in meta["import_report"]["skipped"])


# ---- 3. rewards/ keys that are not reward functions -------------------------------------------------
def test_a_custom_rewards_key_is_a_plain_scalar_not_a_reward_function(runs):
    hist = [{**e, "rewards/accuracy_rate": 0.4, "rewards/pnl_reward_fn/max": 1.0}
            for e in json.loads(FIXTURE.read_text())["log_history"][:3]]
    rid = import_run("trl", json.dumps(hist).encode(), "custom.json")
    wide, meta = _load(runs, rid)
    assert meta["config"]["reward"]["metrics"] == ["diversity_reward_fn", "format_reward_fn", "oversight_reward_fn",
                                                   "pnl_reward_fn", "risk_reward_fn"]
    assert wide["trl/rewards/accuracy_rate"].tolist() == [0.4] * 3 and names.metric_mean("accuracy_rate") not in wide
    assert "trl/rewards/pnl_reward_fn/max" in wide
    assert any("rewards/accuracy_rate, rewards/pnl_reward_fn/max: not a reward function's key" in n
               for n in meta["import_report"]["notes"])


def test_the_same_holds_through_wandb_names(runs):
    """A TRL run's W&B history (transformers prefixes train/): the custom rewards/ key stays a
    plain scalar, and old TRL's reward_std is the group reward std, as from trainer_state."""
    new = "_step,train/rewards/fmt/mean,train/rewards/fmt/std,train/rewards/accuracy_rate,train/frac_reward_zero_std\n" \
          "1,0.5,0.1,0.4,0.25\n2,0.6,0.2,0.5,0.5\n"
    wide, meta = _load(runs, import_run("csv", new.encode(), "new.csv"))
    assert wide[names.metric_mean("fmt")].tolist() == [0.5, 0.6] and names.metric_mean("accuracy_rate") not in wide
    assert wide["trl/rewards/accuracy_rate"].tolist() == [0.4, 0.5]
    assert any("rewards/accuracy_rate: not a reward function's key" in n for n in meta["import_report"]["notes"])
    old = "_step," + ",".join(f"train/{k}" for k in OLD_TRL) + "\n" + "\n".join(
        f"{s}," + ",".join(str(v) for v in OLD_TRL.values()) for s in (1, 2, 3)) + "\n"
    wide, meta = _load(runs, import_run("csv", old.encode(), "old.csv"))
    assert wide[names.REWARD_STD].tolist() == [0.4] * 3 and names.TRL_REWARD_STD not in wide
    assert wide[names.metric_mean("correctness")].tolist() == [0.5] * 3  # 0.14-0.16's rewards/<fn>
    assert any("TRL 0.14-0.16's" in n for n in meta["import_report"]["notes"])


# ---- 4. unknown is not none ---------------------------------------------------------------------------
def test_report_says_unknown_where_the_source_logged_no_ratio(runs):
    from grpo_core.analysis import report
    hist = [{"loss": 0.1, "reward": 0.5, "learning_rate": 1e-5, "step": s} for s in range(1, 6)]
    rid = import_run("trl", json.dumps(hist).encode(), "noratio.json")
    rep = report.build_report(runs / rid)
    rows = {k: v for k, _, v in report.summary_rows(rep)}
    assert rows["zero_trainable_steps"].startswith("unknown (the source did not log a trainable ratio")
    assert rows["ratio"].startswith("unknown") and rows["submitted"].startswith("unknown")
    assert rows["phantom"] == "unknown (the source did not log per-group data)"
    md = report.to_markdown(rep)
    assert "| steps with zero trainable groups | unknown" in md and "| none |" not in md
    assert "whether any were made is unknown" in md and "No applied changes." not in md
    rid = import_path("trl", FIXTURE)  # a ratio logged, never 0: none is the truth
    rows = {k: v for k, _, v in report.summary_rows(report.build_report(runs / rid))}
    assert rows["zero_trainable_steps"] == "none"
    assert rows["submitted"].startswith("unknown (the source did not log group counts, only a ratio")
    hist = [{"loss": 0.1, "frac_reward_zero_std": 0.5, "step": s} for s in range(1, 6)]
    rows = {k: v for k, _, v in report.summary_rows(report.build_report(
        runs / import_run("trl", json.dumps(hist).encode(), "noreward.json")))}
    assert rows["reward_final"] == rows["trend_run"] == "unknown (the source did not log a reward)"


# ---- 5. old TRL's reward_std is the group reward std ------------------------------------------------
OLD_TRL = {"loss": 0.0, "rewards/correctness": 0.5, "rewards/format": 0.25, "reward": 0.75, "reward_std": 0.4,
           "completion_length": 120.0, "kl": 0.0005, "learning_rate": 1e-6}  # TRL 0.14-0.16's keys


def test_old_trl_reward_std_is_the_group_reward_std(runs):
    from grpo_core.analysis import report
    hist = [{**OLD_TRL, "step": s} for s in range(1, 8)]
    wide, meta = _load(runs, import_run("trl", json.dumps(hist).encode(), "old.json"))
    assert wide[names.REWARD_STD].tolist() == [0.4] * 7 and names.TRL_REWARD_STD not in wide
    assert any("TRL 0.14-0.16's" in n and "Bessel-corrected" in n for n in meta["import_report"]["notes"])
    rep = report.build_report(meta["run_dir"] if "run_dir" in meta else runs / meta["run_id"])
    check = next(c for c in rep.verdict.checks if c.name == "reward_std")
    assert check.value == pytest.approx(0.4) and "no group reward std" not in check.text
    wide, _ = _load(runs, import_run("trl", json.dumps(hist).encode(), "old4.json", group_size=4))
    assert wide[names.REWARD_STD].iloc[0] == pytest.approx(0.4 * math.sqrt(3 / 4))  # our population std
    v017 = [{"reward": 0.5, "reward_std": 0.3, "rewards/acc/mean": 0.5, "rewards/acc/std": 0.5,
             "completions/mean_length": 9.0, "step": s} for s in (1, 2)]  # TRL 0.17: no frac_reward_zero_std yet
    assert _load(runs, import_run("trl", json.dumps(v017).encode(), "v017.json"))[0][names.REWARD_STD].tolist() == [0.3] * 2
    new = [{**e, "frac_reward_zero_std": 0.0} for e in v017]  # 0.18+: which TRL is unknown: not mapped
    wide, meta = _load(runs, import_run("trl", json.dumps(new).encode(), "new.json"))
    assert names.REWARD_STD not in wide and wide[names.TRL_REWARD_STD].tolist() == [0.3] * 2


# ---- 6. notebooks -------------------------------------------------------------------------------------
class _Display:
    """IPython.display as a notebook front end keeps it: the latest HTML per display id."""

    def __init__(self):
        self.shown: list[list[str]] = []

    def module(self):
        mod = types.ModuleType("IPython.display")
        mod.HTML = lambda html: html
        shown = self.shown

        class Handle:
            def __init__(self, slot):
                self.slot = slot

            def update(self, html):
                shown[self.slot][0] = html

        def display(html, display_id=False):
            shown.append([html])
            return Handle(len(shown) - 1)

        mod.display = display
        return mod


def _notebook_html(monkeypatch, max_steps, logging_steps, unsloth: bool) -> tuple[str, object]:
    display = _Display()
    ipython = types.ModuleType("IPython")
    ipython.display = display.module()
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython.display)
    monkeypatch.delitem(sys.modules, "transformers.utils.notebook", raising=False)
    from transformers.utils.notebook import NotebookProgressCallback
    cb = NotebookProgressCallback()
    if unsloth:  # unsloth_zoo's PatchRLStatistics: TRL's metrics as columns, '/' as ' / ', no frac_reward_zero_std
        def on_log(args, state, control, logs=None, **kw):
            if "loss" in logs:
                values = {"Training Loss": logs["loss"]}
                values.update({k.replace("/", " / "): v for k, v in logs.items()
                               if k not in ("loss", "epoch", "frac_reward_zero_std", "num_tokens")})
                values["Step"] = state.global_step
                cb.training_tracker.write_line(values)
        cb.on_log = on_log
    _, out = trl_run(max_steps, logging_steps, cb)
    return display.shown[-1][0], out


def notebook_json(cells: list[list[dict]]) -> bytes:
    """nbformat 4: code cells with their outputs (multiline strings as lists of lines)."""
    lines = lambda s: s.splitlines(keepends=True)  # noqa: E731
    nb_cells = []
    for n, outs in enumerate(cells, 1):
        for o in outs:
            for k in ("text",):
                if k in o:
                    o[k] = lines(o[k])
            for mime, v in (o.get("data") or {}).items():
                o["data"][mime] = lines(v)
        nb_cells.append({"cell_type": "code", "execution_count": n, "id": f"c{n}", "metadata": {},
                         "outputs": outs, "source": ["trainer.train()"]})
    nb = {"cells": nb_cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1).encode()


def test_an_unsloth_notebook_table_imports_with_the_last_window(runs, monkeypatch):
    html, out = _notebook_html(monkeypatch, 12, 5, unsloth=True)
    assert "<th>rewards / fmt / mean</th>" in html and "<progress value='12' max='12'" in html
    nb = notebook_json([
        [{"output_type": "stream", "name": "stderr", "text": "Map: 100%|##########| 7000/7000 [00:00<00:00, "
                                                                "72225.39 examples/s]\n"}],
        [{"output_type": "display_data", "metadata": {},
          "data": {"text/html": html, "text/plain": "<IPython.core.display.HTML object>"}},
         {"output_type": "execute_result", "execution_count": 2, "metadata": {}, "data": {"text/plain": repr(out)}}],
    ])
    rid = import_run("trl-log", nb, "grpo.ipynb")
    wide, meta = _load(runs, rid)
    assert wide.index.tolist() == [5, 10, 12]
    for step, (lo, hi) in {5: (1, 5), 10: (6, 10), 12: (11, 12)}.items():
        m = window_means(lo, hi)
        assert wide.loc[step, names.REWARD] == pytest.approx(m["reward"], abs=1e-6)  # 6 decimals in the table
        assert wide.loc[step, names.metric_mean("fmt")] == pytest.approx(m["rewards/fmt/mean"], abs=1e-6)
    assert wide.loc[10, "trl/loss"] == pytest.approx(0.1)
    # Unsloth's table leaves frac_reward_zero_std out: no ratio but at the last window (TrainOutput's metrics)
    assert wide[names.TRAINABLE_RATIO].isna().tolist() == [True, True, False]
    assert wide.loc[12, names.TRAINABLE_RATIO] == pytest.approx(1 - window_means(11, 12)["frac_reward_zero_std"])
    assert meta["config"]["grpo"]["steps"] == 12 and meta["status"] == "finished" and rid == "trl-log-grpo"
    assert meta["summary"]["train_runtime"] == 12.5
    notes = meta["import_report"]["notes"]
    assert any("no frac_reward_zero_std column" in n for n in notes)
    assert any("last logging window" in n for n in notes)


def test_a_plain_transformers_notebook_and_one_that_ran_a_script(runs, monkeypatch):
    html, _ = _notebook_html(monkeypatch, 6, 2, unsloth=False)
    interrupted = notebook_json([[{"output_type": "display_data", "metadata": {}, "data": {"text/html": html}},
                                  {"output_type": "error", "ename": "KeyboardInterrupt", "evalue": "",
                                   "traceback": []}]])
    wide, meta = _load(runs, import_run("trl-log", interrupted, "plain.ipynb"))
    assert wide["trl/loss"].to_dict() == {2: 0.02, 4: 0.04, 6: 0.06} and names.REWARD not in wide
    assert any("KeyboardInterrupt" in n for n in meta["import_report"]["notes"])
    script = notebook_json([[{"output_type": "stream", "name": "stdout", "text": terminal(10, 5, map_rows=20)}]])
    wide, meta = _load(runs, import_run("trl-log", script, "script.ipynb"))
    assert wide.index.tolist() == [5, 10] and names.TRAINABLE_RATIO in wide
    empty = notebook_json([[{"output_type": "stream", "name": "stdout", "text": "hello\n"}]])
    with pytest.raises(ConfigError, match="empty.ipynb: expected a notebook whose outputs have a training table"):
        import_run("trl-log", empty, "empty.ipynb")
    assert "notebook" in kinds.file_kinds()["trl-log"]


# ---- 7. a file given as the wrong kind names the right one ---------------------------------------
def _sources(tmp: Path) -> dict[str, tuple[str, Path]]:
    """name -> (the kind that reads it, the file), one of each kind's files."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from tests.test_importers import history_record, wandb_log
    out = {}

    def put(name, kind, data):
        p = tmp / name
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = (kind, p)

    put("trainer_state.json", "trl", FIXTURE.read_bytes())
    put("log_history.json", "trl", json.dumps(json.loads(FIXTURE.read_text())["log_history"]))
    put("train.log", "trl-log", terminal(10, 5, map_rows=20))
    put("run.ipynb", "trl-log", notebook_json([[{"output_type": "stream", "name": "stdout",
                                                 "text": terminal(10, 5, map_rows=20)}]]))
    buf = io.BytesIO()
    pd.DataFrame({"step": [1, 1], "prompt": ["p", "p"], "completion": ["a", "b"], "acc": [0.0, 1.0],
                  "advantage": [-0.7, 0.7]}).to_parquet(buf)
    put("completions_00001.parquet", "trl-completions", buf.getvalue())
    put("run-abc.wandb", "wandb", wandb_log([history_record(1, {"train/reward": 0.5})]))
    put("export.csv", "csv", "Step,my-run - train/reward\n1,0.5\n2,0.6\n")
    w = EventFileWriter(str(tmp / "tb"))
    w.add_event(event_pb2.Event(wall_time=time.time(), step=1, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="train/reward", simple_value=0.5)])))
    w.close()
    out["events"] = ("tensorboard", next((tmp / "tb").glob("events.out.tfevents.*")))
    put("history.jsonl", "art", "\n".join(json.dumps({"step": s, "training_step": s, "recorded_at": "2025-01-01",
                                                      "train/reward": 0.5}) for s in (1, 2)))
    put("verl.jsonl", "verl", "\n".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.5}}) for s in (1, 2)))
    put("verl-console.log", "verl", "step:1 - critic/score/mean:0.5 - actor/lr:1e-06\n")
    return out


def test_each_kind_s_file_given_as_each_other_kind_names_the_right_kind(runs, tmp_path):
    sources = _sources(tmp_path)
    for name, (kind, path) in sources.items():
        assert (kinds.sniff(path.read_bytes()) or (None,))[0] == kind, name
        for other in kinds.KINDS:
            if other == kind:
                continue
            with pytest.raises(ConfigError) as e:
                kinds.read(other, path)
            msg = str(e.value)
            assert f"use `import {kind}`" in msg and str(path) in msg and "\n" not in msg, (name, other, msg)
    assert import_path("trl", sources["trainer_state.json"][1]) and import_path("csv", sources["export.csv"][1])
    with pytest.raises(ConfigError, match=r"this is a TRL trainer_state.json: use `import trl` \(import tensorboard"):
        import_path("tensorboard", sources["trainer_state.json"][1])


def test_a_folder_of_another_kind_is_named_on_the_error_path(runs, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "trainer_state.json").write_bytes(FIXTURE.read_bytes())
    with pytest.raises(ConfigError, match=r"this is a TRL output dir: use `import trl`"):
        import_path("tensorboard", tmp_path / "out")


def test_watch_names_the_right_kind_too_and_creates_no_run(runs, tmp_path):
    from grpo_core.integrations.follow import follow
    sources = _sources(tmp_path)
    for name, (kind, path) in sources.items():
        use = "watch" if kind in kinds.watch_kinds() else "import"
        for other in kinds.watch_kinds():
            if other == kind:
                continue
            with pytest.raises(ConfigError) as e:
                follow(other, path, root=runs, every_s=0.01, max_polls=1)
            msg = str(e.value)
            assert f"use `{use} {kind}`" in msg and f"(watch {other} reads" in msg and "\n" not in msg, (name, other, msg)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "trainer_state.json").write_bytes(FIXTURE.read_bytes())
    with pytest.raises(ConfigError, match=r"this is a TRL output dir: use `watch trl`"):
        follow("verl", tmp_path / "out", root=runs, every_s=0.01, max_polls=1)
    assert not runs.exists() or not any(runs.iterdir())  # nothing half-created


def test_a_source_with_no_end_record_is_never_finished(runs, tmp_path):
    """Finished only on an end record (TRL's run totals, or its trainer state at max_steps);
    a log that simply stops is 'stopped at step N', whether it finished unknown."""
    from grpo_core.runs.run_meta import FINISHED

    def status(rid):
        meta = _load(runs, rid)[1]
        return meta["status"], meta.get("status_detail")

    hist = json.loads(FIXTURE.read_text())["log_history"]
    bare = import_run("trl", json.dumps(hist[:5]).encode(), "bare.json")  # no max_steps, no totals
    assert status(bare) == ("unknown", "stopped at step 25: the source records no end, so whether the run "
                                       "finished is unknown")
    assert status(import_path("trl", FIXTURE))[0] == FINISHED  # its trainer state: global_step = max_steps
    tb = _sources(tmp_path)["events"][1]  # an event file: no end record, no max_steps
    assert status(import_path("tensorboard", tb))[0] == "unknown"
