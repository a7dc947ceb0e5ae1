"""Cold start of `kvplan estimate` on a bundled model, against importing typer and rich.

Each command runs N times in fresh interpreters, in the caller's environment as it is (HF_HUB_OFFLINE is not
set: a bundled model must be answered without a network call anyway). A third row runs the same estimate
with HF_ENDPOINT pointed at a local socket that accepts connections and never answers, the network that
drops packets: if kvplan asked the Hub, that row would wait for the Hub timeout instead of matching the first.

Wall time and CPU time (user + system of the child) are both printed: on a shared machine the CPU time is
the steadier of the two. Goal (issue 13): estimate <= 1.5x the typer-and-rich import.
Usage: python benchmarks/startup.py [N]
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import subprocess
import sys
import time

ESTIMATE = ["-m", "kvplan", "estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16"]
BASELINE = ["-c", "import typer, rich.console, rich.table"]
GOAL_RATIO = 1.5


def medians(args: list[str], runs: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Median wall and CPU seconds of `python ARGS` over `runs` fresh interpreters."""
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
        )
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(args)} failed: {done.stderr.decode()[-400:]}")
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    # Warm the file cache and write the bytecode a user's install has (even where the caller's environment
    # sets PYTHONDONTWRITEBYTECODE, which would make every measured run compile kvplan from source).
    writing = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for args in (BASELINE, ESTIMATE):
        medians(args, 2, writing)
    base = medians(BASELINE, runs)
    estimate = medians(ESTIMATE, runs)
    with socket.socket() as silent:  # listens, never accepts: a connect succeeds, a request never returns
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        blackhole = medians(ESTIMATE, min(runs, 5), {**os.environ, "HF_ENDPOINT": endpoint})
    print(f"medians over {runs} runs                  wall ms   CPU ms")
    for label, (wall, cpu) in (
        ("import typer, rich.console, rich.table", base),
        ("kvplan estimate meta-llama/Llama-2-7b", estimate),
        ("  same, Hub endpoint never answers", blackhole),
    ):
        print(f"{label:<40} {wall * 1000:7.1f}  {cpu * 1000:7.1f}")
    for label, i in (("wall", 0), ("CPU", 1)):
        ratio = estimate[i] / base[i]
        print(f"ratio ({label}) {ratio:.2f}x, goal <= {GOAL_RATIO}x: {'met' if ratio <= GOAL_RATIO else 'missed'}")


if __name__ == "__main__":
    main()
