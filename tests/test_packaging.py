"""A plain (non-editable) install ships the bundled library: the design-card command works offline from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build a wheel of this checkout and install it, without dependencies, into a private directory."""
    pytest.importorskip("setuptools")
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(work / "dist"),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    wheel = next((work / "dist").glob("kvplan-*.whl"))
    target = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    return target


def test_wheel_ships_model_configs(installed):
    shipped = {p.name for p in (installed / "kvplan" / "model_configs").iterdir()}
    assert "meta-llama__Llama-2-7b-hf.json" in shipped and "aliases.json" in shipped


def test_wheel_holds_every_subpackage(installed):
    source = {p.parent.relative_to(REPO) for p in (REPO / "kvplan").rglob("__init__.py")}
    shipped = {p.parent.relative_to(installed) for p in (installed / "kvplan").rglob("__init__.py")}
    assert source <= shipped, f"add to [tool.setuptools] packages: {sorted(map(str, source - shipped))}"


def test_design_card_offline_from_installed_package(installed, tmp_path):
    code = (
        "import kvplan, json, sys; from kvplan.cli import main; "
        "sys.argv = ['kvplan', 'estimate', 'meta-llama/Llama-2-7b', '--seq', '32768', '--batch', '16', '--json']; "
        "print(kvplan.__file__, file=sys.stderr); main()"
    )
    env = {**os.environ, "PYTHONPATH": str(installed), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert str(installed) in out.stderr  # the installed copy ran, not this checkout
    data = json.loads(out.stdout)
    assert data["kv"]["model_batch_bytes"] == 256 * 2**30  # 16 x 16 GiB
    assert data["model"]["source"].startswith("bundled library")
