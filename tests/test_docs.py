"""The docs are part of the product: every command and option is documented, every pasted session is current,
every link resolves, and the figures quoted are those the code and the benchmark results give."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import pytest
import typer.main

from kvplan.check.build import _UNMODELLED
from kvplan.check.readers import FORMATS
from kvplan.cli import app
from tests.conftest import REPO

README = (REPO / "README.md").read_text()
DOCS = {p: p.read_text() for p in [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]}
OPTIONS = (REPO / "docs" / "options.md").read_text()
COMMANDS = typer.main.get_group(app).commands  # name -> click command, as --help shows them


def test_every_command_is_in_the_readme():
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert len(names) == 7
    missing = [n for n in names if f"kvplan {n}" not in README]
    assert not missing, f"document these commands in README.md: {missing}"


def test_readme_has_the_two_setup_commands_and_ci_runs_the_second():
    assert "pip install . && kvplan estimate meta-llama/Llama-2-7b --seq 32768 --batch 16" in README
    test_command = "pip install -e '.[test]' && python -m pytest"
    assert test_command in README
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_readme_is_under_20_kb():
    assert len(README.encode()) < 20_000, "move detail from README.md into docs/"


def _command_section(name: str) -> str:
    match = re.search(rf"^## kvplan {name}\n(.*?)(?=^## |\Z)", OPTIONS, re.S | re.M)
    assert match, f"docs/options.md has no '## kvplan {name}' section"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_is_in_docs_options(name):
    # Each option, under every spelling --help shows (aliases, short forms, --no- forms), in its command's section.
    text = _command_section(name)
    spellings = [o for p in COMMANDS[name].params if p.param_type_name == "option"
                 for o in (*p.opts, *p.secondary_opts) if o != "--help"]
    assert spellings or name == "gpus"
    missing = [o for o in spellings if not re.search(rf"`{re.escape(o)}`", text)]
    assert not missing, f"document these options of kvplan {name} in docs/options.md: {missing}"


def test_every_console_block_is_a_kvplan_session():
    # The regenerating script only sees ```console blocks that start with `$ kvplan`; anything else would be
    # pasted text that no test keeps true.
    sys.path.insert(0, str(REPO / "scripts"))
    import readme_sessions

    for path, text in DOCS.items():
        assert text.count("```console") == len(readme_sessions.sessions(text)), path
    assert sum(len(readme_sessions.sessions(t)) for t in DOCS.values()) >= 25


@pytest.mark.slow
def test_doc_sessions_are_real_output():
    # Each ```console block in README.md and docs/ holds a command and what it prints today, at 80 columns.
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "readme_sessions.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + "\nrun: python scripts/readme_sessions.py"


def test_the_readme_python_api_runs(monkeypatch):
    # The five lines under "Python API", run as written (offline: the model is in the bundled library).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = re.search(r"## Python API\n\n```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 6
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    fits, max_requests, tokens = out.getvalue().split()
    # Llama-3.1-8B on one H100 at 8,192 tokens on the current release (Model Runner V2, a cold compile cache, V2's
    # sampler state, cuBLAS handles in the baseline): 28,318 blocks of 16 tokens, 28,318 / 512 x 8,192 = 453,088
    # KV tokens, 55 whole requests of 512 blocks beside the null block (the estimate recipe's figures).
    assert (fits, int(max_requests), int(tokens)) == ("True", 55, 453_088)


LEFTOVERS = ("design card", "design-card", "../shared", "No GPU was available", "rev: v0.1.0")


@pytest.mark.parametrize("leftover", LEFTOVERS)
def test_no_internal_leftovers(leftover):
    found = [p.relative_to(REPO).as_posix() for p, text in DOCS.items() if leftover.lower() in text.lower()]
    assert not found, f"{leftover!r} in {found}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_resolves():
    for path, text in DOCS.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://")):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.name}: link to {target}"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", dest.read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, f"{path.name}: no heading for #{anchor} in {dest.name}"


def test_every_docs_page_is_linked_from_the_readme():
    for page in (REPO / "docs").glob("*.md"):
        assert f"docs/{page.name}" in README, f"link docs/{page.name} from README.md"


# --- figures quoted from elsewhere -------------------------------------------------------------------------------

RESULTS = (REPO / "benchmarks" / "results" / "vllm_accuracy.md").read_text()


def _results_rows() -> dict[tuple[str, str], list[str]]:
    """(split, group) -> cells of the 'By GPU' and 'By release' tables of the committed accuracy results."""
    rows = {}
    for title in ("By GPU", "By release"):
        table = RESULTS.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
        for line in table.splitlines():
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cells[0] in ("fit", "holdout"):
                rows[(cells[0], cells[1])] = cells
    return rows


def test_the_readme_accuracy_tables_are_the_benchmark_results():
    # README cells: split | group | logs | available KV memory "mean / worst" | verdict right. Results cells:
    # split | group | logs | available KV (B) "mean / worst (n)" | ... | verdict right.
    rows = _results_rows()
    accuracy = README.split("## Accuracy", 1)[1].split("\n## ", 1)[0]
    quoted = [[c.strip() for c in line.strip("|").split("|")] for line in accuracy.splitlines()
              if line.startswith(("| fit ", "| holdout "))]
    assert len(quoted) >= 15
    for split, group, logs, kv, verdict in quoted:
        row = rows[(split, group)]
        assert (logs, verdict) == (row[2], row[-1]), group
        assert row[3].startswith(kv + " ("), f"{group}: README says {kv}, the results {row[3]}"


def test_the_accuracy_page_quotes_the_results_verbatim():
    text = (REPO / "docs" / "accuracy.md").read_text()
    # Every table row of the split tables and of the targets table ("| available KV memory MAE <= 3% | ...").
    quoted = [line for line in text.splitlines()
              if line.startswith(("| fit |", "| holdout |", "| available KV", "| KV tokens MAE", "| every logged"))]
    assert len(quoted) >= 30
    missing = [line for line in quoted if line not in RESULTS]
    assert not missing, f"rerun the copy from benchmarks/results/vllm_accuracy.md: {missing[:2]}"


def test_the_check_page_names_every_format_and_every_ignored_flag():
    text = (REPO / "docs" / "check.md").read_text()
    for fmt in FORMATS:
        assert f"| `{fmt.name}` |" in text, f"add format {fmt.name} to docs/check.md"
    for engine, flags in _UNMODELLED.items():
        for flag in flags:
            assert f"`--{flag}`" in text, f"docs/check.md: name {engine}'s ignored flag --{flag}"


def test_the_example_profile_is_what_calibrate_saves(tmp_path):
    saved = tmp_path / "box.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", "calibrate", "tests/data/logs/vllm-0.19-h100-codellama-7b.log",
         "--save", str(saved), "--offline"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr
    example = REPO / "docs" / "examples" / "box-h100-vllm-0.19.json"
    assert json.loads(saved.read_text()) == json.loads(example.read_text())
    shown = re.search(r"```json\n(.*?)```", (REPO / "docs" / "calibrate.md").read_text(), re.S).group(1)
    assert json.loads(shown) == json.loads(example.read_text())


@pytest.mark.slow
@pytest.mark.torch
def test_the_pasted_verify_byte_table_is_what_verify_measures():
    # docs/verify.md pastes a CPU run (its timings vary); its predicted-vs-measured table must be today's.
    text = (REPO / "docs" / "verify.md").read_text()
    block = re.search(r"```text\n\$ (kvplan verify [^\n]+)\n(.*?)```", text, re.S)
    command, shown = block.group(1), block.group(2)
    done = subprocess.run(
        [sys.executable, "-m", "kvplan", *command.split()[1:]], capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    assert shown.splitlines() == printed[: len(shown.splitlines())]


@pytest.mark.parametrize(
    ("case", "label"),
    [
        ("llama-3.1-8b-32k-x16", "Llama-3.1-8B 32,768 x 16, contiguous"),
        ("deepseek-v2-lite-mla-32k-x16", "DeepSeek-V2-Lite (MLA) 32,768 x 16"),
        ("gpt-oss-20b-sliding-16k-x16", "gpt-oss-20b 16,384 x 16, paged"),
    ],
)
def test_the_h200_verify_table_is_the_saved_gpu_run(case, label):
    # docs/verify.md's H200 table restates benchmarks/results/gpu/<case>.json: bytes, step, bandwidth.
    run = json.loads((REPO / "benchmarks" / "results" / "gpu" / f"{case}.json").read_text())
    rank = run["ranks"][0]
    dec = rank["decode"]
    assert rank["predicted_bytes"] == rank["measured_bytes"] and run["passed"]
    row = (
        f"| {label} | {rank['predicted_bytes']:,} | passed | {dec['step_seconds'] * 1e3:.1f} ms | "
        f"{dec['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s | {rank['decode_bandwidth_vs_copy']:.0%} |"
    )
    assert row in (REPO / "docs" / "verify.md").read_text()
