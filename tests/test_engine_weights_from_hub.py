"""`estimate --weights-from-hub`: exact checkpoint bytes from safetensors headers on the (fake, local) Hub."""

from __future__ import annotations

import json

from tests.conftest import run_cli
from tests.conftest_hub import HubEnv
from tests.hub_server import safetensors_file

# A toy Llama: 2 layers, hidden 256, 4 heads of 64, MLP 512, vocab 1,024 (a multiple of vLLM's padding of 64),
# untied head, 2,048 positions, bf16. Parameters: embed and head 1,024 x 256 = 262,144 each; attention
# 2 x 4 x 256 x 256 = 524,288; MLP 2 x 3 x 256 x 512 = 786,432; norms 2 x 2 x 256 + 256 = 1,280;
# 1,836,288 in all = 3,672,576 B in bf16.
TINY = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024,
    "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
# The checkpoint the fake Hub serves: 2,000,000 bf16 values = 4,000,000 B (deliberately not the config's size,
# so a test can tell which figure was used).
HUB_BYTES = 4_000_000
ROTARY_BYTES = 2048 * 64 * 2  # vLLM's cos/sin cache: 2,048 positions x head_dim 64 x 2 B = 262,144 B


def _serve(hub_env: HubEnv) -> None:
    weights = safetensors_file({"model.weights": ("BF16", [HUB_BYTES // 2])})
    hub_env.hub.add_repo("org/tiny", {"config.json": json.dumps(TINY).encode(), "model.safetensors": weights})


def _estimate(runner, *args: str) -> dict:
    result = run_cli(runner, "estimate", "org/tiny", "--seq", "1024", "--gpu", "H100", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_vllm_weights_follow_the_safetensors_bytes(runner, hub_env: HubEnv) -> None:
    _serve(hub_env)
    data = _estimate(runner, "--weights-from-hub")
    assert data["weights"]["checkpoint_bytes"] == HUB_BYTES
    assert data["weights"]["source"] == "safetensors headers of org/tiny@main on the Hub (--weights-from-hub)"
    # One GPU: vLLM holds the checkpoint as it is plus its rotary cache: 4,000,000 + 262,144.
    assert data["gpus"][0]["engine_detail"]["stages"][0]["weights_bytes"] == HUB_BYTES + ROTARY_BYTES
    without = _estimate(runner)
    # The config-based figure: 3,672,576 B + 262,144 B.
    assert without["gpus"][0]["engine_detail"]["stages"][0]["weights_bytes"] == 3_672_576 + ROTARY_BYTES
    assert without["weights"]["source"] == "config (bfloat16)"


def test_tensor_parallel_split_keeps_the_modelled_shares(runner, hub_env: HubEnv) -> None:
    _serve(hub_env)
    data = _estimate(runner, "--weights-from-hub", "--tp", "2")
    # Modelled rank 0 at tp=2: half of the (padded) vocabulary rows of embed and head 2 x 262,144 B, half of the
    # linear layers 2,621,440 / 2 B, the replicated norms 2,560 B = 1,837,568 B of the 3,672,576 B checkpoint.
    # Scaled to the measured bytes: int(1,837,568 x 4,000,000 / 3,672,576) = 2,001,394, plus the rotary cache.
    assert data["gpus"][0]["engine_detail"]["stages"][0]["weights_bytes"] == 2_001_394 + ROTARY_BYTES


def test_human_output_names_the_source(runner, hub_env: HubEnv) -> None:
    _serve(hub_env)
    result = run_cli(runner, "estimate", "org/tiny", "--seq", "1024", "--gpu", "H100", "--weights-from-hub",
                     "--tp", "2")
    text = " ".join(result.stdout.split())
    assert "safetensors headers of org/tiny@main on the Hub (--weights-from-hub)" in text
    assert "split over ranks as kvplan's parameter groups split (approximate)" in text


def test_generic_engine_uses_the_measured_bytes(runner, hub_env: HubEnv) -> None:
    _serve(hub_env)
    data = _estimate(runner, "--weights-from-hub", "--engine", "generic")
    assert {t["name"]: t["bytes"] for t in data["gpus"][0]["terms"]}["weights"] == HUB_BYTES


def test_conflicting_flags_are_one_line_errors(runner, hub_env: HubEnv, tmp_path) -> None:
    _serve(hub_env)
    both = run_cli(runner, "estimate", "org/tiny", "--weights-from-hub", "--weights-bytes", "4GiB", "--seq", "8")
    assert both.exit_code == 2
    assert both.stderr.strip() == (
        "Error: --weights-from-hub: give either the checkpoint size or read it from the Hub, not both"
    )
    local = tmp_path / "config.json"
    local.write_text(json.dumps(TINY))
    from_path = run_cli(runner, "estimate", str(local), "--weights-from-hub", "--seq", "8")
    assert from_path.exit_code == 2 and "needs a Hub repo id" in from_path.stderr
    offline = run_cli(runner, "estimate", "org/tiny", "--weights-from-hub", "--offline", "--seq", "8")
    assert offline.exit_code == 2 and "--weights-from-hub: reads the Hub; drop offline" in offline.stderr
