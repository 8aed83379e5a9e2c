"""What the dashboard accepts from a browser, and the optional access token.

The dashboard listens on 127.0.0.1 unless `serve --host` says otherwise. Whoever can
reach it can start and stop runs, so what a browser sends is checked here:

- Nothing typed in a browser is imported or executed. Custom reward functions
  (`reward.custom = "module:function"`) come only from a config file or `--set` on the
  trainer's side (`python -m grpo_core train`); a run started from the dashboard with
  one is refused.
- Paths typed in a form (model folder, JSONL dataset) must resolve, symlinks followed,
  inside an allowed place: the runs dir, the source checkout (none for an installed wheel),
  or a folder listed in $GRPO_HEALTH_ALLOWED_DIRS (separated by ':'). A model path must be an existing folder
  or .gguf file (or a shipped model's name, model_source.SHIPPED), a dataset an existing file; hub ids are for
  the CLI. `log.runs_dir` cannot be moved
  from a form. Run ids, preset names and upload names are checked where they are used
  (locations.check_run_id, presets.check_name, importers' run-id from the file name).
- With a token ($GRPO_HEALTH_TOKEN, or `serve --token`), every page asks for it first
  and shows nothing else until it matches (constant-time compare).
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from grpo_core.errors import ConfigError
from grpo_core.runs import model_source
from grpo_core.runs.config import RunConfig
from grpo_core.runs.locations import env, runs_dir, source_checkout

TOKEN_ENV = "GRPO_HEALTH_TOKEN"
ALLOWED_ENV = "GRPO_HEALTH_ALLOWED_DIRS"
REPO = source_checkout()  # None when grpo_core is an installed wheel: no repository to allow
LOOPBACK = ("127.0.0.1", "localhost", "::1")


# ---- access token ------------------------------------------------------------------------------
def expected_token() -> str:
    return os.environ.get(TOKEN_ENV, "")


def token_matches(typed: str | None, expected: str | None = None) -> bool:
    """True when no token is set, or `typed` equals it (compared in constant time)."""
    expected = expected_token() if expected is None else expected
    if not expected:
        return True
    return hmac.compare_digest((typed or "").encode(), expected.encode())


def is_loopback(host: str) -> bool:
    return host in LOOPBACK or host.startswith("127.")


# ---- paths typed in forms ------------------------------------------------------------------------
def allowed_roots(root=None) -> list[Path]:
    extra = [Path(p).expanduser() for p in env(ALLOWED_ENV, "").split(os.pathsep) if p.strip()]
    return [p.resolve() for p in (runs_dir(root), *([REPO] if REPO else []), *extra)]


def check_ui_path(field: str, value: str, kind: str, root=None) -> str:
    """A path typed in the dashboard -> its resolved absolute form, or ConfigError naming the
    field. kind: "dir" or "file"."""
    p = Path(value).expanduser()
    p = (p if p.is_absolute() else Path.cwd() / p).resolve()  # symlinks and '..' resolved before the check
    roots = allowed_roots(root)
    if not any(p.is_relative_to(r) for r in roots):
        raise ConfigError(f"{field} {value!r} is outside the folders the dashboard may read "
                          f"({', '.join(map(str, roots))}); move it there, add its folder to ${ALLOWED_ENV}, "
                          "or start the run from the terminal (python -m grpo_core train)")
    if kind == "dir" and not p.is_dir():
        raise ConfigError(f"{field} {value!r}: no such folder (from the dashboard, give an existing local "
                          "model folder; hub ids go in a config file for python -m grpo_core train)")
    if kind == "file" and not p.is_file():
        raise ConfigError(f"{field} {value!r}: no such file")
    return str(p)


def check_ui_config(cfg: RunConfig, root=None) -> RunConfig:
    """A config that came from a browser form: refuse code and out-of-bounds paths; the
    paths it keeps are replaced by their resolved form (what was checked is what runs)."""
    if cfg.reward.custom:
        names = ", ".join(f"reward.custom.{k}" for k in cfg.reward.custom)
        raise ConfigError(f"{names}: custom reward functions cannot be set from the dashboard (nothing typed "
                          "in a browser is imported or run); put them in a config file and start the run with "
                          "python -m grpo_core train --config FILE")
    here = runs_dir(root)
    if cfg.log.runs_dir and Path(cfg.log.runs_dir).expanduser().resolve() != here:
        raise ConfigError(f"log.runs_dir cannot be changed from the dashboard (runs go to {here})")
    if cfg.model.path in model_source.SHIPPED:  # a package's file, not a typed path: installed, or the pip line
        model_source.shipped_file(cfg.model.path)
    elif cfg.model.path:
        kind = "file" if cfg.model.path.endswith(".gguf") else "dir"
        cfg.model.path = check_ui_path("model.path", cfg.model.path, kind, root)
    if cfg.task.dataset:
        cfg.task.dataset = check_ui_path("task.dataset", cfg.task.dataset, "file", root)
    return cfg


def require_token():
    """Streamlit side (app.py and every page, so a page URL opened directly is guarded too):
    with a token set, show only a password box until it matches, once per browser session."""
    import time

    import streamlit as st
    expected = expected_token()
    if not expected or st.session_state.get("_grpo_token_ok"):
        return
    st.title("GRPO Health")
    typed = st.text_input("Access token", type="password", key="_grpo_token",
                          help="Set by whoever started the dashboard (serve --token or $GRPO_HEALTH_TOKEN)")
    if typed:
        if token_matches(typed, expected):
            st.session_state["_grpo_token_ok"] = True  # server-side only: a browser cannot set it
            st.rerun()
        time.sleep(1.0)  # slows guessing down
        st.error("That token does not match.")
    st.stop()
