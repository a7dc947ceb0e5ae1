"""The vLLM engine model: its flags and defaults, the KV memory budget per rank, blocks, tokens, concurrency,
the lines vLLM logs at start-up, and the start-up failure when one request at max_model_len does not fit.

Two behaviours are modelled (`version`):
- "0.19": vLLM 0.19.0, the release of the calibration logs. gpu_memory_utilization defaults to 0.9; CUDA-graph
  memory is not subtracted from the KV budget; "GPU KV cache size" = num_blocks // num_groups * block_size.
- "current" (the default, newest releases as ENGINES.md describes them): utilization defaults to 0.92; an
  estimate of CUDA-graph memory is subtracted; "GPU KV cache size" = int(max_concurrency * max_model_len).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvplan.capacity.kv import pp_stage_layers
from kvplan.engines.base import Refusal
from kvplan.engines.vllm_kv import KvCacheLayout, kv_cache_layout, vllm_layer_spec
from kvplan.engines.vllm_memory import NO_SPLIT, StageMemory, WeightSplit, stage_memory
from kvplan.errors import InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import KvDtype, normalize_weight_dtype, resolve_kv_dtype, serving_dtype
from kvplan.model.specs import ModelSpec
from kvplan.units import GiB

VLLM_VERSIONS = ("current", "0.19")
DEFAULT_UTILIZATION = {"current": 0.92, "0.19": 0.9}
# vLLM's EngineArgs.get_batch_defaults for the OpenAI server: GPUs with >= 70 GiB that are not A100s
# (H100, H200, MI300X) get 8,192 batched tokens and 1,024 sequences; the rest 2,048 and 256.
BIG_GPU_BYTES = 70 * GiB
# CUDA-graph capture memory, subtracted from the budget only by newer releases. vLLM 0.19 logs it beside the
# budget ("... and 0.89 GiB for CUDAGraph memory"): 0.65-1.84 GiB over the 61 H100 logs, median 0.85 GiB.
CUDAGRAPH_ESTIMATE_BYTES = round(0.85 * GiB)


@dataclass(frozen=True)
class VllmFlags:
    """vLLM's own serve flags; None means vLLM's default for the GPU and version."""

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str = "auto"
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    enable_prefix_caching: bool = True
    kv_cache_memory_bytes: int | None = None
    version: str = "current"
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    split: WeightSplit = NO_SPLIT  # expert parallel and CPU offload (vllm_memory.WeightSplit)

    def validate(self) -> None:
        if self.version not in VLLM_VERSIONS:
            raise InputError(f"--vllm-version must be one of {', '.join(VLLM_VERSIONS)}, got {self.version!r}")
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {u}")
        for name in ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise InputError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise InputError("--kv-cache-memory-bytes must be a positive size")


@dataclass(frozen=True)
class ResolvedFlags:
    """The flags with every default filled in, as vLLM would run them."""

    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_dtype: KvDtype
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tp: int
    pp: int
    dtype: str
    quantization: str | None
    enable_prefix_caching: bool
    kv_cache_memory_bytes: int | None
    version: str


@dataclass(frozen=True)
class StageKv:
    memory: StageMemory
    available_kv_bytes: int
    layout: KvCacheLayout
    num_blocks: int  # this rank's own count, before the minimum over ranks


@dataclass(frozen=True)
class VllmReport:
    """What vLLM would report at start-up on `gpu` (per rank), or the error it would stop with."""

    gpu: GpuSpec
    flags: ResolvedFlags
    total_memory_bytes: int
    requested_bytes: int
    cudagraph_bytes: int
    stages: tuple[StageKv, ...]
    limiting_stage: int  # the rank whose block count all ranks adopt
    num_blocks: int  # includes the null block, as vLLM counts them
    kv_cache_tokens: int
    blocks_per_request: int
    max_concurrency: float
    max_model_len_fit: int  # vLLM's estimate_max_model_len on the limiting rank (0: not one token)
    refusal: Refusal | None
    log_lines: tuple[str, ...] = field(default_factory=tuple)

    @property
    def startup_error(self) -> str | None:
        """The error vLLM would stop with, in its own words; None when it starts."""
        return None if self.refusal is None else self.refusal.message

    @property
    def available_kv_cache_bytes(self) -> int:
        return self.stages[self.limiting_stage].available_kv_bytes

    @property
    def first_rank_available_kv_bytes(self) -> int:
        """What rank 0 logs as "Available KV cache memory" (it differs from the limit under PP)."""
        return self.stages[0].available_kv_bytes

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can use: one is the null block that padded block-table slots point at."""
        return max(0, self.num_blocks - 1)

    @property
    def max_running_requests(self) -> int:
        """Concurrency as the scheduler runs it: whole requests, capped by max_num_seqs."""
        return min(math.floor(self.max_concurrency), self.flags.max_num_seqs)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (the `engine` object of estimate's JSON)."""
        f = self.flags
        return {
            "vllm_version": f.version,
            "flags": {
                "max_model_len": f.max_model_len,
                "gpu_memory_utilization": f.gpu_memory_utilization,
                "kv_cache_dtype": f.kv_cache_dtype.name,
                "block_size": f.block_size,
                "max_num_seqs": f.max_num_seqs,
                "max_num_batched_tokens": f.max_num_batched_tokens,
                "tensor_parallel_size": f.tp,
                "pipeline_parallel_size": f.pp,
                "dtype": f.dtype,
                "enable_prefix_caching": f.enable_prefix_caching,
                "kv_cache_memory_bytes": f.kv_cache_memory_bytes,
            },
            "total_memory_bytes": self.total_memory_bytes,
            "requested_bytes": self.requested_bytes,
            "cudagraph_bytes": self.cudagraph_bytes,
            "stages": [
                {
                    "stage": s.memory.stage,
                    "layers": s.memory.layers,
                    "weights_bytes": s.memory.weights_bytes,
                    "rotary_cache_bytes": s.memory.rotary_cache_bytes,
                    "activation_peak_bytes": s.memory.activation_peak_bytes,
                    "non_torch_bytes": s.memory.non_torch_bytes,
                    "available_kv_cache_bytes": s.available_kv_bytes,
                    "kv_cache_groups": [
                        {"kind": g.kind, "layers": g.layers, "window_tokens": g.window_tokens}
                        for g in s.layout.groups
                    ],
                    "group_size": s.layout.group_size,
                    "page_bytes": s.layout.page_bytes,
                    "bytes_per_block": s.layout.bytes_per_block,
                    "num_blocks": s.num_blocks,
                }
                for s in self.stages
            ],
            "limiting_stage": self.limiting_stage,
            "available_kv_cache_bytes": self.available_kv_cache_bytes,
            "block_size": self.stages[self.limiting_stage].layout.block_size,
            "num_gpu_blocks": self.num_blocks,
            "usable_blocks": self.usable_blocks,
            "blocks_per_request": self.blocks_per_request,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": round(self.max_concurrency, 4),
            "max_model_len_fit": self.max_model_len_fit,
            "startup_error": self.startup_error,
        }


def format_gib(n_bytes: int) -> str:
    """vLLM's format_gib: round(bytes / GiB, 2), printed as Python prints a float (42.8, 58.11)."""
    return str(round(n_bytes / GiB, 2))


def resolve_flags(model: ModelSpec, flags: VllmFlags, gpu: GpuSpec) -> ResolvedFlags:
    flags.validate()
    big = gpu.total_memory_bytes >= BIG_GPU_BYTES and "a100" not in gpu.key.lower()
    max_len = flags.max_model_len or model.max_position_embeddings
    if max_len is None:
        raise InputError(f"{model.name} states no max_position_embeddings; pass --max-model-len")
    dtype = serving_dtype(model.config_dtype) if flags.dtype == "auto" else normalize_weight_dtype(flags.dtype)
    return ResolvedFlags(
        max_model_len=max_len,
        gpu_memory_utilization=flags.gpu_memory_utilization or DEFAULT_UTILIZATION[flags.version],
        kv_cache_dtype=resolve_kv_dtype(flags.kv_cache_dtype, dtype),
        block_size=flags.block_size or 16,
        max_num_seqs=flags.max_num_seqs or (1024 if big else 256),
        max_num_batched_tokens=flags.max_num_batched_tokens or (8192 if big else 2048),
        tp=flags.tensor_parallel_size,
        pp=flags.pipeline_parallel_size,
        dtype=dtype,
        quantization=flags.quantization,
        enable_prefix_caching=flags.enable_prefix_caching,
        kv_cache_memory_bytes=flags.kv_cache_memory_bytes,
        version=flags.version,
    )


def _stage_layout(model: ModelSpec, layers: range, f: ResolvedFlags, block_size_set: bool) -> KvCacheLayout:
    specs = [vllm_layer_spec(model.layers[i], f.kv_cache_dtype, f.tp) for i in layers]
    return kv_cache_layout([s for s in specs if s is not None], f.block_size, block_size_set=block_size_set)


def estimate_max_model_len(layout: KvCacheLayout, available_bytes: int, limit: int, batched: int) -> int:
    """vLLM's estimate_max_model_len: the longest max_model_len whose one request fits, by bisection."""
    def fits(length: int) -> bool:
        return layout.blocks_per_request(length, batched) * layout.bytes_per_block <= available_bytes

    if not fits(1):
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_vllm(
    model: ModelSpec,
    flags: VllmFlags,
    gpu: GpuSpec,
    *,
    available_shift_bytes: int = 0,
    checkpoint_bytes: int | None = None,
) -> VllmReport:
    """Reproduce vLLM's start-up memory accounting and KV cache sizing for `model` on `gpu`.

    `checkpoint_bytes` is the checkpoint's measured size (--weights-from-hub, --weights-bytes): the weights
    per rank follow it (vllm_memory.checkpoint_scale). `available_shift_bytes` moves every rank's budget by the same amount (the accuracy benchmark uses it
    to pin rank 0 to a logged figure while keeping the modelled differences between pipeline stages).
    """
    f = resolve_flags(model, flags, gpu)
    total = gpu.total_memory_bytes
    requested = math.ceil(total * f.gpu_memory_utilization)
    cudagraph = CUDAGRAPH_ESTIMATE_BYTES if f.version == "current" else 0
    memories = stage_memory(
        model, dtype=f.dtype, tp=f.tp, pp=f.pp, quantization=f.quantization,
        max_num_batched_tokens=f.max_num_batched_tokens, max_num_seqs=f.max_num_seqs,
        checkpoint_bytes=checkpoint_bytes, split=flags.split,
    )
    stages: list[StageKv] = []
    for mem, layers in zip(memories, pp_stage_layers(model.num_layers, f.pp)):
        layout = _stage_layout(model, layers, f, flags.block_size is not None)
        if f.kv_cache_memory_bytes is not None:
            available = f.kv_cache_memory_bytes
        else:
            available = requested - mem.non_kv_bytes - cudagraph + available_shift_bytes
        stages.append(StageKv(mem, available, layout, max(0, available) // layout.bytes_per_block))
    limiting = min(range(len(stages)), key=lambda i: (stages[i].num_blocks, i))
    lim = stages[limiting]
    layout = lim.layout
    num_blocks = lim.num_blocks
    per_request = layout.blocks_per_request(f.max_model_len, f.max_num_batched_tokens)
    concurrency = num_blocks / per_request
    if f.version == "0.19":
        tokens = num_blocks // len(layout.groups) * layout.block_size
    else:
        tokens = int(concurrency * f.max_model_len)
    fit_len = estimate_max_model_len(layout, lim.available_kv_bytes, f.max_model_len, f.max_num_batched_tokens)
    refusal = _too_long(model, f, flags.allow_long_max_model_len) or _startup_error(stages, f)
    error = None if refusal is None else refusal.message
    return VllmReport(
        gpu=gpu,
        flags=f,
        total_memory_bytes=total,
        requested_bytes=requested,
        cudagraph_bytes=cudagraph,
        stages=tuple(stages),
        limiting_stage=limiting,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        max_model_len_fit=fit_len,
        refusal=refusal,
        log_lines=tuple(_log_lines(stages, f, tokens, concurrency, error, requested, total)),
    )


def _too_long(model: ModelSpec, f: ResolvedFlags, allowed: bool) -> Refusal | None:
    """vLLM refuses a max_model_len beyond the config's positions (unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""
    limit = model.max_position_embeddings
    if limit and f.max_model_len > limit and not allowed:
        return Refusal(
            "context",
            f"User-specified max_model_len ({f.max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={limit} in model's config.json). To allow overriding this maximum, set "
            "the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
            "workload.max_model_len",
        )
    return None


def _startup_error(stages: list[StageKv], f: ResolvedFlags) -> Refusal | None:
    """vLLM's _check_enough_kv_cache_memory, rank by rank: the first rank that cannot hold one request."""
    for s in stages:
        if s.available_kv_bytes <= 0:
            return Refusal(
                "no_kv_memory",
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine.",
                "engine.gpu_memory_utilization",
            )
        needed = s.layout.blocks_per_request(f.max_model_len, f.max_num_batched_tokens) * s.layout.bytes_per_block
        if needed > s.available_kv_bytes:
            fit = estimate_max_model_len(s.layout, s.available_kv_bytes, f.max_model_len, f.max_num_batched_tokens)
            hint = f"Based on the available memory, the estimated maximum model length is {fit}. " if fit else ""
            return Refusal(
                "one_request",
                f"To serve at least one request with the models's max seq len ({f.max_model_len}), "
                f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache "
                f"memory ({format_gib(s.available_kv_bytes)} GiB). {hint}Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
                "workload.max_model_len",
            )
    return None


def _log_lines(stages, f: ResolvedFlags, tokens: int, concurrency: float, error, requested: int, total: int) -> list[str]:
    first = stages[0].memory
    lines = [f"Model loading took {format_gib(first.weights_bytes)} GiB memory"]
    for s in stages:
        m = s.memory
        where = f"[PP{m.stage}] " if len(stages) > 1 else ""
        lines.append(
            f"{where}Memory profiling: torch peak memory increase: {format_gib(m.activation_peak_bytes)}GiB; "
            f"non-torch forward increase memory: {format_gib(m.non_torch_bytes)}GiB; "
            f"weights memory: {format_gib(m.weights_bytes)}GiB."
        )
    lines.append(f"Available KV cache memory: {format_gib(stages[0].available_kv_bytes)} GiB")
    if error:
        lines.append(f"ValueError: {error}")
        return lines
    lines.append(f"GPU KV cache size: {tokens:,} tokens")
    lines.append(f"Maximum concurrency for {f.max_model_len:,} tokens per request: {concurrency:.2f}x")
    return lines
