"""When vLLM caches an MLA model's per-head K and V instead of its latent, and what MLA layers keep after loading.

DeepSeek-V2/V3 run on vLLM's plain attention path wherever ModelConfig.use_mla is false: every release before
0.7.1 (there was no MLA cache yet), 0.7.1-0.7.2 for a checkpoint quantized other than fp8 (config.py
`use_mla`: "MLA is not supported with %s quantization. Disabling MLA."), and wherever the user sets
VLLM_MLA_DISABLE=1. That path (DeepseekV2Attention) caches K and V for every head:
`Attention(num_local_heads, qk_head_dim, num_kv_heads=num_local_heads)`, V padded to K's width, and V0's
CacheEngine sizes it by ModelConfig.get_head_size(), which 0.6.x hard-codes to 256 ("FlashAttention supports
only head_size 32, 64, 128, 256") and 0.7.0 makes qk_nope + qk_rope_head_dim. DeepSeek-V3 with an AWQ
checkpoint on 0.7.2, one GPU: 128 heads x 2 x 192 x 2 B = 98,304 B a token a layer, 85x the latent's 1,152 B.

Where MLA is on, its layers keep decode matrices beside the checkpoint's weights (mla_kept_bytes).
"""

from __future__ import annotations

from kvplan.engines.vllm_versions import VllmRules
from kvplan.errors import FieldError
from kvplan.hardware.gpus import COMPUTE_CAPABILITY
from kvplan.model.dtypes import weight_dtype_bytes
from kvplan.model.quant import exclusion_predicate
from kvplan.model.specs import FullAttentionSpec, LayerKind, LayerSpec, ModelSpec, QuantSpec
from kvplan.units import cdiv

# The only quantization 0.7.1-0.7.2 keep MLA for, as kvplan reads checkpoints: "fp8". The same check keeps
# compressed-tensors when every group's weights and input activations have type "fp8"; compressed-tensors
# writes "int" or "float" there (kvplan refuses anything else), so those checkpoints lose MLA too.
MLA_QUANTIZATIONS = ("fp8",)


def dense_mla_reason(model: ModelSpec, rules: VllmRules, version: str, quantization: str | None, *,
                     disabled: bool = False) -> str | None:
    """Why this release caches the MLA model's per-head K/V, or None where it caches the latent (or the model
    has no MLA layer). `quantization`: the checkpoint's method, else --quantization. `disabled`: the user set
    VLLM_MLA_DISABLE=1 (envs.py from 0.7.1; ModelConfig.use_mla is then false in every release)."""
    if not any(spec.kind == LayerKind.MLA for spec in model.layers):
        return None
    if not rules.mla_latent:
        reason = f"vLLM {version} has no MLA cache (it came in 0.7.1)"
    elif disabled:
        reason = "VLLM_MLA_DISABLE=1 turns MLA off"
    elif rules.mla_quant_gate and quantization is not None and quantization not in MLA_QUANTIZATIONS:
        reason = f"vLLM {version} turns MLA off for {quantization} weights (fp8 only until 0.7.3)"
    else:
        return None
    if model.model_type not in rules.mla_dense_types:
        raise FieldError("engine.version", f"{reason}; kvplan models the per-head cache it falls back to for "
                         f"{', '.join(rules.mla_dense_types)} only, not {model.model_type} (vLLM registers "
                         "DeepSeek-V3 from 0.6.6)", version)
    return reason


def dense_mla_layer(spec: LayerSpec, model: ModelSpec, rules: VllmRules) -> LayerSpec:
    """The per-head K/V layer the plain attention path caches in place of an MLA layer."""
    if spec.kind != LayerKind.MLA:
        return spec
    mla = model.geometry.mla
    assert mla is not None  # read_geometry reads the MLA dims whenever a layer is MLA
    head = rules.mla_dense_head or mla.qk_nope_head_dim + mla.qk_rope_head_dim
    return FullAttentionSpec(num_kv_heads=model.num_attention_heads, head_dim=head)


def mla_kept_bytes(model: ModelSpec, rules: VllmRules, *, dtype: str, tp: int, quantization: str | None) -> int:
    """Bytes one MLA layer keeps on one TP rank beside its checkpoint weights once process_weights_after_loading
    has run (inside the load vLLM measures as the model's weights). H heads a rank, latent L, nope N, rope R,
    V width, q input Q (q_lora_rank, else hidden), hidden D, model dtype a bytes:

    - 0.7.1-0.7.3 (attention/backends/mla/utils.py, VLLM_MLA_PERFORM_MATRIX_ABSORPTION on by default) absorb
      W_UK into the query projection and W_UV into o_proj for decode, beside the raw weights prefill keeps:
      W_QR (Q x H x R, dtype a), W_Q_UK (Q x H x L) and W_UV_O (H x L x D), requantized to fp8 with the
      checkpoint's scale blocks for an fp8 checkpoint, else in dtype a; a quantized kv_b_proj stays dequantized
      behind the W_UK / W_UV views, in float32 in 0.7.1-0.7.2 (scaled_dequantize), in dtype a in 0.7.3.
      DeepSeek-V3 in bf16 at tp 8: 1,536 x 16 x 64 x 2 + 1,536 x 16 x 512 x 2 + 16 x 512 x 7,168 x 2 =
      145,752,064 B a layer, 8.28 GiB over 61 layers.
    - 0.8+ (mla/common.py, later mla_attention.py) keep only W_UK_T and W_UV, views of kv_b_proj: a copy
      L x H x (N + V) in dtype a where kv_b_proj is quantized, none where it is not. DeepSeek-R1 (fp8) at tp 8:
      512 x 16 x 256 x 2 = 4,194,304 B a layer.
    """
    mla = model.geometry.mla
    if rules.mla_weights == "none" or mla is None:
        return 0
    first = next(i for i, spec in enumerate(model.layers) if spec.kind == LayerKind.MLA)
    quant = model.quant
    kv_b_quantized = (quantization is not None if quant is None
                      else not exclusion_predicate(quant)(f"model.layers.{first}.self_attn.kv_b_proj"))
    act = weight_dtype_bytes(dtype)
    heads = model.num_attention_heads // tp
    kv_b = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    if rules.mla_weights == "kv_b":
        return kv_b * act if kv_b_quantized else 0
    q_in = mla.q_lora_rank or model.hidden_size
    dequant = (4 if rules.mla_weights == "absorbed_fp32" else act) if kv_b_quantized else 0
    fp8 = kv_b_quantized and (quant.method if quant is not None else quantization) == "fp8"
    kept = q_in * heads * mla.qk_rope_head_dim * act + kv_b * dequant
    for rows, cols in ((q_in, heads * mla.kv_lora_rank), (heads * mla.kv_lora_rank, model.hidden_size)):
        kept += rows * cols * (1 if fp8 else act) + (_fp8_scale_bytes(rows, cols, quant) if fp8 else 0)
    return kept


def _fp8_scale_bytes(rows: int, cols: int, quant: QuantSpec | None) -> int:
    """float32 scales of a requantized fp8 matrix: one per block of a block-scaled checkpoint (128 x 128 for
    DeepSeek-V3), one for the tensor otherwise."""
    block = quant.block_shape if quant is not None else None
    return 4 * (cdiv(rows, block[0]) * cdiv(cols, block[1]) if block else 1)


def mla_block_size(rules: VllmRules, gpu_key: str, kv_cache_dtype: str, given: int | None) -> int | None:
    """The block size vLLM gives an MLA model's cache, or None to keep the given (else default 16) one.

    - 0.8.0-0.17.1 (platforms/cuda.py check_and_update_config): FlashMLA on Hopper forces 64; from 0.10.2
      CUTLASS MLA on SM100 forces 128; a given size stands only if it is the forced one (a multiple of it
      from 0.11.1).
    - 0.18+ (Platform's block-size choice): a given size stands; otherwise the first MLA backend of
      _get_backend_priorities prefers its smallest supported size: FLASH_ATTN_MLA 16 on Hopper (FLASHMLA 64
      with an fp8 cache, which FLASH_ATTN_MLA does not take), FLASHINFER_MLA 32 on SM100, TRITON_MLA 16
      elsewhere.
    """
    capability = COMPUTE_CAPABILITY.get(gpu_key)
    if rules.mla_block_rule == "none" or capability is None:
        return None
    hopper, sm100 = capability[0] == 9, capability[0] == 10
    if rules.mla_block_rule == "preferred":
        if given is not None:
            return None
        return (64 if kv_cache_dtype.startswith("fp8") else 16) if hopper else 32 if sm100 else None
    forced = 64 if hopper else 128 if sm100 and rules.mla_block_rule != "flashmla" else None
    if forced is None or given == forced or (given and rules.mla_block_rule == "forced_multiple"
                                             and given % forced == 0):
        return None
    return forced
