"""benchmarks/trtllm_accuracy.py on the held-out TensorRT-LLM logs: what each check computes, derived by hand from
the logged figures (GiB printed to two decimals, taken as round(x x 2^30) bytes), and the engine's note quoting
the committed result."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

from kvplan.capacity.deployment import Deployment, Workload
from kvplan.engines.trtllm import TrtllmOptions
from kvplan.hardware.gpus import find_gpu
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO / "benchmarks" / "logs"
_spec = importlib.util.spec_from_file_location("trtllm_accuracy", REPO / "benchmarks" / "trtllm_accuracy.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["trtllm_accuracy"] = bench  # its dataclasses look their module up
_spec.loader.exec_module(bench)
ALIASES = json.loads((LOGS / "configs" / "aliases.json").read_text())
RECORDS = {r["id"]: r for r in map(json.loads, (LOGS / "trtllm.jsonl").read_text().splitlines())}
GIB = 1 << 30


def test_a_dgx_spark_profile_replayed():
    row = bench.evaluate(RECORDS["jeansblog-gpt-oss-120b-dgxspark-trtllm-1.1.0rc3"], ALIASES)
    # gpt-oss-120b keeps its sliding layers whole in TensorRT-LLM's pool: 36 x 8 KV heads x 64 x 2 x 2 B.
    assert row.per_token_kvplan == 73_728 and row.per_token_ok
    # (total - weights - activation - (outside torch - the estimation's KV)) x 0.9:
    # 119.70 - 63.52 - 0.85 - (49.28 - 0.56) GiB = 7,097,433,457 B; x 0.9 = 6,387,690,111 B (5.949 GiB, logged
    # 5.95); / 73,728 = 86,638 tokens; 2,708 blocks of 32 = 86,656 tokens (logged 86,720, from 86,711 before its
    # blocks: the four two-decimal figures carry +/-0.02 GiB, about 270 tokens).
    assert round(row.a_kv_gib * GIB) == 6_387_690_111
    assert row.a_tokens == 86_656


def test_the_cpp_manager_takes_its_fraction_of_the_free_memory():
    row = bench.evaluate(RECORDS["tritontrtllm-docs-llava-1.5-7b-tp2-h100nvl"], ALIASES)
    # 0.9 x 85.57 GiB = 77.013 GiB; logged "Allocated 77.02 GiB" (whole blocks). The KV dtype is not known, so
    # neither the bytes a token nor the tokens are checked.
    assert abs(row.a_kv_gib - 0.9 * 85.57) < 1e-6
    assert row.per_token_ok is None and row.a_tokens is None


def test_an_h100_plan_end_to_end():
    row = bench.evaluate(RECORDS["otel-qwen3-reranker-0.6b-h100-trtllm-1.2.1"], ALIASES)
    # Qwen3-0.6B's layout: 28 x 8 x 128 x 2 x 2 B = 114,688 B a token; 68.69 GiB / 643,136 tokens agrees.
    assert row.per_token_kvplan == 114_688 and row.per_token_ok
    assert row.b_tokens is not None and abs(row.b_tokens / 643_136 - 1) < 0.01


def test_the_engine_quotes_the_committed_result():
    # Every TensorRT-LLM plan states how many held-out logs were checked and how far they were off; the figures
    # are the committed benchmark's (benchmarks/results/trtllm_accuracy.md).
    text = (REPO / "benchmarks" / "results" / "trtllm_accuracy.md").read_text()
    found = re.search(r"^- per token: (\d+) of (\d+) logs the same", text, re.M)
    assert found is not None and found[1] == found[2]
    assert max(abs(float(x)) for x in re.findall(r"worst ([+-][\d.]+)%", text)) < 0.2
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| log")]
    checkable = sum(1 for line in rows if "[" not in line.split("|")[1])
    d = Deployment(model=resolve_model("Qwen/Qwen3-0.6B", offline=True).model, gpu=find_gpu("H100"),
                   engine=TrtllmOptions(), workload=Workload(max_model_len=4096))
    account = plan(d).account
    assert account.calibration is not None and not account.calibration.in_range
    assert f"{len(rows)} held-out TensorRT-LLM logs, {checkable} checkable" in account.calibration.checked_on
    assert any(f"the parts {checkable} held-out logs print agree within 0.2%" in n for n in account.notes)
