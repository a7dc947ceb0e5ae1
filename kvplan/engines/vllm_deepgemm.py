"""DeepGEMM's grouped-GEMM MoE scratch: the rows of every expert padded to the GEMM's M block.

docs/engine-rules.md 1.5. Where vLLM runs a model's experts on DeepGEMM (block-FP8 checkpoints on Hopper and
SM100 in 0.11-0.14 where the deep_gemm package is installed, and on SM12x from 0.24; DeepSeek-V4's MXFP4
experts on SM12x in 0.24-0.31), the kernel reads the tokens' top-k copies grouped by expert, each group padded
to a multiple of its M block, so the workspace holds M_sum rows, not T x top_k (`compute_aligned_M` in
fused_moe/deep_gemm_utils.py):

    M_sum = round_up(T x top_k + E' x (align - 1), align),  E' = local experts (to 0.23),
                                                            min(T x top_k, local experts) (0.24+)

beside two buffers whose widths `workspace_shapes` sets per release (WIDTHS), the first shared with the
(T, H) output, in the activation dtype (0.31 stores the first as fp8: half its columns). align is the M
block: 128 (DeepGEMM's contiguous-layout alignment) before 0.25; from 0.25 the per-call block of the DeepGEMM
build vLLM pins (a6b593d): on SM12x 64 where an expert's share of the rows fits in 64, else 128.
DeepSeek-V4-Flash at tp 2, 4,096 tokens, top-6 of 256 experts, I = 2,048 / 2, H = 4,096, bf16 on 0.25:
24,576 rows, 96 an expert -> align 128, M_sum = round_up(24,576 + 256 x 127, 128) = 57,088; (57,088 x 4,096
+ 57,088 x 4,096) x 2 B = 935,329,792 B, where unpadded rows (Triton's) hold 402,653,184 B.
"""

from __future__ import annotations

from kvplan.records import dataclass
from kvplan.units import cdiv

ROW_RULES = ("uncapped", "capped", "sm120", "sm120_fp8")  # VllmRules.deepgemm_rows
# (first buffer, second buffer) widths a row, from I (expert width on the rank) and H (hidden), per release of
# DeepGemmExperts.workspace_shapes (VllmRules.deepgemm_widths).
WIDTHS = {
    "0.11.0": lambda i, h: (max(2 * i, h), max(i, h)),
    "0.11.1": lambda i, h: (2 * i, max(i, h)),
    "0.13": lambda i, h: (max(i, h), max(2 * i, h)),
}
# The MXFP4 backend pads the experts' widths to DeepGEMM's 128 (mxfp4_round_up_hidden_size_and_intermediate_size).
DIM_ALIGN = 128
LEGACY_BLOCK_M = 128  # DeepGEMM's kLegacyMKAlignmentForContiguousLayout, vLLM's cap on the per-call block
SM120_MIN_BLOCK_M = 64  # DeepGEMM a6b593d: SM12x blocks are 4 warps x 16 rows, stepped by 64


@dataclass(frozen=True)
class DeepGemmScratch:
    """Where a release runs a model's experts on DeepGEMM: its row rule, its widths and the experts one rank
    holds."""

    rule: str  # ROW_RULES
    local_experts: int
    widths: str = "0.13"  # WIDTHS
    expert_parallel: bool = False  # each rank holds whole experts (no tp split of their width)
    padded_dims: bool = False  # the MXFP4 backend's widths rounded up to DIM_ALIGN


def _round_up(x: int, multiple: int) -> int:
    return cdiv(x, multiple) * multiple


def block_m(rule: str, rows: int, local_experts: int) -> int:
    """The M block the workspace is padded to. From 0.25 vLLM asks DeepGEMM for the smallest block that still
    covers an expert's share of the rows, stepping down from 128 by 64 on SM12x: 96 rows an expert keep 128,
    64 or fewer take 64."""
    if rule in ("uncapped", "capped"):
        return LEGACY_BLOCK_M
    per_expert = cdiv(rows, local_experts)
    block = LEGACY_BLOCK_M
    while block > SM120_MIN_BLOCK_M and block - SM120_MIN_BLOCK_M >= per_expert:
        block -= SM120_MIN_BLOCK_M
    return block


def aligned_rows(rule: str, rows: int, local_experts: int) -> int:
    """M_sum: T x top_k rows plus each reachable expert's padding, rounded to the block."""
    align = block_m(rule, rows, local_experts)
    reach = local_experts if rule == "uncapped" else min(rows, local_experts)
    return _round_up(rows + reach * (align - 1), align)


def deepgemm_workspace_bytes(scratch: DeepGemmScratch, *, tokens: int, chunk_tokens: int, top_k: int,
                             expert_width: int, hidden: int, tp: int, dtype_bytes: int) -> int:
    """The buffers one forward of `tokens` tokens allocates on one rank, in chunks of `chunk_tokens`: the two
    workspaces sized for a chunk, the first holding the (tokens, H) output too when one chunk does it all."""
    inter = expert_width if scratch.expert_parallel else cdiv(expert_width, tp)
    h = hidden
    if scratch.padded_dims:
        inter, h = _round_up(inter, DIM_ALIGN), _round_up(hidden, DIM_ALIGN)
    rows = aligned_rows(scratch.rule, chunk_tokens * top_k, scratch.local_experts)
    first, second = WIDTHS[scratch.widths](inter, h)
    if scratch.rule == "sm120_fp8":  # fp8 bytes in a workspace of the activation dtype (_fp8_workspace_shape)
        first = cdiv(first, dtype_bytes)
    out = tokens * h
    common = max(rows * first, out) if tokens == chunk_tokens else rows * first + out
    return (common + rows * second) * dtype_bytes
