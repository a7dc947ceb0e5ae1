"""Terms measured on the user's box (BoxProfile) in the vLLM model, and the calibration range it states.

The profiles are built by hand from the vLLM 0.19 reference logs (H100 80GB); the log lines they come from
are quoted beside each. Figures there are GiB to two decimals, so a replay agrees to the logs' rounding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvplan.capacity.deployment import BoxProfile, Deployment, Parallelism, Workload
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_calibration import (
    FIT_MAE_PCT,
    FIT_WORST_PCT,
    HOLDOUT_BY_GPU,
    HOLDOUT_BY_RELEASE,
    HOLDOUT_LOGS,
    HOLDOUT_MAE_PCT,
    HOLDOUT_WORST_PCT,
)
from kvplan.engines.vllm_engine import VllmEngine, VllmOptions
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli

H100 = find_gpu("H100")
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "vllm_accuracy.json"


def _gib(x: float) -> int:
    return round(x * GiB)


def _model(name: str):
    return resolve_model(name, offline=True).model


def _profile(model: str, **terms) -> BoxProfile:
    # "worker init memory snapshot: ... total_memory=79.19GiB" (every reference log)
    return BoxProfile(source="reference log", engine="vllm", engine_version="0.19.0", gpu_name="NVIDIA H100 80GB HBM3",
                      total_memory_bytes=_gib(79.19), model=model, **terms)


# Llama-3.1-8B-Instruct, tp 1, 0.95: "Total non KV cache memory: 17.13GiB; torch peak memory increase: 1.89GiB;
# non-torch forward increase memory: 0.25GiB; weights memory: 14.99GiB." / "... and 0.91 GiB for CUDAGraph
# memory" / "Available KV cache memory: 58.11 GiB".
LLAMA = _profile("meta-llama/Llama-3.1-8B-Instruct", weights_bytes=_gib(14.99), activation_peak_bytes=_gib(1.89),
                 non_torch_bytes=_gib(0.25), cuda_graph_bytes=_gib(0.91), max_num_batched_tokens=8192,
                 max_num_seqs=1024)
# CodeLlama-7b-hf, tp 1, 0.95: 0.77 GiB peak, 0.25 non-torch, 12.56 weights, 0.89 graphs -> 61.66 GiB.
CODELLAMA = _profile("codellama/CodeLlama-7b-hf", weights_bytes=_gib(12.56), activation_peak_bytes=_gib(0.77),
                     non_torch_bytes=_gib(0.25), cuda_graph_bytes=_gib(0.89), max_num_batched_tokens=8192,
                     max_num_seqs=1024)
# gpt-oss-20b, tp 2, 0.9: 2.87 GiB peak, 2.07 non-torch, 7.01 weights, 1.55 graphs -> 59.32 GiB.
GPT_OSS_TP2 = BoxProfile(source="reference log", engine="vllm", engine_version="0.19.0",
                         total_memory_bytes=_gib(79.19), tp=2, model="openai/gpt-oss-20b", weights_bytes=_gib(7.01),
                         activation_peak_bytes=_gib(2.87), non_torch_bytes=_gib(2.07),
                         cuda_graph_bytes=_gib(1.55), max_num_batched_tokens=8192, max_num_seqs=1024)


@pytest.mark.parametrize(("profile", "name", "tp", "util", "logged_gib"), [
    (LLAMA, "meta-llama/Llama-3.1-8B-Instruct", 1, 0.95, 58.11),
    (CODELLAMA, "codellama/CodeLlama-7b-hf", 1, 0.95, 61.66),
    (GPT_OSS_TP2, "openai/gpt-oss-20b", 2, 0.9, 59.32),
])
def test_replaying_the_logged_deployment_gives_back_its_kv_memory(profile, name, tp, util, logged_gib):
    # ceil(79.19 GiB x util) minus the measured terms: Llama 75.2305 - 14.99 - 1.89 - 0.25 = 58.1005 GiB.
    r = plan_vllm(_model(name), VllmFlags(max_model_len=8192, gpu_memory_utilization=util, version="0.19",
                                          tensor_parallel_size=tp), H100, profile=profile)
    assert set(r.profile.applied) == {"total memory", "non-torch", "CUDA graphs", "weights", "activation peak"}
    assert abs(r.available_kv_cache_bytes / GiB - logged_gib) / logged_gib < 0.005


def test_changing_only_utilization_moves_kv_memory_by_that_share_of_the_total():
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")

    def available(util: float) -> int:
        flags = VllmFlags(max_model_len=8192, gpu_memory_utilization=util, version="0.19")
        return plan_vllm(llama, flags, H100, profile=LLAMA).available_kv_cache_bytes

    total = LLAMA.total_memory_bytes
    moved = available(0.95) - available(0.90)
    # ceil(T x 0.95) - ceil(T x 0.90): 0.05 x T to the byte (each ceil adds under one byte).
    assert moved == math.ceil(total * 0.95) - math.ceil(total * 0.90)
    assert abs(moved - 0.05 * total) <= 1


def test_terms_apply_only_where_they_were_measured():
    qwen = _model("Qwen/Qwen2.5-7B-Instruct")
    r = plan_vllm(qwen, VllmFlags(max_model_len=8192, version="0.19"), H100, profile=LLAMA)
    # Another model: the box's total, non-torch and graphs carry over; the weights and peak do not.
    assert r.profile.applied == ("total memory", "non-torch", "CUDA graphs")
    assert any(s.startswith("weights") for s in r.profile.skipped)
    assert r.total_memory_bytes == _gib(79.19)
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")
    wide = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.19", tensor_parallel_size=2), H100, profile=LLAMA)
    # Another tp: NCCL differs, so only the total carries over.
    assert wide.profile.applied == ("total memory",)
    step = plan_vllm(llama, VllmFlags(max_model_len=8192, version="0.19", max_num_batched_tokens=4096), H100,
                     profile=LLAMA)
    # Another step: the weights carry over, the activation peak does not.
    assert "weights" in step.profile.applied and "activation peak" not in step.profile.applied


def test_profile_through_the_engine_account():
    d = Deployment(model=_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=H100,
                   engine=VllmOptions(version="0.19", gpu_memory_utilization=0.95), workload=Workload(8192, 1),
                   parallelism=Parallelism(), profile=LLAMA)
    a = VllmEngine().account(d)
    assert abs(a.kv_budget_bytes / GiB - 58.11) < 0.03
    assert all(t.label.endswith("measured on your box") for t in a.terms)
    assert "measured on your box" in a.calibration.checked_on


# --- calibration range ---------------------------------------------------------------------------------------

def test_inside_the_checked_range():
    d = Deployment(model=_model("meta-llama/Llama-3.1-8B-Instruct"), gpu=H100, engine=VllmOptions(version="0.19"),
                   workload=Workload(8192, 1))
    c = VllmEngine().account(d).calibration
    assert c.in_range and c.outside == () and "0.19 on H100-80GB" in c.checked_on


def test_outside_the_checked_range_says_what():
    d = Deployment(model=_model("Qwen/Qwen2.5-VL-7B-Instruct"), gpu=find_gpu("L4"),
                   engine=VllmOptions(version="0.10.1"), workload=Workload(8192, 1))
    c = VllmEngine().account(d).calibration
    assert not c.in_range
    assert c.outside == ("GPU L4", "vLLM 0.10.1", "architecture qwen2_5_vl")
    assert f"{HOLDOUT_LOGS} held-out logs" in c.error_band


def test_calibration_in_the_output(runner):
    out = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--gpu", "L4",
                  "--vllm-version", "0.11.0", "--offline")
    assert out.exit_code == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith("FITS")
    below = "\n".join(lines[1:5])
    assert "Outside the checked range (GPU L4, vLLM 0.11.0;" in " ".join(below.split())
    assert all(len(line) <= 80 for line in lines)
    inside = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--gpu", "H100",
                     "--vllm-version", "0.19", "--offline")
    assert "Outside the checked range" not in inside.stdout
    data = json.loads(run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192",
                              "--gpu", "L4", "--vllm-version", "0.11.0", "--offline", "--json").stdout)
    cal = data["gpus"][0]["calibration"]
    assert cal["in_range"] is False and cal["outside"] == ["GPU L4", "vLLM 0.11.0"]
    assert cal["error_band"].startswith("available KV memory off by")


def test_stated_error_bands_are_the_benchmark_results():
    # benchmarks/vllm_accuracy.py writes these; the engine quotes them (FIT_* and HOLDOUT_*).
    summary = json.loads(RESULTS.read_text())["summary"]
    fit, held = summary["fit"]["available_kv"], summary["holdout"]["available_kv"]
    assert (round(fit["mae_pct"], 2), round(abs(fit["worst_pct"]), 2)) == (FIT_MAE_PCT, FIT_WORST_PCT)
    assert (round(held["mae_pct"], 2), round(abs(held["worst_pct"]), 1), held["logs"]) == (
        HOLDOUT_MAE_PCT, HOLDOUT_WORST_PCT, HOLDOUT_LOGS)

    def bands(groups: dict) -> dict:
        return {name: (round(b["mae_pct"], 2), round(abs(b["worst_pct"]), 1), b["logs"])
                for name, b in groups.items() if name not in ("logged total", "unknown")}

    assert bands(summary["holdout_by_gpu"]) == HOLDOUT_BY_GPU
    assert bands(summary["holdout_by_release"]) == HOLDOUT_BY_RELEASE


def test_a_plan_quotes_its_own_gpus_and_releases_held_out_error():
    from kvplan.engines.vllm_calibration import calibration_for
    from kvplan.engines.vllm_versions import rules_for

    def band(gpu: str, version: str) -> str:
        return calibration_for(_model("meta-llama/Llama-3.1-8B-Instruct"), find_gpu(gpu), rules_for(version), "v1",
                               version).error_band

    # L4's 3 held-out logs (1.54% mean, -2.4% worst) and 0.10's 9 (0.85%, 2.1% worst); 0.10.1.1 is a 0.10 release.
    assert band("L4", "0.10.1.1").endswith(
        "; on L4 1.5% and 2.4% at worst (3 logs); on vLLM 0.10 0.8% and 2.1% at worst (9 logs)")
    # No held-out log on an A10G: said, not left out. On H100 only the release is outside the fit.
    assert "; no held-out log on A10G" in band("A10G", "0.10.1")
    assert "on H100-80GB" not in band("H100", "0.10.1")
