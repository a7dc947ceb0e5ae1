"""Estimate results for people: the verdict first, then the figures behind it, within 80 columns.

Values that come from a config, a file or the user are printed as plain Text (never as rich markup) through
kvplan.escape.ci_text: no control character, and no CI log command can start inside them.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from kvplan.api import EstimateResult, GpuResult
from kvplan.capacity.kv import KvEstimate
from kvplan.cli.flags import change_flags
from kvplan.escape import ci_text
from kvplan.hardware.gpus import GpuSpec
from kvplan.planner.serialize import reason
from kvplan.planner.verdict import Verdict
from kvplan.units import GiB, fmt_bytes

_KIND_NAMES = {
    "full_attention": "full attention",
    "sliding_window": "sliding window",
    "chunked_local": "chunked local",
    "mla": "MLA latent",
    "compressed_mla": "compressed MLA",
    "mamba": "Mamba state",
    "linear_attention": "linear-attention state",
    "shared_kv": "shared KV",
    "none": "no cache",
}


_TERM_NAMES = {
    "weights": "weights",
    "activation_peak": "activation peak",
    "non_torch": "non-torch",
    "cuda_graphs": "CUDA graphs",
    "sampler_state": "sampler state",
    "draft_buffers": "draft buffers",
    "reserved": "reserved",
    "overhead": "overhead",
    "context": "CUDA context",
    "pinned": "pinned",
}


def _indent(r: RenderableType, by: int = 2) -> Padding:
    """Indented, with wrapped lines kept under the first (a hanging indent for long log lines)."""
    return Padding(r, (0, 0, 0, by))


def _bullet(text: str) -> Padding:
    """`- text`, indented, its wrapped lines aligned under the text rather than under the dash."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column()
    grid.add_column()
    grid.add_row("-", Text(ci_text(text)))
    return _indent(grid)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:,.2f} GiB"


def _requests(n: int) -> str:
    return f"{n:,} request" if n == 1 else f"{n:,} requests"


def _engine_name(v: Verdict) -> str:
    from kvplan.engines import get_engine

    label = get_engine(v.account.engine).label
    return f"{label} {v.account.version}" if v.account.version else label


def best_fix_text(g: GpuResult) -> str:
    if not g.fixes:
        return ""
    f = g.fixes[0]
    gpus = f.verdict.total_gpus
    flags = change_flags(f.changes, f.verdict.gpus_per_instance, f.verdict.account.engine)
    return f"{flags} (fits on {gpus} GPU{'s' if gpus > 1 else ''})"


def verdict_line(r: EstimateResult, g: GpuResult) -> Text:
    """The first line: verdict, what limits it, the best fix."""
    v = g.verdict
    d = v.deployment
    where = f" on {d.gpu.key} with {_engine_name(v)}"
    load = f"{_requests(d.workload.concurrency)} of {d.max_model_len:,} tokens"
    if v.fits:
        text = Text("FITS", style="bold green")
        body = (f"{where}: {load} need {_gib(v.kv_needed_bytes)} of {_gib(v.kv_budget_bytes)} of KV; "
                f"up to {v.max_requests:,} at once.")
    else:
        text = Text("DOES NOT FIT", style="bold red")
        why = reason(v)
        body = f"{where}: {load}. {why['message'].rstrip('.') + '.' if why else ''}"
        if v.limit == "kv_cache":
            body = (f"{where}: {load} need {_gib(v.kv_needed_bytes)} of KV; {_gib(v.kv_budget_bytes)} is free "
                    f"(up to {_requests(v.max_requests)} at once).")
        fix = best_fix_text(g)
        if fix:
            body += f" Best fix: {fix}."
    text.append(ci_text(body))
    return text


def calibration_line(v: Verdict) -> Text | None:
    """Under the verdict, when the plan lies outside where the engine model was checked against logs."""
    c = v.account.calibration
    if c is None or c.in_range:
        return None
    return Text(ci_text(f"Outside the checked range ({', '.join(c.outside)}; checked on {c.checked_on}): "
                        f"{c.error_band}."), style="yellow")


def _side_by_side_line(r: EstimateResult) -> Text:
    fit = [g.verdict.deployment.gpu.key for g in r.results if g.verdict.fits]
    not_fit = [g.verdict.deployment.gpu.key for g in r.results if not g.verdict.fits]
    text = Text("No GPU named: ", style="bold")
    text.append(f"fits on {', '.join(fit) if fit else 'none of the common cards'}")
    if not_fit and fit:
        text.append(f"; not on {', '.join(not_fit)}")
    refusals = {g.verdict.account.refusal.message for g in r.results if g.verdict.account.refusal}
    if len(refusals) == 1 and not fit:
        text.append(ci_text(f": {refusals.pop().rstrip('.')}"))
    text.append(". Name one with --gpu for its account and fixes.")
    return text


def _kv_rows(kv: KvEstimate) -> list[tuple[str, str, str]]:
    """Engine-neutral KV: one per-token figure for a uniform model, per kind for windowed and hybrid ones."""
    req = kv.request
    rows = []
    uniform = len(kv.kinds) == 1 and kv.kinds[0].resident_tokens == req.seq_tokens
    if uniform:
        k = kv.kinds[0]
        rows.append(("per token", fmt_bytes(kv.model_bytes_per_token), f"{k.layers} {_KIND_NAMES[k.kind]} layers"))
    else:
        for k in kv.kinds:
            name = f"{_KIND_NAMES[k.kind]}, {k.layers} layers"
            if k.state_bytes:
                rows.append((name, fmt_bytes(k.state_bytes), "per request, any length (per GPU)"))
            elif k.resident_tokens < req.seq_tokens:
                rows.append((name, f"{k.bytes_per_token:,} B", f"per token, {k.resident_tokens:,} kept (per GPU)"))
            else:
                rows.append((name, f"{k.bytes_per_token:,} B", "per token, all kept (per GPU)"))
    rows.append(("per request", _gib(kv.model_contiguous_bytes_per_request), f"{req.seq_tokens:,} tokens"))
    rows.append((_requests(req.batch), _gib(kv.model_batch_contiguous_bytes), "contiguous, no paging"))
    return rows


def _account_table(v: Verdict) -> Table:
    a = v.account
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column()
    t.add_column(justify="right")
    t.add_column()
    if a.requested_bytes:
        t.add_row("usable", _gib(a.requested_bytes), "what the engine lets itself use")
    for term in a.terms:
        t.add_row(f"- {_TERM_NAMES.get(term.name, term.name)}", _gib(term.bytes), Text(ci_text(term.label)))
    t.add_row("= KV memory", _gib(a.kv_budget_bytes), "")
    for u in v.pools:
        p = u.pool
        unit = f"{p.unit}s"
        t.add_row(p.name, f"{p.budget_units:,}", f"{unit} usable, {p.unit_bytes:,} B each")
        t.add_row("  needed", f"{u.needed_units:,}",
                  f"{unit} for {_requests(v.requests_per_cache)} ({p.per_request_units:,} each"
                  + (f", {p.shared_prefix_units:,} shared)" if p.shared_prefix_units else ")"))
    if a.refusal is not None:
        t.add_row("max requests", "0", f"{_engine_name(v)} would not start")
    else:
        t.add_row("max requests", f"{v.max_requests:,}",
                  f"at once (engine figure {v.max_concurrency:,.2f}x" + (
                      f", cap {a.request_cap:,}" if a.request_cap else "") + ")")
    if v.workload is not None:
        w = v.workload
        t.add_row("real requests", f"{w.requests:,}",
                  f"at once at {w.mean_input_tokens:,.0f} + {w.mean_output_tokens:,.0f} tokens on average "
                  f"(kvplan's figure; {_engine_name(v)} prints only the max-model-len one above)")
    if v.longest_context_tokens is not None:
        t.add_row("longest context", f"{v.longest_context_tokens:,}",
                  f"tokens for {_requests(v.deployment.workload.concurrency)}")
    return t


def _fixes_table(g: GpuResult) -> Table:
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column()
    t.add_column()
    for f in g.fixes:
        gpus = f.verdict.total_gpus
        effect = f"{gpus} GPU{'s' if gpus > 1 else ''}, up to {f.verdict.max_requests:,} at once"
        if not f.keeps_workload:
            effect += " (a smaller workload)"
        t.add_row(change_flags(f.changes, f.verdict.gpus_per_instance, f.verdict.account.engine), effect)
    return t


def _side_by_side(r: EstimateResult) -> Table:
    t = Table(box=None, pad_edge=False)
    for col, right in (("GPU", False), ("KV free", True), ("KV need", True), ("fits", False),
                       ("max req", True), ("longest", True)):
        t.add_column(col, justify="right" if right else "left")
    for g in r.results:
        v = g.verdict
        t.add_row(v.deployment.gpu.key, _gib(v.kv_budget_bytes), _gib(v.kv_needed_bytes),
                  "yes" if v.fits else "no", f"{v.max_requests:,}",
                  "-" if v.longest_context_tokens is None else f"{v.longest_context_tokens:,}")
    return t


def render_estimate(r: EstimateResult, console: Console) -> None:
    m, req = r.model, r.request
    named = r.gpu_named
    for g in r.results if named else ():
        console.print(verdict_line(r, g))
        outside = calibration_line(g.verdict)
        if outside is not None:
            console.print(outside)
    if not named:
        console.print(_side_by_side_line(r))
    console.print()
    kinds = ", ".join(f"{n} {_KIND_NAMES.get(k, k)}" for k, n in m.layer_kinds().items())
    console.print(Text(ci_text(f"{m.name}: {m.family}, {m.num_layers} layers ({kinds}), "
                               f"{m.num_params / 1e9:,.2f}B params")))
    console.print(Text(ci_text(f"  from {m.source}"), style="dim"))
    p = req.parallelism
    shard = ", ".join(f"{k} {v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("dp", p.dp)) if v > 1)
    console.print(Text(ci_text(
        f"  {r.results[0].verdict.deployment.max_model_len:,} tokens x {_requests(req.workload.concurrency)}, "
        f"KV {r.kv.kv_dtype.name}, weights {r.checkpoint.source}" + (f", {shard}" if shard else "")
    )))
    console.print()
    console.print(Text("KV cache, engine-neutral (tokens x bytes):", style="bold"))
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column()
    t.add_column(justify="right")
    t.add_column()
    for row in _kv_rows(r.kv):
        t.add_row(*row)
    t.add_row("checkpoint", _gib(r.checkpoint.total_bytes), f"{r.checkpoint.num_params / 1e9:,.2f}B params")
    console.print(_indent(t))
    if not named:
        console.print()
        console.print(_indent(_side_by_side(r)))
    for g in r.results if named else ():
        v = g.verdict
        console.print()
        console.print(Text(ci_text(f"On {v.deployment.gpu.key} ({_gib(v.account.total_memory_bytes)}), "
                                   f"{_engine_name(v)}, per GPU:"), style="bold"))
        console.print(_indent(_account_table(v)))
        if v.account.log_lines:
            console.print(Text(f"{_engine_name(v)} would log:", style="bold"))
            for line in v.account.log_lines:
                console.print(_indent(Text(ci_text(line))))
        if g.fixes:
            console.print(Text("Fixes (each planned again):", style="bold"))
            console.print(_indent(_fixes_table(g)))
        if v.notes:
            console.print(Text("Why these figures:", style="bold"))
            for note in v.notes:
                console.print(_bullet(note))
    for note in m.notes:
        console.print(Text(ci_text(f"note: {note}"), style="dim"))


def gpus_to_dict(gpus: tuple[GpuSpec, ...]) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "key": g.key,
                "name": g.display_name,
                "device_names": list(g.device_names),
                "total_memory_bytes": g.total_memory_bytes,
                "memory_source": g.memory_source,
                "aliases": list(g.aliases),
                "vendor": g.vendor,
                "bandwidth_bytes_per_s": g.bandwidth_bytes_per_s,
                "bandwidth_source": g.bandwidth_source,
            }
            for g in gpus
        ]
    }


def render_gpus(gpus: tuple[GpuSpec, ...], console: Console) -> None:
    """One line of figures per card, its name and aliases below: fits 80 columns, cuts nothing."""
    console.print(Text("GPU catalog: total memory as CUDA reports it, where sourced", style="bold"))
    t = Table(box=None, pad_edge=False)
    for col, right in (("key", False), ("memory", True), ("bytes", True), ("figure", False), ("bandwidth", True)):
        t.add_column(col, justify="right" if right else "left", no_wrap=True)
    for g in gpus:
        bw = f"{g.bandwidth_bytes_per_s / 1e12:g} TB/s" if g.bandwidth_bytes_per_s else "-"
        t.add_row(g.key, _gib(g.total_memory_bytes), f"{g.total_memory_bytes:,}", g.memory_kind, bw)
    console.print(t)
    console.print()
    for g in gpus:
        also = f"; also {', '.join(g.aliases)}" if g.aliases else ""
        console.print(Text(f"{g.key}: {g.display_name}{also}"))
