"""Renderers and exit codes of `kvplan check`: JSON parses, GitHub annotations are well formed, JUnit is valid XML."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET

from rich.console import Console

from kvplan.check.model import CheckResult, DeploymentRequest, Location, Unresolved
from kvplan.check.report import exit_code, render_github, render_human, render_json, render_junit

GiB = 2**30


def request(name: str = "chat", **kwargs) -> DeploymentRequest:
    defaults = dict(
        location=Location("deploy/k8s.yaml", 12),
        name=name,
        source_format="k8s",
        engine="vllm",
        model="meta-llama/Llama-3.1-8B-Instruct",
        gpu="H100-80GB",
        gpu_source="annotation kvplan.io/gpu",
        num_gpus=1,
        max_model_len=8192,
        max_num_seqs=64,
    )
    defaults.update(kwargs)
    return DeploymentRequest(**defaults)


def fits(margin: float = 0.25, **kwargs) -> CheckResult:
    return CheckResult(
        request(**kwargs),
        "fits",
        kv_needed_bytes=4 * GiB,
        kv_available_bytes=40 * GiB,
        max_concurrency=80.5,
        margin=margin,
    )


def does_not_fit(**kwargs) -> CheckResult:
    return CheckResult(
        request(name="huge", **kwargs),
        "does_not_fit",
        kv_needed_bytes=64 * GiB,
        kv_available_bytes=20 * GiB,
        max_concurrency=0.31,
        margin=-2.2,
        reason="To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (5.00 GiB)",
        fix="--max-model-len 40960, or --kv-cache-dtype fp8",
    )


def cannot() -> CheckResult:
    req = request(
        name='odd <&> "x"',
        gpu=None,
        unresolved=(Unresolved("gpu", "no GPU type in the manifest", "add annotation kvplan.io/gpu: H100-80GB"),),
    )
    return CheckResult(req, "cannot_evaluate")


def test_exit_codes_and_precedence() -> None:
    assert exit_code([fits()]) == 0
    assert exit_code([fits(), cannot()]) == 0  # a warning: evaluated deployments fit
    assert exit_code([fits(), cannot()], strict=True) == 2  # --strict: cannot evaluate fails the job
    assert exit_code([cannot()]) == 2  # nothing evaluated
    assert exit_code([cannot()], allow_empty=True) == 0
    assert exit_code([fits(), does_not_fit()]) == 1
    assert exit_code([cannot(), does_not_fit()]) == 1  # a definite "no" wins over "could not evaluate"
    assert exit_code([fits(margin=0.05)], min_margin=0.1) == 1
    assert exit_code([fits(margin=0.05, min_margin=0.1)]) == 1  # the file's own required margin
    assert exit_code([fits(margin=0.15, min_margin=0.1)], min_margin=0.2) == 1  # the stricter one applies
    assert exit_code([]) == 2  # an empty run never passes silently
    assert exit_code([], allow_empty=True) == 0


def test_json_parses_and_carries_figures() -> None:
    payload = json.loads(render_json([fits(), does_not_fit(), cannot()], min_margin=0.3))
    first, second, third = payload["results"]
    assert (first["file"], first["line"], first["kv_needed_bytes"], first["meets_min_margin"]) == (
        "deploy/k8s.yaml",
        12,
        4 * GiB,
        False,
    )
    assert second["verdict"] == "does_not_fit" and second["fix"].startswith("--max-model-len")
    assert third["unresolved"] == [
        {
            "field": "gpu",
            "reason": "no GPU type in the manifest",
            "how_to_fix": "add annotation kvplan.io/gpu: H100-80GB",
            "line": None,
        }
    ]
    assert payload["summary"] == {
        "fits": 1,
        "does_not_fit": 1,
        "cannot_evaluate": 1,
        "below_min_margin": 1,
        "files_skipped": 0,
    }
    assert payload["exit_code"] == 1 and payload["exit_reason"] == "2 deployments do not fit or miss their margin"


GITHUB_LINE = re.compile(r"^::(error|warning|notice) file=([^,:]+),line=(\d+),title=([^:]*)::(.+)$")


def test_github_annotations() -> None:
    text = render_github([fits(), does_not_fit(), cannot()])
    *lines, summary = text.splitlines()
    assert summary == (
        "kvplan check: 0 files, 3 deployments: 1 fit, 1 do not fit, 1 cannot evaluate; "
        "exit 1: 1 deployment does not fit"
    )
    assert len(lines) == 3
    parsed = [GITHUB_LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [m.group(1) for m in parsed] == ["notice", "error", "warning"]
    assert parsed[1].group(2) == "deploy/k8s.yaml" and parsed[1].group(3) == "12"
    assert parsed[1].group(4) == "kvplan%3A huge does not fit"  # ':' escaped in a property
    assert "Fix: --max-model-len 40960%2C" not in parsed[1].group(5)  # ',' is only escaped in properties
    assert "Fix: --max-model-len 40960, or --kv-cache-dtype fp8" in parsed[1].group(5)


def test_github_escapes_newlines_and_percent() -> None:
    result = CheckResult(request(name="a,b"), "does_not_fit", reason="100% full\nsecond line")
    line, _summary = render_github([result]).splitlines()
    assert "100%25 full%0Asecond line" in line and "title=kvplan%3A a%2Cb does not fit" in line


def test_junit_is_valid_xml() -> None:
    text = render_junit([fits(), does_not_fit(), cannot()])
    root = ET.fromstring(text.split("?>", 1)[1])
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert cases[0].find("failure") is None and cases[0].find("error") is None
    assert cases[1].find("failure").get("type") == "does_not_fit"
    error = cases[2].find("error")
    assert cases[2].get("name") == 'odd <&> "x" (deploy/k8s.yaml:12)'  # escaped on the way out, intact on the way in
    assert "kvplan.io/gpu" in error.text


def test_junit_strips_control_characters() -> None:
    result = CheckResult(request(name="bad\x01name"), "does_not_fit", reason="x\x1by")
    root = ET.fromstring(render_junit([result]).split("?>", 1)[1])
    # Replaced by a visible escape (XML 1.0 forbids U+0001; a reader still sees something was there).
    assert root.find("testsuite/testcase").get("name").startswith("bad\\x01name")


def test_human_report() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    render_human([fits(), does_not_fit(), cannot()], console)
    text = out.getvalue()
    assert "deploy/k8s.yaml:12" in text and "does not fit" in text and "cannot evaluate" in text
    assert "KV 4.00 GiB needed of 40.00 GiB, margin 25.0%" in text
    assert 'odd <&> "x"' in text and "Fix: add annotation kvplan.io/gpu:" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_human_report_never_cuts_a_path() -> None:
    # A path longer than the line stands alone on its line instead of being folded into pieces.
    long_path = "deploy/" + "very-long-directory-name/" * 4 + "k8s.yaml"
    out = io.StringIO()
    render_human([fits(location=Location(long_path, 7))], Console(file=out, width=60, color_system=None))
    assert f"{long_path}:7" in out.getvalue()
