"""Every module of the package imports, and no two modules import each other in a circle.

The import graph is read from the source (the AST), not from what Python happens to run:
every ``import`` and ``from ... import`` anywhere in a module counts, including those
under ``if TYPE_CHECKING:`` and inside functions. A circle that only type checking or a
deferred import keeps from failing at import time is still a circle in the design: the
two modules cannot be understood, tested or moved apart (docs/architecture.md).

How an import becomes an edge:

* ``import a.b.c`` is an edge to ``a.b.c``; ``from a.b import c`` is an edge to the
  submodule ``a.b.c`` when there is one, else to ``a.b`` (``c`` is a name defined there).
  Relative imports are resolved against the importing module's package.
* Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``; those are not edges,
  or every module importing a sibling would form a circle with its own package.
* The one exception: a package's ``__init__`` may import its own submodules under
  ``if TYPE_CHECKING:``. That is how ``fqbroker/__init__.py`` declares the names it
  re-exports lazily (``_LAZY``: imported on first use, once the package is complete), and
  a submodule may still import the package for its version. Any other import in an
  ``__init__`` is an edge like everywhere else.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pkgutil
import subprocess
import sys
import textwrap
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import fqbroker
from fqbroker import accel

PACKAGE = "fqbroker"
# The spark data source needs the spark extra; the broker never imports it.
OPTIONAL = {"fqbroker.spark": "pyspark"}


@dataclass(frozen=True)
class Edge:
    target: str
    line: int
    how: str  # "", "TYPE_CHECKING" or "in a function": where the import statement is


def package_modules() -> dict[str, Path]:
    """Every module of the package (name -> source file), optional ones when installed."""
    found = {PACKAGE: Path(fqbroker.__file__)}
    for info in pkgutil.walk_packages(fqbroker.__path__, PACKAGE + "."):
        # The compiled accelerator's shared library has no source (fqbroker/accel.py).
        if _missing_prerequisite(info.name) or info.name == accel.LIBRARY:
            continue
        spec = importlib.util.find_spec(info.name)
        assert spec is not None and spec.origin is not None, info.name
        # A compiled module's imports are its source's.
        compiled = info.name in accel.MODULES
        found[info.name] = Path(accel.source_path(info.name) if compiled else spec.origin)
    return found


def _missing_prerequisite(name: str) -> bool:
    for prefix, needs in OPTIONAL.items():
        if (name == prefix or name.startswith(prefix + ".")) and not importlib.util.find_spec(
            needs
        ):
            return True
    return False


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> list[Edge]:
    """The edges from ``module`` (its source text) to modules in ``known``."""
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    edges: list[Edge] = []

    def add(target: str, node: ast.stmt, how: str) -> None:
        # The longest known prefix: ``import a.b.c`` where c is a function is an edge to a.b.
        while target and target not in known:
            target = target.rpartition(".")[0]
        if not target or target == module:
            return
        if is_package and how == "TYPE_CHECKING" and target.startswith(module + "."):
            return  # a lazy re-export's declaration (see the module docstring)
        edges.append(Edge(target, node.lineno, how))

    def visit(nodes: Iterable[ast.AST], how: str) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node, how)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, package)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    add(sub if sub in known else base, node, how)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(node.body, "TYPE_CHECKING")
                visit(node.orelse, how)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(ast.iter_child_nodes(node), how or "in a function")
            else:
                visit(ast.iter_child_nodes(node), how)

    visit(ast.parse(source).body, "")
    return edges


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph() -> dict[str, list[Edge]]:
    modules = package_modules()
    return {
        name: imports_of(path.read_text(), name, path.name == "__init__.py", modules)
        for name, path in modules.items()
    }


# --- finding circles -------------------------------------------------------------------------


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The groups of nodes that reach each other (Tarjan), each of two or more nodes or one
    that imports itself; sorted, so the report reads the same every run."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(start: str) -> None:
        # Iterative: the package's import chains are short, but a test should not depend on it.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1 or node in graph.get(node, ()):
                        groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(groups)


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Circles to show, modules in import order: within each strongly connected group, the
    shortest circle through each member, each circle once. Every module of a group is in
    at least one of them; breaking them all breaks the group."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    for group in strongly_connected(graph):
        members = set(group)
        for start in group:
            circle = _shortest_circle(graph, start, members)
            i = circle.index(min(circle))  # the same circle from another start: once
            key = tuple(circle[i:] + circle[:i])
            if key not in seen:
                seen.add(key)
                found.append(list(key))
    return found


def _shortest_circle(graph: Mapping[str, Iterable[str]], start: str, within: set[str]) -> list[str]:
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for child in sorted(graph.get(node, ())):
            if child not in within:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if child not in came_from:
                came_from[child] = node
                todo.append(child)
    raise AssertionError(f"{start} is in a strongly connected group but on no circle")


def describe(circle: list[str], graph: Mapping[str, list[Edge]]) -> str:
    steps = []
    for i, module in enumerate(circle):
        target = circle[(i + 1) % len(circle)]
        where = dict.fromkeys(
            f"{e.line}{f' {e.how}' if e.how else ''}" for e in graph[module] if e.target == target
        )
        steps.append(f"  {module} (line {', '.join(where)}) ->")
    return "\n".join([*steps, f"  {circle[0]}"])


# --- the tests -------------------------------------------------------------------------------


def test_every_module_imports_on_its_own() -> None:
    # In a fresh interpreter, the package's modules forgotten before each one, so an import
    # that works only after another module was loaded shows up. ``__main__`` modules run a
    # program when imported: their imports are in the graph test.
    names = sorted(n for n in package_modules() if not n.endswith(".__main__"))
    script = textwrap.dedent(
        """
        import importlib, sys, traceback
        failed = []
        for name in sys.argv[1:]:
            for loaded in [m for m in sys.modules if m.split(".")[0] == "fqbroker"]:
                del sys.modules[loaded]
            try:
                importlib.import_module(name)
            except Exception:
                failed.append(name + ":\\n" + traceback.format_exc(limit=-3))
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
        """
    )
    # Pure Python: a module compiled with mypyc cannot be imported again once forgotten,
    # and what a module imports is its source's either way (fqbroker/accel.py).
    env = {**os.environ, accel.ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 30 and "fqbroker.core.router" in graph  # the walk found the package
    targets = {name: [e.target for e in edges] for name, edges in graph.items()}
    found = cycles(targets)
    groups = "\n".join(
        f"  {len(group)} modules: {', '.join(group)}" for group in strongly_connected(targets)
    )
    report = "\n\n".join(describe(circle, graph) for circle in found)
    assert not found, (
        f"modules that import each other, in a circle:\n{groups}\n\n"
        f"{len(found)} circles (module, line of the import ->):\n{report}"
    )


def test_cycle_finder_on_a_small_graph() -> None:
    graph = {
        "a": ["b"],
        "b": ["c", "d"],
        "c": ["a"],  # a -> b -> c -> a
        "d": ["e"],
        "e": ["d"],  # d <-> e, reached from the first circle but not part of it
        "f": ["a"],  # into a circle, on none
        "g": ["g"],  # imports itself
        "h": [],
    }
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"], ["g"]]
    assert cycles(graph) == [["a", "b", "c"], ["d", "e"], ["g"]]
    assert cycles({"a": ["b"], "b": ["c"], "c": []}) == []
    # Two circles sharing a module: each member is on a reported circle.
    two = cycles({"x": ["y", "z"], "y": ["x"], "z": ["x"]})
    assert two == [["x", "y"], ["x", "z"]]


def test_edges_from_source() -> None:
    known = {
        "pkg",
        "pkg.a",
        "pkg.b",
        "pkg.sub",
        "pkg.sub.c",
        "pkg.sub.d",
        "other",
    }
    source = textwrap.dedent(
        """
        from __future__ import annotations
        import os
        import pkg.a
        from pkg import b, helper
        from typing import TYPE_CHECKING
        from . import d
        from .. import a
        from ..a import name
        if TYPE_CHECKING:
            from pkg.sub import d as typed
        def later():
            import other
        """
    )
    edges = imports_of(source, "pkg.sub.c", False, known)
    assert [(e.target, e.how) for e in edges] == [
        ("pkg.a", ""),
        ("pkg.b", ""),
        ("pkg", ""),  # helper is a name in pkg, not a module
        ("pkg.sub.d", ""),
        ("pkg.a", ""),
        ("pkg.a", ""),
        ("pkg.sub.d", "TYPE_CHECKING"),
        ("other", "in a function"),
    ]
    # A package's __init__: its own submodules under TYPE_CHECKING are lazy re-exports, not
    # edges; anything else it imports is.
    init = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from pkg.a import x
        if TYPE_CHECKING:
            from pkg.b import y
            from other import z
        """
    )
    assert [e.target for e in imports_of(init, "pkg", True, known)] == ["pkg.a", "other"]


def test_every_name_the_package_exports_resolves() -> None:
    # fqbroker's lazy names (Broker, Client, Message) name their modules in strings,
    # which no import statement checks: each must load, from a fresh interpreter.
    code = "import fqbroker; [getattr(fqbroker, n) for n in fqbroker.__all__]"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(fqbroker.__file__).parents[1])
