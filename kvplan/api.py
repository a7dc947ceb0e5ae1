"""The Python API the CLI calls: resolve a model, plan it, and return data plus its renderer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from kvplan.engines import ENGINES
from kvplan.errors import InputError
from kvplan.gpus import COMMON_GPUS, GpuSpec, custom_gpu, find_gpu
from kvplan.plan import BudgetModel, Plan, PlanRequest, plan
from kvplan.render import plan_to_dict, render_plan
from kvplan.resolve import resolve_model


@dataclass(frozen=True)
class EstimateResult:
    plan: Plan
    data: dict[str, Any]
    render: Callable[[Console], None]
    notices: tuple[str, ...]
    fits: bool | None  # None when no GPU was named (the common cards are compared instead)


def select_gpus(gpu: str | None, gpu_mem_bytes: int | None) -> tuple[list[GpuSpec], bool]:
    """The GPUs to fit: the named one, a custom size, or the common cards side by side."""
    if gpu and gpu_mem_bytes is not None:
        raise InputError("give either --gpu or --gpu-mem, not both")
    if gpu_mem_bytes is not None:
        if gpu_mem_bytes <= 0:
            raise InputError("--gpu-mem must be a positive size such as 48GiB")
        return [custom_gpu(gpu_mem_bytes)], True
    if gpu:
        return [find_gpu(gpu)], True
    return [find_gpu(k) for k in COMMON_GPUS], False


def estimate(
    model: str,
    *,
    seq_tokens: int | None = None,
    batch: int = 1,
    kv_cache_dtype: str = "auto",
    dtype: str | None = None,
    block_size: int | None = None,
    tp: int = 1,
    pp: int = 1,
    shared_prefix_tokens: int = 0,
    gpu: str | None = None,
    gpu_mem_bytes: int | None = None,
    num_gpus: int | None = None,
    gpu_memory_utilization: float | None = None,
    overhead_bytes: int | None = None,
    weights_bytes: int | None = None,
    quantization: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    offline: bool = False,
    engine: str = "vllm",
    vllm_version: str = "current",
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    enable_prefix_caching: bool = True,
    kv_cache_memory_bytes: int | None = None,
    mem_fraction_static: float | None = None,
    page_size: int = 1,
    hf_cache: str = "dynamic",
) -> EstimateResult:
    """Plan MODEL at seq_tokens x batch; see `kvplan estimate --help` for each argument.

    gpu_memory_utilization None means the engine's default (vLLM: 0.92 current, 0.9 for --vllm-version 0.19).
    """
    resolved = resolve_model(model, revision=revision, token=token, offline=offline)
    spec = resolved.model
    notices = list(resolved.notices)
    if seq_tokens is None:
        if spec.max_position_embeddings is None:
            raise InputError(f"{spec.name} states no max context (max_position_embeddings); pass --seq")
        seq_tokens = spec.max_position_embeddings
        notices.append(f"--seq not given: using the model's max context, {seq_tokens:,} tokens")
    gpus, named = select_gpus(gpu, gpu_mem_bytes)
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    budget_model: BudgetModel | None = None
    if engine == "vllm":
        from kvplan.engines.budgets import vllm_budget
        from kvplan.engines.vllm import DEFAULT_UTILIZATION, VllmFlags

        flags = VllmFlags(
            max_model_len=seq_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            dtype=dtype or "auto",
            quantization=quantization,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            version=vllm_version,
        )
        flags.validate()
        if gpu_memory_utilization is None:
            gpu_memory_utilization = DEFAULT_UTILIZATION[vllm_version]
        budget_model = vllm_budget(flags)
    elif engine == "sglang":
        from kvplan.engines.budgets import sglang_budget

        budget_model = sglang_budget(mem_fraction_static, page_size)
    elif engine == "transformers":
        from kvplan.engines.budgets import transformers_budget

        budget_model = transformers_budget(hf_cache)
    req = PlanRequest(
        seq_tokens=seq_tokens,
        batch=batch,
        kv_cache_dtype=kv_cache_dtype,
        dtype=dtype,
        block_size=block_size or 16,
        tp=tp,
        pp=pp,
        shared_prefix_tokens=shared_prefix_tokens,
        gpu_memory_utilization=0.9 if gpu_memory_utilization is None else gpu_memory_utilization,
        overhead_bytes=overhead_bytes,
        weights_bytes=weights_bytes,
        quantization=quantization,
        num_gpus=num_gpus,
    )
    p = plan(spec, req, gpus, budget_model=budget_model, engine=engine)
    return EstimateResult(
        plan=p,
        data=plan_to_dict(p, gpu_named=named),
        render=lambda console: render_plan(p, console, gpu_named=named),
        notices=tuple(notices),
        fits=p.fits[0].fits if named else None,
    )
