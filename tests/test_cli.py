"""The CLI through CliRunner: exit codes, one-line errors, JSON equals the table's data, version, gpus."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvplan import __version__
from kvplan.units import GiB
from tests.conftest import REPO, run_cli, run_json


def test_version(runner):
    result = run_cli(runner, "--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"kvplan {__version__}"


def test_python_dash_m(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "kvplan", "--version"], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == f"kvplan {__version__}"


def test_design_card_json(runner):
    data = run_json(runner, "estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16")
    kv = data["kv"]
    assert kv["model_bytes_per_token"] == 524_288  # 2 * 32 layers * 4096 * 2 B
    assert kv["model_bytes_per_request"] == 16 * GiB
    assert kv["model_batch_bytes"] == 256 * GiB
    assert data["gpu_named"] is False and len(data["gpus"]) >= 5  # common cards side by side


def test_fits_exit_0_and_does_not_fit_exit_1(runner):
    fits = run_cli(
        runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "8192", "--batch", "4", "--gpu", "H100"
    )
    assert fits.exit_code == 0, fits.output
    assert fits.stdout.startswith("FITS on H100-80GB")
    too_big = run_cli(
        runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "131072", "--batch", "16", "--gpu", "H100"
    )
    assert too_big.exit_code == 1
    first = too_big.stdout.split("\n\n")[0]
    assert first.startswith("DOES NOT FIT on H100-80GB") and "Best fix:" in first


def test_json_fit_fields(runner):
    # Llama-3.1-8B, 16 x 131,072 tokens: 131,072 B/token x 131,072 = 16 GiB per request = 8,192 blocks of 2 MiB.
    data = run_json(
        runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "131072", "--batch", "16", "--gpu", "H100"
    )
    fit = data["gpus"][0]
    assert data["fits"] is False and fit["fits"] is False and data["reason"]["code"] == "kv_cache"
    [pool] = fit["pools"]
    assert pool["unit_bytes"] == 2 * 1024**2 and pool["per_request_units"] == 8192
    assert fit["kv_needed_bytes"] == 16 * 16 * GiB
    assert fit["kv_budget_bytes"] == pool["budget_units"] * pool["unit_bytes"] < fit["kv_needed_bytes"]
    used = sum(t["bytes"] for t in fit["terms"])
    assert fit["available_kv_cache_bytes"] == fit["requested_bytes"] - used
    assert fit["max_requests"] == pool["budget_units"] // 8192 == data["max_requests"]
    assert isinstance(fit["max_concurrency"], float) and isinstance(fit["max_requests"], int)
    best = fit["fixes"][0]
    assert best["keeps_workload"] and best["max_requests"] >= 16


def test_the_best_fix_replayed_as_flags_fits(runner):
    args = ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "131072", "--batch", "16", "--gpu", "H100"]
    first = run_cli(runner, *args).stdout.split("\n")[:3]
    fix = " ".join(first).split("Best fix: ")[1].split(" (fits on")[0]
    again = run_cli(runner, *args, *fix.split())
    assert again.exit_code == 0 and again.stdout.startswith("FITS"), (fix, again.stdout[:300])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kv-cache-dtype", "fp7"], "--kv-cache-dtype fp7: unknown KV cache dtype"),
        (["--gpu", "H1000"], "unknown GPU 'H1000'"),
        (["--gpu", ""], "--gpu is empty"),
        (["--gpu-mem", "lots"], "--gpu-mem: cannot read 'lots' as a size"),
        (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization 1.5: must be in (0, 1]"),
        (["--dtype", "fp64"], "--dtype fp64: is not a dtype engines serve in"),
        (["--batch", "0"], "--batch 0: must be between 1 and"),
        (["--batch", "9" * 400], "--batch"),
        (["--seq", "9" * 400], "--max-model-len"),
        (["--shared-prefix", "1024"], "--shared-prefix 1024: must be shorter than the request length 1,024"),
        (
            ["--engine", "sglang", "--block-size", "32"],
            "--block-size is an option of --engine vllm / generic, not sglang; sglang's counterpart is --page-size",
        ),
        # vLLM's own switches are refused under another engine, not ignored
        (["--engine", "sglang", "--no-flashinfer-sampler"], "--no-flashinfer-sampler is an option of --engine vllm"),
        (["--engine", "sglang", "--mamba-cache-dtype", "float32"], "--mamba-cache-dtype is an option of --engine vllm"),
        (["--engine", "sglang", "--mla-disable"], "--mla-disable is an option of --engine vllm"),
    ],
)
def test_bad_input_is_one_line_exit_2(runner, args, message):
    result = run_cli(runner, "estimate", "meta-llama/Llama-2-7b", "--seq", "1024", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines
    assert "Traceback" not in result.output


def test_unknown_model_did_you_mean(runner):
    result = run_cli(runner, "estimate", "llama-2-7b-hff", "--seq", "1024")
    assert result.exit_code == 2
    assert "did you mean" in result.stderr and "meta-llama/Llama-2-7b-hf" in result.stderr


def test_malformed_config_names_the_key(runner, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 1}))
    result = run_cli(runner, "estimate", str(cfg), "--seq", "1024")
    assert result.exit_code == 2
    assert "num_hidden_layers" in result.stderr


def test_debug_variable_shows_traceback(runner, monkeypatch, tmp_path):
    monkeypatch.setenv("KVPLAN_DEBUG", "1")
    result = run_cli(runner, "estimate", "llama-2-7b-hff", "--seq", "1024")
    assert result.exit_code == 2 and "Traceback" in result.stderr


def test_gpus_command(runner):
    data = run_json(runner, "gpus")
    keys = {g["key"] for g in data["gpus"]}
    assert {"H100-80GB", "A100-80GB", "L4", "MI300X", "B200"} <= keys
    h100 = next(g for g in data["gpus"] if g["key"] == "H100-80GB")
    assert round(h100["total_memory_bytes"] / GiB, 2) == 79.19
    human = run_cli(runner, "gpus")
    assert human.exit_code == 0 and "H100-80GB" in human.stdout


def test_gpu_mem_for_any_card(runner):
    data = run_json(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "4096", "--gpu-mem", "48GiB")
    assert data["gpus"][0]["total_memory_bytes"] == 48 * GiB


def test_results_on_stdout_messages_on_stderr(runner):
    result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--json")
    json.loads(result.stdout)  # stdout is only the document
    assert "no request length given: using the model's max context, 131,072 tokens" in result.stderr
