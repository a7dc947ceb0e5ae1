"""What Hugging Face Transformers' caches hold, byte for byte: DynamicCache and StaticCache (transformers 5.x).

No paging and no tensor parallelism: each layer holds K and V tensors [batch, H_kv, tokens, D] in the model
dtype. A full-attention layer holds every token. A sliding-window layer of DynamicCache
(DynamicSlidingWindowLayer) keeps the last `sliding_window - 1` tokens after each update; StaticCache
preallocates min(sliding_window, max_cache_len) for it and max_cache_len for a full layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.dtypes import weight_dtype_bytes
from kvplan.errors import InputError
from kvplan.specs import FullAttentionSpec, ModelSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec

CACHE_KINDS = ("dynamic", "static")


@dataclass(frozen=True)
class HfLayerBytes:
    layer: int
    kind: str
    tokens: int  # tokens the layer's K (and V) tensor holds
    bytes: int  # K + V


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


def _resident(spec: FullAttentionSpec, cache: str, seq_tokens: int, max_cache_len: int) -> int:
    if isinstance(spec, ChunkedLocalAttentionSpec):
        raise InputError("the transformers engine does not model chunked attention caches (Llama 4); use --engine vllm")
    if isinstance(spec, SlidingWindowSpec):
        window = spec.sliding_window
        # Gemma-2's 4,096 window after a 5,000-token prefill: DynamicCache keeps 4,095 tokens.
        return min(seq_tokens, window - 1) if cache == "dynamic" else min(window, max_cache_len)
    return seq_tokens if cache == "dynamic" else max_cache_len


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
    out = []
    for i, spec in enumerate(model.layers):
        if not spec.has_cache:
            continue
        if not isinstance(spec, FullAttentionSpec):
            raise InputError(
                f"the transformers engine does not model {spec.kind} layers yet (layer {i}); use --engine vllm"
            )
        tokens = _resident(spec, cache, seq_tokens, max_len)
        per_token = spec.num_kv_heads * (spec.head_dim + spec.v_dim) * elem
        out.append(HfLayerBytes(i, spec.kind, tokens, batch * tokens * per_token))
    return HfCacheEstimate(cache, batch, seq_tokens, dtype, tuple(out))
