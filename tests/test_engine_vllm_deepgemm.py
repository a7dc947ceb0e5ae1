"""DeepGEMM's MoE scratch: rows padded per expert (kvplan/engines/vllm_deepgemm.py, engine-rules.md 1.5).

The shapes are DeepGemmFP4Experts.workspace_shapes and compute_aligned_M(_and_alignment) in the 0.20-0.31
sdists, the block from the DeepGEMM build each release pins (a6b593d from 0.25).
"""

from __future__ import annotations

from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_deepgemm import DeepGemmScratch, aligned_rows, block_m, deepgemm_workspace_bytes
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model

FLASH = resolve_model("deepseek-ai/DeepSeek-V4-Flash", offline=True).model


def test_the_block_an_expert_share_picks() -> None:
    # 0.25+ on SM12x: 128, stepped down by 64 while the smaller block still covers an expert's share.
    # 4,096 tokens x top-6 over 256 experts = 96 rows each -> 128; 2,048 tokens -> 48 each -> 64.
    assert block_m("sm120", 24_576, 256) == 128 and block_m("sm120", 12_288, 256) == 64
    assert block_m("capped", 12_288, 256) == 128 and block_m("uncapped", 12_288, 256) == 128


def test_padding_reaches_every_expert_before_0_24_and_only_the_routed_rows_after() -> None:
    # 16 tokens x 6 = 96 rows over 256 experts. 0.20-0.23 pad all 256: round_up(96 + 256 x 127, 128) = 32,640;
    # 0.24 at most 96 experts: 96 + 96 x 127 = 12,288 (a multiple of 128). 0.25 on SM12x: 1 row an expert ->
    # block 64: 96 + 96 x 63 = 6,144.
    assert aligned_rows("uncapped", 96, 256) == 32_640
    assert aligned_rows("capped", 96, 256) == 12_288
    assert aligned_rows("sm120", 96, 256) == 6_144


def test_the_workspace_of_deepseek_v4_flash_at_tp_2() -> None:
    # 4,096 tokens, top-6 of 256 experts, I = 2,048 / 2 = 1,024, H = 4,096, bf16 (the module's worked number):
    # M_sum = round_up(24,576 + 256 x 127, 128) = 57,088; (57,088 x max(1,024, 4,096) + 57,088 x max(2,048, 4,096))
    # x 2 B = 935,329,792 B. 0.31 keeps the first buffer as fp8 in bf16 elements: 57,088 x 2,048 (above the
    # 4,096 x 4,096 output it also holds) + 57,088 x 4,096, x 2 B = 701,497,344 B.
    def ws(rule: str, **kw) -> int:
        return deepgemm_workspace_bytes(DeepGemmScratch(rule, kw.pop("experts", 256), **kw), tokens=4096, top_k=6,
                                        expert_width=2048, hidden=4096, tp=2, dtype_bytes=2)

    assert ws("sm120") == 935_329_792
    assert ws("sm120_fp8") == 701_497_344
    # Expert parallel over the two ranks: 128 whole experts each (I = 2,048), 192 rows an expert -> 128;
    # round_up(24,576 + 128 x 127, 128) = 40,832 rows x (4,096 + 4,096) x 2 B = 668,991,488 B.
    assert ws("sm120", experts=128, expert_parallel=True) == 668_991_488


def test_only_sm12x_runs_deepseek_v4_experts_on_deepgemm() -> None:
    # AzallazA/ds4-vllm-0.25-test's deployment (two RTX PRO 6000s, tp 2, 4,096 tokens a step, 0.25.0, whose log
    # names DEEPGEMM_MXFP4). The same plan on B200s (FlashInfer's TRT-LLM kernels, not modelled: Triton's rows)
    # peaks lower by the padding alone: 935,329,792 - 24,576 x (4,096 + 4,096) x 2 = 532,676,608 B.
    flags = VllmFlags(version="0.25.0", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=1_048_576,
                      max_num_seqs=64, max_num_batched_tokens=4096, enforce_eager=True)
    peaks = [plan_vllm(FLASH, flags, find_gpu(g)).stages[0].memory.run_peak_bytes for g in ("RTX-PRO-6000", "B200")]
    assert peaks[0] - peaks[1] == 532_676_608
