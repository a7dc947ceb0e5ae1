"""Run the engine capacity model on each deployment request: verdict, margin, and the smallest fix.

What "fits" means: the engine starts (every rank holds one request at max-model-len, vLLM's own start-up
check) and, where the file states a concurrency target (kvplan's schema `concurrency` / `max_num_seqs`), that
many full-length requests fit at once. Margin is the share of the KV memory left after that requirement:
needing 40 GiB of 50 GiB available is a 20% margin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvplan.capacity.plan import PlanRequest, plan
from kvplan.check.model import CANNOT_EVALUATE, DOES_NOT_FIT, FITS, CheckResult, DeploymentRequest
from kvplan.engines.sglang import plan_sglang
from kvplan.engines.vllm import VllmFlags, VllmReport, plan_vllm
from kvplan.errors import KvplanError
from kvplan.hardware.gpus import GpuSpec, find_gpu
from kvplan.model.specs import ModelSpec
from kvplan.sources.resolve import resolve_model
from kvplan.units import fmt_gib

TGI_DEFAULT_MEMORY_FRACTION = 1.0  # TGI's --cuda-memory-fraction default


@dataclass(frozen=True)
class Capacity:
    """One engine's answer for one deployment on one replica (per GPU of the fullest rank)."""

    available_bytes: int  # KV memory on the limiting rank
    needed_bytes: int  # KV the requirement takes on that rank
    max_concurrency: float  # full-length requests that fit at once, all replicas
    startup_error: str | None
    max_model_len: int
    engine_lines: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.startup_error is None and self.needed_bytes <= self.available_bytes

    @property
    def margin(self) -> float | None:
        if self.available_bytes <= 0:
            return None
        return (self.available_bytes - self.needed_bytes) / self.available_bytes


def _required_requests(req: DeploymentRequest) -> int:
    """kvplan's own schema states how many concurrent full-length requests must fit; engine flags only cap."""
    if req.source_format == "kvplan" and req.max_num_seqs:
        return req.max_num_seqs
    return 1


def _replicas(req: DeploymentRequest) -> int:
    per_replica = req.tensor_parallel_size * req.pipeline_parallel_size
    dp = req.flag("data-parallel-size") or req.flag("data-parallel-size-local")
    if dp and dp.isdigit():
        return max(1, int(dp))
    return max(1, (req.num_gpus or per_replica) // per_replica)


def _vllm(model: ModelSpec, req: DeploymentRequest, gpu: GpuSpec, version: str) -> Capacity:
    flags = VllmFlags(
        max_model_len=req.max_model_len,
        gpu_memory_utilization=req.gpu_memory_utilization,
        kv_cache_dtype=req.kv_cache_dtype or "auto",
        block_size=req.block_size,
        max_num_seqs=req.max_num_seqs,
        max_num_batched_tokens=req.max_num_batched_tokens,
        tensor_parallel_size=req.tensor_parallel_size,
        pipeline_parallel_size=req.pipeline_parallel_size,
        dtype=req.dtype or "auto",
        quantization=req.quantization,
        enable_prefix_caching=req.enable_prefix_caching is not False,
        version=version,
    )
    report: VllmReport = plan_vllm(model, flags, gpu)
    f = report.flags
    stage = report.stages[report.limiting_stage]
    per_request = stage.layout.blocks_per_request(f.max_model_len, f.max_num_batched_tokens) * stage.layout.bytes_per_block
    return Capacity(
        available_bytes=report.available_kv_cache_bytes,
        needed_bytes=_required_requests(req) * per_request,
        max_concurrency=report.max_concurrency * _replicas(req),
        startup_error=report.startup_error,
        max_model_len=f.max_model_len,
        engine_lines=report.log_lines,
    )


def _sglang(model: ModelSpec, req: DeploymentRequest, gpu: GpuSpec, version: str) -> Capacity:
    page = req.flag("page-size")
    report = plan_sglang(
        model,
        gpu,
        mem_fraction_static=req.gpu_memory_utilization,
        page_size=int(page) if page and page.isdigit() else 1,
        tp=req.tensor_parallel_size,
        kv_cache_dtype=req.kv_cache_dtype or "auto",
        dtype=req.dtype,
    )
    max_len = req.max_model_len or model.max_position_embeddings or 0
    needed_tokens = _required_requests(req) * max_len
    error = None
    if report.max_total_num_tokens < max_len:
        error = (
            f"max_total_num_tokens={report.max_total_num_tokens:,} is smaller than the context length "
            f"{max_len:,}: one full-length request cannot be held"
        )
    return Capacity(
        available_bytes=report.available_kv_bytes,
        needed_bytes=report.kv_bytes_for_tokens(needed_tokens),
        max_concurrency=report.max_concurrency(max_len) * _replicas(req) if max_len else 0.0,
        startup_error=error,
        max_model_len=max_len,
        engine_lines=(
            f"max_total_num_tokens={report.max_total_num_tokens}, page_size={report.page_size}, "
            f"mem_fraction_static={report.mem_fraction_static}",
        ),
    )


def _tgi(model: ModelSpec, req: DeploymentRequest, gpu: GpuSpec, version: str) -> Capacity:
    """TGI has no engine model here: the generic budget at TGI's memory fraction, one request at max-total-tokens."""
    max_len = req.max_model_len or model.max_position_embeddings or 0
    p = plan(
        model,
        PlanRequest(
            seq_tokens=max_len,
            batch=_required_requests(req),
            kv_cache_dtype=req.kv_cache_dtype or "auto",
            tp=req.tensor_parallel_size,
            gpu_memory_utilization=req.gpu_memory_utilization or TGI_DEFAULT_MEMORY_FRACTION,
            quantization=None,
        ),
        [gpu],
        suggest=False,
    )
    fit = p.fits[0]
    return Capacity(
        available_bytes=fit.kv_budget_bytes,
        needed_bytes=fit.kv_needed_bytes,
        max_concurrency=float(fit.max_concurrency * _replicas(req)),
        startup_error=None if fit.kv_budget_bytes > 0 else "the weights alone exceed the GPU memory TGI may use",
        max_model_len=max_len,
        engine_lines=("TGI evaluated with kvplan's generic budget (no TGI engine model)",),
    )


ENGINES: dict[str, Callable[[ModelSpec, DeploymentRequest, GpuSpec, str], Capacity]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "tgi": _tgi,
}


def _fix(model: ModelSpec, req: DeploymentRequest, gpu: GpuSpec, version: str, cap: Capacity, margin: float) -> str | None:
    """The smallest single change that makes the deployment fit with `margin`, tried from least to most costly."""
    engine = ENGINES[req.engine]

    def works(changed: DeploymentRequest) -> bool:
        try:
            c = engine(model, changed, gpu, version)
        except KvplanError:
            return False
        return c.fits and (c.margin or 0.0) >= margin

    util = req.gpu_memory_utilization
    if req.engine == "vllm" and (util is None or util < 0.95) and works(replace(req, gpu_memory_utilization=0.95)):
        return "raise --gpu-memory-utilization to 0.95"
    if (req.kv_cache_dtype or "auto") not in ("fp8", "fp8_e4m3", "fp8_e5m2") and works(replace(req, kv_cache_dtype="fp8")):
        return "set --kv-cache-dtype fp8 (halves the KV bytes of a 16-bit cache)"
    if works(replace(req, max_model_len=1)):
        # The longest context that still fits with the margin: KV grows with max-model-len, so bisect.
        lo, hi = 1, cap.max_model_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if works(replace(req, max_model_len=mid)) else (lo, mid - 1)
        return f"lower --max-model-len to {lo} (from {cap.max_model_len})"
    tp = req.tensor_parallel_size
    for _ in range(4):
        tp *= 2
        gpus = max(req.num_gpus or 0, tp * req.pipeline_parallel_size)
        if works(replace(req, tensor_parallel_size=tp, num_gpus=gpus)):
            return f"use {tp * req.pipeline_parallel_size} GPUs (--tensor-parallel-size {tp})"
    return None


def evaluate(
    req: DeploymentRequest,
    *,
    offline: bool = False,
    min_margin: float | None = None,
    vllm_version: str = "current",
) -> CheckResult:
    """The verdict for one deployment request."""
    if req.unresolved:
        why = "; ".join(f"{u.field}: {u.reason} ({u.how_to_fix})" for u in req.unresolved)
        return CheckResult(req, CANNOT_EVALUATE, reason=why)
    if req.engine not in ENGINES:
        return CheckResult(req, CANNOT_EVALUATE, reason=f"engine '{req.engine}' has no capacity model in kvplan")
    per_replica = req.tensor_parallel_size * req.pipeline_parallel_size
    if req.num_gpus is not None and req.num_gpus < per_replica:
        return CheckResult(
            req,
            DOES_NOT_FIT,
            reason=f"tp x pp = {per_replica} GPUs but only {req.num_gpus} requested: the engine will not start",
            fix=f"request {per_replica} GPUs (nvidia.com/gpu: {per_replica})",
        )
    try:
        gpu = find_gpu(req.gpu or "")
        model = resolve_model(req.model or "", offline=offline, prefer_library=True, explicit_paths_only=True).model
        cap = ENGINES[req.engine](model, req, gpu, vllm_version)
    except KvplanError as exc:
        return CheckResult(req, CANNOT_EVALUATE, reason=exc.message)

    margin_needed = max(m for m in (min_margin, req.min_margin, 0.0) if m is not None)
    verdict = FITS if cap.fits else DOES_NOT_FIT
    reason = None
    if not cap.fits:
        reason = cap.startup_error or (
            f"{_required_requests(req)} requests of {cap.max_model_len:,} tokens need {fmt_gib(cap.needed_bytes)} "
            f"of KV, {fmt_gib(cap.available_bytes)} is available"
        )
    needs_fix = not cap.fits or (cap.margin or 0.0) < margin_needed
    return CheckResult(
        req,
        verdict,
        kv_needed_bytes=cap.needed_bytes,
        kv_available_bytes=cap.available_bytes,
        max_concurrency=round(cap.max_concurrency, 2),
        margin=None if cap.margin is None else round(cap.margin, 4),
        reason=reason,
        fix=_fix(model, req, gpu, vllm_version, cap, margin_needed) if needs_fix else None,
        engine_lines=cap.engine_lines,
    )
