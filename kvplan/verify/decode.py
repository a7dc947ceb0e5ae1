"""Prefill and cached decode through the allocated caches, with real attention arithmetic at the model's shapes.

Weights are random and shared by all layers of one shape: what is exercised is the cache (where each token is
written, what each query reads back), not the model's answers. Per layer: h = h + f(rmsnorm(h)), where f is
attention (GQA by folding each KV head's query group into the query axis), MLA in its absorbed form (queries
projected into the 576-wide latent, attention over the cached latents, values = their first kv_lora_rank
entries), or a recurrent update of the constant state tensors. MLP/MoE-only and shared-KV layers are passed
through unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field
from types import ModuleType
from typing import Any, cast

from kvplan.model.specs import AttentionSpec, LayerKind, LayerSpec, MLASpec, StateSpec, kv_heads_per_rank
from kvplan.records import dataclass
from kvplan.units import cdiv
from kvplan.verify.alloc import (
    LayerCache,
    StateCache,
    TokenCache,
    _first_visible,
    compressed_unsupported,
    state_shape,
)
from kvplan.verify.device import torch_dtype
from kvplan.verify.setup import LayerPlan, VerifySetup
from kvplan.verify.storage import roundtrip, storage_format

Reduce = Callable[[Any], Any]


@dataclass(frozen=True)
class Heads:
    """An attention layer's arithmetic shape on one rank: KV heads, query heads per KV head, K and V widths."""

    kv: int
    group: int
    dk: int
    dv: int
    latent: bool  # MLA: one latent serves as K, and its first dv entries as V


def _kv_heads(spec: LayerSpec, q_heads: int, tp: int) -> Heads:
    attn = cast(AttentionSpec, spec)
    kv = kv_heads_per_rank(attn.num_kv_heads, tp)
    return Heads(kv, cdiv(q_heads, kv), attn.head_dim, attn.v_dim, latent=False)


def _latent_heads(spec: LayerSpec, q_heads: int, tp: int) -> Heads:
    """MLA in absorbed form: every query head reads the one 576-wide latent; values are its first 512."""
    mla = cast(MLASpec, spec)
    return Heads(1, q_heads, mla.latent_dim, mla.kv_lora_rank, latent=True)


SCORE_BYTES = 1 << 30  # attention scores one masked prefill slice may hold
SPLIT_TOKENS = 512  # most slots one partial product of a decode step's P @ V sums over
STATE_DECAY = 0.9  # a recurrent state keeps 90% of itself per token, so long prompts stay finite


def _split_product(torch: ModuleType, probs: Any, vals: Any) -> Any:
    """probs [B, S, G] and vals [B, S, W] -> probs^T @ vals [B, G, W], summed in parts of c slots, c the largest
    divisor of S up to SPLIT_TOKENS (S = 32,768 -> 64 parts of 512), so that B x S / c products run side by
    side instead of B long ones. An S with no divisor of 128 or more is summed in one part."""
    big, slots, group = probs.shape
    c = next(d for d in range(min(SPLIT_TOKENS, slots), 0, -1) if slots % d == 0)
    if c < 128:
        c = slots
    parts = slots // c
    partial = torch.bmm(probs.view(big * parts, c, group).transpose(1, 2), vals.reshape(big * parts, c, -1))
    total = partial.view(big, parts, group, -1).sum(1, dtype=torch.promote_types(probs.dtype, torch.float32))
    return total.to(probs.dtype)  # parts summed in float32 at least: 64 bf16 partials would lose bits


class Weights:
    """Random projections, one per (name, shape), created on first use and shared by every layer that asks."""

    def __init__(self, torch: ModuleType, device: Any, seed: int) -> None:
        self.torch, self.device = torch, device
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.cache: dict[tuple[str, int, int, Any], Any] = {}

    def get(self, name: str, rows: int, cols: int, dtype: Any) -> Any:
        key = (name, rows, cols, dtype)
        if key not in self.cache:
            w = self.torch.randn(rows, cols, generator=self.gen, device=self.device) / math.sqrt(rows)
            self.cache[key] = w.to(dtype)
        return self.cache[key]

    def nbytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.cache.values())


@dataclass
class StepLog:
    """What each decode step saw: per decoded layer the tokens it attended to and the tokens stored."""

    seen: list[dict[int, int]] = field(default_factory=list)
    stored: list[dict[int, int]] = field(default_factory=list)
    kv_read_bytes: list[int] = field(default_factory=list)


class Decoder:
    def __init__(
        self,
        torch: ModuleType,
        setup: VerifySetup,
        caches: list[LayerCache | None],
        device: Any,
        dtype: Any,
        *,
        seed: int = 1,
        reduce: Reduce | None = None,
        decode_layers: int | None = None,
    ) -> None:
        self.torch, self.setup, self.caches, self.device, self.dtype = torch, setup, caches, device, dtype
        self.F = torch.nn.functional
        self.weights = Weights(torch, device, seed)
        self.reduce = reduce or (lambda t: t)
        n = len(setup.layers) if decode_layers is None else min(decode_layers, len(setup.layers))
        self.decoded = list(range(n))  # positions in setup.layers that the arithmetic runs through
        self.hidden = setup.model.hidden_size
        self.q_heads = cdiv(setup.model.num_attention_heads, setup.tp)  # query heads on this rank

    # ---- one layer -------------------------------------------------------------------------------------

    def _attention(
        self, plan: LayerPlan, cache: TokenCache | None, x: Any, pos0: int, rows: slice, log: dict[str, int] | None
    ) -> Any:
        """x [b, T, hidden] at positions pos0.. -> [b, T, hidden]. T == 1 with a cache reads the cache."""
        torch = self.torch
        b, T, _ = x.shape
        heads = ATTENTION_HEADS[plan.spec.kind](plan.spec, self.q_heads, self.setup.tp)
        kv, group, dk, dv, mla = heads.kv, heads.group, heads.dk, heads.dv, heads.latent
        w = self.weights
        q = (x @ w.get("q", self.hidden, kv * group * dk, self.dtype)).view(b, T, kv, group, dk)
        k = (x @ w.get("k", self.hidden, kv * dk, self.dtype)).view(b, T, kv, dk).transpose(1, 2)  # [b, kv, T, dk]
        v = None if mla else (x @ w.get("v", self.hidden, kv * dv, self.dtype)).view(b, T, kv, dv).transpose(1, 2)
        values = [k] if mla else [k, v]
        positions = range(pos0, pos0 + T)
        if cache is not None:
            cache.update(positions, values, rows)
        if cache is not None and T == 1:
            o, seen = self._decode_attention(cache, q.view(b, kv, group, dk), pos0, dv, mla)
            if log is not None:
                log["seen"], log["kv_read_bytes"] = seen, cache.slots * sum(s.bytes_per_slot for s in cache.stores) * b
            o = o.reshape(b, 1, kv * group * dv)
        else:
            # prefill / recompute: causal attention over the fresh K/V, read back as the cache would store them.
            fmt = [storage_format(torch, self.setup.kv_dtype, t.shape[-1]) for t in values]
            keys = roundtrip(torch, fmt[0], k)
            vals = keys[..., :dv] if mla else roundtrip(torch, fmt[1], v)
            keys = keys.repeat_interleave(group, dim=1)  # [b, kv*group, T, dk]
            vals = vals.repeat_interleave(group, dim=1)
            qh = q.permute(0, 2, 3, 1, 4).reshape(b, kv * group, T, dk)
            o = self._prefill_attention(plan, qh, keys, vals, pos0)
            o = o.transpose(1, 2).reshape(b, T, kv * group * dv)
        return self.reduce(o @ w.get("o", kv * group * dv, self.hidden, self.dtype))

    def _decode_attention(self, cache: TokenCache, q: Any, pos: int, dv: int, mla: bool) -> tuple[Any, int]:
        """One query token per request, q [b, kv, group, dk], over every slot of the cache -> ([b, kv, group,
        dv], tokens seen). Split as flash-decoding splits it, so the whole GPU streams the cache at once.

        Scores are one product per request (and head, where a head's tokens lie together) with the slots on
        the long axis: K [B, slots, W] @ Q [B, W, G]. Where heads are interleaved (paged pools), Q is block
        diagonal, each head's queries facing only its own dk columns: the zeros add nothing, and K is still
        read once. Slots past the written ones get weight 0. P @ V sums over the slots in SPLIT_TOKENS parts,
        each its own product, then adds the parts (32,768 slots: 64 parts per request and head).
        """
        torch = self.torch
        b, kv, group, dk = q.shape
        n, mask, seen = cache.readable(pos)
        store = cache.stores[0]
        keys = store.matrix(self.dtype)
        vals = keys[..., :dv] if mla else cache.stores[1].matrix(self.dtype)
        q = q * dk**-0.5  # scaled_dot_product_attention's default scale
        interleaved = store.heads_interleaved and kv > 1
        if interleaved:
            heads = torch.arange(kv, device=q.device)
            block_q = q.new_zeros(b, kv, dk, kv, group)
            block_q[:, heads, :, heads, :] = q.permute(1, 0, 3, 2)  # [kv, b, dk, group] on the diagonal
            queries = block_q.view(b, kv * dk, kv * group)
        else:
            queries = q.reshape(b * kv, group, dk).transpose(1, 2)
        scores = torch.bmm(keys, queries)  # [B, slots, G]
        logits = scores[:, :n].float()
        if mask is not None:
            logits = logits.masked_fill(~mask.view(1, -1, 1), float("-inf"))
        probs = torch.zeros_like(scores)
        probs[:, :n] = torch.softmax(logits, dim=1).to(scores.dtype)
        out = _split_product(torch, probs, vals)  # [B, G, Wv]
        if interleaved:
            out = out.view(b, kv, group, kv, dv).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)
        return out.reshape(b, kv, group, dv), seen

    def _prefill_attention(self, plan: LayerPlan, q: Any, k: Any, v: Any, pos0: int) -> Any:
        """Causal attention of q [b, H, T, dk] over k/v [b, H, T, d] from position pos0, within windows/chunks.

        Plain causal full attention with head_dim <= 256 is one flash call. Windows, chunks and MLA's 576-wide
        latent need a mask or fall outside flash's head sizes, so queries go in slices that keep the scores
        under SCORE_BYTES: 2 requests x 16 heads x 32,768 keys x 4 B = 4 MiB per query row -> 256 rows a slice.
        """
        torch, F = self.torch, self.F
        b, heads, T, dk = q.shape
        windowed = plan.spec.window_tokens is not None
        if not windowed and dk <= 256:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        rows = max(1, SCORE_BYTES // (b * heads * T * 4))
        pos = torch.arange(pos0, pos0 + T, device=q.device)
        outs = []
        for start in range(0, T, rows):
            stop = min(T, start + rows)
            qpos = pos[start:stop]
            lo = torch.tensor([_first_visible(plan, int(p)) for p in range(pos0 + start, pos0 + stop)], device=q.device)
            kpos = pos[:stop]
            mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] >= lo[:, None])
            outs.append(
                F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], attn_mask=mask)
            )
        return torch.cat(outs, 2)

    def _state(self, plan: LayerPlan, states: list[Any], x: Any) -> Any:
        """Recurrent update, token by token: a conv window shifts in a new column; a [P, Q] state decays and
        adds a rank-one outer product. Each state is read out and projected back to the hidden size."""
        b, T, _ = x.shape
        w = self.weights
        dt = self.dtype  # arithmetic in the compute dtype; each state keeps its own dtype in memory
        # Input projections for all T tokens at once; only the recurrence itself steps token by token.
        proj = []
        for s in states:
            if s.dim() == 3:  # [b, channels, kernel - 1]: a shift register
                proj.append((x @ w.get("conv_in", self.hidden, s.shape[1], dt),))
            else:  # [b, P, Q] after flattening the leading dims
                p_dim, q_dim = s[0].numel() // s.shape[-1], s.shape[-1]
                proj.append(
                    tuple(
                        x @ w.get(n, self.hidden, d, dt)
                        for n, d in (("ssm_a", p_dim), ("ssm_b", q_dim), ("ssm_c", q_dim))
                    )
                )
        reads: list[list[Any]] = [[] for _ in states]
        for t in range(T):
            for j, s in enumerate(states):
                if s.dim() == 3:
                    s.copy_(self.torch.cat([s[..., 1:].to(dt), proj[j][0][:, t, :, None]], -1))
                    reads[j].append((s.to(dt) * w.get("conv_w", s.shape[1], s.shape[2], dt)).sum(-1))
                else:
                    flat = s.view(b, -1, s.shape[-1])
                    a, bq, cq = (p[:, t] for p in proj[j])
                    flat.copy_(flat.to(dt) * STATE_DECAY + a[:, :, None] * bq[:, None, :])
                    reads[j].append((flat.to(dt) @ cq[..., None]).squeeze(-1))
        out = 0
        for j, r in enumerate(reads):
            stacked = self.torch.stack(r, 1)  # [b, T, width]
            out = out + stacked @ w.get(f"state_out{j}", stacked.shape[-1], self.hidden, dt)
        return self.reduce(out)

    def _states_for(self, cache: StateCache | None, plan: LayerPlan, rows: slice, b: int) -> list[Any]:
        if cache is not None:
            return [s[rows] for s in cache.states]  # views: updated in place
        spec = cast(StateSpec, plan.spec)
        return [
            self.torch.zeros(
                (b, *state_shape(t.shape, t.split_dim, self.setup.tp)),
                dtype=torch_dtype(self.torch, t.dtype),
                device=self.device,
            )
            for t in spec.tensors
        ]

    def _norm(self, h: Any) -> Any:
        return h * self.torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)

    def forward(self, x: Any, pos0: int, rows: slice, *, use_cache: bool, log: dict[int, dict] | None = None) -> Any:
        """The hidden stream [b, T, hidden] through the decoded layers."""
        h = x
        for i in self.decoded:
            cache = self.caches[i] if use_cache else None
            h = LAYER_STEPS[self.setup.layers[i].spec.kind](self, i, cache, h, pos0, rows, log)
        return h

    def attention_step(
        self, i: int, cache: LayerCache | None, h: Any, pos0: int, rows: slice, log: dict[int, dict] | None
    ) -> Any:
        """h + attention through layer i (position i of the stage), logging what a decode step saw."""
        plan = self.setup.layers[i]
        if not plan.resident_tokens:
            return h
        assert cache is None or isinstance(cache, TokenCache)
        entry = None if log is None else log.setdefault(i, {})
        return h + self._attention(plan, cache, self._norm(h), pos0, rows, entry)

    def state_step(
        self, i: int, cache: LayerCache | None, h: Any, pos0: int, rows: slice, log: dict[int, dict] | None
    ) -> Any:
        """h + the recurrent update of layer i's constant state."""
        plan = self.setup.layers[i]
        assert cache is None or isinstance(cache, StateCache)
        return h + self._state(plan, self._states_for(cache, plan, rows, h.shape[0]), self._norm(h))

    def pass_through(
        self, i: int, cache: LayerCache | None, h: Any, pos0: int, rows: slice, log: dict[int, dict] | None
    ) -> Any:
        """MLP/MoE-only and shared-KV layers: the stream goes on unchanged (no cache to exercise)."""
        return h

    # ---- phases ----------------------------------------------------------------------------------------

    def prefill(self, x: Any, rows_per_chunk: int) -> None:
        """Fill the caches with the prompt x [batch, T, hidden], a few requests at a time."""
        for start in range(0, x.shape[0], rows_per_chunk):
            rows = slice(start, min(start + rows_per_chunk, x.shape[0]))
            self.forward(x[rows], 0, rows, use_cache=True)

    def decode_one_token(self, x: Any, pos: int, steps: StepLog | None = None) -> Any:
        """x [batch, hidden] is the token at `pos`; returns its hidden state after the decoded layers."""
        log: dict[int, dict] = {}
        before = self._stored() if steps is not None else {}
        out = self.forward(x[:, None], pos, slice(None), use_cache=True, log=log)[:, 0]
        if steps is not None:
            steps.seen.append({i: e["seen"] for i, e in log.items()})
            after = self._stored()
            steps.stored.append({i: after[i] - before[i] for i in before})
            steps.kv_read_bytes.append(sum(e["kv_read_bytes"] for e in log.values()) + self.state_bytes(x.shape[0]))
        return out

    def recompute(self, x: Any, rows_per_chunk: int) -> Any:
        """The same stream without any cache: every token's K/V recomputed from scratch, [batch, T, hidden]."""
        outs = []
        for start in range(0, x.shape[0], rows_per_chunk):
            rows = slice(start, min(start + rows_per_chunk, x.shape[0]))
            outs.append(self.forward(x[rows], 0, rows, use_cache=False))
        return self.torch.cat(outs, 0)

    def _stored(self) -> dict[int, int]:
        """Tokens held per decoded attention layer (slots written so far)."""
        return {i: int((c.slot_pos >= 0).sum()) for i in self.decoded if isinstance(c := self.caches[i], TokenCache)}

    def state_bytes(self, batch: int) -> int:
        """Bytes of recurrent state one decode step reads (and rewrites) in the decoded layers."""
        total = 0
        for i in self.decoded:
            c = self.caches[i]
            if isinstance(c, StateCache):
                total += sum(s[:batch].numel() * s.element_size() for s in c.states)
        return total

    def expected_seen(self, i: int, pos: int) -> int:
        """Tokens the query at `pos` should see in layer i: pos + 1, or its window / chunk."""
        return pos - _first_visible(self.setup.layers[i], pos) + 1


def _not_attention(spec: LayerSpec, q_heads: int, tp: int) -> Heads:
    raise ValueError(f"a {spec.kind} layer has no attention heads")


# The attention shape of each kind (LAYER_STEPS sends only the attention kinds to _attention).
ATTENTION_HEADS: dict[LayerKind, Callable[[LayerSpec, int, int], Heads]] = {
    LayerKind.FULL_ATTENTION: _kv_heads,
    LayerKind.SLIDING_WINDOW: _kv_heads,
    LayerKind.CHUNKED_LOCAL: _kv_heads,
    LayerKind.MLA: _latent_heads,
    LayerKind.COMPRESSED_MLA: compressed_unsupported,
    LayerKind.MAMBA: _not_attention,
    LayerKind.LINEAR_ATTENTION: _not_attention,
    LayerKind.SHARED_KV: _not_attention,
    LayerKind.NO_CACHE: _not_attention,
}

# What decoding does in a layer of each kind: (decoder, stage position, cache, h, pos0, rows, log) -> h.
Step = Callable[[Decoder, int, LayerCache | None, Any, int, slice, dict[int, dict] | None], Any]
LAYER_STEPS: dict[LayerKind, Step] = {
    LayerKind.FULL_ATTENTION: Decoder.attention_step,
    LayerKind.SLIDING_WINDOW: Decoder.attention_step,
    LayerKind.CHUNKED_LOCAL: Decoder.attention_step,
    LayerKind.MLA: Decoder.attention_step,
    LayerKind.COMPRESSED_MLA: compressed_unsupported,
    LayerKind.MAMBA: Decoder.state_step,
    LayerKind.LINEAR_ATTENTION: Decoder.state_step,
    LayerKind.SHARED_KV: Decoder.pass_through,
    LayerKind.NO_CACHE: Decoder.pass_through,
}
