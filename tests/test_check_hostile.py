"""Hostile deployment files end in a one-line DeploymentError with file:line, fast and in bounded memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvplan.check import loader
from kvplan.check.files import load_requests
from kvplan.check.loader import MAX_FILE_BYTES, load_documents
from kvplan.errors import DeploymentError

# Nine aliases nine levels deep: 9**9 = 387,420,489 strings if expanded.
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def refused(path: Path, text: str | bytes) -> str:
    """The file is refused after bounded work: no more YAML nodes expanded than the loader's budget (a count,
    not a clock: a busy CI machine must not fail it)."""
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    expanded = [0]
    real = loader._to_python

    def counting(*args, **kwargs):
        expanded[0] += 1
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(DeploymentError) as info:
        patch.setattr(loader, "_to_python", counting)
        load_documents(str(path))
    assert expanded[0] <= loader.MAX_NODES + 1
    message = info.value.message
    assert "\n" not in message and message.startswith(str(path))
    return message


def test_billion_laughs(tmp_path: Path) -> None:
    message = refused(tmp_path / "bomb.yaml", BILLION_LAUGHS)
    assert "alias" in message


def test_many_aliases(tmp_path: Path) -> None:
    text = "a: &a x\nb: [" + ", ".join(["*a"] * 5000) + "]\n"
    assert "more than 1000 YAML aliases" in refused(tmp_path / "aliases.yaml", text)


def test_recursive_alias(tmp_path: Path) -> None:
    assert "recursive alias" in refused(tmp_path / "loop.yaml", "a: &a [*a]\n")


def test_fifty_megabytes(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as handle:
        handle.truncate(50 * 10**6)  # sparse: 50 MB of NULs without writing them
    read = [0]
    real_read = os.read

    def counting_read(fd, n):
        read[0] += n
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", counting_read)
    with pytest.raises(DeploymentError) as info:
        load_documents(str(path))
    assert read[0] == 0  # refused by its size before a byte is read
    assert info.value.message == (
        f"{path}: is 50,000,000 bytes; kvplan reads deployment files of up to {MAX_FILE_BYTES // 2**20} MiB"
    )


@pytest.mark.parametrize(
    "tag", ["!!python/object/apply:os.system ['echo hi']", "!Ref Something", "!!python/name:os.system"]
)
def test_unknown_tags(tmp_path: Path, tag: str) -> None:
    message = refused(tmp_path / "tag.yaml", f"ok: 1\nbad: {tag}\n")
    assert message.startswith(f"{tmp_path / 'tag.yaml'}:2: unknown YAML tag")


def test_tagged_mapping(tmp_path: Path) -> None:
    assert "unknown YAML tag" in refused(tmp_path / "t.yaml", "a: !!python/object:builtins.dict {x: 1}\n")


def test_binary_garbage(tmp_path: Path) -> None:
    message = refused(tmp_path / "blob.yaml", b"kind: Pod\nspec:\n  \xff\xfe\x00\x01garbage\n")
    assert message.startswith(f"{tmp_path / 'blob.yaml'}:3: not UTF-8")


def test_control_characters(tmp_path: Path) -> None:
    message = refused(tmp_path / "ctl.yaml", "a: 1\nb: \x00\x07\n")
    assert message.startswith(f"{tmp_path / 'ctl.yaml'}:2: control character U+0000")


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    message = refused(tmp_path / "bad.yaml", "apiVersion: v1\nkind: Pod\nspec:\n  containers: [a, b\n  x: y\n")
    assert ": invalid YAML: " in message and message.startswith(f"{tmp_path / 'bad.yaml'}:")


def test_deep_nesting(tmp_path: Path) -> None:
    assert "nested deeper" in refused(tmp_path / "deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")


def test_too_many_documents(tmp_path: Path) -> None:
    assert "more than 1000 YAML documents" in refused(tmp_path / "docs.yaml", "a: 1\n---\n" * 1500)


def test_failures_become_results_not_tracebacks(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(BILLION_LAUGHS)
    good = Path(__file__).parent / "fixtures" / "deploy" / "sglang.yaml"
    requests, (failure,) = load_requests([str(tmp_path / "bomb.yaml"), str(good)])
    assert len(requests) == 1 and failure.verdict == "cannot_evaluate"
    assert failure.request.location.file == str(tmp_path / "bomb.yaml")
