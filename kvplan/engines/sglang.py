"""The SGLang engine model: --mem-fraction-static, max_total_num_tokens, page size, the sliding-window pool.

SGLang (sglang/srt/model_executor/model_runner.py, profile_max_num_token) reserves a fraction of the memory
that was free BEFORE the weights were loaded, unlike vLLM's fraction of the total:
    rest = free_after_weights - free_before_load * (1 - mem_fraction_static)
    max_total_num_tokens = rest // cell_size, rounded down to a multiple of page_size
cell_size is the KV bytes of one token over every layer on this rank (K and V heads split over TP with at
least one per rank; an MLA latent is not split). Models with sliding-window layers get a second pool: per
full-attention token, swa_full_tokens_ratio (0.8) sliding-window tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.engines.vllm_memory import weights_per_stage
from kvplan.errors import InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.units import GiB

# Memory CUDA, the context and NCCL take before SGLang measures "free before load": vLLM 0.19 logs 0.51 GiB of
# non-torch memory at worker start on H100 (tp 1); SGLang's own start-up is assumed to cost the same.
CONTEXT_BYTES = round(0.51 * GiB)
SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MEM_FRACTION_STATIC = 0.9

# Which of SGLang's token pools holds a layer's per-token KV: "full", "swa" (the sliding-window pool), or None
# for layers with no per-token KV. Llama 4's chunked layers are counted in the full pool and Mamba /
# DeltaNet state in none: SGLang's hybrid chunk pool and its state pool are not modelled.
KIND_RULES: dict[LayerKind, str | None] = {
    LayerKind.FULL_ATTENTION: "full",
    LayerKind.SLIDING_WINDOW: "swa",
    LayerKind.CHUNKED_LOCAL: "full",
    LayerKind.MLA: "full",
    LayerKind.MAMBA: None,
    LayerKind.LINEAR_ATTENTION: None,
    LayerKind.SHARED_KV: None,
    LayerKind.NO_CACHE: None,
}


@dataclass(frozen=True)
class SglangReport:
    mem_fraction_static: float
    page_size: int
    free_before_load_bytes: int
    weights_bytes: int
    available_kv_bytes: int
    cell_size_bytes: int  # full-attention (and MLA) bytes per token on this rank
    swa_cell_size_bytes: int  # sliding-window bytes per token on this rank
    max_total_num_tokens: int
    swa_max_total_num_tokens: int

    def kv_bytes_for_tokens(self, tokens: int) -> int:
        """Pool bytes `tokens` full-attention tokens take, with the sliding-window pool's share that each brings."""
        return round(tokens * (self.cell_size_bytes + SWA_FULL_TOKENS_RATIO * self.swa_cell_size_bytes))

    def max_concurrency(self, seq_tokens: int) -> float:
        return self.max_total_num_tokens / seq_tokens if seq_tokens else 0.0


def plan_sglang(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    mem_fraction_static: float | None = None,
    page_size: int = 1,
    tp: int = 1,
    kv_cache_dtype: str = "auto",
    dtype: str | None = None,
    checkpoint_bytes: int | None = None,
) -> SglangReport:
    fraction = DEFAULT_MEM_FRACTION_STATIC if mem_fraction_static is None else mem_fraction_static
    if not 0 < fraction < 1:
        raise InputError(f"--mem-fraction-static must be in (0, 1), got {fraction}")
    if page_size < 1:
        raise InputError("--page-size must be >= 1")
    dtype = dtype or serving_dtype(model.config_dtype)
    kv = resolve_kv_dtype(kv_cache_dtype, dtype)
    weights = weights_per_stage(model, dtype=dtype, tp=tp, pp=1, quantization=None, checkpoint_bytes=checkpoint_bytes)[0][0]
    free_before = gpu.total_memory_bytes - CONTEXT_BYTES
    rest = free_before - weights - round(free_before * (1 - fraction))
    full = sum(s.kv_bytes_per_token(kv, tp) for s in model.layers if KIND_RULES[s.kind] == "full")
    swa = sum(s.kv_bytes_per_token(kv, tp) for s in model.layers if KIND_RULES[s.kind] == "swa")
    per_full_token = full + SWA_FULL_TOKENS_RATIO * swa
    if per_full_token <= 0:
        raise InputError(f"{model.name} has no attention KV cache for SGLang's token pool")
    tokens = max(0, int(rest // per_full_token))
    tokens -= tokens % page_size
    swa_tokens = int(tokens * SWA_FULL_TOKENS_RATIO) if swa else 0
    swa_tokens -= swa_tokens % page_size
    return SglangReport(fraction, page_size, free_before, weights, rest, full, swa, tokens, swa_tokens)
