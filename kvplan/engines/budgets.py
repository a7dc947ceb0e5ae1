"""Engine models as plan.py budget models: each turns (model, request, gpu) into an EngineBudget."""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan.capacity.plan import BudgetModel, EngineBudget, PlanRequest, generic_overhead_bytes
from kvplan.capacity.weights import estimate_weights
from kvplan.engines.sglang import plan_sglang
from kvplan.engines.transformers import hf_cache_bytes
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import serving_dtype
from kvplan.model.specs import ModelSpec


def vllm_budget(base: VllmFlags) -> BudgetModel:
    """vLLM's accounting; the request's seq, KV dtype, tp and pp override `base` (suggestions vary them)."""

    def budget(model: ModelSpec, req: PlanRequest, gpu: GpuSpec) -> EngineBudget:
        flags = replace(
            base,
            max_model_len=req.seq_tokens,
            kv_cache_dtype=req.kv_cache_dtype,
            tensor_parallel_size=req.tp,
            pipeline_parallel_size=req.pp,
        )
        r = plan_vllm(model, flags, gpu, checkpoint_bytes=req.weights_bytes)
        stage = r.stages[r.limiting_stage]
        m = stage.memory
        return EngineBudget(
            requested_bytes=r.requested_bytes,
            weights_per_gpu_bytes=m.weights_bytes,
            overhead_bytes=m.activation_peak_bytes + m.non_torch_bytes + r.cudagraph_bytes,
            kv_budget_bytes=stage.available_kv_bytes,
            max_concurrency=math.floor(r.max_concurrency),
            fits=r.startup_error is None and req.batch <= r.max_concurrency,
            detail=r,
            kv_needed_bytes=req.batch * r.blocks_per_request * stage.layout.bytes_per_block,
        )

    return budget


def sglang_budget(mem_fraction_static: float | None, page_size: int) -> BudgetModel:
    def budget(model: ModelSpec, req: PlanRequest, gpu: GpuSpec) -> EngineBudget:
        r = plan_sglang(
            model, gpu, mem_fraction_static=mem_fraction_static, page_size=page_size, tp=req.tp,
            kv_cache_dtype=req.kv_cache_dtype, dtype=req.dtype, checkpoint_bytes=req.weights_bytes,
        )
        reserved = r.free_before_load_bytes - r.weights_bytes - r.available_kv_bytes
        return EngineBudget(
            requested_bytes=r.free_before_load_bytes,
            weights_per_gpu_bytes=r.weights_bytes,
            overhead_bytes=reserved,
            kv_budget_bytes=r.available_kv_bytes,
            max_concurrency=r.max_total_num_tokens // req.seq_tokens,
            fits=req.batch * req.seq_tokens <= r.max_total_num_tokens,
            detail=r,
            kv_needed_bytes=r.kv_bytes_for_tokens(req.batch * req.seq_tokens),
        )

    return budget


def transformers_budget(cache: str) -> BudgetModel:
    """Transformers on one GPU: the generic budget, but the KV need is what its cache holds (no paging)."""

    def budget(model: ModelSpec, req: PlanRequest, gpu: GpuSpec) -> EngineBudget:
        dtype = req.dtype or serving_dtype(model.config_dtype)
        hf = hf_cache_bytes(model, seq_tokens=req.seq_tokens, batch=req.batch, dtype=dtype, cache=cache)
        weights = estimate_weights(
            model, dtype=dtype, tp=req.tp, pp=req.pp, quantization=req.quantization, override_bytes=req.weights_bytes
        )
        requested = math.floor(gpu.total_memory_bytes * req.gpu_memory_utilization)
        overhead = generic_overhead_bytes(req.tp, req.pp) if req.overhead_bytes is None else req.overhead_bytes
        kv_budget = requested - weights.per_gpu_bytes - overhead
        one = hf_cache_bytes(model, seq_tokens=req.seq_tokens, batch=1, dtype=dtype, cache=cache).total_bytes
        return EngineBudget(
            requested_bytes=requested,
            weights_per_gpu_bytes=weights.per_gpu_bytes,
            overhead_bytes=overhead,
            kv_budget_bytes=kv_budget,
            max_concurrency=max(0, kv_budget) // one if one else None,
            fits=hf.total_bytes <= kv_budget,
            detail=hf,
            kv_needed_bytes=hf.total_bytes,
        )

    return budget
