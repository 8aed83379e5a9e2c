"""Bad input, the product-level checklist: every case drives a real entry point (the CLI's
main(), `python -m grpo_core` as a subprocess, the Streamlit pages under AppTest, the real
trainer) and checks for a clear message naming the field, no traceback, nothing created
and nothing dropped. Module tests (test_config, test_cli, test_app, ...) cover more paths
per module; this file is the list a user would walk through.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from grpo_core.__main__ import main
from grpo_core.dashboard import processes
from grpo_core.errors import StoreError
from grpo_core.runs import names
from grpo_core.runs.run_index import list_runs
from grpo_core.runs.store import RunStore
from tests.helpers_dashboard import REPO, app_test, synth_run

FAST = ["--set", "model.warm_start_steps=0", "--set", "log.progress=false"]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def files(tmp_path) -> Path:
    """Bad files of every kind the CLI and pages read."""
    d = tmp_path / "in"
    d.mkdir()
    good = {"prompt": "Q: sun? sun=hot [S1] A:", "answer": "hot", "source": "S1"}
    (d / "not-json.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{prompt: oops}\n")
    (d / "no-answer.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "Q: x?", "source": "S1"}) + "\n")
    (d / "bad-type.jsonl").write_text(json.dumps({**good, "prompt": 5}) + "\n")
    (d / "a-list.jsonl").write_text(json.dumps(good) + "\n[1, 2]\n")
    (d / "empty.jsonl").write_text("\n\n")
    (d / "typo.toml").write_text("[grpo]\nstpes = 10\n")
    (d / "section.toml").write_text("[rewards]\nexact = 1.0\n")
    (d / "broken.toml").write_text("[grpo\nsteps = 10\n")
    (d / "model-no-tok").mkdir()
    (d / "model-no-tok" / "config.json").write_text("{}")
    (d / "history.csv").write_text("Step,train/reward\n1,0.5\n2,0.6\n")
    return d


# ---- the CLI: exit 2, one line on stderr naming the field, no run created ------------------------------
CLI_CASES = {
    "weight NaN": (["train", "--set", "reward.weights.exact=nan"], "reward.weights.exact must be finite"),
    "weight negative": (["train", "--set", "reward.weights.exact=-0.5"], "reward.weights.exact must be >= 0"),
    "weights all zero": (["train"] + [a for m in ("answer_f1", "exact", "citation", "format", "length")
                                      for a in ("--set", f"reward.weights.{m}=0")], "reward.weights are all zero"),
    "unknown metric": (["train", "--set", "reward.weights.exakt=0.5"],
                       "reward.weights.exakt: no such metric (did you mean 'exact'?)"),
    "weight not a number": (["train", "--set", "reward.weights.exact=lots"], "reward.weights.exact must be a number"),
    "threshold >= 1": (["train", "--set", "grpo.min_group_std=1.5"], "grpo.min_group_std must be in [0, 1), got 1.5"),
    "threshold < 0": (["train", "--set", "grpo.min_group_std=-0.1"], "grpo.min_group_std must be in [0, 1)"),
    "group size 1": (["train", "--set", "grpo.group_size=1"], "grpo.group_size must be >= 2, got 1"),
    "key typo": (["train", "--set", "grpo.grup_size=4"], "unknown key 'grpo.grup_size' (did you mean 'group_size'?)"),
    "key typo in a file": (["train", "--config", "{in}/typo.toml"], "unknown key 'grpo.stpes' (did you mean 'steps'?)"),
    "section typo": (["train", "--config", "{in}/section.toml"], "unknown config section 'rewards' (did you mean 'reward'?)"),
    "not TOML": (["train", "--config", "{in}/broken.toml"], "broken.toml: not valid TOML"),
    "no config file": (["train", "--config", "{in}/nope.toml"], "config file not found"),
    "--set without =": (["train", "--set", "grpo.steps"], "--set expects section.key=value"),
    "missing model path": (["train", "--set", "model.path={in}/no-such-model"], "no such folder"),
    "model without tokenizer": (["train", "--set", "model.path={in}/model-no-tok"], "has no tokenizer files"),
    "jsonl not JSON": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/not-json.jsonl"],
                       "not-json.jsonl line 3: not valid JSON"),
    "jsonl missing field": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/no-answer.jsonl"],
                            "no-answer.jsonl line 2: field 'answer' (needed by metric"),
    "jsonl wrong type": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/bad-type.jsonl"],
                         "bad-type.jsonl line 1: field 'prompt' must be a string or a list of chat messages, got int 5"),
    "jsonl row not an object": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/a-list.jsonl"],
                                "a-list.jsonl line 2: expected a JSON object"),
    "jsonl empty": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/empty.jsonl"], "has no rows"),
    "jsonl missing file": (["train", "--set", "task.name=jsonl", "--set", "task.dataset={in}/none.jsonl"],
                           "task.dataset '{in}/none.jsonl': no such file"),
    "jsonl without dataset": (["train", "--set", "task.name=jsonl"], "task.dataset must name a JSONL file"),
    "custom metric not module:function": (["train", "--set", "reward.custom.mine=nocolon"],
                                           "reward.custom.mine must be 'module:function'"),
    "custom metric not importable": (["train", "--set", "reward.custom.mine=no_such_module:fn"],
                                     "custom metric 'no_such_module:fn' cannot be loaded"),
    "run id with ../": (["train", "--run-id", "../escape"], "run id '../escape' is not allowed"),
    "run id with /": (["train", "--run-id", "a/b"], "run id 'a/b' is not allowed"),
    "import: CSV given as TRL": (["import", "trl", "{in}/history.csv"], "history.csv: this is a CSV exported from W&B: use `import csv`"),
    "import: CSV given as W&B run file": (["import", "wandb", "{in}/history.csv"], "use `import csv`"),
    "import: TOML given as CSV": (["import", "csv", "{in}/typo.toml"], "expected a CSV exported from W&B"),
    "import: missing file": (["import", "trl", "{in}/nope.json"], "nope.json: file not found"),
    "import: run id with ../": (["import", "csv", "{in}/history.csv", "--run-id", "../up"],
                                "run id '../up' is not allowed"),
}


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_cli_bad_input_is_one_line_exit_2_and_creates_nothing(case, files, runs_dir, capsys):
    args, want = CLI_CASES[case]
    args = [a.replace("{in}", str(files)) for a in args]
    if args[0] == "train":
        args += FAST
    assert main(args) == 2
    cap = capsys.readouterr()
    line = one_line(cap.err)
    assert want.replace("{in}", str(files)) in line, line
    assert cap.out == "" and list_runs(runs_dir).empty and not (runs_dir.parent / "escape").exists()


@pytest.fixture
def finished_run(runs_dir) -> str:
    synth_run(runs_dir, "done", 3, status="finished").close()
    return "done"


@pytest.mark.parametrize("args, want", [
    (["stop"], "run done is finished: control requests apply only to a live run"),
    (["set-weights", "exact=0.5"], "run done is finished"),
    (["set-threshold", "1"], "min_group_std must be a number in [0, 1), got 1.0"),
    (["set-weights", "exact=inf"], "reward.weights.exact must be finite"),
    (["set-group-size", "1"], "group_size must be an integer from 2"),
])
def test_control_of_a_finished_run_or_with_bad_values_is_refused_in_one_line(finished_run, runs_dir, capsys,
                                                                              args, want):
    assert main(["control", str(runs_dir / finished_run), *args]) == 2
    assert want in one_line(capsys.readouterr().err)
    with RunStore.open(runs_dir / finished_run, readonly=True) as s:
        assert s.control().empty


@pytest.mark.slow
def test_the_real_cli_process_prints_one_line_and_no_traceback(files, runs_dir):
    """The same path as a user's shell: `python -m grpo_core train ...` with a bad dataset row."""
    out = subprocess.run([sys.executable, "-m", "grpo_core", "train", "--runs-dir", str(runs_dir), "--set",
                          "task.name=jsonl", "--set", f"task.dataset={files}/not-json.jsonl"],
                         cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 2 and out.stdout == ""
    assert "line 3: not valid JSON" in one_line(out.stderr) and list_runs(runs_dir).empty


@pytest.fixture
def serve_starts_nothing(monkeypatch):
    """serve's demo and Streamlit replaced by failures: a check that lets a bad port through
    fails the test instead of starting a trainer and a server."""
    from grpo_core.dashboard import serve

    def started(*a, **kw):
        raise AssertionError("serve started something before refusing the port")
    monkeypatch.setattr(processes, "start_demo_if_idle", started)
    monkeypatch.setattr(serve, "run_streamlit", started)


@pytest.mark.parametrize("args, want", [
    (["--port", "99999"], "--port must be a port number (1-65535), got 99999"),
    (["--port", "0"], "--port must be a port number (1-65535), got 0"),
    (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: not an address of this machine"),
])
def test_serve_refuses_a_bad_port_or_host_in_one_line_before_starting_anything(args, want, runs_dir, capsys,
                                                                                serve_starts_nothing):
    assert main(["serve", "--runs-dir", str(runs_dir), *args]) == 2
    assert want in one_line(capsys.readouterr().err)
    assert list_runs(runs_dir).empty


def test_serve_on_a_port_in_use_is_one_line_and_no_demo(runs_dir, capsys, serve_starts_nothing):
    import socket
    with socket.socket() as taken:  # a real listener on a port the OS chose: in use, as another dashboard's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--runs-dir", str(runs_dir), "--port", str(port)]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"port {port} on 127.0.0.1 is in use" in line and "--port" in line, line
    assert list_runs(runs_dir).empty


# ---- the dashboard: st.error with the message, no exception, no run ---------------------------------------
def runs_page(**state) -> AppTest:
    at = app_test()
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    at.switch_page("pages/runs.py").run()
    assert not at.exception
    return at


def start_form(at: AppTest, model: str = "", extra: str = "") -> list[str]:
    next(t for t in at.text_input if t.label == "Model path").set_value(model)
    next(t for t in at.text_area if t.label.startswith("More settings")).set_value(extra)
    next(b for b in at.button if b.label == "Start run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return [e.value for e in at.error]


UI_CASES = {
    "weight NaN": ("", "reward.weights.exact=nan", "reward.weights.exact must be finite"),
    "unknown metric": ("", "reward.weights.exakt=1", "reward.weights.exakt: no such metric (did you mean 'exact'?)"),
    "group size 1": ("", "grpo.group_size=1", "grpo.group_size must be >= 2"),
    "typo": ("", "grpo.learnig_rate=0.1", "unknown key 'grpo.learnig_rate'"),
    "missing model folder": ("{runs}/no-such-model", "", "model.path '{runs}/no-such-model': no such folder"),
    "model outside the allowed folders": ("/etc", "", "model.path '/etc' is outside the folders"),
    "model via ../": ("{runs}/../../../etc", "", "is outside the folders"),
    "dataset outside": ("", "task.name=\"jsonl\"\ntask.dataset=\"/etc/passwd\"", "task.dataset '/etc/passwd' is outside"),
    "custom code": ("", "reward.custom.x=\"os:system\"", "reward.custom.x: custom reward functions cannot be set"),
    "runs dir moved": ("", "log.runs_dir=\"/tmp\"", "log.runs_dir cannot be changed from the dashboard"),
}


@pytest.mark.parametrize("case", list(UI_CASES))
def test_start_form_bad_input_is_one_st_error_and_starts_nothing(case, runs_dir, monkeypatch):
    spawned = []
    monkeypatch.setattr(processes, "_spawn", lambda *a: spawned.append(a) or a[1])
    model, extra, want = (x.replace("{runs}", str(runs_dir)) for x in UI_CASES[case])
    errs = start_form(runs_page(), model, extra)
    assert len(errs) == 1 and want in errs[0] and "\n" not in errs[0], errs
    assert not spawned and list_runs(runs_dir).empty


def test_start_form_takes_a_model_folder_inside_the_runs_dir(runs_dir, monkeypatch):
    """The policy's other side: an existing folder inside an allowed place is taken, resolved."""
    spawned = []
    monkeypatch.setattr(processes, "_spawn", lambda *a: spawned.append(a) or a[1])
    (runs_dir / "models" / "mine").mkdir(parents=True)
    errs = start_form(runs_page(), str(runs_dir / "models" / ".." / "models" / "mine"), "model.warm_start_steps=0")
    assert errs == [] and len(spawned) == 1
    rid = spawned[0][1]
    assert RunStore.open(runs_dir / rid).config["model"]["path"] == str(runs_dir / "models" / "mine")


def test_pilot_form_refuses_a_model_path_outside(runs_dir, monkeypatch):
    at = app_test()
    at.run()
    at.switch_page("pages/pilot.py").run()
    next(t for t in at.text_input if t.label == "Model path").set_value("/etc")
    next(b for b in at.button if b.label == "Start pilot").click().run()
    assert not at.exception
    errs = [e.value for e in at.error]
    assert len(errs) == 1 and "model.path '/etc' is outside the folders" in errs[0] and list_runs(runs_dir).empty


def test_import_of_the_wrong_kind_on_the_runs_page_is_one_line(files, runs_dir):
    at = runs_page()
    at.selectbox(key="import_kind").set_value("trl")
    at.file_uploader(key="import_file").upload("../../history.csv", (files / "history.csv").read_bytes(), "text/csv")
    at.run()
    at.button(key="import_go").click().run()
    errs = [e.value for e in at.error]
    assert not at.exception and len(errs) == 1 and "use `import csv`" in errs[0]
    assert list_runs(runs_dir).empty


def test_an_upload_name_with_dots_and_slashes_stays_in_the_runs_dir(files, runs_dir):
    at = runs_page()
    at.selectbox(key="import_kind").set_value("csv")
    at.file_uploader(key="import_file").upload("../../../etc/x.csv", (files / "history.csv").read_bytes(), "text/csv")
    at.run()
    at.button(key="import_go").click().run()
    assert not at.exception and not at.error
    runs = list_runs(runs_dir)
    assert len(runs) == 1 and Path(runs["path"].iloc[0]).parent == runs_dir and ".." not in runs["run_id"].iloc[0]


def test_a_finished_run_offers_no_control_and_refuses_a_request(runs_dir):
    store = synth_run(runs_dir, "r", 3)  # running, heartbeat fresh, pid = this process
    at = runs_page()
    assert at.button(key="stop_r") and at.button(key="pause_r")
    store.set_status("finished")  # finishes while the page is open: the next rerun offers nothing to send
    at.run()
    assert not at.exception and not [b for b in at.button if b.key in ("stop_r", "pause_r")]
    with pytest.raises(StoreError, match="run r is finished: control requests apply only to a live run"):
        processes.stop_run("r", root=runs_dir)  # what the button calls, had it been clicked a moment earlier
    assert store.control().empty


# ---- the trainer: a reward metric that misbehaves, empty completions ----------------------------------------
BAD_METRICS = '''
import math
def key(c):  # a number from the text: which completions a rule hits varies, deterministically
    return sum(map(ord, c))
def boom(completion, example):
    if key(completion) % 2 == 0:
        raise ValueError("boom on an even key")
    return 1.0
def nan(completion, example):
    return math.nan if key(completion) % 3 == 0 else 0.5
def inf(completion, example):
    return math.inf if key(completion) % 4 == 1 else 0.0
def text(completion, example):
    return "high" if key(completion) % 5 == 0 else 0.2
'''
KEY = lambda c: sum(map(ord, c))  # noqa: E731
RULES = {"boom": lambda c: KEY(c) % 2 == 0, "nan": lambda c: KEY(c) % 3 == 0, "inf": lambda c: KEY(c) % 4 == 1,
         "text": lambda c: KEY(c) % 5 == 0}
WHAT = {"boom": "ValueError: boom on an even key", "nan": "returned nan", "inf": "returned inf",
        "text": "returned str 'high'"}
STEPS, BP, BG = 3, 2, 8


def always_eos_model(path: Path):
    """The built-in tiny model rewired so that eos is its first token every time: the residual
    stream carries only the token embedding, the final norm keeps one dimension, and eos is
    far out along it. Saved like any local Hugging Face model folder."""
    import torch

    from grpo_core.runs.config import ModelConfig
    from grpo_core.train import models
    tok = models.build_tokenizer()
    model = models.build_tiny_model(ModelConfig(), tok, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        emb = model.model.embed_tokens.weight  # tied with lm_head
        emb[:, 0] = 1.0
        emb[tok.eos_token_id, 0] = 50.0
    models.save_pretrained(model, tok, path)


@pytest.fixture(scope="module")
def misbehaving_runs(tmp_path_factory):
    """Two real trainer runs side by side: custom metrics that raise / return NaN, inf, a string;
    a model whose every completion is empty."""
    base = tmp_path_factory.mktemp("bad-metrics")
    root = base / "runs"
    (base / "badmetrics.py").write_text(BAD_METRICS)
    always_eos_model(base / "eos-model")
    common = ["--runs-dir", str(root), "--set", f"grpo.steps={STEPS}", "--set", f"grpo.prompts_per_step={BP}",
              "--set", f"grpo.group_size={BG}", "--set", "grpo.max_new_tokens=8", "--set", "log.checkpoint_every=0",
              *FAST]
    env = {**os.environ, "PYTHONPATH": f"{base}{os.pathsep}{REPO}", "GRPO_HEALTH_RUNS_DIR": str(root)}
    custom = [a for m in RULES for a in ("--set", f"reward.custom.{m}=\"badmetrics:{m}\"",
                                         "--set", f"reward.weights.{m}=0.1")]
    procs = {"metrics": subprocess.Popen([sys.executable, "-m", "grpo_core", "train", "--run-id", "metrics",
                                          *common, *custom], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True),
             "empty": subprocess.Popen([sys.executable, "-m", "grpo_core", "train", "--run-id", "empty", *common,
                                        "--set", f"model.path={base / 'eos-model'}"],
                                       cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)}
    for rid, p in procs.items():
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, f"{rid}: {err[-3000:]}"
    return root


@pytest.mark.slow
@pytest.mark.parametrize("metric", list(RULES))
def test_a_metric_that_raises_or_returns_nan_inf_or_text_is_a_scoring_error_and_the_step_goes_on(
        misbehaving_runs, metric):
    with RunStore.open(misbehaving_runs / "metrics", readonly=True) as s:
        meta, roll, wide = s.get_meta(), s.rollouts(), s.scalars_wide()
    assert meta["status"] == "finished" and list(wide.index) == list(range(1, STEPS + 1))
    assert len(roll) == STEPS * BP * BG  # every rollout kept, the failing ones too
    hit = roll["completion"].map(RULES[metric])
    assert hit.any() and (~hit).any(), "the rule must both fire and not fire in this run"
    errors = roll["error"].fillna("")
    assert errors[hit].str.contains(f"{metric}: ", regex=False).all()
    assert errors[hit].str.contains(WHAT[metric], regex=False).all()
    assert not errors[~hit].str.contains(f"{metric}: ", regex=False).any()
    assert (roll.loc[hit, metric] == 0).all()  # a failed score counts as 0 in the total, visibly
    per_step = roll.assign(bad=errors != "").groupby("step")["bad"].sum()
    assert wide[names.SCORING_ERRORS].tolist() == per_step.astype(float).tolist()  # counted, step by step


@pytest.mark.slow
def test_empty_completions_are_scored_and_kept(misbehaving_runs):
    with RunStore.open(misbehaving_runs / "empty", readonly=True) as s:
        meta, roll, wide, groups = s.get_meta(), s.rollouts(), s.scalars_wide(), s.groups()
    assert meta["status"] == "finished" and list(wide.index) == list(range(1, STEPS + 1))
    assert len(roll) == STEPS * BP * BG and (roll["completion"] == "").all()  # "" kept, not NULL or dropped
    assert roll["error"].isna().all() and (wide[names.SCORING_ERRORS] == 0).all()
    for m in ("answer_f1", "exact", "citation", "format"):
        assert (roll[m] == 0).all()
    assert (roll["length"] == 0).all() and (wide[names.COMPLETION_MEAN_LENGTH] <= 1).all()
    assert not groups["trainable"].any() and (wide[names.TRAINABLE_RATIO] == 0).all()
