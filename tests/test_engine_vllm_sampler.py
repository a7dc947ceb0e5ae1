"""The sampler's share of vLLM's profiled activation peak: torch.sort's working set on the PyTorch path (V0, and
V1 before 0.17 or wherever FlashInfer is missing), FlashInfer's where the official image ships it, and the
fused-MoE workspace that 0.14+ keeps while the sampler runs."""

from __future__ import annotations

import pytest

from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_memory import (
    SAMPLER_BASE_BYTES,
    activation_peak_bytes,
    moe_workspace_bytes,
    sampler_bytes_per_logit,
    torch_sort_bytes_per_element,
)
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB, MiB

H100, T4 = find_gpu("H100"), find_gpu("T4")


def _model(name: str):
    return resolve_model(name, offline=True).model


LLAMA_3B = _model("meta-llama/Llama-3.2-3B-Instruct")
QWEN_MOE = _model("Qwen/Qwen3-30B-A3B")


@pytest.mark.parametrize(("rows", "per_element"), [
    # float32 values 4 + int64 indices 8, and meanwhile: int64 source indices 8 + cub's spare keys 4 and indices 8.
    (1, 32), (128, 32), (1024, 32),
    # Below 128 rows torch sorts everything at once: two int2 (index, segment) arrays 16 + sorted keys 4 + cub's
    # spare keys 4 and int2 values 8, beside the outputs.
    (2, 44), (48, 44), (127, 44),
])
def test_torch_sort_working_set(rows, per_element):
    assert torch_sort_bytes_per_element(rows) == per_element


def test_torch_sort_working_set_against_vllms_own_benchmark_of_it():
    # vllm-project/vllm#32558 measured the PyTorch path's peak with the input and its clone (4 + 4 B) held:
    # 1.25 GiB for 256 x 131,072 = 33,554,432 elements x 40 B, exactly.
    assert 256 * 131_072 * (torch_sort_bytes_per_element(256) + 8) == 1.25 * GiB
    # vllm-project/vllm#33538: 78.50 MiB for 48 x 32,768 = 1,572,864 x 52 B = 78.0 MiB (0.6% below).
    measured = 78.50 * MiB
    modelled = 48 * 32_768 * (torch_sort_bytes_per_element(48) + 8)
    assert abs(modelled - measured) / measured < 0.01


@pytest.mark.parametrize(("sampler", "rows", "per_logit"), [
    ("sort", 256, 4 + 32),  # float32 logits + the sort
    ("triton", 1024, 3.279 * 4),
    ("triton", 7, 4 + 44),  # 0.17+ sorts batches under 8 rows with PyTorch
    ("flashinfer_logits", 1024, 12),  # float32 logits, top_k_mask_logits' copy, its softmax
    ("flashinfer_probs", 1024, 8),  # float32 logits, softmax
    ("logits", 8192, 0),
])
def test_sampler_bytes_per_logit(sampler, rows, per_logit):
    assert sampler_bytes_per_logit(sampler, rows) == pytest.approx(per_logit)


def test_v0_sampler_sorts():
    # Llama-3.2-3B on vLLM 0.8.5's V0 engine (T4, fp16), 160 sequences in a 2,048-token step: the sampler's
    # 160 x 128,256 = 20,520,960 logits x (2 B fp16 + 4 B float32 + 32 B sort) = 779,796,480 B + the 24,696,062 B
    # base outweigh the forward; 0.749 GiB (the vLLM log of this run, tests/data/logs, prints 0.75 GiB).
    r = plan_vllm(LLAMA_3B, VllmFlags(max_model_len=2048, max_num_seqs=160, max_num_batched_tokens=2048,
                                      dtype="float16", version="0.8.5.post1", use_v1=False), T4)
    assert r.stages[0].memory.activation_peak_bytes == SAMPLER_BASE_BYTES + 20_520_960 * 38


def _qwen_moe_peak(version: str, install: str) -> int:
    r = plan_vllm(QWEN_MOE, VllmFlags(max_model_len=6144, version=version, install=install), H100)
    return r.stages[0].memory.activation_peak_bytes


def test_flashinfer_in_the_image_and_not_in_the_wheel_before_0_12():
    # Qwen3-30B-A3B on H100 (1,024 sequences, 8,192-token step): 1,024 x 151,936 = 155,582,464 logits. The
    # fused-MoE scratch is freed after each layer before 0.14, so the sampler alone sets the peak.
    logits = 1024 * 151_936
    # 0.10.2 from the wheel: no FlashInfer, PyTorch's sort: (2 + 4 + 32) B a logit = 5.53 GiB with the base
    # (the 0.10.2 log of this run in a virtualenv prints 5.58 GiB).
    assert _qwen_moe_peak("0.10.2", "wheel") == SAMPLER_BASE_BYTES + logits * 38
    # The image's FlashInfer: bf16 logits 2 + float32 logits, masked logits and probabilities 12.
    assert _qwen_moe_peak("0.10.2", "image") == SAMPLER_BASE_BYTES + logits * 14
    # 0.8's image carries FlashInfer 0.2.1.post2, which samples from probabilities: 2 + 8.
    assert _qwen_moe_peak("0.8.5", "image") == SAMPLER_BASE_BYTES + logits * 10
    # From 0.12 FlashInfer's sampler is opt-in: the image sorts too.
    assert _qwen_moe_peak("0.12.0", "image") == _qwen_moe_peak("0.12.0", "wheel") == SAMPLER_BASE_BYTES + logits * 38


def test_moe_workspace_held_through_the_sampler_from_0_14():
    moe = moe_workspace_bytes(QWEN_MOE, dtype="bfloat16", tp=1, max_num_batched_tokens=8192)
    sort = SAMPLER_BASE_BYTES + 1024 * 151_936 * 38
    assert _qwen_moe_peak("0.13.0", "image") == sort
    assert _qwen_moe_peak("0.14.0", "image") == sort + moe
    # Without a sampler (a non-last pipeline stage) the scratch counts once, in the forward, either way.
    kept, freed = (activation_peak_bytes(QWEN_MOE, dtype="bfloat16", tp=1, max_num_batched_tokens=8192,
                                         max_num_seqs=1024, runs_sampler=False, moe_workspace_kept=k)
                   for k in (True, False))
    assert kept == freed


def test_v0_ignores_the_install():
    flags = dict(max_model_len=2048, dtype="float16", version="0.8.5.post1", use_v1=False)
    image = plan_vllm(LLAMA_3B, VllmFlags(install="image", **flags), T4)
    wheel = plan_vllm(LLAMA_3B, VllmFlags(install="wheel", **flags), T4)
    assert image.available_kv_cache_bytes == wheel.available_kv_cache_bytes


def test_unknown_install_names_the_field():
    with pytest.raises(FieldError) as err:
        plan_vllm(LLAMA_3B, VllmFlags(max_model_len=2048, install="conda"), H100)
    assert err.value.field == "engine.install" and "image, wheel" in err.value.problem


def test_notes_say_what_kvplan_assumes_of_the_box():
    from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
    from kvplan.capacity.deployment import Workload
    from kvplan.engines.vllm_engine import VllmOptions

    def notes(version: str, install: str = "image") -> str:
        r = estimate(EstimateRequest(ModelSource("Qwen/Qwen3-8B", offline=True), Workload(max_model_len=8192),
                                     gpu=GpuChoice(("A100-80GB",)), engine=VllmOptions(version=version,
                                                                                         install=install)))
        return " ".join(r.results[0].verdict.account.notes)

    # 0.8.5's V1 charges whatever is on the device (vllm/v1/worker/gpu_worker.py, torch peak + all non-torch).
    assert "another process's too" in notes("0.8.5") and "another process's too" not in notes("0.9.1")
    assert "planned as the vllm/vllm-openai image" in notes("0.10.2")
    assert "from the pip wheel has no FlashInfer" in notes("0.10.2", install="wheel")
    assert "FlashInfer" not in notes("0.19")


def test_notes_name_the_mxfp4_kernels_an_install_gets():
    from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
    from kvplan.capacity.deployment import Workload
    from kvplan.engines.vllm_engine import VllmOptions

    def notes(version: str, install: str = "image") -> str:
        r = estimate(EstimateRequest(ModelSource("openai/gpt-oss-20b", offline=True), Workload(max_model_len=8192),
                                     gpu=GpuChoice(("H100",)), engine=VllmOptions(version=version, install=install)))
        return " ".join(r.results[0].verdict.account.notes)

    # A 0.11 wheel has no triton_kernels (Marlin); the image does; 0.12 vendors them, so no note there.
    assert "loads the mxfp4 experts for marlin" in notes("0.11.0", install="wheel")
    assert "mxfp4 experts" not in notes("0.11.0") and "mxfp4 experts" not in notes("0.12.0", install="wheel")
    # 0.10.1's torch 2.7.1 takes Marlin in the image too.
    assert "loads the mxfp4 experts for marlin" in notes("0.10.1")


def test_the_other_install_is_quoted_where_it_changes_the_plan():
    from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
    from kvplan.capacity.deployment import Workload
    from kvplan.engines.vllm_engine import VllmOptions
    from kvplan.units import fmt_gib

    def account(version: str, install: str):
        r = estimate(EstimateRequest(ModelSource("Qwen/Qwen3-30B-A3B", offline=True), Workload(max_model_len=8192),
                                     gpu=GpuChoice(("H100",)), engine=VllmOptions(version=version, install=install)))
        return r.results[0].verdict.account

    image, wheel = account("0.10.2", "image"), account("0.10.2", "wheel")
    # Only the sampler differs: 1,024 x 151,936 logits at (38 - 14) B each = 3,733,979,136 B (3.48 GiB) more peak
    # for the wheel's PyTorch sort, so that much less KV memory.
    assert image.kv_budget_bytes - wheel.kv_budget_bytes == 1024 * 151_936 * 24
    assert (f"installed as the pip wheel (--vllm-install wheel) it would have {fmt_gib(wheel.kv_budget_bytes)} "
            f"of KV memory, not {fmt_gib(image.kv_budget_bytes)}") in image.notes
    assert (f"installed as the vllm/vllm-openai image (--vllm-install image) it would have "
            f"{fmt_gib(image.kv_budget_bytes)} of KV memory, not {fmt_gib(wheel.kv_budget_bytes)}") in wheel.notes
    # From 0.12 both installs sort with PyTorch: nothing to quote.
    assert not any("--vllm-install" in n for n in account("0.12.0", "image").notes)
