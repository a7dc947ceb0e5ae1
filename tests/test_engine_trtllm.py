"""The TensorRT-LLM engine model: its KV budget is a fraction of what is left after the weights and the profiled
peak, cut into blocks of 32 tokens; figures derived by hand from its source rules (docs/engine-rules.md part 3)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvplan.capacity.deployment import BoxProfile, Deployment, Workload
from kvplan.engines.trtllm import TrtllmOptions
from kvplan.errors import FieldError
from kvplan.hardware.gpus import custom_gpu
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli, run_json

MODEL = "meta-llama/Llama-2-7b-hf"  # 32 layers x 32 KV heads x 128 x 2 (K, V) x 2 B (fp16) = 512 KiB per token
GPU = custom_gpu(80 * GiB)
# A box whose terms are known exactly, so the arithmetic below is TensorRT-LLM's alone: 12 GiB of weights, a
# 2 GiB peak of the estimation pass (8,192 tokens in 3 dummy requests of min(8,192, 4,096 - 1) tokens) and
# 1.5 GiB outside torch (1 GiB non-torch + 0.5 GiB CUDA graphs).
BOX = BoxProfile(source="box.json", engine="trtllm", total_memory_bytes=80 * GiB, non_torch_bytes=GiB,
                 cuda_graph_bytes=GiB // 2, weights_bytes=12 * GiB, activation_peak_bytes=2 * GiB,
                 model=MODEL, max_num_batched_tokens=8192, max_num_seqs=3)


def _d(options=None, profile=BOX, length=4096, concurrency=1, **kw):
    return Deployment(model=resolve_model(MODEL, offline=True).model, gpu=GPU, engine=options or TrtllmOptions(),
                      workload=Workload(max_model_len=length, concurrency=concurrency), profile=profile, **kw)


def test_fraction_of_what_is_left_in_blocks_of_32():
    a = plan(_d()).account
    # left = 80 - 12 - 2 - 1.5 = 64.5 GiB; x 0.9 = 58.05 GiB = int(69,256,347,648 x 0.9) = 62,330,712,883 B;
    # / 524,288 B per token = 118,886 tokens; ceil(118,886 / 32) = 3,716 blocks (118,912 tokens).
    assert a.kv_budget_bytes == int(64.5 * GiB * 0.9) == 62_330_712_883
    assert a.detail["tokens_from_memory"] == 118_886
    assert a.pools[0].budget_units == 3_716 and a.kv_cache_tokens == 118_912
    assert a.pools[0].unit_bytes == 32 * 524_288
    # A 4,096-token request holds 4,096 / 32 = 128 blocks: 3,716 // 128 = 29 requests (engine figure 29.03x).
    v = plan(_d(concurrency=29))
    assert v.fits and v.max_requests == 29 and not plan(_d(concurrency=30)).fits
    assert round(a.engine_concurrency, 2) == 29.03


def test_more_weights_cost_the_kv_cache_only_the_fraction_of_them():
    # One more GiB of weights takes 0.9 GiB from the KV budget, not 1 GiB: the fraction is of what is left.
    heavier = plan(_d(profile=replace(BOX, weights_bytes=13 * GiB))).account
    assert plan(_d()).account.kv_budget_bytes - heavier.kv_budget_bytes == pytest.approx(0.9 * GiB, abs=1)


def test_max_tokens_caps_and_fraction_and_block_size():
    # max_tokens 50,000 < 118,886: the smaller wins -> ceil(50,000 / 32) = 1,563 blocks.
    assert plan(_d(TrtllmOptions(max_tokens=50_000))).account.pools[0].budget_units == 1_563
    # fraction 0.5: 64.5 x 0.5 = 32.25 GiB -> 66,048 tokens -> 2,064 blocks.
    assert plan(_d(TrtllmOptions(free_gpu_memory_fraction=0.5))).account.pools[0].budget_units == 2_064
    # tokens_per_block 64: ceil(118,886 / 64) = 1,858 blocks of 64 tokens; a 4,096-token request takes 64.
    a = plan(_d(TrtllmOptions(tokens_per_block=64))).account
    assert (a.pools[0].budget_units, a.pools[0].per_request_units) == (1_858, 64)


def test_defaults_and_request_cap():
    a = plan(_d()).account
    assert (a.detail["tokens_per_block"], a.detail["max_num_tokens"], a.request_cap) == (32, 8192, 2048)
    assert plan(_d(TrtllmOptions(max_batch_size=8), concurrency=9)).limit == "request_cap"


def test_refusals_in_its_own_words():
    v = plan(_d(TrtllmOptions(free_gpu_memory_fraction=1.0)))
    assert v.account.refusal.message == ("Invalid freeMemFraction, freeMemFraction (1.000000) must be smaller than "
                                         "1.0f")
    assert v.account.refusal.field == "engine.free_gpu_memory_fraction"
    # 79 GiB of weights leave nothing.
    assert plan(_d(profile=replace(BOX, weights_bytes=79 * GiB))).limit == "no_kv_memory"
    with pytest.raises(FieldError, match="free_gpu_memory_fraction"):
        plan(_d(TrtllmOptions(free_gpu_memory_fraction=1.5)))


def test_modelled_terms_without_a_profile_and_the_calibration_range():
    a = plan(_d(profile=None)).account
    names = [t.name for t in a.terms]
    assert names == ["weights", "activation_peak", "non_torch", "reserved"]
    assert a.calibration is not None and not a.calibration.in_range and "not calibrated" in a.calibration.checked_on


def test_state_models_are_not_modelled():
    d = Deployment(model=resolve_model("nvidia/Nemotron-H-56B-Base-8K", offline=True).model, gpu=GPU,
                   engine=TrtllmOptions(), workload=Workload(max_model_len=8192))
    with pytest.raises(FieldError, match="state cache"):
        plan(d)


def test_cli_flags_belong_to_trtllm(runner):
    doc = run_json(runner, "estimate", MODEL, "--seq", "4096", "--gpu", "H100", "--engine", "trtllm",
                   "--max-batch-size", "8", "--free-gpu-memory-fraction", "0.8")
    g = doc["gpus"][0]
    assert g["engine"] == "trtllm" and g["request_cap"] == 8
    assert doc["request"]["engine_options"]["free_gpu_memory_fraction"] == 0.8
    r = run_cli(runner, "estimate", MODEL, "--gpu", "H100", "--max-batch-size", "8")
    assert r.exit_code == 2
    assert "--max-batch-size is an option of --engine trtllm, not vllm; vllm's counterpart is --max-num-seqs" in \
        r.output


def test_nvfp4_cache_bytes_and_where_it_runs():
    # get_cache_bytes_per_token: 2 x 32 x 32 x 128 = 262,144 values a token, half a byte each plus one fp8 scale
    # per 16: 131,072 + 16,384 = 147,456 B. The same box's 62,330,712,883 B hold 422,707 tokens, 13,210 blocks.
    from kvplan.hardware.gpus import find_gpu

    def on(key: str):
        d = _d(kv_cache_dtype="nvfp4")
        return plan(replace(d, gpu=replace(find_gpu(key), total_memory_bytes=80 * GiB))).account

    a = on("B200")
    assert a.pools[0].unit_bytes == 32 * 147_456
    assert a.detail["tokens_from_memory"] == 62_330_712_883 // 147_456 == 422_707
    assert a.pools[0].budget_units == 13_210
    refused = on("H100").refusal
    assert refused is not None and refused.code == "kv_dtype" and "Blackwell" in refused.message
