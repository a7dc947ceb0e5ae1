"""The SGLang engine model: mem_fraction_static and its default rule per release, the token pools, SGLang's options.

SGLang (sglang/srt/model_executor/model_runner.py, profile_max_num_token) keeps a fraction of the memory that
was free BEFORE the weights were loaded, unlike vLLM's fraction of the total:
    rest = free_after_weights - free_before_load x (1 - mem_fraction_static)
and cuts `rest` into token slots of `cell_size` bytes (the KV of one token over every layer of this rank; KV
heads split over the attention-TP ranks with at least one per rank; an MLA latent is never split), rounded
down to whole pages. From 0.5.3 sliding-window layers get a second pool (swa_full_tokens_ratio sliding tokens
per full token); Mamba or linear-attention layers take per-request state slots off `rest` first. What is left
outside the fraction holds activations, CUDA graphs and the request table, which is why the default fraction
comes from the GPU's size. Which rules a release follows: kvplan.engines.sglang_releases.
A BoxProfile measured by `kvplan calibrate` replaces the modelled GPU total, the memory in use before loading
(context, NCCL) and the weights (kvplan.engines.box says when each applies).
"""

from __future__ import annotations

from typing import Any, ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.capacity.kv import pp_stage_layers
from kvplan.engines.allocator import loaded_tensor_bytes, segment_bytes
from kvplan.engines.base import Calibration, EngineAccount, Knobs, KvPool, MemoryTerm, Refusal, check_counts
from kvplan.engines.box import BoxTerms, box_terms
from kvplan.engines.release import CURRENT, Release, release_text
from kvplan.engines.sglang_releases import (
    FractionInputs,
    SglangRelease,
    batch_defaults,
    release_of,
    rules_for,
)
from kvplan.engines.vllm_dsa import index_key_bytes
from kvplan.engines.vllm_engine import tp_refusal
from kvplan.engines.vllm_memory import WeightSplit, non_torch_for, weights_per_stage
from kvplan.errors import FieldError
from kvplan.hardware.gpus import COMPUTE_CAPABILITY
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype, weight_dtype_bytes
from kvplan.model.specs import LayerKind, LayerSpec, ModelSpec
from kvplan.records import dataclass
from kvplan.units import GiB, MiB, cdiv

# In use before SGLang measures "free before load": the CUDA context, and at tp or pp > 1 the communicators,
# since model_runner.py reads free memory after init_torch_distributed ("Init torch distributed ends. mem
# usage=..."). vLLM's worker snapshot is taken at the same point, so its figures apply (vllm_memory.NON_TORCH):
# 0.51 GiB of context on H100, +1.02 GiB of NCCL at tp >= 2 over NVSwitch, +0.92 GiB at pp > 1; nothing known
# beyond the context elsewhere. A calibrated profile replaces it with the box's own figure (GPU total - "Load
# weight begin. avail mem").
SWA_FULL_TOKENS_RATIO = 0.8  # ServerArgs.swa_full_tokens_ratio
# ServerArgs.mamba_full_memory_ratio (0.5.23): the Mamba state pool's memory as a share of the full KV pool's.
MAMBA_FULL_MEMORY_RATIO = 0.9
FIXED_MAMBA_SLOTS = 512  # max_mamba_cache_size when neither it nor max_running_requests is given (0.5.3)
# SGLang's --kv-cache-dtype choices.
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "fp4_e2m1")
# fp4_e2m1 (torch.float4_e2m1fn_x2, two values a byte; get_cell_size_per_token adds one scale byte per 16
# values): an MLA cell from sgl-project/sglang@76196b3 (2025-11-01, first in 0.5.4.post3), an MHA cell from
# @6d5e16f (2025-11-14, first in 0.5.5.post3). kvplan reads a release to its patch, so from 0.5.5 and 0.5.6.
FP4_KV_MLA: Release = (0, 5, 5)
FP4_KV_MHA: Release = (0, 5, 6)
# Which pool holds a layer's cache, by the layer's kind: full-attention tokens, sliding-window tokens, per-request
# state, or none. Llama 4's chunked layers count as full (SGLang's own chunk pool is not modelled).
KIND_RULES: dict[LayerKind, str | None] = {
    LayerKind.FULL_ATTENTION: "full",
    LayerKind.SLIDING_WINDOW: "swa",
    LayerKind.CHUNKED_LOCAL: "full",
    LayerKind.MLA: "full",
    LayerKind.COMPRESSED_MLA: "unmodelled",  # DeepSeek-V4: SGLang's compressed pools are not modelled
    LayerKind.MAMBA: "state",
    LayerKind.LINEAR_ATTENTION: "state",
    LayerKind.SHARED_KV: None,
    LayerKind.NO_CACHE: None,
}
# Attention backends that constrain the page size (0.5.23 arg_groups/overrides.py): (sizes taken, size forced
# otherwise). FlashMLA pages are 64 tokens whatever --page-size says.
PAGE_RULES: dict[str, tuple[tuple[int, ...], int]] = {
    "flashmla": ((64,), 64),
    "trtllm_mla": ((32, 64), 64),
    "trtllm_mha": ((16, 32, 64, 128), 64),
}
# Architectures SGLang serves as multimodal (its multimodal model registry holds these classes' families).
_MULTIMODAL_WORDS = ("ForConditionalGeneration", "VLForCausalLM", "Llava", "Vision")
# Releases and GPUs the held-out SGLang logs cover (benchmarks/sglang_accuracy.py, benchmarks/logs/sglang.jsonl).
LOGGED_RANGES = ((0, 4, 0), (0, 4, 3), (0, 4, 6), (0, 5, 3), (0, 5, 23))
LOGGED_GPUS = ("RTX-3090", "L4", "H100-80GB", "H200", "MI300X", "RTX-5090", "A40")
# benchmarks/results/sglang_accuracy.md, KV tokens on the held-out logs (tests check these are its figures):
# A from each box's measured free memory (what a calibrated profile gives), B from the deployment alone.
A_LOGS, A_MAE_PCT, A_WORST_PCT = 9, 0.06, 0.14
B_LOGS, B_MAE_PCT, B_WORST_PCT = 8, 2.13, 8.06


@dataclass(frozen=True)
class SglangOptions:
    """SGLang's own server options; None means SGLang's default for the GPU and release."""

    engine: ClassVar[str] = "sglang"

    version: str = CURRENT
    mem_fraction_static: float | None = None
    page_size: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    max_total_tokens: int | None = None  # --max-total-tokens: a cap on the token pool
    attention_backend: str | None = None  # --attention-backend: some force a page size

    def validate(self) -> None:
        release_of(self.version)
        f = self.mem_fraction_static
        if f is not None and not 0 < f < 1:
            raise FieldError("engine.mem_fraction_static", "must be in (0, 1)", f)
        check_counts(self, ("page_size", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
                            "max_total_tokens"))


@dataclass(frozen=True)
class GpuDefaults:
    """What SGLang derives from the GPU's memory when the flags are not given."""

    release: SglangRelease
    chunked_prefill_size: int
    cuda_graph_max_bs: int | None
    mem_fraction_static: float
    reserved_mib: float | None  # what the default fraction leaves for activations and CUDA graphs
    rule: str  # how the fraction was chosen, for people


def is_multimodal(model: ModelSpec) -> bool:
    """Served by SGLang as a multimodal model: a vision tower in the parameters, or a multimodal class name."""
    return any(g.name.startswith("vision") for g in model.param_groups) or any(
        w in model.architecture for w in _MULTIMODAL_WORDS)


def gpu_defaults(total_bytes: int, o: SglangOptions, p: Parallelism, model: ModelSpec | None = None) -> GpuDefaults:
    """SGLang's defaults for chunked_prefill_size, cuda_graph_max_bs and mem_fraction_static on this card, for the
    release `o.version` names (kvplan.engines.sglang_releases). gpu_mem is the card's total in MiB as nvidia-smi
    reports it (server_args.py, utils.get_nvgpu_memory_capacity; plan_sglang passes GpuSpec.smi_total_bytes):
    H100 (81,089 MiB), tp 1, newest rules: chunk 8,192, graphs 256 -> 13,440 MiB reserved -> 0.834."""
    rules = rules_for(release_of(o.version))
    gpu_mib = total_bytes / MiB
    chunk, graphs = batch_defaults(rules.batch, gpu_mib, p.tp)
    chunk = o.chunked_prefill_size or chunk
    graphs = o.cuda_graph_max_bs or graphs
    chosen = rules.fraction(FractionInputs(gpu_mib, p.tp, p.pp, p.dp, p.dp_attention, chunk, graphs or 0))
    fraction, reserved, rule = chosen.value, chosen.reserved_mib, chosen.rule
    if o.mem_fraction_static:
        fraction, reserved, rule = o.mem_fraction_static, None, "--mem-fraction-static as given"
    multimodal = model is not None and is_multimodal(model)
    if multimodal and rules.multimodal == "runner":
        # ModelRunner (0.3-0.4.x): "adjust --mem-fraction-static for multimodal models", any fraction x 0.95.
        fraction, rule = fraction * 0.95, f"{rule}, x 0.95 for a multimodal model"
    elif multimodal and not o.mem_fraction_static and rules.multimodal == "default x0.90":
        fraction, rule = fraction * 0.90, f"{rule}, x 0.90 for a multimodal model"
    elif multimodal and not o.mem_fraction_static and rules.multimodal == "vit":
        # adjust_mem_fraction_for_vlm: x 0.95 x clamp(1 - 0.1 x (ViT complexity / ViT-L's - 1), 0.8, 1.05); the
        # tower's depth and width are not in kvplan's model record, so the factor is taken as 1 (a ViT-L tower).
        fraction, rule = fraction * 0.95, f"{rule}, x 0.95 for a multimodal model (ViT factor taken as 1)"
    return GpuDefaults(rules, chunk, graphs, fraction, reserved, rule)


def _attention_tp(p: Parallelism) -> int:
    """Ranks one layer's attention is split over: tp, or tp / dp with DP attention."""
    return p.tp // p.dp if p.dp_attention else p.tp


@dataclass(frozen=True)
class Cells:
    """Per-token and per-request bytes of one rank's layers, by pool."""

    full_bytes: int  # full-attention (and MLA) bytes per token
    swa_bytes: int  # sliding-window bytes per token (0 when the release has no separate pool)
    state_bytes: int  # Mamba / linear-attention state per request
    full_layers: int
    swa_layers: int
    window_tokens: int


DSA_PAGE_TOKENS = 64  # the NSA pool asserts 64-token pages on CUDA (memory_pool.py)
# server_args.py reads DeepSeek-V3.2's `auto` cache as fp8 on SM100 and later from 0.5.4.post2 (a patch release
# kvplan's release ranges cannot tell from 0.5.4).
DSA_AUTO_FP8_BLACKWELL: Release = (0, 5, 4)


def _dsa_kv_dtype(kv_name: str, rules: SglangRelease, version: str, gpu_key: str, dtype: str) -> str:
    """The cache dtype SGLang runs DeepSeek-V3.2's sparse attention in (0.5.3+): bfloat16 or fp8_e4m3; `auto`
    is fp8 on SM100 and later from 0.5.4.post2 (server_args.py), the model dtype otherwise."""
    if not rules.dsa:
        raise FieldError("engine.version", f"SGLang {version} does not have DeepSeek-V3.2's sparse attention (first "
                         "in 0.5.3)", version)
    name = kv_name.lower()
    if name == "auto":
        capability = COMPUTE_CAPABILITY.get(gpu_key)
        blackwell = capability is not None and capability[0] >= 10
        return "fp8_e4m3" if release_of(version) >= DSA_AUTO_FP8_BLACKWELL and blackwell else dtype
    if name not in ("bf16", "bfloat16", "fp8_e4m3"):
        raise FieldError("engine.kv_cache_dtype", "SGLang's DeepSeek-V3.2 pool takes bfloat16 or fp8_e4m3", kv_name)
    return kv_name


def _cells(model: ModelSpec, layers: range, kv_name: str, dtype: str, attn_tp: int, swa_pool: bool) -> Cells:
    kv = resolve_kv_dtype(kv_name, dtype)
    mla = model.geometry.mla
    full = swa = state = window = full_layers = swa_layers = 0
    for spec, n in model.spec_counts(layers).items():
        pool = KIND_RULES[spec.kind]
        if pool == "unmodelled":
            raise FieldError("model", f"{model.name} has {spec.kind} layers (DeepSeek-V4); kvplan models their "
                             "caches for vLLM and Transformers only (use --engine vllm)")
        if pool == "swa" and not swa_pool:
            pool = "full"  # before 0.5.3 every attention layer keeps all its tokens (the 0.4.4 Gemma 3 log)
        if pool == "state":
            state += n * _sglang_state_bytes(spec, attn_tp)
        elif pool == "swa":
            swa += n * spec.kv_bytes_per_token(kv, attn_tp)
            swa_layers += n
            window = max(window, getattr(spec, "sliding_window", 0))
        elif pool == "full" and mla is not None and mla.index_head_dim:
            # DeepSeek-V3.2: the cell size counts the latent at the cache dtype's element size and the indexer
            # key (pool_configurator.py); the fp8 pool stores 656 B latents, 80 B a token more than it counts.
            full += n * (kv.vector_bytes(mla.kv_lora_rank + mla.qk_rope_head_dim) + index_key_bytes(mla.index_head_dim))
            full_layers += n
        elif pool == "full":
            full += n * spec.kv_bytes_per_token(kv, attn_tp)
            full_layers += n
    return Cells(full, swa, state, full_layers, swa_layers, window)


# SGLang's state dtypes (configs/mamba_utils.py, server_args.py @0.5.2-0.5.23): the conv state in bfloat16
# whatever the model dtype (SGLANG_MAMBA_CONV_DTYPE); the SSM / recurrent state in --mamba-ssm-dtype, whose
# default is float32 (0.5.2-0.5.8; from 0.5.9 the config's mamba_ssm_dtype first, which Qwen3.5 sets to float32
# too). Qwen3-Next-80B at tp 1: conv 8,192 x 3 x 2 B + recurrent 32 x 128 x 128 x 4 B = 2,146,304 B a layer, where
# vLLM (bf16 model, no stated dtype) keeps 1,097,728.
_SGLANG_STATE_BYTES = {"conv": 2}
_SGLANG_SSM_BYTES = 4


def _sglang_state_bytes(spec: LayerSpec, tp: int) -> int:
    return sum(t.elements(tp) * _SGLANG_STATE_BYTES.get(t.name, _SGLANG_SSM_BYTES) for t in spec.state_tensors)


@dataclass(frozen=True)
class SglangReport:
    """What SGLang would report at start-up on one rank of the limiting pipeline stage."""

    defaults: GpuDefaults
    page_size: int
    total_memory_bytes: int
    context_bytes: int  # in use before SGLang measures free memory (context, NCCL)
    free_before_load_bytes: int
    weights_bytes: int
    available_kv_bytes: int  # `rest`: the memory the pools are cut from
    cells: Cells
    max_total_num_tokens: int
    swa_max_total_num_tokens: int
    mamba_slots: int
    profiled_tokens: int  # before --max-total-tokens and page rounding (negative when rest is)
    notes: tuple[str, ...] = ()

    @property
    def cell_size_bytes(self) -> int:
        return self.cells.full_bytes

    @property
    def swa_cell_size_bytes(self) -> int:
        return self.cells.swa_bytes

    @property
    def state_bytes(self) -> int:
        return self.cells.state_bytes

    @property
    def kv_pool_bytes(self) -> int:
        """What the pools take: K and V of every token slot, plus the state slots."""
        return self.token_pool_bytes + self.mamba_slots * self.cells.state_bytes

    @property
    def token_pool_bytes(self) -> int:
        """K and V of every token slot: what SGLang's "KV Cache is allocated" lines add up to (the state pool
        of a hybrid is allocated and logged apart)."""
        c = self.cells
        return self.max_total_num_tokens * c.full_bytes + self.swa_max_total_num_tokens * c.swa_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "sglang_release_rules": self.defaults.release.label,
            "mem_fraction_static": self.defaults.mem_fraction_static,
            "mem_fraction_rule": self.defaults.rule,
            "chunked_prefill_size": self.defaults.chunked_prefill_size,
            "cuda_graph_max_bs": self.defaults.cuda_graph_max_bs,
            "page_size": self.page_size,
            "total_memory_bytes": self.total_memory_bytes,
            "context_bytes": self.context_bytes,
            "free_before_load_bytes": self.free_before_load_bytes,
            "weights_bytes": self.weights_bytes,
            "free_after_load_bytes": self.free_before_load_bytes - self.weights_bytes,
            "available_kv_cache_bytes": self.available_kv_bytes,
            "cell_size_bytes": self.cell_size_bytes,
            "swa_cell_size_bytes": self.swa_cell_size_bytes,
            "state_bytes_per_request": self.state_bytes,
            "max_total_num_tokens": self.max_total_num_tokens,
            "swa_max_total_num_tokens": self.swa_max_total_num_tokens,
            "mamba_slots": self.mamba_slots,
            "kv_pool_bytes": self.kv_pool_bytes,
            "token_pool_bytes": self.token_pool_bytes,
        }


def _mamba_slots(rest: int, state: int, o: SglangOptions, p: Parallelism, rules: SglangRelease) -> int:
    """State slots taken off `rest` before the token pool is cut.

    0.5.3: max_mamba_cache_size = max_running_requests when given, else 512 (each divided over the DP-attention
    ranks). 0.5.23: when not given, the state pool's budget is rest x r / (1 + r) (r = mamba_full_memory_ratio,
    0.9) and the slots (budget - one slot) // one slot: rest 19 GiB, 30 MiB per slot -> budget 9.0 GiB -> 306
    slots.
    """
    dp = p.dp if p.dp_attention else 1
    if o.max_running_requests:
        return o.max_running_requests // dp
    if rules.mamba == "ratio":
        budget = max(0, rest) * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
        return max(0, int((budget - state) // state))
    return FIXED_MAMBA_SLOTS // dp


def _tokens(rest: int, c: Cells) -> tuple[int, int]:
    """(full-attention tokens, sliding-window tokens) that `rest` bytes hold.

    With a sliding-window pool (set_num_token_hybrid): the tokens every layer could hold, times the layers,
    shared out so each full-attention token brings swa_full_tokens_ratio sliding ones. Gemma-2-9B, 21 + 21
    layers of 8,192 B: rest // 344,064 B = N; full = int(N x 42 / (0.8 x 21 + 21)), sliding = int(full x 0.8).
    """
    if rest <= 0:
        cell = c.full_bytes + c.swa_bytes
        return (int(rest // cell) if cell else 0), 0
    if not c.swa_bytes:
        return (rest // c.full_bytes if c.full_bytes else 0), 0
    every = rest // (c.full_bytes + c.swa_bytes)
    layers = c.full_layers + c.swa_layers
    full = int(every * layers / (SWA_FULL_TOKENS_RATIO * c.swa_layers + c.full_layers))
    return full, int(full * SWA_FULL_TOKENS_RATIO)


def _page_size(o: SglangOptions, rules: SglangRelease) -> tuple[int, str | None]:
    page = o.page_size or 1
    rule = PAGE_RULES.get((o.attention_backend or "").lower()) if rules.first >= (0, 5, 3) else None
    if rule is not None and page not in rule[0]:
        return rule[1], (f"the {o.attention_backend} attention backend takes pages of "
                         f"{', '.join(map(str, rule[0]))} tokens: SGLang uses {rule[1]}, not {page}")
    return page, None


def _fp4_refusal(d: Deployment) -> str | None:
    """Where SGLang does not size a pool for --kv-cache-dtype fp4_e2m1 (FP4_KV_MLA, FP4_KV_MHA)."""
    if d.kv_cache_dtype.lower() != "fp4_e2m1" or not isinstance(d.engine, SglangOptions):
        return None
    release = release_of(d.engine.version)
    if release < FP4_KV_MLA:
        return f"SGLang {d.engine.version} has no fp4_e2m1 KV cache (from 0.5.4.post3); use fp8_e4m3."
    if d.model.geometry.mla is None and release < FP4_KV_MHA:
        return (f"SGLang {d.engine.version} sizes fp4_e2m1 pools for MLA models only (MHA from 0.5.5.post3); "
                "use fp8_e4m3.")
    return None


def plan_sglang(d: Deployment) -> SglangReport:
    """SGLang's token pools for `d` on the rank of its fullest pipeline stage."""
    o = d.engine
    if not isinstance(o, SglangOptions):
        raise TypeError("plan_sglang needs SGLang options")
    p, model = d.parallelism, d.model
    box: BoxTerms = box_terms(d.profile, d)
    defaults = gpu_defaults(d.gpu.smi_total_bytes, o, p, model)
    rules = defaults.release
    page, page_note = _page_size(o, rules)
    dtype = d.weights.dtype or serving_dtype(model.config_dtype)
    kv_name = d.kv_cache_dtype
    if model.geometry.mla is not None and model.geometry.mla.index_head_dim:
        kv_name = _dsa_kv_dtype(kv_name, rules, o.version, d.gpu.key, dtype)
        if d.gpu.vendor != "amd" and page != DSA_PAGE_TOKENS:
            page, page_note = DSA_PAGE_TOKENS, f"SGLang's DeepSeek-V3.2 pool takes {DSA_PAGE_TOKENS}-token pages"
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
    total = box.total_memory_bytes or d.gpu.total_memory_bytes
    nt = non_torch_for(d.gpu.key, p.tp, p.pp)
    context = nt.context_bytes + nt.before_snapshot_bytes if box.non_torch_bytes is None else box.non_torch_bytes
    # SGLang reads free memory itself (before loading and after), so another process's memory is simply gone.
    context += d.gpu_in_use_bytes
    free_before = total - context
    notes = [n for n in (page_note, *box.notes) if n]
    reports = []
    stage_layers = pp_stage_layers(model.num_layers, p.pp)
    elem = weight_dtype_bytes(dtype)
    for i, ((modelled, _), layers) in enumerate(zip(weights, stage_layers, strict=True)):
        # SGLang's weights are the drop in free memory: the allocator's segments, not the parameter bytes.
        tensors = loaded_tensor_bytes(model, layers, tp=p.tp, elem=elem, quant=model.quant, first=i == 0,
                                      last=i == len(stage_layers) - 1)
        rounding = segment_bytes(tensors) - sum(tensors) if tensors is not None else 0
        w = modelled + rounding if box.weights_bytes is None else box.weights_bytes
        rest = free_before - w - round(free_before * (1 - defaults.mem_fraction_static))
        c = _cells(model, layers, kv_name, dtype, attn_tp, rules.swa_pool)
        slots = _mamba_slots(rest, c.state_bytes, o, p, rules) if c.state_bytes else 0
        profiled, swa_tokens = _tokens(rest - slots * c.state_bytes, c)
        tokens = max(0, min(profiled, o.max_total_tokens or profiled))
        if c.swa_bytes and tokens != profiled:
            swa_tokens = int(tokens * SWA_FULL_TOKENS_RATIO)
        tokens -= tokens % page
        swa_tokens -= swa_tokens % page
        reports.append(SglangReport(defaults, page, total, context, free_before, w, rest, c, tokens, swa_tokens,
                                    slots, profiled, tuple(notes)))
    # Every stage runs the same requests: the stage with the fewest token slots limits them all.
    return min(reports, key=lambda r: (r.max_total_num_tokens, r.mamba_slots))


def max_running_requests(r: SglangReport, o: SglangOptions, p: Parallelism, context_len: int) -> int:
    """The scheduler's limit on requests at once (managers/tp_worker.py).

    Given: --max-running-requests (over the DP-attention ranks). Default: min(tokens // 2, the request table),
    the table holding min(max(int(tokens / context x 512), 2,048), 4,096) requests (fewer with state slots),
    one more in 0.4.x: QwQ-32B on 4 x L4, 46,611 tokens at context 131,072 -> table 2,048 -> 2,049 logged.
    """
    if o.max_running_requests:
        return max(1, o.max_running_requests // (p.dp if p.dp_attention else 1))
    tokens = r.max_total_num_tokens
    table = min(max(int(tokens / context_len * 512), 2048), 4096)
    if r.state_bytes:
        table = min(table, r.mamba_slots)
    return max(1, min(tokens // 2, table + r.defaults.release.request_table_extra))


def _refusal_words(r: SglangReport) -> str:
    f = r.defaults.mem_fraction_static
    style = r.defaults.release.refusal
    if style == "raise above":
        after = r.free_before_load_bytes - r.weights_bytes
        lowest = 1 - after / r.free_before_load_bytes if r.free_before_load_bytes else 1.0
        return (f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={f}. "
                f"Raise --mem-fraction-static above {lowest:.4f}.")
    if style == "current value":
        return ("Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                f"self.server_args.mem_fraction_static={f}")
    return "Not enough memory. Please try to increase --mem-fraction-static."


def _refusal(d: Deployment, r: SglangReport | None) -> Refusal | None:
    if d.kv_cache_dtype.lower() not in KV_CACHE_DTYPES:
        return Refusal(
            "kv_dtype",
            f"SGLang's --kv-cache-dtype takes {', '.join(KV_CACHE_DTYPES)}; not {d.kv_cache_dtype!r}.",
            "kv_cache_dtype",
        )
    fp4 = _fp4_refusal(d)
    if fp4 is not None:
        return Refusal("kv_dtype", fp4, "kv_cache_dtype")
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
        return Refusal("no_kv_memory", _refusal_words(r), "engine.mem_fraction_static")
    if r.max_total_num_tokens < d.max_model_len:
        return Refusal(
            "one_request",
            f"max_total_num_tokens={r.max_total_num_tokens:,} is below the context length {d.max_model_len:,}: "
            "SGLang starts, but cannot admit one request of that length.",
            "workload.max_model_len",
        )
    return None


def calibration(d: Deployment, rules: SglangRelease) -> Calibration:
    """Where the SGLang model was checked against held-out logs (benchmarks/results/sglang_accuracy.md)."""
    outside = []
    if rules.first not in LOGGED_RANGES:
        outside.append(f"releases {rules.label}+ (no SGLang logs)")
    if d.gpu.key not in LOGGED_GPUS:
        outside.append(f"GPU {d.gpu.key} (no SGLang logs)")
    if any(KIND_RULES[s.kind] == "state" for s in d.model.layers):
        outside.append("Mamba/linear-attention state pool (no logs with its size)")
    return Calibration(
        in_range=not outside,
        checked_on="SGLang 0.4.2-0.5.17 and 2026 builds, 15 held-out logs (benchmarks/results/sglang_accuracy.md)",
        outside=tuple(outside),
        error_band=f"token pool off by {A_MAE_PCT}% on average, {A_WORST_PCT}% at worst on {A_LOGS} logs from the "
                   f"box's measured free memory (a calibrated profile); end to end {B_MAE_PCT}% and {B_WORST_PCT}% "
                   f"on {B_LOGS} logs (the memory in use before loading and the weights are modelled)",
    )


class SglangEngine:
    """SGLang (sglang.launch_server), releases 0.3.0 to 0.5.23, each by its own rules."""

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
        version = release_text(release_of(o.version)) if o.version != CURRENT else CURRENT
        early = _refusal(d, None)
        if early is not None:
            return EngineAccount(
                engine=self.name, version=version, total_memory_bytes=d.gpu.total_memory_bytes, requested_bytes=0,
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
                units.append(min(cdiv(length, page), cdiv(r.cells.window_tokens, page) + 1) * page)
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
        cap = max_running_requests(r, o, d.parallelism, length)
        fraction = r.defaults.mem_fraction_static
        kept = r.free_before_load_bytes - round(r.free_before_load_bytes * (1 - fraction))
        terms = (
            MemoryTerm("context", r.context_bytes, "in use before SGLang measures free memory (context, NCCL"
                       + (", other processes)" if d.gpu_in_use_bytes else ")")),
            MemoryTerm("weights", r.weights_bytes, "weights as loaded on this rank, in whole allocator segments"),
            MemoryTerm("reserved", r.free_before_load_bytes - kept,
                       f"left outside mem_fraction_static {fraction:.3f} for activations, CUDA graphs and the "
                       "request table"),
        )
        refusal = _refusal(d, r)
        line = (f"max_total_num_tokens={tokens}, chunked_prefill_size={r.defaults.chunked_prefill_size}, "
                f"max_running_requests={cap}, context_len={length}, page_size={page}, "
                f"mem_fraction_static={fraction:.3f}")
        lines = [line]
        if o.max_total_tokens and r.profiled_tokens < o.max_total_tokens:
            lines.insert(0, f"max_total_tokens={o.max_total_tokens} is larger than the profiled value "
                            f"{r.profiled_tokens}. Use the profiled value instead.")
        notes = [f"SGLang {version} follows the rules read in {r.defaults.release.read_in}"]
        if not o.mem_fraction_static:
            reserved = r.defaults.reserved_mib
            notes.append(
                f"mem_fraction_static {fraction:.3f} is SGLang's default for a "
                f"{d.gpu.total_memory_bytes / GiB:,.1f} GiB card ({r.defaults.rule})"
                + (f": {reserved:,.0f} MiB reserved" if reserved is not None else "")
            )
        if r.state_bytes:
            notes.append(f"the Mamba/linear-attention state pool holds {r.mamba_slots:,} request slots of "
                         f"{r.state_bytes:,} B, taken off the KV memory first")
        notes.extend(r.notes)
        checked = calibration(d, r.defaults.release)
        if not checked.in_range:
            notes.append(f"outside the logs SGLang was checked on ({'; '.join(checked.outside)}): {checked.error_band}")
        return EngineAccount(
            engine=self.name,
            version=version,
            total_memory_bytes=r.total_memory_bytes,
            requested_bytes=kept + r.context_bytes,
            terms=terms,
            kv_budget_bytes=max(0, r.available_kv_bytes),
            pools=tuple(pools),
            max_model_len=length,
            request_cap=cap,
            engine_concurrency=tokens / length,
            kv_cache_tokens=tokens,
            refusal=refusal,
            log_lines=tuple(lines) if refusal is None else (*lines, f"Error: {refusal.message}"),
            notes=tuple(notes),
            detail=r.to_dict(),
            calibration=checked,
            per_request_at=per_request,
        )

