"""vLLM 0.8-0.10's V1 oracle: the settings that send a V1-default release back to the V0 engine.

EngineArgs._is_v1_supported_oracle (vllm/engine/arg_utils.py, read in every sdist from 0.8.0 to 0.10.2; 0.11
has no V0 left) falls back to V0 when VLLM_USE_V1 is unset. Two kinds: `_raise_or_fallback` ("X is not
supported by the V1 Engine. Falling back to V0."), which raises NotImplementedError when VLLM_USE_V1=1, and
`_warn_or_fallback` ("X is experimental on VLLM_USE_V1=1. Falling back to V0 Engine."), which only warns then.
Only the settings kvplan plans are read here; docs/engine-rules.md 1.1 lists them with their releases.
"""

from __future__ import annotations

from kvplan.engines.vllm_versions import Release
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.records import dataclass

# Architectures that inherit SupportsV0Only, with the releases that mark them: [first, end).
V0_ONLY: dict[str, tuple[Release, Release]] = {
    **dict.fromkeys(("MambaForCausalLM", "JambaForCausalLM"), ((0, 8, 0), (0, 10, 1))),
    **dict.fromkeys(("Mamba2ForCausalLM", "BambaForCausalLM", "Zamba2ForCausalLM"), ((0, 8, 0), (0, 9, 2))),
    **dict.fromkeys(("FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM"), ((0, 9, 0), (0, 9, 2))),
    "NemotronHForCausalLM": ((0, 9, 1), (0, 9, 2)),
    "MiniMaxText01ForCausalLM": ((0, 8, 3), (0, 10, 1)),
    "Plamo2ForCausalLM": ((0, 8, 5), (0, 10, 2)),
    "Phi4FlashForCausalLM": ((0, 10, 0), (0, 11, 0)),
    **dict.fromkeys(("WhisperForConditionalGeneration", "BloomForCausalLM"), ((0, 8, 0), (0, 10, 2))),
    **dict.fromkeys(("MllamaForConditionalGeneration", "BartForConditionalGeneration"), ((0, 8, 0), (0, 11, 0))),
    "Gemma3ForConditionalGeneration": ((0, 8, 0), (0, 8, 1)),
    **dict.fromkeys(("GlmForCausalLM", "Phi4MMForCausalLM"), ((0, 8, 0), (0, 8, 5))),
    **dict.fromkeys(("MiniCPMV", "MiniCPMO"), ((0, 8, 0), (0, 8, 3))),
}


@dataclass(frozen=True)
class Fallback:
    """A setting V1 does not take in this release: `feature` as vLLM names it; `raises`: whether VLLM_USE_V1=1
    then stops with NotImplementedError (else it runs V1 with a warning)."""

    feature: str
    raises: bool = True


def v1_fallback(
    model: ModelSpec, gpu: GpuSpec, release: Release, *, kv_cache_dtype: str, dtype: str, pp: int,
    cpu_offload: bool, bitsandbytes: bool, lora: bool, speculative: bool,
) -> Fallback | None:
    """The first setting, in the oracle's order, that sends this 0.8-0.10 release to V0; None where V1 runs."""
    if not (0, 8, 0) <= release < (0, 11, 0):
        return None
    capability = gpu.compute_capability
    first, end = V0_ONLY.get(model.architecture, ((0, 0, 0), (0, 0, 0)))
    checks: list[tuple[bool, Fallback]] = [
        # T4 (7.5) and V100 (7.0) until 0.10.1
        (capability is not None and capability < (8, 0) and release < (0, 10, 2),
         Fallback("Compute Capability < 8.0")),
        (kv_cache_dtype != "auto" and not _kv_dtype_on_v1(kv_cache_dtype, model, gpu, capability, release),
         Fallback("--kv-cache-dtype")),
        (cpu_offload and release < (0, 8, 3), Fallback("--cpu-offload-gb")),
        (dtype == "float32" and release < (0, 9, 2), Fallback("--dtype float32")),
        (bitsandbytes and release < (0, 8, 3), Fallback("--quantization bitsandbytes")),
        (first <= release < end, Fallback(str([model.architecture]))),
        (speculative and release < (0, 9, 0), Fallback("Speculative Decoding")),
        (lora and release < (0, 8, 3), Fallback("LORA", raises=False)),
        # 0.8.0-0.8.2 warn; 0.8.3-0.9.0 take only the Ray executor (kvplan plans the default, multiprocessing)
        (pp > 1 and release < (0, 8, 3), Fallback("PP", raises=False)),
        (pp > 1 and (0, 8, 3) <= release < (0, 9, 1), Fallback("Pipeline Parallelism without Ray distributed "
                                                               "executor")),
        # has_inner_state: 0.9.2-0.10.1 send every Mamba-state model to V0 ("Mamba is experimental ...")
        (any(s.kind == LayerKind.MAMBA for s in model.layers) and (0, 9, 2) <= release < (0, 10, 2),
         Fallback("Mamba", raises=False)),
    ]
    return next((fallback for hit, fallback in checks if hit), None)


def _kv_dtype_on_v1(kv_cache_dtype: str, model: ModelSpec, gpu: GpuSpec, capability: tuple[int, int] | None,
                    release: Release) -> bool:
    """Whether V1 takes this quantized KV cache: not at all in 0.8.0-0.8.1; from 0.8.2 fp8 through
    FlashAttention 3 on Hopper (flash_attn_supports_fp8), on ROCm from 0.9.0, on SM100 from 0.10.0, and for MLA
    models (FlashMLA, CUTLASS MLA) from 0.10.2."""
    if release < (0, 8, 2) or not kv_cache_dtype.startswith("fp8"):
        return False
    if capability is not None and capability[0] == 9:
        return True
    if gpu.vendor == "amd":
        return release >= (0, 9, 0)
    if capability == (10, 0) and release >= (0, 10, 0):
        return True
    return release >= (0, 10, 2) and any(s.kind == LayerKind.MLA for s in model.layers)
