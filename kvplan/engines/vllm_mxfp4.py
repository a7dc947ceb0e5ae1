"""gpt-oss's mxfp4 MoE experts as vLLM loads them: padded for the kernel backend the GPU gets.

docs/engine-rules.md 1.10 (vLLM 0.10.1+, mxfp4_round_up_hidden_size_and_intermediate_size). The checkpoint
holds per expert w13 = [2I, H] and w2 = [H, I] as packed 4-bit values (2 per byte) with one e8m0 scale byte
per 32 values and bf16 biases. At load:
- every backend rounds the per-rank intermediate I/tp and the hidden size H up to its tile;
- OpenAI's Triton kernels (Hopper) also swizzle the packed values into a layout padded to 64 in both dims,
  keep a swizzled copy of the scales beside the original scale parameters, and convert biases to float32.
gpt-oss-20b (24 layers x 32 experts, H = I = 2,880) on H100 at tp 1: the experts grow from 9.47 to 10.23 GiB,
so the weights from 12.83 to 13.60 GiB (vLLM logs 13.64); at tp 2 from 6.43 to 6.96 GiB (logged 7.01).
"""

from __future__ import annotations

from kvplan.hardware.gpus import GpuSpec
from kvplan.records import dataclass
from kvplan.units import cdiv, round_up

MX_BLOCK = 32  # values per e8m0 scale byte


@dataclass(frozen=True)
class Mxfp4Backend:
    """One backend's padding: intermediate per rank and hidden rounded up to these multiples."""

    name: str
    intermediate_multiple: int
    hidden_multiple: int
    swizzle: bool = False  # Triton's Hopper layout: packed dims to 64, scales kept twice, fp32 biases


TRITON = Mxfp4Backend("triton", 64, 1, swizzle=True)
MARLIN = Mxfp4Backend("marlin", 128, 256)
FLASHINFER_TRTLLM = Mxfp4Backend("flashinfer-trtllm", 256, 256)
ROCM = Mxfp4Backend("rocm", 256, 256)

# vLLM's choice (quantization/mxfp4.py get_mxfp4_backend, 0.10.1-0.18; fused_moe/oracle/mxfp4.py, 0.19):
# FlashInfer TRT-LLM on SM100 where FlashInfer is importable, CK on ROCm, Triton on SM90-SM10x where OpenAI's
# triton_kernels is, Marlin on the rest (Ampere and Ada have no Triton mxfp4 kernel). vllm_versions says which
# installs have FlashInfer and triton_kernels in each release.
_HOPPER = ("H100", "H200", "H20", "GH200")
_BLACKWELL = ("B200", "GB200", "B300", "GB300")


def release_backend(gpu: GpuSpec, *, triton: str, flashinfer_dependency: bool, install: str) -> Mxfp4Backend:
    """The backend a release installed as `install` ("image" or "wheel") gives `gpu`; `triton` and
    `flashinfer_dependency` are the release's rules (VllmRules.mxfp4_triton, .flashinfer_dependency): before
    0.12 a wheel has neither triton_kernels nor FlashInfer, the image both (0.10.2+)."""
    return backend_for(gpu, triton_kernels=triton == "vendored" or (triton == "package" and install == "image"),
                       flashinfer=flashinfer_dependency or install == "image")


def backend_for(gpu: GpuSpec, *, triton_kernels: bool = True, flashinfer: bool = True) -> Mxfp4Backend:
    """The backend `gpu` gets, given whether triton_kernels and FlashInfer are importable (an H100 on a 0.11
    wheel has neither: Marlin)."""
    key = gpu.key.upper()
    if gpu.vendor == "amd":
        return ROCM
    if key.startswith(_BLACKWELL) and flashinfer:
        return FLASHINFER_TRTLLM
    if key.startswith(_HOPPER + _BLACKWELL) and triton_kernels:
        return TRITON
    return MARLIN


def expert_bytes_per_rank(
    *, experts: int, layers: int, hidden: int, intermediate: int, ranks: int, bias_bytes: int, backend: Mxfp4Backend,
) -> int:
    """Loaded bytes of all mxfp4 experts (values, scales, biases) on one rank, intermediate split over `ranks`.

    gpt-oss-20b on Triton at tp 2: I/2 = 1,440 -> 1,472. Per expert the packed w13 [2,944, 1,440] is stored
    transposed and padded to [1,472, 2,944]; w2 [2,880, 736] to [768, 2,880]: 6,545,408 B; scales
    2,944 x 90 + 2,880 x 46 = 397,440 B, kept twice; fp32 biases (2,944 + 2,880) x 4 = 23,296 B. 768 experts:
    768 x (6,545,408 + 794,880 + 23,296) = 5,655,232,512 B.
    """
    inter = round_up(cdiv(intermediate, ranks), backend.intermediate_multiple)
    hid = round_up(hidden, backend.hidden_multiple)
    if backend.swizzle:
        values = round_up(hid // 2, 64) * round_up(2 * inter, 64) + round_up(inter // 2, 64) * round_up(hid, 64)
    else:
        values = 2 * inter * hid // 2 + hid * inter // 2
    scales = 2 * inter * cdiv(hid, MX_BLOCK) + hid * cdiv(inter, MX_BLOCK)
    biases = (2 * inter + hid) * (4 if backend.swizzle else bias_bytes)
    copies = 2 if backend.swizzle else 1
    return experts * layers * (values + copies * scales + biases)
