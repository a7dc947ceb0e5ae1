"""The attention backend vLLM 0.20+ picks for a model's K/V layers, and what FlashInfer adds to the CUDA-graph
estimate (docs/engine-rules.md 1.26).

Read in the 0.18-0.33 sdists (platforms/cuda.py _get_backend_priorities and get_valid_backends; v1/attention/
backends/flash_attn.py, flashinfer.py, triton_attn.py; utils/flashinfer.py; v1/worker/gpu_model_runner.py
profile_cudagraph_memory; config/compilation.py resolve_cudagraph_mode_and_sizes) and FlashInfer's decode.py
(0.6.6-0.6.18). The first backend in priority order that accepts the layers wins: FlashInfer, FlashAttention,
Triton on SM10x; FlashAttention, FlashInfer, Triton on every other CUDA GPU. FlashAttention is FA3 on SM90 and
FA2 elsewhere; only FA3 takes an fp8 cache (e4m3) or attention sinks. So FlashInfer runs an fp8 cache on A100,
L40S, RTX 4090 or RTX 5090, and everything but sinks on B200.

The estimate (V1 0.20+, Model Runner V2 0.29+) measures free device memory around the first two captures of
each mode. Piecewise warm-ups run no attention; the first FULL decode warm-up runs FlashInfer and allocates:
  native decode (A100-RTX 5090; SM120 to 0.27): the builder's float workspace, 394 MiB (0.26+: at least
    max_num_batched_tokens x query heads a rank x head size x 16 B), and one 8 MiB int workspace per FULL
    size (a decode wrapper each), for every KV-cache group's builder; Model Runner V2 allocates the float
    workspace before the window;
  TensorRT-LLM-gen (SM100) or XQA (SM90 from 0.25, SM120 from 0.28) decode: one 394 MiB global workspace.
Native decode graphs hold one token a request, so with speculative decoding vLLM drops FULL graphs and
captures piecewise ones only (AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE).
"""

from __future__ import annotations

from kvplan.engines.vllm_kv import KvCacheLayout
from kvplan.engines.vllm_versions import VllmRules
from kvplan.model.kinds import LayerKind
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass
from kvplan.units import MiB

FLASHINFER_WORKSPACE_BYTES = 394 * MiB  # VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE's default, 413,138,944 B
FLASHINFER_PREFILL_BYTES_PER_ELEM = 16  # FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM (0.26+)
FLASHINFER_WRAPPER_BYTES = 8 * MiB  # a decode wrapper's int workspace (flashinfer/decode.py, 8 x 1024 x 1024)

# model_type values vLLM treats as prefix LMs over their image tokens (MM_PREFIX_LM_MODELS, 0.13+; moondream3 from
# 0.30).
MM_PREFIX_MODEL_TYPES = ("bagel", "gemma3", "molmo2", "moondream3", "paligemma", "umm")
# The layers vLLM runs through FlashAttention / FlashInfer / Triton; MLA has its own backends.
_KV_KINDS = (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL)
_FP8 = ("fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class AttentionPath:
    """The backend of the model's K/V layers and, for FlashInfer, how it decodes."""

    backend: str  # "FLASH_ATTN", "FLASHINFER", "TRITON_ATTN" or "TURBOQUANT"
    head_size: int  # the K/V layers' widest head
    decode: str = "native"  # FlashInfer's decode kernel: "native", "trtllm" (SM100) or "xqa" (SM90 / SM120)

    @property
    def flashinfer_native(self) -> bool:
        return self.backend == "FLASHINFER" and self.decode == "native"

    def full_graphs_with_drafts(self, major: int) -> bool:
        """Whether FULL decode graphs survive speculative decoding: FlashInfer's native decode and SM90's XQA
        support single-token decode only; FlashAttention and Triton any uniform batch."""
        return not (self.backend == "FLASHINFER" and (self.decode == "native" or major == 9))

    @property
    def label(self) -> str:
        if self.backend != "FLASHINFER":
            return self.backend
        return {"native": "FLASHINFER", "trtllm": "FLASHINFER (TRT-LLM decode)", "xqa": "FLASHINFER (XQA decode)"}[
            self.decode]


def attention_path(
    model: ModelSpec, rules: VllmRules, capability: tuple[int, int] | None, kv_cache_dtype: str, dtype: str,
) -> AttentionPath | None:
    """The backend 0.20+ picks on a CUDA GPU of `capability` for the model's K/V layers; None where kvplan does
    not pick one (releases before 0.20, whose estimate stays off the budget; AMD or unknown GPUs; models without
    K/V layers, MLA included). Llama-3.1-8B with an fp8 cache on an L40S (8.9): FLASHINFER, native decode."""
    if not rules.flashinfer_workspace or capability is None:
        return None
    heads = {model.geometry.head_dims[i] for i, spec in enumerate(model.layers) if spec.kind in _KV_KINDS}
    if not heads:
        return None
    head = max(heads)
    # A multimodal model whose image tokens attend both ways (ModelArchConfigConvertor.is_mm_prefix_lm: Gemma 3,
    # PaliGemma, ...) takes a backend with supports_mm_prefix, Triton or Flex; so does a float32 model, which
    # FlashAttention and FlashInfer do not take (supported_dtypes). The 0.19 fit logs print it: "Using
    # TRITON_ATTN attention backend out of potential backends: ['TRITON_ATTN', 'FLEX_ATTENTION']" for
    # gemma-3-4b-it and for Llama-3.1-8B in float32. (0.30 adds hybrid Triton backends for these on SM90 and
    # SM10x, whose buffers are not read: kvplan plans them as Triton.)
    if model.model_type in MM_PREFIX_MODEL_TYPES or dtype == "float32":
        return AttentionPath("TRITON_ATTN", head)
    sinks = model.attention_sinks
    # vLLM's own quantized caches (vllm_kv_quant): the per-token-head kinds run on Triton, TurboQuant on its
    # backend, NVFP4 on FlashInfer only.
    if kv_cache_dtype.endswith("_per_token_head") or kv_cache_dtype.startswith("turboquant_"):
        return AttentionPath("TURBOQUANT" if kv_cache_dtype.startswith("turboquant_") else "TRITON_ATTN", head)
    fp8 = kv_cache_dtype in _FP8 or kv_cache_dtype.startswith("nvfp4")
    major = capability[0]
    flashinfer_heads = (64, 128, 256, 512) if rules.flashinfer_head_512 else (64, 128, 256)
    flashinfer = (rules.flashinfer_min_capability <= capability <= (12, 1) and head in flashinfer_heads
                  and (not sinks or major in rules.flashinfer_sink_majors))
    # FA3 (SM90) alone takes fp8 e4m3 and sinks; FA2 needs SM80 and a head of at most 256 in steps of 8.
    flash_attn = (capability >= (8, 0) and head % 8 == 0 and head <= 256
                  and (not fp8 or (major == 9 and kv_cache_dtype == "fp8_e4m3")) and (not sinks or major == 9))
    order = ("FLASHINFER", "FLASH_ATTN") if major == 10 else ("FLASH_ATTN", "FLASHINFER")
    valid = {"FLASHINFER": flashinfer, "FLASH_ATTN": flash_attn}
    backend = next((b for b in order if valid[b]), "TRITON_ATTN")
    if backend == "FLASHINFER" and major == 10:
        return AttentionPath(backend, head, "trtllm")
    if backend == "FLASHINFER" and major in rules.xqa_majors:
        return AttentionPath(backend, head, "xqa")
    return AttentionPath(backend, head)


def flashinfer_workspace_bytes(
    rules: VllmRules, *, max_num_batched_tokens: int, heads_per_rank: int, head_size: int,
) -> int:
    """The builder's float workspace: 394 MiB to 0.25; from 0.26 at least the prefill chunk's heads x 16 B.
    Qwen3-32B at tp 1 (64 heads of 128) with 16,384-token steps: 16,384 x 64 x 128 x 16 = 2 GiB."""
    if rules.flashinfer_workspace == "step":
        step = max_num_batched_tokens * heads_per_rank * head_size * FLASHINFER_PREFILL_BYTES_PER_ELEM
        return max(FLASHINFER_WORKSPACE_BYTES, step)
    return FLASHINFER_WORKSPACE_BYTES


def kv_attention_groups(layout: KvCacheLayout) -> int:
    """The KV-cache groups of K/V attention layers on a rank: V1 builds one attention metadata builder per
    group and backend (gpu_model_runner.initialize_attn_backend), each with its own FlashInfer workspace and
    decode wrappers. gpt-oss: a sliding and a full group, 2; a DeltaNet hybrid: its attention group, 1."""
    return sum(1 for g in layout.groups if g.kind in _KV_KINDS)


def flashinfer_graph_bytes(
    path: AttentionPath | None, rules: VllmRules, *, runner: str, full_graphs: int, max_num_batched_tokens: int,
    heads_per_rank: int, builders: int = 1,
) -> int:
    """What FlashInfer adds to the CUDA-graph estimate through the first FULL warm-up (0 without FULL graphs).

    Qwen3.8-27B at tp 2 on two RTX 5090s, fp8 cache, 0.27.1 (native decode, one attention group, 35 FULL
    sizes, 12 heads of 256 a rank, 8,192-token steps): max(413,138,944, 8,192 x 12 x 256 x 16 = 402,653,184)
    + 35 x 8 MiB = 413,138,944 + 293,601,280 = 706,740,224 B (0.66 GiB). Native decode pays it per builder;
    the TensorRT-LLM-gen / XQA workspace is one module global."""
    if path is None or path.backend != "FLASHINFER" or not full_graphs:
        return 0
    if not path.flashinfer_native:
        return FLASHINFER_WORKSPACE_BYTES
    wrappers = full_graphs * FLASHINFER_WRAPPER_BYTES
    if runner == "v2":  # init_attn_backend allocates the shared workspace before the measured window
        return builders * wrappers
    return builders * (wrappers + flashinfer_workspace_bytes(
        rules, max_num_batched_tokens=max_num_batched_tokens, heads_per_rank=heads_per_rank,
        head_size=path.head_size))
