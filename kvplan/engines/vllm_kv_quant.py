"""vLLM 0.20+'s quantized KV caches beyond fp8: per-token-head int8/fp8/int4, NVFP4 and TurboQuant
(docs/engine-rules.md 1.27, read from the 0.20.0-0.33.0 sdists).

The bytes a token takes are kvplan.model.dtypes' (KvDtype.head_bytes); this module holds what else the release
does with them: where vLLM has no backend for the layer or the GPU (a refusal with the fix), the layers
TurboQuant leaves in the model dtype, the block it then takes, and the buffers it builds beside the weights.
"""

from __future__ import annotations

from kvplan.engines.release import Release, parse_release
from kvplan.engines.vllm_versions import VllmRules
from kvplan.model.dtypes import TURBOQUANT, UNSIZED_KV_DTYPES, VLLM_KV_DTYPES, kv_dtype_problem
from kvplan.model.specs import LayerKind, ModelSpec
from kvplan.units import round_up

NVFP4 = ("nvfp4", "nvfp4_4over6")
# TurboQuant keeps the first and last BOUNDARY layers of a dense model in the model dtype
# (TurboQuantConfig.get_boundary_skip_layers, n = min(2, layers // 2)).
BOUNDARY = 2
# 0.20.0 registers decode buffers in every TurboQuant layer (attention.py _init_turboquant_buffers), with
# tq_max_kv_splits_for_cuda_graph splits: 4 x seqs x query heads x (32 x (D + 1) + D + 1) B a layer.
TQ_SPLITS = 32

_SINCE: dict[str, Release] = {
    "nvfp4": (0, 21, 0),  # 0.20 has no backend that runs it; 0.21 FlashInfer on SM100 (flashinfer.py)
    "tq_hybrid": (0, 21, 0),  # 0.20 refuses hybrids (arg_utils.py); 0.21 quantizes every attention layer
    "tq_workspace": (0, 21, 0),  # the per-layer buffers move to the shared workspace, outside the budget
    "fa3_fixed": (0, 22, 0),  # 0.20-0.21: FA3 claims the per-token-head and nvfp4 caches on SM90, then fails
    "fp8_head_sm89": (0, 24, 0),  # Triton's fp8 per-token-head store needs SM89+
    "tq_block_32": (0, 25, 0),  # _align_heterogeneous_kv_block_size: the quantized page covers a bf16 one
    "int4_window": (0, 28, 0),  # 0.25-0.27 size int4 sliding-window pages as int8
    "nvfp4_any_gpu": (0, 32, 0),  # plain nvfp4 also on SM80/90/120 (not head 64, not sinks)
    "int4_any_head": (0, 32, 0),  # before, the Hadamard rotation needs a power-of-two head
}


def _release(version: str, rules: VllmRules) -> Release:
    return parse_release(version) or rules.since


def _has(model: ModelSpec, *kinds: LayerKind) -> bool:
    return any(spec.kind in kinds for spec in model.layers)


def quant_kv_refusal(model: ModelSpec, rules: VllmRules, version: str, kv_name: str, *,
                     capability: tuple[int, int] | None, vendor: str, dtype: str) -> str | None:
    """Why vLLM `version` cannot run this cache for `model` on the GPU (as its backend selection or config
    check says it), with the fix; None where it can, or where the dtype is not one of these."""
    name = kv_name.lower()
    if name in UNSIZED_KV_DTYPES:
        return f"--kv-cache-dtype {name}: {kv_dtype_problem(name)}"
    if name not in VLLM_KV_DTYPES and name != "nvfp4":
        return None
    release = _release(version, rules)
    fix = "use --kv-cache-dtype fp8 or auto"
    if vendor != "nvidia":
        return f"kvplan reads --kv-cache-dtype {name} from vLLM's CUDA backends only; {fix}"
    if _has(model, LayerKind.MLA, LayerKind.COMPRESSED_MLA):
        return (f"vLLM has no MLA attention backend that takes --kv-cache-dtype {name} (No valid attention backend "
                f"found); {fix}")
    heads = {model.geometry.head_dims[i] for i, spec in enumerate(model.layers) if hasattr(spec, "num_kv_heads")}
    sliding = _has(model, LayerKind.SLIDING_WINDOW, LayerKind.CHUNKED_LOCAL)
    major = capability[0] if capability else None
    if name in TURBOQUANT:
        if sliding:
            return f"TurboQuant has no sliding-window attention (sliding window not supported); {fix}"
        if model.attention_sinks:
            return f"TurboQuant has no attention sinks (attention sinks not supported); {fix}"
        if dtype == "float32":
            return f"TurboQuant runs float16 or bfloat16 models only; add --dtype bfloat16 or {fix}"
        if release < _SINCE["tq_hybrid"] and _has(model, LayerKind.MAMBA, LayerKind.LINEAR_ATTENTION):
            return ("TurboQuant KV cache is not supported for hybrid (attention + Mamba) models before vLLM 0.21; "
                    f"upgrade or {fix}")
        return None
    if major == 9 and release < _SINCE["fa3_fixed"]:
        return (f"vLLM {version}'s FlashAttention 3 claims --kv-cache-dtype {name} on Hopper and its cache view "
                f"fails (fixed in 0.22); upgrade, or {fix}")
    if name == "fp8_per_token_head" and release >= _SINCE["fp8_head_sm89"] and capability and capability < (8, 9):
        return f"FP8 KV cache is not supported by the Triton attention backend below SM89; {fix}"
    if name == "int4_per_token_head":
        if release < _SINCE["int4_any_head"] and any(h & (h - 1) for h in heads):
            return (f"int4_per_token_head needs a power-of-two head size before vLLM 0.32 (heads {sorted(heads)}); "
                    f"{fix}")
        if sliding and release < _SINCE["int4_window"]:
            return f"vLLM {version} sizes int4_per_token_head sliding-window pages as int8 (fixed in 0.28); {fix}"
    if name in NVFP4:
        if release < _SINCE["nvfp4"]:
            return f"vLLM {version} has no attention backend that runs nvfp4 (from 0.21, on Blackwell); {fix}"
        anywhere = (name == "nvfp4" and release >= _SINCE["nvfp4_any_gpu"] and 64 not in heads
                    and not model.attention_sinks)
        if major != 10 and not (anywhere and capability is not None and capability >= (8, 0)):
            return (f"--kv-cache-dtype {name} runs on FlashInfer's SM100 path here (No valid attention backend "
                    f"found); {fix}")
    return None


def boundary_layers(model: ModelSpec, kv_name: str) -> frozenset[int]:
    """The layers TurboQuant leaves in the model dtype: the first and last two of a dense model (a hybrid keeps
    none from 0.21, where it is taken). Llama-3.1-8B: 0, 1, 30, 31."""
    if kv_name.lower() not in TURBOQUANT or _has(model, LayerKind.MAMBA, LayerKind.LINEAR_ATTENTION):
        return frozenset()
    n = min(BOUNDARY, model.num_layers // 2)
    return frozenset(range(n)) | frozenset(range(model.num_layers - n, model.num_layers))


def quant_block_size(model: ModelSpec, rules: VllmRules, version: str, kv_name: str, block_size: int) -> int:
    """The block a dense TurboQuant model takes from 0.25: its quantized page must cover a bf16 page of the
    first layer's 16-token kernel block, so A x cdiv(32, A) tokens with A = max(16, block): 16 -> 32."""
    if not boundary_layers(model, kv_name) or _release(version, rules) < _SINCE["tq_block_32"]:
        return block_size
    return round_up(32, max(16, block_size))


def quant_buffer_bytes(model: ModelSpec, rules: VllmRules, version: str, kv_name: str, *, stages: list[range],
                       tp: int, capability: tuple[int, int] | None, max_num_seqs: int,
                       max_num_batched_tokens: int) -> int:
    """What these caches build beside the weights on the fullest rank (inside "Model loading took"): 0.20's
    TurboQuant decode buffers in each quantized layer, 4 x seqs x query heads x (32 x (D + 1) + D + 1) B (Llama-
    3.1-8B at 256 sequences: 139,493,376 B a layer), and on FlashInfer's SM100 path an fp8 output buffer in each
    attention layer, steps x query heads x head size (at 8,192 tokens: 32 MiB a layer)."""
    name = kv_name.lower()
    release = _release(version, rules)
    q_heads = max(1, model.num_attention_heads // tp)
    head = max(model.geometry.head_dims)
    attention = [i for i, spec in enumerate(model.layers) if hasattr(spec, "num_kv_heads")]
    if name in TURBOQUANT and release < _SINCE["tq_workspace"]:
        kept = boundary_layers(model, name)
        quantized = max(sum(1 for i in attention if i in stage and i not in kept) for stage in stages)
        return quantized * 4 * max_num_seqs * q_heads * (TQ_SPLITS * (head + 1) + head + 1)
    if name in NVFP4 and release >= _SINCE["nvfp4"] and capability is not None and capability[0] == 10:
        widest = max(sum(1 for i in attention if i in stage) for stage in stages)
        return widest * max_num_batched_tokens * q_heads * head
    return 0


def quant_note(model: ModelSpec, rules: VllmRules, version: str, kv_name: str, *, tp: int, block_size: int,
               max_num_seqs: int, max_model_len: int) -> str | None:
    """The plan's note on a TurboQuant cache: the layers it leaves in the model dtype, the block it takes, and
    from 0.21 the decode and prefill workspace its builder takes outside the budget (read, not measured)."""
    name = kv_name.lower()
    if name not in TURBOQUANT:
        return None
    kept = sorted(boundary_layers(model, name))
    out = (f"TurboQuant keeps layers {', '.join(map(str, kept))} in the model dtype and runs the others on its own "
           f"backend, in {block_size}-token blocks" if kept else "TurboQuant quantizes every attention layer")
    if _release(version, rules) >= _SINCE["tq_workspace"]:
        q_heads, head = max(1, model.num_attention_heads // tp), max(model.geometry.head_dims)
        kv_heads = max(1, max(getattr(s, "num_kv_heads", 0) for s in model.layers) // tp)
        decode = max_num_seqs * q_heads * (TQ_SPLITS * (head + 1) * 4 + head * 2 + 4)
        prefill = 2 * kv_heads * round_up(max_model_len - 1, block_size) * head * 2
        out += (f"; its shared workspace (about {max(decode, prefill) / 2**30:.2f} GiB here) is allocated after the "
                "KV cache is sized, in the share --gpu-memory-utilization leaves")
    return out
