"""Evaluate each deployment request: map it onto the deployment model, plan it, and say the smallest fix.

The same Deployment and planner as `kvplan estimate` (kvplan.capacity.deployment, kvplan.planner), so the
two commands cannot disagree. What "fits" means: the engine starts (every rank holds one request at
max-model-len) and, where the file states a concurrency target (kvplan's schema `concurrency`), that many
full-length requests are held at once. Margin is the share of the limiting pool left after that
requirement: needing 40 GiB of 50 GiB is a 20% margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvplan.capacity.deployment import BoxProfile, Deployment, Parallelism, WeightsChoice, Workload
from kvplan.capacity.weights import RUNTIME_QUANTIZATIONS
from kvplan.check.fields import fix_text, request_field
from kvplan.check.model import CANNOT_EVALUATE, DOES_NOT_FIT, FITS, CheckResult, DeploymentRequest
from kvplan.engines import ENGINE_NAMES, get_engine
from kvplan.engines.sglang import SglangOptions
from kvplan.engines.tgi import TgiOptions
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.engines.vllm_versions import rules_for
from kvplan.errors import KvplanError
from kvplan.hardware.gpus import GpuSpec, custom_gpu, find_gpu
from kvplan.planner.fixes import Fix, find_fixes
from kvplan.planner.serialize import reason as reason_of
from kvplan.planner.serialize import verdict_to_dict
from kvplan.planner.verdict import Verdict, plan
from kvplan.sources.resolve import resolve_model

CHECKED_ENGINES = ("vllm", "sglang", "tgi")


def required_requests(req: DeploymentRequest) -> int:
    """kvplan's own schema states how many concurrent full-length requests must fit; engine flags only cap."""
    if req.source_format == "kvplan" and req.max_num_seqs:
        return req.max_num_seqs
    return 1


def _vllm_version(req: DeploymentRequest, default: str) -> str:
    """The release the image tag or the script's pip pin names, when kvplan models it; else --vllm-version."""
    if req.engine_version:
        try:
            VllmOptions(version=req.engine_version).validate()
            return req.engine_version
        except KvplanError:
            pass
    return default


def _engine_options(req: DeploymentRequest, vllm_version: str) -> Any:
    # kvplan's own schema states a concurrency to hold (the workload), not a scheduler cap.
    cap = req.max_num_seqs if req.source_format != "kvplan" else None
    builders: dict[str, Callable[[], Any]] = {
        "vllm": lambda: VllmOptions(
            version=_vllm_version(req, vllm_version),
            install=req.engine_install or "image",
            gpu_memory_utilization=req.gpu_memory_utilization,
            block_size=req.block_size,
            max_num_seqs=cap,
            max_num_batched_tokens=req.max_num_batched_tokens,
            enable_prefix_caching=req.enable_prefix_caching,
            enable_chunked_prefill=req.enable_chunked_prefill,
            kv_cache_memory_bytes=req.kv_cache_memory_bytes,
            allow_long_max_model_len=req.allow_long_max_model_len,
            flashinfer_sampler=req.flashinfer_sampler,
            mla_disable=req.mla_disable,
            deep_gemm=req.deep_gemm,
            # VLLM_USE_V1 chooses the engine while a release has both (to 0.10.x); later ones have V1 only.
            use_v1=req.use_v1 if rules_for(_vllm_version(req, vllm_version)).v0_available else None,
            lora=LoraSlots(*req.lora_slots) if req.lora_slots else None,
            mamba_cache_dtype=req.mamba_cache_dtype or "auto",
            mamba_ssm_cache_dtype=req.mamba_ssm_cache_dtype or "auto",
            speculative_method=req.speculative[0] if req.speculative else None,
            num_speculative_tokens=req.speculative[1] if req.speculative else 0,
        ),
        "sglang": lambda: SglangOptions(
            mem_fraction_static=req.gpu_memory_utilization,
            page_size=req.block_size,
            max_running_requests=cap,
            chunked_prefill_size=req.max_num_batched_tokens,
        ),
        "tgi": lambda: TgiOptions(
            cuda_memory_fraction=req.gpu_memory_utilization or 1.0,
            max_batch_size=cap,
            max_batch_total_tokens=req.max_batch_total_tokens,
            max_total_tokens_cap=req.max_model_len_cap_tokens,
        ),
    }
    return builders[req.engine]()


def _gpu(req: DeploymentRequest) -> GpuSpec:
    """The catalog card the file (or --gpu) names, at the memory --gpu-mem gives when it gives one (a label
    kvplan does not know is then planned by that memory alone)."""
    if req.gpu_memory_bytes is not None:
        try:
            gpu = find_gpu(req.gpu_key or req.gpu or "")
        except KvplanError:
            return custom_gpu(req.gpu_memory_bytes, name=req.gpu_key or req.gpu or "custom")
    else:
        gpu = find_gpu(req.gpu_key or req.gpu or "")
    if req.gpu_memory_bytes is not None and req.gpu_memory_bytes != gpu.total_memory_bytes:
        return replace(gpu, total_memory_bytes=req.gpu_memory_bytes, memory_source="given: --gpu-mem")
    return gpu


def _gpus_per_instance_given(req: DeploymentRequest) -> int | None:
    """GPUs the file gives one instance: kvplan's own schema counts every replica's in `num_gpus`."""
    if req.num_gpus is None:
        return None
    return req.num_gpus // max(1, req.replicas) if req.source_format == "kvplan" else req.num_gpus


def to_deployment(req: DeploymentRequest, *, offline: bool, vllm_version: str,
                  profile: BoxProfile | None = None) -> Deployment:
    """The deployment a request describes (raises KvplanError for what cannot be resolved)."""
    gpu = _gpu(req)
    model = resolve_model(req.model or "", offline=offline, prefer_library=True, explicit_paths_only=True).model
    parallelism = Parallelism(
        tp=req.tensor_parallel_size,
        pp=req.pipeline_parallel_size,
        dp=req.data_parallel_size,
        dp_attention=req.dp_attention,
        expert_parallel=req.expert_parallel,
        ep_size=req.expert_parallel_size,
    )
    runtime = req.quantization in RUNTIME_QUANTIZATIONS and model.quant is None
    weights = WeightsChoice(
        dtype=None if req.dtype in (None, "auto") else req.dtype,
        quantization=req.quantization if runtime else None,
        cpu_offload_bytes=req.cpu_offload_bytes or 0,
    )
    return Deployment(
        model=model,
        gpu=gpu,
        engine=_engine_options(req, vllm_version),
        workload=Workload(max_model_len=req.max_model_len, concurrency=required_requests(req)),
        parallelism=parallelism,
        weights=weights,
        kv_cache_dtype=req.kv_cache_dtype or "auto",
        instances=max(1, req.replicas),
        profile=profile,
    )


def blockers(req: DeploymentRequest, *, offline: bool) -> list[str]:
    """Everything that keeps a request from being evaluated, all at once (no GPU type AND an unknown model)."""
    found = [f"{u.field}: {u.reason} ({u.how_to_fix})" for u in req.unresolved]
    fields = {u.field for u in req.unresolved}
    if req.model and "model" not in fields:
        try:
            resolve_model(req.model, offline=offline, prefer_library=True, explicit_paths_only=True)
        except KvplanError as exc:
            found.append(f"model: {exc.message}")
    if (req.gpu or req.gpu_key) and "gpu" not in fields:
        try:
            _gpu(req)
        except KvplanError as exc:
            found.append(f"gpu: {exc.message}")
    return found


def _margin(v: Verdict) -> float | None:
    budget, needed = v.kv_budget_bytes, v.kv_needed_bytes
    if not budget or needed is None:
        return None
    return (budget - needed) / budget


def evaluate(
    req: DeploymentRequest,
    *,
    offline: bool = False,
    min_margin: float | None = None,
    vllm_version: str = "current",
    profile: BoxProfile | None = None,
    gpu_in_use_bytes: int = 0,
    gpu_in_use_share: float = 0.0,
) -> CheckResult:
    """The verdict for one deployment request; `gpu_in_use_bytes` / `gpu_in_use_share`: what other processes hold
    on each GPU, in bytes and as a share of its memory."""
    if req.unresolved:
        return CheckResult(req, CANNOT_EVALUATE, reason="; ".join(blockers(req, offline=offline)))
    if req.engine not in CHECKED_ENGINES or req.engine not in ENGINE_NAMES:
        return CheckResult(req, CANNOT_EVALUATE, reason=f"engine '{req.engine}' has no capacity model in kvplan")
    try:
        d = to_deployment(req, offline=offline, vllm_version=vllm_version, profile=profile)
        # Other servers of the file on the same GPU hold their stated share of it (readers.compose).
        in_use = gpu_in_use_bytes + round((gpu_in_use_share + req.shared_gpu_fraction) * d.gpu.total_memory_bytes)
        if req.shared_with and in_use >= d.gpu.total_memory_bytes:
            yours = " and --gpu-memory-in-use" if gpu_in_use_bytes or gpu_in_use_share else ""
            return CheckResult(req, DOES_NOT_FIT, reason=(
                f"{' and '.join(req.shared_with)} on the same GPU{yours} already hold all of its memory"),
                fix="give the servers that share a GPU memory fractions that sum to less than 1",
                reason_code="gpu_shared")
        d = replace(d, gpu_in_use_bytes=in_use)
        d.validate()
    except KvplanError as exc:
        return CheckResult(req, CANNOT_EVALUATE, reason=exc.message)
    engine = get_engine(req.engine)
    per_instance = engine.gpus_per_instance(d.parallelism)
    available = _gpus_per_instance_given(req)
    if available is not None and available < per_instance:
        p = d.parallelism
        return CheckResult(
            req, DOES_NOT_FIT,
            reason=(f"the parallelism needs {per_instance} GPUs (tp {p.tp} x pp {p.pp}"
                    + (f" x dp {p.dp}" if per_instance != p.tp * p.pp else "")
                    + f") but only {available} are requested: the engine will not start"),
            fix=f"request {per_instance} GPUs (nvidia.com/gpu: {per_instance})",
            reason_code="gpus",
        )
    try:
        v = plan(d)
    except KvplanError as exc:
        return CheckResult(req, CANNOT_EVALUATE, reason=exc.message)
    margin_needed = max(m for m in (min_margin, req.min_margin, 0.0) if m is not None)
    margin = _margin(v)
    why = reason_of(v)
    fixes: tuple[Fix, ...] = ()
    if not v.fits or (margin or 0.0) < margin_needed:
        fixes = find_fixes(d, v, accept=lambda t: (_margin(t) or 0.0) >= margin_needed)
    return CheckResult(
        req,
        FITS if v.fits else DOES_NOT_FIT,
        kv_needed_bytes=v.kv_needed_bytes,
        kv_available_bytes=v.kv_budget_bytes,
        max_concurrency=round(v.max_concurrency, 2),
        margin=None if margin is None else round(margin, 4),
        reason=None if why is None else why["message"],
        fix=fix_text(req, fixes[0]) if fixes else None,
        fix_field=request_field(fixes[0].changes[0].field) if fixes else None,
        engine_lines=v.account.log_lines,
        reason_code=None if why is None else why["code"],
        max_requests=v.max_requests,
        figures=verdict_to_dict(v),
        fixes=tuple(fix_text(req, f) for f in fixes),
    )
