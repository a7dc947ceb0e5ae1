"""Render check results: a list for people, JSON, GitHub workflow annotations, JUnit XML; and the exit code.

Exit code precedence (documented in the README): 1 when any deployment does not fit or fits with less than
its required margin; else 2 when a file could not be read, when nothing was evaluated (no deployment found,
or none had what evaluation needs) unless --allow-empty, or when --strict and any deployment could not be
evaluated; else 0. A definite "does not fit" wins because it is the answer a reviewer must act on. Without
--strict a deployment that cannot be evaluated is a warning, shown with every blocker, and does not fail
the job by itself. The required margin of a deployment is the larger of `--min-margin` and its own.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from kvplan.check.model import CANNOT_EVALUATE, DOES_NOT_FIT, FITS, VERDICTS, CheckResult, FileReport
from kvplan.errors import EXIT_CANNOT_EVALUATE, EXIT_DOES_NOT_FIT, EXIT_OK
from kvplan.escape import ci_text, gh_data, gh_property, json_text, xml_text
from kvplan.records import dataclass
from kvplan.units import fmt_gib


def required_margin(result: CheckResult, min_margin: float | None) -> float | None:
    """The stricter of the command-line margin and the deployment's own."""
    found = [m for m in (min_margin, result.request.min_margin) if m is not None]
    return max(found) if found else None


def misses_margin(result: CheckResult, min_margin: float | None) -> bool:
    """True when the deployment fits but with less headroom than required."""
    need = required_margin(result, min_margin)
    return result.verdict == FITS and need is not None and result.margin is not None and result.margin < need


@dataclass(frozen=True)
class Policy:
    """How strict the run is: --min-margin, --strict (cannot evaluate fails), --allow-empty (empty passes)."""

    min_margin: float | None = None
    strict: bool = False
    allow_empty: bool = False


def unreadable(result: CheckResult) -> bool:
    """A result that stands for a file that could not be read at all."""
    return any(u.field == "file" for u in result.request.unresolved)


def fails_job(result: CheckResult, policy: Policy) -> bool:
    """Whether this one result fails the job by itself (an empty run fails as a whole, see exit_reason)."""
    if result.verdict == DOES_NOT_FIT or misses_margin(result, policy.min_margin):
        return True
    return result.verdict == CANNOT_EVALUATE and (policy.strict or unreadable(result))


DEFAULT_POLICY = Policy()


def exit_reason(results: Sequence[CheckResult], policy: Policy = DEFAULT_POLICY) -> tuple[int, str]:
    """The exit code and why, in words for the closing summary line."""
    failing = [r for r in results if r.verdict == DOES_NOT_FIT or misses_margin(r, policy.min_margin)]
    if failing:
        verb = "does" if len(failing) == 1 else "do"
        below = " or miss their margin" if any(r.verdict == FITS for r in failing) else ""
        return EXIT_DOES_NOT_FIT, f"{_count(len(failing), 'deployment')} {verb} not fit{below}"
    broken = [r for r in results if unreadable(r)]
    if broken:
        return EXIT_CANNOT_EVALUATE, f"{_count(len(broken), 'file')} could not be read"
    failed = [r for r in results if r.reason_code == "internal"]
    if failed:
        return EXIT_CANNOT_EVALUATE, f"kvplan failed on {_count(len(failed), 'deployment')}"
    blocked = [r for r in results if r.verdict == CANNOT_EVALUATE]
    if blocked and policy.strict:
        return EXIT_CANNOT_EVALUATE, f"--strict and {_count(len(blocked), 'deployment')} could not be evaluated"
    if not any(r.verdict in (FITS, DOES_NOT_FIT) for r in results) and not policy.allow_empty:
        what = "no deployment found" if not results else "no deployment could be evaluated"
        return EXIT_CANNOT_EVALUATE, f"{what} (--allow-empty to pass)"
    if blocked:
        return EXIT_OK, f"every evaluated deployment fits; {_count(len(blocked), 'warning')} (--strict to fail)"
    return EXIT_OK, "every deployment fits" if results else "nothing to check (--allow-empty)"


def exit_code(results: Sequence[CheckResult], min_margin: float | None = None, *, strict: bool = False,
              allow_empty: bool = False) -> int:
    """0 pass; 1 a deployment does not fit or misses its margin; 2 unreadable, empty, or --strict and blocked."""
    return exit_reason(results, Policy(min_margin, strict, allow_empty))[0]


def summary_line(results: Sequence[CheckResult], files: Sequence[FileReport], policy: Policy = DEFAULT_POLICY) -> str:
    """One closing line: counts, the exit code and why, and the files skipped."""
    code, why = exit_reason(results, policy)
    counts = [f"{sum(1 for r in results if r.verdict == FITS and not misses_margin(r, policy.min_margin))} fit"]
    below = sum(1 for r in results if misses_margin(r, policy.min_margin))
    if below:
        counts.append(f"{below} below margin")
    counts.append(f"{sum(1 for r in results if r.verdict == DOES_NOT_FIT)} do not fit")
    counts.append(f"{sum(1 for r in results if r.verdict == CANNOT_EVALUATE and not unreadable(r))} cannot evaluate")
    deployments = sum(1 for r in results if not unreadable(r))
    skipped = [f.path for f in files if f.skipped]
    text = (f"kvplan check: {_count(len(files), 'file')}, {_count(deployments, 'deployment')}: "
            f"{', '.join(counts)}; exit {code}: {why}")
    if skipped:
        text += f"; skipped {_count(len(skipped), 'file')} without deployments: {', '.join(skipped)}"
    return text


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


_FLAG_RE = re.compile(r"--([a-z][a-z0-9-]+)")


def annotation_line(result: CheckResult) -> int:
    """The line to annotate: the line of what the fix changes, of the first blocker, else the deployment's."""
    req = result.request
    if result.fix_field:
        return req.line_of(result.fix_field)
    if result.verdict == CANNOT_EVALUATE:
        return next((u.line for u in req.unresolved if u.line is not None), req.location.line)
    if result.fix:
        # The fix names the flag to change ("lower --max-model-len to 33744"): point at that flag's line.
        for flag in _FLAG_RE.findall(result.fix):
            for key in (f"--{flag}", flag.replace("-", "_")):  # the flag as written, or the field it fills
                if req.line_of(key) != req.location.line:
                    return req.line_of(key)
        if "GPU" in result.fix:
            return req.line_of("num_gpus")
    return req.location.line


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
        needed = required_margin(result, min_margin) or 0.0
        text = f"{text} fits with margin {result.margin:.1%}, below the required {needed:.1%}"
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
        "reason_code": result.reason_code,
        "max_requests": result.max_requests,
        "fix": result.fix,
        "fixes": list(result.fixes),
        "figures": result.figures,
        "unresolved": [{"field": u.field, "reason": u.reason, "how_to_fix": u.how_to_fix, "line": u.line}
                       for u in req.unresolved],
        "notes": list(req.notes),
        "gpus_per_pod": req.gpus_per_pod,
        "pods_per_instance": req.pods_per_instance,
        "replicas": req.replicas,
        "data_parallel_size": req.data_parallel_size,
        "dp_attention": req.dp_attention,
        "expert_parallel": req.expert_parallel,
        "cpu_offload_bytes": req.cpu_offload_bytes,
        "lora_slots": None if req.lora_slots is None else dict(
            zip(("max_loras", "max_lora_rank", "fully_sharded"), req.lora_slots, strict=True)),
        "gpu_key": req.gpu_key,
        "gpu_memory_bytes": req.gpu_memory_bytes,
        "ignored_flags": [{"flag": f.flag, "value": f.value, "why": f.why, "line": f.line} for f in req.ignored_flags],
        "document": req.location.document or None,
        "flags": [[k, v] for k, v in req.flags],
        "engine_lines": list(result.engine_lines),
    }


def render_json(results: Sequence[CheckResult], *, min_margin: float | None = None,
                files: Sequence[FileReport] = (), policy: Policy | None = None) -> str:
    """A JSON document: {"results": [...], "files": [...], "summary": {...}, "exit_code": N, "exit_reason": ...}."""
    policy = policy or Policy(min_margin)
    summary: dict[str, Any] = {v: sum(1 for r in results if r.verdict == v) for v in VERDICTS}
    summary["below_min_margin"] = sum(1 for r in results if misses_margin(r, policy.min_margin))
    summary["files_skipped"] = sum(1 for f in files if f.skipped)
    code, why = exit_reason(results, policy)
    payload = {
        "results": [_as_dict(r, policy.min_margin) for r in results],
        "files": [{"file": f.path, "deployments": f.deployments, "skipped": f.skipped, "error": f.error}
                  for f in files],
        "summary": summary,
        "exit_code": code,
        "exit_reason": why,
    }
    return json_text(json.dumps(payload, indent=2))


def render_github(results: Sequence[CheckResult], *, min_margin: float | None = None,
                  files: Sequence[FileReport] = (), policy: Policy | None = None) -> str:
    """GitHub Actions workflow commands: `::error` for what fails the job, `::warning` for what cannot be
    evaluated without failing it, `::notice` for fits and skipped files; then the summary line.

    Each annotation points at the line to change (the flag the fix names, the first blocker), not at the
    container. Standard input has no file to annotate, so its annotations carry no file and line.
    """
    policy = policy or Policy(min_margin)
    code, _ = exit_reason(results, policy)
    empty_fails = code != EXIT_OK and not any(fails_job(r, policy) for r in results)
    lines = []
    for result in results:
        req = result.request
        if fails_job(result, policy) or (empty_fails and result.verdict == CANNOT_EVALUATE):
            level = "error"
        elif result.verdict == CANNOT_EVALUATE:
            level = "warning"
        else:
            level = "notice"
        if result.verdict == DOES_NOT_FIT:
            title = f"kvplan: {req.name} does not fit"
        elif misses_margin(result, policy.min_margin):
            title = f"kvplan: {req.name} below margin"
        elif result.verdict == CANNOT_EVALUATE:
            title = f"kvplan: cannot evaluate {req.name}"
        else:
            title = f"kvplan: {req.name} fits"
        where = "" if req.location.document else (
            f"file={gh_property(req.location.file)},line={annotation_line(result)},")
        message = _headline(result, policy.min_margin)
        if req.location.document:
            message = f"{req.location}: {message}"
        lines.append(f"::{level} {where}title={gh_property(title)}::{gh_data(message)}")
    for report in files:
        if report.skipped:
            level = "error" if empty_fails else "notice"
            # line=1: a skipped file has no deployment line to point at, and an annotation with a file but
            # no line is shown by GitHub only in the run summary, not beside the file in the diff.
            lines.append(f"::{level} file={gh_property(report.path)},line=1,title={gh_property('kvplan: skipped')}::"
                         f"{gh_data(report.path + ': ' + report.skipped)}")
    lines.append(ci_text(summary_line(results, files, policy)))
    return "\n".join(lines) + "\n"


def render_junit(results: Sequence[CheckResult], *, min_margin: float | None = None,
                 files: Sequence[FileReport] = (), policy: Policy | None = None) -> str:
    """JUnit XML: one testcase per deployment (failure = does not fit or below margin, error = cannot
    evaluate) and one skipped testcase per file without deployments."""
    min_margin = (policy or Policy(min_margin)).min_margin
    skipped_files = [f for f in files if f.skipped]
    failures = sum(1 for r in results if r.verdict == DOES_NOT_FIT or misses_margin(r, min_margin))
    errors = sum(1 for r in results if r.verdict == CANNOT_EVALUATE)
    tests = str(len(results) + len(skipped_files))
    root = ET.Element("testsuites", name="kvplan check", tests=tests, failures=str(failures), errors=str(errors))
    suite = ET.SubElement(root, "testsuite", name="kvplan check", tests=tests, failures=str(failures),
                          errors=str(errors), skipped=str(len(skipped_files)))
    for report in skipped_files:
        case = ET.SubElement(suite, "testcase", classname=xml_text(report.path), name=xml_text(report.path),
                             file=xml_text(report.path))
        ET.SubElement(case, "skipped", message=xml_text(report.skipped or ""))
    for result in results:
        req = result.request
        case = ET.SubElement(suite, "testcase", classname=xml_text(req.location.file),
                             name=xml_text(f"{req.name} ({req.location})"), file=xml_text(req.location.file),
                             line=str(req.location.line))
        headline = xml_text(_headline(result, min_margin))
        details = [f"{u.field}: {u.reason}. How to fix: {u.how_to_fix}" for u in req.unresolved]
        details += [f"note: {n}" for n in req.notes] + list(result.engine_lines)
        if result.verdict == DOES_NOT_FIT or misses_margin(result, min_margin):
            node = ET.SubElement(case, "failure", message=headline, type=DOES_NOT_FIT)
            node.text = xml_text("\n".join([headline, *details]))
        elif result.verdict == CANNOT_EVALUATE:
            node = ET.SubElement(case, "error", message=headline, type=CANNOT_EVALUATE)
            node.text = xml_text("\n".join([headline, *details]))
        else:
            out = ET.SubElement(case, "system-out")
            out.text = xml_text("\n".join([headline, *details]))
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _short_location(req) -> str:
    """file:line relative to the working directory when that is shorter (reports are read in CI logs)."""
    try:
        rel = os.path.relpath(req.location.file)
    except ValueError:  # another drive on Windows
        rel = req.location.file
    path = rel if len(rel) < len(req.location.file) else req.location.file
    where = f"{path}:{req.location.line}"
    return f"{where} ({req.location.document})" if req.location.document else where


_LABELS = {FITS: ("fits", "green"), DOES_NOT_FIT: ("does not fit", "red"),
           CANNOT_EVALUATE: ("cannot evaluate", "yellow")}
_INDENT = "    "


def render_human(results: Sequence[CheckResult], console: Console, *, min_margin: float | None = None,
                 files: Sequence[FileReport] = (), policy: Policy | None = None) -> None:
    """Each deployment as a short block (verdict and place, then what was evaluated, the figures, why and the
    fix), each skipped file with what it holds, then the summary line. Lines are wrapped at the console's
    width between words, so a path or a number is never cut; a path longer than the line stands alone."""
    policy = policy or Policy(min_margin)
    width = max(40, console.width)
    for result in results:
        req = result.request
        label, style = _LABELS[result.verdict]
        if misses_margin(result, policy.min_margin):
            label, style = "below margin", "red"
        if result.verdict == CANNOT_EVALUATE and not fails_job(result, policy):
            style = "yellow"
        _print_head(console, label, f"bold {style}", _short_location(req), width)
        for line in _details(result, policy):
            for piece in _wrap(ci_text(line), width):
                console.print(piece, markup=False, highlight=False, soft_wrap=True)
    for report in files:
        if report.skipped:
            _print_head(console, "skipped", "bold", report.path, width)
            for piece in _wrap(ci_text(report.skipped), width):
                console.print(piece, markup=False, highlight=False, soft_wrap=True)
    for piece in _wrap(ci_text(summary_line(results, files, policy)), width, indent=""):
        console.print(piece, markup=False, highlight=False, soft_wrap=True)


def _print_head(console: Console, label: str, style: str, place: str, width: int) -> None:
    """The verdict label and the file:line, on one line when both fit; otherwise the place on its own line,
    so a 71-character path under a 16-character label is moved rather than cut."""
    if 16 + len(place) <= width:
        console.print(Text.assemble((f"{label:<15}", style), " ", ci_text(place)), soft_wrap=True)
    else:
        console.print(Text(label, style=style), soft_wrap=True)
        console.print(ci_text(place), soft_wrap=True)


def _details(result: CheckResult, policy: Policy) -> list[str]:
    req = result.request
    lines = [f"{req.name}: {req.model or '?'} ({req.engine})"]
    if req.num_gpus is not None or req.gpu:
        shape = f"tp {req.tensor_parallel_size}, pp {req.pipeline_parallel_size}"
        if req.data_parallel_size > 1:
            shape += f", dp {req.data_parallel_size}"
        replicas = f", {req.replicas} replicas" if req.replicas > 1 else ""
        lines.append(f"{req.gpu or '?'} x {req.num_gpus if req.num_gpus is not None else '?'} ({shape}){replicas}, "
                     f"max len {req.max_model_len if req.max_model_len is not None else 'default'}")
    if result.kv_needed_bytes is not None and result.kv_available_bytes is not None:
        figures = f"KV {fmt_gib(result.kv_needed_bytes)} needed of {fmt_gib(result.kv_available_bytes)}"
        if result.margin is not None:
            figures += f", margin {result.margin:.1%}"
        if result.max_concurrency is not None:
            figures += f", max concurrency {result.max_concurrency:.2f}"
        lines.append(figures)
    if result.verdict == DOES_NOT_FIT:
        lines.append(f"why: {result.reason or 'KV cache too small'}")
    elif misses_margin(result, policy.min_margin):
        lines.append(f"why: margin {result.margin:.1%} is below the required "
                     f"{required_margin(result, policy.min_margin):.1%}")
    if result.fix and (result.verdict != FITS or misses_margin(result, policy.min_margin)):
        lines.append(f"fix (line {annotation_line(result)}): {result.fix}")
    if result.verdict == CANNOT_EVALUATE:
        if not req.unresolved and result.reason:
            lines.append(f"why: {result.reason}")
        for gap in req.unresolved:
            at = f" (line {gap.line})" if gap.line else ""
            lines.append(f"- {gap.field}{at}: {gap.reason}. Fix: {gap.how_to_fix}")
    for flag in req.ignored_flags:
        lines.append(f"ignored --{flag.flag} {flag.value}: {flag.why}")
    if result.verdict != FITS or misses_margin(result, policy.min_margin):
        lines += [f"note: {n}" for n in req.notes]
    return lines


def _wrap(text: str, width: int, indent: str = _INDENT) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "  ",
                         break_long_words=False, break_on_hyphens=False) or [indent]
