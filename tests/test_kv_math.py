"""The textbook KV figures, exactly, and the per-kind mechanisms (window, MLA, TP, PP, paging, prefix)."""

from __future__ import annotations

import pytest

from kvplan.capacity.kv import KvRequest, estimate_kv, pp_stage_layers
from kvplan.model.dtypes import BFLOAT16, FLOAT16, FP8_E4M3, INT4, INT8, NVFP4
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB, MiB
from tests.factories import model


@pytest.mark.parametrize(
    "seq, expected",
    [
        # 2 (K,V) * 32 layers * 4096 d_model * 2 B = 524,288 B = 512 KiB per token.
        (512, 256 * MiB),  # 512 * 512 KiB
        (2048, 1 * GiB),  # 2048 * 512 KiB
        (4096, 2 * GiB),
        (32768, 16 * GiB),
    ],
)
def test_llama2_7b_per_request(seq, expected):
    est = estimate_kv(model(), FLOAT16, KvRequest(seq_tokens=seq))
    assert est.model_bytes_per_token == 524_288
    assert est.model_contiguous_bytes_per_request == expected
    assert est.paged_bytes_per_request == expected  # seq is a multiple of 16: no rounding


def test_llama2_7b_sixteen_requests_at_32k():
    # 16 requests * 16 GiB = 256 GiB.
    est = estimate_kv(model(), FLOAT16, KvRequest(seq_tokens=32768, batch=16))
    assert est.model_batch_contiguous_bytes == 256 * GiB
    assert est.batch_paged_bytes == 256 * GiB


def test_gqa_8_heads_bf16():
    # 2 * 32 layers * 8 KV heads * 128 dim * 2 B = 131,072 B/token; * 32768 = 4 GiB; * 16 = 64 GiB.
    m = model(num_key_value_heads=8, torch_dtype="bfloat16")
    est = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=32768, batch=16))
    assert est.model_contiguous_bytes_per_request == 4 * GiB
    assert est.model_batch_contiguous_bytes == 64 * GiB


@pytest.mark.parametrize("kv_heads, expected", [(8, 1.25 * GiB), (64, 10 * GiB)])
def test_llama2_70b_4096_fp16(kv_heads, expected):
    # 2 * 80 layers * H_kv * 128 * 2 B * 4096 tokens: H_kv=8 -> 1.25 GiB; H_kv=64 (MHA) -> 10 GiB.
    m = model(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=kv_heads)
    est = estimate_kv(m, FLOAT16, KvRequest(seq_tokens=4096))
    assert est.model_contiguous_bytes_per_request == int(expected)


def test_deepseek_v3_mla_bf16():
    # MLA latent 512 + 64 = 576 values * 2 B = 1,152 B per layer, no factor 2; 61 layers.
    m = resolve_model("deepseek-ai/DeepSeek-V3", offline=True).model
    est = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=1))
    assert est.model_bytes_per_token == 61 * 1152
    assert m.layer_kinds() == {"mla": 61}


def test_deepseek_v3_latent_replicated_under_tp():
    m = resolve_model("deepseek-ai/DeepSeek-V3", offline=True).model
    one = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=1000, tp=1))
    eight = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=1000, tp=8))
    assert eight.bytes_per_token == one.bytes_per_token == 61 * 1152


def test_gpt_oss_20b_counts_only_window_on_sliding_layers():
    # 24 layers alternate sliding (window 128) and full; 8 KV heads * 64 dim * 2 (K,V) * 2 B = 2,048 B/token/layer.
    m = resolve_model("openai/gpt-oss-20b", offline=True).model
    est = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=32768))
    kinds = {k.kind: k for k in est.kinds}
    assert kinds["sliding_window"].layers == 12 and kinds["full_attention"].layers == 12
    assert kinds["sliding_window"].contiguous_bytes == 12 * 128 * 2048  # 3 MiB: the window only
    assert kinds["full_attention"].contiguous_bytes == 12 * 32768 * 2048  # 768 MiB
    # Paged: the 128-token window can straddle one more 16-token block: cdiv(128, 16) + 1 = 9 blocks.
    assert kinds["sliding_window"].paged_bytes == 12 * 9 * 16 * 2048


@pytest.mark.parametrize("tp, heads_per_gpu", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1)])
def test_llama31_70b_kv_heads_per_gpu(tp, heads_per_gpu):
    # 8 KV heads: split down to one per GPU at tp=8; at tp=16 each head is replicated on two GPUs.
    m = resolve_model("meta-llama/Llama-3.1-70B-Instruct", offline=True).model
    est = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=1, tp=tp))
    assert est.bytes_per_token == 80 * heads_per_gpu * 2 * 128 * 2


def test_pp_stages_follow_vllm_partition():
    assert [len(r) for r in pp_stage_layers(61, 4)] == [15, 15, 16, 15]
    assert [len(r) for r in pp_stage_layers(32, 2)] == [16, 16]
    # 10 // 4 = 2, remainder 2 -> the second-to-last and the one before it get one more.
    assert [len(r) for r in pp_stage_layers(10, 4)] == [2, 3, 3, 2]


def test_pp_reports_fullest_stage():
    # 61 MLA layers over pp=4: the fullest stage holds 16 layers * 1,152 B per token.
    m = resolve_model("deepseek-ai/DeepSeek-V3", offline=True).model
    est = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=1, pp=4))
    assert est.bytes_per_token == 16 * 1152
    assert est.fullest_stage == 2


def test_paging_rounds_up_to_whole_blocks():
    # 1000 tokens -> cdiv(1000, 16) = 63 blocks = 1008 tokens: 8 tokens * 512 KiB = 4 MiB of rounding.
    est = estimate_kv(model(), FLOAT16, KvRequest(seq_tokens=1000))
    assert est.contiguous_bytes_per_request == 1000 * 524_288
    assert est.paged_bytes_per_request == 1008 * 524_288
    assert est.paging_overhead_bytes_per_request == 4 * MiB


def test_shared_prefix_full_blocks_stored_once():
    # 4 requests of 2048 tokens sharing a 1000-token prefix: 62 full blocks (992 tokens) stored once,
    # so 3 * 992 * 512 KiB = 1,488 MiB saved.
    est = estimate_kv(model(), FLOAT16, KvRequest(seq_tokens=2048, batch=4, shared_prefix_tokens=1000))
    assert est.shared_prefix_saving_bytes == 3 * 992 * 524_288
    assert est.batch_paged_bytes == 4 * GiB - 3 * 992 * 524_288


@pytest.mark.parametrize(
    "dtype, per_head_vector",
    [
        (FP8_E4M3, 128),  # 1 B per value, per-tensor scales live with the weights
        (INT8, 128 + 4),  # + one fp32 scale per token per head
        (INT4, 64 + 4),  # 4 bits -> 64 B + fp16 scale and zero point
        (NVFP4, 64 + 8),  # 4 bits -> 64 B + one fp8 scale per 16 values (8 scales)
    ],
)
def test_quantized_kv_dtypes_carry_their_scales(dtype, per_head_vector):
    # Llama-2-7B: 32 layers * 32 heads * (K + V) vectors of 128 values.
    est = estimate_kv(model(), dtype, KvRequest(seq_tokens=1))
    assert est.model_bytes_per_token == 32 * 32 * 2 * per_head_vector
