"""The exhaustive enum of layer kinds every consumer's rule table is keyed by (re-exported by specs.py)."""

from __future__ import annotations

from enum import Enum


class LayerKind(str, Enum):
    """Every kind of layer kvplan sizes. Exhaustive: each consumer keeps a rule table keyed by it (listed in
    kvplan/kind_tables.py), and a test fails when a table lacks a kind, so a new kind must say what every
    engine, allocator and renderer does with it."""

    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MLA = "mla"
    COMPRESSED_MLA = "compressed_mla"  # DeepSeek-V4: a latent window plus compressed entries (and an indexer)
    MAMBA = "mamba"  # Mamba (v1) or Mamba2 state
    LINEAR_ATTENTION = "linear_attention"  # gated DeltaNet state
    SHARED_KV = "shared_kv"  # reads another layer's KV (Gemma 3n)
    NO_CACHE = "none"  # an MLP-only or MoE-only layer of a hybrid stack

    # Print as the bare value ("mla"), as tables and JSON always have, on every Python version.
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return format(str(self.value), format_spec)

