"""Your own data, the first time (issue 18): the own-data commands of docs/trainer.md run exactly as
printed, and each first-time mistake is one line that names the field and the fix."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grpo_core.__main__ import main
from grpo_core.analysis import autopilot, pilot
from grpo_core.runs.config import from_dict
from grpo_core.runs.run_index import list_runs
from grpo_core.tasks import build_metrics, make_task
from grpo_core.tasks.loading import load_config
from grpo_core.tasks.metrics import KINDS

REPO = Path(__file__).resolve().parents[1]
FAST = ["--set", "model.warm_start_steps=0", "--set", "log.progress=false"]


GUIDE = REPO / "docs" / "trainer.md"  # "Train your own model", linked from the README's main paths


def guide_block(marker: str) -> list[str]:
    """The commands of the fenced bash block that follows `marker` in docs/trainer.md, as printed."""
    text = GUIDE.read_text(encoding="utf-8")
    at = text.index(marker)
    block = re.search(r"```bash\n(.*?)\n\s*```", text[at:], re.S)
    assert block, f"no ```bash block after {marker!r} in {GUIDE.name}"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip()]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- the guide's commands, exactly as printed --------------------------------------------------------
def test_the_guides_own_data_commands_run_as_printed(tmp_path):
    """A fresh folder with the checkout's .venv: the own-prompts block, then the own-metric block,
    each line a real shell command, no PYTHONPATH, no runs dir but the folder's own."""
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GRPO_HEALTH_RUNS_DIR")}
    env["GRPO_HEALTH_TORCH_THREADS"] = "1"
    prompts = guide_block("<!-- own-data commands:")
    metric = guide_block("<!-- own-metric commands:")
    assert any("task.name=jsonl" in c and "task.dataset=prompts.jsonl" in c for c in prompts)
    for command in prompts + metric:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    runs = list_runs(tmp_path / "runs").set_index("run_id")
    assert runs.loc["mine", "status"] == "finished" and runs.loc["mine-short", "status"] == "finished"
    mine = load_config(tmp_path / "runs" / "mine" / "config.toml").reward.weights
    assert mine == {"math_answer": 1.0}  # the rows' own metric, not the demo's five
    short = load_config(tmp_path / "runs" / "mine-short" / "config.toml").reward
    assert short.weights == {"math_answer": 1.0, "short": 1.0} and str(tmp_path) in short.custom_dirs


# ---- item 1: defaults from the rows; weight 0 drops; whole table from the CLI --------------------------
def test_jsonl_defaults_are_the_metrics_its_rows_feed(tmp_path):
    cases = [
        ([{"prompt": "2+3=", "answer": "5"}, {"prompt": "1+1=", "answer": 2}], {"math_answer": 1.0}),
        ([{"prompt": "Q", "answer": "Paris"}], {"answer_f1": 0.4, "exact": 0.3}),
        ([{"prompt": "Q", "answer": "Paris", "source": "S1"}], {"answer_f1": 0.4, "exact": 0.3, "citation": 0.2}),
        ([{"prompt": "Q", "answer": "x #### 42", "max_tokens": 64}], {"math_answer": 1.0, "token_length": 0.1}),
        ([{"prompt": "give JSON", "schema": {"type": "object"}}], {"json_valid": 1.0}),
    ]
    for i, (rows, want) in enumerate(cases):
        data = write_rows(tmp_path / f"d{i}.jsonl", rows)
        cfg = load_config(None, ["task.name=jsonl", f"task.dataset={data}"])
        assert cfg.reward.weights == want, rows
        make_task(cfg)  # and the rows pass their own metrics' checks


def test_the_issue_command_with_citation_zero_now_works(tmp_path):
    """The issue's report: `--set reward.weights.citation=0` gave "field 'source' ... is missing"."""
    data = write_rows(tmp_path / "p.jsonl", [{"prompt": "2+3=", "answer": "5"}])
    cfg = load_config(None, ["task.name=jsonl", f"task.dataset={data}", "reward.weights.citation=0"])
    assert cfg.reward.weights == {"math_answer": 1.0}
    # a demo-style weights table: the metric set to 0 is dropped, with the field it needs
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = {json.dumps(str(data))}\n"
                    "[reward.weights]\nexact = 1.0\nanswer_f1 = 0.5\ncitation = 0\n")
    cfg = load_config(toml)
    assert cfg.reward.weights == {"exact": 1.0, "answer_f1": 0.5}
    make_task(cfg)


def test_weight_zero_keeps_a_metric_another_setting_names(tmp_path):
    cfg = load_config(None, ["reward.weights.exact=0", "reward.outcome_metric=exact"])
    assert cfg.reward.weights["exact"] == 0.0  # the outcome gate reads it
    assert "exact" not in load_config(None, ["reward.weights.exact=0"]).reward.weights


def test_whole_weights_table_from_the_command_line(tmp_path):
    assert load_config(None, ["reward.weights={exact = 1.0, format = 0.5}"]).reward.weights == \
        {"exact": 1.0, "format": 0.5}
    assert load_config(None, ['reward.weights={"exact": 1.0}']).reward.weights == {"exact": 1.0}  # JSON, as sweeps
    # then one entry of it
    assert load_config(None, ["reward.weights={exact = 1.0}", "reward.weights.format=0.2"]).reward.weights == \
        {"exact": 1.0, "format": 0.2}
    # it replaces a file's table too, and a JSONL task's defaults
    data = write_rows(tmp_path / "p.jsonl", [{"prompt": "2+3=", "answer": "5"}])
    cfg = load_config(None, ["task.name=jsonl", f"task.dataset={data}", "reward.weights={token_length = 1.0}"])
    assert cfg.reward.weights == {"token_length": 1.0}


# ---- each first-time error: exit 2 and its one line ------------------------------------------------------
def _cli_error(args: list[str], capsys) -> str:
    assert main(args + FAST) == 2
    return one_line(capsys.readouterr().err)


def test_rows_no_metric_can_feed_list_the_fields_and_the_set(tmp_path, runs_dir, capsys):
    data = write_rows(tmp_path / "q.jsonl", [{"prompt": "hi", "question": "why"}, {"prompt": "yo"}])
    line = _cli_error(["train", "--set", "task.name=jsonl", "--set", f"task.dataset={data}"], capsys)
    assert line == ("error: q.jsonl: no built-in metric can score these rows (fields found: prompt (2 of 2 rows), "
                    "question (1 of 2 rows)); add an 'answer' to each row (math_answer, exact and answer_f1 read it), "
                    "or choose the metrics: --set 'reward.weights={json_valid = 1.0}' (built-in: answer_f1, exact, "
                    "citation, format, length, math_answer, json_valid, token_length, repetition) or your own: "
                    "--set reward.custom.mine=my_module:score")
    assert list_runs(runs_dir).empty
    # the --set it names works
    assert main(["train", "--set", "task.name=jsonl", "--set", f"task.dataset={data}", "--set",
                 "reward.weights={json_valid = 1.0}", "--set", "grpo.steps=1", "--run-id", "ok", *FAST]) == 0


def test_a_missing_field_names_the_set_that_drops_its_metric(tmp_path, runs_dir, capsys):
    data = write_rows(tmp_path / "p.jsonl", [{"prompt": "2+3=", "answer": "5"}])
    toml = tmp_path / "run.toml"
    toml.write_text(f"[task]\nname = 'jsonl'\ndataset = {json.dumps(str(data))}\n"
                    "[reward.weights]\nexact = 1.0\ncitation = 0.2\n")
    line = _cli_error(["train", "--config", str(toml)], capsys)
    assert line == ("error: p.jsonl line 1: field 'source' (needed by metric citation) is missing; add it to every "
                    "row, or drop the metric: --set reward.weights.citation=0")
    assert main(["train", "--config", str(toml), "--set", "reward.weights.citation=0", "--set", "grpo.steps=1",
                 "--run-id", "ok", *FAST]) == 0


@pytest.mark.parametrize("rows, weights, message", [
    ([{"prompt": "p", "schema": {"type": 5}}], None,
     "p.jsonl line 1: field 'schema' is not a valid JSON Schema (5 is not valid"),
    ([{"prompt": "p", "schema": "object"}], None, "p.jsonl line 1: field 'schema' must be a JSON object, got str \"object\""),
    ([{"prompt": "p", "answer": True}], None, "p.jsonl line 1: field 'answer' must be a string, got bool true"),
    ([{"prompt": "p", "answer": [5]}], "{math_answer = 1.0}",
     "p.jsonl line 1: field 'answer' must be a string or a number, got list [5]"),
    ([{"prompt": "p", "answer": "5", "max_tokens": "9"}], None, "p.jsonl line 1: field 'max_tokens' must be an integer"),
])
def test_bad_rows_for_the_new_metrics_are_one_line(tmp_path, runs_dir, capsys, rows, weights, message):
    data = write_rows(tmp_path / "p.jsonl", rows)
    line = _cli_error(["train", "--set", "task.name=jsonl", "--set", f"task.dataset={data}",
                       *(["--set", f"reward.weights={weights}"] if weights else [])], capsys)
    assert message in line, line


def test_a_bad_whole_table_is_one_line(runs_dir, capsys):
    line = _cli_error(["train", "--set", "reward.weights={exact: 1"], capsys)
    assert line == ("error: --set reward.weights: '{exact: 1' is neither a TOML inline table nor a JSON object; "
                    "e.g. --set 'reward.weights={exact = 1.0, answer_f1 = 0.5}'")


# ---- custom metric modules: found next to the config and in the working dir; failures named -----------------
@pytest.fixture
def clean_imports(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("own_data_"):
            del sys.modules[name]


def test_custom_module_next_to_the_config_file_imports_from_anywhere(tmp_path, monkeypatch, clean_imports):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "own_data_pkg").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "own_data_pkg" / "rewards.py").write_text("def score(completion, example):\n    return 1.0\n")
    toml = project / "run.toml"
    toml.write_text('[reward.custom]\nmine = "own_data_pkg.rewards:score"\n[reward.weights]\nexact = 1.0\nmine = 0.5\n')
    monkeypatch.chdir(elsewhere)
    cfg = load_config(toml)
    assert cfg.reward.custom_dirs == [str(project), str(elsewhere)]
    stored = from_dict(cfg.to_dict())  # what a --resume reads: the folders are kept
    make_task(stored)
    fns, kinds = build_metrics(list(stored.reward.weights), stored.reward.custom)
    assert fns["mine"]("x", {}) == 1.0 and kinds["mine"] == "custom"


def test_custom_module_in_the_working_dir_imports(tmp_path, monkeypatch, clean_imports):
    (tmp_path / "own_data_cwd.py").write_text("def score(completion, example):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cfg = load_config(None, ["reward.custom.mine=own_data_cwd:score"])
    make_task(cfg)
    fns, _ = build_metrics(list(cfg.reward.weights) + ["mine"], cfg.reward.custom)
    assert fns["mine"]("x", {}) == 0.5


@pytest.mark.parametrize("module_text, target, message", [
    (None, "own_data_nope.rewards:score",
     "error: reward.custom.mine: custom metric 'own_data_nope.rewards:score' cannot be loaded: no module named "
     "'own_data_nope' (searched the config file's folder, the working dir and sys.path); put "
     "own_data_nope.py or the package folder own_data_nope/ next to the config file or in the working dir, "
     "pip install it, or list its folder in reward.custom_dirs"),
    ("import own_data_missing_dep\n", "own_data_broken:score",
     "error: reward.custom.mine: custom metric 'own_data_broken:score' cannot be loaded: importing "
     "'own_data_broken' raised ModuleNotFoundError: No module named 'own_data_missing_dep' (own_data_broken.py "
     "line 1); pip install it, or fix the module and start again"),
    ("def score(c, e):\n    return 1 +\n", "own_data_broken:score",
     "error: reward.custom.mine: custom metric 'own_data_broken:score' cannot be loaded: importing "
     "'own_data_broken' raised SyntaxError: invalid syntax (own_data_broken.py line 2); fix the module and start "
     "again"),
    ("def scor(c, e):\n    return 1\n", "own_data_broken:score",
     "error: reward.custom.mine: custom metric 'own_data_broken:score' cannot be loaded: module 'own_data_broken' "
     "has no 'score' (did you mean 'scor'?) (it has: scor)"),
])
def test_a_custom_module_that_fails_is_named_with_the_fix(tmp_path, monkeypatch, clean_imports, runs_dir, capsys,
                                                          module_text, target, message):
    if module_text is not None:
        (tmp_path / target.split(":")[0].replace(".", "/")).with_suffix(".py").write_text(module_text)
    monkeypatch.chdir(tmp_path)
    line = _cli_error(["train", "--set", f"reward.custom.mine={target}"], capsys)
    assert line.startswith(message), line
    assert list_runs(runs_dir).empty


# ---- item 2: the new metrics' kinds reach the code that reads kinds -------------------------------------------
def test_new_metric_kinds_reach_the_planner_and_the_autopilot():
    _, kinds = build_metrics(["math_answer", "json_valid", "token_length"], {})
    assert kinds == {"math_answer": "binary", "json_valid": "binary", "token_length": "penalty"}
    assert autopilot.metric_max(kinds) == {"math_answer": 1.0, "json_valid": 1.0, "token_length": 0.0}
    assert pilot.is_binary("math_answer", np.array([0.0, 1.0]))
    assert not pilot.is_binary("token_length", np.array([0.0, -0.5]))
    assert set(KINDS.values()) == {"binary", "continuous", "penalty"}
    assert pilot.is_binary("json_valid", np.array([1.0]))
