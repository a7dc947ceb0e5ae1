"""`kvplan estimate`: flags -> an EstimateRequest -> the planner -> the verdict, table or JSON."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import typer

from kvplan.api import EstimateRequest, GpuChoice, ModelSource
from kvplan.api import estimate as run_estimate
from kvplan.capacity.deployment import Parallelism, WeightsChoice, Workload
from kvplan.cli import options as opt
from kvplan.cli.flags import check_engine_flags, flag_error
from kvplan.cli.output import Output
from kvplan.cli.render import render_estimate
from kvplan.engines.vllm_speculative import speculative_options
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK, FieldError, InputError
from kvplan.units import GiB, parse_size, parse_size_or_share


def _size(value: str | None, flag: str) -> int | None:
    return None if value is None else parse_size(value, flag)


def _engine_options(engine: str, f: dict[str, Any]) -> Any:
    """The selected engine's options from the flags given (None: the engine's default). Only that engine's
    module is imported (see kvplan.engines)."""
    builders: dict[str, tuple[str, str, Callable[[], dict[str, Any]]]] = {
        "vllm": ("vllm_engine", "VllmOptions", lambda: dict(
            version=f["vllm_version"], install=f["vllm_install"], compile_cache=f["compile_cache"],
            gpu_memory_utilization=f["gpu_memory_utilization"],
            block_size=f["block_size"], max_num_seqs=f["max_num_seqs"],
            max_num_batched_tokens=f["max_num_batched_tokens"], enable_prefix_caching=f["enable_prefix_caching"],
            enable_chunked_prefill=f["enable_chunked_prefill"],
            kv_cache_memory_bytes=_size(f["kv_cache_memory"], "--kv-cache-memory-bytes"),
            allow_long_max_model_len=f["allow_long"], flashinfer_sampler=f["flashinfer_sampler"], lora=_lora(f),
            mla_disable=bool(f["mla_disable"]), deep_gemm=False if f["no_deep_gemm"] else None,
            mamba_cache_dtype=f["mamba_cache_dtype"],
            mamba_ssm_cache_dtype=f["mamba_ssm_cache_dtype"], **speculative_options(f["speculative_config"]),
        )),
        "sglang": ("sglang", "SglangOptions", lambda: dict(
            version=f["sglang_version"], mem_fraction_static=f["mem_fraction_static"], page_size=f["page_size"],
            max_running_requests=f["max_running_requests"], chunked_prefill_size=f["chunked_prefill_size"],
            cuda_graph_max_bs=f["cuda_graph_max_bs"], max_total_tokens=f["max_total_tokens"],
            attention_backend=f["attention_backend"],
        )),
        "trtllm": ("trtllm", "TrtllmOptions", lambda: dict(
            free_gpu_memory_fraction=f["free_gpu_memory_fraction"], max_tokens=f["max_tokens"],
            tokens_per_block=f["tokens_per_block"], max_batch_size=f["max_batch_size"],
            max_num_tokens=f["max_num_tokens"],
        )),
        "transformers": ("transformers", "TransformersOptions", lambda: dict(
            cache=f["hf_cache"], memory_fraction=f["gpu_memory_utilization"],
            overhead_bytes=_size(f["overhead"], "--overhead"),
        )),
        "generic": ("generic", "GenericOptions", lambda: dict(
            gpu_memory_utilization=f["gpu_memory_utilization"], block_size=f["block_size"],
            overhead_bytes=_size(f["overhead"], "--overhead"),
        )),
        "tgi": ("tgi", "TgiOptions", lambda: dict(
            cuda_memory_fraction=f["gpu_memory_utilization"], max_batch_size=f["max_num_seqs"],
        )),
    }
    if engine not in builders:
        raise InputError(f"--engine must be one of {', '.join(builders)}, got {engine!r}")
    module, cls, kwargs = builders[engine]
    options = getattr(importlib.import_module(f"kvplan.engines.{module}"), cls)
    return options(**{k: v for k, v in kwargs().items() if v is not None})


def _lora(f: dict[str, Any]) -> Any:
    """vLLM's LoRA slots when any LoRA flag is given (vLLM's defaults: 1 adapter of rank 16), else None."""
    if not f["enable_lora"] and f["max_loras"] is None and f["max_lora_rank"] is None:
        return None
    from kvplan.engines.vllm_lora import LoraSlots

    given = {k: f[k] for k in ("max_loras", "max_lora_rank") if f[k] is not None}
    return LoraSlots(**given)


def _gpu_names(gpu: str | None) -> tuple[str, ...]:
    if gpu is None:
        return ()
    names = tuple(n.strip() for n in gpu.split(","))
    if not all(names):
        raise InputError("--gpu is empty; name a GPU such as H100 (see `kvplan gpus`), or leave the flag out")
    return names


def estimate(
    model: opt.Models,
    seq: opt.Seq = None,
    batch: opt.Batch = "1",
    shared_prefix: opt.SharedPrefix = 0,
    prefix_hit_rate: opt.PrefixHitRate = 1.0,
    input_len: opt.InputLen = None,
    output_len: opt.OutputLen = None,
    lengths: opt.Lengths = None,
    kv_cache_dtype: opt.KvCacheDtype = "auto",
    tp: opt.Tp = 1,
    pp: opt.Pp = 1,
    dp: opt.Dp = 1,
    enable_expert_parallel: opt.ExpertParallel = None,
    enable_dp_attention: opt.DpAttention = None,
    ep_size: opt.EpSize = None,
    gpu: opt.Gpu = None,
    gpu_mem: opt.GpuMem = None,
    gpu_in_use: opt.GpuInUse = None,
    num_gpus: opt.NumGpus = None,
    dtype: opt.Dtype = "auto",
    quantization: opt.Quantization = None,
    weights_bytes: opt.WeightsBytes = None,
    weights_from_hub: opt.WeightsFromHub = False,
    cpu_offload_gb: opt.CpuOffloadGb = None,
    revision: opt.Revision = None,
    token: opt.Token = None,
    offline: opt.Offline = False,
    refresh: opt.Refresh = False,
    profile: opt.Profile = None,
    engine: opt.Engine = "vllm",
    vllm_version: opt.VllmVersion = None,
    vllm_install: opt.VllmInstall = None,
    compile_cache: opt.CompileCache = None,
    gpu_memory_utilization: opt.GpuMemoryUtilization = None,
    block_size: opt.BlockSize = None,
    max_num_seqs: opt.MaxNumSeqs = None,
    max_num_batched_tokens: opt.MaxNumBatchedTokens = None,
    enable_prefix_caching: opt.PrefixCaching = False,
    no_enable_prefix_caching: opt.NoPrefixCaching = False,
    enable_chunked_prefill: opt.ChunkedPrefill = False,
    no_chunked_prefill: opt.NoChunkedPrefill = False,
    kv_cache_memory: opt.KvCacheMemory = None,
    allow_long: opt.AllowLong = None,
    mla_disable: opt.MlaDisable = None,
    no_deep_gemm: opt.NoDeepGemm = None,
    flashinfer_sampler: opt.FlashinferSampler = False,
    no_flashinfer_sampler: opt.NoFlashinferSampler = False,
    mamba_cache_dtype: opt.MambaCacheDtype = None,
    mamba_ssm_cache_dtype: opt.MambaSsmCacheDtype = None,
    speculative_config: opt.SpeculativeConfig = None,
    enable_lora: opt.EnableLora = None,
    max_loras: opt.MaxLoras = None,
    max_lora_rank: opt.MaxLoraRank = None,
    mem_fraction_static: opt.MemFractionStatic = None,
    page_size: opt.PageSize = None,
    max_running_requests: opt.MaxRunningRequests = None,
    chunked_prefill_size: opt.ChunkedPrefillSize = None,
    cuda_graph_max_bs: opt.CudaGraphMaxBs = None,
    sglang_version: opt.SglangVersion = None,
    max_total_tokens: opt.MaxTotalTokens = None,
    attention_backend: opt.AttentionBackend = None,
    free_gpu_memory_fraction: opt.FreeGpuMemoryFraction = None,
    max_tokens: opt.MaxTokens = None,
    tokens_per_block: opt.TokensPerBlock = None,
    max_batch_size: opt.MaxBatchSize = None,
    max_num_tokens: opt.MaxNumTokens = None,
    hf_cache: opt.HfCache = None,
    overhead: opt.Overhead = None,
    json_out: opt.Json = False,
    csv_out: opt.Csv = False,
    plot: opt.Plot = None,
) -> None:
    """Size the KV cache of MODEL and fit it to a GPU as the serving engine would.

    Example: kvplan estimate meta-llama/Llama-3.1-8B-Instruct --max-model-len 8192 --batch 32 --gpu H100

    Lists sweep every combination: --seq 4k,8k,32k --batch 1,16 --gpu H100,H200, several models.
    """
    if enable_prefix_caching and no_enable_prefix_caching:
        raise InputError("--enable-prefix-caching and --no-enable-prefix-caching contradict: give one")
    prefix_caching = True if enable_prefix_caching else False if no_enable_prefix_caching else None
    if enable_chunked_prefill and no_chunked_prefill:
        raise InputError("--enable-chunked-prefill and --no-enable-chunked-prefill contradict: give one")
    chunked = True if enable_chunked_prefill else False if no_chunked_prefill else None
    if flashinfer_sampler and no_flashinfer_sampler:
        raise InputError("--flashinfer-sampler and --no-flashinfer-sampler contradict: give one")
    sampler = True if flashinfer_sampler else False if no_flashinfer_sampler else None
    flags = dict(locals(), enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked,
                 flashinfer_sampler=sampler)
    given = [
        name for name, value in (
            ("--vllm-version", vllm_version), ("--vllm-install", vllm_install), ("--compile-cache", compile_cache),
            ("--gpu-memory-utilization", gpu_memory_utilization),
            ("--block-size", block_size), ("--max-num-seqs", max_num_seqs),
            ("--max-num-batched-tokens", max_num_batched_tokens), ("--enable-prefix-caching", prefix_caching),
            ("--enable-chunked-prefill", chunked),
            ("--kv-cache-memory-bytes", kv_cache_memory), ("--allow-long-max-model-len", allow_long),
            ("--mla-disable", mla_disable), ("--no-deep-gemm", no_deep_gemm),
            ("--no-flashinfer-sampler" if no_flashinfer_sampler else "--flashinfer-sampler", sampler),
            ("--mamba-cache-dtype", mamba_cache_dtype), ("--mamba-ssm-cache-dtype", mamba_ssm_cache_dtype),
            ("--speculative-config", speculative_config),
            ("--enable-lora", enable_lora), ("--max-loras", max_loras), ("--max-lora-rank", max_lora_rank),
            ("--mem-fraction-static", mem_fraction_static), ("--page-size", page_size),
            ("--max-running-requests", max_running_requests), ("--chunked-prefill-size", chunked_prefill_size),
            ("--cuda-graph-max-bs", cuda_graph_max_bs), ("--enable-dp-attention", enable_dp_attention),
            ("--ep-size", ep_size), ("--enable-expert-parallel", enable_expert_parallel),
            ("--hf-cache", hf_cache), ("--overhead", overhead), ("--sglang-version", sglang_version),
            ("--max-total-tokens", max_total_tokens), ("--attention-backend", attention_backend),
            ("--free-gpu-memory-fraction", free_gpu_memory_fraction), ("--max-tokens", max_tokens),
            ("--tokens-per-block", tokens_per_block), ("--max-batch-size", max_batch_size),
            ("--max-num-tokens", max_num_tokens),
        )
        if value is not None
    ]
    check_engine_flags(engine, given)
    from kvplan.cli.lengths import request_mix
    from kvplan.cli.lists import counts

    seqs: tuple[int | None, ...] = counts(seq, "--max-model-len") or (None,)
    batches = counts(batch, "--batch", human=False)
    mix = request_mix(input_len, output_len, lengths)
    if not model or not batches:
        raise InputError("name a model, e.g. kvplan estimate meta-llama/Llama-3.1-8B-Instruct")
    sweep = len(model) * len(seqs) * len(batches) > 1 or csv_out or plot is not None
    in_use = parse_size_or_share(gpu_in_use, "--gpu-memory-in-use") if gpu_in_use is not None else (0, 0.0)
    out = Output(json_mode=json_out)
    box = None
    if profile is not None:
        from kvplan.calibrate.profile import load_profile

        box = load_profile(profile)
        # The box runs the release its log came from: plan with that release's rules unless told otherwise.
        release_flag = {"vllm": "vllm_version", "sglang": "sglang_version"}.get(engine)
        if release_flag and box.engine == engine and box.engine_version and flags.get(release_flag) is None:
            flags[release_flag] = box.engine_version
            out.notice(f"--profile: planning with {engine} {box.engine_version}, the release the profile was "
                       "measured on")

    def request_for(name: str, seq_tokens: int | None, requests: int) -> EstimateRequest:
        return EstimateRequest(
            source=ModelSource(name, revision=revision, token=token, offline=offline, refresh=refresh,
                               weights_from_hub=weights_from_hub),
            workload=Workload(max_model_len=seq_tokens, concurrency=requests, shared_prefix_tokens=shared_prefix,
                              prefix_hit_rate=prefix_hit_rate, mix=mix),
            parallelism=Parallelism(tp=tp, pp=pp, dp=dp, dp_attention=bool(enable_dp_attention),
                                    expert_parallel=bool(enable_expert_parallel), ep_size=ep_size),
            gpu=GpuChoice(names=_gpu_names(gpu), memory_bytes=_size(gpu_mem, "--gpu-mem"), num_gpus=num_gpus,
                          in_use_bytes=in_use[0], in_use_share=in_use[1]),
            weights=WeightsChoice(
                dtype=None if dtype == "auto" else dtype, quantization=quantization,
                checkpoint_bytes=_size(weights_bytes, "--weights-bytes"),
                checkpoint_source="--weights-bytes" if weights_bytes else "",
                cpu_offload_bytes=round((cpu_offload_gb or 0) * GiB),
            ),
            kv_cache_dtype=kv_cache_dtype,
            engine=_engine_options(engine, flags),
            profile=box,
        )

    if sweep:
        from kvplan.cli.sweep import run_sweep

        combos = [(m, s, b) for m in model for s in seqs for b in batches]
        raise typer.Exit(run_sweep([request_for(*c) for c in combos], out, csv_out=csv_out, plot=plot))
    try:
        result = run_estimate(request_for(model[0], seqs[0], batches[0]))
    except FieldError as exc:
        raise flag_error(exc, engine) from None
    for notice in result.notices:
        out.notice(notice)
    out.result(result.to_dict(), lambda console: render_estimate(result, console))
    raise typer.Exit(EXIT_DOES_NOT_FIT if result.fits is False else EXIT_OK)
