"""Checkpoint weight quantization (quantization_config, hf_quant_config.json) -> QuantSpec, and its bytes.

Weight-only formats pack quantizable Linear weights and add scales (and zero points); every module the config
leaves out (embeddings, lm_head, norms, `ignore` / `modules_to_not_convert` / `exclude_modules`) stays at the
model dtype. Which modules are left out is decided by name, module by module, through `exclusion_predicate`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvplan.errors import ConfigError
from kvplan.model.specs import ParamGroup, QuantSpec
from kvplan.units import cdiv


def parse_quant(qc: Any, hf_quant: Any, source: str, dtype_bytes: int = 2) -> QuantSpec | None:
    """Read the checkpoint's quantization; None for an unquantized checkpoint.

    `dtype_bytes` is the model dtype's size: compressed-tensors stores its scales in that dtype.
    """
    if hf_quant is not None:
        if not isinstance(hf_quant, dict) or not isinstance(hf_quant.get("quantization"), dict):
            raise ConfigError("hf_quant_config.quantization", "must be a JSON object", source)
        return _modelopt(hf_quant["quantization"], source, "hf_quant_config.quantization")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError("quantization_config", "must be a JSON object", source)
    method = qc.get("quant_method")
    if not isinstance(method, str):
        raise ConfigError("quantization_config.quant_method", f"must be a string, got {method!r}", source)
    method = method.lower()
    skip = _patterns(qc, "modules_to_not_convert", source)
    if method == "fp8":
        block = qc.get("weight_block_size")
        static = qc.get("activation_scheme") == "static"
        if block is not None:
            if not (isinstance(block, list) and len(block) == 2 and all(_pos_int(b) for b in block)):
                raise ConfigError("quantization_config.weight_block_size", f"must be [rows, cols], got {block!r}",
                                  source)
            return QuantSpec("fp8", 8, block_shape=(block[0], block[1]), scale_bytes=4, excluded=skip,
                             note=f"fp8 with one fp32 scale per {block[0]}x{block[1]} block")
        return QuantSpec("fp8", 8, scale_bytes=8 if static else 4, excluded=skip,
                         note="fp8 with a per-tensor fp32 weight scale" + (" and input scale" if static else ""))
    if method == "mxfp4":
        # gpt-oss: MoE expert weights as 4-bit blocks of 32 with one e8m0 scale byte each; the config's
        # modules_to_not_convert keeps attention, router, embeddings and head in bf16.
        return QuantSpec("mxfp4", 4, group_size=32, scale_bytes=1, excluded=skip,
                         note="MXFP4: 4-bit values, one e8m0 scale byte per 32")
    if method in ("awq", "gptq"):
        return _awq_gptq(qc, method, skip, source)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source, dtype_bytes)
    if method == "modelopt":
        # Newer NVIDIA ModelOpt exports state in config.json what hf_quant_config.json's "quantization" holds.
        return _modelopt(qc, source, "quantization_config")
    if method == "bitsandbytes":
        four = qc.get("load_in_4bit") is True
        # bnb 4-bit: packed nf4/fp4 values, one fp32 absmax per 64 weights (not double-quantized).
        return QuantSpec("bitsandbytes", 4 if four else 8, group_size=64 if four else None,
                         scale_bytes=4, excluded=_patterns(qc, "llm_int8_skip_modules", source),
                         note=f"bitsandbytes int{4 if four else 8}")
    raise ConfigError("quantization_config.quant_method", f"unsupported method {method!r}", source)


def _pos_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _patterns(qc: dict, key: str, source: str, where: str = "quantization_config") -> tuple[str, ...]:
    value = qc.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key}", "must be a list of module names", source)
    return tuple(value)


def _modelopt(q: dict, source: str, where: str) -> QuantSpec:
    """NVIDIA ModelOpt checkpoints: hf_quant_config.json's "quantization", or config.json's quantization_config
    with quant_method "modelopt" (`where` names the one read). One format for every quantized Linear, or, with
    MIXED_PRECISION, one per module from `quantized_layers`."""
    algo = q.get("quant_algo")
    if not isinstance(algo, str):
        raise ConfigError(f"{where}.quant_algo", f"must be a string, got {algo!r}", source)
    excluded = _patterns(q, "exclude_modules", source, where) + _patterns(q, "ignore", source, where)
    if algo.upper() == "MIXED_PRECISION":
        spec = _modelopt_mixed(q, excluded, source, where)
    else:
        spec = _modelopt_format(algo, q.get("group_size", 16), source, f"{where}.quant_algo", excluded)
    return replace(spec, kv_cache_quant=_modelopt_kv(q, source, where))


def _modelopt_kv(q: dict, source: str, where: str) -> str | None:
    """The KV cache quantization a ModelOpt export states: `kv_cache_scheme` (newer config.json exports: a
    compressed-tensors-style {"num_bits": 8, "type": "float", "dynamic": false}, or a name) before
    `kv_cache_quant_algo` ("FP8", "NVFP4"), the order vLLM's get_kv_cache_quant_algo_string reads them in. A
    dynamic 8-bit float scheme is left out: vLLM does not take it (it warns and keeps auto)."""
    scheme = q.get("kv_cache_scheme") or q.get("kv_cache_quant_algo")
    if scheme is None:
        return None
    if isinstance(scheme, str):
        return scheme.strip().upper() or None
    if not isinstance(scheme, dict):
        raise ConfigError(f"{where}.kv_cache_scheme", f"must be a name or an object, got {scheme!r}", source)
    if scheme.get("type") != "float":
        return None
    if scheme.get("num_bits") == 8:
        return "FP8" if scheme.get("dynamic") is False else None
    return "NVFP4" if scheme.get("num_bits") == 4 else None


def _modelopt_format(algo: str, group: Any, source: str, key: str, excluded: tuple[str, ...] = ()) -> QuantSpec:
    """One ModelOpt weight format, as vLLM's modelopt.py loads it (`QUANT_ALGOS`)."""
    name = algo.upper()
    if name == "FP8":
        # fp8 weight + an fp32 weight_scale and an fp32 input_scale per Linear (static per-tensor).
        return QuantSpec("modelopt-fp8", 8, scale_bytes=8, excluded=excluded,
                         note="ModelOpt FP8, per-tensor fp32 weight and input scales")
    if name == "FP8_PER_CHANNEL_PER_TOKEN":
        return QuantSpec("modelopt-fp8-channel", 8, scale_bytes=4, excluded=excluded,
                         note="ModelOpt FP8, one fp32 scale per output channel")
    if name in ("NVFP4", "W4A16_NVFP4"):
        if not _pos_int(group):
            raise ConfigError(key.rsplit(".", 1)[0] + ".group_size", f"must be a positive integer, got {group!r}",
                              source)
        # W4A16_NVFP4 stores the same tensors; only the activations stay 16-bit at run time.
        activations = "16-bit activations" if name == "W4A16_NVFP4" else "fp4 activations"
        return QuantSpec("nvfp4", 4, group_size=group, scale_bytes=1, excluded=excluded,
                         note=f"ModelOpt NVFP4 ({activations}), one fp8 scale per {group} weights + fp32 "
                              "global scales")
    if name == "MXFP8":
        # OCP MX: fp8 e4m3 values in blocks of 32 sharing one e8m0 scale byte (vLLM's MXFP8_BLOCK_SIZE).
        return QuantSpec("mxfp8", 8, group_size=32, scale_bytes=1, excluded=excluded,
                         note="ModelOpt MXFP8, one e8m0 scale per 32 weights")
    raise ConfigError(key, f"unsupported algorithm {algo!r}; kvplan sizes FP8, FP8_PER_CHANNEL_PER_TOKEN, "
                      "NVFP4, W4A16_NVFP4, MXFP8 and MIXED_PRECISION", source)


def _modelopt_mixed(q: dict, excluded: tuple[str, ...], source: str, where: str) -> QuantSpec:
    """MIXED_PRECISION: `quantized_layers` maps each quantized module to its own algorithm; a module it does
    not list stays at the model dtype, as vLLM's ModelOptMixedPrecisionConfig leaves it unquantized.
    nvidia/Qwen3.6-27B-NVFP4: 144 attention and DeltaNet projections in FP8, 192 MLP projections and lm_head
    in W4A16_NVFP4; embeddings, norms, the vision tower and the MTP head at bf16."""
    layers = q.get("quantized_layers")
    key = f"{where}.quantized_layers"
    if not isinstance(layers, dict) or not layers:
        raise ConfigError(key, "must map each quantized module to its quant_algo (MIXED_PRECISION needs it)",
                          source)
    formats: dict[tuple[str, Any], QuantSpec] = {}
    per_module: list[tuple[str, QuantSpec]] = []
    for module, info in layers.items():
        algo = info.get("quant_algo") if isinstance(info, dict) else None
        if not isinstance(algo, str):
            raise ConfigError(f"{key}.{module}.quant_algo", f"must be a string, got {algo!r}", source)
        fmt_key = (algo.upper(), info.get("group_size", 16))
        if fmt_key not in formats:
            formats[fmt_key] = _modelopt_format(algo, fmt_key[1], source, f"{key}.{module}.quant_algo")
        per_module.append((module, formats[fmt_key]))
    listed = ", ".join(f"{algo} x {sum(1 for _, m in per_module if m is f)}" for (algo, _), f in formats.items())
    return QuantSpec("modelopt-mixed", min(f.weight_bits for f in formats.values()), excluded=excluded,
                     per_module=tuple(sorted(per_module)),
                     note=f"ModelOpt MIXED_PRECISION ({listed} modules; the rest at model dtype)")


def _awq_gptq(qc: dict, method: str, skip: tuple[str, ...], source: str) -> QuantSpec:
    """AWQ / GPTQ int-N: packed int32 weights, one fp16 scale and one packed int-N zero point per group of
    `group_size` input channels per output channel; GPTQ also stores g_idx (one int32 per input channel)."""
    bits = qc.get("bits", qc.get("w_bit", 4))
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if isinstance(bits, bool) or bits not in (2, 3, 4, 8):
        raise ConfigError("quantization_config.bits", f"must be 2, 3, 4 or 8, got {bits!r}", source)
    if isinstance(group, bool) or not isinstance(group, int) or group == 0 or group < -1:
        raise ConfigError("quantization_config.group_size", f"must be a positive integer or -1, got {group!r}", source)
    per = "per output channel" if group == -1 else f"per group of {group}"
    return QuantSpec(method, bits, group_size=None if group == -1 else group, scale_bytes=2, zero_point_bits=bits,
                     excluded=skip,
                     note=f"{method.upper()} int{bits}, fp16 scale and int{bits} zero point {per}"
                     + (", int32 g_idx" if method == "gptq" else ""))


def _compressed_tensors(qc: dict, source: str, dtype_bytes: int) -> QuantSpec:
    """llm-compressor checkpoints: w4a16 (pack-quantized int4, group), w8a8 (int8, channel), fp8 (float8,
    channel / tensor / block). Scales are stored in the model dtype."""
    key = "quantization_config.config_groups"
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError(key, "is missing or empty", source)
    schemes = []
    for name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            raise ConfigError(f"{key}.{name}.weights", "is missing", source)
        targets = group.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise ConfigError(f"{key}.{name}.targets", "must be a list of module types or patterns", source)
        if any(t != "Linear" for t in targets):
            raise ConfigError(f"{key}.{name}.targets", f"kvplan sizes only targets ['Linear'], got {targets!r}", source)
        schemes.append((name, weights))
    if len({repr(sorted(w.items())) for _, w in schemes}) > 1:
        raise ConfigError(key, "holds several weight schemes; kvplan sizes one scheme per checkpoint", source)
    name, weights = schemes[0]
    wkey = f"{key}.{name}.weights"
    bits = weights.get("num_bits")
    if isinstance(bits, bool) or bits not in (4, 8):
        raise ConfigError(f"{wkey}.num_bits", f"must be 4 or 8, got {bits!r}", source)
    strategy = weights.get("strategy")
    wtype = weights.get("type", "int")
    if wtype not in ("int", "float"):
        raise ConfigError(f"{wkey}.type", f"must be 'int' or 'float', got {wtype!r}", source)
    group = None
    block = None
    if strategy == "group":
        group = weights.get("group_size")
        if not _pos_int(group):
            raise ConfigError(f"{wkey}.group_size", f"must be a positive integer, got {group!r}", source)
    elif strategy == "block":
        shape = weights.get("block_structure")
        if not (isinstance(shape, list) and len(shape) == 2 and all(_pos_int(b) for b in shape)):
            raise ConfigError(f"{wkey}.block_structure", f"must be [rows, cols], got {shape!r}", source)
        block = (shape[0], shape[1])
    elif strategy not in ("channel", "tensor"):
        raise ConfigError(f"{wkey}.strategy", f"must be tensor, channel, group or block, got {strategy!r}", source)
    symmetric = weights.get("symmetric", True)
    zero = 0 if symmetric is True else bits
    method = "compressed-tensors" if strategy != "tensor" else "compressed-tensors-tensor"
    return QuantSpec(method, bits, group_size=group, block_shape=block, scale_bytes=dtype_bytes,
                     zero_point_bits=zero, excluded=_patterns(qc, "ignore", source),
                     note=f"compressed-tensors {wtype}{bits} ({strategy} scales)")


# ---- which modules a config leaves unquantized ---------------------------------------------------------

def exclusion_predicate(quant: QuantSpec | None) -> Callable[[str], bool]:
    """A test over full module names ("model.layers.3.self_attn.q_proj") for the config's exclusion patterns.

    A MIXED_PRECISION checkpoint also leaves out every module `quantized_layers` does not list.

    Three spellings occur: "re:<regex>" (compressed-tensors, matched from the start of the name); globs with
    "*" (gpt-oss's "model.layers.*.self_attn"); plain names. A glob or plain name excludes the module it names
    and every module under it ("model.layers.0.mlp" covers "model.layers.0.mlp.down_proj", never
    "model.layers.0.mlp_gate"); a plain name without dots ("lm_head") matches that last path component.
    """
    if quant is not None and quant.per_module:
        listed = module_formats(quant)
        return lambda name: listed(name) is None
    if quant is None or not quant.excluded:
        return lambda name: False
    exact: set[str] = set()
    leaves: set[str] = set()
    regexes: list[re.Pattern[str]] = []
    for pattern in quant.excluded:
        if pattern.startswith("re:"):
            try:
                regexes.append(re.compile(pattern[3:]))
            except re.error:
                raise ConfigError("quantization_config.ignore", f"bad regular expression {pattern!r}") from None
        elif "*" in pattern or "?" in pattern or "[" in pattern:
            regexes.append(re.compile(fnmatch.translate(pattern)[:-2] + r"(?:\..*)?\Z", re.S))
        elif "." in pattern:
            exact.add(pattern)
        else:
            leaves.add(pattern)

    def excluded(name: str) -> bool:
        parts = name.split(".")
        if leaves and any(p in leaves for p in parts):
            return True
        if exact and any(".".join(parts[:k]) in exact for k in range(1, len(parts) + 1)):
            return True
        return any(r.match(name) for r in regexes)

    return excluded


# A multimodal decoder's module prefix as kvplan (and vLLM) spell it, and as ModelOpt's exports do.
_DECODER_SPELLINGS = (("language_model.model.", "model.language_model."),
                      ("model.language_model.", "language_model.model."))


def module_formats(quant: QuantSpec) -> Callable[[str], QuantSpec | None]:
    """For a MIXED_PRECISION checkpoint: the format of a module by its full name, None when it stays at the
    model dtype (excluded, or not listed). A module takes the entry of its nearest listed ancestor, so
    "model.language_model.layers.0.mlp.experts" covers each expert's projections; kvplan names a multimodal
    decoder "language_model.model.*" and ModelOpt "model.language_model.*", so both spellings are tried."""
    listed = dict(quant.per_module)
    excluded = exclusion_predicate(QuantSpec(quant.method, quant.weight_bits, excluded=quant.excluded))

    def fmt(name: str) -> QuantSpec | None:
        if excluded(name):
            return None
        spellings = [name]
        for a, b in _DECODER_SPELLINGS:
            if name.startswith(a):
                spellings.append(b + name[len(a):])
        for spelled in spellings:
            parts = spelled.split(".")
            for k in range(len(parts), 0, -1):
                found = listed.get(".".join(parts[:k]))
                if found is not None:
                    return found
        return None

    return fmt


# ---- bytes -----------------------------------------------------------------------------------------------

def group_weight_bytes(group: ParamGroup, quant: QuantSpec | None, dtype_bytes: int) -> int:
    """Bytes of one parameter group stored as the checkpoint stores it."""
    if group.elem_bytes is not None:
        return group.params * group.elem_bytes
    if group.fmt is not None:
        quant = group.fmt  # a MIXED_PRECISION checkpoint: this group's own format
    if quant is None or not group.quantizable:
        return group.params * dtype_bytes
    total = 0
    counted = 0
    for count, out_f, in_f in group.matrices:
        total += count * matrix_bytes(out_f, in_f, quant)
        counted += count * out_f * in_f
    # Parameters of a quantizable group with no recorded shape (none today) would stay at model dtype.
    return total + (group.params - counted) * dtype_bytes


def matrix_bytes(out_f: int, in_f: int, quant: QuantSpec) -> int:
    """One quantized Linear weight (out_f x in_f) with its scales, zero points and index tensors.

    Llama-3.1-70B q_proj (8192 x 8192) as GPTQ int4 group 128: 8192*8192/2 = 33,554,432 B of weights,
    8192 * 64 groups * (2 B scale + 0.5 B zero) = 1,310,720 B, g_idx 8192 * 4 = 32,768 B.
    """
    data = cdiv(out_f * in_f * quant.weight_bits, 8)
    if quant.block_shape is not None:
        scales = cdiv(out_f, quant.block_shape[0]) * cdiv(in_f, quant.block_shape[1])
    elif quant.group_size is not None:
        scales = out_f * cdiv(in_f, quant.group_size)
    elif quant.method in ("fp8", "modelopt-fp8", "compressed-tensors-tensor"):
        scales = 1  # one per tensor
    else:
        scales = out_f  # one per output channel
    extra = scales * quant.scale_bytes + cdiv(scales * quant.zero_point_bits, 8)
    if quant.method == "gptq":
        extra += in_f * 4  # g_idx: the group of each input channel, int32
    if quant.method == "nvfp4":
        extra += 8  # weight_scale_2 and input_scale, one fp32 each
    return data + extra
