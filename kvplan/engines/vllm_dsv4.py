"""DeepSeek-V4's caches as vLLM lays them out (engine-rules.md 1.24), read in the 0.20-0.33 sdists.

Every layer registers a sliding window of latents (`DeepseekV4SWACache`, 64-token blocks); a layer of ratio
r > 1 adds its compressed latents (`MLAAttentionSpec(compress_ratio=r)`, blocks of the cache's block size,
256, holding 256 / r entries) and its compressor's state rows (a sliding window of 2r rows for r = 4, r for
128); r = 4 adds the indexer's keys and the indexer compressor's state. All are one head, so every TP rank
holds all of it. vLLM stores latents in its fp8_ds_mla layout and pads every page to 576 B (FlashMLA).

`kv_cache_utils.group_and_unify_kv_cache_specs` makes one full-MLA group (compressed latents and indexer
keys) and one sliding group per (block size, window); `_get_kv_cache_groups_uniform_groups` picks the
"layer tuples" with the least padding and splits each sliding group into groups of at most that many layers.
All groups share one pool; what a block id costs there, and what the one-request check charges, changed by
release (VllmRules.dsv4_*). DeepSeek-V4-Flash on 0.22 at 30,000 tokens and 16,384-token steps: 118 + 2 x 259
+ 4,099 + 2,065 = 6,800 blocks of 22 x 47,808 = 1,051,776 B, 7,152,076,800 B = 6.66 GiB, as vllm#44376 prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

from kvplan.engines.base import Refusal
from kvplan.engines.vllm_dsa import BLOCK_TOKENS as DSA_BLOCK_TOKENS
from kvplan.engines.vllm_dsa import index_key_bytes
from kvplan.engines.vllm_kv import KvCacheLayout, KvGroup, group_blocks
from kvplan.engines.vllm_versions import VllmRules
from kvplan.errors import FieldError
from kvplan.model.specs import CompressedMLASpec, LayerKind, LayerSpec, ModelSpec
from kvplan.units import BF16_BYTES, FP32_BYTES, INT32_BYTES, cdiv, round_up

# The only block size the V4 FlashMLA and indexer kernels take (flashmla.py, indexer.py), and the one the V4
# window backend prefers (sparse_swa.py); sparse_mla_refusal refuses another.
BLOCK_TOKENS = 256
SWA_BLOCK_TOKENS = 64  # DeepseekV4SWACache's fixed block (sparse_swa.py)
PAGE_ALIGN_BYTES = 576  # FlashMLA's alignment, applied to every V4 page (kv_cache_interface._apply_alignment_padding)
# The compressor's state block, rows a block: its [block, state] page must fit the latent pages it shares a
# tensor with (compressor.py: "C4 compressor block shape [4, 2*512*2*4]", "C128 [8, 512*2*4]").
STATE_BLOCK_ROWS = {4: 4, 128: 8}


def latent_bytes(spec: CompressedMLASpec) -> int:
    """One latent in fp8_ds_mla: the unrotated part in fp8, the rotated part in bf16, one scale byte per 64
    fp8 values and a pad byte (attention.py head_bytes). 512 = 448 + 64 wide: 448 + 128 + 7 + 1 = 584 B."""
    nope = spec.head_dim - spec.rope_dim
    return nope + 2 * spec.rope_dim + nope // 64 + 1


def _page(rows: int, row_bytes: int) -> int:
    return round_up(rows * row_bytes, PAGE_ALIGN_BYTES)


def layer_caches(spec: CompressedMLASpec) -> list[tuple[str, int, int, int]]:
    """(group key, block tokens, window tokens, page bytes) of each cache one layer registers; the key "mla"
    is the full-MLA group, the others a sliding group. Flash ratio 4: window 37,440, compressed 37,440,
    indexer 8,640, compressor state 32,832 (4 rows x 2 x 2 x 512 float32), indexer state 8,640."""
    out = [("swa", SWA_BLOCK_TOKENS, spec.window, _page(SWA_BLOCK_TOKENS, latent_bytes(spec)))]
    r = spec.compress_ratio
    if r == 1:
        return out
    coff = 2 if r == 4 else 1  # ratio 4 overlaps two runs (compressor.py coff)
    rows = STATE_BLOCK_ROWS[r]
    out.append(("mla", BLOCK_TOKENS, 0, _page(BLOCK_TOKENS // r, latent_bytes(spec))))
    out.append((f"state{r}", rows, coff * r, _page(rows, 2 * coff * spec.head_dim * FP32_BYTES)))
    if r == 4:
        out.append(("mla", BLOCK_TOKENS, 0, _page(BLOCK_TOKENS // r, index_key_bytes(spec.index_head_dim))))
        out.append((f"state{r}", rows, coff * r, _page(rows, 2 * coff * spec.index_head_dim * FP32_BYTES)))
    return out


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """kv_cache_utils._approximate_gcd: the d >= lower_bound that pads the values least when each is rounded
    up to a multiple of d (ties to the larger). Flash's [21, 43, 21, 20] from 21: 22 (padding 5)."""
    best, best_pad = lower_bound, None
    for d in range(lower_bound, max(max(values), lower_bound) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def dsv4_kv_dtype(rules: VllmRules, kv_name: str, version: str) -> str:
    """The KV dtype vLLM serves DeepSeek-V4 in (sparse_mla_refusal has refused the ones it does not take): fp8,
    stored as fp8_ds_mla whatever the spelling; `auto` is fp8 from 0.30. The release must have the model."""
    if not rules.dsv4:
        raise FieldError("engine.version", f"vLLM {version} does not have DeepSeek-V4 (first in 0.20.0)", version)
    return "fp8" if kv_name == "auto" else kv_name


def sparse_mla_refusal(model: ModelSpec, rules: VllmRules, version: str, *, kv_cache_dtype: str,
                       block_size: int | None) -> Refusal | None:
    """What vLLM refuses for DeepSeek-V4 and V3.2 before it sizes memory. V4: its attention asserts an fp8
    cache (`auto` reads as fp8 from 0.30), and its FlashMLA and indexer kernels take only 256-token blocks
    (v1/worker/utils.py select_common_block_size: "No common block size"). V3.2: from 0.18 a given block size
    must be the indexer's 64 (to 0.17 the platform forces 64 over it)."""
    if model.geometry.compressed_mla is not None:
        if not (kv_cache_dtype.startswith("fp8") or (kv_cache_dtype == "auto" and rules.dsv4_auto_fp8)):
            return Refusal("kv_dtype", f"DeepSeek-V4's attention takes only an fp8 KV cache on vLLM {version} (it "
                           "asserts an fp8 cache dtype; 0.30 and later read auto as fp8).", "kv_cache_dtype")
        if block_size is not None and block_size != BLOCK_TOKENS:
            return Refusal("option", f"No common block size for DeepSeek-V4's kernels: they take only "
                           f"{BLOCK_TOKENS}-token blocks, not {block_size}.", "engine.block_size")
    mla = model.geometry.mla
    if mla is not None and mla.index_head_dim and rules.dsa and not rules.dsa_block_forced \
            and block_size is not None and block_size != DSA_BLOCK_TOKENS:
        return Refusal("option", f"DeepSeek-V3.2's indexer takes only {DSA_BLOCK_TOKENS}-token blocks on vLLM "
                       f"{version}, not {block_size}.", "engine.block_size")
    return None


def dsv4_layout(stage: Sequence[LayerSpec], rules: VllmRules) -> KvCacheLayout:
    """The groups, pages and block costs vLLM gives one rank's DeepSeek-V4 layers (dsv4_kv_dtype has checked
    the release)."""
    caches = [c for s in stage if s.kind == LayerKind.COMPRESSED_MLA
              for c in layer_caches(cast(CompressedMLASpec, s))]
    mla_pages = [page for key, _, _, page in caches if key == "mla"]
    mla_sizes = sorted(set(mla_pages))
    buckets: dict[tuple[str, int, int], list[int]] = {}
    for key, block, window, page in caches:
        if key != "mla":
            if rules.dsv4_state_padded and mla_sizes:  # raised to the next full-MLA page size
                page = min((x for x in mla_sizes if x >= page), default=page)
            buckets.setdefault((key, block, window), []).append(page)
    # A group's "layer tuples": how many of its layers share its most common page size. The sliding groups are
    # split to at most `tuples` of them, the count that pads every group least.
    tuples = approximate_gcd([_tuples(mla_pages), *(_tuples(p) for p in buckets.values())],
                             lower_bound=max(1, _tuples(mla_pages)))
    members: list[tuple[int, int, list[int]]] = [(BLOCK_TOKENS, 0, mla_pages)] if mla_pages else []
    for (_, block, window), pages in buckets.items():
        n_groups = cdiv(_tuples(pages), tuples)
        counts = Counter(pages)
        for i in range(n_groups):  # layer tuples i, i + n, ... (layer_tuples[i::num_tuple_groups])
            members.append((block, window, [size for size in sorted(counts)
                                            for _ in range(i, counts[size], n_groups)]))
    groups = tuple(KvGroup("full_attention" if window == 0 else "sliding_window", len(pages), window, 0, 0, block,
                           page_bytes=sum(pages)) for block, window, pages in members)
    tuples_used = max(_tuples(pages) for _, _, pages in members)
    tuple_bytes = sum(mla_sizes)
    stride = max(g.page_bytes for g in groups)
    sizes = {size for _, _, pages in members for size in pages}
    slots = sum(size * max(pages.count(size) for _, _, pages in members) for size in sizes)
    pool = {"tuples": tuples_used * tuple_bytes, "slots": slots, "stride": stride}[rules.dsv4_pool]
    check = tuples_used * tuple_bytes if rules.dsv4_check == "tuples" else stride
    return KvCacheLayout(groups, tuples_used, tuple_bytes, pool_block_bytes=pool, check_block_bytes=check,
                         weighted_concurrency=rules.dsv4_weighted_concurrency)


def _tuples(pages: list[int]) -> int:
    return max(Counter(pages).values(), default=0)


def dsv4_buffer_bytes(
    model: ModelSpec, rules: VllmRules, *, max_num_batched_tokens: int, draft: bool = False,
) -> tuple[int, int]:
    """Buffers DeepSeek-V4 allocates when vLLM builds it, which "Model loading took" counts: (on every rank, on
    the last pipeline rank). Every rank: the sparse attention's top-k indices, int32 [tokens, index_topk]
    (nvidia/model.py topk_indices_buffer; Flash at 16,384 tokens: 33,554,432 B). The last rank, with MTP
    (`draft`) and 0.20-0.26 also without: the pre-head residual stream the draft reads, bf16 [tokens, hc_mult x
    hidden] (_mtp_hidden_buffer; Flash: 16,384 x 16,384 x 2 B = 536,870,912 B)."""
    c = model.geometry.compressed_mla
    if c is None:
        return 0, 0
    topk = max_num_batched_tokens * c.index_topk * INT32_BYTES
    kept = rules.dsv4_mtp_buffer or draft
    mtp = max_num_batched_tokens * c.hc_mult * model.hidden_size * BF16_BYTES if kept else 0
    return topk, mtp


# FlashMLA's sparse kernels run 64 or 128 query heads: a rank's heads are padded up (nvidia/flashmla.py).
FLASHMLA_HEADS = (64, 128)


def dsv4_forward_bytes(model: ModelSpec, *, tp: int, tokens: int, dtype_bytes: int) -> int:
    """The profiling forward's peak on one rank, the fused-MoE scratch apart (moe_workspace_bytes adds it), read
    in the 0.22 sdist. In the profile run the attention takes its dummy branch, and the peak is where it pads q
    to FlashMLA's heads in the first layer of the largest ratio kind. Alive then, a token each: the
    hyper-connection residual (hc_mult x hidden), its mixing coefficients (float32 [hc] and [hc^2]), the layer
    input, the attention's output buffer and the padded q (padded heads x head_dim each), q itself, the q/kv
    down-projection and its normed copy, and the compressor's float32 scores (2 x coff x head_dim; on a ratio-4
    layer also the indexer's weights and its compressor's 2 x 2 x index_head_dim). Flash at tp 2 in bf16:
    32,768 + 80 + 8,192 + 2 x 65,536 + 32,768 + 2 x 3,072 + 8,192 + 128 + 2,048 = 221,392 B a token."""
    c = model.geometry.compressed_mla
    assert c is not None  # called for DeepSeek-V4 only
    heads = cdiv(model.num_attention_heads, tp)
    padded = next((h for h in FLASHMLA_HEADS if heads <= h), heads)
    hc = c.hc_mult
    ratio = 4 if 4 in c.compress_ratios else max(c.compress_ratios)
    coff = 2 if ratio == 4 else 1
    scores = 0 if ratio == 1 else 2 * coff * c.head_dim * FP32_BYTES
    if ratio == 4:
        scores += c.index_n_heads * dtype_bytes + 2 * 2 * c.index_head_dim * FP32_BYTES
    per_token = (
        (hc * model.hidden_size + model.hidden_size) * dtype_bytes  # residual stream, layer input
        + (hc + hc * hc) * FP32_BYTES  # post and comb mixing coefficients
        + (2 * padded + heads) * c.head_dim * dtype_bytes  # output buffer, padded q, q
        + 2 * (c.q_lora_rank + c.head_dim) * dtype_bytes  # q/kv down-projection and its normed copy
        + scores
    )
    return tokens * per_token


def dsv4_notes(layout: KvCacheLayout, max_model_len: int, in_flight_tokens: int) -> list[str]:
    """What a request holds in each group, and why most of it does not grow with its length."""
    parts = []
    for g in layout.groups:
        blocks = group_blocks(g, max_model_len, in_flight_tokens, layout.mamba_cache_mode)
        what = "compressed latents and indexer keys" if g.window_tokens == 0 else (
            "latent window" if g.block_size == SWA_BLOCK_TOKENS else "compressor state")
        parts.append(f"{blocks:,} x {g.block_size} ({what})")
    out = [f"DeepSeek-V4's {len(layout.groups)} cache groups share one pool; a request of {max_model_len:,} "
           f"tokens takes " + " + ".join(parts) + " blocks. The window and state groups keep the "
           f"{in_flight_tokens:,} tokens in flight, so they, not the length, set most of it",
           "one latent head: every TP rank holds the whole cache"]
    if layout.check_bytes_per_block != layout.bytes_per_block:
        out.append(f"vLLM's one-request check charges {layout.check_bytes_per_block:,} B a block; its pool takes "
                   f"{layout.bytes_per_block:,}")
    return out
