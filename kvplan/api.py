"""The Python API the CLI calls: resolve a model, plan it, and return data plus its renderer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from kvplan.capacity.plan import BudgetModel, Plan, PlanRequest, plan
from kvplan.capacity.weights import estimate_weights
from kvplan.cli.render import plan_to_dict, render_plan
from kvplan.engines import ENGINES
from kvplan.errors import InputError
from kvplan.hardware.gpus import COMMON_GPUS, GpuSpec, custom_gpu, find_gpu
from kvplan.model.specs import ModelSpec
from kvplan.sources.resolve import resolve_model


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


def checkpoint_bytes_from_hub(
    model: str, spec: ModelSpec, *, revision: str | None, token: str | None, offline: bool
) -> tuple[int, str]:
    """--weights-from-hub: the checkpoint's exact bytes from its safetensors headers, and where they came from."""
    from kvplan.capacity.weights import hub_weights_source, weights_from_hub

    if offline:
        raise InputError("--weights-from-hub reads the Hub; drop --offline, or give the size with --weights-bytes")
    if Path(model.strip()).expanduser().exists():
        raise InputError(
            f"--weights-from-hub needs a Hub repo id, and {model!r} is a local path; give --weights-bytes instead"
        )
    return weights_from_hub(spec.name, revision, token), hub_weights_source(spec.name, revision)


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
    weights_from_hub: bool = False,
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
    weights_source = "--weights-bytes"
    if weights_from_hub:
        if weights_bytes is not None:
            raise InputError("give either --weights-bytes or --weights-from-hub, not both")
        weights_bytes, weights_source = checkpoint_bytes_from_hub(
            model, spec, revision=revision, token=token, offline=offline
        )
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
    if weights_bytes is not None:
        # The same override, named for where it came from (plan() labels every override --weights-bytes).
        measured = estimate_weights(
            spec, dtype=p.dtype, tp=tp, pp=pp, quantization=quantization, override_bytes=weights_bytes,
            override_source=weights_source,
        )
        if budget_model is not None and engine != "transformers":
            # vLLM and SGLang split the measured bytes themselves (vllm_memory.checkpoint_scale), not evenly.
            measured = replace(measured, source=weights_source)
        p = replace(p, weights=measured)
    if overhead_bytes is not None and engine in ("vllm", "sglang"):
        notices.append(f"--overhead is ignored by --engine {engine}: it models activation and runtime memory itself")
    return EstimateResult(
        plan=p,
        data=plan_to_dict(p, gpu_named=named),
        render=lambda console: render_plan(p, console, gpu_named=named),
        notices=tuple(notices),
        fits=p.fits[0].fits if named else None,
    )
