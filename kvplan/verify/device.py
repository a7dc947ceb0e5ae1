"""Torch at the edge: the lazy import, the device, its free memory, and what counts as out-of-memory."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from kvplan.errors import DeviceError, InputError

TORCH_MISSING = "torch is not installed: pip install 'kvplan[verify]'"

# Torch dtypes by kvplan's dtype names (weights, compute and Mamba state tensors).
_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def import_torch() -> ModuleType:
    """torch, imported only when verify runs; a DeviceError naming the extra when it is missing."""
    try:
        import torch
    except ImportError:
        raise DeviceError(TORCH_MISSING) from None
    return torch


def torch_dtype(torch: ModuleType, name: str) -> Any:
    """'bfloat16' -> torch.bfloat16 (the float8 weight names compute in bfloat16, as engines serve them)."""
    return getattr(torch, _TORCH_DTYPES.get(name, "bfloat16"))


def pick_device(torch: ModuleType, requested: str | None, rank: int = 0) -> Any:
    """--device cpu|cuda (default cuda when available); rank r of a multi-GPU run uses cuda:r."""
    name = (requested or ("cuda" if torch.cuda.is_available() else "cpu")).strip().lower()
    if name == "cpu":
        return torch.device("cpu")
    if not name.startswith("cuda"):
        raise InputError(f"--device must be cpu or cuda, got {requested!r}")
    if not torch.cuda.is_available():
        raise DeviceError("--device cuda: torch sees no CUDA device (use --device cpu, or install a CUDA build of torch)")
    index = rank if name == "cuda" else int(name.split(":", 1)[1]) + rank
    if index >= torch.cuda.device_count():
        raise DeviceError(f"rank {rank} needs cuda:{index} but torch sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def device_label(torch: ModuleType, device: Any) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def meminfo_available_bytes(path: str = "/proc/meminfo") -> int | None:
    """MemAvailable from /proc/meminfo in bytes (the kernel states it in KiB), or None off Linux."""
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_bytes(torch: ModuleType, device: Any) -> int | None:
    """What the device can still give: cudaMemGetInfo's free on CUDA, MemAvailable on the host."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return meminfo_available_bytes()


def is_oom(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, or the RuntimeError older builds and the CPU allocator raise."""
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def release(torch: ModuleType, device: Any) -> None:
    """Give freed cache blocks back to the device (callers drop their references first)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
