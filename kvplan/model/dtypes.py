"""Element types for weights and for the KV cache, with the bytes (and scale bytes) each one costs.

Pure data: no torch. A KV dtype says how many bytes one token's K (or V) vector of one head takes,
including any scales the format stores beside the values.
"""

from __future__ import annotations

from kvplan.errors import InputError
from kvplan.records import dataclass
from kvplan.units import cdiv, round_up


@dataclass(frozen=True)
class KvDtype:
    """A KV-cache element format.

    bits: storage bits per element. scale_bytes: bytes of scale/zero-point stored per group of
    `group_elems` elements (group_elems None = one group per token-head vector). Example: int8 with
    one fp32 scale per token and head stores a 128-wide head in 128 + 4 = 132 bytes.
    """

    name: str
    bits: int
    scale_bytes: int = 0
    group_elems: int | None = None
    scales_note: str = "no scales"
    # Formats that store K and V unlike each other (vLLM's TurboQuant): V's bits, the bytes each vector adds
    # beyond its values and scales (norms, scale and zero point), and the alignment of one head's K + V slot.
    value_bits: int | None = None
    key_extra_bytes: int = 0
    value_extra_bytes: int = 0
    slot_align: int = 1

    def vector_bytes(self, n_elems: int, bits: int | None = None) -> int:
        """Bytes for one token's vector of `n_elems` values (one head's K or V, or one MLA latent)."""
        data = cdiv(n_elems * (bits or self.bits), 8)
        if self.scale_bytes == 0:
            return data
        groups = 1 if self.group_elems is None else cdiv(n_elems, self.group_elems)
        return data + groups * self.scale_bytes

    def head_bytes(self, k_dim: int, v_dim: int) -> int:
        """One token's K and V of one head. TurboQuant 3-bit keys with 4-bit values at D = 128 (vLLM's
        turboquant_k3v4_nc): (48 + a 2 B norm) + (64 + a 2 B scale and a 2 B zero point) = 118 B, even already."""
        slot = (self.vector_bytes(k_dim) + self.key_extra_bytes
                + self.vector_bytes(v_dim, self.value_bits) + self.value_extra_bytes)
        return round_up(slot, self.slot_align)

    @property
    def element_bytes_label(self) -> str:
        return f"{self.bits / 8:g} B/elem" + ("" if not self.scale_bytes else f" + {self.scales_note}")


FLOAT32 = KvDtype("float32", 32)
FLOAT16 = KvDtype("float16", 16)
BFLOAT16 = KvDtype("bfloat16", 16)
# vLLM's fp8 KV keeps one fp32 scale per layer for K and one for V (k_scale, v_scale), stored with the
# weights, so the cache itself carries 1 byte per element and no per-token scale.
FP8_E4M3 = KvDtype("fp8_e4m3", 8, scales_note="per-tensor k/v scales kept with the weights (0 B/token)")
FP8_E5M2 = KvDtype("fp8_e5m2", 8, scales_note="per-tensor k/v scales kept with the weights (0 B/token)")
# int8 per token and head: one fp32 scale for each token's head vector (vLLM's per-token-head kinds:
# 2 * block * H_kv * 4 bytes of scales per block for K and V together).
INT8 = KvDtype("int8", 8, scale_bytes=4, scales_note="one fp32 scale per token per head (4 B)")
# int4 asymmetric per token and head: an fp16 scale and an fp16 zero point per token-head vector.
INT4 = KvDtype("int4", 4, scale_bytes=4, scales_note="fp16 scale + fp16 zero point per token per head (4 B)")
# NVFP4: 4-bit values with one fp8 scale per 16 values: D/2 + D/16 bytes per head vector.
NVFP4 = KvDtype("nvfp4", 4, scale_bytes=1, group_elems=16, scales_note="one fp8 scale per 16 values")

# vLLM 0.20+'s own quantized caches (vllm/config/cache.py CacheDType; layouts in vllm_kv_quant and
# docs/engine-rules.md 1.27). Per token and head: one fp32 scale inline for K and one for V.
INT8_PER_TOKEN_HEAD = KvDtype("int8_per_token_head", 8, scale_bytes=4, scales_note="one fp32 scale per token and "
                              "head, K and V each (4 B)")
FP8_PER_TOKEN_HEAD = KvDtype("fp8_per_token_head", 8, scale_bytes=4, scales_note="one fp32 scale per token and "
                             "head, K and V each (4 B)")
INT4_PER_TOKEN_HEAD = KvDtype("int4_per_token_head", 4, scale_bytes=4, scales_note="a 4 B scale per token and "
                              "head, K and V each")
NVFP4_4OVER6 = KvDtype("nvfp4_4over6", 4, scale_bytes=1, group_elems=16, scales_note="one fp8 scale per 16 values")
# TurboQuant (turboquant/config.py TQ_PRESETS, slot_size_aligned): keys fp8 (k8v4) or Lloyd-Max codes with an
# fp16 norm, values as codes with an fp16 scale and zero point, the head's slot rounded up to even bytes.
_TQ_VALUES = "values with an fp16 scale and zero point"
TURBOQUANT = {
    "turboquant_k8v4": KvDtype("turboquant_k8v4", 8, value_bits=4, value_extra_bytes=4, slot_align=2,
                               scales_note=f"fp8 keys; 4-bit {_TQ_VALUES}"),
    "turboquant_4bit_nc": KvDtype("turboquant_4bit_nc", 4, value_bits=4, key_extra_bytes=2, value_extra_bytes=4,
                                  slot_align=2, scales_note=f"4-bit keys with an fp16 norm; 4-bit {_TQ_VALUES}"),
    "turboquant_k3v4_nc": KvDtype("turboquant_k3v4_nc", 3, value_bits=4, key_extra_bytes=2, value_extra_bytes=4,
                                  slot_align=2, scales_note=f"3-bit keys with an fp16 norm; 4-bit {_TQ_VALUES}"),
    "turboquant_3bit_nc": KvDtype("turboquant_3bit_nc", 3, value_bits=3, key_extra_bytes=2, value_extra_bytes=4,
                                  slot_align=2, scales_note=f"3-bit keys with an fp16 norm; 3-bit {_TQ_VALUES}"),
}
# SGLang's fp4_e2m1 (torch.float4_e2m1fn_x2): its cell size counts one scale byte per 16 values.
FP4_E2M1 = KvDtype("fp4_e2m1", 4, scale_bytes=1, group_elems=16, scales_note="one scale byte per 16 values")
VLLM_KV_DTYPES: dict[str, KvDtype] = {
    d.name: d for d in (INT8_PER_TOKEN_HEAD, FP8_PER_TOKEN_HEAD, INT4_PER_TOKEN_HEAD, NVFP4_4OVER6,
                        *TURBOQUANT.values())
}

_KV_ALIASES: dict[str, KvDtype] = {
    "fp32": FLOAT32,
    "float32": FLOAT32,
    "float": FLOAT32,
    "fp16": FLOAT16,
    "float16": FLOAT16,
    "half": FLOAT16,
    "bf16": BFLOAT16,
    "bfloat16": BFLOAT16,
    "fp8": FP8_E4M3,
    "fp8_e4m3": FP8_E4M3,
    "fp8_e4m3fn": FP8_E4M3,
    "fp8_e5m2": FP8_E5M2,
    "int8": INT8,
    "int4": INT4,
    "nvfp4": NVFP4,
    "fp4_e2m1": FP4_E2M1,
    **VLLM_KV_DTYPES,
}
# Names vLLM takes that kvplan does not size: ROCm-only formats and DeepSeek-V3.2's NVFP4 latent (vllm_kv_quant).
UNSIZED_KV_DTYPES = ("nvfp4_ds_mla", "ultraquant_4bit", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
# Layouts an engine's own kernels define: sized, but not formats `verify` stores.
ENGINE_KV_DTYPES: dict[str, KvDtype] = {**VLLM_KV_DTYPES, FP4_E2M1.name: FP4_E2M1}

KV_DTYPE_CHOICES = ("auto", "fp32", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "nvfp4")

# Weight element sizes in bytes, by the names configs use for torch_dtype / dtype.
_WEIGHT_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_WEIGHT_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
}


def normalize_weight_dtype(name: str) -> str:
    """'torch.bfloat16', 'bf16', 'BFloat16' -> 'bfloat16'. Raises InputError for unknown names."""
    key = str(name).strip().lower().removeprefix("torch.")
    key = _WEIGHT_ALIASES.get(key, key)
    if key not in _WEIGHT_BYTES:
        raise InputError(
            f"unknown dtype '{name}'; use one of float32, float16, bfloat16 (or fp32, fp16, bf16)"
        )
    return key


def weight_dtype_bytes(name: str) -> int:
    return _WEIGHT_BYTES[normalize_weight_dtype(name)]


def serving_dtype(config_dtype: str | None) -> str:
    """The dtype an engine serves a checkpoint in when asked for 'auto'.

    vLLM and SGLang keep float16/bfloat16 as stored but downcast float32 (or a config with no dtype)
    to bfloat16: CodeLlama-7b-hf's config says float32 and vLLM 0.19 loads 12.56 GiB of weights,
    which is 6.74e9 parameters at 2 bytes, not 4.
    """
    if config_dtype is None:
        return "bfloat16"
    name = normalize_weight_dtype(config_dtype)
    if name == "float32":
        return "bfloat16"
    if name.startswith("float8"):
        return "bfloat16"
    return name


# The dtypes an engine computes in. vLLM's and SGLang's --dtype accept auto, half, float16, bfloat16, float and
# float32, nothing 8-bit: an fp8 checkpoint is a quantization (its scales and kernels come with it) served in
# bf16/fp16 activations, and an fp8 cache is a KV dtype. So `--dtype fp8` is refused as vLLM refuses it,
# rather than read as "weights and, through 'auto', the KV cache in fp8".
_SERVED_DTYPES = ("float32", "float16", "bfloat16")


def served_dtype(name: str) -> str:
    """The dtype a model is served (computed) in, normalized: 'bf16' -> 'bfloat16'. fp8 is refused, naming
    the fields that do give fp8 weights or an fp8 cache."""
    key = normalize_weight_dtype(name)
    if key not in _SERVED_DTYPES:
        raise InputError(
            f"dtype '{name}' is not one engines serve in (vLLM's --dtype: auto, half, float16, bfloat16, float, "
            "float32); for fp8 weights use --quantization fp8, for an fp8 KV cache --kv-cache-dtype fp8"
        )
    return key


def resolve_kv_dtype(name: str, model_dtype: str) -> KvDtype:
    """`--kv-cache-dtype` value -> KvDtype. 'auto' means the dtype the model is served in, `model_dtype`,
    which must be one an engine serves in (served_dtype)."""
    served = served_dtype(model_dtype)
    key = str(name).strip().lower()
    if key == "auto":
        key = served
    if key not in _KV_ALIASES:
        raise InputError(f"--kv-cache-dtype {name}: {kv_dtype_problem(name)}")
    return _KV_ALIASES[key]


def kv_dtype_problem(name: str) -> str:
    """Why `name` is no KV dtype kvplan sizes, without the name (each front end shows it its own way)."""
    if str(name).strip().lower() in UNSIZED_KV_DTYPES:
        return ("vLLM takes it, but kvplan does not size it (ROCm-only formats, DeepSeek-V3.2's NVFP4 latent); plan "
                "with fp8 or auto")
    return (f"unknown KV cache dtype; use one of {', '.join(KV_DTYPE_CHOICES)} (vLLM 0.20+ also "
            f"{', '.join(VLLM_KV_DTYPES)}; SGLang's fp4_e2m1)")
