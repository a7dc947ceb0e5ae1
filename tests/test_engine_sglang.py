"""The SGLang engine model: mem_fraction_static of the memory free before load, token pool, MLA, SWA pool."""

from __future__ import annotations

import pytest

from kvplan.engines.sglang import CONTEXT_BYTES, SWA_FULL_TOKENS_RATIO, plan_sglang
from kvplan.engines.vllm_memory import weights_per_stage
from kvplan.errors import InputError
from kvplan.hardware.gpus import custom_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB

GPU = custom_gpu(80 * GiB)


def _model(name):
    return resolve_model(name, offline=True).model


def test_token_pool_formula_llama():
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    r = plan_sglang(m, GPU, mem_fraction_static=0.85)
    free = 80 * GiB - CONTEXT_BYTES
    weights = weights_per_stage(m, dtype="bfloat16", tp=1, pp=1, quantization=None)[0][0]
    rest = free - weights - round(free * (1 - 0.85))
    # cell = 32 layers x 8 heads x 128 x 2 (K, V) x 2 B = 131,072 B per token.
    assert r.cell_size_bytes == 131_072
    assert r.available_kv_bytes == rest
    assert r.max_total_num_tokens == rest // 131_072


def test_page_size_rounds_down():
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    r = plan_sglang(m, GPU, mem_fraction_static=0.85, page_size=64)
    assert r.max_total_num_tokens % 64 == 0
    assert r.max_total_num_tokens > plan_sglang(m, GPU, mem_fraction_static=0.85).max_total_num_tokens - 64


def test_mla_not_divided_by_tp():
    # DeepSeek-V2-Lite: 27 layers x (512 + 64) x 2 B = 31,104 B per token at any TP.
    m = _model("deepseek-ai/DeepSeek-V2-Lite")
    assert plan_sglang(m, GPU, tp=1).cell_size_bytes == 31_104
    assert plan_sglang(m, GPU, tp=2).cell_size_bytes == 31_104


def test_sliding_window_pool():
    m = _model("google/gemma-2-9b-it")
    r = plan_sglang(m, GPU, mem_fraction_static=0.85)
    # 21 full + 21 sliding layers, 8 KV heads x 256 x 2 x 2 B = 8,192 B per layer per token.
    assert r.cell_size_bytes == r.swa_cell_size_bytes == 21 * 8192
    assert r.max_total_num_tokens == int(r.available_kv_bytes // (21 * 8192 * (1 + SWA_FULL_TOKENS_RATIO)))
    assert r.swa_max_total_num_tokens == int(r.max_total_num_tokens * SWA_FULL_TOKENS_RATIO)


def test_bad_fraction():
    with pytest.raises(InputError, match="mem-fraction-static"):
        plan_sglang(_model("meta-llama/Llama-3.1-8B-Instruct"), GPU, mem_fraction_static=1.5)


def test_pool_bytes_for_tokens_include_the_sliding_pool_share():
    # gemma-2-9b: each full-attention token (21 x 8,192 B) brings 0.8 sliding-window tokens (21 x 8,192 B each).
    r = plan_sglang(_model("google/gemma-2-9b-it"), GPU, mem_fraction_static=0.85)
    assert r.kv_bytes_for_tokens(1000) == round(1000 * 21 * 8192 * (1 + SWA_FULL_TOKENS_RATIO))
