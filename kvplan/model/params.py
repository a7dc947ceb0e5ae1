"""Parameter count from a config, by component, in the groups weight-memory planning needs.

Counts follow the module shapes Transformers builds for each family (Linear weights and biases, norms,
embeddings, vision towers); each Linear is named as the checkpoint names it (`model.layers.3.self_attn.q_proj`)
so a quantization config's `ignore` / `modules_to_not_convert` patterns decide, module by module and layer by
layer, which weights are packed and which stay at the model dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvplan.errors import ConfigError
from kvplan.model.specs import ParamGroup

if TYPE_CHECKING:  # the reader class lives in parse.py; imported only for type names
    from kvplan.model.parse import _Cfg

# A predicate over a full module name: True when the checkpoint leaves that module unquantized.
Excluded = Callable[[str], bool]


def _never(_: str) -> bool:
    return False


class _Counter:
    """Accumulates parameters into named groups; linear() records each matrix for the quantizer.

    A Linear whose module name the quantization config excludes goes to `<group>_unquantized` (or keeps the
    group name when the whole group is excluded), with quantizable=False, so it is sized at the model dtype.
    """

    def __init__(self, excluded: Excluded, prefix: str) -> None:
        self.excluded = excluded
        self.prefix = prefix  # "model" or "language_model.model": where the decoder's modules live
        self._params: dict[tuple[str, bool], int] = {}
        self._tp: dict[tuple[str, bool], str] = {}
        self._mats: dict[tuple[str, bool], list[tuple[int, int, int]]] = {}

    def add(self, group: str, n: int, *, tp: str = "split") -> None:
        """`n` parameters that no weight-only quantizer packs (norms, biases, embeddings, routers)."""
        key = (group, False)
        self._params[key] = self._params.get(key, 0) + n
        self._tp.setdefault(key, tp)

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
    ) -> None:
        """Linear(in_f, out_f) at `module` ("{p}.layers.{i}.self_attn.q_proj"), once per layer in `layers`
        (once if None), `per_layer` copies each (MoE experts). Weights are quantizable unless excluded;
        biases stay at the model dtype."""
        names = [module.format(p=self.prefix, i=i) for i in (layers if layers is not None else [0])]
        if not names:
            return
        kept = sum(1 for n in names if not self.excluded(n))
        for quantized, count in ((True, kept), (False, len(names) - kept)):
            if not count:
                continue
            key = (group, quantized)
            self._params[key] = self._params.get(key, 0) + count * per_layer * in_f * out_f
            self._tp.setdefault(key, "split")
            self._mats.setdefault(key, []).append((count * per_layer, out_f, in_f))
        if bias:
            self.add(group + "_bias", len(names) * per_layer * out_f)

    def groups(self) -> tuple[ParamGroup, ...]:
        out = []
        for (name, quantized), n in self._params.items():
            if not n:
                continue
            mixed = (name, not quantized) in self._params and self._params[(name, not quantized)]
            label = f"{name}_unquantized" if (mixed and not quantized and (name, True) in self._mats) else name
            out.append(
                ParamGroup(
                    name=label,
                    params=n,
                    quantizable=quantized,
                    tp=self._tp[(name, quantized)],
                    matrices=tuple(self._mats.get((name, quantized), ())) if quantized else (),
                )
            )
        return tuple(out)


def count_params(
    raw: dict,
    *,
    cfg_reader: _Cfg,
    text_type: str,
    model_type: str,
    kinds: Sequence[str],
    excluded: Excluded | None = None,
    vision: _Cfg | None = None,
) -> tuple[ParamGroup, ...]:
    """Parameters of the text model plus its vision tower (when the config has one), grouped by component.

    `kinds` is the parser's per-layer kind list ('full', 'sliding', 'chunked', 'mla', 'linear', 'mamba',
    'none', 'shared'), which decides each layer's mixer.
    """
    multimodal = vision is not None or (model_type != text_type and "text_config" in raw)
    prefix = "language_model.model" if multimodal and model_type not in _FLAT_MULTIMODAL else "model"
    c = _Counter(excluded or _never, prefix)
    cfg = cfg_reader
    family = model_type if model_type in _SPECIAL else text_type
    if family in _SPECIAL:
        _SPECIAL[family](c, cfg, kinds)
    else:
        _decoder(c, cfg, text_type, kinds)
    if vision is not None:
        VISION_TOWERS[model_type](c, vision, cfg)
    return c.groups()


# Multimodal checkpoints whose text decoder sits at `model.layers` (Qwen2.5-VL keeps `visual.*` beside it).
_FLAT_MULTIMODAL = frozenset({"qwen2_5_vl", "qwen2_vl"})


def _tied(cfg: _Cfg, default: bool) -> bool:
    return cfg.bool("tie_word_embeddings", default)


def _embeddings(c: _Counter, cfg: _Cfg, hidden: int, *, tied_default: bool = False) -> None:
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * hidden, tp="vocab")
    if not _tied(cfg, tied_default):
        c.add("lm_head", vocab * hidden, tp="vocab")


def _where(kinds: Sequence[str], *wanted: str) -> list[int]:
    return [i for i, k in enumerate(kinds) if k in wanted]


def _qkvo(
    c: _Counter, hidden: int, heads: int, kv_heads: int, head_dim: int, layers: list[int],
    *, kv_layers: list[int] | None = None, bias: bool = False,
) -> None:
    """Standard attention projections; k and v only on `kv_layers` (Gemma 3n's shared layers have none)."""
    p = "{p}.layers.{i}.self_attn"
    kv_layers = layers if kv_layers is None else kv_layers
    c.linear("attention", p + ".q_proj", hidden, heads * head_dim, layers=layers, bias=bias)
    c.linear("attention", p + ".k_proj", hidden, kv_heads * head_dim, layers=kv_layers, bias=bias)
    c.linear("attention", p + ".v_proj", hidden, kv_heads * head_dim, layers=kv_layers, bias=bias)
    c.linear("attention", p + ".o_proj", heads * head_dim, hidden, layers=layers, bias=bias)


_ATTENTION_KINDS = ("full", "sliding", "chunked", "shared")
_QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_next", "olmo2", "gemma3n_text")


def _decoder(c: _Counter, cfg: _Cfg, text_type: str, kinds: Sequence[str]) -> None:
    """Llama-style decoders (Llama, Mistral, Qwen2/3, Qwen3-Next, Gemma 1-3, Granite, Phi-3, Mixtral,
    DeepSeek, gpt-oss, Llama 4's text model, ...)."""
    hidden = cfg.int("hidden_size")
    layers = len(kinds)
    heads = cfg.int("num_attention_heads")
    head_dim = cfg.int("head_dim", required=False) or hidden // heads
    _embeddings(c, cfg, hidden, tied_default=text_type in ("gemma", "gemma2", "gemma3_text", "granite"))
    attn_bias = cfg.bool("attention_bias", False)
    qkv_bias = attn_bias or text_type in ("qwen2", "qwen2_moe", "qwen2_5_vl", "qwen2_5_vl_text")
    p = "{p}.layers.{i}.self_attn"

    if cfg.has("kv_lora_rank"):
        _mla_attention(c, cfg, hidden, heads, list(range(layers)))
    else:
        attn = _where(kinds, *_ATTENTION_KINDS)
        kv_per_layer = _kv_heads_by_layer(cfg, heads, layers)
        # Qwen3-Next's attention is gated: q_proj also produces a per-head output gate (twice the width).
        q_out = heads * head_dim * (2 if text_type == "qwen3_next" else 1)
        c.linear("attention", p + ".q_proj", hidden, q_out, layers=attn, bias=qkv_bias)
        v_dim = cfg.int("v_head_dim", required=False) or head_dim  # V narrower than K where a config says so
        for kv in sorted(set(kv_per_layer[i] for i in attn)):
            same = [i for i in attn if kv_per_layer[i] == kv]
            c.linear("attention", p + ".k_proj", hidden, kv * head_dim, layers=same, bias=qkv_bias)
            c.linear("attention", p + ".v_proj", hidden, kv * v_dim, layers=same, bias=qkv_bias)
        c.linear("attention", p + ".o_proj", heads * v_dim, hidden, layers=attn, bias=attn_bias)
        if text_type in _QK_NORM_TYPES:
            c.add("norms", len(attn) * 2 * head_dim, tp="replicated")  # q_norm and k_norm over head_dim
        if text_type == "gpt_oss":
            c.add("attention_sinks", len(attn) * heads)
        if text_type == "qwen3_next":
            _gated_deltanet(c, cfg, hidden, _where(kinds, "linear"))

    # Norms: two per layer (four in Gemma 2/3: pre/post attention and feed-forward) + the final norm.
    per_layer_norms = 4 if text_type in ("gemma2", "gemma3_text") else 2
    c.add("norms", (layers * per_layer_norms + 1) * hidden, tp="replicated")
    _mlp_stack(c, cfg, hidden, layers, cfg.bool("mlp_bias", False), text_type)


def _kv_heads_by_layer(cfg: _Cfg, heads: int, layers: int) -> list[int]:
    """KV heads per layer: one number for all, or a per-layer list where the config gives one."""
    name, value = cfg.raw_value("num_key_value_heads")
    if isinstance(value, list):
        return [cfg.list_int(name, layers)[i] for i in range(layers)]
    kv = cfg.int("num_key_value_heads", required=False) or heads
    return [kv] * layers


def _gated_deltanet(c: _Counter, cfg: _Cfg, hidden: int, linear: list[int]) -> None:
    """Qwen3-Next linear-attention layers: fused qkvz and beta/alpha projections, a depthwise conv, out."""
    if not linear:
        return
    k_heads, v_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    k_dim, v_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim")
    n = len(linear)
    p = "{p}.layers.{i}.linear_attn"
    c.linear("linear_attention", p + ".in_proj_qkvz", hidden, 2 * k_heads * k_dim + 2 * v_heads * v_dim, layers=linear)
    c.linear("linear_attention", p + ".in_proj_ba", hidden, 2 * v_heads, layers=linear)
    c.linear("linear_attention", p + ".out_proj", v_heads * v_dim, hidden, layers=linear)
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    c.add("linear_attention_state_params", n * (conv_dim * kernel + 2 * v_heads + v_dim), tp="split")


def _mla_attention(c: _Counter, cfg: _Cfg, hidden: int, heads: int, layers: list[int]) -> None:
    """DeepSeek MLA projections: q (optionally low-rank), the joint KV down-projection, KV up-projection, o."""
    kv_rank = cfg.int("kv_lora_rank")
    q_rank = cfg.int("q_lora_rank", required=False)
    rope = cfg.int("qk_rope_head_dim")
    nope = cfg.int("qk_nope_head_dim")
    v_dim = cfg.int("v_head_dim")
    bias = cfg.bool("attention_bias", False)
    q_width = heads * (nope + rope)
    p = "{p}.layers.{i}.self_attn"
    if q_rank:
        c.linear("attention", p + ".q_a_proj", hidden, q_rank, layers=layers, bias=bias)
        c.add("norms", len(layers) * q_rank, tp="replicated")
        c.linear("attention", p + ".q_b_proj", q_rank, q_width, layers=layers)
    else:
        c.linear("attention", p + ".q_proj", hidden, q_width, layers=layers)
    c.linear("attention", p + ".kv_a_proj_with_mqa", hidden, kv_rank + rope, layers=layers, bias=bias)
    c.add("norms", len(layers) * kv_rank, tp="replicated")
    c.linear("attention", p + ".kv_b_proj", kv_rank, heads * (nope + v_dim), layers=layers)
    c.linear("attention", p + ".o_proj", heads * v_dim, hidden, layers=layers, bias=bias)


def _gated_mlp(c: _Counter, group: str, module: str, hidden: int, inter: int, layers: list[int], bias: bool,
               per_layer: int = 1) -> None:
    c.linear(group, module + ".gate_proj", hidden, inter, layers=layers, bias=bias, per_layer=per_layer)
    c.linear(group, module + ".up_proj", hidden, inter, layers=layers, bias=bias, per_layer=per_layer)
    c.linear(group, module + ".down_proj", inter, hidden, layers=layers, bias=bias, per_layer=per_layer)


def _mlp_stack(c: _Counter, cfg: _Cfg, hidden: int, layers: int, bias: bool, text_type: str) -> None:
    """Dense gated MLPs and MoE layers (all experts resident), by which layers are sparse."""
    ff = "{p}.layers.{i}.feed_forward" if text_type == "llama4_text" else "{p}.layers.{i}.mlp"
    if text_type in ("mixtral",):
        ff = "{p}.layers.{i}.block_sparse_moe"
    inter = cfg.int("intermediate_size")
    experts = cfg.int("num_local_experts", "num_experts", "n_routed_experts", required=False, minimum=0) or 0
    if not experts:
        _gated_mlp(c, "mlp", ff, hidden, inter, list(range(layers)), bias)
        return
    moe_inter = cfg.int("moe_intermediate_size", required=False) or inter
    first_dense = cfg.int("first_k_dense_replace", required=False, minimum=0) or 0
    step = cfg.int("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq", required=False) or 1
    listed = cfg.list("mlp_only_layers")
    mlp_only = set(cfg.list_int("mlp_only_layers", len(listed), minimum=0)) if listed else set()
    sparse = [i for i in range(layers) if i >= first_dense and (i + 1) % step == 0 and i not in mlp_only]
    dense = [i for i in range(layers) if i not in set(sparse)]
    dense_inter = cfg.int("intermediate_size_mlp", required=False) or inter
    if dense:
        _gated_mlp(c, "mlp", ff, hidden, dense_inter, dense, bias)
    expert_bias = text_type == "gpt_oss"
    _gated_mlp(c, "experts", ff + ".experts", hidden, moe_inter, sparse, expert_bias, per_layer=experts)
    router_bias = text_type == "gpt_oss"
    c.add("router", len(sparse) * (hidden * experts + (experts if router_bias else 0)), tp="replicated")
    shared = cfg.int("n_shared_experts", required=False, minimum=0)
    shared_inter = cfg.int("shared_expert_intermediate_size", required=False, minimum=0)
    if text_type == "llama4_text":
        # Llama 4: every MoE layer also runs one shared expert of intermediate_size.
        _gated_mlp(c, "shared_experts", ff + ".shared_expert", hidden, inter, sparse, False)
    elif shared:
        _gated_mlp(c, "shared_experts", ff + ".shared_experts", hidden, shared * moe_inter, sparse, False)
    elif shared_inter:
        _gated_mlp(c, "shared_experts", ff + ".shared_expert", hidden, shared_inter, sparse, False)
        c.add("router", len(sparse) * hidden, tp="replicated")  # shared_expert_gate


def _nemotron_h(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Nemotron-H: each layer is one mixer (M = Mamba2, * = attention, - = relu^2 MLP, E = MoE) + one norm."""
    hidden = cfg.int("hidden_size")
    pattern = cfg.str("hybrid_override_pattern") or ""
    layers = len(pattern)
    c.add("embed_tokens", cfg.int("vocab_size") * hidden, tp="vocab")
    if not _tied(cfg, False):
        c.add("lm_head", cfg.int("vocab_size") * hidden, tp="vocab")
    c.add("norms", (layers + 1) * hidden, tp="replicated")
    mamba = [i for i, ch in enumerate(pattern) if ch == "M"]
    _mamba2_mixer(c, cfg, hidden, mamba, heads_key=("mamba_num_heads",), head_dim_key=("mamba_head_dim",),
                  groups_key=("n_groups",), state_key=("ssm_state_size",), kernel_key=("conv_kernel",),
                  conv_bias=cfg.bool("use_conv_bias", True), proj_bias=cfg.bool("use_bias", False),
                  module="{p}.layers.{i}.mixer")
    attn = [i for i, ch in enumerate(pattern) if ch == "*"]
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = cfg.int("head_dim", "attention_head_dim", required=False) or hidden // heads
    bias = cfg.bool("attention_bias", False)
    p = "{p}.layers.{i}.mixer"
    c.linear("attention", p + ".q_proj", hidden, heads * hd, layers=attn, bias=bias)
    c.linear("attention", p + ".k_proj", hidden, kv * hd, layers=attn, bias=bias)
    c.linear("attention", p + ".v_proj", hidden, kv * hd, layers=attn, bias=bias)
    c.linear("attention", p + ".o_proj", heads * hd, hidden, layers=attn, bias=bias)
    mlp = [i for i, ch in enumerate(pattern) if ch == "-"]
    mlp_bias = cfg.bool("mlp_bias", False)
    inter = cfg.int("intermediate_size")
    c.linear("mlp", p + ".up_proj", hidden, inter, layers=mlp, bias=mlp_bias)
    c.linear("mlp", p + ".down_proj", inter, hidden, layers=mlp, bias=mlp_bias)
    moe = [i for i, ch in enumerate(pattern) if ch == "E"]
    if moe:
        experts = cfg.int("n_routed_experts")
        moe_inter = cfg.int("moe_intermediate_size")
        c.linear("experts", p + ".experts.up_proj", hidden, moe_inter, layers=moe, per_layer=experts)
        c.linear("experts", p + ".experts.down_proj", moe_inter, hidden, layers=moe, per_layer=experts)
        c.add("router", len(moe) * experts * hidden, tp="replicated")
        shared = cfg.int("moe_shared_expert_intermediate_size", required=False, minimum=0) or 0
        n_shared = cfg.int("n_shared_experts", required=False, minimum=0) or 0
        if shared and n_shared:
            c.linear("shared_experts", p + ".shared_experts.up_proj", hidden, shared, layers=moe)
            c.linear("shared_experts", p + ".shared_experts.down_proj", shared, hidden, layers=moe)


def _mamba2_mixer(c: _Counter, cfg: _Cfg, hidden: int, layers: list[int], *, heads_key, head_dim_key,
                  groups_key, state_key, kernel_key, conv_bias: bool, proj_bias: bool, module: str,
                  inner: int | None = None) -> None:
    """A Mamba2 mixer: in_proj to (z, x, B, C, dt), depthwise conv over (x, B, C), dt_bias, A_log, D, a gated
    norm over the inner width, out_proj. Nemotron-3-Nano: inner 64*64 = 4096, in_proj width 2*4096 + 2*8*128 + 64."""
    if not layers:
        return
    n_heads = cfg.int(*heads_key)
    inner = inner if inner is not None else n_heads * cfg.int(*head_dim_key)
    groups, state, kernel = cfg.int(*groups_key), cfg.int(*state_key), cfg.int(*kernel_key)
    conv_dim = inner + 2 * groups * state
    n = len(layers)
    c.linear("mamba", module + ".in_proj", hidden, 2 * inner + 2 * groups * state + n_heads, layers=layers,
             bias=proj_bias)
    c.linear("mamba", module + ".out_proj", inner, hidden, layers=layers, bias=proj_bias)
    c.add("mamba_state_params", n * (conv_dim * kernel + (conv_dim if conv_bias else 0) + 3 * n_heads + inner))


def _jamba(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Jamba: Mamba (v1) or attention per layer, dense MLP or MoE per layer, two norms each."""
    hidden = cfg.int("hidden_size")
    layers = len(kinds)
    _embeddings(c, cfg, hidden, tied_default=False)
    c.add("norms", (2 * layers + 1) * hidden, tp="replicated")
    attn = _where(kinds, "full", "sliding")
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = hidden // heads
    _qkvo(c, hidden, heads, kv, hd, attn)
    mamba = _where(kinds, "mamba1")
    inner = cfg.int("mamba_expand") * hidden
    d_state, d_conv = cfg.int("mamba_d_state"), cfg.int("mamba_d_conv")
    dt_rank = _jamba_dt_rank(cfg, hidden)
    proj_bias = cfg.bool("mamba_proj_bias", False)
    m = "{p}.layers.{i}.mamba"
    c.linear("mamba", m + ".in_proj", hidden, 2 * inner, layers=mamba, bias=proj_bias)
    c.linear("mamba", m + ".x_proj", inner, dt_rank + 2 * d_state, layers=mamba)
    c.linear("mamba", m + ".dt_proj", dt_rank, inner, layers=mamba, bias=True)
    c.linear("mamba", m + ".out_proj", inner, hidden, layers=mamba, bias=proj_bias)
    conv_bias = inner if cfg.bool("mamba_conv_bias", True) else 0
    # conv1d, A_log (inner, d_state), D, and the dt / B / C layernorms Jamba adds.
    per_layer = inner * d_conv + conv_bias + inner * d_state + inner + dt_rank + 2 * d_state
    c.add("mamba_state_params", len(mamba) * per_layer)
    experts = cfg.int("num_experts", required=False, minimum=0) or 0
    period = cfg.int("expert_layer_period", required=False) or 1
    offset = cfg.int("expert_layer_offset", required=False, minimum=0) or 0
    inter = cfg.int("intermediate_size")
    moe = [i for i in range(layers) if experts > 1 and i % period == offset]
    dense = [i for i in range(layers) if i not in set(moe)]
    f = "{p}.layers.{i}.feed_forward"
    _gated_mlp(c, "mlp", f, hidden, inter, dense, False)
    _gated_mlp(c, "experts", f + ".experts", hidden, inter, moe, False, per_layer=experts)
    c.add("router", len(moe) * experts * hidden, tp="replicated")


def _jamba_dt_rank(cfg: _Cfg, hidden: int) -> int:
    """mamba_dt_rank, or "auto" = ceil(hidden / 16) (Jamba's class documents that rule)."""
    _, value = cfg.raw_value("mamba_dt_rank")
    if value == "auto" or value is None:
        return -(-hidden // 16)
    return cfg.int("mamba_dt_rank")


def _granitemoehybrid(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Granite 4 (granitemoehybrid): Mamba2 or attention per layer, then MoE (optional) + a shared MLP."""
    hidden = cfg.int("hidden_size")
    layers = len(kinds)
    _embeddings(c, cfg, hidden, tied_default=False)
    c.add("norms", (2 * layers + 1) * hidden, tp="replicated")
    attn = _where(kinds, "full", "sliding")
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = cfg.int("head_dim", required=False) or hidden // heads
    bias = cfg.bool("attention_bias", False)
    _qkvo(c, hidden, heads, kv, hd, attn, bias=bias)
    _mamba2_mixer(c, cfg, hidden, _where(kinds, "mamba"), heads_key=("mamba_n_heads",),
                  head_dim_key=("mamba_d_head",), groups_key=("mamba_n_groups",), state_key=("mamba_d_state",),
                  kernel_key=("mamba_d_conv",), conv_bias=cfg.bool("mamba_conv_bias", True),
                  proj_bias=cfg.bool("mamba_proj_bias", False), module="{p}.layers.{i}.mamba",
                  inner=cfg.int("mamba_expand") * hidden)
    every = list(range(layers))
    experts = cfg.int("num_local_experts", required=False, minimum=0) or 0
    if experts:
        inter = cfg.int("intermediate_size")
        m = "{p}.layers.{i}.block_sparse_moe"
        c.linear("experts", m + ".input_linear", hidden, 2 * inter, layers=every, per_layer=experts)
        c.linear("experts", m + ".output_linear", inter, hidden, layers=every, per_layer=experts)
        c.add("router", layers * experts * hidden, tp="replicated")
    shared = cfg.int("shared_intermediate_size", required=False, minimum=0) or 0
    if shared:
        s = "{p}.layers.{i}.shared_mlp"
        c.linear("mlp", s + ".input_linear", hidden, 2 * shared, layers=every)
        c.linear("mlp", s + ".output_linear", shared, hidden, layers=every)


def _gemma3n(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Gemma 3n's text model: per-layer MLP widths, AltUp, LAuReL, per-layer input embeddings; layers that
    reuse an earlier layer's KV (num_kv_shared_layers) have no k_proj / v_proj / k_norm."""
    hidden = cfg.int("hidden_size")
    layers = len(kinds)
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = cfg.int("head_dim", required=False) or hidden // heads
    _embeddings(c, cfg, hidden, tied_default=True)
    every = list(range(layers))
    own_kv = [i for i, k in enumerate(kinds) if k != "shared"]
    _qkvo(c, hidden, heads, kv, hd, every, kv_layers=own_kv)
    c.add("norms", (layers + len(own_kv)) * hd, tp="replicated")  # q_norm everywhere, k_norm where KV is own
    inters = cfg.list_int("intermediate_size", layers)
    for width in sorted(set(inters)):
        _gated_mlp(c, "mlp", "{p}.layers.{i}.mlp", hidden, width, [i for i in every if inters[i] == width], False)
    n_alt = cfg.int("altup_num_inputs")
    rank = cfg.int("laurel_rank")
    per_in = cfg.int("hidden_size_per_layer_input")
    vocab_pl = cfg.int("vocab_size_per_layer_input")
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


def _gpt2(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """GPT-2: learned positions, fused qkv Conv1D with biases, 4x MLP with biases, LayerNorms with bias."""
    h = cfg.int("n_embd", "hidden_size")
    layers = list(range(len(kinds)))
    inner = cfg.int("n_inner", required=False) or 4 * h
    c.add("embed_tokens", cfg.int("vocab_size") * h, tp="vocab")
    c.add("embed_positions", cfg.int("n_positions", "max_position_embeddings") * h, tp="replicated")
    c.linear("attention", "transformer.h.{i}.attn.c_attn", h, 3 * h, layers=layers, bias=True)
    c.linear("attention", "transformer.h.{i}.attn.c_proj", h, h, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_fc", h, inner, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_proj", inner, h, layers=layers, bias=True)
    c.add("norms", (2 * len(layers) + 1) * 2 * h, tp="replicated")


def _gpt_bigcode(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """GPT-BigCode: GPT-2 layout with MQA (fused q + one K and V head)."""
    h = cfg.int("n_embd", "hidden_size")
    layers = list(range(len(kinds)))
    heads = cfg.int("n_head", "num_attention_heads")
    inner = cfg.int("n_inner", required=False) or 4 * h
    kv = 2 * (h // heads) if cfg.bool("multi_query", True) else 2 * h
    c.add("embed_tokens", cfg.int("vocab_size") * h, tp="vocab")
    c.add("embed_positions", cfg.int("n_positions", "max_position_embeddings") * h, tp="replicated")
    c.linear("attention", "transformer.h.{i}.attn.c_attn", h, h + kv, layers=layers, bias=True)
    c.linear("attention", "transformer.h.{i}.attn.c_proj", h, h, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_fc", h, inner, layers=layers, bias=True)
    c.linear("mlp", "transformer.h.{i}.mlp.c_proj", inner, h, layers=layers, bias=True)
    c.add("norms", (2 * len(layers) + 1) * 2 * h, tp="replicated")


def _opt(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """OPT: learned positions with an offset of 2, biased projections, optional embedding projections."""
    h = cfg.int("hidden_size")
    layers = list(range(len(kinds)))
    ffn = cfg.int("ffn_dim")
    proj = cfg.int("word_embed_proj_dim", required=False) or h
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * proj, tp="vocab")
    c.add("embed_positions", (cfg.int("max_position_embeddings") + 2) * h, tp="replicated")
    if proj != h:
        c.linear("embed_proj", "model.decoder.project_in", proj, h)
        c.linear("embed_proj", "model.decoder.project_out", h, proj)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        c.linear("attention", "model.decoder.layers.{i}.self_attn." + name, h, h, layers=layers, bias=True)
    c.linear("mlp", "model.decoder.layers.{i}.fc1", h, ffn, layers=layers, bias=True)
    c.linear("mlp", "model.decoder.layers.{i}.fc2", ffn, h, layers=layers, bias=True)
    final_norm = cfg.bool("do_layer_norm_before", True) and not cfg.bool("_remove_final_layer_norm", False)
    c.add("norms", (2 * len(layers) + (1 if final_norm else 0)) * 2 * h, tp="replicated")
    if not cfg.bool("tie_word_embeddings", True):
        c.add("lm_head", vocab * proj, tp="vocab")


def _falcon(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Falcon: fused query_key_value (MQA or grouped), 4x MLP, one or two LayerNorms per layer."""
    h = cfg.int("hidden_size", "n_embd")
    layers = list(range(len(kinds)))
    heads = cfg.int("num_attention_heads", "n_head")
    hd = h // heads
    bias = cfg.bool("bias", False)
    if cfg.bool("new_decoder_architecture", False):
        kv = cfg.int("num_kv_heads", "n_head_kv")
        ln_per_layer = 2
    else:
        kv = 1 if cfg.bool("multi_query", True) else heads
        ln_per_layer = 1 if cfg.bool("parallel_attn", True) else 2
    ffn = cfg.int("ffn_hidden_size", required=False) or 4 * h
    c.add("embed_tokens", cfg.int("vocab_size") * h, tp="vocab")
    t = "transformer.h.{i}"
    c.linear("attention", t + ".self_attention.query_key_value", h, (heads + 2 * kv) * hd, layers=layers, bias=bias)
    c.linear("attention", t + ".self_attention.dense", h, h, layers=layers, bias=bias)
    c.linear("mlp", t + ".mlp.dense_h_to_4h", h, ffn, layers=layers, bias=bias)
    c.linear("mlp", t + ".mlp.dense_4h_to_h", ffn, h, layers=layers, bias=bias)
    c.add("norms", (ln_per_layer * len(layers) + 1) * 2 * h, tp="replicated")
    if not cfg.bool("tie_word_embeddings", True):
        c.add("lm_head", cfg.int("vocab_size") * h, tp="vocab")


def _phi(c: _Counter, cfg: _Cfg, kinds: Sequence[str]) -> None:
    """Phi-1/2: biased q/k/v/dense, plain (ungated) MLP with biases, one LayerNorm per layer, biased lm_head."""
    h = cfg.int("hidden_size")
    layers = list(range(len(kinds)))
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = h // heads
    inter = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * h, tp="vocab")
    p = "model.layers.{i}.self_attn"
    c.linear("attention", p + ".q_proj", h, heads * hd, layers=layers, bias=True)
    c.linear("attention", p + ".k_proj", h, kv * hd, layers=layers, bias=True)
    c.linear("attention", p + ".v_proj", h, kv * hd, layers=layers, bias=True)
    c.linear("attention", p + ".dense", heads * hd, h, layers=layers, bias=True)
    c.linear("mlp", "model.layers.{i}.mlp.fc1", h, inter, layers=layers, bias=True)
    c.linear("mlp", "model.layers.{i}.mlp.fc2", inter, h, layers=layers, bias=True)
    c.add("norms", (len(layers) + 1) * 2 * h, tp="replicated")
    c.add("lm_head", vocab * h + vocab, tp="vocab")


_SPECIAL: dict[str, Callable[[_Counter, _Cfg, Sequence[str]], None]] = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "opt": _opt,
    "falcon": _falcon,
    "RefinedWebModel": _falcon,
    "RefinedWeb": _falcon,
    "phi": _phi,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "granitemoehybrid": _granitemoehybrid,
    "gemma3n_text": _gemma3n,
}


# ---- vision towers (their weights are loaded and count toward weight memory) ----------------------------


def _siglip(c: _Counter, v: _Cfg, text: _Cfg) -> None:
    """Gemma 3's SigLIP encoder (no pooling head) and its projector into the text width.

    Gemma-3-4b: 27 layers of width 1152; patch embedding 3*14*14*1152 + 1152; 4096 positions (896/14)^2.
    """
    h, inter, layers = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    patch, image, chans = v.int("patch_size"), v.int("image_size"), v.int("num_channels")
    every = list(range(layers))
    e = "vision_tower.vision_model.encoder.layers.{i}"
    c.add("vision", chans * patch * patch * h + h + (image // patch) ** 2 * h)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        c.linear("vision", e + ".self_attn." + name, h, h, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc1", h, inter, layers=every, bias=True)
    c.linear("vision", e + ".mlp.fc2", inter, h, layers=every, bias=True)
    c.add("vision", layers * 4 * h + 2 * h)  # two LayerNorms (weight + bias) per layer, post_layernorm
    if v.bool("vision_use_head", True):
        raise ConfigError("vision_config.vision_use_head", "a SigLIP pooling head is not sized by kvplan", v.source)
    # Projector: a soft-embedding RMSNorm over the vision width and a (vision, text) matrix.
    c.add("vision", h)
    c.linear("vision", "multi_modal_projector.mm_input_projection", h, text.int("hidden_size"))


def _llama4_vision(c: _Counter, v: _Cfg, text: _Cfg) -> None:
    """Llama 4's vision encoder (34 layers, width 1408), pixel-shuffle adapter MLP and projector."""
    h, inter, layers = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_hidden_layers")
    patch, image, chans = v.int("patch_size"), v.int("image_size"), v.int("num_channels")
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
        raise ConfigError("vision_config.pixel_shuffle_ratio", f"must be a number in (0, 1], got {ratio!r}", v.source)
    shuffled = int(h / (ratio * ratio))
    c.linear("vision", "vision_model.vision_adapter.mlp.fc1", shuffled, v.int("projector_input_dim"))
    c.linear("vision", "vision_model.vision_adapter.mlp.fc2", v.int("projector_input_dim"),
             v.int("projector_output_dim"))
    c.linear("vision", "multi_modal_projector.linear_1", v.int("vision_output_dim"), text.int("hidden_size"))


def _qwen2_5_vl_vision(c: _Counter, v: _Cfg, text: _Cfg) -> None:
    """Qwen2.5-VL's ViT: Conv3d patch embedding, fused qkv, gated MLP with biases, RMSNorms, a patch merger."""
    h, inter, depth = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    patch, temporal, chans = v.int("patch_size"), v.int("temporal_patch_size"), v.int("in_chans", "in_channels")
    merge, out = v.int("spatial_merge_size"), v.int("out_hidden_size")
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


# Vision towers kvplan sizes, by the multimodal config's model_type; the parser notes any other tower as unsized.
VISION_TOWERS: dict[str, Callable[[_Counter, _Cfg, _Cfg], None]] = {
    "gemma3": _siglip,
    "llama4": _llama4_vision,
    "qwen2_5_vl": _qwen2_5_vl_vision,
}
