"""The SGLang engine model, anchored to SGLang's own rules (server_args.py, model_runner.py) with derivations."""

from __future__ import annotations

import pytest

from kvplan.capacity.deployment import Deployment, Parallelism, Workload
from kvplan.engines.sglang import (
    CONTEXT_BYTES,
    MAMBA_FULL_MEMORY_RATIO,
    SWA_FULL_TOKENS_RATIO,
    SglangEngine,
    SglangOptions,
    gpu_defaults,
    plan_sglang,
)
from kvplan.engines.vllm_memory import weights_per_stage
from kvplan.errors import FieldError
from kvplan.hardware.gpus import custom_gpu, find_gpu
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB

GPU = custom_gpu(80 * GiB)


def _model(name):
    return resolve_model(name, offline=True).model


def _d(name, gpu=GPU, length=8192, concurrency=1, fraction=0.85, **kw):
    options = {k: kw.pop(k) for k in list(kw) if k in SglangOptions.__dataclass_fields__}
    return Deployment(
        model=_model(name), gpu=gpu, engine=SglangOptions(mem_fraction_static=fraction, **options),
        workload=Workload(max_model_len=length, concurrency=concurrency), **kw,
    )


def test_default_fraction_on_h100_follows_the_reserve_rule():
    # _handle_gpu_memory_settings: the H100's 85,028,372,480 B are 81,089.375 MiB, the 60-160 GiB class:
    # chunked_prefill_size 8,192 and cuda_graph_max_bs 256 at tp < 4. Reserve 512 + 1.5 x 8,192 + 2 x 256 +
    # 1 x 1 / 8 x 1,024 = 13,440 MiB (above the 10,240 floor); (81,089.375 - 13,440) / 81,089.375 = 0.834.
    d = gpu_defaults(find_gpu("H100").total_memory_bytes, SglangOptions(), Parallelism())
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.reserved_mib, d.mem_fraction_static) == (
        8192, 256, 13_440, 0.834
    )


def test_default_fraction_on_a_24_gb_card_and_at_tp_4():
    # L4: 23,034 MiB, the 20-35 GiB class: chunk 2,048, graphs 24 (tp < 4) -> reserve 512 + 3,072 + 48 + 128 =
    # 3,760 MiB, no floor below 60 GiB: (23,034 - 3,760) / 23,034 = 0.83676... -> 0.837.
    d = gpu_defaults(find_gpu("L4").total_memory_bytes, SglangOptions(), Parallelism())
    assert (d.cuda_graph_max_bs, d.reserved_mib, d.mem_fraction_static) == (24, 3_760, 0.837)
    # tp 4: graphs 80, and tp x pp / 8 x 1,024 = 512 -> 512 + 3,072 + 160 + 512 = 4,256 -> 0.815.
    d4 = gpu_defaults(find_gpu("L4").total_memory_bytes, SglangOptions(), Parallelism(tp=4))
    assert (d4.reserved_mib, d4.mem_fraction_static) == (4_256, 0.815)


def test_token_pool_formula_llama():
    d = _d("meta-llama/Llama-3.1-8B-Instruct")
    r = plan_sglang(d)
    free = 80 * GiB - CONTEXT_BYTES
    weights = weights_per_stage(d.model, dtype="bfloat16", tp=1, pp=1, quantization=None)[0][0]
    rest = free - weights - round(free * (1 - 0.85))
    # cell = 32 layers x 8 heads x 128 x 2 (K, V) x 2 B = 131,072 B per token.
    assert r.cell_size_bytes == 131_072
    assert r.available_kv_bytes == rest
    assert r.max_total_num_tokens == rest // 131_072


def test_page_size_rounds_down():
    r = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct", page_size=64))
    one = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct"))
    assert r.max_total_num_tokens == one.max_total_num_tokens // 64 * 64


def test_mla_not_divided_by_tp():
    # DeepSeek-V2-Lite: 27 layers x (512 + 64) x 2 B = 31,104 B per token at any TP.
    assert plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite")).cell_size_bytes == 31_104
    assert plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite", parallelism=Parallelism(tp=2))).cell_size_bytes == 31_104


def test_sliding_window_pool():
    r = plan_sglang(_d("google/gemma-2-9b-it"))
    # 21 full + 21 sliding layers, 8 KV heads x 256 x 2 x 2 B = 8,192 B per layer per token.
    assert r.cell_size_bytes == r.swa_cell_size_bytes == 21 * 8192
    assert r.max_total_num_tokens == int(r.available_kv_bytes // (21 * 8192 * (1 + SWA_FULL_TOKENS_RATIO)))
    assert r.swa_max_total_num_tokens == int(r.max_total_num_tokens * SWA_FULL_TOKENS_RATIO)


def test_mamba_state_pool_is_counted():
    # Nemotron-H-56B: Mamba2 layers hold constant state; the state pool gets 0.9 / 1.9 of `rest`, the attention
    # tokens the remaining 1 / 1.9, and every request takes one state slot.
    d = _d("nvidia/Nemotron-H-56B-Base-8K", gpu=custom_gpu(192 * GiB), length=8192)
    r = plan_sglang(d)
    assert r.state_bytes > 0
    mamba = round(r.available_kv_bytes * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO))
    assert r.mamba_slots == mamba // r.state_bytes
    assert r.max_total_num_tokens == (r.available_kv_bytes - mamba) // r.cell_size_bytes
    v = plan(d)
    assert [u.pool.name for u in v.pools] == ["full-attention tokens", "state slots"]
    assert v.max_requests == min(r.max_total_num_tokens // 8192, r.mamba_slots, v.account.request_cap)


def test_pipeline_stages_limit_the_pool():
    # pp 2: each stage holds half the layers and its own weights; the stage with fewer token slots limits both.
    one = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct"))
    two = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct", parallelism=Parallelism(pp=2)))
    assert two.cell_size_bytes == 16 * 8 * 128 * 2 * 2
    assert two.max_total_num_tokens > 2 * one.max_total_num_tokens


def test_dp_attention_keeps_the_mla_latent_per_dp_rank():
    # DeepSeek-V3 on 8 GPUs, tp 8 with DP attention over 8: each rank holds the whole latent (61 x 1,152 B per
    # token) for its own requests: 16 requests become 2 per rank, not 16 copies on every rank.
    d = _d("deepseek-ai/DeepSeek-V3", gpu=find_gpu("H200"), length=4096, concurrency=16, fraction=None,
           parallelism=Parallelism(tp=8, dp=8, dp_attention=True))
    v = plan(d)
    assert v.account.pools[0].unit_bytes == 61 * 1152
    assert v.kv_caches == 8 and v.requests_per_cache == 2
    assert SglangEngine().gpus_per_instance(d.parallelism) == 8


def test_refusals_name_the_field():
    v = plan(_d("meta-llama/Llama-3.1-8B-Instruct", kv_cache_dtype="fp8"))
    assert v.limit == "kv_dtype" and v.account.refusal.field == "kv_cache_dtype"
    v = plan(_d("meta-llama/Llama-3.1-8B-Instruct", parallelism=Parallelism(tp=3)))
    assert v.limit == "tp_heads" and "(32)" in v.account.refusal.message


def test_bad_fraction():
    with pytest.raises(FieldError, match="mem_fraction_static"):
        plan(_d("meta-llama/Llama-3.1-8B-Instruct", fraction=1.5))
