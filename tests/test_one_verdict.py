"""One deployment, one accounting, one verdict: the defects of the "one verdict" issue, each pinned, the
invariants over random deployments and every engine, and `estimate` against `check` on the same deployments."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.capacity.deployment import Deployment, Parallelism, Workload
from kvplan.engines import ENGINE_NAMES, get_engine
from kvplan.errors import KvplanError
from kvplan.hardware.gpus import find_gpu
from kvplan.planner.fixes import apply, find_fixes
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli, run_json

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def _first_line(result) -> str:
    return result.stdout.split("\n\n")[0].replace("\n", " ")


# --- the defects, each as the issue tells it ----------------------------------------------------------------


def test_four_replicas_hold_ten_requests_each(runner):
    # 40 requests on --num-gpus 4 at tp 1: four vLLM instances of one H100, 10 requests each. 10 x 32,768 tokens
    # x 131,072 B = 40 GiB per GPU, not the whole batch's 160 GiB.
    data = run_json(runner, "estimate", LLAMA_8B, "--seq", "32768", "--batch", "40", "--gpu", "H100",
                    "--num-gpus", "4")
    fit = data["gpus"][0]
    assert data["fits"] is True and fit["kv_caches"] == 4 and fit["requests_per_cache"] == 10
    assert fit["kv_needed_bytes"] == 40 * GiB
    # Max requests count every replica: each holds floor(usable blocks / 2,048) of them.
    assert fit["max_requests"] == 4 * (fit["pools"][0]["budget_units"] // 2048)


def test_replicas_in_a_deployment_file_agree(runner, tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump({"kvplan": 1, "model": LLAMA_8B, "gpu": "H100", "num_gpus": 4,
                                 "max_model_len": 32768, "concurrency": 40}))
    result = run_cli(runner, "check", str(f), "--offline", "--format", "json")
    (r,) = json.loads(result.stdout)["results"]
    assert r["verdict"] == "fits" and r["kv_needed_bytes"] == 40 * GiB and result.exit_code == 0


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_shared_prefix_enters_the_verdict(runner, engine):
    # 24 requests of 32,768 tokens with a 30,000-token shared system prompt: without sharing they need 24 x
    # 32,768 tokens of KV; with it the whole blocks (pages) of the prefix are stored once.
    args = ["estimate", LLAMA_8B, "--seq", "32768", "--batch", "24", "--gpu", "H100", "--engine", engine]
    alone = run_json(runner, *args)["gpus"][0]
    shared = run_json(runner, *args, "--shared-prefix", "30000")["gpus"][0]
    assert alone["fits"] is False and shared["fits"] is True
    assert shared["pools"][0]["shared_prefix_units"] > 0
    assert shared["max_requests"] > alone["max_requests"]


def test_max_num_seqs_caps_what_runs_at_once(runner):
    # Llama-3.2-1B at 1,024 tokens: the KV holds thousands of requests, but vLLM runs 1,024 at once (its
    # default max_num_seqs on an H100): 2,000 concurrent requests do not fit, and max_requests says 1,024.
    data = run_json(runner, "estimate", "meta-llama/Llama-3.2-1B-Instruct", "--seq", "1024", "--batch", "2000",
                    "--gpu", "H100")
    fit = data["gpus"][0]
    assert data["fits"] is False and fit["limit"] == "request_cap" and fit["max_requests"] == 1024
    assert fit["fixes"][0]["changes"] == [{"field": "engine.max_num_seqs", "value": 2000}]


def test_transformers_refuses_what_it_does_not_model(runner):
    fp8 = run_cli(runner, "estimate", LLAMA_8B, "--seq", "8192", "--engine", "transformers", "--kv-cache-dtype", "fp8")
    assert fp8.exit_code == 2 and "--kv-cache-dtype fp8" in fp8.stderr
    tp = run_cli(runner, "estimate", LLAMA_8B, "--seq", "8192", "--engine", "transformers", "--tp", "2")
    assert tp.exit_code == 2 and "--tp" in tp.stderr and "one process on one GPU" in tp.stderr


def test_sglang_takes_pp_state_and_its_own_default_fraction(runner):
    # pp 2 halves the layers per stage; the Mamba state of Nemotron-3-Nano is a pool of its own; and with no
    # --mem-fraction-static the fraction is SGLang's rule for the card (0.834 on an H100), not 0.9.
    one = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--gpu", "H100", "--engine", "sglang")
    two = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--gpu", "H100", "--engine", "sglang", "--pp", "2")
    assert one["gpus"][0]["engine_detail"]["mem_fraction_static"] == 0.834
    assert two["gpus"][0]["pools"][0]["unit_bytes"] * 2 == one["gpus"][0]["pools"][0]["unit_bytes"]
    nano = run_json(runner, "estimate", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "--seq", "8192", "--gpu",
                    "H100", "--engine", "sglang")
    assert "state slots" in [p["name"] for p in nano["gpus"][0]["pools"]]


@pytest.mark.parametrize(
    "args, owner",
    [
        (["--engine", "sglang", "--block-size", "32"], "--block-size is an option of --engine vllm / generic"),
        (["--engine", "sglang", "--max-num-seqs", "5"], "--max-num-seqs is an option of --engine vllm / tgi"),
        (["--engine", "sglang", "--hf-cache", "static"], "--hf-cache is an option of --engine transformers"),
        (["--engine", "vllm", "--page-size", "16"], "--page-size is an option of --engine sglang"),
    ],
)
def test_foreign_flags_are_errors_naming_their_engine(runner, args, owner):
    result = run_cli(runner, "estimate", LLAMA_8B, "--seq", "8192", *args)
    assert result.exit_code == 2 and owner in result.stderr


def test_configs_vllm_refuses(runner):
    tp3 = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--gpu", "H100", "--tp", "3")
    assert tp3["fits"] is False and tp3["reason"]["code"] == "tp_heads"
    assert "must be divisible by tensor parallel size (3)" in tp3["reason"]["message"]
    assert {f["changes"][0]["value"] for f in tp3["gpus"][0]["fixes"]} <= {1, 2, 4}
    int4 = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--gpu", "H100", "--kv-cache-dtype", "int4")
    assert int4["fits"] is False and int4["reason"]["code"] == "kv_dtype"


def test_beyond_the_trained_context(runner):
    # Llama-2-7B states 4,096 positions: vLLM refuses 32,768 unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; the best
    # fix is the model's own context, never the failing value again.
    result = run_cli(runner, "estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16", "--gpu", "H200")
    first = _first_line(result)
    assert first.startswith("DOES NOT FIT") and "max_position_embeddings=4096" in first
    assert "Best fix: --max-model-len 4096" in first and "--max-model-len 32768" not in result.stdout
    assert "32,768 tokens is beyond the 4,096 the model's config states" in result.stdout.replace("\n  ", " ")


def test_suggestions_never_repeat_the_request_and_combine(runner):
    data = run_json(runner, "estimate", LLAMA_8B, "--seq", "131072", "--batch", "16", "--gpu", "H100")
    asked = {"workload.max_model_len": 131072, "workload.concurrency": 16, "parallelism.tp": 1, "gpu": "H100-80GB",
             "kv_cache_dtype": "auto"}
    fixes = data["gpus"][0]["fixes"]
    assert fixes and all(asked.get(c["field"]) != c["value"] for f in fixes for c in f["changes"])
    assert any(len(f["changes"]) > 1 for f in fixes)  # combinations are tried (fp8 + replicas, another GPU)
    # A shrinking fix is strictly smaller than the request.
    for f in fixes:
        for c in f["changes"]:
            if c["field"] in ("workload.max_model_len", "workload.concurrency"):
                assert c["value"] < asked[c["field"]]


def test_kv_memory_without_a_gpu_still_gives_tokens_and_concurrency(runner):
    # 20 GiB of KV in blocks of 2 MiB (Llama-3.1-8B, 16 tokens x 131,072 B): 10,240 blocks, 163,840 tokens;
    # vLLM's figure 10,240 / 512 = 20.0x. Whole requests, 10,239 usable / 512 = 19, on every card that holds
    # the weights and the pinned 20 GiB.
    data = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--kv-cache-memory-bytes", "20GiB")
    assert data["gpu_named"] is False
    assert (data["kv_cache_tokens"], data["max_concurrency"]) == (163_840, 20.0)
    holding = [g for g in data["gpus"] if g["fits"]]
    assert holding and all(g["max_requests"] == 19 for g in holding)


def test_json_types_are_the_same_for_every_engine(runner):
    for engine in ("vllm", "sglang", "transformers", "generic", "tgi"):
        data = run_json(runner, "estimate", LLAMA_8B, "--seq", "8192", "--gpu", "H100", "--engine", engine)
        fit = data["gpus"][0]
        assert isinstance(fit["max_concurrency"], float) and isinstance(fit["max_requests"], int), engine
        assert data["schema_version"] == 2


def test_verdict_first_and_replication_flagged(runner):
    # Llama-3.1-70B has 8 KV heads: at tp 16 each rank keeps one, replicated on 2 ranks.
    result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-70B-Instruct", "--seq", "8192", "--gpu", "H100",
                     "--tp", "16")
    assert result.stdout.startswith(("FITS", "DOES NOT FIT"))
    assert "tp 16 exceeds the 8 KV heads" in result.stdout.replace("\n  ", " ")


# --- invariants over random deployments, every engine -------------------------------------------------------

MODELS = {n: resolve_model(n, offline=True).model for n in (
    LLAMA_8B, "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V2-Lite", "google/gemma-3-27b-it",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Qwen/Qwen3-30B-A3B", "mistralai/Mistral-7B-Instruct-v0.3",
    # A ModelOpt checkpoint with an FP8 KV cache: auto runs fp8 where the engine follows it (checkpoint_kv).
    "nvidia/Qwen3.6-35B-A3B-NVFP4",
)}
GPUS = ["L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100", "H200", "B200", "MI300X"]


@st.composite
def deployments(draw):
    engine = get_engine(draw(st.sampled_from(sorted(ENGINE_NAMES))))
    model = MODELS[draw(st.sampled_from(sorted(MODELS)))]
    length = draw(st.integers(1, 140_000))
    single = engine.name == "transformers"
    return Deployment(
        model=model,
        gpu=find_gpu(draw(st.sampled_from(GPUS))),
        engine=engine.default_options(),
        workload=Workload(max_model_len=length, concurrency=draw(st.integers(1, 600)),
                          shared_prefix_tokens=draw(st.integers(0, length - 1))),
        parallelism=Parallelism(tp=1 if single else draw(st.sampled_from([1, 2, 3, 4, 8])),
                                pp=1 if single else draw(st.sampled_from([1, 2]))),
        # vLLM's own quantized caches too (engine-rules 1.27): TurboQuant's unequal pages, nvfp4's refusals off
        # Blackwell; the other engines refuse them.
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8", "fp8_e4m3", "int8", "int8_per_token_head",
                                             "turboquant_k3v4_nc", "nvfp4"])) if not single else "auto",
        instances=draw(st.integers(1, 4)),
    )


def _check_invariants(d: Deployment):
    try:
        v = plan(d)
    except KvplanError:
        return None  # a value the engine cannot take is an error, not a verdict
    a = v.account
    pools_hold = all(u.needed_units <= u.pool.budget_units for u in v.pools)
    cap_holds = a.request_cap is None or v.requests_per_cache <= a.request_cap
    assert v.fits == (a.refusal is None and bool(v.pools) and pools_hold and cap_holds)
    if len(v.pools) == 1 and v.kv_needed_bytes is not None:
        assert v.fits == (a.refusal is None and cap_holds and v.kv_needed_bytes <= v.kv_budget_bytes)
    assert (v.max_requests >= d.workload.concurrency) == v.fits
    return v


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_fits_iff_need_within_budget_and_accepted(d):
    _check_invariants(d)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_every_fix_replanned_fits(d):
    v = _check_invariants(d)
    if v is None or v.fits:
        return
    for fix in find_fixes(d, v):
        again = _check_invariants(apply(d, fix.changes))
        assert again is not None and again.fits, fix.changes


# --- estimate and check: the same deployment, the same verdict and figures ------------------------------------

# (model, gpu, num_gpus, tp, pp, max_model_len, concurrency, kv_cache_dtype, engine, utilization)
SAME = [
    (LLAMA_8B, "H100", 1, 1, 1, 8192, 32, "auto", "vllm", None),
    (LLAMA_8B, "H100", 1, 1, 1, 131072, 8, "auto", "vllm", None),
    (LLAMA_8B, "L4", 1, 1, 1, 16384, 4, "fp8", "vllm", 0.95),
    (LLAMA_8B, "H100", 4, 1, 1, 32768, 40, "auto", "vllm", None),
    (LLAMA_8B, "A100-40GB", 2, 2, 1, 32768, 16, "auto", "vllm", None),
    (LLAMA_8B, "H100", 2, 1, 2, 65536, 16, "auto", "vllm", None),
    ("meta-llama/Llama-3.1-70B-Instruct", "H100", 4, 4, 1, 32768, 32, "fp8", "vllm", None),
    ("meta-llama/Llama-3.1-70B-Instruct", "H100", 2, 2, 1, 8192, 64, "auto", "vllm", 0.9),
    ("openai/gpt-oss-20b", "H100", 1, 1, 1, 131072, 16, "auto", "vllm", None),
    ("openai/gpt-oss-120b", "H200", 1, 1, 1, 65536, 8, "auto", "vllm", None),
    ("deepseek-ai/DeepSeek-V2-Lite", "A100-80GB", 1, 1, 1, 32768, 32, "auto", "vllm", None),
    ("google/gemma-3-27b-it", "H100", 1, 1, 1, 32768, 8, "auto", "vllm", None),
    ("Qwen/Qwen3-30B-A3B", "H200", 1, 1, 1, 40960, 16, "auto", "vllm", None),
    ("mistralai/Mistral-7B-Instruct-v0.3", "L40S", 1, 1, 1, 32768, 4, "auto", "vllm", None),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "H100", 1, 1, 1, 65536, 16, "auto", "vllm", None),
    (LLAMA_8B, "H100", 1, 1, 1, 8192, 32, "auto", "sglang", None),
    (LLAMA_8B, "L4", 1, 1, 1, 8192, 4, "fp8_e4m3", "sglang", 0.85),
    ("google/gemma-2-9b-it", "A100-80GB", 1, 1, 1, 8192, 16, "auto", "sglang", None),
    ("deepseek-ai/DeepSeek-V2-Lite", "H100", 2, 2, 1, 16384, 64, "auto", "sglang", None),
    (LLAMA_8B, "L4", 1, 1, 1, 4096, 4, "auto", "tgi", None),
    ("meta-llama/Llama-3.1-70B-Instruct", "L40S", 4, 4, 1, 8192, 2, "auto", "tgi", 0.95),
]
_UTIL_FLAG = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static", "tgi": "--gpu-memory-utilization"}
FIGURES = ("fits", "limit", "kv_needed_bytes", "kv_budget_bytes", "max_requests", "max_concurrency", "kv_cache_tokens",
           "available_kv_cache_bytes", "requests_per_cache", "total_gpus")


@pytest.mark.parametrize("case", SAME, ids=[f"{c[0].split('/')[1]}-{c[1]}-{c[8]}-{c[5]}x{c[6]}" for c in SAME])
def test_estimate_and_check_agree(runner, tmp_path, case):
    model, gpu, num_gpus, tp, pp, length, concurrency, kv, engine, util = case
    flags = ["estimate", model, "--gpu", gpu, "--num-gpus", str(num_gpus), "--tp", str(tp), "--pp", str(pp),
             "--seq", str(length), "--batch", str(concurrency), "--kv-cache-dtype", kv, "--engine", engine]
    if util is not None:
        flags += [_UTIL_FLAG[engine], str(util)]
    estimate = run_json(runner, *flags)["gpus"][0]
    doc = {"kvplan": 1, "name": "same", "model": model, "gpu": gpu, "num_gpus": num_gpus, "tp": tp, "pp": pp,
           "max_model_len": length, "concurrency": concurrency, "kv_cache_dtype": kv, "engine": engine}
    if util is not None:
        doc["gpu_memory_utilization"] = util
    f = tmp_path / "same.yaml"
    f.write_text(yaml.safe_dump(doc))
    result = run_cli(runner, "check", str(f), "--offline", "--format", "json")
    (checked,) = json.loads(result.stdout)["results"]
    figures = checked["figures"]
    assert figures is not None, checked
    assert {k: figures[k] for k in FIGURES} == {k: estimate[k] for k in FIGURES}
    assert checked["verdict"] == ("fits" if estimate["fits"] else "does_not_fit")
