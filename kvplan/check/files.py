"""Find the deployment files to check and read each into requests (files that cannot be read become results)."""

from __future__ import annotations

import os

from kvplan.check.loader import load_documents
from kvplan.check.model import CANNOT_EVALUATE, CheckResult, DeploymentRequest, Location, Unresolved
from kvplan.check.readers import RECOGNISED, requests_of_document
from kvplan.errors import DeploymentError

YAML_SUFFIXES = (".yaml", ".yml")
MAX_FILES = 10_000


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


def load_requests(
    paths: list[str], *, default_gpu: str | None = None
) -> tuple[list[DeploymentRequest], list[CheckResult]]:
    """Every deployment in `paths` (files, directories, "-" for stdin), and the files that could not be read.

    A file named explicitly that holds no deployment is reported too; files found by walking a directory
    that hold none (Services, CI workflows) are skipped quietly.
    """
    requests: list[DeploymentRequest] = []
    failures: list[CheckResult] = []
    for path, explicit in walk(paths):
        try:
            found = _read_file(path, default_gpu)
        except DeploymentError as exc:
            failures.append(_failure(path, exc.message, "fix the file, or leave it out of the check"))
            continue
        if found is None:
            if explicit:
                failures.append(_failure(path, f"{path}: no deployment kvplan recognises (reads: {RECOGNISED})",
                                         "name a file that holds a deployment"))
            continue
        requests.extend(found)
    return requests, failures


def _read_file(path: str, default_gpu: str | None) -> list[DeploymentRequest] | None:
    if path != "-" and not os.path.exists(path):
        raise DeploymentError(f"{path}: no such file or directory")
    found: list[DeploymentRequest] | None = None
    for doc in load_documents(path):
        try:
            requests = requests_of_document(doc, default_gpu)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            if os.environ.get("KVPLAN_DEBUG") == "1":
                raise
            raise DeploymentError(
                f"{doc.file}:{doc.line}: cannot read this document ({type(exc).__name__}: {exc})"
            ) from None
        if requests is not None:
            found = (found or []) + requests
    return found


def _failure(path: str, message: str, fix: str) -> CheckResult:
    line = 1
    head = message.split(": ", 1)[0]
    if head.startswith(path + ":") and head[len(path) + 1 :].isdigit():
        line = int(head[len(path) + 1 :])
    request = DeploymentRequest(
        location=Location(path, line), name=os.path.basename(path) or path, source_format="unknown",
        engine="unknown", model=None, gpu=None, gpu_source="", num_gpus=None,
        unresolved=(Unresolved("file", message, fix),),
    )
    return CheckResult(request=request, verdict=CANNOT_EVALUATE, reason=message, fix=fix)
