"""GPU prices per hour for `kvplan plan`: the bundled table (each figure with its date and source) and --price.

prices.json holds public on-demand list prices, one per GPU type, read on the date it gives from the page it
names; GPU types with no dated public figure are listed there as not found, never guessed. The user's own
--price H100=2.49 replaces a bundled figure or adds a missing one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources

from kvplan.errors import InputError
from kvplan.hardware.gpus import find_gpu
from kvplan.records import dataclass

# A GPU-hour above this is a typo (a month's price, cents as dollars): the dearest list price found is ~$10.
MAX_USD_PER_GPU_HOUR = 1000.0


@dataclass(frozen=True)
class Price:
    """What one GPU of a type costs per hour, and where the figure comes from."""

    gpu: str  # catalog key
    usd_per_hour: float
    source: str  # a URL, or "--price" for the user's own figure
    date: str  # ISO date the source gives for the figure ("" for the user's own)
    provider: str = ""


@cache
def bundled_prices() -> dict[str, Price]:
    """The bundled table, by catalog key."""
    text = resources.files("kvplan.hardware").joinpath("prices.json").read_text(encoding="utf-8")
    table = json.loads(text)
    return {
        row["gpu"]: Price(row["gpu"], float(row["usd_per_hour"]), row["source"], row["date"], row["provider"])
        for row in table["prices"]
    }


def parse_price(text: str) -> Price:
    """'H100=2.49' -> the H100-80GB at $2.49 per GPU-hour (any name `kvplan gpus` knows)."""
    name, sep, amount = text.partition("=")
    if not sep or not name.strip() or not amount.strip():
        raise InputError(f"--price {text!r}: write GPU=USD_PER_HOUR, e.g. --price H100=2.49")
    gpu = find_gpu(name.strip())
    try:
        usd = float(amount.strip().lstrip("$"))
    except ValueError:
        raise InputError(f"--price {text!r}: {amount.strip()!r} is not a number of dollars per GPU-hour") from None
    if not math.isfinite(usd) or not 0 < usd <= MAX_USD_PER_GPU_HOUR:
        raise InputError(f"--price {text!r}: a GPU-hour costs more than $0 and at most ${MAX_USD_PER_GPU_HOUR:,.0f}")
    return Price(gpu.key, usd, "--price", "")


def price_table(overrides: Sequence[str], *, bundled: bool = True) -> dict[str, Price]:
    """The prices a plan ranks by: the bundled table (unless `bundled` is off) with the user's figures on top."""
    table = dict(bundled_prices()) if bundled else {}
    for text in overrides:
        price = parse_price(text)
        table[price.gpu] = price
    return table
