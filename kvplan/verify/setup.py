"""What verify will allocate, planned without torch by the same resolve + estimate_kv path as `estimate`."""

from __future__ import annotations

import math
from dataclasses import replace

from kvplan.capacity.kv import KindKv, KvEstimate, KvRequest, estimate_kv, pp_stage_layers
from kvplan.errors import InputError
from kvplan.model.dtypes import ENGINE_KV_DTYPES, KvDtype, resolve_kv_dtype, serving_dtype
from kvplan.model.specs import LayerKind, LayerSpec, ModelSpec
from kvplan.records import dataclass
from kvplan.sources.resolve import resolve_model

LAYOUTS = ("paged", "contiguous")


@dataclass(frozen=True)
class VerifyRequest:
    """The flags of `kvplan verify`, as plain values (the CLI and the Python API both build one)."""

    model: str
    seq_tokens: int | None = None
    batch: int = 1
    kv_cache_dtype: str = "auto"
    dtype: str | None = None
    block_size: int = 16
    tp: int = 1
    pp: int = 1
    layout: str = "paged"
    fraction: float = 1.0
    steps: int = 16
    device: str | None = None  # None: cuda when available, else cpu
    decode_layers: int | None = None  # None: decode through every layer of the stage
    gpu: str | None = None  # catalog card whose peak bandwidth to compare with (default: detected)
    gpu_mem_bytes: int | None = None  # cap on the memory verify may use
    check: bool = True  # the cached-vs-recomputed correctness check
    revision: str | None = None
    token: str | None = None
    offline: bool = False


@dataclass(frozen=True)
class LayerPlan:
    """One layer of the verified pipeline stage: its spec and how many token slots a request gets in it."""

    index: int  # layer index in the model
    spec: LayerSpec
    kind: str
    resident_tokens: int  # tokens one request keeps (the window for sliding layers)
    paged_tokens: int  # whole blocks' worth of tokens one request holds in the paged layout


@dataclass(frozen=True)
class VerifySetup:
    request: VerifyRequest
    model: ModelSpec
    dtype: str  # compute dtype of the decode (the served weight dtype)
    kv_dtype: KvDtype
    seq_tokens: int
    batch: int  # after --fraction
    estimate: KvEstimate  # estimate_kv at `batch`, per TP rank, fullest pipeline stage
    layers: tuple[LayerPlan, ...]  # the fullest stage's layers (what one device holds)
    notices: tuple[str, ...]

    @property
    def tp(self) -> int:
        return self.request.tp

    @property
    def layout(self) -> str:
        return self.request.layout

    def predicted_bytes_by_kind(self) -> dict[str, int]:
        """Per kind, bytes for the whole batch on one rank: paged = whole blocks, contiguous = resident tokens."""
        out: dict[str, int] = {}
        for k in self.estimate.kinds:
            per_request = (k.paged_bytes if self.layout == "paged" else k.contiguous_bytes) + k.state_bytes
            out[k.kind] = out.get(k.kind, 0) + self.batch * per_request
        return out


# DeepSeek-V4's window, compressed latents and indexer keys are not built here; estimate and check size them.
COMPRESSED_REFUSAL = ("kvplan verify does not build DeepSeek-V4's compressed caches (its window, compressed "
                      "latents and indexer keys); `kvplan estimate --engine vllm` sizes them")


def scaled_batch(batch: int, fraction: float) -> int:
    """--fraction 0.25 of 16 requests -> 4; never below one request."""
    if not 0 < fraction <= 1:
        raise InputError(f"--fraction must be in (0, 1], got {fraction}")
    return max(1, math.floor(batch * fraction))


def _paged_tokens(kind: KindKv) -> int:
    """Tokens' worth of blocks per layer of this kind, read back from the estimate's paged bytes.

    Every layer of one KindKv group has the same resident tokens, so paged_bytes / bytes_per_token is the same
    block count for each: Llama at seq 100, block 16 -> 7 blocks = 112 tokens.
    """
    return kind.paged_bytes // kind.bytes_per_token if kind.bytes_per_token else 0


def prepare(req: VerifyRequest) -> VerifySetup:
    """Resolve the model and plan it exactly as `estimate` does, at the (fraction-scaled) batch."""
    if req.layout not in LAYOUTS:
        raise InputError(f"--layout must be one of {', '.join(LAYOUTS)}, got {req.layout!r}")
    if req.steps < 1:
        raise InputError("--steps must be >= 1")
    resolved = resolve_model(req.model, revision=req.revision, token=req.token, offline=req.offline)
    model = resolved.model
    if any(spec.kind == LayerKind.COMPRESSED_MLA for spec in model.layers):
        raise InputError(COMPRESSED_REFUSAL)
    if model.geometry.mla is not None and model.geometry.mla.index_head_dim:
        raise InputError("kvplan verify does not build a sparse-attention indexer's key cache (DeepSeek-V3.2); "
                         "`kvplan estimate --engine vllm` sizes it")
    notices = list(resolved.notices)
    seq_tokens = req.seq_tokens
    if seq_tokens is None:
        if model.max_position_embeddings is None:
            raise InputError(f"{model.name} states no max context (max_position_embeddings); pass --seq")
        seq_tokens = model.max_position_embeddings
        notices.append(f"--seq not given: using the model's max context, {seq_tokens:,} tokens")
    if seq_tokens <= req.steps:
        raise InputError(f"--seq {seq_tokens} must be larger than --steps {req.steps} (the prompt is seq - steps)")
    batch = scaled_batch(req.batch, req.fraction)
    if batch != req.batch:
        notices.append(f"--fraction {req.fraction:g}: batch scaled from {req.batch} to {batch} requests")
    dtype = req.dtype or serving_dtype(model.config_dtype)
    kv_dtype = resolve_kv_dtype(req.kv_cache_dtype, dtype)
    if kv_dtype.name in ENGINE_KV_DTYPES:
        raise InputError(f"--kv-cache-dtype {kv_dtype.name} is a layout of an engine's own kernels, which verify "
                         "does not run; verify int8, int4 or nvfp4 (the same bytes for the per-token-head kinds and "
                         "fp4_e2m1), or size it with kvplan estimate --engine vllm or sglang")
    if req.decode_layers is not None and req.decode_layers < 1:
        raise InputError("--decode-layers must be >= 1")
    estimate, layers = _plan_layers(model, kv_dtype, req, seq_tokens, batch)
    if req.pp > 1:
        first, last = layers[0].index, layers[-1].index
        notices.append(
            f"--pp {req.pp}: this device holds pipeline stage {estimate.fullest_stage} (layers {first}-{last}), "
            "the fullest one, as the estimate does"
        )
    return VerifySetup(
        request=req,
        model=model,
        dtype=dtype,
        kv_dtype=kv_dtype,
        seq_tokens=seq_tokens,
        batch=batch,
        estimate=estimate,
        layers=layers,
        notices=tuple(notices),
    )


def _plan_layers(model: ModelSpec, kv_dtype: KvDtype, req: VerifyRequest, seq_tokens: int,
                 batch: int) -> tuple[KvEstimate, tuple[LayerPlan, ...]]:
    kv_req = KvRequest(seq_tokens=seq_tokens, batch=batch, block_size=req.block_size, tp=req.tp, pp=req.pp)
    estimate = estimate_kv(model, kv_dtype, kv_req)
    stage = pp_stage_layers(model.num_layers, req.pp)[estimate.fullest_stage]
    by_key = {(k.kind, k.resident_tokens): k for k in estimate.kinds}
    layers = []
    for i in stage:
        spec = model.layers[i]
        resident = spec.resident_tokens(seq_tokens)
        group = by_key.get((spec.kind, resident))
        paged = _paged_tokens(group) if group is not None and resident else 0
        layers.append(LayerPlan(index=i, spec=spec, kind=spec.kind, resident_tokens=resident, paged_tokens=paged))
    return estimate, tuple(layers)


def replan(setup: VerifySetup, seq_tokens: int, batch: int) -> VerifySetup:
    """The same model and flags at another length and batch (the short correctness check runs at one)."""
    estimate, layers = _plan_layers(setup.model, setup.kv_dtype, setup.request, seq_tokens, batch)
    return replace(setup, seq_tokens=seq_tokens, batch=batch, estimate=estimate, layers=layers)
