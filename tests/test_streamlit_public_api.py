"""The dashboard uses Streamlit's public API only: no file of the app (app.py, pages/,
grpo_core/) imports one of Streamlit's internal modules (streamlit.runtime, ...) or reads
one of its private attributes (st._x, st.runtime..., PagesManager.uses_pages_directory).
A private attribute can change meaning or vanish in any Streamlit release; frame.py's
legacy-routing hand-over (frame.through_app) is built from public API and plain Python."""
import ast
import types
from pathlib import Path

import pytest
import streamlit

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([ROOT / "app.py", *ROOT.glob("pages/*.py"), *ROOT.glob("grpo_core/**/*.py")])
# Streamlit's documented modules (st.column_config, st.components.v1, st.connections, the
# exceptions the API raises, AppTest); every other streamlit.* module is internal.
PUBLIC = {"streamlit", "streamlit.column_config", "streamlit.components", "streamlit.components.v1",
          "streamlit.connections", "streamlit.errors", "streamlit.testing", "streamlit.testing.v1"}
# Internal names a reader of private state would spell out, whatever way it gets to them.
INTERNAL_NAMES = ("PagesManager", "uses_pages_directory", "get_script_run_ctx", "ScriptRunContext",
                  "script_run_context", "streamlit.runtime", "streamlit.web", "_mpa_v1")


def internal(attr: str) -> bool:
    """Whether streamlit.<attr> is private: a leading underscore, or an internal module."""
    value = getattr(streamlit, attr, None)
    return attr.startswith("_") or isinstance(value, types.ModuleType) and value.__name__ not in PUBLIC


def private_uses(source: str) -> list[str]:
    """What in this source reaches past Streamlit's public API, as 'line: what'."""
    tree = ast.parse(source)
    aliases = set()  # names bound to the streamlit package: `import streamlit as st`
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "streamlit" and a.name not in PUBLIC:
                    out.append(f"{node.lineno}: import {a.name}")
                if a.name == "streamlit":
                    aliases.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "streamlit":
            if node.module not in PUBLIC:
                out.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module == "streamlit":
                out += [f"{node.lineno}: from streamlit import {a.name}" for a in node.names if internal(a.name)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and internal(node.attr):
            out.append(f"{node.lineno}: {node.value.id}.{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr in INTERNAL_NAMES:
            out.append(f"{node.lineno}: .{node.attr}")
        text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else \
            node.id if isinstance(node, ast.Name) else node.name if isinstance(node, ast.alias) else ""
        out += [f"{node.lineno}: {name!r}" for name in INTERNAL_NAMES if name in text]
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_streamlit_api(path):
    assert private_uses(path.read_text()) == []


def test_the_files_checked_include_the_app_and_every_page():
    names = {str(p.relative_to(ROOT)) for p in FILES}
    assert {"app.py", "pages/live.py", "pages/runs.py", "pages/analysis.py", "pages/pilot.py",
            "grpo_core/dashboard/access.py", "grpo_core/dashboard/widget_state.py",
            "grpo_core/dashboard/frame.py"} <= names


@pytest.mark.parametrize("source, found", [
    ("from streamlit.runtime.pages_manager import PagesManager\n", ["from streamlit.runtime.pages_manager"]),
    ("import streamlit.runtime.scriptrunner as sr\n", ["import streamlit.runtime.scriptrunner"]),
    ("import streamlit as st\nx = st.runtime.exists()\n", ["st.runtime"]),
    ("import streamlit as stl\nstl._config.get_option('x')\n", ["stl._config"]),
    ("import streamlit as st\nif getattr(st, 'x').uses_pages_directory: pass\n", [".uses_pages_directory"]),
    ("import importlib\nm = importlib.import_module('streamlit.runtime.pages_manager')\n", ["'streamlit.runtime'"]),
    ("from streamlit import runtime\n", ["from streamlit import runtime"]),
])
def test_the_check_finds_each_way_of_reaching_private_state(source, found):
    hits = private_uses(source)
    assert hits and all(any(f in h for h in hits) for f in found), hits


def test_public_api_passes_the_check():
    ok = ("import streamlit as st\nfrom streamlit.errors import StreamlitAPIException\n"
          "from streamlit.testing.v1 import AppTest\n"
          "st.navigation([st.Page('a.py')]).run()\nst.session_state['x'] = st.column_config.TextColumn('a')\n")
    assert private_uses(ok) == []
