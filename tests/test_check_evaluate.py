"""`kvplan check` end to end: verdicts, figures, margins, fixes and exit codes over deployment files."""

from __future__ import annotations

import json
import re

import pytest

from kvplan.check.model import VERDICTS
from kvplan.units import GiB
from tests.conftest import REPO, run_cli
from tests.conftest_hub import HubEnv

FIXTURES = REPO / "tests" / "fixtures"
# Llama-3.1-8B: 32 layers * 8 KV heads * 128 dims * 2 (K, V) * 2 B = 131,072 B per token in bf16.
LLAMA31_8B_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


def check_json(runner, *args: str) -> tuple[int, list[dict]]:
    result = run_cli(runner, "check", *args, "--offline", "--format", "json")
    assert result.exit_code in (0, 1, 2), result.output
    data = json.loads(result.stdout)
    assert data["exit_code"] == result.exit_code
    return result.exit_code, data["results"]


def test_engine_refuses_to_start(runner):
    code, [r] = check_json(runner, str(FIXTURES / "check" / "vllm-l4-refused.yaml"))
    assert code == 1 and r["verdict"] == "does_not_fit"
    # One request of 131,072 tokens = 8,192 blocks of 16 tokens at 131,072 B per token = 16 GiB.
    assert r["kv_needed_bytes"] == 131072 * LLAMA31_8B_BYTES_PER_TOKEN == 16 * GiB
    assert r["reason"].startswith("To serve at least one request with the model's max seq len (131072), (16.0 GiB")
    assert r["kv_available_bytes"] < r["kv_needed_bytes"] and r["reason_code"] == "one_request"
    # The fixes that keep the workload come first; the shorter context is among them, as the longest length
    # whose blocks the usable KV memory holds: blocks of 16 tokens x 2 MiB, usable = kv_available / 2 MiB.
    shorter = next(f for f in r["fixes"] if "--max-model-len" in f)
    fit_len = int(re.search(r"--max-model-len (\d+)", shorter).group(1))
    usable_blocks = r["kv_available_bytes"] // (16 * LLAMA31_8B_BYTES_PER_TOKEN)
    assert -(-fit_len // 16) <= usable_blocks < -(-(fit_len + 16) // 16)


def test_fits_with_flag_equals_value(runner):
    code, [r] = check_json(runner, str(FIXTURES / "check" / "vllm-h100-fits.yaml"))
    assert code == 0 and r["verdict"] == "fits"
    assert r["kv_needed_bytes"] == 32768 * LLAMA31_8B_BYTES_PER_TOKEN == 4 * GiB
    assert r["max_num_seqs"] == 64
    assert r["margin"] == pytest.approx(1 - r["kv_needed_bytes"] / r["kv_available_bytes"], abs=1e-4)


def test_too_few_gpus_for_tp(runner):
    code, [r] = check_json(runner, str(FIXTURES / "check" / "vllm-gpus-short.yaml"))
    assert code == 1 and r["verdict"] == "does_not_fit"
    assert "needs 4 GPUs (tp 4 x pp 1) but only 2 are requested" in r["reason"] and r["reason_code"] == "gpus"


def test_concurrency_target_and_margin(runner):
    code, (eight, four) = check_json(runner, str(FIXTURES / "check" / "kvplan-concurrency.yaml"))
    # fp8 KV: 65,536 B per token. 8 requests * 65,536 tokens = 32 GiB; 4 requests = 16 GiB.
    assert eight["kv_needed_bytes"] == 8 * 65536 * 65536 == 32 * GiB and eight["verdict"] == "fits"
    assert four["kv_needed_bytes"] == 16 * GiB and four["verdict"] == "fits"
    assert four["meets_min_margin"] is False and four["required_margin"] == 0.8
    assert code == 1  # a deployment below its required margin fails the job
    # A fix keeps 80% of the KV free: the requests must fit a fifth of the pool. In kvplan's own schema the
    # fixes are its keys. Fewer requests: 65,536 tokens x 65,536 B = 4 GiB each, so the largest count is
    # floor(0.2 x available / 4 GiB); a shorter context: 4 requests in whole 16-token blocks of 1 MiB.
    fewer = next(f for f in four["fixes"] if "concurrency:" in f)
    n = int(re.search(r"concurrency: (\d+)", fewer).group(1))
    assert n * 4 * GiB <= 0.2 * four["kv_available_bytes"] < (n + 1) * 4 * GiB
    shorter = next(f for f in four["fixes"] if "max_model_len:" in f)
    fit_len = int(re.search(r"max_model_len: (\d+)", shorter).group(1))
    blocks = 4 * -(-fit_len // 16)
    assert blocks * 16 * 65536 <= 0.2 * four["kv_available_bytes"] < (blocks + 4) * 16 * 65536


def test_min_margin_flag(runner):
    fixture = str(FIXTURES / "check" / "vllm-h100-fits.yaml")
    assert run_cli(runner, "check", fixture, "--offline", "--min-margin", "0.5").exit_code == 0
    assert run_cli(runner, "check", fixture, "--offline", "--min-margin", "0.99").exit_code == 1


def test_missing_gpu_cannot_be_evaluated(runner):
    code, [r] = check_json(runner, str(FIXTURES / "deploy" / "missing-gpu.yaml"))
    assert code == 2 and r["verdict"] == "cannot_evaluate"
    assert "kvplan.io/gpu" in r["reason"]
    code, [r] = check_json(runner, str(FIXTURES / "deploy" / "missing-gpu.yaml"), "--gpu", "H100-80GB")
    assert code == 0 and r["verdict"] == "fits"


def test_sglang_and_tgi_are_evaluated(runner):
    _, [sgl] = check_json(runner, str(FIXTURES / "deploy" / "sglang.yaml"))
    assert sgl["verdict"] in ("fits", "does_not_fit") and "max_total_num_tokens=" in sgl["engine_lines"][0]
    _, [tgi] = check_json(runner, str(FIXTURES / "deploy" / "tgi.yaml"))
    assert tgi["verdict"] in ("fits", "does_not_fit") and tgi["kv_available_bytes"] > 0


def test_github_annotation_points_at_the_line(runner):
    fixture = FIXTURES / "check" / "vllm-l4-refused.yaml"
    result = run_cli(runner, "check", str(fixture), "--offline", "--format", "github")
    assert result.exit_code == 1
    assert result.stdout.startswith(f"::error file={fixture},line=")
    assert "does not fit" in result.stdout


def test_offline_never_asks_the_hub(runner, hub_env: HubEnv, tmp_path):
    manifest = (FIXTURES / "check" / "vllm-h100-fits.yaml").read_text().replace(
        "meta-llama/Llama-3.1-8B-Instruct", "someorg/not-in-library"
    )
    (tmp_path / "d.yaml").write_text(manifest)
    code, [r] = check_json(runner, str(tmp_path / "d.yaml"))
    assert code == 2 and "offline" in r["reason"]
    assert hub_env.hub.requests == []


def test_library_models_need_no_network_even_online(runner, hub_env: HubEnv):
    # hub_env is online (HF_HUB_OFFLINE unset) and its fake Hub holds nothing: the bundled copy answers.
    result = run_cli(runner, "check", str(FIXTURES / "check" / "vllm-h100-fits.yaml"), "--format", "json")
    assert result.exit_code == 0, result.output
    assert hub_env.hub.requests == []


DEPLOY_FILES = REPO / "tests" / "data" / "reference-deploy"  # a copy of ../shared/reference/deploy-files


def test_every_real_deployment_file_is_evaluated_or_refused_with_a_reason(runner):
    code, results = check_json(runner, str(DEPLOY_FILES))
    files = {r["file"] for r in results}
    assert len(files) == len(list(DEPLOY_FILES.glob("*.yaml")))  # every file reported
    for r in results:
        assert r["verdict"] in VERDICTS
        if r["verdict"] != "fits":
            assert r["reason"], r
    assert {"fits", "cannot_evaluate"} <= {r["verdict"] for r in results}
