"""Keep the docs' terminal sessions true: every ```console block is a kvplan command and its real output.

    python scripts/readme_sessions.py          # rerun every `$ kvplan ...` block and rewrite its output
    python scripts/readme_sessions.py --check  # exit 1 if any block's output differs (tests/test_docs.py)

It covers README.md, ARCHITECTURE.md and every docs/*.md. Commands run from the repository root as a
user's terminal at 80 columns would show them: COLUMNS=80, offline (HF_HUB_OFFLINE=1) with an empty Hugging
Face cache, so a model cached on this machine cannot change an answer. The CLI's stdout is kept, and its
stderr after it when the command ends in `2>&1` (to show an `Error:` line). A block whose command exits
non-zero shows `[exit N]` as its last line, since the exit code is part of the answer. Blocks run in
parallel: about 30 commands take 8 s on 2 cores.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```console\n\$ (kvplan [^\n]+)\n(.*?)```", re.S)


def doc_files() -> list[Path]:
    """The files whose sessions are kept true: the README, ARCHITECTURE.md and every page under docs/."""
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def run(command: str, hf_home: str) -> str:
    """The command's stdout as the block shows it (with its stderr after it when the command ends in `2>&1`):
    trailing spaces dropped, `[exit N]` when it is not 0."""
    argv = shlex.split(command)
    with_stderr = argv[-1:] == ["2>&1"]
    if with_stderr:
        argv = argv[:-1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80", "HF_HOME": hf_home}
    env.pop("KVPLAN_DEBUG", None)
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", *argv[1:]], capture_output=True, text=True, cwd=ROOT, env=env
    )
    shown = done.stdout + (done.stderr if with_stderr else "")
    out = "\n".join(line.rstrip() for line in shown.rstrip("\n").splitlines())
    if done.returncode:
        out += f"\n[exit {done.returncode}]"
    return out + "\n"


def sessions(text: str) -> list[tuple[str, str]]:
    """(command, shown output) of every console block in `text`."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def outputs(commands: list[str]) -> dict[str, str]:
    """Each distinct command's output today, run in parallel with a shared empty HF cache."""
    with tempfile.TemporaryDirectory(prefix="kvplan-docs-hf-") as hf_home:
        unique = sorted(set(commands))
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            return dict(zip(unique, pool.map(lambda c: run(c, hf_home), unique), strict=True))


def main() -> int:
    texts = {path: path.read_text() for path in doc_files() if path.exists()}
    fresh = outputs([cmd for text in texts.values() for cmd, _ in sessions(text)])
    if "--check" in sys.argv:
        stale = [
            f"{path.relative_to(ROOT)}: {cmd}"
            for path, text in texts.items()
            for cmd, shown in sessions(text)
            if fresh[cmd] != shown
        ]
        for where in stale:
            print(f"output is stale in {where}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in texts.items():
        updated = BLOCK.sub(lambda m: f"```console\n$ {m.group(1)}\n{fresh[m.group(1)]}```", text)
        if updated != text:
            path.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
