"""The `kvplan` command line: thin commands that parse flags, call the library, and hand data to output."""

from __future__ import annotations

import functools
import gc
import importlib
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from kvplan import __version__
from kvplan.cli.options import Json
from kvplan.cli.output import Output, RstripLines, report_error
from kvplan.errors import KvplanError

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


def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """KV-cache capacity planner for LLM serving."""


def gpus(json_out: Json = False) -> None:
    """List the GPU catalog with the memory CUDA reports. Example: kvplan gpus --json"""
    from kvplan.cli.render import gpus_to_dict, render_gpus
    from kvplan.hardware.gpus import all_gpus

    catalog = all_gpus()
    Output(json_mode=json_out).result(gpus_to_dict(catalog), lambda console: render_gpus(catalog, console))


# name -> (module, function), in --help's order. A command's module is imported only when the app is built
# with it: `kvplan estimate` builds an app holding estimate alone, so neither the other commands' modules nor
# typer's parsing of their signatures are paid for at start (about 25 ms of 240).
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": ("kvplan.cli.estimate", "estimate"),
    "plan": ("kvplan.cli.plan", "plan_command"),
    "check": ("kvplan.cli.check", "check"),
    "verify": ("kvplan.cli.verify", "verify_command"),
    "calibrate": ("kvplan.cli.calibrate", "calibrate_command"),
    "models": ("kvplan.cli.models", "models_command"),
    "gpus": ("kvplan.cli", "gpus"),
}


def build_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with the one named `only` (still a group: `kvplan NAME ...`)."""
    built = typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        help="KV-cache capacity planner for LLM serving: size it, fit it, prove it.",
        pretty_exceptions_enable=False,
    )
    built.callback()(_main)
    for name, (module, function) in COMMANDS.items():
        if only is None or name == only:
            built.command(name)(handle_errors(getattr(importlib.import_module(module), function)))
    return built


def __getattr__(name: str) -> Any:
    # `from kvplan.cli import app` (tests, the docs' sessions) gets the whole app, built on first use.
    if name == "app":
        globals()["app"] = built = build_app()
        return built
    raise AttributeError(name)


def main() -> None:
    """Console-script entry point."""
    stdout = RstripLines(sys.stdout)
    sys.stdout = stdout
    command = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        # What loading the command's modules creates (modules, classes, functions, typer's parameters: for
        # `estimate` 26,500 objects the collector tracks) lives until exit. The collector stays off while
        # they load and then freezes them, so no later collection, the one at interpreter exit included,
        # walks them again: `kvplan estimate` starts in about 150 ms instead of 170 (benchmarks/startup.py).
        gc.disable()
        app = build_app(command if command in COMMANDS else None)
        gc.freeze()
        gc.enable()
        app()
    except KvplanError as exc:  # raised outside a command (e.g. while parsing options)
        raise SystemExit(report_error(exc)) from None
    finally:
        stdout.close()
