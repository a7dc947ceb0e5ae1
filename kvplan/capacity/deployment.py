"""One deployment, as every command sees it: the model, the workload, parallelism, the GPU, weights, the engine.

`kvplan estimate` builds one from flags, `kvplan check` from a deployment file, `kvplan plan` from each
candidate it searches; the engine registry (kvplan.engines) turns it into one capacity account, and the
planner (kvplan.planner) into one verdict. Values are validated here with errors that name the field
(`workload.max_model_len`), never a flag: each front end says the field its own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import KV_DTYPE_CHOICES, resolve_kv_dtype, served_dtype
from kvplan.model.specs import ModelSpec

# Bounds far beyond any real deployment; a value past them is a typo or an attack, and would only make the
# arithmetic slow (a 400-digit --seq). Llama 4 Scout's 10M-token context is the longest real one.
MAX_CONTEXT_TOKENS = 1 << 30
MAX_CONCURRENCY = 10**8
MAX_PARALLEL = 4096
MAX_INSTANCES = 100_000


def check_int(name: str, value: object, low: int, high: int) -> int:
    """An integer field within [low, high], or a FieldError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, "must be a whole number", repr(value)[:40])
    if not low <= value <= high:
        digits = len(str(abs(value))) if abs(value) < 10**4000 else "4000+"
        shown = value if abs(value) < 10**15 else f"(a {digits}-digit number)"
        raise FieldError(name, f"must be between {low:,} and {high:,}", shown)
    return value


@dataclass(frozen=True)
class Workload:
    """What the server must hold at once: `concurrency` requests of up to `max_model_len` tokens each.

    max_model_len None means the engine's default: the context the model's config states.
    shared_prefix_tokens: a prompt prefix common to every request, stored once per instance where the engine
    caches prefixes (whole blocks/pages of it only).
    """

    max_model_len: int | None = None
    concurrency: int = 1
    shared_prefix_tokens: int = 0

    def validate(self) -> None:
        if self.max_model_len is not None:
            check_int("workload.max_model_len", self.max_model_len, 1, MAX_CONTEXT_TOKENS)
        check_int("workload.concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        check_int("workload.shared_prefix_tokens", self.shared_prefix_tokens, 0, MAX_CONTEXT_TOKENS)


@dataclass(frozen=True)
class Parallelism:
    """How one engine instance splits the model over GPUs.

    tp: tensor-parallel ranks; pp: pipeline stages; dp: data-parallel ranks inside the instance (vLLM
    --data-parallel-size, SGLang --dp), each with its own KV cache and share of the requests;
    dp_attention: SGLang's DP attention, where the dp ranks live inside the tp group (tp GPUs in all) and each
    holds whole attention weights and its own requests' KV; expert_parallel: MoE experts split over the
    expert-parallel group instead of tensor-split (vLLM --enable-expert-parallel: the group is tp x dp);
    ep_size: SGLang's --ep-size (None: the engine's default).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    expert_parallel: bool = False
    ep_size: int | None = None

    def validate(self) -> None:
        check_int("parallelism.tp", self.tp, 1, MAX_PARALLEL)
        check_int("parallelism.pp", self.pp, 1, MAX_PARALLEL)
        check_int("parallelism.dp", self.dp, 1, MAX_PARALLEL)
        if self.ep_size is not None:
            check_int("parallelism.ep_size", self.ep_size, 1, MAX_PARALLEL)


@dataclass(frozen=True)
class WeightsChoice:
    """How the weights are served: dtype, runtime quantization, a measured checkpoint size, CPU offload."""

    dtype: str | None = None  # served dtype; None: the engine's reading of the config (float32 served as bf16)
    quantization: str | None = None  # runtime quantization of an unquantized checkpoint (vLLM --quantization fp8)
    checkpoint_bytes: int | None = None  # the checkpoint's measured size (safetensors headers, --weights-bytes)
    checkpoint_source: str = ""  # where checkpoint_bytes came from, for people
    cpu_offload_bytes: int = 0  # weights kept in CPU memory per GPU (vLLM --cpu-offload-gb)

    def validate(self) -> None:
        if self.dtype is not None:
            try:
                served_dtype(self.dtype)
            except InputError:
                raise FieldError(
                    "weights.dtype",
                    "is not a dtype engines serve in (auto, float16, bfloat16, float32); for fp8 weights set the "
                    "quantization to fp8, for an fp8 KV cache the KV cache dtype",
                    self.dtype,
                ) from None
        if self.checkpoint_bytes is not None:
            check_int("weights.checkpoint_bytes", self.checkpoint_bytes, 1, 1 << 50)
        check_int("weights.cpu_offload_bytes", self.cpu_offload_bytes, 0, 1 << 50)


@dataclass(frozen=True)
class BoxProfile:
    """Terms measured on the user's own box from its engine log (`kvplan calibrate --save`), used instead of
    the modelled ones where they apply (same GPU and tensor-parallel size; weights and the activation peak
    only for the same model and step size). None: not measured, the model's figure stands."""

    source: str  # the log it came from, for people
    engine: str
    engine_version: str | None = None
    gpu_name: str | None = None  # as the log names the device
    total_memory_bytes: int | None = None
    tp: int = 1
    pp: int = 1
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    model: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    weights_bytes: int | None = None  # per rank
    activation_peak_bytes: int | None = None  # per rank, at max_num_batched_tokens / max_num_seqs


class EngineOptions(Protocol):
    """An engine's own options (kvplan.engines.<engine>): a frozen dataclass naming its engine."""

    engine: ClassVar[str]

    def validate(self) -> None: ...


@dataclass(frozen=True)
class Deployment:
    """One model server: `instances` identical engine instances sharing the workload's requests."""

    model: ModelSpec
    gpu: GpuSpec
    engine: EngineOptions
    workload: Workload = field(default_factory=Workload)
    parallelism: Parallelism = field(default_factory=Parallelism)
    weights: WeightsChoice = field(default_factory=WeightsChoice)
    kv_cache_dtype: str = "auto"
    instances: int = 1
    profile: BoxProfile | None = None  # measured terms of the user's own box (kvplan calibrate)

    def validate(self) -> None:
        self.workload.validate()
        self.parallelism.validate()
        self.weights.validate()
        self.engine.validate()
        check_int("instances", self.instances, 1, MAX_INSTANCES)
        try:
            resolve_kv_dtype(self.kv_cache_dtype, "bfloat16")
        except InputError:
            raise FieldError("kv_cache_dtype", f"unknown KV cache dtype; use one of {', '.join(KV_DTYPE_CHOICES)}",
                             self.kv_cache_dtype) from None
        if self.workload.shared_prefix_tokens >= self.max_model_len:
            raise FieldError(
                "workload.shared_prefix_tokens",
                f"must be shorter than the request length {self.max_model_len:,}: each request generates "
                "tokens of its own",
                self.workload.shared_prefix_tokens,
            )

    @property
    def max_model_len(self) -> int:
        """Tokens per request: the workload's, else the model's stated context."""
        if self.workload.max_model_len is not None:
            return self.workload.max_model_len
        if self.model.max_position_embeddings is None:
            raise FieldError("workload.max_model_len", f"{self.model.name} states no max context; give one")
        return self.model.max_position_embeddings

    @property
    def requests_per_instance(self) -> int:
        """The share of the workload one instance must hold: 40 requests over 4 instances -> 10 each."""
        return -(-self.workload.concurrency // self.instances)
