"""Requests resident at once for the workload's real lengths (workload_concurrency), from any engine's account.

The engine's own figure (vLLM's "Maximum concurrency for 8,192 tokens per request") sizes every request at
max-model-len. Real requests are shorter: each holds its prompt and, by its last token, its answer, in the
engine's units (vLLM blocks, SGLang token slots, Transformers bytes) as EngineAccount.per_request_at rounds
them, windows capped and a Mamba state per request included. Sizing each request at its last token means
none of the resident requests is ever preempted to make room for another's answer. A shared prompt prefix is
stored once and saved by the share of requests that hit it.

Llama-3.1-8B in blocks of 16 on an 8,192-token server: a request at max-model-len takes 512 blocks; a
2,000-token prompt with a 500-token answer takes cdiv(2,500, 16) = 157, so about 512 / 157 = 3.3 times as
many requests are resident at once.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from kvplan.capacity.deployment import MAX_CONCURRENCY, Workload
from kvplan.engines.base import EngineAccount
from kvplan.records import dataclass

LIMIT_REQUEST_CAP = "request_cap"


@dataclass(frozen=True)
class WorkloadFit:
    """How many of the workload's real requests one engine instance's caches hold and run at once."""

    requests_per_cache: int  # resident at once in one KV cache (0: the engine would not start)
    requests: int  # over every cache
    limit: str  # the limiting pool's name, or "request_cap" (the scheduler's limit)
    mean_units: tuple[Fraction, ...]  # per pool: units one request takes on average (prefix not subtracted)
    capped_requests: int  # requests of the mix longer than max-model-len, counted at it
    mix_requests: int
    mean_input_tokens: float
    mean_output_tokens: float
    source: str


def with_prefix_hit_rate(account: EngineAccount, rate: float) -> EngineAccount:
    """The account with each pool's shared prefix saving the hit rate's share of it, in whole units.

    n requests need n x per - (n - 1) x shared; at hit rate h only h of the other requests find the prefix
    cached, so they save (n - 1) x h x shared: 62 shared blocks at h = 0.5 save 31 per request. The share is
    read as an exact fraction (0.29 x 100 = 29, where floating point would give 28.999...).
    """
    if rate >= 1 or not any(p.shared_prefix_units for p in account.pools):
        return account
    share = Fraction(rate).limit_denominator(10**6)
    pools = tuple(replace(p, shared_prefix_units=int(p.shared_prefix_units * share)) for p in account.pools)
    return replace(account, pools=pools)


def workload_concurrency(account: EngineAccount, workload: Workload, caches: int) -> WorkloadFit | None:
    """Requests of the workload's mix resident at once in `caches` KV caches; None without a mix.

    Per pool, with m requests in the mix and U the units all of them take: n requests fit while
    n x U / m - (n - 1) x shared <= budget, so n = floor((budget - shared) x m / (U - m x shared)), the
    arithmetic of KvPool.max_requests on the mean request, kept in integers. Then the scheduler's cap.
    """
    mix = workload.mix
    if mix is None or account.per_request_at is None:
        return None
    length_cap = account.max_model_len
    m = mix.requests
    capped = sum(n for length, n in mix.totals if length > length_cap)
    units = [0] * len(account.pools)
    for length, n in mix.totals:
        for i, u in enumerate(account.per_request_at(min(length, length_cap))):
            units[i] += n * u
    most, limit = MAX_CONCURRENCY, LIMIT_REQUEST_CAP
    for pool, total in zip(account.pools, units, strict=True):
        own = total - m * pool.shared_prefix_units
        if own <= 0:
            continue  # a request takes nothing of its own here (a prefix-only pool): no limit
        fit = max(0, (pool.budget_units - pool.shared_prefix_units) * m // own)
        if fit < most:
            most, limit = fit, pool.name
    if account.request_cap is not None and account.request_cap < most:
        most, limit = account.request_cap, LIMIT_REQUEST_CAP
    if account.refusal is not None:
        most = 0
    return WorkloadFit(
        requests_per_cache=most,
        requests=most * caches,
        limit=limit,
        mean_units=tuple(Fraction(total, m) for total in units),
        capped_requests=capped,
        mix_requests=m,
        mean_input_tokens=mix.mean_input_tokens,
        mean_output_tokens=mix.mean_output_tokens,
        source=mix.source,
    )
