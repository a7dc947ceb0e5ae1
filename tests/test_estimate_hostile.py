"""`kvplan estimate` on hostile local configs and names: escaped output, bounded reads, one error line, no hang."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.errors import ConfigError, ModelNotFoundError
from kvplan.sources.local_files import MAX_CONFIG_BYTES
from kvplan.sources.resolve import resolve_model
from tests.conftest import REPO, run_cli
from tests.deadline import deadline
from tests.factories import llama_config

FLAGS = ["--seq", "1024", "--gpu", "H100"]


def write_config(directory: Path, **overrides: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(llama_config(**overrides)))
    return directory


@pytest.mark.parametrize("model_type", ["[/x]", "[link=https://evil.example]click[/link]", "[bold]x"])
def test_markup_in_model_type_prints_as_typed(runner, tmp_path: Path, model_type: str) -> None:
    # [/x] used to crash rich ("closing tag doesn't match"); [link=...] used to render as a hyperlink.
    result = run_cli(runner, "estimate", str(write_config(tmp_path / "m", model_type=model_type)), *FLAGS)
    assert result.exit_code == 0, result.output
    assert f": {model_type}, 32 layers" in result.stdout  # the model line: "NAME: FAMILY, N layers"


def test_markup_in_a_directory_name_prints_as_typed(runner, tmp_path: Path) -> None:
    model = write_config(tmp_path / "[red]x[red]")
    result = run_cli(runner, "estimate", str(model), *FLAGS)
    assert result.exit_code == 0 and "\n[red]x[red]: llama, 32 layers" in result.stdout


def test_terminal_escapes_never_reach_the_terminal(runner, tmp_path: Path) -> None:
    osc_link = "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\\x07"
    result = run_cli(runner, "estimate", str(write_config(tmp_path / "m", model_type=osc_link)), *FLAGS)
    assert result.exit_code == 0
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert ": \\x1b]8;;http://evil.example\\x1b\\click" in result.stdout


def test_json_output_carries_no_ci_command_and_the_same_data(runner, tmp_path: Path) -> None:
    model = write_config(tmp_path / "##vso[task.setvariable variable=x]1")
    result = run_cli(runner, "estimate", str(model), *FLAGS, "--json")
    assert result.exit_code == 0 and "##" not in result.stdout
    assert json.loads(result.stdout)["model"]["name"] == "##vso[task.setvariable variable=x]1"


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_devices_are_refused_at_once(runner, path: str) -> None:
    # /dev/zero used to be read until MemoryError.
    with deadline(5):
        result = run_cli(runner, "estimate", path, *FLAGS)
    assert result.exit_code == 2
    assert result.stderr == f"Error: cannot read {path}: is a character device, not a regular file\n"


def test_a_fifo_is_refused_without_blocking(runner, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "config.json")  # no writer: a plain open() would wait for ever
    with deadline(5):
        by_file = run_cli(runner, "estimate", str(tmp_path / "config.json"), *FLAGS)
        by_dir = run_cli(runner, "estimate", str(tmp_path), *FLAGS)
    for result in (by_file, by_dir):
        assert result.exit_code == 2
        assert result.stderr == f"Error: cannot read {tmp_path / 'config.json'}: is a FIFO, not a regular file\n"


def test_a_one_gigabyte_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)  # sparse: 1 GiB of NULs without writing them
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with deadline(5), pytest.raises(ModelNotFoundError) as caught:
        resolve_model(str(path))
    assert caught.value.message == (
        f"cannot read {path}: is 1,073,741,824 bytes; kvplan reads files of up to {MAX_CONFIG_BYTES >> 20} MiB"
    )
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 64 * 1024  # < 64 MiB more


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe{}", "is not UTF-8 text (byte 0 is 0xff)"),
        (b"[" * 100_000, "nests its JSON deeper than kvplan reads (a corrupt or hostile file)"),
        (b'{"hidden_size": ' + b"9" * 5000 + b"}",
         "holds a number of more than 4,300 digits (a corrupt or hostile file)"),
        (b'["not", "an", "object"]', "must hold a JSON object, not a list"),
    ],
)
def test_unreadable_json_is_a_config_error(tmp_path: Path, content: bytes, problem: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        resolve_model(str(tmp_path))
    assert caught.value.message == f"config key 'config.json' in {tmp_path / 'config.json'}: {problem}"


def test_an_over_long_name_is_one_clear_error(runner) -> None:
    name = "a" * 300  # longer than NAME_MAX (255): os.stat raises ENAMETOOLONG
    result = run_cli(runner, "estimate", name, *FLAGS)
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: '{'a' * 60}...' (300 characters) is too long for a local path and is no library name or Hub "
        "repo id\n"
    )


def test_a_namesake_under_another_org_is_named_not_used(runner) -> None:
    # anyorg/Llama-3.1-8B-Instruct may be a fine-tune: offline it used to become meta-llama's config silently.
    result = run_cli(runner, "estimate", "anyorg/Llama-3.1-8B-Instruct", *FLAGS)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Error: anyorg/Llama-3.1-8B-Instruct (revision main) is not in the local cache")
    assert result.stderr.endswith(
        "; the bundled library holds meta-llama/Llama-3.1-8B-Instruct under that name: pass it if it is the same "
        "model\n"
    )


def test_strict_utf8_stdout_with_lone_surrogates(tmp_path: Path) -> None:
    # A non-UTF-8 directory name (b"\xff", a surrogate once decoded) and a "\ud800" escape in model_type.
    directory = os.fsencode(tmp_path) + b"/model-\xff"
    os.mkdir(directory)
    with open(directory + b"/config.json", "w") as handle:
        handle.write(json.dumps(llama_config(model_type="\ud800x"), ensure_ascii=True))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict", "HF_HUB_OFFLINE": "1"}
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "kvplan", "estimate", directory, *FLAGS, *extra],
            capture_output=True, cwd=REPO, env=env, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert b"Traceback" not in done.stderr and b"internal error" not in done.stderr
        if not extra:
            assert b"model-\\xff: \\ud800x, 32 layers" in done.stdout
