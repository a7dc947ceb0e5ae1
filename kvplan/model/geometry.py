"""The model's geometry, read once from its config: the one record cache specs and parameter counts share.

Widths, heads, each layer's kind, experts, MLA and recurrent dimensions are derived here and nowhere else,
so the KV cache and the weights cannot disagree about a model (a config with `multi_query_group_num: 2`
has 2 KV heads in both; `kv_channels: 128` is the head size of both).
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import ConfigError
from kvplan.model.config_reader import ConfigReader
from kvplan.model.kinds import LayerKind
from kvplan.model.layer_kinds import mixer_kinds
from kvplan.records import dataclass

_FALCON_TYPES = ("falcon", "RefinedWebModel", "RefinedWeb")


@dataclass(frozen=True)
class MoeGeometry:
    """Routed experts, where the config makes some layers sparse."""

    num_experts: int  # routed experts per MoE layer
    experts_per_token: int  # num_experts_per_tok; 0 where the config does not say
    expert_intermediate_size: int  # one expert's MLP width: moe_intermediate_size, else intermediate_size
    shared_experts: int  # n_shared_experts (DeepSeek, Nemotron-H); 0 without
    shared_expert_intermediate_size: int | None  # Qwen2-MoE / Qwen3-Next / Nemotron-H's shared expert width
    layers: tuple[int, ...]  # the MoE layers; never empty (a model without one has moe=None)


@dataclass(frozen=True)
class MlaGeometry:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3, Kimi-K2)."""

    q_lora_rank: int | None  # None: a full-rank q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    # DeepSeek-V3.2's lightning indexer (sparse attention): its heads, key width and tokens kept; 0 without.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0


@dataclass(frozen=True)
class CompressedMlaGeometry:
    """DeepSeek-V4's attention: one shared latent head (K = V) of head_dim values, of which the last
    qk_rope_head_dim are rotated; every layer keeps a sliding window of latents, and a layer whose
    compress_ratio is r > 1 also keeps one compressed latent per r tokens (r = 4 adds a sparse-attention
    indexer with its own keys). DeepSeek-V4-Flash: 512 = 448 + 64 wide, window 128, ratios 0, 0, then 4 and
    128 alternating."""

    head_dim: int  # the latent's width (512)
    rope_dim: int  # its rotated part (qk_rope_head_dim, 64)
    window: int  # sliding_window (128)
    compress_ratios: tuple[int, ...]  # per layer: 1 (the window only), 4 or 128
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int  # the grouped output projection's groups
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int  # hyper-connections: the residual stream is hc_mult x hidden wide
    num_hash_layers: int  # the first layers route tokens by a hash table instead of a learned gate


@dataclass(frozen=True)
class MambaGeometry:
    """Mamba (v1, Jamba) or Mamba2 (Nemotron-H, Granite 4) mixer dimensions."""

    version: int  # 1 or 2
    inner_size: int  # d_inner: mamba_expand * hidden (Jamba, Granite 4) or heads * head_dim (Nemotron-H)
    state_size: int  # d_state
    conv_kernel: int
    num_heads: int = 0  # Mamba2 only, as are head_dim and n_groups
    head_dim: int = 0
    n_groups: int = 0
    # Tokens per chunk of the SSD kernel (mamba_chunk_size or chunk_size); vLLM takes 2,048 for Mamba1, which
    # has none (ModelConfig.get_mamba_chunk_size). Prefix caching in mamba_cache_mode "all" aligns blocks to it.
    chunk_size: int = 2048
    ssm_cache_dtype: str | None = None  # the config's mamba_ssm_cache_dtype, where it states one (Nemotron-3-Nano)


@dataclass(frozen=True)
class LinearAttentionGeometry:
    """Gated DeltaNet dimensions (Qwen3-Next's linear-attention layers)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int


@dataclass(frozen=True)
class Geometry:
    """A model's sizes, per layer where they vary. Llama-3.1-8B: hidden 4096, 32 layers of full attention,
    32 query and 8 KV heads of 128, MLP 14336, vocabulary 128,256, untied, 131,072 positions."""

    hidden_size: int
    num_attention_heads: int
    head_dim: int
    v_head_dim: int  # the V width (MLA: its v_head_dim); equal to head_dim in most models
    kv_heads: tuple[int, ...]  # per layer
    head_dims: tuple[int, ...]  # per layer: head_dim, or the global layers' own (Gemma 4: 256 and 512)
    v_from_k: tuple[bool, ...]  # per layer: V is projected by k_proj (Gemma 4 global layers: no v_proj)
    layer_kinds: tuple[LayerKind, ...]  # per layer
    kv_source: tuple[int, ...]  # per layer, the layer whose KV it reads: itself, unless SHARED_KV
    intermediate_sizes: tuple[int, ...]  # MLP width per layer; () where the config states none (GPT-2)
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    sliding_window: int | None
    attention_chunk_size: int | None
    moe: MoeGeometry | None = None
    mla: MlaGeometry | None = None
    compressed_mla: CompressedMlaGeometry | None = None
    mamba: MambaGeometry | None = None
    linear_attention: LinearAttentionGeometry | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def intermediate_size(self) -> int | None:
        """The widest layer's MLP (Gemma 3n lists one per layer), None where the config states none."""
        return max(self.intermediate_sizes) if self.intermediate_sizes else None

    @property
    def rotary_dim(self) -> int:
        """Per-head width kvplan sizes the rotary cos/sin cache by: MLA rotates only qk_rope_head_dim,
        other attention the whole head (a partial_rotary_factor is not applied)."""
        if self.compressed_mla is not None:
            return self.compressed_mla.rope_dim
        return self.mla.qk_rope_head_dim if self.mla is not None else self.head_dim

    def v_dim(self, i: int) -> int:
        """Layer i's V width: v_head_dim, unless the layer has a head size of its own (then V's is the same)."""
        return self.v_head_dim if self.head_dims[i] == self.head_dim else self.head_dims[i]

    def layers_of(self, *kinds: LayerKind) -> list[int]:
        """Indices of the layers of any of `kinds`: Gemma-2's sliding layers are [0, 2, 4, ...]."""
        return [i for i, kind in enumerate(self.layer_kinds) if kind in kinds]


def read_geometry(cfg: ConfigReader, raw: dict[str, Any], *, model_type: str, text_type: str,
                  notes: list[str]) -> Geometry:
    """The geometry of the (text) model `cfg` reads; `raw` is the whole config (a multimodal wrapper's
    tie_word_embeddings sits at its top level). Raises ConfigError naming the key of any contradiction."""
    hidden = cfg.require_int("hidden_size", "n_embd", "d_model", "dim")
    num_layers = cfg.require_int("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    num_heads = cfg.require_int("num_attention_heads", "n_head", "num_heads", "n_heads")
    head_dim = _head_dim(cfg, hidden, num_heads)
    kv_heads = _kv_heads_by_layer(cfg, model_type, num_heads, num_layers)

    mixers = mixer_kinds(cfg, model_type, text_type, num_layers, notes)
    shared = _num_kv_shared(cfg, num_layers)
    first_shared = num_layers - shared
    kinds = tuple(LayerKind.SHARED_KV if i >= first_shared else k for i, k in enumerate(mixers))
    kv_source = tuple(_shared_source(mixers, i, first_shared) if i >= first_shared else i for i in range(num_layers))

    mla = _mla(cfg) if LayerKind.MLA in kinds else None
    intermediate = _intermediate_sizes(cfg, num_layers)
    head_dims, kv_heads, v_from_k = _global_layers(cfg, kinds, head_dim, kv_heads, num_heads)
    return Geometry(
        hidden_size=hidden,
        num_attention_heads=num_heads,
        head_dim=head_dim,
        v_head_dim=mla.v_head_dim if mla else (cfg.opt_int("v_head_dim") or head_dim),
        kv_heads=tuple(kv_heads),
        head_dims=tuple(head_dims),
        v_from_k=tuple(v_from_k),
        layer_kinds=kinds,
        kv_source=kv_source,
        intermediate_sizes=intermediate,
        vocab_size=cfg.require_int("vocab_size", "padded_vocab_size"),
        tie_word_embeddings=_tied(raw, cfg),
        max_position_embeddings=cfg.opt_int(
            "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx"
        ),
        sliding_window=cfg.opt_int("sliding_window"),
        attention_chunk_size=cfg.opt_int("attention_chunk_size"),
        moe=_moe(cfg, model_type, num_layers, max(intermediate) if intermediate else None),
        mla=mla,
        compressed_mla=_compressed_mla(cfg, num_layers, head_dim) if LayerKind.COMPRESSED_MLA in kinds else None,
        mamba=_mamba(cfg, model_type, hidden) if LayerKind.MAMBA in mixers else None,
        linear_attention=_linear_attention(cfg) if LayerKind.LINEAR_ATTENTION in mixers else None,
    )


def _global_layers(cfg: ConfigReader, kinds: tuple[LayerKind, ...], head_dim: int, kv_heads: list[int],
                   num_heads: int) -> tuple[list[int], list[int], list[bool]]:
    """Head size, KV heads and whether V comes from k_proj, per layer. Gemma 4's full-attention ("global")
    layers differ from its sliding ones: global_head_dim wide heads, and with attention_k_eq_v
    num_global_key_value_heads of them whose V is the K projection (gemma-4-26B-A4B: sliding 8 x 256,
    global 2 x 512, K = V). Every other model: head_dim and its KV heads on every layer."""
    global_dim = cfg.opt_int("global_head_dim")
    k_eq_v = cfg.flag("attention_k_eq_v", False)
    global_kv = cfg.opt_int("num_global_key_value_heads") if k_eq_v else None
    if global_kv is not None and (global_kv > num_heads or num_heads % global_kv):
        raise cfg.error("num_global_key_value_heads", f"{global_kv} KV heads do not divide {num_heads} attention heads")
    dims, heads, from_k = [], [], []
    for kind, kv in zip(kinds, kv_heads, strict=True):
        is_global = kind == LayerKind.FULL_ATTENTION
        dims.append(global_dim if is_global and global_dim else head_dim)
        heads.append(global_kv if is_global and global_kv else kv)
        from_k.append(is_global and k_eq_v)
    return dims, heads, from_k


def _head_dim(cfg: ConfigReader, hidden: int, num_heads: int) -> int:
    """An explicit head size wins (Qwen3, Gemma, Mistral-Nemo: 5120 / 32 = 160 but head_dim 128; ChatGLM
    names it kv_channels); otherwise hidden / heads, which must divide."""
    explicit = cfg.opt_int("head_dim", "attention_head_dim", "kv_channels")
    if explicit is not None:
        return explicit
    if hidden % num_heads:
        raise cfg.error("head_dim", f"is absent and hidden size {hidden} is not divisible by {num_heads} heads; "
                        "the config must state it")
    return hidden // num_heads


def _kv_heads_by_layer(cfg: ConfigReader, model_type: str, num_heads: int, num_layers: int) -> list[int]:
    """KV heads of each layer: a list-valued num_key_value_heads gives one per layer, else one for all.
    Each must divide the query heads (GQA groups are whole)."""
    _, value = cfg.raw_value("num_key_value_heads")
    if isinstance(value, list):
        per_layer = cfg.int_or_per_layer_list("num_key_value_heads", num_layers)
    else:
        per_layer = [_num_kv_heads(cfg, model_type, num_heads)] * num_layers
    for kv in sorted(set(per_layer)):
        if kv > num_heads or num_heads % kv:
            raise cfg.error("num_key_value_heads", f"{kv} KV heads do not divide {num_heads} attention heads")
    return per_layer


def _num_kv_heads(cfg: ConfigReader, model_type: str, num_heads: int) -> int:
    """KV heads under every naming the families use; MHA when nothing says otherwise."""
    if model_type in _FALCON_TYPES:
        # Falcon: the new decoder architecture (40B/180B) states num_kv_heads; the old one is MQA when
        # multi_query is set (falcon-7b: 71 heads, 1 KV head), MHA otherwise.
        if cfg.flag("new_decoder_architecture", False) or cfg.sets("n_head_kv"):
            return cfg.require_int("num_kv_heads", "n_head_kv")
        if cfg.flag("multi_query", model_type == "falcon"):
            return 1
        return cfg.opt_int("num_kv_heads") or num_heads
    if model_type == "gpt_bigcode":
        # GPT-BigCode (StarCoder) is MQA unless multi_query is false; the class default is true.
        return 1 if cfg.flag("multi_query", True) else num_heads
    explicit = cfg.opt_int("num_key_value_heads", "num_kv_heads", "n_head_kv")
    if explicit is not None:
        return explicit
    if cfg.has("multi_query_group_num"):
        # ChatGLM / GLM-4: multi_query_group_num KV heads when multi_query_attention is on (its class
        # default), full MHA when the config turns it off. chatglm3-6b: 32 heads, 2 groups.
        if cfg.flag("multi_query_attention", True):
            return cfg.require_int("multi_query_group_num")
    return num_heads


def _num_kv_shared(cfg: ConfigReader, num_layers: int) -> int:
    """Gemma 3n's num_kv_shared_layers: the last N layers read an earlier layer's KV."""
    shared = cfg.opt_int("num_kv_shared_layers", minimum=0) or 0
    if shared >= num_layers:
        raise cfg.error("num_kv_shared_layers", f"{shared} shared layers leave none of {num_layers} to own KV")
    return shared


def _shared_source(mixers: list[LayerKind], layer: int, first_shared: int) -> int:
    """Gemma 3n: a shared layer reads the last non-shared layer of the same attention kind."""
    for j in range(first_shared - 1, -1, -1):
        if mixers[j] == mixers[layer]:
            return j
    return first_shared - 1


def _intermediate_sizes(cfg: ConfigReader, num_layers: int) -> tuple[int, ...]:
    """The MLP width of each layer: one number for all, or a per-layer list (Gemma 3n); () when unstated."""
    name, value = cfg.raw_value("intermediate_size", "ffn_dim", "n_inner")
    if value is None:
        return ()
    return tuple(cfg.int_or_per_layer_list(name, num_layers))


def _tied(raw: dict[str, Any], cfg: ConfigReader) -> bool:
    """tie_word_embeddings: a multimodal wrapper's top-level value wins, then the text config and its class
    default, then Transformers' PretrainedConfig default (true)."""
    value = raw.get("tie_word_embeddings")
    if value is not None:
        if not isinstance(value, bool):
            raise ConfigError("tie_word_embeddings", f"must be true or false, got {value!r}", cfg.source)
        return value
    return cfg.flag("tie_word_embeddings", True)


def _mla(cfg: ConfigReader) -> MlaGeometry:
    return MlaGeometry(
        q_lora_rank=cfg.opt_int("q_lora_rank"),
        kv_lora_rank=cfg.require_int("kv_lora_rank"),
        qk_nope_head_dim=cfg.require_int("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.require_int("qk_rope_head_dim"),
        v_head_dim=cfg.require_int("v_head_dim"),
        index_n_heads=cfg.require_int("index_n_heads") if cfg.has("index_topk") else 0,
        index_head_dim=cfg.require_int("index_head_dim") if cfg.has("index_topk") else 0,
        index_topk=cfg.opt_int("index_topk") or 0,
    )


# The ratios DeepSeek-V4's compressor is built for (vLLM's DeepseekCompressor asserts them).
COMPRESS_RATIOS = (4, 128)


def _compressed_mla(cfg: ConfigReader, num_layers: int, head_dim: int) -> CompressedMlaGeometry:
    """DeepSeek-V4's attention dimensions. compress_ratios may list one more entry than there are layers
    (the MTP block's, which vLLM never reads); 0 means the window alone (kept as ratio 1)."""
    listed = cfg.int_list("compress_ratios", minimum=0)
    if len(listed) < num_layers:
        raise cfg.error("compress_ratios", f"has {len(listed)} entries for {num_layers} layers")
    ratios = tuple(max(1, r) for r in listed[:num_layers])
    bad = sorted({r for r in ratios if r != 1 and r not in COMPRESS_RATIOS})
    if bad:
        raise cfg.error("compress_ratios", f"has ratios {bad}; DeepSeek-V4's compressor takes 0, 4 or 128")
    rope = cfg.require_int("qk_rope_head_dim")
    if rope >= head_dim:
        raise cfg.error("qk_rope_head_dim", f"{rope} must be below head_dim {head_dim}")
    return CompressedMlaGeometry(
        head_dim=head_dim,
        rope_dim=rope,
        window=cfg.require_int("sliding_window"),
        compress_ratios=ratios,
        q_lora_rank=cfg.require_int("q_lora_rank"),
        o_lora_rank=cfg.require_int("o_lora_rank"),
        o_groups=cfg.require_int("o_groups"),
        index_n_heads=cfg.require_int("index_n_heads"),
        index_head_dim=cfg.require_int("index_head_dim"),
        index_topk=cfg.require_int("index_topk"),
        hc_mult=cfg.opt_int("hc_mult") or 1,
        num_hash_layers=cfg.opt_int("num_hash_layers", minimum=0) or 0,
    )


def _moe(cfg: ConfigReader, model_type: str, num_layers: int, intermediate: int | None) -> MoeGeometry | None:
    """Routed experts and the layers that use them, by each family's rule; None for a dense model (also
    when a class default names experts that no layer of this config uses: Nemotron-H-56B is dense)."""
    experts = cfg.opt_int("num_local_experts", "num_experts", "n_routed_experts", minimum=0) or 0
    if not experts:
        if model_type == "nemotron_h" and "E" in (cfg.opt_str("hybrid_override_pattern") or ""):
            raise cfg.error("n_routed_experts", "is missing but hybrid_override_pattern has MoE layers (E)")
        return None
    layers = _moe_layers(cfg, model_type, num_layers, experts)
    if not layers:
        return None
    width = cfg.opt_int("moe_intermediate_size") or intermediate
    if width is None:
        raise cfg.error("moe_intermediate_size",
                        "is missing, and so is intermediate_size: kvplan needs the expert width")
    return MoeGeometry(
        num_experts=experts,
        experts_per_token=cfg.opt_int("num_experts_per_tok", minimum=0) or 0,
        expert_intermediate_size=width,
        shared_experts=cfg.opt_int("n_shared_experts", minimum=0) or 0,
        shared_expert_intermediate_size=cfg.opt_int(
            "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", minimum=0
        ),
        layers=tuple(layers),
    )


def _moe_layers(cfg: ConfigReader, model_type: str, num_layers: int, experts: int) -> list[int]:
    """Which layers are sparse, as each family's config says it."""
    if model_type == "nemotron_h":
        # Nemotron-H: 'E' marks an MoE layer in hybrid_override_pattern (mixer_kinds checked its length).
        return [i for i, code in enumerate(cfg.opt_str("hybrid_override_pattern") or "") if code == "E"]
    if model_type == "jamba":
        # Jamba: every expert_layer_period-th layer from expert_layer_offset; one expert is a dense MLP.
        period = cfg.opt_int("expert_layer_period") or 1
        offset = cfg.opt_int("expert_layer_offset", minimum=0) or 0
        return [i for i in range(num_layers) if experts > 1 and i % period == offset]
    if model_type == "granitemoehybrid":
        return list(range(num_layers))  # Granite 4: every layer's MLP is the MoE
    # Decoders: dense until first_k_dense_replace (DeepSeek), then every step-th layer (Llama 4's
    # interleave_moe_layer_step, Qwen2-MoE's decoder_sparse_step), except Qwen's mlp_only_layers.
    first_dense = cfg.opt_int("first_k_dense_replace", minimum=0) or 0
    step = cfg.opt_int("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq") or 1
    mlp_only = set(cfg.int_list("mlp_only_layers", minimum=0))
    return [i for i in range(num_layers) if i >= first_dense and (i + 1) % step == 0 and i not in mlp_only]


def _mamba(cfg: ConfigReader, model_type: str, hidden: int) -> MambaGeometry:
    """Mamba dimensions under each family's key names (Nemotron-H mamba_num_heads / ssm_state_size /
    n_groups / conv_kernel; Granite 4 mamba_n_heads / mamba_d_state / mamba_n_groups / mamba_d_conv)."""
    chunk = cfg.opt_int("mamba_chunk_size") or cfg.opt_int("chunk_size") or 2048
    stated = cfg.opt_str("mamba_ssm_cache_dtype")
    ssm_dtype = None if stated in (None, "auto") else stated
    if model_type == "jamba":
        return MambaGeometry(
            version=1,
            inner_size=cfg.require_int("mamba_expand") * hidden,
            state_size=cfg.require_int("mamba_d_state"),
            conv_kernel=cfg.require_int("mamba_d_conv", minimum=2),
            chunk_size=chunk,
            ssm_cache_dtype=ssm_dtype,
        )
    n_heads = cfg.require_int("mamba_num_heads", "mamba_n_heads")
    head_dim = cfg.require_int("mamba_head_dim", "mamba_d_head")
    state = cfg.require_int("ssm_state_size", "mamba_d_state")
    n_groups = cfg.require_int("n_groups", "mamba_n_groups")
    kernel = cfg.require_int("conv_kernel", "mamba_d_conv", minimum=2)
    # Granite 4 sizes the mixer as mamba_expand * hidden; Nemotron-H as heads * head_dim.
    inner = cfg.require_int("mamba_expand") * hidden if model_type == "granitemoehybrid" else n_heads * head_dim
    return MambaGeometry(2, inner, state, kernel, num_heads=n_heads, head_dim=head_dim, n_groups=n_groups,
                         chunk_size=chunk, ssm_cache_dtype=ssm_dtype)


def _linear_attention(cfg: ConfigReader) -> LinearAttentionGeometry:
    return LinearAttentionGeometry(
        num_key_heads=cfg.require_int("linear_num_key_heads"),
        num_value_heads=cfg.require_int("linear_num_value_heads"),
        key_head_dim=cfg.require_int("linear_key_head_dim"),
        value_head_dim=cfg.require_int("linear_value_head_dim"),
        conv_kernel=cfg.require_int("linear_conv_kernel_dim", minimum=2),
    )
