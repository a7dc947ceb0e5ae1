"""The GPU catalog: each card's memory as CUDA reports it (or which figure it holds where unsourced), and lookup."""

from __future__ import annotations

import difflib
import re
from decimal import ROUND_HALF_EVEN, Decimal

from kvplan.errors import InputError
from kvplan.records import dataclass
from kvplan.units import GiB, MiB

# What `memory_source` starts with, before the colon. The planner's budget is vLLM's
# `total_memory × gpu_memory_utilization`, and vLLM takes total_memory from torch.cuda.mem_get_info(),
# so "cuda" and "vllm-log" figures are the right input; the others are stand-ins, labelled as such.
MEMORY_KINDS = (
    "cuda",  # torch total_memory / deviceQuery totalGlobalMem / torch OOM "total capacity"
    "vllm-log",  # total_memory printed by vLLM (itself mem_get_info, i.e. a CUDA total)
    "nvidia-smi",  # NVML framebuffer total: 0.25-0.75 GiB MORE than CUDA sees (driver-reserved memory)
    "kfd",  # AMD: what the ROCm kernel driver (rocminfo / KFD) reports
    "nominal",  # the marketed size read as GiB (raw DRAM); the CUDA total is lower by roughly 1%
    "given",  # typed by the user (--gpu-mem)
)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. `memory_source` reads "<kind>: <detail> [citation tag in gpus.md]"."""

    key: str
    display_name: str
    device_names: tuple[str, ...]  # exactly as torch.cuda.get_device_name() / nvidia-smi print them
    total_memory_bytes: int
    memory_source: str
    aliases: tuple[str, ...]
    vendor: str  # "nvidia" | "amd" ("unknown" only for custom_gpu)
    bandwidth_bytes_per_s: int | None = None
    bandwidth_source: str = ""
    # nvidia-smi's total where the catalog holds the CUDA one and knows both: SGLang sizes its defaults by it.
    nvidia_smi_bytes: int | None = None

    @property
    def memory_kind(self) -> str:
        """The kind of figure `total_memory_bytes` holds: one of MEMORY_KINDS."""
        return self.memory_source.split(":", 1)[0]

    @property
    def smi_total_bytes(self) -> int:
        """The total nvidia-smi reports (SGLang's get_nvgpu_memory_capacity reads it): the recorded figure, else
        the catalog's total, which is nvidia-smi's or the closest figure known."""
        return self.nvidia_smi_bytes or self.total_memory_bytes

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """The NVIDIA card's (major, minor), which picks kernels and backends; None for AMD and unknown cards."""
        return COMPUTE_CAPABILITY.get(self.key) if self.vendor == "nvidia" else None


def _from_rounded_gib(text: str) -> int:
    """A total that a source printed only as GiB to 2 decimals, stored as the nearest whole MiB.

    Any byte count within ±0.005 GiB fits such a report equally well; the nearest MiB is the plainest
    choice and rounds back to the printed figure: "22.18" -> 22.18 × 1024 = 22,712.32 -> 22,712 MiB.
    """
    return int((Decimal(text) * 1024).to_integral_value(rounding=ROUND_HALF_EVEN)) * MiB


def _tb_per_s(text: str) -> int:
    """Decimal terabytes per second (10**12 B/s, as vendors quote bandwidth) -> bytes per second."""
    return int(Decimal(text) * 10**12)


# H100 SXM 80GB: vLLM prints total_memory only as "79.19GiB", but its --kv-cache-memory suggestions are
# exact bytes, and two runs of gpt-oss-20b at tp=2 in vllm-startup-logs.jsonl differ only in
# gpu_memory_utilization (same free memory 77.18 GiB, same weights/activation/non-torch/CUDA-graph
# figures, same "fully utilize" suggestion 68,225,471,488). Their "fit into requested memory"
# suggestions, ceil(total × util) − non_kv − 150 MiB, are 66,128,745,472 at 0.95 and 61,877,326,848 at
# 0.9, so ceil(0.95 T) − ceil(0.9 T) = 4,251,418,624, i.e. 0.05 T = 4,251,418,624 ± 1 and
# T = 85,028,372,480 ± 40 B. Every suggestion in all 61 logs is a multiple of 512 B, which needs
# ceil(0.95 T) ≡ free ≡ 0 (mod 512); inside that ±40 B window only T = 85,028,372,480 (the odd
# 85,028,372,481 aside) qualifies. Checks: T = 81,089.375 MiB = 79.1888 GiB -> "79.19"; 0.95 T =
# 80,776,953,856 B = 75.2291 GiB -> "75.23"; 0.9 T -> "71.27"; free = 0.95 T + (68,789,657,600 −
# 65,088,610,304) = 84,478,001,152 B -> "78.68" and T − free = 0.51 GiB, the logged cuda_memory;
# nvidia-smi's 81,559 MiB is 469.6 MiB above T, the ≈469 MiB gap gpus.md measures. Two other figures
# quoted for this card do NOT fit these logs: 81,088 MiB (85,026,930,688 B, 79.1875 GiB) gives a
# difference 72,090 B short, and 85,029,158,912 B (81,090.125 MiB) one 39,322 B long; neither makes
# ceil(0.95 T) a multiple of 512.
H100_SXM_CUDA_TOTAL_BYTES = 85_028_372_480

# H200 SXM: torch.cuda.mem_get_info() on one H200 (driver 580.159.04, torch 2.11.0+cu130), measured by
# benchmarks/cuda_facts.py into benchmarks/results/gpu/cuda_facts.json: 150,109,880,320 B = 139.8011 GiB
# ("139.80"). An 8-GPU box's torch OOM printed 139.81 GiB, i.e. 9 to 15 MiB more: totals differ by a few MiB
# between boxes and drivers, and the measured exact figure is the one kept.
H200_CUDA_TOTAL_BYTES = 150_109_880_320

_N = "nvidia"
_A = "amd"

# Tags for sources read after gpus.md was written (the rest are gpus.md's):
# [evo2#190]: https://github.com/ArcInstitute/evo2/issues/190 ("Is a L4 GPU not enough": torch's OOM message)
# [arxiv-confi]: https://github.com/sungwon-chae/arxiv_confi/blob/3906c481ed03deeb5ce0b4db322c77bdc44416ad/
#   etu_logging.md (8 x "NVIDIA H200 (139.8 GB)", then torch's OOM message)
# [kvplan-h200]: benchmarks/results/gpu/cuda_facts.json (this project's own run, 2026-11-30)
# [pto-cu-h200nvl]: https://github.com/uv-xiao/pto-cu/blob/0b98390d6355ba1e853a2817a35b1f3ac7307ae2/docs/
#   in_progress/nvidia_backend/vllm_remote_64k_context_health_probe.md ("NVIDIA H200 NVL", nvidia-smi
#   "141773 MiB free / 143771 MiB total", GPUs connected through SYS, not NVLink)
# [thamada-dq]: https://github.com/thamada/nvidia-smi/blob/HEAD/nvsim/H100SXMx8_deviceQuery.py (deviceQuery of
#   8 x "NVIDIA H100 80GB HBM3": "81106 MBytes (85045477376 bytes)", 132 SMs)
# [a5000-query]: a published device query of an "NVIDIA RTX A5000" ("Total amount of global memory: 24226 MBytes
#   (25402343424 bytes)", 64 multiprocessors, compute 8.6) in a CUDA teaching page held in the stored code index,
#   which does not name its repository
# [opticks-pro6000]: https://github.com/simoncblyth/opticks/blob/d162f86f43e76fb96a4d27528c8e6cb12bff62cf/notes/
#   issues/opticks_ctest_shakedown_with_cuda131_on_rtx6000pro_server.rst ("NVIDIA RTX PRO 6000 Blackwell Server
#   Edition", CUDA 13.1: "totalGlobalMem_bytes : 101975851008"); https://github.com/antirez/ds4/issues/563 prints
#   the same card's nvidia-smi "97887MiB" and cudaMemGetInfo "total=94.97 GiB".
#   Drivers move it by tens of MiB (vLLM 0.27.1 under driver 610.43.02 prints 95.01 GiB, 40 MiB more), and a
#   Workstation Edition under WSL2 reports 95.59 GiB [sglang#24364]
# [thamada-dq-a40]: https://github.com/thamada/nvidia-smi/blob/HEAD/nvsim/A40x10_deviceQuery.py (deviceQuery of
#   10 x "NVIDIA A40", CUDA 12.4, ECC enabled: "45403 MBytes (47608692736 bytes)", 84 multiprocessors). nvidia-smi
#   prints the card's total as 46068MiB (two public nvidia-smi tables in the stored code index).
# [gpu-speed-test-a40]: https://github.com/lijichen/GPU-Speed-Test (README: 8 x "NVIDIA A40 total=44.42 GiB" from
#   its CUDA memory stress tool). Drivers move the total by tens of MiB, as for the other cards.
# [internvl-pro6000]: https://github.com/Jessi11111/fine-tuning-InternVL-78B/blob/
#   16a3892b65f86d5ac03b2c72e3ef2f74f93524fc/README.md (torch 2.7.1: "_CudaDeviceProperties(name='NVIDIA RTX PRO
#   6000 Blackwell Server Edition', ... total_memory=97250MB, multi_processor_count=188")
# [sglang#24364]: https://github.com/sgl-project/sglang/issues/24364 ("GPU 0 has a total capacity of 95.59 GiB")
# [h100pcie-query]: a published nvidia-smi / nvaccelinfo print of two "NVIDIA H100 PCIe" (driver 565.57.01,
#   2025-01-20: 81559MiB each; "Global Memory Size: 85045477376", 114 multiprocessors), held in the stored code
#   index, which does not name its repository
# [deac-a100pcie]: https://github.com/WFU-HPC/deac-docs/blob/fb7fbcf52a9457ca4299a783699fb8f92352e86a/source/
#   cluster-gpu.rst (CUDA 12.4 deviceQuery of 4 x "NVIDIA A100 80GB PCIe", ECC enabled: "81038 MBytes
#   (84974239744 bytes)"). TruNcat3/cuButterfly docs/hardware/a100-pcie-80gb.md @45de6b5d0382 records the same
#   84,974,239,744 B for its A100 80GB PCIe. Taken after the first held-out log on this card (vLLM 0.28.0) had been
#   evaluated against the nominal 80 GiB (+7.1%).

# Bandwidth figures below are only those gpus.md gives; "secondary" means a page quoting the vendor
# figure that gpus.md could not check against the datasheet.
_CATALOG: tuple[GpuSpec, ...] = (
    GpuSpec(
        "H100-80GB", "NVIDIA H100 80GB HBM3 (SXM)", ("NVIDIA H100 80GB HBM3",),
        H100_SXM_CUDA_TOTAL_BYTES,
        "vllm-log: 79.19 GiB (vLLM 0.19.0 total_memory), exact bytes solved from the logged"
        " --kv-cache-memory suggestions [llmd-log, vllm-startup-logs.jsonl]",
        ("h100", "H100-SXM", "H100-SXM5", "H100-SXM5-80GB", "H100-SXM-80GB", "nvidia-h100-80gb",
         "h100-mega-80gb", "nvidia-h100-mega-80gb"),
        _N, _tb_per_s("3.35"), "secondary [manning]",
    ),
    # H100 PCIe: its device query gives totalGlobalMem 85,045,477,376 B, byte for byte the H100 SXM's
    # (81,106 MB in deviceQuery), and nvidia-smi 81,559 MiB, again the SXM's; so the CUDA total vLLM sees is
    # taken to be the SXM's exact mem_get_info total (16 MiB below totalGlobalMem on that card).
    GpuSpec(
        "H100-PCIE", "NVIDIA H100 PCIe 80GB", ("NVIDIA H100 PCIe",),
        H100_SXM_CUDA_TOTAL_BYTES,
        "cuda: the H100 SXM's total; the same totalGlobalMem 85,045,477,376 B (PCIe: nvaccelinfo"
        " [h100pcie-query], SXM: deviceQuery [thamada-dq]) and nvidia-smi 81,559 MiB [h100pcie-query]",
        ("H100-PCIE-80GB", "H100-80GB-PCIE"),
        _N, _tb_per_s("2"), "secondary: reseller page quoting NVIDIA [milic]", nvidia_smi_bytes=81_559 * MiB,
    ),
    GpuSpec(
        "H100-NVL", "NVIDIA H100 NVL 94GB", ("NVIDIA H100 NVL",),
        95_830 * MiB, "nvidia-smi: 95,830 MiB, drv 535.183.01 [gpu-admin-tools#4]",
        ("H100-NVL-94GB", "H100NVL"),
        _N, None, "unknown: secondary pages conflict (3.93 [grok-nvl] vs 4.8 TB/s [gpublog-nvl])",
    ),
    GpuSpec(
        "H200", "NVIDIA H200 141GB HBM3e", ("NVIDIA H200",),
        H200_CUDA_TOTAL_BYTES,
        "cuda: mem_get_info 150,109,880,320 B, drv 580.159.04 [kvplan-h200]; another box's torch OOM"
        " read 139.81 GiB [arxiv-confi] (nvidia-smi 143,771 MiB [tg-blog])",
        ("H200-141GB", "H200-SXM", "nvidia-h200-141gb"),
        _N, _tb_per_s("4.8"), "secondary [oi#1441]", nvidia_smi_bytes=143_771 * MiB,
    ),
    GpuSpec(
        # The PCIe form: NVLink bridges between 2 or 4 cards, no NVSwitch, so no NVLink SHARP under tp.
        "H200-NVL", "NVIDIA H200 NVL 141GB HBM3e (PCIe)", ("NVIDIA H200 NVL",),
        H200_CUDA_TOTAL_BYTES,
        "cuda: the H200 SXM's mem_get_info [kvplan-h200]; the NVL prints the SXM's nvidia-smi total, 143,771 MiB"
        " [pto-cu-h200nvl]",
        ("H200NVL", "H200-NVL-141GB"),
        _N, None, "unknown: no source read", nvidia_smi_bytes=143_771 * MiB,
    ),
    GpuSpec(
        "GH200-96GB", "NVIDIA GH200 96GB HBM3 (480GB superchip; GPU memory only)", ("NVIDIA GH200 480GB",),
        _from_rounded_gib("94.88"),
        "cuda: torch OOM 'total capacity of 94.88 GiB' [litgpt#1892] (nvidia-smi 97,871 MiB)",
        ("gh200", "GH200-480GB"),
        _N,
    ),
    GpuSpec(
        "GH200-144GB", "NVIDIA GH200 144GB HBM3e (GPU memory only)", ("NVIDIA GH200 144G HBM3e",),
        144 * GiB, "nominal: 144 GB HBM3e, from the device name [vllm#18390]; no totals found",
        ("GH200-144G",),
        _N,
    ),
    GpuSpec(
        "H20", "NVIDIA H20 96GB", ("NVIDIA H20",),
        97_871 * MiB, "nvidia-smi: 97,871 MiB, drv 580.95.05 [nvtrust#128]",
        ("H20-96GB",),
        _N,
    ),
    GpuSpec(
        "H800", "NVIDIA H800 80GB HBM3 (SXM)", ("NVIDIA H800",),
        80 * GiB, "nominal: 80 GB HBM3, the H100 SXM's memory; device name from nvidia-smi -q [dcgm#120];"
        " no totals found",
        ("H800-80GB", "H800-SXM", "nvidia-h800"),
        _N,
    ),
    GpuSpec(
        "B200", "NVIDIA B200", ("NVIDIA B200",),
        _from_rounded_gib("178.35"),
        "cuda: cudaGetDeviceProperties 178.35, printed as 'GB' but GiB by arithmetic [ao#4002]"
        " (nvidia-smi 183,359 MiB [trtllm#10278])",
        ("B200-180GB", "B200-SXM", "nvidia-b200"),
        _N, _tb_per_s("8.0"), "NVIDIA Blackwell brief via torchao [ao-roofline] (7.67 effective per [ao#4002])",
    ),
    GpuSpec(
        "A100-80GB", "NVIDIA A100 80GB HBM2e (SXM4)", ("NVIDIA A100-SXM4-80GB",),
        85_198_045_184, "cuda: deviceQuery 81,251 MBytes (85,198,045,184 B), CUDA drv 11.4 [gengwg-gist]",
        ("A100-SXM4-80GB", "A100-SXM-80GB", "A100-80GB-SXM", "a100-80g", "nvidia-a100-80gb"),
        _N, _tb_per_s("2.039"), "secondary [cloud-atlas-a100]",
    ),
    GpuSpec(
        "A800-80GB", "NVIDIA A800 80GB (SXM4)", ("NVIDIA A800-SXM4-80GB",),
        81_920 * MiB, "nvidia-smi: 81,920 MiB, drv 535.86.10 [dexbotic#41] (a current driver's total, which"
        " includes the driver-reserved part)",
        ("A800-SXM4-80GB", "A800", "nvidia-a800"),
        _N,
    ),
    GpuSpec(
        "A800-80GB-PCIE", "NVIDIA A800 80GB PCIe", ("NVIDIA A800 80GB PCIe",),
        81_920 * MiB, "nvidia-smi: 81,920 MiB, drv 550.54.15 [vllm#41519]",
        ("A800-PCIE-80GB",),
        _N,
    ),
    GpuSpec(
        "A100-80GB-PCIE", "NVIDIA A100 80GB PCIe", ("NVIDIA A100 80GB PCIe",),
        84_974_239_744, "cuda: deviceQuery 81,038 MBytes (84,974,239,744 B), CUDA drv 12.4, ECC on [deac-a100pcie]",
        ("A100-PCIE-80GB",),
        _N,
    ),
    GpuSpec(
        "A100-40GB", "NVIDIA A100 40GB HBM2e (SXM4)", ("NVIDIA A100-SXM4-40GB",),
        42_298_834_944,
        "cuda: deviceQuery 40,339 MBytes (42,298,834,944 B), CUDA drv 12.2 [bottlerocket#3873];"
        " the lower of two CUDA reports (39.56 GiB [threestudio#402])",
        ("a100", "A100-SXM4-40GB", "A100-40GB-SXM", "nvidia-tesla-a100"),
        _N, _tb_per_s("1.555"), "secondary [hf-gpucat]",
    ),
    GpuSpec(
        "A100-40GB-PCIE", "NVIDIA A100 40GB PCIe", ("NVIDIA A100-PCIE-40GB",),
        42_298_834_944, "cuda: torch total 40,339.3125 MiB (42,298,834,944 B) [pruna-json]",
        ("A100-PCIE-40GB",),
        _N, _tb_per_s("1.555"), "secondary [cloud-atlas-a100]",
    ),
    GpuSpec(
        "A10G", "NVIDIA A10G 24GB GDDR6", ("NVIDIA A10G",),
        23_028 * MiB, "nvidia-smi: 23,028 MiB, drv 550.90.07, AWS g5 [vllm#9373]",
        ("nvidia-a10g",),
        _N, _tb_per_s("0.6"), "secondary [hf-gpucat]",
    ),
    GpuSpec(
        "A10", "NVIDIA A10 24GB GDDR6", ("NVIDIA A10",),
        _from_rounded_gib("22.18"), "cuda: torch OOM 'total capacity of 22.18 GiB' [minicpm#640]",
        ("A10-24GB", "nvidia-a10"),
        _N, _tb_per_s("0.6"), "secondary [kimbochen-gist]",
    ),
    GpuSpec(
        "A30", "NVIDIA A30 24GB HBM2", (),
        _from_rounded_gib("23.53"), "cuda: torch OOM 'total capacity of 23.53 GiB' [rbmod#5]",
        ("A30-24GB", "NVIDIA A30"),
        _N,
    ),
    GpuSpec(
        "A40", "NVIDIA A40 48GB GDDR6 (ECC)", ("NVIDIA A40",),
        47_608_692_736,
        "cuda: deviceQuery 45,403 MBytes (47,608,692,736 B), CUDA drv 12.4, ECC on [thamada-dq-a40]; a CUDA memory"
        " test prints 44.42 GiB [gpu-speed-test-a40]",
        ("A40-48GB",),
        _N, nvidia_smi_bytes=46_068 * MiB,
    ),
    GpuSpec(
        "L4", "NVIDIA L4 24GB GDDR6", ("NVIDIA L4",),
        _from_rounded_gib("22.03"),
        "cuda: torch OOM 'GPU 0 has a total capacity of 22.03 GiB' on an L4 [evo2#190]"
        " (nvidia-smi 23,034 MiB [modal#2797])",
        ("L4-24GB", "nvidia-l4"),
        _N, nvidia_smi_bytes=23_034 * MiB,
    ),
    GpuSpec(
        "L40", "NVIDIA L40 48GB GDDR6", (),
        _from_rounded_gib("44.40"), "cuda: torch OOM 'total capacity of 44.40 GiB' [eagle#68]",
        ("L40-48GB", "NVIDIA L40"),
        _N, _tb_per_s("0.864"), "secondary [mullet]",
    ),
    GpuSpec(
        "L20", "NVIDIA L20 48GB GDDR6", (),
        48 * GiB, "nominal: 48 GB [livetalking#545]; no totals found",
        ("L20-48GB", "NVIDIA L20", "nvidia-l20"),
        _N,
    ),
    GpuSpec(
        "L40S", "NVIDIA L40S 48GB GDDR6 (ECC)", ("NVIDIA L40S",),
        47_576_711_168,
        "cuda: deviceQuery 45,373 MBytes (47,576,711,168 B), CUDA drv 12.4, ECC on [cuda-device-query];"
        " the lower of two CUDA reports (44.42 GiB [stepvideo#8])",
        ("L40S-48GB", "nvidia-l40s"),
        _N, _tb_per_s("0.864"), "secondary [itc]",
    ),
    GpuSpec(
        "T4", "NVIDIA Tesla T4 16GB GDDR6", ("Tesla T4",),
        15_835_660_288, "cuda: deviceQuery 15,102 MBytes (15,835,660,288 B), CUDA drv 12.2 [t4-gist]",
        ("T4-16GB", "nvidia-tesla-t4"),
        _N, _tb_per_s("0.32"), "secondary [hf-gpucat]",
    ),
    GpuSpec(
        "V100-16GB", "NVIDIA Tesla V100 SXM2 16GB", ("Tesla V100-SXM2-16GB",),
        16_160 * MiB, "nvidia-smi: 16,160 MiB, drv 390.30 [pb-v100-16]",
        ("v100", "V100-SXM2-16GB", "nvidia-tesla-v100"),
        _N, _tb_per_s("0.9"), "secondary [hf-gpucat]",
    ),
    GpuSpec(
        "V100-32GB", "NVIDIA Tesla V100 32GB", ("Tesla V100-SXM2-32GB", "Tesla V100-PCIE-32GB"),
        34_058_272_768, "nvidia-smi: NVML memory_info.total 34,058,272,768 B, drv 418.67 [pb-v100-32]",
        ("V100-SXM2-32GB", "V100-PCIE-32GB"),
        _N, _tb_per_s("0.9"), "secondary [hf-gpucat]",
    ),
    GpuSpec(
        "RTX-3090", "NVIDIA GeForce RTX 3090 24GB", ("NVIDIA GeForce RTX 3090",),
        _from_rounded_gib("23.56"),
        "cuda: torch OOM 'total capacity of 23.56 GiB' [club3090#58];"
        " the lower of two CUDA reports (23.68 GiB [vllm#16343])",
        ("3090", "RTX3090"),
        _N, 936_100_000_000, "NVIDIA driver 'Memory bandwidth: 936.10 GB/s' [fab3090-gist]",
    ),
    GpuSpec(
        "RTX-4090", "NVIDIA GeForce RTX 4090 24GB", ("NVIDIA GeForce RTX 4090",),
        _from_rounded_gib("23.64"),
        "cuda: torch OOM 'total capacity of 23.64 GiB' [phidias#8];"
        " the lower of two CUDA reports (23.68 GiB [cogvideo#36])",
        ("4090", "RTX4090"),
        _N, _tb_per_s("1.008"), "secondary [mika-gist]",
    ),
    GpuSpec(
        "RTX-5090", "NVIDIA GeForce RTX 5090 32GB", ("NVIDIA GeForce RTX 5090",),
        33_677_180_928,
        "cuda: deviceQuery 32,117 MBytes (33,677,180,928 B), drv 570.133.04 [aikitoria#1]"
        " (vLLM printed 31.4 GiB [club3090#1087])",
        ("5090", "RTX5090"),
        _N, _tb_per_s("1.792"), "NVIDIA RTX Blackwell PDF via torchao [ao-roofline]",
    ),
    GpuSpec(
        "RTX-6000-ADA", "NVIDIA RTX 6000 Ada Generation 48GB", (),
        48 * GiB, "nominal: 48 GB, nothing sourced in gpus.md (not measured)",
        # The torch device name is not sourced either, so it is an alias here, not a device name.
        ("RTX6000-ADA", "RTX-6000-Ada-Generation", "NVIDIA RTX 6000 Ada Generation", "6000-ada"),
        _N,
    ),
    GpuSpec(
        "RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell 96GB GDDR7",
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        101_975_851_008, "cuda: Server Edition totalGlobalMem 101,975,851,008 B (94.97 GiB) [opticks-pro6000];"
        " torch total_memory=97250MB [internvl-pro6000]; device names [cfg-pro6000ws, cfg-pro6000se]",
        ("RTX-PRO-6000-96GB", "RTX-PRO-6000-Blackwell", "RTXPRO6000", "nvidia-rtx-pro-6000"),
        _N, nvidia_smi_bytes=97_887 * MiB,
    ),
    GpuSpec(
        "RTX-A6000", "NVIDIA RTX A6000 48GB GDDR6", ("NVIDIA RTX A6000",),
        48 * GiB, "nominal: 48 GB GDDR6 [lambda-csv]; no totals found",
        ("A6000", "RTXA6000"),
        _N,
    ),
    GpuSpec(
        "RTX-A5000", "NVIDIA RTX A5000 24GB GDDR6", ("NVIDIA RTX A5000",),
        25_402_343_424, "cuda: device query 24,226 MBytes (25,402,343,424 B), 64 SMs [a5000-query]",
        ("A5000", "RTXA5000"),
        _N,
    ),
    GpuSpec(
        "MI300X", "AMD Instinct MI300X 192GB HBM3", ("AMD Instinct MI300X",),
        8 * 25_767_706_624,
        "kfd: rocminfo size_in_bytes 25,767,706,624 B per CPX partition × 8 [rocm#4750]",
        ("MI300X-192GB", "amd-mi300x"),
        _A, _tb_per_s("5.3"), "AMD MI300X datasheet via torchao [ao-roofline]",
    ),
    GpuSpec(
        "MI325X", "AMD Instinct MI325X 256GB HBM3E", ("AMD Instinct MI325X",),
        256 * GiB, "nominal: 256 GiB, ROCm spec table [rocm-specs]; no totals found",
        ("MI325X-256GB", "amd-mi325x"),
        _A, _tb_per_s("6.0"), "secondary: AMD product page via [vultr]",
    ),
    GpuSpec(
        "MI355X", "AMD Instinct MI355X 288GB HBM3E", (),
        288 * GiB, "nominal: 288 GiB, ROCm spec table [rocm-specs]; no totals found",
        ("MI355X-288GB", "AMD Instinct MI355X", "amd-mi355x"),
        _A,
    ),
)

# CUDA compute capability of each NVIDIA card (NVIDIA's "CUDA GPUs" table): which kernel images load. vLLM's
# non-torch growth follows it (kvplan.engines.vllm_memory.non_torch_class). AMD cards have none.
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    **dict.fromkeys(("V100-16GB", "V100-32GB"), (7, 0)),
    "T4": (7, 5),
    **dict.fromkeys(("A100-80GB", "A100-80GB-PCIE", "A100-40GB", "A100-40GB-PCIE", "A800-80GB", "A800-80GB-PCIE",
                     "A30"), (8, 0)),
    **dict.fromkeys(("A10G", "A10", "A40", "RTX-3090", "RTX-A6000", "RTX-A5000"), (8, 6)),
    **dict.fromkeys(("L4", "L40", "L20", "L40S", "RTX-4090", "RTX-6000-ADA"), (8, 9)),
    **dict.fromkeys(("H100-80GB", "H100-PCIE", "H100-NVL", "H200", "H200-NVL", "GH200-96GB", "GH200-144GB", "H20",
                     "H800"), (9, 0)),
    "B200": (10, 0),
    **dict.fromkeys(("RTX-5090", "RTX-PRO-6000"), (12, 0)),
}

# Streaming multiprocessors of each NVIDIA card (NVIDIA's datasheets and architecture whitepapers), and the
# threads one SM holds resident by compute capability (the CUDA C++ Programming Guide's "maximum number of
# resident threads per SM"). The CUDA context reserves local memory for every resident thread at once, so its
# size follows SMs x threads (kvplan.engines.vllm_memory.cuda_context_bytes).
SM_COUNT: dict[str, int] = {
    **dict.fromkeys(("V100-16GB", "V100-32GB"), 80),
    "T4": 40,
    **dict.fromkeys(("A100-80GB", "A100-80GB-PCIE", "A100-40GB", "A100-40GB-PCIE", "A800-80GB", "A800-80GB-PCIE"),
                    108),
    "A30": 56, "A10G": 80, "A10": 72, "A40": 84, "RTX-3090": 82, "RTX-A6000": 84, "RTX-A5000": 64,
    "L4": 58, "L40": 142, "L40S": 142, "L20": 92, "RTX-4090": 128, "RTX-6000-ADA": 142,
    **dict.fromkeys(("H100-80GB", "H100-NVL", "H200", "H200-NVL", "GH200-96GB", "GH200-144GB", "H800"), 132),
    "H100-PCIE": 114, "H20": 78,
    "B200": 148, "RTX-5090": 170, "RTX-PRO-6000": 188,
}
THREADS_PER_SM: dict[tuple[int, int], int] = {
    (7, 0): 2048, (7, 5): 1024, (8, 0): 2048, (8, 6): 1536, (8, 9): 1536, (9, 0): 2048, (10, 0): 2048,
    (12, 0): 1536,
}


def resident_threads(gpu_key: str) -> int | None:
    """Threads the whole card holds resident (SMs x threads per SM); None where kvplan does not know them
    (AMD, a card typed with --gpu-mem). RTX 3090: 82 x 1,536 = 125,952."""
    sms, capability = SM_COUNT.get(gpu_key), COMPUTE_CAPABILITY.get(gpu_key)
    if sms is None or capability is None:
        return None
    return sms * THREADS_PER_SM[capability]


# Compared side by side when the user names no GPU.
COMMON_GPUS: tuple[str, ...] = (
    "L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "MI300X",
)

# AWS instance family (the part before the dot in "p4d.24xlarge") -> the GPU every size of it carries.
_AWS_FAMILIES: dict[str, str] = {
    "g4dn": "T4",
    "g5": "A10G",
    "g6": "L4",
    "g6e": "L40S",
    "p3": "V100-16GB",
    "p3dn": "V100-32GB",
    "p4d": "A100-40GB",
    "p4de": "A100-80GB",
    "p5": "H100-80GB",
    "p5e": "H200",
    "p5en": "H200",
    "p6-b200": "B200",
}
_AWS_TYPE = re.compile(r"^([a-z][a-z0-9-]*)\.(\d*x?large|metal(?:-[a-z0-9]+)?)$")

# GCP accelerator-optimized machine types, by the part before the GPU count ("a3-highgpu-8g" -> "a3-highgpu"):
# A2 Standard carries A100 40GB, A2 Ultra A100 80GB, A3 High/Edge H100 80GB, A3 Mega H100 Mega 80GB, A3 Ultra
# H200, A4 B200, G2 L4 (its sizes are "g2-standard-N").
_GCP_FAMILIES: dict[str, str] = {
    "a2-highgpu": "A100-40GB",
    "a2-megagpu": "A100-40GB",
    "a2-ultragpu": "A100-80GB",
    "a3-highgpu": "H100-80GB",
    "a3-edgegpu": "H100-80GB",
    "a3-megagpu": "H100-80GB",
    "a3-ultragpu": "H200",
    "a4-highgpu": "B200",
    "g2-standard": "L4",
}
_GCP_TYPE = re.compile(r"^([a-z]\d-[a-z]+)-\d+g?$")

# Azure GPU VM sizes name the GPU after the size ("Standard_ND96isr_H100_v5", "Standard_NC24ads_A100_v4");
# older series do not, and are keyed by series and version ("Standard_NC24s_v3": NCv3 = V100 16GB).
_AZURE_TYPE = re.compile(r"^standard_(n[cdv])(\d+)([a-z]*)(?:_([a-z0-9]+))?_v(\d+)$")
_AZURE_NAMED: dict[str, str] = {
    "h100": "H100-80GB",  # ND H100 v5 (SXM); the NC H100 v5 sizes are handled below (NVL)
    "h200": "H200",
    "a100": "A100-80GB",  # ND A100 v4 (80GB, SXM) ... NC A100 v4 carries the PCIe card, handled below
    "t4": "T4",
    "a10": "A10",
    "mi300x": "MI300X",
}
_AZURE_SERIES: dict[tuple[str, str], str] = {
    ("nc", "3"): "V100-16GB",  # NCv3
    ("nd", "2"): "V100-32GB",  # NDv2 (ND40rs_v2)
    ("nd", "4"): "A100-40GB",  # ND A100 v4 (ND96asr_v4)
}

# Oracle Cloud shapes: "BM.GPU.H100.8" names the GPU in its third part; two older shapes do not.
_OCI_SHAPE = re.compile(r"^(?:bm|vm)\.(gpu\d*)(?:\.([a-z0-9-]+))?\.\d+$")
_OCI_NAMED: dict[str, str] = {"a100-v2": "A100-80GB"}
_OCI_FAMILIES: dict[str, str] = {"gpu4": "A100-40GB"}

# Leading words that labels and device names add around the model name: "NVIDIA-H100-80GB-HBM3"
# (nvidia.com/gpu.product), "nvidia-tesla-t4" (GKE), "nvidia-gpu-l4" (KubeAI), "AMD Instinct MI300X".
_PREFIXES = ("nvidia", "tesla", "geforce", "amd", "instinct", "gpu")
# GPU feature discovery appends "-SHARED" to the product label when time-slicing is on.
_SUFFIXES = ("shared",)
_MIG = re.compile(r"mig[-_ .]?\d+g[._]?\d+gb", re.IGNORECASE)


def _squash(text: str) -> str:
    """Lower case with every separator dropped: "NVIDIA_H100 80GB-HBM3" -> "nvidiah10080gbhbm3"."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _core(text: str) -> str:
    """The squashed name without vendor words in front or label words behind: "nvidiateslat4" -> "t4"."""
    name = _squash(text)
    changed = True
    while changed:
        changed = False
        for word in _PREFIXES:
            if name.startswith(word) and len(name) > len(word):
                name, changed = name[len(word):], True
        for word in _SUFFIXES:
            if name.endswith(word) and len(name) > len(word):
                name, changed = name[: -len(word)], True
    return name


def _build_index(catalog: tuple[GpuSpec, ...]) -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for gpu in catalog:
        for name in (gpu.key, *gpu.aliases, *gpu.device_names):
            core = _core(name)
            other = index.get(core)
            if other is not None and other.key != gpu.key:
                raise ValueError(f"GPU catalog: name {name!r} means both {other.key} and {gpu.key}")
            index[core] = gpu
    return index


_BY_KEY: dict[str, GpuSpec] = {gpu.key: gpu for gpu in _CATALOG}
_INDEX: dict[str, GpuSpec] = _build_index(_CATALOG)


def all_gpus() -> tuple[GpuSpec, ...]:
    """Every catalogued GPU, in catalog order (NVIDIA data-centre, workstation/consumer, then AMD)."""
    return _CATALOG


def _cloud_instance(text: str) -> GpuSpec | None:
    """The GPU of an AWS/GCP/Azure instance type or OCI shape, None if `text` is none; unknown AWS families raise.

    A bare AWS family ("p5", Karpenter's instance-family label) names its GPU too.
    """
    lowered = text.strip().lower()
    if lowered in _AWS_FAMILIES:
        return _BY_KEY[_AWS_FAMILIES[lowered]]
    gcp = _GCP_TYPE.match(lowered)
    if gcp and gcp.group(1) in _GCP_FAMILIES:
        return _BY_KEY[_GCP_FAMILIES[gcp.group(1)]]
    azure = _AZURE_TYPE.match(lowered)
    if azure:
        return _azure(azure, text)
    aws = _AWS_TYPE.match(lowered)
    if aws:
        family = aws.group(1)
        if family in _AWS_FAMILIES:
            return _BY_KEY[_AWS_FAMILIES[family]]
        raise InputError(
            f"unknown GPU '{text}': AWS instance family '{family}' is not one kvplan knows"
            f" ({', '.join(_AWS_FAMILIES)}); name the GPU instead, or give --gpu-mem 48GiB"
        )
    oci = _OCI_SHAPE.match(lowered)
    if oci:
        family, named = oci.group(1), oci.group(2)
        if named is None and family in _OCI_FAMILIES:
            return _BY_KEY[_OCI_FAMILIES[family]]
        if named is not None:
            key = _OCI_NAMED.get(named)
            return _BY_KEY[key] if key else _INDEX.get(_core(named))
    return None


def _azure(match: re.Match[str], text: str) -> GpuSpec:
    """The GPU of an Azure N-series size: by the GPU its name carries, else by series and version."""
    series, named, version = match.group(1), match.group(4), match.group(5)
    if series == "nv" and named == "a10" and int(match.group(2)) < 36:
        # NVads A10 v5 below 36 vCPUs is a slice of one A10 (1/6, 1/3, 1/2 of its memory).
        raise InputError(f"GPU '{text}' is a fraction of an A10; give its memory with --gpu-mem")
    if named == "h100" and series == "nc":
        return _BY_KEY["H100-NVL"]  # NC H100 v5 sizes carry the H100 NVL
    if named == "a100" and series == "nc":
        return _BY_KEY["A100-80GB-PCIE"]  # NC A100 v4 sizes carry the A100 80GB PCIe
    if named in _AZURE_NAMED:
        return _BY_KEY[_AZURE_NAMED[named]]
    if (series, version) in _AZURE_SERIES:
        return _BY_KEY[_AZURE_SERIES[(series, version)]]
    raise InputError(
        f"unknown GPU '{text}': Azure size series N{series[1].upper()} v{version} is not one kvplan knows;"
        " name the GPU instead, or give --gpu-mem 48GiB"
    )


def find_gpu(name: str) -> GpuSpec:
    """Look a GPU up by key, alias, device name, k8s label, AWS instance type or OCI shape, ignoring case.

    find_gpu("NVIDIA-H100-80GB-HBM3"), find_gpu("h100"), find_gpu("p5.48xlarge"), find_gpu("a3-highgpu-8g")
    and find_gpu("Standard_ND96isr_H100_v5") all give H100-80GB.
    """
    text = str(name).strip()
    if not _squash(text):
        raise InputError("GPU name is empty; name one (see `kvplan gpus`), or give --gpu-mem 48GiB")
    if _MIG.search(text):
        raise InputError(
            f"GPU '{text}' is a MIG slice; the catalog holds whole GPUs: give the slice's memory with"
            " --gpu-mem (for example --gpu-mem 10GiB)"
        )
    found = _INDEX.get(_core(text)) or _cloud_instance(text)
    if found is not None:
        return found
    guesses = difflib.get_close_matches(_core(text), list(_INDEX), n=8, cutoff=0.6)
    keys = list(dict.fromkeys(_INDEX[g].key for g in guesses))[:3]
    hint = f"; did you mean {', '.join(keys)}?" if keys else ""
    raise InputError(f"unknown GPU '{text}'{hint} (see `kvplan gpus`, or give --gpu-mem 48GiB)")


def custom_gpu(total_memory_bytes: int, name: str = "custom") -> GpuSpec:
    """A GPU the catalog lacks, from a size the user gives (--gpu-mem 48GiB -> 51,539,607,552 B)."""
    if isinstance(total_memory_bytes, bool) or not isinstance(total_memory_bytes, int):
        raise InputError(f"--gpu-mem: expected a whole number of bytes, got {total_memory_bytes!r}")
    if total_memory_bytes <= 0:
        raise InputError(f"--gpu-mem: GPU memory must be positive, got {total_memory_bytes} B")
    return GpuSpec(
        key=name,
        display_name=f"{name} ({total_memory_bytes / GiB:,.2f} GiB)",
        device_names=(),
        total_memory_bytes=total_memory_bytes,
        memory_source="given: --gpu-mem",
        aliases=(),
        vendor="unknown",
    )


def other_variants(name: str) -> tuple[str, ...]:
    """Catalog cards a bare family name could also mean: "A100" is read as A100-40GB, but A100-80GB and the
    PCIe cards are A100s too. Empty when the name is a card's own key or names one card only."""
    core = _core(name)
    chosen = _INDEX.get(core)
    if chosen is None or core == _core(chosen.key):
        return ()
    family = re.match(r"[a-z]+\d+", core)
    if family is None:
        return ()
    # Only the cards people usually mean (COMMON_GPUS): "H100" is the SXM card; an A100 may well be an 80 GB one.
    return tuple(k for k in COMMON_GPUS if k != chosen.key and _core(k).startswith(family.group(0)))
