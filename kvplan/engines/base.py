"""What every engine model returns: one capacity account of one engine instance, in the engine's own units.

An engine subtracts its own terms from the GPU (weights, activation peak, CUDA graphs, ...), keeps the rest for
KV, and cuts that into its own units: vLLM blocks, SGLang token slots, Transformers' plain bytes. Each such
pool says what one request at max_model_len takes and what a shared prompt prefix saves, so the planner can
size any number of requests with the same arithmetic for every engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, ClassVar, Protocol

from kvplan.capacity.deployment import Deployment, EngineOptions, Parallelism
from kvplan.errors import FieldError
from kvplan.records import dataclass

# Why an engine would refuse a deployment at start-up, as stable codes (the JSON's `reason.code`).
REFUSAL_CODES = {
    "tp_heads": "tensor parallelism does not divide the attention or KV heads",
    "pp_layers": "more pipeline stages than layers",
    "kv_dtype": "a KV cache dtype the engine does not take",
    "kv_dtype_gpu": "a KV cache dtype the GPU does not support",
    "context": "max-model-len beyond the model's context",
    "option": "an option value the engine rejects",
    "weights": "the weights alone exceed the memory the engine may use",
    "no_kv_memory": "no memory left for the KV cache",
    "one_request": "one request at max-model-len does not fit the KV cache",
    "sampler_warmup_oom": "out of memory in the sampler warm-up after the KV cache was allocated",
    "startup_free_memory": "less free memory at start-up than the memory utilization asks for",
    "kv_alloc_oom": "out of memory allocating the KV cache the engine sized",
    "mamba_blocks": "more sequences than a hybrid's cache has blocks for their state (FULL CUDA graphs)",
    "gpus": "fewer GPUs than the parallelism needs",
}


# Counts an engine option may hold (tokens, requests, block sizes): 2^30 bounds what a planner can mean and
# keeps every product of them inside exact integer arithmetic.
MAX_COUNT = 1 << 30


def check_counts(options: object, names: tuple[str, ...]) -> None:
    """Each of `names` on `options` is None (the engine's default) or a count from 1 to 2^30."""
    for name in names:
        value = getattr(options, name)
        if value is not None and not 1 <= value <= MAX_COUNT:
            raise FieldError(f"engine.{name}", "must be between 1 and 2^30", value)


@dataclass(frozen=True)
class Refusal:
    """The engine would not start: a stable code, the engine's own words, and the field whose change fixes it."""

    code: str
    message: str
    field: str | None = None

    def __post_init__(self) -> None:
        if self.code not in REFUSAL_CODES:
            raise ValueError(f"unknown refusal code {self.code!r}")


@dataclass(frozen=True)
class MemoryTerm:
    """One thing the engine subtracts from the GPU before the KV cache, on the limiting rank."""

    name: str  # stable key: weights, activation_peak, non_torch, cuda_graphs, reserved, overhead, ...
    bytes: int
    label: str  # for people: "activation peak of the profiling run (8,192 tokens)"


@dataclass(frozen=True)
class KvPool:
    """One pool of KV units on the limiting rank, and what requests take from it.

    n requests at max_model_len need n x per_request_units - (n - 1) x shared_prefix_units: the units of a
    common prefix are stored once (vLLM's prefix caching shares whole blocks of it, SGLang's radix cache whole
    pages). Llama-3.1-8B in blocks of 16 at 8,192 tokens with a 1,000-token shared prefix: 512 blocks per
    request, 62 shared, so 10 requests need 10 x 512 - 9 x 62 = 4,562 blocks.
    """

    name: str  # "KV blocks", "full-attention tokens", "sliding-window tokens", "state slots", "KV bytes"
    unit: str  # "block", "token", "slot", "byte"
    unit_bytes: int  # bytes one unit costs on the limiting rank
    budget_units: int  # units requests can use (vLLM: without the null block)
    per_request_units: int  # one request at max_model_len
    shared_prefix_units: int = 0

    def needed_units(self, requests: int) -> int:
        if requests <= 0:
            return 0
        return requests * self.per_request_units - (requests - 1) * self.shared_prefix_units

    def max_requests(self) -> int | None:
        """Most requests the budget holds; None when a request takes nothing of its own here (unbounded)."""
        if self.per_request_units > self.budget_units:
            return 0
        own = self.per_request_units - self.shared_prefix_units
        if own <= 0:
            return None
        return 1 + (self.budget_units - self.per_request_units) // own

    @property
    def budget_bytes(self) -> int:
        return self.budget_units * self.unit_bytes

    def needed_bytes(self, requests: int) -> int:
        return self.needed_units(requests) * self.unit_bytes


@dataclass(frozen=True)
class Calibration:
    """Where an engine model was checked against real logs, and whether this plan lies inside that range.

    Outside it (another GPU class, release or architecture) the figures still come from the mechanism, with
    the error band the held-out logs showed, stated beside them."""

    in_range: bool
    checked_on: str  # "vLLM 0.19 on H100, 61 logs"
    outside: tuple[str, ...] = ()  # what lies outside: "GPU L4 (no logs)", "release 0.10 (no logs)"
    error_band: str = ""  # "available KV memory within +/-3% on held-out logs"


@dataclass(frozen=True)
class EngineAccount:
    """One engine instance on its limiting rank: what the engine subtracts, what is left, how requests use it.

    `per_request_at(L)` gives each pool's per-request units at another max_model_len with this same budget
    (vLLM's estimate_max_model_len works the same way), for the longest context that fits.
    """

    engine: str
    version: str | None
    total_memory_bytes: int
    requested_bytes: int  # what the engine lets itself use (vLLM: total x utilization)
    terms: tuple[MemoryTerm, ...]
    kv_budget_bytes: int  # memory the engine keeps for KV on the limiting rank (vLLM: "Available KV cache memory")
    pools: tuple[KvPool, ...]
    max_model_len: int
    request_cap: int | None  # requests the scheduler runs at once (vLLM max_num_seqs); None: no cap
    engine_concurrency: float  # the engine's own figure for full-length requests on one instance
    kv_cache_tokens: int | None  # tokens the engine reports ("GPU KV cache size", max_total_num_tokens)
    refusal: Refusal | None = None
    log_lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    detail: Mapping[str, Any] = field(default_factory=dict)  # the engine's own report, as plain data
    calibration: Calibration | None = None
    # MLA layers cached as per-head K/V, which tp splits (vLLM with MLA off: vllm_mla), not as the latent
    mla_per_head: bool = False
    per_request_at: Callable[[int], tuple[int, ...]] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Knobs:
    """The engine options the fix-finder may turn, as deployment field names (None: the engine has none)."""

    fp8_kv_dtype: str | None = None  # how the engine spells an 8-bit float KV cache
    utilization: tuple[str, float] | None = None  # (field, the highest value worth suggesting)
    request_cap: str | None = None  # the scheduler's limit on requests run at once
    long_context: str | None = None  # a switch that lets max-model-len exceed the config's context


class EngineModel(Protocol):
    """An engine as kvplan models it; registered once in kvplan.engines (get_engine)."""

    name: ClassVar[str]  # "vllm"
    label: ClassVar[str]  # "vLLM", for people
    options_type: ClassVar[type]  # its EngineOptions dataclass
    knobs: ClassVar[Knobs]

    def gpus_per_instance(self, p: Parallelism) -> int:
        """GPUs one engine instance occupies under this parallelism."""
        ...

    def account(self, d: Deployment) -> EngineAccount:
        """The capacity account of one instance of `d` (raises FieldError for values it cannot take)."""
        ...

    def default_options(self) -> EngineOptions:
        """The engine's options with every value at the engine's default."""
        ...
