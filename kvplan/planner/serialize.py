"""Verdicts and fixes as plain data, for every JSON kvplan prints (estimate, check, plan).

Types are the same whatever the engine: `max_concurrency` is always a float (the engine's own figure for
full-length requests), `max_requests` always an int (whole requests held and run at once); a reason is a
stable `code` with its `message`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvplan.engines.base import REFUSAL_CODES, Calibration
from kvplan.planner.verdict import LIMIT_KV, LIMIT_REQUEST_CAP, Verdict

if TYPE_CHECKING:  # fixes are searched only for a named GPU; estimate's start does not import the search
    from kvplan.planner.fixes import Fix

LIMIT_MESSAGES = {
    LIMIT_KV: "the KV cache cannot hold the workload's requests",
    LIMIT_REQUEST_CAP: "the scheduler runs fewer requests at once than the workload asks",
}


def reason(v: Verdict) -> dict[str, Any] | None:
    """Why a deployment does not fit, as {code, message}; None when it fits."""
    if v.fits:
        return None
    refusal = v.account.refusal
    if refusal is not None:
        return {"code": refusal.code, "message": refusal.message, "field": refusal.field,
                "summary": REFUSAL_CODES[refusal.code]}
    u = v.limiting_pool
    if v.limit == LIMIT_REQUEST_CAP:
        message = (f"{v.requests_per_cache:,} requests per cache exceed the scheduler's limit of "
                   f"{v.account.request_cap:,} at once")
    elif u is not None:
        message = (f"{v.requests_per_cache:,} requests need {u.needed_units:,} {u.pool.unit}s of {u.pool.name}; "
                   f"{u.pool.budget_units:,} are available")
    else:
        message = LIMIT_MESSAGES[v.limit]
    return {"code": v.limit, "message": message, "field": None, "summary": LIMIT_MESSAGES.get(v.limit, "")}


def workload_to_dict(v: Verdict) -> dict[str, Any]:
    """The workload figure beside the engine's: real request lengths resident at once (`workload_concurrency`)."""
    w = v.workload
    if w is None:
        return {}
    return {
        "workload_concurrency": w.requests,
        "workload": {
            "requests_per_cache": w.requests_per_cache,
            "limit": w.limit,
            "mean_input_tokens": round(w.mean_input_tokens, 2),
            "mean_output_tokens": round(w.mean_output_tokens, 2),
            "mix_requests": w.mix_requests,
            "capped_requests": w.capped_requests,
            "source": w.source,
            "mean_units_per_request": [round(float(u), 4) for u in w.mean_units],
            # vLLM prints only the max-model-len figure ("Maximum concurrency for N tokens per request").
            "engine_prints": "max_concurrency",
        },
    }


def verdict_to_dict(v: Verdict) -> dict[str, Any]:
    a = v.account
    return {
        "fits": v.fits,
        "limit": v.limit,
        "reason": reason(v),
        "engine": a.engine,
        "engine_version": a.version,
        "total_memory_bytes": a.total_memory_bytes,
        "requested_bytes": a.requested_bytes,
        "terms": [{"name": t.name, "bytes": t.bytes, "label": t.label} for t in a.terms],
        "available_kv_cache_bytes": a.kv_budget_bytes,
        "kv_budget_bytes": v.kv_budget_bytes,
        "kv_needed_bytes": v.kv_needed_bytes,
        "headroom_bytes": v.headroom_bytes,
        "pools": [
            {
                "name": u.pool.name,
                "unit": u.pool.unit,
                "unit_bytes": u.pool.unit_bytes,
                "budget_units": u.pool.budget_units,
                "per_request_units": u.pool.per_request_units,
                "shared_prefix_units": u.pool.shared_prefix_units,
                "needed_units": u.needed_units,
            }
            for u in v.pools
        ],
        "kv_cache_tokens": a.kv_cache_tokens,
        "max_concurrency": round(v.max_concurrency, 4),
        "max_requests": v.max_requests,
        "request_cap": a.request_cap,
        "requests_per_cache": v.requests_per_cache,
        "kv_caches": v.kv_caches,
        "instances": v.deployment.instances,
        "gpus_per_instance": v.gpus_per_instance,
        "total_gpus": v.total_gpus,
        "max_model_len": a.max_model_len,
        "longest_context_tokens": v.longest_context_tokens,
        "log_lines": list(a.log_lines),
        "notes": list(v.notes),
        "calibration": calibration_to_dict(a.calibration),
        "engine_detail": dict(a.detail),
        **workload_to_dict(v),
    }


def calibration_to_dict(c: Calibration | None) -> dict[str, Any] | None:
    """Where the engine model was checked and whether this plan lies inside (None: the engine states none)."""
    if c is None:
        return None
    return {"in_range": c.in_range, "checked_on": c.checked_on, "outside": list(c.outside),
            "error_band": c.error_band}


def fix_to_dict(f: Fix) -> dict[str, Any]:
    return {
        "changes": [{"field": c.field, "value": c.shown_value} for c in f.changes],
        "keeps_workload": f.keeps_workload,
        "total_gpus": f.verdict.total_gpus,
        "max_requests": f.verdict.max_requests,
        "headroom_bytes": f.verdict.headroom_bytes,
    }
