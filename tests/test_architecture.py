"""ARCHITECTURE.md is checked against the code: the layer map against every import, and each "how to add"
list against the registries it describes (kind tables, engines, file formats, the GPU catalog)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from kvplan.check.evaluate import CHECKED_ENGINES
from kvplan.check.readers import FORMATS
from kvplan.engines import ENGINE_NAMES, get_engine, vllm_memory
from kvplan.hardware import gpus
from kvplan.kind_tables import KIND_TABLES
from tests.conftest import REPO
from tests.test_import_graph import import_graph

ARCH = (REPO / "ARCHITECTURE.md").read_text()
PATH = re.compile(r"`((?:kvplan|tests|docs|scripts|benchmarks)/[\w/<>.\-]+)`")
ADD_SECTIONS = ("An attention kind", "An engine", "A deployment-file format", "A GPU", "A KV cache dtype")


def section(title: str) -> str:
    """The text under `### title`, up to the next heading."""
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^#)", ARCH, re.S | re.M)
    assert match, f"ARCHITECTURE.md has no section '### {title}'"
    return match.group(1)


def steps(title: str) -> str:
    """The numbered list of files to touch, without the tables and notes that follow it."""
    lines = section(title).splitlines()
    out, inside = [], False
    for line in lines:
        if re.match(r"^\d+\. ", line):
            inside = True
        elif inside and line and not line.startswith(" "):
            break
        if inside:
            out.append(line)
    return "\n".join(out)


def table_row(text: str, first_cell: str) -> str:
    """The table row of `text` whose first cell holds `first_cell` (a name in backticks)."""
    rows = [line for line in text.splitlines() if line.startswith("|")
            and f"`{first_cell}`" in line.split("|")[1]]
    assert len(rows) == 1, f"expected one row for {first_cell!r}, found {len(rows)}"
    return rows[0]


def relative(path: str | Path) -> str:
    return Path(path).resolve().relative_to(REPO).as_posix()


def test_the_section_parser_sees_the_lists():
    # The checks below are only as good as the parsing: each list has its files, and stops at its end.
    assert "kvplan/model/kinds.py" in steps("An attention kind")
    assert "Where each registered engine" not in steps("An engine")
    assert steps("A GPU").count("\n") >= 4


def test_every_file_an_add_list_names_exists():
    for title in ADD_SECTIONS:
        for path in PATH.findall(section(title)):
            if "<" in path:  # a file to create: its folder must exist
                assert (REPO / path.split("<")[0]).is_dir(), path
            else:
                assert (REPO / path).exists(), f"ARCHITECTURE.md ({title}) names {path}, which does not exist"


def test_every_kind_table_is_in_the_attention_kind_list():
    text = steps("An attention kind")
    for name, _ in KIND_TABLES:
        module, table = name.rsplit(".", 1)
        path = module.replace(".", "/") + ".py"
        item = next((line for line in text.split("\n") if f"`{path}`" in line), None)
        assert item is not None, f"add {path} to ARCHITECTURE.md's 'An attention kind' list"
        assert f"`{table}`" in text, f"name {name} in ARCHITECTURE.md's 'An attention kind' list"
    assert "`kvplan/kind_tables.py`" in text


def _estimate_builders() -> set[str]:
    """Engine names with an options builder in `kvplan estimate` (the dict in _engine_options)."""
    tree = ast.parse((REPO / "kvplan/cli/estimate.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_engine_options":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Dict) and inner.keys:
                    return {str(k.value) for k in inner.keys if isinstance(k, ast.Constant)}
    raise AssertionError("kvplan/cli/estimate.py has no _engine_options builders")


def test_every_registered_engine_is_in_the_engine_list():
    assert "`kvplan/engines/__init__.py`" in steps("An engine")
    text = section("An engine")
    builders = _estimate_builders()
    options_help = (REPO / "kvplan/cli/options.py").read_text()
    for name in ENGINE_NAMES:
        engine = get_engine(name)
        row = table_row(text, name)
        cells = row.split("|")
        module = relative(inspect.getfile(type(engine)))
        assert f"`{module}`" in cells[2], f"{name}: its module {module} belongs in its row"
        assert name in builders, f"{name}: kvplan/cli/estimate.py builds no options for it"
        assert name in options_help, f"{name}: the --engine help in kvplan/cli/options.py does not name it"
        for cli_file in ("kvplan/cli/options.py", "kvplan/cli/estimate.py", "kvplan/cli/flags.py"):
            assert f"`{cli_file}`" in cells[3], f"{name}: {cli_file} maps its options"
        if name in CHECKED_ENGINES:
            for check_file in ("kvplan/check/build.py", "kvplan/check/fields.py", "kvplan/check/evaluate.py"):
                assert f'"{name}"' in (REPO / check_file).read_text(), f"{check_file} does not map {name}"
                assert f"`{check_file}`" in cells[4], f"{name}: {check_file} maps its options for check"
        else:
            assert "not read by `check`" in cells[4], f"{name}: check does not read it; the row must say so"


def test_every_registered_format_is_in_the_format_list():
    assert "`kvplan/check/readers/__init__.py`" in steps("A deployment-file format")
    text = section("A deployment-file format")
    for fmt in FORMATS:
        row = table_row(text, fmt.name)
        module = relative(inspect.getfile(fmt.read))
        assert f"`{module}`" in row, f"format {fmt.name} is read by {module}; its row must name it"


def test_the_gpu_list_names_the_catalog_files():
    text = steps("A GPU")
    assert f"`{relative(inspect.getfile(gpus))}`" in text and "`_CATALOG`" in text
    assert "`kvplan/hardware/prices.json`" in text
    assert f"`{relative(inspect.getfile(vllm_memory))}`" in text and "`NVLS_GPUS`" in text
    assert hasattr(gpus, "_CATALOG") and hasattr(vllm_memory, "NVLS_GPUS")


# --- the layer map ---------------------------------------------------------------------------------------------

def _layers() -> dict[str, int]:
    """Package -> layer, from the table under '## The layers'."""
    found: dict[str, int] = {}
    for line in ARCH.split("## The layers", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip().isdigit():
            for name in re.findall(r"`(kvplan(?:\.\w+)?)`", cells[2]):
                found[name] = int(cells[1])
    return found


def _contract() -> list[set[str]]:
    """The import-linter layers in pyproject.toml, bottom first, each as a set of packages."""
    text = (REPO / "pyproject.toml").read_text()
    block = re.search(r"^layers = \[\n(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has no import-linter layers list"
    layers = [line.strip().strip('",') for line in block.group(1).splitlines() if line.strip()]
    return [{f"kvplan.{name.strip()}" for name in layer.split("|")} for layer in reversed(layers)]


def _package(module: str) -> str:
    """kvplan.engines.vllm -> kvplan.engines; kvplan.api -> kvplan.api; kvplan -> kvplan."""
    return ".".join(module.split(".")[:2])


def test_the_layer_table_is_the_import_linter_contract():
    table = _layers()
    by_layer = [{p for p, n in table.items() if n == layer} for layer in range(max(table.values()) + 1)]
    assert by_layer == _contract()


def test_every_package_has_a_layer():
    packages = {_package(m) for m in import_graph(REPO / "kvplan")}
    placed = set(_layers()) | {"kvplan", "kvplan.__main__"}
    assert packages - placed == set(), "place these in ARCHITECTURE.md's layer table and pyproject's contract"


def test_nothing_imports_the_kind_table_registry():
    importers = [m for m, targets in import_graph(REPO / "kvplan").items() if "kvplan.kind_tables" in targets]
    assert importers == []
