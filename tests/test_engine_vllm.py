"""The vLLM engine model: vLLM's own worked numbers, its block/group math, start-up failure, and the CLI."""

from __future__ import annotations

import json

import pytest

from kvplan.engines.allocator import allocated_bytes
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_kv import VllmLayerSpec, kv_cache_layout
from kvplan.engines.vllm_memory import moe_workspace_bytes, padded_vocab, rotary_cache_bytes
from kvplan.errors import InputError
from kvplan.hardware.gpus import H100_SXM_CUDA_TOTAL_BYTES, find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB, MiB
from tests.conftest import run_cli

H100 = find_gpu("H100")


def _model(name: str):
    return resolve_model(name, offline=True).model


def _llama(**kw):
    flags = dict(max_model_len=8192, gpu_memory_utilization=0.95, version="0.19")
    flags.update(kw)
    return plan_vllm(_model("meta-llama/Llama-3.1-8B-Instruct"), VllmFlags(**flags), H100)


def test_llama_8b_h100_095_matches_vllm_log():
    # vLLM 0.19.0 logs 58.11 GiB available and 476,016 tokens (29,751 blocks). requested = ceil(0.95 x
    # 85,028,372,480) = 80,776,953,856 B; weights = 8,030,261,248 params x 2 B + 32 MiB rotary cache =
    # 14.99 GiB; activation 1.87 GiB (sampler term), non-torch 0.25 GiB -> 58.12 GiB.
    r = _llama()
    assert r.requested_bytes == 80_776_953_856
    assert abs(r.available_kv_cache_bytes / GiB - 58.11) < 0.02
    assert r.kv_cache_tokens % 16 == 0
    assert abs(r.kv_cache_tokens - 476_016) / 476_016 < 0.001
    assert "Available KV cache memory: 58.1" in "\n".join(r.log_lines)


def test_llama_weights_include_rotary_cache():
    # 131,072 positions x 128 rotary dims x 2 B = 32 MiB: the gap between parameters and vLLM's 14.99 GiB.
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    assert rotary_cache_bytes(m, 2) == 32 * MiB
    assert round(_llama().stages[0].memory.weights_bytes / GiB, 2) == 14.99


def test_given_kv_memory_block_math_is_exact():
    # Page per layer: 16 tokens x 8 KV heads x 128 x (K + V) x 2 B = 65,536 B; 32 layers -> 2 MiB per block.
    # 58.11 GiB = 59,504.64 MiB -> 29,752 blocks -> 476,032 tokens (vLLM: 476,016 from 58.1097... GiB).
    r = _llama(kv_cache_memory_bytes=round(58.11 * GiB))
    assert r.stages[0].layout.bytes_per_block == 2 * MiB
    assert r.num_blocks == 29_752
    assert r.kv_cache_tokens == 476_032
    assert r.blocks_per_request == 512  # cdiv(8192, 16)
    assert f"{r.max_concurrency:.2f}" == "58.11"


def test_fp8_kv_doubles_tokens_for_the_same_memory():
    auto = _llama(kv_cache_memory_bytes=40 * GiB)
    fp8 = _llama(kv_cache_memory_bytes=40 * GiB, kv_cache_dtype="fp8")
    # 40 GiB / 2 MiB = 20,480 blocks; fp8 halves the page -> 40,960.
    assert auto.num_blocks == 20_480 and fp8.num_blocks == 40_960
    assert fp8.kv_cache_tokens == 2 * auto.kv_cache_tokens


@pytest.mark.parametrize("tp", [4, 8])
def test_qwen25_7b_holds_one_kv_head_per_gpu(tp):
    # 4 KV heads: tp=4 -> 1 per GPU; tp=8 -> still 1 (replicated). Page = 16 x 1 x 128 x 2 x 2 B = 8,192 B;
    # 28 layers -> 229,376 B per block.
    r = plan_vllm(
        _model("Qwen/Qwen2.5-7B-Instruct"),
        VllmFlags(max_model_len=8192, tensor_parallel_size=tp, kv_cache_memory_bytes=GiB),
        H100,
    )
    assert r.stages[0].layout.page_bytes == 8192
    assert r.stages[0].layout.bytes_per_block == 229_376


def test_vocab_padding_to_64():
    assert padded_vocab(49_155) == 49_216 and padded_vocab(128_256) == 128_256


def test_gemma3_groups_and_blocks_per_request():
    # Gemma-3-4B: 34 layers, 5 full + 29 sliding (window 1,024). Group size 5: 1 full group + cdiv(29, 5) = 6
    # sliding groups. At L = T = 8,192: full 512 blocks, each sliding group cdiv(min(1023 + 8192, 8192), 16) + 1
    # = 513 -> 512 + 6 x 513 = 3,590 (vLLM: 204,817 blocks / 3,590 = 57.05x).
    r = plan_vllm(
        _model("google/gemma-3-4b-it"), VllmFlags(max_model_len=8192, kv_cache_memory_bytes=GiB, version="0.19"), H100
    )
    layout = r.stages[0].layout
    assert layout.group_size == 5
    assert len(layout.groups) == 7
    assert layout.blocks_per_request(8192, 8192) == 3590
    # 0.19 reports num_blocks // 7 groups x 16 tokens.
    assert r.kv_cache_tokens == r.num_blocks // 7 * 16


def test_gpt_oss_two_equal_groups():
    r = plan_vllm(_model("openai/gpt-oss-20b"), VllmFlags(max_model_len=8192, kv_cache_memory_bytes=GiB), H100)
    layout = r.stages[0].layout
    assert (layout.group_size, len(layout.groups)) == (12, 2)
    # full 512 + sliding (window 128) cdiv(127 + 8192, 16) capped at 8192 -> 512 + 1 = 513.
    assert layout.blocks_per_request(8192, 8192) == 1025


def test_layout_pads_uneven_groups_within_one_and_a_half():
    # 8 full + 9 sliding: 9 < 8 x 1.5, so both kinds form one group of 9 (the full group padded).
    specs = [VllmLayerSpec("full_attention", 512)] * 8 + [VllmLayerSpec("sliding_window", 512, 128)] * 9
    layout = kv_cache_layout(specs, 16)
    assert layout.group_size == 9 and len(layout.groups) == 2


def test_startup_failure_message_and_largest_max_model_len():
    # 4 GiB of KV: 2,048 blocks of 2 MiB; 131,072 tokens need 8,192 blocks (16 GiB) -> vLLM refuses and
    # estimates 2,048 x 16 = 32,768 tokens.
    r = _llama(max_model_len=131072, kv_cache_memory_bytes=4 * GiB)
    assert r.startup_error.startswith(
        "To serve at least one request with the models's max seq len (131072), (16.0 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (4.0 GiB). Based on the available memory, the "
        "estimated maximum model length is 32768."
    )
    assert r.max_model_len_fit == 32768


def test_current_version_defaults_and_tokens():
    r = plan_vllm(_model("meta-llama/Llama-3.1-8B-Instruct"), VllmFlags(max_model_len=8192), H100)
    assert r.flags.gpu_memory_utilization == 0.92
    assert (r.flags.max_num_batched_tokens, r.flags.max_num_seqs) == (8192, 1024)
    assert r.kv_cache_tokens == int(r.max_concurrency * 8192)
    assert r.cudagraph_bytes > 0


def test_small_gpu_defaults():
    r = plan_vllm(_model("meta-llama/Llama-3.2-1B-Instruct"), VllmFlags(max_model_len=4096), find_gpu("L4"))
    assert (r.flags.max_num_batched_tokens, r.flags.max_num_seqs) == (2048, 256)


def test_pipeline_parallel_takes_the_minimum_over_stages():
    r = _llama(pipeline_parallel_size=2)
    assert r.stages[1].memory.runs_sampler and not r.stages[0].memory.runs_sampler
    assert r.num_blocks == min(s.num_blocks for s in r.stages)
    assert r.limiting_stage == 1


def test_bad_flags():
    with pytest.raises(InputError, match="engine.version: is outside the releases kvplan models"):
        _llama(version="0.1")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in _llama(max_model_len=10**7).startup_error


def test_h100_total_is_the_logged_one():
    assert H100.total_memory_bytes == H100_SXM_CUDA_TOTAL_BYTES


def test_cli_json_top_level(runner):
    result = run_cli(
        runner,
        "estimate",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "8192",
        "--gpu",
        "H100",
        "--gpu-memory-utilization",
        "0.95",
        "--vllm-version",
        "0.19",
        "--offline",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["schema_version"] == 2 and data["request"]["engine"] == "vllm"
    assert abs(data["available_kv_cache_bytes"] / GiB - 58.11) < 0.02
    assert abs(data["kv_cache_tokens"] - 476_016) < 500
    assert abs(data["max_concurrency"] - 58.11) < 0.05
    # Whole requests: the usable blocks (without the null block) over 512 blocks per request, under max_num_seqs.
    fit = data["gpus"][0]
    assert data["max_requests"] == fit["pools"][0]["budget_units"] // 512 == fit["max_requests"]
    assert fit["pools"][0]["budget_units"] == fit["engine_detail"]["num_gpu_blocks"] - 1
    assert fit["log_lines"]


def test_cli_prints_vllm_lines_and_failure(runner):
    result = run_cli(
        runner,
        "estimate",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "131072",
        "--gpu",
        "H100",
        "--kv-cache-memory-bytes",
        "4GiB",
        "--offline",
    )
    assert result.exit_code == 1, result.output
    assert "To serve at least one request" in result.stdout
    # 4 GiB = 2,048 blocks of 2 MiB; one is the null block: 2,047 x 16 = 32,752 tokens is the longest context
    # the usable blocks hold, and the best fix that keeps 4 GiB is that length.
    assert "--max-model-len 32752" in result.stdout


def test_cli_generic_engine_keeps_fixed_overhead(runner):
    result = run_cli(
        runner,
        "estimate",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--seq",
        "8192",
        "--gpu",
        "H100",
        "--engine",
        "generic",
        "--offline",
        "--json",
    )
    data = json.loads(result.stdout)
    assert {t["name"]: t["bytes"] for t in data["gpus"][0]["terms"]}["overhead"] == 2 * GiB
    assert data["kv_cache_tokens"] is None


def test_fused_moe_workspace():
    # Qwen3-30B-A3B: 8,192 tokens x top_k 8 = 65,536 rows; expert width 768, hidden 2,048:
    # rows x (max(768, 2,048) + max(1,536, 2,048)) x 2 B = 536,870,912 B (0.5 GiB).
    qwen = _model("Qwen/Qwen3-30B-A3B")
    assert moe_workspace_bytes(qwen, dtype="bfloat16", tp=1, max_num_batched_tokens=8192) == 536_870_912
    # Mixtral-8x7B at tp=2: 8,192 x 2 = 16,384 rows; width 14,336 / 2 = 7,168, hidden 4,096:
    # 16,384 x (7,168 + 14,336) x 2 B = 704,643,072 B.
    mixtral = _model("mistralai/Mixtral-8x7B-Instruct-v0.1")
    assert moe_workspace_bytes(mixtral, dtype="bfloat16", tp=2, max_num_batched_tokens=8192) == 704_643_072
    # Dense models and gpt-oss's mxfp4 experts (OpenAI's Triton kernels) take none.
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "openai/gpt-oss-20b"):
        assert moe_workspace_bytes(_model(name), dtype="bfloat16", tp=1, max_num_batched_tokens=8192) == 0


def test_estimate_states_the_batch_need_in_vllm_blocks():
    # gpt-oss-20b: two KV-cache groups of 12 layers (sliding, full); page per layer 16 tokens x 8 KV heads x 64 x
    # (K, V) x 2 B = 32,768 B, so 12 x 32,768 = 393,216 B per block. One request of 131,072 tokens needs
    # cdiv(131,072, 16) = 8,192 full blocks + cdiv(min(128 - 1 + 2 x 8,192 in flight, 131,072), 16) + 1 = 1,033
    # sliding blocks (two batches in flight from 0.26) = 9,225; eight requests: 8 x 9,225 x 393,216 B (kvplan's
    # engine-neutral paging says less: 9 blocks).
    from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
    from kvplan.capacity.deployment import Workload

    r = estimate(
        EstimateRequest(
            ModelSource("openai/gpt-oss-20b", offline=True),
            Workload(max_model_len=131072, concurrency=8),
            gpu=GpuChoice(("H100",)),
        )
    )
    v = r.results[0].verdict
    assert v.pools[0].pool.per_request_units == 9225 and v.pools[0].pool.unit_bytes == 393_216
    assert v.kv_needed_bytes == 8 * 9225 * 393_216


def _activation_and_notes(runner, *args: str) -> tuple[int, list[str]]:
    from tests.conftest import run_json

    g = run_json(runner, "estimate", "Qwen/Qwen3-30B-A3B", "--seq", "8192", "--gpu", "H100", *args)["gpus"][0]
    return next(t["bytes"] for t in g["terms"] if t["name"] == "activation_peak"), g["notes"]


def test_vllm_install_changes_the_sampler_only_where_the_release_differs(runner):
    # 0.10.2 samples with FlashInfer where it is installed (the vllm/vllm-openai image) and with PyTorch's
    # sort otherwise (the pip wheel): the sort holds more bytes per logit, so the wheel's profiling peak is
    # larger. 0.19 makes FlashInfer opt-in for both, so the install does not change its peak.
    # 1,024 sampler rows x 151,936 vocabulary = 155,582,464 logits; the wheel's sort holds 2 + 4 + 32 = 38 B a
    # logit, the image's FlashInfer 2 + 12 = 14 B (tests/test_engine_vllm_sampler.py derives both): 24 B more.
    image, image_notes = _activation_and_notes(runner, "--vllm-version", "0.10.2", "--vllm-install", "image")
    wheel, wheel_notes = _activation_and_notes(runner, "--vllm-version", "0.10.2", "--vllm-install", "wheel")
    assert wheel - image == 1024 * 151_936 * 24
    assert any("pip wheel has no FlashInfer" in n for n in wheel_notes)
    assert any("planned as the vllm/vllm-openai image" in n for n in image_notes)
    same = {_activation_and_notes(runner, "--vllm-version", "0.19", "--vllm-install", i)[0] for i in ("image", "wheel")}
    assert len(same) == 1


def test_gemma4_pages_unify_by_a_longer_global_block():
    # gemma-4-26B-A4B on one GPU, bf16: 25 sliding layers of 8,192 B/token (window 1,024) and 5 global layers
    # of 4,096 B/token. Pages at block 16: 131,072 and 65,536 B; vLLM's unify_kv_cache_spec_page_size gives
    # the global layers blocks of 32 tokens (65,536 divides 131,072 twice). Groups of 5 layers: 1 global and
    # 5 sliding; a block id spans group_size = 5 tensors of one page each -> 5 x 131,072 = 655,360 B.
    specs = ([VllmLayerSpec("sliding_window", 8192, 1024)] * 5 + [VllmLayerSpec("full_attention", 4096)]) * 5
    layout = kv_cache_layout(specs, 16)
    assert layout.group_size == 5 and layout.bytes_per_block == 655_360 and layout.block_size == 16
    assert sorted((g.kind, g.block_size) for g in layout.groups) == [("full_attention", 32)] + [
        ("sliding_window", 16)] * 5
    # One request at 32,768 tokens, 8,192 per step: global cdiv(32,768, 32) = 1,024; each sliding group
    # cdiv(min(1,023 + 8,192, 32,768), 16) + 1 = 577 -> 1,024 + 5 x 577 = 3,909.
    assert layout.blocks_per_request(32768, 8192) == 3909
    # The H200 log (vLLM 0.20.2, clinician-gemma4-26b-a4b-h200-0.20.2 in benchmarks/logs) printed 71.67 GiB
    # and 30.04x: 71.67 GiB / 655,360 B = 117,424 blocks, less the null block, / 3,909 = 30.04.
    assert round((round(71.67 * GiB) // 655_360 - 1) / 3909, 2) == 30.04


def test_pages_that_do_not_divide_are_refused_with_both_sizes():
    specs = [VllmLayerSpec("sliding_window", 6144, 128), VllmLayerSpec("full_attention", 4096)]
    with pytest.raises(InputError, match="pages of 65,536 B and 98,304 B"):
        kv_cache_layout(specs, 16)


def test_qwen3_6_moe_float32_deltanet_state_sets_the_attention_block():
    # nvidia/Qwen3.6-35B-A3B-NVFP4, bf16 KV, one GPU. Each DeltaNet layer holds conv (2 x 16 x 128 + 32 x 128,
    # 3) x 2 B = 49,152 B and a float32 recurrent state (its config's mamba_ssm_dtype, which vLLM >= 0.17
    # honours) 32 x 128 x 128 x 4 B = 2,097,152 B: 2,146,304 B. Attention: 2 KV heads x 256 x 2 x 2 B =
    # 2,048 B/token, so vLLM raises the block to 16 x cdiv(2,146,304, 16 x 2,048) = 16 x 66 = 1,056 tokens.
    r = plan_vllm(_model("nvidia/Qwen3.6-35B-A3B-NVFP4"), VllmFlags(max_model_len=32768, version="0.24"), H100)
    layout = r.stages[0].layout
    assert layout.block_size == 1056
    # A block id spans 10 layers (10 attention and 30 DeltaNet layers, in groups of 10) of 1,056 x 2,048 B.
    assert layout.bytes_per_block == 10 * 1056 * 2048


def test_prefix_caching_on_a_deltanet_hybrid_holds_two_state_pages():
    # club-3090 #612 (vLLM 0.24.0, RTX 5090): Qwen3.6-35B-A3B NVFP4, fp8 KV, --enable-prefix-caching,
    # max_model_len 131,072. Pages: fp8 attention 2 x 256 x 2 x 1 B = 1,024 B/token; DeltaNet state 49,152 +
    # 2,097,152 = 2,146,304 B -> blocks of 16 x cdiv(2,146,304, 16 x 1,024) = 2,096 tokens. Prefix caching
    # puts the DeltaNet layers in mamba_cache_mode "align": 2 pages per request in each of the 3 state groups,
    # beside cdiv(131,072, 2,096) = 63 attention blocks -> 69 (66 with prefix caching off, vLLM's default for
    # hybrids). The log's 5.98 GiB then holds 299 blocks, 298 usable: 298 / 69 = 4.32x, as logged (4.33x).
    model = _model("nvidia/Qwen3.6-35B-A3B-NVFP4")
    flags = dict(max_model_len=131072, kv_cache_dtype="fp8", version="0.24.0", max_num_seqs=1)
    on = plan_vllm(model, VllmFlags(**flags, enable_prefix_caching=True), find_gpu("RTX-5090"))
    off = plan_vllm(model, VllmFlags(**flags), find_gpu("RTX-5090"))
    assert (on.stages[0].layout.block_size, on.blocks_per_request, off.blocks_per_request) == (2096, 69, 66)
    assert off.flags.enable_prefix_caching is False and on.flags.enable_prefix_caching is True
    blocks = round(5.98 * GiB) // on.stages[0].layout.bytes_per_block
    assert round((blocks - 1) / 69, 2) == 4.32
    # Before 0.15 there is no mamba_cache_mode: one state page a request either way.
    old = plan_vllm(model, VllmFlags(**{**flags, "version": "0.14.1"}, enable_prefix_caching=True), H100)
    assert old.stages[0].layout.mamba_cache_mode == "none"


def test_prefix_caching_on_a_mamba_hybrid_takes_all_mode_blocks(runner):
    # Nemotron-H-56B (bf16) on vLLM 0.19, one GPU: a Mamba2 state is conv 20,480 x 3 x 2 B + SSM 256 x 64 x 256 x 2 B =
    # 8,511,488 B; attention 8 KV heads x 128 x 2 x 2 B = 4,096 B/token. Without prefix caching the block is
    # 16 x cdiv(8,511,488, 16 x 4,096) = 2,080 tokens and a request at 8,192 tokens holds cdiv(8,192, 2,080) =
    # 4 attention blocks + 1 page in each of the 6 Mamba groups = 10. With it, vLLM (0.15+) uses mamba_cache_mode
    # "all": the block is a multiple of lcm(chunk_size 128, 16) = 128 holding a state, 128 x cdiv(2,078, 128) =
    # 2,176 tokens, and every group, Mamba too, holds cdiv(8,192, 2,176) = 4 blocks: 4 + 6 x 4 = 28.
    model = _model("nvidia/Nemotron-H-56B-Base-8K")
    off = plan_vllm(model, VllmFlags(max_model_len=8192, version="0.19"), find_gpu("H200"))
    on = plan_vllm(model, VllmFlags(max_model_len=8192, version="0.19", enable_prefix_caching=True),
                   find_gpu("H200"))
    assert (off.stages[0].layout.block_size, off.blocks_per_request) == (2080, 10)
    assert (on.stages[0].layout.block_size, on.blocks_per_request) == (2176, 28)
    out = run_cli(runner, "estimate", "nvidia/Nemotron-H-56B-Base-8K", "--seq", "8192", "--gpu", "H200",
                  "--vllm-version", "0.19", "--enable-prefix-caching", "--json")
    notes = " ".join(json.loads(out.stdout)["gpus"][0]["notes"])
    assert "mamba_cache_mode 'all': a request holds a state page per 2176-token block" in notes


@pytest.mark.parametrize(("version", "state_bytes", "block"), [
    # Nemotron-H-56B states no SSM dtype: conv 20,480 x 3 x 2 B = 122,880 B, SSM 256 x 64 x 256 values. Up to
    # 0.12 vLLM keeps the SSM state in the model's bf16 (8,388,608 B); 0.13-0.19 default it to float16 (the
    # same bytes); from 0.20 to float32: 16,777,216 B, so the block grows from 16 x cdiv(8,511,488, 65,536) =
    # 2,080 to 16 x cdiv(16,900,096, 65,536) = 4,128 tokens (4,096 B of attention a token).
    ("0.12.0", 8_511_488, 2080), ("0.19", 8_511_488, 2080), ("0.20.0", 16_900_096, 4128),
])
def test_nemotron_h_ssm_state_dtype_by_release(version, state_bytes, block):
    r = plan_vllm(_model("nvidia/Nemotron-H-56B-Base-8K"), VllmFlags(max_model_len=8192, version=version),
                  find_gpu("H200"))
    layout = r.stages[0].layout
    assert {g.state_bytes for g in layout.groups if g.kind == "mamba"} == {state_bytes}
    assert layout.block_size == block


def test_nemotron_3_nano_states_float32_and_vllm_reads_it_from_0_13():
    # Its config says mamba_ssm_cache_dtype float32: 64 x 64 x 128 x 4 B = 2,097,152 B + conv (4,096 + 2 x 8 x
    # 128) x 3 x 2 B = 36,864 B. vLLM 0.12 ignores the key (bf16: 1,048,576 + 36,864).
    model = _model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    states = {v: {g.state_bytes for g in plan_vllm(model, VllmFlags(max_model_len=8192, version=v), H100)
                  .stages[0].layout.groups if g.kind == "mamba"} for v in ("0.12.0", "0.13.0")}
    assert states == {"0.12.0": {1_085_440}, "0.13.0": {2_134_016}}


def test_mamba_ssm_cache_dtype_flag_sets_the_deltanet_state(runner, tmp_path):
    # Qwen3-Next-80B's DeltaNet state on vLLM: conv 8,192 x 3 x 2 B = 49,152 B, recurrent 32 x 128 x 128 values
    # in the conv dtype (bf16) by default: 1,097,728 B; --mamba-ssm-cache-dtype float32 (what PR #34489 says
    # Qwen3-Next needs) doubles the recurrent part: 49,152 + 2,097,152 = 2,146,304 B, and the attention block
    # (2,048 B/token) grows from 16 x cdiv(1,097,728, 32,768) = 544 to 16 x 66 = 1,056 tokens.
    model = _model("Qwen/Qwen3-Next-80B-A3B-Thinking")

    def layout(**kw):
        return plan_vllm(model, VllmFlags(max_model_len=32768, version="0.19", **kw), find_gpu("H200")).stages[0].layout

    default, fp32 = layout(), layout(mamba_ssm_cache_dtype="float32")
    assert {g.state_bytes for g in default.groups if g.kind == "mamba"} == {1_097_728} and default.block_size == 544
    assert {g.state_bytes for g in fp32.groups if g.kind == "mamba"} == {2_146_304} and fp32.block_size == 1056
    with pytest.raises(InputError, match="has no --mamba-ssm-cache-dtype"):
        plan_vllm(model, VllmFlags(version="0.10.0", mamba_ssm_cache_dtype="float32"), find_gpu("H200"))
    with pytest.raises(InputError, match="must be one of auto, float32, float16, bfloat16"):
        plan_vllm(model, VllmFlags(version="0.19", mamba_cache_dtype="fp8"), find_gpu("H200"))
    out = run_cli(runner, "estimate", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--seq", "32768", "--gpu", "H200",
                  "--vllm-version", "0.19", "--mamba-ssm-cache-dtype", "float32", "--json")
    assert "blocks of 1056 per layer group" in " ".join(json.loads(out.stdout)["gpus"][0]["notes"])


def test_mtp_draft_on_a_deltanet_hybrid():
    # Qwen3.6-35B-A3B NVFP4 with --speculative-config '{"method": "mtp", "num_speculative_tokens": 3}' (vLLM
    # 0.24, fp8 KV, 131,072 tokens, RTX 5090). The MTP block (mtp.* is excluded from the NVFP4 quantization,
    # so bf16): 844,640,768 parameters x 2 B = 1,689,281,536 B more weights. Its attention layer joins the 10
    # full-attention layers: groups of 11 (the 30 DeltaNet layers in 3 groups, padded to 33). Each DeltaNet conv
    # state keeps 3 + 3 rows: 8,192 x 6 x 2 B = 98,304 B + the float32 recurrent 2,097,152 = 2,195,456 B, so
    # the block is 16 x cdiv(2,195,456, 16 x 1,024) = 2,144 tokens. A request holds cdiv(131,072, 2,144) = 62
    # attention blocks and 1 + 3 state pages in each of the 3 state groups: 74 (66 without MTP).
    model = _model("nvidia/Qwen3.6-35B-A3B-NVFP4")
    assert model.mtp is not None and model.mtp.num_params == 844_640_768
    flags = dict(max_model_len=131072, kv_cache_dtype="fp8", version="0.24.0", max_num_seqs=1)
    base = plan_vllm(model, VllmFlags(**flags), find_gpu("RTX-5090"))
    mtp = plan_vllm(model, VllmFlags(**flags, speculative_method="mtp", num_speculative_tokens=3),
                    find_gpu("RTX-5090"))
    layout, memory = mtp.stages[0].layout, mtp.stages[0].memory
    assert memory.draft_bytes == 1_689_281_536
    assert memory.weights_bytes - base.stages[0].memory.weights_bytes == 1_689_281_536
    assert {g.state_bytes for g in layout.groups if g.kind == "mamba"} == {2_195_456}
    assert (layout.block_size, layout.group_size, mtp.blocks_per_request, base.blocks_per_request) == (
        2144, 11, 74, 66)


def test_weights_count_the_allocator_blocks_they_load_into():
    # torch counts a tensor of 10 MiB or more as its whole 2 MiB-rounded block unless the allocator splits the
    # rest off: it does when the rest is over 1 MiB and the request under max_split_size. Qwen2.5-1.5B in fp16:
    # the embedding, 151,936 x 1,536 x 2 B = 445.125 MiB, keeps its 446 MiB block (0.875 MiB over); gate_up
    # (52.5 MiB, block 54) and down (26.25 MiB, block 28) are split off by default, but vLLM 0.21+ loads under
    # max_split_size_mb 20, so each of the 28 layers keeps 1.5 + 1.75 MiB more: 95,420,416 B, the 0.10 GiB
    # by which 0.30's "Model loading took 2.98 GiB" exceeds the 2.88 GiB checkpoint.
    mib = 2**20
    assert allocated_bytes([52.5 * mib, 26.25 * mib]) == round(78.75 * mib)
    assert allocated_bytes([52.5 * mib, 26.25 * mib], max_split_bytes=20 * mib) == 82 * mib
    assert allocated_bytes([round(445.125 * mib)]) == 446 * mib
    # Under max_split the rest is split off when it is over 1 MiB (18.5 in a 20 MiB block), kept when not (19).
    assert allocated_bytes([round(18.5 * mib)], max_split_bytes=20 * mib) == round(18.5 * mib)
    assert allocated_bytes([19 * mib], max_split_bytes=20 * mib) == 20 * mib
    model = _model("Qwen/Qwen2.5-1.5B-Instruct")
    flags = dict(dtype="float16", max_model_len=4096)
    t4 = find_gpu("T4")
    before = plan_vllm(model, VllmFlags(version="0.20.0", **flags), t4).stages[0].memory.weights_bytes
    after = plan_vllm(model, VllmFlags(version="0.21.0", **flags), t4).stages[0].memory.weights_bytes
    assert after - before == 28 * round(3.25 * mib) == 95_420_416


def test_mtp_proposer_buffers_count_from_0_27():
    # V1's proposer (llm_base_proposer.py) keeps the target's hidden states and the draft's input embeddings,
    # bf16 [T, hidden] each, int32 token ids, int64 positions and slot mapping, an int32 arange of max(seqs + 1,
    # T) and int32 backup tokens. Qwen3.6-35B-A3B (hidden 2,048) at T = 8,192, 1 sequence: 8,192 x (2 x 2,048 x
    # 2 + 4 + 16) + 4 x (8,192 + 1) = 67,108,864 + 163,840 + 32,772 = 67,305,476 B. The runner builds it after the
    # worker's snapshot: 0.26's budget, measured from there, misses it; 0.27's, the drop in free memory, has it.
    model = _model("nvidia/Qwen3.6-35B-A3B-NVFP4")
    flags = dict(max_model_len=131072, kv_cache_dtype="fp8", max_num_seqs=1, max_num_batched_tokens=8192,
                 speculative_method="mtp", num_speculative_tokens=3)
    gpu = find_gpu("RTX-5090")
    assert plan_vllm(model, VllmFlags(version="0.26.0", **flags), gpu).stages[0].memory.proposer_bytes == 0
    new = plan_vllm(model, VllmFlags(version="0.27.1", **flags), gpu)
    assert new.flags.runner == "v1" and new.stages[0].memory.proposer_bytes == 67_305_476
    assert plan_vllm(model, VllmFlags(version="0.27.1", **(flags | {"speculative_method": None,
                                                                      "num_speculative_tokens": 0})),
                     gpu).stages[0].memory.proposer_bytes == 0


def test_mtp_draft_on_deepseek_v3_adds_an_mla_layer():
    # DeepSeek-V3, tp 8, vLLM 0.19: the MTP layer caches an MLA latent like the model's 61 layers, so a block
    # id spans 62 pages of 16 x (512 + 64) x 2 B = 18,432 B: 1,142,784 B (1,124,352 without).
    model = _model("deepseek-ai/DeepSeek-V3")
    flags = dict(max_model_len=32768, version="0.19", tensor_parallel_size=8)
    base = plan_vllm(model, VllmFlags(**flags), find_gpu("H200")).stages[0].layout
    mtp = plan_vllm(model, VllmFlags(**flags, speculative_method="mtp", num_speculative_tokens=1),
                    find_gpu("H200")).stages[0].layout
    assert (base.bytes_per_block, mtp.bytes_per_block) == (61 * 18_432, 62 * 18_432)


def test_speculative_methods_kvplan_does_not_model_are_refused():
    with pytest.raises(InputError, match='models the "mtp" method only'):
        plan_vllm(_model("meta-llama/Llama-3.1-8B-Instruct"),
                  VllmFlags(version="0.19", speculative_method="eagle", num_speculative_tokens=2), H100)
    with pytest.raises(InputError, match="has no MTP block kvplan sizes"):
        plan_vllm(_model("meta-llama/Llama-3.1-8B-Instruct"),
                  VllmFlags(version="0.19", speculative_method="mtp", num_speculative_tokens=2), H100)


def test_gdn_hybrid_graph_estimate_transient_is_named_from_0_26(runner):
    # vllm#50780: from 0.26 the first FULL capture of a gated-DeltaNet hybrid warms up with
    # max_num_tokens // largest FULL size context tokens a request and keeps a transient the estimate counts.
    # Qwen3.6-27B on one RTX 5090, default 256 sequences -> FULL sizes up to 256; 2,048 batched tokens
    # (0.27's default on this card) // 256 = 8 context tokens. Not modelled, so the plan names it.
    from tests.conftest import run_json

    def notes(model: str, version: str) -> str:
        g = run_json(runner, "estimate", model, "--seq", "32768", "--gpu", "RTX-5090",
                     "--vllm-version", version)["gpus"][0]
        return " ".join(g["notes"])

    hybrid = notes("nvidia/Qwen3.6-27B-NVFP4", "0.27.1")
    assert "vllm#50780" in hybrid and "256 requests of 8 context tokens" in hybrid
    assert "vllm#50780" not in notes("nvidia/Qwen3.6-27B-NVFP4", "0.25.1")
    assert "vllm#50780" not in notes("Qwen/Qwen3-8B", "0.27.1")


def test_hybrid_max_num_seqs_above_the_cache_blocks_is_refused_from_0_20(runner):
    # vllm#38270 (compilation.py resolve_cudagraph_mode_and_sizes): from 0.20 a hybrid with FULL decode graphs needs
    # one state block per decode sequence and refuses max_num_seqs above the KV cache's block count. Qwen3.6-27B
    # (48 DeltaNet + 16 attention layers) at 131,072 tokens on an H100 keeps fewer blocks than the default 1,024
    # sequences: refused, and the refusal names the plan's own block count, the most sequences it can take.
    from tests.conftest import run_json

    def gpu(*args: str) -> dict:
        return run_json(runner, "estimate", "nvidia/Qwen3.6-27B-NVFP4", "--seq", "131072", "--gpu", "H100",
                        *args)["gpus"][0]

    refused = gpu("--vllm-version", "0.20.0")
    blocks = refused["engine_detail"]["num_gpu_blocks"]
    assert refused["fits"] is False and refused["reason"]["code"] == "mamba_blocks"
    assert 0 < blocks < 1024 and f"Mamba cache blocks ({blocks})" in refused["reason"]["message"]
    assert {"field": "engine.max_num_seqs", "value": blocks} in [c for f in refused["fixes"] for c in f["changes"]]
    # At that many sequences it starts; 0.19 capped the graph sizes instead; eager mode captures no FULL graphs.
    assert gpu("--vllm-version", "0.20.0", "--max-num-seqs", str(blocks))["fits"] is True
    assert gpu("--vllm-version", "0.19.1")["fits"] is True
    from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
    from kvplan.capacity.deployment import Workload
    from kvplan.engines.vllm_engine import VllmOptions

    eager = estimate(EstimateRequest(ModelSource("nvidia/Qwen3.6-27B-NVFP4", offline=True),
                                     Workload(max_model_len=131072), gpu=GpuChoice(("H100",)),
                                     engine=VllmOptions(version="0.20.0", enforce_eager=True)))
    assert eager.results[0].verdict.account.refusal is None
