"""Frozen per-layer cache specs, one class per LayerKind, and the model description they make up.

One small frozen dataclass per kind of layer (vLLM's pattern): each says how many bytes one token costs
on one tensor-parallel rank, how many tokens a request keeps resident, and what constant state it holds.
The classes are siblings (shared fields sit in bases nothing dispatches on), each stating its `kind`;
consumers look that kind up in their rule tables (kvplan/kind_tables.py), so a new kind cannot fall
silently into another kind's branch. The planner never branches on model families, only on these specs,
so hybrids fall out of the same code.
"""

from __future__ import annotations

import math
from dataclasses import field, replace
from typing import ClassVar

from kvplan.model.dtypes import KvDtype, weight_dtype_bytes
from kvplan.model.geometry import Geometry
from kvplan.model.kinds import LayerKind
from kvplan.records import dataclass
from kvplan.units import cdiv


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """vLLM's get_num_kv_heads: heads split over ranks, at least one; beyond that they are replicated.

    Llama-3.1-70B has 8 KV heads: tp=8 -> 1 per rank; tp=16 -> still 1 (each head held by two ranks).
    """
    return max(1, num_kv_heads // tp)


@dataclass(frozen=True)
class LayerSpec:
    """What every layer spec answers, whatever its kind. Abstract: nothing is ever an instance of it alone,
    and consumers dispatch on `kind` through their rule tables, never with isinstance on a base class."""

    kind: ClassVar[LayerKind]

    def kv_bytes_per_token(self, kv: KvDtype, tp: int = 1) -> int:
        """Bytes one token adds to this layer's cache on one TP rank."""
        return 0

    def resident_tokens(self, seq_tokens: int) -> int:
        """Tokens of a `seq_tokens`-long request this layer keeps in its cache."""
        return 0

    def cache_bytes(self, kv: KvDtype, tp: int, seq_tokens: int) -> int:
        """Bytes a `seq_tokens`-long request keeps in this layer's cache on one TP rank, state excluded: the
        resident tokens at their bytes each, for every kind whose tokens all cost the same."""
        return self.kv_bytes_per_token(kv, tp) * self.resident_tokens(seq_tokens)

    def state_bytes(self, tp: int = 1) -> int:
        """Constant per-request state (Mamba / linear attention), independent of sequence length."""
        return 0

    @property
    def state_tensors(self) -> tuple[StateTensor, ...]:
        """The tensors of that state, for an engine that stores them in its own dtypes (SGLang)."""
        return ()

    def with_state_dtypes(self, conv: str, other: str) -> LayerSpec:
        """This layer with its conv state in `conv` and its other state tensors in `other` (vLLM's
        --mamba-cache-dtype / --mamba-ssm-cache-dtype); a layer without state is returned as is."""
        return self

    def with_conv_rows(self, extra: int) -> LayerSpec:
        """This layer with `extra` more rows in its conv state (speculative decoding's draft tokens)."""
        return self

    @property
    def window_tokens(self) -> int | None:
        """The most tokens a request keeps however long it runs (a window or chunk); None if unbounded."""
        return None

    @property
    def has_cache(self) -> bool:
        """Whether the layer stores anything per request (tokens or state)."""
        return True


@dataclass(frozen=True)
class NoCacheSpec(LayerSpec):
    """A layer that stores nothing per request (Nemotron-H's MLP and MoE layers)."""

    kind: ClassVar[LayerKind] = LayerKind.NO_CACHE

    @property
    def has_cache(self) -> bool:
        return False


@dataclass(frozen=True)
class AttentionSpec(LayerSpec):
    """Fields and page arithmetic shared by the K/V attention kinds; never matched on (dispatch by kind).

    2 * H_kv * D * b bytes per token (K and V): Llama-2-7B, 32 KV heads * (128 + 128) * 2 B = 16,384 B per
    token per layer.
    """

    num_kv_heads: int
    head_dim: int
    v_head_dim: int | None = None  # a V width different from K's (None: same as head_dim)

    @property
    def v_dim(self) -> int:
        return self.head_dim if self.v_head_dim is None else self.v_head_dim

    def kv_heads(self, tp: int = 1) -> int:
        return kv_heads_per_rank(self.num_kv_heads, tp)

    def kv_bytes_per_token(self, kv: KvDtype, tp: int = 1) -> int:
        return self.kv_heads(tp) * kv.head_bytes(self.head_dim, self.v_dim)

    def resident_tokens(self, seq_tokens: int) -> int:
        window = self.window_tokens
        return seq_tokens if window is None else min(seq_tokens, window)


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Full causal attention, MHA / GQA / MQA: every token of the request stays resident."""

    kind: ClassVar[LayerKind] = LayerKind.FULL_ATTENTION


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention: the same page as full attention, but only the last W tokens stay.

    gpt-oss-20b's sliding layers keep 128 tokens whatever the context.
    """

    sliding_window: int = 0

    kind: ClassVar[LayerKind] = LayerKind.SLIDING_WINDOW

    @property
    def window_tokens(self) -> int | None:
        return self.sliding_window


@dataclass(frozen=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention (Llama 4): a token attends within its chunk, so one chunk stays resident."""

    attention_chunk_size: int = 0

    kind: ClassVar[LayerKind] = LayerKind.CHUNKED_LOCAL

    @property
    def window_tokens(self) -> int | None:
        return self.attention_chunk_size


@dataclass(frozen=True)
class MLASpec(LayerSpec):
    """Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2) as vLLM and SGLang cache it.

    One compressed latent of kv_lora_rank + qk_rope_head_dim values per token, no K/V factor of two, and
    the same latent on every TP rank: DeepSeek-V3 = (512 + 64) * 2 B = 1,152 B per token per layer. With
    sparse attention (DeepSeek-V3.2) the lightning indexer's key of index_head_dim values sits beside it:
    1,152 + 128 * 2 = 1,408 B in bf16 (vLLM stores that key in fp8 whatever the cache: vllm_dsa).
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    index_head_dim: int = 0  # the indexer's key width; 0 without sparse attention

    kind: ClassVar[LayerKind] = LayerKind.MLA

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def kv_bytes_per_token(self, kv: KvDtype, tp: int = 1) -> int:
        index = kv.vector_bytes(self.index_head_dim) if self.index_head_dim else 0
        return kv.vector_bytes(self.latent_dim) + index

    def resident_tokens(self, seq_tokens: int) -> int:
        return seq_tokens


@dataclass(frozen=True)
class CompressedMLASpec(LayerSpec):
    """A DeepSeek-V4 attention layer. One latent head of `head_dim` values (K = V) serves every query head, so
    the cache is the same on every TP rank. The layer keeps the last `window` tokens' latents, and where
    `compress_ratio` r > 1 one compressed latent per r tokens of the whole history; r = 4 layers also keep
    an indexer key of `index_head_dim` values per compressed entry. DeepSeek-V4-Flash in bf16 at 32,768
    tokens: a ratio-4 layer holds 128 x 1,024 + 8,192 x (1,024 + 256) = 10,616,832 B, a ratio-128 layer
    128 x 1,024 + 256 x 1,024 = 393,216 B. (vLLM stores them in its own fp8 layout: vllm_dsv4.)"""

    head_dim: int
    rope_dim: int
    window: int
    compress_ratio: int = 1  # 1: the window alone
    index_head_dim: int = 0  # the indexer's key width (ratio-4 layers); 0 without an indexer

    kind: ClassVar[LayerKind] = LayerKind.COMPRESSED_MLA

    def entry_bytes(self, kv: KvDtype) -> int:
        """One latent, a window token's or a compressed entry's (the indexer key apart: index_bytes)."""
        return kv.vector_bytes(self.head_dim)

    def index_bytes(self, kv: KvDtype) -> int:
        return kv.vector_bytes(self.index_head_dim) if self.index_head_dim else 0

    def compressed_entries(self, seq_tokens: int) -> int:
        """Compressed latents a request holds: one per complete run of r tokens (0 for the window alone)."""
        return seq_tokens // self.compress_ratio if self.compress_ratio > 1 else 0

    def kv_bytes_per_token(self, kv: KvDtype, tp: int = 1) -> int:
        """What one more token adds once the window is full, averaged over r tokens and rounded up (ratio
        128 in bf16: cdiv(1,024, 128) = 8 B); a window-only layer adds nothing past its window, and is
        reported at its window tokens' bytes each."""
        if self.compress_ratio == 1:
            return self.entry_bytes(kv)
        return cdiv(self.entry_bytes(kv) + self.index_bytes(kv), self.compress_ratio)

    def resident_tokens(self, seq_tokens: int) -> int:
        return min(seq_tokens, self.window) if self.compress_ratio == 1 else seq_tokens

    def cache_bytes(self, kv: KvDtype, tp: int, seq_tokens: int) -> int:
        window = min(seq_tokens, self.window) * self.entry_bytes(kv)
        return window + self.compressed_entries(seq_tokens) * (self.entry_bytes(kv) + self.index_bytes(kv))

    @property
    def window_tokens(self) -> int | None:
        return self.window if self.compress_ratio == 1 else None


@dataclass(frozen=True)
class StateTensor:
    """One constant-size state tensor of a recurrent layer, e.g. Mamba2's conv state (conv_dim, kernel-1).

    `split_dim` is the axis tensor parallelism divides (heads or channels); None if replicated.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    split_dim: int | None = 0

    def elements(self, tp: int = 1) -> int:
        dims = list(self.shape)
        if self.split_dim is not None and tp > 1:
            dims[self.split_dim] = cdiv(dims[self.split_dim], tp)
        return math.prod(dims)

    def bytes(self, tp: int = 1) -> int:
        return self.elements(tp) * weight_dtype_bytes(self.dtype)


@dataclass(frozen=True)
class StateSpec(LayerSpec):
    """Fields shared by the recurrent kinds: constant state tensors per request, whatever the sequence
    length. Never matched on (dispatch by kind).

    Nemotron-H-56B Mamba2 layer: conv (8192 + 2*8*128, 3) bf16 = 55,296 B and ssm (128, 64, 256)... per request.
    """

    tensors: tuple[StateTensor, ...] = ()

    def state_bytes(self, tp: int = 1) -> int:
        return sum(t.bytes(tp) for t in self.tensors)

    @property
    def state_tensors(self) -> tuple[StateTensor, ...]:
        return self.tensors

    def with_state_dtypes(self, conv: str, other: str) -> LayerSpec:
        return replace(self, tensors=tuple(replace(t, dtype=conv if t.name == "conv" else other)
                                           for t in self.tensors))

    def with_conv_rows(self, extra: int) -> LayerSpec:
        if not extra:
            return self
        return replace(self, tensors=tuple(replace(t, shape=(*t.shape[:-1], t.shape[-1] + extra))
                                           if t.name == "conv" else t for t in self.tensors))


@dataclass(frozen=True)
class MambaSpec(StateSpec):
    """A Mamba (v1, Jamba) or Mamba2 (Nemotron-H, Granite 4) layer: a conv state and an SSM state."""

    kind: ClassVar[LayerKind] = LayerKind.MAMBA


@dataclass(frozen=True)
class LinearAttentionSpec(StateSpec):
    """A gated DeltaNet linear-attention layer (Qwen3-Next): a conv state and a recurrent state."""

    kind: ClassVar[LayerKind] = LayerKind.LINEAR_ATTENTION


@dataclass(frozen=True)
class SharedKVSpec(LayerSpec):
    """A layer that reads another layer's KV (Gemma 3n `num_kv_shared_layers`): it stores none of its own."""

    source_layer: int = 0

    kind: ClassVar[LayerKind] = LayerKind.SHARED_KV

    @property
    def has_cache(self) -> bool:
        return False


# The one spec class of each kind, for the parser and for tests that every kind has a class.
SPEC_CLASSES: dict[LayerKind, type[LayerSpec]] = {
    cls.kind: cls
    for cls in (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLASpec, CompressedMLASpec,
                MambaSpec, LinearAttentionSpec, SharedKVSpec, NoCacheSpec)
}


@dataclass(frozen=True)
class QuantSpec:
    """How the checkpoint's weights are stored (from `quantization_config` / hf_quant_config.json)."""

    method: str  # "fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "nvfp4", "bitsandbytes", ...
    weight_bits: int
    group_size: int | None = None  # elements per scale group; None = per-channel / per-tensor
    block_shape: tuple[int, int] | None = None  # fp8 block scales, e.g. (128, 128)
    scale_bytes: int = 0
    zero_point_bits: int = 0
    excluded: tuple[str, ...] = ()  # module patterns left at the model dtype
    note: str = ""
    # MIXED_PRECISION (ModelOpt): (module name, its format), sorted; empty for one format per checkpoint.
    per_module: tuple[tuple[str, QuantSpec], ...] = ()
    # A ModelOpt checkpoint's KV cache quantization ("FP8", "NVFP4", or the name it gives), which engines
    # follow under --kv-cache-dtype auto (kvplan.engines.checkpoint_kv); None: the checkpoint states none.
    kv_cache_quant: str | None = None


@dataclass(frozen=True)
class ParamGroup:
    """A count of parameters that share one fate: quantizable linear weights, or kept at model dtype."""

    name: str  # "embed_tokens", "lm_head", "attention", "mlp", "experts", "norms", "vision", ...
    params: int
    quantizable: bool = False  # a Linear weight a weight-only quantizer would pack
    # Per-rank sharding under TP: "split" (column/row parallel), "replicated" (norms, routers),
    # "vocab" (embeddings / lm_head are split over TP too in vLLM).
    tp: str = "split"
    # The group's Linear matrices, for group-wise scale counts and the vision tower's shape; empty = none.
    matrices: tuple[tuple[int, int, int], ...] = ()  # (count, out_features, in_features)
    fmt: QuantSpec | None = None  # its format in a MIXED_PRECISION checkpoint; None: the checkpoint's one
    # Bytes per parameter where the model keeps the group in its own dtype whatever the serving dtype
    # (DeepSeek-V4's float32 hyper-connection mixers, int32 hash-routing table); None: the serving dtype.
    elem_bytes: int | None = None
    # A tensor the model loads that is a buffer, not a parameter (DeepSeek-V4's hash table and router bias):
    # its bytes count, but not in the parameter count, as Transformers counts parameters.
    buffer: bool = False


@dataclass(frozen=True)
class MtpSpec:
    """The multi-token-prediction block a checkpoint stores beside the model (DeepSeek-V3's
    num_nextn_predict_layers, Qwen3.5's mtp_num_hidden_layers). Serving loads it only as the draft of MTP
    speculative decoding: its weights (the embeddings and head are the model's own) and one attention
    layer's cache per block."""

    layers: tuple[LayerSpec, ...]  # each block's cache, the spec of the model's own attention layer
    param_groups: tuple[ParamGroup, ...]

    @property
    def num_params(self) -> int:
        return sum(g.params for g in self.param_groups if not g.buffer)


@dataclass(frozen=True)
class ModelSpec:
    """Everything kvplan knows about a model, parsed once from its config. Pure data.

    The sizes of the model (widths, heads, experts, vocabulary) live in `geometry`, the one record both the
    cache specs and the parameter count were built from; the properties below read it.
    """

    name: str
    source: str  # where the config came from: "library:<file>", a path, or "hub:<repo>@<rev>"
    model_type: str
    architecture: str
    family: str
    geometry: Geometry
    layers: tuple[LayerSpec, ...]
    dtype: str  # the config's torch_dtype, normalized ("bfloat16"); None-free: see config_dtype
    config_dtype: str | None
    param_groups: tuple[ParamGroup, ...] = ()
    quant: QuantSpec | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    mtp: MtpSpec | None = None  # not in param_groups: loaded only for MTP speculative decoding

    @property
    def hidden_size(self) -> int:
        return self.geometry.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.geometry.vocab_size

    @property
    def max_position_embeddings(self) -> int | None:
        return self.geometry.max_position_embeddings

    @property
    def num_attention_heads(self) -> int:
        return self.geometry.num_attention_heads

    @property
    def intermediate_size(self) -> int | None:
        """The MLP width; the widest layer's where the config lists one per layer (Gemma 3n)."""
        return self.geometry.intermediate_size

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> int:
        return sum(g.params for g in self.param_groups if not g.buffer)

    def spec_counts(self, layers: range) -> dict[LayerSpec, int]:
        """How many of `layers` share each distinct spec ({FullAttentionSpec(8, 128): 32} for Llama-3.1-8B).

        Planning sizes each distinct spec once; this memo (a pure function of frozen fields, kept in the
        instance dict) spares the bisections of `plan` from re-hashing 80 identical specs per step.
        """
        memo = self.__dict__.setdefault("_spec_counts_memo", {})
        key = (layers.start, layers.stop)
        if key not in memo:
            counts: dict[LayerSpec, int] = {}
            for i in layers:
                counts[self.layers[i]] = counts.get(self.layers[i], 0) + 1
            memo[key] = counts
        return memo[key]

    def layer_kinds(self) -> dict[LayerKind, int]:
        """Count of layers per kind, in first-seen order: {'sliding_window': 12, 'full_attention': 12}."""
        out: dict[LayerKind, int] = {}
        for spec in self.layers:
            out[spec.kind] = out.get(spec.kind, 0) + 1
        return out

    @property
    def attention_sinks(self) -> bool:
        """Whether the attention layers keep a learned sink per head (gpt-oss), which only some engine backends
        run: the parser counts them as their own parameter group."""
        return any(g.name == "attention_sinks" for g in self.param_groups)
