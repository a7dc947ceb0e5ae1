"""Hugging Face config.json (or Meta params.json) -> ModelSpec with one frozen spec per layer.

The config is read once into a Geometry (geometry.py); each layer's spec is built from it by its kind
(SPEC_BUILDERS) and the parameter count (params.py) is taken from the same record. Pure: a dict in, a
ModelSpec out. Anything not understood, missing or self-contradictory raises a
ConfigError naming the key; nothing is guessed silently (a default the model class documents is applied
and recorded in the notes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.errors import ConfigError, InputError
from kvplan.model import params as params_mod
from kvplan.model import quant as quant_mod
from kvplan.model.config_reader import ConfigReader
from kvplan.model.dtypes import normalize_weight_dtype, serving_dtype, weight_dtype_bytes
from kvplan.model.geometry import Geometry, read_geometry
from kvplan.model.kinds import LayerKind
from kvplan.model.specs import (
    ChunkedLocalAttentionSpec,
    CompressedMLASpec,
    FullAttentionSpec,
    LayerSpec,
    LinearAttentionSpec,
    MambaSpec,
    MLASpec,
    ModelSpec,
    MtpSpec,
    NoCacheSpec,
    QuantSpec,
    SharedKVSpec,
    SlidingWindowSpec,
    StateTensor,
)

# Families by model_type, for display and for engine models that differ by family.
_FAMILIES = {
    "llama": "llama", "llama4": "llama4", "llama4_text": "llama4", "mistral": "mistral", "mistral3": "mistral",
    "mixtral": "mixtral", "qwen2": "qwen2", "qwen2_moe": "qwen2-moe", "qwen2_5_vl": "qwen2.5-vl",
    "qwen2_5_vl_text": "qwen2.5-vl", "qwen3": "qwen3", "qwen3_moe": "qwen3-moe", "qwen3_next": "qwen3-next",
    "qwen3_5": "qwen3.5", "qwen3_5_text": "qwen3.5", "qwen3_5_moe": "qwen3.5-moe", "qwen3_5_moe_text": "qwen3.5-moe",
    "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "gemma3n": "gemma3n",
    "gemma3n_text": "gemma3n", "gemma4": "gemma4", "gemma4_text": "gemma4", "granite": "granite",
    "granitemoe": "granite-moe",
    "granitemoehybrid": "granite-4", "phi": "phi", "phi3": "phi3", "opt": "opt", "gpt2": "gpt2",
    "gpt_bigcode": "gpt-bigcode", "falcon": "falcon", "RefinedWebModel": "falcon", "RefinedWeb": "falcon",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "kimi_k2": "deepseek",
    "deepseek_v32": "deepseek", "deepseek_v4": "deepseek-v4", "gpt_oss": "gpt-oss",
    "nemotron_h": "nemotron-h", "jamba": "jamba", "starcoder2": "starcoder2", "cohere": "cohere",
    "cohere2": "cohere", "olmo2": "olmo", "llava": "llava", "llava_next": "llava", "kimi_vl": "kimi-vl",
    "meta-llama": "llama",
}

# Config keys of cache mechanisms kvplan does not model where they appear: reading such a config with the
# standard decoder keys would size a cache the engine does not build, so it is refused by the key.
_UNMODELLED_CACHE_KEYS = {
    "index_topk": "a sparse-attention indexer on layers that are not MLA, whose key cache engines keep beside "
                  "the KV",
}

# Absent keys whose class default changes a size; defaults of flags such as attention_bias are not worth a note.
_SIZING_KEYS = frozenset(
    "vocab_size hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim intermediate_size "
    "sliding_window max_position_embeddings attention_chunk_size num_kv_shared_layers".split()
)

# The text model a multimodal config nests under text_config when the nested dict names no model_type.
_TEXT_TYPES = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "gemma4": "gemma4_text", "llama4": "llama4_text",
               "mistral3": "mistral", "llava": "llama", "llava_next": "llama"}


@lru_cache(maxsize=1)
def _hf_defaults() -> dict[str, dict[str, Any]]:
    text = (Path(__file__).parent / "hf_defaults.json").read_text(encoding="utf-8")
    return json.loads(text)


def meta_params_to_config(params: dict, source: str) -> dict:
    """Meta's original params.json (dim, n_layers, n_heads, n_kv_heads, ...) -> an equivalent Llama config.

    The FFN width is not stored; Meta's code derives it: hidden = int(2 * 4 * dim / 3), times
    ffn_dim_multiplier if set, rounded up to multiple_of. Llama-2-7B: dim 4096 -> 10922 -> 11008.
    vocab_size -1 means "from the tokenizer": 32000 for Llama 1/2 (Meta's tokenizer.model).
    """
    if not isinstance(params, dict):
        raise ConfigError("params.json", "must be a JSON object", source)
    cfg = ConfigReader(params, source=source)
    dim = cfg.require_int("dim")
    n_layers = cfg.require_int("n_layers")
    n_heads = cfg.require_int("n_heads")
    n_kv_heads = cfg.opt_int("n_kv_heads") or n_heads
    multiple_of = cfg.opt_int("multiple_of") or 256
    hidden = int(2 * (4 * dim) / 3)
    multiplier = params.get("ffn_dim_multiplier")
    if multiplier is not None:
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier <= 0:
            raise ConfigError("ffn_dim_multiplier", f"must be a positive number, got {multiplier!r}", source)
        hidden = int(multiplier * hidden)
    intermediate = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
    vocab = params.get("vocab_size", -1)
    if vocab is None or vocab == -1:
        vocab = 32000
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ConfigError("vocab_size", f"must be a positive integer or -1, got {vocab!r}", source)
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": dim,
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv_heads,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "max_position_embeddings": params.get("max_seq_len", 4096),
        "rms_norm_eps": params.get("norm_eps", 1e-5),
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16" if n_kv_heads != n_heads else "float16",
        "_kvplan_from": "params.json",
    }


def parse_config(
    raw: Any,
    *,
    name: str,
    source: str,
    hf_quant_config: dict | None = None,
) -> ModelSpec:
    """Parse a config.json dict into a ModelSpec. Raises ConfigError naming the offending key."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json", f"must be a JSON object, got {type(raw).__name__}", source)
    if "dim" in raw and "n_layers" in raw and "model_type" not in raw:
        raw = meta_params_to_config(raw, source)
    top_type = raw.get("model_type")
    if top_type is not None and not isinstance(top_type, str):
        raise ConfigError("model_type", f"must be a string, got {top_type!r}", source)
    notes: list[str] = []

    text_raw = raw
    prefix = ""
    if "text_config" in raw:
        text_raw = raw["text_config"]
        prefix = "text_config."
        if not isinstance(text_raw, dict):
            raise ConfigError("text_config", "must be a JSON object", source)
    text_type = text_raw.get("model_type") if prefix else top_type
    if prefix and not text_type:
        text_type = _TEXT_TYPES.get(top_type or "")
    if text_type is not None and not isinstance(text_type, str):
        raise ConfigError(f"{prefix}model_type", f"must be a string, got {text_type!r}", source)
    # Class defaults fill absent keys in a nested text_config (Gemma 3 omits vocab_size); in a top-level
    # config only the secondary keys default, so a config missing hidden_size is an error, not a guess.
    defaults = dict(_hf_defaults().get(text_type or "", {}))
    if not prefix:
        for structural in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
            defaults.pop(structural, None)
    cfg = ConfigReader(text_raw, source=source, prefix=prefix, defaults=defaults)

    model_type = str(top_type or text_type or "unknown")
    family = _FAMILIES.get(model_type, _FAMILIES.get(str(text_type), model_type))
    archs = raw.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else model_type
    if model_type not in _FAMILIES and text_type not in _FAMILIES:
        notes.append(
            f"model_type '{model_type}' is not one kvplan knows by name; read with the standard decoder keys"
        )

    for key, mechanism in _UNMODELLED_CACHE_KEYS.items():
        # DeepSeek-V3.2's indexer (on MLA layers) and V4's (on compressed ones) are part of their layers.
        if cfg.has(key) and not cfg.has("compress_ratios") and not cfg.has("kv_lora_rank"):
            raise cfg.error(key, f"marks {mechanism}, which kvplan does not model; it gives no estimate rather "
                                 "than a wrong one for this model")
    geometry = read_geometry(cfg, raw, model_type=model_type, text_type=str(text_type), notes=notes)
    layers = tuple(SPEC_BUILDERS[kind](geometry, cfg, i) for i, kind in enumerate(geometry.layer_kinds))

    dtype_raw = raw.get("torch_dtype") or raw.get("dtype") or text_raw.get("torch_dtype") or text_raw.get("dtype")
    config_dtype: str | None = None
    if dtype_raw is not None:
        try:
            config_dtype = normalize_weight_dtype(dtype_raw)
        except InputError:
            raise ConfigError("torch_dtype", f"unknown dtype {dtype_raw!r}", source) from None
    dtype = config_dtype or "float32"
    if config_dtype is None:
        notes.append("config states no torch_dtype (Transformers reads that as float32)")

    quant = quant_mod.parse_quant(
        raw.get("quantization_config"), hf_quant_config, source, weight_dtype_bytes(serving_dtype(config_dtype))
    )
    vision = _vision_cfg(raw, source, notes)
    groups = params_mod.count_params(
        geometry,
        cfg,
        text_type=str(text_type),
        model_type=model_type,
        multimodal=vision is not None or (model_type != text_type and "text_config" in raw),
        excluded=quant_mod.exclusion_predicate(quant),
        formats=quant_mod.module_formats(quant) if quant is not None and quant.per_module else None,
        vision=vision,
    )
    sized = sorted({cfg.key(k) for k in cfg.defaulted if k in _SIZING_KEYS})
    if sized:
        notes.append(f"{text_type} class defaults used for absent keys: " + ", ".join(sized))
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        architecture=architecture,
        family=family,
        geometry=geometry,
        layers=layers,
        dtype=dtype,
        config_dtype=config_dtype,
        param_groups=groups,
        quant=quant,
        notes=tuple(notes),
        mtp=_mtp(geometry, cfg, layers, str(text_type), model_type, quant),
    )


def _mtp(g: Geometry, cfg: ConfigReader, layers: tuple[LayerSpec, ...], text_type: str, model_type: str,
         quant: QuantSpec | None) -> MtpSpec | None:
    """The MTP block, where the config has one kvplan sizes: each block caches as the model's attention layers
    do (a full-attention layer's spec for Qwen3.5, the MLA spec for DeepSeek-V3), or, for DeepSeek-V4, as a
    ratio-1 layer: its window of latents alone (vLLM gives a layer past num_hidden_layers ratio 1)."""
    blocks, groups = params_mod.count_mtp_params(
        g, cfg, text_type=text_type, model_type=model_type, excluded=quant_mod.exclusion_predicate(quant),
        formats=quant_mod.module_formats(quant) if quant is not None and quant.per_module else None,
    )
    if blocks and g.compressed_mla is not None:
        d = g.compressed_mla
        window = CompressedMLASpec(head_dim=d.head_dim, rope_dim=d.rope_dim, window=d.window, compress_ratio=1)
        return MtpSpec(layers=(window,) * blocks, param_groups=groups)
    attention = [spec for spec in layers if spec.kind in (LayerKind.FULL_ATTENTION, LayerKind.MLA)]
    if not blocks or not attention:
        return None
    return MtpSpec(layers=(attention[-1],) * blocks, param_groups=groups)


def _vision_cfg(raw: dict, source: str, notes: list[str]) -> ConfigReader | None:
    """A reader over vision_config with its class defaults, or None when the config has no vision tower."""
    if raw.get("audio_config") is not None:
        notes.append(
            f"the audio encoder of {raw.get('model_type')} is not sized: weight bytes leave it out "
            "(use --weights-from-hub for exact bytes)"
        )
    vision = raw.get("vision_config")
    if vision is None:
        return None
    if not isinstance(vision, dict):
        raise ConfigError("vision_config", f"must be a JSON object, got {type(vision).__name__}", source)
    vtype = vision.get("model_type")
    if vtype is not None and not isinstance(vtype, str):
        raise ConfigError("vision_config.model_type", f"must be a string, got {vtype!r}", source)
    top = raw.get("model_type")
    # The vision config class each sized tower uses, for the defaults of keys its vision_config omits.
    known = {"gemma3": "siglip_vision_model", "gemma4": "gemma4_vision", "llama4": "llama4_vision_model",
             "qwen2_5_vl": "qwen2_5_vl_vision", "qwen3_5": "qwen3_5_vision", "qwen3_5_moe": "qwen3_5_moe_vision"}
    vtype = vtype or known.get(str(top))
    if str(top) not in params_mod.VISION_TOWERS:
        notes.append(
            f"the vision tower of {top} is not sized: weight bytes cover the text model only "
            "(use --weights-from-hub for exact bytes)"
        )
        return None
    return ConfigReader(vision, source=source, prefix="vision_config.", defaults=_hf_defaults().get(vtype or "", {}))


# ---- one spec per layer, by kind ------------------------------------------------------------------------


def _v_head_dim(g: Geometry, i: int) -> int | None:
    """The V width layer i's attention spec records: None when V is as wide as K (nearly every model)."""
    return None if g.v_dim(i) == g.head_dims[i] else g.v_dim(i)


def _full(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    return FullAttentionSpec(g.kv_heads[i], g.head_dims[i], _v_head_dim(g, i))


def _sliding(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    if g.sliding_window is None:
        raise cfg.error("sliding_window", "is missing but layers use sliding attention")
    return SlidingWindowSpec(g.kv_heads[i], g.head_dims[i], _v_head_dim(g, i), sliding_window=g.sliding_window)


def _chunked(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    if g.attention_chunk_size is None:
        raise cfg.error("attention_chunk_size", "is missing but layers use chunked attention")
    return ChunkedLocalAttentionSpec(g.kv_heads[i], g.head_dims[i], _v_head_dim(g, i),
                                     attention_chunk_size=g.attention_chunk_size)


def _mla(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    assert g.mla is not None  # read_geometry reads the MLA dims whenever a layer is MLA
    return MLASpec(kv_lora_rank=g.mla.kv_lora_rank, qk_rope_head_dim=g.mla.qk_rope_head_dim,
                   index_head_dim=g.mla.index_head_dim)


def _shared(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    return SharedKVSpec(source_layer=g.kv_source[i])


def _no_cache(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    return NoCacheSpec()


def _state_dtype(cfg: ConfigReader, key: str, *aliases: str) -> str:
    """Recurrent state dtype: the config's explicit cache dtype (the first of `key`, `aliases` it states), else
    the model dtype."""
    key = next((k for k in (key, *aliases) if cfg.opt_str(k) is not None), key)
    value = cfg.opt_str(key)
    if value is None or value == "auto":
        value = cfg.raw.get("torch_dtype") or cfg.raw.get("dtype") or "bfloat16"
    try:
        return normalize_weight_dtype(value)
    except InputError:
        raise cfg.error(key, f"unknown dtype {value!r}") from None


def _mamba(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    """Mamba per-request state, as vLLM shapes it (MambaStateShapeCalculator).

    Mamba (v1, Jamba): conv (inner, d_conv - 1) and ssm (inner, d_state). Jamba-v0.1: inner 2 * 4096 = 8192
    -> conv 8192 * 3 * 2 B = 49,152 B and ssm 8192 * 16 * 2 B = 262,144 B (bf16).
    Mamba2: conv (inner + 2 * n_groups * d_state, conv_kernel - 1) and ssm (num_heads, head_dim, d_state).
    Nemotron-3-Nano: inner = 64 heads * 64 = 4096, conv (4096 + 2*8*128, 3) * 2 B = 36,864 B; ssm
    (64, 64, 128) * 4 B (its float32 mamba_ssm_cache_dtype) = 2,097,152 B.
    """
    m = g.mamba
    assert m is not None  # read_geometry reads the Mamba dims whenever a layer is Mamba
    conv_dtype, ssm_dtype = _state_dtype(cfg, "mamba_conv_cache_dtype"), _state_dtype(cfg, "mamba_ssm_cache_dtype")
    if m.version == 1:
        conv = StateTensor("conv", (m.inner_size, m.conv_kernel - 1), conv_dtype, 0)
        ssm = StateTensor("ssm", (m.inner_size, m.state_size), ssm_dtype, 0)
    else:
        conv_dim = m.inner_size + 2 * m.n_groups * m.state_size
        conv = StateTensor("conv", (conv_dim, m.conv_kernel - 1), conv_dtype, 0)
        ssm = StateTensor("ssm", (m.num_heads, m.head_dim, m.state_size), ssm_dtype, 0)
    return MambaSpec(tensors=(conv, ssm))


def _linear_attention(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5 linear attention) per-request state, as vLLM shapes it.

    conv state: (2 * key_heads * key_dim + value_heads * value_dim, kernel - 1) in the model dtype;
    recurrent state: (value_heads, key_dim, value_dim) in the dtype the config gives the SSM state, else the
    model dtype. Qwen3-Next-80B: conv (2*16*128 + 32*128, 3) = 24,576 values, recurrent 32 * 128 * 128 =
    524,288 values, both bf16 -> 1,097,728 B per layer per request. Qwen3.5 configs say "mamba_ssm_dtype":
    "float32", which vLLM copies into mamba_ssm_cache_dtype from 0.17.0, the first release that serves them
    (Qwen3_5ForConditionalGenerationConfig, vllm-project/vllm#34489): Qwen3.6-35B-A3B holds conv
    (8,192, 3) x 2 B = 49,152 B and recurrent 32 x 128 x 128 x 4 B = 2,097,152 B per layer.
    """
    la = g.linear_attention
    assert la is not None  # read_geometry reads the DeltaNet dims whenever a layer is linear attention
    conv_dim = 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim
    return LinearAttentionSpec(
        tensors=(
            StateTensor("conv", (conv_dim, la.conv_kernel - 1), _state_dtype(cfg, "mamba_conv_cache_dtype"), 0),
            StateTensor("recurrent", (la.num_value_heads, la.key_head_dim, la.value_head_dim),
                        _state_dtype(cfg, "mamba_ssm_cache_dtype", "mamba_ssm_dtype"), 0),
        )
    )


# How each kind's spec is built from the geometry (a kind table: tests check it covers every LayerKind).
def _compressed(g: Geometry, cfg: ConfigReader, i: int) -> LayerSpec:
    c = g.compressed_mla
    assert c is not None  # read_geometry reads it for every config with compress_ratios
    ratio = c.compress_ratios[i]
    return CompressedMLASpec(head_dim=c.head_dim, rope_dim=c.rope_dim, window=c.window, compress_ratio=ratio,
                             index_head_dim=c.index_head_dim if ratio == 4 else 0)


SPEC_BUILDERS: dict[LayerKind, Callable[[Geometry, ConfigReader, int], LayerSpec]] = {
    LayerKind.FULL_ATTENTION: _full,
    LayerKind.SLIDING_WINDOW: _sliding,
    LayerKind.CHUNKED_LOCAL: _chunked,
    LayerKind.MLA: _mla,
    LayerKind.COMPRESSED_MLA: _compressed,
    LayerKind.MAMBA: _mamba,
    LayerKind.LINEAR_ATTENTION: _linear_attention,
    LayerKind.SHARED_KV: _shared,
    LayerKind.NO_CACHE: _no_cache,
}
