"""Per-layer cache buffers, allocated once at the planned size from the layer specs (gpt-fast's KVCache idea).

Layouts: contiguous K/V of [batch, kv_heads, slots, head_dim]; paged pools of [num_blocks, block_size, kv_heads,
head_dim] with a block table per request. Slots per request are the resident tokens (contiguous) or the planned
whole blocks (paged). Windows and chunks are rings: position p lives in slot p % slots, so a 128-token window in
blocks of 16 keeps 9 blocks = 144 slots and every token of the window stays readable while the ring turns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, cast

from kvplan.errors import InputError
from kvplan.model.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    LayerKind,
    LayerSpec,
    MLASpec,
    SlidingWindowSpec,
    StateSpec,
    kv_heads_per_rank,
)
from kvplan.units import cdiv
from kvplan.verify.device import torch_dtype
from kvplan.verify.setup import COMPRESSED_REFUSAL, LayerPlan, VerifySetup
from kvplan.verify.storage import Format, decode, encode, storage_format


def _zeros(torch: ModuleType, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """Every cache tensor comes from here (zeros: a paged gather may read slots no token has written yet)."""
    return torch.zeros(shape, dtype=dtype, device=device)


class TokenStore:
    """One per-token tensor of a layer (K, V, or an MLA latent) for the whole batch, plus its scales."""

    def __init__(
        self,
        torch: ModuleType,
        *,
        layout: str,
        batch: int,
        heads: int,
        dim: int,
        slots: int,
        block_size: int,
        fmt: Format,
        device: Any,
    ) -> None:
        self.torch, self.layout, self.heads, self.dim, self.slots, self.fmt = torch, layout, heads, dim, slots, fmt
        self.block_size = block_size
        if layout == "contiguous":
            lead: tuple[int, ...] = (batch, heads, slots)  # [batch, kv_heads, seq, head_dim]
        else:
            blocks = slots // block_size  # the planned whole blocks of one request
            lead = (batch * blocks, block_size, heads)  # [num_blocks, block_size, kv_heads, head_dim]
            self._blocks = (batch, blocks)
        self._block_table: Any = None
        self.codes = _zeros(torch, (*lead, fmt.code_width), fmt.code_dtype, device)
        self.scales: Any = (
            None if fmt.scale_dtype is None else _zeros(torch, (*lead, fmt.scale_width), fmt.scale_dtype, device)
        )

    def tensors(self) -> list[Any]:
        return [t for t in (self.codes, self.scales) if t is not None]

    @property
    def block_table(self) -> Any:
        """[batch, blocks]: request b owns blocks b*blocks .. (b+1)*blocks-1. Metadata, made on first use so
        the allocation the meter brackets holds the KV tensors only."""
        if self._block_table is None:
            batch, blocks = self._blocks
            ids = self.torch.arange(batch * blocks, dtype=self.torch.long, device=self.codes.device)
            self._block_table = ids.view(batch, blocks)
        return self._block_table

    @property
    def bytes_per_slot(self) -> int:
        """Bytes one token slot of one request takes, all heads (the scale tensor included)."""
        per = self.codes.element_size() * self.fmt.code_width
        if self.scales is not None:
            per += self.scales.element_size() * self.fmt.scale_width
        return per * self.heads

    def write(self, slot_idx: Any, x: Any, rows: slice) -> None:
        """Store x [rows, heads, n, dim] at slots slot_idx [n] (a host tensor) of the requests in `rows`."""
        codes, scales = encode(self.torch, self.fmt, x)
        if len(slot_idx) == 1:
            # A decode step writes one slot: index with host integers, since moving a host index tensor to the
            # GPU would wait for the device at every layer.
            self._write_one(int(slot_idx[0]), codes, scales, rows)
            return
        slot_idx = slot_idx.to(self.codes.device)
        if self.layout == "contiguous":
            self.codes[rows, :, slot_idx] = codes
            if scales is not None:
                self.scales[rows, :, slot_idx] = scales
            return
        blk = self.block_table[rows][:, slot_idx // self.block_size]  # [rows, n] physical block ids
        off = slot_idx % self.block_size  # [n]
        self.codes[blk, off] = codes.transpose(1, 2)  # [rows, n, heads, width]
        if scales is not None:
            self.scales[blk, off] = scales.transpose(1, 2)

    def _write_one(self, slot: int, codes: Any, scales: Any | None, rows: slice) -> None:
        if self.layout == "contiguous":
            self.codes[rows, :, slot : slot + 1] = codes
            if scales is not None:
                self.scales[rows, :, slot : slot + 1] = scales
            return
        blk = self.block_table[rows][:, slot // self.block_size : slot // self.block_size + 1]  # [rows, 1]
        off = slot % self.block_size
        self.codes[blk, off] = codes.transpose(1, 2)
        if scales is not None:
            self.scales[blk, off] = scales.transpose(1, 2)

    @property
    def heads_interleaved(self) -> bool:
        """Paged pools keep a token's heads side by side ([.., block_size, heads, dim]); contiguous caches keep
        each head's tokens together ([batch, heads, slots, dim])."""
        return self.layout == "paged"

    def matrix(self, dtype: Any) -> Any:
        """Every slot of every request as one matrix per batch entry, in `dtype`, without copying a plain float
        cache of that dtype: contiguous [batch * heads, slots, dim]; paged [batch, slots, heads * dim].

        The paged view reads the pool through the block table without a gather because this table hands
        request r the physical blocks r * blocks .. (r + 1) * blocks - 1 in order (see block_table), so request
        r's slots are rows r of pool.view(batch, blocks * block_size, ...): the bytes a block-table kernel
        such as vLLM's reads, in the same order.
        """
        values = decode(self.torch, self.fmt, self.codes, self.scales, self.dim, dtype)
        if self.layout == "contiguous":
            batch, heads, slots, dim = values.shape
            return values.view(batch * heads, slots, dim)
        batch, blocks = self._blocks
        return values.view(batch, blocks * self.block_size, self.heads * self.dim)


@dataclass
class TokenCache:
    """An attention layer's cache (K and V, or one MLA latent) and which position each slot holds."""

    plan: LayerPlan
    stores: tuple[TokenStore, ...]
    slot_pos: Any  # [slots] int64 on the host: the position held by each slot, -1 while empty
    block_owner: Any = None  # paged: [blocks] the logical block each physical block of the ring holds

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def slots(self) -> int:
        return self.stores[0].slots

    def tensors(self) -> list[Any]:
        return [t for s in self.stores for t in s.tensors()]

    def update(self, positions: range, values: Sequence[Any], rows: slice) -> None:
        """Write the last `slots` of `positions` (each [rows, heads, n, dim] in `values`) at position % slots."""
        torch = self.stores[0].torch
        drop = max(0, len(positions) - self.slots)
        kept = torch.arange(positions[drop], positions[-1] + 1, dtype=torch.long)  # positions are consecutive
        slot_idx = kept % self.slots
        for store, x in zip(self.stores, values, strict=True):
            store.write(slot_idx, x[:, :, drop:], rows)
        self.slot_pos[slot_idx] = kept
        store = self.stores[0]
        if store.layout == "paged":
            # A block is handed out whole: entering logical block j takes over physical block j % blocks, and
            # every token it held is gone, still in the window or not. A 128-token window in 8 blocks of 16
            # therefore loses tokens when it starts mid-block; 9 blocks (the estimate's count) do not.
            bs = store.block_size
            self.block_owner.scatter_reduce_(0, slot_idx // bs, kept // bs, reduce="amax")
            owner = self.block_owner[torch.arange(self.slots) // bs]
            self.slot_pos[(self.slot_pos >= 0) & (self.slot_pos // bs != owner)] = -1

    def visible(self, pos: int) -> Any:
        """Which slots the token at `pos` may attend to: [slots] bool (causal, within its window or chunk)."""
        sp = self.slot_pos
        lo = _first_visible(self.plan, pos)
        return (sp >= lo) & (sp <= pos)

    def readable(self, pos: int) -> tuple[int, Any | None, int]:
        """What the token at `pos` attends over: slots 0..n-1 (positions are written in order, so those were
        written), a device mask over them (None when every one counts), and how many tokens it sees."""
        n_read = min(self.slots, pos + 1)
        mask = self.visible(pos)[:n_read]
        seen = int(mask.sum())
        if seen == n_read:
            return n_read, None, seen
        return n_read, mask.to(self.stores[0].codes.device), seen


def _from_start(spec: LayerSpec, pos: int) -> int:
    return 0


def _window_start(spec: LayerSpec, pos: int) -> int:
    return max(0, pos - cast(SlidingWindowSpec, spec).sliding_window + 1)


def _chunk_start(spec: LayerSpec, pos: int) -> int:
    size = cast(ChunkedLocalAttentionSpec, spec).attention_chunk_size
    return pos - pos % size


def compressed_unsupported(*_: object) -> NoReturn:
    """DeepSeek-V4's layers: verify refuses them in prepare(), before any table is consulted."""
    raise InputError(COMPRESSED_REFUSAL)


def _attends_nothing(spec: LayerSpec, pos: int) -> int:
    raise ValueError(f"a {spec.kind} layer attends over no cached tokens")


# First position the token at `pos` attends to, per kind: 0 for full attention and MLA, pos - W + 1 in a
# window of W, the chunk's start (pos 9,000 in chunks of 8,192 -> 8,192). Layers without tokens have none.
FIRST_VISIBLE: dict[LayerKind, Callable[[LayerSpec, int], int]] = {
    LayerKind.FULL_ATTENTION: _from_start,
    LayerKind.SLIDING_WINDOW: _window_start,
    LayerKind.CHUNKED_LOCAL: _chunk_start,
    LayerKind.MLA: _from_start,
    LayerKind.COMPRESSED_MLA: compressed_unsupported,
    LayerKind.MAMBA: _attends_nothing,
    LayerKind.LINEAR_ATTENTION: _attends_nothing,
    LayerKind.SHARED_KV: _attends_nothing,
    LayerKind.NO_CACHE: _attends_nothing,
}


def _first_visible(plan: LayerPlan, pos: int) -> int:
    """First position `pos` attends to in this layer (FIRST_VISIBLE)."""
    return FIRST_VISIBLE[plan.spec.kind](plan.spec, pos)


@dataclass
class StateCache:
    """A recurrent layer's constant per-request state: one [batch, *shape-per-rank] tensor per StateTensor."""

    plan: LayerPlan
    states: tuple[Any, ...]

    @property
    def kind(self) -> str:
        return self.plan.kind

    def tensors(self) -> list[Any]:
        return list(self.states)


LayerCache = TokenCache | StateCache


def state_shape(shape: tuple[int, ...], split_dim: int | None, tp: int) -> tuple[int, ...]:
    """A state tensor's shape on one rank, split as StateTensor.bytes splits it: (6144, 3) over tp 2 -> (3072, 3)."""
    dims = list(shape)
    if split_dim is not None and tp > 1:
        dims[split_dim] = cdiv(dims[split_dim], tp)
    return tuple(dims)


def token_slots(plan: LayerPlan, layout: str) -> int:
    return plan.resident_tokens if layout == "contiguous" else plan.paged_tokens


# Allocates one layer's cache for `batch` requests: (torch, setup, plan, device, batch) -> cache or None.
Allocator = Callable[[ModuleType, VerifySetup, LayerPlan, Any, int], LayerCache | None]


def _state_cache(torch: ModuleType, setup: VerifySetup, plan: LayerPlan, device: Any, batch: int) -> LayerCache | None:
    """One [batch, *shape-per-rank] tensor per state tensor, in the state's own dtype."""
    states = tuple(
        _zeros(torch, (batch, *state_shape(t.shape, t.split_dim, setup.tp)), torch_dtype(torch, t.dtype), device)
        for t in cast(StateSpec, plan.spec).tensors
    )
    return StateCache(plan, states) if states else None


def _kv_stores(spec: LayerSpec, tp: int) -> tuple[tuple[int, int], ...]:
    """K and V: (heads on this rank, width) each."""
    attn = cast(AttentionSpec, spec)
    heads = kv_heads_per_rank(attn.num_kv_heads, tp)
    return ((heads, attn.head_dim), (heads, attn.v_dim))


def _latent_store(spec: LayerSpec, tp: int) -> tuple[tuple[int, int], ...]:
    """MLA: one latent, the same on every rank."""
    return ((1, cast(MLASpec, spec).latent_dim),)


def _token_cache(stores_of: Callable[[LayerSpec, int], tuple[tuple[int, int], ...]]) -> Allocator:
    """An allocator of per-token stores (contiguous or paged) shaped by `stores_of`."""

    def allocate_tokens(
        torch: ModuleType, setup: VerifySetup, plan: LayerPlan, device: Any, batch: int
    ) -> LayerCache | None:
        if plan.resident_tokens == 0:
            return None
        layout, block_size = setup.layout, setup.estimate.request.block_size
        slots = token_slots(plan, layout)
        stores = tuple(
            TokenStore(
                torch,
                layout=layout,
                batch=batch,
                heads=heads,
                dim=dim,
                slots=slots,
                block_size=block_size,
                fmt=storage_format(torch, setup.kv_dtype, dim),
                device=device,
            )
            for heads, dim in stores_of(plan.spec, setup.tp)
        )
        owner = torch.full((slots // block_size,), -1, dtype=torch.long) if layout == "paged" else None
        return TokenCache(plan, stores, torch.full((slots,), -1, dtype=torch.long), owner)

    return allocate_tokens


def _no_cache(torch: ModuleType, setup: VerifySetup, plan: LayerPlan, device: Any, batch: int) -> LayerCache | None:
    return None


# How each kind's cache is allocated (None: the layer stores nothing: MLP/MoE-only, shared KV).
ALLOCATORS: dict[LayerKind, Allocator] = {
    LayerKind.FULL_ATTENTION: _token_cache(_kv_stores),
    LayerKind.SLIDING_WINDOW: _token_cache(_kv_stores),
    LayerKind.CHUNKED_LOCAL: _token_cache(_kv_stores),
    LayerKind.MLA: _token_cache(_latent_store),
    LayerKind.COMPRESSED_MLA: compressed_unsupported,
    LayerKind.MAMBA: _state_cache,
    LayerKind.LINEAR_ATTENTION: _state_cache,
    LayerKind.SHARED_KV: _no_cache,
    LayerKind.NO_CACHE: _no_cache,
}


def allocate_layer(
    torch: ModuleType, setup: VerifySetup, plan: LayerPlan, device: Any, batch: int | None = None
) -> LayerCache | None:
    """The cache of one layer, or None for a layer that stores nothing (MLP/MoE-only, shared KV)."""
    return ALLOCATORS[plan.spec.kind](torch, setup, plan, device, setup.batch if batch is None else batch)


def allocate(
    torch: ModuleType,
    setup: VerifySetup,
    device: Any,
    *,
    batch: int | None = None,
    on_layer: Callable[[LayerPlan, LayerCache | None], None] | None = None,
    before_layer: Callable[[], None] | None = None,
) -> list[LayerCache | None]:
    """Every layer's cache of the stage, in layer order; `before_layer`/`on_layer` let the meter bracket each one."""
    caches: list[LayerCache | None] = []
    for plan in setup.layers:
        if before_layer is not None:
            before_layer()
        cache = allocate_layer(torch, setup, plan, device, batch)
        caches.append(cache)
        if on_layer is not None:
            on_layer(plan, cache)
    return caches
