"""Cold-start time of `kvplan estimate` on the bundled library, against `python -c pass`.

Runs each command N times in fresh interpreters (HF_HUB_OFFLINE=1) and prints the medians.
Usage: python benchmarks/startup.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

DESIGN_CARD = ["-m", "kvplan", "estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16"]


def median_seconds(args: list[str], runs: int) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
        )
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    median_seconds(DESIGN_CARD, 2)  # warm the file cache and bytecode
    base = median_seconds(["-c", "pass"], runs)
    card = median_seconds(DESIGN_CARD, runs)
    print(f"python -c pass:                       median {base * 1000:7.1f} ms over {runs} runs")
    print(f"kvplan estimate (design card, offline): median {card * 1000:7.1f} ms over {runs} runs")
    print(f"kvplan's own cost:                    {(card - base) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
