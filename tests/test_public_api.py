"""The public API and the env vars: every name `grpo_core` exports is the object its module
defines, `import grpo_core` loads no torch (the Streamlit process imports it), `__version__` is
the installed distribution's, and every env var is GRPO_HEALTH_* with the old names still read."""
from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import grpo_core
from grpo_core.dashboard import access, serve
from grpo_core.errors import ConfigError
from grpo_core.runs import locations

REPO = Path(__file__).resolve().parents[1]


def test_every_exported_name_is_the_object_its_module_defines():
    assert grpo_core.__all__ == sorted(grpo_core.PUBLIC) and len(grpo_core.__all__) >= 15
    for name in grpo_core.__all__:
        module = importlib.import_module(grpo_core.PUBLIC[name])
        assert getattr(grpo_core, name) is getattr(module, name), name
    assert {"GRPOHealthCallback", "ArtMonitor", "RunStore", "RunConfig", "import_path", "follow"} <= set(dir(grpo_core))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        grpo_core.Nope  # noqa: B018
    with pytest.raises(ImportError):
        exec("from grpo_core import Nope", {})


def run_python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_grpo_core_and_its_readers_leave_torch_unloaded():
    """The store, the run list and the report come from wings without torch: using them through
    the top-level names loads no torch either; the TRL callback does (it is the trainer's side)."""
    seen = run_python(
        "import json, sys\n"
        "import grpo_core\n"
        "first = 'torch' in sys.modules\n"
        "grpo_core.RunStore, grpo_core.list_runs, grpo_core.build_report, grpo_core.RunConfig\n"
        "second = 'torch' in sys.modules\n"
        "grpo_core.GRPOHealthCallback\n"
        "print(json.dumps([first, second, 'torch' in sys.modules]))\n")
    assert seen == [False, False, True]


def test_version_is_the_installed_distributions():
    assert grpo_core.__version__ == metadata.version("grpo-health")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert grpo_core.installed_version() == pyproject["project"]["version"]  # .venv holds this checkout


def test_version_falls_back_to_pyproject_in_a_checkout_never_installed(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(metadata, "version", not_installed)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert grpo_core.installed_version() == pyproject["project"]["version"]


# ---- one env prefix: GRPO_HEALTH_*, the old names still read ------------------------------------------------
@pytest.mark.parametrize("new, old", sorted(locations.OLD_ENV_NAMES.items()))
def test_an_old_env_name_is_still_read_and_the_new_one_wins(monkeypatch, caplog, new, old):
    monkeypatch.delenv(new, raising=False)
    monkeypatch.setenv(old, "from-the-old-name")
    monkeypatch.setattr(locations, "warned_old_names", set())
    with caplog.at_level(logging.WARNING, logger=locations.__name__):
        assert locations.env(new) == "from-the-old-name"
        assert locations.env(new) == "from-the-old-name"
    assert [r.getMessage() for r in caplog.records] == [  # once per process, not on every read
        f"${old} is the old name of ${new}; it still works, but set ${new}"]
    monkeypatch.setenv(new, "from-the-new-name")
    assert locations.env(new) == "from-the-new-name"
    monkeypatch.setenv(new, "")  # empty is unset: the old name again
    assert locations.env(new) == "from-the-old-name"


def test_the_runs_dir_and_allowed_dirs_read_both_names(monkeypatch, tmp_path):
    monkeypatch.delenv("GRPO_HEALTH_RUNS_DIR")
    monkeypatch.setenv("GRPO_RUNS_DIR", str(tmp_path / "old"))
    assert locations.runs_dir() == tmp_path / "old"
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(tmp_path / "new"))
    assert locations.runs_dir() == tmp_path / "new"
    (tmp_path / "old" / "model").mkdir(parents=True)
    monkeypatch.delenv("GRPO_HEALTH_ALLOWED_DIRS", raising=False)
    monkeypatch.setenv("GRPO_ALLOWED_DIRS", str(tmp_path / "old"))
    assert access.check_ui_path("model.path", str(tmp_path / "old" / "model"), "dir") == str(tmp_path / "old" / "model")


def test_the_trainers_torch_threads_read_both_names(monkeypatch):
    import torch

    from grpo_core.train import models
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("GRPO_HEALTH_TORCH_THREADS", raising=False)
        monkeypatch.setenv("GRPO_TORCH_THREADS", "2")
        models.set_threads()
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("GRPO_HEALTH_TORCH_THREADS", "3")
        models.set_threads()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_serve_port_from_the_flag_then_the_env(monkeypatch):
    monkeypatch.delenv(serve.PORT_ENV, raising=False)
    assert serve.serve_port(None) == 8501
    monkeypatch.setenv(serve.PORT_ENV, "8600")
    assert serve.serve_port(None) == 8600 and serve.serve_port(9) == 9
    monkeypatch.setenv(serve.PORT_ENV, "eighty")
    with pytest.raises(ConfigError, match=r"\$GRPO_HEALTH_PORT must be a port number"):
        serve.serve_port(None)


def test_library_code_reads_env_vars_only_under_the_new_prefix():
    """Every GRPO_* env var grpo_core names is GRPO_HEALTH_*; the old names live only in
    locations.OLD_ENV_NAMES, the one place that still reads them."""
    old = set(locations.OLD_ENV_NAMES.values())
    found = []
    for path in sorted((REPO / "grpo_core").rglob("*.py")):
        if path.name == "locations.py":
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(REPO)}: {name}" for name in old if name in text]
    assert found == []
