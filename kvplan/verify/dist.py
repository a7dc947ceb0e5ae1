"""Tensor-parallel ranks: one process per rank with torch.distributed, under torchrun or spawned here.

Under torchrun (RANK and WORLD_SIZE set) this process is one rank; otherwise verify spawns --tp local
processes. NCCL on GPUs, gloo on the host. Each rank allocates and measures its own shard; rank 0 gathers
every rank's result and reports them all.

Spawned ranks meet through a file (torch's FileStore) and talk over the loopback interface only: no port
listens on other interfaces and no host name is looked up (gloo would otherwise resolve the machine's name, a
DNS query under --offline). Under torchrun the environment is checked first (a stale RANK=abc is one error
line) and the rendezvous has a deadline, so a rank whose peers never come fails instead of waiting for ever.
"""

from __future__ import annotations

import ipaddress
import os
import pickle
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from kvplan.errors import DeviceError, InputError, KvplanError
from kvplan.verify.device import import_torch
from kvplan.verify.rank import RankResult, run_rank
from kvplan.verify.setup import VerifySetup

RENDEZVOUS_TIMEOUT_ENV = "KVPLAN_RENDEZVOUS_TIMEOUT"
DEFAULT_RENDEZVOUS_TIMEOUT_S = 120.0  # every rank of a torchrun job starts within seconds of the others
MAX_WORLD = 4096
_UNSET_HINT = "unset RANK and WORLD_SIZE to run verify alone, or launch it with torchrun"


def torchrun_rank(offline: bool = False) -> tuple[int, int, int] | None:
    """(rank, world, local rank) when launched by torchrun (RANK and WORLD_SIZE set), else None.

    The variables are checked, each by name: RANK=abc, RANK=2 of WORLD_SIZE=2, a MASTER_PORT that is no port,
    and under --offline a MASTER_ADDR that would need a name lookup, are InputErrors, not tracebacks.
    """
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    world = _env_int("WORLD_SIZE", 1, MAX_WORLD)
    rank = _env_int("RANK", 0, world - 1)
    local = _env_int("LOCAL_RANK", 0, MAX_WORLD - 1) if "LOCAL_RANK" in env else rank
    if world > 1:
        address = env.get("MASTER_ADDR", "").strip()
        if not address:
            raise InputError(f"torchrun environment: WORLD_SIZE={world} but MASTER_ADDR is not set; {_UNSET_HINT}")
        _env_int("MASTER_PORT", 1, 65535)
        if offline and not _is_ip(address):
            raise InputError(
                f"torchrun environment: MASTER_ADDR={address[:60]!r} needs a name lookup and --offline does none; "
                "give its IP address"
            )
    return rank, world, local


def _env_int(name: str, low: int, high: int) -> int:
    raw = os.environ.get(name, "")
    text = raw.strip()
    if not text.isdigit() or len(text) > 9 or not low <= int(text) <= high:
        shown = "not set" if name not in os.environ else f"{raw[:40]!r}"
        raise InputError(
            f"torchrun environment: {name} is {shown}, not a whole number in [{low}, {high}]; {_UNSET_HINT}"
        )
    return int(text)


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return False
    return True


def rendezvous_timeout_s() -> float:
    """Seconds a torchrun rank waits for the others (KVPLAN_RENDEZVOUS_TIMEOUT, default 120)."""
    raw = os.environ.get(RENDEZVOUS_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_RENDEZVOUS_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86_400:
        raise InputError(f"{RENDEZVOUS_TIMEOUT_ENV} must be a number of seconds in (0, 86400], got {raw[:40]!r}")
    return seconds


def run_ranks(setup: VerifySetup, progress: Any = None) -> list[RankResult] | None:
    """Every rank's result on rank 0 (None on the other torchrun ranks, which print nothing)."""
    launched = torchrun_rank(offline=setup.request.offline)
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


def _rendezvous(dist: Any, rank: int, world: int) -> Any:
    """torchrun's env:// rendezvous, bounded by rendezvous_timeout_s(); the store it returns, or a DeviceError."""
    seconds = rendezvous_timeout_s()
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        store, _rank, _world = next(dist.rendezvous("env://", rank, world, timeout=timedelta(seconds=seconds)))
    except (RuntimeError, ValueError, OSError) as exc:  # torch's DistStoreError is a RuntimeError
        detail = " ".join(str(exc).split())[:160]
        raise DeviceError(
            f"rank {rank} of {world}: the other ranks did not meet at {where} within {seconds:g} s ({detail}); a "
            f"stale RANK/WORLD_SIZE in the environment starts one rank alone: {_UNSET_HINT}"
        ) from None
    store.set_timeout(timedelta(minutes=30))  # torch's default for the collectives that follow
    return store


def _rank_main(setup: VerifySetup, rank: int, world: int, local: int, progress: Any,
               store: Any = None) -> list[RankResult] | None:
    torch = import_torch()
    dist = torch.distributed
    backend = _backend(setup, torch)
    if backend == "nccl":
        torch.cuda.set_device(local)
    if store is None:
        store = _rendezvous(dist, rank, world)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
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


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), found by type where /sys tells it."""
    net = Path("/sys/class/net")
    try:
        for name in sorted(os.listdir(net)):
            if (net / name / "type").read_text().strip() == "772":  # ARPHRD_LOOPBACK
                return name
    except OSError:
        pass
    names = {name for _index, name in socket.if_nameindex()} if hasattr(socket, "if_nameindex") else set()
    return "lo0" if "lo0" in names else "lo"


def _spawned(rank: int, setup: VerifySetup, world: int, store_path: str, out_path: str) -> None:
    """Entry point of each spawned rank: rank 0 pickles the gathered results (or the error) to out_path."""
    # gloo and NCCL pick their interface from these; without them gloo resolves the host name (DNS).
    loopback = loopback_interface()
    os.environ.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
    try:
        store = import_torch().distributed.FileStore(store_path, world)
        results: Any = _rank_main(setup, rank, world, rank, None, store=store)
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
        store_path = str(Path(tmp) / "rendezvous")
        try:
            torch.multiprocessing.spawn(_spawned, args=(setup, setup.tp, store_path, out_path), nprocs=setup.tp,
                                        join=True)
        except Exception as exc:  # a rank died without a KvplanError (killed, crashed)
            raise DeviceError(f"a --tp rank failed: {' '.join(str(exc).split())[-300:]}") from None
        # The file is ours, written by rank 0 a moment ago.
        results = pickle.loads(Path(out_path).read_bytes())
    if isinstance(results, str):
        raise DeviceError(results)
    return results
