"""The attention backend vLLM 0.20+ picks and FlashInfer's buffers in the CUDA-graph estimate
(kvplan/engines/vllm_attention.py, docs/engine-rules.md 1.26). The expected backends are the 0.18-0.33 sdists'
priority lists and validity rules applied by hand; the bytes are vLLM's and FlashInfer's own constants."""

from __future__ import annotations

import pytest

from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_attention import AttentionPath, attention_path, flashinfer_graph_bytes
from kvplan.engines.vllm_versions import rules_for
from kvplan.hardware.gpus import COMPUTE_CAPABILITY, find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import MiB


def _model(name: str):
    return resolve_model(name, offline=True).model


LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # 32 query heads, 8 KV heads of 128
GPT_OSS = "openai/gpt-oss-20b"  # heads of 64 with attention sinks
PHI3 = "microsoft/Phi-3-mini-4k-instruct"  # heads of 96: FlashInfer takes 64, 128, 256 (512)
QWEN36 = "nvidia/Qwen3.6-27B-NVFP4"  # 16 gated-attention layers, 24 query heads of 256, beside 48 DeltaNet layers
GEMMA3 = "google/gemma-3-4b-it"  # Gemma3ForConditionalGeneration, heads of 256


@pytest.mark.parametrize(("model", "gpu", "release", "kv", "label"), [
    # Every GPU but SM10x tries FlashAttention first: FA2 on SM80/86/89/120 takes no fp8 cache, FA3 on SM90 e4m3.
    (LLAMA, "A100-80GB", "0.27.1", "auto", "FLASH_ATTN"),
    (LLAMA, "A100-80GB", "0.27.1", "fp8", "FLASHINFER"),
    (LLAMA, "L40S", "0.21", "fp8", "FLASHINFER"),
    (LLAMA, "H100", "0.27.1", "fp8", "FLASH_ATTN"),
    # FA3 never takes e5m2; FlashInfer decodes through XQA on SM90 from 0.25.
    (LLAMA, "H100", "0.24", "fp8_e5m2", "FLASHINFER"),
    (LLAMA, "H100", "0.25", "fp8_e5m2", "FLASHINFER (XQA decode)"),
    # SM10x tries FlashInfer first, with TensorRT-LLM-gen kernels.
    (LLAMA, "B200", "0.21", "auto", "FLASHINFER (TRT-LLM decode)"),
    # SM120 decodes natively to 0.27 and through XQA from 0.28.
    (QWEN36, "RTX-5090", "0.27.1", "fp8", "FLASHINFER"),
    (QWEN36, "RTX-5090", "0.28", "fp8", "FLASHINFER (XQA decode)"),
    (QWEN36, "RTX-5090", "0.27.1", "auto", "FLASH_ATTN"),
    # Sinks: FA3 (SM90) only; FlashInfer on SM100, SM12x from 0.28, SM90 from 0.30; Triton anywhere.
    (GPT_OSS, "H100", "0.27.1", "auto", "FLASH_ATTN"),
    (GPT_OSS, "A100-80GB", "0.27.1", "fp8", "TRITON_ATTN"),
    (GPT_OSS, "RTX-5090", "0.27.1", "auto", "TRITON_ATTN"),
    (GPT_OSS, "RTX-5090", "0.28", "auto", "FLASHINFER (XQA decode)"),
    # A 96-wide head: FA2 takes it in bf16, nobody but Triton in fp8 before Hopper.
    (PHI3, "A100-80GB", "0.27.1", "fp8", "TRITON_ATTN"),
    (PHI3, "A100-80GB", "0.27.1", "auto", "FLASH_ATTN"),
    # T4 (SM75): FA needs SM80; FlashInfer takes SM75 to 0.23, Triton after.
    (LLAMA, "T4", "0.21", "auto", "FLASHINFER"),
    (LLAMA, "T4", "0.24", "auto", "TRITON_ATTN"),
    # Gemma 3's image tokens attend both ways (model_type gemma3 is a prefix LM): only Triton and Flex support it,
    # whatever the cache; the 0.19 fit log of gemma-3-4b-it on an H100 prints "Using TRITON_ATTN attention
    # backend out of potential backends: ['TRITON_ATTN', 'FLEX_ATTENTION']".
    (GEMMA3, "H100", "0.21", "auto", "TRITON_ATTN"),
    (GEMMA3, "L4", "0.21", "fp8", "TRITON_ATTN"),
])
def test_the_backend_vllm_picks(model: str, gpu: str, release: str, kv: str, label: str) -> None:
    key = find_gpu(gpu).key
    kv_name = {"auto": "bfloat16", "fp8": "fp8_e4m3"}.get(kv, kv)
    path = attention_path(_model(model), rules_for(release), COMPUTE_CAPABILITY[key], kv_name, "bfloat16")
    assert path is not None and path.label == label


def test_a_float32_model_runs_on_triton() -> None:
    # FlashAttention and FlashInfer take float16 and bfloat16 only (supported_dtypes): the fit log of Llama-3.1-8B
    # in float32 on an H100 uses TRITON_ATTN.
    path = attention_path(_model(LLAMA), rules_for("0.21"), COMPUTE_CAPABILITY["H100-80GB"], "float32", "float32")
    assert path is not None and path.label == "TRITON_ATTN"


def test_no_backend_where_kvplan_does_not_pick_one() -> None:
    # Before 0.20 the estimate stays off the budget; MLA runs its own backends; AMD has no capability entry.
    assert attention_path(_model(LLAMA), rules_for("0.19"), (8, 9), "fp8_e4m3", "bfloat16") is None
    deepseek = _model("deepseek-ai/DeepSeek-V3")
    assert attention_path(deepseek, rules_for("0.27.1"), (9, 0), "bfloat16", "bfloat16") is None
    assert attention_path(_model(LLAMA), rules_for("0.27.1"), None, "fp8_e4m3", "bfloat16") is None


def test_flashinfer_bytes_in_the_estimate() -> None:
    native = AttentionPath("FLASHINFER", 256)
    # Qwen3.8-27B at tp 2, 0.27.1 (the fentz26 run): 12 heads of 256 a rank, 8,192-token steps, 35 FULL sizes:
    # max(413,138,944, 8,192 x 12 x 256 x 16 = 402,653,184) + 35 x 8,388,608 = 706,740,224.
    assert flashinfer_graph_bytes(native, rules_for("0.27.1"), runner="v1", full_graphs=35,
                                  max_num_batched_tokens=8192, heads_per_rank=12) == 706_740_224
    # From 0.26 the workspace grows with the step: Qwen3-32B (64 heads of 128) at 16,384 tokens:
    # 16,384 x 64 x 128 x 16 = 2,147,483,648, + 35 x 8 MiB; 0.25 keeps 394 MiB.
    wide = AttentionPath("FLASHINFER", 128)
    assert flashinfer_graph_bytes(wide, rules_for("0.26"), runner="v1", full_graphs=35,
                                  max_num_batched_tokens=16384, heads_per_rank=64) == 2_147_483_648 + 35 * 8 * MiB
    assert flashinfer_graph_bytes(wide, rules_for("0.25"), runner="v1", full_graphs=35,
                                  max_num_batched_tokens=16384, heads_per_rank=64) == 394 * MiB + 35 * 8 * MiB
    # Model Runner V2 allocates the workspace before the window: the wrappers alone.
    assert flashinfer_graph_bytes(wide, rules_for("0.29"), runner="v2", full_graphs=35,
                                  max_num_batched_tokens=16384, heads_per_rank=64) == 35 * 8 * MiB
    # TensorRT-LLM-gen / XQA decode: the one global workspace, 413,138,944 B.
    assert flashinfer_graph_bytes(AttentionPath("FLASHINFER", 128, "trtllm"), rules_for("0.21"), runner="v1",
                                  full_graphs=35, max_num_batched_tokens=8192, heads_per_rank=32) == 413_138_944
    # Piecewise warm-ups run no attention: nothing without FULL graphs, nothing on FlashAttention.
    assert flashinfer_graph_bytes(native, rules_for("0.27.1"), runner="v1", full_graphs=0,
                                  max_num_batched_tokens=8192, heads_per_rank=12) == 0
    assert flashinfer_graph_bytes(AttentionPath("FLASH_ATTN", 128), rules_for("0.27.1"), runner="v1",
                                  full_graphs=35, max_num_batched_tokens=8192, heads_per_rank=12) == 0


def test_an_fp8_cache_on_an_l40s_costs_flashinfers_buffers() -> None:
    # Llama-3.1-8B on V1 0.21 (256 sequences: 35 FULL sizes): the fp8 plan's estimate is the bf16 plan's
    # (FlashAttention, same graphs) plus 394 MiB + 35 x 8 MiB = 706,740,224 B, and its KV memory that much less.
    flags = dict(max_model_len=8192, version="0.21")
    l40s = find_gpu("L40S")
    bf16 = plan_vllm(_model(LLAMA), VllmFlags(**flags), l40s)
    fp8 = plan_vllm(_model(LLAMA), VllmFlags(kv_cache_dtype="fp8", **flags), l40s)
    assert (bf16.attention.label, fp8.attention.label) == ("FLASH_ATTN", "FLASHINFER")
    assert len(fp8.graphs.full) == 35
    assert fp8.cudagraph_bytes - bf16.cudagraph_bytes == fp8.flashinfer_graph_bytes == 706_740_224
    assert bf16.available_kv_cache_bytes - fp8.available_kv_cache_bytes == 706_740_224
    assert fp8.to_dict()["attention_backend"] == "FLASHINFER"


def test_each_attention_group_has_its_own_flashinfer_builder() -> None:
    # V1 builds one metadata builder per KV-cache group, each with its own workspace and decode wrappers: Gemma 2
    # 9B keeps its 21 sliding and 21 full layers in 2 groups, so an fp8 cache on an L4 (0.21, 2,048-token steps,
    # 256 sequences: 35 FULL sizes) costs 2 x (413,138,944 + 35 x 8,388,608) = 1,413,480,448 B.
    gemma = _model("google/gemma-2-9b-it")
    r = plan_vllm(gemma, VllmFlags(max_model_len=8192, version="0.21", kv_cache_dtype="fp8"), find_gpu("L4"))
    assert len(r.stages[0].layout.groups) == 2 and len(r.graphs.full) == 35
    assert r.flashinfer_graph_bytes == 2 * 706_740_224 == 1_413_480_448
    # Gemma 3 4B's 7 groups would pay 7 times, but it runs on Triton (a prefix LM over its image tokens).
    gemma3 = plan_vllm(_model(GEMMA3), VllmFlags(max_model_len=8192, version="0.21", kv_cache_dtype="fp8"),
                       find_gpu("L4"))
    assert len(gemma3.stages[0].layout.groups) == 7 and gemma3.flashinfer_graph_bytes == 0


def test_draft_tokens_drop_full_graphs_on_native_flashinfer() -> None:
    # resolve_cudagraph_mode_and_sizes: FlashInfer's native decode supports single-token decode only, so MTP
    # (q = 4) falls back to piecewise graphs (club-3090#1087 logs "CUDAGraphMode.FULL_AND_PIECEWISE is not
    # supported with spec-decode for attention backend FlashInferBackend ...; setting cudagraph_mode=PIECEWISE");
    # FlashAttention (bf16) keeps FULL graphs of 4 and 8 tokens (2 sequences x 4).
    gpu = find_gpu("RTX-5090")
    flags = dict(max_model_len=32768, version="0.27.1", max_num_seqs=2, speculative_method="mtp",
                 num_speculative_tokens=3, tensor_parallel_size=2)
    fp8 = plan_vllm(_model(QWEN36), VllmFlags(kv_cache_dtype="fp8", **flags), gpu)
    bf16 = plan_vllm(_model(QWEN36), VllmFlags(**flags), gpu)
    assert fp8.graphs.full == () and fp8.flashinfer_graph_bytes == 0
    assert bf16.graphs.full == (4, 8)
    # From 0.28 SM120 decodes through XQA, which takes uniform batches: FULL graphs stay, with the workspace.
    xqa = plan_vllm(_model(QWEN36), VllmFlags(kv_cache_dtype="fp8", **flags | {"version": "0.28"}), gpu)
    assert xqa.graphs.full == (4, 8) and xqa.flashinfer_graph_bytes == 413_138_944
