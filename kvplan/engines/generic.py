"""Engines kvplan sizes with a plain budget: `generic` (any paged server) and TGI, which has no finer model here.

Per GPU: kv_budget = floor(total x fraction) - weights on the fullest rank - overhead, cut into paged
requests by kvplan.capacity.kv (whole blocks per request, whole blocks of a shared prefix stored once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.kv import KvRequest, estimate_kv
from kvplan.capacity.weights import estimate_weights
from kvplan.engines.base import EngineAccount, Knobs, KvPool, MemoryTerm, Refusal
from kvplan.errors import FieldError
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.units import GiB, fmt_gib

# Overhead per GPU when no engine model applies: the CUDA context, allocator slack and the activation peak of
# a prefill step. vLLM 0.19 on H100 logs 0.25 GiB of non-torch memory and 0.77-3.99 GiB of activation peak
# across 61 runs; 2 GiB covers the middle of that range. Multi-GPU adds NCCL buffers: about 2.1 GiB per GPU
# at tp >= 2 in the same logs.
GENERIC_OVERHEAD_BYTES = 2 * GiB
GENERIC_MULTI_GPU_EXTRA_BYTES = 2 * GiB
# TGI's launcher: --max-total-tokens defaults to min(max_position_embeddings, 4096) (text-generation-launcher
# --help, TGI 2.x); --cuda-memory-fraction to 1.0.
TGI_DEFAULT_MAX_TOTAL_TOKENS_CAP = 4096


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


@dataclass(frozen=True)
class TgiOptions:
    """Text Generation Inference's launcher options that size memory."""

    engine: ClassVar[str] = "tgi"

    cuda_memory_fraction: float = 1.0
    max_batch_size: int | None = None
    overhead_bytes: int | None = None

    def validate(self) -> None:
        if not 0 < self.cuda_memory_fraction <= 1:
            raise FieldError("engine.cuda_memory_fraction", "must be in (0, 1]", self.cuda_memory_fraction)
        if self.max_batch_size is not None and not 1 <= self.max_batch_size <= 1 << 30:
            raise FieldError("engine.max_batch_size", "must be between 1 and 2^30", self.max_batch_size)


def _paged_account(
    d: Deployment, *, name: str, length: int, fraction: float, overhead: int | None, block: int, cap: int | None,
    notes: tuple[str, ...],
) -> EngineAccount:
    """The plain budget: requested - weights - overhead, requests in whole blocks with a shared prefix."""
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
    weights = estimate_weights(
        d.model, dtype=dtype, tp=p.tp, pp=p.pp, quantization=d.weights.quantization,
        override_bytes=d.weights.checkpoint_bytes,
    ).per_gpu_bytes
    weights = max(0, weights - d.weights.cpu_offload_bytes)
    requested = math.floor(d.gpu.total_memory_bytes * fraction)
    overhead = generic_overhead_bytes(p.tp * p.pp) if overhead is None else overhead
    budget = requested - weights - overhead
    one = kv.paged_bytes_per_request
    refusal = None
    if budget <= 0:
        refusal = Refusal("weights", f"weights ({fmt_gib(weights)}) and overhead ({fmt_gib(overhead)}) exceed the "
                          f"{fmt_gib(requested)} the server may use", "gpu")
    elif budget < one:
        refusal = Refusal("one_request", f"one request of {length:,} tokens needs {fmt_gib(one)} of KV; "
                          f"{fmt_gib(budget)} is left", "workload.max_model_len")
    return EngineAccount(
        engine=name,
        version=None,
        total_memory_bytes=d.gpu.total_memory_bytes,
        requested_bytes=requested,
        terms=(
            MemoryTerm("weights", weights, "weights on the fullest rank"),
            MemoryTerm("overhead", overhead, "activations and runtime (kvplan's generic figure)"),
        ),
        kv_budget_bytes=max(0, budget),
        pools=(KvPool("KV bytes", "byte", 1, max(0, budget), one, kv.shared_prefix_bytes),),
        max_model_len=length,
        request_cap=cap,
        engine_concurrency=max(0, budget) / one if one else 0.0,
        kv_cache_tokens=None,
        refusal=refusal,
        notes=notes,
        detail={"block_size": block, "paged_bytes_per_request": one, "overhead_bytes": overhead},
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
        return _paged_account(
            d, name=self.name, length=d.max_model_len, fraction=o.gpu_memory_utilization,
            overhead=o.overhead_bytes, block=o.block_size, cap=None,
            notes=("generic budget: a fixed overhead stands for activations and runtime; no engine rules",),
        )


class TgiEngine:
    """Text Generation Inference: the plain budget at TGI's memory fraction and its max-total-tokens default."""

    name: ClassVar[str] = "tgi"
    label: ClassVar[str] = "TGI"
    options_type: ClassVar[type] = TgiOptions
    knobs: ClassVar[Knobs] = Knobs(fp8_kv_dtype="fp8_e4m3", request_cap="engine.max_batch_size")

    def default_options(self) -> TgiOptions:
        return TgiOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        return p.tp  # --num-shard

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, TgiOptions):
            raise TypeError("TgiEngine needs TgiOptions")
        given = d.workload.max_model_len
        stated = d.model.max_position_embeddings or TGI_DEFAULT_MAX_TOTAL_TOKENS_CAP
        length = given or min(stated, TGI_DEFAULT_MAX_TOTAL_TOKENS_CAP)
        notes = ["TGI has no engine model in kvplan: its budget is the generic one at --cuda-memory-fraction"]
        if given is None:
            notes.append(f"--max-total-tokens not given: TGI's default min(max_position_embeddings, 4096) = {length:,}")
        return _paged_account(
            d, name=self.name, length=length, fraction=o.cuda_memory_fraction, overhead=o.overhead_bytes,
            block=16, cap=o.max_batch_size, notes=tuple(notes),
        )
