"""`kvplan estimate` must start fast: the estimate path imports neither torch, transformers nor huggingface_hub."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

PROBE = """
import sys, json
from typer.testing import CliRunner
from kvplan.cli import app
result = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16", "--json"])
heavy = sorted(m for m in ("torch", "transformers", "huggingface_hub", "numpy") if m in sys.modules)
print(json.dumps({"exit": result.exit_code, "heavy": heavy}))
"""


def test_estimate_imports_no_heavy_module():
    # A fresh interpreter: the test process itself has imported torch and huggingface_hub for other tests.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"exit": 0, "heavy": []}
