"""The `kvplan verify` command: parse flags, run the ranks, hand the results to the output (no torch at import).

The options it shares with `estimate` are the same declarations (kvplan.cli.options), so their spelling,
help and defaults cannot drift; only what verify alone does (device, layout, steps) is declared here.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvplan.cli import options as opt
from kvplan.cli.lists import counts
from kvplan.cli.output import Output, stderr_console
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK, InputError
from kvplan.units import parse_size

VERIFY = "Verify"
Device = Annotated[
    str | None, typer.Option("--device", help="cpu or cuda (default: cuda when there is one).", rich_help_panel=VERIFY)
]
Steps = Annotated[int, typer.Option("--steps", help="Tokens to decode after the prompt.", rich_help_panel=VERIFY)]
Layout = Annotated[
    str,
    typer.Option("--layout", help="paged (blocks) or contiguous \\[batch, heads, seq, dim].", rich_help_panel=VERIFY),
]
Fraction = Annotated[
    float, typer.Option("--fraction", help="Scale the batch down for a busy or smaller device.", rich_help_panel=VERIFY)
]
DecodeLayers = Annotated[
    int | None,
    typer.Option("--decode-layers", help="Decode the first N layers (bytes cover all).", rich_help_panel=VERIFY),
]
NoCheck = Annotated[
    bool, typer.Option("--no-check", help="Skip the cached-vs-recomputed check.", rich_help_panel=VERIFY)
]


def _one(values: tuple[int, ...], flag: str) -> int | None:
    if len(values) > 1:
        raise InputError(f"{flag} takes one value in verify (it allocates one cache), got {len(values)}")
    return values[0] if values else None


def verify_command(
    model: opt.Model,
    seq: opt.Seq = None,
    batch: opt.Batch = "1",
    kv_cache_dtype: opt.KvCacheDtype = "auto",
    dtype: opt.Dtype = "auto",
    block_size: opt.BlockSize = None,
    tp: opt.Tp = 1,
    pp: opt.Pp = 1,
    gpu: opt.Gpu = None,
    gpu_mem: opt.GpuMem = None,
    device: Device = None,
    steps: Steps = 16,
    layout: Layout = "paged",
    fraction: Fraction = 1.0,
    decode_layers: DecodeLayers = None,
    no_check: NoCheck = False,
    revision: opt.Revision = None,
    token: opt.Token = None,
    offline: opt.Offline = False,
    json_out: opt.Json = False,
) -> None:
    """Allocate the planned KV cache with torch, decode through it, and check the bytes match the estimate.

    Example: kvplan verify meta-llama/Llama-3.1-8B-Instruct --seq 32768 --batch 16 --layout contiguous
    """
    from kvplan.verify.api import verify

    out = Output(json_mode=json_out)
    report = verify(
        model, seq_tokens=_one(counts(seq, "--max-model-len"), "--max-model-len"),
        batch=_one(counts(batch, "--batch", human=False), "--batch") or 1,
        kv_cache_dtype=kv_cache_dtype, dtype=None if dtype == "auto" else dtype, block_size=block_size or 16,
        tp=tp, pp=pp, gpu=gpu, gpu_mem_bytes=None if gpu_mem is None else parse_size(gpu_mem, "--gpu-mem"),
        device=device, steps=steps, layout=layout, fraction=fraction, decode_layers=decode_layers,
        check=not no_check, revision=revision, token=token, offline=offline,
        # The bar is for a person watching; in a log or a pipe it would leave an empty line behind.
        progress=stderr_console() if sys.stderr.isatty() else None,
    )
    if report is None:  # a torchrun rank other than 0: rank 0 reports for everyone
        raise typer.Exit(EXIT_OK)
    for notice in report.setup.notices:
        out.notice(notice)
    out.result(report.data, report.render)
    raise typer.Exit(EXIT_OK if report.passed else EXIT_DOES_NOT_FIT)
