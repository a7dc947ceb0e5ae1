"""What Hugging Face Transformers' caches hold, byte for byte: DynamicCache and StaticCache (transformers 5.x).

No paging and no tensor parallelism; everything is per layer, in the dtype the model runs in unless said:
- full attention: K and V tensors [batch, H_kv, tokens, D] holding every token (StaticCache: max_cache_len);
- sliding window and Llama 4's chunked attention (one cache class for both, DynamicSlidingWindowLayer, with
  the chunk size as its window): the last `window - 1` tokens after each update (StaticCache: min(window,
  max_cache_len));
- MLA (DeepSeek-V2/V3): the compressed latent, not the decompressed heads: "keys" [batch, 1, tokens,
  kv_lora_rank] and "values" [batch, 1, tokens, qk_rope_head_dim];
- Mamba / Mamba2 / gated DeltaNet (LinearAttentionLayer): a conv state [batch, conv_dim, kernel] (the whole
  kernel, where vLLM keeps kernel - 1) in the model dtype and a recurrent state in float32, whatever the
  model dtype, because Transformers' scans accumulate the state in float32 and cache what they return;
- MLP/MoE-only layers and KV-shared layers (DummyLayer): nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar, cast

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.weights import estimate_weights
from kvplan.engines.base import EngineAccount, Knobs, KvPool, MemoryTerm, Refusal
from kvplan.errors import FieldError, InputError
from kvplan.model.dtypes import serving_dtype, weight_dtype_bytes
from kvplan.model.specs import (
    AttentionSpec,
    CompressedMLASpec,
    LayerKind,
    LayerSpec,
    MLASpec,
    ModelSpec,
    StateSpec,
    StateTensor,
)
from kvplan.records import dataclass
from kvplan.units import FP32_BYTES, fmt_gib

CACHE_KINDS = ("dynamic", "static")
# The recurrent state of every Transformers scan (mamba2_chunk_scan, torch_chunk_gated_delta_rule, Jamba's
# selective scan) is computed in float32 and cached as returned.
_RECURRENT_STATE_DTYPE = "float32"


@dataclass(frozen=True)
class HfLayerBytes:
    layer: int
    kind: str
    tokens: int  # tokens the layer's K (and V) tensor holds; 0 for a recurrent layer
    bytes: int  # K + V, or conv + recurrent state


@dataclass(frozen=True)
class HfCacheEstimate:
    cache: str
    batch: int
    seq_tokens: int
    dtype: str
    layers: tuple[HfLayerBytes, ...]

    @property
    def total_bytes(self) -> int:
        return sum(layer.bytes for layer in self.layers)


def _resident(window: int | None, cache: str, seq_tokens: int, max_cache_len: int) -> int:
    if window is None:
        return seq_tokens if cache == "dynamic" else max_cache_len
    # Gemma-2's 4,096 window after a 5,000-token prefill: DynamicCache keeps 4,095 tokens; Llama 4's
    # 8,192-token chunks after 9,000 tokens: 8,191.
    return min(seq_tokens, window - 1) if cache == "dynamic" else min(window, max_cache_len)


def _state_tensor_bytes(t: StateTensor, elem_bytes: int) -> int:
    """One state tensor for one request, as Transformers shapes it.

    kvplan's specs carry vLLM's shapes: conv (conv_dim, kernel - 1); Transformers keeps the whole kernel.
    Nemotron-3-Nano conv: (4096 + 2*8*128) x 4 x 2 B = 49,152 B; its ssm state (64, 64, 128) x 4 B
    (float32) = 2,097,152 B.
    """
    if t.name == "conv":
        conv_dim, kernel_minus_one = t.shape
        return conv_dim * (kernel_minus_one + 1) * elem_bytes
    count = 1
    for d in t.shape:
        count *= d
    return count * weight_dtype_bytes(_RECURRENT_STATE_DTYPE)


@dataclass(frozen=True)
class _Shape:
    """One layer's cache request: which layer, how long the run is, how many requests, bytes per element."""

    layer: int
    cache: str
    seq_tokens: int
    max_len: int
    batch: int
    elem: int


def _kv(spec: LayerSpec, s: _Shape) -> HfLayerBytes:
    """K and V of every KV head; a sliding or chunked layer keeps its window (one cache class for both)."""
    attn = cast(AttentionSpec, spec)  # the table sends only the attention kinds here
    tokens = _resident(attn.window_tokens, s.cache, s.seq_tokens, s.max_len)
    per_token = attn.num_kv_heads * (attn.head_dim + attn.v_dim) * s.elem
    return HfLayerBytes(s.layer, spec.kind, tokens, s.batch * tokens * per_token)


def _latent(spec: LayerSpec, s: _Shape) -> HfLayerBytes:
    """DeepSeek-V2-Lite: (512 + 64) x 2 B = 1,152 B per token, one "head", no K/V factor of two; DeepSeek-V3.2
    adds its indexer's key (DynamicIndexedLayer), 128 x 2 B more."""
    mla = cast(MLASpec, spec)
    tokens = _resident(None, s.cache, s.seq_tokens, s.max_len)
    width = mla.latent_dim + mla.index_head_dim
    return HfLayerBytes(s.layer, spec.kind, tokens, s.batch * tokens * width * s.elem)


def _state(spec: LayerSpec, s: _Shape) -> HfLayerBytes:
    per_request = sum(_state_tensor_bytes(t, s.elem) for t in cast(StateSpec, spec).tensors)
    return HfLayerBytes(s.layer, spec.kind, 0, s.batch * per_request)


def _compressed(spec: LayerSpec, s: _Shape) -> HfLayerBytes:
    """DeepSeek-V4 (modeling_deepseek_v4.py, Transformers 5.24; DynamicCache only). A window-only layer is a
    DynamicSlidingWindowLayer with K and V apart; a compressing layer (DeepseekV4CSACache for ratio 4,
    DeepseekV4HCACache for 128) aliases V to K and keeps, for its compressor and its indexer: the entries
    emitted (one per r tokens), the tokens since the last one (its kv and gate projections, coff x width
    each), and for ratio 4 the last window's first-series slice, kv in the model dtype and gate in float32.
    Flash, a ratio-4 layer, 5,000 tokens in bf16: 127 x 512 x 2 + 1,250 x (512 + 128) x 2 + 4 x (512 + 128) x
    (2 + 4) = 1,745,408 B a request."""
    if s.cache != "dynamic":
        raise FieldError("engine.cache", "Transformers keeps DeepSeek-V4's compressed state in DynamicCache "
                         "only", s.cache)
    c = cast(CompressedMLASpec, spec)
    tokens = _resident(c.window, s.cache, s.seq_tokens, s.max_len)
    r = c.compress_ratio
    per_request = tokens * c.head_dim * s.elem * (2 if r == 1 else 1)
    coff = 2 if r == 4 else 1
    for width in (c.head_dim, c.index_head_dim) if r > 1 else ():
        if not width:
            continue
        per_request += (s.seq_tokens // r) * width * s.elem  # compressed entries
        per_request += 2 * (s.seq_tokens % r) * coff * width * s.elem  # pending kv and gate projections
        if r == 4 and s.seq_tokens >= r:
            per_request += r * width * (s.elem + FP32_BYTES)  # the overlap: kv, and gate in float32
    return HfLayerBytes(s.layer, spec.kind, tokens, s.batch * per_request)


def _nothing(spec: LayerSpec, s: _Shape) -> None:
    return None  # DummyLayer: MLP/MoE-only and KV-shared layers cache nothing


# What Transformers' cache holds for each layer kind (None: the layer adds nothing).
KIND_RULES: dict[LayerKind, Callable[[LayerSpec, _Shape], HfLayerBytes | None]] = {
    LayerKind.FULL_ATTENTION: _kv,
    LayerKind.SLIDING_WINDOW: _kv,
    LayerKind.CHUNKED_LOCAL: _kv,
    LayerKind.MLA: _latent,
    LayerKind.COMPRESSED_MLA: _compressed,
    LayerKind.MAMBA: _state,
    LayerKind.LINEAR_ATTENTION: _state,
    LayerKind.SHARED_KV: _nothing,
    LayerKind.NO_CACHE: _nothing,
}


def hf_cache_bytes(
    model: ModelSpec,
    *,
    seq_tokens: int,
    batch: int = 1,
    dtype: str | None = None,
    cache: str = "dynamic",
    max_cache_len: int | None = None,
) -> HfCacheEstimate:
    """Bytes Transformers' cache holds after `seq_tokens` tokens of `batch` requests.

    Llama-3.1-8B, 1 x 1,000 tokens, bf16, DynamicCache: 32 layers x 8 heads x 128 x 2 (K, V) x 2 B x 1,000
    = 131,072,000 B.
    """
    if cache not in CACHE_KINDS:
        raise InputError(f"--hf-cache must be one of {', '.join(CACHE_KINDS)}, got {cache!r}")
    dtype = dtype or model.config_dtype or "float32"
    elem = weight_dtype_bytes(dtype)
    max_len = max_cache_len or seq_tokens
    if cache == "static" and seq_tokens > max_len:
        raise InputError(f"--seq {seq_tokens} exceeds the StaticCache max_cache_len {max_len}")
    rows = (KIND_RULES[spec.kind](spec, _Shape(i, cache, seq_tokens, max_len, batch, elem))
            for i, spec in enumerate(model.layers))
    return HfCacheEstimate(cache, batch, seq_tokens, dtype, tuple(r for r in rows if r is not None))


@dataclass(frozen=True)
class TransformersOptions:
    """`model.generate` in one process on one GPU: which cache class, and what else the process holds."""

    engine: ClassVar[str] = "transformers"

    cache: str = "dynamic"
    memory_fraction: float = 0.9  # share of the GPU kvplan lets the process fill (no engine enforces one)
    overhead_bytes: int | None = None  # activations and runtime; None: kvplan's generic figure

    def validate(self) -> None:
        if self.cache not in CACHE_KINDS:
            raise FieldError("engine.cache", f"must be one of {', '.join(CACHE_KINDS)}", self.cache)
        if not 0 < self.memory_fraction <= 1:
            raise FieldError("engine.memory_fraction", "must be in (0, 1]", self.memory_fraction)
        if self.overhead_bytes is not None and not 0 <= self.overhead_bytes < 1 << 50:
            raise FieldError("engine.overhead_bytes", "must be a size of 0 or more", self.overhead_bytes)


class TransformersEngine:
    """Hugging Face Transformers' generate(): no paging, no sharing; one process, one GPU."""

    name: ClassVar[str] = "transformers"
    label: ClassVar[str] = "Transformers"
    options_type: ClassVar[type] = TransformersOptions
    knobs: ClassVar[Knobs] = Knobs()

    def default_options(self) -> TransformersOptions:
        return TransformersOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        return 1

    def account(self, d: Deployment) -> EngineAccount:
        from kvplan.engines.generic import generic_overhead_bytes

        o = d.engine
        if not isinstance(o, TransformersOptions):
            raise TypeError("TransformersEngine needs TransformersOptions")
        p = d.parallelism
        if (p.tp, p.pp, p.dp) != (1, 1, 1) or p.expert_parallel:
            raise FieldError(
                "parallelism.tp" if p.tp > 1 else "parallelism.pp" if p.pp > 1 else "parallelism.dp",
                "the transformers engine models one process on one GPU; tensor, pipeline and data parallelism "
                "are vLLM and SGLang options",
            )
        dtype = d.weights.dtype or serving_dtype(d.model.config_dtype)
        if d.kv_cache_dtype.lower() not in ("auto", dtype, _SHORT.get(dtype, dtype)):
            raise FieldError(
                "kv_cache_dtype",
                f"Transformers' DynamicCache and StaticCache keep K and V in the model dtype ({dtype}); its "
                "quantized caches are not modelled: use auto",
                d.kv_cache_dtype,
            )
        length = d.max_model_len
        one = hf_cache_bytes(d.model, seq_tokens=length, batch=1, dtype=dtype, cache=o.cache).total_bytes
        weights = estimate_weights(
            d.model, dtype=dtype, quantization=d.weights.quantization, override_bytes=d.weights.checkpoint_bytes,
        ).per_gpu_bytes
        # Transformers allocates as it goes: another process's memory is not there to take.
        requested = min(math.floor(d.gpu.total_memory_bytes * o.memory_fraction),
                        d.gpu.total_memory_bytes - d.gpu_in_use_bytes)
        overhead = generic_overhead_bytes(1) if o.overhead_bytes is None else o.overhead_bytes
        budget = requested - weights - overhead
        refusal = None
        if budget < one:
            refusal = Refusal(
                "no_kv_memory" if budget <= 0 else "one_request",
                f"one request of {length:,} tokens needs {fmt_gib(one)} of cache; {fmt_gib(max(0, budget))} is left "
                "after the weights and overhead (torch.OutOfMemoryError in generate)",
                "workload.max_model_len",
            )
        return EngineAccount(
            engine=self.name,
            version=None,
            total_memory_bytes=d.gpu.total_memory_bytes,
            requested_bytes=requested,
            terms=(
                MemoryTerm("weights", weights, "weights"),
                MemoryTerm("overhead", overhead, "activations and runtime (kvplan's generic figure)"),
            ),
            kv_budget_bytes=max(0, budget),
            pools=(KvPool("KV bytes", "byte", 1, max(0, budget), one),),
            max_model_len=length,
            request_cap=None,
            engine_concurrency=max(0, budget) / one if one else 0.0,
            kv_cache_tokens=None,
            refusal=refusal,
            notes=(f"{o.cache} cache: every request keeps its own K/V tensors in {dtype}; nothing is paged or shared",),
            detail={"cache": o.cache, "dtype": dtype, "bytes_per_request": one},
            per_request_at=lambda n: (hf_cache_bytes(d.model, seq_tokens=n, batch=1, dtype=dtype,
                                                     cache=o.cache).total_bytes,),
        )


_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
