"""`kvplan models` through the CLI, and the safetensors-header sum (--weights-from-hub) on the local fake Hub."""

from __future__ import annotations

import json

import pytest

from kvplan.capacity.weights import estimate_weights
from kvplan.errors import HubError
from kvplan.sources import library
from kvplan.sources.hub import fetch_safetensors_bytes
from tests.conftest import run_cli
from tests.conftest_hub import HubEnv
from tests.hub_server import safetensors_file


def _json(runner, *args: str) -> dict:
    result = run_cli(runner, "models", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_models_json_lists_the_whole_library(runner) -> None:
    data = _json(runner)
    assert data["count"] == len(library.entries()) == len(data["models"])
    row = next(m for m in data["models"] if m["name"] == "meta-llama/Llama-3.1-8B-Instruct")
    # 32 layers x 2 x 8 KV heads x 128 x 2 B (bf16); 8,030,261,248 parameters x 2 B of bf16 weights.
    assert row == {
        "name": "meta-llama/Llama-3.1-8B-Instruct",
        "family": "llama",
        "model_type": "llama",
        "kinds": {"full_attention": 32},
        "layers": 32,
        "kv_heads": [8],
        "dtype": "bfloat16",
        "kv_bytes_per_token": 131_072,
        "state_bytes_per_request": 0,
        "params": 8_030_261_248,
        "weight_bytes": 16_060_522_496,
        "quantization": None,
        "max_context_tokens": 131_072,
    }


def test_models_filters_by_kind_family_and_name(runner) -> None:
    mla = _json(runner, "--kind", "mla")["models"]
    assert {m["name"] for m in mla} == {
        "deepseek-ai/DeepSeek-R1",
        "deepseek-ai/DeepSeek-V2-Lite",
        "deepseek-ai/DeepSeek-V3",
        "moonshotai/Kimi-K2-Instruct",
    }
    assert all(m["family"] == "gemma2" for m in _json(runner, "--family", "gemma2")["models"])
    named = _json(runner, "qwen3-next")["models"]
    assert [m["name"] for m in named] == ["Qwen/Qwen3-Next-80B-A3B-Thinking"]
    # Qwen3-Next: 36 gated-DeltaNet layers of (8192*3 + 32*128*128) * 2 B constant state each.
    assert named[0]["state_bytes_per_request"] == 39_518_208


def test_models_table_and_no_match(runner) -> None:
    result = run_cli(runner, "models", "--kind", "mamba")
    assert result.exit_code == 0
    assert "Nemotron-H-56B" in result.stdout and "438.33 MiB" in result.stdout
    missing = run_cli(runner, "models", "no-such-model-anywhere")
    assert missing.exit_code == 2
    assert missing.stderr.startswith("Error: no library model matches the filters")


def test_weights_from_hub_reads_safetensors_headers(hub_env: HubEnv) -> None:
    tensors = {"model.embed_tokens.weight": ("BF16", [16, 8]), "model.layers.0.mlp.qweight": ("I32", [4, 8])}
    hub_env.hub.add_repo(
        "org/int4", {"config.json": {"model_type": "llama"}, "model.safetensors": safetensors_file(tensors)}
    )
    # BF16 16*8 = 128 values * 2 B = 256 B; I32 4*8 = 32 * 4 B = 128 B.
    assert fetch_safetensors_bytes("org/int4").total_bytes == 384
    entry = library.require("meta-llama/Llama-3.2-1B-Instruct")
    from kvplan.model.parse import parse_config

    model = parse_config(entry.read_config(), name=entry.repo_id, source=entry.filename)
    est = estimate_weights(model, dtype="bfloat16", override_bytes=384, override_source="the Hub's headers")
    assert est.total_bytes == 384 and est.source == "the Hub's headers"


def test_weights_from_hub_offline_is_a_one_line_error(hub_env: HubEnv) -> None:
    hub_env.set_offline()
    with pytest.raises(HubError) as caught:
        fetch_safetensors_bytes("org/anything")
    assert caught.value.reason == "offline" and "\n" not in caught.value.message
