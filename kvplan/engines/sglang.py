"""The SGLang engine model: mem_fraction_static and its default rule, the token pools, and SGLang's options.

SGLang (sglang/srt/model_executor/model_runner.py, profile_max_num_token) keeps a fraction of the memory that
was free BEFORE the weights were loaded, unlike vLLM's fraction of the total:
    rest = free_after_weights - free_before_load x (1 - mem_fraction_static)
and cuts `rest` into token slots of `cell_size` bytes (the KV of one token over every layer of this rank; KV
heads split over the attention-TP ranks with at least one per rank; an MLA latent is never split), rounded
down to whole pages. Models with sliding-window layers get a second pool (swa_full_tokens_ratio sliding
tokens per full token); models with Mamba or linear-attention layers a pool of per-request state slots.
What is left outside mem_fraction_static holds activations and CUDA graphs, which is why the default fraction
comes from the GPU's size (server_args.py, _handle_gpu_memory_settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.kv import pp_stage_layers
from kvplan.engines.base import EngineAccount, Knobs, KvPool, MemoryTerm, Refusal
from kvplan.engines.vllm_engine import tp_refusal
from kvplan.engines.vllm_memory import CONTEXT_BYTES, WeightSplit, weights_per_stage
from kvplan.errors import FieldError
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.units import GiB, MiB, cdiv

SGLANG_VERSIONS = ("current",)
# Memory the CUDA context takes before SGLang measures "free before load": vLLM 0.19 logs 0.51 GiB of non-torch
# memory at worker start on H100 (tp 1); SGLang's own start-up is assumed to cost the same.
SWA_FULL_TOKENS_RATIO = 0.8  # ServerArgs.swa_full_tokens_ratio
# ServerArgs.mamba_full_memory_ratio: the Mamba state pool's memory as a share of the full-attention KV pool's.
MAMBA_FULL_MEMORY_RATIO = 0.9
# SGLang's --kv-cache-dtype choices.
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16")


@dataclass(frozen=True)
class SglangOptions:
    """SGLang's own server options; None means SGLang's default for the GPU."""

    engine: ClassVar[str] = "sglang"

    version: str = "current"
    mem_fraction_static: float | None = None
    page_size: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None

    def validate(self) -> None:
        if self.version not in SGLANG_VERSIONS:
            raise FieldError("engine.version", f"must be one of {', '.join(SGLANG_VERSIONS)}", self.version)
        f = self.mem_fraction_static
        if f is not None and not 0 < f < 1:
            raise FieldError("engine.mem_fraction_static", "must be in (0, 1)", f)
        for name in ("page_size", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 1 << 30:
                raise FieldError(f"engine.{name}", "must be between 1 and 2^30", value)


@dataclass(frozen=True)
class GpuDefaults:
    """What SGLang derives from the GPU's memory when the flags are not given."""

    chunked_prefill_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float
    reserved_mib: float  # what the default fraction leaves for activations and CUDA graphs


def gpu_defaults(total_bytes: int, o: SglangOptions, p: Parallelism) -> GpuDefaults:
    """SGLang's _handle_gpu_memory_settings (server_args.py), for CUDA GPUs.

    gpu_mem is the card's total in MiB. By size class it picks chunked_prefill_size and cuda_graph_max_bs,
    then reserves 512 + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 x 1024 MiB
    (more with DP attention), at least 10 GiB on cards above 60 GiB, and keeps the rest:
    H100 (81,089 MiB), tp 1: chunk 8,192, graphs 256 -> 512 + 12,288 + 512 + 128 = 13,440 MiB ->
    round((81,089 - 13,440) / 81,089, 3) = 0.834.
    """
    gpu_mem = total_bytes / MiB
    tp_small = p.tp < 4
    if gpu_mem < 20 * 1024:  # T4, 4080
        chunk, graphs = 2048, 8
    elif gpu_mem < 35 * 1024:  # A10, 4090, 5090
        chunk, graphs = 2048, (24 if tp_small else 80)
    elif gpu_mem < 60 * 1024:  # A100 40GB, L40
        chunk, graphs = 4096, (32 if tp_small else 160)
    elif gpu_mem < 160 * 1024:  # H100, A100 80GB, H20, H200
        chunk, graphs = 8192, (256 if tp_small else 512)
    else:  # B200, MI300
        chunk, graphs = 16384, 512
    chunk = o.chunked_prefill_size or chunk
    graphs = o.cuda_graph_max_bs or graphs
    reserved = 512 + max(chunk, 2048) * 1.5 + graphs * 2 + p.tp * p.pp / 8 * 1024
    if p.dp_attention:
        reserved += graphs * p.dp * 3 + (graphs * p.dp * 1.5 if graphs > 300 else 0)
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = o.mem_fraction_static or round((gpu_mem - reserved) / gpu_mem, 3)
    return GpuDefaults(chunk, graphs, fraction, reserved)


def _attention_tp(p: Parallelism) -> int:
    """Ranks one layer's attention is split over: tp, or tp / dp with DP attention."""
    return p.tp // p.dp if p.dp_attention else p.tp


# Which of SGLang's pools holds a layer: "full" tokens, "swa" (the sliding-window pool), "state" (one Mamba /
# DeltaNet slot per request), or None for layers with nothing of their own. Llama 4's chunked layers are
# counted in the full pool: SGLang's chunked-attention pool is not modelled.
KIND_RULES: dict[LayerKind, str | None] = {
    LayerKind.FULL_ATTENTION: "full",
    LayerKind.SLIDING_WINDOW: "swa",
    LayerKind.CHUNKED_LOCAL: "full",
    LayerKind.MLA: "full",
    LayerKind.MAMBA: "state",
    LayerKind.LINEAR_ATTENTION: "state",
    LayerKind.SHARED_KV: None,
    LayerKind.NO_CACHE: None,
}


def _cells(model: ModelSpec, layers: range, kv_name: str, dtype: str, attn_tp: int) -> tuple[int, int, int, int]:
    """(full cell bytes, sliding cell bytes, state bytes per request, sliding window) over `layers` on one rank."""
    kv = resolve_kv_dtype(kv_name, dtype)
    sums = {"full": 0, "swa": 0, "state": 0}
    window = 0
    for spec, n in model.spec_counts(layers).items():
        pool = KIND_RULES[spec.kind]
        if pool == "state":
            sums["state"] += n * spec.state_bytes(attn_tp)
        elif pool is not None:
            sums[pool] += n * spec.kv_bytes_per_token(kv, attn_tp)
        if pool == "swa":
            window = max(window, spec.window_tokens or 0)
    return sums["full"], sums["swa"], sums["state"], window


@dataclass(frozen=True)
class SglangReport:
    """What SGLang would report at start-up on one rank of the limiting pipeline stage."""

    defaults: GpuDefaults
    page_size: int
    free_before_load_bytes: int
    weights_bytes: int
    available_kv_bytes: int  # `rest`: the memory the pools are cut from
    cell_size_bytes: int  # full-attention (and MLA) bytes per token on this rank
    swa_cell_size_bytes: int  # sliding-window bytes per token on this rank
    state_bytes: int  # Mamba / linear-attention state per request on this rank
    max_total_num_tokens: int
    swa_max_total_num_tokens: int
    mamba_slots: int
    window_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mem_fraction_static": self.defaults.mem_fraction_static,
            "chunked_prefill_size": self.defaults.chunked_prefill_size,
            "cuda_graph_max_bs": self.defaults.cuda_graph_max_bs,
            "page_size": self.page_size,
            "free_before_load_bytes": self.free_before_load_bytes,
            "weights_bytes": self.weights_bytes,
            "available_kv_cache_bytes": self.available_kv_bytes,
            "cell_size_bytes": self.cell_size_bytes,
            "swa_cell_size_bytes": self.swa_cell_size_bytes,
            "state_bytes_per_request": self.state_bytes,
            "max_total_num_tokens": self.max_total_num_tokens,
            "swa_max_total_num_tokens": self.swa_max_total_num_tokens,
            "mamba_slots": self.mamba_slots,
        }


def plan_sglang(d: Deployment) -> SglangReport:
    """SGLang's token pools for `d` on the rank of its fullest pipeline stage."""
    o = d.engine
    if not isinstance(o, SglangOptions):
        raise TypeError("plan_sglang needs SGLang options")
    p, model = d.parallelism, d.model
    defaults = gpu_defaults(d.gpu.total_memory_bytes, o, p)
    page = o.page_size or 1
    dtype = d.weights.dtype or serving_dtype(model.config_dtype)
    attn_tp = _attention_tp(p)
    split = WeightSplit(
        attention_ranks=attn_tp if p.dp_attention else None,
        expert_ranks=p.ep_size if p.expert_parallel or p.ep_size else None,
        cpu_offload_bytes=d.weights.cpu_offload_bytes,
    )
    weights = weights_per_stage(
        model, dtype=dtype, tp=p.tp, pp=p.pp, quantization=d.weights.quantization,
        checkpoint_bytes=d.weights.checkpoint_bytes, split=split,
    )
    free_before = d.gpu.total_memory_bytes - CONTEXT_BYTES
    reports = []
    for (w, _), layers in zip(weights, pp_stage_layers(model.num_layers, p.pp), strict=True):
        rest = free_before - w - round(free_before * (1 - defaults.mem_fraction_static))
        full, swa, state, window = _cells(model, layers, d.kv_cache_dtype, dtype, attn_tp)
        # Mamba hybrids: the state pool takes mamba_full_memory_ratio of what the full KV pool gets.
        mamba_bytes = round(max(0, rest) * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)) if state else 0
        slots = mamba_bytes // state if state else 0
        per_full_token = full + SWA_FULL_TOKENS_RATIO * swa
        tokens = int(max(0, rest - mamba_bytes) // per_full_token) if per_full_token else 0
        tokens -= tokens % page
        swa_tokens = int(tokens * SWA_FULL_TOKENS_RATIO) if swa else 0
        swa_tokens -= swa_tokens % page
        reports.append(SglangReport(defaults, page, free_before, w, rest, full, swa, state, tokens, swa_tokens, slots,
                                    window))
    # Every stage runs the same requests: the stage with the fewest token slots limits them all.
    return min(reports, key=lambda r: (r.max_total_num_tokens, r.mamba_slots))


def _refusal(d: Deployment, r: SglangReport | None) -> Refusal | None:
    if d.kv_cache_dtype.lower() not in KV_CACHE_DTYPES:
        return Refusal(
            "kv_dtype",
            f"SGLang's --kv-cache-dtype takes {', '.join(KV_CACHE_DTYPES)}; not {d.kv_cache_dtype!r}.",
            "kv_cache_dtype",
        )
    if d.parallelism.pp > d.model.num_layers:
        return Refusal("pp_layers", f"--pp-size {d.parallelism.pp} exceeds the model's {d.model.num_layers} layers.",
                       "parallelism.pp")
    if d.parallelism.dp_attention and d.parallelism.tp % d.parallelism.dp:
        return Refusal("option", f"DP attention needs --dp {d.parallelism.dp} to divide --tp {d.parallelism.tp}.",
                       "parallelism.dp")
    refused = tp_refusal(d.model, _attention_tp(d.parallelism))
    if refused is not None:
        return refused
    limit = d.model.max_position_embeddings
    if limit and d.max_model_len > limit:
        return Refusal(
            "context",
            f"User-specified context_length ({d.max_model_len}) is greater than the derived context_length "
            f"({limit}). Set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to override.",
            "workload.max_model_len",
        )
    if r is None:
        return None
    if r.available_kv_bytes <= 0 or r.max_total_num_tokens <= 0:
        return Refusal("no_kv_memory", "Not enough memory. Please try to increase --mem-fraction-static.",
                       "engine.mem_fraction_static")
    if r.max_total_num_tokens < d.max_model_len:
        return Refusal(
            "one_request",
            f"max_total_num_tokens={r.max_total_num_tokens:,} is below the context length {d.max_model_len:,}: "
            "SGLang starts, but cannot admit one request of that length.",
            "workload.max_model_len",
        )
    return None


class SglangEngine:
    """SGLang (sglang.launch_server), as of its 2025-2026 releases."""

    name: ClassVar[str] = "sglang"
    label: ClassVar[str] = "SGLang"
    options_type: ClassVar[type] = SglangOptions
    knobs: ClassVar[Knobs] = Knobs(fp8_kv_dtype="fp8_e4m3", request_cap="engine.max_running_requests")

    def default_options(self) -> SglangOptions:
        return SglangOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        """tp x pp GPUs; --dp replicas multiply them unless DP attention places the dp ranks inside tp."""
        return p.tp * p.pp * (1 if p.dp_attention else p.dp)

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, SglangOptions):
            raise TypeError("SglangEngine needs SglangOptions")
        early = _refusal(d, None)
        if early is not None:
            return EngineAccount(
                engine=self.name, version=o.version, total_memory_bytes=d.gpu.total_memory_bytes, requested_bytes=0,
                terms=(), kv_budget_bytes=0, pools=(), max_model_len=d.max_model_len,
                request_cap=o.max_running_requests, engine_concurrency=0.0, kv_cache_tokens=None, refusal=early,
                log_lines=(f"Error: {early.message}",),
            )
        r = plan_sglang(d)
        page = r.page_size
        length = d.max_model_len
        prefix = d.workload.shared_prefix_tokens // page * page  # the radix cache shares whole pages

        def per_request(length: int) -> tuple[int, ...]:
            units = [cdiv(length, page) * page]
            if r.swa_cell_size_bytes:
                units.append(min(cdiv(length, page), cdiv(r.window_tokens, page) + 1) * page)
            if r.state_bytes:
                units.append(1)
            return tuple(units)

        units = per_request(length)
        pools = [KvPool("full-attention tokens", "token", r.cell_size_bytes, r.max_total_num_tokens, units[0], prefix)]
        if r.swa_cell_size_bytes:
            pools.append(KvPool("sliding-window tokens", "token", r.swa_cell_size_bytes, r.swa_max_total_num_tokens,
                                units[1]))
        if r.state_bytes:
            pools.append(KvPool("state slots", "slot", r.state_bytes, r.mamba_slots, 1))
        tokens = r.max_total_num_tokens
        # max_running_requests default (scheduler): min(clamp(tokens / context x 512, 2048, 4096), tokens // 2).
        cap = o.max_running_requests or min(max(int(tokens / length * 512), 2048), 4096, max(1, tokens // 2))
        requested = r.free_before_load_bytes - round(r.free_before_load_bytes * (1 - r.defaults.mem_fraction_static))
        terms = (
            MemoryTerm("context", CONTEXT_BYTES, "CUDA context before SGLang measures free memory"),
            MemoryTerm("weights", r.weights_bytes, "weights as loaded on this rank"),
            MemoryTerm("reserved", r.free_before_load_bytes - requested,
                       f"left outside mem_fraction_static {r.defaults.mem_fraction_static} for activations and "
                       "CUDA graphs"),
        )
        refusal = _refusal(d, r)
        line = (f"max_total_num_tokens={tokens}, chunked_prefill_size={r.defaults.chunked_prefill_size}, "
                f"max_running_requests={cap}, context_len={length}, page_size={page}, "
                f"mem_fraction_static={r.defaults.mem_fraction_static}")
        notes = []
        if not o.mem_fraction_static:
            notes.append(
                f"mem_fraction_static {r.defaults.mem_fraction_static} is SGLang's default for a "
                f"{d.gpu.total_memory_bytes / GiB:,.1f} GiB card: {r.defaults.reserved_mib:,.0f} MiB reserved for "
                "activations and CUDA graphs"
            )
        if r.state_bytes:
            notes.append(
                f"the Mamba/linear-attention state pool takes {MAMBA_FULL_MEMORY_RATIO} x the full KV pool's memory: "
                f"{r.mamba_slots:,} request slots of {r.state_bytes:,} B"
            )
        return EngineAccount(
            engine=self.name,
            version=o.version,
            total_memory_bytes=d.gpu.total_memory_bytes,
            requested_bytes=requested + CONTEXT_BYTES,
            terms=terms,
            kv_budget_bytes=max(0, r.available_kv_bytes),
            pools=tuple(pools),
            max_model_len=length,
            request_cap=cap,
            engine_concurrency=tokens / length,
            kv_cache_tokens=tokens,
            refusal=refusal,
            log_lines=(line,) if refusal is None else (line, f"Error: {refusal.message}"),
            notes=tuple(notes),
            detail=r.to_dict(),
            per_request_at=per_request,
        )
