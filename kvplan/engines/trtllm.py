"""The TensorRT-LLM engine model (PyTorch backend, trtllm-serve / LLM API): its KV cache sizing and options.

TensorRT-LLM (tensorrt_llm/_torch/pyexecutor/_util.py, KvCacheCreator) first runs dummy requests that fill
max_num_tokens, measures the peak (torch's allocated peak plus everything outside torch: CUDA context, NCCL,
CUDA graphs), and then keeps a FRACTION OF WHAT IS LEFT, not of the card:
    kv_bytes = (total - peak + temporary_kv) x free_gpu_memory_fraction          (default 0.9)
The temporary KV cache of the estimation pass is in the peak and is added back, so the fraction applies to
total - weights - activation peak - memory outside torch. The C++ KV cache manager turns that into tokens
(kv_bytes / bytes per token, capped by max_tokens when set: the smaller wins) and blocks of
tokens_per_block (32) tokens, ceil(tokens / tokens_per_block), the minimum over ranks. A request of L tokens
holds ceil(L / tokens_per_block) blocks; max_batch_size (2,048) caps the requests in flight.

Worked example (Llama-3.1-8B, H100 79.19 GiB, tp 1, fraction 0.9): weights 14.99 GiB, peak of an 8,192-token
step ~1.9 GiB, outside torch ~1.6 GiB leave ~60.7 GiB; x 0.9 = ~54.6 GiB / 128 KiB per token = ~447,000
tokens = ~13,980 blocks of 32.
Public TensorRT-LLM logs seldom print the whole profile. benchmarks/trtllm_accuracy.py checks what nine held-out
ones print: the bytes a token on five, the fraction and blocks from two logs' own measurements, and one plan end
to end (Qwen3-0.6B's layout on an H100 with 1.2.1's defaults: 641,920 tokens planned, 643,136 logged). All agree
within 0.2%, but that is too few for an error band, so every plan still says the model is not calibrated.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.kv import pp_stage_layers
from kvplan.engines.base import Calibration, EngineAccount, Knobs, KvPool, MemoryTerm, Refusal, check_counts
from kvplan.engines.box import BoxTerms, box_terms
from kvplan.engines.release import CURRENT
from kvplan.engines.vllm_memory import WeightSplit, activation_peak_bytes, non_torch_for, weights_per_stage
from kvplan.errors import FieldError
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.records import dataclass
from kvplan.units import GiB, cdiv

TRTLLM_VERSIONS = (CURRENT,)
DEFAULT_FRACTION = 0.9  # KvCacheConfig.free_gpu_memory_fraction (llmapi/llm_args.py)
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block
DEFAULT_MAX_BATCH_SIZE = 2048  # BaseLlmArgs.max_batch_size
DEFAULT_MAX_NUM_TOKENS = 8192  # BaseLlmArgs.max_num_tokens
# CUDA graphs: no TensorRT-LLM log gives their memory; vLLM 0.19's median over its 61 H100 logs (0.85 GiB) is
# borrowed and labelled so. The CUDA context, cuBLAS and NCCL: vLLM's figures by GPU class and tp
# (vllm_memory.NON_TORCH), context included, since TensorRT-LLM measures after everything started.
CUDA_GRAPH_BYTES = round(0.85 * GiB)
# kv_cache_config.dtype choices kvplan maps onto a KV dtype. nvfp4 (KVCacheManager.get_cache_bytes_per_token):
# half a byte a value and one fp8 scale per 16 values, 144 B a head of 128 for K and V; FP4 needs Blackwell.
KV_CACHE_DTYPES = ("auto", "fp8", "bf16", "bfloat16", "fp16", "float16", "nvfp4")
FP4_MIN_CAPABILITY = (10, 0)
# Layer kinds whose per-token KV TensorRT-LLM's paged cache holds (sliding windows and Llama 4's chunks count in
# full: its per-window pools are not modelled, which over-counts their need); state kinds are not modelled.
KIND_RULES: dict[LayerKind, str | None] = {
    LayerKind.FULL_ATTENTION: "kv",
    LayerKind.SLIDING_WINDOW: "kv",
    LayerKind.CHUNKED_LOCAL: "kv",
    LayerKind.MLA: "kv",
    LayerKind.COMPRESSED_MLA: "unmodelled",  # DeepSeek-V4's compressed caches
    LayerKind.MAMBA: "state",
    LayerKind.LINEAR_ATTENTION: "state",
    LayerKind.SHARED_KV: None,
    LayerKind.NO_CACHE: None,
}


@dataclass(frozen=True)
class TrtllmOptions:
    """TensorRT-LLM's own options (LLM API / trtllm-serve names); None means its default."""

    engine: ClassVar[str] = "trtllm"

    version: str = CURRENT
    free_gpu_memory_fraction: float | None = None  # kv_cache_config.free_gpu_memory_fraction
    max_tokens: int | None = None  # kv_cache_config.max_tokens
    tokens_per_block: int | None = None  # kv_cache_config.tokens_per_block
    max_batch_size: int | None = None
    max_num_tokens: int | None = None

    def validate(self) -> None:
        if self.version not in TRTLLM_VERSIONS:
            raise FieldError("engine.version", f"must be one of {', '.join(TRTLLM_VERSIONS)}", self.version)
        f = self.free_gpu_memory_fraction
        if f is not None and not 0 <= f <= 1:
            raise FieldError("engine.free_gpu_memory_fraction", "must be in [0, 1]", f)
        check_counts(self, ("max_tokens", "tokens_per_block", "max_batch_size", "max_num_tokens"))


@dataclass(frozen=True)
class TrtllmStage:
    """One rank of one pipeline stage, as the KV cache creator sizes it."""

    weights_bytes: int
    activation_peak_bytes: int
    outside_torch_bytes: int  # context, NCCL, CUDA graphs
    kv_budget_bytes: int  # (total - peak) x fraction
    bytes_per_token: int
    tokens: int  # before the max_tokens cap
    blocks: int


def _bytes_per_token(model: ModelSpec, layers: range, kv_name: str, dtype: str, tp: int) -> int:
    kv = resolve_kv_dtype(kv_name, dtype)
    if model.geometry.mla is not None and model.geometry.mla.index_head_dim:
        raise FieldError("model", f"{model.name} has a sparse-attention indexer (DeepSeek-V3.2); kvplan models its "
                         "key cache for vLLM, SGLang and Transformers only (use --engine vllm)")
    total = 0
    for spec, n in model.spec_counts(layers).items():
        rule = KIND_RULES[spec.kind]
        if rule == "unmodelled":
            raise FieldError("model", f"{model.name} has {spec.kind} layers (DeepSeek-V4); kvplan models their "
                             "caches for vLLM and Transformers only (use --engine vllm)")
        if rule == "state":
            raise FieldError("model", f"{model.name} has {spec.kind} layers; kvplan does not model TensorRT-LLM's "
                             "state cache for them (use --engine vllm or sglang)")
        if rule == "kv":
            total += n * spec.kv_bytes_per_token(kv, tp)
    if not total:
        raise FieldError("model", f"{model.name} keeps no per-token KV for TensorRT-LLM's paged cache")
    return total


def estimation_requests(max_num_tokens: int, max_seq_len: int) -> int:
    """The estimation pass's context requests: each min(max_num_tokens, max_seq_len - 1) long, together filling
    max_num_tokens (_get_token_num_for_estimation): 8,192 tokens at max_seq_len 4,096 -> 4,095 each -> 3."""
    each = max(1, min(max_num_tokens, max_seq_len - 1))
    return cdiv(max_num_tokens, each)


def _stages(d: Deployment, o: TrtllmOptions) -> tuple[tuple[TrtllmStage, ...], BoxTerms]:
    p, model = d.parallelism, d.model
    dtype = d.weights.dtype or serving_dtype(model.config_dtype)
    step = o.max_num_tokens or DEFAULT_MAX_NUM_TOKENS
    requests = estimation_requests(step, d.max_model_len)
    box = box_terms(d.profile, d, max_num_batched_tokens=step, max_num_seqs=requests)
    total = box.total_memory_bytes or d.gpu.total_memory_bytes
    fraction = DEFAULT_FRACTION if o.free_gpu_memory_fraction is None else o.free_gpu_memory_fraction
    tpb = o.tokens_per_block or DEFAULT_TOKENS_PER_BLOCK
    weights = weights_per_stage(model, dtype=dtype, tp=p.tp, pp=p.pp, quantization=d.weights.quantization,
                                checkpoint_bytes=d.weights.checkpoint_bytes,
                                split=WeightSplit(cpu_offload_bytes=d.weights.cpu_offload_bytes))
    layers = pp_stage_layers(model.num_layers, p.pp)
    outside = non_torch_for(d.gpu.key, p.tp, p.pp).charged(with_context=True) + CUDA_GRAPH_BYTES
    if box.non_torch_bytes is not None:
        outside = box.non_torch_bytes + (box.cuda_graph_bytes or 0)
    outside += d.gpu_in_use_bytes  # measured free memory: another process's is gone too
    out = []
    for i, ((w, _), stage) in enumerate(zip(weights, layers, strict=True)):
        last = i == len(layers) - 1
        # The forward of the dummy step, then the sampler over one row per dummy request (last stage only); the
        # coefficients are vLLM's (kvplan.engines.vllm_memory), not fitted on TensorRT-LLM.
        peak = activation_peak_bytes(model, dtype=dtype, tp=p.tp, max_num_batched_tokens=step,
                                     max_num_seqs=requests, runs_sampler=last)
        w = w if box.weights_bytes is None else box.weights_bytes
        peak = peak if box.activation_peak_bytes is None else box.activation_peak_bytes
        budget = int((total - w - peak - outside) * fraction)
        per_token = _bytes_per_token(model, stage, d.kv_cache_dtype, dtype, p.tp)
        tokens = max(0, budget) // per_token
        capped = min(tokens, o.max_tokens) if o.max_tokens else tokens
        out.append(TrtllmStage(w, peak, outside, budget, per_token, tokens, cdiv(capped, tpb)))
    return tuple(out), box


def _refusal(d: Deployment, o: TrtllmOptions) -> Refusal | None:
    if d.kv_cache_dtype.lower() not in KV_CACHE_DTYPES:
        return Refusal("kv_dtype", f"TensorRT-LLM's kv_cache_config.dtype takes {', '.join(KV_CACHE_DTYPES)} here; "
                       f"not {d.kv_cache_dtype!r}.", "kv_cache_dtype")
    capability = d.gpu.compute_capability
    if d.kv_cache_dtype.lower() == "nvfp4" and (capability is None or capability < FP4_MIN_CAPABILITY):
        return Refusal("kv_dtype", "TensorRT-LLM's nvfp4 KV cache runs on Blackwell (SM100 and later); use fp8.",
                       "kv_cache_dtype")
    fraction = o.free_gpu_memory_fraction
    if fraction is not None and fraction >= 1.0:
        # BaseKVCacheManager::calculateFreeMemBytes (C++): the Python config accepts 1.0, the C++ check does not.
        return Refusal("option", f"Invalid freeMemFraction, freeMemFraction ({fraction:f}) must be smaller than 1.0f",
                       "engine.free_gpu_memory_fraction")
    heads, tp = d.model.num_attention_heads, d.parallelism.tp
    if heads % tp:
        return Refusal("tp_heads", f"tensor parallel size {tp} does not divide the {heads} attention heads "
                       "(kvplan's words).", "parallelism.tp")
    if d.parallelism.pp > d.model.num_layers:
        return Refusal("pp_layers", f"{d.parallelism.pp} pipeline stages for {d.model.num_layers} layers "
                       "(kvplan's words).", "parallelism.pp")
    return None


def calibration() -> Calibration:
    return Calibration(
        in_range=False,
        checked_on="9 held-out TensorRT-LLM logs, 6 checkable in part (benchmarks/results/trtllm_accuracy.md): "
                   "not calibrated",
        outside=("engine TensorRT-LLM (too few logs for an error band)",),
        error_band="unknown",
    )


class TrtllmEngine:
    """TensorRT-LLM's PyTorch backend (trtllm-serve, LLM API), from the newest stored sources read."""

    name: ClassVar[str] = "trtllm"
    label: ClassVar[str] = "TensorRT-LLM"
    options_type: ClassVar[type] = TrtllmOptions
    knobs: ClassVar[Knobs] = Knobs(fp8_kv_dtype="fp8", utilization=("engine.free_gpu_memory_fraction", 0.95),
                                   request_cap="engine.max_batch_size")

    def default_options(self) -> TrtllmOptions:
        return TrtllmOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        return p.tp * p.pp * p.dp

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, TrtllmOptions):
            raise TypeError("TrtllmEngine needs TrtllmOptions")
        refused = _refusal(d, o)
        cap = o.max_batch_size or DEFAULT_MAX_BATCH_SIZE
        if refused is not None:
            return EngineAccount(
                engine=self.name, version=o.version, total_memory_bytes=d.gpu.total_memory_bytes, requested_bytes=0,
                terms=(), kv_budget_bytes=0, pools=(), max_model_len=d.max_model_len, request_cap=cap,
                engine_concurrency=0.0, kv_cache_tokens=None, refusal=refused, log_lines=(refused.message,),
                calibration=calibration(),
            )
        stages, box = _stages(d, o)
        lim = min(stages, key=lambda s: s.blocks)  # every rank adopts the smallest block count
        tpb = o.tokens_per_block or DEFAULT_TOKENS_PER_BLOCK
        fraction = DEFAULT_FRACTION if o.free_gpu_memory_fraction is None else o.free_gpu_memory_fraction
        total = box.total_memory_bytes or d.gpu.total_memory_bytes
        length = d.max_model_len
        per_request = cdiv(length, tpb)
        block_bytes = lim.bytes_per_token * tpb
        peak = lim.weights_bytes + lim.activation_peak_bytes + lim.outside_torch_bytes
        left = total - peak
        terms = (
            MemoryTerm("weights", lim.weights_bytes, "weights as loaded on this rank"),
            MemoryTerm("activation_peak", lim.activation_peak_bytes,
                       f"peak of the estimation pass ({o.max_num_tokens or DEFAULT_MAX_NUM_TOKENS:,} tokens; "
                       "vLLM's activation model)"),
            MemoryTerm("non_torch", lim.outside_torch_bytes, "outside torch: CUDA context, NCCL, CUDA graphs"
                       + (", other processes" if d.gpu_in_use_bytes else "")),
            MemoryTerm("reserved", max(0, left - lim.kv_budget_bytes),
                       f"the {1 - fraction:.0%} of the rest that free_gpu_memory_fraction {fraction} leaves"),
        )
        pool = KvPool("KV blocks", "block", block_bytes, lim.blocks, per_request,
                      d.workload.shared_prefix_tokens // tpb)  # block reuse shares whole blocks of a prefix
        refusal = None
        if lim.kv_budget_bytes <= 0 or lim.blocks == 0:
            refusal = Refusal("no_kv_memory", "no GPU memory is left for the KV cache after the weights and the "
                              "profiled peak (kvplan's words).", "engine.free_gpu_memory_fraction")
        elif per_request > lim.blocks:
            refusal = Refusal("one_request", f"the KV cache holds {lim.blocks * tpb:,} tokens, fewer than one "
                              f"request of {length:,} (kvplan's words).", "workload.max_model_len")
        notes = [f"free_gpu_memory_fraction {fraction} is a share of the {left / GiB:,.2f} GiB left after the "
                 f"weights and the profiled peak, not of the {total / GiB:,.2f} GiB card"]
        if o.max_tokens and o.max_tokens < lim.tokens:
            notes.append(f"max_tokens {o.max_tokens:,} caps the {lim.tokens:,} tokens the memory holds (the smaller "
                         "of the two wins)")
        notes.extend(box.notes)
        notes.append("not calibrated: public TensorRT-LLM logs seldom print the whole profile; the parts 6 held-out "
                     "logs print agree within 0.2% (bytes a token, the fraction and blocks, one H100 plan), too few "
                     "for an error band")
        detail: dict[str, Any] = {
            "free_gpu_memory_fraction": fraction,
            "tokens_per_block": tpb,
            "max_num_tokens": o.max_num_tokens or DEFAULT_MAX_NUM_TOKENS,
            "max_batch_size": cap,
            "bytes_per_token": lim.bytes_per_token,
            "kv_budget_bytes": lim.kv_budget_bytes,
            "tokens_from_memory": lim.tokens,
            "primary_blocks": lim.blocks,
        }
        return EngineAccount(
            engine=self.name,
            version=o.version,
            total_memory_bytes=total,
            requested_bytes=total,
            terms=terms,
            kv_budget_bytes=max(0, lim.kv_budget_bytes),
            pools=(pool,),
            max_model_len=length,
            request_cap=cap,
            engine_concurrency=lim.blocks / per_request,
            kv_cache_tokens=lim.blocks * tpb,
            refusal=refusal,
            log_lines=(
                f"Peak memory during memory usage profiling (torch + non-torch): {peak / GiB:.2f} GiB, available KV "
                f"cache memory when calculating max tokens: {lim.kv_budget_bytes / GiB:.2f} GiB, fraction is set "
                f"{fraction}, kv size is {lim.bytes_per_token}. device total memory {total / GiB:.2f} GiB",
                f"[TensorRT-LLM][INFO] Number of blocks in KV cache primary pool: {lim.blocks}",
            ),
            notes=tuple(notes),
            detail=detail,
            calibration=calibration(),
            per_request_at=lambda n: (cdiv(n, tpb),),
        )
