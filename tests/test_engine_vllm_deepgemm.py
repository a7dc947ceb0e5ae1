"""DeepGEMM's MoE scratch: rows padded per expert (kvplan/engines/vllm_deepgemm.py, engine-rules.md 1.5).

The shapes are DeepGemmExperts' and DeepGemmFP4Experts' workspace_shapes and compute_aligned_M(_and_alignment)
in the 0.11-0.33 sdists, the block from the DeepGEMM build each release pins (a6b593d from 0.25); which models
run there per release, GPU and install is read from the FP8 and MXFP4 MoE oracles.
"""

from __future__ import annotations

import pytest

from kvplan.engines.vllm import VllmFlags, deepgemm_scratch, plan_vllm, resolve_flags
from kvplan.engines.vllm_deepgemm import (
    ROW_RULES,
    WIDTHS,
    DeepGemmScratch,
    aligned_rows,
    block_m,
    deepgemm_workspace_bytes,
)
from kvplan.engines.vllm_memory import NO_SPLIT, WeightSplit
from kvplan.engines.vllm_versions import RULES
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from tests.conftest import run_cli

FLASH = resolve_model("deepseek-ai/DeepSeek-V4-Flash", offline=True).model
QWEN_FP8 = resolve_model("Qwen/Qwen3-30B-A3B-FP8", offline=True).model  # block-FP8, 128 experts, top-8, I 768
H100, B200, PRO = find_gpu("H100"), find_gpu("B200"), find_gpu("RTX-PRO-6000")


def test_every_release_names_a_rule_the_module_has() -> None:
    assert {r.deepgemm_rows for r in RULES} <= set(ROW_RULES)
    assert {r.deepgemm_widths for r in RULES} <= set(WIDTHS)


def test_the_block_an_expert_share_picks() -> None:
    # 0.25+ on SM12x: 128, stepped down by 64 while the smaller block still covers an expert's share.
    # 4,096 tokens x top-6 over 256 experts = 96 rows each -> 128; 2,048 tokens -> 48 each -> 64.
    assert block_m("sm120", 24_576, 256) == 128 and block_m("sm120", 12_288, 256) == 64
    assert block_m("capped", 12_288, 256) == 128 and block_m("uncapped", 12_288, 256) == 128


def test_padding_reaches_every_expert_before_0_24_and_only_the_routed_rows_after() -> None:
    # 16 tokens x 6 = 96 rows over 256 experts. To 0.23 all 256 are padded: round_up(96 + 256 x 127, 128) =
    # 32,640; 0.24 at most 96 experts: 96 + 96 x 127 = 12,288 (a multiple of 128). 0.25 on SM12x: 1 row an
    # expert -> block 64: 96 + 96 x 63 = 6,144.
    assert aligned_rows("uncapped", 96, 256) == 32_640
    assert aligned_rows("capped", 96, 256) == 12_288
    assert aligned_rows("sm120", 96, 256) == 6_144


def test_the_workspace_of_deepseek_v4_flash_at_tp_2() -> None:
    # 4,096 tokens, top-6 of 256 experts, I = 2,048 / 2 = 1,024, H = 4,096, bf16 (the module's worked number):
    # M_sum = round_up(24,576 + 256 x 127, 128) = 57,088; (57,088 x max(1,024, 4,096) + 57,088 x max(2,048, 4,096))
    # x 2 B = 935,329,792 B. 0.31 keeps the first buffer as fp8 in bf16 elements: 57,088 x 2,048 (above the
    # 4,096 x 4,096 output it also holds) + 57,088 x 4,096, x 2 B = 701,497,344 B.
    def ws(rule: str, **kw) -> int:
        return deepgemm_workspace_bytes(DeepGemmScratch(rule, kw.pop("experts", 256), padded_dims=True, **kw),
                                        tokens=4096, chunk_tokens=4096, top_k=6, expert_width=2048, hidden=4096,
                                        tp=2, dtype_bytes=2)

    assert ws("sm120") == 935_329_792
    assert ws("sm120_fp8") == 701_497_344
    # Expert parallel over the two ranks: 128 whole experts each (I = 2,048), 192 rows an expert -> 128;
    # round_up(24,576 + 128 x 127, 128) = 40,832 rows x (4,096 + 4,096) x 2 B = 668,991,488 B.
    assert ws("sm120", experts=128, expert_parallel=True) == 668_991_488


def test_the_widths_each_release_gives_block_fp8_experts() -> None:
    # Qwen3-30B-A3B-FP8 at tp 1, 8,192 tokens: 65,536 rows, + 128 x 127 = 81,792 (639 blocks of 128).
    # 0.11.0: max(2I, H) + max(I, H) = 2,048 + 2,048; 0.11.1-0.12: 2I + max(I, H) = 1,536 + 2,048;
    # 0.13+: max(I, H) + max(2I, H) = 2,048 + 2,048; x 2 B a value. Triton's 65,536 rows x 4,096 x 2 B would
    # hold 536,870,912 B.
    def ws(widths: str, tokens: int = 8192, chunk: int = 8192) -> int:
        return deepgemm_workspace_bytes(DeepGemmScratch("uncapped", 128, widths=widths), tokens=tokens,
                                        chunk_tokens=chunk, top_k=8, expert_width=768, hidden=2048, tp=1,
                                        dtype_bytes=2)

    assert ws("0.11.0") == ws("0.13") == 81_792 * 4_096 * 2 == 670_040_064
    assert ws("0.11.1") == 81_792 * 3_584 * 2 == 586_285_056
    # 32,768 tokens in chunks of 16,384 (0.12): the buffers are a chunk's (131,072 + 16,256 = 147,328 rows) and
    # the (32,768, H) output is its own: (147,328 x 1,536 + 32,768 x 2,048 + 147,328 x 2,048) x 2 B.
    assert ws("0.11.1", tokens=32_768, chunk=16_384) == (226_295_808 + 67_108_864 + 301_727_744) * 2


@pytest.mark.parametrize(("version", "gpu", "tp", "install", "runs"), [
    ("0.10.2", H100, 1, "image", False),  # no DeepGEMM MoE path yet
    ("0.11.0", H100, 1, "image", True),  # I = 768 > 512, multiples of 128
    ("0.11.0", H100, 2, "image", False),  # I / tp = 384: _valid_deep_gemm says no on SM90
    ("0.11.0", B200, 2, "image", True),  # E8M0 on SM100 skips the shape check
    ("0.11.1", H100, 2, "image", True),
    ("0.11.1", H100, 2, "wheel", False),  # the deep_gemm package is not in the wheel before 0.20
    ("0.12.0", H100, 8, "image", False),  # off at tp 8 unless VLLM_MOE_USE_DEEP_GEMM is set
    ("0.14.1", H100, 4, "image", True),
    ("0.19.0", H100, 1, "image", False),  # Triton first on SM90 from 0.17
    ("0.23.0", PRO, 1, "image", False),  # support_deep_gemm lacks SM12x before 0.24
    ("0.24.0", PRO, 1, "wheel", True),
    ("0.33.0", PRO, 1, "image", True),
    ("0.33.0", H100, 1, "image", False),
])
def test_where_block_fp8_experts_run_on_deepgemm(version, gpu, tp, install, runs) -> None:
    f = resolve_flags(QWEN_FP8, VllmFlags(version=version, tensor_parallel_size=tp, install=install), gpu)
    assert (deepgemm_scratch(QWEN_FP8, f, gpu, NO_SPLIT) is not None) == runs


def test_the_switches_turn_it_off_or_ask_for_it() -> None:
    # VLLM_USE_DEEP_GEMM=0 (--no-deep-gemm) or VLLM_MOE_USE_DEEP_GEMM=0: off; VLLM_MOE_USE_DEEP_GEMM=1 lifts
    # 0.12-0.14's default off at tp 8.
    def runs(version: str, gpu, tp: int, deep_gemm: bool | None) -> bool:
        f = resolve_flags(QWEN_FP8, VllmFlags(version=version, tensor_parallel_size=tp, deep_gemm=deep_gemm), gpu)
        return deepgemm_scratch(QWEN_FP8, f, gpu, NO_SPLIT) is not None

    assert [runs("0.33.0", PRO, 1, v) for v in (None, False)] == [True, False]
    assert [runs("0.13.0", H100, 8, v) for v in (None, True, False)] == [False, True, False]


def test_where_deepseek_v4_experts_run_on_deepgemm() -> None:
    # DEEPGEMM_MXFP4 takes SM12x from 0.24 (DeepGemmFP4Experts._supports_current_device), the release that runs
    # V4's sparse attention there at all; SM100 picks FlashInfer's TRT-LLM kernels first; 0.32 adds SM12x
    # backends kvplan has not read.
    def runs(version: str, gpu) -> bool:
        f = resolve_flags(FLASH, VllmFlags(version=version, tensor_parallel_size=2, kv_cache_dtype="fp8"), gpu)
        return deepgemm_scratch(FLASH, f, gpu, NO_SPLIT) is not None

    assert [runs(v, PRO) for v in ("0.24.0", "0.31.0", "0.32.0")] == [True, True, False]
    assert not runs("0.25.0", B200) and not runs("0.25.0", H100)
    f = resolve_flags(FLASH, VllmFlags(version="0.25.0", tensor_parallel_size=2, kv_cache_dtype="fp8"), PRO)
    assert deepgemm_scratch(FLASH, f, PRO, WeightSplit(expert_ranks=2)) == DeepGemmScratch(
        "sm120", 128, expert_parallel=True, padded_dims=True)


def test_only_sm12x_runs_deepseek_v4_experts_on_deepgemm() -> None:
    # AzallazA/ds4-vllm-0.25-test's deployment (two RTX PRO 6000s, tp 2, 4,096 tokens a step, 0.25.0, whose log
    # names DEEPGEMM_MXFP4). The same plan on B200s (FlashInfer's TRT-LLM kernels, not modelled: Triton's rows)
    # peaks lower by the padding alone: 935,329,792 - 24,576 x (4,096 + 4,096) x 2 = 532,676,608 B.
    flags = VllmFlags(version="0.25.0", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=1_048_576,
                      max_num_seqs=64, max_num_batched_tokens=4096, enforce_eager=True)
    peaks = [plan_vllm(FLASH, flags, g).stages[0].memory.run_peak_bytes for g in (PRO, B200)]
    assert peaks[0] - peaks[1] == 532_676_608


def test_the_plan_says_what_deepgemm_adds(runner) -> None:
    # Qwen3-30B-A3B-FP8 on an RTX PRO 6000 with the newest release (0.33): 8,192 tokens x top-8 = 65,536 rows,
    # 512 an expert -> blocks of 128: 65,536 + 128 x 127 = 81,792 rows; 0.31+ keep the first buffer as fp8:
    # (81,792 x 2,048 / 2 + 81,792 x 2,048) x 2 B = 502,530,048 B (0.47 GiB) against Triton's 65,536 x 4,096 x
    # 2 B = 0.50 GiB. --no-deep-gemm plans Triton's and drops the note.
    args = ("estimate", "Qwen/Qwen3-30B-A3B-FP8", "--gpu", "RTX-PRO-6000", "--max-model-len", "32k", "--offline")
    said = " ".join(run_cli(runner, *args).output.split())
    assert "pads each expert's rows to its block: 81,792 rows where Triton's hold 65,536, 0.47 GiB of scratch " \
           "instead of 0.50 GiB" in said
    assert "DeepGEMM" not in run_cli(runner, *args, "--no-deep-gemm").output
