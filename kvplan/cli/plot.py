"""`kvplan estimate --plot FILE`: KV memory and max concurrency against context length, per model and GPU.

matplotlib is the optional extra `kvplan[plot]`, imported here only when a plot is asked for, so the estimate
path stays light (tests/test_imports.py). The top panel draws the KV the batch needs per GPU with each GPU's KV
budget as a dashed line of the same colour: where a solid line crosses its dashed one, the batch stops fitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvplan.errors import InputError
from kvplan.units import GiB

if TYPE_CHECKING:
    from kvplan.cli.sweep_row import SweepRow

FORMATS = (".png", ".svg")


def check_plot_path(path: str) -> None:
    """Refuse a plot file kvplan cannot write before any planning runs."""
    target = Path(path).expanduser()
    if target.suffix.lower() not in FORMATS:
        raise InputError(f"--plot {path}: write a .png or .svg file, e.g. --plot kv.png")
    if not target.parent.is_dir():
        raise InputError(f"--plot {path}: the folder {target.parent} does not exist")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display, no GUI toolkit
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'kvplan[plot]'") from None
    return plt


def series(rows: Sequence[SweepRow]) -> dict[tuple[str, str, int], list[SweepRow]]:
    """Rows grouped by (model, GPU, batch), each group ordered by context length: one line each."""
    groups: dict[tuple[str, str, int], list[SweepRow]] = {}
    for r in rows:
        groups.setdefault((r.model, r.verdict.deployment.gpu.key, r.batch), []).append(r)
    for group in groups.values():
        group.sort(key=lambda r: r.verdict.deployment.max_model_len)
    return groups


def draw_sweep(rows: Sequence[SweepRow], path: str) -> None:
    """Write the two panels to `path` (.png or .svg)."""
    check_plot_path(path)
    plt = _pyplot()
    fig, (kv_ax, req_ax) = plt.subplots(2, 1, figsize=(9, 8), sharex=True)
    batches = {r.batch for r in rows}
    for (model, gpu, batch), group in series(rows).items():
        x = [r.verdict.deployment.max_model_len for r in group]
        label = f"{model} on {gpu}" + (f", batch {batch}" if len(batches) > 1 else "")
        needed = [None if r.verdict.kv_needed_bytes is None else r.verdict.kv_needed_bytes / GiB for r in group]
        budget = [None if r.verdict.kv_budget_bytes is None else r.verdict.kv_budget_bytes / GiB for r in group]
        (line,) = kv_ax.plot(x, needed, marker="o", label=label)
        kv_ax.plot(x, budget, linestyle="--", color=line.get_color(), label=f"KV budget, {gpu}")
        req_ax.plot(x, [r.verdict.max_requests for r in group], marker="o", color=line.get_color(), label=label)
    kv_ax.set_ylabel("KV per GPU (GiB)")
    kv_ax.set_title("KV the batch needs (solid) and the GPU's KV budget (dashed)")
    kv_ax.legend(fontsize="small")
    req_ax.set_ylabel("requests at once")
    req_ax.set_xlabel("context length (tokens per request)")
    req_ax.set_title("Max concurrency at that context length")
    for ax in (kv_ax, req_ax):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    # No creation date in the file: the same sweep draws the same bytes.
    metadata = {"Date": None} if path.lower().endswith(".svg") else {"Software": None}
    fig.savefig(path, metadata=metadata)
    plt.close(fig)
