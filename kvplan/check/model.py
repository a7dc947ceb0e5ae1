"""Frozen values that `kvplan check` passes between reading, evaluating and reporting."""

from __future__ import annotations

from typing import Any

from kvplan.records import dataclass

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

    document: str = ""  # for stdin: the `# Source:` path helm wrote, or Kind/name

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where} ({self.document})" if self.document else where


@dataclass(frozen=True)
class Unresolved:
    """A value the file does not determine, why, and how the user can supply it."""

    field: str
    reason: str
    how_to_fix: str
    line: int | None = None  # the line to change, when the file has one


@dataclass(frozen=True)
class IgnoredFlag:
    """A flag that changes the engine's memory but that kvplan does not model, and why."""

    flag: str
    value: str
    why: str
    line: int | None = None


@dataclass(frozen=True)
class DeploymentRequest:
    """One model server as a deployment file asks for it; nothing guessed, gaps listed in `unresolved`.

    Counting: a pod is one container's GPUs (`gpus_per_pod`, its nvidia.com/gpu limit); an instance is one
    engine, spread over `pods_per_instance` pods (LeaderWorkerSet size, StatefulSet with --nnodes, Ray
    workers), so `num_gpus` = the GPUs of one instance; `replicas` independent instances serve the same
    model. Parallelism is as the flags state it; how many GPUs an engine needs for it is the engine's rule
    (vLLM tp x pp x dp, SGLang tp x pp with DP-attention) and is applied by the evaluation, not here.
    """

    location: Location
    name: str
    source_format: str
    engine: str
    model: str | None
    gpu: str | None  # as written in the file (a label value, an instance type) or given by --gpu
    gpu_source: str
    num_gpus: int | None  # GPUs of one instance: gpus_per_pod x pods_per_instance
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
    enable_chunked_prefill: bool | None = None  # vLLM --[no-]enable-chunked-prefill
    min_margin: float | None = None
    flags: tuple[tuple[str, str], ...] = ()
    unresolved: tuple[Unresolved, ...] = ()
    notes: tuple[str, ...] = ()
    # Topology (issue 11): what the file states, counted by the evaluation the way each engine does.
    gpus_per_pod: int | None = None  # the serving container's GPU limit
    pods_per_instance: int = 1  # LWS size, StatefulSet with --nnodes, Ray worker pods of one engine
    replicas: int = 1  # independent instances (Deployment/LWS replicas, replicaCount, Ray num_replicas)
    data_parallel_size: int = 1  # vLLM --data-parallel-size, SGLang --dp-size: DP ranks of one instance
    data_parallel_size_local: int | None = None  # vLLM --data-parallel-size-local: DP ranks per pod
    dp_attention: bool = False  # SGLang --enable-dp-attention: DP ranks live inside the TP group
    expert_parallel: bool = False  # vLLM --enable-expert-parallel, SGLang --ep-size > 1 / --enable-ep-moe
    expert_parallel_size: int | None = None  # SGLang --ep-size as written (vLLM's EP group is tp x dp)
    # Memory the engine is told about that the figures must apply.
    cpu_offload_bytes: int | None = None  # --cpu-offload-gb (GiB in both vLLM and SGLang) in bytes
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory(-bytes): a fixed KV budget
    max_batch_total_tokens: int | None = None  # TGI --max-batch-total-tokens: the KV pool in tokens
    max_model_len_cap_tokens: int | None = None  # TGI < 3 without --max-total-tokens: min(context, 4096)
    allow_long_max_model_len: bool = False  # env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    flashinfer_sampler: bool | None = None  # env VLLM_USE_FLASHINFER_SAMPLER=1 / =0 (None: unset)
    mla_disable: bool = False  # env VLLM_MLA_DISABLE=1: DeepSeek caches per-head K/V, not its MLA latent
    deep_gemm: bool | None = None  # env VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM (vllm.VllmFlags.deep_gemm)
    use_v1: bool | None = None  # env VLLM_USE_V1=1 / =0 (None: unset); chooses the engine up to 0.10
    # vLLM --enable-lora: (--max-loras, --max-lora-rank, --fully-sharded-loras)
    lora_slots: tuple[int, int, bool] | None = None
    mamba_cache_dtype: str | None = None  # vLLM --mamba-cache-dtype (a hybrid's conv state)
    mamba_ssm_cache_dtype: str | None = None  # vLLM --mamba-ssm-cache-dtype (its SSM / recurrent state)
    speculative: tuple[str, int] | None = None  # vLLM --speculative-config with method mtp: (method, tokens)
    engine_version: str | None = None  # from the image tag, e.g. "0.10.1" (vllm/vllm-openai:v0.10.1), or a pip pin
    engine_install: str | None = None  # vLLM's --vllm-install: "wheel" where the file's own script pip-installs it
    # Other servers of the same file pinned to the same GPU (compose device_ids): the share of the GPU they hold
    # (their stated memory fractions, summed), and their names.
    shared_gpu_fraction: float = 0.0
    shared_with: tuple[str, ...] = ()
    # Hardware as resolved against the catalog (or --gpu-mem): the key and the memory the figures use.
    gpu_key: str | None = None
    gpu_memory_bytes: int | None = None
    ignored_flags: tuple[IgnoredFlag, ...] = ()
    # Where each fact came from: field names ("max_model_len") and flags ("--max-model-len") -> line.
    lines: tuple[tuple[str, int], ...] = ()

    def flag(self, name: str) -> str | None:
        """The last value given for a canonical flag name (engines keep the last occurrence)."""
        found = None
        for key, value in self.flags:
            if key == name:
                found = value
        return found

    def line_of(self, key: str) -> int:
        """The line a field or flag came from ("max_model_len", "--max-model-len"), else the deployment's."""
        for name, line in self.lines:
            if name == key:
                return line
        return self.location.line


@dataclass(frozen=True)
class FileReport:
    """One file that was read: how many deployments it held, or why none (foreign) or why it was unreadable."""

    path: str
    deployments: int = 0
    skipped: str | None = None  # no deployment kvplan reads: what the file holds instead
    error: str | None = None  # the file could not be read at all


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
    fix_field: str | None = None  # the request field the fix changes, so reports point at its line

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, not {self.verdict!r}")
