"""The `generic` engine: a plain budget for any paged server kvplan has no model of.

Per GPU: kv_budget = floor(total x fraction) - weights on the fullest rank - overhead, cut into paged
requests by kvplan.capacity.kv (whole blocks per request, whole blocks of a shared prefix stored once).
"""

from __future__ import annotations

import math
from typing import ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.kv import KvRequest, estimate_kv
from kvplan.capacity.weights import estimate_weights
from kvplan.engines.base import EngineAccount, Knobs, KvPool, MemoryTerm, Refusal
from kvplan.errors import FieldError
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.records import dataclass
from kvplan.units import GiB, fmt_gib

# Overhead per GPU when no engine model applies: the CUDA context, allocator slack and the activation peak of
# a prefill step. vLLM 0.19 on H100 logs 0.25 GiB of non-torch memory and 0.77-3.99 GiB of activation peak
# across 61 runs; 2 GiB covers the middle of that range. Multi-GPU adds NCCL buffers: about 2.1 GiB per GPU
# at tp >= 2 in the same logs.
GENERIC_OVERHEAD_BYTES = 2 * GiB
GENERIC_MULTI_GPU_EXTRA_BYTES = 2 * GiB


def generic_overhead_bytes(gpus: int) -> int:
    return GENERIC_OVERHEAD_BYTES + (GENERIC_MULTI_GPU_EXTRA_BYTES if gpus > 1 else 0)


@dataclass(frozen=True)
class GenericOptions:
    """A paged server with a fixed overhead: what fraction of the GPU it fills and what it keeps aside."""

    engine: ClassVar[str] = "generic"

    gpu_memory_utilization: float = 0.9
    overhead_bytes: int | None = None  # None: generic_overhead_bytes
    block_size: int = 16

    def validate(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise FieldError("engine.gpu_memory_utilization", "must be in (0, 1]", self.gpu_memory_utilization)
        if self.overhead_bytes is not None and not 0 <= self.overhead_bytes < 1 << 50:
            raise FieldError("engine.overhead_bytes", "must be a size of 0 or more", self.overhead_bytes)
        if not 1 <= self.block_size <= 1 << 20:
            raise FieldError("engine.block_size", "must be between 1 and 2^20", self.block_size)


def rank_weights_bytes(d: Deployment) -> int:
    """Weights on the fullest rank as loaded (tp x pp split by parameter group), less any CPU offload."""
    p = d.parallelism
    dtype = d.weights.dtype or serving_dtype(d.model.config_dtype)
    weights = estimate_weights(
        d.model, dtype=dtype, tp=p.tp, pp=p.pp, quantization=d.weights.quantization,
        override_bytes=d.weights.checkpoint_bytes,
    ).per_gpu_bytes
    return max(0, weights - d.weights.cpu_offload_bytes)


def paged_account(
    d: Deployment, *, name: str, length: int, fraction: float, overhead: int | None, block: int, cap: int | None,
    notes: tuple[str, ...], budget_terms: tuple[int, tuple[MemoryTerm, ...], int] | None = None,
) -> EngineAccount:
    """Requests in whole blocks with a shared prefix, against the plain budget requested - weights - overhead,
    or against `budget_terms` = (requested, terms, KV budget) an engine computed its own way."""
    p = d.parallelism
    dtype = d.weights.dtype or serving_dtype(d.model.config_dtype)
    kv_dtype = resolve_kv_dtype(d.kv_cache_dtype, dtype)
    if p.pp > d.model.num_layers:
        raise FieldError("parallelism.pp", f"exceeds the model's {d.model.num_layers} layers", p.pp)

    def kv_at(n: int):
        req = KvRequest(seq_tokens=n, batch=2, block_size=block, tp=p.tp, pp=p.pp,
                        shared_prefix_tokens=min(d.workload.shared_prefix_tokens, n))
        return estimate_kv(d.model, kv_dtype, req)

    kv = kv_at(length)
    weights = rank_weights_bytes(d)
    if budget_terms is None:
        requested = min(math.floor(d.gpu.total_memory_bytes * fraction), d.gpu.total_memory_bytes - d.gpu_in_use_bytes)
        overhead = generic_overhead_bytes(p.tp * p.pp) if overhead is None else overhead
        budget = requested - weights - overhead
        terms: tuple[MemoryTerm, ...] = (
            MemoryTerm("weights", weights, "weights on the fullest rank"),
            MemoryTerm("overhead", overhead, "activations and runtime (kvplan's generic figure)"),
        )
    else:
        requested, terms, budget = budget_terms
    one = kv.paged_bytes_per_request
    refusal = None
    if budget <= 0:
        refusal = Refusal("weights", f"weights ({fmt_gib(weights)}) and what the engine keeps aside exceed the "
                          f"{fmt_gib(requested)} it may use", "gpu")
    elif budget < one:
        refusal = Refusal("one_request", f"one request of {length:,} tokens needs {fmt_gib(one)} of KV; "
                          f"{fmt_gib(budget)} is left", "workload.max_model_len")
    return EngineAccount(
        engine=name,
        version=None,
        total_memory_bytes=d.gpu.total_memory_bytes,
        requested_bytes=requested,
        terms=terms,
        kv_budget_bytes=max(0, budget),
        pools=(KvPool("KV bytes", "byte", 1, max(0, budget), one, kv.shared_prefix_bytes),),
        max_model_len=length,
        request_cap=cap,
        engine_concurrency=max(0, budget) / one if one else 0.0,
        kv_cache_tokens=None,
        refusal=refusal,
        notes=notes,
        detail={"block_size": block, "paged_bytes_per_request": one},
        per_request_at=lambda n: (kv_at(n).paged_bytes_per_request,),
    )


class GenericEngine:
    """No engine's own rules: a fixed overhead and paged blocks. For servers kvplan has no model of."""

    name: ClassVar[str] = "generic"
    label: ClassVar[str] = "generic"
    options_type: ClassVar[type] = GenericOptions
    knobs: ClassVar[Knobs] = Knobs(fp8_kv_dtype="fp8", utilization=("engine.gpu_memory_utilization", 0.95))

    def default_options(self) -> GenericOptions:
        return GenericOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        return p.tp * p.pp * p.dp

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, GenericOptions):
            raise TypeError("GenericEngine needs GenericOptions")
        return paged_account(
            d, name=self.name, length=d.max_model_len, fraction=o.gpu_memory_utilization,
            overhead=o.overhead_bytes, block=o.block_size, cap=None,
            notes=("generic budget: a fixed overhead stands for activations and runtime; no engine rules",),
        )
