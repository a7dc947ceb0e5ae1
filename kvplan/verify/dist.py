"""Tensor-parallel ranks: one process per rank with torch.distributed, under torchrun or spawned here.

Under torchrun (RANK and WORLD_SIZE set) this process is one rank; otherwise verify spawns --tp local
processes. NCCL on GPUs, gloo on the host. Each rank allocates and measures its own shard; rank 0 gathers
every rank's result and reports them all.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
from pathlib import Path
from typing import Any

from kvplan.errors import DeviceError, InputError, KvplanError
from kvplan.verify.device import import_torch
from kvplan.verify.rank import RankResult, run_rank
from kvplan.verify.setup import VerifySetup


def torchrun_rank() -> tuple[int, int, int] | None:
    """(rank, world, local rank) when launched by torchrun, else None."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    return rank, world, int(env.get("LOCAL_RANK", rank))


def run_ranks(setup: VerifySetup, progress: Any = None) -> list[RankResult] | None:
    """Every rank's result on rank 0 (None on the other torchrun ranks, which print nothing)."""
    launched = torchrun_rank()
    if setup.tp == 1 and (launched is None or launched[1] == 1):
        return [run_rank(setup, progress=progress)]
    if launched is not None:
        rank, world, local = launched
        if world != setup.tp:
            raise InputError(f"torchrun started {world} processes but --tp is {setup.tp}; they must match")
        return _rank_main(setup, rank, world, local, progress if rank == 0 else None)
    return _spawn(setup, progress)


def _backend(setup: VerifySetup, torch: Any) -> str:
    device = setup.request.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return "gloo" if device == "cpu" else "nccl"


def _rank_main(setup: VerifySetup, rank: int, world: int, local: int, progress: Any) -> list[RankResult] | None:
    torch = import_torch()
    dist = torch.distributed
    backend = _backend(setup, torch)
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    try:
        def reduce(t: Any) -> Any:
            # The row-parallel output projection's all-reduce (gloo sums float32 only).
            buf = t.float() if backend == "gloo" else t.contiguous()
            dist.all_reduce(buf)
            return buf.to(t.dtype)

        try:
            result: RankResult | str = run_rank(setup, rank=rank, world=world, device_index=local, reduce=reduce,
                                                progress=progress)
        except KvplanError as exc:
            result = f"rank {rank}: {exc.message}"
        gathered: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(result, gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    assert gathered is not None
    errors = [r for r in gathered if isinstance(r, str)]
    if errors:
        raise DeviceError("; ".join(errors))
    return list(gathered)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(rank: int, setup: VerifySetup, world: int, port: int, out_path: str) -> None:
    """Entry point of each spawned rank: rank 0 pickles the gathered results (or the error) to out_path."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        results: Any = _rank_main(setup, rank, world, rank, None)
    except KvplanError as exc:
        results = exc.message
    if rank == 0:
        Path(out_path).write_bytes(pickle.dumps(results))


def _spawn(setup: VerifySetup, progress: Any) -> list[RankResult]:
    torch = import_torch()
    if _backend(setup, torch) == "nccl" and torch.cuda.device_count() < setup.tp:
        raise DeviceError(f"--tp {setup.tp} needs {setup.tp} GPUs but torch sees {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="kvplan-verify-") as tmp:
        out_path = str(Path(tmp) / "results.pkl")
        try:
            torch.multiprocessing.spawn(_spawned, args=(setup, setup.tp, _free_port(), out_path), nprocs=setup.tp,
                                        join=True)
        except Exception as exc:  # a rank died without a KvplanError (killed, crashed)
            raise DeviceError(f"a --tp rank failed: {' '.join(str(exc).split())[-300:]}") from None
        # The file is ours, written by rank 0 a moment ago.
        results = pickle.loads(Path(out_path).read_bytes())
    if isinstance(results, str):
        raise DeviceError(results)
    return results
