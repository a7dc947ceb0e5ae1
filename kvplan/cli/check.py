"""The `kvplan check` command: read deployment files, evaluate each deployment, report, set the exit code."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated

import typer
from rich.console import Console

from kvplan.cli.output import tolerant

FORMATS = ("human", "json", "github", "junit")


def check(
    paths: Annotated[list[str], typer.Argument(help="Deployment files or directories ('-' for stdin).")],
    output_format: Annotated[
        str, typer.Option("--format", help="human, json, github (annotations) or junit.")
    ] = "human",
    json_out: Annotated[bool, typer.Option("--json", help="Same as --format json, as on the other commands.")] = False,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="GPU type for every deployment; wins over the file's, e.g. H100-80GB.")
    ] = None,
    gpu_mem: Annotated[
        str | None, typer.Option("--gpu-mem", help="Memory of each GPU, e.g. 80GiB; wins over the catalog's figure.")
    ] = None,
    gpu_in_use: Annotated[
        str | None,
        typer.Option("--gpu-memory-in-use", help="Memory other processes hold on each GPU: 2GiB, or 30% of it."),
    ] = None,
    min_margin: Annotated[
        float | None, typer.Option("--min-margin", help="Fail unless this share of KV memory is left, e.g. 0.1.")
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail when a deployment cannot be evaluated.")] = False,
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Pass when no deployment was evaluated (else exit 2).")
    ] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network: bundled library only.")] = False,
    vllm_version: Annotated[
        str, typer.Option("--vllm-version", help="vLLM release, 0.6.0 to 0.33, or current.")
    ] = "current",
    follow_symlinks: Annotated[
        bool, typer.Option("--follow-symlinks", help="Read symlinks that lead outside the checked directories.")
    ] = False,
    profile: Annotated[
        str | None, typer.Option("--profile", help="The box's measured terms (kvplan calibrate --save).")
    ] = None,
) -> None:
    """Fail the CI job when a deployment will not fit its GPUs.

    Example: kvplan check deploy/ --format github --min-margin 0.1
    Exit codes: 0 all fit, 1 a deployment does not fit or misses --min-margin, 2 a file could not be read,
    nothing was evaluated, or (--strict) a deployment could not be evaluated.
    """
    from kvplan.check.evaluate import evaluate
    from kvplan.check.files import read_paths
    from kvplan.check.isolate import evaluate_each
    from kvplan.check.report import Policy, exit_reason, render_github, render_human, render_json, render_junit
    from kvplan.errors import InputError
    from kvplan.units import parse_size, parse_size_or_share

    if output_format not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    if json_out:
        if output_format not in ("human", "json"):
            raise InputError(f"--json and --format {output_format} contradict: give one")
        output_format = "json"
    if min_margin is not None and not 0 <= min_margin < 1:
        raise InputError(f"--min-margin must be a fraction in [0, 1), got {min_margin}")
    memory = parse_size(gpu_mem, "--gpu-mem") if gpu_mem is not None else None
    if memory is not None and memory <= 0:
        raise InputError(f"--gpu-mem must be a positive size such as 80GiB, got {gpu_mem!r}")
    in_use, in_use_share = (parse_size_or_share(gpu_in_use, "--gpu-memory-in-use") if gpu_in_use is not None
                            else (0, 0.0))
    box = None
    if profile is not None:
        from kvplan.calibrate.profile import load_profile

        box = load_profile(profile)
    reading = read_paths(paths, gpu=gpu, gpu_memory_bytes=memory, follow_symlinks=follow_symlinks)
    results = reading.failures + evaluate_each(
        reading.requests,
        lambda r: evaluate(r, offline=offline, min_margin=min_margin, vllm_version=vllm_version, profile=box,
                           gpu_in_use_bytes=in_use, gpu_in_use_share=in_use_share),
    )
    policy = Policy(min_margin, strict, allow_empty)
    if output_format == "human":
        render_human(results, _console(), files=reading.files, policy=policy)
    else:
        render = {"json": render_json, "github": render_github, "junit": render_junit}[output_format]
        tolerant(sys.stdout).write(render(results, files=reading.files, policy=policy) + "\n")
    raise typer.Exit(exit_reason(results, policy)[0])


def _console() -> Console:
    """Human output at the terminal's width: COLUMNS when set, the terminal's own, else 80 (CI logs)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif sys.stdout.isatty():
        width = shutil.get_terminal_size().columns
    else:
        width = 80
    return Console(file=tolerant(sys.stdout), highlight=False, emoji=False, soft_wrap=True, width=width)
