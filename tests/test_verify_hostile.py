"""verify under faults: every allocator's out-of-memory, container memory limits, a stale or malformed torchrun
environment, and a --tp 2 --offline run that looks up no name and listens on loopback only."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.verify.device import is_oom
from kvplan.verify.host_memory import Headroom, host_headroom
from tests.conftest import REPO, run_cli
from tests.deadline import deadline

pytestmark = pytest.mark.torch

LLAMA = ["meta-llama/Llama-3.2-1B-Instruct", "--seq", "20", "--steps", "2", "--decode-layers", "1", "--device", "cpu"]
GiB = 1 << 30


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB)"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:119] data. DefaultCPUAllocator: can't allocate memory: you tried "
                     "to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        RuntimeError("std::bad_alloc"),
        MemoryError(),
        OSError(12, "Cannot allocate memory"),
    ],
)
def test_every_allocators_out_of_memory_is_recognised(exc: BaseException) -> None:
    assert is_oom(exc)


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch"), ValueError("out of memory"), KeyError("x")])
def test_other_errors_are_not_out_of_memory(exc: BaseException) -> None:
    assert not is_oom(exc)


def test_cpu_out_of_memory_is_the_documented_error(runner, monkeypatch) -> None:
    pytest.importorskip("torch")
    import kvplan.verify.alloc as alloc

    def zeros(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(alloc, "_zeros", zeros)
    without_check = run_cli(runner, "verify", *LLAMA, "--no-check")
    assert without_check.exit_code == 2
    assert without_check.stderr.strip().startswith("Error: out of memory on cpu while allocating, after 0 of 16 layers")
    with_check = run_cli(runner, "verify", *LLAMA)  # the correctness check allocates first
    assert with_check.exit_code == 2
    assert with_check.stderr.strip() == (  # (the progress display leaves an empty line on stderr)
        "Error: out of memory on cpu during the correctness check, before the planned cache was allocated; memory "
        "freed. Pass --no-check, --fraction below 1, or lower --batch / --seq"
    )


def fake_proc(root: Path, cgroup_line: str, mem_available_kib: int = 64 * 2**20) -> str:
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(f"MemTotal: 1 kB\nMemAvailable: {mem_available_kib} kB\n")
    (root / "proc" / "self" / "cgroup").write_text(cgroup_line + "\n")
    (root / "proc" / "self" / "status").write_text("VmSize: 1024 kB\n")
    return str(root / "proc")


def write_group(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name).write_text(value + "\n")


def test_cgroup_v2_limit_of_an_ancestor(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "0::/kubepods/pod1/ctr")  # MemAvailable 64 GiB: the whole node
    root = tmp_path / "cgroup"
    write_group(root / "kubepods" / "pod1" / "ctr", {"memory.max": "max", "memory.current": str(GiB)})
    # The pod: 8 GiB limit, 6 GiB used of which 1 GiB is reclaimable page cache -> 8 - 6 + 1 = 3 GiB left.
    write_group(root / "kubepods" / "pod1", {"memory.max": str(8 * GiB), "memory.current": str(6 * GiB),
                                             "memory.stat": f"anon 1\ninactive_file {GiB}\n"})
    headroom = host_headroom(proc, str(root))
    assert headroom == Headroom(3 * GiB, f"the cgroup limit {root / 'kubepods' / 'pod1' / 'memory.max'}")


def test_cgroup_v1_limit_inside_a_container_namespace(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, "9:memory:/")
    root = tmp_path / "cgroup"
    # 4 GiB limit, 1 GiB used -> 3 GiB; "no limit" in v1 is 9,223,372,036,854,771,712, ignored elsewhere.
    write_group(root / "memory", {"memory.limit_in_bytes": str(4 * GiB), "memory.usage_in_bytes": str(GiB)})
    limit_file = root / "memory" / "memory.limit_in_bytes"
    assert host_headroom(proc, str(root)) == Headroom(3 * GiB, f"the cgroup limit {limit_file}")
    write_group(root / "memory", {"memory.limit_in_bytes": "9223372036854771712"})
    assert host_headroom(proc, str(root)) == Headroom(64 * GiB, "MemAvailable")


def test_ulimit_v_bounds_the_headroom(tmp_path: Path, monkeypatch) -> None:
    import resource

    proc = fake_proc(tmp_path, "0::/")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2 * GiB, resource.RLIM_INFINITY))
    # 2 GiB of address space, 1,024 KiB mapped already (VmSize) -> 2 GiB - 1 MiB.
    assert host_headroom(proc, str(tmp_path / "none")) == Headroom(2 * GiB - 2**20, "ulimit -v")


def test_the_refusal_names_the_container_limit(runner, monkeypatch) -> None:
    pytest.importorskip("torch")
    import kvplan.verify.device as device

    monkeypatch.setattr(device, "host_headroom", lambda: Headroom(2**20, "the cgroup limit /sys/fs/cgroup/memory.max"))
    result = run_cli(runner, "verify", *LLAMA)
    assert result.exit_code == 2
    assert "but cpu has 1.00 MiB free under the cgroup limit /sys/fs/cgroup/memory.max; nothing was allocated" \
        in result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK is 'abc', not a whole number in [0, 1]"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK is '2', not a whole number in [0, 1]"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE is '0', not a whole number in [1, 4096]"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK is '-1', not a whole number in [0, 4095]"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "WORLD_SIZE=2 but MASTER_ADDR is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"},
         "MASTER_PORT is '99999', not a whole number in [1, 65535]"),
    ],
)
def test_a_malformed_torchrun_environment_is_one_line(runner, monkeypatch, env: dict, message: str) -> None:
    pytest.importorskip("torch")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = run_cli(runner, "verify", *LLAMA, "--tp", "2")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(f"Error: torchrun environment: {message}")
    assert "\n" not in result.stderr.strip()


def test_offline_needs_an_address_not_a_name(runner, monkeypatch) -> None:
    pytest.importorskip("torch")
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "trainer-0", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    result = run_cli(runner, "verify", *LLAMA, "--tp", "2", "--offline")
    assert result.stderr.strip() == ("Error: torchrun environment: MASTER_ADDR='trainer-0' needs a name lookup and "
                                     "--offline does none; give its IP address")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_stale_torchrun_environment_fails_instead_of_waiting(runner, monkeypatch) -> None:
    pytest.importorskip("torch")
    port = free_port()
    # RANK/WORLD_SIZE left over from another job: rank 0 of 2 waits for a rank 1 that never comes.
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                        "KVPLAN_RENDEZVOUS_TIMEOUT": "1"}.items():
        monkeypatch.setenv(name, value)
    with deadline(60):
        result = run_cli(runner, "verify", *LLAMA, "--tp", "2")
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(
        f"Error: rank 0 of 2: the other ranks did not meet at 127.0.0.1:{port} within 1 s"
    )
    assert result.stderr.endswith("unset RANK and WORLD_SIZE to run verify alone, or launch it with torchrun\n")


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "-o", os.devnull, "true"], capture_output=True)
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _strace_works(), reason="needs strace and permission to trace")
def test_tp2_offline_looks_up_no_name_and_listens_on_loopback_only(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    trace = tmp_path / "trace.txt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        ["strace", "-f", "-e", "trace=bind,connect,sendto", "-o", str(trace),
         sys.executable, "-m", "kvplan", "verify", *LLAMA, "--tp", "2", "--offline", "--json"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    calls = trace.read_text()
    assert "htons(53)" not in calls and "nscd" not in calls  # no DNS query, no name-service lookup
    binds = re.findall(r"bind\(\d+, \{sa_family=AF_INET6?, [^}]*\}", calls)
    assert binds and all('inet_addr("127.0.0.1")' in b or 'inet_pton(AF_INET6, "::1"' in b for b in binds), binds
