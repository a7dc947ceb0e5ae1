"""DeepSeek-V4's caches as vLLM lays them out (kvplan/engines/vllm_dsv4.py, engine-rules.md 1.24).

The figures are vLLM's own arithmetic, read in the 0.20-0.33 sdists; the one real start-up they are checked
against, vllm-project/vllm#44376, is a held-out log (benchmarks/logs/vllm.jsonl) and is reproduced here from the
source's rules, not fitted.
"""

from __future__ import annotations

import pytest

from kvplan.engines.transformers import hf_cache_bytes
from kvplan.engines.vllm import VllmFlags, plan_vllm, resolve_flags
from kvplan.engines.vllm_dsv4 import (
    approximate_gcd,
    dsv4_buffer_bytes,
    dsv4_forward_bytes,
    dsv4_layout,
    layer_caches,
)
from kvplan.engines.vllm_memory import rotary_cache_bytes
from kvplan.engines.vllm_versions import rules_for
from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.verify.setup import VerifyRequest, prepare
from tests.conftest import run_cli

FLASH = resolve_model("deepseek-ai/DeepSeek-V4-Flash", offline=True).model
GH200 = find_gpu("GH200-96GB")


def test_the_pages_each_layer_registers() -> None:
    # A latent in fp8_ds_mla: 448 fp8 values, 64 rotated values in bf16, 448 / 64 = 7 scale bytes and a pad byte
    # = 584 B; every page is padded to 576 B. Window: 64 x 584 = 37,376 -> 37,440. Ratio 4: 64 compressed
    # entries a 256-token block (37,440), indexer keys of 128 + 4 B (64 x 132 = 8,448 -> 8,640), compressor state
    # 4 rows of 2 x 2 x 512 float32 (32,768 -> 32,832) and the indexer compressor's 4 x 2 x 2 x 128 x 4 = 8,192
    # -> 8,640. Ratio 128: 2 entries (1,168 -> 1,728), state 8 rows of 2 x 512 float32 (32,768 -> 32,832).
    window, four, one_28 = FLASH.layers[0], FLASH.layers[2], FLASH.layers[3]
    assert layer_caches(window) == [("swa", 64, 128, 37_440)]
    assert layer_caches(four) == [("swa", 64, 128, 37_440), ("mla", 256, 0, 37_440), ("state4", 4, 8, 32_832),
                                  ("mla", 256, 0, 8_640), ("state4", 4, 8, 8_640)]
    assert layer_caches(one_28) == [("swa", 64, 128, 37_440), ("mla", 256, 0, 1_728), ("state128", 8, 128, 32_832)]


def test_layer_tuples_pad_the_groups_least() -> None:
    # Flash's groups hold 21 (indexer keys, ratio-4 latents), 43 (windows), 21 and 20 layers of their commonest
    # page: d = 21 pads 0 + 20 + 0 + 1 = 21, d = 22 pads 1 + 1 + 1 + 2 = 5, larger d more.
    assert approximate_gcd([21, 43, 21, 20], lower_bound=21) == 22


@pytest.mark.parametrize(("release", "pool", "check", "weighted"), [
    # 0.20-0.22: 22 layer tuples x (8,640 + 37,440 + 1,728) = 1,051,776 for both.
    ("0.22.0", 1_051_776, 1_051_776, True),
    # 0.23-0.26: each page size x its most layers in one group: 8,640 x 21 + 37,440 x 22 + 1,728 x 20.
    ("0.23.0", 1_039_680, 1_051_776, True),
    # 0.27: the largest group, the full-MLA one: 21 x 8,640 + 21 x 37,440 + 20 x 1,728 = 1,002,240.
    ("0.27.0", 1_002_240, 1_051_776, False),
    # 0.29: the check charges the pool's stride too.
    ("0.29.0", 1_002_240, 1_002_240, False),
])
def test_what_a_block_costs_per_release(release: str, pool: int, check: int, weighted: bool) -> None:
    layout = dsv4_layout(FLASH.layers, rules_for(release))
    assert (layout.bytes_per_block, layout.check_bytes_per_block, layout.weighted_concurrency) == (pool, check,
                                                                                                  weighted)
    # Five groups: the full-MLA one (62 layers), the 43 windows split 22 + 21, the ratio-4 states (21 + 21), the
    # ratio-128 states (20).
    assert [(g.layers, g.block_size, g.window_tokens) for g in layout.groups] == [
        (62, 256, 0), (22, 64, 128), (21, 64, 128), (42, 4, 8), (20, 8, 128)]


def test_deepseek_v4_pro_groups_and_block_costs() -> None:
    # Pro: 30 ratio-4 and 31 ratio-128 layers, no window-only one. Its full-MLA group holds 30 + 30 + 31 = 91 pages
    # (commonest count 31), the 61 windows 61, the ratio-4 states 60 (30 + 30), the ratio-128 states 31: 31 layer
    # tuples pad least (2), so the windows split 31 + 30. One tuple: 8,640 + 37,440 + 1,728 = 47,808 B; x 31 =
    # 1,482,048 B a block on 0.22. The largest group from 0.27: 30 x 8,640 + 30 x 37,440 + 31 x 1,728 =
    # 1,435,968 B. At 30,000 tokens and 16,384-token steps a request takes 6,800 blocks, as Flash's.
    pro = resolve_model("deepseek-ai/DeepSeek-V4-Pro", offline=True).model
    old = dsv4_layout(pro.layers, rules_for("0.22.0"))
    assert [(g.layers, g.block_size) for g in old.groups] == [(91, 256), (31, 64), (30, 64), (31, 8), (60, 4)]
    assert old.bytes_per_block == old.check_bytes_per_block == 1_482_048
    assert old.blocks_per_request(30_000, 16_384) * old.check_bytes_per_block == 10_077_926_400
    new = dsv4_layout(pro.layers, rules_for("0.29.0"))
    assert new.bytes_per_block == new.check_bytes_per_block == 1_435_968


def test_vllm_44376_one_request_check_is_reproduced() -> None:
    # vllm#44376: DeepSeek-V4-Flash, 2 x GH200 at tp 2, LLM() (16,384-token steps on a card of 70 GiB or more),
    # 30,000 tokens, fp8 KV, block 256, release about 0.22; vLLM printed 6.66 GiB needed, 5.44 GiB available,
    # 13528 tokens at most. Blocks a request: cdiv(30,000, 256) = 118 of latents, 2 x (cdiv(127 + 16,384, 64) + 1)
    # = 2 x 259 of windows, cdiv(7 + 16,384, 4) + 1 = 4,099 and cdiv(127 + 16,384, 8) + 1 = 2,065 of state:
    # 6,800 x 1,051,776 = 7,152,076,800 B = 6.66 GiB. At 13,528 tokens: 53 + 2 x 213 + 3,383 + 1,692 = 5,554
    # blocks = 5,841,563,904 B, the smallest memory that prints 5.44 GiB and gives 13528 (13,529 needs 5,556).
    flags = VllmFlags(version="0.22.0", tensor_parallel_size=2, max_model_len=30_000, kv_cache_dtype="fp8",
                      block_size=256, usage="llm", kv_cache_memory_bytes=5_841_563_904)
    plan = plan_vllm(FLASH, flags, GH200)
    assert plan.flags.max_num_batched_tokens == 16_384
    assert plan.blocks_per_request == 6_800
    assert plan.refusal is not None and plan.refusal.code == "one_request"
    assert "(6.66 GiB KV cache is needed" in plan.refusal.message
    assert "available KV cache memory (5.44 GiB)" in plan.refusal.message
    assert "estimated maximum model length is 13528." in plan.refusal.message
    # The pool takes 5,841,563,904 // 1,051,776 = 5,554 blocks; vLLM 0.22 divides them by the page-weighted
    # blocks a request of 13,528 tokens holds: cdiv(53 x 1,002,240 + 213 x 823,680 + 213 x 786,240 + 3,383 x
    # 967,680 + 1,692 x 748,800, 1,002,240) = 4,926.
    fits = plan_vllm(FLASH, VllmFlags(version="0.22.0", tensor_parallel_size=2, max_model_len=13_528,
                                      kv_cache_dtype="fp8", usage="llm", kv_cache_memory_bytes=5_841_563_904), GH200)
    assert fits.refusal is None and fits.num_blocks == 5_554
    assert fits.max_concurrency == pytest.approx(5_554 / 4_926)


def test_the_cache_dtype_block_size_and_release_vllm_takes() -> None:
    with pytest.raises(FieldError, match="first in 0.20.0"):
        resolve_flags(FLASH, VllmFlags(version="0.19.1", kv_cache_dtype="fp8"), GH200)
    with pytest.raises(FieldError, match="takes only an fp8 KV cache") as err:
        resolve_flags(FLASH, VllmFlags(version="0.29.0"), GH200)  # auto: the attention layer asserts fp8
    assert err.value.field == "engine.kv_cache_dtype"
    assert resolve_flags(FLASH, VllmFlags(version="0.30.0"), GH200).kv_cache_dtype.name.startswith("fp8")
    with pytest.raises(FieldError, match="only 256-token blocks") as err:
        resolve_flags(FLASH, VllmFlags(version="0.30.0", block_size=64), GH200)
    assert err.value.field == "engine.block_size"
    assert resolve_flags(FLASH, VllmFlags(version="0.30.0"), GH200).block_size == 256
    # FlashMLA's sparse kernels need SM90/SM100; an RTX PRO 6000 (SM120) runs it from 0.24 through FlashInfer.
    with pytest.raises(FieldError, match="not SM80") as err:
        resolve_flags(FLASH, VllmFlags(version="0.30.0"), find_gpu("A100-80GB"))
    assert err.value.field == "gpu"
    with pytest.raises(FieldError, match="SM120 from 0.24"):
        resolve_flags(FLASH, VllmFlags(version="0.23.0", kv_cache_dtype="fp8"), find_gpu("RTX-PRO-6000"))
    assert resolve_flags(FLASH, VllmFlags(version="0.24.0", kv_cache_dtype="fp8"), find_gpu("RTX-PRO-6000"))


def test_the_profiling_forward_peaks_where_q_is_padded_to_flashmla_heads() -> None:
    # Flash at tp 2 (32 heads a rank, padded to 64) in bf16, a token each: residual 4 x 4,096 x 2 = 32,768; mixing
    # coefficients (4 + 16) x 4 = 80; layer input 8,192; output buffer and padded q 2 x 64 x 512 x 2 = 131,072;
    # q 32 x 512 x 2 = 32,768; q/kv down-projection and its normed copy 2 x (1,024 + 512) x 2 = 6,144; the
    # ratio-4 compressor's scores 2 x 2 x 512 x 4 = 8,192, the indexer's weights 64 x 2 = 128 and its compressor's
    # 2 x 2 x 128 x 4 = 2,048: 221,392 B. At 16,384 tokens: 3,627,286,528 B.
    assert dsv4_forward_bytes(FLASH, tp=2, tokens=16_384, dtype_bytes=2) == 3_627_286_528
    # With the Marlin experts' kept scratch, 16,384 x 6 x (4,096 + 4,096) x 2 B = 1,610,612,736, the profiled peak
    # is 5,237,899,264 B (the sampler's 1,024 rows stay below it).
    flags = VllmFlags(version="0.22.0", tensor_parallel_size=2, max_model_len=30_000, kv_cache_dtype="fp8",
                      usage="llm", compile_cache="warm")
    plan = plan_vllm(FLASH, flags, GH200)
    assert plan.stages[0].memory.activation_peak_bytes == 3_627_286_528 + 1_610_612_736


def test_buffers_vllm_builds_with_the_model() -> None:
    # Two float32 RoPE caches (rope_theta and compress_rope_theta): 2 x 1,048,576 x 64 x 4 B = 536,870,912 B.
    assert rotary_cache_bytes(FLASH, 2) == 536_870_912
    # At 16,384 tokens: top-k indices 16,384 x 512 x 4 B = 33,554,432 on every rank; the MTP hidden buffer
    # 16,384 x 4 x 4,096 x 2 B = 536,870,912 on the last, built without a draft until 0.26.
    assert dsv4_buffer_bytes(FLASH, rules_for("0.26.0"), max_num_batched_tokens=16_384) == (33_554_432, 536_870_912)
    assert dsv4_buffer_bytes(FLASH, rules_for("0.27.0"), max_num_batched_tokens=16_384) == (33_554_432, 0)
    # From 0.27 it is built only for a draft that reads it (nvidia/model.py: use_eagle() or uses_draft_model()).
    assert dsv4_buffer_bytes(FLASH, rules_for("0.27.0"), max_num_batched_tokens=16_384, draft=True) == (
        33_554_432, 536_870_912)


def test_the_mtp_block() -> None:
    # vLLM's DeepSeekV4MTP (models/deepseek_v4/nvidia/mtp.py, 0.22-0.33): layer 43, past num_hidden_layers, so
    # compress ratio 1 (no compressor, no indexer) and a learned router. Parameters: fused_wqa_wkv 1,536 x
    # 4,096 = 6,291,456; norms (q 1,024, kv 512, attn/ffn 2 x 4,096, enorm/hnorm/shared_head 3 x 4,096) 22,016;
    # wq_b + wo_a + wo_b 3 x 33,554,432; 64 sinks; hyper-connections 2 x (24 x 16,384 + 27) + hc_head 4 x
    # 16,384 + 5 = 852,027; router 1,048,576 and its bias 256; shared expert 25,165,824; 256 experts x
    # 25,165,824 = 6,442,450,944; e_proj + h_proj 2 x 4,096^2 = 33,554,432: 6,610,048,891 in all.
    mtp = FLASH.mtp
    assert mtp is not None and sum(g.params for g in mtp.param_groups) == 6_610_048_891
    assert [(spec.compress_ratio, spec.index_head_dim) for spec in mtp.layers] == [(1, 0)]
    # Per GPU at tp 2, tensor by tensor from the 0.25 source: 1,819,593,324 B with e8m0 block scales and the sink
    # padded to 64 heads; kvplan keeps float32 block scales (the 8 fp8 linears' 6,272 blocks a rank x 3 B more:
    # +18,816 B) and 32 sinks a rank (-128 B): 1,819,612,012 B, as the azallaza log's 75.64 GiB "Model loading
    # took" holds it (75.58 planned). The window layer joins the second window group
    # (22 + 22 layers, not 22 + 21): the pool's 1,039,680 B a block and a 1M-token request's 5,786 blocks stay.
    base = dict(version="0.25.0", tensor_parallel_size=2, max_model_len=1_048_576, kv_cache_dtype="fp8",
                max_num_seqs=64, max_num_batched_tokens=4096)
    pro6000 = find_gpu("RTX-PRO-6000")
    plain = plan_vllm(FLASH, VllmFlags(**base), pro6000)
    drafted = plan_vllm(FLASH, VllmFlags(**base, speculative_method="mtp", num_speculative_tokens=2), pro6000)
    assert drafted.stages[0].memory.weights_bytes - plain.stages[0].memory.weights_bytes == 1_819_612_012
    layout = drafted.stages[0].layout
    assert [g.layers for g in layout.groups if g.kind == "sliding_window"][:2] == [22, 22]
    assert layout.pool_block_bytes == plain.stages[0].layout.pool_block_bytes == 1_039_680
    assert drafted.blocks_per_request == plain.blocks_per_request == 5_786


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_engines_without_a_model_of_it_say_so(runner, engine: str) -> None:
    result = run_cli(runner, "estimate", "deepseek-ai/DeepSeek-V4-Flash", "--gpu", "GH200-96GB", "--tp", "2",
                     "--engine", engine)
    assert result.exit_code == 2 and "for vLLM and Transformers only" in result.stderr, result.output


def test_transformers_dynamic_cache_of_it() -> None:
    # Transformers 5.24 (modeling_deepseek_v4.py), one request of 5,000 tokens in bf16. The 2 window-only layers
    # keep K and V apart: 2 x 127 x 512 x 2 B = 260,096 each. A ratio-4 layer aliases V to K (127 x 512 x 2 =
    # 130,048), keeps 1,250 entries of its compressor (512 wide) and indexer (128): 1,600,000, no pending tokens
    # (5,000 = 1,250 x 4), and the last window's slice, kv in bf16 and gate in float32: 4 x 640 x 6 = 15,360;
    # 1,745,408 each. A ratio-128 layer: 130,048 + 39 x 512 x 2 + the 8 pending tokens' kv and gate 2 x 8 x 512
    # x 2 = 186,368. 2 x 260,096 + 21 x 1,745,408 + 20 x 186,368 = 40,901,120 B. tests/test_engine_transformers_
    # real.py checks the same rule against the cache Transformers builds.
    assert hf_cache_bytes(FLASH, seq_tokens=5_000, batch=1, dtype="bfloat16").total_bytes == 40_901_120
    with pytest.raises(FieldError, match="DynamicCache only"):
        hf_cache_bytes(FLASH, seq_tokens=5_000, batch=1, dtype="bfloat16", cache="static")


def test_verify_refuses_it_before_allocating() -> None:
    with pytest.raises(InputError, match="does not build DeepSeek-V4"):
        prepare(VerifyRequest(model="deepseek-ai/DeepSeek-V4-Flash", offline=True))


def test_what_vllm_refuses_comes_with_its_fix(runner, tmp_path) -> None:
    # auto before 0.30: V4's attention asserts an fp8 cache; the fix is fp8.
    result = run_cli(runner, "estimate", "deepseek-ai/DeepSeek-V4-Flash", "--gpu", "H200", "--tp", "2",
                     "--vllm-version", "0.22", "--seq", "65536")
    assert result.exit_code == 1, result.output
    assert "takes only an fp8 KV cache" in result.stdout and "Best fix: --kv-cache-dtype fp8" in result.stdout
    # A 64-token block: its kernels take only 256; the fix drops the flag (the default is 256).
    deploy = tmp_path / "dsv4.yaml"
    deploy.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: dsv4\nspec:\n  template:\n    spec:\n"
        "      nodeSelector:\n        cloud.google.com/gke-accelerator: nvidia-h200-141gb\n"
        "      containers:\n        - name: vllm\n          image: vllm/vllm-openai:v0.22.0\n"
        '          command: ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash"]\n'
        '          args: ["--tensor-parallel-size", "2", "--max-model-len", "65536", "--kv-cache-dtype", "fp8",'
        ' "--block-size", "64"]\n'
        "          resources:\n            limits:\n              nvidia.com/gpu: 2\n")
    result = run_cli(runner, "check", str(deploy), "--offline")
    assert result.exit_code == 1, result.output
    assert "No common block size" in result.stdout and "drop --block-size (fits on 2 GPUs" in result.stdout
