"""The GPU catalog: figures pinned to their sources, and every way a user or a deploy file names a GPU."""

from __future__ import annotations

import math
import re

import pytest

from kvplan.errors import InputError
from kvplan.hardware.gpus import (
    COMMON_GPUS,
    COMPUTE_CAPABILITY,
    MEMORY_KINDS,
    SM_COUNT,
    THREADS_PER_SM,
    GpuSpec,
    all_gpus,
    custom_gpu,
    find_gpu,
    resident_threads,
)
from kvplan.units import GiB, MiB


def test_h100_sxm_total_is_the_cuda_figure_solved_from_the_vllm_logs():
    # vLLM 0.19.0 prints total_memory=79.19GiB for every H100 run in vllm-startup-logs.jsonl.
    total = find_gpu("h100").total_memory_bytes
    assert round(total / GiB, 2) == 79.19
    # Exact bytes: the two gpt-oss-20b tp=2 runs differ only in gpu_memory_utilization (0.95 vs 0.9);
    # their "--kv-cache-memory=N to fit into requested memory" suggestions are
    # ceil(total × util) − (the same non-KV bytes) − 150 MiB:
    fit_095, fit_090 = 66_128_745_472, 61_877_326_848
    # so ceil(0.95 T) − ceil(0.9 T) = 4,251,418,624 = 0.05 T (± 1) -> T = 85,028,372,480 = 81,089.375 MiB.
    assert total == 85_028_372_480 == 81_089 * MiB + 384 * 1024
    assert math.ceil(total * 0.95) - math.ceil(total * 0.9) == fit_095 - fit_090
    # Other figures quoted for this card do not reproduce that difference: 81,088 MiB (79.1875 GiB) falls
    # 72,090 B short and 85,029,158,912 B (81,090.125 MiB) is 39,322 B over.
    for wrong, off_bytes in ((81_088 * MiB, -72_090), (85_029_158_912, 39_322)):
        assert math.ceil(wrong * 0.95) - math.ceil(wrong * 0.9) - (fit_095 - fit_090) == off_bytes
    # Every suggestion in the logs is a multiple of 512 B, so ceil(0.95 T) is too: 80,776,953,856 B.
    assert math.ceil(total * 0.95) == 80_776_953_856 and 80_776_953_856 % 512 == 0
    # vLLM's printed "Desired GPU memory utilization is (0.95, 75.23 GiB)" and "(0.9, 71.27 GiB)".
    assert round(math.ceil(total * 0.95) / GiB, 2) == 75.23
    assert round(math.ceil(total * 0.9) / GiB, 2) == 71.27
    # Free at startup = requested + (fully-utilize − fit) suggestion gap: 80,776,953,856 + (68,789,657,600
    # − 65,088,610,304) = 84,478,001,152 B, logged as 78.68 GiB, leaving the logged cuda_memory 0.51 GiB.
    free = math.ceil(total * 0.95) + (68_789_657_600 - 65_088_610_304)
    assert round(free / GiB, 2) == 78.68
    assert round((total - free) / GiB, 2) == 0.51
    # nvidia-smi shows 81,559 MiB for this card: 469.625 MiB more, the driver-reserved gap gpus.md notes.
    assert 81_559 * MiB - total == 469 * MiB + 640 * 1024


# Entries a source gave in exact bytes, pinned to those bytes.
@pytest.mark.parametrize(
    ("key", "total_bytes"),
    [
        ("A100-80GB", 85_198_045_184),  # deviceQuery 81,251 MBytes
        ("A100-40GB", 42_298_834_944),  # deviceQuery 40,339 MBytes
        ("A100-40GB-PCIE", 42_298_834_944),  # torch 40,339.3125 MiB × 2**20
        ("A100-80GB-PCIE", 84_974_239_744),  # deviceQuery 81,038 MBytes, CUDA 12.4, ECC on
        ("L40S", 47_576_711_168),  # deviceQuery 45,373 MBytes
        ("T4", 15_835_660_288),  # deviceQuery 15,102 MBytes
        ("RTX-5090", 33_677_180_928),  # deviceQuery 32,117 MBytes
        ("RTX-PRO-6000", 101_975_851_008),  # Server Edition totalGlobalMem; torch prints 97,250 MiB
        ("V100-32GB", 34_058_272_768),  # NVML memory_info.total
        ("MI300X", 206_141_652_992),  # 25,767,706,624 B per CPX partition × 8
        ("A10G", 23_028 * 1_048_576),  # nvidia-smi 23,028 MiB
        ("RTX-6000-ADA", 48 * 1_073_741_824),  # nominal 48 GB, nothing measured
    ],
)
def test_exact_totals(key, total_bytes):
    assert find_gpu(key).total_memory_bytes == total_bytes


# Entries a source printed only as GiB to 2 decimals: stored as the nearest MiB, so they print back the same.
@pytest.mark.parametrize(
    ("key", "printed_gib", "nearest_mib"),
    [
        ("GH200-96GB", 94.88, 97_157),  # 94.88 × 1024 = 97,157.12
        ("B200", 178.35, 182_630),  # 178.35 × 1024 = 182,630.4
        ("A10", 22.18, 22_712),  # 22.18 × 1024 = 22,712.32
        ("A30", 23.53, 24_095),  # 23.53 × 1024 = 24,094.72
        ("L40", 44.40, 45_466),  # 44.40 × 1024 = 45,465.6
        ("RTX-3090", 23.56, 24_125),  # 23.56 × 1024 = 24,125.44
        ("RTX-4090", 23.64, 24_207),  # 23.64 × 1024 = 24,207.36
        ("L4", 22.03, 22_559),  # 22.03 × 1024 = 22,558.72
    ],
)
def test_rounded_gib_totals_round_trip(key, printed_gib, nearest_mib):
    gpu = find_gpu(key)
    assert gpu.total_memory_bytes == nearest_mib * MiB
    assert round(gpu.total_memory_bytes / GiB, 2) == printed_gib
    assert gpu.memory_kind == "cuda"


@pytest.mark.parametrize("gpu", all_gpus(), ids=lambda g: g.key)
def test_every_entry_says_which_figure_it_holds(gpu: GpuSpec):
    assert gpu.memory_kind in MEMORY_KINDS
    assert gpu.memory_kind != "given"
    if gpu.memory_kind != "nominal":
        # Every measured figure names its source with a citation tag from gpus.md.
        assert re.search(r"\[[^\]]+\]", gpu.memory_source), gpu.memory_source
    assert isinstance(gpu.total_memory_bytes, int) and gpu.total_memory_bytes > 0
    assert gpu.vendor in ("nvidia", "amd")
    if gpu.bandwidth_bytes_per_s is None:
        assert gpu.bandwidth_source == "" or gpu.bandwidth_source.startswith("unknown")
    else:
        assert gpu.bandwidth_bytes_per_s > 0 and re.search(r"\[[^\]]+\]", gpu.bandwidth_source)


def test_unsourced_and_stand_in_figures_are_labelled():
    assert find_gpu("RTX 6000 Ada").memory_kind == "nominal"
    assert "not measured" in find_gpu("RTX 6000 Ada").memory_source
    # The H100 PCIe reports the SXM card's totalGlobalMem and nvidia-smi total, so it takes the SXM's CUDA total.
    pcie, sxm = find_gpu("H100 PCIe"), find_gpu("h100")
    assert (pcie.memory_kind, pcie.total_memory_bytes, pcie.smi_total_bytes) == \
        ("cuda", sxm.total_memory_bytes, 81_559 * MiB)
    assert find_gpu("H100 NVL").memory_kind == "nvidia-smi"
    assert find_gpu("L4").memory_kind == "cuda"
    assert find_gpu("h100").memory_kind == "vllm-log"
    # Conflicting secondary bandwidth figures (3.93 vs 4.8 TB/s) are not picked between.
    assert find_gpu("H100 NVL").bandwidth_bytes_per_s is None


def test_nvidia_smi_total_kept_beside_the_cuda_one():
    # SGLang sizes its defaults by nvidia-smi's total (get_nvgpu_memory_capacity), vLLM its budget by CUDA's: the
    # L4 shows 23,034 MiB in nvidia-smi and 22.03 GiB (22,559 MiB) to torch, 475 MiB the driver keeps.
    l4 = find_gpu("L4")
    assert (l4.smi_total_bytes, l4.total_memory_bytes) == (23_034 * MiB, 22_559 * MiB)
    assert find_gpu("H200").smi_total_bytes == 143_771 * MiB
    # Where the catalog knows one figure, it stands for both.
    assert find_gpu("A10G").smi_total_bytes == find_gpu("A10G").total_memory_bytes == 23_028 * MiB


def test_bandwidth_is_in_bytes_per_second():
    assert find_gpu("h100").bandwidth_bytes_per_s == 3_350_000_000_000  # 3.35 TB/s
    assert find_gpu("RTX 3090").bandwidth_bytes_per_s == 936_100_000_000  # 936.10 GB/s
    assert find_gpu("L4").bandwidth_bytes_per_s is None  # gpus.md gives none


@pytest.mark.parametrize(
    "name",
    [
        "A10G", "A10", "L4", "L40S", "L40", "A100-40GB", "A100 SXM4 40GB", "A100 PCIe 40GB", "A100-80GB",
        "A100 SXM4 80GB", "A100 80GB PCIe", "H100 SXM", "H100 PCIe", "H100 NVL", "H200", "GH200",
        "GH200 144GB", "H20", "B200", "MI300X", "MI325X", "RTX 4090", "RTX 5090", "RTX 6000 Ada",
        "RTX 3090", "T4", "V100 16GB", "V100 32GB", "RTX A6000",
    ],
)
def test_required_gpus_are_catalogued(name):
    assert find_gpu(name) in all_gpus()


@pytest.mark.parametrize(
    ("names", "key"),
    [
        (["h100", "H100", "H100-80GB", "NVIDIA H100 80GB HBM3", "h100-sxm", "H100 SXM5", "nvidia-h100-80gb",
          "NVIDIA-H100-80GB-HBM3", "NVIDIA_H100_80GB_HBM3", "nvidia-h100-mega-80gb", "nvidia-gpu-h100"],
         "H100-80GB"),
        (["a100-80gb", "A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "nvidia-a100-80gb", "NVIDIA-A100-SXM4-80GB",
          "nvidia-gpu-a100-80gb"], "A100-80GB"),
        (["a100", "nvidia-tesla-a100", "NVIDIA A100-SXM4-40GB"], "A100-40GB"),
        (["NVIDIA A100-PCIE-40GB", "NVIDIA_A100-PCIe-40GB"], "A100-40GB-PCIE"),
        (["l4", "nvidia-l4", "NVIDIA L4", "NVIDIA-L4", "nvidia-gpu-l4"], "L4"),
        (["a10g", "NVIDIA A10G", "NVIDIA-A10G-SHARED"], "A10G"),
        (["t4", "Tesla T4", "Tesla-T4", "nvidia-tesla-t4"], "T4"),
        (["v100", "Tesla V100-SXM2-16GB", "nvidia-tesla-v100"], "V100-16GB"),
        (["h200", "NVIDIA H200", "nvidia-h200-141gb"], "H200"),
        (["h200 nvl", "NVIDIA H200 NVL", "H200NVL"], "H200-NVL"),
        (["gh200", "NVIDIA GH200 480GB", "nvidia-gpu-gh200"], "GH200-96GB"),
        (["b200", "nvidia-b200", "NVIDIA B200"], "B200"),
        (["mi300x", "AMD Instinct MI300X", "AMD_Instinct_MI300X", "amd-gpu-mi300x"], "MI300X"),
        (["rtx 4090", "NVIDIA GeForce RTX 4090", "NVIDIA_GeForce_RTX_4090", "4090"], "RTX-4090"),
    ],
)
def test_aliases_resolve_to_the_same_entry(names, key):
    assert {find_gpu(n).key for n in names} == {key}
    assert find_gpu(names[0]) is find_gpu(key)


@pytest.mark.parametrize(
    ("instance", "key"),
    [
        ("g5.xlarge", "A10G"),
        ("g5.48xlarge", "A10G"),
        ("g6.2xlarge", "L4"),
        ("g6e.12xlarge", "L40S"),
        ("g4dn.xlarge", "T4"),
        ("p3.8xlarge", "V100-16GB"),
        ("p3dn.24xlarge", "V100-32GB"),
        ("p4d.24xlarge", "A100-40GB"),
        ("p4de.24xlarge", "A100-80GB"),
        ("p5.48xlarge", "H100-80GB"),
        ("p5e.48xlarge", "H200"),
        ("P5EN.48XLARGE", "H200"),
        ("p6-b200.48xlarge", "B200"),
        ("BM.GPU.H100.8", "H100-80GB"),  # OCI shape, as in deploy-files/
        ("BM.GPU.A100-v2.8", "A100-80GB"),
        ("BM.GPU4.8", "A100-40GB"),
    ],
)
def test_cloud_instance_types_resolve(instance, key):
    assert find_gpu(instance).key == key


def test_every_key_alias_and_device_name_finds_its_own_entry():
    for gpu in all_gpus():
        for name in (gpu.key, *gpu.aliases, *gpu.device_names):
            assert find_gpu(name) is gpu, name
            assert find_gpu(name.upper()) is gpu and find_gpu(name.lower()) is gpu


def test_every_nvidia_card_has_a_compute_capability_and_no_other_key_does():
    keys = {g.key for g in all_gpus()}
    nvidia = {g.key for g in all_gpus() if g.vendor == "nvidia"}
    assert set(COMPUTE_CAPABILITY) == nvidia and nvidia < keys
    assert COMPUTE_CAPABILITY["T4"] == (7, 5) and COMPUTE_CAPABILITY["H200"] == (9, 0)
    # The CUDA context's local memory needs every NVIDIA card's SMs and its capability's resident threads.
    assert set(SM_COUNT) == nvidia and set(COMPUTE_CAPABILITY.values()) <= set(THREADS_PER_SM)
    assert resident_threads("H100-80GB") == 132 * 2048 and resident_threads("L4") == 58 * 1536
    assert resident_threads("MI300X") is None and resident_threads(custom_gpu(GiB).key) is None


def test_common_gpus_are_catalogue_keys():
    assert COMMON_GPUS == ("L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-80GB", "H200", "B200", "MI300X")
    assert [find_gpu(k).key for k in COMMON_GPUS] == list(COMMON_GPUS)


@pytest.mark.parametrize(("typo", "suggested"), [("H100-90GB", "H100-80GB"), ("rtx4070", "RTX-4090"),
                                                   ("L40SS", "L40S"), ("mi330x", "MI300X")])
def test_unknown_gpu_suggests_the_close_match(typo, suggested):
    with pytest.raises(InputError) as err:
        find_gpu(typo)
    message = err.value.message
    assert message.startswith(f"unknown GPU '{typo}'; did you mean ")
    assert suggested in message.split("did you mean ")[1].split("?")[0]
    assert message.endswith("(see `kvplan gpus`, or give --gpu-mem 48GiB)")
    assert "\n" not in message and err.value.exit_code == 2


def test_unknown_gpu_without_a_close_match():
    with pytest.raises(InputError, match=r"^unknown GPU 'zzzz' \(see `kvplan gpus`, or give --gpu-mem 48GiB\)$"):
        find_gpu("zzzz")


@pytest.mark.parametrize("name", ["", "   ", "--"])
def test_empty_gpu_name(name):
    with pytest.raises(InputError, match="GPU name is empty"):
        find_gpu(name)


def test_unknown_aws_family_and_mig_slice_say_what_to_do():
    with pytest.raises(InputError, match=r"AWS instance family 'm5' .*--gpu-mem"):
        find_gpu("m5.large")
    with pytest.raises(InputError, match=r"MIG slice.*--gpu-mem"):
        find_gpu("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")


def test_custom_gpu():
    gpu = custom_gpu(48 * GiB)
    assert gpu.total_memory_bytes == 51_539_607_552  # 48 × 2**30
    assert gpu.memory_kind == "given" and gpu.key == "custom" and gpu.bandwidth_bytes_per_s is None
    assert custom_gpu(10 * GiB, name="A100-MIG-1g.10gb").key == "A100-MIG-1g.10gb"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="--gpu-mem"):
            custom_gpu(bad)  # type: ignore[arg-type]


def test_specs_are_frozen():
    with pytest.raises(AttributeError):
        find_gpu("h100").total_memory_bytes = 1  # type: ignore[misc]


def test_the_h200_total_is_the_one_measured_on_an_h200():
    # benchmarks/results/gpu/cuda_facts.json: torch.cuda.mem_get_info() total on one H200, which vLLM budgets
    # from: 150,109,880,320 B = 143,155.9375 MiB = 139.8011 GiB.
    assert find_gpu("NVIDIA H200").total_memory_bytes == 150_109_880_320
    assert round(150_109_880_320 / GiB, 2) == 139.80


def test_nvlink_sharp_only_on_nvswitch_boxes():
    # NCCL's NVLink SHARP buffers need NVSwitch: the HGX H200 has it, the H200 NVL (PCIe cards with bridges at
    # most) does not, though its key starts with the same letters. vLLM's non-torch growth at tp 2 follows.
    from kvplan.engines.vllm_memory import non_torch_class

    assert non_torch_class("H200", 2, 1) == "nvls_tp2"
    assert non_torch_class("H200-NVL", 2, 1) == "other_tp"
    assert non_torch_class("H100-NVL", 4, 1) == "other_tp"
    assert non_torch_class("GH200-96GB", 2, 1) == "nvls_tp2"
