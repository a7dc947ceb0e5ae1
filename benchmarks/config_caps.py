"""Wall time of the largest configs kvplan accepts (up to 1,024 layers, 4,096 experts, 1,024 heads) and of
refusing a 1 KB config that declares 100,000 layers (30-60 s to plan before the caps).
tests/test_model_caps.py bounds the same work by counting calls.

Usage: python benchmarks/config_caps.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvplan.capacity.kv import KvRequest, estimate_kv  # noqa: E402
from kvplan.engines.vllm import VllmFlags, plan_vllm  # noqa: E402
from kvplan.errors import ConfigError  # noqa: E402
from kvplan.hardware.gpus import find_gpu  # noqa: E402
from kvplan.model.config_reader import MAX_LAYERS  # noqa: E402
from kvplan.model.dtypes import BFLOAT16  # noqa: E402
from kvplan.model.parse import parse_config  # noqa: E402
from tests.factories import hybrid_moe_config, llama_config  # noqa: E402


def parse_and_plan(raw: dict) -> str:
    try:
        model = parse_config(raw, name="big", source="benchmark")
    except ConfigError as exc:
        return f"refused: {exc.key}"
    estimate_kv(model, BFLOAT16, KvRequest(seq_tokens=32768, batch=8))
    plan_vllm(model, VllmFlags(max_model_len=32768, tensor_parallel_size=8, pipeline_parallel_size=4),
              find_gpu("H200"))
    return "planned"


def main() -> None:
    cases = [(f"{n:,} layers, hybrid MoE at the caps", hybrid_moe_config(n)) for n in (128, 512, MAX_LAYERS)]
    cases.append(("100,000 layers declared in 1 KB", llama_config(num_hidden_layers=100_000)))
    for label, raw in cases:
        start = time.perf_counter()
        outcome = parse_and_plan(raw)
        print(f"{label:<40} {outcome:<26} {(time.perf_counter() - start) * 1000:8.1f} ms")


if __name__ == "__main__":
    main()
