"""vLLM's defaults for max_num_batched_tokens and max_num_seqs, per release, engine, GPU and entry point.

docs/engine-rules.md 1.4. The step size sets the profiling run's activation peak and the sequence count the
sampler's rows, so a wrong default moves the KV budget by gigabytes on a large vocabulary.
"""

from __future__ import annotations

from kvplan.engines.vllm_versions import VllmRules
from kvplan.hardware.gpus import GpuSpec
from kvplan.records import dataclass
from kvplan.units import GiB

# V1's "big GPU" test compares torch's total_memory with 70 GiB (0.8.5+); H100 80GB reports 79.19 GiB.
BIG_GPU_BYTES = 70 * GiB
# 0.28+ gives GPUs of at least 160 GiB (B200, B300, MI300X) the largest defaults for both entry points.
LARGEST_GPU_BYTES = 160 * GiB
# V0 turns chunked prefill on by itself only past 32K tokens of context (create_engine_config).
V0_CHUNKED_ABOVE_TOKENS = 32_768
# V0 gives multimodal models at least this step (_MULTIMODAL_MODEL_MAX_NUM_BATCHED_TOKENS).
V0_MULTIMODAL_MIN_TOKENS = 5_120
V0_MAX_NUM_SEQS = 256


@dataclass(frozen=True)
class BatchShape:
    """The scheduler's step: tokens per step and requests at once, as vLLM resolves them."""

    max_num_batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool = True  # a prompt longer than the step is split over steps


def _device_name(gpu: GpuSpec) -> str:
    """What torch.cuda.get_device_name() prints, lower-cased (vLLM matches substrings of it)."""
    return (gpu.device_names[0] if gpu.device_names else gpu.key).lower()


def _v1_defaults(rules: VllmRules, gpu: GpuSpec, usage: str) -> tuple[int, int]:
    """(tokens, seqs) before the caps: `vllm serve` and the LLM class differ by a factor of 2 to 4 in tokens."""
    name = _device_name(gpu)
    if rules.v1_batch_rule == "fixed":  # 0.6.4 - 0.6.6, V1 opt-in
        return (2048 if usage == "serve" else 8192), 1024
    if rules.v1_batch_rule in ("name", "name_seqs"):  # 0.7.0 - 0.8.4: by device name
        big = "h100" in name or "h200" in name
        seqs = 1024 if big or rules.v1_batch_rule == "name" else 256  # 0.8.4: 256 off H100/H200
        return ((8192 if big else 2048) if usage == "serve" else (16384 if big else 8192)), seqs
    if rules.v1_batch_rule == "memory_tiers" and gpu.total_memory_bytes >= LARGEST_GPU_BYTES:
        return 16384, 1024
    big = gpu.total_memory_bytes >= BIG_GPU_BYTES
    if rules.v1_batch_rule in ("memory_not_a100", "memory_tiers"):
        big = big and "a100" not in name
    if usage == "serve":
        return (8192, 1024) if big else (2048, 256)
    return (16384, 1024) if big else (8192, 256)


def batch_shape(
    rules: VllmRules,
    engine: str,
    gpu: GpuSpec,
    *,
    max_model_len: int,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    chunked_prefill_capable: bool,
    multimodal: bool,
    usage: str = "serve",
    chunked_prefill: bool | None = None,
) -> BatchShape:
    """The step vLLM runs: given values stand, defaults follow the release's rule.

    Llama-3.1-8B on an L4 with vLLM 0.19 `vllm serve`: 2,048 tokens, 256 sequences; the same on 0.8.2's V1:
    2,048 and 1,024 (the name rule gives 8,192 only to H100/H200); on V0 with max_model_len 8,192: chunked
    prefill stays off, so max(8,192, 2,048) = 8,192 tokens and 256 sequences.
    """
    if engine == "v0":
        seqs = max_num_seqs or V0_MAX_NUM_SEQS
        chunked = chunked_prefill if chunked_prefill is not None else (
            chunked_prefill_capable and max_model_len > V0_CHUNKED_ABOVE_TOKENS)
        if max_num_batched_tokens is not None:
            return BatchShape(max_num_batched_tokens, seqs, chunked)
        tokens = rules.v0_chunked_tokens if chunked else max(max_model_len, 2048)
        if multimodal:
            tokens = max(tokens, V0_MULTIMODAL_MIN_TOKENS)
        return BatchShape(tokens, seqs, chunked)
    # V1 chunks prompts; from 0.11.1 --no-enable-chunked-prefill turns it off, and a defaulted step then holds a
    # whole prompt: max(max_model_len, the default) (EngineArgs._set_default_args).
    chunked = not (chunked_prefill is False and rules.v1_chunked_optional)
    default_tokens, default_seqs = _v1_defaults(rules, gpu, usage)
    if not chunked:
        default_tokens = max(max_model_len, default_tokens)
    tokens = max_num_batched_tokens or default_tokens
    seqs = max_num_seqs or default_seqs
    if rules.batch_caps:
        # 0.11.1+: a defaulted step is no larger than all sequences at full length; defaulted sequences no
        # more than the step's tokens (max_num_seqs 1: 8,192-token step capped at 1 x max_model_len).
        if max_num_batched_tokens is None:
            tokens = min(seqs * max_model_len, tokens)
        if max_num_seqs is None:
            seqs = min(seqs, tokens)
    return BatchShape(tokens, seqs, chunked)
