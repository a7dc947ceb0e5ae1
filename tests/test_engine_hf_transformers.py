"""kvplan's Transformers cache bytes against transformers itself, for every bundled model it can build.

Each model is built from its bundled config on the meta device (no weights, no download, never
trust_remote_code) with the layer count cut to at most 12, and a real prefill of 2 x 5,000 tokens runs
through a DynamicCache; meta tensors carry shapes, so the bytes the cache holds are exact. kvplan parses the
SAME reduced config, so the comparison is like for like; 12 layers keep every alternation pattern in the
library (Gemma 3's 5:1 included) and 5,000 tokens pass Gemma 2's 4,096-token window.
"""

from __future__ import annotations

import copy
import json

import pytest

from kvplan.engines.hf import hf_cache_bytes
from kvplan.errors import KvplanError
from kvplan.parse import parse_config
from tests.conftest import REPO

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_LAYERS = 12
BATCH, SEQ = 2, 5000
CONFIGS = sorted(p for p in (REPO / "model_configs").glob("*.json") if p.name != "aliases.json"
                 and not p.name.endswith(".hf_quant_config.json") and not p.name.endswith(".params.json"))


def _reduce(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    cfg = raw.get("text_config", raw)
    n = cfg.get("num_hidden_layers")
    if not isinstance(n, int):
        return raw
    keep = min(n, MAX_LAYERS)
    cfg["num_hidden_layers"] = keep
    for key in ("layer_types", "no_rope_layers"):
        if isinstance(cfg.get(key), list):
            cfg[key] = cfg[key][:keep]
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"][:keep]
    raw.pop("quantization_config", None)
    return raw


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_dynamic_cache_bytes_equal_transformers(path):
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    raw = _reduce(json.loads(path.read_text()))
    try:
        spec = parse_config(raw, name=path.stem, source=str(path))
        expected_kinds_ok = hf_cache_bytes(spec, seq_tokens=1).total_bytes >= 0
    except KvplanError as exc:
        pytest.skip(f"kvplan's transformers engine does not model this model: {exc}")
    assert expected_kinds_ok
    try:
        cfg = AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "transformers_version"})
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - any failure to build means Transformers cannot build it
        pytest.skip(f"transformers cannot build {path.stem} on the meta device: {type(exc).__name__}: {exc}"[:300])
    cache = DynamicCache(config=cfg)
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    try:
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"meta-device forward not supported for {path.stem}: {type(exc).__name__}"[:300])
    held = sum(
        t.numel() * t.element_size()
        for layer in cache.layers
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
        if t is not None and t.numel()
    )
    ours = hf_cache_bytes(spec, seq_tokens=SEQ, batch=BATCH, dtype="bfloat16").total_bytes
    assert ours == held
