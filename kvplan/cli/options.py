"""The options `estimate`, `verify` and `plan` share, declared once, grouped into help panels.

vLLM's spellings are accepted beside kvplan's short ones (--max-model-len for --seq, -tp for --tp), so a
`vllm serve` command line can be pasted. Engine-specific options default to None: kvplan.cli.flags then
knows which were given, and refuses one the selected engine does not have.
"""

from __future__ import annotations

from typing import Annotated

import typer

WORKLOAD = "Workload"
PARALLEL = "Parallelism"
GPU = "GPU"
WEIGHTS = "Weights"
SOURCE = "Model source"
ENGINE = "Engine"
VLLM = "vLLM"
SGLANG = "SGLang"
TRTLLM = "TensorRT-LLM"
TRANSFORMERS = "Transformers and generic"
OUTPUT = "Output"

Model = Annotated[str, typer.Argument(help="Hub repo id, local config.json or model dir, or a library name.")]
Models = Annotated[
    list[str], typer.Argument(help="Hub repo ids, local config.json or model dirs, or library names (several sweep).")
]
Seq = Annotated[
    str | None,
    typer.Option(
        "--seq",
        "--max-model-len",
        help="Tokens per request as vLLM reads them (32k = 32,000, 32K = 32,768; "
        "default: the model's context); a list sweeps: 4k,8k,32k.",
        rich_help_panel=WORKLOAD,
    ),
]
Batch = Annotated[
    str, typer.Option("--batch", "-b", help="Requests held at once; a list sweeps: 1,8,32.", rich_help_panel=WORKLOAD)
]
SharedPrefix = Annotated[
    int,
    typer.Option(
        "--shared-prefix", "--prefix-len", help="Prompt tokens requests share (cached once).", rich_help_panel=WORKLOAD
    ),
]
PrefixHitRate = Annotated[
    float,
    typer.Option(
        "--prefix-hit-rate", help="Share of requests that find that prefix cached (1).", rich_help_panel=WORKLOAD
    ),
]
InputLen = Annotated[
    int | None, typer.Option("--input-len", help="Mean prompt tokens of real requests.", rich_help_panel=WORKLOAD)
]
OutputLen = Annotated[
    int | None, typer.Option("--output-len", help="Mean answer tokens of real requests.", rich_help_panel=WORKLOAD)
]
Lengths = Annotated[
    str | None,
    typer.Option("--lengths", help="File of observed prompt/answer token pairs (or JSONL).", rich_help_panel=WORKLOAD),
]
KvCacheDtype = Annotated[
    str,
    typer.Option(
        "--kv-cache-dtype",
        help="auto (the model's, or a ModelOpt checkpoint's own), bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2, "
        "int8, int4, nvfp4; vLLM 0.20+'s "
        "int8_per_token_head, fp8_per_token_head, int4_per_token_head, nvfp4_4over6, turboquant_k8v4, "
        "turboquant_4bit_nc, turboquant_k3v4_nc, turboquant_3bit_nc; SGLang's fp4_e2m1.",
        rich_help_panel=WORKLOAD,
    ),
]
Tp = Annotated[
    int, typer.Option("--tp", "--tensor-parallel-size", "-tp", help="Tensor-parallel GPUs.", rich_help_panel=PARALLEL)
]
Pp = Annotated[
    int, typer.Option("--pp", "--pipeline-parallel-size", "-pp", help="Pipeline stages.", rich_help_panel=PARALLEL)
]
Dp = Annotated[
    int,
    typer.Option(
        "--dp", "--data-parallel-size", "-dp", help="Data-parallel ranks per instance.", rich_help_panel=PARALLEL
    ),
]
ExpertParallel = Annotated[
    bool | None,
    typer.Option(
        "--enable-expert-parallel", help="vLLM: spread MoE experts over tp x dp ranks.", rich_help_panel=PARALLEL
    ),
]
DpAttention = Annotated[
    bool | None,
    typer.Option("--enable-dp-attention", help="SGLang: data-parallel attention inside tp.", rich_help_panel=PARALLEL),
]
EpSize = Annotated[
    int | None, typer.Option("--ep-size", help="SGLang: expert-parallel ranks.", rich_help_panel=PARALLEL)
]
Gpu = Annotated[
    str | None,
    typer.Option("--gpu", help="GPU type: H100, A100-80GB, L4... (see `kvplan gpus`).", rich_help_panel=GPU),
]
GpuMem = Annotated[
    str | None, typer.Option("--gpu-mem", help="Memory of another card, e.g. 48GiB.", rich_help_panel=GPU)
]
GpuInUse = Annotated[
    str | None,
    typer.Option("--gpu-memory-in-use", help="Memory other processes hold on each GPU: 2GiB, or 30% of it.",
                 rich_help_panel=GPU),
]
NumGpus = Annotated[
    int | None,
    typer.Option("--num-gpus", help="GPUs in all; beyond one instance they are replicas.", rich_help_panel=GPU),
]
Dtype = Annotated[str, typer.Option("--dtype", help="Weight dtype: auto, bf16, fp16, fp32.", rich_help_panel=WEIGHTS)]
Quantization = Annotated[
    str | None, typer.Option("--quantization", help="Runtime weight quantization, e.g. fp8.", rich_help_panel=WEIGHTS)
]
WeightsBytes = Annotated[
    str | None, typer.Option("--weights-bytes", help="The checkpoint's size, e.g. 15GiB.", rich_help_panel=WEIGHTS)
]
WeightsFromHub = Annotated[
    bool,
    typer.Option("--weights-from-hub", help="Exact size from the Hub's safetensors headers.", rich_help_panel=WEIGHTS),
]
CpuOffloadGb = Annotated[
    float | None,
    typer.Option("--cpu-offload-gb", help="vLLM: GiB of weights per GPU kept in CPU memory.", rich_help_panel=WEIGHTS),
]
Revision = Annotated[str | None, typer.Option("--revision", help="Hub branch, tag or commit.", rich_help_panel=SOURCE)]
Token = Annotated[str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN).", rich_help_panel=SOURCE)]
Offline = Annotated[
    bool, typer.Option("--offline", help="Never use the network: library and cache only.", rich_help_panel=SOURCE)
]
Refresh = Annotated[
    bool, typer.Option("--refresh", help="Ask the Hub even for a cached or bundled model.", rich_help_panel=SOURCE)
]
Engine = Annotated[
    str, typer.Option("--engine", help="vllm, sglang, trtllm, transformers, generic or tgi.", rich_help_panel=ENGINE)
]
Profile = Annotated[
    str | None,
    typer.Option("--profile", help="This box's measured terms (kvplan calibrate --save).", rich_help_panel=GPU),
]
VllmVersion = Annotated[
    str | None, typer.Option("--vllm-version", help="vLLM release, 0.6.0 to 0.33, or current.", rich_help_panel=VLLM)
]
VllmInstall = Annotated[
    str | None,
    typer.Option(
        "--vllm-install",
        help="image (vllm/vllm-openai, the default) or wheel (pip): the 0.8-0.11 sampler's peak and the "
        "0.10-0.11 mxfp4 kernels.",
        rich_help_panel=VLLM,
    ),
]
CompileCache = Annotated[
    str | None,
    typer.Option(
        "--compile-cache",
        help="cold (first boot, or no kept ~/.cache/vllm; the default) or warm: a cold torch.compile's copies "
        "count in the profiled peak (0.11.1+).",
        rich_help_panel=VLLM,
    ),
]
GpuMemoryUtilization = Annotated[
    float | None,
    typer.Option(
        "--gpu-memory-utilization", help="Share of GPU memory to use (vLLM 0.92; 0.9 <= 0.19).", rich_help_panel=VLLM
    ),
]
BlockSize = Annotated[int | None, typer.Option("--block-size", help="Tokens per KV block (16).", rich_help_panel=VLLM)]
MaxNumSeqs = Annotated[
    int | None, typer.Option("--max-num-seqs", help="Requests run at once (1024 or 256).", rich_help_panel=VLLM)
]
MaxNumBatchedTokens = Annotated[
    int | None, typer.Option("--max-num-batched-tokens", help="Tokens per step (8192 or 2048).", rich_help_panel=VLLM)
]
# Two flags rather than typer's "--x/--no-x" pair: the pair takes a second column in --help that pushes
# vLLM's long names past 80 columns.
PrefixCaching = Annotated[
    bool, typer.Option("--enable-prefix-caching", help="Prefix caching on (the default; for Mamba and "
                       "DeltaNet hybrids from vLLM 0.28).", rich_help_panel=VLLM)
]
NoPrefixCaching = Annotated[
    bool, typer.Option("--no-enable-prefix-caching", help="Prefix caching off.", rich_help_panel=VLLM)
]
ChunkedPrefill = Annotated[
    bool, typer.Option("--enable-chunked-prefill", help="Chunked prefill on (default: the release's).",
                       rich_help_panel=VLLM)
]
NoChunkedPrefill = Annotated[
    bool, typer.Option("--no-enable-chunked-prefill",
                       help="Chunked prefill off: a step holds a whole prompt.", rich_help_panel=VLLM)
]
KvCacheMemory = Annotated[
    str | None,
    typer.Option(
        "--kv-cache-memory-bytes",
        help="Fix the KV memory per GPU, e.g. 40GiB.",
        rich_help_panel=VLLM,
    ),
]
AllowLong = Annotated[
    bool | None,
    typer.Option(
        "--allow-long-max-model-len",
        help="Allow --max-model-len past the model's context (vLLM's env VLLM_ALLOW_LONG_MAX_MODEL_LEN).",
        rich_help_panel=VLLM,
    ),
]
NoDeepGemm = Annotated[
    bool | None,
    typer.Option("--no-deep-gemm", help="As VLLM_USE_DEEP_GEMM=0: MoE experts on Triton, not DeepGEMM.",
                 rich_help_panel=VLLM),
]
MlaDisable = Annotated[
    bool | None,
    typer.Option("--mla-disable", help="As VLLM_MLA_DISABLE=1: DeepSeek caches K and V per head, not MLA.",
                 rich_help_panel=VLLM),
]
FlashinferSampler = Annotated[
    bool, typer.Option("--flashinfer-sampler", help="As VLLM_USE_FLASHINFER_SAMPLER=1: V1 samples with FlashInfer.",
                       rich_help_panel=VLLM)
]
NoFlashinferSampler = Annotated[
    bool, typer.Option("--no-flashinfer-sampler", help="As VLLM_USE_FLASHINFER_SAMPLER=0: V1 sorts with PyTorch.",
                       rich_help_panel=VLLM)
]
MambaCacheDtype = Annotated[
    str | None,
    typer.Option("--mamba-cache-dtype", help="Mamba/DeltaNet conv state dtype (auto, float32, float16, bfloat16).",
                 rich_help_panel=VLLM),
]
MambaSsmCacheDtype = Annotated[
    str | None,
    typer.Option("--mamba-ssm-cache-dtype", help="Their SSM/recurrent state dtype (auto: the model's rule).",
                 rich_help_panel=VLLM),
]
SpeculativeConfig = Annotated[
    str | None,
    typer.Option("--speculative-config", help='JSON, as vLLM takes it; "mtp" is modelled, e.g. '
                 '\'{"method": "mtp", "num_speculative_tokens": 3}\'.', rich_help_panel=VLLM),
]
EnableLora = Annotated[
    bool | None,
    typer.Option("--enable-lora", help="LoRA slots take GPU memory (--max-loras, --max-lora-rank).",
                 rich_help_panel=VLLM),
]
MaxLoras = Annotated[
    int | None, typer.Option("--max-loras", help="LoRA adapters on the GPU at once (default 1).", rich_help_panel=VLLM)
]
MaxLoraRank = Annotated[
    int | None, typer.Option("--max-lora-rank", help="Largest LoRA rank (default 16).", rich_help_panel=VLLM)
]
SglangVersion = Annotated[
    str | None,
    typer.Option("--sglang-version", help="SGLang release, e.g. 0.4.3 (default: current).", rich_help_panel=SGLANG),
]
MaxTotalTokens = Annotated[
    int | None, typer.Option("--max-total-tokens", help="Cap on the KV token pool.", rich_help_panel=SGLANG)
]
AttentionBackend = Annotated[
    str | None,
    typer.Option("--attention-backend", help="e.g. flashmla (some fix the page size).", rich_help_panel=SGLANG),
]
MemFractionStatic = Annotated[
    float | None,
    typer.Option("--mem-fraction-static", help="Share of memory free before loading.", rich_help_panel=SGLANG),
]
PageSize = Annotated[int | None, typer.Option("--page-size", help="Tokens per KV page (1).", rich_help_panel=SGLANG)]
MaxRunningRequests = Annotated[
    int | None, typer.Option("--max-running-requests", help="Requests run at once.", rich_help_panel=SGLANG)
]
ChunkedPrefillSize = Annotated[
    int | None, typer.Option("--chunked-prefill-size", help="Tokens per prefill chunk.", rich_help_panel=SGLANG)
]
CudaGraphMaxBs = Annotated[
    int | None, typer.Option("--cuda-graph-max-bs", help="Largest CUDA-graph batch.", rich_help_panel=SGLANG)
]
FreeGpuMemoryFraction = Annotated[
    float | None,
    typer.Option(
        "--free-gpu-memory-fraction",
        help="Share of memory left after loading (0.9).",
        rich_help_panel=TRTLLM,
    ),
]
MaxTokens = Annotated[
    int | None, typer.Option("--max-tokens", help="Cap on the KV cache's tokens.", rich_help_panel=TRTLLM)
]
TokensPerBlock = Annotated[
    int | None, typer.Option("--tokens-per-block", help="Tokens per KV block (32).", rich_help_panel=TRTLLM)
]
MaxBatchSize = Annotated[
    int | None, typer.Option("--max-batch-size", help="Requests in flight (2048).", rich_help_panel=TRTLLM)
]
MaxNumTokens = Annotated[
    int | None, typer.Option("--max-num-tokens", help="Tokens per step (8192).", rich_help_panel=TRTLLM)
]
HfCache = Annotated[
    str | None, typer.Option("--hf-cache", help="Transformers cache: dynamic or static.", rich_help_panel=TRANSFORMERS)
]
Overhead = Annotated[
    str | None,
    typer.Option("--overhead", help="Activations and runtime per GPU (2 GiB).", rich_help_panel=TRANSFORMERS),
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.", rich_help_panel=OUTPUT)]
Csv = Annotated[bool, typer.Option("--csv", help="Print one CSV row per combination.", rich_help_panel=OUTPUT)]
Plot = Annotated[
    str | None,
    typer.Option(
        "--plot",
        help="Draw KV memory and concurrency against context: FILE.png or .svg (needs the \\[plot] extra).",
        rich_help_panel=OUTPUT,
    ),
]
