"""Style (ruff), types (mypy) and the layer contract (import-linter) are part of the test suite.

The test extra installs all three, so the README's one test command checks them too; a missing tool is a
failure, not a skip, because a skipped lint would let CI pass without linting. The layer contract in
pyproject.toml is what keeps the core pure: model/capacity/engines never import the CLI, torch or the network.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_ruff() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", "kvplan", "tests", "benchmarks", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = _run(sys.executable, "-m", "mypy", "kvplan")
    assert result.returncode == 0, result.stdout + result.stderr


def test_layer_contract() -> None:
    result = _run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout
