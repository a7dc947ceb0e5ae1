"""Verify results as data (the --json document) and as rich tables, plus the progress bar on stderr."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kvplan.escape import ci_text, markup
from kvplan.model.specs import LayerKind
from kvplan.units import fmt_bytes
from kvplan.verify.rank import RankResult
from kvplan.verify.setup import VerifySetup


@contextmanager
def progress_bar(console: Console | None) -> Iterator[Progress | None]:
    """Allocation and decode progress on `console` (the CLI's stderr; transient, so the table or JSON on stdout
    stays clean); None: no bar."""
    if console is None:
        yield None
        return

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with bar:
        yield bar


def scope_notes(setup: VerifySetup, results: list[RankResult]) -> list[str]:
    """What the run did and did not cover, said in the output."""
    notes = []
    d = results[0].decode
    if d is not None and d.decoded_layers < d.total_layers:
        notes.append(
            f"decode ran through the first {d.decoded_layers} of {d.total_layers} layers (--decode-layers); "
            "the bytes check covers all of them"
        )
    if results[0].device == "cpu":
        notes.append("on the host the arithmetic runs in float32 (the cache keeps its KV dtype)")
    kinds = setup.model.layer_kinds()
    if kinds.get(LayerKind.NO_CACHE) or kinds.get(LayerKind.SHARED_KV):
        notes.append("MLP/MoE-only and shared-KV layers store nothing and are passed through unchanged")
    if any(p.kind == "mla" for p in setup.layers):
        notes.append(
            "MLA decodes in absorbed form: queries in the latent space, values = the latent's first kv_lora_rank"
        )
    c = results[0].check
    if c is not None and not c.windows_wrapped and any(p.spec.window_tokens is not None for p in setup.layers):
        notes.append(f"the {c.seq_tokens}-token correctness check is shorter than the window, so the ring did not turn")
    return notes


def to_dict(setup: VerifySetup, results: list[RankResult], passed: bool) -> dict[str, Any]:
    r = setup.request
    return {
        "model": setup.model.name,
        "source": setup.model.source,
        "request": {
            "seq_tokens": setup.seq_tokens,
            "batch": setup.batch,
            "requested_batch": r.batch,
            "fraction": r.fraction,
            "kv_cache_dtype": setup.kv_dtype.name,
            "dtype": setup.dtype,
            "layout": r.layout,
            "block_size": r.block_size,
            "tp": r.tp,
            "pp": r.pp,
            "steps": r.steps,
        },
        "passed": passed,
        "predicted_bytes": results[0].predicted_bytes,
        "ranks": [_rank_dict(x) for x in results],
        "notes": list(setup.notices) + scope_notes(setup, results),
    }


def _rank_dict(x: RankResult) -> dict[str, Any]:
    out = {
        "rank": x.rank,
        "device": x.device,
        "predicted_bytes": x.predicted_bytes,
        "measured_bytes": x.measured_bytes,
        "kinds": [dict(asdict(k), matches=k.matches) for k in x.kinds],
        "reserved_bytes": x.reserved_bytes,
        "free_before_bytes": x.free_before_bytes,
        "workspace_estimate_bytes": x.workspace_bytes,
        "weights_bytes": x.weights_bytes,
        "check": None if x.check is None else dict(asdict(x.check), passed=x.check.passed),
        "decode": None if x.decode is None else asdict(x.decode),
        "copy_bandwidth_bytes_per_s": x.copy_bandwidth_bytes_per_s,
        "peak_bandwidth_bytes_per_s": x.peak_bandwidth_bytes_per_s,
        "peak_bandwidth_source": x.peak_bandwidth_source,
    }
    if x.decode is not None:
        bw = x.decode.bandwidth_bytes_per_s
        out["decode_bandwidth_vs_copy"] = bw / x.copy_bandwidth_bytes_per_s
        out["decode_bandwidth_vs_peak"] = (
            None if not x.peak_bandwidth_bytes_per_s else bw / x.peak_bandwidth_bytes_per_s
        )
    return out


def render(setup: VerifySetup, results: list[RankResult], passed: bool, console: Console) -> None:
    """Per rank, the byte table (exact integers, so a one-byte miss shows) and the decode figures as short
    lines: twelve decode columns side by side would not fit 80 columns without cutting numbers."""
    r = setup.request
    console.print(
        f"[bold]{markup(setup.model.name)}[/bold]: {setup.batch} x {setup.seq_tokens:,} tokens, "
        f"KV {setup.kv_dtype.name}, {r.layout} (block {r.block_size}), tp={r.tp} pp={r.pp}"
    )
    for x in results:
        same = x.predicted_bytes == x.measured_bytes
        console.print(Text.assemble(
            (f"KV cache, rank {x.rank}: ", "bold"),
            f"{fmt_bytes(x.predicted_bytes)} predicted, {fmt_bytes(x.measured_bytes)} measured: ",
            ("match", "green") if same else ("MISMATCH", "bold red"),
        ))
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("kind", "layers", "predicted bytes", "measured bytes", "match"):
            table.add_column(col, justify="left" if col == "kind" else "right")
        for k in x.kinds:
            table.add_row(k.kind, str(k.layers), f"{k.predicted_bytes:,}", f"{k.measured_bytes:,}",
                          "yes" if k.matches else "NO")
        table.add_row("[bold]total[/bold]", "", f"{x.predicted_bytes:,}", f"{x.measured_bytes:,}",
                      "yes" if same else "NO")
        console.print(Padding(table, (0, 0, 0, 4)))
        for k in x.kinds:
            if not k.matches:
                console.print(Padding(Text(f"{k.kind}: measured {k.measured_bytes - k.predicted_bytes:+,} B "
                                           "against the prediction"), (0, 0, 0, 4)))
        _render_decode(x, console)
    x = results[0]
    if x.reserved_bytes is not None:
        console.print(
            f"reserved by the CUDA allocator after allocation (includes slack): {fmt_bytes(x.reserved_bytes)}"
        )
    console.print(
        f"device copy bandwidth: {x.copy_bandwidth_bytes_per_s / 1e9:,.1f} GB/s; peak: "
        f"{'n/a' if not x.peak_bandwidth_bytes_per_s else f'{x.peak_bandwidth_bytes_per_s / 1e9:,.0f} GB/s'} "
        f"({markup(x.peak_bandwidth_source)})"
    )
    for note in list(setup.notices) + scope_notes(setup, results):
        console.print(f"note: {ci_text(note)}", markup=False)
    console.print("[bold green]verified[/bold green]" if passed else "[bold red]MISMATCH[/bold red]")


def _render_decode(x: RankResult, console: Console) -> None:
    d, c = x.decode, x.check
    if d is None:
        return
    bw = d.bandwidth_bytes_per_s
    peak = "n/a" if not x.peak_bandwidth_bytes_per_s else f"{bw / x.peak_bandwidth_bytes_per_s:.0%}"
    check = "skipped" if c is None else (
        f"{'ok' if c.passed else 'FAILED'} (max relative error {c.rel_error:.1e} over {c.seq_tokens} tokens)")
    lines = [
        f"step {d.step_seconds * 1e3:,.2f} ms ({d.tokens_per_s:,.1f} tokens/s); recomputing without the cache "
        f"{d.recompute_seconds * 1e3:,.1f} ms, {d.speedup:,.1f}x slower",
        f"KV read per step {fmt_bytes(d.kv_read_bytes_per_step)} at {bw / 1e9:,.2f} GB/s: "
        f"{bw / x.copy_bandwidth_bytes_per_s:.0%} of the device's copy bandwidth, {peak} of its peak",
        f"peak memory {fmt_bytes(d.peak_bytes)}; cached = recomputed: {check}",
    ]
    console.print(Text.assemble(("Cached decode", "bold"), f", rank {x.rank} on ", ci_text(x.device)))
    for line in lines:
        console.print(Padding(Text(line), (0, 0, 0, 4)))
