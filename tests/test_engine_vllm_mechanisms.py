"""vLLM's memory mechanisms beyond the budget formula: CUDA-graph capture sizes, mxfp4 padding, the vision
encoder's profiling, non-torch memory by GPU class, the sampler warm-up after the KV cache, and bitsandbytes'
4-bit forward."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_encoder import encoder_profile, v0_encoder_profile
from kvplan.engines.vllm_graphs import capture_sizes
from kvplan.engines.vllm_memory import (
    CONTEXT_BYTES,
    CONTEXT_FIXED_BYTES,
    NON_TORCH,
    bnb_4bit_forward_bytes,
    cuda_context_bytes,
    non_torch_class,
    non_torch_for,
)
from kvplan.engines.vllm_mxfp4 import FLASHINFER_TRTLLM, MARLIN, TRITON, backend_for, expert_bytes_per_rank
from kvplan.engines.vllm_versions import rules_for
from kvplan.errors import KvplanError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli

H100 = find_gpu("H100")


def _model(name: str):
    return resolve_model(name, offline=True).model


GPT_OSS = _model("openai/gpt-oss-20b")


# --- CUDA graphs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "engine", "gpu", "seqs", "tokens", "piecewise", "full", "largest"), [
    # 0.19 defaults on H100: [1, 2, 4] + every 8 below 256 (31) + every 16 from 256 to 512 (17) = 51, twice.
    ("0.19", "v1", "H100", 1024, 8192, 51, 51, 1024),
    # 256 sequences: piecewise still up to min(2 x 256, 512); full decode graphs only up to 256 (35 sizes),
    # as the 0.19.1 log prints: PIECEWISE=51 (largest=512), FULL=35 (largest=256).
    ("0.19", "v1", "H100", 256, 8192, 51, 35, 768),
    # 0.10.0: every 8 up to min(2 x seqs, 512), piecewise only: 3 + 64 = 67; with 128 seqs up to 256: 35.
    ("0.10.0", "v1", "H100", 256, 8192, 67, 0, 512),
    ("0.10.0", "v1", "H100", 128, 8192, 35, 0, 256),
    # V0: decode batches [1, 2, 4, 8, ..., 256] for 256 sequences: 35.
    ("0.7.3", "v0", "H100", 256, 8192, 35, 0, 256),
    # 0.28+ on B200: up to 1,024: 3 + 31 + 49 (256 .. 1,024 step 16) = 83.
    ("0.28", "v1", "B200", 1024, 8192, 83, 83, 2048),
    # The step caps the sizes: a 256-token step captures [1, 2, 4] + every 8 below 256 + 256 = 35 per mode.
    ("0.19", "v1", "H100", 1024, 256, 35, 35, 512),
])
def test_capture_sizes(version, engine, gpu, seqs, tokens, piecewise, full, largest):
    modes = capture_sizes(rules_for(version), engine, find_gpu(gpu), max_num_seqs=seqs, max_num_batched_tokens=tokens)
    assert (len(modes.piecewise), len(modes.full), modes.largest_total) == (piecewise, full, largest)


def test_eager_captures_nothing_and_subtracts_nothing():
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")
    eager = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.20.0", enforce_eager=True), H100)
    graphs = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.20.0"), H100)
    assert eager.cudagraph_bytes == 0
    assert eager.available_kv_cache_bytes - graphs.available_kv_cache_bytes == graphs.cudagraph_bytes


def test_graph_memory_grows_with_the_captured_sizes():
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")
    many = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.20.0"), H100)
    few = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.20.0", max_num_seqs=64), H100)
    assert few.graphs.count < many.graphs.count and few.cudagraph_bytes < many.cudagraph_bytes


# --- gpt-oss mxfp4 padding --------------------------------------------------------------------------------

def test_mxfp4_backends_by_gpu():
    assert backend_for(H100) is TRITON and backend_for(find_gpu("H200")) is TRITON
    assert backend_for(find_gpu("B200")) is FLASHINFER_TRTLLM
    assert backend_for(find_gpu("A100-80GB")) is MARLIN and backend_for(find_gpu("L4")) is MARLIN
    # Without OpenAI's triton_kernels (a 0.10.2-0.11 wheel) Hopper falls back to Marlin; a Blackwell without
    # FlashInfer takes Triton where it can.
    assert backend_for(H100, triton_kernels=False, flashinfer=False) is MARLIN
    assert backend_for(find_gpu("B200"), triton_kernels=True, flashinfer=False) is TRITON


@pytest.mark.parametrize(("version", "install", "backend"), [
    ("0.10.1", "image", "marlin"),  # torch 2.7.1: the Triton path needs 2.8
    ("0.10.2", "image", "triton"),  # the image installs triton_kernels
    ("0.11.0", "wheel", "marlin"),  # the wheel does not depend on it
    ("0.12.0", "wheel", "triton"),  # vendored in vllm/third_party from 0.12
])
def test_mxfp4_backend_by_release_and_install(version, install, backend):
    r = plan_vllm(GPT_OSS, VllmFlags(max_model_len=8192, version=version, install=install), H100)
    triton = plan_vllm(GPT_OSS, VllmFlags(max_model_len=8192, version="0.19"), H100).stages[0].memory.weights_bytes
    # Marlin pads H to 3,072 and I to 2,944 (above); Triton keeps H and swizzles: their expert bytes differ
    # by 11,083,579,392 - 10,988,421,120 = 95,158,272 B for gpt-oss-20b at tp 1.
    assert r.stages[0].memory.weights_bytes - triton == (95_158_272 if backend == "marlin" else 0)


def test_gpt_oss_120b_wheel_on_h100_as_logged():
    # vllm-project/vllm#27508: gpt-oss-120b on one H100, a pip install of 0.11 (a conda env), --gpu-memory-
    # utilization 0.95 --max-num-batched-tokens 1024, logged "Available KV cache memory: 1.71 GiB". A wheel has
    # neither FlashInfer (the sampler sorts 1,024 rows x 201,088 logits with PyTorch: 38 B each, 7.29 GiB) nor
    # triton_kernels (Marlin weights, 65.91 GiB; the 0.10.1 Marlin log of the same model prints 65.97):
    # 0.95 x 79.19 GiB - 65.91 - 7.31 - 0.25 non-torch = 1.76 GiB.
    model = _model("openai/gpt-oss-120b")
    flags = VllmFlags(max_model_len=131072, version="0.11.0", install="wheel", gpu_memory_utilization=0.95,
                      max_num_batched_tokens=1024)
    r = plan_vllm(model, flags, H100)
    assert round(r.first_rank_available_kv_bytes / GiB, 2) == 1.76
    assert r.refusal is not None and r.refusal.code == "one_request"  # 131,072 tokens need 4.54 GiB
    # The image (FlashInfer's sampler, Triton weights) would have left 6.89 GiB, room for the request. Its
    # sampler warm-up (2.91 GiB over 1,024 rows) then meets 2.83 GiB beside 0.11.0's 134 graphs (67 capture
    # sizes, step 8 to 512, FULL and PIECEWISE; 3.79 GiB): a call within kvplan's error, so only the room is pinned.
    image = plan_vllm(model, replace(flags, install="image"), H100)
    assert image.first_rank_available_kv_bytes > 6.8 * GiB
    assert image.refusal is None or image.refusal.code != "one_request"


def test_mxfp4_expert_bytes():
    # gpt-oss-20b: 24 layers x 32 experts, H = I = 2,880; per expert on Triton at tp 1 (I stays 2,880):
    # values: w13 packed [5,760, 1,440] stored as [1,472, 5,760] (1,440 -> 1,472 to 64) = 8,478,720 and w2
    # [2,880, 1,440] as [1,472, 2,880] = 4,239,360; scales 5,760 x 90 + 2,880 x 90 = 777,600, kept twice;
    # fp32 biases (5,760 + 2,880) x 4 = 34,560. 768 x 14,307,840 = 10,988,421,120 B.
    geo = dict(experts=32, layers=24, hidden=2880, intermediate=2880, bias_bytes=2)
    assert expert_bytes_per_rank(ranks=1, backend=TRITON, **geo) == 10_988_421_120
    # tp 2: I/2 = 1,440 -> 1,472; see the function's docstring: 768 x 7,363,584 = 5,655,232,512 B.
    assert expert_bytes_per_rank(ranks=2, backend=TRITON, **geo) == 5_655_232_512
    # Marlin (Ampere): I -> 2,944 (128), H -> 3,072 (256); values 2 x 2,944 x 3,072 / 2 + 3,072 x 2,944 / 2
    # = 13,565,952; scales 5,888 x 96 + 3,072 x 92 = 847,872; bf16 biases (5,888 + 3,072) x 2 = 17,920.
    # 768 x 14,431,744 = 11,083,579,392 B.
    assert expert_bytes_per_rank(ranks=1, backend=MARLIN, **geo) == 11_083_579_392


@pytest.mark.parametrize(("tp", "logged_gib"), [(1, 13.64), (2, 7.01)])
def test_gpt_oss_weights_as_vllm_loads_them_on_h100(tp, logged_gib):
    # vLLM 0.19 on H100 logs "Model loading took 13.64 GiB" (tp 1) and 7.01 GiB (tp 2); the checkpoint's
    # shapes give 12.83 and 6.43 GiB. The Triton padding and layout close the gap to within 1%.
    r = plan_vllm(GPT_OSS, VllmFlags(max_model_len=8192, version="0.19", tensor_parallel_size=tp), H100)
    assert abs(r.stages[0].memory.weights_bytes / GiB - logged_gib) / logged_gib < 0.01


# --- the vision encoder's profiling -----------------------------------------------------------------------

def test_encoder_profile_qwen25_vl():
    # One 16,384-token image (65,536 patches) fits the budget max(8,192, 16,384): width 1,280, gated MLP
    # 3,420: 65,536 x (2 x 1,280 + 3 x 3,420) x 2 B = 1,680,343,040 B of activations. From 0.9.1 the pixels
    # arrive in bf16 (65,536 x 1,176 x 2 B = 154,140,672 -> 1,834,483,712 B); before, in float32 beside the
    # encoder's bf16 copy (x (4 + 2) B = 462,422,016 -> 2,142,765,056 B). Embeddings 16,384 x 3,584 x 2 B =
    # 117,440,512 B stay cached.
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    kw = dict(dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=32768)
    e = encoder_profile(vl, **kw, pixels_in_model_dtype=True)
    assert (e.items, e.tokens, e.peak_bytes, e.cached_bytes) == (1, 16384, 1_834_483_712, 117_440_512)
    assert encoder_profile(vl, **kw, pixels_in_model_dtype=False).peak_bytes == 2_142_765_056


def test_encoder_profile_gemma3_fills_the_budget_with_images():
    # 256 tokens per image: 8,192 // 256 = 32 images, 131,072 patches through SigLIP (width 1,152, MLP 4,304):
    # 131,072 x (2,304 + 8,608) x 2 B + 131,072 x 588 x 2 B of bf16 pixels = 3,014,656,000 B.
    gemma = _model("google/gemma-3-4b-it")
    e = encoder_profile(gemma, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=8192,
                        pixels_in_model_dtype=True)
    assert (e.items, e.peak_bytes) == (32, 3_014_656_000)
    assert encoder_profile(_model("meta-llama/Llama-3.1-8B-Instruct"), dtype_bytes=2, max_num_batched_tokens=8192,
                           max_num_seqs=1024, max_model_len=8192, pixels_in_model_dtype=True) is None


def test_encoder_profile_qwen3_6_image():
    # Qwen3.6's processor: one 4,096 x 4,096 image, 65,536 patches of 3 x 2 x 16 x 16 = 1,536 values, 16,384
    # tokens. Its tower: width 1,152, a plain MLP of 4,304 (fc1 output and its GELU both live): 65,536 x
    # (2 x 1,152 + 2 x 4,304) x 2 B = 1,430,257,664 B, plus bf16 pixels 65,536 x 1,536 x 2 B = 201,326,592 B.
    # The embeddings cached: 16,384 x 2,048 (the 35B-A3B's text width) x 2 B = 67,108,864 B.
    moe = _model("nvidia/Qwen3.6-35B-A3B-NVFP4")
    e = encoder_profile(moe, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=131072,
                        pixels_in_model_dtype=True)
    assert (e.items, e.tokens, e.peak_bytes, e.cached_bytes) == (1, 16384, 1_631_584_256, 67_108_864)


def test_encoder_takes_kv_memory_on_a_24gb_card():
    # Qwen2.5-VL-7B on an RTX 4090 (0.19, 2,048-token step): the encoder's 1.7 GiB peak, not the language
    # model's 0.6 GiB, sets the activation term, so the KV cache loses about 1.1 GiB (~20,000 tokens).
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    r = plan_vllm(vl, VllmFlags(max_model_len=32768, version="0.19"), find_gpu("RTX-4090"))
    m = r.stages[0].memory
    # 65,536 patches x (2 x 1,280 + 10,260) x 2 B + the pixels in bf16 (65,536 x 1,176 x 2 B).
    assert m.activation_peak_bytes == m.encoder_bytes == 1_834_483_712  # pixels included; the LM's peak is smaller
    # 1.1 GiB at 57,344 B per token (28 layers x 4 KV heads x 128 x 2 x 2 B) is ~21,000 tokens: from ~96,000
    # with the language model's peak to ~75,900 (75,856 with the RTX 4090's 0.04 GiB of non-torch growth), and
    # 74,816 once the weights sit in the allocator's 2 MiB blocks (59,768,832 B more, 1,042 tokens).
    assert 74_000 < r.kv_cache_tokens < 76_000


def test_v0_runs_the_multimodal_prompt_through_the_language_model():
    # V0 (0.9.2, Unsloth's 2,048-token step and 1 sequence): min(1, 2,048 // 16,384) -> 1 dummy sequence whose
    # prompt holds one 16,384-token image and is not cut to the step, so the language model runs over 16,384
    # tokens: 0.096 GiB + 2.926 x 16,384 x 2 B x (18,944 + 3,584) = 2,263,045,111 B, with the embeddings
    # (117,440,512 B) and the pixels, fp16 from 0.9.1 (65,536 x 1,176 x 2 = 154,140,672 B), still held:
    # 2,534,626,295 B, above the encoder's own 1,834,483,712 B (the T4 logs of this run print 2.71 GiB).
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    e = v0_encoder_profile(vl, dtype_bytes=2, max_num_batched_tokens=2048, max_num_seqs=1, pixels_in_model_dtype=True)
    assert (e.items, e.lm_tokens, e.lm_rows, e.cached_bytes) == (1, 16384, 1, 117_440_512 + 154_140_672)
    # The encoder's own peak: 65,536 patches x (2 x 1,280 width + its 10,260-wide MLP) x 2 B = 1,680,343,040 B,
    # plus the fp16 pixels; before 0.9.1 the float32 pixels and the encoder's fp16 copy (308,281,344 +
    # 154,140,672 B) were both held.
    assert e.peak_bytes == 1_834_483_712
    assert v0_encoder_profile(vl, dtype_bytes=2, max_num_batched_tokens=2048, max_num_seqs=1,
                              pixels_in_model_dtype=False).peak_bytes == 2_142_765_056
    r = plan_vllm(vl, VllmFlags(max_model_len=16384, max_num_batched_tokens=2048, max_num_seqs=1, dtype="float16",
                                version="0.9.2", use_v1=False), find_gpu("T4"))
    assert r.stages[0].memory.activation_peak_bytes == 2_534_626_295
    # Without images V0's step is the step.
    assert v0_encoder_profile(_model("meta-llama/Llama-3.1-8B-Instruct"), dtype_bytes=2, max_num_batched_tokens=2048,
                              max_num_seqs=1, pixels_in_model_dtype=True) is None


# --- non-torch memory by GPU class and TP -------------------------------------------------------------------

@pytest.mark.parametrize(("gpu", "tp", "pp", "row"), [
    ("H100-80GB", 1, 1, "single"),
    ("H100-80GB", 1, 2, "pp"),
    ("H100-80GB", 2, 1, "nvls_tp2"),
    ("H200", 8, 1, "nvls_tp4"),
    ("L4", 2, 1, "other_tp"),
    ("A100-80GB", 4, 1, "other_tp"),
    ("H100-NVL", 2, 1, "other_tp"),  # NVLink bridges, no NVSwitch: no NVLink SHARP buffers
])
def test_non_torch_by_gpu_class_and_tp(gpu, tp, pp, row):
    assert non_torch_class(gpu, tp, pp) == row


def test_nccl_share_on_pcie_cards_is_smaller():
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")
    h100 = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.19", tensor_parallel_size=2), H100)
    l40s = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.19", tensor_parallel_size=2), find_gpu("L40S"))
    # 2.07 GiB (H100 logs, NVLink SHARP) against 0.30 GiB (A100/24 GB-card issue logs).
    assert round(h100.stages[0].memory.non_torch_bytes / GiB, 2) == 2.07
    assert round(l40s.stages[0].memory.non_torch_bytes / GiB, 2) == 0.30


# --- the sampler warm-up after the KV cache ------------------------------------------------------------------

def _gpt_oss(util: float, tp: int = 1, version: str = "0.19"):
    return plan_vllm(GPT_OSS, VllmFlags(max_model_len=8192, gpu_memory_utilization=util, version=version,
                                         tensor_parallel_size=tp), H100)


def test_gpt_oss_sampler_warmup_oom_at_095_and_start_at_09():
    # The reference logs: tp 1 and tp 2 at 0.95 fail warming up the sampler over 1,024 rows of a 201,088-token
    # vocabulary (2.9 GiB); tp 2 at 0.9 starts. The KV sizing itself is unchanged (58.47 GiB logged at tp 1).
    failed = _gpt_oss(0.95)
    assert failed.refusal is not None and failed.refusal.code == "sampler_warmup_oom"
    assert failed.refusal.message.startswith("CUDA out of memory occurred when warming up sampler with 1024 dummy")
    assert abs(failed.available_kv_cache_bytes / GiB - 58.47) < 0.05
    assert failed.warmup.free_bytes < failed.warmup.need_bytes
    assert _gpt_oss(0.95, tp=2).refusal.code == "sampler_warmup_oom"
    assert _gpt_oss(0.9, tp=2).refusal is None
    assert _gpt_oss(0.9).refusal is None


def test_the_second_graph_copy_is_the_018_019_estimate_pass():
    # 0.17 has no estimate pass before the KV cache: the same run keeps one copy of the graphs and starts.
    assert _gpt_oss(0.95, version="0.17").refusal is None
    assert _gpt_oss(0.95).warmup.held_twice_bytes == _gpt_oss(0.95).cudagraph_bytes


def test_other_fit_logs_at_095_start():
    # Llama-4-Scout at tp 4 starts at 0.95 with vLLM's own figures leaving it 1.0 GiB of room.
    scout = _model("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    r = plan_vllm(scout, VllmFlags(max_model_len=8192, gpu_memory_utilization=0.95, version="0.19",
                                   tensor_parallel_size=4), H100)
    assert r.refusal is None and r.warmup.held_twice_bytes == 0


def test_cli_warmup_oom_does_not_fit_with_a_fix(runner):
    base = ("estimate", "openai/gpt-oss-20b", "--max-model-len", "8192", "--gpu", "H100", "--vllm-version", "0.19",
            "--offline")
    args = (*base, "--gpu-memory-utilization", "0.95")
    result = run_cli(runner, *args, "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["reason"]["code"] == "sampler_warmup_oom"
    fixes = data["gpus"][0]["fixes"]
    fields = [c["field"] for f in fixes for c in f["changes"]]
    assert {"engine.gpu_memory_utilization", "engine.max_num_seqs"} & set(fields)
    same_gpu = [f for f in fixes if f["total_gpus"] == 1 and f["keeps_workload"]]
    assert same_gpu, fixes
    human = run_cli(runner, *args)
    assert human.stdout.startswith("DOES NOT FIT") and "Best fix: --" in human.stdout
    assert all(len(line) <= 80 for line in human.stdout.splitlines())
    ok = run_cli(runner, *base, "--gpu-memory-utilization", "0.9")
    assert ok.exit_code == 0 and ok.stdout.startswith("FITS")


def test_single_gpu_non_torch_growth_follows_the_architecture():
    # Hopper and later (and cards of unknown architecture) take the fit split's 0.25 GiB; compute capability
    # below 9.0 takes 0.04 GiB, the median of the growth-only fit set's 5 single-GPU pre-Hopper logs (0.02, 0.02,
    # 0.04, 0.10, 0.16). Parallel runs keep their own rows.
    assert [non_torch_class(k, 1, 1) for k in ("T4", "A100-80GB", "L4", "H100-80GB", "B200", "MI300X")] == [
        "single_pre_hopper", "single_pre_hopper", "single_pre_hopper", "single", "single", "single"]
    assert non_torch_class("T4", 2, 1) == "other_tp" and non_torch_class("L4", 1, 2) == "pp"
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    t4 = plan_vllm(m, VllmFlags(max_model_len=4096, version="0.8.5", use_v1=False, dtype="float16"), find_gpu("T4"))
    assert t4.stages[0].memory.non_torch_bytes == round(0.04 * GiB) == 42_949_673


def test_cuda_context_follows_the_cards_resident_threads():
    # Context = H100's 0.51 GiB less its local memory (132 SMs x 2,048 threads x 1 KiB = 276,824,064 B), plus
    # this card's: 547,608,330 - 276,824,064 = 270,784,266 B fixed.
    assert CONTEXT_FIXED_BYTES == 270_784_266
    assert cuda_context_bytes("H100-80GB") == CONTEXT_BYTES == 547_608_330
    assert cuda_context_bytes("RTX-3090") == 270_784_266 + 82 * 1536 * 1024 == 399_759_114
    assert cuda_context_bytes("T4") == 270_784_266 + 40 * 1024 * 1024 == 312_727_306
    assert cuda_context_bytes("MI300X") == CONTEXT_BYTES  # SMs unknown: H100's figure
    # Held-out checks, not fitted: vLLM 0.10.2 on an RTX 4090 found 23.21 of 23.65 GiB free at start-up
    # (benchmarks/logs/vllm-nontorch-fit.jsonl, memoryawarerlhf): 0.44 GiB in use, and 270,784,266 +
    # 128 x 1,536 x 1 KiB = 472,110,858 B = 0.4397 GiB. vLLM 0.6.4 on an RTX 3090 printed non_torch_memory
    # 0.35 GiB (context and growth; vllm-project/vllm#10517): 399,759,114 + 0.04 GiB = 0.41 GiB, where H100's
    # context alone would give 0.55 GiB.
    assert round(cuda_context_bytes("RTX-4090") / GiB, 2) == 0.44
    rtx3090 = non_torch_for("RTX-3090", 1, 1)
    assert round((rtx3090.context_bytes + rtx3090.growth_bytes) / GiB, 2) == 0.41
    assert non_torch_for("RTX-3090", 2, 1).growth_bytes == NON_TORCH["other_tp"].growth_bytes


def test_vllm_runtime_bitsandbytes_is_4bit_not_tgis_int8():
    # vLLM's BitsAndBytesConfig defaults to load_in_4bit without double quant: each linear weight becomes half a
    # byte plus one fp32 absmax per 64 values (0.5625 B), where TGI's --quantize bitsandbytes is int8. The
    # embedding and the head stay bf16. Llama-3.1-8B's 6,979,321,856 linear weights: 2 B -> 0.5625 B each.
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    linear = sum(g.params for g in m.param_groups if g.quantizable)
    assert linear == 6_979_321_856
    plain = plan_vllm(m, VllmFlags(max_model_len=8192, version="0.19"), find_gpu("L4"))
    bnb = plan_vllm(m, VllmFlags(max_model_len=8192, version="0.19", quantization="bitsandbytes"), find_gpu("L4"))
    saved = plain.stages[0].memory.weights_bytes - bnb.stages[0].memory.weights_bytes
    assert saved == linear * 2 - linear // 2 - linear // 64 * 4


def test_bitsandbytes_4bit_forward_holds_the_shard_and_its_dequantised_weight():
    # _apply_4bit_weight at the down projection (Qwen2.5-VL-7B: hidden 3,584, MLP 18,944), 16,384 tokens:
    # the shard's result 16,384 x 3,584 x 2 B = 117,440,512 B beside the preallocated output, and the
    # dequantised weight 3,584 x 18,944 x 2 B = 135,790,592 B: 253,231,104 B. Stock vLLM computes in
    # bfloat16, so a float16 model also holds a bf16 copy of the input: + 16,384 x 18,944 x 2 = 620,756,992 B.
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    unsloth = bnb_4bit_forward_bytes(vl, compute="model", dtype="float16", tp=1, tokens=16384)
    assert unsloth == 117_440_512 + 135_790_592 == 253_231_104
    assert bnb_4bit_forward_bytes(vl, compute="bfloat16", dtype="float16", tp=1, tokens=16384) == \
        253_231_104 + 620_756_992
    # A bfloat16 model makes no copy either way; tp 2 halves the MLP: 3,584 x 9,472 x 2 B = 67,895,296 B.
    assert bnb_4bit_forward_bytes(vl, compute="bfloat16", dtype="bfloat16", tp=1, tokens=16384) == 253_231_104
    assert bnb_4bit_forward_bytes(vl, compute="model", dtype="float16", tp=2, tokens=16384) == \
        117_440_512 + 67_895_296
    # Fused MoE experts under bitsandbytes are not this path.
    assert bnb_4bit_forward_bytes(_model("Qwen/Qwen3-30B-A3B"), compute="model", dtype="bfloat16", tp=1,
                                  tokens=8192) == 0


def test_unsloth_qwen25_vl_t4_activation_as_logged():
    # Unsloth's Qwen2.5-VL-7B GRPO notebook on a T4 (V0 0.9.2, bitsandbytes, float16, 1 sequence) prints
    # "PyTorch activation peak memory takes 2.71GiB". The language model's 16,384-token forward with the
    # embeddings and pixels held (2,534,626,295 B, test above) plus the bitsandbytes terms computed in the
    # model dtype (253,231,104 B): 2,787,857,399 B = 2.60 GiB. Stock vLLM's bf16 copy would make it 3.17 GiB.
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    flags = VllmFlags(max_model_len=16384, max_num_batched_tokens=2048, max_num_seqs=1, dtype="float16",
                      version="0.9.2", use_v1=False, quantization="bitsandbytes", bnb_compute="model")
    act = plan_vllm(vl, flags, find_gpu("T4")).stages[0].memory.activation_peak_bytes
    assert act == 2_534_626_295 + 253_231_104
    stock = plan_vllm(vl, replace(flags, bnb_compute="bfloat16"), find_gpu("T4"))
    assert stock.stages[0].memory.activation_peak_bytes == act + 620_756_992
    with pytest.raises(KvplanError, match="engine.bnb_compute"):
        plan_vllm(vl, replace(flags, bnb_compute="fp16"), find_gpu("T4"))
