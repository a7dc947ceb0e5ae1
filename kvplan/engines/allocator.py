"""What PyTorch's CUDA caching allocator holds for a model's weights: the segments it takes from the device
(segment_bytes, SGLang's measure), and what it counts as allocated (allocated_bytes, vLLM's).

An engine that measures its weights as a drop in free device memory (SGLang's "Load weight end. ... mem
usage", read after torch.cuda.empty_cache()) counts the segments that hold them, not their bytes. The
allocator (c10/cuda/CUDACachingAllocator.cpp) rounds each request up to 512 B and then:
  <= 1 MiB (kSmallSize): carved from shared 2 MiB segments (kSmallBuffer);
  1 - 10 MiB (kMinLargeAlloc): carved from shared 20 MiB segments (kLargeBuffer);
  > 10 MiB: a segment of its own, rounded up to 2 MiB (kRoundLarge).
empty_cache() frees only segments with nothing live in them, so the rounding of every large tensor stays.
QwQ-32B at tp 4 (64 layers, qkv 17.5 MiB, o 12.5, gate_up 135, down 67.5 per rank in bf16): 3.5 MiB a layer,
0.22 GiB in all beyond the parameter bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvplan.model.specs import ModelSpec, QuantSpec
from kvplan.units import MiB, cdiv, round_up

MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is a multiple of it
SMALL_BYTES = 1 * MiB  # kSmallSize
SMALL_SEGMENT_BYTES = 2 * MiB  # kSmallBuffer
MIN_LARGE_ALLOC_BYTES = 10 * MiB  # kMinLargeAlloc
LARGE_SEGMENT_BYTES = 20 * MiB  # kLargeBuffer
ROUND_LARGE_BYTES = 2 * MiB  # kRoundLarge


def segment_bytes(tensor_bytes: Iterable[int]) -> int:
    """Device bytes the allocator holds for tensors of these sizes, allocated one after another and kept.

    Small and medium tensors share segments, so their total is rounded once per pool (packing is exact when
    they are allocated back to back, as a model's load does); each large tensor is rounded on its own.
    """
    small = medium = large = 0
    for n in tensor_bytes:
        size = round_up(max(n, 1), MIN_BLOCK_BYTES)
        if size <= SMALL_BYTES:
            small += size
        elif size <= MIN_LARGE_ALLOC_BYTES:
            medium += size
        else:
            large += round_up(size, ROUND_LARGE_BYTES)
    return round_up(small, SMALL_SEGMENT_BYTES) + round_up(medium, LARGE_SEGMENT_BYTES) + large


def allocated_bytes(tensor_bytes: Iterable[int], *, max_split_bytes: int | None = None) -> int:
    """What torch counts as allocated (max_memory_allocated, vLLM's "Model loading took") for tensors of these
    sizes allocated one after another and kept.

    A tensor of 10 MiB or more gets a segment of its own, rounded up to 2 MiB; the allocator splits the rest
    off (should_split), so only the request counts, unless the rest is 1 MiB or less, or the request is at least
    max_split_size: then the whole block counts. vLLM 0.21+ loads the model with max_split_size_mb 20
    (gpu_worker.py _scoped_allocator_max_split), so every weight of 20 MiB or more counts rounded to 2 MiB:
    Qwen2.5-1.5B in fp16, 28 x (gate_up 52.5 MiB in 54 + down 26.25 MiB in 28) + the embedding's 445.125 in
    446 = 96.4 MB beyond the parameter bytes. Smaller tensors count their bytes (rounded to 512 B)."""
    total = 0
    for n in tensor_bytes:
        size = round_up(max(n, 1), MIN_BLOCK_BYTES)
        block = round_up(size, ROUND_LARGE_BYTES)
        kept_whole = size >= MIN_LARGE_ALLOC_BYTES and (
            block - size <= SMALL_BYTES or (max_split_bytes is not None and size >= max_split_bytes))
        total += block if kept_whole else size
    return total


def _weight_bytes_per_param(model: ModelSpec, name: str, quant: QuantSpec | None, elem: int) -> float:
    """Bytes a parameter of group `name` takes in its weight tensor: the model dtype, or the quantized format's
    packed bits (its scales and zero points are tensors of their own, too small to round: fp8's block scales
    are 1 / 16,384 of the weight, and folding them in would round every expert tensor up by a block)."""
    g = next((g for g in model.param_groups if g.name == name), None)
    if g is None:
        return float(elem)
    if g.elem_bytes is not None:
        return float(g.elem_bytes)
    fmt = g.fmt or quant
    return fmt.weight_bits / 8 if fmt is not None and g.quantizable else float(elem)


def loaded_tensor_bytes(model: ModelSpec, layers: range, *, tp: int, elem: int, quant: QuantSpec | None,
                        first: bool, last: bool) -> list[int] | None:
    """The weight tensors one rank of a stage holds as vLLM and SGLang load them: q/k/v fused into qkv_proj,
    gate and up into gate_up_proj, each MoE layer's experts in two 3-D tensors, the vocabulary split over tp.
    None for layers this does not describe (MLA, DeepSeek-V4's, Mamba, linear attention): their rounding is not
    counted. Shapes are cut by tp only: under DP attention or expert parallel the rounding is that of the tp
    split, within a few MiB."""
    g = model.geometry
    if g.mla is not None or g.compressed_mla is not None or g.mamba is not None or g.linear_attention is not None:
        return None
    h = g.hidden_size
    attn, mlp, experts = (_weight_bytes_per_param(model, name, quant, elem) for name in ("attention", "mlp", "experts"))
    out: list[int] = []
    for i in layers:
        q, kv = g.num_attention_heads * g.head_dims[i], g.kv_heads[i] * g.head_dims[i]
        out += [int(cdiv(q + 2 * kv, tp) * h * attn), int(h * cdiv(q, tp) * attn), h * elem, h * elem]
        if g.moe is not None and i in g.moe.layers:
            inter = cdiv(g.moe.expert_intermediate_size, tp)
            out += [int(g.moe.num_experts * 2 * inter * h * experts), int(g.moe.num_experts * h * inter * experts)]
        elif g.intermediate_sizes:
            inter = cdiv(g.intermediate_sizes[i], tp)
            out += [int(2 * inter * h * mlp), int(h * inter * mlp)]
    vocab_rows = cdiv(g.vocab_size, tp)
    if first:
        out.append(vocab_rows * h * elem)
    if last:
        out += [h * elem] + ([] if g.tie_word_embeddings else [vocab_rows * h * elem])
    return out
