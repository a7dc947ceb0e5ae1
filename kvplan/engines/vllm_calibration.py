"""Where kvplan's vLLM model was checked against real start-up logs, and the error it showed there.

The fitted terms (activation peak, non-torch memory, CUDA graphs) come from the fit split: vLLM 0.19 on
H100-80GB, the architectures below; the single-GPU non-torch growth before Hopper from the growth-only fit set
(benchmarks/logs/vllm-nontorch-fit.jsonl, no held-out log in it). Everything else is the mechanism carried to
other GPUs, releases and architectures; the band stated for those is what the held-out logs showed (`python
benchmarks/vllm_accuracy.py`, benchmarks/results/vllm_accuracy.json, which a test keeps in step with this).
"""

from __future__ import annotations

from kvplan.engines.base import Calibration
from kvplan.engines.vllm_profile import ProfileUse
from kvplan.engines.vllm_versions import VllmRules
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.specs import ModelSpec

FIT_GPUS = ("H100-80GB",)
FIT_RELEASES = ((0, 19, 0),)
# model_type of every fit-split log with a config in the bundled library.
FIT_ARCHITECTURES = (
    "deepseek_v2", "gemma2", "gemma3", "gpt_oss", "granite", "llama", "llama4", "mixtral", "phi", "phi3",
    "qwen2", "qwen3", "qwen3_moe",
)
FIT_LOGS = 61
# Available KV memory, predicted from the flags alone against "Available KV cache memory" (percent of the
# logged figure): the fit split, and the held-out logs (other GPUs and releases) that could be evaluated.
FIT_MAE_PCT, FIT_WORST_PCT = 0.18, 2.23
HOLDOUT_MAE_PCT, HOLDOUT_WORST_PCT, HOLDOUT_LOGS = 2.45, 38.5, 51


def calibration_for(
    model: ModelSpec, gpu: GpuSpec, rules: VllmRules, engine: str, version: str, *,
    profiled: ProfileUse | None = None,
) -> Calibration:
    """Whether this plan lies inside the checked range, what lies outside, and the error band to expect."""
    outside = []
    if gpu.key not in FIT_GPUS:
        outside.append(f"GPU {gpu.key}")
    if rules.since not in FIT_RELEASES:
        outside.append(f"vLLM {version}")
    elif engine != "v1":
        outside.append(f"vLLM {version} V0")
    if model.model_type not in FIT_ARCHITECTURES:
        outside.append(f"architecture {model.model_type}")
    checked = f"vLLM 0.19 on H100-80GB, {FIT_LOGS} logs"
    if profiled is not None and profiled.applied:
        checked += f"; measured on your box: {', '.join(profiled.applied)}"
    if not outside:
        band = f"available KV memory off by {FIT_MAE_PCT:.2f}% on average, {FIT_WORST_PCT:.1f}% at worst"
    else:
        band = (f"available KV memory off by {HOLDOUT_MAE_PCT:.1f}% on average, {HOLDOUT_WORST_PCT:.0f}% at "
                f"worst on {HOLDOUT_LOGS} held-out logs")
    return Calibration(in_range=not outside, checked_on=checked, outside=tuple(outside), error_band=band)
