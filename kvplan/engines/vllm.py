"""The vLLM engine model: its flags and defaults, the KV memory budget per rank, blocks, tokens, concurrency,
the lines vLLM logs at start-up, and the start-up failures (one request too long, the sampler warm-up).

Any release from 0.6.0 to 0.33 (`version`, "current" = the newest): vllm_versions maps it to its rules
(default utilization, batch defaults, which terms the budget charges, CUDA graphs, how tokens and
concurrency are reported); vllm_memory, vllm_graphs, vllm_encoder and vllm_mxfp4 give the terms;
a BoxProfile (measured on the user's box) replaces the terms it measured (vllm_profile).
"""

from __future__ import annotations

import functools
import math
from dataclasses import field, replace
from typing import Any

from kvplan.capacity.deployment import BoxProfile
from kvplan.capacity.kv import pp_stage_layers
from kvplan.engines.base import Refusal
from kvplan.engines.vllm_attention import AttentionPath, attention_path, flashinfer_graph_bytes, kv_attention_groups
from kvplan.engines.vllm_batch import batch_shape
from kvplan.engines.vllm_deepgemm import DeepGemmScratch
from kvplan.engines.vllm_dsa import BLOCK_TOKENS as DSA_BLOCK_TOKENS
from kvplan.engines.vllm_dsa import (
    dsa_buffer_bytes,
    dsa_check,
    dsa_storage,
    dsa_token_bytes,
    sparse_mla_gpu,
    uses_dsa,
)
from kvplan.engines.vllm_dsv4 import BLOCK_TOKENS as DSV4_BLOCK_TOKENS
from kvplan.engines.vllm_dsv4 import (
    dsv4_buffer_bytes,
    dsv4_kv_dtype,
    dsv4_layout,
    sparse_mla_refusal,
)
from kvplan.engines.vllm_encoder import encoder_profile, v0_encoder_profile
from kvplan.engines.vllm_fallback import Fallback, v1_fallback
from kvplan.engines.vllm_graphs import GraphModes, capture_sizes, graph_bytes
from kvplan.engines.vllm_kv import (
    KvCacheLayout,
    VllmLayerSpec,
    kv_cache_layout,
    uniform_type_layout,
    vllm_layer_spec,
)
from kvplan.engines.vllm_kv_quant import boundary_layers, quant_block_size, quant_buffer_bytes, quant_kv_refusal
from kvplan.engines.vllm_log import log_lines
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.engines.vllm_memory import (
    BNB_COMPUTE,
    NO_SPLIT,
    StageMemory,
    WeightSplit,
    activation_peak_bytes,
    comms_in_growth,
    cublas_in_baseline,
    non_torch_for,
    num_experts,
    stage_memory,
    v2_sampler_state_bytes,
)
from kvplan.engines.vllm_mla import dense_mla_layer, dense_mla_reason, mla_block_size, mla_kept_bytes
from kvplan.engines.vllm_mxfp4 import Mxfp4Backend, release_backend
from kvplan.engines.vllm_profile import ProfileUse, apply_profile
from kvplan.engines.vllm_speculative import proposer_buffer_bytes
from kvplan.engines.vllm_versions import VllmRules, engine_for, parse_release, rules_for
from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import KvDtype, normalize_weight_dtype, resolve_kv_dtype, serving_dtype, weight_dtype_bytes
from kvplan.model.specs import LayerKind, LayerSpec, ModelSpec
from kvplan.records import dataclass
from kvplan.units import GiB, MiB, cdiv

USAGES = ("serve", "llm")  # `vllm serve` (OPENAI_API_SERVER) or the LLM class (LLM_CLASS)
# How vLLM is installed: the vllm/vllm-openai image (FlashInfer included) or the vllm wheel (pip, uv; without
# FlashInfer before 0.12). From 0.8 to 0.11.0 it decides V1's sampler (0.11.1+ takes FlashInfer only by env), and
# with it the profiled activation peak, and from 0.10.2 to 0.11 whether gpt-oss's mxfp4 experts load for Triton
# (the image's triton_kernels) or Marlin.
INSTALLS = ("image", "wheel")
# The state of vLLM's torch.compile cache at start-up: "cold" (no cache for this model and these settings: a
# first boot, or a container that does not keep ~/.cache/vllm) compiles inside the profiled window (0.11.1+:
# vllm_memory.compile_clone_bytes); "warm" loads the compiled graphs and profiles the forward alone.
COMPILE_CACHES = ("cold", "warm")


# vLLM's meaning of a runtime quantization name where it differs from TGI's: --quantization bitsandbytes on an
# unquantized checkpoint loads 4-bit (vllm/model_executor/layers/quantization/bitsandbytes.py: load_in_4bit
# defaults to True), where TGI's --quantize bitsandbytes is int8.
VLLM_RUNTIME = {"bitsandbytes": "bitsandbytes-4bit"}


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
    enable_prefix_caching: bool | None = None  # None: vLLM's default (on; off for state-cache hybrids to 0.27)
    enable_chunked_prefill: bool | None = None  # None: the release's default (V0: past 32K tokens; V1: on)
    kv_cache_memory_bytes: int | None = None
    version: str = "current"
    use_v1: bool | None = None  # VLLM_USE_V1; None: the release's default engine
    mamba_cache_dtype: str = "auto"  # --mamba-cache-dtype: the conv state's (auto: the served dtype)
    mamba_ssm_cache_dtype: str = "auto"  # --mamba-ssm-cache-dtype: the SSM / recurrent state's
    # --speculative-config's method and num_speculative_tokens; kvplan models "mtp" (the checkpoint's own block)
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    usage: str = "serve"  # "serve" or "llm": the entry point's batch defaults
    install: str = "image"  # "image" or "wheel" (INSTALLS)
    enforce_eager: bool = False  # no CUDA graphs
    compile_cache: str = "cold"  # COMPILE_CACHES
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    flashinfer_sampler: bool | None = None  # VLLM_USE_FLASHINFER_SAMPLER=1 / =0; None: unset (_sampler_path)
    mla_disable: bool = False  # VLLM_MLA_DISABLE=1 (vllm_mla.dense_mla_reason)
    # VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM: False where either is 0, True where VLLM_MOE_USE_DEEP_GEMM=1
    # asks for it (0.12-0.14 leave it off at tp 8 and more unless asked); None: unset (deepgemm_scratch)
    deep_gemm: bool | None = None
    split: WeightSplit = NO_SPLIT  # expert parallel and CPU offload (vllm_memory.WeightSplit)
    lora: LoraSlots | None = None  # --enable-lora with --max-loras / --max-lora-rank (vllm_lora)
    # The dtype bitsandbytes 4-bit layers compute in: "bfloat16" (vLLM's own) or "model" (Unsloth's patched
    # vLLM, which an Unsloth log shows by its "Unsloth:" lines); vllm_memory.bnb_4bit_forward_bytes.
    bnb_compute: str = "bfloat16"

    def validate(self) -> VllmRules:
        rules = rules_for(self.version)
        if self.lora is not None:
            self.lora.validate()
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise FieldError("engine.gpu_memory_utilization", "must be in (0, 1]", u)
        for name in ("max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise InputError("--tensor-parallel-size and --pipeline-parallel-size must be >= 1")
        if self.kv_cache_memory_bytes is not None:
            if self.kv_cache_memory_bytes <= 0:
                raise InputError("--kv-cache-memory-bytes must be a positive size")
            if not rules.kv_cache_memory_option:
                raise FieldError("engine.kv_cache_memory_bytes",
                                 f"vLLM {self.version} has no --kv-cache-memory-bytes (0.10.2 and later)")
        for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
            value = getattr(self, name)
            if value not in MAMBA_DTYPES:
                raise FieldError(f"engine.{name}", f"must be one of {', '.join(MAMBA_DTYPES)}", value)
            if value != "auto" and not rules.mamba_dtype_options:
                raise FieldError(f"engine.{name}", f"vLLM {self.version} has no --{name.replace('_', '-')} "
                                 "(0.10.1 and later)", value)
        if self.speculative_method is not None:
            if self.speculative_method != "mtp":
                raise FieldError("engine.speculative_method", "kvplan models the \"mtp\" method only (the "
                                 "checkpoint's own MTP block); a draft model or EAGLE head is not counted",
                                 self.speculative_method)
            if self.num_speculative_tokens < 1:
                raise FieldError("engine.num_speculative_tokens", "must be >= 1 with a speculative method",
                                 self.num_speculative_tokens)
        if self.usage not in USAGES:
            raise FieldError("engine.usage", f"must be one of {', '.join(USAGES)}", self.usage)
        if self.install not in INSTALLS:
            raise FieldError("engine.install", f"must be one of {', '.join(INSTALLS)}", self.install)
        if self.compile_cache not in COMPILE_CACHES:
            raise FieldError("engine.compile_cache", f"must be one of {', '.join(COMPILE_CACHES)}",
                             self.compile_cache)
        if self.bnb_compute not in BNB_COMPUTE:
            raise FieldError("engine.bnb_compute", f"must be one of {', '.join(BNB_COMPUTE)}", self.bnb_compute)
        return rules


# vLLM's MambaDType (config/cache.py): the values --mamba-cache-dtype and --mamba-ssm-cache-dtype take.
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")


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
    rules: VllmRules
    engine: str  # "v0" or "v1"
    install: str  # "image" or "wheel"
    lora: LoraSlots | None = None
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    num_speculative_tokens: int = 0  # MTP draft tokens a step (0: no speculative decoding)
    chunked_prefill: bool = True  # a prompt longer than the step is split over steps
    runner: str = "v1"  # the worker's model runner: "v1" (GPUModelRunner) or "v2" (Model Runner V2, 0.25+)
    # torch.compile inside the profiled window: "cold" (no compile cache), "warm" (cache hit), or "none" (V0, or
    # --enforce-eager: "Enforce eager set, disabling torch.compile and CUDAGraphs")
    compile_cache: str = "none"
    flashinfer_sampler: bool | None = None  # VLLM_USE_FLASHINFER_SAMPLER as given (None: unset)
    rocm: bool = False  # an AMD GPU (the worker skips the CUDA-graph estimate on ROCm before 0.26)
    v0_fallback: str | None = None  # the setting that sent a V1-default release (0.8-0.10) to V0 (vllm_fallback)
    mla_dense: str | None = None  # why an MLA model's cache holds per-head K/V, not the latent (vllm_mla)
    deep_gemm: bool | None = None  # VllmFlags.deep_gemm as given
    dsa_storage: str | None = None  # how a sparse-attention (DeepSeek-V3.2) latent is stored (vllm_dsa)

    @property
    def window_tokens_in_flight(self) -> int:
        """The tokens scheduled but not yet settled, which a sliding window or an attention chunk keeps blocks for
        beyond itself: one step up to 0.25; from 0.26 VllmConfig.max_in_flight_tokens, max_concurrent_batches x
        step, where async scheduling (on by default for generate models, MTP included) runs 2 batches on V1 at
        pp 1 and pp + 1 on Model Runner V2, and V1 with pp > 1 runs pp. gpt-oss-20b at 8,192 tokens on V1:
        16,384."""
        if self.engine != "v1" or not self.rules.window_in_flight_batches:
            return self.max_num_batched_tokens
        batches = self.pp + 1 if self.runner == "v2" else (2 if self.pp == 1 else self.pp)
        return batches * self.max_num_batched_tokens


@dataclass(frozen=True)
class StageKv:
    memory: StageMemory
    available_kv_bytes: int
    layout: KvCacheLayout
    num_blocks: int  # this rank's own count, before the minimum over ranks


@dataclass(frozen=True)
class Warmup:
    """V1's sampler warm-up after the KV cache is allocated (last pipeline rank): free memory against need.

    free = total - CUDA context - communicators - weights - non-torch growth - the KV cache - CUDA graphs
    - held_twice; need = the profiling run's own peak for a step of S = min(max_num_seqs, step) one-token
    requests (the sampler over S rows dominates).
    held_twice: kvplan's reading of the fit split. vLLM 0.19's own figures leave gpt-oss-20b 1.56 GiB (tp 1)
    and 0.35 GiB (tp 2) beyond the sampler's 2.9 GiB at utilization 0.95, yet both runs fail, while
    Llama-4-Scout (tp 4) starts with 1.0 GiB to spare; so the missing consumer belongs to gpt-oss, and a
    second copy of its CUDA-graph memory (1.84, 1.55 GiB) accounts for both failures and the start at 0.9.
    In 0.18-0.19 an estimate pass captures graphs before the KV cache is sized; kvplan takes the mxfp4
    Triton-kernel MoE graphs (gpt-oss's, the only family whose graph buffers are that large) to be held by
    both captures when the sampler warms up. It rests on gpt-oss's three logs.
    """

    rows: int
    free_bytes: int
    need_bytes: int
    graph_bytes: int
    held_twice_bytes: int

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.free_bytes


@dataclass(frozen=True)
class MoeScratch:
    """The fused-MoE buffers a release allocates (vllm_memory.moe_workspace_bytes): their kind, token chunk,
    whether they outlive the forward, and the DeepGEMM row padding where the experts run there."""

    kind: str
    chunk_tokens: int | None
    kept: bool
    deepgemm: DeepGemmScratch | None = None


@dataclass(frozen=True)
class VllmReport:
    """What vLLM would report at start-up on `gpu` (per rank), or the error it would stop with."""

    gpu: GpuSpec
    flags: ResolvedFlags
    total_memory_bytes: int
    requested_bytes: int
    cudagraph_bytes: int  # what the captured graphs hold on a rank (subtracted only from 0.20)
    graphs: GraphModes
    attention: AttentionPath | None  # the K/V layers' backend (0.20+ on NVIDIA GPUs; None: not picked)
    flashinfer_graph_bytes: int  # FlashInfer's buffers within cudagraph_bytes (vllm_attention)
    stages: tuple[StageKv, ...]
    limiting_stage: int  # the rank whose block count all ranks adopt
    num_blocks: int  # as vLLM counts them (V1: the null block included)
    kv_cache_tokens: int
    blocks_per_request: int
    max_concurrency: float
    max_model_len_fit: int  # vLLM's estimate_max_model_len on the limiting rank (0: not one token)
    refusal: Refusal | None
    warmup: Warmup | None = None
    profile: ProfileUse | None = None
    log_lines: tuple[str, ...] = field(default_factory=tuple)
    moe_scratch: MoeScratch | None = None  # the fused-MoE buffers the profiling forward allocates

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
        """Blocks requests can use: V1 keeps one as the null block that padded block-table slots point at."""
        return max(0, self.num_blocks - (1 if self.flags.engine == "v1" and self.flags.rules.null_block else 0))

    @property
    def max_running_requests(self) -> int:
        """Concurrency as the scheduler runs it: whole requests, capped by max_num_seqs."""
        return min(math.floor(self.max_concurrency), self.flags.max_num_seqs)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (the `engine` object of estimate's JSON)."""
        f = self.flags
        return {
            "vllm_version": f.version,
            "rules_since": f.rules.release,
            "engine": f.engine,
            "install": f.install,
            "non_kv_measure": f.rules.budget(f.engine),
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
                "mamba_cache_dtype": f.mamba_cache_dtype,
                "mamba_ssm_cache_dtype": f.mamba_ssm_cache_dtype,
                "num_speculative_tokens": f.num_speculative_tokens,
            },
            "total_memory_bytes": self.total_memory_bytes,
            "requested_bytes": self.requested_bytes,
            "cudagraph_bytes": self.cudagraph_bytes,
            "cudagraphs_subtracted": graphs_charged(f),
            "attention_backend": None if self.attention is None else self.attention.label,
            "flashinfer_graph_bytes": self.flashinfer_graph_bytes,
            "model_runner": f.runner,
            "compile_cache": f.compile_cache,
            "cudagraph_sizes": {"piecewise": len(self.graphs.piecewise), "full": len(self.graphs.full),
                                "lora_cases": self.graphs.lora_cases},
            "stages": [
                {
                    "stage": s.memory.stage,
                    "layers": s.memory.layers,
                    "weights_bytes": s.memory.weights_bytes,
                    "lora_bytes": s.memory.lora_bytes,
                    "draft_bytes": s.memory.draft_bytes,
                    "mla_kept_bytes": s.memory.mla_kept_bytes,
                    "buffer_bytes": s.memory.buffer_bytes,
                    "rotary_cache_bytes": s.memory.rotary_cache_bytes,
                    "activation_peak_bytes": s.memory.activation_peak_bytes,
                    "encoder_peak_bytes": s.memory.encoder_bytes,
                    "compile_clone_bytes": s.memory.compile_clone_bytes,
                    "intermediate_bytes": s.memory.intermediate_bytes,
                    "sampler_state_bytes": s.memory.sampler_state_bytes,
                    "proposer_bytes": s.memory.proposer_bytes,
                    "non_torch_bytes": s.memory.non_torch_bytes,
                    "available_kv_cache_bytes": s.available_kv_bytes,
                    "kv_cache_groups": [
                        {"kind": g.kind, "layers": g.layers, "window_tokens": g.window_tokens}
                        for g in s.layout.groups
                    ],
                    "mamba_cache_mode": s.layout.mamba_cache_mode,
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
            "sampler_warmup": None if self.warmup is None else {
                "rows": self.warmup.rows, "free_bytes": self.warmup.free_bytes,
                "need_bytes": self.warmup.need_bytes, "fits": self.warmup.fits,
            },
            "profile_terms": [] if self.profile is None else list(self.profile.applied),
            "startup_error": self.startup_error,
        }


def format_gib(n_bytes: int) -> str:
    """vLLM's format_gib: round(bytes / GiB, 2), printed as Python prints a float (42.8, 58.11)."""
    return str(round(n_bytes / GiB, 2))


def _v0_auto_chunked(model: ModelSpec, flags: VllmFlags, rules: VllmRules, gpu: GpuSpec, mla_in_use: bool) -> bool:
    """Whether V0 may turn chunked prefill on by itself past 32K tokens (EngineArgs.create_engine_config, read
    per sdist): never with a sliding window, state layers (seqlen-agnostic, 0.6.0-0.6.2; kvplan plans none on
    V0) or LoRA, nor with what the release lists in v0_auto_chunked_excludes: prefix caching (0.6.0), a
    multimodal model (0.6.2+), ROCm (0.6.6-0.7.3), MLA in use (0.8+). Speculative decoding, prompt adapters
    and pooling models, which also keep it off, are not planned on V0."""
    kinds = set(model.layer_kinds())
    if kinds & {"sliding_window", "chunked_local", "mamba", "linear_attention"} or flags.lora is not None:
        return False
    excluded = {
        "prefix_caching": bool(flags.enable_prefix_caching),
        "multimodal": any(g.name == "vision" for g in model.param_groups),
        "rocm": gpu.vendor == "amd",
        "mla": mla_in_use,
    }
    return not any(excluded[name] for name in rules.v0_auto_chunked_excludes)


def resolve_flags(model: ModelSpec, flags: VllmFlags, gpu: GpuSpec) -> ResolvedFlags:
    rules = flags.validate()
    engine = engine_for(rules, flags.use_v1)
    max_len = flags.max_model_len or model.max_position_embeddings
    if max_len is None:
        raise InputError(f"{model.name} states no max_position_embeddings; pass --max-model-len")
    dtype = serving_dtype(model.config_dtype) if flags.dtype == "auto" else normalize_weight_dtype(flags.dtype)
    # The weights' quantization as vLLM names it: the checkpoint's method, else --quantization.
    quant = model.quant.method if model.quant is not None else flags.quantization
    fallback = _v1_fallback(model, flags, gpu, dtype, quant) if engine == "v1" else None
    if fallback is not None and flags.use_v1 is None:
        engine = "v0"
    elif fallback is not None and fallback.raises:
        raise FieldError("engine.use_v1", f"vLLM {flags.version}: VLLM_USE_V1=1 is not supported with "
                         f"{fallback.feature} (unset it: vLLM falls back to V0)", True)
    mla_dense = dense_mla_reason(model, rules, flags.version, quant, disabled=flags.mla_disable)
    mla_in_use = mla_dense is None and any(spec.kind == LayerKind.MLA for spec in model.layers)
    shape = batch_shape(
        rules, engine, gpu, max_model_len=max_len, max_num_batched_tokens=flags.max_num_batched_tokens,
        max_num_seqs=flags.max_num_seqs,
        chunked_prefill_capable=_v0_auto_chunked(model, flags, rules, gpu, mla_in_use),
        multimodal=any(g.name == "vision" for g in model.param_groups), usage=flags.usage,
        chunked_prefill=flags.enable_chunked_prefill,
    )
    runner = model_runner(model, rules, engine, flags.quantization)
    kv_name = flags.kv_cache_dtype
    block_size = (mla_block_size(rules, gpu.key, flags.kv_cache_dtype, flags.block_size) if mla_in_use else None) \
        or flags.block_size or 16
    # What the engine account refuses (vllm_engine._config_refusal), a caller planning directly is told.
    refused = sparse_mla_refusal(model, rules, flags.version, kv_cache_dtype=kv_name, block_size=flags.block_size)
    if refused is not None:
        if refused.code == "kv_dtype":
            raise FieldError("engine.kv_cache_dtype", refused.message, kv_name)
        raise FieldError("engine.block_size", refused.message, flags.block_size)
    if model.geometry.compressed_mla is not None:
        kv_name = dsv4_kv_dtype(rules, kv_name, flags.version)
        sparse_mla_gpu(rules, gpu_key=gpu.key, vendor=gpu.vendor, version=flags.version, model="DeepSeek-V4")
        block_size = DSV4_BLOCK_TOKENS
    quant_refused = quant_kv_refusal(model, rules, flags.version, kv_name, capability=gpu.compute_capability,
                                     vendor=gpu.vendor, dtype=dtype)
    if quant_refused is not None:
        raise FieldError("engine.kv_cache_dtype", quant_refused, kv_name)
    block_size = quant_block_size(model, rules, flags.version, kv_name, block_size)
    storage = None
    if uses_dsa(model) and mla_in_use:
        dsa_check(rules, gpu_key=gpu.key, vendor=gpu.vendor, version=flags.version)
        block_size = DSA_BLOCK_TOKENS
        storage = dsa_storage(model, rules, kv_name=kv_name, dtype=dtype, gpu_key=gpu.key,
                              tp=flags.tensor_parallel_size)
        kv_name = "fp8" if storage.startswith("fp8") else storage
    return ResolvedFlags(
        max_model_len=max_len,
        gpu_memory_utilization=flags.gpu_memory_utilization or rules.default_utilization,
        kv_cache_dtype=resolve_kv_dtype(kv_name, dtype),
        block_size=block_size,
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        tp=flags.tensor_parallel_size,
        pp=flags.pipeline_parallel_size,
        dtype=dtype,
        quantization=flags.quantization,
        enable_prefix_caching=(_prefix_caching_default(model, rules) if flags.enable_prefix_caching is None
                               else flags.enable_prefix_caching),
        kv_cache_memory_bytes=flags.kv_cache_memory_bytes,
        version=flags.version,
        rules=rules,
        engine=engine,
        install=flags.install,
        lora=flags.lora,
        mamba_cache_dtype=flags.mamba_cache_dtype,
        mamba_ssm_cache_dtype=flags.mamba_ssm_cache_dtype,
        num_speculative_tokens=_draft_tokens(model, flags, engine),
        chunked_prefill=shape.chunked_prefill,
        runner=runner,
        compile_cache="none" if engine == "v0" or flags.enforce_eager else flags.compile_cache,
        flashinfer_sampler=flags.flashinfer_sampler,
        rocm=gpu.vendor == "amd",
        v0_fallback=fallback.feature if fallback is not None and engine == "v0" else None,
        mla_dense=mla_dense,
        deep_gemm=flags.deep_gemm,
        dsa_storage=storage,
    )


def _v1_fallback(model: ModelSpec, flags: VllmFlags, gpu: GpuSpec, dtype: str, quant: str | None) -> Fallback | None:
    return v1_fallback(
        model, gpu, parse_release(flags.version), kv_cache_dtype=flags.kv_cache_dtype, dtype=dtype,
        pp=flags.pipeline_parallel_size, cpu_offload=flags.split.cpu_offload_bytes > 0,
        bitsandbytes=(quant or "").startswith("bitsandbytes"), lora=flags.lora is not None,
        speculative=flags.speculative_method is not None,
    )


def model_runner(model: ModelSpec, rules: VllmRules, engine: str, quantization: str | None = None) -> str:
    """The runner vLLM's worker builds (VllmConfig.use_v2_model_runner without VLLM_USE_V2_MODEL_RUNNER):
    0.22-0.24 take V2 for the architectures their list names (0.22-0.23 only when neither MoE nor quantized);
    0.25-0.28 for generate models without MoE (is_moe) or Mamba / gated-DeltaNet state (is_hybrid), and for
    the MoE architectures listed; 0.29 for every model. Qwen3-32B on 0.27.1 logs V2's model_runner.py,
    Qwen3-235B-A22B (MoE, not listed) V1's gpu_model_runner.py."""
    if engine != "v1" or rules.v2_runner is None:
        return "v1"
    if rules.v2_runner == "all":
        return "v2"
    listed = model.architecture in rules.v2_architectures
    if rules.v2_runner == "listed":
        quantized = model.quant is not None or quantization is not None
        if not listed or (rules.v2_listed_unquantized and (num_experts(model) or quantized)):
            return "v1"
        return "v2"
    if _has_state_cache(model):
        return "v1"
    return "v2" if listed or not num_experts(model) else "v1"


def _draft_tokens(model: ModelSpec, flags: VllmFlags, engine: str) -> int:
    """MTP's draft tokens a step; refused where the model has no MTP block kvplan sizes, and on V0."""
    if flags.speculative_method is None:
        return 0
    if engine != "v1":
        raise FieldError("engine.speculative_method", "kvplan models MTP in vLLM's V1 engine only",
                         flags.speculative_method)
    if model.mtp is None:
        raise FieldError("engine.speculative_method", f"{model.name} has no MTP block kvplan sizes (its config "
                         "states no num_nextn_predict_layers / mtp_num_hidden_layers, or the family is not "
                         "modelled)", flags.speculative_method)
    return flags.num_speculative_tokens


def _has_state_cache(model: ModelSpec) -> bool:
    """Mamba or gated-DeltaNet layers: vLLM's is_prefix_caching_supported says no for such hybrids, so prefix
    caching is off unless asked for (config/model.py @0.17-0.24)."""
    return any(spec.kind in (LayerKind.MAMBA, LayerKind.LINEAR_ATTENTION) for spec in model.layers)


def _prefix_caching_default(model: ModelSpec, rules: VllmRules) -> bool:
    """--enable-prefix-caching's default (EngineArgs: is_prefix_caching_supported, and up to 0.27 `not
    is_hybrid`): on, except for a model with Mamba or gated-DeltaNet state, which has it from 0.28 when it also
    has attention layers (arg_utils.py drops `not is_hybrid` at 0.28.0; config/model.py says "Generative hybrid
    models support prefix caching" from 0.26.0). An attention-free model (pure Mamba) stays off."""
    if not _has_state_cache(model):
        return True
    return rules.hybrid_prefix_caching and any(
        spec.kind not in (LayerKind.MAMBA, LayerKind.LINEAR_ATTENTION, LayerKind.NO_CACHE) for spec in model.layers)


def mamba_cache_mode(model: ModelSpec, f: ResolvedFlags) -> str:
    """vLLM's mamba_cache_mode (MambaModelConfig, 0.15+): "none" without prefix caching; with it, "all" for
    models whose Mamba layers support prefix caching (Mamba, Mamba2, Jamba, Nemotron-H, Granite 4, ...) and
    "align" for the rest (gated DeltaNet: Qwen3-Next, Qwen3.5); "align" for all of them under speculative
    decoding in 0.20-0.21, and by default from 0.28."""
    if not (f.rules.mamba_cache_modes and f.enable_prefix_caching and _has_state_cache(model)):
        return "none"
    default = f.rules.mamba_mode_default
    if default == "align" or (default == "support_unless_spec" and f.num_speculative_tokens):
        return "align"
    return "all" if any(spec.kind == LayerKind.MAMBA for spec in model.layers) else "align"


def _vllm_state(spec: LayerSpec, model: ModelSpec, f: ResolvedFlags) -> LayerSpec:
    """A state layer in the dtypes vLLM gives it (MambaStateDtypeCalculator): the conv state in
    --mamba-cache-dtype (auto: the served dtype); the SSM / recurrent state in --mamba-ssm-cache-dtype, whose
    auto is the conv state's dtype, except where a model hook fills it: Nemotron-H takes the config's
    mamba_ssm_cache_dtype or the release's default (float16 from 0.13, float32 from 0.20); Qwen3.5 its
    config's mamba_ssm_dtype (0.17+, already in the DeltaNet spec: parse.py). Nemotron-H-56B (no dtype
    stated): SSM 256 x 64 x 256 x 2 B = 8,388,608 B a layer up to 0.19, 16,777,216 from 0.20."""
    if spec.kind not in (LayerKind.MAMBA, LayerKind.LINEAR_ATTENTION):
        return spec
    conv = f.dtype if f.mamba_cache_dtype == "auto" else f.mamba_cache_dtype
    ssm = f.mamba_ssm_cache_dtype
    if ssm == "auto":
        ssm = conv
        mamba = model.geometry.mamba
        if model.model_type == "nemotron_h" and f.rules.nemotron_ssm_default:
            ssm = (mamba.ssm_cache_dtype if mamba else None) or f.rules.nemotron_ssm_default
        elif spec.kind == LayerKind.LINEAR_ATTENTION:
            ssm = next(t.dtype for t in spec.state_tensors if t.name != "conv")
    spec = spec.with_state_dtypes(conv, ssm)
    # MTP: a DeltaNet conv state keeps kernel - 1 + N rows (gated_delta_net_state_shape's num_spec).
    return spec.with_conv_rows(f.num_speculative_tokens) if spec.kind == LayerKind.LINEAR_ATTENTION else spec


def _stage_layout(model: ModelSpec, layers: range, f: ResolvedFlags, block_size_set: bool) -> KvCacheLayout:
    """One rank's KV layout. Without V1's hybrid manager (V0, V1 before 0.9.1) every attention layer caches
    every token (a sliding window only masks), and state layers have no place in the block pool. Where MLA is
    off (vllm_mla) its layers cache per-head K/V. With MTP the draft's attention layers join the last stage's
    cache (gpu_model_runner.get_kv_cache_spec)."""
    hybrid = f.engine == "v1" and f.rules.hybrid_groups
    specs = model.layers[layers.start : layers.stop : layers.step]
    if f.mla_dense is not None:
        specs = tuple(dense_mla_layer(spec, model, f.rules) for spec in specs)
    if f.num_speculative_tokens and model.mtp is not None and layers.stop == model.num_layers:
        specs = specs + model.mtp.layers
    if model.geometry.compressed_mla is not None:
        return dsv4_layout(specs, f.rules)
    stage = tuple(_vllm_state(spec, model, f) for spec in specs)
    chunk = model.geometry.mamba.chunk_size if model.geometry.mamba else 2048
    mode = mamba_cache_mode(model, f)
    latent = dsa_token_bytes(model, f.dsa_storage) if f.dsa_storage else _padded_latent_bytes(model, f)
    # TurboQuant's boundary layers stay in the model dtype (vllm_kv_quant): positions within this stage.
    kept = boundary_layers(model, f.kv_cache_dtype.name)
    plain = frozenset(i for i, layer in enumerate(range(layers.start, layers.stop, layers.step)) if layer in kept)
    return _layout(stage, f.kv_cache_dtype, f.tp, hybrid, f.block_size, block_size_set, f.version, f.engine,
                   mode, chunk, _extra_state_pages(model, f, mode), latent,
                   plain, resolve_kv_dtype("auto", f.dtype) if plain else None)


def _extra_state_pages(model: ModelSpec, f: ResolvedFlags, mode: str) -> int:
    """State pages a request holds per Mamba group beyond its mode's (MambaSpec.max_memory_usage_bytes): MTP's
    draft tokens (num_speculative_blocks; in "all" mode only from 0.22), and in "align" mode from 0.32 one
    prefill checkpoint for a Mamba2 mixer (mamba_mixer2.py get_kv_cache_spec: num_prefill_checkpoint_blocks=1).
    Nemotron-H with prefix caching on 0.32: 2 + 1 pages a Mamba group."""
    draft = f.num_speculative_tokens if mode != "all" or f.rules.mamba_all_spec_pages else 0
    mamba = model.geometry.mamba
    checkpoint = mode == "align" and f.rules.mamba2_checkpoint_page and mamba is not None and mamba.version == 2
    return draft + int(checkpoint)


def _built_buffers(model: ModelSpec, f: ResolvedFlags, gpu: GpuSpec) -> tuple[int, int]:
    """What the model allocates when vLLM builds it, on every rank and on the last rank besides: DeepSeek-V4's
    (vllm_dsv4), the sparse-attention indexer's (vllm_dsa, sized by the fullest stage's layers), or a quantized
    cache's (vllm_kv_quant)."""
    every, last = dsv4_buffer_bytes(model, f.rules, max_num_batched_tokens=f.max_num_batched_tokens,
                                    draft=f.num_speculative_tokens > 0)
    every += quant_buffer_bytes(model, f.rules, f.version, f.kv_cache_dtype.name,
                                stages=pp_stage_layers(model.num_layers, f.pp), tp=f.tp,
                                capability=gpu.compute_capability,
                                max_num_seqs=f.max_num_seqs, max_num_batched_tokens=f.max_num_batched_tokens)
    if f.dsa_storage is not None:
        every += dsa_buffer_bytes(model, f.rules, max_num_batched_tokens=f.max_num_batched_tokens,
                                  max_model_len=f.max_model_len, max_num_seqs=f.max_num_seqs,
                                  decode_tokens=1 + f.num_speculative_tokens, layers=cdiv(model.num_layers, f.pp))
    return every, last


def _padded_latent_bytes(model: ModelSpec, f: ResolvedFlags) -> int:
    """V0's CacheEngine pads an MLA latent to 256 bytes of the model dtype in 0.7.2-0.7.3 on CUDA
    (_align_cache): DeepSeek's 576 values in bf16 become 640, 1,280 B a token a layer (640 B with an fp8 cache).
    0 where nothing is padded."""
    mla = model.geometry.mla
    if mla is None or f.engine != "v0" or not f.rules.mla_page_align or f.rocm or f.mla_dense is not None:
        return 0
    step = 256 // weight_dtype_bytes(f.dtype)
    return f.kv_cache_dtype.vector_bytes(cdiv(mla.kv_lora_rank + mla.qk_rope_head_dim, step) * step)


@functools.lru_cache(maxsize=1024)
def _layout(stage: tuple[LayerSpec, ...], kv: KvDtype, tp: int, hybrid: bool, block_size: int,
            block_size_set: bool, version: str, engine: str, mode: str, chunk: int, extra_pages: int,
            latent_bytes: int = 0, plain: frozenset[int] = frozenset(), plain_kv: KvDtype | None = None,
            ) -> KvCacheLayout:
    """_stage_layout's layout, kept: `kvplan plan` lays out one model's stages for hundreds of candidate
    deployments that share a KV dtype, tp and block size (gemma-3-27b: 806 plans, 62 layers each).
    `latent_bytes`: an MLA layer's padded bytes a token (_padded_latent_bytes; 0: as the spec says). `plain`:
    positions whose cache is `plain_kv` (TurboQuant's boundary layers); they share one group with the others
    (uniform_type_layout)."""
    present = [s for s in (vllm_layer_spec(layer, plain_kv if i in plain and plain_kv else kv, tp)
                           for i, layer in enumerate(stage)) if s is not None]
    if plain and all(s.kind == "full_attention" for s in present):
        return uniform_type_layout(present, block_size)
    if latent_bytes:
        present = [VllmLayerSpec("mla", latent_bytes) if s.kind == "mla" else s for s in present]
    if not hybrid:
        if any(s.kind == "mamba" for s in present):
            raise FieldError("engine.version", f"kvplan models Mamba and linear-attention caches only in V1's "
                             f"hybrid KV cache manager (0.9.1 and later), not vLLM {version} {engine.upper()}",
                             version)
        present = [s if s.kind in ("full_attention", "mla") else VllmLayerSpec("full_attention", s.bytes_per_token)
                   for s in present]
    return kv_cache_layout(present, block_size, block_size_set=block_size_set, mamba_cache_mode=mode,
                           mamba_chunk_tokens=chunk, extra_state_pages=extra_pages)


def estimate_max_model_len(layout: KvCacheLayout, available_bytes: int, limit: int, batched: int) -> int:
    """vLLM's estimate_max_model_len: the longest max_model_len whose one request fits, by bisection."""
    def fits(length: int) -> bool:
        return layout.blocks_per_request(length, batched) * layout.check_bytes_per_block <= available_bytes

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


def _moe_kernel(model: ModelSpec) -> str | None:
    if not num_experts(model):
        return None
    return "mxfp4" if model.quant is not None and model.quant.method == "mxfp4" else "fused_moe"


def _graph_bytes(model: ModelSpec, f: ResolvedFlags, modes: GraphModes, layers: int) -> int:
    """CUDA-graph memory on a rank of the widest stage; MoE layers' width is top_k experts' intermediate."""
    inter = model.intermediate_size or 4 * model.hidden_size
    geometry = model.geometry.moe
    moe = geometry is not None
    if geometry is not None:
        inter = (geometry.expert_intermediate_size or inter) * (geometry.experts_per_token or 1)
    return graph_bytes(
        modes, layers=layers, moe_layers=layers if moe else 0,
        moe_kernel=_moe_kernel(model), hidden=model.hidden_size, intermediate=inter, tp=f.tp,
        dtype_bytes=weight_dtype_bytes(f.dtype),
    )


def _sampler_path(f: ResolvedFlags) -> str:
    """The profiled sampler's path. V0 sorts like V1's PyTorch path (vllm/model_executor/layers/sampler.py
    _apply_top_k_top_p; its FlashInfer opt-in is not modelled). Model Runner V2 samples the dummy rows without
    top-k/top-p (vllm/v1/worker/gpu/sample/sampler.py), from a float32 copy on 0.25 only. V1 0.8+
    (v1/sample/ops/topk_topp_sampler.py) takes FlashInfer where it is importable unless
    VLLM_USE_FLASHINFER_SAMPLER=0, and from 0.11.1 only with VLLM_USE_FLASHINFER_SAMPLER=1; Unsloth sets it to 1."""
    if f.engine == "v0":
        return "sort"
    if f.runner == "v2":
        return "v2" if f.rules.v2_sampler_fp32 else "v2_in_place"
    if f.flashinfer_sampler is False or not f.rules.sampler_warmup:
        return f.rules.v1_sampler
    if f.flashinfer_sampler:  # the user installed FlashInfer and opted in: 0.8's image FlashInfer takes probs
        return "flashinfer_probs" if f.rules.image_sampler == "flashinfer_probs" else "flashinfer_logits"
    if f.install == "image" and f.rules.image_sampler is not None:
        return f.rules.image_sampler
    return f.rules.v1_sampler


def _sampler_shards(f: ResolvedFlags) -> int:
    """V2's batch-sharded sampling (0.29+): each tp rank computes logits and samples for its share of rows."""
    return f.tp if f.runner == "v2" and f.rules.v2_sharded_sampling else 1


def fused_moe_scratch(model: ModelSpec, f: ResolvedFlags, gpu: GpuSpec, split: WeightSplit) -> MoeScratch:
    """AWQ/GPTQ experts run Marlin (fused_marlin_moe: no chunking, nothing kept); experts on DeepGEMM keep
    padded rows (deepgemm_scratch); the rest run fused_experts_impl, then (0.14+) TritonExperts in the workspace
    manager."""
    if model.quant is not None and model.quant.method in ("awq", "gptq"):
        return MoeScratch("marlin_old" if f.rules.moe_marlin_old else "marlin", None, False)
    kept = f.engine == "v1" and f.rules.moe_workspace_kept
    deepgemm = deepgemm_scratch(model, f, gpu, split)
    # 0.11-0.13 keep DeepGEMM's buffers in the modular kernel's shared buffers between forwards.
    return MoeScratch(f.rules.moe_scratch, f.rules.moe_chunk_tokens, kept or deepgemm is not None, deepgemm)


def deepgemm_scratch(model: ModelSpec, f: ResolvedFlags, gpu: GpuSpec, split: WeightSplit) -> DeepGemmScratch | None:
    """Whether the release runs this model's experts on DeepGEMM on this card, and how (vllm_deepgemm).

    DeepSeek-V4's MXFP4 experts: the MXFP4 oracle tries FlashInfer's TRT-LLM kernels (SM100) first, then
    DEEPGEMM_MXFP4, which takes SM12x from 0.24 (`DeepGemmFP4Experts._supports_current_device`). Block-FP8
    experts (`oracle/fp8.py`, `quantization/fp8.py get_fp8_moe_backend`): DeepGEMM on SM90 and SM100 where the
    deep_gemm package imports (the image; the wheel from 0.20) in 0.11-0.14, off at tp 8 and more from 0.12,
    and on 0.11.0's SM90 only past `_valid_deep_gemm` (I / tp > 512, I / tp and H multiples of 128, T >= 128);
    on SM12x from 0.24 (`support_deep_gemm` adds the family). VLLM_USE_DEEP_GEMM=0 turns all of it off, and
    kvplan reads VLLM_MOE_USE_DEEP_GEMM=0 the same way (the FP8 oracle reads it; the MXFP4 one was not read)."""
    moe, cc, rules = model.geometry.moe, gpu.compute_capability, f.rules
    if moe is None or cc is None or not moe.experts_per_token or f.deep_gemm is False:
        return None
    local = cdiv(moe.num_experts, split.expert_ranks) if split.expert_ranks else moe.num_experts
    ep = bool(split.expert_ranks)
    if model.geometry.compressed_mla is not None:
        return DeepGemmScratch(rules.deepgemm_rows, local, expert_parallel=ep, padded_dims=True) \
            if rules.deepgemm_mxfp4_sm12x and cc[0] == 12 else None
    quant = model.quant
    if quant is None or quant.method != "fp8" or quant.block_shape is None or rules.deepgemm_fp8 is None:
        return None
    if rules.deepgemm_fp8 == "sm12x":
        runs = cc[0] == 12
    else:
        installed = f.install == "image" or rules.deepgemm_vendored
        width = moe.expert_intermediate_size // (1 if ep else f.tp)
        shape_ok = (width > 512 and width % 128 == 0 and model.hidden_size % 128 == 0
                    and f.max_num_batched_tokens >= 128)
        runs = installed and (cc == (9, 0) or cc[0] == 10) and not (
            (rules.deepgemm_fp8 == "below_tp8" and f.tp >= 8 and f.deep_gemm is None)
            or (rules.deepgemm_fp8 == "sm90_shape" and cc == (9, 0) and not shape_ok))
    return DeepGemmScratch(rules.deepgemm_rows, local, widths=rules.deepgemm_widths, expert_parallel=ep) \
        if runs else None


def mxfp4_backend(rules: VllmRules, install: str, gpu: GpuSpec) -> Mxfp4Backend | None:
    """The kernels gpt-oss's mxfp4 experts load for in this release and install; None before 0.10.1."""
    if not rules.mxfp4:
        return None
    return release_backend(gpu, triton=rules.mxfp4_triton, flashinfer_dependency=rules.flashinfer_dependency,
                           install=install)


def plan_vllm(
    model: ModelSpec,
    flags: VllmFlags,
    gpu: GpuSpec,
    *,
    available_shift_bytes: int = 0,
    checkpoint_bytes: int | None = None,
    profile: BoxProfile | None = None,
    in_use_bytes: int = 0,
) -> VllmReport:
    """Reproduce vLLM's start-up memory accounting and KV cache sizing for `model` on `gpu`.

    `in_use_bytes`: memory other processes hold on each GPU. Releases that charge everything in use take it
    off the budget; V1 from 0.9.1 refuses to start when it leaves less free than total x util; V0 from 0.6.5
    sizes the cache from its own usage and then cannot allocate it (docs/engine-rules.md 1.18).

    `checkpoint_bytes` is the checkpoint's measured size (--weights-from-hub, --weights-bytes): the weights
    per rank follow it (vllm_memory.checkpoint_scale). `profile`: terms measured on the user's box, used
    where they apply (vllm_profile). `available_shift_bytes` moves every rank's budget by the same amount
    (the accuracy benchmark uses it to pin rank 0 to a logged figure while keeping the modelled
    differences between pipeline stages).
    """
    f = resolve_flags(model, flags, gpu)
    rules = f.rules
    total = gpu.total_memory_bytes
    non_torch = replace(non_torch_for(gpu.key, f.tp, f.pp), other_bytes=in_use_bytes)
    if not rules.snapshot_after_comms:
        non_torch = comms_in_growth(non_torch)
    if f.engine == "v1" and rules.cublas_before_snapshot:
        non_torch = cublas_in_baseline(non_torch, gpu.key)
    charge_context = rules.charges_context(f.engine)
    dtype_bytes = weight_dtype_bytes(f.dtype)
    if f.engine == "v0":
        encoder = v0_encoder_profile(model, dtype_bytes=dtype_bytes, max_num_batched_tokens=f.max_num_batched_tokens,
                                     max_num_seqs=f.max_num_seqs, pixels_in_model_dtype=rules.pixels_in_model_dtype)
    else:
        encoder = encoder_profile(model, dtype_bytes=dtype_bytes, max_num_batched_tokens=f.max_num_batched_tokens,
                                  max_num_seqs=f.max_num_seqs, max_model_len=f.max_model_len,
                                  pixels_in_model_dtype=rules.pixels_in_model_dtype)
    mxfp4 = mxfp4_backend(rules, f.install, gpu)
    if model.quant is not None and model.quant.method == "mxfp4" and not rules.mxfp4:
        raise FieldError("engine.version", f"vLLM {f.version} cannot load mxfp4 weights (0.10.1 and later)",
                         f.version)
    bnb = (model.quant.method if model.quant is not None else f.quantization or "").startswith("bitsandbytes")
    if bnb and not rules.bitsandbytes:
        # vllm/config/model.py 0.28: "Unknown quantization method: bitsandbytes. Must be one of [...]"
        raise FieldError("engine.version", f"vLLM {f.version} has no bitsandbytes quantization (0.27 is the "
                         "last release with it)", f.version)
    moe_scratch = fused_moe_scratch(model, f, gpu, flags.split)
    memories = stage_memory(
        model, dtype=f.dtype, tp=f.tp, pp=f.pp, quantization=VLLM_RUNTIME.get(f.quantization or "", f.quantization),
        max_num_batched_tokens=f.max_num_batched_tokens, max_num_seqs=f.max_num_seqs, non_torch=non_torch,
        charge_context=charge_context, sampler=_sampler_path(f), moe_workspace_kept=moe_scratch.kept,
        moe_scratch=moe_scratch.kind, moe_chunk_tokens=moe_scratch.chunk_tokens, moe_deepgemm=moe_scratch.deepgemm,
        encoder=encoder,
        checkpoint_bytes=checkpoint_bytes, split=flags.split, mxfp4_backend=mxfp4,
        lora=flags.lora, lora_extra_vocab=rules.lora_extra_vocab,
        draft=model.mtp.param_groups if f.num_speculative_tokens and model.mtp is not None else (),
        bnb_compute=flags.bnb_compute, sampler_shards=_sampler_shards(f), cold_compile=cold_compile(f),
        # Model Runner V2 allocates its receive buffers and its sampler state in load_model, after the weights are
        # measured and before profiling: the snapshot budget (to 0.26) counts neither, the consumed-memory one
        # (0.27+: the drop in free memory since the worker's start) counts both.
        intermediate_charged=f.runner == "v1" or f.rules.v1_budget == "consumed",
        sampler_state_bytes=v2_sampler_state_bytes(model, max_num_seqs=f.max_num_seqs,
                                                   draft_tokens=f.num_speculative_tokens)
        if f.runner == "v2" and f.rules.v1_budget == "consumed" else 0,
        # The allocator's blocks, where vLLM measures its weights with torch on a CUDA card (allocator).
        weight_blocks=f.engine == "v1" and gpu.vendor == "nvidia",
        load_max_split_bytes=None if rules.load_max_split_mb is None else rules.load_max_split_mb * MiB,
        # The runner builds the proposer after the worker's snapshot and before profiling: a budget measured from
        # that snapshot (0.9.1-0.26) misses its buffers, one that counts all memory in use (0.27+, and V1 to
        # 0.9.0 through torch's absolute peak) has them.
        proposer_bytes=proposer_buffer_bytes(model, runner=f.runner, elem_bytes=dtype_bytes,
                                             max_num_batched_tokens=f.max_num_batched_tokens,
                                             max_num_seqs=f.max_num_seqs)
        if f.num_speculative_tokens and f.rules.budget(f.engine) in ("consumed", "absolute") else 0,
        mla_layer_bytes=0 if f.mla_dense is not None else mla_kept_bytes(model, rules, dtype=f.dtype, tp=f.tp,
                                                                         quantization=f.quantization),
        buffers=_built_buffers(model, f, gpu),
    )
    stage_layers = pp_stage_layers(model.num_layers, f.pp)
    layouts = [_stage_layout(model, layers, f, flags.block_size is not None) for layers in stage_layers]
    modes = capture_sizes(rules, f.engine, gpu, max_num_seqs=f.max_num_seqs,
                          max_num_batched_tokens=f.max_num_batched_tokens, enforce_eager=flags.enforce_eager,
                          lora=f.lora is not None, decode_query_len=1 + f.num_speculative_tokens)
    capability = gpu.compute_capability if f.engine == "v1" else None
    attention = attention_path(model, rules, capability, f.kv_cache_dtype.name, f.dtype)
    if (attention is not None and capability is not None and f.num_speculative_tokens
            and not attention.full_graphs_with_drafts(capability[0])):
        modes = replace(modes, full=())  # resolve_cudagraph_mode_and_sizes: "setting cudagraph_mode=PIECEWISE"
    flashinfer_bytes = flashinfer_graph_bytes(
        attention, rules, runner=f.runner, full_graphs=len(modes.full), max_num_batched_tokens=f.max_num_batched_tokens,
        heads_per_rank=model.num_attention_heads // f.tp, builders=max(map(kv_attention_groups, layouts)))
    graphs = _graph_bytes(model, f, modes, max(len(s) for s in stage_layers)) + flashinfer_bytes
    used: ProfileUse | None = None
    if profile is not None:
        total, memories, graphs, used = apply_profile(
            profile, model=model, flags=f, total_bytes=total, memories=memories, graph_bytes=graphs,
            charge_context=charge_context,
        )
    product = total * f.gpu_memory_utilization
    requested = math.ceil(product) if rules.requested_ceil else int(product)
    cudagraph_charge = graphs if graphs_charged(f) else 0
    stages: list[StageKv] = []
    for mem, layout in zip(memories, layouts, strict=True):
        if f.kv_cache_memory_bytes is not None:
            available = f.kv_cache_memory_bytes
        else:
            available = requested - mem.non_kv_bytes - cudagraph_charge + available_shift_bytes
        stages.append(StageKv(mem, available, layout, max(0, available) // layout.bytes_per_block))
    limiting = min(range(len(stages)), key=lambda i: (stages[i].num_blocks, i))
    lim = stages[limiting]
    layout = lim.layout
    num_blocks = lim.num_blocks
    per_request = layout.blocks_per_request(f.max_model_len, f.window_tokens_in_flight)
    tokens, concurrency = _tokens_and_concurrency(f, layout, num_blocks, per_request)
    fit_len = estimate_max_model_len(layout, check_memory_bytes(lim, f), f.max_model_len, f.window_tokens_in_flight)
    warmup = _warmup(model, f, stages[-1], num_blocks, total, graphs, moe_scratch) if f.engine == "v1" else None
    refusal = (_too_long(model, f, flags.allow_long_max_model_len) or _step_too_short(f)
               or _free_at_start(f, total, requested, stages)
               or _startup_error(stages, f) or _mamba_blocks(f, layout, modes, num_blocks)
               or _cache_allocation(f, total, stages, num_blocks)
               or _warmup_refusal(warmup))
    report = VllmReport(
        gpu=gpu,
        flags=f,
        total_memory_bytes=total,
        requested_bytes=requested,
        cudagraph_bytes=graphs,
        graphs=modes,
        attention=attention,
        flashinfer_graph_bytes=flashinfer_bytes,
        stages=tuple(stages),
        limiting_stage=limiting,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens,
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        max_model_len_fit=fit_len,
        refusal=refusal,
        warmup=warmup,
        profile=used,
        moe_scratch=moe_scratch,
    )
    return _with_log(report)


def _with_log(r: VllmReport) -> VllmReport:
    return replace(r, log_lines=tuple(log_lines(r)))


def _tokens_and_concurrency(
    f: ResolvedFlags, layout: KvCacheLayout, num_blocks: int, per_request: int
) -> tuple[int, float]:
    """The "GPU KV cache size" tokens and "Maximum concurrency" each release reports (engine-rules.md 1.8)."""
    if f.engine == "v0" or f.rules.v1_tokens_rule == "blocks":
        tokens = num_blocks * layout.block_size
        return tokens, tokens / f.max_model_len
    if layout.weighted_concurrency:
        per_request = layout.concurrency_blocks(f.max_model_len, f.window_tokens_in_flight)
    concurrency = num_blocks / per_request
    if f.rules.v1_tokens_rule == "blocks_per_group":
        return num_blocks // len(layout.groups) * layout.block_size, concurrency
    return int(concurrency * f.max_model_len), concurrency


def cold_compile(f: ResolvedFlags) -> bool:
    """Whether torch.compile runs, without a cache, inside the profiled window and holds its benchmark copies
    there (V1 0.11.1+; --enforce-eager compiles nothing)."""
    return f.rules.compile_clone and f.compile_cache == "cold"


def graphs_charged(f: ResolvedFlags) -> bool:
    """Whether the CUDA-graph estimate comes off the budget: V1 0.20+ (on ROCm 0.26+), except on Model Runner
    V2 before 0.29 (its profile_cudagraph_memory returns 0)."""
    if f.engine != "v1" or not f.rules.cudagraphs_subtracted or (f.rocm and not f.rules.cudagraphs_rocm):
        return False
    return f.runner == "v1" or f.rules.v2_cudagraphs_profiled


def _warmup(
    model: ModelSpec, f: ResolvedFlags, last: StageKv, num_blocks: int, total: int, graphs: int, scratch: MoeScratch
) -> Warmup | None:
    """The sampler warm-up on the last pipeline rank (V1 0.8+; see Warmup). Every rank allocates the
    limiting rank's block count, in its own block size. Model Runner V2 warms kernels up instead."""
    if not f.rules.sampler_warmup or f.runner == "v2":
        return None
    rows = min(f.max_num_seqs, f.max_num_batched_tokens)
    need = activation_peak_bytes(model, dtype=f.dtype, tp=f.tp, max_num_batched_tokens=rows, max_num_seqs=rows,
                                 runs_sampler=True, sampler=_sampler_path(f), moe_workspace_kept=scratch.kept,
                                 moe_scratch=scratch.kind, moe_chunk_tokens=scratch.chunk_tokens,
                                 moe_deepgemm=scratch.deepgemm)
    nt = last.memory.non_torch
    kv = num_blocks * last.layout.bytes_per_block
    twice = graphs if f.rules.cudagraphs_profiled and _moe_kernel(model) == "mxfp4" else 0
    free = total - nt.before_start_bytes - last.memory.weights_bytes - nt.growth_bytes - kv - graphs - twice
    return Warmup(rows, free, need, graphs, twice)


def _warmup_refusal(w: Warmup | None) -> Refusal | None:
    if w is None or w.fits:
        return None
    return Refusal(
        "sampler_warmup_oom",
        f"CUDA out of memory occurred when warming up sampler with {w.rows} dummy requests. Please try lowering "
        "`max_num_seqs` or `gpu_memory_utilization` when initializing the engine.",
        "engine.gpu_memory_utilization",
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


_DOCS_LINK = " See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."


def check_memory_bytes(s: StageKv, f: ResolvedFlags) -> int:
    """The memory V1's one-request check (and its estimate of the longest length) plans with: from 0.29 the
    available memory less one block, the null block the pool holds back (kv_cache_utils.py
    check_enough_kv_cache_memory: "plans against usable blocks"); before, all of it. Llama-3.1-8B's 16-token
    block, 32 layers x 16 x 4,096 B = 2,097,152 B: 0.29 checks 2 MiB less than "Available KV cache memory"."""
    held = s.layout.bytes_per_block if f.engine == "v1" and f.rules.check_null_block else 0
    return s.available_kv_bytes - held


def _no_memory(f: ResolvedFlags) -> Refusal:
    wording = f.rules.kv_refusal_wording if f.engine == "v1" else "plain"
    return Refusal(
        "no_kv_memory",
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
        "engine" + (" (this flag also controls CPU memory reservation on the CPU backend, despite its name)."
                    if wording == "cpu_note" else ".") + ("" if wording == "plain" else _DOCS_LINK),
        "engine.gpu_memory_utilization",
    )


def _step_too_short(f: ResolvedFlags) -> Refusal | None:
    """SchedulerConfig.verify_max_model_len: without chunked prefill a prompt must fit one step."""
    if f.chunked_prefill or f.max_num_batched_tokens >= f.max_model_len:
        return None
    return Refusal(
        "option",
        f"max_num_batched_tokens ({f.max_num_batched_tokens}) is smaller than max_model_len ({f.max_model_len}). "
        "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
        "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.",
        "engine.max_num_batched_tokens",
    )


def _free_at_start(f: ResolvedFlags, total: int, requested: int, stages: list[StageKv]) -> Refusal | None:
    """V1 from 0.9.1 (request_memory): the worker's snapshot must find total x util free. What is in use then:
    the CUDA context, communicators set up before it, other processes. H100 at 0.995: 79.19 x 0.995 = 78.79
    GiB asked, 79.19 - 0.51 = 78.68 GiB free: refused."""
    if f.engine != "v1" or f.rules.startup_check is None:
        return None
    nt = stages[0].memory.non_torch  # every rank takes the same row
    free = total - nt.before_start_bytes  # before 0.11 the communicators come after it (comms_in_growth)
    if free >= requested:
        return None
    device = " cuda:0" if f.rules.startup_check == "device" else ""
    return Refusal(
        "startup_free_memory",
        f"Free memory on device{device} ({format_gib(free)}/{format_gib(total)} GiB) on startup is less than desired "
        f"GPU memory utilization ({f.gpu_memory_utilization}, {format_gib(requested)} GiB). Decrease GPU memory "
        "utilization or reduce GPU memory used by other processes.",
        "engine.gpu_memory_utilization",
    )


def _mamba_blocks(f: ResolvedFlags, layout: KvCacheLayout, modes: GraphModes, num_blocks: int) -> Refusal | None:
    """0.20+: a hybrid whose decode runs in FULL CUDA graphs needs one state block per decode sequence, so
    initialize_kv_cache refuses max_num_seqs above the cache's block count (vllm#38270). Qwen3.8-27B in bf16 on
    one RTX PRO 6000 at 8,192 tokens, 0.26.0: 616 blocks against the default 1,024 sequences."""
    if not f.rules.mamba_seqs_check or not modes.full or f.max_num_seqs <= num_blocks:
        return None
    if not any(g.kind == "mamba" for g in layout.groups):
        return None
    return Refusal(
        "mamba_blocks",
        f"max_num_seqs ({f.max_num_seqs}) exceeds available Mamba cache blocks ({num_blocks}). Each decode sequence "
        "requires one Mamba cache block, so CUDA graph capture cannot proceed. Please lower max_num_seqs to at most "
        f"{num_blocks} or increase gpu_memory_utilization.",
        "engine.max_num_seqs",
    )


def _cache_allocation(f: ResolvedFlags, total: int, stages: list[StageKv], num_blocks: int) -> Refusal | None:
    """V0 from 0.6.0 except 0.6.4 sizes the cache from its own usage since start, blind to other processes, and
    then allocates it: CUDA out of memory where they hold what the cache needs. Every rank allocates the
    limiting rank's block count. (V1 from 0.9.1 stops at the start-up check first; the "absolute" budget
    charges them.)"""
    if f.engine != "v0" or f.rules.charges_context("v0"):
        return None
    for s in stages:
        nt = s.memory.non_torch
        free = total - nt.before_start_bytes - s.memory.weights_bytes - nt.growth_bytes
        kv = num_blocks * s.layout.bytes_per_block
        if kv > free:
            return Refusal(
                "kv_alloc_oom",
                f"CUDA out of memory allocating the KV cache: {format_gib(kv)} GiB for {num_blocks:,} blocks, "
                f"{format_gib(max(0, free))} GiB free after loading. vLLM {f.version}'s V0 sizes the cache as "
                f"{f.gpu_memory_utilization} of the GPU less its own usage"
                + (f"; other processes hold {format_gib(nt.other_bytes)} GiB." if nt.other_bytes else "."),
                "engine.gpu_memory_utilization",
            )
    return None


def _startup_error(stages: list[StageKv], f: ResolvedFlags) -> Refusal | None:
    """The first rank that cannot hold one request: V1's _check_enough_kv_cache_memory, V0's
    raise_if_cache_size_invalid (which compares tokens, num_gpu_blocks x block_size, with max_model_len; from
    0.8.0 one pipeline virtual engine's share, num_gpu_blocks // pp)."""
    if f.engine == "v0":
        # Every worker checks the executor's count, the minimum over them all.
        blocks = min(s.num_blocks for s in stages)
        if blocks <= 0:
            return _no_memory(f)
        capacity = (blocks // f.pp if f.rules.v0_pp_check_split else blocks) * stages[0].layout.block_size
        if f.max_model_len > capacity:
            return Refusal(
                "one_request",
                f"The model's max seq len ({f.max_model_len}) is larger than the maximum number of tokens that "
                f"can be stored in KV cache ({capacity}). Try increasing `gpu_memory_utilization` or "
                "decreasing `max_model_len` when initializing the engine.",
                "workload.max_model_len",
            )
        return None
    for s in stages:
        available = check_memory_bytes(s, f)
        if available <= 0:
            return _no_memory(f)
        needed = (s.layout.blocks_per_request(f.max_model_len, f.window_tokens_in_flight)
                  * s.layout.check_bytes_per_block)
        if needed > available:
            fit = estimate_max_model_len(s.layout, available, f.max_model_len, f.window_tokens_in_flight)
            hint = f"Based on the available memory, the estimated maximum model length is {fit}. " if fit else ""
            wording = f.rules.kv_refusal_wording
            return Refusal(
                "one_request",
                f"To serve at least one request with the {'model' if wording == 'cpu_note' else 'models'}'s max "
                f"seq len ({f.max_model_len}), ({format_gib(needed)} GiB KV cache is needed, which is larger than "
                f"the available KV cache memory ({format_gib(available)} GiB). {hint}Try increasing "
                "`gpu_memory_utilization`" + (" (which also controls CPU memory on the CPU backend)"
                                              if wording == "cpu_note" else "")
                + " or decreasing `max_model_len` when initializing the engine."
                + ("" if wording == "plain" else _DOCS_LINK),
                "workload.max_model_len",
            )
    return None

