"""docs/design.md's generated tables (layout, CLI, metric names) match the code: a module, a verb
or a metric name added without `python docs/tables.py --write` fails here, naming the table."""
from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "docs" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tree(tmp_path):
    """A copy of the sources the layout table reads (grpo_core/, pages/, app.py)."""
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in ("grpo_core", "pages"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=ignore)
    shutil.copy(REPO / "app.py", tmp_path / "app.py")
    return tmp_path


def test_design_md_tables_match_the_code(tables, capsys):
    rc = tables.main(["--check"])
    assert rc == 0, capsys.readouterr().err + "run `python docs/tables.py --write`"


def test_a_module_added_without_regenerating_makes_the_layout_stale(tables, tree):
    (tree / "grpo_core" / "runs" / "new_part.py").write_text('"""A part nobody listed yet."""\n')
    doc = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    layout = tables.layout_table(tree)
    assert "| `grpo_core/runs/new_part.py` | A part nobody listed yet. |" in layout
    assert tables.stale(doc, {"layout": layout}) == ["layout"]
    assert tables.stale(tables.rewrite(doc, {"layout": layout}), {"layout": layout}) == []


def test_every_module_is_in_the_layout_table_with_its_first_line(tables):
    layout = tables.layout_table()
    sources = [*sorted((REPO / "grpo_core").rglob("*.py")), REPO / "app.py", *sorted((REPO / "pages").glob("*.py"))]
    for path in sources:
        if "__pycache__" in path.parts:
            continue
        name = path.relative_to(REPO).as_posix()
        package = path.name == "__init__.py" and path.parent != REPO / "grpo_core"  # a wing: its own bold row
        shown = f"**`{path.parent.relative_to(REPO).as_posix()}/`**" if package else f"`{name}`"
        assert f"| {shown} | {tables.first_line(path)} |" in layout, name


def test_the_cli_table_lists_every_verb_of_the_parser(tables):
    from grpo_core.__main__ import build_parser

    cli = tables.cli_table()
    usage = build_parser().format_usage()
    verbs = usage[usage.index("{") + 1:usage.index("}")].split(",")
    assert len(verbs) >= 12 and {"train", "watch", "prompts", "export", "serve"} <= set(verbs)
    rows = [line.split("|")[1].strip().strip("`") for line in cli.splitlines()[2:]]
    assert rows == verbs


def test_the_names_table_has_every_name_constant_with_its_string(tables):
    from grpo_core.runs import names

    table = tables.names_table()
    source = (REPO / "grpo_core" / "runs" / "names.py").read_text(encoding="utf-8")
    constants = [node.targets[0].id for node in ast.parse(source).body if isinstance(node, ast.Assign)
                 and isinstance(node.targets[0], ast.Name) and isinstance(getattr(names, node.targets[0].id), str)]
    assert len(constants) > 30
    for constant in constants:
        assert f"| `{getattr(names, constant)}` ({constant}) |" in table, constant
    assert "| `reward/<metric>/mean` (metric_mean) |" in table
    assert "| `data/scoring_errors` (SCORING_ERRORS) | rollouts whose metric raised or gave NaN/inf |" in table


def fresh_copy(tables, tmp_path) -> Path:
    """docs/design.md copied and regenerated: every table current, whatever the repository's copy says."""
    doc = tmp_path / "design.md"
    shutil.copy(REPO / "docs" / "design.md", doc)
    assert tables.main(["--write", "--doc", str(doc)]) == 0
    return doc


def test_check_names_the_stale_table_and_write_fixes_it(tables, tmp_path, capsys):
    doc = fresh_copy(tables, tmp_path)
    text = doc.read_text(encoding="utf-8")
    doc.write_text(text.replace("| `train/reward` (REWARD) |", "| `train/old_reward` (REWARD) |"), encoding="utf-8")
    assert tables.main(["--check", "--doc", str(doc)]) == 1
    err = capsys.readouterr().err
    assert "metric names table is stale" in err and "layout" not in err and "cli" not in err
    assert tables.main(["--write", "--doc", str(doc)]) == 0
    assert tables.main(["--check", "--doc", str(doc)]) == 0


def test_check_names_a_table_whose_markers_are_missing(tables, tmp_path, capsys):
    doc = fresh_copy(tables, tmp_path)
    doc.write_text(doc.read_text(encoding="utf-8").replace("<!-- generated: cli -->", ""), encoding="utf-8")
    assert tables.main(["--check", "--doc", str(doc)]) == 1
    assert "cli table has no '<!-- generated: cli -->' markers" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no '<!-- generated: cli -->'"):
        tables.main(["--write", "--doc", str(doc)])
