"""Fuzz: every library config with fields removed or corrupted parses, or fails with an error naming a key.

Never another exception (no traceback for bad input), and a config that does parse can be sized: its KV bytes
per token, constant state and weight bytes are computed without error.
"""

from __future__ import annotations

import copy
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.cli.model_rows import model_row
from kvplan.errors import ConfigError, KvplanError
from kvplan.model.parse import parse_config
from kvplan.sources import library

ENTRIES = library.entries()
CONFIGS = [(e, e.read_config(), e.read_hf_quant_config()) for e in ENTRIES]

GARBAGE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=0),
    st.integers(min_value=10**12, max_value=10**40),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.5, 1e308, -1.0]),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
    st.lists(st.dictionaries(st.text(max_size=2), st.none(), max_size=2), max_size=2),
)

def _paths(raw: dict, prefix: tuple[str, ...] = (), depth: int = 4) -> list[tuple[str, ...]]:
    """Every key of the config and of the dicts nested in it (text_config, vision_config, quantization_config
    down to config_groups.*.weights.*), as key paths."""
    out = []
    for key, value in raw.items():
        out.append(prefix + (key,))
        if isinstance(value, dict) and depth > 1:
            out += _paths(value, prefix + (key,), depth - 1)
    return out


@st.composite
def corrupted(draw):
    entry, raw, hq = draw(st.sampled_from(CONFIGS))
    raw = copy.deepcopy(raw)
    paths = _paths(raw)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths))
        target = raw
        for key in path[:-1]:
            target = target.get(key) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            continue
        if draw(st.booleans()):
            target.pop(path[-1], None)
        else:
            target[path[-1]] = draw(GARBAGE)
    return entry, raw, hq


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted())
def test_corrupted_library_configs_parse_or_name_a_key(case) -> None:
    entry, raw, hq = case
    try:
        model = parse_config(raw, name=entry.repo_id, source=entry.filename, hf_quant_config=hq)
    except ConfigError as exc:
        assert exc.key and f"'{exc.key}'" in exc.message
        return
    except KvplanError as exc:  # pragma: no cover - every parse failure today is a ConfigError
        raise AssertionError(f"not a ConfigError naming a key: {exc.message}") from None
    row = model_row(entry.repo_id, model)
    assert row.kv_bytes_per_token >= 0 and row.weight_bytes > 0
