"""Invariants over random inputs: no traceback from any JSON, bytes monotone in seq and batch, never up with tp."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.capacity.kv import KvRequest, estimate_kv
from kvplan.errors import KvplanError
from kvplan.model.dtypes import BFLOAT16, FLOAT16, FP8_E4M3
from kvplan.model.parse import parse_config
from kvplan.sources.resolve import resolve_model
from tests.factories import llama_config

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
KEYS = list(llama_config()) + ["head_dim", "sliding_window", "layer_types", "kv_lora_rank", "text_config",
                               "hybrid_override_pattern", "quantization_config", "use_sliding_window"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=12))
def test_random_configs_never_traceback(raw):
    try:
        parse_config(raw, name="fuzz", source="fuzz")
    except KvplanError:
        pass


@settings(max_examples=200)
@given(key=st.sampled_from(KEYS), value=json_values)
def test_one_corrupted_field_is_an_error_naming_a_key_or_a_model(key, value):
    raw = llama_config()
    raw[key] = value
    try:
        parse_config(raw, name="fuzz", source="fuzz")
    except KvplanError as exc:
        assert "'" in str(exc)  # ConfigError messages quote the key


@given(st.binary(max_size=200))
def test_garbage_bytes_never_traceback(blob):
    try:
        raw = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return
    try:
        parse_config(raw, name="fuzz", source="fuzz")
    except KvplanError:
        pass


MODELS = [resolve_model(n, offline=True).model for n in (
    "meta-llama/Llama-3.1-8B-Instruct", "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V2-Lite",
    "google/gemma-3-27b-it", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "tiiuae/falcon-7b",
)]


@given(
    m=st.sampled_from(MODELS),
    seq=st.integers(1, 300_000),
    extra=st.integers(0, 50_000),
    batch=st.integers(1, 64),
    dtype=st.sampled_from([FLOAT16, BFLOAT16, FP8_E4M3]),
)
def test_bytes_grow_with_seq_and_batch(m, seq, extra, batch, dtype):
    base = estimate_kv(m, dtype, KvRequest(seq_tokens=seq, batch=batch))
    longer = estimate_kv(m, dtype, KvRequest(seq_tokens=seq + extra, batch=batch))
    wider = estimate_kv(m, dtype, KvRequest(seq_tokens=seq, batch=batch + 1))
    assert longer.batch_paged_bytes >= base.batch_paged_bytes
    assert longer.batch_contiguous_bytes >= base.batch_contiguous_bytes
    assert wider.batch_paged_bytes > base.batch_paged_bytes


@given(m=st.sampled_from(MODELS), seq=st.integers(1, 100_000), tp_exp=st.integers(0, 5))
def test_per_gpu_bytes_never_grow_with_tp(m, seq, tp_exp):
    tp = 2**tp_exp
    narrow = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=seq, tp=tp))
    wide = estimate_kv(m, BFLOAT16, KvRequest(seq_tokens=seq, tp=tp * 2))
    assert wide.paged_bytes_per_request <= narrow.paged_bytes_per_request
