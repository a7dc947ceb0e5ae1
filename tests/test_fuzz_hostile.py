"""Fuzz every command and format with hostile input: configs, deployment YAML, flags, file names with control
characters, and Hub fault modes. No run may end in "internal error", hang past its deadline, print an output line
a CI system would execute, or write JUnit that does not parse."""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvplan.cli import app
from kvplan.errors import HubError
from tests.conftest import REPO
from tests.conftest_hub import route_to
from tests.deadline import deadline
from tests.hub_server import FakeHub, Fault

pytestmark = pytest.mark.slow

LLAMA = json.loads((REPO / "model_configs" / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
GH_COMMAND = re.compile(r"^::(notice|warning|error) file=[^:\n]*,line=\d+,title=[^:\n]*::[^\n]*$")
CI_ANYWHERE = re.compile(r"##(\[|vso\[|teamcity\[)")
# Each suite runs in a few seconds on two cores; `--hypothesis-seed` or a larger max_examples digs deeper.
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# Text as an attacker writes it: workflow commands, markup, terminal escapes, bidi overrides, lone surrogates.
PIECES = st.sampled_from([
    "::error file=a.py,line=1::x", "\n::stop-commands::t", "##vso[task.setvariable variable=x]1", "##[error]",
    "[/x]", "[link=https://evil.example]", "[bold]", ":smile:", "\x1b[31m", "\x1b]8;;http://e\x07", "\x00", "\x7f",
    "\u202e", "\ufffe", "\ud800", "\udcff", "%0A", "%", ",", "\r", "\t", "\\", '"', "'", "<&>", "]]>", "x" * 300,
])
HOSTILE_TEXT = st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=4).map("".join)
HOSTILE_SCALAR = st.one_of(
    HOSTILE_TEXT, st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([float("nan"), float("inf"), -1.0, 1e308, 0.5]),
)


def name_bytes(text: str) -> bytes:
    """A file name from any text: lone surrogates become the (non-UTF-8) bytes they would be, "/" and NUL "_"."""
    return text.replace("/", "_").replace("\x00", "_").encode("utf-8", "surrogatepass")[:200] or b"m"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_clean(result, fmt: str = "human", results: int | None = None) -> None:
    """No internal error, a documented exit code, and output no CI system would run."""
    assert "internal error" not in result.output and "Traceback" not in result.output, result.output[-2000:]
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output[-2000:])
    for stream, is_stdout in ((result.stdout, True), (result.stderr, False)):
        commands = [line for line in stream.splitlines() if line.lstrip().startswith("::")]
        if fmt == "github" and is_stdout:
            assert all(GH_COMMAND.match(line) for line in commands), commands
            if results is not None:
                assert len(commands) == results
        else:
            assert commands == [], commands
        assert not CI_ANYWHERE.search(stream) and "\x1b" not in stream
    if fmt == "junit" and result.exit_code in (0, 1) or fmt == "junit" and result.stdout.startswith("<?xml"):
        ET.fromstring(result.stdout.split("?>", 1)[1])
    if fmt == "json" and result.stdout.startswith("{"):
        json.loads(result.stdout)


# --- estimate: hostile configs and directory names ---------------------------------------------------------------

STRING_KEYS = ["model_type", "torch_dtype", "architectures", "rope_scaling", "quantization_config", "sliding_window",
               "layer_types", "head_dim", "num_key_value_heads", "max_position_embeddings"]


@SETTINGS
@given(
    name=HOSTILE_TEXT.filter(lambda s: s not in ("", ".", "..")),
    changes=st.dictionaries(st.sampled_from(STRING_KEYS), HOSTILE_SCALAR, max_size=3),
    json_out=st.booleans(),
)
def test_estimate_on_hostile_configs(name: str, changes: dict, json_out: bool) -> None:
    config = copy.deepcopy(LLAMA)
    config.update(changes)
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(os.fsencode(tmp), name_bytes(name))
        os.mkdir(directory)
        with open(os.path.join(directory, b"config.json"), "w") as handle:
            handle.write(json.dumps(config))
        with deadline(30):
            result = invoke("estimate", os.fsdecode(directory), "--seq", "4096", "--gpu", "H100",
                            *(["--json"] if json_out else []))
    assert_clean(result, "json" if json_out else "human")


@SETTINGS
@given(
    gpu_mem=st.one_of(
        HOSTILE_TEXT, st.from_regex(r"[0-9]{1,400}(\.[0-9]{1,40})?\s*[kKmMgGtTiIbB]{0,3}", fullmatch=True)
    ),
    kv_dtype=st.one_of(HOSTILE_TEXT, st.sampled_from(["auto", "fp8", "fp8_e5m2", "int4", "nvfp4"])),
    weights=st.one_of(st.none(), HOSTILE_TEXT, st.sampled_from(["15GiB", "1e400", "9" * 400])),
)
def test_estimate_on_hostile_flags(gpu_mem: str, kv_dtype: str, weights: str | None) -> None:
    # The lead owns the validation of --seq/--batch/--block-size/--shared-prefix/--gpu; the flags fuzzed here
    # are the sizes (kvplan.units) and the dtype names, with hostile text.
    args = ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "4096", "--gpu-mem", gpu_mem,
            "--kv-cache-dtype", kv_dtype]
    if weights is not None:
        args += ["--weights-bytes", weights]
    with deadline(30):
        result = invoke(*args)
    assert_clean(result)


# --- check: hostile YAML, names and file names, every format ------------------------------------------------------

FIELD = st.sampled_from(["name", "model", "gpu", "engine", "max_model_len", "tp", "num_gpus", "kv_cache_dtype",
                         "gpu_memory_utilization", "concurrency", "min_margin"])


@st.composite
def deployment_yaml(draw) -> str:
    """A kvplan-schema deployment with hostile values, written as YAML (json.dumps of each scalar is valid YAML,
    surrogates and control characters as \\u escapes), or a raw hostile document."""
    if draw(st.integers(0, 5)) == 0:
        return draw(st.sampled_from([
            "a: 1\na: 2\n", "x: " + "9" * 5000 + "\n", "[" * 200, "kvplan: 1\n" + "  " * 60 + "x\n", "- - - -\n",
            "kvplan: 1\ndeployments: {a: *x}\n", "kind: Deployment\napiVersion: apps/v1\nspec: [1, 2]\n", "\t\x00",
        ]))
    fields = {"kvplan": 1, "name": "d", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "H100-80GB"}
    fields.update(draw(st.dictionaries(FIELD, HOSTILE_SCALAR, max_size=3)))
    return "".join(f"{key}: {json.dumps(value, allow_nan=True)}\n" for key, value in fields.items())


FILE_NAME = HOSTILE_TEXT.map(lambda s: name_bytes(s)[:100] + b"\xff.yaml")


@SETTINGS
@given(files=st.lists(st.tuples(FILE_NAME, deployment_yaml()), min_size=1, max_size=4), fmt=st.sampled_from(
    ["human", "json", "github", "junit"]))
def test_check_on_hostile_trees(files: list[tuple[bytes, str]], fmt: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        good = os.path.join(os.fsencode(tmp), b"zz-good.yaml")
        with open(good, "w") as handle:
            handle.write("kvplan: 1\nname: good\nmodel: meta-llama/Llama-3.1-8B-Instruct\ngpu: H100-80GB\n"
                         "max_model_len: 8192\n")
        for index, (name, text) in enumerate(files):
            with open(os.path.join(os.fsencode(tmp), b"%d-" % index + name), "w", encoding="utf-8",
                      errors="surrogatepass") as handle:
                handle.write(text)
        with deadline(60):
            result = invoke("check", tmp, "--format", fmt, "--offline")
    assert_clean(result, fmt)
    if fmt == "json":
        results = json.loads(result.stdout)["results"]
        assert results[-1]["name"] == "good" and results[-1]["verdict"] == "fits"  # never hidden by the others


def test_a_skipped_file_is_annotated_at_a_line(tmp_path: Path) -> None:
    # Found by the search above: a file with no deployment got `::notice file=...` without `line=`, which
    # GitHub shows only in the run summary. A file name that is not UTF-8 must survive too.
    (tmp_path / "a.yaml").write_text("kvplan: 1\nname: good\nmodel: meta-llama/Llama-3.1-8B-Instruct\ngpu: H100-80GB\n"
                                     "max_model_len: 8192\n")
    with open(os.path.join(os.fsencode(tmp_path), b"b-\xff.yaml"), "w") as handle:
        handle.write("just: text\n")
    result = invoke("check", str(tmp_path), "--format", "github", "--offline")
    assert_clean(result, "github", results=2)
    assert "skipped" in result.stdout


# --- the Hub: fault modes -------------------------------------------------------------------------------------------

FAULTS = st.builds(
    Fault,
    mode=st.sampled_from(["status", "hang", "drip", "truncate", "no_hub_headers", "redirect_loop", "huge",
                          "ignore_range"]),
    methods=st.sampled_from([("HEAD", "GET"), ("GET",), ("HEAD",)]),
    status=st.sampled_from([401, 403, 404, 408, 429, 500, 502, 503, 504]),
    interval_s=st.sampled_from([0.05, 0.3]),
    announce_length=st.booleans(),
    times=st.sampled_from([None, 1, 2]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(fault=FAULTS, repo=st.sampled_from(["meta-llama/Llama-3.1-8B-Instruct", "org/private-model"]))
def test_hub_fault_modes(fault: Fault, repo: str) -> None:
    from kvplan.sources.resolve import resolve_model

    with tempfile.TemporaryDirectory() as tmp, FakeHub() as fake, pytest.MonkeyPatch.context() as patch:
        route_to(fake, Path(tmp), patch)
        patch.setenv("KVPLAN_HUB_TIMEOUT", "1")
        fake.add_repo(repo, {"config.json": LLAMA})
        fake.fault = fault
        started = time.monotonic()
        with deadline(20):
            try:
                resolved = resolve_model(repo, refresh=True)
            except HubError as exc:
                assert repo == "org/private-model" and "\n" not in exc.message
            else:
                assert len(resolved.notices) <= 1
        assert time.monotonic() - started < 6
        assert fake.requests  # the fault was met on the fake Hub (never the internet)


# --- models, gpus and verify: hostile filters, flags and model directories ----------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(name=st.one_of(st.none(), HOSTILE_TEXT), family=st.one_of(st.none(), HOSTILE_TEXT),
       kind=st.one_of(st.none(), HOSTILE_TEXT), json_out=st.booleans())
def test_models_and_gpus_on_hostile_filters(name, family, kind, json_out) -> None:
    args = ["models"] + ([name] if name is not None else []) + (["--family", family] if family is not None else [])
    args += (["--kind", kind] if kind is not None else []) + (["--json"] if json_out else [])
    with deadline(30):
        assert_clean(invoke(*args), "json" if json_out else "human")
        assert_clean(invoke("gpus", *(["--json"] if json_out else [])), "json" if json_out else "human")


TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 256,
        "torch_dtype": "float32"}


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(name=HOSTILE_TEXT.filter(lambda s: s not in ("", ".", "..")), model_type=HOSTILE_TEXT,
       gpu_mem=st.one_of(st.none(), HOSTILE_TEXT, st.sampled_from(["1KiB", "9" * 400])),
       layout=st.one_of(st.sampled_from(["paged", "contiguous"]), HOSTILE_TEXT),
       device=st.one_of(st.just("cpu"), HOSTILE_TEXT), json_out=st.booleans())
def test_verify_on_hostile_models_and_flags(name, model_type, gpu_mem, layout, device, json_out) -> None:
    pytest.importorskip("torch")
    with tempfile.TemporaryDirectory() as tmp:
        directory = os.path.join(os.fsencode(tmp), name_bytes(name))
        os.mkdir(directory)
        with open(os.path.join(directory, b"config.json"), "w") as handle:
            handle.write(json.dumps({**TINY, "model_type": model_type}))
        args = ["verify", os.fsdecode(directory), "--seq", "20", "--steps", "2", "--layout", layout, "--device", device]
        args += (["--gpu-mem", gpu_mem] if gpu_mem is not None else []) + (["--json"] if json_out else [])
        with deadline(60):
            result = invoke(*args)
    assert_clean(result, "json" if json_out else "human")
