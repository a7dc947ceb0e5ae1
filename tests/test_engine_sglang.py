"""The SGLang engine model, anchored to SGLang's own rules per release (docs/engine-rules.md part 2), with the
derivation of each figure in a comment."""

from __future__ import annotations

import pytest

from kvplan.capacity.deployment import BoxProfile, Deployment, Parallelism, Workload
from kvplan.engines.allocator import loaded_tensor_bytes, segment_bytes
from kvplan.engines.sglang import (
    MAMBA_FULL_MEMORY_RATIO,
    SglangEngine,
    SglangOptions,
    gpu_defaults,
    max_running_requests,
    plan_sglang,
)
from kvplan.engines.sglang_releases import release_of, rules_for
from kvplan.engines.vllm_memory import CONTEXT_BYTES, cuda_context_bytes, weights_per_stage
from kvplan.errors import FieldError
from kvplan.hardware.gpus import custom_gpu, find_gpu
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB

GPU = custom_gpu(80 * GiB)
H100 = find_gpu("H100").total_memory_bytes  # 81,089.375 MiB (CUDA's total)
L4 = find_gpu("L4").smi_total_bytes  # 23,034 MiB (nvidia-smi)
H200 = find_gpu("H200").smi_total_bytes  # 143,771 MiB (nvidia-smi)


def _model(name):
    return resolve_model(name, offline=True).model


def _d(name, gpu=GPU, length=8192, concurrency=1, fraction=0.85, **kw):
    options = {k: kw.pop(k) for k in list(kw) if k in SglangOptions.__dataclass_fields__}
    return Deployment(
        model=_model(name), gpu=gpu, engine=SglangOptions(mem_fraction_static=fraction, **options),
        workload=Workload(max_model_len=length, concurrency=concurrency), **kw,
    )


def _fraction(total, version="current", **parallel):
    return gpu_defaults(total, SglangOptions(version=version), Parallelism(**parallel)).mem_fraction_static


@pytest.mark.parametrize(("version", "tp", "expected"), [
    # 0.3.0-0.4.5: by tensor parallelism only; the tp >= 8 value moved 0.83 -> 0.82 (0.3.6) -> 0.81 (0.4.0).
    ("0.3.4", 1, 0.88), ("0.3.4", 2, 0.87), ("0.3.4", 4, 0.85), ("0.3.4", 8, 0.83), ("0.3.6", 8, 0.82),
    ("0.4.3.post4", 8, 0.81), ("0.4.3", 16, 0.79),
    # 0.4.6: a card up to 80 GiB keeps the table.
    ("0.4.6", 1, 0.88),
    # 0.4.9-0.5.1: reserve (9.5 + tp / 2) GiB below 90 GiB: tp 1 -> 10,240 MiB -> round(70,849.4 / 81,089.4, 3)
    # = 0.874; tp 8 -> 13,824 MiB -> round(67,265.4 / 81,089.4, 3) = 0.830.
    ("0.4.9", 1, 0.874), ("0.5.1", 8, 0.830),
    # 0.5.3+: 512 + 1.5 x 8,192 + 2 x 256 + 1 / 8 x 1,024 = 13,440 MiB -> round(67,649.4 / 81,089.4, 3) = 0.834;
    # tp 8 takes cuda_graph_max_bs 512: 512 + 12,288 + 1,024 + 1,024 = 14,848 -> 0.817.
    ("0.5.3", 1, 0.834), ("0.5.13.post1", 8, 0.817), ("current", 1, 0.834),
])
def test_default_fraction_on_h100_per_release(version, tp, expected):
    assert _fraction(H100, version, tp=tp) == expected


def test_default_fraction_on_big_cards_per_release():
    # 0.4.6: above 80 GiB, 13 GiB reserved: (143,771 - 13,312) / 143,771 = 0.907407... (not rounded).
    assert _fraction(H200, "0.4.6") == pytest.approx((143_771 - 13 * 1024) / 143_771)
    # 0.4.9: 90-160 GiB class: (12 + 1 / 2) x 1,024 = 12,800 MiB -> round(130,971 / 143,771, 3) = 0.911.
    assert _fraction(H200, "0.4.9") == 0.911
    # 0.5.3: the reserve is 13,440 MiB (above the 10 GiB floor): round(130,331 / 143,771, 3) = 0.907.
    assert _fraction(H200, "0.5.3") == 0.907


def test_default_fraction_on_a_24_gb_card():
    # L4, 23,034 MiB (20-35 GiB class), tp 1.
    # 0.5.3-0.5.20: chunk 2,048, graphs 16 -> 512 + 3,072 + 32 + 128 = 3,744 MiB -> round(19,290 / 23,034, 3)
    # = 0.837; tp 4: graphs 80, 4 / 8 x 1,024 = 512 -> 512 + 3,072 + 160 + 512 = 4,256 -> 0.815.
    d = gpu_defaults(L4, SglangOptions(version="0.5.13"), Parallelism())
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.reserved_mib, d.mem_fraction_static) == (
        2048, 16, 3_744, 0.837)
    assert _fraction(L4, "0.5.13", tp=4) == 0.815
    # 0.5.23: chunk 4,096 and graphs 48 -> 512 + 6,144 + 96 + 128 = 6,880 -> round(16,154 / 23,034, 3) = 0.701;
    # tp 4: graphs 160 -> 512 + 6,144 + 320 + 512 = 7,488 -> round(15,546 / 23,034, 3) = 0.675.
    d = gpu_defaults(L4, SglangOptions(), Parallelism())
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.reserved_mib, d.mem_fraction_static) == (
        4096, 48, 6_880, 0.701)
    assert _fraction(L4, tp=4) == 0.675
    # 0.4.3: below 25,000 MiB chunk 2,048 (graphs 8 at tp < 4), and the fraction from the TP table: 0.85 at tp 4.
    d = gpu_defaults(L4, SglangOptions(version="0.4.3"), Parallelism(tp=4))
    assert (d.chunked_prefill_size, d.cuda_graph_max_bs, d.mem_fraction_static) == (2048, 80, 0.85)


def test_multimodal_fraction_per_release():
    gemma = _model("google/gemma-3-4b-it")  # Gemma3ForConditionalGeneration: SGLang serves it as multimodal
    text = _model("meta-llama/Llama-3.1-8B-Instruct")
    # 0.3-0.4.x: ModelRunner multiplies the fraction by 0.95: 0.88 x 0.95 = 0.836, a user's fraction too.
    assert gpu_defaults(H200, SglangOptions(version="0.4.4"), Parallelism(), gemma).mem_fraction_static == \
        pytest.approx(0.836)
    assert gpu_defaults(H200, SglangOptions(version="0.4.4", mem_fraction_static=0.8), Parallelism(),
                        gemma).mem_fraction_static == pytest.approx(0.76)
    assert gpu_defaults(H200, SglangOptions(version="0.4.4"), Parallelism(), text).mem_fraction_static == 0.88
    # 0.4.9-0.5.1: the default only, x 0.90: round(130,971 / 143,771, 3) x 0.9 = 0.911 x 0.9 = 0.8199.
    assert gpu_defaults(H200, SglangOptions(version="0.5.1"), Parallelism(), gemma).mem_fraction_static == \
        pytest.approx(0.8199)
    # 0.5.3+: adjust_mem_fraction_for_vlm, the default x 0.95 (x a ViT factor kvplan takes as 1): 0.907 x 0.95.
    assert gpu_defaults(H200, SglangOptions(), Parallelism(), gemma).mem_fraction_static == pytest.approx(0.86165)
    assert gpu_defaults(H200, SglangOptions(mem_fraction_static=0.8), Parallelism(),
                        gemma).mem_fraction_static == 0.8


def test_release_ranges_and_bad_versions():
    assert rules_for(release_of("0.5.13.post1")).first == (0, 5, 3)
    assert rules_for(release_of("0.4.8.post1")).first == (0, 4, 6)
    assert rules_for(release_of("0.9.0")).first == (0, 5, 23)  # newer than any read: the newest rules
    with pytest.raises(FieldError, match="from 0.3.0"):
        SglangOptions(version="0.2.14").validate()
    with pytest.raises(FieldError, match="SGLang release"):
        SglangOptions(version="newest").validate()


def test_token_pool_formula_llama():
    d = _d("meta-llama/Llama-3.1-8B-Instruct")
    r = plan_sglang(d)
    free = 80 * GiB - CONTEXT_BYTES
    # Every Llama-3.1-8B matrix is a whole number of 2 MiB (qkv 48 MiB, o 32, gate_up 224, down 112, embedding
    # and head 1,002 MiB each); only the 65 norms (532,480 B) round, up to one 2 MiB segment: +1,564,672 B.
    weights = weights_per_stage(d.model, dtype="bfloat16", tp=1, pp=1, quantization=None)[0][0] + 1_564_672
    rest = free - weights - round(free * (1 - 0.85))
    # cell = 32 layers x 8 heads x 128 x 2 (K, V) x 2 B = 131,072 B per token.
    assert r.cell_size_bytes == 131_072
    assert r.available_kv_bytes == rest
    assert r.max_total_num_tokens == rest // 131_072


def test_weights_are_counted_in_allocator_segments():
    # Qwen2.5-32B (QwQ-32B's shapes) at tp 4, bf16, per rank and layer: qkv 1,792 x 5,120 x 2 B = 17.5 MiB
    # -> 18, o 5,120 x 1,280 x 2 B = 12.5 MiB -> 14, gate_up 13,824 x 5,120 x 2 B = 135 MiB -> 136, down
    # 5,120 x 6,912 x 2 B = 67.5 MiB -> 68: 3.5 MiB a layer, 224 MiB over 64 layers; the vocabulary (38,016 rows
    # x 5,120 x 2 B = 371.25 MiB -> 372, twice, untied) 1.5 MiB; the 129 norms (1,320,960 B) fill one 2 MiB
    # small segment: 225.5 MiB + 776,192 B.
    m = resolve_model("Qwen/Qwen2.5-32B", offline=True).model
    tensors = loaded_tensor_bytes(m, range(64), tp=4, elem=2, quant=None, first=True, last=True)
    assert tensors is not None
    assert segment_bytes(tensors) - sum(tensors) == round(225.5 * 2**20) + 776_192
    assert segment_bytes([1, 1]) == 2 * 2**20  # two 512 B blocks share one small segment
    assert segment_bytes([3 * 2**20, 3 * 2**20]) == 20 * 2**20  # 1-10 MiB requests share 20 MiB segments
    assert segment_bytes([11 * 2**20 + 1]) == 12 * 2**20  # a large one has its own, rounded to 2 MiB


def test_page_size_rounds_down_and_backends_force_it():
    r = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct", page_size=64))
    one = plan_sglang(_d("meta-llama/Llama-3.1-8B-Instruct"))
    assert r.max_total_num_tokens == one.max_total_num_tokens // 64 * 64
    # FlashMLA pages are 64 tokens whatever --page-size says (0.5.3+); 0.4.x had no such override.
    mla = plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite", page_size=1, attention_backend="flashmla"))
    assert mla.page_size == 64 and mla.max_total_num_tokens % 64 == 0
    old = plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite", page_size=1, attention_backend="flashmla",
                         version="0.4.3"))
    assert old.page_size == 1


def test_mla_not_divided_by_tp():
    # DeepSeek-V2-Lite: 27 layers x (512 + 64) x 2 B = 31,104 B per token at any TP.
    assert plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite")).cell_size_bytes == 31_104
    assert plan_sglang(_d("deepseek-ai/DeepSeek-V2-Lite", parallelism=Parallelism(tp=2))).cell_size_bytes == 31_104


def test_sliding_window_pool_from_0_5_3():
    r = plan_sglang(_d("google/gemma-2-9b-it"))
    # 21 full + 21 sliding layers, 8 KV heads x 256 x 2 x 2 B = 8,192 B per layer per token.
    assert r.cell_size_bytes == r.swa_cell_size_bytes == 21 * 8192
    # set_num_token_hybrid: every layer's tokens N = rest // (42 x 8,192 B), then full = int(N x 42 /
    # (0.8 x 21 + 21)) and sliding = int(full x 0.8).
    every = r.available_kv_bytes // (42 * 8192)
    assert r.max_total_num_tokens == int(every * 42 / (0.8 * 21 + 21))
    assert r.swa_max_total_num_tokens == int(r.max_total_num_tokens * 0.8)
    # Before 0.5.3 every layer keeps every token in one pool: N = rest // (42 x 8,192 B).
    old = plan_sglang(_d("google/gemma-2-9b-it", version="0.4.6"))
    assert (old.cell_size_bytes, old.swa_cell_size_bytes) == (42 * 8192, 0)
    assert old.max_total_num_tokens == old.available_kv_bytes // (42 * 8192)


def test_mamba_state_pool_per_release():
    # Nemotron-H-56B: Mamba2 layers hold constant state per request (S bytes), taken off `rest` first.
    d = _d("nvidia/Nemotron-H-56B-Base-8K", gpu=custom_gpu(192 * GiB), length=8192)
    r = plan_sglang(d)
    s = r.state_bytes
    assert s > 0
    # 0.5.23: the state budget is rest x 0.9 / 1.9, the slots (budget - S) // S; the rest is token slots.
    budget = r.available_kv_bytes * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
    assert r.mamba_slots == int((budget - s) // s)
    assert r.max_total_num_tokens == (r.available_kv_bytes - r.mamba_slots * s) // r.cell_size_bytes
    v = plan(d)
    assert [u.pool.name for u in v.pools] == ["full-attention tokens", "state slots"]
    assert v.max_requests == min(r.max_total_num_tokens // 8192, r.mamba_slots, v.account.request_cap)
    # 0.5.3: max_mamba_cache_size = --max-running-requests when given (16 here), else 512.
    fixed = plan_sglang(_d("nvidia/Nemotron-H-56B-Base-8K", gpu=custom_gpu(192 * GiB), version="0.5.13",
                           max_running_requests=16))
    assert fixed.mamba_slots == 16
    assert fixed.max_total_num_tokens == (fixed.available_kv_bytes - 16 * s) // fixed.cell_size_bytes


def test_max_running_requests_default_per_release():
    # Qwen2.5-32B (QwQ-32B's architecture) at context 131,072: the request table holds min(max(int(N / 131,072
    # x 512), 2,048), 4,096) = 2,048; 0.4.x adds the table's spare slot (2,049, as the 0.4.3 log on 4 x L4 shows).
    d = _d("Qwen/Qwen2.5-32B", gpu=find_gpu("L4"), length=131072, fraction=0.85,
           parallelism=Parallelism(tp=4), version="0.4.3")
    r = plan_sglang(d)
    assert max_running_requests(r, d.engine, d.parallelism, 131072) == min(r.max_total_num_tokens // 2, 2049)
    new = _d("Qwen/Qwen2.5-7B-Instruct", length=32768, fraction=0.82, version="0.5.13")
    r = plan_sglang(new)
    table = min(max(int(r.max_total_num_tokens / 32768 * 512), 2048), 4096)
    assert max_running_requests(r, new.engine, new.parallelism, 32768) == min(r.max_total_num_tokens // 2, table)


def test_refusal_words_per_release():
    # A fraction too small for the weights: rest < 0.
    old = plan(_d("meta-llama/Llama-3.1-8B-Instruct", fraction=0.1, version="0.4.3"))
    assert old.account.refusal.message == "Not enough memory. Please try to increase --mem-fraction-static."
    mid = plan(_d("meta-llama/Llama-3.1-8B-Instruct", fraction=0.1, version="0.5.13"))
    assert mid.account.refusal.message.endswith("Current value: self.server_args.mem_fraction_static=0.1")
    new = plan(_d("meta-llama/Llama-3.1-8B-Instruct", fraction=0.1))
    assert new.account.refusal.message.startswith(
        "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.1.")


def test_profile_replaces_total_context_and_weights():
    # A box that measured 1.25 GiB in use before loading and 15.54 GiB of weights.
    profile = BoxProfile(source="box.log", engine="sglang", gpu_name="L4", total_memory_bytes=L4,
                         non_torch_bytes=round(1.25 * GiB), weights_bytes=round(15.54 * GiB), tp=4,
                         model="Qwen/Qwen2.5-32B")
    base = _d("Qwen/Qwen2.5-32B", gpu=find_gpu("L4"), length=131072, parallelism=Parallelism(tp=4))
    r = plan_sglang(Deployment(**{**base.__dict__, "profile": profile}))
    free_before = L4 - round(1.25 * GiB)
    assert (r.free_before_load_bytes, r.weights_bytes) == (free_before, round(15.54 * GiB))
    assert r.available_kv_bytes == free_before - round(15.54 * GiB) - round(free_before * 0.15)
    # Another tp: the weights and the memory in use before loading are not this box's any more.
    other = Deployment(**{**base.__dict__, "profile": profile, "parallelism": Parallelism(tp=2)})
    r2 = plan_sglang(other)
    assert r2.free_before_load_bytes == L4 - cuda_context_bytes("L4")
    assert any("tp 4" in n for n in r2.notes)


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


def test_dp_attention_reserve_per_release():
    # 0.5.3+, H200 tp 8, dp 8 with DP attention: graphs 512 at tp >= 4 -> 512 + 12,288 + 1,024 + 1,024 = 14,848,
    # + 512 x 8 x 3 = 12,288, + 512 x 8 x 1.5 = 6,144 (max_bs > 300) -> 33,280 MiB -> round(110,491 / 143,771, 3).
    d = gpu_defaults(H200, SglangOptions(), Parallelism(tp=8, dp=8, dp_attention=True))
    assert d.reserved_mib == 33_280 and d.mem_fraction_static == round((143_771 - 33_280) / 143_771, 3)
    # 0.4.9: + 4 GiB: (12 + 8 / 2) x 1,024 + 4,096 = 20,480 MiB.
    d = gpu_defaults(H200, SglangOptions(version="0.4.9"), Parallelism(tp=8, dp=8, dp_attention=True))
    assert d.reserved_mib == 20_480


def test_refusals_name_the_field():
    v = plan(_d("meta-llama/Llama-3.1-8B-Instruct", kv_cache_dtype="fp8"))
    assert v.limit == "kv_dtype" and v.account.refusal.field == "kv_cache_dtype"
    v = plan(_d("meta-llama/Llama-3.1-8B-Instruct", parallelism=Parallelism(tp=3)))
    assert v.limit == "tp_heads" and "(32)" in v.account.refusal.message


def test_bad_fraction():
    with pytest.raises(FieldError, match="mem_fraction_static"):
        plan(_d("meta-llama/Llama-3.1-8B-Instruct", fraction=1.5))


def test_calibration_range_is_stated():
    inside = plan(_d("meta-llama/Llama-3.1-8B-Instruct", gpu=find_gpu("H100"), version="0.5.13")).account
    assert inside.calibration.in_range
    outside = plan(_d("meta-llama/Llama-3.1-8B-Instruct", gpu=find_gpu("A10"))).account.calibration
    assert not outside.in_range and any("A10" in o for o in outside.outside)


def test_sglang_version_flag(runner):
    from tests.conftest import run_cli, run_json

    doc = run_json(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--gpu", "H100",
                   "--engine", "sglang", "--sglang-version", "0.4.3")
    g = doc["gpus"][0]
    assert g["engine_version"] == "0.4.3" and g["engine_detail"]["mem_fraction_static"] == 0.88
    r = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--engine", "sglang",
                "--sglang-version", "0.2.9")
    assert r.exit_code == 2 and "--sglang-version 0.2.9: kvplan models SGLang from 0.3.0" in r.output
    r = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--sglang-version", "0.4.3")
    assert r.exit_code == 2 and "vllm's counterpart is --vllm-version" in r.output


def test_stated_error_band_is_the_benchmark_result():
    # benchmarks/sglang_accuracy.py writes its summary lines; the engine quotes them in every plan.
    import re
    from pathlib import Path

    from kvplan.engines import sglang

    text = (Path(__file__).resolve().parent.parent / "benchmarks/results/sglang_accuracy.md").read_text()
    for mode, logs, mae, worst in (("A", sglang.A_LOGS, sglang.A_MAE_PCT, sglang.A_WORST_PCT),
                                   ("B", sglang.B_LOGS, sglang.B_MAE_PCT, sglang.B_WORST_PCT)):
        m = re.search(rf"^- {mode}, KV tokens: (\d+) logs, MAE ([\d.]+)%, worst [+-]([\d.]+)%", text, re.M)
        assert m is not None and (int(m[1]), float(m[2]), float(m[3])) == (logs, mae, worst)
    band = plan(_d("meta-llama/Llama-3.1-8B-Instruct", gpu=find_gpu("A10"))).account.calibration.error_band
    assert f"{sglang.B_MAE_PCT}% and {sglang.B_WORST_PCT}% on {sglang.B_LOGS} logs" in band


def test_state_pool_uses_sglangs_own_state_dtypes():
    # Qwen3-Next-80B (bf16, no state dtype in its config): each of its 36 DeltaNet layers keeps, in SGLang, a
    # bf16 conv state (2 x 16 x 128 + 32 x 128 = 8,192 channels x 3) = 49,152 B and a float32 recurrent state
    # (--mamba-ssm-dtype's default) 32 x 128 x 128 x 4 B = 2,097,152 B: 36 x 2,146,304 = 77,266,944 B a
    # request, where vLLM keeps both in bf16 (36 x 1,097,728).
    r = plan_sglang(_d("Qwen/Qwen3-Next-80B-A3B-Thinking", gpu=custom_gpu(200 * GiB)))
    assert r.state_bytes == 36 * 2_146_304 == 77_266_944


def test_fp4_e2m1_cells_as_get_cell_size_per_token_counts_them():
    # torch.float4_e2m1fn_x2 holds two values a byte, and the cell adds one scale byte per 16 values:
    # Llama-3.1-8B (8 KV heads, 128 wide, 32 layers), (8 x 256 x 32) // 2 + (8 x 128 x 32 x 2) // 16 = 32,768 +
    # 4,096 = 36,864 B a token; DeepSeek-V2-Lite's latent (512 + 64) x 27 // 2 + (576 // 16) x 27 = 7,776 + 972
    # = 8,748 B. MLA pools take it from 0.5.5 (0.5.4.post3), MHA pools from 0.5.6 (0.5.5.post3).
    def deployment(name: str, version: str) -> Deployment:
        return Deployment(model=resolve_model(name, offline=True).model, gpu=find_gpu("B200"),
                          parallelism=Parallelism(), workload=Workload(8192, 1), kv_cache_dtype="fp4_e2m1",
                          engine=SglangOptions(version=version))

    assert plan_sglang(deployment("meta-llama/Llama-3.1-8B-Instruct", "0.5.6")).cell_size_bytes == 36_864
    assert plan_sglang(deployment("deepseek-ai/DeepSeek-V2-Lite-Chat", "0.5.5")).cell_size_bytes == 8_748
    for name, version, says in (("meta-llama/Llama-3.1-8B-Instruct", "0.5.5", "MLA models only"),
                                ("deepseek-ai/DeepSeek-V2-Lite-Chat", "0.5.3", "no fp4_e2m1 KV cache")):
        refusal = plan(deployment(name, version)).account.refusal
        assert refusal is not None and refusal.code == "kv_dtype" and says in refusal.message
