"""The Transformers engine model: DynamicCache / StaticCache bytes, hand-derived."""

from __future__ import annotations

import pytest

from kvplan.engines.hf import hf_cache_bytes
from kvplan.errors import InputError
from kvplan.resolve import resolve_model


def _model(name):
    return resolve_model(name, offline=True).model


def test_llama_dynamic_cache():
    # 32 layers x 8 heads x 128 x 2 (K, V) x 2 B x 1,000 tokens = 131,072,000 B.
    assert hf_cache_bytes(_model("meta-llama/Llama-3.1-8B-Instruct"), seq_tokens=1000).total_bytes == 131_072_000


def test_sliding_layers_keep_window_minus_one():
    # Gemma-2-9B: 21 sliding (window 4,096) + 21 full layers, 8 heads x 256 x 2 x 2 B = 16,384 B per token-layer
    # at batch 2. After 5,000 tokens: 21 x 5,000 x 16,384 + 21 x 4,095 x 16,384.
    est = hf_cache_bytes(_model("google/gemma-2-9b-it"), seq_tokens=5000, batch=2, dtype="bfloat16")
    assert est.total_bytes == 21 * 5000 * 16_384 + 21 * 4095 * 16_384


def test_static_cache_preallocates():
    m = _model("google/gemma-2-9b-it")
    est = hf_cache_bytes(m, seq_tokens=10, dtype="bfloat16", cache="static", max_cache_len=8192)
    # full layers: 8,192 tokens; sliding layers: min(4,096, 8,192) = 4,096; 8,192 B per token-layer at batch 1.
    assert est.total_bytes == 21 * 8192 * 8192 + 21 * 4096 * 8192


def test_unsupported_kinds_say_so():
    with pytest.raises(InputError, match="mla"):
        hf_cache_bytes(_model("deepseek-ai/DeepSeek-V2-Lite"), seq_tokens=10)
