"""No import cycles in kvplan: the graph of every `import` between kvplan modules, read from the source
(module level, inside functions and under TYPE_CHECKING alike), has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports (`from a.b import c` names a.b.c when c is a
    module, else a.b)."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each a cycle or a knot of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_kvplan_has_no_import_cycle() -> None:
    graph = import_graph(REPO / "kvplan")
    assert "kvplan.model.geometry" in graph["kvplan.model.parse"]  # the graph sees the imports it guards
    assert cycles(graph) == []


def test_the_model_package_imports_only_down_the_layers() -> None:
    # config_reader <- kinds <- layer_kinds <- geometry <- specs <- params <- parse: each imports only earlier ones.
    order = ["kvplan.model.config_reader", "kvplan.model.kinds", "kvplan.model.layer_kinds", "kvplan.model.geometry",
             "kvplan.model.specs", "kvplan.model.params", "kvplan.model.parse"]
    graph = import_graph(REPO / "kvplan")
    for i, module in enumerate(order):
        assert not graph[module] & set(order[i:]), module


def test_a_cycle_through_a_type_checking_import_is_found(tmp_path: Path) -> None:
    # params.py and parse.py once imported each other, one side only under TYPE_CHECKING: still a cycle.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "parse.py").write_text("from pkg import params\n")
    (pkg / "params.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.parse import Cfg\n"
    )
    (pkg / "other.py").write_text("import pkg.parse\n")
    assert cycles(import_graph(pkg)) == [["pkg.params", "pkg.parse"]]
