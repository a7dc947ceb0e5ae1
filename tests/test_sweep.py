"""Estimate over lists: token counts read as vLLM reads them, one row per combination, CSV, JSON list, plots."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from kvplan.cli.lists import human_int
from kvplan.errors import InputError
from tests.conftest import REPO, run_cli

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    "text, value",
    [
        # vLLM's human_readable_int (vllm/utils/argparse_utils.py): lowercase decimal, uppercase binary.
        ("32k", 32_000), ("32K", 32_768), ("25.6k", 25_600), ("1m", 1_000_000), ("1M", 1_048_576),
        ("2g", 2_000_000_000), ("1G", 1 << 30), ("1t", 10**12), ("1T", 1 << 40), ("8192", 8192), (" 4k ", 4000),
    ],
)
def test_sizes_as_vllm_reads_them(text, value):
    assert human_int(text, "--max-model-len") == value


@pytest.mark.parametrize("text, message", [("1.5K", "decimals are not allowed with binary suffixes like K"),
                                            ("32kb", "not a whole number"), ("", "not a whole number")])
def test_sizes_vllm_refuses(text, message):
    with pytest.raises(InputError, match=message):
        human_int(text, "--max-model-len")


def test_a_list_sweeps_every_combination(runner):
    result = run_cli(runner, "estimate", LLAMA, "Qwen/Qwen3-8B", "--seq", "4k,8K", "--batch", "1,16",
                     "--gpu", "H100,L40S", "--json")
    assert result.exit_code in (0, 1), result.output
    rows = json.loads(result.stdout)
    assert isinstance(rows, list) and len(rows) == 2 * 2 * 2 * 2
    assert {r["max_model_len"] for r in rows} == {4000, 8192} and {r["batch"] for r in rows} == {1, 16}
    assert {r["gpu"] for r in rows} == {"H100-80GB", "L40S"}


def test_each_row_is_the_single_estimate(runner):
    rows = json.loads(run_cli(runner, "estimate", LLAMA, "--seq", "4k,8k", "--gpu", "H100", "--json").stdout)
    single = json.loads(run_cli(runner, "estimate", LLAMA, "--seq", "8000", "--gpu", "H100", "--json").stdout)
    row = next(r for r in rows if r["max_model_len"] == 8000)
    figures = single["gpus"][0]
    for key in ("kv_needed_bytes", "kv_budget_bytes", "max_requests", "longest_context_tokens", "fits"):
        assert row[key] == figures[key], key


def test_csv_one_row_per_combination(runner):
    result = run_cli(runner, "estimate", LLAMA, "--seq", "4k,8k,32k", "--gpu", "H100", "--csv")
    assert result.exit_code in (0, 1), result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [int(r["max_model_len"]) for r in rows] == [4000, 8000, 32000]
    assert all(r["gpu"] == "H100-80GB" and r["model"] == LLAMA for r in rows)
    assert int(rows[0]["kv_needed_bytes"]) == 4000 * 131072  # 4,000 tokens x 128 KiB, whole blocks (250)


def test_sweep_table_fits_80_columns(runner):
    result = run_cli(runner, "estimate", LLAMA, "google/gemma-3-27b-it", "--seq", "4k,131072", "--batch", "1,64",
                     "--gpu", "H100,A100-40GB-PCIE", "--input-len", "1000", "--output-len", "200")
    assert result.exit_code in (0, 1)
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "google/gemma-3-27b-it" in result.stdout


def test_csv_and_json_together_is_an_error(runner):
    result = run_cli(runner, "estimate", LLAMA, "--seq", "4k,8k", "--csv", "--json")
    assert result.exit_code == 2 and "--csv and --json" in result.stderr


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot(runner, tmp_path, suffix):
    pytest.importorskip("matplotlib", reason="matplotlib is the [plot] extra; the test extra installs it")
    target = tmp_path / f"kv{suffix}"
    result = run_cli(runner, "estimate", LLAMA, "Qwen/Qwen3-8B", "--seq", "4k,8k,32k", "--gpu", "H100,L40S",
                     "--plot", str(target))
    assert result.exit_code in (0, 1), result.output
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in data[:2000]
    assert "plot written to" in result.stderr


def test_plot_refuses_other_formats(runner, tmp_path):
    result = run_cli(runner, "estimate", LLAMA, "--seq", "4k,8k", "--plot", str(tmp_path / "kv.pdf"))
    assert result.exit_code == 2 and "write a .png or .svg file" in result.stderr


SWEEP_PROBE = """
import sys, json
from typer.testing import CliRunner
from kvplan.cli import app
result = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-2-7b", "--seq", "4k,8k", "--csv"])
print(json.dumps({"exit": result.exit_code, "matplotlib": "matplotlib" in sys.modules}))
"""


def test_a_sweep_without_plot_does_not_import_matplotlib():
    out = subprocess.run([sys.executable, "-c", SWEEP_PROBE], capture_output=True, text=True, cwd=REPO, check=True,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"exit": 0, "matplotlib": False}
