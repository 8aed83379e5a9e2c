"""Shared test set-up. Every test gets its own runs directory: nothing a test does
touches ./runs or another test's runs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The built-in model is tiny: one torch thread per process, so a trainer does not contend for
# the cores with the test's other subprocesses (Streamlit, the browser) and with itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")
PYTHON = sys.executable


@pytest.fixture(autouse=True)
def _isolated_runs_dir(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    monkeypatch.setenv("GRPO_HEALTH_RUNS_DIR", str(runs))
    monkeypatch.delenv("GRPO_HEALTH_REDRAWS_PER_S", raising=False)  # the viewers' share at its default
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield


@pytest.fixture(autouse=True)
def _fresh_live_reads(request, monkeypatch):
    """An in-process page run (AppTest) sees what its test just wrote: the shared live view's probe
    throttle (at most one "anything new?" read per PROBE_S; tests/test_live_cache.py pins it there)
    is off, and no run is remembered from another test."""
    from grpo_core.dashboard import live_cache
    if request.module.__name__.endswith("test_live_cache"):
        yield
        return
    monkeypatch.setattr(live_cache, "PROBE_S", 0.0)
    live_cache.clear()
    yield
    live_cache.clear()


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    return Path(os.environ["GRPO_HEALTH_RUNS_DIR"])
