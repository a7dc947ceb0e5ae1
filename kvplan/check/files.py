"""Find the deployment files to check and read each into requests (files that cannot be read become results).

Never fails open: a directory that cannot be listed, a symlink leaving the checked tree, and a directory that
holds no deployment at all each become a "cannot evaluate" result naming what was not read (exit code 2).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from kvplan.check.loader import load_documents
from kvplan.check.model import CANNOT_EVALUATE, CheckResult, DeploymentRequest, Location, Unresolved
from kvplan.check.readers import RECOGNISED, requests_of_document
from kvplan.errors import DeploymentError, KvplanError

YAML_SUFFIXES = (".yaml", ".yml")
MAX_FILES = 10_000


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


def load_requests(
    paths: list[str], *, default_gpu: str | None = None, follow_symlinks: bool = False
) -> tuple[list[DeploymentRequest], list[CheckResult]]:
    """Every deployment in `paths` (files, directories, "-" for stdin), and what could not be read.

    A file named explicitly that holds no deployment is reported too; files found by walking a directory
    that hold none (Services, CI workflows) are skipped quietly, unless the directory holds no deployment at
    all. Any failure on one file, expected or not, becomes that file's result: the other files are still read.
    """
    requests: list[DeploymentRequest] = []
    failures: list[CheckResult] = []
    for path in paths:
        if path == "-" or not os.path.isdir(path):
            _read_into(path, True, default_gpu, requests, failures)
            continue
        before = len(requests), len(failures)
        for found in yaml_files(path, failures, follow_symlinks=follow_symlinks):
            _read_into(found, False, default_gpu, requests, failures)
        if (len(requests), len(failures)) == before:
            failures.append(_failure(path, f"{path}: no deployment in this directory (no .yaml or .yml file in it "
                                     f"holds one kvplan reads: {RECOGNISED})",
                                     "name the directory or files that hold the deployments"))
    return requests, failures


def _read_into(path: str, explicit: bool, default_gpu: str | None, requests: list[DeploymentRequest],
               failures: list[CheckResult]) -> None:
    try:
        found = _read_file(path, default_gpu)
    except KvplanError as exc:
        failures.append(_failure(path, exc.message, "fix the file, or leave it out of the check"))
        return
    except Exception as exc:  # noqa: BLE001 - one file's unexpected failure must not lose the others' results
        if os.environ.get("KVPLAN_DEBUG") == "1":
            raise
        failures.append(_failure(path, f"{path}: cannot read this file ({type(exc).__name__}: {exc})",
                                 "leave the file out of the check, and report the error to kvplan"))
        return
    if found is None:
        if explicit:
            failures.append(_failure(path, f"{path}: no deployment kvplan recognises (reads: {RECOGNISED})",
                                     "name a file that holds a deployment"))
        return
    requests.extend(found)


def _read_file(path: str, default_gpu: str | None) -> list[DeploymentRequest] | None:
    if path != "-" and not os.path.lexists(path):
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
