"""Layer kinds are exhaustive: every rule table has an entry for every LayerKind, every table is registered,
every kind has exactly one spec class, and nothing dispatches with isinstance on a spec class."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from kvplan.kind_tables import KIND_TABLES
from kvplan.model import specs
from kvplan.model.kinds import LayerKind
from tests.conftest import REPO

SOURCES = sorted((REPO / "kvplan").rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("name, table", KIND_TABLES, ids=[name for name, _ in KIND_TABLES])
def test_every_table_has_an_entry_for_every_layer_kind(name: str, table: dict) -> None:
    missing = [kind.value for kind in LayerKind if kind not in table]
    assert not missing, f"{name} has no rule for {missing}"
    assert set(table) == set(LayerKind)


def test_the_registry_names_each_table_as_it_is_defined() -> None:
    for name, table in KIND_TABLES:
        module, attr = name.rsplit(".", 1)
        assert getattr(importlib.import_module(module), attr) is table, name


def _tables_in_source(path: Path) -> list[str]:
    """Module-level names annotated as a dict keyed by LayerKind: `KIND_RULES: dict[LayerKind, ...] = {...}`."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation).replace(" ", "")
            if annotation.startswith(("dict[LayerKind,", "Mapping[LayerKind,")):
                found.append(f"{_module_name(path)}.{node.target.id}")
    return found


def test_every_kind_table_in_the_source_is_registered() -> None:
    in_source = {name for path in SOURCES for name in _tables_in_source(path)}
    registered = {name for name, _ in KIND_TABLES}
    # The scan must see the tables it is meant to guard, or this test could not fail.
    assert "kvplan.engines.vllm_kv.KIND_RULES" in in_source
    assert in_source - registered == set(), "add these tables to kvplan/kind_tables.py"
    assert registered - in_source == set()


def _concrete_spec_classes() -> set[type]:
    out: set[type] = set()
    todo = [specs.LayerSpec]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if "kind" in vars(sub):  # states its own kind: a concrete kind, not a shared-field base
                out.add(sub)
    return out


def test_each_kind_has_one_spec_class_that_states_it() -> None:
    assert {cls.kind for cls in specs.SPEC_CLASSES.values()} == set(LayerKind)
    assert all(cls.kind == kind for kind, cls in specs.SPEC_CLASSES.items())
    # A spec class added without a SPEC_CLASSES entry (and so without a kind of its own) fails here.
    assert _concrete_spec_classes() == set(specs.SPEC_CLASSES.values())


def test_spec_classes_are_siblings_not_subclasses_of_each_other() -> None:
    concrete = list(specs.SPEC_CLASSES.values())
    for a in concrete:
        for b in concrete:
            assert a is b or not issubclass(a, b), f"{a.__name__} subclasses {b.__name__}"


def _isinstance_on_specs(source: str, spec_names: set[str]) -> list[int]:
    """Lines of `isinstance(x, SomeSpec)` (or a tuple holding one) in `source`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            names = {n.id for arg in node.args[1:] for n in ast.walk(arg) if isinstance(n, ast.Name)}
            if names & spec_names:
                lines.append(node.lineno)
    return lines


def test_the_isinstance_scan_finds_a_ladder() -> None:
    ladder = "def f(s, x):\n    if isinstance(x, int):\n        return 0\n    return isinstance(s, (A, MLASpec))\n"
    assert _isinstance_on_specs(ladder, {"MLASpec"}) == [4]


def test_nothing_in_kvplan_dispatches_on_a_spec_class_with_isinstance() -> None:
    spec_names = {name for name, obj in vars(specs).items()
                  if isinstance(obj, type) and issubclass(obj, specs.LayerSpec)}
    assert {"FullAttentionSpec", "AttentionSpec", "StateSpec"} <= spec_names
    hits = [f"{path.relative_to(REPO)}:{line}" for path in SOURCES
            for line in _isinstance_on_specs(path.read_text(), spec_names)]
    assert hits == [], "dispatch on spec.kind through a kind table instead"


def test_every_memory_term_an_engine_names_has_a_printed_name() -> None:
    # The table prints a term by its _TERM_NAMES entry; a term without one would print as its key
    # ("draft_buffers"). Every MemoryTerm("<name>", ...) written in kvplan/ must have an entry.
    from kvplan.cli.render import _TERM_NAMES

    named = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "MemoryTerm" and node.args
                    and isinstance(node.args[0], ast.Constant)):
                named.add(node.args[0].value)
    assert {"weights", "draft_buffers"} <= named
    assert named <= set(_TERM_NAMES), sorted(named - set(_TERM_NAMES))
