"""Caps on layers, experts and heads: a tiny hostile config fails at once naming the key, and the largest
accepted config parses and plans in a bounded amount of work (counted in Python calls, not seconds)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvplan.capacity.kv import KvRequest, estimate_kv
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.errors import ConfigError
from kvplan.hardware.gpus import find_gpu
from kvplan.model.config_reader import MAX_EXPERTS, MAX_HEADS, MAX_LAYERS
from kvplan.model.dtypes import BFLOAT16
from kvplan.model.parse import parse_config
from tests.factories import hybrid_moe_config, llama_config

LIBRARY = Path(__file__).resolve().parents[1] / "model_configs"


def calls_made(work: Callable[[], object]) -> int:
    """Python function calls `work` makes: a measure of work that does not depend on the machine's speed."""
    count = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal count
        count += event == "call"

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(previous)
    return count


def _parse_and_plan(raw: dict) -> None:
    model = parse_config(raw, name="big", source="test")
    estimate_kv(model, BFLOAT16, KvRequest(seq_tokens=32768, batch=8))
    plan_vllm(model, VllmFlags(max_model_len=32768, tensor_parallel_size=8, pipeline_parallel_size=4),
              find_gpu("H200"))


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"num_hidden_layers": 100_000}, "num_hidden_layers"),
        ({"num_hidden_layers": MAX_LAYERS + 1}, "num_hidden_layers"),
        ({"num_attention_heads": MAX_HEADS * 2, "num_key_value_heads": 8}, "num_attention_heads"),
        ({"num_key_value_heads": [8] * 31 + [MAX_HEADS + 1]}, r"num_key_value_heads\[31\]"),
        ({"num_local_experts": MAX_EXPERTS + 1, "num_experts_per_tok": 2}, "num_local_experts"),
    ],
)
def test_values_beyond_the_caps_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"'{key}' in test: is implausibly large"):
        parse_config(llama_config(**overrides), name="hostile", source="test")


@pytest.mark.parametrize("stem, section, key", [
    ("deepseek-ai__DeepSeek-V3", None, "num_nextn_predict_layers"),
    ("nvidia__Qwen3.6-27B-NVFP4", "text_config", "mtp_num_hidden_layers"),
])
def test_an_mtp_block_count_beyond_the_layer_cap_names_the_key(stem: str, section: str | None, key: str) -> None:
    # The MTP block's parameters are counted block by block, so its count is a layer count like any other (a
    # fuzzed 10**12 ran out of memory building the list of blocks); one past the cap is refused.
    raw = json.loads((LIBRARY / f"{stem}.json").read_text())
    (raw[section] if section else raw)[key] = MAX_LAYERS + 1
    with pytest.raises(ConfigError, match=rf"'{'.'.join(filter(None, (section, key)))}' in test: is implausibly"):
        parse_config(raw, name="hostile", source="test")


def test_a_1kb_config_declaring_100000_layers_is_refused_before_any_per_layer_work() -> None:
    raw = llama_config(num_hidden_layers=100_000)

    def parse() -> None:
        with pytest.raises(ConfigError):
            parse_config(raw, name="hostile", source="test")

    # Refused at the first read of num_hidden_layers: a few hundred calls, where reading 100,000 layers
    # would cost at least one call each.
    assert calls_made(parse) < 1_000


def test_the_largest_accepted_config_parses_and_plans_in_work_linear_in_its_layers() -> None:
    full = calls_made(lambda: _parse_and_plan(hybrid_moe_config(MAX_LAYERS)))
    half = calls_made(lambda: _parse_and_plan(hybrid_moe_config(MAX_LAYERS // 2)))
    # About 38 calls per layer today (one spec built and hashed, sized by the KV estimate and by vLLM's
    # spec table, one parameter-count entry per module) plus ~1,600 fixed: 1,024 layers -> ~38,500 calls,
    # well under a second. 100 per layer leaves room for change but not for a loop over layers per layer.
    assert full <= 100 * MAX_LAYERS
    # Linear: doubling the layers at most doubles the work (a quadratic step would quadruple it).
    assert full <= 2 * half
