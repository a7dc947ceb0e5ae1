"""Capacity planning: does batch x seq fit a GPU, how many requests fit, how long a context, and what helps.

Engine-neutral budget (the `estimate` default engine model lives in kvplan.engines): per GPU,
    kv_budget = total_memory * gpu_memory_utilization - weights_per_gpu - overhead
and the KV need is the paged accounting of kvplan.capacity.kv on the fullest GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvplan.capacity.kv import KvEstimate, KvRequest, estimate_kv
from kvplan.capacity.weights import WeightEstimate, estimate_weights
from kvplan.errors import InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import KvDtype, resolve_kv_dtype
from kvplan.model.specs import ModelSpec
from kvplan.units import GiB

# Generic overhead per GPU when no engine model is asked for: the CUDA context, allocator slack and the
# activation peak of a prefill step. vLLM 0.19 on H100 logs 0.25 GiB of non-torch memory and 0.77-3.99 GiB
# of activation peak across 61 runs; 2 GiB covers the middle of that range. Multi-GPU adds NCCL buffers:
# about 2.1 GiB per GPU at tp >= 2 in the same logs.
GENERIC_OVERHEAD_BYTES = 2 * GiB
GENERIC_MULTI_GPU_EXTRA_BYTES = 2 * GiB


def requests_phrase(n: int) -> str:
    """'1 request', '16 requests'."""
    return f"{n:,} request" if n == 1 else f"{n:,} requests"


def generic_overhead_bytes(tp: int, pp: int) -> int:
    return GENERIC_OVERHEAD_BYTES + (GENERIC_MULTI_GPU_EXTRA_BYTES if tp * pp > 1 else 0)


@dataclass(frozen=True)
class PlanRequest:
    seq_tokens: int
    batch: int = 1
    kv_cache_dtype: str = "auto"
    dtype: str | None = None  # served weight dtype; None = the engine's reading of the config
    block_size: int = 16
    tp: int = 1
    pp: int = 1
    shared_prefix_tokens: int = 0
    gpu_memory_utilization: float = 0.9
    overhead_bytes: int | None = None  # None = generic_overhead_bytes(tp, pp)
    weights_bytes: int | None = None
    quantization: str | None = None
    num_gpus: int | None = None  # total GPUs; None = tp * pp. More than tp * pp means data-parallel replicas

    def validate(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise InputError(
                f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.num_gpus is not None and self.num_gpus < self.tp * self.pp:
            raise InputError(
                f"--num-gpus {self.num_gpus} is fewer than --tp {self.tp} x --pp {self.pp} = {self.tp * self.pp}"
            )
        if self.overhead_bytes is not None and self.overhead_bytes < 0:
            raise InputError("--overhead cannot be negative")

    @property
    def replicas(self) -> int:
        return (self.num_gpus or self.tp * self.pp) // (self.tp * self.pp)

    def kv_request(self, seq_tokens: int | None = None, batch: int | None = None) -> KvRequest:
        return KvRequest(
            seq_tokens=self.seq_tokens if seq_tokens is None else seq_tokens,
            batch=self.batch if batch is None else batch,
            block_size=self.block_size,
            tp=self.tp,
            pp=self.pp,
            shared_prefix_tokens=min(self.shared_prefix_tokens, self.seq_tokens if seq_tokens is None else seq_tokens),
        )


@dataclass(frozen=True)
class EngineBudget:
    """An engine model's answer for one GPU: what it leaves for KV, and its own report (e.g. vLLM's lines)."""

    requested_bytes: int
    weights_per_gpu_bytes: int
    overhead_bytes: int  # everything else the engine subtracts (activation peak, non-torch, CUDA graphs)
    kv_budget_bytes: int
    max_concurrency: int | None = None  # the engine's own count, when it has one
    fits: bool | None = None  # False when the engine would refuse to start
    detail: object | None = None
    # The batch's KV in the engine's own units (vLLM: blocks per request of every KV-cache group, including
    # the in-flight tokens a sliding window reserves); None = kvplan's engine-neutral paged accounting.
    kv_needed_bytes: int | None = None


# An engine's budget model: (model, request, gpu) -> EngineBudget. None means the generic budget above.
BudgetModel = Callable[[ModelSpec, "PlanRequest", GpuSpec], EngineBudget]


@dataclass(frozen=True)
class Suggestion:
    change: str  # "--kv-cache-dtype fp8"
    effect: str  # "holds 24 requests at 32,768 tokens"


@dataclass(frozen=True)
class GpuFit:
    """The answer for one GPU type."""

    gpu: GpuSpec
    total_memory_bytes: int
    requested_bytes: int  # total * utilization
    weights_per_gpu_bytes: int
    overhead_bytes: int
    kv_budget_bytes: int  # what is left for KV on the fullest GPU (can be negative)
    kv_needed_bytes: int  # batch x seq, paged, on the fullest GPU
    fits: bool
    max_concurrency: int  # requests of seq tokens that fit (all replicas)
    max_seq_tokens: int  # longest context that fits `batch` requests (0: not even one token)
    headroom_bytes: int  # kv_budget - kv_needed
    suggestions: tuple[Suggestion, ...] = ()
    engine: object | None = None  # the engine model's report for this GPU (kvplan.engines), if any


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    request: PlanRequest
    dtype: str
    kv_dtype: KvDtype
    kv: KvEstimate
    weights: WeightEstimate
    fits: tuple[GpuFit, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = ()
    engine: str = "generic"


def _max_concurrency(kv: KvEstimate, budget: int) -> int:
    """Largest n with n * per_request - (n - 1) * shared <= budget (shared: prefix blocks stored once)."""
    per_request = kv.paged_bytes_per_request
    if budget < per_request or per_request == 0:
        return 0 if per_request else 10**9
    return 1 + (budget - per_request) // (per_request - kv.shared_prefix_bytes)


def _max_seq(model: ModelSpec, kv_dtype: KvDtype, req: PlanRequest, budget: int, limit: int) -> int:
    """Longest seq (<= limit) at which `batch` requests fit `budget`; bytes grow monotonically with seq."""
    def need(seq: int) -> int:
        return estimate_kv(model, kv_dtype, req.kv_request(seq_tokens=seq)).batch_paged_bytes

    if need(1) > budget:
        return 0
    lo, hi = 1, limit
    if need(hi) <= budget:
        return hi
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if need(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def fit_gpu(
    model: ModelSpec,
    req: PlanRequest,
    gpu: GpuSpec,
    kv_dtype: KvDtype,
    kv: KvEstimate,
    weights: WeightEstimate,
    *,
    suggest: bool = True,
    budget_model: BudgetModel | None = None,
) -> GpuFit:
    total = gpu.total_memory_bytes
    eb = budget_model(model, req, gpu) if budget_model is not None else None
    if eb is None:
        requested = math.floor(total * req.gpu_memory_utilization)
        overhead = generic_overhead_bytes(req.tp, req.pp) if req.overhead_bytes is None else req.overhead_bytes
        weights_per_gpu = weights.per_gpu_bytes
        budget = requested - weights_per_gpu - overhead
    else:
        requested, overhead, weights_per_gpu, budget = (
            eb.requested_bytes, eb.overhead_bytes, eb.weights_per_gpu_bytes, eb.kv_budget_bytes
        )
    needed = kv.batch_paged_bytes if eb is None or eb.kv_needed_bytes is None else eb.kv_needed_bytes
    fits = needed <= budget if eb is None or eb.fits is None else eb.fits
    concurrency = _max_concurrency(kv, budget) * req.replicas if budget > 0 else 0
    if eb is not None and eb.max_concurrency is not None:
        concurrency = eb.max_concurrency * req.replicas
    seq_limit = max(model.max_position_embeddings or 0, req.seq_tokens, 1)
    # Replicas split the batch: each replica serves cdiv(batch, replicas) requests.
    per_replica = replace(req, batch=-(-req.batch // req.replicas))
    max_seq = _max_seq(model, kv_dtype, per_replica, budget, seq_limit) if budget > 0 else 0
    fit = GpuFit(
        gpu=gpu,
        total_memory_bytes=total,
        requested_bytes=requested,
        weights_per_gpu_bytes=weights_per_gpu,
        overhead_bytes=overhead,
        kv_budget_bytes=budget,
        kv_needed_bytes=needed,
        fits=fits,
        max_concurrency=concurrency,
        max_seq_tokens=max_seq,
        headroom_bytes=budget - needed,
        engine=None if eb is None else eb.detail,
    )
    if fits or not suggest:
        return fit
    return replace(fit, suggestions=tuple(_suggestions(model, req, gpu, kv_dtype, fit, budget_model)))


def _suggestions(
    model: ModelSpec, req: PlanRequest, gpu: GpuSpec, kv_dtype: KvDtype, fit: GpuFit, budget_model: BudgetModel | None
) -> list[Suggestion]:
    out: list[Suggestion] = []
    if fit.max_concurrency >= 1:
        out.append(Suggestion(f"--batch {fit.max_concurrency}", f"{requests_phrase(fit.max_concurrency)} of {req.seq_tokens:,} tokens fit"))
    if fit.max_seq_tokens >= 1:
        out.append(Suggestion(f"--seq {fit.max_seq_tokens}", f"{requests_phrase(req.batch)} fit at {fit.max_seq_tokens:,} tokens"))
    if kv_dtype.bits > 8:
        fp8 = replace(req, kv_cache_dtype="fp8")
        p = plan(model, fp8, [gpu], suggest=False, budget_model=budget_model)
        f = p.fits[0]
        verdict = "fits" if f.fits else f"holds {requests_phrase(f.max_concurrency)}"
        out.append(Suggestion("--kv-cache-dtype fp8", f"{verdict} ({f.kv_needed_bytes / GiB:,.2f} GiB KV needed)"))
    tp = req.tp
    for _ in range(5):
        tp *= 2
        wider = replace(req, tp=tp, num_gpus=None if req.num_gpus is None else max(req.num_gpus, tp * req.pp))
        try:
            f = plan(model, wider, [gpu], suggest=False, budget_model=budget_model).fits[0]
        except InputError:
            break
        if f.fits:
            out.append(Suggestion(f"--tp {tp}", f"fits on {tp * req.pp} GPUs ({f.headroom_bytes / GiB:,.2f} GiB spare)"))
            break
    return out


def plan(
    model: ModelSpec,
    req: PlanRequest,
    gpus: list[GpuSpec],
    *,
    suggest: bool = True,
    budget_model: BudgetModel | None = None,
    engine: str = "generic",
) -> Plan:
    """Size the KV cache and weights for `req`, and fit them to each GPU in `gpus`.

    `budget_model` replaces the generic budget with an engine's own accounting (kvplan.engines); the KV
    need, max context and suggestions keep this module's structure either way.
    """
    from kvplan.model.dtypes import serving_dtype

    req.validate()
    dtype = req.dtype or serving_dtype(model.config_dtype)
    kv_dtype = resolve_kv_dtype(req.kv_cache_dtype, dtype)
    kv = estimate_kv(model, kv_dtype, req.kv_request())
    weights = estimate_weights(
        model, dtype=dtype, tp=req.tp, pp=req.pp, quantization=req.quantization, override_bytes=req.weights_bytes
    )
    fits = tuple(
        fit_gpu(model, req, g, kv_dtype, kv, weights, suggest=suggest, budget_model=budget_model) for g in gpus
    )
    notes = list(model.notes)
    if model.config_dtype != dtype and req.dtype is None:
        notes.append(f"config dtype {model.config_dtype or 'unset'} is served as {dtype} (engines downcast float32)")
    return Plan(
        model=model, request=req, dtype=dtype, kv_dtype=kv_dtype, kv=kv, weights=weights, fits=fits,
        notes=tuple(notes), engine=engine,
    )
