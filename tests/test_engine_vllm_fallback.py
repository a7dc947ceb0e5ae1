"""vLLM 0.8-0.10's V1 oracle (EngineArgs._is_v1_supported_oracle, read in each sdist): the settings that send a
V1-default release to V0, and VLLM_USE_V1=1's refusal of them. benchmarks/results/vllm_accuracy.md ("Engine
chosen") checks the oracle against the 24 collected 0.8-0.10 logs that name their engine: 23 agree."""

from __future__ import annotations

import pytest

from kvplan.engines.vllm import VllmFlags, plan_vllm, resolve_flags
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from tests.conftest import REPO, run_cli, run_json


def _model(name: str):
    return resolve_model(name, offline=True).model


LLAMA = _model("meta-llama/Llama-3.2-3B-Instruct")
FP8, LORA, PP2 = {"kv_cache_dtype": "fp8"}, {"lora": LoraSlots()}, {"pipeline_parallel_size": 2}


@pytest.mark.parametrize(("version", "gpu", "given", "engine", "feature"), [
    # `current_platform.get_device_capability().major < 8` until 0.10.1 (unsloth's T4 notebooks log V0)
    ("0.8.5", "T4", {}, "v0", "Compute Capability < 8.0"),
    ("0.10.1", "T4", {}, "v0", "Compute Capability < 8.0"),
    ("0.10.2", "T4", {}, "v1", None),
    ("0.11.0", "T4", {}, "v1", None),  # no V0 left
    # any quantized KV cache in 0.8.0-0.8.1; from 0.8.2 fp8 through FlashAttention 3 on Hopper only, SM100 from 0.10
    ("0.8.1", "H100", FP8, "v0", "--kv-cache-dtype"),
    ("0.8.2", "H100", FP8, "v1", None),
    ("0.9.2", "A100-80GB", FP8, "v0", "--kv-cache-dtype"),
    ("0.9.2", "B200", FP8, "v0", "--kv-cache-dtype"),
    ("0.10.0", "B200", FP8, "v1", None),
    # LoRA "experimental" to 0.8.2; pipeline parallel only with Ray in 0.8.3-0.9.0 (kvplan plans the default)
    ("0.8.2", "H100", LORA, "v0", "LORA"),
    ("0.8.3", "H100", LORA, "v1", None),
    ("0.9.0", "H100", PP2, "v0", "Pipeline Parallelism without Ray distributed executor"),
    ("0.9.1", "H100", PP2, "v1", None),
    # V1_SUPPORTED_DTYPES = [bfloat16, float16] until 0.9.1
    ("0.9.1", "H100", {"dtype": "float32"}, "v0", "--dtype float32"),
    ("0.9.2", "H100", {"dtype": "float32"}, "v1", None),
])
def test_the_v1_oracle_per_release(version, gpu, given, engine, feature):
    f = resolve_flags(LLAMA, VllmFlags(max_model_len=4096, version=version, **given), find_gpu(gpu))
    assert (f.engine, f.v0_fallback) == (engine, feature)


def test_vllm_use_v1_refuses_what_v1_cannot_run_and_only_warns_on_experimental_features():
    # _raise_or_fallback raises NotImplementedError under VLLM_USE_V1=1; _warn_or_fallback (LoRA to 0.8.2) runs V1.
    with pytest.raises(FieldError, match="VLLM_USE_V1=1 is not supported with Compute Capability < 8.0"):
        resolve_flags(LLAMA, VllmFlags(max_model_len=4096, version="0.9.0", use_v1=True), find_gpu("T4"))
    f = resolve_flags(LLAMA, VllmFlags(max_model_len=4096, version="0.8.2", use_v1=True, **LORA), find_gpu("H100"))
    assert (f.engine, f.v0_fallback) == ("v1", None)


def test_a_v0_only_hybrid_is_named_not_planned_as_v1():
    # NemotronHForCausalLM inherits SupportsV0Only in 0.9.1: vLLM runs it on V0, whose Mamba cache kvplan does not
    # model, so the plan stops there instead of planning V1's hybrid manager; VLLM_USE_V1=1 is refused too.
    nemotron = _model("nvidia/Nemotron-H-56B-Base-8K")
    with pytest.raises(FieldError, match="V0"):
        plan_vllm(nemotron, VllmFlags(max_model_len=8192, version="0.9.1", tensor_parallel_size=2), find_gpu("H100"))
    with pytest.raises(FieldError, match="NemotronHForCausalLM"):
        plan_vllm(nemotron, VllmFlags(max_model_len=8192, version="0.9.1", tensor_parallel_size=2, use_v1=True),
                  find_gpu("H100"))


def test_the_plan_says_it_fell_back(runner):
    data = run_json(runner, "estimate", "meta-llama/Llama-3.2-3B-Instruct", "--offline", "--gpu", "T4",
                    "--seq", "4096", "--vllm-version", "0.8.5")
    assert any("falls back to V0" in n and "Compute Capability < 8.0" in n for n in data["gpus"][0]["notes"])


def test_check_names_vllm_use_v1_where_v1_refuses_the_deployment(runner, tmp_path):
    # A T4 on the 0.9.2 image with VLLM_USE_V1=1: vLLM raises NotImplementedError (compute capability < 8.0), so
    # check cannot evaluate it and says why; unset, the same deployment falls back to V0 and is planned.
    manifest = (REPO / "tests" / "fixtures" / "deploy" / "t4-vllm-0.9.2-use-v1.yaml").read_text()
    forced, unset = tmp_path / "forced.yaml", tmp_path / "unset.yaml"
    forced.write_text(manifest)
    unset.write_text(manifest.replace('          env: [{name: VLLM_USE_V1, value: "1"}]\n', ""))
    refused = run_cli(runner, "check", str(forced), "--offline")
    assert refused.exit_code == 2 and "VLLM_USE_V1=1 is not supported with" in " ".join(refused.stdout.split())
    planned = run_cli(runner, "check", str(unset), "--offline")
    assert planned.exit_code == 0 and "fits" in planned.stdout
