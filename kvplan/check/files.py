"""Find the deployment files to check and read each into requests; every file read is accounted for.

A file either holds deployments, or holds none kvplan reads (a Service, a CI workflow: reported as skipped,
with what it holds), or cannot be read (reported as a failure result). Standard input is `-`; its documents
are named by the `# Source:` comment `helm template` writes before each, else by their Kind/name.

Never fails open: a directory that cannot be listed, a symlink leaving the checked tree, and a directory that
holds no deployment at all each become a "cannot evaluate" result naming what was not read; any failure on
one file, expected or not, becomes that file's result while the other files are still read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import replace

from kvplan.check.build import apply_hardware
from kvplan.check.loader import load_documents, read_text
from kvplan.check.model import CANNOT_EVALUATE, CheckResult, DeploymentRequest, FileReport, Location, Unresolved
from kvplan.check.readers import RECOGNISED, describe_document, requests_of_document
from kvplan.check.readers.k8s import mapping
from kvplan.errors import DeploymentError, KvplanError
from kvplan.records import dataclass

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


def yaml_files(top: str, not_read: list[CheckResult], *, follow_symlinks: bool = False) -> Iterator[str]:
    """The *.yaml / *.yml files under directory `top`, sorted; what is skipped is appended to `not_read`.

    Hidden directories are skipped. Without follow_symlinks no symlinked directory is entered (one leading out of
    `top` is reported), and a symlinked file is read only when its target lies inside `top` (a
    `deploy.yaml -> /etc/shadow` is not).
    """
    unlistable: list[OSError] = []
    inside = os.path.realpath(top)
    entered: set[tuple[int, int]] = set()
    count = 0
    for root, dirs, names in os.walk(top, onerror=unlistable.append, followlinks=follow_symlinks):
        try:
            info = os.stat(root)
        except OSError as exc:
            unlistable.append(exc)
            continue
        if (info.st_dev, info.st_ino) in entered:  # a symlink loop under --follow-symlinks: enter each directory once
            dirs[:] = []
            continue
        entered.add((info.st_dev, info.st_ino))
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in dirs if not follow_symlinks else ():
            link = os.path.join(root, name)
            target = os.path.realpath(link)
            # One inside the tree is walked under its own name; one leading out is not read, and says so.
            if os.path.islink(link) and os.path.commonpath([inside, target]) != inside:
                not_read.append(_failure(link, f"{link}: a symlink to the directory {target}, outside {top}; "
                                         "not followed", "pass --follow-symlinks to read it, or name the directory"))
        for name in sorted(n for n in names if n.endswith(YAML_SUFFIXES)):
            path = os.path.join(root, name)
            count += 1
            if count > MAX_FILES:
                raise DeploymentError(f"{top}: more than {MAX_FILES} YAML files; name the directories to check")
            target = os.path.realpath(path)
            if not follow_symlinks and os.path.islink(path) and os.path.commonpath([inside, target]) != inside:
                not_read.append(_failure(path, f"{path}: a symlink to {target}, outside {top}; not followed",
                                         "pass --follow-symlinks to read it, or check that file by name"))
                continue
            yield path
    for error in unlistable:
        where = str(error.filename or top)
        not_read.append(_failure(where, f"{where}: cannot list this directory ({error.strerror or error}); "
                                 "its files were not checked", "make it readable, or leave it out of the check"))


def read_paths(
    paths: list[str], *, gpu: str | None = None, gpu_memory_bytes: int | None = None, follow_symlinks: bool = False
) -> Reading:
    """Every deployment in `paths` (files, directories, "-" for stdin), with `--gpu` / `--gpu-mem` applied."""
    reading = Reading([], [], [])
    for path in paths:
        if path == "-" or not os.path.isdir(path):
            _read_into(path, reading, gpu, gpu_memory_bytes)
            continue
        before = len(reading.files), len(reading.failures)
        for found in yaml_files(path, reading.failures, follow_symlinks=follow_symlinks):
            _read_into(found, reading, gpu, gpu_memory_bytes)
        if (len(reading.files), len(reading.failures)) == before:
            # Files without deployments are reported one by one (skipped); a directory without any is named.
            reading.failures.append(_failure(
                path, f"{path}: no .yaml or .yml file in this directory (kvplan reads: {RECOGNISED})",
                "name the directory or files that hold the deployments"))
    return reading


def load_requests(
    paths: list[str], *, gpu: str | None = None, follow_symlinks: bool = False
) -> tuple[list[DeploymentRequest], list[CheckResult]]:
    """The deployments in `paths` and what could not be read (read_paths without the file list)."""
    reading = read_paths(paths, gpu=gpu, follow_symlinks=follow_symlinks)
    return reading.requests, reading.failures


def _read_into(path: str, reading: Reading, gpu: str | None, gpu_memory_bytes: int | None) -> None:
    shown = STDIN if path == "-" else path
    try:
        found, skipped = _read_file(path)
    except KvplanError as exc:
        reading.failures.append(_failure(shown, exc.message, "fix the file, or leave it out of the check"))
        reading.files.append(FileReport(shown, error=exc.message))
        return
    except Exception as exc:  # noqa: BLE001 - one file's unexpected failure must not lose the others' results
        if os.environ.get("KVPLAN_DEBUG") == "1":
            raise
        message = f"{shown}: cannot read this file ({type(exc).__name__}: {exc})"
        reading.failures.append(_failure(shown, message, "leave the file out of the check, and report the "
                                         "error to kvplan"))
        reading.files.append(FileReport(shown, error=message))
        return
    found = [apply_hardware(r, gpu=gpu, gpu_memory_bytes=gpu_memory_bytes) for r in found]
    reading.files.append(FileReport(shown, len(found), None if found else skipped))
    reading.requests.extend(found)


def _read_file(path: str) -> tuple[list[DeploymentRequest], str]:
    """The file's deployments, and when it has none, what it holds instead (for the report)."""
    if path != "-" and not os.path.lexists(path):
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
