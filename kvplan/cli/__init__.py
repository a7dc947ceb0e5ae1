"""The `kvplan` command line: thin commands that parse flags, call the library, and hand data to output."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from kvplan import __version__
from kvplan.cli.options import Json
from kvplan.cli.output import Output, RstripLines, report_error
from kvplan.errors import KvplanError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="KV-cache capacity planner for LLM serving: size it, fit it, prove it.",
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Run a command; expected failures become `Error: ...` on stderr with the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets one line, never a traceback
            raise typer.Exit(report_error(exc)) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """KV-cache capacity planner for LLM serving."""


@app.command()
@handle_errors
def gpus(json_out: Json = False) -> None:
    """List the GPU catalog with the memory CUDA reports. Example: kvplan gpus --json"""
    from kvplan.cli.render import gpus_to_dict, render_gpus
    from kvplan.hardware.gpus import all_gpus

    catalog = all_gpus()
    Output(json_mode=json_out).result(gpus_to_dict(catalog), lambda console: render_gpus(catalog, console))


def main() -> None:
    """Console-script entry point."""
    stdout = RstripLines(sys.stdout)
    sys.stdout = stdout
    try:
        app()
    except KvplanError as exc:  # raised outside a command (e.g. while parsing options)
        raise SystemExit(report_error(exc)) from None
    finally:
        stdout.close()


# Commands that live in their own packages (their modules import nothing heavy at load time).
from kvplan.cli.calibrate import calibrate_command as _calibrate  # noqa: E402
from kvplan.cli.check import check as _check  # noqa: E402
from kvplan.cli.estimate import estimate as _estimate  # noqa: E402
from kvplan.cli.models import models_command as _models  # noqa: E402
from kvplan.cli.plan import plan_command as _plan  # noqa: E402
from kvplan.cli.verify import verify_command as _verify  # noqa: E402

app.command("estimate")(handle_errors(_estimate))
app.command("check")(handle_errors(_check))
app.command("plan")(handle_errors(_plan))
app.command("models")(handle_errors(_models))
app.command("verify")(handle_errors(_verify))
app.command("calibrate")(handle_errors(_calibrate))
