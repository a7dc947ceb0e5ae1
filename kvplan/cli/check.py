"""The `kvplan check` command: read deployment files, evaluate each deployment, report, set the exit code."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from kvplan.cli.output import stdout_console

FORMATS = ("human", "json", "github", "junit")


def check(
    paths: Annotated[list[str], typer.Argument(help="Deployment files or directories ('-' for stdin).")],
    output_format: Annotated[str, typer.Option("--format", help="human, json, github (annotations) or junit.")] = "human",
    gpu: Annotated[str | None, typer.Option("--gpu", help="GPU type for deployments that name none, e.g. H100-80GB.")] = None,
    min_margin: Annotated[
        float | None, typer.Option("--min-margin", help="Fail unless this share of KV memory is left, e.g. 0.1.")
    ] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network: bundled library only.")] = False,
    vllm_version: Annotated[str, typer.Option("--vllm-version", help="vLLM behaviour: current or 0.19.")] = "current",
    profile: Annotated[
        str | None, typer.Option("--profile", help="The box's measured terms (kvplan calibrate --save).")
    ] = None,
) -> None:
    """Fail the CI job when a deployment will not fit its GPUs.

    Example: kvplan check deploy/ --format github --min-margin 0.1
    Exit codes: 0 all fit, 1 a deployment does not fit or misses --min-margin, 2 a file could not be evaluated.
    """
    from kvplan.check.evaluate import evaluate
    from kvplan.check.files import load_requests
    from kvplan.check.report import exit_code, render_github, render_human, render_json, render_junit
    from kvplan.errors import InputError

    if output_format not in FORMATS:
        raise InputError(f"--format must be one of {', '.join(FORMATS)}, got {output_format!r}")
    if min_margin is not None and not 0 <= min_margin < 1:
        raise InputError(f"--min-margin must be a fraction in [0, 1), got {min_margin}")
    box = None
    if profile is not None:
        from kvplan.calibrate.profile import load_profile

        box = load_profile(profile)
    requests, failures = load_requests(paths, default_gpu=gpu)
    results = failures + [
        evaluate(r, offline=offline, min_margin=min_margin, vllm_version=vllm_version, profile=box)
        for r in requests
    ]
    if output_format == "human":
        render_human(results, stdout_console(), min_margin=min_margin)
    else:
        render = {"json": render_json, "github": render_github, "junit": render_junit}[output_format]
        sys.stdout.write(render(results, min_margin=min_margin) + "\n")
    raise typer.Exit(exit_code(results, min_margin))
