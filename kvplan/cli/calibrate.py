"""`kvplan calibrate`: read start-up logs, compare each with kvplan's prediction, save the box's profile."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from kvplan.cli.options import Json
from kvplan.cli.output import Output

SCHEMA_VERSION = 1


def _read(path: str) -> tuple[str, str]:
    """(text, source name) of a log file, or of stdin for '-'."""
    from pathlib import Path

    from kvplan.errors import InputError

    if path == "-":
        return sys.stdin.read(), "stdin"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read log {path}: {exc.strerror or exc}") from None
    if len(data) > 256 << 20:
        raise InputError(f"log {path} is {len(data) >> 20} MiB; paste the start-up section (it is a few hundred "
                         "lines) or trim the file")
    return data.decode("utf-8", errors="replace"), path


def calibrate_command(
    logs: Annotated[list[str], typer.Argument(help="vLLM or SGLang start-up logs ('-' for stdin).")],
    save: Annotated[str | None, typer.Option("--save", help="Write this box's profile, for --profile.")] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="The model, when the log names none or a local path.")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="The GPU, when the log does not say it.")] = None,
    engine_version: Annotated[
        str | None, typer.Option("--engine-version", help="The release, when the log prints none.")
    ] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Never use the network.")] = False,
    json_out: Json = False,
) -> None:
    """Set a start-up log's measured memory beside kvplan's prediction.

    Example: kvplan calibrate vllm.log --save box.json
    then: kvplan estimate MODEL --profile box.json
    """
    from kvplan.calibrate.compare import calibrate, report_to_dict
    from kvplan.calibrate.formats import read_log
    from kvplan.calibrate.profile import save_profile
    from kvplan.cli.calibrate_render import render_reports
    from kvplan.errors import InputError

    if save is not None and len(logs) != 1:
        raise InputError(f"--save writes one box's profile: give one log, not {len(logs)}")
    reports = []
    for path in logs:
        text, source = _read(path)
        log = read_log(text, source)
        reports.append(calibrate(log, model=model, gpu=gpu, version=engine_version, offline=offline))
    saved = None
    if save is not None:
        r = reports[0]
        if r.profile is None:
            raise InputError(f"--save {save}: no profile, because {r.unpredicted or 'kvplan could not plan the log'}")
        save_profile(save, r.profile, r.provenance)
        saved = save
    data: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "logs": [report_to_dict(r) for r in reports],
                            "profile_saved": saved}
    Output(json_mode=json_out).result(data, lambda console: render_reports(reports, saved, console))
