"""The README is part of the product: every command is documented and every pasted session is current."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvplan.cli import app
from tests.conftest import REPO

pytestmark = pytest.mark.slow

README = (REPO / "README.md").read_text()


def test_every_command_is_in_the_readme():
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    missing = [n for n in names if f"kvplan {n}" not in README]
    assert not missing, f"document these commands in README.md: {missing}"


def test_readme_sessions_are_real_output():
    # Each ```console block in the README holds a command and the output it prints today.
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "readme_sessions.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + "\nrun: python scripts/readme_sessions.py"


def test_readme_has_the_two_setup_commands_and_ci_runs_the_second():
    assert "pip install . && kvplan estimate meta-llama/Llama-2-7b --seq 32768 --batch 16" in README
    test_command = "pip install -e '.[test]' && python -m pytest"
    assert test_command in README
    assert test_command in (REPO / ".ci" / "run").read_text()
