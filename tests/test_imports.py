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


MAIN_PROBE = """
import sys, json, io, contextlib
sys.argv = ["kvplan", "estimate", "meta-llama/Llama-2-7b", "--seq", "32768", "--batch", "16"]
from kvplan.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"exit": code, "modules": sorted(sys.modules)}))
"""


def test_console_estimate_loads_only_its_own_path():
    # What `kvplan estimate` pays for at start: the console entry builds an app holding estimate alone and
    # asks the registry for vLLM alone. The modules below belong to other commands, other engines, the fix
    # search (a named GPU only) and the Hub client; importlib.resources would pull in zipfile and tempfile.
    out = subprocess.run(
        [sys.executable, "-c", MAIN_PROBE], capture_output=True, text=True, cwd=REPO, check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["exit"] == 0
    loaded = set(report["modules"])
    assert "kvplan.engines.vllm_engine" in loaded  # the probe did plan
    absent = {
        "kvplan.cli.plan", "kvplan.cli.model_rows", "kvplan.check", "kvplan.calibrate", "kvplan.verify",
        "kvplan.engines.sglang", "kvplan.engines.trtllm", "kvplan.engines.tgi", "kvplan.engines.transformers",
        "kvplan.planner.fixes", "kvplan.sources.hub", "huggingface_hub", "importlib.resources", "zipfile",
    }
    assert sorted(absent & loaded) == []
