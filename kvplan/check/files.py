"""Find the deployment files to check and read each into requests; every file read is accounted for.

A file either holds deployments, or holds none kvplan reads (a Service, a CI workflow: reported as skipped,
with what it holds), or cannot be read (reported as a failure result). Standard input is `-`; its documents
are named by the `# Source:` comment `helm template` writes before each, else by their Kind/name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from kvplan.check.build import apply_hardware
from kvplan.check.loader import load_documents, read_text
from kvplan.check.model import CANNOT_EVALUATE, CheckResult, DeploymentRequest, FileReport, Location, Unresolved
from kvplan.check.readers import describe_document, requests_of_document
from kvplan.check.readers.k8s import mapping
from kvplan.errors import DeploymentError

YAML_SUFFIXES = (".yaml", ".yml")
MAX_FILES = 10_000
STDIN = "<stdin>"
_SOURCE_RE = re.compile(r"^# Source: (\S.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Reading:
    """Everything read from the paths: the deployments, the files that failed, and a report of every file."""

    requests: list[DeploymentRequest]
    failures: list[CheckResult]
    files: list[FileReport]


def walk(paths: list[str]) -> list[tuple[str, bool]]:
    """(file, named explicitly) for every path; directories give their *.yaml / *.yml files, sorted."""
    files: list[tuple[str, bool]] = []
    for path in paths:
        if path != "-" and os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                files.extend((os.path.join(root, n), False) for n in sorted(names) if n.endswith(YAML_SUFFIXES))
                if len(files) > MAX_FILES:
                    raise DeploymentError(f"{path}: more than {MAX_FILES} YAML files; name the directories to check")
        else:
            files.append((path, True))
    return files


def read_paths(paths: list[str], *, gpu: str | None = None, gpu_memory_bytes: int | None = None) -> Reading:
    """Every deployment in `paths` (files, directories, "-" for stdin), with `--gpu` / `--gpu-mem` applied."""
    requests: list[DeploymentRequest] = []
    failures: list[CheckResult] = []
    files: list[FileReport] = []
    for path, _explicit in walk(paths):
        shown = STDIN if path == "-" else path
        try:
            found, skipped = _read_file(path)
        except DeploymentError as exc:
            failures.append(_failure(shown, exc.message, "fix the file, or leave it out of the check"))
            files.append(FileReport(shown, error=exc.message))
            continue
        found = [apply_hardware(r, gpu=gpu, gpu_memory_bytes=gpu_memory_bytes) for r in found]
        files.append(FileReport(shown, len(found), None if found else skipped))
        requests.extend(found)
    return Reading(requests, failures, files)


def load_requests(paths: list[str], *, gpu: str | None = None) -> tuple[list[DeploymentRequest], list[CheckResult]]:
    """The deployments in `paths` and the files that could not be read (read_paths without the file list)."""
    reading = read_paths(paths, gpu=gpu)
    return reading.requests, reading.failures


def _read_file(path: str) -> tuple[list[DeploymentRequest], str]:
    """The file's deployments, and when it has none, what it holds instead (for the report)."""
    if path != "-" and not os.path.exists(path):
        raise DeploymentError(f"{path}: no such file or directory")
    text = read_text(path)
    shown = STDIN if path == "-" else path
    documents = load_documents(shown, text)
    sources = [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in _SOURCE_RE.finditer(text)]
    found: list[DeploymentRequest] = []
    seen: list[str] = []
    for number, doc in enumerate(documents, start=1):
        try:
            requests = requests_of_document(doc)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            if os.environ.get("KVPLAN_DEBUG") == "1":
                raise
            raise DeploymentError(
                f"{doc.file}:{doc.line}: cannot read this document ({type(exc).__name__}: {exc})"
            ) from None
        if requests is None or not requests:
            what = describe_document(doc.data)
            seen.append(what if requests is None else f"{what} (runs no model server kvplan knows)")
            continue
        if path == "-":
            kind = mapping(doc.data).get("kind")
            named = describe_document(doc.data) if kind else f"document {number}"
            label = next((s for line, s in reversed(sources) if line < doc.line), named)
            requests = [replace(r, location=replace(r.location, document=label)) for r in requests]
        found.extend(requests)
    if found:
        return found, ""
    if not documents:
        return [], "no YAML documents"
    listed = ", ".join(seen[:4]) + (f" and {len(seen) - 4} more" if len(seen) > 4 else "")
    return [], f"no deployment kvplan reads: {listed}"


def _failure(path: str, message: str, fix: str) -> CheckResult:
    line = 1
    head = message.split(": ", 1)[0]
    if head.startswith(path + ":") and head[len(path) + 1 :].isdigit():
        line = int(head[len(path) + 1 :])
    request = DeploymentRequest(
        location=Location(path, line), name=os.path.basename(path) or path, source_format="unknown",
        engine="unknown", model=None, gpu=None, gpu_source="", num_gpus=None,
        unresolved=(Unresolved("file", message, fix, line),),
    )
    return CheckResult(request=request, verdict=CANNOT_EVALUATE, reason=message, fix=fix)
