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
from kvplan.engines.vllm_versions import VllmRules, parse_release
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.specs import ModelSpec

FIT_GPUS = ("H100-80GB",)
FIT_RELEASES = ((0, 19),)  # minor lines
# model_type of every fit-split log with a config in the bundled library.
FIT_ARCHITECTURES = (
    "deepseek_v2", "gemma2", "gemma3", "gpt_oss", "granite", "llama", "llama4", "mixtral", "phi", "phi3",
    "qwen2", "qwen3", "qwen3_moe",
)
FIT_LOGS = 61
# Available KV memory, predicted from the flags alone against "Available KV cache memory" (percent of the
# logged figure): the fit split, and the held-out logs (other GPUs and releases) that could be evaluated.
FIT_MAE_PCT, FIT_WORST_PCT = 0.14, 1.92
HOLDOUT_MAE_PCT, HOLDOUT_WORST_PCT, HOLDOUT_LOGS = 3.55, 44.7, 74
# The same per GPU and per minor release (mean |error| %, worst |error| %, logs): a plan outside the fit quotes
# its own GPU's and release's next to the whole. Few logs stand behind most of them; the count is said.
HOLDOUT_BY_GPU = {
    "A100-40GB": (0.82, 1.4, 2), "A100-80GB": (0.74, 3.3, 10), "A100-80GB-PCIE": (2.81, 2.8, 1),
    "A40": (0.14, 0.1, 4), "B200": (1.19, 1.2, 1), "GH200-96GB": (41.66, 41.7, 1), "H100-80GB": (7.97, 44.7, 11),
    "H200": (1.02, 1.0, 1), "H200-NVL": (0.02, 0.0, 4), "L4": (1.54, 2.4, 3), "L40S": (1.57, 1.6, 1),
    "MI300X": (4.1, 4.1, 1), "RTX-3090": (3.16, 3.3, 3), "RTX-4090": (1.01, 1.8, 3), "RTX-5090": (7.11, 17.6, 4),
    "RTX-A5000": (0.07, 0.1, 1), "RTX-PRO-6000": (5.67, 19.4, 7), "T4": (1.73, 7.1, 14),
}
HOLDOUT_BY_RELEASE = {
    "0.6": (3.36, 4.1, 4), "0.7": (9.15, 44.7, 5), "0.8": (0.67, 1.9, 10), "0.9": (15.76, 34.4, 3),
    "0.10": (0.85, 2.1, 9), "0.11": (0.88, 2.7, 10), "0.13": (0.07, 0.1, 1), "0.16": (1.38, 1.6, 2),
    "0.19": (2.31, 3.3, 3), "0.20": (1.02, 1.0, 1), "0.22": (41.66, 41.7, 1), "0.23": (0.02, 0.0, 4),
    "0.24": (5.1, 5.4, 2), "0.25": (15.02, 15.0, 1), "0.26": (0.43, 1.3, 8), "0.27": (6.33, 19.4, 7),
    "0.28": (2.81, 2.8, 1), "0.30": (4.3, 4.3, 1), "0.31": (0.8, 0.8, 1),
}


def calibration_for(
    model: ModelSpec, gpu: GpuSpec, rules: VllmRules, engine: str, version: str, *,
    profiled: ProfileUse | None = None,
) -> Calibration:
    """Whether this plan lies inside the checked range, what lies outside, and the error band to expect."""
    outside = []
    fitted_release = parse_release(version)[:2] in FIT_RELEASES
    if gpu.key not in FIT_GPUS:
        outside.append(f"GPU {gpu.key}")
    if not fitted_release:
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
        if gpu.key not in FIT_GPUS:
            band += "; " + _group_band(gpu.key, HOLDOUT_BY_GPU.get(gpu.key))
        if not fitted_release:
            major, minor_number, _ = parse_release(version)  # "current" is the newest release's minor
            minor = f"{major}.{minor_number}"
            band += "; " + _group_band(f"vLLM {minor}", HOLDOUT_BY_RELEASE.get(minor))
    return Calibration(in_range=not outside, checked_on=checked, outside=tuple(outside), error_band=band)


def _group_band(group: str, figures: tuple[float, float, int] | None) -> str:
    """'on L4 1.5% and 2.4% at worst (3 logs)', or that no held-out log ran there."""
    if figures is None:
        return f"no held-out log on {group}"
    mae, worst, logs = figures
    return f"on {group} {mae:.1f}% and {worst:.1f}% at worst ({logs} log{'s' if logs != 1 else ''})"
