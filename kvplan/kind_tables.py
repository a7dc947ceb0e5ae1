"""Every rule table keyed by LayerKind, registered in one place (tests/test_kind_tables.py checks each covers
every kind, and that no table in the source is missing from here). Adding a kind: add it to LayerKind, give
it a spec class in kvplan/model/specs.py, then an entry in each table below."""

from __future__ import annotations

from collections.abc import Mapping

from kvplan.capacity import kv
from kvplan.engines import sglang, transformers, trtllm, vllm_kv
from kvplan.model import parse, specs
from kvplan.model.kinds import LayerKind
from kvplan.verify import alloc, decode

# (the table's qualified name, the table)
KIND_TABLES: tuple[tuple[str, Mapping[LayerKind, object]], ...] = (
    ("kvplan.model.specs.SPEC_CLASSES", specs.SPEC_CLASSES),
    ("kvplan.model.parse.SPEC_BUILDERS", parse.SPEC_BUILDERS),
    ("kvplan.capacity.kv.KIND_RULES", kv.KIND_RULES),
    ("kvplan.engines.vllm_kv.KIND_RULES", vllm_kv.KIND_RULES),
    ("kvplan.engines.sglang.KIND_RULES", sglang.KIND_RULES),
    ("kvplan.engines.transformers.KIND_RULES", transformers.KIND_RULES),
    ("kvplan.engines.trtllm.KIND_RULES", trtllm.KIND_RULES),
    ("kvplan.verify.alloc.ALLOCATORS", alloc.ALLOCATORS),
    ("kvplan.verify.alloc.FIRST_VISIBLE", alloc.FIRST_VISIBLE),
    ("kvplan.verify.decode.ATTENTION_HEADS", decode.ATTENTION_HEADS),
    ("kvplan.verify.decode.LAYER_STEPS", decode.LAYER_STEPS),
)
