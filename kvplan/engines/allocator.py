"""What PyTorch's CUDA caching allocator takes from the device for a set of live tensors: whole segments.

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

from kvplan.units import MiB, round_up

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
