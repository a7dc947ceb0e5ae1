"""Evaluate each deployment on its own: any failure becomes that deployment's "cannot evaluate" result.

`evaluate()` maps kvplan's own errors; a bug or an out-of-range value that slips past it (a float overflow, a
recursion limit) must not lose the report of every other deployment, in any output format.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from kvplan.check.model import CANNOT_EVALUATE, CheckResult, DeploymentRequest

# The reason code of a deployment kvplan itself failed on: it fails the run, never a mere warning.
INTERNAL = "internal"


def evaluate_each(
    requests: list[DeploymentRequest], evaluate: Callable[[DeploymentRequest], CheckResult]
) -> list[CheckResult]:
    """`evaluate` applied to every request; an exception becomes that request's result (KVPLAN_DEBUG=1 re-raises)."""
    results = []
    for request in requests:
        try:
            results.append(evaluate(request))
        except Exception as exc:  # noqa: BLE001 - isolation is the point: every other result is still reported
            if os.environ.get("KVPLAN_DEBUG", "").strip() not in ("", "0"):
                raise
            message = " ".join(str(exc).split())[:300]
            results.append(CheckResult(
                request,
                CANNOT_EVALUATE,
                reason=f"kvplan could not evaluate this deployment ({type(exc).__name__}: {message})",
                fix="check its values are in range; if they are, report this to kvplan (KVPLAN_DEBUG=1 shows where)",
                reason_code=INTERNAL,
            ))
    return results
