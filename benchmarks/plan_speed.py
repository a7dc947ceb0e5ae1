"""How long `kvplan plan` takes to search the whole GPU catalog, against one `kvplan estimate` of the same model.

Both run in this process on the bundled library (no network): the estimate is kvplan.api.estimate on one
named GPU (model resolved, planned, fixes searched when it does not fit), as `kvplan estimate --gpu H100` does;
the plan is the model resolved once and kvplan.planner.search over every catalog GPU x shape x KV dtype, as
`kvplan plan` does before it renders. Each is the median of repeated runs; the counters say how many
candidates the search planned and how many it ruled out without planning.

Usage: python benchmarks/plan_speed.py [RUNS]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from kvplan.api import EstimateRequest, GpuChoice, ModelSource, estimate
from kvplan.capacity.deployment import Parallelism, Workload
from kvplan.hardware.gpus import all_gpus
from kvplan.planner.search import SearchResult, SearchSpace, search
from kvplan.sources.resolve import resolve_model

# (model, max-model-len, concurrent requests, the estimate's tensor parallelism): dense, MoE, MLA, hybrid.
CASES = (
    ("meta-llama/Llama-3.1-8B-Instruct", 8192, 64, 1),
    ("meta-llama/Llama-3.3-70B-Instruct", 16384, 50, 4),
    ("google/gemma-3-27b-it", 32768, 16, 1),
    ("Qwen/Qwen3-30B-A3B", 32768, 64, 1),
    ("deepseek-ai/DeepSeek-V3", 8192, 32, 8),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 32768, 64, 1),
)


def median_seconds(work: Callable[[], object], runs: int) -> float:
    work()  # warm: bytecode, the library's file cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plan_catalog(model: str, length: int, users: int) -> SearchResult:
    spec = resolve_model(model, offline=True).model
    return search(spec, Workload(length, users), SearchSpace(gpus=all_gpus()))


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    gpus = len(all_gpus())
    print(f"kvplan plan over the whole catalog ({gpus} GPU types, up to 8 GPUs, KV auto and fp8) against one "
          f"kvplan estimate; medians of {runs} runs")
    print()
    print(f"{'model':<44} {'estimate':>9} {'plan':>8} {'ratio':>6} {'planned':>8} {'unplanned':>9} {'options':>7}")
    for model, length, users, tp in CASES:
        request = EstimateRequest(ModelSource(model, offline=True), Workload(length, users), Parallelism(tp=tp),
                                  gpu=GpuChoice(("H100",)))
        one = median_seconds(lambda request=request: estimate(request), runs)
        whole = median_seconds(lambda m=model, n=length, u=users: plan_catalog(m, n, u), runs)
        result = plan_catalog(model, length, users)
        s = result.stats
        print(f"{model:<44} {one * 1e3:>7.1f}ms {whole * 1e3:>6.1f}ms {whole / one:>5.1f}x {s.planned:>8} "
              f"{s.pruned_weights + s.pruned_gpus:>9} {len(result.options):>7}")


if __name__ == "__main__":
    main()
