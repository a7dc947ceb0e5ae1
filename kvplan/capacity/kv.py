"""KV-cache bytes from per-layer specs: per token, per request, per batch, contiguous and paged, per GPU.

Engine-neutral accounting: contiguous = exactly the resident tokens (what a [batch, heads, seq, dim]
buffer holds); paged = whole blocks of `block_size` tokens per request (vLLM / SGLang style), with the
full blocks of a prefix shared by the whole batch stored once when prefix caching is on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from kvplan.errors import InputError
from kvplan.model.dtypes import KvDtype
from kvplan.model.specs import CompressedMLASpec, LayerKind, LayerSpec, ModelSpec
from kvplan.records import dataclass
from kvplan.units import cdiv


@dataclass(frozen=True)
class KvRequest:
    seq_tokens: int
    batch: int = 1
    block_size: int = 16
    tp: int = 1
    pp: int = 1
    shared_prefix_tokens: int = 0

    def validate(self) -> None:
        for name in ("seq_tokens", "batch", "block_size", "tp", "pp"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_tokens', '').replace('_', '-')} must be >= 1")
        if not 0 <= self.shared_prefix_tokens <= self.seq_tokens:
            raise InputError(
                f"--shared-prefix {self.shared_prefix_tokens} must be between 0 and --seq {self.seq_tokens}"
            )


def pp_stage_layers(num_layers: int, pp: int) -> list[range]:
    """Layers of each pipeline stage, as vLLM partitions them (get_pp_indices).

    Each stage gets num_layers // pp; the remainder goes one each to the stages before the last, counting
    back from the second to last (the last stage also holds the LM head). 61 layers over pp=4: 61 // 4 = 15,
    remainder 1 -> [15, 15, 16, 15].
    """
    if pp > num_layers:
        raise InputError(f"--pp {pp} is larger than the model's {num_layers} layers")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


@dataclass(frozen=True)
class KindKv:
    """One layer kind's share on one GPU (the fullest pipeline stage, one TP rank)."""

    kind: str
    layers: int
    bytes_per_token: int  # summed over this kind's layers on the GPU
    resident_tokens: int  # tokens one request keeps in each of these layers
    contiguous_bytes: int  # per request
    paged_bytes: int  # per request, whole blocks
    state_bytes: int  # per request, constant


@dataclass(frozen=True)
class KvEstimate:
    """KV figures for one request shape on one GPU, plus the unsharded model-wide figures."""

    request: KvRequest
    kv_dtype: KvDtype
    kinds: tuple[KindKv, ...]  # on the fullest stage, per TP rank
    stage_layer_counts: tuple[int, ...]
    fullest_stage: int
    # Whole model, unsharded (tp=1, pp=1): the textbook figures.
    model_bytes_per_token: int
    model_contiguous_bytes_per_request: int
    model_paged_bytes_per_request: int
    model_state_bytes_per_request: int

    @property
    def bytes_per_token(self) -> int:
        """Per GPU: bytes one more token adds to one request (full + MLA layers; windows stop growing)."""
        return sum(k.bytes_per_token for k in self.kinds)

    @property
    def contiguous_bytes_per_request(self) -> int:
        return sum(k.contiguous_bytes + k.state_bytes for k in self.kinds)

    @property
    def paged_bytes_per_request(self) -> int:
        return sum(k.paged_bytes + k.state_bytes for k in self.kinds)

    @property
    def state_bytes_per_request(self) -> int:
        return sum(k.state_bytes for k in self.kinds)

    @property
    def shared_prefix_bytes(self) -> int:
        """Per GPU: bytes of the common prefix that each request after the first does not store again.

        Only full blocks are shared (a 100-token prefix in blocks of 16 shares 6 blocks = 96 tokens), and only
        in layers that still hold the whole history (full attention, MLA): a sliding window or chunk that has
        moved past the prefix no longer holds it.
        """
        req = self.request
        shared_tokens = (req.shared_prefix_tokens // req.block_size) * req.block_size
        return sum(
            shared_tokens * k.bytes_per_token for k in self.kinds if k.resident_tokens == req.seq_tokens
        )

    @property
    def shared_prefix_saving_bytes(self) -> int:
        """Per GPU: what storing the batch's common prefix once saves (paged, prefix caching)."""
        return (self.request.batch - 1) * self.shared_prefix_bytes

    @property
    def batch_contiguous_bytes(self) -> int:
        return self.request.batch * self.contiguous_bytes_per_request

    @property
    def batch_paged_bytes(self) -> int:
        return self.request.batch * self.paged_bytes_per_request - self.shared_prefix_saving_bytes

    @property
    def paging_overhead_bytes_per_request(self) -> int:
        """What rounding each layer up to whole blocks costs one request."""
        return self.paged_bytes_per_request - self.contiguous_bytes_per_request

    @property
    def model_batch_contiguous_bytes(self) -> int:
        return self.request.batch * self.model_contiguous_bytes_per_request


def _whole_blocks(resident: int, seq_tokens: int, block_size: int) -> int:
    """cdiv(resident, B) blocks: a full-attention request of 100 tokens in blocks of 16 holds 7 = 112 tokens."""
    return cdiv(resident, block_size)


def _sliding_blocks(resident: int, seq_tokens: int, block_size: int) -> int:
    """A window of W tokens that starts mid-block spans one block more than cdiv(W, B): W=128, B=16 at
    seq=130 holds tokens 3..130 in blocks 0..8, nine blocks (never more than the whole request's)."""
    blocks = cdiv(resident, block_size)
    if resident < seq_tokens:
        blocks = min(cdiv(seq_tokens, block_size), blocks + 1)
    return blocks


def _blocks_of(rule: Callable[[int, int, int], int]) -> Callable[[LayerSpec, KvDtype, int, int, int], int]:
    """A kind whose tokens all cost the same: `rule`'s whole blocks of its resident tokens, at its bytes a
    token."""
    def paged(spec: LayerSpec, kv: KvDtype, tp: int, seq_tokens: int, block_size: int) -> int:
        blocks = rule(spec.resident_tokens(seq_tokens), seq_tokens, block_size)
        return blocks * block_size * spec.kv_bytes_per_token(kv, tp)
    return paged


def _compressed_paged(layer: LayerSpec, kv: KvDtype, tp: int, seq_tokens: int, block_size: int) -> int:
    """DeepSeek-V4: the window in whole blocks of latents, and the compressed entries in whole blocks of B / r
    entries (at least one a block: a block of 16 tokens holds no whole 128-token run). Ratio 4, B = 16,
    1,000 tokens: the window in 9 blocks of 16 latents, 250 entries in 63 blocks of 4."""
    spec = cast(CompressedMLASpec, layer)  # the one spec class of this kind (kind_tables)
    window = _sliding_blocks(min(seq_tokens, spec.window), seq_tokens, block_size) * block_size
    paged = window * spec.entry_bytes(kv)
    if spec.compress_ratio == 1:
        return paged
    per_block = max(1, block_size // spec.compress_ratio)
    blocks = cdiv(cdiv(seq_tokens, spec.compress_ratio), per_block)
    return paged + blocks * per_block * (spec.entry_bytes(kv) + spec.index_bytes(kv))


# Whole blocks one request holds in a layer of each kind, in bytes. Only a sliding window moves token by
# token; a chunk starts at a multiple of its size (Llama 4: 8,192 = 512 blocks of 16), so it is counted as
# whole blocks of its resident tokens.
KIND_RULES: dict[LayerKind, Callable[[LayerSpec, KvDtype, int, int, int], int]] = {
    LayerKind.FULL_ATTENTION: _blocks_of(_whole_blocks),
    LayerKind.SLIDING_WINDOW: _blocks_of(_sliding_blocks),
    LayerKind.CHUNKED_LOCAL: _blocks_of(_whole_blocks),
    LayerKind.MLA: _blocks_of(_whole_blocks),
    LayerKind.COMPRESSED_MLA: _compressed_paged,
    LayerKind.MAMBA: _blocks_of(_whole_blocks),  # no tokens resident: zero blocks (the state is counted apart)
    LayerKind.LINEAR_ATTENTION: _blocks_of(_whole_blocks),
    LayerKind.SHARED_KV: _blocks_of(_whole_blocks),
    LayerKind.NO_CACHE: _blocks_of(_whole_blocks),
}


def _kinds_for(counts: dict[LayerSpec, int], kv: KvDtype, req: KvRequest, tp: int) -> tuple[KindKv, ...]:
    """Per-kind totals; identical layers (frozen specs compare equal) are sized once, times their count."""
    acc: dict[tuple[str, int], dict[str, int]] = {}
    for spec, n in counts.items():
        resident = spec.resident_tokens(req.seq_tokens)
        key = (spec.kind, resident)
        a = acc.setdefault(key, {"layers": 0, "bpt": 0, "contig": 0, "paged": 0, "state": 0})
        bpt = spec.kv_bytes_per_token(kv, tp)
        a["layers"] += n
        a["bpt"] += n * bpt
        a["contig"] += n * spec.cache_bytes(kv, tp, req.seq_tokens)
        a["paged"] += n * KIND_RULES[spec.kind](spec, kv, tp, req.seq_tokens, req.block_size)
        a["state"] += n * spec.state_bytes(tp)
    return tuple(
        KindKv(
            kind=kind,
            layers=a["layers"],
            bytes_per_token=a["bpt"],
            resident_tokens=resident,
            contiguous_bytes=a["contig"],
            paged_bytes=a["paged"],
            state_bytes=a["state"],
        )
        for (kind, resident), a in acc.items()
    )


def estimate_kv(model: ModelSpec, kv: KvDtype, req: KvRequest) -> KvEstimate:
    """KV bytes of `model` for `req`, per GPU (fullest stage, one TP rank) and for the whole model."""
    req.validate()
    stages = pp_stage_layers(model.num_layers, req.pp)
    per_stage = [_kinds_for(model.spec_counts(stage), kv, req, req.tp) for stage in stages]

    def stage_bytes(kinds: tuple[KindKv, ...]) -> int:
        return sum(k.paged_bytes + k.state_bytes for k in kinds)

    fullest = max(range(len(per_stage)), key=lambda s: stage_bytes(per_stage[s]))
    whole = _kinds_for(model.spec_counts(range(model.num_layers)), kv, req, 1)
    return KvEstimate(
        request=req,
        kv_dtype=kv,
        kinds=per_stage[fullest],
        stage_layer_counts=tuple(len(s) for s in stages),
        fullest_stage=fullest,
        model_bytes_per_token=sum(k.bytes_per_token for k in whole),
        model_contiguous_bytes_per_request=sum(k.contiguous_bytes + k.state_bytes for k in whole),
        model_paged_bytes_per_request=sum(k.paged_bytes + k.state_bytes for k in whole),
        model_state_bytes_per_request=sum(k.state_bytes for k in whole),
    )
