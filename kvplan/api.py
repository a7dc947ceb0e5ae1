"""The Python API the commands call: an EstimateRequest in, data out (no terminal, no flags).

    from kvplan.api import EstimateRequest, ModelSource, GpuChoice, estimate
    from kvplan.capacity.deployment import Workload
    result = estimate(EstimateRequest(ModelSource("meta-llama/Llama-3.1-8B-Instruct"),
                                      Workload(max_model_len=8192, concurrency=32), gpu=GpuChoice(("H100",))))
    result.fits, result.results[0].verdict.max_requests, result.to_dict()
"""

from __future__ import annotations

from dataclasses import field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.capacity.deployment import (
    BoxProfile,
    Deployment,
    EngineOptions,
    Parallelism,
    WeightsChoice,
    Workload,
    options_dict,
)
from kvplan.capacity.kv import KvEstimate, KvRequest, estimate_kv
from kvplan.capacity.weights import WeightEstimate, estimate_weights
from kvplan.engines import get_engine
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import COMMON_GPUS, GpuSpec, custom_gpu, find_gpu, other_variants
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.specs import ModelSpec
from kvplan.planner.serialize import fix_to_dict, reason, verdict_to_dict
from kvplan.planner.verdict import Verdict, plan
from kvplan.records import dataclass
from kvplan.sources.resolve import resolve_model

if TYPE_CHECKING:
    from kvplan.planner.fixes import Fix

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: a Hub id, a local path or a library name, and how to reach it."""

    model: str
    revision: str | None = None
    token: str | None = None
    offline: bool = False
    refresh: bool = False  # ask the Hub even when the HF cache or the bundled library has the model
    weights_from_hub: bool = False  # read the checkpoint's exact bytes from its safetensors headers


@dataclass(frozen=True)
class GpuChoice:
    """Which GPUs to plan for: named cards, a custom size, or (neither) the common cards side by side."""

    names: tuple[str, ...] = ()
    memory_bytes: int | None = None
    num_gpus: int | None = None  # GPUs in all: beyond one instance's share they become replicas
    in_use_bytes: int = 0  # memory other processes already hold on each GPU (--gpu-memory-in-use)
    in_use_share: float = 0.0  # and as a share of each GPU's memory (--gpu-memory-in-use 30%)

    def gpus(self) -> tuple[list[GpuSpec], bool]:
        if self.names and self.memory_bytes is not None:
            raise FieldError("gpu", "give either a GPU name or a memory size, not both")
        if self.memory_bytes is not None:
            if not 0 < self.memory_bytes < 1 << 50:
                raise FieldError("gpu.memory_bytes", "must be a positive size such as 48GiB", self.memory_bytes)
            return [custom_gpu(self.memory_bytes)], True
        if self.names:
            return [find_gpu(n) for n in self.names], True
        return [find_gpu(k) for k in COMMON_GPUS], False


@dataclass(frozen=True)
class EstimateRequest:
    source: ModelSource
    workload: Workload = field(default_factory=Workload)
    parallelism: Parallelism = field(default_factory=Parallelism)
    gpu: GpuChoice = field(default_factory=GpuChoice)
    weights: WeightsChoice = field(default_factory=WeightsChoice)
    kv_cache_dtype: str = "auto"
    engine: EngineOptions = field(default_factory=VllmOptions)
    profile: BoxProfile | None = None  # terms measured on the user's box (kvplan calibrate --save)


@dataclass(frozen=True)
class GpuResult:
    verdict: Verdict
    fixes: tuple[Fix, ...] = ()


@dataclass(frozen=True)
class EstimateResult:
    request: EstimateRequest
    model: ModelSpec
    kv: KvEstimate  # the engine-neutral figures: per token, per request, per kind
    checkpoint: WeightEstimate
    results: tuple[GpuResult, ...]
    gpu_named: bool
    notices: tuple[str, ...] = ()

    @property
    def fits(self) -> bool | None:
        """The named GPU's verdict (all of them, when several are named); None when none was named."""
        if not self.gpu_named:
            return None
        return all(r.verdict.fits for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        """The --json document (schema: kvplan/schemas/estimate.schema.json)."""
        return _document(self)


def instances_for(num_gpus: int | None, gpus_per_instance: int) -> int:
    """Replicas that `num_gpus` GPUs make: 4 GPUs at tp 1 -> 4 instances; fewer than one instance's share is
    an error naming the field."""
    if num_gpus is None:
        return 1
    if num_gpus < gpus_per_instance:
        raise FieldError(
            "gpu.num_gpus", f"is fewer than the {gpus_per_instance} GPUs one instance needs (tp x pp x dp)", num_gpus
        )
    return num_gpus // gpus_per_instance


def _checkpoint_from_hub(source: ModelSource, model: ModelSpec) -> WeightsChoice:
    from kvplan.sources.hub import fetch_safetensors_bytes  # the network edge, imported only when asked for

    if source.offline:
        raise FieldError("source.weights_from_hub", "reads the Hub; drop offline, or give the checkpoint size")
    if Path(source.model.strip()).expanduser().exists():
        raise FieldError("source.weights_from_hub", f"needs a Hub repo id, and {source.model!r} is a local path; "
                         "give the checkpoint size instead")
    return WeightsChoice(
        checkpoint_bytes=fetch_safetensors_bytes(model.name, revision=source.revision, token=source.token).total_bytes,
        checkpoint_source=f"safetensors headers of {model.name}@{source.revision or 'main'} on the Hub "
        "(--weights-from-hub)",
    )


def profile_gpu(profile: BoxProfile) -> GpuSpec | None:
    """The GPU a profile was measured on: its catalog card, else a card of its measured total."""
    if profile.gpu_name:
        try:
            return find_gpu(profile.gpu_name)
        except InputError:
            pass
    if profile.total_memory_bytes:
        return custom_gpu(profile.total_memory_bytes, name=profile.gpu_name or "profiled box")
    return None


def deployments(req: EstimateRequest, model: ModelSpec) -> tuple[list[Deployment], bool]:
    """One deployment per GPU the request plans for (with a profile and no GPU named: the profiled box)."""
    engine = get_engine(req.engine.engine)
    box = profile_gpu(req.profile) if req.profile is not None else None
    if box is not None and not req.gpu.names and req.gpu.memory_bytes is None:
        cards, named = [box], True
    else:
        cards, named = req.gpu.gpus()
    instances = instances_for(req.gpu.num_gpus, engine.gpus_per_instance(req.parallelism))
    out = [
        Deployment(
            model=model, gpu=card, engine=req.engine, workload=req.workload, parallelism=req.parallelism,
            weights=req.weights, kv_cache_dtype=req.kv_cache_dtype, instances=instances, profile=req.profile,
            gpu_in_use_bytes=req.gpu.in_use_bytes + round(req.gpu.in_use_share * card.total_memory_bytes),
        )
        for card in cards
    ]
    return out, named


def estimate(req: EstimateRequest, *, fixes: bool = True) -> EstimateResult:
    """Resolve the model, plan it on each GPU, and find fixes where it does not fit."""
    s = req.source
    resolved = resolve_model(s.model, revision=s.revision, token=s.token, offline=s.offline, refresh=s.refresh)
    model = resolved.model
    notices = list(resolved.notices)
    if s.weights_from_hub:
        if req.weights.checkpoint_bytes is not None:
            raise FieldError("source.weights_from_hub", "give either the checkpoint size or read it from the Hub, "
                             "not both")
        hub = _checkpoint_from_hub(s, model)
        req = replace(req, weights=replace(req.weights, checkpoint_bytes=hub.checkpoint_bytes,
                                           checkpoint_source=hub.checkpoint_source))
    if req.workload.max_model_len is None:
        if model.max_position_embeddings is None:
            raise FieldError("workload.max_model_len", f"{model.name} states no max context; give one")
        notices.append(f"no request length given: using the model's max context, "
                       f"{model.max_position_embeddings:,} tokens")
    for name in req.gpu.names:
        variants = other_variants(name)
        if variants:
            notices.append(f"GPU '{name}' is read as {find_gpu(name).key}; {', '.join(variants)} are {name} cards "
                           "too: name one to choose")
    found, named = deployments(req, model)
    for d in found:
        d.validate()
    results = []
    for d in found:
        v = plan(d)
        if fixes and named:
            from kvplan.planner.fixes import find_fixes  # searched only for a named GPU

            results.append(GpuResult(v, find_fixes(d, v)))
        else:
            results.append(GpuResult(v))
    d0 = found[0]
    dtype = req.weights.dtype or serving_dtype(model.config_dtype)
    # The engine's own dtype where auto follows the checkpoint's KV quantization (kvplan.engines.checkpoint_kv).
    engine_kv = results[0].verdict.deployment.kv_cache_dtype
    try:
        kv_dtype = resolve_kv_dtype(engine_kv if req.kv_cache_dtype.strip().lower() == "auto" else req.kv_cache_dtype,
                                    dtype)
    except InputError:
        kv_dtype = resolve_kv_dtype("auto", dtype)  # an engine refusal says why; the neutral figures use auto
    p = req.parallelism
    pp = p.pp if p.pp <= model.num_layers else 1
    kv = estimate_kv(model, kv_dtype, KvRequest(
        seq_tokens=d0.max_model_len, batch=req.workload.concurrency, block_size=16, tp=p.tp, pp=pp,
        shared_prefix_tokens=req.workload.shared_prefix_tokens,
    ))
    checkpoint = estimate_weights(
        model, dtype=dtype, quantization=req.weights.quantization, override_bytes=req.weights.checkpoint_bytes,
        override_source=req.weights.checkpoint_source or "given size",
    )
    return EstimateResult(req, model, kv, checkpoint, tuple(results), named, tuple(notices))


# Top-level figures scripts read: the named GPU's, or, with no GPU named, figures every card agrees on (a KV
# budget pinned with --kv-cache-memory-bytes makes tokens and concurrency the same on every card).
_HEADLINE = ("available_kv_cache_bytes", "kv_cache_tokens", "max_concurrency", "max_requests",
             "longest_context_tokens")


def _document(r: EstimateResult) -> dict[str, Any]:
    m, req, kv, w = r.model, r.request, r.kv, r.checkpoint
    gpus = []
    for g in r.results:
        v = g.verdict
        gpus.append({
            "gpu": v.deployment.gpu.key,
            "gpu_name": v.deployment.gpu.display_name,
            "memory_source": v.deployment.gpu.memory_source,
            **verdict_to_dict(v),
            "fixes": [fix_to_dict(f) for f in g.fixes],
        })
    headline: dict[str, Any] = {}
    for key in _HEADLINE:
        values = {json_key(g[key]) for g in gpus}
        headline[key] = gpus[0][key] if (r.gpu_named and len(gpus) == 1) or len(values) == 1 else None
    first = r.results[0].verdict
    engine_options = options_dict(req.engine)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "name": m.name,
            "source": m.source,
            "family": m.family,
            "model_type": m.model_type,
            "architecture": m.architecture,
            "layers": m.num_layers,
            "layer_kinds": m.layer_kinds(),
            "params": m.num_params,
            "config_dtype": m.config_dtype,
            "max_position_embeddings": m.max_position_embeddings,
        },
        "request": {
            "max_model_len": first.deployment.max_model_len,
            "concurrency": req.workload.concurrency,
            "shared_prefix_tokens": req.workload.shared_prefix_tokens,
            "kv_cache_dtype": kv.kv_dtype.name if req.kv_cache_dtype == "auto" else req.kv_cache_dtype,
            "dtype": req.weights.dtype,
            "quantization": req.weights.quantization,
            "tensor_parallel_size": req.parallelism.tp,
            "pipeline_parallel_size": req.parallelism.pp,
            "data_parallel_size": req.parallelism.dp,
            "num_gpus": req.gpu.num_gpus,
            "gpu_memory_in_use_bytes": req.gpu.in_use_bytes,
            "gpu_memory_in_use_share": req.gpu.in_use_share,
            "engine": req.engine.engine,
            "engine_options": engine_options,
            "profile": None if req.profile is None else req.profile.source,
        },
        "fits": r.fits,
        "reason": reason(first) if r.gpu_named and len(r.results) == 1 else None,
        **headline,
        "kv": {
            "dtype": kv.kv_dtype.name,
            "scales": kv.kv_dtype.scales_note,
            "model_bytes_per_token": kv.model_bytes_per_token,
            "model_bytes_per_request": kv.model_contiguous_bytes_per_request,
            "model_batch_bytes": kv.model_batch_contiguous_bytes,
            "model_state_bytes_per_request": kv.model_state_bytes_per_request,
            "by_kind": [
                {
                    "kind": k.kind,
                    "layers": k.layers,
                    "bytes_per_token": k.bytes_per_token,
                    "resident_tokens": k.resident_tokens,
                    "contiguous_bytes_per_request": k.contiguous_bytes,
                    "paged_bytes_per_request": k.paged_bytes,
                    "state_bytes_per_request": k.state_bytes,
                }
                for k in kv.kinds
            ],
        },
        "weights": {
            "num_params": w.num_params,
            "checkpoint_bytes": w.total_bytes,
            "source": w.source,
        },
        "gpu_named": r.gpu_named,
        "gpus": gpus,
        "notices": list(r.notices),
        "notes": list(m.notes),
    }


def json_key(value: Any) -> Any:
    """A hashable stand-in for comparing JSON values."""
    return repr(value)
