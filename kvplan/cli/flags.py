"""How the command line names deployment fields: errors and fixes in flag terms, and which engine owns a flag.

The core speaks in fields (`parallelism.tp`, `engine.max_num_seqs`); only this module knows that the CLI
spells them `--tp` and `--max-num-seqs`, and which engines have them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.errors import FieldError, InputError
from kvplan.units import GiB

if TYPE_CHECKING:
    from kvplan.planner.fixes import Change

# Deployment field -> the estimate flag that sets it.
FIELD_FLAGS: dict[str, str] = {
    "workload.max_model_len": "--max-model-len",
    "workload.concurrency": "--batch",
    "workload.shared_prefix_tokens": "--shared-prefix",
    "workload.prefix_hit_rate": "--prefix-hit-rate",
    "workload.mix": "--input-len",
    "workload.mix.input_tokens": "--input-len",
    "workload.mix.output_tokens": "--output-len",
    "parallelism.tp": "--tp",
    "parallelism.pp": "--pp",
    "parallelism.dp": "--dp",
    "parallelism.ep_size": "--ep-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "gpu": "--gpu",
    "gpu.memory_bytes": "--gpu-mem",
    "gpu.in_use_bytes": "--gpu-memory-in-use",
    "gpu.num_gpus": "--num-gpus",
    "instances": "--num-gpus",
    "engine": "--engine",
    "weights.dtype": "--dtype",
    "weights.quantization": "--quantization",
    "weights.checkpoint_bytes": "--weights-bytes",
    "weights.cpu_offload_bytes": "--cpu-offload-gb",
    "source.weights_from_hub": "--weights-from-hub",
    "engine.version": "--vllm-version",
    "engine.install": "--vllm-install",
    "engine.compile_cache": "--compile-cache",
    "engine.gpu_memory_utilization": "--gpu-memory-utilization",
    "engine.block_size": "--block-size",
    "engine.max_num_seqs": "--max-num-seqs",
    "engine.max_num_batched_tokens": "--max-num-batched-tokens",
    "engine.kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "engine.allow_long_max_model_len": "--allow-long-max-model-len",
    "engine.flashinfer_sampler": "--flashinfer-sampler",
    "engine.mla_disable": "--mla-disable",
    "engine.mamba_cache_dtype": "--mamba-cache-dtype",
    "engine.mamba_ssm_cache_dtype": "--mamba-ssm-cache-dtype",
    "engine.speculative_method": "--speculative-config",
    "engine.num_speculative_tokens": "--speculative-config",
    "engine.max_loras": "--max-loras",
    "engine.max_lora_rank": "--max-lora-rank",
    "engine.mem_fraction_static": "--mem-fraction-static",
    "engine.page_size": "--page-size",
    "engine.max_running_requests": "--max-running-requests",
    "engine.chunked_prefill_size": "--chunked-prefill-size",
    "engine.cuda_graph_max_bs": "--cuda-graph-max-bs",
    "engine.max_total_tokens": "--max-total-tokens",
    "engine.attention_backend": "--attention-backend",
    "engine.free_gpu_memory_fraction": "--free-gpu-memory-fraction",
    "engine.max_tokens": "--max-tokens",
    "engine.tokens_per_block": "--tokens-per-block",
    "engine.max_num_tokens": "--max-num-tokens",
    "engine.cache": "--hf-cache",
    "engine.overhead_bytes": "--overhead",
    "engine.memory_fraction": "--gpu-memory-utilization",
    "engine.cuda_memory_fraction": "--gpu-memory-utilization",
    "engine.max_batch_size": "--max-batch-size",
}
# Fields whose flag depends on the engine (TGI's max_batch_size is --max-num-seqs; TensorRT-LLM's its own).
ENGINE_FIELD_FLAGS: dict[tuple[str, str], str] = {
    ("tgi", "engine.max_batch_size"): "--max-num-seqs",
    ("sglang", "engine.version"): "--sglang-version",
}

# Engine-specific flags -> the engines that have them; one of another engine's is an error naming its owner.
ENGINE_FLAGS: dict[str, tuple[str, ...]] = {
    "--vllm-version": ("vllm",),
    "--vllm-install": ("vllm",),
    "--compile-cache": ("vllm",),
    "--gpu-memory-utilization": ("vllm", "generic", "transformers", "tgi"),
    "--block-size": ("vllm", "generic"),
    "--max-num-seqs": ("vllm", "tgi"),
    "--max-num-batched-tokens": ("vllm",),
    "--enable-prefix-caching": ("vllm",),
    "--enable-chunked-prefill": ("vllm",),
    "--kv-cache-memory-bytes": ("vllm",),
    "--allow-long-max-model-len": ("vllm",),
    "--mla-disable": ("vllm",),
    "--flashinfer-sampler": ("vllm",),
    "--no-flashinfer-sampler": ("vllm",),
    "--mamba-cache-dtype": ("vllm",),
    "--mamba-ssm-cache-dtype": ("vllm",),
    "--speculative-config": ("vllm",),
    "--enable-lora": ("vllm",),
    "--max-loras": ("vllm",),
    "--max-lora-rank": ("vllm",),
    "--mem-fraction-static": ("sglang",),
    "--page-size": ("sglang",),
    "--max-running-requests": ("sglang",),
    "--chunked-prefill-size": ("sglang",),
    "--cuda-graph-max-bs": ("sglang",),
    "--sglang-version": ("sglang",),
    "--max-total-tokens": ("sglang",),
    "--attention-backend": ("sglang",),
    "--free-gpu-memory-fraction": ("trtllm",),
    "--max-tokens": ("trtllm",),
    "--tokens-per-block": ("trtllm",),
    "--max-batch-size": ("trtllm",),
    "--max-num-tokens": ("trtllm",),
    "--enable-dp-attention": ("sglang",),
    "--ep-size": ("sglang",),
    "--enable-expert-parallel": ("vllm",),
    "--hf-cache": ("transformers",),
    "--overhead": ("transformers", "generic"),
}
# What the other engine calls the same knob, for the error message.
_COUNTERPARTS = {
    ("--block-size", "sglang"): "--page-size",
    ("--page-size", "vllm"): "--block-size",
    ("--max-num-seqs", "sglang"): "--max-running-requests",
    ("--max-running-requests", "vllm"): "--max-num-seqs",
    ("--gpu-memory-utilization", "sglang"): "--mem-fraction-static",
    ("--mem-fraction-static", "vllm"): "--gpu-memory-utilization",
    ("--max-num-batched-tokens", "sglang"): "--chunked-prefill-size",
    ("--chunked-prefill-size", "vllm"): "--max-num-batched-tokens",
    ("--ep-size", "vllm"): "--enable-expert-parallel",
    ("--enable-expert-parallel", "sglang"): "--ep-size",
    ("--gpu-memory-utilization", "trtllm"): "--free-gpu-memory-fraction",
    ("--mem-fraction-static", "trtllm"): "--free-gpu-memory-fraction",
    ("--free-gpu-memory-fraction", "vllm"): "--gpu-memory-utilization",
    ("--free-gpu-memory-fraction", "sglang"): "--mem-fraction-static",
    ("--block-size", "trtllm"): "--tokens-per-block",
    ("--page-size", "trtllm"): "--tokens-per-block",
    ("--tokens-per-block", "vllm"): "--block-size",
    ("--tokens-per-block", "sglang"): "--page-size",
    ("--max-num-seqs", "trtllm"): "--max-batch-size",
    ("--max-running-requests", "trtllm"): "--max-batch-size",
    ("--max-batch-size", "vllm"): "--max-num-seqs",
    ("--max-batch-size", "sglang"): "--max-running-requests",
    ("--max-num-batched-tokens", "trtllm"): "--max-num-tokens",
    ("--max-num-tokens", "vllm"): "--max-num-batched-tokens",
    ("--vllm-version", "sglang"): "--sglang-version",
    ("--sglang-version", "vllm"): "--vllm-version",
    ("--max-total-tokens", "trtllm"): "--max-tokens",
    ("--max-tokens", "sglang"): "--max-total-tokens",
}


def check_engine_flags(engine: str, given: list[str]) -> None:
    """An engine-specific flag the selected engine does not have is an error naming who has it."""
    for flag in given:
        owners = ENGINE_FLAGS.get(flag)
        if owners is None or engine in owners:
            continue
        other = _COUNTERPARTS.get((flag, engine))
        hint = f"; {engine}'s counterpart is {other}" if other else ""
        raise InputError(f"{flag} is an option of --engine {' / '.join(owners)}, not {engine}{hint}")


def field_flag(field: str, engine: str | None = None) -> str | None:
    """The estimate flag that sets `field` for this engine."""
    return ENGINE_FIELD_FLAGS.get((engine or "", field)) or FIELD_FLAGS.get(field)


def flag_error(exc: FieldError, engine: str | None = None) -> InputError:
    """A core FieldError in the command line's words: `--seq 0: must be between 1 and ...`."""
    flag = field_flag(exc.field, engine)
    if flag is None:
        return InputError(exc.message)
    return InputError(exc.phrased(flag))


def _gib_value(field: str, value: object) -> object:
    if field == "weights.cpu_offload_bytes" and isinstance(value, int):
        return f"{value / GiB:g}"
    return value


def change_flags(changes: tuple[Change, ...], gpus_per_instance: int, engine: str | None = None) -> str:
    """A fix as the flags that make it: `--tp 4 --kv-cache-dtype fp8`; a flag back to the engine's default (a
    value of None) is `without --block-size`."""
    words = []
    for c in changes:
        if c.field == "instances" and isinstance(c.value, int):
            words.append(f"--num-gpus {c.value * gpus_per_instance}")
        elif c.field == "engine.allow_long_max_model_len":
            words.append("--allow-long-max-model-len")
        elif c.shown_value is None:
            words.append(f"without {field_flag(c.field, engine) or c.field}")
        else:
            words.append(f"{field_flag(c.field, engine) or c.field} {_gib_value(c.field, c.shown_value)}")
    return " ".join(words)
