"""Byte units and integer helpers. GiB is 2**30 and is always labelled GiB."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, Decimal

from kvplan.errors import InputError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
# The largest size kvplan accepts: 1 PiB is beyond any GPU, host or checkpoint it plans for, and far below the
# float and int limits a 400-digit flag would otherwise overflow.
MAX_SIZE_BYTES = 1 << 50
# vLLM's human_readable_int (vllm/utils/argparse_utils.py): lower-case suffixes are decimal and may carry
# decimals, upper-case suffixes are binary and may not: 32k = 32,000, 32K = 32,768, 25.6k = 25,600.
_COUNT_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kKmMgGtT])")
_PLAIN_INT_RE = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")
_DECIMAL_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_SUFFIXES = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# The largest count kvplan accepts (tokens, requests, blocks): 10**12 tokens is a thousand times the longest
# context any model states, and keeps every product of counts and bytes far from overflowing a float.
MAX_COUNT = 10**12
_MAX_INPUT_CHARS = 40  # "1099511627776" is 13 digits; anything much longer is not a size or a count


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: 17 tokens in blocks of 16 need cdiv(17, 16) = 2 blocks."""
    return -(-a // b)


# Element sizes of tensors a model or engine keeps in a dtype of their own, whatever the model is served in.
FP32_BYTES = INT32_BYTES = 4
INT64_BYTES = 8
BF16_BYTES = 2


def round_up(a: int, step: int) -> int:
    """`a` rounded up to a multiple of `step`: a 37,376-byte page padded to 576-byte steps is 37,440."""
    return cdiv(a, step) * step


def gib(n_bytes: int | float) -> float:
    """Bytes as GiB (2**30), for display only; the arithmetic stays in integer bytes."""
    return n_bytes / GiB


def fmt_gib(n_bytes: int | float, digits: int = 2) -> str:
    return f"{n_bytes / GiB:,.{digits}f} GiB"


def fmt_bytes(n_bytes: int | float) -> str:
    """Human size with binary units: 1536 -> '1.50 KiB'."""
    n = float(n_bytes)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:,.2f} {unit}"
    return f"{sign}{int(n):,} B"


def _too_long(text: str, what: str, example: str) -> InputError:
    return InputError(f"{what}: {len(text):,} characters is not a number; write it like {example}")


def parse_size(text: str | int | float, what: str = "size") -> int:
    """'48GiB', '80 GB', '1.5TiB', '123456' -> bytes. Decimal units (GB) are powers of ten, binary (GiB) of two.

    Bounded: at most MAX_SIZE_BYTES (1 PiB); a 400-digit value is refused, not overflowed.
    """
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a size such as 48GiB, got {text!r}")
    if isinstance(text, (int, float)):
        if text != text or text < 0:  # NaN compares unequal to itself
            raise InputError(f"{what}: a size must be a number of bytes >= 0, got {text}")
        if text > MAX_SIZE_BYTES:
            raise InputError(f"{what}: {text:.3g} bytes is more than kvplan plans for (at most 1 PiB)")
        return int(text)
    raw = str(text)
    if len(raw) > _MAX_INPUT_CHARS:
        raise _too_long(raw, what, "48GiB, 80GB or 51539607552")
    m = _SIZE_RE.match(raw)
    unit = m.group(2).lower() if m else None
    if unit in ("k", "m", "g", "t"):
        unit += "b"
    if unit in ("ki", "mi", "gi", "ti"):
        unit += "b"
    if not m or unit not in _SIZE_UNITS:
        raise InputError(f"{what}: cannot read {raw!r} as a size; write it like 48GiB, 80GB or 51539607552")
    # Exact decimal arithmetic: 1.5TiB is 1,649,267,441,664 bytes, with no float rounding on the way.
    size = Decimal(m.group(1)) * _SIZE_UNITS[unit]
    if size > MAX_SIZE_BYTES:
        raise InputError(f"{what}: {raw.strip()} is more than kvplan plans for (at most 1 PiB)")
    return int(size.to_integral_value(ROUND_HALF_EVEN))


def parse_size_or_share(text: str, what: str = "size") -> tuple[int, float]:
    """'2GiB' -> (2,147,483,648, 0.0); '30%' -> (0, 0.3): a size, or a share of each GPU's memory in percent.

    A share is what another server's memory fraction holds (a second vLLM at --gpu-memory-utilization 0.3 is
    30%); it must leave part of the card: 0 <= share < 100%.
    """
    raw = str(text).strip()
    if not raw.endswith("%"):
        return parse_size(raw, what), 0.0
    number = raw[:-1].strip()
    if len(number) > 12:
        raise _too_long(number, what, "30%")
    try:
        share = Decimal(number) / 100
    except ArithmeticError:
        raise InputError(f"{what}: cannot read {raw!r} as a share; write it like 30%") from None
    if not share.is_finite() or not 0 <= share < 1:
        raise InputError(f"{what}: a share of the GPU must be at least 0% and under 100%, got {raw!r}")
    return 0, float(share)


def parse_count(text: str | int, what: str = "count", *, minimum: int = 0, maximum: int = MAX_COUNT) -> int:
    """'32768', '32k', '32K', '25.6k' -> an integer, read as vLLM's human_readable_int reads it, and bounded.

    Lower-case suffixes are decimal (32k = 32,000) and may carry decimals; upper-case ones are binary
    (32K = 32,768) and may not. vLLM multiplies in floating point and truncates, so 32.3k is 32,299 there
    (32.3 * 1000 = 32299.999...), and so here: the flag means what the engine will read.
    """
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a whole number such as 32768 or 32k, got {text!r}")
    if isinstance(text, int):
        value = text
    else:
        raw = str(text).strip()
        if len(raw) > _MAX_INPUT_CHARS:
            raise _too_long(raw, what, "32768 or 32k")
        m = _COUNT_RE.fullmatch(raw)
        if m and m.group(2) in _DECIMAL_SUFFIXES:
            value = int(float(m.group(1)) * _DECIMAL_SUFFIXES[m.group(2)])
        elif m and "." in m.group(1):
            raise InputError(
                f"{what}: decimals are not allowed with the binary suffix {m.group(2)} (vLLM refuses {raw!r}); "
                f"did you mean {m.group(1)}{m.group(2).lower()}?"
            )
        elif m:
            value = int(m.group(1)) * _BINARY_SUFFIXES[m.group(2)]
        elif _PLAIN_INT_RE.fullmatch(raw):  # what Python's int() reads, as vLLM's int(value)
            value = int(raw)
        else:
            raise InputError(f"{what}: cannot read {raw!r} as a whole number; write it like 32768, 32k or 32K")
    if not minimum <= value <= maximum:
        raise InputError(f"{what}: must be between {minimum:,} and {maximum:,}, got {value:,}")
    return value
