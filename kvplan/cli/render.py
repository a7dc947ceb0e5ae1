"""Plans as data (the --json document) and as rich tables (the same data, for people)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvplan.capacity.plan import GpuFit, Plan, requests_phrase
from kvplan.cli.escape import ci_text, markup
from kvplan.hardware.gpus import GpuSpec
from kvplan.units import GiB, fmt_bytes


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def engine_to_dict(detail: object) -> dict[str, Any] | None:
    """An engine model's report as plain data (kvplan.engines); None for the generic budget."""
    from kvplan.engines.sglang import SglangReport
    from kvplan.engines.transformers import HfCacheEstimate
    from kvplan.engines.vllm import VllmReport

    if isinstance(detail, VllmReport):
        f = detail.flags
        return {
            "engine": "vllm",
            "vllm_version": f.version,
            "flags": {
                "max_model_len": f.max_model_len,
                "gpu_memory_utilization": f.gpu_memory_utilization,
                "kv_cache_dtype": f.kv_cache_dtype.name,
                "block_size": f.block_size,
                "max_num_seqs": f.max_num_seqs,
                "max_num_batched_tokens": f.max_num_batched_tokens,
                "tensor_parallel_size": f.tp,
                "pipeline_parallel_size": f.pp,
                "dtype": f.dtype,
                "enable_prefix_caching": f.enable_prefix_caching,
                "kv_cache_memory_bytes": f.kv_cache_memory_bytes,
            },
            "total_memory_bytes": detail.total_memory_bytes,
            "requested_bytes": detail.requested_bytes,
            "cudagraph_bytes": detail.cudagraph_bytes,
            "stages": [
                {
                    "stage": s.memory.stage,
                    "layers": s.memory.layers,
                    "weights_bytes": s.memory.weights_bytes,
                    "rotary_cache_bytes": s.memory.rotary_cache_bytes,
                    "activation_peak_bytes": s.memory.activation_peak_bytes,
                    "non_torch_bytes": s.memory.non_torch_bytes,
                    "available_kv_cache_bytes": s.available_kv_bytes,
                    "kv_cache_groups": [
                        {"kind": g.kind, "layers": g.layers, "window_tokens": g.window_tokens} for g in s.layout.groups
                    ],
                    "group_size": s.layout.group_size,
                    "page_bytes": s.layout.page_bytes,
                    "bytes_per_block": s.layout.bytes_per_block,
                    "num_blocks": s.num_blocks,
                }
                for s in detail.stages
            ],
            "limiting_stage": detail.limiting_stage,
            "available_kv_cache_bytes": detail.available_kv_cache_bytes,
            "block_size": detail.stages[detail.limiting_stage].layout.block_size,
            "num_gpu_blocks": detail.num_blocks,
            "usable_blocks": detail.usable_blocks,
            "blocks_per_request": detail.blocks_per_request,
            "kv_cache_tokens": detail.kv_cache_tokens,
            "max_concurrency": round(detail.max_concurrency, 4),
            "max_running_requests": detail.max_running_requests,
            "max_model_len_fit": detail.max_model_len_fit,
            "startup_error": detail.startup_error,
            "log_lines": list(detail.log_lines),
        }
    if isinstance(detail, SglangReport):
        return {
            "engine": "sglang",
            "mem_fraction_static": detail.mem_fraction_static,
            "page_size": detail.page_size,
            "free_before_load_bytes": detail.free_before_load_bytes,
            "weights_bytes": detail.weights_bytes,
            "available_kv_cache_bytes": detail.available_kv_bytes,
            "cell_size_bytes": detail.cell_size_bytes,
            "swa_cell_size_bytes": detail.swa_cell_size_bytes,
            "max_total_num_tokens": detail.max_total_num_tokens,
            "swa_max_total_num_tokens": detail.swa_max_total_num_tokens,
        }
    if isinstance(detail, HfCacheEstimate):
        return {
            "engine": "transformers",
            "cache": detail.cache,
            "dtype": detail.dtype,
            "total_bytes": detail.total_bytes,
            "layers": [{"layer": x.layer, "kind": x.kind, "tokens": x.tokens, "bytes": x.bytes} for x in detail.layers],
        }
    return None


def _headline(f: GpuFit, seq_tokens: int) -> dict[str, Any]:
    """The three figures scripts read at the top level: KV memory, KV tokens, concurrency (engine terms)."""
    e = engine_to_dict(f.engine) if f.engine is not None else None
    if e and e["engine"] == "vllm":
        return {"available_kv_cache_bytes": e["available_kv_cache_bytes"], "kv_cache_tokens": e["kv_cache_tokens"],
                "max_concurrency": e["max_concurrency"]}
    if e and e["engine"] == "sglang":
        return {"available_kv_cache_bytes": e["available_kv_cache_bytes"], "kv_cache_tokens": e["max_total_num_tokens"],
                "max_concurrency": round(e["max_total_num_tokens"] / seq_tokens, 4)}
    return {"available_kv_cache_bytes": f.kv_budget_bytes, "kv_cache_tokens": None, "max_concurrency": f.max_concurrency}


def fit_to_dict(f: GpuFit) -> dict[str, Any]:
    return {
        "gpu": f.gpu.key,
        "gpu_name": f.gpu.display_name,
        "total_memory_bytes": f.total_memory_bytes,
        "memory_source": f.gpu.memory_source,
        "requested_bytes": f.requested_bytes,
        "weights_per_gpu_bytes": f.weights_per_gpu_bytes,
        "overhead_bytes": f.overhead_bytes,
        "kv_budget_bytes": f.kv_budget_bytes,
        "kv_needed_bytes": f.kv_needed_bytes,
        "headroom_bytes": f.headroom_bytes,
        "fits": f.fits,
        "max_concurrency": f.max_concurrency,
        "max_seq_tokens": f.max_seq_tokens,
        "suggestions": [{"change": s.change, "effect": s.effect} for s in f.suggestions],
        "engine": engine_to_dict(f.engine) if f.engine is not None else None,
    }


def plan_to_dict(p: Plan, *, gpu_named: bool) -> dict[str, Any]:
    m, r, kv, w = p.model, p.request, p.kv, p.weights
    # Top-level engine figures describe the named GPU; with no GPU named they are null (see "gpus").
    head = _headline(p.fits[0], r.seq_tokens) if gpu_named and p.fits else dict.fromkeys(
        ("available_kv_cache_bytes", "kv_cache_tokens", "max_concurrency"))
    return {
        "engine": p.engine,
        **head,
        "model": {
            "name": m.name,
            "source": m.source,
            "model_type": m.model_type,
            "family": m.family,
            "architecture": m.architecture,
            "num_layers": m.num_layers,
            "layer_kinds": m.layer_kinds(),
            "config_dtype": m.config_dtype,
            "dtype": p.dtype,
            "num_params": m.num_params,
            "max_position_embeddings": m.max_position_embeddings,
        },
        "request": {
            "seq_tokens": r.seq_tokens,
            "batch": r.batch,
            "kv_cache_dtype": p.kv_dtype.name,
            "block_size": r.block_size,
            "tp": r.tp,
            "pp": r.pp,
            "num_gpus": r.num_gpus or r.tp * r.pp,
            "shared_prefix_tokens": r.shared_prefix_tokens,
            "gpu_memory_utilization": r.gpu_memory_utilization,
        },
        "kv": {
            "dtype": p.kv_dtype.name,
            "scales": p.kv_dtype.scales_note,
            "model_bytes_per_token": kv.model_bytes_per_token,
            "model_bytes_per_request": kv.model_contiguous_bytes_per_request,
            "model_batch_bytes": kv.model_batch_contiguous_bytes,
            "model_state_bytes_per_request": kv.model_state_bytes_per_request,
            "per_gpu": {
                "bytes_per_token": kv.bytes_per_token,
                "contiguous_bytes_per_request": kv.contiguous_bytes_per_request,
                "paged_bytes_per_request": kv.paged_bytes_per_request,
                "paging_overhead_bytes_per_request": kv.paging_overhead_bytes_per_request,
                "state_bytes_per_request": kv.state_bytes_per_request,
                "batch_contiguous_bytes": kv.batch_contiguous_bytes,
                "batch_paged_bytes": kv.batch_paged_bytes,
                "shared_prefix_saving_bytes": kv.shared_prefix_saving_bytes,
                "stage_layer_counts": list(kv.stage_layer_counts),
                "fullest_stage": kv.fullest_stage,
            },
            "by_kind": [
                {
                    "kind": k.kind,
                    "layers": k.layers,
                    "bytes_per_token": k.bytes_per_token,
                    "resident_tokens": k.resident_tokens,
                    "contiguous_bytes_per_request": k.contiguous_bytes,
                    "paged_bytes_per_request": k.paged_bytes,
                    "state_bytes_per_request": k.state_bytes,
                }
                for k in kv.kinds
            ],
        },
        "weights": {
            "num_params": w.num_params,
            "total_bytes": w.total_bytes,
            "per_gpu_bytes": w.per_gpu_bytes,
            "source": w.source,
            "groups": [{"name": n, "params": c, "bytes": b} for n, c, b in w.groups],
        },
        "gpu_named": gpu_named,
        "gpus": [fit_to_dict(f) for f in p.fits],
        "fits": (p.fits[0].fits if gpu_named and p.fits else None),
        "notes": list(p.notes),
    }


def render_plan(p: Plan, console: Console, *, gpu_named: bool) -> None:
    m, r, kv = p.model, p.request, p.kv
    # Names, directories and model_type come from the config: escaped once here, where they enter the output.
    name, family, source = markup(m.name), markup(m.family), markup(m.source)
    kinds = ", ".join(f"{n} {k}" for k, n in m.layer_kinds().items())
    console.print(f"[bold]{name}[/bold]  ({family}, {m.num_layers} layers: {kinds}; {m.num_params / 1e9:,.2f}B params)")
    console.print(f"  source: {source}")
    shard = "" if r.tp == 1 and r.pp == 1 else f", tp={r.tp} pp={r.pp}"
    console.print(
        f"  request: {r.seq_tokens:,} tokens x {requests_phrase(r.batch)}, KV {p.kv_dtype.name}, weights {p.dtype}, "
        f"block {r.block_size}{shard}"
    )
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    summary.add_column()
    summary.add_row("KV per token", fmt_bytes(kv.model_bytes_per_token), "all layers, whole model")
    summary.add_row("KV per request", _gib(kv.model_contiguous_bytes_per_request), f"at {r.seq_tokens:,} tokens")
    summary.add_row("KV for the batch", _gib(kv.model_batch_contiguous_bytes), f"{requests_phrase(r.batch)}, contiguous")
    if r.tp * r.pp > 1:
        summary.add_row("KV per GPU", _gib(kv.batch_paged_bytes), f"paged, fullest of {r.tp * r.pp} GPUs")
    else:
        summary.add_row("KV paged", _gib(kv.batch_paged_bytes), f"blocks of {r.block_size}")
    summary.add_row("Weights", *_weights_row(p))
    console.print(summary)

    if p.fits:
        console.print(_fit_table(p, gpu_named))
        for f in p.fits if gpu_named else ():
            verdict = "[green]FITS[/green]" if f.fits else "[red]DOES NOT FIT[/red]"
            console.print(
                f"Verdict on {f.gpu.key}: {verdict}: {r.batch} x {r.seq_tokens:,} tokens need {_gib(f.kv_needed_bytes)} "
                f"of KV per GPU; {_gib(f.kv_budget_bytes)} is free for KV. Max concurrency {f.max_concurrency} at "
                f"{r.seq_tokens:,} tokens; longest context for {requests_phrase(r.batch)}: {f.max_seq_tokens:,} tokens."
            )
            for s in f.suggestions:
                console.print(f"  try {s.change}: {s.effect}")
            _render_engine(f, console)

    console.print(_kind_table(p))
    if kv.paging_overhead_bytes_per_request:
        console.print(
            f"Paging rounds each request up to whole {r.block_size}-token blocks: "
            f"+{fmt_bytes(kv.paging_overhead_bytes_per_request)} per request per GPU."
        )
    if kv.shared_prefix_saving_bytes:
        console.print(f"Shared prefix of {r.shared_prefix_tokens:,} tokens stored once saves {_gib(kv.shared_prefix_saving_bytes)} per GPU.")
    if p.kv_dtype.scale_bytes or p.kv_dtype.bits == 8:
        console.print(f"KV dtype {p.kv_dtype.name}: {p.kv_dtype.scales_note}.")
    for note in p.notes:
        console.print(f"[dim]note: {markup(note)}[/dim]")


def _weights_row(p: Plan) -> tuple[str, str]:
    """The summary's weights figure: the engine's own per-GPU load when an engine model ran (what the fit
    table subtracts), else the checkpoint size and its share per GPU."""
    from kvplan.engines.sglang import SglangReport
    from kvplan.engines.vllm import VllmReport

    w, r = p.weights, p.request
    d = p.fits[0].engine if p.fits else None
    sharded = r.tp * r.pp > 1
    where = "per GPU (fullest rank)" if sharded else "on the GPU"
    if isinstance(d, VllmReport):
        rank = d.stages[d.limiting_stage].memory
        per_gpu, loads = rank.weights_bytes, f"vLLM loads {_gib(rank.weights_bytes)} {where}: parameters"
        if rank.rotary_cache_bytes:
            loads += f" + {fmt_bytes(rank.rotary_cache_bytes)} rotary cos/sin cache"
    elif isinstance(d, SglangReport):
        per_gpu, loads = d.weights_bytes, f"SGLang loads {_gib(d.weights_bytes)} {where}: parameters + rotary cache"
    else:
        return _gib(w.total_bytes), f"{markup(w.source)}; {_gib(w.per_gpu_bytes)} per GPU"
    split = "; split over ranks as kvplan's parameter groups split (approximate)"
    measured_split = split if r.weights_bytes is not None and sharded else ""
    return _gib(per_gpu), f"{loads}; checkpoint {_gib(w.total_bytes)} from {markup(w.source)}{measured_split}"


def _render_engine(f: GpuFit, console: Console) -> None:
    """What the engine itself would say on this GPU: vLLM's start-up lines, SGLang's token pool."""
    from kvplan.engines.sglang import SglangReport
    from kvplan.engines.vllm import VllmReport

    d = f.engine
    if isinstance(d, VllmReport):
        console.print(f"vLLM ({d.flags.version}) would log on {f.gpu.key}:")
        for line in d.log_lines:
            console.print(f"  {ci_text(line)}", markup=False)
        if d.startup_error is None:
            console.print(
                f"  ({d.num_blocks:,} blocks of {d.stages[d.limiting_stage].layout.block_size} tokens incl. the null "
                f"block; {d.max_running_requests:,} requests run at once, max_num_seqs {d.flags.max_num_seqs:,})",
                markup=False,
            )
        elif d.max_model_len_fit:
            console.print(f"  try --max-model-len {d.max_model_len_fit}", markup=False)
    elif isinstance(d, SglangReport):
        console.print(
            f"SGLang on {f.gpu.key}: max_total_num_tokens={d.max_total_num_tokens:,} "
            f"(mem_fraction_static {d.mem_fraction_static}, page size {d.page_size})"
            + (f", sliding-window pool {d.swa_max_total_num_tokens:,} tokens" if d.swa_cell_size_bytes else ""),
            markup=False,
        )


def _fit_table(p: Plan, gpu_named: bool) -> Table:
    t = Table(title=None if gpu_named else "No GPU named: the common cards side by side")
    for col in ("GPU", "memory", "x util", "weights/GPU", "overhead", "KV budget", "KV needed", "fits", "max conc.", "max seq"):
        t.add_column(col, justify="left" if col == "GPU" else "right")
    for f in p.fits:
        t.add_row(
            f.gpu.key,
            _gib(f.total_memory_bytes),
            _gib(f.requested_bytes),
            _gib(f.weights_per_gpu_bytes),
            _gib(f.overhead_bytes),
            _gib(f.kv_budget_bytes),
            _gib(f.kv_needed_bytes),
            "yes" if f.fits else "no",
            f"{f.max_concurrency:,}",
            f"{f.max_seq_tokens:,}",
        )
    return t


def _kind_table(p: Plan) -> Table:
    kv, r = p.kv, p.request
    where = "per GPU" if r.tp * r.pp > 1 else "whole model"
    t = Table(title=f"KV by layer kind ({where}, one request of {r.seq_tokens:,} tokens)")
    for col in ("kind", "layers", "bytes/token", "resident tokens", "contiguous", "paged", "state"):
        t.add_column(col, justify="left" if col == "kind" else "right")
    for k in kv.kinds:
        t.add_row(
            k.kind,
            str(k.layers),
            f"{k.bytes_per_token:,}",
            f"{k.resident_tokens:,}",
            fmt_bytes(k.contiguous_bytes),
            fmt_bytes(k.paged_bytes),
            fmt_bytes(k.state_bytes),
        )
    return t


def gpus_to_dict(gpus: tuple[GpuSpec, ...]) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "key": g.key,
                "name": g.display_name,
                "device_names": list(g.device_names),
                "total_memory_bytes": g.total_memory_bytes,
                "memory_source": g.memory_source,
                "aliases": list(g.aliases),
                "vendor": g.vendor,
                "bandwidth_bytes_per_s": g.bandwidth_bytes_per_s,
                "bandwidth_source": g.bandwidth_source,
            }
            for g in gpus
        ]
    }


def render_gpus(gpus: tuple[GpuSpec, ...], console: Console) -> None:
    t = Table(title="GPU catalog (memory as CUDA reports it where sourced)")
    for col in ("key", "name", "memory", "bytes", "figure", "bandwidth", "aliases"):
        t.add_column(col, justify="right" if col in ("memory", "bytes") else "left")
    for g in gpus:
        bw = f"{g.bandwidth_bytes_per_s / 1e12:g} TB/s" if g.bandwidth_bytes_per_s else "-"
        t.add_row(g.key, g.display_name, _gib(g.total_memory_bytes), f"{g.total_memory_bytes:,}", g.memory_kind, bw, ", ".join(g.aliases[:4]))
    console.print(t)
