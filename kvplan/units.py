"""Byte units and integer helpers. GiB is 2**30 and is always labelled GiB."""

from __future__ import annotations

import re

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


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative integers: 17 tokens in blocks of 16 need cdiv(17, 16) = 2 blocks."""
    return -(-a // b)


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


def parse_size(text: str | int | float, what: str = "size") -> int:
    """'48GiB', '80 GB', '1.5TiB', '123456' -> bytes. Decimal units (GB) are powers of ten, binary (GiB) of two."""
    if isinstance(text, bool):
        raise InputError(f"{what}: expected a size such as 48GiB, got {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise InputError(f"{what}: a size cannot be negative ({text})")
        return int(text)
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).lower() if m else None
    if unit is not None and unit not in _SIZE_UNITS and unit + "b" in _SIZE_UNITS:
        unit = unit + "b" if unit in ("k", "m", "g", "t") else unit
    if unit in ("ki", "mi", "gi", "ti"):
        unit = unit + "b"
    if not m or unit not in _SIZE_UNITS:
        raise InputError(f"{what}: cannot read {text!r} as a size; write it like 48GiB, 80GB or 51539607552")
    return int(round(float(m.group(1)) * _SIZE_UNITS[unit]))
