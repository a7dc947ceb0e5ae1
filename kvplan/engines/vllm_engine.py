"""vLLM as a registered engine: its own options, the configurations it refuses, and its capacity account.

The arithmetic is vllm.plan_vllm's (budget per rank, KV-cache groups, blocks); this module maps a Deployment
onto vLLM's flags, checks what vLLM checks before it sizes anything, and states the result in blocks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.engines.base import EngineAccount, Knobs, KvPool, MemoryTerm, Refusal, check_counts
from kvplan.engines.vllm import (
    COMPILE_CACHES,
    INSTALLS,
    USAGES,
    ResolvedFlags,
    VllmFlags,
    VllmReport,
    graphs_charged,
    mxfp4_backend,
    plan_vllm,
)
from kvplan.engines.vllm_attention import kv_attention_groups
from kvplan.engines.vllm_calibration import calibration_for
from kvplan.engines.vllm_deepgemm import DeepGemmScratch, aligned_rows
from kvplan.engines.vllm_dsa import dsa_note
from kvplan.engines.vllm_dsv4 import dsv4_notes, sparse_mla_refusal
from kvplan.engines.vllm_kv import KvCacheLayout
from kvplan.engines.vllm_kv_quant import quant_kv_refusal, quant_note
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.engines.vllm_memory import StageMemory, WeightSplit, moe_workspace_bytes
from kvplan.engines.vllm_mla import dense_mla_layer
from kvplan.engines.vllm_mxfp4 import release_backend
from kvplan.engines.vllm_speculative import proposer_buffer_bytes
from kvplan.engines.vllm_versions import VllmRules, engine_for, rules_for
from kvplan.errors import FieldError
from kvplan.model.dtypes import VLLM_KV_DTYPES, normalize_weight_dtype, serving_dtype, weight_dtype_bytes
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.records import dataclass
from kvplan.units import GiB, cdiv, fmt_gib

# KV cache dtypes kvplan sizes (kvplan.model.dtypes, vllm_kv_quant); a release must also list the name
# (VllmRules). 'bf16' is kvplan's spelling of bfloat16.
SIZED_KV_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "nvfp4", *VLLM_KV_DTYPES)


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's own serve options; None means vLLM's default for the GPU and release."""

    engine: ClassVar[str] = "vllm"

    version: str = "current"
    use_v1: bool | None = None  # VLLM_USE_V1 (0.6.4-0.10.x); None: the release's default engine
    usage: str = "serve"  # "serve" (vllm serve) or "llm" (the LLM class): their batch defaults differ
    install: str = "image"  # "image" (vllm/vllm-openai, FlashInfer included) or "wheel" (pip): V1's sampler
    enforce_eager: bool = False  # --enforce-eager: no CUDA graphs
    compile_cache: str = "cold"  # "cold" (first boot, or no kept ~/.cache/vllm) or "warm" (vllm.COMPILE_CACHES)
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None  # None: vLLM's default for the model
    enable_chunked_prefill: bool | None = None  # None: the release's default (--no-enable-chunked-prefill: False)
    kv_cache_memory_bytes: int | None = None
    allow_long_max_model_len: bool = False  # the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    flashinfer_sampler: bool | None = None  # the env var VLLM_USE_FLASHINFER_SAMPLER (1/0); None: unset
    mla_disable: bool = False  # the env var VLLM_MLA_DISABLE=1: DeepSeek on the per-head attention path
    deep_gemm: bool | None = None  # env VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM (vllm.VllmFlags.deep_gemm)
    lora: LoraSlots | None = None  # --enable-lora: slots for --max-loras adapters of --max-lora-rank
    mamba_cache_dtype: str = "auto"  # --mamba-cache-dtype (Mamba / DeltaNet conv state)
    mamba_ssm_cache_dtype: str = "auto"  # --mamba-ssm-cache-dtype (their SSM / recurrent state)
    speculative_method: str | None = None  # --speculative-config's method ("mtp" is modelled)
    num_speculative_tokens: int = 0  # and its num_speculative_tokens

    @property
    def rules(self) -> VllmRules:
        return rules_for(self.version)

    def validate(self) -> None:
        engine_for(self.rules, self.use_v1)
        if self.usage not in USAGES:
            raise FieldError("engine.usage", f"must be one of {', '.join(USAGES)}", self.usage)
        if self.install not in INSTALLS:
            raise FieldError("engine.install", f"must be one of {', '.join(INSTALLS)}", self.install)
        if self.compile_cache not in COMPILE_CACHES:
            raise FieldError("engine.compile_cache", f"must be one of {', '.join(COMPILE_CACHES)}",
                             self.compile_cache)
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise FieldError("engine.gpu_memory_utilization", "must be in (0, 1]", u)
        check_counts(self, ("block_size", "max_num_seqs", "max_num_batched_tokens"))
        if self.kv_cache_memory_bytes is not None and not 0 < self.kv_cache_memory_bytes < 1 << 50:
            raise FieldError("engine.kv_cache_memory_bytes", "must be a positive size", self.kv_cache_memory_bytes)
        if self.lora is not None:
            self.lora.validate()
        if self.kv_cache_memory_bytes is not None and not self.rules.kv_cache_memory_option:
            raise FieldError("engine.kv_cache_memory_bytes",
                             f"vLLM {self.version} has no --kv-cache-memory-bytes (0.10.2 and later)")
        VllmFlags(version=self.version, mamba_cache_dtype=self.mamba_cache_dtype,
                  mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype, speculative_method=self.speculative_method,
                  num_speculative_tokens=self.num_speculative_tokens).validate()


def tp_refusal(model: ModelSpec, tp: int) -> Refusal | None:
    """vLLM's checks of tensor parallelism against the heads (ModelConfig.verify_with_parallel_config and the
    QKV projection): tp must divide the attention heads; KV heads are split when tp divides them and
    replicated when tp is a multiple of them (8 KV heads: tp 16 is fine, tp 12 is not)."""
    heads = model.num_attention_heads
    if heads % tp:
        return Refusal(
            "tp_heads",
            f"Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp}).",
            "parallelism.tp",
        )
    for kv in sorted({s.num_kv_heads for s in model.layers if hasattr(s, "num_kv_heads")}):
        if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
            return Refusal(
                "tp_heads",
                f"The {kv} KV heads can neither be split over nor replicated on tensor parallel size {tp}.",
                "parallelism.tp",
            )
    return None


def _config_refusal(d: Deployment, o: VllmOptions) -> Refusal | None:
    """What vLLM rejects before it sizes memory: flag values (per release), tp against the heads, pp against
    the layers."""
    rules = o.rules
    taken = [c for c in rules.kv_cache_dtypes if c in SIZED_KV_DTYPES]
    kv = d.kv_cache_dtype.lower()
    named = kv if kv != "bf16" else "bfloat16"
    # A cache the release takes but cannot run here, or that kvplan does not size (vllm_kv_quant).
    if named in rules.kv_cache_dtypes:
        dtype = (serving_dtype(d.model.config_dtype) if d.weights.dtype in (None, "auto")
                 else normalize_weight_dtype(d.weights.dtype))
        quant = quant_kv_refusal(d.model, rules, o.version, kv, capability=d.gpu.compute_capability,
                                 vendor=d.gpu.vendor, dtype=dtype)
        if quant is not None:
            return Refusal("kv_dtype", quant + ".", "kv_cache_dtype")
    if named not in taken:
        return Refusal(
            "kv_dtype",
            f"vLLM {o.version}'s --kv-cache-dtype takes {', '.join(taken)} (of what kvplan sizes); "
            f"not {d.kv_cache_dtype!r}.",
            "kv_cache_dtype",
        )
    sparse = sparse_mla_refusal(d.model, rules, o.version, kv_cache_dtype=kv, block_size=o.block_size)
    if sparse is not None:
        return sparse
    sizes = rules.block_sizes
    if o.block_size is not None and sizes is not None and o.block_size not in sizes:
        return Refusal(
            "option",
            f"vLLM {o.version}'s --block-size takes {', '.join(map(str, sizes))}; not {o.block_size}.",
            "engine.block_size",
        )
    if d.parallelism.pp > d.model.num_layers:
        return Refusal(
            "pp_layers",
            f"Pipeline parallel size {d.parallelism.pp} exceeds the model's {d.model.num_layers} layers.",
            "parallelism.pp",
        )
    return tp_refusal(d.model, d.parallelism.tp)


def _flags(d: Deployment, o: VllmOptions) -> VllmFlags:
    p = d.parallelism
    return VllmFlags(
        max_model_len=d.max_model_len,
        gpu_memory_utilization=o.gpu_memory_utilization,
        kv_cache_dtype="bfloat16" if d.kv_cache_dtype.lower() == "bf16" else d.kv_cache_dtype,
        block_size=o.block_size,
        max_num_seqs=o.max_num_seqs,
        max_num_batched_tokens=o.max_num_batched_tokens,
        tensor_parallel_size=p.tp,
        pipeline_parallel_size=p.pp,
        dtype=d.weights.dtype or "auto",
        quantization=d.weights.quantization,
        enable_prefix_caching=o.enable_prefix_caching,
        enable_chunked_prefill=o.enable_chunked_prefill,
        kv_cache_memory_bytes=o.kv_cache_memory_bytes,
        version=o.version,
        use_v1=o.use_v1,
        usage=o.usage,
        install=o.install,
        enforce_eager=o.enforce_eager,
        compile_cache=o.compile_cache,
        allow_long_max_model_len=o.allow_long_max_model_len,
        flashinfer_sampler=o.flashinfer_sampler,
        mla_disable=o.mla_disable,
        deep_gemm=o.deep_gemm,
        # Expert parallel spreads whole experts over the tp x dp ranks of the EP group (FusedMoE's EP).
        split=WeightSplit(
            expert_ranks=p.tp * p.dp if p.expert_parallel else None,
            cpu_offload_bytes=d.weights.cpu_offload_bytes,
        ),
        lora=o.lora,
        mamba_cache_dtype=o.mamba_cache_dtype,
        mamba_ssm_cache_dtype=o.mamba_ssm_cache_dtype,
        speculative_method=o.speculative_method,
        num_speculative_tokens=o.num_speculative_tokens,
    )


def _shared_prefix_blocks(report: VllmReport, prefix_tokens: int) -> int:
    """Blocks of a common prefix that prefix caching (when on) stores once: whole blocks, in groups that keep
    every token (full attention, MLA). A 1,000-token prefix in blocks of 16 shares 62 blocks per such group."""
    if not report.flags.enable_prefix_caching or prefix_tokens <= 0:
        return 0
    layout = report.stages[report.limiting_stage].layout
    whole = prefix_tokens // layout.block_size
    return sum(whole for g in layout.groups if g.kind in ("full_attention", "mla"))


def _other_install_kv(d: Deployment, given: VllmFlags, r: VllmReport) -> tuple[str, int] | None:
    """The other install and the KV memory it leaves, where the install changes the plan; None where it does not.

    From 0.8 to 0.11.0 the image's FlashInfer sampler keeps the profiled peak small and the wheel's PyTorch sort over
    1,024 rows of logits does not (Qwen3-235B-A22B-FP8 at tp 4 on 0.9.2: 11.92 GiB of KV memory as the image,
    8.44 GiB as the wheel), and from 0.10.1 to 0.11 the install picks gpt-oss's mxfp4 kernels: where the user
    did not say how vLLM is installed, the output shows both figures."""
    f = r.flags
    sampler = f.engine == "v1" and f.rules.image_sampler is not None and f.flashinfer_sampler is None
    mxfp4 = d.model.quant is not None and d.model.quant.method == "mxfp4" and f.rules.mxfp4 \
        and f.rules.mxfp4_triton != "vendored"
    if not (sampler or mxfp4):
        return None
    other = "wheel" if f.install == "image" else "image"
    alt = plan_vllm(d.model, replace(given, install=other), d.gpu, checkpoint_bytes=d.weights.checkpoint_bytes,
                    profile=d.profile, in_use_bytes=d.gpu_in_use_bytes)
    kv_bytes = alt.stages[alt.limiting_stage].available_kv_bytes
    return None if kv_bytes == r.stages[r.limiting_stage].available_kv_bytes else (other, kv_bytes)


def _mla_dense_note(model: ModelSpec, f: ResolvedFlags) -> str:
    """DeepSeek-V2-Lite on 0.7.0: 16 heads x 2 x 192 x 2 B = 12,288 B a token a layer, not the latent's 1,152."""
    mla = next(spec for spec in model.layers if spec.kind == LayerKind.MLA)
    dense = dense_mla_layer(mla, model, f.rules)
    dense_bytes, latent_bytes = (spec.kv_bytes_per_token(f.kv_cache_dtype, f.tp) for spec in (dense, mla))
    return (f"{f.mla_dense}: each layer caches K and V for every head, {dense_bytes:,} B a token on each GPU, not "
            f"the {latent_bytes:,} B MLA latent")


def _flashinfer_sampler_note(f: ResolvedFlags) -> str:
    """What VLLM_USE_FLASHINFER_SAMPLER does to the profiled sampler in this release and engine."""
    env = f"VLLM_USE_FLASHINFER_SAMPLER={int(bool(f.flashinfer_sampler))}"
    if f.engine == "v0":
        return f"{env} is not modelled on vLLM {f.version}'s V0 sampler: planned as PyTorch's sort"
    if not f.rules.sampler_warmup:
        return f"{env} does not change vLLM {f.version}'s V1 profile, which runs no sampler before 0.8"
    if f.runner == "v2":
        return f"{env} does not reach Model Runner V2's sampler, which samples without top-k/top-p"
    return (f"{env}: the sampler runs FlashInfer's kernels (installed beside vLLM), a smaller peak than "
            "PyTorch's sort" if f.flashinfer_sampler else
            f"{env}: the sampler sorts with PyTorch, a larger peak than FlashInfer's kernels")


def _layout_notes(f: ResolvedFlags, layout: KvCacheLayout) -> list[str]:
    """Partly empty last blocks, sliding windows' reservations, blocks raised for a Mamba state."""
    out = []
    if f.max_model_len % layout.block_size:
        out.append(
            f"a request of {f.max_model_len:,} tokens takes {cdiv(f.max_model_len, layout.block_size):,} whole "
            f"blocks of {layout.block_size} per layer group: the last one is partly empty"
        )
    windows = [g for g in layout.groups if g.kind == "sliding_window"]
    if windows:
        w = windows[0].window_tokens
        blocks = cdiv(min(w - 1 + f.window_tokens_in_flight, f.max_model_len), layout.block_size) + 1
        out.append(
            f"a {w:,}-token sliding window reserves {blocks:,} blocks per request, not {cdiv(w, layout.block_size):,}: "
            + (f"the {f.max_num_batched_tokens:,} tokens of one prefill step stay until it ends"
               if f.window_tokens_in_flight == f.max_num_batched_tokens else
               f"the {f.window_tokens_in_flight:,} tokens of the steps in flight "
               f"({f.window_tokens_in_flight // f.max_num_batched_tokens} x {f.max_num_batched_tokens:,}) stay until "
               "they end")
            + ", and a window can start mid-block"
        )
    if f.block_size and layout.block_size != f.block_size:
        out.append(
            f"vLLM raises the attention block to {layout.block_size} tokens so one page holds a Mamba state"
        )
    return out


def _attention_notes(r: VllmReport) -> list[str]:
    """FlashInfer's share of the CUDA-graph estimate, and FULL graphs dropped under speculative decoding
    (vllm_attention)."""
    f, path = r.flags, r.attention
    if path is None or path.backend != "FLASHINFER":
        return []
    out = []
    if r.flashinfer_graph_bytes:
        groups = max(kv_attention_groups(s.layout) for s in r.stages)
        wrappers = f"{len(r.graphs.full)} decode wrappers of 8 MiB" + (
            f" for each of its {groups} attention groups" if groups > 1 else "")
        what = (f"its {fmt_gib(r.flashinfer_graph_bytes)} workspace" if not path.flashinfer_native else
                f"{wrappers} ({fmt_gib(r.flashinfer_graph_bytes)}; its workspace comes before the capture)"
                if f.runner == "v2" else f"its workspace and {wrappers} ({fmt_gib(r.flashinfer_graph_bytes)})")
        where = ("in the CUDA-graph estimate" if graphs_charged(f) else
                 "beside the CUDA graphs, outside the budget")
        out.append(f"vLLM {f.version} runs this model's attention on {path.label} on this GPU: the FULL "
                   f"captures allocate {what}, {where}")
    elif f.num_speculative_tokens and not r.graphs.full and r.graphs.piecewise:
        out.append(f"vLLM {f.version} runs this model's attention on {path.label} on this GPU, whose decode "
                   "graphs hold one token a request: with draft tokens it captures piecewise graphs only")
    return out


def _deepgemm_note(model: ModelSpec, r: VllmReport) -> list[str]:
    """What running the experts on DeepGEMM adds to the profiling peak (vllm_deepgemm)."""
    scratch, f, moe = r.moe_scratch, r.flags, model.geometry.moe
    if scratch is None or scratch.deepgemm is None or moe is None:
        return []
    dg = scratch.deepgemm

    def scratch_bytes(deepgemm: DeepGemmScratch | None) -> int:
        return moe_workspace_bytes(model, dtype=f.dtype, tp=f.tp, max_num_batched_tokens=f.max_num_batched_tokens,
                                   scratch=scratch.kind, chunk_tokens=scratch.chunk_tokens, deepgemm=deepgemm)

    rows = min(f.max_num_batched_tokens, scratch.chunk_tokens or f.max_num_batched_tokens) * moe.experts_per_token
    return [f"vLLM {f.version} runs the experts on DeepGEMM's grouped GEMM, which pads each expert's rows to its "
            f"block: {aligned_rows(dg.rule, rows, dg.local_experts):,} rows where Triton's hold {rows:,}, "
            f"{fmt_gib(scratch_bytes(dg))} of scratch instead of {fmt_gib(scratch_bytes(None))} (--no-deep-gemm: "
            "VLLM_USE_DEEP_GEMM=0)"]


def _notes(d: Deployment, r: VllmReport, other_install: tuple[str, int] | None) -> list[str]:
    """Why vLLM's figures are what they are: null block, windows, raised blocks, graphs, install, warm-up,
    profile."""
    f = r.flags
    layout = r.stages[r.limiting_stage].layout
    out = []
    if f.engine == "v1" and f.rules.null_block and r.num_blocks > 0:
        out.append(f"1 of vLLM's {r.num_blocks:,} blocks is its null block, which no request can use")
    elif any(k in d.model.layer_kinds() for k in ("sliding_window", "chunked_local")):
        out.append(f"vLLM {f.version}'s V0 engine caches every token in sliding-window layers too")
    if d.model.geometry.compressed_mla is not None:
        out.extend(dsv4_notes(layout, f.max_model_len, f.window_tokens_in_flight))
    else:
        out.extend(_layout_notes(f, layout))
    quant = quant_note(d.model, f.rules, f.version, f.kv_cache_dtype.name, tp=f.tp, block_size=f.block_size,
                       max_num_seqs=f.max_num_seqs, max_model_len=f.max_model_len)
    if quant is not None:
        out.append(quant)
    if f.dsa_storage is not None:
        out.append(dsa_note(d.model, f.dsa_storage))
        given = d.engine.block_size if isinstance(d.engine, VllmOptions) else None
        if given is not None and given != f.block_size:  # only to 0.17: sparse_mla_refusal refuses it after
            out.append(f"vLLM {f.version} forces {f.block_size}-token blocks for DeepSeek-V3.2's indexer: the "
                       f"given block size {given} is not used")
    if f.num_speculative_tokens:
        outside = ""
        if not r.stages[-1].memory.proposer_bytes:  # built after the snapshot this release measures from
            held = proposer_buffer_bytes(d.model, runner=f.runner, elem_bytes=weight_dtype_bytes(f.dtype),
                                         max_num_batched_tokens=f.max_num_batched_tokens, max_num_seqs=f.max_num_seqs)
            outside = f"; the proposer's {fmt_gib(held)} of buffers are outside vLLM {f.version}'s budget"
        out.append(f"MTP with {f.num_speculative_tokens} draft tokens: the draft's weights and its attention "
                   "layers' cache are counted (and, in a DeltaNet hybrid, its longer conv state and "
                   f"{f.num_speculative_tokens} more state pages a request); its profiling forward and its CUDA "
                   "graphs are not" + outside)
    if layout.mamba_cache_mode == "align":
        out.append("prefix caching puts the state layers in mamba_cache_mode 'align': a request holds 2 state "
                   "pages per layer group, not 1")
    elif layout.mamba_cache_mode == "all":
        out.append(f"prefix caching puts the Mamba layers in mamba_cache_mode 'all': a request holds a state "
                   f"page per {layout.block_size}-token block of its length, not 1")
    if f.runner == "v2":
        copy = "one float32 copy of the logits" if f.rules.v2_sampler_fp32 else "the logits in their own dtype"
        out.append(f"vLLM {f.version} runs this model on Model Runner V2: its profiling samples from {copy} (no "
                   "top-k/top-p)" + ("" if f.rules.v2_cudagraphs_profiled else ", and it makes no CUDA-graph estimate"))
    clone = max((s.memory for s in r.stages), key=lambda m: m.compile_clone_bytes - m.run_peak_bytes)
    if clone.compile_clone_bytes > clone.run_peak_bytes:
        # Inductor's benchmark_combo_kernel (on from 0.11.1 with torch 2.9) runs each kernel on random copies of
        # its arguments; vllm#54122 and #54383 report the KV cache of a first boot smaller than a restart's.
        out.append(f"a cold torch.compile (first boot, or no kept ~/.cache/vllm) profiles its copy of the "
                   f"embedding table: {fmt_gib(clone.compile_clone_bytes)}, above the run's "
                   f"{fmt_gib(clone.run_peak_bytes)} (vllm#54122); a warm cache (--compile-cache warm) leaves "
                   f"{fmt_gib(clone.compile_clone_bytes - clone.run_peak_bytes)} more KV")
    out.extend(_attention_notes(r))
    out.extend(_deepgemm_note(d.model, r))
    if (f.rules.gdn_graph_transient and f.runner == "v1" and r.graphs.full and graphs_charged(f)
            and "linear_attention" in d.model.layer_kinds()):
        # fentz26's Qwen3.8-27B at tp 2 on 0.27.1 (256 sequences, 32 context tokens each): estimated 3.51 GiB for
        # 51 + 35 graphs, kvplan 0.93; dfch's at tp 4 on 0.26.0 (512 sequences, 16 each): 0.96, kvplan 1.05.
        sample = min(f.max_model_len, f.max_num_batched_tokens // max(r.graphs.full))
        out.append(f"vLLM {f.version} may estimate this gated-DeltaNet hybrid's CUDA graphs well above the "
                   f"planned {fmt_gib(r.cudagraph_bytes)}: its first FULL capture warms up {max(r.graphs.full)} "
                   f"requests of {sample:,} context tokens, which leaves a transient that grows with "
                   "--max-num-batched-tokens (vllm#50780; not modelled: Qwen3.8-27B logged 3.51 GiB against 0.93 "
                   "planned at tp 2 with 256 sequences on 0.27.1, 0.96 against 1.05 at tp 4 with 512 on 0.26.0)")
    if r.cudagraph_bytes and not graphs_charged(f):
        out.append(f"CUDA graphs (about {fmt_gib(r.cudagraph_bytes)}) are not in vLLM {f.version}'s budget"
                   + (" (it skips their estimate on ROCm before 0.26)" if f.rocm and f.rules.cudagraphs_subtracted
                      else "") + ": they live in the memory utilization leaves out")
    other = r.stages[0].memory.non_torch.other_bytes
    if other:
        out.append(f"{fmt_gib(other)} of each GPU is held by other processes (--gpu-memory-in-use): "
                   + ("charged to the budget, as this release charges all memory in use"
                      if f.rules.charges_context(f.engine) else
                      "the start-up check needs total x utilization free beside it"
                      if f.engine == "v1" and f.rules.startup_check else
                      "not in the budget, which counts only vLLM's own usage; the cache must still fit beside it"))
    elif f.rules.charges_context(f.engine):
        out.append(f"vLLM {f.version}'s {f.engine.upper()} engine charges all memory in use on the GPU, another "
                   "process's too: kvplan plans an otherwise idle GPU (--gpu-memory-in-use states what else "
                   "runs there)")
    if f.engine == "v0" and f.pp > 1 and r.num_blocks > 0:
        # core/scheduler.py and worker/cache_engine.py: num_gpu_blocks //= pipeline_parallel_size
        out.append(f"vLLM {f.version}'s V0 splits the {r.num_blocks:,} blocks over its {f.pp} pipeline virtual "
                   f"engines, {r.num_blocks // f.pp:,} each: a request runs in one, so none can be longer than "
                   f"{r.num_blocks // f.pp * layout.block_size:,} tokens")
    if f.mla_dense is not None:
        out.append(_mla_dense_note(d.model, f))
    elif isinstance(d.engine, VllmOptions) and d.engine.mla_disable:
        out.append(f"VLLM_MLA_DISABLE=1 changes nothing here: {d.model.name} has no MLA layer")
    if f.v0_fallback is not None:
        out.append(f"vLLM {f.version} does not run {f.v0_fallback} on its V1 engine and falls back to V0: "
                   "planned as V0 (VLLM_USE_V1 unset)")
    if f.flashinfer_sampler is not None:
        out.append(_flashinfer_sampler_note(f))
    elif f.engine == "v1" and f.rules.image_sampler is not None:
        out.append(f"vLLM {f.version} samples with FlashInfer only where it is installed: planned as the "
                   "vllm/vllm-openai image, which ships it (a pip-installed vllm sorts with PyTorch, a larger peak)"
                   if f.install == "image" else
                   f"vLLM {f.version} from the pip wheel has no FlashInfer: its sampler sorts with PyTorch, a larger "
                   "peak than the vllm/vllm-openai image's")
    mxfp4 = mxfp4_backend(f.rules, f.install, r.gpu)
    if d.model.quant is not None and d.model.quant.method == "mxfp4" and mxfp4 is not None and \
            f.rules.mxfp4_triton != "vendored" and mxfp4.name != release_backend(
                r.gpu, triton="vendored", flashinfer_dependency=True, install=f.install).name:
        out.append(f"vLLM {f.version} as installed ({f.install}) loads the mxfp4 experts for {mxfp4.name}: OpenAI's "
                   "triton_kernels come with the vllm/vllm-openai image from 0.10.2 and with every install from "
                   "0.12 (0.10.1's torch 2.7.1 is below what they need)")
    if other_install is not None:
        install, kv_bytes = other_install
        out.append(f"installed as the {'pip wheel' if install == 'wheel' else 'vllm/vllm-openai image'} "
                   f"(--vllm-install {install}) it would have {fmt_gib(kv_bytes)} of KV memory, not "
                   f"{fmt_gib(r.stages[r.limiting_stage].available_kv_bytes)}")
    warm = r.warmup
    if warm is not None and r.refusal is None:
        out.append(f"the sampler warm-up after the KV cache ({warm.rows:,} rows) needs {fmt_gib(warm.need_bytes)} "
                   f"of the {fmt_gib(warm.free_bytes)} then free")
    if r.profile is not None:
        out += [f"not taken from your box's profile: {s}" for s in r.profile.skipped]
    return out


def _terms(d: Deployment, r: VllmReport, m: StageMemory) -> list[MemoryTerm]:
    """What this release subtracts from the requested memory on the limiting rank, each term labelled."""
    f = r.flags
    measured = set(r.profile.applied) if r.profile else set()

    def mark(name: str, label: str) -> str:
        return f"{label}; measured on your box" if name in measured else label

    loaded = "weights as loaded on this rank"
    if d.weights.checkpoint_bytes is not None:
        loaded = f"{d.weights.checkpoint_source or 'the given checkpoint size'}, as loaded on this rank"
        if d.parallelism.tp * d.parallelism.pp > 1:
            loaded += "; split over ranks as kvplan's parameter groups split (approximate)"
    if m.lora_bytes and f.lora is not None:
        slots = f"{f.lora.max_loras} x rank {f.lora.max_lora_rank}"
        loaded += f", {m.lora_bytes / GiB:.2f} GiB of it LoRA slots ({slots})"
    if m.draft_bytes:
        loaded += f", {m.draft_bytes / GiB:.2f} GiB of it the MTP draft"
    if m.mla_kept_bytes:
        kept = "absorbed MLA matrices" if f.rules.mla_weights.startswith("absorbed") else "MLA's dequantized kv_b_proj"
        loaded += f", {m.mla_kept_bytes / GiB:.2f} GiB of it {kept}"
    if m.buffer_bytes:
        loaded += f", {m.buffer_bytes / GiB:.2f} GiB of it buffers the model builds"
    peak = f"activation peak of the profiling run ({f.max_num_batched_tokens:,} tokens"
    peak += f", {min(f.max_num_seqs, f.max_num_batched_tokens):,} sampler rows)" if m.runs_sampler else ")"
    if m.encoder_bytes:
        peak += ", vision encoder first"
    if m.intermediate_bytes:
        peak += f", {m.intermediate_bytes / GiB:.2f} GiB of it buffers for the previous stage's output"
    if m.compile_clone_bytes > m.run_peak_bytes:
        peak = (f"a cold compile's copies of the embedding table and two {f.max_num_batched_tokens:,}-token "
                "buffers")
    charged = "CUDA context, NCCL and growth" if m.non_torch_bytes > m.non_torch.growth_bytes else "growth"
    if m.non_torch.other_bytes and m.non_torch_bytes > m.non_torch.growth_bytes:
        charged += f", {m.non_torch.other_bytes / GiB:.2f} GiB of it other processes'"
    terms = [
        MemoryTerm("weights", m.weights_bytes, mark("weights", loaded)),
        MemoryTerm("activation_peak", m.activation_peak_bytes, mark("activation peak", peak)),
        MemoryTerm("non_torch", m.non_torch_bytes, mark("non-torch", f"non-torch memory ({charged})")),
    ]
    if m.sampler_state_bytes:
        terms.append(MemoryTerm("sampler_state", m.sampler_state_bytes,
                                f"Model Runner V2's penalty counts and token masks ({f.max_num_seqs:,} requests)"))
    if m.proposer_bytes:
        terms.append(MemoryTerm("draft_buffers", m.proposer_bytes,
                                f"the MTP proposer's hidden states and inputs ({f.max_num_batched_tokens:,} tokens)"))
    if graphs_charged(f) and r.cudagraph_bytes:
        sizes = f"{len(r.graphs.piecewise)} piecewise + {len(r.graphs.full)} full graphs" + (
            f" x {r.graphs.lora_cases} LoRA cases" if r.graphs.lora_cases > 1 else "")
        terms.append(MemoryTerm("cuda_graphs", r.cudagraph_bytes, mark("CUDA graphs", f"CUDA graphs ({sizes})")))
    return terms


class VllmEngine:
    """vLLM, any release from 0.6.0 to 0.33 (V0 and V1 engines): kvplan.engines.vllm_versions lists what each
    release changes."""

    name: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM"
    options_type: ClassVar[type] = VllmOptions
    # 0.95 is the highest utilization vLLM's own errors and docs propose; above it the sampler warm-up and
    # CUDA graphs run short of memory (the gpt-oss-20b log at 0.95 already fails).
    knobs: ClassVar[Knobs] = Knobs(
        fp8_kv_dtype="fp8",
        utilization=("engine.gpu_memory_utilization", 0.95),
        request_cap="engine.max_num_seqs",
        long_context="engine.allow_long_max_model_len",
    )

    def default_options(self) -> VllmOptions:
        return VllmOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        """tp x pp GPUs per data-parallel rank, dp ranks per instance."""
        return p.tp * p.pp * p.dp

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, VllmOptions):
            raise TypeError("VllmEngine needs VllmOptions")
        refused = _config_refusal(d, o)
        if refused is not None:
            return EngineAccount(
                engine=self.name, version=o.version, total_memory_bytes=d.gpu.total_memory_bytes,
                requested_bytes=0, terms=(), kv_budget_bytes=0, pools=(), max_model_len=d.max_model_len,
                request_cap=o.max_num_seqs, engine_concurrency=0.0, kv_cache_tokens=None, refusal=refused,
                log_lines=(f"ValueError: {refused.message}",),
            )
        flags = _flags(d, o)
        r = plan_vllm(d.model, flags, d.gpu, checkpoint_bytes=d.weights.checkpoint_bytes, profile=d.profile,
                      in_use_bytes=d.gpu_in_use_bytes)
        stage = r.stages[r.limiting_stage]
        batched = r.flags.window_tokens_in_flight
        terms = _terms(d, r, stage.memory)
        if o.kv_cache_memory_bytes is not None:
            terms = [MemoryTerm("pinned", 0, f"--kv-cache-memory-bytes fixes the KV memory at "
                                f"{fmt_gib(o.kv_cache_memory_bytes)}")]
        pool = KvPool(
            name="KV blocks",
            unit="block",
            unit_bytes=stage.layout.bytes_per_block,
            budget_units=r.usable_blocks,
            per_request_units=r.blocks_per_request,
            shared_prefix_units=_shared_prefix_blocks(r, d.workload.shared_prefix_tokens),
        )
        layout = stage.layout
        return EngineAccount(
            engine=self.name,
            version=o.version,
            total_memory_bytes=r.total_memory_bytes,
            requested_bytes=r.requested_bytes,
            terms=tuple(terms),
            kv_budget_bytes=stage.available_kv_bytes,
            pools=(pool,),
            max_model_len=r.flags.max_model_len,
            request_cap=r.flags.max_num_seqs,
            engine_concurrency=r.max_concurrency,
            kv_cache_tokens=r.kv_cache_tokens,
            refusal=r.refusal,
            log_lines=r.log_lines,
            notes=tuple(_notes(d, r, _other_install_kv(d, flags, r))),
            detail=r.to_dict(),
            mla_per_head=r.flags.mla_dense is not None,
            calibration=calibration_for(d.model, d.gpu, r.flags.rules, r.flags.engine, o.version,
                                        profiled=r.profile),
            per_request_at=lambda length: (layout.blocks_per_request(length, batched),),
        )
