"""What this GPU's CUDA reports, next to kvplan's catalog entry for it: the figures a new catalog row needs.

    python benchmarks/cuda_facts.py [OUT.json]

Prints and writes (JSON) the device name, the total memory as vLLM reads it (torch.cuda.mem_get_info, the
figure gpu_memory_utilization multiplies), nvidia-smi's total (SGLang's default reads it), and what the process
holds outside torch's allocator once CUDA is up and once cuBLAS has run one product: the CUDA context and
library workspaces that vLLM counts as "non-torch memory". Needs torch with CUDA; reads nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


def _outside_torch_bytes(torch: Any) -> int:
    """Device memory in use that torch's caching allocator did not hand out: context, cuBLAS, driver pools."""
    free, total = torch.cuda.mem_get_info()
    return int(total - free - torch.cuda.memory_reserved())


def main() -> None:
    import torch

    from kvplan.errors import KvplanError
    from kvplan.hardware.gpus import find_gpu

    torch.cuda.init()
    name = torch.cuda.get_device_name()
    _free, total = torch.cuda.mem_get_info()
    context = _outside_torch_bytes(torch)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    torch.cuda.synchronize()
    after_cublas = _outside_torch_bytes(torch)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total,driver_version", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout.strip().splitlines()
    smi_mib, driver = (smi[0].split(", ") + [""])[:2] if smi else ("", "")
    try:
        spec = find_gpu(name)
        catalog = {"key": spec.key, "total_memory_bytes": spec.total_memory_bytes,
                   "memory_source": spec.memory_source, "nvidia_smi_bytes": spec.nvidia_smi_bytes}
    except KvplanError as exc:
        catalog = {"error": str(exc)}
    doc = {
        "device_name": name,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "mem_get_info_total_bytes": total,
        "device_properties_total_bytes": torch.cuda.get_device_properties(0).total_memory,
        "nvidia_smi_total_bytes": int(smi_mib) * (1 << 20) if smi_mib.isdigit() else None,
        "outside_torch_after_init_bytes": context,
        "outside_torch_after_cublas_bytes": after_cublas,
        "catalog": catalog,
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            fh.write(text + "\n")
    if "total_memory_bytes" in catalog:
        diff = catalog["total_memory_bytes"] - total
        print(f"catalog {catalog['key']}: {catalog['total_memory_bytes']:,} B; CUDA {total:,} B; "
              f"catalog - CUDA = {diff:+,} B ({diff / total:+.4%})")


if __name__ == "__main__":
    main()
