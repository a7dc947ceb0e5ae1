"""How a deployment file names each deployment field, so a fix reads as the change to make in that file.

The core's fixes are fields (`parallelism.tp`); a vLLM container says `--tensor-parallel-size`, SGLang
`--tp-size`, TGI `--num-shard`, and kvplan's own schema `tensor_parallel_size`.
"""

from __future__ import annotations

from kvplan.check.model import DeploymentRequest
from kvplan.planner.fixes import Fix

_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "workload.max_model_len": "--max-model-len",
        "parallelism.tp": "--tensor-parallel-size",
        "parallelism.pp": "--pipeline-parallel-size",
        "parallelism.dp": "--data-parallel-size",
        "kv_cache_dtype": "--kv-cache-dtype",
        "engine.gpu_memory_utilization": "--gpu-memory-utilization",
        "engine.max_num_seqs": "--max-num-seqs",
        "engine.block_size": "--block-size",
        "engine.allow_long_max_model_len": "env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    },
    "sglang": {
        "workload.max_model_len": "--context-length",
        "parallelism.tp": "--tp-size",
        "parallelism.pp": "--pp-size",
        "parallelism.dp": "--dp-size",
        "kv_cache_dtype": "--kv-cache-dtype",
        "engine.mem_fraction_static": "--mem-fraction-static",
        "engine.max_running_requests": "--max-running-requests",
        "engine.page_size": "--page-size",
    },
    "tgi": {
        "workload.max_model_len": "--max-total-tokens",
        "parallelism.tp": "--num-shard",
        "kv_cache_dtype": "--kv-cache-dtype",
        "engine.cuda_memory_fraction": "--cuda-memory-fraction",
        "engine.max_batch_size": "--max-batch-size",
    },
}
_OWN_SCHEMA = {
    "workload.max_model_len": "max_model_len",
    "workload.concurrency": "concurrency",
    "parallelism.tp": "tensor_parallel_size",
    "parallelism.pp": "pipeline_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "engine.gpu_memory_utilization": "gpu_memory_utilization",
    "engine.mem_fraction_static": "gpu_memory_utilization",
    "gpu": "gpu",
    "instances": "num_gpus",
}


def change_words(req: DeploymentRequest, field: str, value: object, gpus_per_instance: int) -> str:
    """One change as the file would carry it: `--tensor-parallel-size 4`, `tensor_parallel_size: 4`; for a
    value of None (the engine's default, which the file gets by dropping the setting) the setting's name."""
    if req.source_format == "kvplan":
        key = _OWN_SCHEMA.get(field, field)
        shown = value * gpus_per_instance if field == "instances" and isinstance(value, int) else value
        return key if value is None else f"{key}: {shown}"
    if field == "gpu":
        return f"GPU type {value}"
    if field == "instances" and isinstance(value, int):
        return f"{value * gpus_per_instance} GPUs ({value} replicas)"
    if field == "workload.concurrency":
        return f"at most {value} concurrent requests"
    flag = _FLAGS.get(req.engine, {}).get(field, field)
    if flag.startswith("env "):
        return flag
    return flag if value is None else f"{flag} {value}"


def fix_text(req: DeploymentRequest, fix: Fix) -> str:
    """A fix as one line: `set --tensor-parallel-size 4 and --kv-cache-dtype fp8 (fits on 4 GPUs)`."""
    def words(drop: bool) -> list[str]:
        return [change_words(req, c.field, c.shown_value, fix.verdict.gpus_per_instance) for c in fix.changes
                if (c.shown_value is None) == drop]

    gpus = fix.verdict.total_gpus
    n = fix.verdict.max_requests
    where = f"fits on {gpus} GPU{'s' if gpus > 1 else ''}, up to {n:,} request{'s' if n != 1 else ''} at once"
    parts = ([f"set {' and '.join(words(False))}"] if words(False) else []) + \
        ([f"drop {' and '.join(words(True))}"] if words(True) else [])
    return f"{' and '.join(parts)} ({where})"


# Deployment field -> the DeploymentRequest field whose line a report points at.
_REQUEST_FIELDS = {
    "workload.max_model_len": "max_model_len",
    "workload.concurrency": "max_num_seqs",
    "parallelism.tp": "tensor_parallel_size",
    "parallelism.pp": "pipeline_parallel_size",
    "kv_cache_dtype": "kv_cache_dtype",
    "engine.gpu_memory_utilization": "gpu_memory_utilization",
    "engine.mem_fraction_static": "gpu_memory_utilization",
    "engine.cuda_memory_fraction": "gpu_memory_utilization",
    "engine.max_num_seqs": "max_num_seqs",
    "engine.max_running_requests": "max_num_seqs",
    "engine.max_batch_size": "max_num_seqs",
    "engine.block_size": "block_size",
    "engine.page_size": "block_size",
    "gpu": "gpu",
    "instances": "num_gpus",
}


def request_field(field: str) -> str | None:
    """The request field a fix changes (its line is where to change it)."""
    return _REQUEST_FIELDS.get(field)
