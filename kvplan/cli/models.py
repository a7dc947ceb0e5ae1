"""`kvplan models`: the bundled library as a table (or JSON), one row per model, filterable.

The rows are built in kvplan.cli.model_rows, imported when the command runs: parsing the library is not
paid for by `kvplan estimate`'s start.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer

from kvplan.cli.output import Output
from kvplan.errors import InputError

_KIND_HELP = "Only models with a layer of this kind: full_attention, sliding_window, chunked_local, mla, " \
    "compressed_mla, mamba, linear_attention, shared_kv."


def models_command(
    name: Annotated[str | None, typer.Argument(help="Only models whose name contains this text.")] = None,
    family: Annotated[str | None, typer.Option("--family", help="Only this family (llama, qwen3-moe, ...).")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help=_KIND_HELP)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
) -> None:
    """List the bundled model library. Example: kvplan models --kind mla"""
    from kvplan.cli.model_rows import library_rows, render_models

    rows, failures = library_rows(name, family, kind)
    for failure in failures:
        Output.notice(failure)
    if not rows:
        raise InputError("no library model matches the filters; run `kvplan models` to see them all")
    data: dict[str, Any] = {"count": len(rows), "models": [asdict(r) for r in rows]}
    Output(json_mode=json_out).result(data, lambda console: render_models(rows, console))
