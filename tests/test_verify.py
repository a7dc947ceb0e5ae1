"""kvplan verify end to end on the CPU: measured cache bytes equal the estimate, cached decode equals recomputation."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import run_cli  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

# Small runs: few tokens, 4 decode steps, and the arithmetic through the first layers only (the bytes check
# still covers every layer). Each case pins the predicted bytes with its derivation.
CASES = [
    pytest.param(
        # GQA: 8 KV heads x (64 + 64) x 2 B = 2,048 B per token per layer; paged 40 tokens in blocks of 16 =
        # 3 blocks = 48 tokens -> 98,304 B per layer per request; x 16 layers x 2 requests = 3,145,728.
        ["meta-llama/Llama-3.2-1B-Instruct", "--seq", "40", "--batch", "2", "--decode-layers", "2"],
        {"full_attention": 3_145_728},
        id="gqa-llama-3.2-1b-paged",
    ),
    pytest.param(
        # MQA: 1 KV head x (64 + 64) x 2 B = 256 B per token per layer; contiguous 40 tokens -> 10,240 B;
        # x 32 layers x 2 requests = 655,360.
        ["tiiuae/falcon-7b", "--seq", "40", "--batch", "2", "--layout", "contiguous", "--decode-layers", "2"],
        {"full_attention": 655_360},
        id="mqa-falcon-7b-contiguous",
    ),
    pytest.param(
        # MLA: one latent of 512 + 64 values x 2 B = 1,152 B per token per layer; paged 48 tokens -> 55,296 B;
        # x 27 layers x 2 requests = 2,985,984.
        ["deepseek-ai/DeepSeek-V2-Lite", "--seq", "40", "--batch", "2", "--decode-layers", "2"],
        {"mla": 2_985_984},
        id="mla-deepseek-v2-lite",
    ),
    pytest.param(
        # Sliding window 128 at seq 200, blocks of 16: min(cdiv(200, 16), cdiv(128, 16) + 1) = 9 blocks = 144
        # tokens x 8 heads x 128 x 2 B = 294,912 B per layer per request, x 12 layers x 2 = 7,077,888.
        # Full layers: 13 blocks = 208 tokens x 2,048 B = 425,984 x 12 x 2 = 10,223,616.
        ["openai/gpt-oss-20b", "--seq", "200", "--batch", "2", "--decode-layers", "2"],
        {"sliding_window": 7_077_888, "full_attention": 10_223_616},
        id="sliding-gpt-oss-20b",
    ),
    pytest.param(
        # Hybrid: 6 attention layers with 2 KV heads x 128 x 2 (K, V) x 2 B = 1,024 B/token, 48 paged tokens ->
        # 49,152 x 6 = 294,912. 23 Mamba2 layers: conv (6144, 3) bf16 = 36,864 + ssm (64, 64, 128) fp32 =
        # 2,097,152 -> 2,134,016 x 23 = 49,082,368. MLP/MoE layers: 0. Decode through layers 0-5 (mamba + attn).
        ["nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "--seq", "40", "--decode-layers", "6"],
        {"mamba": 49_082_368, "none": 0, "full_attention": 294_912},
        id="hybrid-nemotron-3-nano",
    ),
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_verify_measures_the_estimate_exactly(runner, args, expected):
    result = run_cli(runner, "verify", *args, "--steps", "4", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    (rank,) = data["ranks"]
    assert {k["kind"]: k["predicted_bytes"] for k in rank["kinds"]} == expected
    assert {k["kind"]: k["measured_bytes"] for k in rank["kinds"]} == expected
    assert data["passed"] is True
    check = rank["check"]
    assert check["outputs_match"] and check["growth_ok"] and check["visibility_ok"], check
    assert rank["decode"]["steps"] == 4 and rank["decode"]["kv_read_bytes_per_step"] > 0


def test_the_sliding_window_check_turns_the_ring(runner):
    """gpt-oss's 128-token window: the check runs 128 + 4 + 8 = 140 tokens, past the window."""
    data = json.loads(run_cli(runner, "verify", "openai/gpt-oss-20b", "--seq", "200", "--steps", "4",
                              "--layout", "contiguous", "--decode-layers", "1", "--device", "cpu", "--json").stdout)
    check = data["ranks"][0]["check"]
    assert check["seq_tokens"] == 140 and check["windows_wrapped"] and check["passed"]


@pytest.mark.parametrize(
    ("kv_dtype", "per_token"),
    [
        ("fp8", 8 * 2 * 64),  # 1 B per element, scales kept with the weights
        ("int8", 8 * 2 * (64 + 4)),  # + one fp32 scale per token-head vector
        ("int4", 8 * 2 * (32 + 4)),  # 64 values in 32 B + fp16 scale and zero point
        ("nvfp4", 8 * 2 * (32 + 4)),  # 64 values in 32 B + one fp8 scale per 16 values
    ],
)
def test_quantized_caches_store_codes_and_scales_exactly(runner, kv_dtype, per_token):
    # Llama-3.2-1B, 16 layers, seq 20 -> 2 blocks = 32 tokens, one request.
    result = run_cli(runner, "verify", "meta-llama/Llama-3.2-1B-Instruct", "--seq", "20", "--steps", "2",
                     "--kv-cache-dtype", kv_dtype, "--decode-layers", "1", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    kinds = json.loads(result.stdout)["ranks"][0]["kinds"]
    assert kinds[0]["measured_bytes"] == per_token * 32 * 16
    assert json.loads(result.stdout)["ranks"][0]["check"]["passed"]


def test_fraction_scales_the_batch_and_says_so(runner):
    # 8 requests x 0.25 = 2; Llama-3.2-1B at 20 tokens = 32 paged tokens x 2,048 B x 16 layers = 1,048,576 each.
    result = run_cli(runner, "verify", "meta-llama/Llama-3.2-1B-Instruct", "--seq", "20", "--batch", "8",
                     "--fraction", "0.25", "--steps", "2", "--decode-layers", "1", "--no-check", "--device", "cpu",
                     "--json")
    data = json.loads(result.stdout)
    assert data["request"]["batch"] == 2 and data["ranks"][0]["measured_bytes"] == 2 * 1_048_576
    assert "batch scaled from 8 to 2 requests" in result.stderr


def test_human_table_names_each_kind(runner):
    result = run_cli(runner, "verify", "openai/gpt-oss-20b", "--seq", "40", "--steps", "2", "--decode-layers", "1",
                     "--no-check", "--device", "cpu")
    assert result.exit_code == 0, result.output
    for word in ("sliding_window", "full_attention", "verified", "first 1 of 24 layers"):
        assert word in result.stdout
