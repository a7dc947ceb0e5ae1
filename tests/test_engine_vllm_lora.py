"""vLLM's LoRA slots (kvplan/engines/vllm_lora.py), pinned to hand-derived shapes and to a logged weights figure."""

from __future__ import annotations

import pytest

from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_lora import LoraSlots, lora_slot_bytes
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli, run_json


def _model(name: str):
    return resolve_model(name, offline=True).model


def test_llama_32_3b_rank_64_slot_bytes():
    # Llama-3.2-3B: H 3,072, I 8,192, 28 layers, 24 x 128 query and 8 x 128 KV widths, tied, V 128,256.
    # Per layer, r = 64: qkv A 3 x 64 x 3,072 + B 64 x (3,072 + 2 x 1,024) = 589,824 + 327,680; o A 64 x 3,072
    # + B 3,072 x 64 = 393,216; gate_up A 2 x 64 x 3,072 + B 64 x 16,384 = 1,441,792; down A 64 x 8,192 + B
    # 3,072 x 64 = 720,896: 3,473,408 values. Embedding (V + 256) x 64 + 3,072 x 64 + 256 x 3,072 = 9,207,808;
    # head 64 x 3,072 + 128,512 x 64 + 256 x 3,072 = 9,207,808; base rows 256 x 3,072 once (tied head).
    m = _model("meta-llama/Llama-3.2-3B-Instruct")
    per_slot = 28 * 3_473_408 + 2 * 9_207_808
    expected = (per_slot + 256 * 3072) * 2
    got = lora_slot_bytes(m, LoraSlots(1, 64), layers=range(28), tp=1, elem=2, first=True, last=True,
                          extra_vocab=256)
    assert got == expected == 232_914_944


def test_slots_scale_with_max_loras_and_split_over_tp():
    m = _model("meta-llama/Llama-3.1-8B-Instruct")
    one = lora_slot_bytes(m, LoraSlots(1, 16), layers=range(32), tp=1, elem=2, first=False, last=False,
                          extra_vocab=0)
    four = lora_slot_bytes(m, LoraSlots(4, 16), layers=range(32), tp=1, elem=2, first=False, last=False,
                           extra_vocab=0)
    assert four == 4 * one
    # At tp 2 the B of column layers and the A of row layers halve; the rest stays: strictly between.
    two = lora_slot_bytes(m, LoraSlots(1, 16), layers=range(32), tp=2, elem=2, first=False, last=False,
                          extra_vocab=0)
    assert one // 2 < two < one
    # --fully-sharded-loras also splits the column layers' A (q/k/v and gate/up: 5 stacks of r x H per layer).
    sharded = lora_slot_bytes(m, LoraSlots(1, 16, fully_sharded=True), layers=range(32), tp=2, elem=2,
                              first=False, last=False, extra_vocab=0)
    assert two - sharded == 32 * 5 * 8 * 4096 * 2


def test_plan_counts_slots_as_weights_and_shrinks_kv():
    m, gpu = _model("meta-llama/Llama-3.1-8B-Instruct"), find_gpu("H100")
    base = plan_vllm(m, VllmFlags(max_model_len=8192, version="0.19"), gpu)
    lora = plan_vllm(m, VllmFlags(max_model_len=8192, version="0.19", lora=LoraSlots(4, 64)), gpu)
    slots = lora.stages[0].memory.lora_bytes
    # 4 slots x (32 x 5,242,880 + 2 x 8,470,528 values) x 2 B: 0.12+ keeps no extra vocabulary at 0.19.
    assert slots == 4 * (32 * 5_242_880 + 2 * (128_256 * 64 + 4096 * 64)) * 2
    assert lora.stages[0].memory.weights_bytes - base.stages[0].memory.weights_bytes == slots
    assert base.stages[0].available_kv_bytes - lora.stages[0].available_kv_bytes == slots
    assert round(slots / GiB, 3) == 1.376


def test_rank_outside_vllms_list_is_refused():
    with pytest.raises(FieldError, match="engine.max_lora_rank"):
        LoraSlots(1, 63).validate()


def test_mla_models_are_refused_not_guessed():
    m = _model("deepseek-ai/DeepSeek-V2-Lite")
    with pytest.raises(FieldError, match="standard attention"):
        lora_slot_bytes(m, LoraSlots(), layers=range(m.num_layers), tp=1, elem=2, first=True, last=True,
                        extra_vocab=0)


def test_estimate_flags_plan_the_slots_and_refuse_a_bad_rank(runner):
    args = ("estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192", "--gpu", "H100",
            "--vllm-version", "0.19", "--offline")
    data = run_json(runner, *args, "--max-loras", "4", "--max-lora-rank", "64")
    assert data["request"]["engine_options"]["lora"] == {"max_loras": 4, "max_lora_rank": 64, "fully_sharded": False}
    plain = run_json(runner, *args)
    gained = plain["available_kv_cache_bytes"] - data["available_kv_cache_bytes"]
    assert gained == 4 * (32 * 5_242_880 + 2 * (128_256 * 64 + 4096 * 64)) * 2  # the slots of the test above
    bad = run_cli(runner, *args, "--max-lora-rank", "63")
    assert bad.exit_code == 2 and "--max-lora-rank 63: must be one of 1, 8, 16" in bad.output
    none = run_cli(runner, *args, "--max-loras", "0")
    assert none.exit_code == 2 and "--max-loras 0: must be from 1 to 1024" in none.output
    other = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--offline",
                    "--engine", "sglang", "--max-loras", "2")
    assert other.exit_code == 2 and "--max-loras is an option of --engine vllm" in other.output
