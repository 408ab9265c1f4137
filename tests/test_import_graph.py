"""The package's imports run one way: no module imports, however indirectly, one that imports it back.

The graph is read from the source (``ast``), so imports inside functions and under ``TYPE_CHECKING`` count as
well: a function-level import that hides a circle is still a circle, and a type that needs one is a room in the
wrong place. There is no circle, and none is allowed: any set of modules that import each other fails here, named
with the arrows inside it. (The package ``fl_lightning.config`` exports the schema alone; the loader, which reads
the algorithm registry whose modules import that schema, is imported from ``fl_lightning.config.loading``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "fl_lightning"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package's module that ``name`` (a module, or a name inside one) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                if target.startswith("fl_lightning"):
                    found = _resolve(target, modules)
                    if found and found != name:
                        graph[name].add(found)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_the_finder_sees_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [{"a", "b", "c"}]


def test_imports_run_one_way():
    graph = _graph()
    assert len(graph) > 100  # the package's modules were found
    circles = _circles(graph)
    arrows = ["; ".join(f"{a} -> {b}" for a in sorted(c) for b in sorted(graph[a] & c)) for c in circles]
    assert circles == [], arrows


ALLOWED_INSIDE_FUNCTIONS = REPO / "tests" / "imports_inside_functions.txt"


def _imports_inside_functions() -> set[str]:
    """``path -> module`` for every import of the package's own modules inside a function (each statement once)."""
    found: set[str] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        seen: set[int] = set()
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if id(node) in seen or not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                seen.add(id(node))
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                rel = str(path.relative_to(REPO))
                found.update(f"{rel} -> {n}" for n in names if n.startswith("fl_lightning"))
    return found


def test_imports_inside_functions_are_the_allowed_ones():
    """An import of the package's own inside a function hides an arrow from a reader of the module's head: each one
    is on the allow-list (tests/imports_inside_functions.txt, kept for a reason its function states: a heavy module
    a cheap path must not pay for, discovery, the config loader reading the registry). A new one fails here: import
    at the top, or add it to the list in the same change; an entry no longer needed fails too, so the list shrinks."""
    lines = ALLOWED_INSIDE_FUNCTIONS.read_text().splitlines()
    allowed = {line.strip() for line in lines if " -> " in line and not line.startswith("#")}
    found = _imports_inside_functions()
    assert not found - allowed, f"imports inside functions not on the allow-list: {sorted(found - allowed)}"
    assert not allowed - found, f"allow-list entries no longer found: {sorted(allowed - found)}"
