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
    for path in _sources("grpo_core", "pages") + [REPO / "app.py"]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_no_module_is_imported_under_a_one_or_two_letter_alias():
    alias = re.compile(r"^\s*(from\s+\S+\s+)?import\s+\S+\s+as\s+([A-Z]{1,2})\s*(#.*)?$", re.M)
    found = [f"{p.relative_to(REPO)}: {m.group(0).strip()}" for p in _sources("grpo_core", "pages", "bench", "tests")
             + [REPO / "app.py"] for m in alias.finditer(p.read_text(encoding="utf-8"))]
    assert found == []
