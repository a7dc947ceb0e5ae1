"""Frozen values that `kvplan check` passes between reading, evaluating and reporting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Verdicts, in the order a reader cares about them.
FITS = "fits"
DOES_NOT_FIT = "does_not_fit"
CANNOT_EVALUATE = "cannot_evaluate"
VERDICTS = (FITS, DOES_NOT_FIT, CANNOT_EVALUATE)


@dataclass(frozen=True)
class Location:
    """Where a deployment was found: the file and the 1-based line of its document, container or entry."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Unresolved:
    """A value the file does not determine, why, and how the user can supply it."""

    field: str
    reason: str
    how_to_fix: str


@dataclass(frozen=True)
class DeploymentRequest:
    """One model server as a deployment file asks for it; nothing guessed, gaps listed in `unresolved`."""

    location: Location
    name: str
    source_format: str
    engine: str
    model: str | None
    gpu: str | None
    gpu_source: str
    num_gpus: int | None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    min_margin: float | None = None
    flags: tuple[tuple[str, str], ...] = ()
    unresolved: tuple[Unresolved, ...] = ()
    notes: tuple[str, ...] = ()

    def flag(self, name: str) -> str | None:
        """The last value given for a canonical flag name (engines keep the last occurrence)."""
        found = None
        for key, value in self.flags:
            if key == name:
                found = value
        return found


@dataclass(frozen=True)
class CheckResult:
    """The answer for one deployment: verdict, the figures behind it, and the smallest fix when it fails."""

    request: DeploymentRequest
    verdict: str
    kv_needed_bytes: int | None = None
    kv_available_bytes: int | None = None
    max_concurrency: float | None = None
    margin: float | None = None
    reason: str | None = None
    fix: str | None = None
    engine_lines: tuple[str, ...] = ()
    reason_code: str | None = None  # stable code of `reason` (kvplan.engines.base.REFUSAL_CODES, kv_cache, ...)
    max_requests: int | None = None  # whole requests held and run at once, every replica
    figures: dict[str, Any] | None = None  # the planner's verdict as data (kvplan.planner.serialize)
    fixes: tuple[str, ...] = ()  # every verified fix, best first (`fix` is the first)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {self.verdict!r}")
