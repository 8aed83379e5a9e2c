"""The floor plan grpo_core keeps (issue 24), checked from the source with ast: no import cycle,
no torch below the trainer, no module of 600 lines, no private name used across modules, and
a docstring on every module whose first line says what it holds.

The wings, bottom up: errors <- runs <- tasks <- analysis <- {train, dashboard, integrations}
<- __main__ / pages. Each test fails with the list of what breaks the rule, file by file.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600  # a module this long or longer is two modules
NO_TORCH_WINGS = ("runs", "tasks", "analysis", "dashboard")  # what the pages and the CLI load without torch
HEAVY = ("torch", "transformers", "peft")  # plus any grpo_core.train module


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_modules() -> dict[str, Path]:
    """Every module of grpo_core (a package by its __init__), by dotted name."""
    return {module_name(p): p for p in sorted((REPO / "grpo_core").rglob("*.py"))}


def checked_files() -> list[Path]:
    """grpo_core/, pages/, app.py and asgi.py: the code the floor plan covers."""
    return [*core_modules().values(), *sorted((REPO / "pages").glob("*.py")), REPO / "app.py", REPO / "asgi.py"]


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def imported(tree: ast.Module, modules) -> list[tuple[int, str]]:
    """(line, module) for every import anywhere in the tree, inside functions too: `from a import b`
    counts as importing a.b when a.b is one of `modules`, else a."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if sub in modules else node.module))
    return found


def import_graph() -> dict[str, set[str]]:
    modules = core_modules()
    return {name: {m for _, m in imported(parse(path), modules) if m in modules and m != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected component of more than one module
    (Tarjan's algorithm, iterative: no recursion limit on a long chain)."""
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        comps.append(set(comp))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [cycle_in(graph, comp) for comp in comps]


def cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first)."""
    start = min(comp)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & comp):
            if child == start:
                return paths[node] + [start]
            if child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    return sorted(comp)


def test_no_import_cycle_among_grpo_core_modules():
    found = [" -> ".join(cycle) for cycle in cycles(import_graph())]
    assert found == [], "import cycles (imports inside functions count too):\n" + "\n".join(found)


def test_the_wings_below_the_trainer_never_import_torch_or_the_trainer():
    modules = core_modules()
    bad = []
    for name, path in modules.items():
        if name.split(".")[1:2] and name.split(".")[1] in NO_TORCH_WINGS:
            for line, mod in imported(parse(path), modules):
                if mod.split(".")[0] in HEAVY or mod == "grpo_core.train" or mod.startswith("grpo_core.train."):
                    bad.append(f"{rel(path)}:{line} imports {mod}")
    assert bad == [], "torch, transformers, peft or grpo_core.train below the trainer:\n" + "\n".join(bad)


def test_importing_every_module_of_those_wings_leaves_torch_unloaded():
    names = sorted(n for n in core_modules() if n.split(".")[1:2] and n.split(".")[1] in NO_TORCH_WINGS)
    script = ("import importlib, sys\n"
              f"for name in {names!r}:\n"
              "    try:\n"
              "        importlib.import_module(name)\n"
              "    except Exception as e:\n"
              "        print(f'{name}: does not import ({type(e).__name__}: {e})')\n"
              "    if 'torch' in sys.modules:\n"
              "        print(f'{name}: loads torch')\n"
              "        break\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", "importing the wings below the trainer:\n" + done.stdout.strip()


def test_no_module_has_600_lines_or_more():
    long = [f"{rel(p)}: {n} lines" for p in checked_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) >= MAX_MODULE_LINES]
    assert long == [], f"modules of {MAX_MODULE_LINES} lines or more:\n" + "\n".join(long)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_aliases(tree: ast.Module, modules) -> dict[str, str]:
    """Local name -> grpo_core module, for every import that binds a module (anywhere in the tree)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:  # import grpo_core.runs.store as store
                    names[alias.asname] = alias.name
                elif alias.name in modules:  # import grpo_core.runs.store binds grpo_core
                    names[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def private_uses(path: Path, modules) -> list[str]:
    tree = parse(path)
    aliases = module_aliases(tree, modules)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_core"):
            found += [f"{rel(path)}:{node.lineno} from {node.module} import {a.name}"
                      for a in node.names if is_private(a.name)]
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            head = dotted(node.value)
            if head is None:
                continue
            first, _, rest = head.partition(".")
            target = aliases.get(first)
            target = f"{target}.{rest}" if target and rest else target
            if target in modules:
                found.append(f"{rel(path)}:{node.lineno} {head}.{node.attr} ({target})")
    return found


def test_no_private_name_crosses_a_module_boundary():
    modules = core_modules()
    found = [use for path in checked_files() for use in private_uses(path, modules)]
    assert found == [], ("private names used from another module (make them public: drop the underscore):\n"
                         + "\n".join(found))


def test_every_module_says_what_it_holds_in_its_docstrings_first_line():
    """The first line is the module's row in docs/design.md's layout table, so it stands alone:
    the docstring's only line, or followed by a blank line (a summary line, PEP 257)."""
    bad = []
    for path in core_modules().values():
        doc = ast.get_docstring(parse(path))
        lines = doc.strip().splitlines() if doc else []
        if not lines:
            bad.append(f"{rel(path)}: no docstring")
        elif len(lines[0].split()) < 3:
            bad.append(f"{rel(path)}: first line too short to say what it holds: {lines[0]!r}")
        elif len(lines) > 1 and lines[1].strip():
            bad.append(f"{rel(path)}: first line runs on into the next: {lines[0]!r}")
    assert bad == [], "module docstrings:\n" + "\n".join(bad)
