"""Hugging Face config.json (or Meta params.json) -> ModelSpec with one frozen spec per layer.

Pure: a dict in, a ModelSpec out. Anything not understood, missing or self-contradictory raises a
ConfigError naming the key; nothing is guessed silently (a default the model class documents is applied
and recorded in the notes).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from typing import Any

from kvplan.errors import ConfigError, InputError
from kvplan.model import params as params_mod
from kvplan.model import quant as quant_mod
from kvplan.model.dtypes import normalize_weight_dtype, serving_dtype, weight_dtype_bytes
from kvplan.model.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    LayerSpec,
    MLASpec,
    ModelSpec,
    NoCacheSpec,
    SharedKVSpec,
    SlidingWindowSpec,
    StateSpec,
    StateTensor,
)

# Families by model_type, for display and for engine models that differ by family.
_FAMILIES = {
    "llama": "llama", "llama4": "llama4", "llama4_text": "llama4", "mistral": "mistral", "mistral3": "mistral",
    "mixtral": "mixtral", "qwen2": "qwen2", "qwen2_moe": "qwen2-moe", "qwen2_5_vl": "qwen2.5-vl",
    "qwen2_5_vl_text": "qwen2.5-vl", "qwen3": "qwen3", "qwen3_moe": "qwen3-moe", "qwen3_next": "qwen3-next",
    "gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3", "gemma3n": "gemma3n",
    "gemma3n_text": "gemma3n", "granite": "granite", "granitemoe": "granite-moe",
    "granitemoehybrid": "granite-4", "phi": "phi", "phi3": "phi3", "opt": "opt", "gpt2": "gpt2",
    "gpt_bigcode": "gpt-bigcode", "falcon": "falcon", "RefinedWebModel": "falcon", "RefinedWeb": "falcon",
    "deepseek_v2": "deepseek", "deepseek_v3": "deepseek", "kimi_k2": "deepseek", "gpt_oss": "gpt-oss",
    "nemotron_h": "nemotron-h", "jamba": "jamba", "starcoder2": "starcoder2", "cohere": "cohere",
    "cohere2": "cohere", "olmo2": "olmo", "llava": "llava", "llava_next": "llava", "kimi_vl": "kimi-vl",
    "meta-llama": "llama",
}

# Transformers' sliding-window alternation for families that express it without `layer_types`:
# layer i is sliding unless (i + 1) % pattern == 0. Gemma 2: 1 local : 1 global; Gemma 3: 5 : 1.
_SLIDING_PATTERN_DEFAULT = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "cohere2": 4}

# Absent keys whose class default changes a size; defaults of flags such as attention_bias are not worth a note.
_SIZING_KEYS = frozenset(
    "vocab_size hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim intermediate_size "
    "sliding_window max_position_embeddings attention_chunk_size num_kv_shared_layers".split()
)

# The text model a multimodal config nests under text_config when the nested dict names no model_type.
_TEXT_TYPES = {"gemma3": "gemma3_text", "gemma3n": "gemma3n_text", "llama4": "llama4_text", "mistral3": "mistral",
               "llava": "llama", "llava_next": "llama"}

_LAYER_TYPE_NAMES = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "sliding_window_attention": "sliding",
    "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "mamba",
}


# Sanity limits: a config value beyond these is a corrupt file, not a model (the largest models have ~130
# layers and widths below 2**20), and planning a billion layers would only exhaust memory.
_COUNT_KEYS = frozenset(
    "num_hidden_layers n_layer num_layers n_layers depth altup_num_inputs num_kv_shared_layers".split()
)
_MAX_COUNT = 100_000
_MAX_SIZE = 1 << 48


@lru_cache(maxsize=1)
def _hf_defaults() -> dict[str, dict[str, Any]]:
    text = resources.files("kvplan.model").joinpath("hf_defaults.json").read_text()
    return json.loads(text)


class _Cfg:
    """Typed reads from one config dict, with errors that name the key and where it sits."""

    def __init__(self, raw: dict, prefix: str, source: str, defaults: dict[str, Any]) -> None:
        self.raw = raw
        self.prefix = prefix
        self.source = source
        self.defaults = defaults
        self.defaulted: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def has(self, name: str) -> bool:
        return self.raw_value(name)[1] is not None

    def raw_value(self, *names: str) -> tuple[str, Any]:
        """The first of `names` the config sets; an explicit null counts as set (Mistral v0.3's
        "sliding_window": null means no window, not "use the class default of 4096")."""
        for name in names:
            if name in self.raw:
                return name, self.raw[name]
        for name in names:
            if self.defaults.get(name) is not None:
                self.defaulted.append(name)
                return name, self.defaults[name]
        return names[0], None

    def int(self, *names: str, required: bool = True, minimum: int = 1) -> int | None:
        name, value = self.raw_value(*names)
        if value is None:
            if required:
                alts = " / ".join(self.key(n) for n in names)
                raise ConfigError(alts, "is missing; kvplan needs it to size the cache", self.source)
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and (not math.isfinite(value) or value != int(value))
        ):
            raise ConfigError(self.key(name), f"must be an integer, got {value!r}", self.source)
        if int(value) < minimum:
            raise ConfigError(self.key(name), f"must be >= {minimum}, got {value!r}", self.source)
        limit = _MAX_COUNT if name in _COUNT_KEYS else _MAX_SIZE
        if int(value) > limit:
            raise ConfigError(self.key(name), f"is implausibly large ({value!r} > {limit:,})", self.source)
        return int(value)

    def bool(self, name: str, default: bool) -> bool:
        _, value = self.raw_value(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ConfigError(self.key(name), f"must be true or false, got {value!r}", self.source)
        return value

    def str(self, name: str) -> str | None:
        _, value = self.raw_value(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ConfigError(self.key(name), f"must be a string, got {value!r}", self.source)
        return value

    def list_int(self, name: str, length: int, minimum: int = 1) -> list[int]:
        """An integer, or a per-layer list of `length` integers (Gemma 3n's intermediate_size)."""
        _, value = self.raw_value(name)
        if not isinstance(value, list):
            return [self.int(name, minimum=minimum)] * length
        if len(value) != length:
            raise ConfigError(self.key(name), f"has {len(value)} entries for {length} layers", self.source)
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, int) or not minimum <= item <= _MAX_SIZE:
                raise ConfigError(f"{self.key(name)}[{i}]", f"must be an integer >= {minimum}, got {item!r}", self.source)
            out.append(item)
        return out

    def list(self, name: str) -> list | None:
        _, value = self.raw_value(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise ConfigError(self.key(name), f"must be a list, got {type(value).__name__}", self.source)
        return value


def meta_params_to_config(params: dict, source: str) -> dict:
    """Meta's original params.json (dim, n_layers, n_heads, n_kv_heads, ...) -> an equivalent Llama config.

    The FFN width is not stored; Meta's code derives it: hidden = int(2 * 4 * dim / 3), times
    ffn_dim_multiplier if set, rounded up to multiple_of. Llama-2-7B: dim 4096 -> 10922 -> 11008.
    vocab_size -1 means "from the tokenizer": 32000 for Llama 1/2 (Meta's tokenizer.model).
    """
    if not isinstance(params, dict):
        raise ConfigError("params.json", "must be a JSON object", source)
    cfg = _Cfg(params, "", source, {})
    dim = cfg.int("dim")
    n_layers = cfg.int("n_layers")
    n_heads = cfg.int("n_heads")
    n_kv_heads = cfg.int("n_kv_heads", required=False) or n_heads
    multiple_of = cfg.int("multiple_of", required=False) or 256
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
    cfg = _Cfg(text_raw, prefix, source, defaults)

    model_type = str(top_type or text_type or "unknown")
    family = _FAMILIES.get(model_type, _FAMILIES.get(str(text_type), model_type))
    archs = raw.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else model_type
    if model_type not in _FAMILIES and text_type not in _FAMILIES:
        notes.append(
            f"model_type '{model_type}' is not one kvplan knows by name; read with the standard decoder keys"
        )

    hidden = cfg.int("hidden_size", "n_embd", "d_model", "dim")
    num_layers = cfg.int("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    num_heads = cfg.int("num_attention_heads", "n_head", "num_heads", "n_heads")
    head_dim = _head_dim(cfg, hidden, num_heads)
    kv_by_layer = _kv_heads_by_layer(cfg, model_type, num_heads, num_layers)
    for kv in sorted(set(kv_by_layer)):
        if kv > num_heads or num_heads % kv:
            raise ConfigError(
                cfg.key("num_key_value_heads"),
                f"{kv} KV heads do not divide {num_heads} attention heads",
                source,
            )
    num_kv_heads = max(kv_by_layer)

    kinds = _layer_kinds(cfg, model_type, str(text_type), num_layers, notes)
    shared = _num_kv_shared(cfg, num_layers)
    layers = _layer_specs(cfg, model_type, kinds, kv_by_layer, head_dim, shared, hidden)

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

    vocab = cfg.int("vocab_size", "padded_vocab_size")
    max_pos = cfg.int(
        "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx", required=False
    )
    intermediate = _intermediate(cfg, num_layers)
    quant = quant_mod.parse_quant(
        raw.get("quantization_config"), hf_quant_config, source, weight_dtype_bytes(serving_dtype(config_dtype))
    )
    vision = _vision_cfg(raw, source, notes)
    param_kinds = [("shared" if isinstance(spec, SharedKVSpec) else k) for k, spec in zip(kinds, layers)]
    groups = params_mod.count_params(
        raw,
        cfg_reader=cfg,
        text_type=str(text_type),
        model_type=model_type,
        kinds=param_kinds,
        excluded=quant_mod.exclusion_predicate(quant),
        vision=vision,
    )
    sized = sorted({cfg.key(k) for k in cfg.defaulted if k in _SIZING_KEYS})
    if sized:
        notes.append(f"{text_type} class defaults used for absent keys: " + ", ".join(sized))
    extra = (
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("num_experts", _num_experts(cfg) or 0),
        # Routed experts per token and each expert's MLP width (sizes vLLM's fused-MoE workspace).
        ("num_experts_per_tok", cfg.int("num_experts_per_tok", required=False, minimum=0) or 0),
        ("moe_intermediate_size", cfg.int("moe_intermediate_size", required=False) or 0),
        ("tie_word_embeddings", _tied(raw, cfg)),
    )
    return ModelSpec(
        name=name,
        source=source,
        model_type=model_type,
        architecture=architecture,
        family=family,
        layers=tuple(layers),
        dtype=dtype,
        config_dtype=config_dtype,
        hidden_size=hidden,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        num_attention_heads=num_heads,
        intermediate_size=intermediate,
        param_groups=groups,
        quant=quant,
        notes=tuple(notes),
        extra=extra,
    )


def _tied(raw: dict, cfg: _Cfg) -> bool:
    value = raw.get("tie_word_embeddings")
    if value is not None:
        if not isinstance(value, bool):
            raise ConfigError("tie_word_embeddings", f"must be true or false, got {value!r}", cfg.source)
        return value
    return cfg.bool("tie_word_embeddings", True)


def _num_experts(cfg: _Cfg) -> int | None:
    return cfg.int("num_local_experts", "num_experts", "n_routed_experts", required=False, minimum=0)


def _intermediate(cfg: _Cfg, num_layers: int) -> int | None:
    """The MLP width; the widest layer's where the config lists one per layer (Gemma 3n)."""
    name, value = cfg.raw_value("intermediate_size", "ffn_dim", "n_inner")
    if isinstance(value, list):
        return max(cfg.list_int(name, num_layers))
    if value is None:
        return None
    return cfg.int(name)


def _head_dim(cfg: _Cfg, hidden: int, num_heads: int) -> int:
    """An explicit head_dim wins (Qwen3, Gemma, Mistral-Nemo: 5120 / 32 = 160 but head_dim 128)."""
    explicit = cfg.int("head_dim", "attention_head_dim", "kv_channels", required=False)
    if explicit is not None:
        return explicit
    if hidden % num_heads:
        raise ConfigError(
            cfg.key("head_dim"),
            f"is absent and hidden size {hidden} is not divisible by {num_heads} heads; the config must state it",
            cfg.source,
        )
    return hidden // num_heads


def _kv_heads_by_layer(cfg: _Cfg, model_type: str, num_heads: int, num_layers: int) -> list[int]:
    """KV heads of each layer: a list-valued num_key_value_heads gives one per layer, else one for all."""
    _, value = cfg.raw_value("num_key_value_heads")
    if isinstance(value, list):
        return cfg.list_int("num_key_value_heads", num_layers)
    return [_num_kv_heads(cfg, model_type, num_heads)] * num_layers


def _num_kv_shared(cfg: _Cfg, num_layers: int) -> int:
    shared = cfg.int("num_kv_shared_layers", required=False, minimum=0) or 0
    if shared >= num_layers:
        raise ConfigError(
            cfg.key("num_kv_shared_layers"), f"{shared} shared layers leave none of {num_layers} to own KV", cfg.source
        )
    return shared


def _vision_cfg(raw: dict, source: str, notes: list[str]) -> _Cfg | None:
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
    known = {"gemma3": "siglip_vision_model", "llama4": "llama4_vision_model", "qwen2_5_vl": "qwen2_5_vl_vision"}
    vtype = vtype or known.get(str(top))
    if str(top) not in params_mod.VISION_TOWERS:
        notes.append(
            f"the vision tower of {top} is not sized: weight bytes cover the text model only "
            "(use --weights-from-hub for exact bytes)"
        )
        return None
    return _Cfg(vision, "vision_config.", source, dict(_hf_defaults().get(vtype or "", {})))


def _num_kv_heads(cfg: _Cfg, model_type: str, num_heads: int) -> int:
    """KV heads under every naming the families use; MHA when nothing says otherwise."""
    explicit = cfg.int("num_key_value_heads", required=False)
    if model_type in ("falcon", "RefinedWebModel", "RefinedWeb"):
        # Falcon: the new decoder architecture (40B/180B) states num_kv_heads; the old one is MQA when
        # multi_query is set (falcon-7b: 71 heads, 1 KV head), MHA otherwise.
        if cfg.bool("new_decoder_architecture", False) or "n_head_kv" in cfg.raw:
            return cfg.int("num_kv_heads", "n_head_kv")
        if cfg.bool("multi_query", model_type == "falcon"):
            return 1
        return cfg.int("num_kv_heads", required=False) or num_heads
    if model_type == "gpt_bigcode":
        # GPT-BigCode (StarCoder) is MQA unless multi_query is false; the class default is true.
        return 1 if cfg.bool("multi_query", True) else num_heads
    if explicit is not None:
        return explicit
    other = cfg.int("num_kv_heads", "n_head_kv", "multi_query_group_num", required=False)
    if other is not None:
        return other
    return num_heads


def _layer_kinds(cfg: _Cfg, model_type: str, text_type: str, num_layers: int, notes: list[str]) -> list[str]:
    """One kind name per layer: 'full', 'sliding', 'chunked', 'linear', 'mamba', 'mamba1', 'none', 'mla'."""
    if cfg.has("kv_lora_rank"):
        return ["mla"] * num_layers

    pattern = cfg.str("hybrid_override_pattern")
    if pattern is not None:
        # Nemotron-H: M = Mamba2, * = attention, - = MLP, E = MoE (no cache of their own).
        if len(pattern) != num_layers:
            raise ConfigError(
                cfg.key("hybrid_override_pattern"),
                f"has {len(pattern)} entries but num_hidden_layers is {num_layers}",
                cfg.source,
            )
        table = {"M": "mamba", "*": "full", "-": "none", "E": "none"}
        bad = sorted(set(pattern) - set(table))
        if bad:
            raise ConfigError(cfg.key("hybrid_override_pattern"), f"has unknown layer codes {bad}", cfg.source)
        return [table[c] for c in pattern]

    if model_type == "jamba":
        # Jamba: layer i is attention when i % attn_layer_period == attn_layer_offset, Mamba (v1) otherwise.
        period = cfg.int("attn_layer_period")
        offset = cfg.int("attn_layer_offset", minimum=0)
        if offset >= period:
            raise ConfigError(cfg.key("attn_layer_offset"), f"{offset} must be below attn_layer_period {period}",
                              cfg.source)
        attn = "sliding" if cfg.int("sliding_window", required=False) else "full"
        return [attn if i % period == offset else "mamba1" for i in range(num_layers)]

    if model_type == "granitemoehybrid":
        # Granite 4: layer_types (or the older layers_block_type) names each layer mamba or attention.
        key = "layer_types" if "layer_types" in cfg.raw else "layers_block_type"
        names = {"mamba": "mamba", "linear_attention": "mamba", "attention": "full", "full_attention": "full"}
        return _listed_kinds(cfg, key, num_layers, names)

    layer_types = cfg.list("layer_types")
    if layer_types is not None:
        return _listed_kinds(cfg, "layer_types", num_layers, _LAYER_TYPE_NAMES)

    interval = cfg.int("full_attention_interval", required=False)
    if interval is not None and model_type == "qwen3_next":
        # Qwen3-Next: every `interval`-th layer is full attention, the rest gated DeltaNet.
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(num_layers)]

    chunk = cfg.int("attention_chunk_size", required=False)
    if chunk is not None and text_type == "llama4_text":
        # Llama 4: RoPE layers use chunked local attention; every no_rope_layer_interval-th layer (NoPE) is
        # global. An explicit no_rope_layers list (1 = RoPE/chunked) wins.
        no_rope = cfg.list("no_rope_layers")
        if no_rope:
            if len(no_rope) != num_layers:
                raise ConfigError(
                    cfg.key("no_rope_layers"), f"has {len(no_rope)} entries for {num_layers} layers", cfg.source
                )
            return ["chunked" if flag else "full" for flag in no_rope]
        every = cfg.int("no_rope_layer_interval", required=False) or 4
        return ["full" if (i + 1) % every == 0 else "chunked" for i in range(num_layers)]

    window = cfg.int("sliding_window", required=False)
    if window is None:
        return ["full"] * num_layers
    if "use_sliding_window" in cfg.raw or cfg.has("use_sliding_window"):
        if not cfg.bool("use_sliding_window", False):
            return ["full"] * num_layers
        # Qwen2-style: layers from max_window_layers on use the window.
        first = cfg.int("max_window_layers", required=False, minimum=0)
        first = num_layers if first is None else first
        return ["sliding" if i >= first else "full" for i in range(num_layers)]
    every = cfg.int("sliding_window_pattern", required=False) or _SLIDING_PATTERN_DEFAULT.get(text_type) or (
        _SLIDING_PATTERN_DEFAULT.get(model_type)
    )
    if every is not None:
        if "sliding_window_pattern" not in cfg.raw:
            notes.append(f"sliding-window alternation of {model_type}: every {every}th layer is global")
        return ["full" if (i + 1) % every == 0 else "sliding" for i in range(num_layers)]
    return ["sliding"] * num_layers


def _listed_kinds(cfg: _Cfg, key: str, num_layers: int, names: dict[str, str]) -> list[str]:
    listed = cfg.list(key)
    if listed is None:
        raise ConfigError(cfg.key(key), "is missing; kvplan needs each layer's type", cfg.source)
    if len(listed) != num_layers:
        raise ConfigError(cfg.key(key), f"has {len(listed)} entries for {num_layers} layers", cfg.source)
    kinds = []
    for i, t in enumerate(listed):
        if not isinstance(t, str) or t not in names:
            raise ConfigError(f"{cfg.key(key)}[{i}]", f"unknown layer type {t!r}", cfg.source)
        kinds.append(names[t])
    return kinds


def _layer_specs(
    cfg: _Cfg,
    model_type: str,
    kinds: list[str],
    kv_by_layer: list[int],
    head_dim: int,
    shared: int,
    hidden: int,
) -> list[LayerSpec]:
    num_layers = len(kinds)
    v_head_dim = cfg.int("v_head_dim", required=False) if "kv_lora_rank" not in cfg.raw else None
    if v_head_dim == head_dim:
        v_head_dim = None
    window = cfg.int("sliding_window", required=False)
    chunk = cfg.int("attention_chunk_size", required=False)

    specs: list[LayerSpec] = []
    for i, kind in enumerate(kinds):
        kv = kv_by_layer[i]
        if shared and i >= num_layers - shared:
            specs.append(SharedKVSpec(source_layer=_shared_source(kinds, i, num_layers - shared)))
            continue
        if kind == "mla":
            specs.append(
                MLASpec(
                    kv_lora_rank=cfg.int("kv_lora_rank"),
                    qk_rope_head_dim=cfg.int("qk_rope_head_dim"),
                )
            )
        elif kind == "full":
            specs.append(FullAttentionSpec(kv, head_dim, v_head_dim))
        elif kind == "sliding":
            if window is None:
                raise ConfigError(cfg.key("sliding_window"), "is missing but layers use sliding attention", cfg.source)
            specs.append(SlidingWindowSpec(kv, head_dim, v_head_dim, sliding_window=window))
        elif kind == "chunked":
            if chunk is None:
                raise ConfigError(
                    cfg.key("attention_chunk_size"), "is missing but layers use chunked attention", cfg.source
                )
            specs.append(ChunkedLocalAttentionSpec(kv, head_dim, v_head_dim, attention_chunk_size=chunk))
        elif kind == "mamba":
            specs.append(_mamba2_state(cfg, model_type, hidden))
        elif kind == "mamba1":
            specs.append(_mamba1_state(cfg, hidden))
        elif kind == "linear":
            specs.append(_gated_deltanet_state(cfg))
        else:
            specs.append(NoCacheSpec())
    return specs


def _shared_source(kinds: list[str], layer: int, first_shared: int) -> int:
    """Gemma 3n: a shared layer reads the last non-shared layer of the same attention kind."""
    for j in range(first_shared - 1, -1, -1):
        if kinds[j] == kinds[layer]:
            return j
    return first_shared - 1


def _state_dtype(cfg: _Cfg, key: str) -> str:
    """Recurrent state dtype: the config's explicit cache dtype, else the model dtype."""
    value = cfg.str(key)
    if value is None or value == "auto":
        value = cfg.raw.get("torch_dtype") or cfg.raw.get("dtype") or "bfloat16"
    try:
        return normalize_weight_dtype(value)
    except InputError:
        raise ConfigError(cfg.key(key), f"unknown dtype {value!r}", cfg.source) from None


def _mamba1_state(cfg: _Cfg, hidden: int) -> StateSpec:
    """Mamba (v1, Jamba) per-request state, as vLLM shapes it (MambaStateShapeCalculator.mamba1_state_shape).

    inner = mamba_expand * hidden; conv state (inner, d_conv - 1), ssm state (inner, d_state). Jamba-v0.1:
    inner 2 * 4096 = 8192 -> conv 8192 * 3 * 2 B = 49,152 B and ssm 8192 * 16 * 2 B = 262,144 B (bf16).
    """
    inner = cfg.int("mamba_expand") * hidden
    d_state = cfg.int("mamba_d_state")
    kernel = cfg.int("mamba_d_conv", minimum=2)
    return StateSpec(
        tensors=(
            StateTensor("conv", (inner, kernel - 1), _state_dtype(cfg, "mamba_conv_cache_dtype"), 0),
            StateTensor("ssm", (inner, d_state), _state_dtype(cfg, "mamba_ssm_cache_dtype"), 0),
        ),
        state_kind="mamba",
    )


def _mamba2_state(cfg: _Cfg, model_type: str, hidden: int) -> StateSpec:
    """Mamba2 per-request state, as vLLM shapes it (MambaStateShapeCalculator.mamba2_state_shape).

    conv state: (intermediate + 2 * n_groups * d_state, conv_kernel - 1) in the model dtype;
    ssm state: (num_heads, head_dim, d_state) in mamba_ssm_cache_dtype. Nemotron-3-Nano: intermediate =
    64 heads * 64 = 4096, conv (4096 + 2*8*128, 3) * 2 B = 36,864 B; ssm (64, 64, 128) * 4 B = 2,097,152 B.
    Granite 4 names the keys mamba_n_heads / mamba_d_head / mamba_d_state / mamba_n_groups / mamba_d_conv and
    sizes intermediate as mamba_expand * hidden_size.
    """
    n_heads = cfg.int("mamba_num_heads", "mamba_n_heads")
    m_head_dim = cfg.int("mamba_head_dim", "mamba_d_head")
    d_state = cfg.int("ssm_state_size", "mamba_d_state")
    n_groups = cfg.int("n_groups", "mamba_n_groups")
    kernel = cfg.int("conv_kernel", "mamba_d_conv", minimum=2)
    intermediate = n_heads * m_head_dim
    if model_type == "granitemoehybrid":
        intermediate = cfg.int("mamba_expand") * hidden
    conv_dim = intermediate + 2 * n_groups * d_state
    return StateSpec(
        tensors=(
            StateTensor("conv", (conv_dim, kernel - 1), _state_dtype(cfg, "mamba_conv_cache_dtype"), 0),
            StateTensor("ssm", (n_heads, m_head_dim, d_state), _state_dtype(cfg, "mamba_ssm_cache_dtype"), 0),
        ),
        state_kind="mamba",
    )


def _gated_deltanet_state(cfg: _Cfg) -> StateSpec:
    """Gated DeltaNet (Qwen3-Next linear attention) per-request state, as vLLM shapes it.

    conv state: (2 * key_heads * key_dim + value_heads * value_dim, kernel - 1);
    recurrent state: (value_heads, key_dim, value_dim). Qwen3-Next-80B: conv (2*16*128 + 32*128, 3) = 24,576
    values, recurrent 32 * 128 * 128 = 524,288 values, both bf16 -> 1,097,728 B per layer per request.
    """
    k_heads = cfg.int("linear_num_key_heads")
    v_heads = cfg.int("linear_num_value_heads")
    k_dim = cfg.int("linear_key_head_dim")
    v_dim = cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim", minimum=2)
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    dtype = _state_dtype(cfg, "mamba_ssm_cache_dtype")
    return StateSpec(
        tensors=(
            StateTensor("conv", (conv_dim, kernel - 1), dtype, 0),
            StateTensor("recurrent", (v_heads, k_dim, v_dim), dtype, 0),
        ),
        state_kind="linear_attention",
    )
