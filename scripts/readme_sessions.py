"""Keep the README's terminal sessions true: every ```console block is a command and its real output.

    python scripts/readme_sessions.py          # rerun every `$ kvplan ...` block and rewrite its output
    python scripts/readme_sessions.py --check  # exit 1 if any block's output differs (tests/test_docs.py)

Commands run offline (HF_HUB_OFFLINE=1) from the repository root, with the CLI's stdout only; a block
whose command exits non-zero shows `[exit N]` as its last line, since the exit code is part of the answer.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"```console\n\$ (kvplan [^\n]+)\n(.*?)```", re.S)


def run(command: str) -> str:
    argv = shlex.split(command)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80"}
    env.pop("KVPLAN_DEBUG", None)
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", *argv[1:]], capture_output=True, text=True, cwd=ROOT, env=env
    )
    out = "\n".join(line.rstrip() for line in done.stdout.rstrip("\n").splitlines())
    if done.returncode:
        out += f"\n[exit {done.returncode}]"
    return out + "\n"


def sessions(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def render(text: str) -> str:
    return BLOCK.sub(lambda m: f"```console\n$ {m.group(1)}\n{run(m.group(1))}```", text)


def main() -> int:
    text = README.read_text()
    if "--check" in sys.argv:
        stale = [cmd for cmd, shown in sessions(text) if run(cmd) != shown]
        for cmd in stale:
            print(f"README output is stale for: {cmd}", file=sys.stderr)
        return 1 if stale else 0
    README.write_text(render(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
