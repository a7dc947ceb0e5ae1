"""One row of an estimate sweep: a combination planned on one GPU (shared by the table, CSV and plot)."""

from __future__ import annotations

from typing import Any

from kvplan.planner.verdict import Verdict
from kvplan.records import dataclass


@dataclass(frozen=True)
class SweepRow:
    """One combination on one GPU."""

    model: str
    batch: int
    kv_cache_dtype: str
    verdict: Verdict
    gpu_named: bool  # a GPU the user named (its verdict sets the exit code), not a card shown for comparison

    def to_dict(self) -> dict[str, Any]:
        v = self.verdict
        return {
            "model": self.model,
            "gpu": v.deployment.gpu.key,
            "engine": v.account.engine,
            "max_model_len": v.deployment.max_model_len,
            "batch": self.batch,
            "kv_cache_dtype": self.kv_cache_dtype,
            "fits": v.fits,
            "limit": v.limit,
            "kv_needed_bytes": v.kv_needed_bytes,
            "kv_budget_bytes": v.kv_budget_bytes,
            "headroom_bytes": v.headroom_bytes,
            "max_requests": v.max_requests,
            "max_concurrency": round(v.max_concurrency, 4),
            "longest_context_tokens": v.longest_context_tokens,
            "workload_concurrency": None if v.workload is None else v.workload.requests,
        }
