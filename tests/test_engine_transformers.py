"""The Transformers engine model: DynamicCache / StaticCache bytes, hand-derived."""

from __future__ import annotations

import pytest

from kvplan.engines.transformers import hf_cache_bytes
from kvplan.errors import InputError
from kvplan.sources.resolve import resolve_model


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


def test_mla_caches_the_compressed_latent():
    # DeepSeek-V2-Lite: Transformers caches kv_lora_rank 512 ("keys") + qk_rope_head_dim 64 ("values") in one
    # head: 576 x 2 B = 1,152 B per token per layer; 27 layers x 1,000 tokens = 31,104,000 B.
    est = hf_cache_bytes(_model("deepseek-ai/DeepSeek-V2-Lite"), seq_tokens=1000, dtype="bfloat16")
    assert est.total_bytes == 27 * 1000 * 1152 == 31_104_000


def test_chunked_layers_keep_chunk_minus_one():
    # Llama 4 Scout: 36 chunked (8,192-token chunks) + 12 global layers, 8 heads x (128 + 128) x 2 B = 4,096 B
    # per token-layer. After 10,000 tokens the chunked layers hold 8,191 (DynamicSlidingWindowLayer).
    est = hf_cache_bytes(_model("meta-llama/Llama-4-Scout-17B-16E-Instruct"), seq_tokens=10_000, dtype="bfloat16")
    assert est.total_bytes == 12 * 10_000 * 4096 + 36 * 8191 * 4096
    static = hf_cache_bytes(
        _model("meta-llama/Llama-4-Scout-17B-16E-Instruct"), seq_tokens=10, dtype="bfloat16", cache="static",
        max_cache_len=16_384,
    )
    assert static.total_bytes == 12 * 16_384 * 4096 + 36 * 8192 * 4096


def test_mamba2_state_whole_kernel_and_float32_ssm():
    # Nemotron-3-Nano: 23 Mamba2 layers, each conv (4096 + 2*8*128 = 6,144 channels) x kernel 4 x 2 B = 49,152 B
    # and ssm (64 heads, 64, 128) x 4 B (float32) = 2,097,152 B; 6 attention layers x 2 heads x 256 x 2 B
    # = 6,144 B per token; 23 MLP/MoE layers hold nothing. 1 x 1,000 tokens:
    # 23 x 2,146,304 + 1,000 x 6,144 = 55,508,992 B.
    est = hf_cache_bytes(_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"), seq_tokens=1000, dtype="bfloat16")
    assert est.total_bytes == 23 * (49_152 + 2_097_152) + 1000 * 6 * 2 * 256 * 2 == 55_508_992


def test_gated_deltanet_state_is_constant():
    # Qwen3-Next-80B: 36 DeltaNet layers, conv (2*16*128 + 32*128 = 8,192) x 4 x 2 B = 65,536 B and recurrent
    # (32, 128, 128) x 4 B = 2,097,152 B; 12 attention layers x 2 heads x (256 + 256) x 2 B = 24,576 B per token.
    # Two requests: the states double; 1,000 vs 2,000 tokens changes only the attention term.
    m = _model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    states = 36 * (65_536 + 2_097_152)
    assert hf_cache_bytes(m, seq_tokens=1000, batch=2, dtype="bfloat16").total_bytes == 2 * (states + 1000 * 24_576)
    assert hf_cache_bytes(m, seq_tokens=2000, batch=1, dtype="bfloat16").total_bytes == states + 2000 * 24_576


def test_unknown_cache_kind_is_an_input_error():
    with pytest.raises(InputError, match="--hf-cache must be one of dynamic, static"):
        hf_cache_bytes(_model("meta-llama/Llama-3.1-8B-Instruct"), seq_tokens=10, cache="paged")
