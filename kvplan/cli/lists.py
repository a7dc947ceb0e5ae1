"""Flag values that name several things (4k,8k,32k; H100,H200) and token counts written as vLLM reads them.

vLLM reads --max-model-len with its human_readable_int (vllm/utils/argparse_utils.py): a lowercase suffix is
decimal and may carry decimals (32k = 32,000, 25.6k = 25,600), an uppercase one binary and whole
(32K = 32,768; 1.5K is refused); anything else goes to int(). kvplan reads them the same way, so a flag
pasted from a `vllm serve` line means what it meant there.
"""

from __future__ import annotations

import re

from kvplan.errors import InputError

_HUMAN_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
# Longer than any count of tokens or requests kvplan accepts (2^30 has 10 digits); int() of a longer string
# would only spend time before the bounds check refuses it.
_MAX_CHARS = 4000


def human_int(text: str, flag: str) -> int:
    """'32k' -> 32,000; '32K' -> 32,768; '25.6k' -> 25,600; '8192' -> 8,192, exactly as vLLM reads them."""
    value = text.strip()
    if len(value) > _MAX_CHARS:
        raise InputError(f"{flag}: {len(value):,} characters is not a number of tokens")
    match = _HUMAN_RE.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            # vLLM's own arithmetic, float and all: int(float('25.6') * 1000) = 25,600.
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise InputError(f"{flag} {value}: decimals are not allowed with binary suffixes like {suffix} "
                             f"(as vLLM refuses them); did you mean {number}{suffix.lower()}?")
        return int(number) * _BINARY[suffix]
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{flag} {value!r}: not a whole number; write it as vLLM does, e.g. 8192, 32k or 32K") \
            from None


def names(text: str | None, flag: str) -> tuple[str, ...]:
    """'H100,H200' -> ('H100', 'H200'); None -> (); an empty item is an error naming the flag."""
    if text is None:
        return ()
    items = tuple(item.strip() for item in text.split(","))
    if not all(items):
        raise InputError(f"{flag} has an empty item in {text!r}; separate values with commas, e.g. H100,H200")
    return items


def counts(text: str | None, flag: str, *, human: bool = True) -> tuple[int, ...]:
    """'4k,8k,32k' -> (4000, 8000, 32000), each read as vLLM reads token counts (`human`) or as a plain int."""
    out = []
    for item in names(text, flag):
        if human:
            out.append(human_int(item, flag))
        else:
            try:
                out.append(int(item))
            except ValueError:
                raise InputError(f"{flag} {item!r}: not a whole number") from None
    return tuple(out)
