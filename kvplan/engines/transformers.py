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

from dataclasses import dataclass

from kvplan.errors import InputError
from kvplan.model.dtypes import weight_dtype_bytes
from kvplan.model.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    LayerSpec,
    MLASpec,
    ModelSpec,
    SlidingWindowSpec,
    StateSpec,
    StateTensor,
)

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


def _window(spec: FullAttentionSpec) -> int | None:
    """The window of a sliding or chunked layer (Transformers caches both alike), None for a full one."""
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return spec.attention_chunk_size
    if isinstance(spec, SlidingWindowSpec):
        return spec.sliding_window
    return None


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


def _layer_bytes(
    i: int, spec: LayerSpec, cache: str, seq_tokens: int, max_len: int, batch: int, elem: int
) -> HfLayerBytes:
    if isinstance(spec, StateSpec):
        per_request = sum(_state_tensor_bytes(t, elem) for t in spec.tensors)
        return HfLayerBytes(i, spec.kind, 0, batch * per_request)
    if isinstance(spec, MLASpec):
        # DeepSeek-V2-Lite: (512 + 64) x 2 B = 1,152 B per token, one "head", no K/V factor of two.
        tokens = _resident(None, cache, seq_tokens, max_len)
        return HfLayerBytes(i, spec.kind, tokens, batch * tokens * spec.latent_dim * elem)
    if isinstance(spec, FullAttentionSpec):
        tokens = _resident(_window(spec), cache, seq_tokens, max_len)
        per_token = spec.num_kv_heads * (spec.head_dim + spec.v_dim) * elem
        return HfLayerBytes(i, spec.kind, tokens, batch * tokens * per_token)
    raise InputError(f"the transformers engine does not model {spec.kind} layers (layer {i}); use --engine vllm")


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
    out = tuple(
        _layer_bytes(i, spec, cache, seq_tokens, max_len, batch, elem)
        for i, spec in enumerate(model.layers)
        if spec.has_cache
    )
    return HfCacheEstimate(cache, batch, seq_tokens, dtype, out)
