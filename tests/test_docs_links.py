"""Every relative link in the README and docs/ names a file of the repository, and nothing
points outside it (the design document lives in docs/design.md)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_relative_links_resolve_inside_the_repository():
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for doc in docs:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() or REPO not in path.parents:
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert broken == []


def test_no_source_points_at_the_design_document_outside_the_repository():
    sources = [REPO / "app.py", *[p for d in ("grpo_core", "pages", "bench") for p in (REPO / d).rglob("*.py")]]
    hits = [str(p.relative_to(REPO)) for p in sources if "../shared/" in p.read_text(encoding="utf-8")]
    assert hits == [] and (REPO / "docs" / "design.md").is_file()


def test_the_readme_is_a_front_door_that_links_every_document():
    """The README is what it is, the two commands, the first minutes, the main paths and an index:
    at most 320 lines, with every document of docs/ linked from it (where the rest lives)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 320
    documents = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert documents - set(LINK.findall(text)) == set()
