"""What the host can still give this process: MemAvailable, the cgroup (v1 or v2) memory limit, and ulimit -v.

In a container MemAvailable describes the whole machine: a pod limited to 8 GiB on a 512 GiB node sees ~500 GiB
"available" and is OOM-killed at 8 GiB. verify refuses up front against the tightest of the three.
"""

from __future__ import annotations

import resource
from pathlib import Path

from kvplan.records import dataclass

_UNLIMITED = 1 << 60  # cgroup v1 states "no limit" as 9,223,372,036,854,771,712 (PAGE_COUNTER_MAX pages)
# (limit, usage, the memory.stat key of reclaimable page cache) per cgroup version.
_V2_FILES = ("memory.max", "memory.current", "inactive_file")
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


@dataclass(frozen=True)
class Headroom:
    """Bytes this process may still allocate, and the limit that says so ("MemAvailable", "ulimit -v", ...)."""

    available_bytes: int
    limit: str


def host_headroom(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> Headroom | None:
    """The tightest of MemAvailable, the cgroup limits of this process and its ancestors, and RLIMIT_AS."""
    found = [h for h in (_meminfo(proc), _cgroup(proc, cgroup_root), _address_space(proc)) if h is not None]
    return min(found, key=lambda h: h.available_bytes) if found else None


def _meminfo(proc: str) -> Headroom | None:
    """MemAvailable from /proc/meminfo (the kernel states it in KiB)."""
    for line in _lines(Path(proc, "meminfo")):
        if line.startswith("MemAvailable:"):
            return Headroom(int(line.split()[1]) * 1024, "MemAvailable")
    return None


def _cgroup(proc: str, root: str) -> Headroom | None:
    """limit - usage + reclaimable page cache, for the tightest cgroup on the way from this one to the root.

    /proc/self/cgroup names the group: "0::/kubepods/pod1" (v2, one hierarchy) or "4:memory:/docker/abc" (v1,
    the memory controller's own). Inside a container's cgroup namespace the path is "/" and the files sit at
    the mount root. Usage minus inactive page cache is the working set the OOM killer weighs.
    """
    tightest: Headroom | None = None
    for line in _lines(Path(proc, "self", "cgroup")):
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            names, base = _V2_FILES, Path(root)
        elif "memory" in controllers.split(","):
            names, base = _V1_FILES, Path(root, "memory")
        else:
            continue
        group = Path(path.strip() or "/")
        for ancestor in (group, *group.parents):
            headroom = _group_headroom(base / str(ancestor).lstrip("/"), *names)
            if headroom is not None and (tightest is None or headroom.available_bytes < tightest.available_bytes):
                tightest = headroom
    return tightest


def _group_headroom(directory: Path, limit_file: str, usage_file: str, inactive_key: str) -> Headroom | None:
    limit = _number(directory / limit_file)
    usage = _number(directory / usage_file)
    if limit is None or usage is None or limit >= _UNLIMITED:
        return None
    inactive = 0
    for line in _lines(directory / "memory.stat"):
        key, _, value = line.partition(" ")
        if key == inactive_key and value.strip().isdigit():
            inactive = int(value)
    return Headroom(max(0, limit - usage + inactive), f"the cgroup limit {directory / limit_file}")


def _address_space(proc: str) -> Headroom | None:
    """ulimit -v (RLIMIT_AS) minus the address space this process already maps (VmSize)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = 0
    for line in _lines(Path(proc, "self", "status")):
        if line.startswith("VmSize:"):
            mapped = int(line.split()[1]) * 1024
    return Headroom(max(0, soft - mapped), "ulimit -v")


def _number(path: Path) -> int | None:
    """A cgroup value file: an integer, or "max" (no limit, as None)."""
    lines = _lines(path)
    value = lines[0].strip() if lines else ""
    return int(value) if value.isdigit() else None


def _lines(path: Path) -> list[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(1 << 20).splitlines()
    except OSError:
        return []

