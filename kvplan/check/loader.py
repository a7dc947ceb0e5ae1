"""Read untrusted YAML safely: size, document, alias, node and depth limits, and file:line on every error.

Only the standard YAML tags are accepted (no Python objects, no custom tags). Aliases are counted while the
file is composed, and every node is counted while it is expanded into Python values, so an alias bomb
(nine aliases nine levels deep expand to 9**9 strings) stops after MAX_NODES nodes, not after exhausting
memory. Mappings and sequences come back as `YMap` / `YList`, which remember the line of each entry.
"""

from __future__ import annotations

import re
import sys
from itertools import accumulate
from typing import Any

import yaml

from kvplan.check.templates import mask_templates
from kvplan.errors import DeploymentError
from kvplan.records import dataclass
from kvplan.sources.local_files import Refused, read_regular
from kvplan.units import MiB

MAX_FILE_BYTES = 5 * MiB  # the largest real manifest here is 20 KB; 5 MiB leaves room for generated bundles
MAX_DOCUMENTS = 1000
MAX_ALIASES = 1000  # alias uses per file; compose files use a handful of `<<: *defaults`
MAX_NODES = 100_000  # expanded nodes per document: ~0.2 s of work; the 20 KB KubeAI catalog has ~2,000
MAX_DEPTH = 100  # nesting; Kubernetes manifests nest about 15 deep
# Integers outside int64/uint64 are refused at their line: Kubernetes, Go and vLLM's own readers reject them, and
# a 309-digit max_model_len would otherwise overflow a float deep inside the evaluation.
_INT_RANGE = range(-(1 << 63), 1 << 64)

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("null", "bool", "int", "float", "str", "timestamp", "binary")}
_MAP_TAG = _TAG + "map"
_SEQ_TAG = _TAG + "seq"
_MERGE_TAG = _TAG + "merge"
# What YAML 1.1 itself forbids in a stream; we check first so binary input fails with a line number.
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class YMap(dict[Any, Any]):
    """A YAML mapping that remembers its own line and the line of each key (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class YList(list[Any]):
    """A YAML sequence that remembers its own line and the line of each item (1-based)."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


@dataclass(frozen=True)
class Document:
    """One YAML document of a file: its value, first line, and the Helm templates masked in the file."""

    file: str
    line: int
    data: Any
    templates: tuple[str, ...]


class _Limited(yaml.SafeLoader):
    """SafeLoader that counts aliases and nesting while composing."""

    def __init__(self, stream: str, file: str) -> None:
        super().__init__(stream)
        self.kvplan_file = file
        self.kvplan_aliases = 0
        self.kvplan_depth = 0
        self.kvplan_nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D401 - PyYAML hook
        if self.check_event(yaml.AliasEvent):
            self.kvplan_aliases += 1
            if self.kvplan_aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise DeploymentError(
                    f"{self.kvplan_file}:{mark.line + 1}: more than {MAX_ALIASES} YAML aliases; "
                    "refusing a possible alias bomb"
                )
        self.kvplan_depth += 1
        self.kvplan_nodes += 1
        try:
            if self.kvplan_nodes > MAX_NODES:
                mark = self.peek_event().start_mark
                raise DeploymentError(f"{self.kvplan_file}:{mark.line + 1}: more than {MAX_NODES:,} YAML nodes")
            if self.kvplan_depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise DeploymentError(
                    f"{self.kvplan_file}:{mark.line + 1}: YAML nested deeper than {MAX_DEPTH} levels"
                )
            return super().compose_node(parent, index)
        finally:
            self.kvplan_depth -= 1


def read_text(path: str) -> str:
    """The file as text, refused when too large, not a regular file, not UTF-8/UTF-16, or holding control bytes."""
    if path == "-":
        try:
            data = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise DeploymentError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise DeploymentError(
                f"{path}: more than {MAX_FILE_BYTES // MiB} MiB; kvplan reads deployment files up to that"
            )
    else:
        try:
            data = read_regular(path, MAX_FILE_BYTES, "deployment files")
        except Refused as exc:
            raise DeploymentError(f"{path}: {exc}") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        encoding = "utf-16"
    else:
        encoding = "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DeploymentError(
            f"{path}:{line}: not {encoding.split('-sig')[0].upper()} text (byte {exc.start} is "
            f"0x{data[exc.start]:02x}); is this a binary file?"
        ) from None
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise DeploymentError(
            f"{path}:{line}: control character U+{ord(bad.group()):04X} is not allowed in YAML; "
            "is this a binary file?"
        )
    return text


def load_documents(path: str, text: str | None = None) -> list[Document]:
    """Every non-empty YAML document of a file, with line-aware values; raises DeploymentError."""
    if text is None:
        text = read_text(path)
    masked, templates = mask_templates(text)
    # PyYAML's scanner does quadratic work per nested flow collection ("[[[[..." 1000 deep takes ~1 s), so
    # refuse deep bracket nesting before parsing. Brackets inside strings count too; real files nest < 10.
    brackets = _NOT_BRACKET.sub("", masked)
    if any(depth > MAX_DEPTH for depth in accumulate(map(_BRACKET_STEP.__getitem__, brackets))):
        raise DeploymentError(f"{path}: YAML nested deeper than {MAX_DEPTH} levels")
    loader = _Limited(masked, path)
    documents: list[Document] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if len(documents) >= MAX_DOCUMENTS:
                raise DeploymentError(f"{path}: more than {MAX_DOCUMENTS} YAML documents")
            if node is None:
                continue
            budget = [MAX_NODES]
            data = _to_python(node, path, budget, 0)
            if data is None:
                continue
            documents.append(Document(path, node.start_mark.line + 1, data, templates))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise DeploymentError(f"{path}:{line}: invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise DeploymentError(f"{path}: invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise DeploymentError(f"{path}: YAML nested too deeply to read") from None
    finally:
        loader.dispose()
    return documents


def _to_python(node: yaml.Node, path: str, budget: list[int], depth: int) -> Any:
    """Expand a composed node into YMap / YList / scalars, spending one unit of `budget` per node."""
    budget[0] -= 1
    line = node.start_mark.line + 1
    if budget[0] < 0:
        raise DeploymentError(
            f"{path}:{line}: YAML aliases expand to more than {MAX_NODES:,} nodes; refusing a possible alias bomb"
        )
    if depth > MAX_DEPTH:
        raise DeploymentError(f"{path}:{line}: YAML nested deeper than {MAX_DEPTH} levels (recursive alias?)")
    if isinstance(node, yaml.ScalarNode):
        if node.tag not in _SCALAR_TAGS:
            raise DeploymentError(f"{path}:{line}: unknown YAML tag {node.tag!r}; kvplan reads plain YAML only")
        if node.tag in (_TAG + "timestamp", _TAG + "binary"):
            return node.value
        return _scalar(node, path, line)
    if isinstance(node, yaml.SequenceNode):
        if node.tag != _SEQ_TAG:
            raise DeploymentError(f"{path}:{line}: unknown YAML tag {node.tag!r}; kvplan reads plain YAML only")
        seq = YList()
        seq.line = line
        seq.item_lines = []
        for child in node.value:
            seq.append(_to_python(child, path, budget, depth + 1))
            seq.item_lines.append(child.start_mark.line + 1)
        return seq
    if isinstance(node, yaml.MappingNode):
        if node.tag != _MAP_TAG:
            raise DeploymentError(f"{path}:{line}: unknown YAML tag {node.tag!r}; kvplan reads plain YAML only")
        mapping = YMap()
        mapping.line = line
        mapping.key_lines = {}
        explicit: list[tuple[Any, Any, int]] = []
        key_seen: dict[tuple[type, Any], int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                # `<<: *defaults` (or a list of them): merged keys come first, explicit keys override.
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    merged = _to_python(source, path, budget, depth + 1)
                    if not isinstance(merged, YMap):
                        raise DeploymentError(f"{path}:{line}: a `<<` merge needs a mapping")
                    for key, value in merged.items():
                        mapping[key] = value
                        mapping.key_lines[key] = merged.line_of(key)
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise DeploymentError(
                    f"{path}:{key_node.start_mark.line + 1}: a mapping key must be a plain value "
                    "(an unquoted `{{ ... }}`?)"
                )
            key = _to_python(key_node, path, budget, depth + 1)
            value = _to_python(value_node, path, budget, depth + 1)
            key_line = key_node.start_mark.line + 1
            if (type(key), key) in key_seen:
                # YAML keeps the last value without a word; Kubernetes and compose refuse the file.
                raise DeploymentError(
                    f"{path}:{key_line}: duplicate key '{key}' (first at line {key_seen[type(key), key]}); "
                    "keep one of them"
                )
            key_seen[type(key), key] = key_line
            explicit.append((key, value, key_line))
        for key, value, key_line in explicit:
            mapping[key] = value
            mapping.key_lines[key] = key_line
        return mapping
    raise DeploymentError(f"{path}:{line}: unsupported YAML node")


def _scalar(node: yaml.ScalarNode, path: str, line: int) -> Any:
    """One plain scalar, with integers bounded (a 5000-digit integer is beyond Python's int() limit)."""
    try:
        value = _SCALARS.yaml_constructors[node.tag](_SCALARS, node)
    except (ValueError, OverflowError):
        raise DeploymentError(
            f"{path}:{line}: a number of {len(node.value):,} characters cannot be read; write a value in range"
        ) from None
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT_RANGE:
        raise DeploymentError(
            f"{path}:{line}: the integer {str(value)[:20]}... ({len(str(abs(value))):,} digits) is beyond the "
            "64-bit range that Kubernetes and the engines read"
        )
    return value


# SafeConstructor's scalar functions, called directly (no memo of nodes kept between files).
_SCALARS = yaml.SafeLoader("")
