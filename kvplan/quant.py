"""Checkpoint weight quantization (quantization_config, hf_quant_config.json) -> QuantSpec, and its bytes.

Weight-only formats pack quantizable Linear weights and add scales (and zero points); everything the
config leaves out (embeddings, lm_head, norms, `ignore` / `modules_to_not_convert`) stays at model dtype.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import ConfigError
from kvplan.specs import ParamGroup, QuantSpec
from kvplan.units import cdiv


def parse_quant(qc: Any, hf_quant: dict | None, source: str) -> QuantSpec | None:
    """Read the checkpoint's quantization; None for an unquantized checkpoint."""
    if hf_quant and isinstance(hf_quant.get("quantization"), dict):
        q = hf_quant["quantization"]
        algo = str(q.get("quant_algo") or "").upper()
        excluded = tuple(q.get("exclude_modules") or ())
        if algo == "FP8":
            return QuantSpec("fp8", 8, scale_bytes=4, excluded=excluded, note="ModelOpt FP8, per-tensor fp32 scales")
        if algo == "NVFP4":
            group = int(q.get("group_size") or 16)
            return QuantSpec("nvfp4", 4, group_size=group, scale_bytes=1, excluded=excluded,
                             note=f"ModelOpt NVFP4, one fp8 scale per {group} weights")
        raise ConfigError("hf_quant_config.quantization.quant_algo", f"unsupported algorithm {algo!r}", source)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ConfigError("quantization_config", "must be a JSON object", source)
    method = str(qc.get("quant_method") or "").lower()
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is not None:
            if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
                raise ConfigError("quantization_config.weight_block_size", f"must be [rows, cols], got {block!r}", source)
            return QuantSpec("fp8", 8, block_shape=(block[0], block[1]), scale_bytes=4,
                             excluded=tuple(qc.get("modules_to_not_convert") or ()),
                             note=f"fp8 with one fp32 scale per {block[0]}x{block[1]} block")
        return QuantSpec("fp8", 8, scale_bytes=4, excluded=tuple(qc.get("modules_to_not_convert") or ()),
                         note="fp8 with per-tensor fp32 scales")
    if method == "mxfp4":
        return QuantSpec("mxfp4", 4, group_size=32, scale_bytes=1,
                         excluded=tuple(qc.get("modules_to_not_convert") or ()),
                         note="MXFP4: 4-bit values, one e8m0 scale byte per 32")
    if method in ("awq", "gptq"):
        bits = qc.get("bits", qc.get("w_bit", 4))
        group = qc.get("group_size", qc.get("q_group_size", 128))
        if not isinstance(bits, int) or bits not in (2, 3, 4, 8):
            raise ConfigError("quantization_config.bits", f"must be 2, 3, 4 or 8, got {bits!r}", source)
        if not isinstance(group, int) or group == 0 or group < -1:
            raise ConfigError("quantization_config.group_size", f"must be a positive integer or -1, got {group!r}", source)
        return QuantSpec(method, bits, group_size=None if group == -1 else group, scale_bytes=2,
                         zero_point_bits=bits, excluded=tuple(qc.get("modules_to_not_convert") or ()),
                         note=f"{method.upper()} int{bits}, fp16 scale and int{bits} zero point per group of {group}")
    if method == "compressed-tensors":
        return _compressed_tensors(qc, source)
    if method in ("bitsandbytes",):
        bits = 4 if qc.get("load_in_4bit") else 8
        return QuantSpec("bitsandbytes", bits, group_size=64 if bits == 4 else None, scale_bytes=4 if bits == 4 else 0,
                         note=f"bitsandbytes int{bits}")
    raise ConfigError("quantization_config.quant_method", f"unsupported method {method!r}", source)


def _compressed_tensors(qc: dict, source: str) -> QuantSpec:
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigError("quantization_config.config_groups", "is missing or empty", source)
    first = next(iter(groups.values()))
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        raise ConfigError("quantization_config.config_groups.*.weights", "is missing", source)
    bits = weights.get("num_bits")
    if not isinstance(bits, int) or bits not in (4, 8):
        raise ConfigError("quantization_config.config_groups.*.weights.num_bits", f"must be 4 or 8, got {bits!r}", source)
    strategy = weights.get("strategy")
    group = weights.get("group_size") if strategy == "group" else None
    wtype = weights.get("type", "int")
    zero = 0 if weights.get("symmetric", True) else bits
    scale_bytes = 2 if bits == 4 else 4 if wtype == "float" else 2
    excluded = tuple(qc.get("ignore") or ())
    return QuantSpec("compressed-tensors", bits, group_size=group, scale_bytes=scale_bytes, zero_point_bits=zero,
                     excluded=excluded, note=f"compressed-tensors {wtype}{bits} ({strategy})")


def group_weight_bytes(group: ParamGroup, quant: QuantSpec | None, dtype_bytes: int) -> int:
    """Bytes of one parameter group stored as the checkpoint stores it."""
    if quant is None or not group.quantizable or _is_excluded(group.name, quant):
        return group.params * dtype_bytes
    data = cdiv(group.params * quant.weight_bits, 8)
    scales = 0
    for count, out_f, in_f in group.matrices:
        scales += count * _scales_per_matrix(out_f, in_f, quant)
    per_scale = quant.scale_bytes + quant.zero_point_bits / 8
    return data + int(scales * per_scale)


def _scales_per_matrix(out_f: int, in_f: int, quant: QuantSpec) -> int:
    if quant.block_shape is not None:
        return cdiv(out_f, quant.block_shape[0]) * cdiv(in_f, quant.block_shape[1])
    if quant.group_size is not None:
        return out_f * cdiv(in_f, quant.group_size)
    if quant.method in ("fp8",):
        return 1  # per-tensor
    return out_f  # per output channel


def _is_excluded(group: str, quant: QuantSpec) -> bool:
    """Group-level exclusion: attention left unquantized by gpt-oss (`model.layers.*.self_attn`)."""
    patterns = " ".join(quant.excluded)
    if group.startswith("attention") and "self_attn" in patterns:
        return True
    return False
