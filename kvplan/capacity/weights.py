"""Weight memory: checkpoint bytes from parameter groups, dtype and quantization, and the share per GPU."""

from __future__ import annotations

from kvplan.capacity.kv import pp_stage_layers
from kvplan.errors import FieldError
from kvplan.model.dtypes import weight_dtype_bytes
from kvplan.model.quant import group_weight_bytes
from kvplan.model.specs import ModelSpec, ParamGroup, QuantSpec
from kvplan.records import dataclass
from kvplan.units import cdiv

# Quantizations an engine applies at load to an unquantized checkpoint, as weight formats. fp8: vLLM/SGLang
# --quantization fp8, one fp32 scale per tensor. bitsandbytes (TGI --quantize): LLM.int8, int8 rows with an
# fp32 scale each; bitsandbytes-nf4/-fp4: 4-bit values in blocks of 64 whose absmax is itself quantized to
# 8 bits (TGI builds Params4bit with compress_statistics=True: one byte per 64 values, plus one fp32 per
# 256 absmax values, 0.02% more, not counted). bitsandbytes-4bit: what vLLM's --quantization bitsandbytes
# makes of an unquantized checkpoint (its BitsAndBytesConfig defaults: load_in_4bit, fp4, no double quant):
# 4-bit values with one fp32 absmax per 64. eetq: int8 per output channel with an fp16 scale.
# Embeddings, norms and the head stay in the model dtype.
_RUNTIME: dict[str, QuantSpec] = {
    "fp8": QuantSpec("fp8", 8, scale_bytes=4, note="runtime fp8 (per-tensor scales)"),
    "bitsandbytes": QuantSpec("bitsandbytes", 8, scale_bytes=4, note="bitsandbytes int8 (per-row fp32 scales)"),
    "bitsandbytes-nf4": QuantSpec("bitsandbytes-nf4", 4, group_size=64, scale_bytes=1,
                                  note="bitsandbytes nf4 (8-bit absmax per 64)"),
    "bitsandbytes-fp4": QuantSpec("bitsandbytes-fp4", 4, group_size=64, scale_bytes=1,
                                  note="bitsandbytes fp4 (8-bit absmax per 64)"),
    "bitsandbytes-4bit": QuantSpec("bitsandbytes", 4, group_size=64, scale_bytes=4,
                                   note="bitsandbytes 4-bit in flight (fp32 absmax per 64)"),
    "eetq": QuantSpec("eetq", 8, scale_bytes=2, note="EETQ int8 (per-channel fp16 scales)"),
}
RUNTIME_QUANTIZATIONS = tuple(_RUNTIME)

# vLLM's --quantization values that name a checkpoint's own format, with the formats (QuantSpec.method) each
# loads; auto_round loads none kvplan sizes. Passing one with its checkpoint changes nothing.
CHECKPOINT_FLAGS: dict[str, tuple[str, ...]] = {
    "awq": ("awq",), "awq_marlin": ("awq",), "gptq": ("gptq",), "gptq_marlin": ("gptq",),
    "modelopt": ("modelopt-fp8", "modelopt-fp8-channel", "nvfp4", "mxfp8", "modelopt-mixed"),
    "modelopt_fp4": ("nvfp4",), "modelopt_mixed": ("modelopt-mixed",), "mxfp4": ("mxfp4",), "auto_round": (),
}


def names_checkpoint_format(flag: str, quant: QuantSpec) -> bool:
    """Whether `--quantization flag` is the checkpoint's own format rather than another one."""
    return flag in ("auto", "compressed-tensors", quant.method) or quant.method in CHECKPOINT_FLAGS.get(flag, ())


# Groups that live outside the decoder layers: on the first pipeline stage (embeddings) or the last (head).
_FIRST_STAGE = ("embed_tokens", "embed_positions", "embed_proj", "vision")
_LAST_STAGE = ("lm_head",)


@dataclass(frozen=True)
class WeightEstimate:
    num_params: int
    total_bytes: int  # the whole model as loaded, all ranks together
    per_gpu_bytes: int  # the fullest rank (largest pipeline stage, one TP shard)
    source: str  # how the bytes were obtained, shown to the user
    groups: tuple[tuple[str, int, int], ...] = ()  # (group, params, bytes)


def runtime_quant(method: str) -> QuantSpec:
    """A quantization applied at load to an unquantized checkpoint (`--quantization fp8`, TGI `--quantize`)."""
    if method not in _RUNTIME:
        raise FieldError(
            "weights.quantization",
            f"runtime quantization {method!r} is not modelled; kvplan sizes {', '.join(RUNTIME_QUANTIZATIONS)}",
            method,
        )
    return _RUNTIME[method]


def _group_stage_share(group: ParamGroup, stage_layers: int, num_layers: int, first: bool, last: bool) -> float:
    if group.name.startswith(_FIRST_STAGE):
        return 1.0 if first else 0.0
    if group.name.startswith(_LAST_STAGE):
        return 1.0 if last else 0.0
    return stage_layers / num_layers


def _group_tp_bytes(group_bytes: int, group: ParamGroup, tp: int) -> int:
    if tp == 1 or group.tp == "replicated":
        return group_bytes
    return cdiv(group_bytes, tp)


def estimate_weights(
    model: ModelSpec,
    *,
    dtype: str,
    tp: int = 1,
    pp: int = 1,
    quantization: str | None = None,
    override_bytes: int | None = None,
    override_source: str = "--weights-bytes",
) -> WeightEstimate:
    """Weight bytes of `model` served in `dtype`, whole and per GPU under tp x pp."""
    num_params = model.num_params
    if override_bytes is not None:
        stages = pp_stage_layers(model.num_layers, pp)
        largest = max(len(s) for s in stages)
        per_gpu = cdiv(override_bytes * largest, model.num_layers * tp)
        split = " (split evenly by layers and tp)" if tp * pp > 1 else ""
        return WeightEstimate(num_params, override_bytes, per_gpu, f"{override_source}{split}")

    quant = model.quant
    source = f"config ({dtype})"
    if quant is not None:
        source = f"config + quantization_config ({quant.note or quant.method})"
        if quantization and not names_checkpoint_format(quantization, quant):
            source += f"; --quantization {quantization} ignored: the checkpoint is already quantized"
    elif quantization:
        quant = runtime_quant(quantization)
        source = f"config ({dtype}) + {quant.note}"
    elem = weight_dtype_bytes(dtype)
    sized = [(g, group_weight_bytes(g, quant, elem)) for g in model.param_groups]
    total = sum(b for _, b in sized)

    stages = pp_stage_layers(model.num_layers, pp)
    per_stage = []
    for i, stage in enumerate(stages):
        stage_bytes = 0.0
        for g, b in sized:
            share = _group_stage_share(g, len(stage), model.num_layers, i == 0, i == len(stages) - 1)
            stage_bytes += _group_tp_bytes(b, g, tp) * share
        per_stage.append(int(stage_bytes))
    return WeightEstimate(
        num_params=num_params,
        total_bytes=total,
        per_gpu_bytes=max(per_stage),
        source=source,
        groups=tuple((g.name, g.params, b) for g, b in sized),
    )
