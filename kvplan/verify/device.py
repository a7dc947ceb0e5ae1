"""Torch at the edge: the lazy import, the device, its free memory, and what counts as out-of-memory."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from kvplan.errors import DeviceError, InputError
from kvplan.verify.host_memory import host_headroom

TORCH_MISSING = "torch is not installed: pip install 'kvplan[verify]'"

# Torch dtypes by kvplan's dtype names (weights, compute and Mamba state tensors).
_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def import_torch() -> ModuleType:
    """torch, imported only when verify runs; a DeviceError naming the extra when it is missing."""
    if os.environ.get("KVPLAN_DEBUG", "").strip() in ("", "0"):
        # c10d prints multi-line C++ stack traces on stderr for a failed rendezvous; kvplan reports it in one
        # line. Read by torch when it loads, so set before the import; KVPLAN_DEBUG=1 keeps them.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
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
        raise DeviceError(
            "--device cuda: torch sees no CUDA device (use --device cpu, or install a CUDA build of torch)"
        )
    index = rank if name == "cuda" else int(name.split(":", 1)[1]) + rank
    if index >= torch.cuda.device_count():
        raise DeviceError(f"rank {rank} needs cuda:{index} but torch sees {torch.cuda.device_count()} GPU(s)")
    return torch.device("cuda", index)


def device_label(torch: ModuleType, device: Any) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def free_bytes(torch: ModuleType, device: Any) -> tuple[int | None, str]:
    """What the device can still give, and what says so ("free", "free under ulimit -v", ...).

    cudaMemGetInfo's free on CUDA; on the host the tightest of MemAvailable, the cgroup memory limit and
    ulimit -v (kvplan.verify.host_memory).
    """
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "free"
    headroom = host_headroom()
    if headroom is None:
        return None, "free"
    return headroom.available_bytes, "free" if headroom.limit == "MemAvailable" else f"free under {headroom.limit}"


# What the allocators say when they run out, lower-cased: CUDA ("CUDA out of memory", "CUDA error: out of
# memory"), HIP, MPS and XPU ("... out of memory"), the CPU allocator ("DefaultCPUAllocator: can't allocate
# memory: you tried to allocate 8589934592 bytes"), the C library ("Cannot allocate memory", errno 12),
# cuBLAS workspaces (CUBLAS_STATUS_ALLOC_FAILED) and C++ (std::bad_alloc).
_OOM_MESSAGES = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "cublas_status_alloc_failed",
    "bad_alloc",
    "hiperroroutofmemory",
    "cudaerrormemoryallocation",
)


def is_oom(exc: BaseException) -> bool:
    """An allocator that ran out: torch.OutOfMemoryError, MemoryError, or any error whose message says so."""
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, OSError)) and any(m in text for m in _OOM_MESSAGES)


def release(torch: ModuleType, device: Any) -> None:
    """Give freed cache blocks back to the device (callers drop their references first)."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
