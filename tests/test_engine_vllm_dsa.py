"""DeepSeek-V3.2's sparse attention on vLLM (kvplan/engines/vllm_dsa.py, engine-rules.md 1.25) and SGLang
(kvplan/engines/sglang.py, engine-rules.md 2.4).

No verbatim DeepSeek-V3.2 config.json is in the library: the tests take DeepSeek-V3's and add the three keys the
V3.2 checkpoint's config adds (index_head_dim 128, index_n_heads 64, index_topk 2048). The figures are vLLM's
own arithmetic, read in the 0.11-0.33 sdists; no held-out log of the model exists to check them against.
"""

from __future__ import annotations

import json

import pytest

from kvplan.capacity.deployment import Deployment, Parallelism, Workload
from kvplan.engines.sglang import SglangOptions, plan_sglang
from kvplan.engines.vllm import VllmFlags, plan_vllm, resolve_flags
from kvplan.engines.vllm_dsa import dsa_buffer_bytes, dsa_storage, dsa_token_bytes
from kvplan.engines.vllm_versions import rules_for
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.model.parse import parse_config
from kvplan.sources import library
from tests.conftest import run_cli

V32_KEYS = {"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"], "index_head_dim": 128,
            "index_n_heads": 64, "index_topk": 2048}
V32_CONFIG = library.require("deepseek-ai/DeepSeek-V3").read_config() | V32_KEYS
V32 = parse_config(V32_CONFIG, name="deepseek-ai/DeepSeek-V3.2", source="test")
H200, B200 = find_gpu("H200"), find_gpu("B200")


def test_the_indexer_sits_beside_the_latent() -> None:
    # Engine-neutral bf16: (512 + 64) x 2 + 128 x 2 = 1,408 B a token a layer.
    from kvplan.model.dtypes import BFLOAT16

    assert V32.layers[0].kv_bytes_per_token(BFLOAT16) == 1_408
    # Its weights, replicated over TP: wq_b [8,192, 1,536] and wk [128, 7,168] in fp8, weights_proj [64, 7,168]
    # in bf16, the key's LayerNorm (weight and bias) in float32: 12,582,912 + 917,504 + 458,752 + 256 =
    # 13,959,424 parameters a layer beyond DeepSeek-V3's, 851,524,864 over 61 layers.
    v3 = library.require("deepseek-ai/DeepSeek-V3")
    v3_params = parse_config(v3.read_config(), name="v3", source="test").num_params
    assert V32.num_params - v3_params == 851_524_864


@pytest.mark.parametrize(("release", "gpu", "kv", "storage", "block_bytes"), [
    # fp8_ds_mla (FlashMLA-sparse): 512 fp8 + 4 x 4 B scales + 64 x 2 B rotary = 656 B, and the indexer key
    # 128 + 4 = 132 B: 64 tokens x 788 B x 61 layers = 3,076,352 B a block.
    ("0.19.0", "H200", "fp8", "fp8_ds_mla", 3_076_352),
    # auto is the model dtype from 0.11.1: (576 x 2 + 132) x 64 x 61 = 5,012,736 B.
    ("0.19.0", "H200", "auto", "bfloat16", 5_012_736),
    # 0.11.0 forces auto to fp8_ds_mla.
    ("0.11.0", "H200", "auto", "fp8_ds_mla", 3_076_352),
    # SM100 runs an fp8 cache on FlashInfer-sparse from 0.19 (0.18: 16 heads a rank or fewer, here 128 / 8):
    # plain fp8, (576 + 132) x 64 x 61 = 2,764,032 B.
    ("0.19.0", "B200", "fp8", "fp8", 2_764_032),
    ("0.18.0", "B200", "fp8", "fp8", 2_764_032),
    ("0.17.0", "B200", "fp8", "fp8_ds_mla", 3_076_352),
])
def test_how_the_latent_is_stored(release: str, gpu: str, kv: str, storage: str, block_bytes: int) -> None:
    plan = plan_vllm(V32, VllmFlags(version=release, tensor_parallel_size=8, max_model_len=32_768,
                                    kv_cache_dtype=kv), find_gpu(gpu))
    assert plan.flags.dsa_storage == storage and plan.flags.block_size == 64
    layout = plan.stages[0].layout
    assert layout.bytes_per_block == block_bytes and len(layout.groups) == 1
    assert plan.blocks_per_request == 32_768 // 64  # one group: cdiv(L, 64) blocks


def test_on_0_18_flashinfer_sparse_takes_fp8_only_at_16_heads_a_rank_or_fewer() -> None:
    rules = rules_for("0.18.0")
    assert dsa_storage(V32, rules, kv_name="fp8", dtype="bfloat16", gpu_key="B200", tp=4) == "fp8_ds_mla"
    assert dsa_storage(V32, rules, kv_name="fp8", dtype="bfloat16", gpu_key="B200", tp=8) == "fp8"
    assert dsa_token_bytes(V32, "fp8") == 576 + 132


def test_buffers_vllm_builds_for_the_indexer() -> None:
    # At 8,192 tokens a step and 32,768 tokens: the shared top-k indices 8,192 x 2,048 x 4 = 67,108,864 B; from
    # 0.17 the expanded block table 8,192 x 512 x 4 = 16,777,216 B; from 0.30 each layer's index group, (min(8,192,
    # 256 x 1) + 1) x 2,049 x 4 = 2,106,372 B, x 61 = 128,488,692 B.
    args = {"max_num_batched_tokens": 8_192, "max_model_len": 32_768, "max_num_seqs": 256, "decode_tokens": 1,
            "layers": 61}
    assert dsa_buffer_bytes(V32, rules_for("0.16.0"), **args) == 67_108_864
    assert dsa_buffer_bytes(V32, rules_for("0.17.0"), **args) == 67_108_864 + 16_777_216
    assert dsa_buffer_bytes(V32, rules_for("0.30.0"), **args) == 67_108_864 + 16_777_216 + 128_488_692


def test_the_release_gpu_and_block_size_vllm_takes() -> None:
    with pytest.raises(FieldError, match="first in 0.11.0"):
        resolve_flags(V32, VllmFlags(version="0.10.2", tensor_parallel_size=8), H200)
    with pytest.raises(FieldError, match="not SM80") as err:
        resolve_flags(V32, VllmFlags(version="0.19.0", tensor_parallel_size=8), find_gpu("A100-80GB"))
    assert err.value.field == "gpu"
    with pytest.raises(FieldError, match="ROCm"):
        resolve_flags(V32, VllmFlags(version="0.19.0", tensor_parallel_size=8), find_gpu("MI300X"))
    # To 0.17 the platform forces 64 over --block-size; from 0.18 a given size must be one the indexer takes.
    assert resolve_flags(V32, VllmFlags(version="0.17.0", tensor_parallel_size=8, block_size=16), H200).block_size == 64
    with pytest.raises(FieldError, match="only 64-token blocks"):
        resolve_flags(V32, VllmFlags(version="0.18.0", tensor_parallel_size=8, block_size=16), H200)


def test_tensorrt_llm_says_it_has_no_model_of_it(runner, tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(V32_CONFIG))
    result = run_cli(runner, "estimate", str(path), "--gpu", "H200", "--tp", "8", "--engine", "trtllm")
    assert result.exit_code == 2 and "for vLLM, SGLang and Transformers only" in result.stderr, result.output


def _sglang(gpu: str, version: str = "current", kv: str = "auto"):
    d = Deployment(model=V32, gpu=find_gpu(gpu), engine=SglangOptions(version=version),
                   workload=Workload(max_model_len=65_536), parallelism=Parallelism(tp=8), kv_cache_dtype=kv)
    return plan_sglang(d)


def test_sglang_counts_the_latent_and_the_indexer_key_in_its_cell() -> None:
    # pool_configurator.py: (512 + 64) x the cache dtype's element size + 128 + 4 B of indexer key, a layer. On
    # an H200 auto is bf16: 61 x (1,152 + 132) = 78,324 B a token; on a B200 from 0.5.4.post2 auto is fp8:
    # 61 x (576 + 132) = 43,188 B (its pool stores 656 B latents, 80 B more than the cell counts). Pages of 64.
    h200 = _sglang("H200")
    assert h200.cell_size_bytes == 78_324 and h200.page_size == 64
    assert _sglang("B200").cell_size_bytes == 43_188
    assert _sglang("B200", version="0.5.3").cell_size_bytes == 78_324  # auto stays bf16 on 0.5.3
    with pytest.raises(FieldError, match="first in 0.5.3"):
        _sglang("H200", version="0.5.1")
    with pytest.raises(FieldError, match="bfloat16 or fp8_e4m3"):
        _sglang("H200", kv="fp8_e5m2")


def test_the_plan_says_what_a_token_costs(runner, tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(V32_CONFIG))
    result = run_cli(runner, "estimate", str(path), "--gpu", "H200", "--tp", "8", "--kv-cache-dtype", "fp8")
    # 656 B of fp8_ds_mla latent and 132 B of indexer key.
    assert "stored as fp8_ds_mla (656 B): 788 B a token" in " ".join(result.stdout.split()), result.output
    # To 0.17 vLLM forces 64-token blocks over a given size, and the plan says the given one is not used.
    result = run_cli(runner, "estimate", str(path), "--gpu", "H200", "--tp", "8", "--vllm-version", "0.17.0",
                     "--block-size", "16")
    assert "the given block size 16 is not used" in " ".join(result.stdout.split()), result.output
