"""Measuring on the device: bytes per layer kind as allocated, elapsed time, peak memory, copy bandwidth."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


def tensor_bytes(tensors: list[Any]) -> int:
    """Bytes of the storages behind `tensors`, each storage once."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@dataclass
class KindTally:
    layers: int = 0
    tensor_bytes: int = 0  # the tensors' own sizes
    measured_bytes: int = 0  # the CUDA allocator's requested-bytes deltas; the tensor sizes on the host


@dataclass
class ByteMeter:
    """Brackets each layer's allocation: on CUDA the bytes the process asked the allocator for (any hidden
    allocation shows), on the host the tensors' nbytes.

    Not memory_allocated: that counts the blocks handed out, and the caching allocator hands a whole free
    block when splitting it would leave 1 MiB or less. On an H200 one 2.25 MiB sliding-window tensor of
    gpt-oss-20b landed in a free 2.75 MiB block and memory_allocated grew 512 KiB more than was asked for.
    """

    torch: ModuleType
    device: Any
    kinds: dict[str, KindTally] = field(default_factory=dict)
    _mark: int = 0

    def _allocated(self) -> int:
        if self.device.type != "cuda":
            return 0
        self.torch.cuda.synchronize(self.device)
        return int(self.torch.cuda.memory_stats(self.device)["requested_bytes.all.current"])

    def start(self) -> None:
        self._mark = self._allocated()

    def add(self, kind: str, tensors: list[Any]) -> None:
        own = tensor_bytes(tensors)
        delta = self._allocated() - self._mark if self.device.type == "cuda" else own
        tally = self.kinds.setdefault(kind, KindTally())
        tally.layers += 1
        tally.tensor_bytes += own
        tally.measured_bytes += delta

    @property
    def measured_bytes(self) -> int:
        return sum(t.measured_bytes for t in self.kinds.values())


def sync(torch: ModuleType, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(torch: ModuleType, device: Any, fn: Any) -> tuple[Any, float]:
    """(fn(), seconds), with the device drained before and after so the time is the work's."""
    sync(torch, device)
    t0 = time.perf_counter()
    out = fn()
    sync(torch, device)
    return out, time.perf_counter() - t0


def reset_peak(torch: ModuleType, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(torch: ModuleType, device: Any) -> tuple[int, str]:
    """Peak memory and what it is: CUDA max_memory_allocated since the reset, or the process's max RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated during decode"
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process max RSS (whole run)"


def reserved_bytes(torch: ModuleType, device: Any) -> int | None:
    return int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else None


def copy_bandwidth(torch: ModuleType, device: Any, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second a plain device copy moves (each copy reads and writes nbytes: 2 * nbytes moved)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm up
    _, seconds = timed(torch, device, lambda d=dst, s=src: [d.copy_(s) for _ in range(repeats)])
    del src, dst
    return 2 * nbytes * repeats / seconds
