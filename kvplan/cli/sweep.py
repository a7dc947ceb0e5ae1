"""`kvplan estimate` over lists: every model x context length x batch x GPU, as a table, CSV rows or a JSON list.

Each combination is one estimate (the same request, planner and verdict as a single run), without the fix
search. The table groups rows by model so a long model name is printed whole once, within 80 columns.
"""

from __future__ import annotations

import csv
import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvplan.api import EstimateRequest, estimate
from kvplan.cli.flags import flag_error
from kvplan.cli.output import Output
from kvplan.cli.sweep_row import SweepRow
from kvplan.errors import EXIT_DOES_NOT_FIT, EXIT_OK, FieldError
from kvplan.units import GiB

# The CSV and JSON columns, in order: what the table shows, as plain numbers.
COLUMNS = (
    "model", "gpu", "engine", "max_model_len", "batch", "kv_cache_dtype", "fits", "limit", "kv_needed_bytes",
    "kv_budget_bytes", "headroom_bytes", "max_requests", "max_concurrency", "longest_context_tokens",
    "workload_concurrency",
)


def sweep_rows(requests: list[EstimateRequest]) -> list[SweepRow]:
    """Plan every request (each on its GPUs); a value the core refuses is an error naming its flag."""
    rows = []
    for req in requests:
        try:
            result = estimate(req, fixes=False)
        except FieldError as exc:
            raise flag_error(exc) from None
        for g in result.results:
            rows.append(SweepRow(result.model.name, req.workload.concurrency, result.kv.kv_dtype.name, g.verdict,
                                 result.gpu_named))
    return rows


def csv_text(rows: list[SweepRow]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.to_dict().items()})
    return buffer.getvalue()


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:,.2f}"


def render_sweep(rows: list[SweepRow], console: Console) -> None:
    """A table per model: GPU, context, batch, fits, KV need and budget (GiB), max requests at once."""
    workload = any(r.verdict.workload is not None for r in rows)
    fitting = sum(r.verdict.fits for r in rows)
    console.print(Text(f"{len(rows):,} combinations, {fitting:,} fit. KV in GiB per GPU; max req: whole requests "
                       "at once at that context."))
    for model in dict.fromkeys(r.model for r in rows):
        console.print()
        console.print(Text(model, style="bold"))
        t = Table(box=None, pad_edge=False)
        headers = ["GPU", "context", "batch", "KV", "fits", "KV need", "KV free", "max req"]
        if workload:
            headers.append("real")
        for i, h in enumerate(headers):
            t.add_column(h, justify="left" if i in (0, 3, 4) else "right", no_wrap=True)
        for r in (r for r in rows if r.model == model):
            v = r.verdict
            cells = [v.deployment.gpu.key, f"{v.deployment.max_model_len:,}", f"{r.batch:,}", r.kv_cache_dtype,
                     "yes" if v.fits else "no", _gib(v.kv_needed_bytes), _gib(v.kv_budget_bytes),
                     f"{v.max_requests:,}"]
            if workload:
                cells.append("-" if v.workload is None else f"{v.workload.requests:,}")
            t.add_row(*cells)
        console.print(t)
    if workload:
        console.print(Text("real: requests of the given lengths resident at once (kvplan's figure; vLLM prints "
                           "the max-model-len one)."))


def run_sweep(requests: list[EstimateRequest], out: Output, *, csv_out: bool, plot: str | None) -> int:
    """Print the sweep (table, CSV or JSON list), draw it when asked, and return the exit code."""
    from kvplan.errors import InputError

    if csv_out and out.json_mode:
        raise InputError("--csv and --json both print the sweep; choose one")
    if plot is not None:
        from kvplan.cli.plot import check_plot_path

        check_plot_path(plot)
    rows = sweep_rows(requests)
    if plot is not None:
        from kvplan.cli.plot import draw_sweep

        draw_sweep(rows, plot)
        out.notice(f"plot written to {plot}")
    if csv_out:
        out.raw(csv_text(rows))
    else:
        out.result([r.to_dict() for r in rows], lambda console: render_sweep(rows, console))
    return EXIT_DOES_NOT_FIT if any(r.gpu_named and not r.verdict.fits for r in rows) else EXIT_OK
