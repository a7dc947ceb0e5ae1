"""The Python API of verify: plan, run the ranks, and return data plus its renderer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from kvplan.records import dataclass
from kvplan.verify.device import import_torch
from kvplan.verify.rank import RankResult
from kvplan.verify.setup import VerifyRequest, VerifySetup, prepare


@dataclass(frozen=True)
class VerifyReport:
    setup: VerifySetup
    ranks: tuple[RankResult, ...]
    passed: bool  # every rank's bytes match per kind and the correctness check passed
    data: dict[str, Any]
    render: Callable[[Console], None]


def verify(model: str, *, progress: Console | None = None, **flags: Any) -> VerifyReport | None:
    """Run verify for MODEL; `flags` are VerifyRequest's fields; `progress`: a console for the progress bar.
    None on torchrun ranks other than 0."""
    setup = prepare(VerifyRequest(model=model, **flags))
    import_torch()  # fail early, before any rank starts, when torch is missing
    from kvplan.verify.dist import run_ranks
    from kvplan.verify.report import progress_bar, render, to_dict

    with progress_bar(progress) as bar:
        results = run_ranks(setup, bar)
    if results is None:
        return None
    passed = all(r.passed for r in results)
    return VerifyReport(
        setup=setup,
        ranks=tuple(results),
        passed=passed,
        data=to_dict(setup, results, passed),
        render=lambda console: render(setup, results, passed, console),
    )
