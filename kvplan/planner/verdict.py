"""One verdict per deployment, from one engine account: fits, the limit, max requests, the longest context.

Every figure a command prints comes from here, so they cannot disagree:
- the workload's requests are spread over every KV cache (instances x data-parallel ranks): 40 requests on
  four 1-GPU replicas are 10 per cache;
- fits <=> the engine accepts the deployment, every pool holds that share, and the scheduler runs it at once
  (vLLM max_num_seqs);
- max_requests = what each cache holds (the smallest pool, then the scheduler cap) x caches, so
  max_requests >= concurrency <=> fits.
"""

from __future__ import annotations

from dataclasses import field, replace

from kvplan.capacity.deployment import MAX_CONCURRENCY, Deployment
from kvplan.engines import get_engine
from kvplan.engines.base import EngineAccount, KvPool
from kvplan.engines.checkpoint_kv import auto_note, checkpoint_kv_dtype
from kvplan.model.specs import kv_heads_per_rank
from kvplan.planner.workload import WorkloadFit, with_prefix_hit_rate, workload_concurrency
from kvplan.records import dataclass

# What limits a deployment that does not fit, besides an engine refusal code (kvplan.engines.base).
LIMIT_FITS = "fits"
LIMIT_KV = "kv_cache"
LIMIT_REQUEST_CAP = "request_cap"


@dataclass(frozen=True)
class PoolUse:
    """One pool and what the workload's share of requests takes from it."""

    pool: KvPool
    needed_units: int

    @property
    def needed_bytes(self) -> int:
        return self.needed_units * self.pool.unit_bytes

    @property
    def fill(self) -> float:
        """Needed over budget: 1.0 is exactly full; > 1 does not fit."""
        if self.pool.budget_units <= 0:
            return float("inf") if self.needed_units else 0.0
        return self.needed_units / self.pool.budget_units


@dataclass(frozen=True)
class Verdict:
    deployment: Deployment
    account: EngineAccount
    gpus_per_instance: int
    kv_caches: int  # independent KV caches: instances x data-parallel ranks
    requests_per_cache: int
    pools: tuple[PoolUse, ...]
    fits: bool
    limit: str  # LIMIT_FITS, LIMIT_KV, LIMIT_REQUEST_CAP, or the engine's refusal code
    max_requests: int  # whole requests held and run at once, over every cache
    longest_context_tokens: int | None  # longest max-model-len at which the workload fits (None: not computed)
    notes: tuple[str, ...] = field(default_factory=tuple)
    workload: WorkloadFit | None = None  # the workload's real lengths resident at once (needs a request mix)

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_instance * self.deployment.instances

    @property
    def max_concurrency(self) -> float:
        """The engine's own figure (vLLM's "Maximum concurrency ... x") over every cache."""
        return self.account.engine_concurrency * self.kv_caches

    @property
    def limiting_pool(self) -> PoolUse | None:
        return max(self.pools, key=lambda u: u.fill) if self.pools else None

    @property
    def kv_needed_bytes(self) -> int | None:
        """The workload's share on the limiting pool, in bytes (None when the engine refused before sizing)."""
        u = self.limiting_pool
        return None if u is None else u.needed_bytes

    @property
    def kv_budget_bytes(self) -> int | None:
        """What the limiting pool holds for requests, in bytes: fits needs kv_needed <= kv_budget."""
        u = self.limiting_pool
        return None if u is None else u.pool.budget_bytes

    @property
    def headroom_bytes(self) -> int | None:
        if self.kv_needed_bytes is None or self.kv_budget_bytes is None:
            return None
        return self.kv_budget_bytes - self.kv_needed_bytes


def _per_cache_max(account: EngineAccount) -> int:
    """Requests one cache holds and runs: the smallest pool's, then the scheduler cap."""
    if account.refusal is not None and not account.pools:
        return 0
    found = [m for m in (p.max_requests() for p in account.pools) if m is not None]
    most = min(found) if found else (account.request_cap or MAX_CONCURRENCY)
    if account.request_cap is not None:
        most = min(most, account.request_cap)
    return 0 if account.refusal is not None else most


def longest_context(account: EngineAccount, requests: int, upper: int) -> int:
    """Longest max-model-len (<= upper) at which `requests` fit this account's pools; 0 if not one token.

    Per-request units grow with the length and the budget stays (vLLM's estimate_max_model_len does the
    same), so bisect on the pools' own per-request rule.
    """
    at = account.per_request_at
    if at is None or not account.pools or upper < 1:
        return 0

    def fits(length: int) -> bool:
        units = at(length)
        for pool, per in zip(account.pools, units, strict=True):
            shared = min(pool.shared_prefix_units, per)
            if requests * per - (requests - 1) * shared > pool.budget_units:
                return False
        return True

    if not fits(1):
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _notes(d: Deployment, account: EngineAccount) -> list[str]:
    """Facts of the deployment that explain its figures, whatever the engine (an MLA latent's only where the
    engine caches it)."""
    out = []
    tp = d.parallelism.tp // (d.parallelism.dp if d.parallelism.dp_attention else 1)
    kv_heads = {s.num_kv_heads for s in d.model.layers if hasattr(s, "num_kv_heads")}
    for h in sorted(kv_heads):
        if tp > h:
            out.append(
                f"tp {tp} exceeds the {h} KV heads: each rank keeps {kv_heads_per_rank(h, tp)} head, replicated "
                f"on {tp // h} ranks, so KV per GPU stops shrinking beyond tp {h}"
            )
    if any(getattr(s, "kind", "") == "mla" for s in d.model.layers) and tp > 1 and not d.parallelism.dp_attention \
            and not account.mla_per_head:
        out.append(f"the MLA latent is not split by tensor parallelism: each of the {tp} ranks holds all of it")
    limit = d.model.max_position_embeddings
    if limit and d.max_model_len > limit:
        out.append(f"{d.max_model_len:,} tokens is beyond the {limit:,} the model's config states")
    return out


def plan(d: Deployment, *, detail: bool = True) -> Verdict:
    """The verdict for `d`. `detail` adds the longest context (a bisection) and the workload figure; the fix
    search and the plan search skip them."""
    d.validate()
    engine = get_engine(d.engine.engine)
    kv_notes = []
    if d.kv_cache_dtype.strip().lower() == "auto":
        picked = checkpoint_kv_dtype(d.model, engine.name, getattr(d.engine, "version", None))
        if picked is not None:
            d = replace(d, kv_cache_dtype=picked)
            kv_notes.append(auto_note(d.model, engine.label, picked))
    account = with_prefix_hit_rate(engine.account(d), d.workload.prefix_hit_rate)
    caches = d.instances * d.parallelism.dp
    share = -(-d.workload.concurrency // caches)
    uses = tuple(PoolUse(p, p.needed_units(share)) for p in account.pools)
    per_cache = _per_cache_max(account)
    fits = account.refusal is None and share <= per_cache
    if fits:
        limit = LIMIT_FITS
    elif account.refusal is not None:
        limit = account.refusal.code
    elif all(u.fill <= 1 for u in uses):
        limit = LIMIT_REQUEST_CAP
    else:
        limit = LIMIT_KV
    longest = None
    if detail:
        upper = max(d.model.max_position_embeddings or 0, 1)
        if account.refusal is not None and account.refusal.code not in ("one_request", "context"):
            longest = 0
        else:
            longest = longest_context(account, share, upper)
    return Verdict(
        deployment=d,
        account=account,
        gpus_per_instance=engine.gpus_per_instance(d.parallelism),
        kv_caches=caches,
        requests_per_cache=share,
        pools=uses,
        fits=fits,
        limit=limit,
        max_requests=per_cache * caches,
        longest_context_tokens=longest,
        notes=tuple(kv_notes + _notes(d, account)) + account.notes,
        workload=workload_concurrency(account, d.workload, caches) if detail else None,
    )
