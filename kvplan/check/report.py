"""Render check results: a rich table for people, JSON, GitHub workflow annotations, JUnit XML; and the exit code.

Exit code precedence (documented in the README): 1 when any deployment does not fit or fits with less than
its required margin, else 2 when anything could not be evaluated, else 0. A definite "does not fit" wins
over "could not evaluate" because it is the answer a reviewer must act on; both fail a CI job.
The required margin of a deployment is the larger of `--min-margin` and its own `min_margin`.
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from kvplan.check.model import CANNOT_EVALUATE, DOES_NOT_FIT, FITS, CheckResult
from kvplan.cli.escape import ci_text, gh_data, gh_property, json_text, xml_text
from kvplan.cli.escape import markup as escape
from kvplan.errors import EXIT_CANNOT_EVALUATE, EXIT_DOES_NOT_FIT, EXIT_OK
from kvplan.units import fmt_gib


def required_margin(result: CheckResult, min_margin: float | None) -> float | None:
    """The stricter of the command-line margin and the deployment's own."""
    found = [m for m in (min_margin, result.request.min_margin) if m is not None]
    return max(found) if found else None


def misses_margin(result: CheckResult, min_margin: float | None) -> bool:
    """True when the deployment fits but with less headroom than required."""
    need = required_margin(result, min_margin)
    return result.verdict == FITS and need is not None and result.margin is not None and result.margin < need


def exit_code(results: Sequence[CheckResult], min_margin: float | None = None) -> int:
    """0 all fit (with margin); 1 one does not fit or misses its margin; else 2 when one could not be evaluated."""
    if any(r.verdict == DOES_NOT_FIT or misses_margin(r, min_margin) for r in results):
        return EXIT_DOES_NOT_FIT
    if any(r.verdict == CANNOT_EVALUATE for r in results):
        return EXIT_CANNOT_EVALUATE
    return EXIT_OK


def _headline(result: CheckResult, min_margin: float | None) -> str:
    """One line: verdict and why, as annotations and JUnit messages show it."""
    req = result.request
    if result.verdict == CANNOT_EVALUATE:
        why = result.reason or "; ".join(f"{u.field}: {u.reason} ({u.how_to_fix})" for u in req.unresolved)
        return f"cannot evaluate {req.name}: {why}"
    figures = []
    if result.kv_needed_bytes is not None and result.kv_available_bytes is not None:
        figures.append(f"KV needed {fmt_gib(result.kv_needed_bytes)} of {fmt_gib(result.kv_available_bytes)} available")
    if result.max_concurrency is not None:
        seqs = f" (max-num-seqs {req.max_num_seqs})" if req.max_num_seqs is not None else ""
        figures.append(f"max concurrency {result.max_concurrency:.2f}{seqs}")
    if result.margin is not None:
        figures.append(f"margin {result.margin:.1%}")
    text = f"{req.name} ({req.model or '?'} on {req.gpu or '?'} x {req.num_gpus or '?'})"
    if result.verdict == DOES_NOT_FIT:
        text = f"{text} does not fit: {result.reason or 'KV cache too small'}"
    elif misses_margin(result, min_margin):
        text = f"{text} fits with margin {result.margin:.1%}, below the required {required_margin(result, min_margin):.1%}"
    else:
        text = f"{text} fits"
    if figures:
        text += "; " + ", ".join(figures)
    if result.fix and result.verdict != FITS or result.fix and misses_margin(result, min_margin):
        text += f". Fix: {result.fix}"
    return text


def _as_dict(result: CheckResult, min_margin: float | None) -> dict[str, Any]:
    req = result.request
    return {
        "file": req.location.file,
        "line": req.location.line,
        "name": req.name,
        "format": req.source_format,
        "engine": req.engine,
        "model": req.model,
        "gpu": req.gpu,
        "gpu_source": req.gpu_source or None,
        "num_gpus": req.num_gpus,
        "tensor_parallel_size": req.tensor_parallel_size,
        "pipeline_parallel_size": req.pipeline_parallel_size,
        "max_model_len": req.max_model_len,
        "max_num_seqs": req.max_num_seqs,
        "max_num_batched_tokens": req.max_num_batched_tokens,
        "gpu_memory_utilization": req.gpu_memory_utilization,
        "kv_cache_dtype": req.kv_cache_dtype,
        "dtype": req.dtype,
        "quantization": req.quantization,
        "verdict": result.verdict,
        "meets_min_margin": None if result.verdict != FITS else not misses_margin(result, min_margin),
        "kv_needed_bytes": result.kv_needed_bytes,
        "kv_available_bytes": result.kv_available_bytes,
        "max_concurrency": result.max_concurrency,
        "margin": result.margin,
        "required_margin": required_margin(result, min_margin),
        "reason": result.reason,
        "fix": result.fix,
        "unresolved": [{"field": u.field, "reason": u.reason, "how_to_fix": u.how_to_fix} for u in req.unresolved],
        "notes": list(req.notes),
        "flags": [[k, v] for k, v in req.flags],
        "engine_lines": list(result.engine_lines),
    }


def render_json(results: Sequence[CheckResult], *, min_margin: float | None = None) -> str:
    """A JSON document: {"results": [...], "summary": {verdict: count}, "exit_code": N}."""
    summary = {v: sum(1 for r in results if r.verdict == v) for v in (FITS, DOES_NOT_FIT, CANNOT_EVALUATE)}
    summary["below_min_margin"] = sum(1 for r in results if misses_margin(r, min_margin))
    payload = {
        "results": [_as_dict(r, min_margin) for r in results],
        "summary": summary,
        "exit_code": exit_code(results, min_margin),
    }
    return json_text(json.dumps(payload, indent=2))


def render_github(results: Sequence[CheckResult], *, min_margin: float | None = None) -> str:
    """GitHub Actions workflow commands, one per deployment: error (does not fit), warning, notice (fits)."""
    lines = []
    for result in results:
        req = result.request
        if result.verdict == DOES_NOT_FIT or misses_margin(result, min_margin):
            level, title = "error", f"kvplan: {req.name} does not fit" if result.verdict == DOES_NOT_FIT else f"kvplan: {req.name} below margin"
        elif result.verdict == CANNOT_EVALUATE:
            level, title = "warning", f"kvplan: cannot evaluate {req.name}"
        else:
            level, title = "notice", f"kvplan: {req.name} fits"
        lines.append(
            f"::{level} file={gh_property(req.location.file)},line={req.location.line},"
            f"title={gh_property(title)}::{gh_data(_headline(result, min_margin))}"
        )
    return "\n".join(lines) + ("\n" if lines else "")


def render_junit(results: Sequence[CheckResult], *, min_margin: float | None = None) -> str:
    """JUnit XML: one testcase per deployment; failure = does not fit (or below margin), error = cannot evaluate."""
    failures = sum(1 for r in results if r.verdict == DOES_NOT_FIT or misses_margin(r, min_margin))
    errors = sum(1 for r in results if r.verdict == CANNOT_EVALUATE)
    root = ET.Element("testsuites", name="kvplan check", tests=str(len(results)), failures=str(failures), errors=str(errors))
    suite = ET.SubElement(root, "testsuite", name="kvplan check", tests=str(len(results)), failures=str(failures),
                          errors=str(errors), skipped="0")
    for result in results:
        req = result.request
        case = ET.SubElement(suite, "testcase", classname=xml_text(req.location.file),
                             name=xml_text(f"{req.name} ({req.location})"), file=xml_text(req.location.file),
                             line=str(req.location.line))
        headline = xml_text(_headline(result, min_margin))
        details = [f"{u.field}: {u.reason}. How to fix: {u.how_to_fix}" for u in req.unresolved]
        details += [f"note: {n}" for n in req.notes] + list(result.engine_lines)
        body = "\n".join([headline, *map(xml_text, details)])  # one escaped line per entry
        if result.verdict == DOES_NOT_FIT or misses_margin(result, min_margin):
            node = ET.SubElement(case, "failure", message=headline, type=DOES_NOT_FIT)
            node.text = body
        elif result.verdict == CANNOT_EVALUATE:
            node = ET.SubElement(case, "error", message=headline, type=CANNOT_EVALUATE)
            node.text = body
        else:
            out = ET.SubElement(case, "system-out")
            out.text = body
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _short_location(req) -> str:
    """file:line relative to the working directory when that is shorter (tables are read in CI logs)."""
    try:
        rel = os.path.relpath(req.location.file)
    except ValueError:  # another drive on Windows
        rel = req.location.file
    path = rel if len(rel) < len(req.location.file) else req.location.file
    return f"{path}:{req.location.line}"


def render_human(results: Sequence[CheckResult], console: Console, *, min_margin: float | None = None) -> None:
    """A table of every deployment, then the reason and fix of each one that does not pass."""
    table = Table(title="kvplan check", show_lines=False)
    for column in ("where", "deployment", "model", "GPU x n (tp/pp)", "max len", "KV needed / available",
                   "conc. / max seqs", "margin", "verdict"):
        table.add_column(column, overflow="fold")
    for result in results:
        req = result.request
        kv = (f"{fmt_gib(result.kv_needed_bytes)} / {fmt_gib(result.kv_available_bytes)}"
              if result.kv_needed_bytes is not None and result.kv_available_bytes is not None else "-")
        concurrency = f"{result.max_concurrency:.2f}" if result.max_concurrency is not None else "-"
        concurrency += f" / {req.max_num_seqs}" if req.max_num_seqs is not None else " / default"
        if result.verdict == FITS and not misses_margin(result, min_margin):
            verdict = "[green]fits[/green]"
        elif result.verdict == FITS:
            verdict = "[red]below margin[/red]"
        elif result.verdict == DOES_NOT_FIT:
            verdict = "[red]does not fit[/red]"
        else:
            verdict = "[yellow]cannot evaluate[/yellow]"
        table.add_row(
            escape(_short_location(req)), escape(req.name), escape(req.model or "?"),
            escape(f"{req.gpu or '?'} x {req.num_gpus if req.num_gpus is not None else '?'} "
                   f"({req.tensor_parallel_size}/{req.pipeline_parallel_size})"),
            str(req.max_model_len) if req.max_model_len is not None else "default", kv, concurrency,
            f"{result.margin:.1%}" if result.margin is not None else "-", verdict,
        )
    console.print(table)
    for result in results:
        if result.verdict == FITS and not misses_margin(result, min_margin):
            continue
        req = result.request
        console.print(f"[bold]{escape(str(req.location))}[/bold] {escape(_headline(result, min_margin))}", highlight=False)
        for unresolved in req.unresolved:
            console.print(ci_text(f"  - {unresolved.field}: {unresolved.reason}. How to fix: {unresolved.how_to_fix}"),
                          markup=False, highlight=False)
        for note in req.notes:
            console.print(ci_text(f"  note: {note}"), markup=False, highlight=False)
