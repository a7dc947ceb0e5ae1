"""vLLM 0.20+'s quantized KV caches beyond fp8 (kvplan/engines/vllm_kv_quant.py, engine-rules.md 1.27):
per-token-head int8/fp8/int4, NVFP4 and TurboQuant. Every figure is vLLM's own arithmetic, read in the
0.20.0-0.33.0 sdists (config/cache.py, v1/kv_cache_interface.py, the Triton, FlashInfer and TurboQuant
backends, turboquant/config.py, platforms/interface.py); no held-out log runs one of these caches.
"""

from __future__ import annotations

import pytest

from kvplan.capacity.deployment import Deployment, Parallelism, Workload
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.engines.vllm_kv_quant import boundary_layers, quant_block_size
from kvplan.engines.vllm_versions import rules_for
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.model.dtypes import TURBOQUANT, VLLM_KV_DTYPES, resolve_kv_dtype
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import MiB

LLAMA = resolve_model("meta-llama/Llama-3.1-8B-Instruct", offline=True).model
H100, B200, L40S = find_gpu("H100"), find_gpu("B200"), find_gpu("L40S")


@pytest.mark.parametrize(("name", "head_bytes"), [
    # One fp32 scale inline for K and one for V, per token and head: 128 + 4 + 128 + 4 = 264 B.
    ("int8_per_token_head", 264),
    ("fp8_per_token_head", 264),
    # Two int4 values a byte: 64 + 4 + 64 + 4 = 136 B.
    ("int4_per_token_head", 136),
    # NVFP4: 64 B of values and one fp8 scale per 16 values, K and V: 2 x (64 + 8) = 144 B.
    ("nvfp4_4over6", 144),
    # TurboQuant (key_packed_size + value_packed_size, rounded up to even): fp8 keys 128 + 4-bit values 64 + an
    # fp16 scale and zero point = 196; 4-bit keys 64 + a 2 B norm = 66, + 68 = 134; 3-bit keys 48 + 2 = 50,
    # + 68 = 118, or + 3-bit values 48 + 4 = 52 -> 102.
    ("turboquant_k8v4", 196),
    ("turboquant_4bit_nc", 134),
    ("turboquant_k3v4_nc", 118),
    ("turboquant_3bit_nc", 102),
])
def test_what_one_head_of_one_token_takes(name: str, head_bytes: int) -> None:
    assert VLLM_KV_DTYPES[name].head_bytes(128, 128) == head_bytes


def test_turboquant_rounds_an_odd_slot_up_to_even_bytes() -> None:
    # D = 72, 3-bit keys and 4-bit values: cdiv(216, 8) + 2 = 29, 36 + 4 = 40, 69 -> 70 (slot_size_aligned).
    assert TURBOQUANT["turboquant_k3v4_nc"].head_bytes(72, 72) == 70


@pytest.mark.parametrize(("name", "block_bytes"), [
    # Llama-3.1-8B at tp 1 (8 KV heads, 32 layers), 16-token blocks: 16 x 32 x 8 x 264 = 1,081,344 B.
    ("int8_per_token_head", 1_081_344),
    ("int4_per_token_head", 16 * 32 * 8 * 136),
])
def test_a_per_token_head_block(name: str, block_bytes: int) -> None:
    r = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.30.0", kv_cache_dtype=name), L40S)
    assert (r.stages[0].layout.block_size, r.stages[0].layout.bytes_per_block) == (16, block_bytes)


def test_turboquant_keeps_the_boundary_layers_in_the_model_dtype() -> None:
    # Dense models keep layers 0, 1, L - 2 and L - 1 in bf16 (get_boundary_skip_layers, n = min(2, L // 2)):
    # 4 x 8 x 512 B + 28 x 8 x 196 B = 16,384 + 43,904 = 60,288 B a token. On 0.24 the block stays 16 tokens:
    # 964,608 B. From 0.25 the quantized page must cover a bf16 page of the first layer's 16-token kernel block,
    # so the block is 32 tokens: 1,929,216 B, one group holding every layer's page at its own size.
    assert boundary_layers(LLAMA, "turboquant_k8v4") == {0, 1, 30, 31}
    on_024 = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.24.0", kv_cache_dtype="turboquant_k8v4"), H100)
    on_030 = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.30.0", kv_cache_dtype="turboquant_k8v4"), H100)
    assert (on_024.stages[0].layout.block_size, on_024.stages[0].layout.bytes_per_block) == (16, 964_608)
    assert (on_030.stages[0].layout.block_size, on_030.stages[0].layout.bytes_per_block) == (32, 1_929_216)
    assert len(on_030.stages[0].layout.groups) == 1
    # Blocks of 48 tokens already cover it (A x cdiv(32, A), A = max(16, block)); 16 becomes 32.
    rules = rules_for("0.30.0")
    assert [quant_block_size(LLAMA, rules, "0.30.0", "turboquant_k8v4", b) for b in (16, 32, 48)] == [32, 32, 48]


def test_turboquant_decode_buffers_count_with_the_weights_on_020_only() -> None:
    # 0.20.0 registers them in every quantized layer: 4 B x 256 sequences x 32 query heads x (32 x 129 + 129) =
    # 139,493,376 B, 28 layers = 3,905,814,528 B inside "Model loading took". From 0.21 they move to the shared
    # workspace, which the builder takes after the KV cache is sized.
    bf16 = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.20.0"), L40S)
    tq = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.20.0", kv_cache_dtype="turboquant_k8v4"), L40S)
    assert tq.stages[0].memory.weights_bytes - bf16.stages[0].memory.weights_bytes == 3_905_814_528
    later = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.21.0", kv_cache_dtype="turboquant_k8v4"),
                      L40S)
    assert later.stages[0].memory.weights_bytes == plan_vllm(
        LLAMA, VllmFlags(max_model_len=32768, version="0.21.0"), L40S).stages[0].memory.weights_bytes


def test_nvfp4_on_blackwell_builds_an_fp8_output_buffer_a_layer() -> None:
    # FlashInfer's SM100 path: max_num_batched_tokens x query heads x head size, 1 B each, in every attention
    # layer: 8,192 x 32 x 128 = 32 MiB a layer, 1 GiB over 32 layers. A block: 16 x 32 x 8 x 144 = 589,824 B.
    flags = VllmFlags(max_model_len=32768, version="0.30.0", kv_cache_dtype="nvfp4", max_num_batched_tokens=8192)
    plain = plan_vllm(LLAMA, VllmFlags(max_model_len=32768, version="0.30.0", max_num_batched_tokens=8192), B200)
    r = plan_vllm(LLAMA, flags, B200)
    assert r.stages[0].memory.weights_bytes - plain.stages[0].memory.weights_bytes == 32 * 32 * MiB
    assert r.stages[0].layout.bytes_per_block == 589_824


@pytest.mark.parametrize(("version", "gpu", "kv", "says"), [
    ("0.20.0", "L40S", "nvfp4", "has no attention backend that runs nvfp4"),
    ("0.30.0", "H100", "nvfp4", "FlashInfer's SM100 path"),
    ("0.30.0", "L40S", "nvfp4_4over6", "FlashInfer's SM100 path"),
    ("0.21.0", "H100", "int8_per_token_head", "FlashAttention 3 claims"),
    ("0.24.0", "A100-80GB", "fp8_per_token_head", "below SM89"),
    ("0.33.0", "H100", "octave_k3v4", "kvplan does not size it"),
])
def test_where_vllm_has_no_backend_the_plan_says_why(version: str, gpu: str, kv: str, says: str) -> None:
    with pytest.raises(FieldError, match=says):
        plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=version, kv_cache_dtype=kv), find_gpu(gpu))


def test_nvfp4_runs_beyond_blackwell_from_032() -> None:
    # On an H100 from 0.32 the block is Blackwell's: 16 tokens x 32 layers x 8 heads x 144 B = 589,824 B.
    r = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.32.0", kv_cache_dtype="nvfp4"), H100)
    assert r.stages[0].layout.bytes_per_block == 589_824


@pytest.mark.parametrize(("model", "kv", "says"), [
    ("google/gemma-3-4b-it", "turboquant_k8v4", "no sliding-window attention"),
    ("openai/gpt-oss-20b", "turboquant_4bit_nc", "no sliding-window attention"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "int8_per_token_head", "no MLA attention backend"),
])
def test_turboquant_and_mla_refusals(model: str, kv: str, says: str) -> None:
    m = resolve_model(model, offline=True).model
    with pytest.raises(FieldError, match=says):
        plan_vllm(m, VllmFlags(max_model_len=8192, version="0.30.0", kv_cache_dtype=kv), H100)


def test_a_deployment_is_refused_with_the_fix() -> None:
    # The engine account turns the same reason into a refusal (exit 1 in estimate and check) with fp8 as the fix.
    d = Deployment(model=LLAMA, gpu=H100, parallelism=Parallelism(), workload=Workload(8192, 1), kv_cache_dtype="nvfp4",
                   engine=VllmOptions(version="0.30.0"))
    v = plan(d)
    assert v.account.refusal is not None and v.account.refusal.code == "kv_dtype"
    assert "FlashInfer's SM100 path" in v.account.refusal.message


def test_the_engine_neutral_estimate_takes_the_same_bytes() -> None:
    # Without an engine the per-token figure is every layer's: 32 x 8 x 196 = 50,176 B for turboquant_k8v4 (the
    # boundary layers are vLLM's choice, not the format's).
    assert sum(s.kv_bytes_per_token(resolve_kv_dtype("turboquant_k8v4", "bfloat16")) for s in LLAMA.layers) == 50_176
