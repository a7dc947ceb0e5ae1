"""Each layer's mixer kind, by the rule the config's family states it with (lists, patterns, periods, windows)."""

from __future__ import annotations

from kvplan.model.config_reader import ConfigReader
from kvplan.model.kinds import LayerKind

_FULL, _SLIDING, _CHUNKED = LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL

# Transformers' sliding-window alternation for families that express it without `layer_types`:
# layer i is sliding unless (i + 1) % pattern == 0. Gemma 2: 1 local : 1 global; Gemma 3: 5 : 1.
_SLIDING_PATTERN_DEFAULT = {"gemma2": 2, "gemma3_text": 6, "gemma3": 6, "cohere2": 4}

# layer_types names, as Transformers' configs write them.
_LAYER_TYPE_NAMES = {
    "full_attention": _FULL,
    "attention": _FULL,
    "global_attention": _FULL,
    "sliding_attention": _SLIDING,
    "sliding_window_attention": _SLIDING,
    "local_attention": _SLIDING,
    "chunked_attention": _CHUNKED,
    "linear_attention": LayerKind.LINEAR_ATTENTION,
    "mamba": LayerKind.MAMBA,
}
# Granite 4 (layer_types or the older layers_block_type): its "linear_attention" layers are Mamba2 mixers.
_GRANITE_TYPE_NAMES = {"mamba": LayerKind.MAMBA, "linear_attention": LayerKind.MAMBA, "attention": _FULL,
                       "full_attention": _FULL}
# Nemotron-H's hybrid_override_pattern: M = Mamba2, * = attention, - = MLP, E = MoE (no cache of their own).
_NEMOTRON_CODES = {"M": LayerKind.MAMBA, "*": _FULL, "-": LayerKind.NO_CACHE, "E": LayerKind.NO_CACHE}


def mixer_kinds(cfg: ConfigReader, model_type: str, text_type: str, num_layers: int,
                notes: list[str]) -> list[LayerKind]:
    """One kind per layer, before KV sharing: Gemma-2-9B -> [sliding, full] * 21; DeepSeek-V3 -> [mla] * 61."""
    if cfg.has("kv_lora_rank"):
        return [LayerKind.MLA] * num_layers
    if cfg.has("compress_ratios"):
        return [LayerKind.COMPRESSED_MLA] * num_layers  # DeepSeek-V4: each layer's ratio is in its geometry

    pattern = cfg.opt_str("hybrid_override_pattern")
    if pattern is not None:
        if len(pattern) != num_layers:
            raise cfg.error("hybrid_override_pattern",
                            f"has {len(pattern)} entries but num_hidden_layers is {num_layers}")
        bad = sorted(set(pattern) - set(_NEMOTRON_CODES))
        if bad:
            raise cfg.error("hybrid_override_pattern", f"has unknown layer codes {bad}")
        return [_NEMOTRON_CODES[c] for c in pattern]

    if model_type == "jamba":
        # Jamba: layer i is attention when i % attn_layer_period == attn_layer_offset, Mamba (v1) otherwise.
        period = cfg.require_int("attn_layer_period")
        offset = cfg.require_int("attn_layer_offset", minimum=0)
        if offset >= period:
            raise cfg.error("attn_layer_offset", f"{offset} must be below attn_layer_period {period}")
        attn = _SLIDING if cfg.opt_int("sliding_window") else _FULL
        return [attn if i % period == offset else LayerKind.MAMBA for i in range(num_layers)]

    if model_type == "granitemoehybrid":
        key = "layer_types" if cfg.sets("layer_types") else "layers_block_type"
        return _listed_kinds(cfg, key, num_layers, _GRANITE_TYPE_NAMES)

    if cfg.opt_list("layer_types") is not None:
        return _listed_kinds(cfg, "layer_types", num_layers, _LAYER_TYPE_NAMES)

    interval = cfg.opt_int("full_attention_interval")
    if interval is not None and (model_type == "qwen3_next" or text_type in ("qwen3_5_text", "qwen3_5_moe_text")):
        # Qwen3-Next and Qwen3.5 without layer_types: every `interval`-th layer is full attention, the rest
        # gated DeltaNet.
        return [_FULL if (i + 1) % interval == 0 else LayerKind.LINEAR_ATTENTION for i in range(num_layers)]

    chunk = cfg.opt_int("attention_chunk_size")
    if chunk is not None and text_type == "llama4_text":
        return _llama4_kinds(cfg, num_layers)

    window = cfg.opt_int("sliding_window")
    if window is None:
        return [_FULL] * num_layers
    if cfg.sets("use_sliding_window") or cfg.has("use_sliding_window"):
        if not cfg.flag("use_sliding_window", False):
            return [_FULL] * num_layers
        # Qwen2-style: layers from max_window_layers on use the window.
        first = cfg.opt_int("max_window_layers", minimum=0)
        first = num_layers if first is None else first
        return [_SLIDING if i >= first else _FULL for i in range(num_layers)]
    every = cfg.opt_int("sliding_window_pattern") or _SLIDING_PATTERN_DEFAULT.get(text_type) or (
        _SLIDING_PATTERN_DEFAULT.get(model_type)
    )
    if every is not None:
        if not cfg.sets("sliding_window_pattern"):
            notes.append(f"sliding-window alternation of {model_type}: every {every}th layer is global")
        return [_FULL if (i + 1) % every == 0 else _SLIDING for i in range(num_layers)]
    return [_SLIDING] * num_layers


def _llama4_kinds(cfg: ConfigReader, num_layers: int) -> list[LayerKind]:
    """Llama 4: RoPE layers use chunked local attention; every no_rope_layer_interval-th layer (NoPE) is
    global. An explicit no_rope_layers list (1 = RoPE/chunked) wins."""
    no_rope = cfg.opt_list("no_rope_layers")
    if no_rope:
        if len(no_rope) != num_layers:
            raise cfg.error("no_rope_layers", f"has {len(no_rope)} entries for {num_layers} layers")
        return [_CHUNKED if flag else _FULL for flag in no_rope]
    every = cfg.opt_int("no_rope_layer_interval") or 4
    return [_FULL if (i + 1) % every == 0 else _CHUNKED for i in range(num_layers)]


def _listed_kinds(cfg: ConfigReader, key: str, num_layers: int, names: dict[str, LayerKind]) -> list[LayerKind]:
    listed = cfg.opt_list(key)
    if listed is None:
        raise cfg.error(key, "is missing; kvplan needs each layer's type")
    if len(listed) != num_layers:
        raise cfg.error(key, f"has {len(listed)} entries for {num_layers} layers")
    kinds = []
    for i, name in enumerate(listed):
        if not isinstance(name, str) or name not in names:
            raise cfg.error(f"{key}[{i}]", f"unknown layer type {name!r}")
        kinds.append(names[name])
    return kinds
