"""Every output and every --help fits an 80-column terminal without cutting a name or number.

Run as a user runs it: a subprocess of `python -m kvplan` with COLUMNS=80, so rich sizes its tables and typer
its help panels for that terminal, and the console script's stdout wrapper is in the path. A cut shows as a
line over 80 characters or as rich's ellipsis "…" (what rich prints when it shortens a cell); a trailing
space is a line padded to the terminal, which copies badly into tickets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        COLUMNS="80",
        LINES="50",
        HF_HOME=str(tmp_path / "hf"),  # an empty cache: library models come from the bundled library
        HF_HUB_OFFLINE="1",
        NO_COLOR="1",
    )
    env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _cuts(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 80 or "…" in line or line != line.rstrip()]


COMMANDS = ["estimate", "check", "plan", "verify", "calibrate", "models", "gpus"]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_fits_80_columns(command: str, tmp_path: Path) -> None:
    result = _run(*([command] if command else []), "--help", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout
    assert _cuts(result.stdout) == []


def test_every_command_is_checked() -> None:
    # The parametrised list above must not fall behind the app: a new command gets its --help checked too.
    import typer.main

    from kvplan.cli import app

    group = typer.main.get_command(app)
    assert set(group.commands) == set(COMMANDS)  # type: ignore[attr-defined]


OUTPUTS = [
    # A verdict with its table, the long names vLLM's flags carry, and a GiB column.
    ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "32k", "--batch", "16", "--gpu", "H100"],
    # Does not fit: the fixes table with its flag lines.
    ["estimate", "meta-llama/Llama-3.1-70B-Instruct", "--seq", "131072", "--batch", "64", "--gpu", "L4"],
    # MLA under tensor parallelism, SGLang's panel.
    ["estimate", "deepseek-ai/DeepSeek-V3", "--tp", "8", "--gpu", "H200", "--engine", "sglang"],
    # A sweep table: two models x two contexts x two GPUs.
    ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "--seq", "8k,32K", "--gpu", "H100,L40S"],
    ["plan", "meta-llama/Llama-3.3-70B-Instruct", "--max-model-len", "16K", "--concurrency", "50",
     "--gpu", "H100,H200,A100-80GB,L40S", "--top", "3"],
    ["check", str(DATA / "deploy"), "--offline"],
    ["check", str(DATA / "reference-deploy"), "--offline"],
    ["models"],
    ["gpus"],
]


@pytest.mark.parametrize("args", OUTPUTS, ids=lambda a: " ".join(a[:2]).replace(str(DATA), "data"))
def test_output_fits_80_columns(args: list[str], tmp_path: Path) -> None:
    result = _run(*args, tmp_path=tmp_path)
    # 0 fits, 1 does not fit, 2 cannot evaluate (check); anything else is a crash worth seeing.
    assert result.returncode in (0, 1, 2), result.stderr
    assert result.stdout.strip(), result.stderr
    assert _cuts(result.stdout) == []
    assert _cuts(result.stderr) == []


def test_calibrate_output_fits_80_columns(tmp_path: Path) -> None:
    logs = sorted((DATA / "logs").glob("vllm-*.log"))[:3]
    result = _run("calibrate", *map(str, logs), tmp_path=tmp_path)
    assert result.returncode in (0, 1, 2), result.stderr
    assert result.stdout.strip()
    assert _cuts(result.stdout) == []


@pytest.mark.torch
def test_verify_output_fits_80_columns(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = _run("verify", "meta-llama/Llama-3.2-1B-Instruct", "--seq", "256", "--batch", "2", "--device", "cpu",
                  "--steps", "2", "--decode-layers", "1", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Cached decode" in result.stdout
    assert _cuts(result.stdout) == []
    assert result.stderr == ""  # no progress bar residue when stderr is not a terminal
