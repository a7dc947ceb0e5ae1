"""The `kvplan verify` command: parse flags, run the ranks, hand the results to the output (no torch at import)."""

from __future__ import annotations

from typing import Annotated

import typer

from kvplan.cli.output import Output
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK
from kvplan.units import parse_size


def verify_command(
    model: Annotated[str, typer.Argument(help="Hub repo id, local config.json / model dir, or a library name.")],
    seq: Annotated[int | None, typer.Option("--seq", "--max-model-len", help="Tokens per request (default: the model's max context).")] = None,
    batch: Annotated[int, typer.Option("--batch", "-b", help="Concurrent requests.")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto, fp32, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2, int8, int4, nvfp4.")] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Compute dtype on GPU: auto (as served), bf16, fp16, fp32.")] = "auto",
    block_size: Annotated[int, typer.Option("--block-size", help="Paged-KV block size in tokens.")] = 16,
    tp: Annotated[int, typer.Option("--tp", "--tensor-parallel-size", help="Ranks, one process each (torchrun-compatible).")] = 1,
    pp: Annotated[int, typer.Option("--pp", "--pipeline-parallel-size", help="Pipeline stages (the fullest stage is verified).")] = 1,
    gpu: Annotated[str | None, typer.Option("--gpu", help="Catalog GPU whose peak bandwidth to compare with (default: detected).")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="Cap on the memory verify may use, e.g. 48GiB.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: cuda when available).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Tokens to decode after the prompt.")] = 16,
    layout: Annotated[str, typer.Option("--layout", help="paged (blocks of --block-size) or contiguous \\[batch, heads, seq, dim].")] = "paged",
    fraction: Annotated[float, typer.Option("--fraction", help="Scale the batch down to fit a busy or smaller device.")] = 1.0,
    decode_layers: Annotated[int | None, typer.Option("--decode-layers", help="Decode through the first N layers only (bytes still cover all).")] = None,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip the cached-vs-recomputed correctness check.")] = False,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub revision (branch, tag or commit).")] = None,
    token: Annotated[str | None, typer.Option("--token", help="Hub token (default: HF_TOKEN).")] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network: bundled library and cache only.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON (same data as the table).")] = False,
) -> None:
    """Allocate the planned KV cache with torch, decode through it, and check the bytes match the estimate.

    Example: kvplan verify meta-llama/Llama-3.1-8B-Instruct --seq 32768 --batch 16 --layout contiguous
    """
    from kvplan.verify.api import verify

    out = Output(json_mode=json_out)
    report = verify(
        model, seq_tokens=seq, batch=batch, kv_cache_dtype=kv_cache_dtype, dtype=None if dtype == "auto" else dtype,
        block_size=block_size, tp=tp, pp=pp, gpu=gpu,
        gpu_mem_bytes=None if gpu_mem is None else parse_size(gpu_mem, "--gpu-mem"), device=device, steps=steps,
        layout=layout, fraction=fraction, decode_layers=decode_layers, check=not no_check, revision=revision,
        token=token, offline=offline, progress=True,
    )
    if report is None:  # a torchrun rank other than 0: rank 0 reports for everyone
        raise typer.Exit(EXIT_OK)
    for notice in report.setup.notices:
        out.notice(notice)
    out.result(report.data, report.render)
    raise typer.Exit(EXIT_OK if report.passed else EXIT_DOES_NOT_FIT)
