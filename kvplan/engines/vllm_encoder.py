"""The vision encoder's share of vLLM's profiling run: items profiled, their activation peak, cached embeddings.

docs/engine-rules.md 1.11. Before the language model's dummy forward, vLLM runs the encoder on a dummy batch
of the modality with the most tokens per item, sized by the encoder budget, and keeps the embeddings cached
while the forward and the sampler run:
    budget = max(max_num_batched_tokens, tokens_per_item)    (compute budget and cache size agree by default)
    items  = max(1, min(budget // tokens_per_item, max_num_seqs x (max_model_len // tokens_per_item)))
The encoder's peak is one transformer block over every patch of those items (blocks run one after another):
the residual stream and its norm (2 x width) plus the wider of attention (q, k, v and output: 4 x width) and
the MLP (its up projections plus the activation between them), in the model dtype, plus the pixel input
(in the model dtype from 0.9.1; before, float32 from the processor and its model-dtype copy). Qwen2.5-VL-7B,
one 16,384-token image of 65,536 patches, width 1,280, MLP 3,420 (gated): 65,536 x (2,560 + 3 x 3,420) x 2 B
= 1.56 GiB + 65,536 x 1,176 x 2 B = 0.14 GiB -> 1.71 GiB, with 16,384 x 3,584 x 2 B = 112 MiB of embeddings
cached.
"""

from __future__ import annotations

from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass


@dataclass(frozen=True)
class ImageProcessor:
    """The largest item the model's processor makes: its patches, the tokens they merge into, values per patch."""

    patches_per_item: int
    tokens_per_item: int
    pixels_per_patch: int  # channels x temporal patch x patch x patch


# By model_type, from each processor's own limits:
# Qwen2/2.5-VL: max_pixels 12,845,056 = 3,584^2 in 14-pixel patches -> 256^2 = 65,536 patches, merged 2 x 2
# into 16,384 tokens; 3 x 2 (temporal) x 14 x 14 = 1,176 values per patch.
# Gemma 3: SigLIP at 896 px in 14-pixel patches -> 4,096 patches, pooled into 256 tokens; 3 x 14 x 14 = 588.
# Qwen3.5/3.6 (Qwen3-VL's processor): longest_edge 16,777,216 = 4,096^2 pixels in 16-pixel patches -> 65,536
# patches, merged 2 x 2 into 16,384 tokens; 3 x 2 x 16 x 16 = 1,536 values per patch. Its video item is
# smaller (2 frames of 4,096 x 3,072: 12,288 tokens), so vLLM profiles the image.
PROCESSORS = {
    "qwen2_5_vl": ImageProcessor(65_536, 16_384, 1_176),
    "qwen2_vl": ImageProcessor(65_536, 16_384, 1_176),
    "gemma3": ImageProcessor(4_096, 256, 588),
    "qwen3_5": ImageProcessor(65_536, 16_384, 1_536),
    "qwen3_5_moe": ImageProcessor(65_536, 16_384, 1_536),
}

# Before 0.9.1 the processor hands pixels over in float32 and the encoder casts them to the model dtype (both
# held); from 0.9.1 vLLM casts them on the CPU, so only the model-dtype copy reaches the GPU.
PIXEL_INPUT_BYTES = 4


@dataclass(frozen=True)
class EncoderProfile:
    items: int
    tokens: int  # embedding tokens cached for the language model's forward
    peak_bytes: int  # the encoder's activation peak, pixels included
    cached_bytes: int  # what stays allocated while the language model runs (embeddings; V0: the pixels too)
    lm_tokens: int | None = None  # V0: tokens of the language model's dummy forward (the prompts carry the items)
    lm_rows: int | None = None  # V0: dummy sequences, so the sampler's rows


def _tower(model: ModelSpec) -> tuple[int, int, int] | None:
    """(layers, width, per-patch elements of the MLP's widest phase) of the vision tower, from its matrices.

    The per-layer matrices are those repeated depth times; the width is their commonest input; the up
    projections read the width and write something else (gate and up, or fc1); the down projection reads
    the MLP width. Qwen2.5-VL: qkv (3,840, 1,280), proj, gate (3,420, 1,280), up, down (1,280, 3,420) x 32.
    """
    # "vision", or "vision_unquantized" where a checkpoint quantizes part of the tower
    mats = [m for g in model.param_groups if g.name.split("_")[0] == "vision" for m in g.matrices]
    if not mats:
        return None
    depth = max(count for count, _, _ in mats)
    layer = [(out, inp) for count, out, inp in mats if count == depth]
    ins = [inp for _, inp in layer]
    width = max(set(ins), key=ins.count)
    ups = [out for out, inp in layer if inp == width and out not in (width, 3 * width)]
    downs = [inp for out, inp in layer if out == width and inp != width]
    mlp = sum(ups) + (max(downs) if downs else 0)
    return depth, width, mlp


def encoder_profile(
    model: ModelSpec, *, dtype_bytes: int, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
    pixels_in_model_dtype: bool,
) -> EncoderProfile | None:
    """The encoder part of the profiling run; None for text models and towers kvplan does not size."""
    proc = PROCESSORS.get(model.model_type)
    tower = _tower(model)
    if proc is None or tower is None:
        return None
    _, width, mlp = tower
    budget = max(max_num_batched_tokens, proc.tokens_per_item)
    items = max(1, min(budget // proc.tokens_per_item, max_num_seqs * (max_model_len // proc.tokens_per_item)))
    patches = items * proc.patches_per_item
    block = patches * (2 * width + max(4 * width, mlp)) * dtype_bytes
    pixels = patches * proc.pixels_per_patch * (dtype_bytes + (0 if pixels_in_model_dtype else PIXEL_INPUT_BYTES))
    tokens = items * proc.tokens_per_item
    return EncoderProfile(items, tokens, block + pixels, tokens * model.hidden_size * dtype_bytes)


def v0_encoder_profile(
    model: ModelSpec, *, dtype_bytes: int, max_num_batched_tokens: int, max_num_seqs: int,
    pixels_in_model_dtype: bool,
) -> EncoderProfile | None:
    """V0's multimodal profiling (vllm/worker/model_runner.py _dummy_run, multimodal/profiling.py
    get_decoder_dummy_data @0.6-0.10): the encoder runs inside the one dummy forward, on the items of
    min(max_num_seqs, step // tokens per item) sequences (at least 1), each prompt carrying one item per
    modality (V0's default limit per prompt is 1; kvplan sizes the image) and never cut to the step: V0 "does
    not support chunked prefill" there, so the language model runs over max(step / sequences, item tokens) a
    sequence. The pixels (float32 before 0.9.1, the model dtype after) stay in the model input through the
    language model's forward. Qwen2.5-VL-7B on 0.9.2, 2,048-token step, 1 sequence: one 16,384-token image,
    so a 16,384-token forward, with 16,384 x 3,584 x 2 B = 112 MiB of embeddings and 65,536 x 1,176 x 2 B =
    147 MiB of pixels held.
    """
    proc = PROCESSORS.get(model.model_type)
    tower = _tower(model)
    if proc is None or tower is None:
        return None
    _, width, mlp = tower
    seqs = max(1, min(max_num_seqs, max_num_batched_tokens // proc.tokens_per_item))
    patches = seqs * proc.patches_per_item
    block = patches * (2 * width + max(4 * width, mlp)) * dtype_bytes
    pixels = patches * proc.pixels_per_patch * (dtype_bytes if pixels_in_model_dtype else PIXEL_INPUT_BYTES)
    cast = 0 if pixels_in_model_dtype else patches * proc.pixels_per_patch * dtype_bytes  # the encoder's copy
    tokens = seqs * proc.tokens_per_item
    held = tokens * model.hidden_size * dtype_bytes + pixels
    lm_tokens = seqs * max(max_num_batched_tokens // seqs, proc.tokens_per_item)
    return EncoderProfile(seqs, tokens, block + pixels + cast, held, lm_tokens, seqs)
