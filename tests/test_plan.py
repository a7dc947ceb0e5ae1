"""`kvplan plan`: every option replays through `kvplan estimate` to the same verdict, the cheapest comes first,
the emitted files read back through `kvplan check` to the same figures, and the output fits 80 columns."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.capacity.deployment import Deployment, Parallelism, WeightsChoice, Workload
from kvplan.emit.commands import LAUNCHERS, launch
from kvplan.engines import ENGINE_NAMES
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.hardware.gpus import all_gpus, find_gpu
from kvplan.hardware.prices import bundled_prices, parse_price
from kvplan.planner.search import SearchSpace, search
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from tests.conftest import run_cli

# Dense GQA, a window, MoE, MLA and hybrids: 12 models.
MODELS = [
    ("meta-llama/Llama-3.1-8B-Instruct", "8192", "64"),
    ("meta-llama/Llama-3.3-70B-Instruct", "16k", "50"),
    ("Qwen/Qwen3-32B", "16k", "50"),
    ("google/gemma-2-9b-it", "8192", "32"),
    ("google/gemma-3-27b-it", "32k", "16"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "16k", "32"),
    ("Qwen/Qwen3-30B-A3B", "32k", "64"),
    ("deepseek-ai/DeepSeek-V2-Lite", "16k", "64"),
    ("deepseek-ai/DeepSeek-V3", "8192", "32"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "32k", "64"),
    ("openai/gpt-oss-20b", "16k", "64"),
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", "32k", "16"),
]
GPUS = "H100,H200,A100-80GB,L40S,B200"


def _plan_json(runner, *args: str) -> dict:
    result = run_cli(runner, "plan", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _estimate(runner, words: list[str]) -> dict:
    result = run_cli(runner, *words, "--json")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)["gpus"][0]


@pytest.mark.slow
@pytest.mark.parametrize("model, length, users", MODELS, ids=[m for m, _, _ in MODELS])
def test_every_option_shown_replays_through_estimate(runner, model, length, users):
    doc = _plan_json(runner, model, "--max-model-len", length, "--concurrency", users, "--gpu", GPUS)
    assert doc["options"], doc["notes"]
    for option in doc["options"][:5]:  # the table's default --top
        replay = shlex.split(option["replay"])[1:]
        figures = _estimate(runner, replay)
        assert figures["fits"], (option["replay"], figures["reason"])
        for key in ("max_requests", "kv_budget_bytes", "headroom_bytes", "total_gpus"):
            assert figures[key] == option["verdict"][key], (key, option["replay"])
        if option["verdict"]["engine"] == "vllm":
            # The vllm serve line itself, pasted after `kvplan estimate`, plans the same instance.
            served = option["argv"][2:] + ["--gpu", option["gpu"], "--batch", users,
                                          "--num-gpus", str(option["num_gpus"])]
            again = _estimate(runner, ["estimate", *served])
            assert again["fits"] and again["max_requests"] == option["max_requests"], option["command"]


def test_an_option_json_has_the_documented_fields(runner):
    doc = _plan_json(runner, "Qwen/Qwen3-32B", "--max-model-len", "16k", "--concurrency", "50", "--gpu", "H100,H200")
    option = doc["options"][0]
    for key in ("gpu", "num_gpus", "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype",
                "quantization", "cost_per_hour", "max_concurrency", "command"):
        assert key in option, key
    assert option["command"].startswith("vllm serve Qwen/Qwen3-32B --max-model-len 16000")
    assert doc["search"]["candidates_planned"] > 0


def _brute_force_cheapest(model: str, length: int, users: int, prices: dict[str, float]) -> float:
    """The cheapest fitting deployment, found by planning every shape and replica count (no pruning)."""
    spec = resolve_model(model, offline=True).model
    best = float("inf")
    moe = any(g.name == "experts" for g in spec.param_groups)
    shapes = [Parallelism(tp=t, pp=p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if t * p <= 8]
    if moe:
        shapes += [Parallelism(tp=t, dp=d, expert_parallel=True) for t in (1, 2, 4) for d in (2, 4, 8) if t * d <= 8]
    for key, usd in prices.items():
        for kv in ("auto", "fp8"):
            for shape in shapes:
                per_instance = shape.tp * shape.pp * shape.dp
                for instances in range(1, 8 // per_instance + 1):
                    d = Deployment(model=spec, gpu=find_gpu(key), engine=VllmOptions(),
                                   workload=Workload(length, users), parallelism=shape, kv_cache_dtype=kv,
                                   instances=instances)
                    if plan(d, detail=False).fits:
                        best = min(best, usd * per_instance * instances)
                        break
    return best


@pytest.mark.slow
@pytest.mark.parametrize("model, length, users", [("meta-llama/Llama-3.3-70B-Instruct", 16000, 50),
                                                  ("Qwen/Qwen3-30B-A3B", 32000, 64)])
def test_with_prices_the_first_option_is_the_cheapest_that_fits(runner, model, length, users):
    prices = {"H100-80GB": 2.49, "H200": 3.50, "A100-80GB": 1.79, "L40S": 0.99}
    flags = [f"--price={k}={v}" for k, v in prices.items()]
    doc = _plan_json(runner, model, "--max-model-len", str(length), "--concurrency", str(users),
                     "--gpu", ",".join(prices), "--no-bundled-prices", *flags)
    costs = [o["cost_per_hour"] for o in doc["options"]]
    assert costs == sorted(costs)
    assert costs[0] == pytest.approx(_brute_force_cheapest(model, length, users, prices))


def test_unpriced_options_follow_priced_ones(runner):
    doc = _plan_json(runner, "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8k", "--concurrency", "32",
                     "--gpu", "H100,RTX-4090,L40S")
    priced = [o["cost_per_hour"] is not None for o in doc["options"]]
    assert priced == sorted(priced, reverse=True) and "RTX-4090" in doc["unpriced_gpus"]


EMIT_CASES = [
    ("meta-llama/Llama-3.1-8B-Instruct", "8192", "64", "H100,L40S"),
    ("meta-llama/Llama-3.3-70B-Instruct", "16k", "50", "H100,A100-80GB"),
    ("Qwen/Qwen3-30B-A3B", "32k", "64", "H100"),
    ("deepseek-ai/DeepSeek-V2-Lite", "16k", "64", "L40S"),
]


def _check(runner, path: Path, *extra: str) -> dict:
    result = run_cli(runner, "check", str(path), "--format", "json", "--offline", *extra)
    assert result.exit_code == 0, result.output
    results = json.loads(result.stdout)["results"]
    assert len(results) == 1, results
    return results[0]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["k8s", "compose", "vllm-config", "helm-values"])
@pytest.mark.parametrize("model, length, users, gpus", EMIT_CASES, ids=[c[0] for c in EMIT_CASES])
def test_emitted_files_read_back_through_check(runner, tmp_path, fmt, model, length, users, gpus):
    args = [model, "--max-model-len", length, "--concurrency", users, "--gpu", gpus]
    doc = _plan_json(runner, *args)
    for number in (1, 2):
        option = doc["options"][number - 1]
        target = tmp_path / f"{fmt}-{number}.yaml"
        written = run_cli(runner, "plan", *args, "--emit", fmt, "--option", str(number), "--output", str(target))
        assert written.exit_code == 0, written.output
        checked = _check(runner, target, *(["--gpu", option["gpu"]] if fmt == "vllm-config" else []))
        # Manifests carry the replicas, so check counts them as the plan does; a vLLM --config file is one
        # instance's settings alone.
        instances = option["instances"] if fmt == "vllm-config" else 1
        assert checked["verdict"] == "fits" and checked["engine"] == "vllm"
        assert checked["kv_available_bytes"] == option["kv_budget_bytes"]
        assert checked["max_requests"] == option["max_requests"] // instances
        assert checked["max_concurrency"] == round(option["max_concurrency"] / instances, 2)
        assert checked["num_gpus"] == option["gpus_per_instance"]
        assert list(checked["engine_lines"]) == option["verdict"]["log_lines"]


def test_emit_to_stdout_is_the_file_alone(runner):
    result = run_cli(runner, "plan", "Qwen/Qwen3-8B", "--max-model-len", "8k", "--concurrency", "8", "--gpu", "L4",
                     "--emit", "k8s")
    assert result.exit_code == 0 and result.stdout.startswith("# kvplan plan option 1")
    assert "nvidia.com/gpu.product: NVIDIA-L4" in result.stdout and "kind: Deployment" in result.stdout


def test_sglang_plan_and_k8s_round_trip(runner, tmp_path):
    args = ["Qwen/Qwen3-8B", "--max-model-len", "8k", "--concurrency", "32", "--gpu", "H100,L40S", "--engine",
            "sglang"]
    doc = _plan_json(runner, *args)
    option = doc["options"][0]
    assert option["command"].startswith("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B")
    target = tmp_path / "sglang.yaml"
    assert run_cli(runner, "plan", *args, "--emit", "k8s", "--output", str(target)).exit_code == 0
    checked = _check(runner, target)
    assert checked["engine"] == "sglang" and checked["verdict"] == "fits"
    assert checked["kv_available_bytes"] == option["kv_budget_bytes"]
    result = run_cli(runner, "plan", *args, "--emit", "vllm-config")
    assert result.exit_code == 2 and "--emit vllm-config is a vLLM format" in result.stderr


def test_table_fits_80_columns_and_names_whole(runner):
    result = run_cli(runner, "plan", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "--max-model-len", "128k",
                     "--concurrency", "40", "--input-len", "3000", "--output-len", "800", "--top", "8")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("PLAN for nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    # Command lines continue with backslashes: joined, each is the JSON's command.
    doc = _plan_json(runner, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "--max-model-len", "128k",
                     "--concurrency", "40", "--input-len", "3000", "--output-len", "800")
    joined = " ".join(result.stdout.replace("\\\n", " ").split())
    for option in doc["options"][:8]:
        assert option["command"] in joined


def test_no_option_exits_1(runner):
    result = run_cli(runner, "plan", "deepseek-ai/DeepSeek-V3", "--max-model-len", "8k", "--concurrency", "8",
                     "--gpu", "L4")
    assert result.exit_code == 1 and result.stdout.startswith("NO OPTION")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "transformers"], "--engine transformers: plan launches one of vllm, sglang"),
        (["--emit", "terraform"], "--emit terraform: write one of k8s, compose, vllm-config, helm-values"),
        (["--emit", "k8s", "--option", "99"], "--option 99: the plan has"),
        (["--price", "H100"], "--price 'H100': write GPU=USD_PER_HOUR"),
        (["--price", "H100=-3"], "a GPU-hour costs more than $0"),
        (["--gpu", "H1000"], "unknown GPU 'H1000'"),
        (["--max-gpus", "0"], "--max-gpus 0: must be between 1 and"),
        (["--concurrency", "0"], "--concurrency 0: must be between 1 and"),
        (["--max-model-len", "1.5K"], "decimals are not allowed with binary suffixes"),
        (["--output", "x.yaml"], "--output names the file --emit writes"),
    ],
)
def test_bad_plan_flags_are_one_line(runner, args, message):
    result = run_cli(runner, "plan", "Qwen/Qwen3-8B", "--max-model-len", "8k", "--gpu", "L4", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines


def test_plan_engines_come_from_the_registry():
    from kvplan.cli.plan import plan_engines

    assert plan_engines() == tuple(name for name in ENGINE_NAMES if name in LAUNCHERS)
    assert {"vllm", "sglang"} <= set(plan_engines())


def test_trtllm_launch_line():
    # TensorRT-LLM takes its KV dtype only from an --extra_llm_api_options file; the note says what it holds.
    spec = resolve_model("Qwen/Qwen3-8B", offline=True).model

    class TrtllmStub:
        engine = "trtllm"

        def validate(self) -> None: ...

    d = Deployment(model=spec, gpu=find_gpu("H100"), engine=TrtllmStub(), workload=Workload(8192, 8),
                   parallelism=Parallelism(tp=2), kv_cache_dtype="fp8")
    line = launch(d, "Qwen/Qwen3-8B")
    assert line.shell == ("trtllm-serve Qwen/Qwen3-8B --backend pytorch --max_seq_len 8192 --tp_size 2 "
                          "--extra_llm_api_options kv_cache.yaml")
    assert "dtype: fp8" in line.notes[0]


def test_vllm_pins_the_planned_kv_budget_only_without_pipeline_stages():
    spec = resolve_model("meta-llama/Llama-3.3-70B-Instruct", offline=True).model
    result = search(spec, Workload(16000, 50), SearchSpace(gpus=(find_gpu("H100"), find_gpu("A100-40GB"))))
    for option in result.options:
        o = option.deployment.engine
        pinned = getattr(o, "kv_cache_memory_bytes", None)
        if option.deployment.parallelism.pp == 1:
            assert pinned == option.verdict.account.kv_budget_bytes
        else:
            assert pinned is None
        # Replanned without the pin, vLLM computes the same budget itself.
        unpinned = plan(replace(option.deployment, engine=replace(o, kv_cache_memory_bytes=None)))
        assert unpinned.max_requests == option.verdict.max_requests


def test_search_counts_what_it_planned_and_skipped():
    # The whole catalog for a 70B model: weights alone rule out most small cards unplanned.
    spec = resolve_model("meta-llama/Llama-3.3-70B-Instruct", offline=True).model
    result = search(spec, Workload(16000, 50), SearchSpace(gpus=all_gpus()))
    stats = result.stats
    assert stats.pruned_weights > 0 and stats.pruned_gpus > 0
    assert stats.planned < 200  # of 29 GPUs x 10 shapes x 2 KV dtypes = 580


def test_quantization_candidates():
    spec = resolve_model("meta-llama/Llama-3.3-70B-Instruct", offline=True).model
    space = SearchSpace(gpus=(find_gpu("H100"),), quantizations=(None, "fp8"), kv_cache_dtypes=("auto",))
    result = search(spec, Workload(8192, 16), space)
    by_quant = {o.deployment.weights.quantization: o.verdict.total_gpus for o in result.options}
    assert set(by_quant) == {None, "fp8"} and by_quant["fp8"] < by_quant[None]
    assert result.options[0].deployment.weights == WeightsChoice(quantization="fp8")


def test_bundled_prices_are_sourced_and_cover_the_catalog():
    table = json.loads(Path(__file__).resolve().parent.parent.joinpath("kvplan/hardware/prices.json").read_text())
    keys = {g.key for g in all_gpus()}
    priced = {row["gpu"] for row in table["prices"]}
    assert priced | set(table["not_found"]) == keys and not priced & set(table["not_found"])
    for row in table["prices"]:
        assert row["source"].startswith("https://") and len(row["date"]) == 10 and row["usd_per_hour"] > 0
    assert bundled_prices()["H100-80GB"].usd_per_hour == 3.78


def test_a_price_names_any_catalog_spelling():
    assert parse_price("h100=2.49").gpu == "H100-80GB" and parse_price("p5.48xlarge=$3").usd_per_hour == 3.0
