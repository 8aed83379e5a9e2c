"""GRPO Health: a GRPO trainer and a dashboard that shows, live, whether its training is healthy.

The public API is the names in `__all__` (README, "Public API"): `from grpo_core import
GRPOHealthCallback, RunStore, ...`, plus `grpo_core.__version__`. Every other module path
may change between versions. Each name is loaded from the module that defines it the first
time it is asked for (PEP 562 `__getattr__`), so `import grpo_core` stays light: the
Streamlit process imports grpo_core and never loads torch, and only whoever asks for the
TRL callback loads TRL.
"""
from __future__ import annotations

import importlib
from importlib import metadata

# Public name -> the module that defines it (the one definition; this is a shortcut to it).
PUBLIC = {
    # inside your own training process
    "GRPOHealthCallback": "grpo_core.integrations.trl",  # TRL GRPOTrainer
    "ArtMonitor": "grpo_core.integrations.art",  # OpenPipe ART
    # another trainer's files, once or followed while they grow (`import` / `watch`)
    "import_path": "grpo_core.integrations.importers",
    "import_run": "grpo_core.integrations.importers",
    "follow": "grpo_core.integrations.follow",
    # the embedded trainer's settings, and starting it as a process of its own
    "RunConfig": "grpo_core.runs.config",
    "start_run": "grpo_core.dashboard.processes",
    # runs on disk: where they are, one run's store, all of them
    "runs_dir": "grpo_core.runs.locations",
    "RunStore": "grpo_core.runs.store",
    "list_runs": "grpo_core.runs.run_index",
    # what a run's numbers say
    "load_run": "grpo_core.analysis.run_data",
    "RunData": "grpo_core.analysis.run_data",
    "build_report": "grpo_core.analysis.report",
    "Report": "grpo_core.analysis.report",
    "to_markdown": "grpo_core.analysis.report",
    "to_html": "grpo_core.analysis.report",
    # bad input: one line naming the field and the fix
    "ConfigError": "grpo_core.errors",
    "StoreError": "grpo_core.errors",
}
__all__ = sorted(PUBLIC)


def installed_version() -> str:
    """The installed distribution's version; in a source checkout that was never installed,
    pyproject.toml's."""
    try:
        return metadata.version("grpo-health")
    except metadata.PackageNotFoundError:
        import tomllib

        from grpo_core.runs.locations import source_checkout
        checkout = source_checkout()
        if checkout is None:
            return "unknown"
        return tomllib.loads((checkout / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


__version__ = installed_version()


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'grpo_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(PUBLIC[name]), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})
