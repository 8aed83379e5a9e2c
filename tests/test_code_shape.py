"""The shape the codebase keeps (issue 16): short functions that read top to bottom, a
trainer loop that is not the whole program, and one-letter module aliases nowhere."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_FUNCTION_LINES = 80  # from a def's first line to its last (ast lineno .. end_lineno)


def _sources(*folders: str) -> list[Path]:
    return [p for d in folders for p in sorted((REPO / d).rglob("*.py"))]


def test_no_function_in_grpo_core_or_pages_is_over_80_lines():
    long = []
    for path in _sources("grpo_core", "pages") + [REPO / "app.py", REPO / "asgi.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_no_module_is_imported_under_a_one_or_two_letter_alias():
    alias = re.compile(r"^\s*(from\s+\S+\s+)?import\s+\S+\s+as\s+([A-Z]{1,2})\s*(#.*)?$", re.M)
    found = [f"{p.relative_to(REPO)}: {m.group(0).strip()}" for p in _sources("grpo_core", "pages", "bench", "tests")
             + [REPO / "app.py", REPO / "asgi.py"] for m in alias.finditer(p.read_text(encoding="utf-8"))]
    assert found == []


# The CLI verbs' own output is printed (python -m grpo_core VERB); everything else logs.
PRINTS = {("train/launch.py", "train"), ("train/launch.py", "report_failure"), ("train/pilot.py", "_pilot_failed")}


def test_library_code_logs_and_only_cli_verbs_print():
    printed = []
    for path in _sources("grpo_core"):
        if path.name == "__main__.py":
            continue
        where = path.relative_to(REPO / "grpo_core").as_posix()

        def visit(node, function):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Call) and getattr(child.func, "id", None) == "print":
                    if not function.startswith("cli_") and (where, function) not in PRINTS:
                        printed.append(f"{where}:{child.lineno} in {function or 'module'}")
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                visit(child, inner)
        visit(ast.parse(path.read_text(encoding="utf-8")), "")
    assert printed == [], "library code prints; use logging.getLogger(__name__):\n" + "\n".join(printed)
