"""KV element formats as torch storage: plain floats, fp8, and uint8 codes with the scales kvplan.model.dtypes counts.

Each format turns a [..., D] vector of values into storage tensors and back, with scales per vector exactly
as `KvDtype.vector_bytes` counts them: int8 D=128 -> 128 code bytes + one fp32 scale = 132 B.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kvplan.model.dtypes import KvDtype
from kvplan.records import dataclass
from kvplan.units import cdiv

# FP4 E2M1 magnitudes (1 sign bit, 2 exponent bits, 1 mantissa bit): the eight values NVFP4 can hold.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_GROUP = 16


@dataclass(frozen=True)
class Format:
    """How one KvDtype is stored: the code tensor's width and dtype, and the scale tensor's, per vector of D."""

    kv: KvDtype
    code_dtype: Any
    code_width: int  # elements of code_dtype per vector
    scale_dtype: Any | None
    scale_width: int  # elements of scale_dtype per vector (0: no scale tensor)


# The largest relative change one stored element undergoes from rounding: half a step of the format.
# bfloat16 keeps 8 significant bits -> 2^-8; int8 codes amax/127 steps -> half a step = 1/254 of amax;
# int4 spans (max - min)/15 steps -> 1/30; NVFP4's E2M1 keeps 2 significant bits -> 2^-2.
ROUNDOFF = {
    "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3,
    "int8": 1 / 254, "int4": 1 / 30, "nvfp4": 2.0**-2,
}


def storage_format(torch: ModuleType, kv: KvDtype, dim: int) -> Format:
    name = kv.name
    if name in ("float32", "float16", "bfloat16"):
        return Format(kv, getattr(torch, name), dim, None, 0)
    if name == "fp8_e4m3":
        return Format(kv, torch.float8_e4m3fn, dim, None, 0)
    if name == "fp8_e5m2":
        return Format(kv, torch.float8_e5m2, dim, None, 0)
    if name == "int8":  # one fp32 scale per vector
        return Format(kv, torch.uint8, dim, torch.float32, 1)
    if name == "int4":  # two codes a byte; an fp16 scale and an fp16 zero point per vector
        return Format(kv, torch.uint8, cdiv(dim, 2), torch.float16, 2)
    if name == "nvfp4":  # two codes a byte; one fp8 scale per 16 values
        return Format(kv, torch.uint8, cdiv(dim, 2), torch.float8_e4m3fn, cdiv(dim, NVFP4_GROUP))
    raise ValueError(f"no torch storage for KV dtype {name}")


def encode(torch: ModuleType, fmt: Format, x: Any) -> tuple[Any, Any | None]:
    """Values [..., D] -> (codes, scales) in the storage dtypes."""
    name = fmt.kv.name
    if fmt.scale_dtype is None:
        return x.to(fmt.code_dtype), None
    xf = x.float()
    if name == "int8":
        scale = (xf.abs().amax(-1, keepdim=True) / 127).clamp_min(1e-8)
        codes = (torch.round(xf / scale).clamp(-127, 127) + 128).to(torch.uint8)
        return codes, scale
    if name == "int4":
        lo, hi = xf.amin(-1, keepdim=True), xf.amax(-1, keepdim=True)
        sz = torch.cat([((hi - lo) / 15).clamp_min(1e-6), lo], -1).to(torch.float16)
        scale, zero = sz[..., :1].float(), sz[..., 1:].float()
        codes = torch.round((xf - zero) / scale).clamp(0, 15).to(torch.uint8)
        return _pack4(torch, codes), sz
    # nvfp4: per group of 16, scale = amax / 6 (E2M1's largest value), stored as fp8 e4m3.
    groups = _grouped(torch, xf)
    scale = (groups.abs().amax(-1, keepdim=True) / 6).clamp_min(2**-9).to(torch.float8_e4m3fn)
    scaled = groups / scale.float()
    table = torch.tensor(_E2M1, device=x.device)
    mag = (scaled.abs().unsqueeze(-1) - table).abs().argmin(-1)
    codes = (mag + 8 * (scaled < 0)).to(torch.uint8).flatten(-2)[..., : x.shape[-1]]
    return _pack4(torch, codes), scale.squeeze(-1)


def decode(torch: ModuleType, fmt: Format, codes: Any, scales: Any, dim: int, dtype: Any) -> Any:
    """(codes, scales) -> values [..., D] in `dtype`."""
    name = fmt.kv.name
    if fmt.scale_dtype is None:
        return codes.to(dtype)
    if name == "int8":
        return ((codes.float() - 128) * scales).to(dtype)
    if name == "int4":
        q = _unpack4(torch, codes, dim).float()
        return (q * scales[..., :1].float() + scales[..., 1:].float()).to(dtype)
    q = _unpack4(torch, codes, dim).long()
    table = torch.tensor(_E2M1, device=codes.device)
    values = table[q & 7] * (1 - 2 * (q >> 3)).float()
    pad = scales.shape[-1] * NVFP4_GROUP - dim
    values = torch.nn.functional.pad(values, (0, pad)).unflatten(-1, (scales.shape[-1], NVFP4_GROUP))
    return (values * scales.float().unsqueeze(-1)).flatten(-2)[..., :dim].to(dtype)


def roundtrip(torch: ModuleType, fmt: Format, x: Any) -> Any:
    """What reading back a stored x gives: the reference recomputation attends over exactly these values."""
    codes, scales = encode(torch, fmt, x)
    return decode(torch, fmt, codes, scales, x.shape[-1], x.dtype)


def _grouped(torch: ModuleType, x: Any) -> Any:
    pad = cdiv(x.shape[-1], NVFP4_GROUP) * NVFP4_GROUP - x.shape[-1]
    return torch.nn.functional.pad(x, (0, pad)).unflatten(-1, (-1, NVFP4_GROUP))


def _pack4(torch: ModuleType, codes: Any) -> Any:
    """4-bit codes [..., D] -> bytes [..., ceil(D/2)]: element 2i in the low nibble, 2i+1 in the high one."""
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack4(torch: ModuleType, packed: Any, dim: int) -> Any:
    return torch.stack([packed & 15, packed >> 4], -1).flatten(-2)[..., :dim]
