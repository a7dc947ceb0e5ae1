"""Parameter count from a config, by component, in the groups weight-memory planning needs.

Counts follow the module shapes Transformers builds for each family (Linear weights and biases, norms,
embeddings, vision towers); each Linear is named as the checkpoint names it (`model.layers.3.self_attn.q_proj`)
so a quantization config's `ignore` / `modules_to_not_convert` patterns decide, module by module and layer by
layer, which weights are packed and which stay at the model dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from kvplan.model.config_reader import ConfigReader
from kvplan.model.geometry import Geometry, LinearAttentionGeometry, MambaGeometry, MlaGeometry
from kvplan.model.kinds import LayerKind
from kvplan.model.specs import ParamGroup, QuantSpec
from kvplan.units import FP32_BYTES, INT32_BYTES

# A predicate over a full module name: True when the checkpoint leaves that module unquantized.
Excluded = Callable[[str], bool]
# A MIXED_PRECISION checkpoint's format of a quantized module, by its full name.
Formats = Callable[[str], QuantSpec | None]
# A group's accumulator: (group name, quantized, its format in a MIXED_PRECISION checkpoint).
_Key = tuple[str, bool, QuantSpec | None]


def _never(_: str) -> bool:
    return False


class _Counter:
    """Accumulates parameters into named groups; linear() records each matrix for the quantizer.

    A Linear whose module name the quantization config excludes goes to `<group>_unquantized` (or keeps the
    group name when the whole group is excluded), with quantizable=False, so it is sized at the model dtype.
    With a MIXED_PRECISION checkpoint (`formats`), the quantized part of a group splits again by format when
    it holds more than one (`attention_modelopt-fp8`, `attention_nvfp4`).
    """

    def __init__(self, excluded: Excluded, prefix: str, formats: Formats | None = None) -> None:
        self.excluded = excluded
        self.formats = formats
        self.prefix = prefix  # "model" or "language_model.model": where the decoder's modules live
        self._params: dict[_Key, int] = {}
        self._tp: dict[_Key, str] = {}
        self._mats: dict[_Key, list[tuple[int, int, int]]] = {}
        self._elem: dict[_Key, int] = {}
        self._buffers: set[_Key] = set()

    def add(self, group: str, n: int, *, tp: str = "split", elem_bytes: int | None = None,
            buffer: bool = False) -> None:
        """`n` parameters that no weight-only quantizer packs (norms, biases, embeddings, routers);
        `elem_bytes` where the model keeps them in a dtype of their own (float32: 4); `buffer` for loaded
        buffers, which are not parameters."""
        key = (group, False, None)
        self._params[key] = self._params.get(key, 0) + n
        self._tp.setdefault(key, tp)
        if elem_bytes is not None:
            self._elem[key] = elem_bytes
        if buffer:
            self._buffers.add(key)

    def linear(
        self,
        group: str,
        module: str,
        in_f: int,
        out_f: int,
        *,
        layers: Sequence[int] | None = None,
        bias: bool = False,
        per_layer: int = 1,
        tp: str = "split",
    ) -> None:
        """Linear(in_f, out_f) at `module` ("{p}.layers.{i}.self_attn.q_proj"), once per layer in `layers`
        (once if None), `per_layer` copies each (MoE experts). Weights are quantizable unless excluded;
        biases stay at the model dtype."""
        names = [module.format(p=self.prefix, i=i) for i in (layers if layers is not None else [0])]
        if not names:
            return
        counts: dict[_Key, int] = {}
        for name in names:
            quantized = not self.excluded(name)
            key = (group, quantized, self.formats(name) if quantized and self.formats else None)
            counts[key] = counts.get(key, 0) + 1
        for key, count in counts.items():
            self._params[key] = self._params.get(key, 0) + count * per_layer * in_f * out_f
            self._tp.setdefault(key, tp)
            self._mats.setdefault(key, []).append((count * per_layer, out_f, in_f))
        if bias:
            self.add(group + "_bias", len(names) * per_layer * out_f)

    def groups(self) -> tuple[ParamGroup, ...]:
        out = []
        for key, n in self._params.items():
            name, quantized, fmt = key
            if not n:
                continue
            parts = [k for k, v in self._params.items() if k[0] == name and v]
            label = name
            if not quantized and any(k[1] and k in self._mats for k in parts):
                label = f"{name}_unquantized"
            elif quantized and sum(1 for k in parts if k[1]) > 1 and fmt is not None:
                label = f"{name}_{fmt.method}"
            out.append(
                ParamGroup(
                    name=label,
                    params=n,
                    quantizable=quantized,
                    tp=self._tp[key],
                    matrices=tuple(self._mats.get(key, ())),
                    fmt=fmt,
                    elem_bytes=self._elem.get(key),
                    buffer=key in self._buffers,
                )
            )
        return tuple(out)


def count_params(
    g: Geometry,
    cfg: ConfigReader,
    *,
    text_type: str,
    model_type: str,
    multimodal: bool = False,
    excluded: Excluded | None = None,
    formats: Formats | None = None,
    vision: ConfigReader | None = None,
) -> tuple[ParamGroup, ...]:
    """Parameters of the text model plus its vision tower (when the config has one), grouped by component.

    Sizes come from the geometry the cache specs were built from; `cfg` is read only for what changes the
    weights and not the cache (biases, norms, a family's extra modules). `multimodal` puts the decoder under
    `language_model.model` as the checkpoint names it.
    """
    prefix = "language_model.model" if multimodal and model_type not in _FLAT_MULTIMODAL else "model"
    c = _Counter(excluded or _never, prefix, formats)
    family = model_type if model_type in _SPECIAL else text_type
    if family in _SPECIAL:
        _SPECIAL[family](c, g, cfg)
    else:
        _decoder(c, g, cfg, text_type)
    if vision is not None:
        VISION_TOWERS[model_type](c, vision, g.hidden_size)
    return c.groups()


def count_mtp_params(
    g: Geometry,
    cfg: ConfigReader,
    *,
    text_type: str,
    model_type: str,
    excluded: Excluded | None = None,
    formats: Formats | None = None,
) -> tuple[int, tuple[ParamGroup, ...]]:
    """The MTP blocks and their own parameters ((0, ()) where the config has no such block or kvplan does not
    size it), each group named mtp_*; the embeddings and LM head are the model's (vLLM shares them, pp = 1).

    DeepSeek-V3 (vllm models/deepseek_mtp.py): per num_nextn_predict_layers, a decoder layer at index
    num_hidden_layers (MLA + MoE, quantized as the model is), enorm and hnorm, eh_proj (2H -> H, a plain
    unquantized nn.Linear on every rank) and shared_head's norm: 11,610,067,968 parameters. DeepSeek-V4
    (models/deepseek_v4/nvidia/mtp.py): a ratio-1 V4 layer with a learned router, enorm, hnorm, e_proj and
    h_proj (fp8, replicated), an hc_head mixer and shared_head's norm: 6,610,048,891 for Flash. Qwen3.5
    (qwen3_5_mtp.py): per mtp_num_hidden_layers, a full-attention decoder layer (gated q, q/k norms, the
    model's MLP or MoE), fc (2H -> H), and norm, pre_fc_norm_hidden, pre_fc_norm_embedding.
    """
    c = _Counter(excluded or _never, "mtp", formats)
    hidden = g.hidden_size
    if text_type in _QWEN3_5_TYPES:
        n = cfg.opt_int("mtp_num_hidden_layers", minimum=0) or 0
        full = g.layers_of(LayerKind.FULL_ATTENTION)
        if not n or not full:
            return 0, ()
        blocks = list(range(n))
        heads, head_dim, kv = g.num_attention_heads, g.head_dims[full[0]], g.kv_heads[full[0]]
        p = "{p}.layers.{i}.self_attn"
        c.linear("attention", p + ".q_proj", hidden, heads * head_dim * 2, layers=blocks)
        c.linear("attention", p + ".k_proj", hidden, kv * head_dim, layers=blocks)
        c.linear("attention", p + ".v_proj", hidden, kv * head_dim, layers=blocks)
        c.linear("attention", p + ".o_proj", heads * head_dim, hidden, layers=blocks)
        c.add("norms", n * (2 * head_dim + 2 * hidden) + 3 * hidden, tp="replicated")
        c.linear("fc", "{p}.fc", 2 * hidden, hidden)
        _mtp_mlp(c, g, cfg, "{p}.layers.{i}.mlp", blocks, shared=".shared_expert")
    elif model_type == "deepseek_v4" and g.compressed_mla is not None and g.moe is not None:
        n = cfg.opt_int("num_nextn_predict_layers", minimum=0) or 0
        if not n:
            return 0, ()
        c.prefix = "model"  # the block is the checkpoint's layer num_hidden_layers
        blocks = [g.num_layers + k for k in range(n)]
        # vLLM gives a layer past num_hidden_layers compress ratio 1 (attention.py: the list's extra entry is
        # never read) and a learned router (its index is past num_hash_layers).
        _dsv4_layers(c, g, blocks, (1,) * n, hashed=0)
        # enorm, hnorm and shared_head.norm; e_proj and h_proj (fp8, replicated); the block's hc_head mixer
        c.add("norms", n * 3 * hidden, tp="replicated")
        c.linear("eh_proj", "{p}.layers.{i}.e_proj", hidden, hidden, layers=blocks, tp="replicated")
        c.linear("eh_proj", "{p}.layers.{i}.h_proj", hidden, hidden, layers=blocks, tp="replicated")
        for _ in blocks:
            _dsv4_head_mixer(c, g.compressed_mla.hc_mult, hidden)
    elif model_type in ("deepseek_v3", "kimi_k2") and g.mla is not None:
        n = cfg.opt_int("num_nextn_predict_layers", minimum=0) or 0
        if not n:
            return 0, ()
        c.prefix = "model"  # the block is the checkpoint's layer num_hidden_layers
        blocks = [g.num_layers + k for k in range(n)]
        _mla_attention(c, g, g.mla, cfg.flag("attention_bias", False), blocks)
        # two layer norms, enorm and hnorm, shared_head.norm
        c.add("norms", n * 5 * hidden, tp="replicated")
        c.add("eh_proj", n * 2 * hidden * hidden, tp="replicated")
        _mtp_mlp(c, g, cfg, "{p}.layers.{i}.mlp", blocks, shared=".shared_experts")
    else:
        return 0, ()
    return n, tuple(replace(group, name="mtp_" + group.name) for group in c.groups())


def _mtp_mlp(c: _Counter, g: Geometry, cfg: ConfigReader, module: str, blocks: list[int], shared: str) -> None:
    """The MTP block's MLP: the routed experts, shared expert(s) and router of an MoE model, else the dense MLP."""
    hidden, moe = g.hidden_size, g.moe
    if moe is None:
        _gated_mlp(c, "mlp", module, hidden, max(_widths(g, cfg)), blocks, False)
        return
    _gated_mlp(c, "experts", module + ".experts", hidden, moe.expert_intermediate_size, blocks, False,
               per_layer=moe.num_experts)
    c.add("router", len(blocks) * hidden * moe.num_experts, tp="replicated")
    width = moe.shared_experts * moe.expert_intermediate_size or moe.shared_expert_intermediate_size or 0
    if width:
        _gated_mlp(c, "shared_experts", module + shared, hidden, width, blocks, False)
    if moe.shared_expert_intermediate_size and not moe.shared_experts:
        c.add("router", len(blocks) * hidden, tp="replicated")  # Qwen's shared_expert_gate


# Multimodal checkpoints whose text decoder sits at `model.layers` (Qwen2.5-VL keeps `visual.*` beside it).
_FLAT_MULTIMODAL = frozenset({"qwen2_5_vl", "qwen2_vl"})

_ATTENTION = (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL, LayerKind.SHARED_KV)
_QWEN3_5_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "gemma4_text", "qwen3_next", "olmo2", "gemma3n_text",
                  *_QWEN3_5_TYPES)


def _embeddings(c: _Counter, g: Geometry) -> None:
    c.add("embed_tokens", g.vocab_size * g.hidden_size, tp="vocab")
    if g.tie_word_embeddings:
        return
    # Weight-only quantizers leave the head at the model dtype; a MIXED_PRECISION checkpoint may list it
    # (nvidia/Qwen3.6-27B-NVFP4 stores lm_head as NVFP4), and vLLM's ParallelLMHead then loads it so.
    if c.formats is not None and c.formats("lm_head") is not None:
        c.linear("lm_head", "lm_head", g.hidden_size, g.vocab_size, tp="vocab")
    else:
        c.add("lm_head", g.vocab_size * g.hidden_size, tp="vocab")


def _widths(g: Geometry, cfg: ConfigReader) -> tuple[int, ...]:
    """Each layer's MLP width; a family that has an MLP needs the config to state it."""
    if not g.intermediate_sizes:
        raise cfg.error("intermediate_size", "is missing; kvplan needs the MLP width to count the weights")
    return g.intermediate_sizes


def _positions(g: Geometry, cfg: ConfigReader) -> int:
    """Rows of a learned position table (GPT-2, OPT)."""
    if g.max_position_embeddings is None:
        raise cfg.error("max_position_embeddings", "is missing; kvplan needs it to count the position embeddings")
    return g.max_position_embeddings


def _qkvo(
    c: _Counter, g: Geometry, layers: list[int], *, module: str = "{p}.layers.{i}.self_attn",
    kv_layers: list[int] | None = None, qkv_bias: bool = False, o_bias: bool = False, q_gate: bool = False,
) -> None:
    """Plain q/k/v/o projections over `layers`; k and v only on `kv_layers` (Gemma 3n's shared layers have
    none), grouped by each layer's head size and KV heads; no v_proj where V is K's projection (Gemma 4's
    global layers). `q_gate`: Qwen3-Next's q_proj also yields a per-head output gate, twice the width."""
    hidden, heads = g.hidden_size, g.num_attention_heads
    kv_layers = layers if kv_layers is None else kv_layers
    for (head_dim, v_dim), same in _grouped(layers, lambda i: (g.head_dims[i], g.v_dim(i))):
        c.linear("attention", module + ".q_proj", hidden, heads * head_dim * (2 if q_gate else 1), layers=same,
                 bias=qkv_bias)
        c.linear("attention", module + ".o_proj", heads * v_dim, hidden, layers=same, bias=o_bias)
    for (kv, head_dim, v_dim, v_from_k), same in _grouped(
        kv_layers, lambda i: (g.kv_heads[i], g.head_dims[i], g.v_dim(i), g.v_from_k[i])
    ):
        c.linear("attention", module + ".k_proj", hidden, kv * head_dim, layers=same, bias=qkv_bias)
        if not v_from_k:
            c.linear("attention", module + ".v_proj", hidden, kv * v_dim, layers=same, bias=qkv_bias)


def _grouped(layers: list[int], key: Callable[[int], tuple[int, ...]]) -> list[tuple[tuple[int, ...], list[int]]]:
    """`layers` grouped by key(layer), in the order of the keys: one projection entry per distinct shape."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i in layers:
        groups.setdefault(key(i), []).append(i)
    return sorted(groups.items())


def _decoder(c: _Counter, g: Geometry, cfg: ConfigReader, text_type: str) -> None:
    """Llama-style decoders (Llama, Mistral, Qwen2/3, Qwen3-Next, Gemma 1-3, Granite, Phi-3, Mixtral,
    DeepSeek, gpt-oss, Llama 4's text model, ...)."""
    _embeddings(c, g)
    attn_bias = cfg.flag("attention_bias", False)
    qkv_bias = attn_bias or text_type in ("qwen2", "qwen2_moe", "qwen2_5_vl", "qwen2_5_vl_text")

    if g.mla is not None:
        _mla_attention(c, g, g.mla, attn_bias, g.layers_of(LayerKind.MLA))
    else:
        attn = g.layers_of(*_ATTENTION)
        # Qwen3-Next and Qwen3.5 gate the attention output (Transformers always; vLLM unless the config sets
        # attn_output_gate to false).
        q_gate = text_type in ("qwen3_next", *_QWEN3_5_TYPES) and cfg.flag("attn_output_gate", True)
        _qkvo(c, g, attn, qkv_bias=qkv_bias, o_bias=attn_bias, q_gate=q_gate)
        if text_type in _QK_NORM_TYPES:
            # q_norm and k_norm over each layer's head (Gemma 4: 256 on sliding layers, 512 on global ones)
            c.add("norms", 2 * sum(g.head_dims[i] for i in attn), tp="replicated")
        if text_type == "gpt_oss":
            c.add("attention_sinks", len(attn) * g.num_attention_heads)
        if g.linear_attention is not None:
            _gated_deltanet(c, g.linear_attention, g.hidden_size, g.layers_of(LayerKind.LINEAR_ATTENTION),
                            split=text_type in _QWEN3_5_TYPES)

    # Norms: two per layer (four in Gemma 2-4: pre/post attention and feed-forward) + the final norm.
    per_layer_norms = 4 if text_type in ("gemma2", "gemma3_text", "gemma4_text") else 2
    c.add("norms", (g.num_layers * per_layer_norms + 1) * g.hidden_size, tp="replicated")
    _mlp_stack(c, g, cfg, cfg.flag("mlp_bias", False), text_type)


def _gated_deltanet(c: _Counter, la: LinearAttentionGeometry, hidden: int, linear: list[int], *, split: bool) -> None:
    """Gated DeltaNet layers: the qkvz and beta/alpha projections, a depthwise conv, out. Qwen3-Next fuses
    them (in_proj_qkvz, in_proj_ba); Qwen3.5 stores four (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), the
    same parameters under the names a quantization config lists."""
    k_heads, v_heads, k_dim, v_dim = la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim
    p = "{p}.layers.{i}.linear_attn"
    if split:
        c.linear("linear_attention", p + ".in_proj_qkv", hidden, 2 * k_heads * k_dim + v_heads * v_dim, layers=linear)
        c.linear("linear_attention", p + ".in_proj_z", hidden, v_heads * v_dim, layers=linear)
        c.linear("linear_attention", p + ".in_proj_b", hidden, v_heads, layers=linear)
        c.linear("linear_attention", p + ".in_proj_a", hidden, v_heads, layers=linear)
    else:
        c.linear("linear_attention", p + ".in_proj_qkvz", hidden, 2 * k_heads * k_dim + 2 * v_heads * v_dim,
                 layers=linear)
        c.linear("linear_attention", p + ".in_proj_ba", hidden, 2 * v_heads, layers=linear)
    c.linear("linear_attention", p + ".out_proj", v_heads * v_dim, hidden, layers=linear)
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    c.add("linear_attention_state_params", len(linear) * (conv_dim * la.conv_kernel + 2 * v_heads + v_dim), tp="split")


def _mla_attention(c: _Counter, g: Geometry, mla: MlaGeometry, bias: bool, layers: list[int]) -> None:
    """DeepSeek MLA projections: q (optionally low-rank), the joint KV down-projection, KV up-projection, o."""
    hidden, heads, rope = g.hidden_size, g.num_attention_heads, mla.qk_rope_head_dim
    q_width = heads * (mla.qk_nope_head_dim + rope)
    p = "{p}.layers.{i}.self_attn"
    if mla.q_lora_rank:
        c.linear("attention", p + ".q_a_proj", hidden, mla.q_lora_rank, layers=layers, bias=bias)
        c.add("norms", len(layers) * mla.q_lora_rank, tp="replicated")
        c.linear("attention", p + ".q_b_proj", mla.q_lora_rank, q_width, layers=layers)
    else:
        c.linear("attention", p + ".q_proj", hidden, q_width, layers=layers)
    c.linear("attention", p + ".kv_a_proj_with_mqa", hidden, mla.kv_lora_rank + rope, layers=layers, bias=bias)
    c.add("norms", len(layers) * mla.kv_lora_rank, tp="replicated")
    c.linear("attention", p + ".kv_b_proj", mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim),
             layers=layers)
    c.linear("attention", p + ".o_proj", heads * mla.v_head_dim, hidden, layers=layers, bias=bias)
    if mla.index_head_dim:
        # DeepSeek-V3.2's lightning indexer, replicated over TP (ReplicatedLinear): its q from the q latent and
        # its one key, fp8 like the rest; the head weights in bf16; the key's LayerNorm (weight and bias) in
        # float32, as the checkpoint lists them (wq_b [8,192, 1,536], wk [128, 7,168], weights_proj [64, 7,168]).
        c.linear("indexer", p + ".indexer.wq_b", mla.q_lora_rank or hidden, mla.index_n_heads * mla.index_head_dim,
                 layers=layers, tp="replicated")
        c.linear("indexer", p + ".indexer.wk", hidden, mla.index_head_dim, layers=layers, tp="replicated")
        c.add("indexer_unquantized", len(layers) * mla.index_n_heads * hidden, tp="replicated")
        c.add("norms_fp32", len(layers) * 2 * mla.index_head_dim, tp="replicated", elem_bytes=FP32_BYTES)


def _gated_mlp(c: _Counter, group: str, module: str, hidden: int, inter: int, layers: list[int], bias: bool,
               per_layer: int = 1) -> None:
    c.linear(group, module + ".gate_proj", hidden, inter, layers=layers, bias=bias, per_layer=per_layer)
    c.linear(group, module + ".up_proj", hidden, inter, layers=layers, bias=bias, per_layer=per_layer)
    c.linear(group, module + ".down_proj", inter, hidden, layers=layers, bias=bias, per_layer=per_layer)


def _dense_mlps(c: _Counter, module: str, hidden: int, widths: Sequence[int], layers: list[int], bias: bool) -> None:
    """Gated MLPs on `layers`, one group of Linear shapes per distinct width (Gemma 3n varies it by layer)."""
    for width in sorted({widths[i] for i in layers}):
        _gated_mlp(c, "mlp", module, hidden, width, [i for i in layers if widths[i] == width], bias)


def _mlp_stack(c: _Counter, g: Geometry, cfg: ConfigReader, bias: bool, text_type: str) -> None:
    """Dense gated MLPs and MoE layers (all experts resident), by which layers the geometry says are sparse."""
    ff = "{p}.layers.{i}.feed_forward" if text_type == "llama4_text" else "{p}.layers.{i}.mlp"
    if text_type in ("mixtral",):
        ff = "{p}.layers.{i}.block_sparse_moe"
    hidden, moe = g.hidden_size, g.moe
    sparse = list(moe.layers) if moe else []
    dense = [i for i in range(g.num_layers) if i not in set(sparse)]
    # Llama 4's dense layers have their own width (intermediate_size_mlp); intermediate_size is the experts'.
    # A model whose every layer is MoE (Qwen3.5-MoE) need not state a dense width at all.
    dense_width = cfg.opt_int("intermediate_size_mlp")
    if dense:
        _dense_mlps(c, ff, hidden, [dense_width] * g.num_layers if dense_width else _widths(g, cfg), dense, bias)
    if moe is None:
        return
    experts, expert_bias = moe.num_experts, text_type == "gpt_oss"
    _gated_mlp(c, "experts", ff + ".experts", hidden, moe.expert_intermediate_size, sparse, expert_bias,
               per_layer=experts)
    c.add("router", len(sparse) * (hidden * experts + (experts if expert_bias else 0)), tp="replicated")
    if text_type == "llama4_text":
        # Llama 4: every MoE layer also runs one shared expert of intermediate_size.
        _gated_mlp(c, "shared_experts", ff + ".shared_expert", hidden, max(_widths(g, cfg)), sparse, False)
    elif moe.shared_experts:
        _gated_mlp(c, "shared_experts", ff + ".shared_experts", hidden,
                   moe.shared_experts * moe.expert_intermediate_size, sparse, False)
    elif cfg.flag("enable_moe_block", False):
        # Gemma 4: each MoE layer keeps a dense MLP of intermediate_size beside its routed experts
        # (gemma-4-26B-A4B: 30 x 3 x 2,816 x 2,112 = 535,265,280 parameters); the expert branch has its own
        # pre-norm and both branches a post-norm (3 x hidden), and the router scales its input (hidden) and
        # each expert's output (num_experts).
        _dense_mlps(c, ff, hidden, _widths(g, cfg), sparse, bias)
        c.add("norms", len(sparse) * 3 * hidden, tp="replicated")
        c.add("router", len(sparse) * (hidden + experts), tp="replicated")
    elif moe.shared_expert_intermediate_size:
        _gated_mlp(c, "shared_experts", ff + ".shared_expert", hidden, moe.shared_expert_intermediate_size, sparse,
                   False)
        c.add("router", len(sparse) * hidden, tp="replicated")  # shared_expert_gate


def _nemotron_h(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Nemotron-H: each layer is one mixer (Mamba2, attention, relu^2 MLP or MoE) + one norm."""
    hidden = g.hidden_size
    _embeddings(c, g)
    c.add("norms", (g.num_layers + 1) * hidden, tp="replicated")
    p = "{p}.layers.{i}.mixer"
    if g.mamba is not None:
        _mamba2_mixer(c, g.mamba, hidden, g.layers_of(LayerKind.MAMBA), conv_bias=cfg.flag("use_conv_bias", True),
                      proj_bias=cfg.flag("use_bias", False), module=p)
    bias = cfg.flag("attention_bias", False)
    _qkvo(c, g, g.layers_of(LayerKind.FULL_ATTENTION), module=p, qkv_bias=bias, o_bias=bias)
    moe = g.moe
    sparse = list(moe.layers) if moe else []
    mlp = [i for i in g.layers_of(LayerKind.NO_CACHE) if i not in set(sparse)]
    mlp_bias = cfg.flag("mlp_bias", False)
    if mlp:  # relu^2: up and down only
        inter = max(_widths(g, cfg))
        c.linear("mlp", p + ".up_proj", hidden, inter, layers=mlp, bias=mlp_bias)
        c.linear("mlp", p + ".down_proj", inter, hidden, layers=mlp, bias=mlp_bias)
    if moe is None:
        return
    width = moe.expert_intermediate_size
    c.linear("experts", p + ".experts.up_proj", hidden, width, layers=sparse, per_layer=moe.num_experts)
    c.linear("experts", p + ".experts.down_proj", width, hidden, layers=sparse, per_layer=moe.num_experts)
    c.add("router", len(sparse) * moe.num_experts * hidden, tp="replicated")
    shared = moe.shared_expert_intermediate_size
    if shared and moe.shared_experts:
        c.linear("shared_experts", p + ".shared_experts.up_proj", hidden, shared, layers=sparse)
        c.linear("shared_experts", p + ".shared_experts.down_proj", shared, hidden, layers=sparse)


def _mamba2_mixer(c: _Counter, m: MambaGeometry, hidden: int, layers: list[int], *, conv_bias: bool,
                  proj_bias: bool, module: str) -> None:
    """A Mamba2 mixer: in_proj to (z, x, B, C, dt), depthwise conv over (x, B, C), dt_bias, A_log, D, a gated
    norm over the inner width, out_proj. Nemotron-3-Nano: inner 64*64 = 4096, in_proj width 2*4096 + 2*8*128 + 64."""
    inner, groups, state, n_heads = m.inner_size, m.n_groups, m.state_size, m.num_heads
    conv_dim = inner + 2 * groups * state
    c.linear("mamba", module + ".in_proj", hidden, 2 * inner + 2 * groups * state + n_heads, layers=layers,
             bias=proj_bias)
    c.linear("mamba", module + ".out_proj", inner, hidden, layers=layers, bias=proj_bias)
    c.add("mamba_state_params",
          len(layers) * (conv_dim * m.conv_kernel + (conv_dim if conv_bias else 0) + 3 * n_heads + inner))


def _jamba(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Jamba: Mamba (v1) or attention per layer, dense MLP or MoE per layer, two norms each."""
    hidden = g.hidden_size
    _embeddings(c, g)
    c.add("norms", (2 * g.num_layers + 1) * hidden, tp="replicated")
    _qkvo(c, g, g.layers_of(LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW))
    mamba = g.layers_of(LayerKind.MAMBA)
    if g.mamba is not None:
        m = g.mamba
        inner, d_state = m.inner_size, m.state_size
        dt_rank = _jamba_dt_rank(cfg, hidden)
        proj_bias = cfg.flag("mamba_proj_bias", False)
        p = "{p}.layers.{i}.mamba"
        c.linear("mamba", p + ".in_proj", hidden, 2 * inner, layers=mamba, bias=proj_bias)
        c.linear("mamba", p + ".x_proj", inner, dt_rank + 2 * d_state, layers=mamba)
        c.linear("mamba", p + ".dt_proj", dt_rank, inner, layers=mamba, bias=True)
        c.linear("mamba", p + ".out_proj", inner, hidden, layers=mamba, bias=proj_bias)
        conv_bias = inner if cfg.flag("mamba_conv_bias", True) else 0
        # conv1d (the full kernel), A_log (inner, d_state), D, and the dt / B / C layernorms Jamba adds.
        per_layer = inner * m.conv_kernel + conv_bias + inner * d_state + inner + dt_rank + 2 * d_state
        c.add("mamba_state_params", len(mamba) * per_layer)
    moe = g.moe
    sparse = list(moe.layers) if moe else []
    dense = [i for i in range(g.num_layers) if i not in set(sparse)]
    f = "{p}.layers.{i}.feed_forward"
    _dense_mlps(c, f, hidden, _widths(g, cfg), dense, False)
    if moe is not None:
        _gated_mlp(c, "experts", f + ".experts", hidden, moe.expert_intermediate_size, sparse, False,
                   per_layer=moe.num_experts)
        c.add("router", len(sparse) * moe.num_experts * hidden, tp="replicated")


def _jamba_dt_rank(cfg: ConfigReader, hidden: int) -> int:
    """mamba_dt_rank, or "auto" = ceil(hidden / 16) (Jamba's class documents that rule)."""
    _, value = cfg.raw_value("mamba_dt_rank")
    if value == "auto" or value is None:
        return -(-hidden // 16)
    return cfg.require_int("mamba_dt_rank")


def _granitemoehybrid(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Granite 4 (granitemoehybrid): Mamba2 or attention per layer, then MoE (optional) + a shared MLP."""
    hidden = g.hidden_size
    _embeddings(c, g)
    c.add("norms", (2 * g.num_layers + 1) * hidden, tp="replicated")
    bias = cfg.flag("attention_bias", False)
    _qkvo(c, g, g.layers_of(LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW), qkv_bias=bias, o_bias=bias)
    if g.mamba is not None:
        _mamba2_mixer(c, g.mamba, hidden, g.layers_of(LayerKind.MAMBA), conv_bias=cfg.flag("mamba_conv_bias", True),
                      proj_bias=cfg.flag("mamba_proj_bias", False), module="{p}.layers.{i}.mamba")
    every = list(range(g.num_layers))
    if g.moe is not None:
        experts, inter = g.moe.num_experts, g.moe.expert_intermediate_size
        m = "{p}.layers.{i}.block_sparse_moe"
        c.linear("experts", m + ".input_linear", hidden, 2 * inter, layers=list(g.moe.layers), per_layer=experts)
        c.linear("experts", m + ".output_linear", inter, hidden, layers=list(g.moe.layers), per_layer=experts)
        c.add("router", len(g.moe.layers) * experts * hidden, tp="replicated")
    shared = cfg.opt_int("shared_intermediate_size", minimum=0) or 0
    if shared:
        s = "{p}.layers.{i}.shared_mlp"
        c.linear("mlp", s + ".input_linear", hidden, 2 * shared, layers=every)
        c.linear("mlp", s + ".output_linear", shared, hidden, layers=every)


def _gemma3n(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Gemma 3n's text model: per-layer MLP widths, AltUp, LAuReL, per-layer input embeddings; layers that
    reuse an earlier layer's KV (num_kv_shared_layers) have no k_proj / v_proj / k_norm."""
    hidden, layers = g.hidden_size, g.num_layers
    _embeddings(c, g)
    every = list(range(layers))
    own_kv = [i for i, kind in enumerate(g.layer_kinds) if kind != LayerKind.SHARED_KV]
    _qkvo(c, g, every, kv_layers=own_kv)
    c.add("norms", (layers + len(own_kv)) * g.head_dim, tp="replicated")  # q_norm everywhere, k_norm on own KV
    _dense_mlps(c, "{p}.layers.{i}.mlp", hidden, _widths(g, cfg), every, False)
    n_alt = cfg.require_int("altup_num_inputs")
    rank = cfg.require_int("laurel_rank")
    per_in = cfg.require_int("hidden_size_per_layer_input")
    vocab_pl = cfg.require_int("vocab_size_per_layer_input")
    # Per layer: 4 norms + AltUp (output scale, router norm, router, coefficient tables) + LAuReL norm
    # + per-layer-input norm, beside the Linear maps below.
    per_layer = 4 * hidden + hidden + hidden + n_alt * hidden + n_alt * n_alt + n_alt * n_alt * n_alt + hidden + hidden
    c.add("norms", layers * per_layer + hidden + per_in, tp="replicated")
    c.linear("laurel", "{p}.layers.{i}.laurel.linear_left", hidden, rank, layers=every)
    c.linear("laurel", "{p}.layers.{i}.laurel.linear_right", rank, hidden, layers=every)
    c.linear("per_layer_inputs", "{p}.layers.{i}.per_layer_input_gate", hidden, per_in, layers=every)
    c.linear("per_layer_inputs", "{p}.layers.{i}.per_layer_projection", per_in, hidden, layers=every)
    c.add("embed_tokens_per_layer", vocab_pl * layers * per_in, tp="vocab")
    c.linear("per_layer_inputs", "{p}.per_layer_model_projection", hidden, layers * per_in)
    c.linear("altup", "{p}.altup_projections", hidden, hidden, layers=list(range(n_alt - 1)))
    c.linear("altup", "{p}.altup_unembed_projections", hidden, hidden, layers=list(range(n_alt - 1)))


def _gpt2(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """GPT-2 and GPT-BigCode: learned positions, biased projections, one fused c_attn. Its width is q plus K
    and V: 3 x hidden for GPT-2 (every head keeps K and V), hidden + 2 x head_dim under BigCode's multi_query
    (gpt2-xl: 3 x 1,600 = 4,800 wide)."""
    h, layers = g.hidden_size, list(range(g.num_layers))
    inner = g.intermediate_size or 4 * h  # n_inner: null means 4 * n_embd
    kv = 2 * g.kv_heads[0] * g.head_dim
    c.add("embed_tokens", g.vocab_size * h, tp="vocab")
    c.add("embed_positions", _positions(g, cfg) * h, tp="replicated")
    c.linear("attention", "transformer.h.{i}.attn.c_attn", h, h + kv, layers=layers, bias=True)
    c.linear("attention", "transformer.h.{i}.attn.c_proj", h, h, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_fc", h, inner, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_proj", inner, h, layers=layers, bias=True)
    c.add("norms", (2 * len(layers) + 1) * 2 * h, tp="replicated")
    if not g.tie_word_embeddings:
        c.add("lm_head", g.vocab_size * h, tp="vocab")


def _opt(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """OPT: learned positions with an offset of 2, biased projections, optional embedding projections."""
    h, layers, vocab = g.hidden_size, list(range(g.num_layers)), g.vocab_size
    ffn = max(_widths(g, cfg))
    proj = cfg.opt_int("word_embed_proj_dim") or h
    c.add("embed_tokens", vocab * proj, tp="vocab")
    c.add("embed_positions", (_positions(g, cfg) + 2) * h, tp="replicated")
    if proj != h:
        c.linear("embed_proj", "model.decoder.project_in", proj, h)
        c.linear("embed_proj", "model.decoder.project_out", h, proj)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        c.linear("attention", "model.decoder.layers.{i}.self_attn." + name, h, h, layers=layers, bias=True)
    c.linear("mlp", "model.decoder.layers.{i}.fc1", h, ffn, layers=layers, bias=True)
    c.linear("mlp", "model.decoder.layers.{i}.fc2", ffn, h, layers=layers, bias=True)
    final_norm = cfg.flag("do_layer_norm_before", True) and not cfg.flag("_remove_final_layer_norm", False)
    c.add("norms", (2 * len(layers) + (1 if final_norm else 0)) * 2 * h, tp="replicated")
    if not g.tie_word_embeddings:
        c.add("lm_head", vocab * proj, tp="vocab")


def _falcon(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Falcon: fused query_key_value (MQA or grouped), 4x MLP, one or two LayerNorms per layer."""
    h, layers, hd = g.hidden_size, list(range(g.num_layers)), g.head_dim
    heads, kv = g.num_attention_heads, g.kv_heads[0]
    bias = cfg.flag("bias", False)
    # The new decoder architecture (40B/180B) has two LayerNorms per layer; the old one shares one between the
    # parallel attention and MLP branches.
    ln_per_layer = 2 if cfg.flag("new_decoder_architecture", False) or not cfg.flag("parallel_attn", True) else 1
    ffn = cfg.opt_int("ffn_hidden_size") or 4 * h
    c.add("embed_tokens", g.vocab_size * h, tp="vocab")
    t = "transformer.h.{i}"
    c.linear("attention", t + ".self_attention.query_key_value", h, (heads + 2 * kv) * hd, layers=layers, bias=bias)
    c.linear("attention", t + ".self_attention.dense", h, h, layers=layers, bias=bias)
    c.linear("mlp", t + ".mlp.dense_h_to_4h", h, ffn, layers=layers, bias=bias)
    c.linear("mlp", t + ".mlp.dense_4h_to_h", ffn, h, layers=layers, bias=bias)
    c.add("norms", (ln_per_layer * len(layers) + 1) * 2 * h, tp="replicated")
    if not g.tie_word_embeddings:
        c.add("lm_head", g.vocab_size * h, tp="vocab")


def _phi(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """Phi-1/2: biased q/k/v/dense, plain (ungated) MLP with biases, one LayerNorm per layer, biased lm_head."""
    h, layers, vocab = g.hidden_size, list(range(g.num_layers)), g.vocab_size
    inter = max(_widths(g, cfg))
    c.add("embed_tokens", vocab * h, tp="vocab")
    p = "model.layers.{i}.self_attn"
    c.linear("attention", p + ".q_proj", h, g.num_attention_heads * g.head_dim, layers=layers, bias=True)
    for kv in sorted(set(g.kv_heads)):
        same = [i for i in layers if g.kv_heads[i] == kv]
        c.linear("attention", p + ".k_proj", h, kv * g.head_dim, layers=same, bias=True)
        c.linear("attention", p + ".v_proj", h, kv * g.head_dim, layers=same, bias=True)
    c.linear("attention", p + ".dense", g.num_attention_heads * g.head_dim, h, layers=layers, bias=True)
    c.linear("mlp", "model.layers.{i}.mlp.fc1", h, inter, layers=layers, bias=True)
    c.linear("mlp", "model.layers.{i}.mlp.fc2", inter, h, layers=layers, bias=True)
    c.add("norms", (len(layers) + 1) * 2 * h, tp="replicated")
    # The head's bias is its own even when its weight is tied to the embeddings.
    c.add("lm_head", (0 if g.tie_word_embeddings else vocab * h) + vocab, tp="vocab")


# DeepSeek-V4's routed experts are MXFP4 (expert_dtype "fp4"): two e2m1 values a byte and one ue8m0 scale per
# 32, which vLLM keeps as loaded (Mxfp4MoEMethod; Marlin and Humming repack without padding these widths).
_DSV4_EXPERTS = QuantSpec("mxfp4", 4, group_size=32, scale_bytes=1, note="DeepSeek-V4 routed experts (fp4)")


def _deepseek_v4(c: _Counter, g: Geometry, cfg: ConfigReader) -> None:
    """DeepSeek-V4 as vLLM builds it (models/deepseek_v4, read in the 0.20-0.33 sdists): its decoder layers
    (_dsv4_layers), the head's hyper-connection mixer, the final norm and the embeddings. DeepSeek-V4-Flash:
    284,332,230,231 parameters without its MTP block, as Transformers 5.24 builds it; the hash table and the
    router bias are buffers beside them."""
    d = g.compressed_mla
    if d is None or g.moe is None:
        raise cfg.error("compress_ratios", "DeepSeek-V4 needs compress_ratios and n_routed_experts")
    _dsv4_layers(c, g, list(range(g.num_layers)), d.compress_ratios, hashed=min(d.num_hash_layers, g.num_layers))
    _dsv4_head_mixer(c, d.hc_mult, g.hidden_size)
    c.add("norms", g.hidden_size, tp="replicated")
    _embeddings(c, g)


def _dsv4_layers(c: _Counter, g: Geometry, layers: list[int], ratios: tuple[int, ...], *, hashed: int) -> None:
    """DeepSeek-V4 decoder layers, `ratios` giving each one's compress ratio. Per layer: a fused q/kv
    down-projection (replicated, fp8), q up-projection and a grouped output projection (wo_a over o_groups,
    wo_b), split over TP; a compressor for ratio > 1 (an overlapping pair for ratio 4) and an indexer for ratio
    4, replicated and kept in bf16 but the indexer's fp8 q projection; hyper-connection mixers in float32; a
    router (a hash table instead of its bias on the first `hashed` layers), one shared expert in fp8 and MXFP4
    routed experts."""
    d, moe = g.compressed_mla, g.moe
    assert d is not None and moe is not None  # _deepseek_v4 and count_mtp_params check both
    hidden, heads, vocab = g.hidden_size, g.num_attention_heads, g.vocab_size
    p = "{p}.layers.{i}"
    c.linear("latent_projection", p + ".attn.fused_wqa_wkv", hidden, d.q_lora_rank + d.head_dim, layers=layers,
             tp="replicated")
    c.add("norms", len(layers) * (d.q_lora_rank + d.head_dim + 2 * hidden), tp="replicated")
    c.linear("attention", p + ".attn.wq_b", d.q_lora_rank, heads * d.head_dim, layers=layers)
    c.linear("attention", p + ".attn.wo_a", heads * d.head_dim // d.o_groups, d.o_groups * d.o_lora_rank,
             layers=layers)
    c.linear("attention", p + ".attn.wo_b", d.o_groups * d.o_lora_rank, hidden, layers=layers)
    c.add("attention_fp32", len(layers) * heads, elem_bytes=FP32_BYTES)  # attn_sink, one per head
    for i, ratio in zip(layers, ratios, strict=True):
        if ratio > 1:
            _dsv4_compressor(c, hidden, ratio, d.head_dim)
        if ratio == 4:
            c.linear("indexer", p + ".attn.indexer.wq_b", d.q_lora_rank, d.index_n_heads * d.index_head_dim,
                     layers=[i], tp="replicated")
            c.add("compressors", d.index_n_heads * hidden, tp="replicated")  # weights_proj, bf16
            _dsv4_compressor(c, hidden, ratio, d.index_head_dim)
    # Hyper-connections: per mixer (attention, FFN) fn [(2 + m) m, m H], base [(2 + m) m], scale [3]. Flash
    # (m = 4, H = 4,096): 2 x 24 x 16,384 floats a layer.
    m = d.hc_mult
    mix = (2 + m) * m
    c.add("hyper_connections", len(layers) * 2 * (mix * m * hidden + mix + 3), tp="replicated",
          elem_bytes=FP32_BYTES)
    c.add("router", len(layers) * moe.num_experts * hidden, tp="replicated")
    c.add("router_fp32", (len(layers) - hashed) * moe.num_experts, tp="replicated", elem_bytes=FP32_BYTES,
          buffer=True)  # e_score_correction_bias
    if hashed:
        c.add("hash_routing", hashed * vocab * (moe.experts_per_token or 1), tp="replicated",
              elem_bytes=INT32_BYTES, buffer=True)  # tid2eid
    shared = moe.expert_intermediate_size * max(1, moe.shared_experts)
    c.linear("mlp", p + ".ffn.shared_experts.gate_up_proj", hidden, 2 * shared, layers=layers)
    c.linear("mlp", p + ".ffn.shared_experts.down_proj", shared, hidden, layers=layers)
    formats, c.formats = c.formats, (lambda name: _DSV4_EXPERTS if ".experts." in name else None)
    width = moe.expert_intermediate_size
    c.linear("experts", p + ".ffn.experts.w13", hidden, 2 * width, layers=layers, per_layer=moe.num_experts)
    c.linear("experts", p + ".ffn.experts.w2", width, hidden, layers=layers, per_layer=moe.num_experts)
    c.formats = formats


def _dsv4_head_mixer(c: _Counter, m: int, hidden: int) -> None:
    """The hyper-connection mixer that folds the m residual streams into one before a head: fn [m, m H], base
    [m], scale [1], in float32 (the model's hc_head; an MTP block's hc_head_fn / base / scale)."""
    c.add("hyper_connections", m * m * hidden + m + 1, tp="replicated", elem_bytes=FP32_BYTES)


def _dsv4_compressor(c: _Counter, hidden: int, ratio: int, width: int) -> None:
    """One compressor of `width`-wide entries: ape [r, coff x width] in float32, the fused kv/gate
    projection [2 coff width, H] and a norm in bf16; coff = 2 for the overlapping ratio-4 kind."""
    coff = 2 if ratio == 4 else 1
    c.add("compressors_fp32", ratio * coff * width, tp="replicated", elem_bytes=FP32_BYTES)
    c.add("compressors", 2 * coff * width * hidden + width, tp="replicated")


_SPECIAL: dict[str, Callable[[_Counter, Geometry, ConfigReader], None]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt2,
    "opt": _opt,
    "falcon": _falcon,
    "RefinedWebModel": _falcon,
    "RefinedWeb": _falcon,
    "phi": _phi,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "granitemoehybrid": _granitemoehybrid,
    "gemma3n_text": _gemma3n,
    "deepseek_v4": _deepseek_v4,
}


# ---- vision towers (their weights are loaded and count toward weight memory) ----------------------------


def _siglip(c: _Counter, v: ConfigReader, text_hidden: int) -> None:
    """Gemma 3's SigLIP encoder (no pooling head) and its projector into the text width.

    Gemma-3-4b: 27 layers of width 1152; patch embedding 3*14*14*1152 + 1152; 4096 positions (896/14)^2.
    """
    h, inter = v.require_int("hidden_size"), v.require_int("intermediate_size")
    layers = v.require_int("num_hidden_layers")
    patch, image, chans = v.require_int("patch_size"), v.require_int("image_size"), v.require_int("num_channels")
    every = list(range(layers))
    e = "vision_tower.vision_model.encoder.layers.{i}"
    c.add("vision", chans * patch * patch * h + h + (image // patch) ** 2 * h)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        c.linear("vision", e + ".self_attn." + name, h, h, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc1", h, inter, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc2", inter, h, layers=every, bias=True)
    c.add("vision", layers * 4 * h + 2 * h)  # two LayerNorms (weight + bias) per layer, post_layernorm
    if v.flag("vision_use_head", True):
        raise v.error("vision_use_head", "a SigLIP pooling head is not sized by kvplan")
    # Projector: a soft-embedding RMSNorm over the vision width and a (vision, text) matrix.
    c.add("vision", h)
    c.linear("vision", "multi_modal_projector.mm_input_projection", h, text_hidden)


def _llama4_vision(c: _Counter, v: ConfigReader, text_hidden: int) -> None:
    """Llama 4's vision encoder (34 layers, width 1408), pixel-shuffle adapter MLP and projector."""
    h, inter = v.require_int("hidden_size"), v.require_int("intermediate_size")
    layers = v.require_int("num_hidden_layers")
    patch, image, chans = v.require_int("patch_size"), v.require_int("image_size"), v.require_int("num_channels")
    every = list(range(layers))
    e = "vision_model.model.layers.{i}"
    c.linear("vision", "vision_model.patch_embedding.linear", chans * patch * patch, h)
    c.add("vision", h + ((image // patch) ** 2 + 1) * h + 4 * h)  # class token, positions, pre/post LayerNorms
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        c.linear("vision", e + ".self_attn." + name, h, h, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc1", h, inter, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc2", inter, h, layers=every, bias=True)
    c.add("vision", layers * 4 * h)
    ratio = v.raw_value("pixel_shuffle_ratio")[1]
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        raise v.error("pixel_shuffle_ratio", f"must be a number in (0, 1], got {ratio!r}")
    shuffled = int(h / (ratio * ratio))
    c.linear("vision", "vision_model.vision_adapter.mlp.fc1", shuffled, v.require_int("projector_input_dim"))
    c.linear("vision", "vision_model.vision_adapter.mlp.fc2", v.require_int("projector_input_dim"),
             v.require_int("projector_output_dim"))
    c.linear("vision", "multi_modal_projector.linear_1", v.require_int("vision_output_dim"), text_hidden)


def _qwen2_5_vl_vision(c: _Counter, v: ConfigReader, text_hidden: int) -> None:
    """Qwen2.5-VL's ViT: Conv3d patch embedding, fused qkv, gated MLP with biases, RMSNorms, a patch merger."""
    h, inter, depth = v.require_int("hidden_size"), v.require_int("intermediate_size"), v.require_int("depth")
    patch, temporal = v.require_int("patch_size"), v.require_int("temporal_patch_size")
    chans = v.require_int("in_chans", "in_channels")
    merge, out = v.require_int("spatial_merge_size"), v.require_int("out_hidden_size")
    every = list(range(depth))
    b = "visual.blocks.{i}"
    c.add("vision", chans * temporal * patch * patch * h + depth * 2 * h + h)  # patch embed, norms, ln_q
    c.linear("vision", b + ".attn.qkv", h, 3 * h, layers=every, bias=True)
    c.linear("vision", b + ".attn.proj", h, h, layers=every, bias=True)
    for name in ("gate_proj", "up_proj"):
        c.linear("vision", b + ".mlp." + name, h, inter, layers=every, bias=True)
    c.linear("vision", b + ".mlp.down_proj", inter, h, layers=every, bias=True)
    merged = h * merge * merge
    c.linear("vision", "visual.merger.mlp.0", merged, merged, bias=True)
    c.linear("vision", "visual.merger.mlp.2", merged, out, bias=True)


def _qwen3_5_vision(c: _Counter, v: ConfigReader, text_hidden: int) -> None:
    """Qwen3.5's ViT: Conv3d patch embedding and a learned position table, LayerNorms with biases, fused qkv,
    a plain GELU MLP (linear_fc1/fc2) and one patch merger. Unlike Qwen3-VL it builds no deepstack mergers,
    whatever deepstack_visual_indexes says. Qwen3.6-27B's tower: 460,730,096 parameters."""
    h, inter, depth = v.require_int("hidden_size"), v.require_int("intermediate_size"), v.require_int("depth")
    patch, temporal = v.require_int("patch_size"), v.require_int("temporal_patch_size")
    chans, positions = v.require_int("in_channels", "in_chans"), v.require_int("num_position_embeddings")
    merge, out = v.require_int("spatial_merge_size"), v.require_int("out_hidden_size")
    every = list(range(depth))
    b = "visual.blocks.{i}"
    # patch embedding (weight + bias), position table, two LayerNorms per block, the merger's LayerNorm
    c.add("vision", chans * temporal * patch * patch * h + h + positions * h + depth * 4 * h + 2 * h)
    c.linear("vision", b + ".attn.qkv", h, 3 * h, layers=every, bias=True)
    c.linear("vision", b + ".attn.proj", h, h, layers=every, bias=True)
    c.linear("vision", b + ".mlp.linear_fc1", h, inter, layers=every, bias=True)
    c.linear("vision", b + ".mlp.linear_fc2", inter, h, layers=every, bias=True)
    merged = h * merge * merge
    c.linear("vision", "visual.merger.linear_fc1", merged, merged, bias=True)
    c.linear("vision", "visual.merger.linear_fc2", merged, out, bias=True)


def _gemma4_vision(c: _Counter, v: ConfigReader, text_hidden: int) -> None:
    """Gemma 4's vision encoder and its projector into the text width; no biases anywhere.

    gemma-4-26B-A4B: a patch projection 3 x 16 x 16 -> 1,152 and a learned position table of 2 axes x 10,240
    positions x 1,152; 27 layers of 16 heads of 72 with a gated MLP of 4,304, four RMSNorms, and q and k
    norms over the head (v's has no scale); 572,792,112 parameters in all.
    """
    h, inter = v.require_int("hidden_size"), v.require_int("intermediate_size")
    layers, heads = v.require_int("num_hidden_layers"), v.require_int("num_attention_heads")
    head_dim = v.opt_int("head_dim") or h // heads
    kv = v.opt_int("num_key_value_heads") or heads
    patch, positions = v.require_int("patch_size"), v.require_int("position_embedding_size")
    every = list(range(layers))
    e = "vision_tower.encoder.layers.{i}"
    c.linear("vision", "vision_tower.patch_embedder.input_proj", 3 * patch * patch, h)
    c.add("vision", 2 * positions * h)
    c.linear("vision", e + ".self_attn.q_proj", h, heads * head_dim, layers=every)
    c.linear("vision", e + ".self_attn.k_proj", h, kv * head_dim, layers=every)
    c.linear("vision", e + ".self_attn.v_proj", h, kv * head_dim, layers=every)
    c.linear("vision", e + ".self_attn.o_proj", heads * head_dim, h, layers=every)
    _gated_mlp(c, "vision", e + ".mlp", h, inter, every, False)
    c.add("vision", layers * (4 * h + 2 * head_dim))
    c.linear("vision", "embed_vision.embedding_projection", h, text_hidden)


# Vision towers kvplan sizes, by the multimodal config's model_type; the parser notes any other tower as unsized.
VISION_TOWERS: dict[str, Callable[[_Counter, ConfigReader, int], None]] = {
    "gemma3": _siglip,
    "gemma4": _gemma4_vision,
    "llama4": _llama4_vision,
    "qwen2_5_vl": _qwen2_5_vl_vision,
    "qwen3_5": _qwen3_5_vision,
    "qwen3_5_moe": _qwen3_5_vision,
}
