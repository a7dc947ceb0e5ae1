"""Shared test fixtures: isolated environment, CLI runner, library paths."""

from __future__ import annotations

import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
REFERENCE = REPO.parent / "shared" / "reference"

try:  # the Hub fixtures (local fake Hub server) live in their own module
    from tests.conftest_hub import *  # noqa: F401,F403
except ImportError:  # pragma: no cover - while that module is being written
    pass


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path):
    """No test reads the user's Hub token or cache, or reaches the internet."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


def run_cli(runner, *args: str):
    from kvplan.cli import app

    return runner.invoke(app, list(args))


def run_json(runner, *args: str) -> dict:
    result = run_cli(runner, *args, "--json")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)
