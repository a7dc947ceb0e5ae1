"""`kvplan check` against hostile trees: one bad file or deployment never hides the others, in any format; no CI
log injection; never fails open (empty or partly unreadable trees); untrusted names never touch the CWD."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvplan.check.files import load_requests
from kvplan.check.loader import load_documents
from kvplan.errors import DeploymentError
from tests.conftest import REPO, run_cli
from tests.deadline import deadline

FORMATS = ("human", "json", "github", "junit")
GOOD = """kvplan: 1
name: good
model: meta-llama/Llama-3.1-8B-Instruct
gpu: H100-80GB
max_model_len: 8192
"""
# The verdict line of GOOD in each format, to prove it is still reported next to a hostile file.
GOOD_SEEN = {
    "human": "    good: meta-llama/Llama-3.1-8B-Instruct",  # the second line of its block
    "json": '"name": "good"',
    "github": "::notice file=",
    "junit": 'name="good (',
}
GH_COMMAND = re.compile(r"^::(notice|warning|error) file=[^:\n]*,line=\d+,title=[^:\n]*::[^\n]*$")
CI_ANYWHERE = re.compile(r"##(\[|vso\[|teamcity\[)")


def deployment(name: str, model: str = "meta-llama/Llama-3.1-8B-Instruct", extra: str = "") -> str:
    return f"kvplan: 1\nname: {json.dumps(name)}\nmodel: {json.dumps(model)}\ngpu: H100-80GB\n{extra}"


def check(runner, *args: str):
    return run_cli(runner, "check", *args)


def assert_ci_safe(output: str, fmt: str, results: int) -> None:
    """No line a CI system would run, but kvplan's own annotations (exactly one per result in github)."""
    commands = [line for line in output.splitlines() if line.lstrip().startswith("::")]
    if fmt == "github":
        assert len(commands) == results and all(GH_COMMAND.match(line) for line in commands), commands
    else:
        assert commands == []
    assert not CI_ANYWHERE.search(output)
    if fmt == "junit":
        ET.fromstring(output.split("?>", 1)[1])
    if fmt == "json":
        assert len(json.loads(output)["results"]) == results


HOSTILE_FILES = {
    # A 5000-digit integer is beyond Python's int() limit: the loader refuses it at its line.
    "huge_int": deployment("h", extra="max_model_len: " + "9" * 5000 + "\n"),
    # 309 digits overflow a float deep in the evaluation; the loader bounds integers to 64 bits instead.
    "len_309": deployment("l", extra="max_model_len: 1" + "0" * 308 + "\n"),
    # A bare 256-character name: longer than a file name may be (ENAMETOOLONG), and in no library.
    "long_name": deployment("n", model="m" * 256),
    # Lone surrogates from YAML escapes, in the name and the model.
    "surrogate": 'kvplan: 1\nname: "x\\ud800y"\nmodel: "org/m\\udcff"\ngpu: H100-80GB\n',
    # Workflow-command injection through names, as the issue found.
    "inject": deployment("x\n::error file=a.py,line=1::INJECTED"),
    "stop": deployment("\n::stop-commands::t0k3n"),
    "azure": deployment("##vso[task.setvariable variable=x]1 ##[error]x ##teamcity[x]"),
    "controls": deployment("\x1b]8;;http://evil\x07\x00\x7f\u202e"),
    # XML 1.0 forbids U+FFFE and U+FFFF: JUnit used to be invalid XML with them.
    "xml_nonchars": deployment("a\ufffeb\uffffc"),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", sorted(HOSTILE_FILES))
def test_a_hostile_file_never_hides_the_others(runner, tmp_path: Path, case: str, fmt: str) -> None:
    (tmp_path / "a-hostile.yaml").write_text(HOSTILE_FILES[case], encoding="utf-8")
    (tmp_path / "b-good.yaml").write_text(GOOD)
    with deadline(30):
        result = check(runner, str(tmp_path), "--format", fmt)
    assert "internal error" not in result.output and "Traceback" not in result.output
    assert GOOD_SEEN[fmt] in result.stdout
    assert_ci_safe(result.stdout, fmt, results=2)
    assert result.exit_code in (0, 2)


def test_an_unexpected_failure_in_one_deployment_is_that_deployments_result(runner, tmp_path, monkeypatch) -> None:
    import kvplan.check.evaluate as evaluate

    real = evaluate.resolve_model

    def resolve(model: str, **kwargs):
        if model == "org/boom":
            raise RuntimeError("an unmapped failure deep inside")
        return real(model, **kwargs)

    monkeypatch.setattr(evaluate, "resolve_model", resolve)
    (tmp_path / "a.yaml").write_text(deployment("boom", model="org/boom"))
    (tmp_path / "b.yaml").write_text(GOOD)
    for fmt in FORMATS:
        result = check(runner, str(tmp_path), "--format", fmt)
        assert result.exit_code == 2 and GOOD_SEEN[fmt] in result.stdout
        assert "RuntimeError: an unmapped failure deep inside" in " ".join(result.stdout.split())
    data = json.loads(check(runner, str(tmp_path), "--format", "json").stdout)
    assert [r["verdict"] for r in data["results"]] == ["cannot_evaluate", "fits"]


def test_fifos_are_refused_without_blocking(runner, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / "good.yaml").write_text(GOOD)
    with deadline(30):
        walked = check(runner, str(tmp_path), "--format", "json")
        named = check(runner, str(tmp_path / "pipe.yaml"), "--format", "json")
    reasons = [r["reason"] for r in json.loads(walked.stdout)["results"]]
    assert reasons == [f"{tmp_path / 'pipe.yaml'}: is a FIFO, not a regular file", None]
    assert named.exit_code == 2


def test_bare_model_names_never_touch_the_current_directory(runner, tmp_path, monkeypatch) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "localmodel").mkdir(parents=True)
    (cwd / "localmodel" / "config.json").write_text("{}")  # would fail to parse if read
    os.mkfifo(cwd / "llama")  # would block if opened
    monkeypatch.chdir(cwd)
    (tmp_path / "d.yaml").write_text(
        "kvplan: 1\ndeployments:\n"
        "  - {name: fifo, model: llama, gpu: H100-80GB}\n"
        "  - {name: planted, model: localmodel, gpu: H100-80GB}\n"
    )
    with deadline(30):
        data = json.loads(check(runner, str(tmp_path / "d.yaml"), "--format", "json").stdout)
    fifo, planted = (r["reason"] for r in data["results"])
    assert "'llama' is not in the bundled library" in fifo
    assert "'localmodel' is not in the bundled library" in planted


def test_resolve_reads_untrusted_names_as_paths_only_when_written_as_paths(tmp_path, monkeypatch) -> None:
    from kvplan.errors import ConfigError, ModelNotFoundError
    from kvplan.sources.resolve import resolve_model

    (tmp_path / "localmodel").mkdir()
    (tmp_path / "localmodel" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="'localmodel' is not in the bundled library"):
        resolve_model("localmodel", explicit_paths_only=True)
    for written in ("./localmodel", str(tmp_path / "localmodel")):  # read, as a path: {} has no hidden_size
        with pytest.raises(ConfigError, match="hidden_size"):
            resolve_model(written, explicit_paths_only=True)
    with pytest.raises(ConfigError, match="hidden_size"):  # on the command line a bare name may be a directory
        resolve_model("localmodel")


def test_symlinks_out_of_the_tree_are_not_followed(runner, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.yaml").write_text(GOOD)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "good.yaml").write_text(GOOD)
    (tree / "shadow.yaml").symlink_to(outside / "secret.yaml")
    (tree / "elsewhere").symlink_to(outside, target_is_directory=True)
    (tree / "alias.yaml").symlink_to(tree / "good.yaml")  # inside the tree: read
    data = json.loads(check(runner, str(tree), "--format", "json").stdout)
    assert [(Path(r["file"]).name, r["verdict"]) for r in data["results"]] == [
        ("elsewhere", "cannot_evaluate"), ("shadow.yaml", "cannot_evaluate"), ("alias.yaml", "fits"),
        ("good.yaml", "fits"),
    ]
    assert data["results"][1]["reason"] == f"{tree / 'shadow.yaml'}: a symlink to {outside / 'secret.yaml'}, " \
        f"outside {tree}; not followed"
    followed = json.loads(check(runner, str(tree), "--format", "json", "--follow-symlinks").stdout)
    assert [r["verdict"] for r in followed["results"]] == ["fits"] * 4 and followed["exit_code"] == 0


def test_symlink_loops_end_under_follow_symlinks(runner, tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    with deadline(30):
        result = check(runner, str(tmp_path), "--format", "json", "--follow-symlinks")
    assert [r["verdict"] for r in json.loads(result.stdout)["results"]] == ["fits"]


def test_duplicate_keys_name_the_key_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("kvplan: 1\nname: a\nmodel: x\nname: b\n")
    with pytest.raises(DeploymentError) as caught:
        load_documents(str(path))
    assert caught.value.message == f"{path}:4: duplicate key 'name' (first at line 2); keep one of them"
    path.write_text("spec: {replicas: 1, replicas: 2}\n")  # flow style, on one line
    with pytest.raises(DeploymentError, match="duplicate key 'replicas'"):
        load_documents(str(path))
    path.write_text("base: &b {x: 1}\nuse:\n  <<: *b\n  x: 2\n")  # a merge key overridden is no duplicate
    assert load_documents(str(path))[0].data["use"]["x"] == 2


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("9" * 5000, "a number of 5,000 characters cannot be read; write a value in range"),
        ("1" + "0" * 308, "the integer 10000000000000000000... (309 digits) is beyond the 64-bit range that "
                          "Kubernetes and the engines read"),
    ],
)
def test_integers_out_of_range_are_refused_at_their_line(tmp_path: Path, value: str, problem: str) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(f"kvplan: 1\nmax_model_len: {value}\n")
    with pytest.raises(DeploymentError) as caught:
        load_documents(str(path))
    assert caught.value.message == f"{path}:2: {problem}"


def test_an_empty_tree_never_exits_0(runner, tmp_path: Path) -> None:
    result = check(runner, str(tmp_path), "--format", "json")
    assert result.exit_code == 2
    (reason,) = [r["reason"] for r in json.loads(result.stdout)["results"]]
    assert reason.startswith(f"{tmp_path}: no .yaml or .yml file in this directory")
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    assert check(runner, str(tmp_path)).exit_code == 2  # YAML, but no deployment in any of it


def test_an_unlistable_subfolder_is_named_and_fails_the_check(runner, tmp_path, monkeypatch) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden-deploy.yaml").write_text(GOOD)
    real_scandir = os.scandir

    def scandir(path=".", *args):  # what os.walk meets in a directory without read permission (even as root)
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_scandir(path, *args)

    monkeypatch.setattr(os, "scandir", scandir)
    result = check(runner, str(tmp_path), "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 2 and [r["verdict"] for r in data["results"]] == ["cannot_evaluate", "fits"]
    assert data["results"][0]["reason"] == (
        f"{locked}: cannot list this directory (Permission denied); its files were not checked"
    )


def test_non_utf8_file_names_in_every_format(runner, tmp_path: Path, monkeypatch) -> None:
    with open(os.fsencode(tmp_path) + b"/bad-\xff-name.yaml", "w") as handle:
        handle.write(GOOD)
    monkeypatch.chdir(tmp_path)  # short locations: the human table does not fold them
    for fmt in FORMATS:
        result = check(runner, ".", "--format", fmt)
        assert result.exit_code == 0, result.output
        if fmt != "json":  # shown as the byte it is (the human table may fold the name across lines)
            assert "\\xff" in result.stdout
        assert_ci_safe(result.stdout, fmt, results=1)


def test_every_format_survives_a_strict_utf8_stdout(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(HOSTILE_FILES["surrogate"])
    with open(os.fsencode(tmp_path) + b"/n-\xfe.yaml", "w") as handle:
        handle.write(GOOD)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "HF_HUB_OFFLINE": "1"}
    for fmt in FORMATS:
        done = subprocess.run([sys.executable, "-m", "kvplan", "check", str(tmp_path), "--format", fmt],
                              capture_output=True, cwd=REPO, env=env, timeout=120)
        # The surrogate-named deployment cannot be evaluated (a warning); the other file fits: exit 0.
        assert done.returncode == 0, (fmt, done.stderr)
        assert done.stderr == b"" and b"x\\ud800y" in done.stdout.replace(b"\\\\", b"\\")


def test_load_requests_isolates_an_unexpected_reader_failure(tmp_path, monkeypatch) -> None:
    import kvplan.check.files as files

    real = files.load_documents

    def load(path: str, text: str | None = None):
        if path.endswith("a.yaml"):
            raise RecursionError("maximum recursion depth exceeded")
        return real(path, text)

    monkeypatch.setattr(files, "load_documents", load)
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD)
    requests, (failure,) = load_requests([str(tmp_path)])
    assert len(requests) == 1
    assert failure.reason == (
        f"{tmp_path / 'a.yaml'}: cannot read this file (RecursionError: maximum recursion depth exceeded)"
    )
