"""vLLM's KV cache groups, pages, blocks, tokens and concurrency (vllm/v1/core/kv_cache_utils.py).

Every layer gets a spec with a page (one block of `block_size` tokens on this rank). Equal specs form one
group; hybrids (Gemma 2/3 sliding + full, gpt-oss, Llama 4 chunked, Mamba hybrids) are split into groups of
an equal number of layers so that every group's block costs the same bytes; one block id then stands for
`group_size` pages, one in each of `group_size` shared tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from kvplan.errors import InputError
from kvplan.model.dtypes import KvDtype
from kvplan.model.specs import LayerKind, LayerSpec
from kvplan.records import dataclass
from kvplan.units import cdiv

# Attention kernels need block sizes in multiples of 16 tokens; vLLM raises a Mamba hybrid's attention
# block to the smallest such multiple whose page holds one Mamba state (vllm/model_executor/models/config.py).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class VllmLayerSpec:
    """One layer as vLLM's KV cache manager sees it on one rank."""

    kind: str  # "full_attention", "sliding_window", "chunked_local", "mla", "compressed_mla", "mamba"
    bytes_per_token: int  # 0 for Mamba (its page is a constant state)
    window_tokens: int = 0  # sliding window or attention chunk
    state_bytes: int = 0  # Mamba / linear attention state per request

    def key(self) -> tuple:
        return (self.kind, self.bytes_per_token, self.window_tokens, self.state_bytes)


@dataclass(frozen=True)
class KvGroup:
    kind: str
    layers: int  # real layers (the last group of a kind may be padded up to group_size)
    window_tokens: int
    bytes_per_token: int
    state_bytes: int
    block_size: int  # tokens per block of this group: raised where its page was smaller than the largest
    page_bytes: int = 0  # the group's bytes a block id, where its pages differ (DeepSeek-V4); 0: uniform pages


@dataclass(frozen=True)
class KvCacheLayout:
    """The grouping vLLM settles on for one rank, with its unified page."""

    groups: tuple[KvGroup, ...]
    group_size: int  # layers per group = tensors sharing one block id
    page_bytes: int  # one layer's page: bytes of one block in one layer
    # How a request holds Mamba / DeltaNet state (vLLM's mamba_cache_mode, set by prefix caching on a hybrid):
    # "none" one page, "align" two, "all" one per block of its length.
    mamba_cache_mode: str = "none"
    # State pages a request holds per Mamba group beyond its mode's: MTP's draft tokens (num_speculative_blocks)
    # and, in "align" mode from 0.32, a Mamba2 mixer's prefill checkpoint (vllm._extra_state_pages).
    extra_state_pages: int = 0
    # DeepSeek-V4 (vllm_dsv4): the pool's bytes a block id and what the one-request check charges one, where
    # they are not page_bytes x group_size (0: they are); and whether the concurrency counts a request's
    # blocks weighted by each group's pages (0.20-0.26).
    pool_block_bytes: int = 0
    check_block_bytes: int = 0
    weighted_concurrency: bool = False

    @property
    def block_size(self) -> int:
        """The smallest group's tokens per block (raised for Mamba hybrids), the one vLLM reports."""
        return min(g.block_size for g in self.groups)

    @property
    def bytes_per_block(self) -> int:
        """What one block id costs on this rank: one page in each of group_size tensors."""
        return self.pool_block_bytes or self.page_bytes * self.group_size

    @property
    def check_bytes_per_block(self) -> int:
        """What the one-request check (and the estimated max model length) charges a block."""
        return self.check_block_bytes or self.bytes_per_block

    def concurrency_blocks(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """The blocks a request counts for "Maximum concurrency": its blocks, or with `weighted_concurrency`
        its groups' bytes over the first group's page (get_max_concurrency_for_kv_cache_config, 0.20-0.26):
        DeepSeek-V4-Flash at 13,528 tokens on 0.22: cdiv(4,936,980,480, 1,002,240) = 4,926 for 5,554 blocks."""
        if not self.weighted_concurrency:
            return self.blocks_per_request(max_model_len, max_num_batched_tokens)
        used = sum(group_blocks(g, max_model_len, max_num_batched_tokens, self.mamba_cache_mode)
                   * g.page_bytes for g in self.groups)
        return cdiv(used, self.groups[0].page_bytes)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks one request at max_model_len needs, summed over groups (max_memory_usage_bytes).

        Full attention / MLA: cdiv(L, B). Sliding window W: cdiv(min(W - 1 + T, L), B) + 1 (the window can
        start mid-block). Chunked local C: cdiv(min(C + T, L), B). Mamba: one block (its state); with prefix
        caching two in mamba_cache_mode "align", cdiv(L, B) in "all". Gemma-3-12B at L = T = 8,192, B = 16:
        512 + 5 x 513 = 3,077.
        """
        return sum(group_blocks(g, max_model_len, max_num_batched_tokens, self.mamba_cache_mode)
                   + (self.extra_state_pages if g.kind == "mamba" else 0) for g in self.groups)


def group_blocks(g: KvGroup, max_model_len: int, batched: int, mamba_cache_mode: str) -> int:
    """Blocks one request holds in group `g` (its share of blocks_per_request)."""
    block_size = g.block_size
    if g.kind == "mamba":
        if mamba_cache_mode == "all":
            return cdiv(max_model_len, block_size)
        return 2 if mamba_cache_mode == "align" else 1
    if g.kind == "sliding_window":
        return cdiv(min(g.window_tokens - 1 + batched, max_model_len), block_size) + 1
    if g.kind == "chunked_local":
        return cdiv(min(g.window_tokens + batched, max_model_len), block_size)
    return cdiv(max_model_len, block_size)


def _attention(vllm_kind: str) -> Callable[[LayerSpec, KvDtype, int], VllmLayerSpec | None]:
    """A token-caching layer as vLLM's spec of `vllm_kind`; windows and chunks carry their length."""
    def spec(layer: LayerSpec, kv: KvDtype, tp: int) -> VllmLayerSpec:
        return VllmLayerSpec(vllm_kind, layer.kv_bytes_per_token(kv, tp), window_tokens=layer.window_tokens or 0)
    return spec


def _state(layer: LayerSpec, kv: KvDtype, tp: int) -> VllmLayerSpec:
    """vLLM caches Mamba and gated DeltaNet alike (MambaSpec): one constant page of state per request."""
    return VllmLayerSpec("mamba", 0, state_bytes=layer.state_bytes(tp))


def _nothing(layer: LayerSpec, kv: KvDtype, tp: int) -> None:
    return None


# vLLM's KV cache spec for each layer kind (None: the layer gets no KV cache tensor).
KIND_RULES: dict[LayerKind, Callable[[LayerSpec, KvDtype, int], VllmLayerSpec | None]] = {
    LayerKind.FULL_ATTENTION: _attention("full_attention"),
    LayerKind.SLIDING_WINDOW: _attention("sliding_window"),
    LayerKind.CHUNKED_LOCAL: _attention("chunked_local"),
    LayerKind.MLA: _attention("mla"),
    LayerKind.COMPRESSED_MLA: _attention("compressed_mla"),  # laid out by vllm_dsv4, not grouped here
    LayerKind.MAMBA: _state,
    LayerKind.LINEAR_ATTENTION: _state,
    LayerKind.SHARED_KV: _nothing,  # reads the KV of the layer it shares
    LayerKind.NO_CACHE: _nothing,
}


def vllm_layer_spec(spec: LayerSpec, kv: KvDtype, tp: int) -> VllmLayerSpec | None:
    """A kvplan layer spec -> vLLM's view on one rank; None for layers without a cache."""
    return KIND_RULES[spec.kind](spec, kv, tp)


def _attention_block_size(specs: list[VllmLayerSpec], block_size: int, user_set: bool, mamba_cache_mode: str,
                          mamba_chunk_tokens: int) -> int:
    """Mamba hybrids: the attention block grows until one page holds one Mamba state; in mamba_cache_mode
    "all" it is also a multiple of lcm(the Mamba kernel's chunk, 16).

    Nemotron-H-like: state 2,134,016 B, attention 4,096 B/token -> 16 x cdiv(2,134,016, 16 x 4,096) = 528;
    in "all" mode with chunk 128: 128 x cdiv(cdiv(2,134,016, 4,096), 128) = 128 x cdiv(521, 128) = 640.
    """
    states = [s.state_bytes for s in specs if s.kind == "mamba"]
    attn = [s.bytes_per_token for s in specs if s.kind != "mamba"]
    if not states or not attn:
        return block_size
    per_token = max(attn)
    if mamba_cache_mode == "all":
        chunk = math.lcm(mamba_chunk_tokens, KERNEL_BLOCK_ALIGNMENT)
        needed = chunk * cdiv(cdiv(max(states), per_token), chunk)
    else:
        needed = KERNEL_BLOCK_ALIGNMENT * cdiv(max(states), KERNEL_BLOCK_ALIGNMENT * per_token)
    return needed if (not user_set or block_size < needed) else block_size


def kv_cache_layout(specs: list[VllmLayerSpec], block_size: int, *, block_size_set: bool = True,
                    mamba_cache_mode: str = "none", mamba_chunk_tokens: int = 2048,
                    extra_state_pages: int = 0) -> KvCacheLayout:
    """Group one rank's layers as get_kv_cache_groups does, and unify the page (`mamba_cache_mode` and the
    Mamba kernel's chunk: see KvCacheLayout and _attention_block_size)."""
    if not specs:
        raise InputError("the model has no layer with a KV cache on this rank; vLLM allocates no blocks")
    block = _attention_block_size(specs, block_size, block_size_set, mamba_cache_mode, mamba_chunk_tokens)
    by_key: dict[tuple, list[VllmLayerSpec]] = {}
    for s in specs:
        by_key.setdefault(s.key(), []).append(s)
    pages = {k: (v[0].state_bytes if v[0].kind == "mamba" else v[0].bytes_per_token * block) for k, v in by_key.items()}
    page = max(pages.values())  # Mamba pages are padded up to the attention page
    counts = [len(v) for v in by_key.values()]
    if len(by_key) == 1:
        s = specs[0]
        return KvCacheLayout((KvGroup(s.kind, len(specs), s.window_tokens, s.bytes_per_token, s.state_bytes, block),),
                             len(specs), page, mamba_cache_mode, extra_state_pages)
    blocks = {k: block if by_key[k][0].kind == "mamba" else _unified_block(block, p, page) for k, p in pages.items()}
    # Groups of equal size: the smallest kind's layer count, or the largest when they are within 1.5x
    # (gpt-oss-20b: 12 sliding + 12 full -> 2 groups of 12; Gemma-3-4B: 5 full + 29 sliding -> size 5,
    # 1 + 6 groups, the last sliding group padded by one layer).
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    groups: list[KvGroup] = []
    for key, members in by_key.items():
        n_groups = cdiv(len(members), group_size)
        s = members[0]
        for i in range(n_groups):
            groups.append(KvGroup(s.kind, len(members[i::n_groups]), s.window_tokens, s.bytes_per_token,
                                  s.state_bytes, blocks[key]))
    return KvCacheLayout(tuple(groups), group_size, page, mamba_cache_mode, extra_state_pages)


def uniform_type_layout(specs: list[VllmLayerSpec], block_size: int) -> KvCacheLayout:
    """Full-attention layers whose pages differ (TurboQuant's model-dtype boundary layers) in one group
    (UniformTypeKVCacheSpecs, 0.11+): a block id takes one page in every layer, each at its own size, so the
    pool's blocks are the memory over the sum of the pages. Llama-3.1-8B with turboquant_k8v4, 32-token blocks:
    4 x 4,096 x 32 + 28 x 1,568 x 32 = 1,929,216 B a block."""
    pages = [s.bytes_per_token * block_size for s in specs]
    block_bytes = sum(pages)
    group = KvGroup("full_attention", len(specs), 0, max(s.bytes_per_token for s in specs), 0, block_size,
                    page_bytes=block_bytes)
    return KvCacheLayout((group,), len(specs), max(pages), pool_block_bytes=block_bytes)


def _unified_block(block: int, page: int, largest: int) -> int:
    """unify_kv_cache_spec_page_size: a layer whose page is smaller than the largest takes a block that many
    times longer, when the page divides it. Gemma 4: sliding 8 x 256 x 2 x 2 B x 16 = 131,072 B a page,
    global 2 x 512 x 2 x 2 B x 16 = 65,536 -> the global layers' blocks hold 32 tokens."""
    if largest % page:
        raise InputError(
            f"layers with KV pages of {page:,} B and {largest:,} B on one rank; vLLM unifies pages only where the "
            "smaller divides the larger (--block-size or --kv-cache-dtype may help)"
        )
    return block * (largest // page)
