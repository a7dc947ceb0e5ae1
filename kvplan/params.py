"""Parameter count from a config, by component, in the groups weight-memory planning needs.

Counts follow the module shapes Transformers builds for each family (Linear weights and biases, norms,
embeddings); quantizable groups also record their matrix shapes so group-wise scales can be counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.specs import ParamGroup

if TYPE_CHECKING:  # the reader class lives in parse.py; imported only for type names
    from kvplan.parse import _Cfg


class _Counter:
    """Accumulates parameters into named groups; linear() records the matrix for quantizers."""

    def __init__(self) -> None:
        self._params: dict[str, int] = {}
        self._quantizable: dict[str, bool] = {}
        self._tp: dict[str, str] = {}
        self._mats: dict[str, list[tuple[int, int, int]]] = {}

    def add(self, group: str, n: int, *, quantizable: bool = False, tp: str = "split") -> None:
        self._params[group] = self._params.get(group, 0) + n
        self._quantizable.setdefault(group, quantizable)
        self._tp.setdefault(group, tp)

    def linear(self, group: str, in_f: int, out_f: int, *, bias: bool = False, count: int = 1) -> None:
        """`count` Linear(in_f, out_f) layers: weights are quantizable, biases stay at model dtype."""
        self.add(group, count * in_f * out_f, quantizable=True)
        self._mats.setdefault(group, []).append((count, out_f, in_f))
        if bias:
            self.add(group + "_bias", count * out_f)

    def groups(self) -> tuple[ParamGroup, ...]:
        return tuple(
            ParamGroup(
                name=name,
                params=n,
                quantizable=self._quantizable[name],
                tp=self._tp[name],
                matrices=tuple(self._mats.get(name, ())),
            )
            for name, n in self._params.items()
            if n
        )


def count_params(raw: dict, *, cfg_reader: "_Cfg", text_type: str, model_type: str) -> tuple[ParamGroup, ...]:
    """Parameters of the text model (plus a vision tower when the config has one), grouped by component."""
    c = _Counter()
    cfg = cfg_reader
    family = model_type if model_type in _SPECIAL else text_type
    if family in _SPECIAL:
        _SPECIAL[family](c, cfg)
    else:
        _decoder(c, cfg, raw, text_type)
    return c.groups()


def _tied(cfg: "_Cfg", default: bool) -> bool:
    return cfg.bool("tie_word_embeddings", default)


def _embeddings(c: _Counter, cfg: "_Cfg", hidden: int, *, tied_default: bool = False) -> None:
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * hidden, tp="vocab")
    if not _tied(cfg, tied_default):
        c.add("lm_head", vocab * hidden, tp="vocab")


def _decoder(c: _Counter, cfg: "_Cfg", raw: dict, text_type: str) -> None:
    """Llama-style decoders (Llama, Mistral, Qwen2/3, Gemma, Granite, Phi-3, Mixtral, DeepSeek, gpt-oss, ...)."""
    hidden = cfg.int("hidden_size")
    layers = cfg.int("num_hidden_layers")
    heads = cfg.int("num_attention_heads")
    kv_heads = cfg.int("num_key_value_heads", required=False) or heads
    head_dim = cfg.int("head_dim", required=False) or hidden // heads
    _embeddings(c, cfg, hidden, tied_default=text_type in ("gemma", "gemma2", "gemma3_text", "granite"))

    attn_bias = cfg.bool("attention_bias", False)
    qkv_bias = attn_bias or text_type in ("qwen2", "qwen2_moe", "qwen2_5_vl", "qwen2_5_vl_text")
    o_bias = attn_bias
    mlp_bias = cfg.bool("mlp_bias", False)

    # Attention, per layer.
    if cfg.has("kv_lora_rank"):
        _mla_attention(c, cfg, hidden, heads, layers)
    else:
        c.linear("attention", hidden, heads * head_dim, bias=qkv_bias, count=layers)
        c.linear("attention", hidden, 2 * kv_heads * head_dim, bias=qkv_bias, count=layers)
        c.linear("attention", heads * head_dim, hidden, bias=o_bias, count=layers)
        if text_type in ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_next", "olmo2"):
            # q_norm and k_norm over head_dim (Qwen3, Gemma 3)
            c.add("norms", layers * 2 * head_dim, tp="replicated")
        if text_type == "gpt_oss":
            c.add("attention_sinks", layers * heads)

    # Norms: two per layer (four in Gemma 2/3: pre/post attention and feed-forward) + the final norm.
    per_layer_norms = 4 if text_type in ("gemma2", "gemma3_text") else 2
    c.add("norms", (layers * per_layer_norms + 1) * hidden, tp="replicated")

    _mlp_stack(c, cfg, hidden, layers, mlp_bias, text_type)


def _mla_attention(c: _Counter, cfg: "_Cfg", hidden: int, heads: int, layers: int) -> None:
    """DeepSeek MLA projections: q (optionally low-rank), the joint KV down-projection, KV up-projection, o."""
    kv_rank = cfg.int("kv_lora_rank")
    q_rank = cfg.int("q_lora_rank", required=False)
    rope = cfg.int("qk_rope_head_dim")
    nope = cfg.int("qk_nope_head_dim")
    v_dim = cfg.int("v_head_dim")
    bias = cfg.bool("attention_bias", False)
    q_width = heads * (nope + rope)
    if q_rank:
        c.linear("attention", hidden, q_rank, bias=bias, count=layers)
        c.add("norms", layers * q_rank, tp="replicated")
        c.linear("attention", q_rank, q_width, count=layers)
    else:
        c.linear("attention", hidden, q_width, count=layers)
    c.linear("attention", hidden, kv_rank + rope, bias=bias, count=layers)
    c.add("norms", layers * kv_rank, tp="replicated")
    c.linear("attention", kv_rank, heads * (nope + v_dim), count=layers)
    c.linear("attention", heads * v_dim, hidden, bias=bias, count=layers)


def _mlp_stack(c: _Counter, cfg: "_Cfg", hidden: int, layers: int, bias: bool, text_type: str) -> None:
    """Dense gated MLPs and MoE layers (all experts resident), by which layers are sparse."""
    inter = cfg.int("intermediate_size")
    experts = cfg.int("num_local_experts", "num_experts", "n_routed_experts", required=False, minimum=0) or 0
    if not experts:
        c.linear("mlp", hidden, 2 * inter, bias=bias, count=layers)
        c.linear("mlp", inter, hidden, bias=bias, count=layers)
        return
    moe_inter = cfg.int("moe_intermediate_size", required=False) or inter
    first_dense = cfg.int("first_k_dense_replace", required=False, minimum=0) or 0
    step = cfg.int("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq", required=False) or 1
    mlp_only = set(cfg.list("mlp_only_layers") or [])
    sparse = [i for i in range(layers) if i >= first_dense and (i + 1) % step == 0 and i not in mlp_only]
    dense = layers - len(sparse)
    dense_inter = cfg.int("intermediate_size_mlp", required=False) or inter
    if dense:
        c.linear("mlp", hidden, 2 * dense_inter, bias=bias, count=dense)
        c.linear("mlp", dense_inter, hidden, bias=bias, count=dense)
    n_sparse = len(sparse)
    expert_bias = text_type == "gpt_oss"
    c.linear("experts", hidden, 2 * moe_inter, bias=expert_bias, count=n_sparse * experts)
    c.linear("experts", moe_inter, hidden, bias=expert_bias, count=n_sparse * experts)
    router_bias = text_type == "gpt_oss"
    c.add("router", n_sparse * hidden * experts + (n_sparse * experts if router_bias else 0), tp="replicated")
    if text_type == "deepseek_v3":
        c.add("router", n_sparse * experts, tp="replicated")  # e_score_correction_bias
    shared = cfg.int("n_shared_experts", required=False, minimum=0)
    shared_inter = cfg.int("shared_expert_intermediate_size", required=False, minimum=0)
    if shared:
        width = shared * moe_inter
        c.linear("shared_experts", hidden, 2 * width, count=n_sparse)
        c.linear("shared_experts", width, hidden, count=n_sparse)
    elif shared_inter:
        c.linear("shared_experts", hidden, 2 * shared_inter, count=n_sparse)
        c.linear("shared_experts", shared_inter, hidden, count=n_sparse)
        c.add("router", n_sparse * hidden, tp="replicated")  # shared_expert_gate


def _gpt2(c: _Counter, cfg: "_Cfg") -> None:
    """GPT-2: learned positions, fused qkv Conv1D with biases, 4x MLP with biases, LayerNorms with bias."""
    h = cfg.int("n_embd", "hidden_size")
    layers = cfg.int("n_layer", "num_hidden_layers")
    inner = cfg.int("n_inner", required=False) or 4 * h
    c.add("embed_tokens", cfg.int("vocab_size") * h, tp="vocab")
    c.add("embed_positions", cfg.int("n_positions", "max_position_embeddings") * h, tp="replicated")
    c.linear("attention", h, 3 * h, bias=True, count=layers)
    c.linear("attention", h, h, bias=True, count=layers)
    c.linear("mlp", h, inner, bias=True, count=layers)
    c.linear("mlp", inner, h, bias=True, count=layers)
    c.add("norms", (2 * layers + 1) * 2 * h, tp="replicated")


def _gpt_bigcode(c: _Counter, cfg: "_Cfg") -> None:
    """GPT-BigCode: GPT-2 layout with MQA (fused q + one K and V head)."""
    h = cfg.int("n_embd", "hidden_size")
    layers = cfg.int("n_layer", "num_hidden_layers")
    heads = cfg.int("n_head", "num_attention_heads")
    inner = cfg.int("n_inner", required=False) or 4 * h
    kv = 2 * (h // heads) if cfg.bool("multi_query", True) else 2 * h
    c.add("embed_tokens", cfg.int("vocab_size") * h, tp="vocab")
    c.add("embed_positions", cfg.int("n_positions", "max_position_embeddings") * h, tp="replicated")
    c.linear("attention", h, h + kv, bias=True, count=layers)
    c.linear("attention", h, h, bias=True, count=layers)
    c.linear("mlp", h, inner, bias=True, count=layers)
    c.linear("mlp", inner, h, bias=True, count=layers)
    c.add("norms", (2 * layers + 1) * 2 * h, tp="replicated")


def _opt(c: _Counter, cfg: "_Cfg") -> None:
    """OPT: learned positions with an offset of 2, biased projections, optional embedding projections."""
    h = cfg.int("hidden_size")
    layers = cfg.int("num_hidden_layers")
    ffn = cfg.int("ffn_dim")
    proj = cfg.int("word_embed_proj_dim", required=False) or h
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * proj, tp="vocab")
    c.add("embed_positions", (cfg.int("max_position_embeddings") + 2) * h, tp="replicated")
    if proj != h:
        c.linear("embed_proj", proj, h)
        c.linear("embed_proj", h, proj)
    c.linear("attention", h, h, bias=True, count=4 * layers)
    c.linear("mlp", h, ffn, bias=True, count=layers)
    c.linear("mlp", ffn, h, bias=True, count=layers)
    final_norm = cfg.bool("do_layer_norm_before", True) and not cfg.bool("_remove_final_layer_norm", False)
    c.add("norms", (2 * layers + (1 if final_norm else 0)) * 2 * h, tp="replicated")
    if not cfg.bool("tie_word_embeddings", True):
        c.add("lm_head", vocab * proj, tp="vocab")


def _falcon(c: _Counter, cfg: "_Cfg") -> None:
    """Falcon: fused query_key_value (MQA or grouped), 4x MLP, one or two LayerNorms per layer."""
    h = cfg.int("hidden_size", "n_embd")
    layers = cfg.int("num_hidden_layers", "n_layer")
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
    c.linear("attention", h, (heads + 2 * kv) * hd, bias=bias, count=layers)
    c.linear("attention", h, h, bias=bias, count=layers)
    c.linear("mlp", h, ffn, bias=bias, count=layers)
    c.linear("mlp", ffn, h, bias=bias, count=layers)
    c.add("norms", (ln_per_layer * layers + 1) * 2 * h, tp="replicated")
    if not cfg.bool("tie_word_embeddings", True):
        c.add("lm_head", cfg.int("vocab_size") * h, tp="vocab")


def _phi(c: _Counter, cfg: "_Cfg") -> None:
    """Phi-1/2: biased q/k/v/dense, plain (ungated) MLP with biases, one LayerNorm per layer, biased lm_head."""
    h = cfg.int("hidden_size")
    layers = cfg.int("num_hidden_layers")
    heads = cfg.int("num_attention_heads")
    kv = cfg.int("num_key_value_heads", required=False) or heads
    hd = h // heads
    inter = cfg.int("intermediate_size")
    vocab = cfg.int("vocab_size")
    c.add("embed_tokens", vocab * h, tp="vocab")
    c.linear("attention", h, heads * hd, bias=True, count=layers)
    c.linear("attention", h, 2 * kv * hd, bias=True, count=layers)
    c.linear("attention", heads * hd, h, bias=True, count=layers)
    c.linear("mlp", h, inter, bias=True, count=layers)
    c.linear("mlp", inter, h, bias=True, count=layers)
    c.add("norms", (layers + 1) * 2 * h, tp="replicated")
    c.add("lm_head", vocab * h + vocab, tp="vocab")


_SPECIAL = {
    "gpt2": _gpt2,
    "gpt_bigcode": _gpt_bigcode,
    "opt": _opt,
    "falcon": _falcon,
    "RefinedWebModel": _falcon,
    "RefinedWeb": _falcon,
    "phi": _phi,
}
