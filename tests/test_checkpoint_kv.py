"""`--kv-cache-dtype auto` on a ModelOpt checkpoint that quantizes its KV cache (kvplan/engines/checkpoint_kv.py):
vLLM 0.14+ runs FP8 (0.20+ NVFP4 too), SGLang 0.5.3+ FP8 only, TensorRT-LLM both; older releases and the other
engines keep the model dtype. Figures are per-token bytes derived by hand from Qwen3-8B's geometry: 36 layers x 8
KV heads x 128 x 2 (K, V) = 73,728 values a token, 147,456 B at bf16, 73,728 B at fp8, and 36 x 8 x 144 =
41,472 B at NVFP4 (2 x (64 B of values + 8 scale bytes) a head)."""

from __future__ import annotations

import json

import pytest

from kvplan.capacity.deployment import Deployment, Workload
from kvplan.engines.sglang import SglangOptions
from kvplan.engines.trtllm import TrtllmOptions
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.errors import ConfigError
from kvplan.hardware.gpus import find_gpu
from kvplan.model.parse import parse_config
from kvplan.model.quant import parse_quant
from kvplan.planner.verdict import plan
from tests.conftest import run_json

BASE = json.loads(open("model_configs/Qwen__Qwen3-8B.json").read())  # noqa: SIM115
BF16, FP8, NVFP4 = 147_456, 73_728, 41_472


def _model(kv: object, key: str = "kv_cache_quant_algo"):
    raw = dict(BASE, quantization_config={"quant_method": "modelopt", "quant_algo": "FP8", key: kv})
    return parse_config(raw, name="nvidia/Qwen3-8B-FP8", source="test")


def _bytes_per_token(engine: object, kv: object = "FP8", gpu: str = "H100", key: str = "kv_cache_quant_algo",
                     kv_cache_dtype: str = "auto") -> int:
    d = Deployment(model=_model(kv, key), gpu=find_gpu(gpu), engine=engine, workload=Workload(8192, 1),
                   kv_cache_dtype=kv_cache_dtype)
    v = plan(d)
    assert v.account.refusal is None, v.account.refusal
    pool = v.account.pools[0]  # a block (vLLM 16 tokens, TensorRT-LLM 32) or SGLang's one-token page
    tokens_per_unit = 8192 // pool.per_request_units
    return pool.unit_bytes // tokens_per_unit


@pytest.mark.parametrize(("engine", "expected"), [
    (VllmOptions(version="0.13.0"), BF16),  # resolve_kv_cache_dtype_string arrives in 0.14.0
    (VllmOptions(version="0.14.0"), FP8),
    (VllmOptions(version="0.19.0"), FP8),
    (SglangOptions(version="0.5.2"), BF16),  # configure_kv_cache_dtype reads the checkpoint from 0.5.3
    (SglangOptions(version="0.5.3"), FP8),
    (TrtllmOptions(), FP8),
])
def test_auto_follows_a_modelopt_fp8_kv_cache_from_the_release_that_reads_it(engine, expected):
    assert _bytes_per_token(engine) == expected


def test_an_explicit_dtype_wins_over_the_checkpoint():
    assert _bytes_per_token(VllmOptions(version="0.19.0"), kv_cache_dtype="bfloat16") == BF16


@pytest.mark.parametrize(("engine", "gpu", "expected"), [
    (VllmOptions(version="0.19.0"), "B200", BF16),  # "nvfp4" not in 0.14-0.19's map: a warning, then auto
    (VllmOptions(version="0.21.0"), "B200", NVFP4),  # 0.20 maps it; nvfp4 runs from 0.21 on SM100
    (SglangOptions(version="0.5.13"), "B200", BF16),  # SGLang follows FP8 only
    (TrtllmOptions(), "B200", NVFP4),
])
def test_an_nvfp4_kv_cache(engine, gpu, expected):
    assert _bytes_per_token(engine, kv="NVFP4", gpu=gpu) == expected


def test_vllm_refuses_what_auto_picks_where_no_backend_runs_it():
    # vLLM 0.25 on an H100: auto resolves to nvfp4, which runs on SM100 only before 0.32, so vLLM cannot start.
    d = Deployment(model=_model("NVFP4"), gpu=find_gpu("H100"), engine=VllmOptions(version="0.25.0"),
                   workload=Workload(8192, 1))
    v = plan(d)
    assert v.account.refusal is not None and v.account.refusal.code == "kv_dtype"
    assert any("ModelOpt KV cache (NVFP4)" in n for n in v.notes)


@pytest.mark.parametrize(("scheme", "expected"), [
    ({"num_bits": 8, "type": "float", "dynamic": False}, "FP8"),
    ({"num_bits": 8, "type": "float", "dynamic": True}, None),  # vLLM warns and keeps auto
    ({"num_bits": 4, "type": "float"}, "NVFP4"),
    ({"num_bits": 8, "type": "int"}, None),
    ("fp8", "FP8"),
])
def test_config_json_kv_cache_scheme(scheme, expected):
    q = parse_quant({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": scheme}, None, "test")
    assert q is not None and q.kv_cache_quant == expected


def test_hf_quant_config_kv_cache_quant_algo():
    hf = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}
    q = parse_quant(None, hf, "test")
    assert q is not None and q.kv_cache_quant == "FP8"
    hf["quantization"]["kv_cache_quant_algo"] = None
    assert parse_quant(None, hf, "test").kv_cache_quant is None


def test_a_malformed_kv_cache_scheme_names_the_key():
    with pytest.raises(ConfigError, match="kv_cache_scheme"):
        parse_quant({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": 8}, None, "test")


def test_the_json_states_the_dtype_the_engine_runs(runner, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(BASE, quantization_config={"quant_method": "modelopt", "quant_algo": "FP8",
                                                               "kv_cache_quant_algo": "FP8"})))
    out = run_json(runner, "estimate", str(path), "--gpu", "H100", "--seq", "8192", "--vllm-version", "0.19",
                   "--offline")
    assert out["request"]["kv_cache_dtype"] == "fp8_e4m3"
    assert out["kv"]["model_bytes_per_token"] == FP8
    assert any("follows the checkpoint's ModelOpt KV cache (FP8)" in n for n in out["gpus"][0]["notes"])
