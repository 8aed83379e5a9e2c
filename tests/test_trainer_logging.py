"""The trainer logs through `logging` and never prints: `python -m grpo_core train` shows its lines
on stderr as before (the CLI's handler), a library user's process prints nothing it did not ask
for, and a caller's own `log` callable still replaces the logger (a quiet rank, a test)."""
from __future__ import annotations

import logging
import shutil

import pytest

from grpo_core.__main__ import StderrLines, main
from grpo_core.runs.store import RunStore
from grpo_core.tasks.loading import load_config
from grpo_core.train.checkpoints import CKPT_PREFIX
from grpo_core.train.trainer import Trainer

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "model.warm_start_steps=0", "grpo.prompts_per_step=2", "grpo.group_size=2", "grpo.max_new_tokens=4",
        "log.progress=false", "log.checkpoint_every=0"]
RESUMED = f"resumed from {CKPT_PREFIX}000002 (step 2)"  # the line the trainer says on --resume


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of two steps with its checkpoint, trained once for the module."""
    root = tmp_path_factory.mktemp("trained")
    args = ["train", "--run-id", "logged", "--runs-dir", str(root)]
    assert main(args + [a for s in TINY + ["grpo.steps=2"] for a in ("--set", s)]) == 0
    return root


@pytest.fixture
def two_steps(trained, runs_dir):
    """This test's own copy of it (a resume changes the run)."""
    shutil.copytree(trained / "logged", runs_dir / "logged")
    return runs_dir


def test_the_cli_shows_what_the_trainer_logs_on_stderr(two_steps, capsys, caplog):
    caplog.set_level(logging.INFO, logger="grpo_core")
    assert main(["train", "--resume", "--run-id", "logged", "--runs-dir", str(two_steps),
                 "--set", "grpo.steps=3"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert RESUMED in err  # the message alone, as the print was
    assert any(line.startswith("run logged finished at step 3") for line in err)  # the verb's own output
    said = [r for r in caplog.records if r.name == "grpo_core.train.trainer"]
    assert [r.getMessage() for r in said] == [RESUMED]
    assert said[0].levelno == logging.INFO


def test_a_library_user_gets_records_not_prints(two_steps, capsys, caplog, monkeypatch):
    """Without the CLI's handler the trainer writes nothing to stdout or stderr; its record
    reaches whatever logging the user set up (here pytest's)."""
    package = logging.getLogger("grpo_core")
    monkeypatch.setattr(package, "handlers", [h for h in package.handlers if not isinstance(h, StderrLines)])
    caplog.set_level(logging.INFO, logger="grpo_core")
    store = RunStore.open(two_steps / "logged")
    cfg = load_config(None, TINY + ["grpo.steps=3"])
    assert Trainer(cfg, store, resume=True).run() == "finished"
    cap = capsys.readouterr()
    assert "resumed from" not in cap.err + cap.out
    assert RESUMED in [r.getMessage() for r in caplog.records]


def test_a_log_callable_replaces_the_logger(two_steps, caplog):
    caplog.set_level(logging.INFO, logger="grpo_core")
    said: list[str] = []
    store = RunStore.open(two_steps / "logged")
    Trainer(load_config(None, TINY + ["grpo.steps=3"]), store, resume=True, log=said.append).run()
    assert said == [RESUMED]
    assert not [r for r in caplog.records if r.name == "grpo_core.train.trainer"]


def test_warnings_and_errors_say_so(capsys):
    handler = StderrLines()
    for level, text in ((logging.INFO, "plain"), (logging.WARNING, "careful"), (logging.ERROR, "broken")):
        handler.handle(logging.LogRecord("grpo_core.x", level, __file__, 1, text, None, None))
    assert capsys.readouterr().err.splitlines() == ["plain", "warning: careful", "error: broken"]
