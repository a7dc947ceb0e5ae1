"""SGLang's start-up rules per release range: the default mem_fraction_static, the chunked-prefill and CUDA-graph
defaults, multimodal adjustments, the request table, the sliding-window and Mamba pools, the refusal's words.

Read from the released sources (docs/engine-rules.md, part 2, names each file and release). A rule read at
release X holds from X until the next read release with a different rule; where a change lies between two read
releases it is placed at the later one, and the range says so. `kvplan estimate --sglang-version 0.4.3.post4`
picks the range holding 0.4.3.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvplan.engines.release import CURRENT, Release, parse_release, release_text
from kvplan.errors import FieldError
from kvplan.records import dataclass

FIRST_RELEASE: Release = (0, 3, 0)


@dataclass(frozen=True)
class FractionInputs:
    """What SGLang's default mem_fraction_static depends on."""

    gpu_mib: float  # the card's memory as nvidia-smi reports it, in MiB (kvplan: the catalog's total)
    tp: int
    pp: int
    dp: int
    dp_attention: bool
    chunked_prefill_size: int
    cuda_graph_max_bs: int


@dataclass(frozen=True)
class Fraction:
    value: float
    reserved_mib: float | None  # what the rule leaves outside the fraction (None: a table value)
    rule: str  # for people


FractionRule = Callable[[FractionInputs], Fraction]
# (below this many MiB, chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4); None: no such option.
BatchTiers = tuple[tuple[float, int, int | None, int | None], ...]


def _tp_table(tp8: float) -> FractionRule:
    """server_args.py 0.3.0-0.4.3: the fraction by tensor parallelism alone (tp >= 16: 0.79, >= 8: tp8, >= 4:
    0.85, >= 2: 0.87, else 0.88): wider TP leaves more per-GPU room for NCCL and activations."""
    table = ((16, 0.79), (8, tp8), (4, 0.85), (2, 0.87), (1, 0.88))

    def rule(i: FractionInputs) -> Fraction:
        value = next(v for at_least, v in table if i.tp >= at_least)
        return Fraction(value, None, f"SGLang's table by tensor parallelism, {value} at tp {i.tp}")

    return rule


def _tp_table_or_big_gpu(i: FractionInputs) -> Fraction:
    """server_args.py 0.4.6: the TP table up to 80 GiB cards; above, 13 GiB reserved: H200 (143,771 MiB) ->
    (143,771 - 13,312) / 143,771 = 0.9074."""
    if i.gpu_mib <= 81920:
        return _tp_table(0.81)(i)
    reserved = 13 * 1024
    return Fraction((i.gpu_mib - reserved) / i.gpu_mib, reserved, "13 GiB reserved on cards above 80 GiB")


def _reserve_by_size(i: FractionInputs) -> Fraction:
    """server_args.py 0.4.9-0.5.1: a reserve by the card's size class and tp x pp, +4 GiB with DP attention.
    H100 (81,089 MiB), tp 1: (9.5 + 1 / 2) x 1,024 = 10,240 MiB -> round(70,849 / 81,089, 3) = 0.874."""
    parallel = i.tp * i.pp
    gib = i.gpu_mib / 1024
    if gib < 35:
        reserved = (2.8 + parallel / 10) * 1024
    elif gib < 90:
        reserved = (9.5 + parallel / 2) * 1024
    elif gib < 160:
        reserved = (12 + parallel / 2) * 1024
    else:
        reserved = 32 * 1024
    if i.dp_attention:
        reserved += 4 * 1024
    return Fraction(round((i.gpu_mib - reserved) / i.gpu_mib, 3), reserved, "a reserve by the card's size class")


def _reserve_by_activation(i: FractionInputs) -> Fraction:
    """server_args.py _handle_gpu_memory_settings 0.5.3+: reserve 512 + 1.5 x max(chunked_prefill_size, 2,048)
    + 2 x cuda_graph_max_bs + tp x pp / 8 x 1,024 MiB (DP attention: + 3 x max_bs x dp, x 1.5 more above 300),
    at least 10 GiB on cards above 60 GiB. H100 (81,089 MiB), tp 1, chunk 8,192, max_bs 256: 512 + 12,288 +
    512 + 128 = 13,440 MiB -> round((81,089 - 13,440) / 81,089, 3) = 0.834."""
    graphs = i.cuda_graph_max_bs
    reserved = 512 + max(i.chunked_prefill_size, 2048) * 1.5 + graphs * 2 + i.tp * i.pp / 8 * 1024
    if i.dp_attention:
        reserved += graphs * i.dp * 3 + (graphs * i.dp * 1.5 if graphs > 300 else 0)
    if i.gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return Fraction(round((i.gpu_mib - reserved) / i.gpu_mib, 3), reserved,
                    "a reserve for activations of one prefill chunk and the CUDA graphs")


# (below MiB, chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4)
_INF = math.inf
BATCH_0_3_0: BatchTiers = ((_INF, 8192, None, None),)
BATCH_0_3_6: BatchTiers = ((25_000, 2048, 4, 4), (_INF, 8192, 160, 160))
BATCH_0_4_3: BatchTiers = ((25_000, 2048, 8, 80), (_INF, 8192, 160, 160))
BATCH_0_4_9: BatchTiers = ((35 * 1024, 2048, 8, 80), (160 * 1024, 8192, 160, 160), (_INF, 16384, 160, 160))
BATCH_0_5_3: BatchTiers = (
    (20 * 1024, 2048, 8, 8),  # T4, RTX 4080
    (35 * 1024, 2048, 16, 80),  # A10, L4, RTX 3090/4090/5090
    (60 * 1024, 4096, 32, 160),  # A100 40GB, L40S
    (160 * 1024, 8192, 256, 512),  # A100 80GB, H100, H20, H200
    (_INF, 16384, 512, 512),  # B200, MI300X
)
BATCH_0_5_23: BatchTiers = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), *BATCH_0_5_3[2:])


@dataclass(frozen=True)
class SglangRelease:
    """The rules of one range of SGLang releases, from `first` up to the next range."""

    first: Release
    read_in: str  # the releases these rules were read in (docs/engine-rules.md)
    fraction: FractionRule
    batch: BatchTiers
    # Multimodal models: "runner" (ModelRunner multiplies any fraction by 0.95), "default x0.90" (the default
    # only), or "vit" (adjust_mem_fraction_for_vlm: the default x 0.95 x a ViT-complexity factor).
    multimodal: str
    # max_running_requests' default is min(tokens // 2, the request table's size); the table had one slot more
    # than max_num_reqs in the 0.4.x logs (2,049 for 2,048), none in 0.5.3's source.
    request_table_extra: int
    swa_pool: bool  # sliding-window layers get their own token pool (set_num_token_hybrid)
    mamba: str  # "fixed": 512 state slots (or max_running_requests); "ratio": mamba_full_memory_ratio of rest
    refusal: str  # "plain", "current value", "raise above"
    # DeepSeek-V3.2's sparse attention (NSATokenToKVPool, 0.5.3rc2+; the indexer's key in the cell size from
    # 0.5.3.post1) [2.4].
    dsa: bool = False
    # --kv-cache-dtype auto takes fp8_e4m3 where a ModelOpt checkpoint's KV is FP8 (configure_kv_cache_dtype,
    # sglang#10336, 0.5.3); any other KV quantization keeps the model dtype [2.7].
    checkpoint_kv_fp8: bool = False

    @property
    def label(self) -> str:
        return release_text(self.first)


RELEASES: tuple[SglangRelease, ...] = (
    SglangRelease((0, 3, 0), "0.3.0, 0.3.4", _tp_table(0.83), BATCH_0_3_0, "runner", 1, False, "fixed", "plain"),
    SglangRelease((0, 3, 6), "0.3.6", _tp_table(0.82), BATCH_0_3_6, "runner", 1, False, "fixed", "plain"),
    SglangRelease((0, 4, 0), "0.4.0", _tp_table(0.81), BATCH_0_3_6, "runner", 1, False, "fixed", "plain"),
    SglangRelease((0, 4, 3), "0.4.3", _tp_table(0.81), BATCH_0_4_3, "runner", 1, False, "fixed", "plain"),
    SglangRelease((0, 4, 6), "0.4.6", _tp_table_or_big_gpu, BATCH_0_4_3, "runner", 1, False, "fixed", "plain"),
    SglangRelease((0, 4, 9), "0.4.9, 0.4.10, 0.5.1", _reserve_by_size, BATCH_0_4_9, "default x0.90", 1, False,
                  "fixed", "plain"),
    SglangRelease((0, 5, 3), "0.5.3 ... 0.5.20", _reserve_by_activation, BATCH_0_5_3, "vit", 0, True, "fixed",
                  "current value", dsa=True, checkpoint_kv_fp8=True),
    SglangRelease((0, 5, 23), "0.5.23", _reserve_by_activation, BATCH_0_5_23, "vit", 0, True, "ratio",
                  "raise above", dsa=True, checkpoint_kv_fp8=True),
)
NEWEST: Release = RELEASES[-1].first


def release_of(version: str) -> Release:
    """The release a --sglang-version names ("current": the newest one read), or a FieldError."""
    if version == CURRENT:
        return NEWEST
    found = parse_release(version)
    if found is None:
        raise FieldError("engine.version", "must be a SGLang release such as 0.4.3 or 0.5.13.post1, or current",
                         version)
    if found < FIRST_RELEASE:
        raise FieldError("engine.version", f"kvplan models SGLang from {release_text(FIRST_RELEASE)}", version)
    return found


def rules_for(release: Release) -> SglangRelease:
    """The rule record of the range holding `release` (a release newer than any read takes the newest rules)."""
    return [r for r in RELEASES if r.first <= release][-1]


def batch_defaults(tiers: BatchTiers, gpu_mib: float, tp: int) -> tuple[int, int | None]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for a card of `gpu_mib` MiB at this tp."""
    _, chunk, small, large = next(t for t in tiers if gpu_mib < t[0])
    return chunk, (small if tp < 4 else large)
