"""--tp 2 on the CPU: two gloo ranks, each allocating and measuring its own shard; rank 0 reports both."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import run_cli  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_tp2_on_cpu_shows_each_ranks_shard(runner):
    # Llama-3.2-1B's 8 KV heads over 2 ranks = 4 per rank: 4 x 128 x 2 B = 1,024 B per token per layer; 20 tokens
    # -> 32 paged tokens -> 32,768 B x 16 layers = 524,288 B per rank for one request.
    result = run_cli(runner, "verify", "meta-llama/Llama-3.2-1B-Instruct", "--seq", "20", "--steps", "2",
                     "--tp", "2", "--decode-layers", "1", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    for rank in data["ranks"]:
        assert rank["measured_bytes"] == rank["predicted_bytes"] == 524_288
        assert rank["check"]["passed"]
