"""The tables of docs/ that are generated from the code: design.md's layout, CLI verbs and metric
names, and trainer.md's built-in reward metrics.

Each table sits between `<!-- generated: NAME -->` and `<!-- /generated -->` in its document.
`python docs/tables.py --write` rewrites them from the tree as it is; `python docs/tables.py --check`
exits 1 naming each table that no longer matches the code (tests/test_docs_tables.py runs it).

The layout reads each module's docstring with `ast` (nothing is imported, so a torch module costs
nothing); the CLI is read from `grpo_core.__main__`'s own parser; the metric names from
`grpo_core/runs/names.py`, the help of a name being the comment on its line; the reward metrics
from their records (`grpo_core/tasks/metrics.py`).
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
TRAINER = REPO / "docs" / "trainer.md"
# The wings in the order imports flow (each imports only those before it); a wing not listed
# here still gets its rows, after these, so a new package never goes missing from the table.
WINGS = ("runs", "tasks", "analysis", "train", "dashboard", "integrations")
BEGIN = "<!-- generated: {} -->"
END = "<!-- /generated -->"
SECTION = re.compile(r"^#\s*-{3,}\s*(.*?)\s*-*\s*$")
if str(REPO) not in sys.path:  # `python docs/tables.py` puts docs/ first on the path, not the repository
    sys.path.insert(0, str(REPO))


def first_line(path: Path) -> str:
    """The first line of a module's docstring (what the module holds), ready for a table cell."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    return cell(doc.strip().splitlines()[0]) if doc and doc.strip() else "(no docstring)"


def cell(text: str) -> str:
    return text.replace("|", "\\|").strip()


def table(header: tuple[str, str], rows: list[tuple[str, str]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    return "\n".join(lines + [f"| {left} | {right} |" for left, right in rows])


# ---- layout -----------------------------------------------------------------------------------
def package_rows(package: Path, root: Path) -> list[tuple[str, str]]:
    """A package's own row (its __init__'s docstring), its modules, then its subpackages."""
    rows = []
    init = package / "__init__.py"
    if init.is_file():
        rows.append((f"**`{package.relative_to(root).as_posix()}/`**", first_line(init)))
    for module in sorted(p for p in package.glob("*.py") if p.name != "__init__.py"):
        rows.append((f"`{module.relative_to(root).as_posix()}`", first_line(module)))
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        rows += package_rows(sub, root)
    return rows


def layout_table(root: Path = REPO) -> str:
    """grpo_core/ (its top-level modules, then each wing in import order), then the Streamlit app
    (app.py, asgi.py, pages/)."""
    core = root / "grpo_core"
    rows = []
    for module in sorted(core.glob("*.py")):
        rows.append((f"`{module.relative_to(root).as_posix()}`", first_line(module)))
    packages = {p.name: p for p in core.iterdir() if (p / "__init__.py").is_file()}
    for name in [w for w in WINGS if w in packages] + sorted(set(packages) - set(WINGS)):
        rows += package_rows(packages[name], root)
    for page in [root / "app.py", root / "asgi.py", *sorted((root / "pages").glob("*.py"))]:
        if page.is_file():
            rows.append((f"`{page.relative_to(root).as_posix()}`", first_line(page)))
    return table(("Module", "What it holds (its docstring's first line)"), rows)


# ---- CLI --------------------------------------------------------------------------------------
def cli_table() -> str:
    """Every verb of `python -m grpo_core`, in --help's order, with its help line, from the parser itself."""
    from grpo_core.__main__ import add_verbs
    verbs = argparse.ArgumentParser(prog="grpo-health").add_subparsers()
    add_verbs(verbs)
    rows = [(f"`{name}`", cell(parser.description or "")) for name, parser in verbs.choices.items()]
    return table(("`python -m grpo_core ...`", "What it does"), rows)


# ---- metric names -----------------------------------------------------------------------------
def line_comments(source: str) -> dict[int, str]:
    """line number -> the comment on that line (tokenize: a '#' inside a string is not one)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}


def name_rows(path: Path) -> list[tuple[str, str]]:
    """(name, note) for each string constant and each function that builds a name, in the
    module's order, under the module's section comments (`# --- groups: ... ---`) as heading rows."""
    source = path.read_text(encoding="utf-8")
    notes = Notes(source)
    rows, heading, last_line = [], None, 0
    for node in ast.parse(source).body:
        heading = next((notes.sections[n] for n in sorted(notes.sections, reverse=True)
                        if last_line < n < node.lineno), heading)
        last_line = node.end_lineno
        row = name_row(node, notes)
        if row and heading:  # a section shows only when a name follows it
            rows.append((f"*{cell(heading)}*", ""))
            heading = None
        rows += [row] if row else []
    return rows


class Notes:
    """The comments of a module's source: section headings, and the note of the statement at a line
    (the comment on its last line, else the comment lines right above it)."""

    def __init__(self, source: str):
        self.lines = source.splitlines()
        self.comments = line_comments(source)
        self.sections = {n: SECTION.match(c).group(1) for n, c in self.comments.items() if SECTION.match(c)}

    def own_line(self, n: int) -> bool:
        return n in self.comments and n not in self.sections and self.lines[n - 1].lstrip().startswith("#")

    def of(self, node: ast.stmt) -> str:
        if node.end_lineno in self.comments and not self.own_line(node.end_lineno):
            return self.comments[node.end_lineno].lstrip("#").strip()
        above, n = [], node.lineno - 1
        while self.own_line(n):
            above.insert(0, self.comments[n].lstrip("#").strip())
            n -= 1
        return " ".join(above)


def name_row(node: ast.stmt, notes: Notes) -> tuple[str, str] | None:
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id.isupper():
            return f"`{node.value.value}` ({target.id})", cell(notes.of(node))
    if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
        example = name_of(node)
        if example is not None:
            doc = (ast.get_docstring(node) or "").split("\n\n")[0]
            return f"`{example}` ({node.name})", cell(" ".join(doc.split()))
    return None


def name_of(node: ast.FunctionDef) -> str | None:
    """What a name-building function returns for `<arg>` placeholders: its f-string with each
    argument shown as <argument>; None for a function that does not return one f-string."""
    returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
    if len(returns) != 1 or not isinstance(returns[0], ast.JoinedStr):
        return None
    parts = []
    for value in returns[0].values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
            parts.append(f"<{value.value.id}>")
        else:
            return None
    return "".join(parts)


def names_table(root: Path = REPO) -> str:
    rows = name_rows(root / "grpo_core" / "runs" / "names.py")
    return table(("Name (constant or function in `grpo_core/runs/names.py`)", "Note"), rows)


# ---- the document -----------------------------------------------------------------------------
def generate(root: Path = REPO) -> dict[str, str]:
    """design.md's tables: name -> its generated Markdown, from the tree under `root`."""
    return {"layout": layout_table(root), "cli": cli_table(), "metric names": names_table(root)}


def metrics_table() -> str:
    from grpo_core.tasks.metrics import docs_table
    return docs_table()


def documents(root: Path = REPO) -> dict[Path, dict[str, str]]:
    """Each document with its generated tables."""
    return {DESIGN: generate(root), TRAINER: {"built-in metrics": metrics_table()}}


def block(name: str, text: str) -> str:
    return f"{BEGIN.format(name)}\n{text}\n{END}"


def current(doc: str, name: str) -> str | None:
    """The text between a table's markers in `doc`, None when its markers are missing."""
    found = re.search(re.escape(BEGIN.format(name)) + r"\n(.*?)\n?" + re.escape(END), doc, re.S)
    return found.group(1) if found else None


def stale(doc: str, tables: dict[str, str]) -> list[str]:
    """The tables whose text in `doc` differs from the generated one (or whose markers are missing)."""
    return [name for name, text in tables.items() if current(doc, name) != text]


def rewrite(doc: str, tables: dict[str, str], doc_name: str = DESIGN.name) -> str:
    for name, text in tables.items():
        if current(doc, name) is None:
            raise SystemExit(f"{doc_name}: no '{BEGIN.format(name)}' ... '{END}' markers; add them where "
                             f"the {name} table goes, then run --write again")
        pattern = re.escape(BEGIN.format(name)) + r"\n.*?" + re.escape(END)
        doc = re.sub(pattern, lambda _: block(name, text), doc, count=1, flags=re.S)
    return doc


def main(argv: list[str] | None = None, root: Path = REPO) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated tables in place")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale table")
    ap.add_argument("--doc", type=Path, help="only this copy of design.md or trainer.md (by its file name)")
    args = ap.parse_args(argv)
    docs = documents(root)
    if args.doc:
        docs = {args.doc: next(tables for path, tables in docs.items() if path.name == args.doc.name)}
    behind = 0
    for path, tables in docs.items():
        doc = path.read_text(encoding="utf-8")
        if args.write:
            path.write_text(rewrite(doc, tables, path.name), encoding="utf-8")
            continue
        for name in stale(doc, tables):
            why = "is stale" if current(doc, name) is not None else f"has no '{BEGIN.format(name)}' markers"
            print(f"{path.name}: the generated {name} table {why}: run `python docs/tables.py --write`",
                  file=sys.stderr)
            behind += 1
    return 1 if behind else 0


if __name__ == "__main__":
    sys.exit(main())
