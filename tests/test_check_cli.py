"""`kvplan check` never passes silently: every file in the report, empty runs fail, --strict, CI output, stdin."""

from __future__ import annotations

import json
import os
import re

from kvplan.hardware.gpus import find_gpu
from tests.conftest import REPO, run_cli

DATA = REPO / "tests" / "data" / "deploy"
FIXTURES = REPO / "tests" / "fixtures"
HELM_TEMPLATE = """---
# Source: qwen/templates/service.yaml
apiVersion: v1
kind: Service
metadata:
  name: qwen
---
# Source: qwen/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: qwen
spec:
  template:
    spec:
      nodeSelector:
        nvidia.com/gpu.product: NVIDIA-L4
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.10.1
          args: ["--model", "Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "8192"]
          resources:
            limits:
              nvidia.com/gpu: 1
"""


def invoke(runner, *args: str, **kwargs):
    from kvplan.cli import app

    return runner.invoke(app, list(args), **kwargs)


def test_folder_of_foreign_and_unreadable_files_fails_and_names_every_file(runner, tmp_path):
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n")
    (tmp_path / "ci.yml").write_text("on: [push]\njobs: {test: {runs-on: ubuntu-latest}}\n")
    (tmp_path / "broken.yaml").write_text("a: [1, 2\n")
    (tmp_path / "blob.yaml").write_bytes(b"\x00\x01\x02")
    result = run_cli(runner, "check", str(tmp_path), "--offline")
    assert result.exit_code == 2
    for name in ("svc.yaml", "ci.yml", "broken.yaml", "blob.yaml"):
        assert name in result.stdout
    assert "Service/web" in result.stdout  # what a skipped file holds instead
    summary = result.stdout.strip().splitlines()[-1]
    assert "exit 2" in result.stdout.replace("\n  ", " ") and summary


def test_only_foreign_files_fail_unless_allow_empty(runner, tmp_path):
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n")
    result = run_cli(runner, "check", str(tmp_path), "--offline", "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 2 and data["exit_reason"] == "no deployment found (--allow-empty to pass)"
    assert data["files"] == [{"file": str(tmp_path / "svc.yaml"), "deployments": 0,
                              "skipped": "no deployment kvplan reads: Service/web", "error": None}]
    assert run_cli(runner, "check", str(tmp_path), "--offline", "--allow-empty").exit_code == 0


def test_strict_turns_cannot_evaluate_into_a_failure(runner):
    mixed = (str(FIXTURES / "check" / "vllm-h100-fits.yaml"), str(FIXTURES / "deploy" / "missing-gpu.yaml"))
    relaxed = run_cli(runner, "check", *mixed, "--offline", "--format", "github")
    assert relaxed.exit_code == 0
    assert relaxed.stdout.count("::warning ") == 1 and "::error" not in relaxed.stdout
    strict = run_cli(runner, "check", *mixed, "--offline", "--format", "github", "--strict")
    assert strict.exit_code == 2
    assert strict.stdout.count("::error ") == 1  # the annotation level matches what fails the job
    assert strict.stdout.strip().splitlines()[-1].endswith("exit 2: --strict and 1 deployment could not be evaluated")


def test_cannot_evaluate_lists_every_blocker(runner):
    result = run_cli(runner, "check", str(REPO / "tests" / "data" / "reference-deploy" / "lws-sglang-llama8b-tp2.yaml"),
                     "--offline", "--format", "json")
    (r,) = json.loads(result.stdout)["results"]
    assert r["verdict"] == "cannot_evaluate" and [u["field"] for u in r["unresolved"]] == ["gpu"]
    assert r["pods_per_instance"] == 2  # --nnodes $(LWS_GROUP_SIZE): the LWS controller sets it to the size


def test_github_summary_line_gives_counts_reason_and_skipped_files(runner):
    result = run_cli(runner, "check", str(FIXTURES / "deploy" / "dir"), "--offline", "--format", "github")
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"^kvplan check: 3 files, 2 deployments: \d fit, \d do not fit, \d cannot evaluate; exit \d: ",
                    summary), summary
    assert summary.endswith(f"skipped 1 file without deployments: {FIXTURES / 'deploy' / 'dir' / 'svc.yaml'}")


def test_human_output_fits_80_columns_and_keeps_paths_whole(runner):
    result = invoke(runner, "check", str(DATA), "--offline", env={"COLUMNS": "80"})
    path = os.path.relpath(DATA / "k8s-shell-args.yaml")
    assert f"{path}:15" in result.stdout  # a path is never folded into pieces
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_stdin_documents_are_named_by_helm_source(runner):
    result = invoke(runner, "check", "-", "--offline", "--format", "json", input=HELM_TEMPLATE)
    (r,) = json.loads(result.stdout)["results"]
    assert (r["file"], r["document"]) == ("<stdin>", "qwen/templates/deployment.yaml")
    assert r["model"] == "Qwen/Qwen2.5-7B-Instruct"
    github = invoke(runner, "check", "-", "--offline", "--format", "github", input=HELM_TEMPLATE)
    first = github.stdout.splitlines()[0]
    assert first.startswith("::notice title=") and "<stdin>:" in first and "qwen/templates/deployment.yaml" in first


def test_gpu_mem_must_be_a_size(runner):
    result = run_cli(runner, "check", str(DATA / "compose-gpus.yaml"), "--gpu-mem", "lots")
    assert result.exit_code == 2 and "Error: " in result.output and "--gpu-mem" in result.output


def test_cloud_names_resolve_to_catalog_gpus():
    assert find_gpu("Standard_ND96isr_H100_v5").key == "H100-80GB"  # Azure ND H100 v5
    assert find_gpu("Standard_NC24ads_A100_v4").key == "A100-80GB-PCIE"
    assert find_gpu("a3-megagpu-8g").key == "H100-80GB"  # GCP A3 Mega
    assert find_gpu("a2-highgpu-4g").key == "A100-40GB"
    assert find_gpu("g2-standard-24").key == "L4"
    assert find_gpu("p5en.48xlarge").key == "H200" and find_gpu("p4de").key == "A100-80GB"  # Karpenter family
    assert find_gpu("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition").key == "RTX-PRO-6000"
    assert (find_gpu("NVIDIA-H800").key, find_gpu("nvidia-l20").key, find_gpu("A800-SXM4-80GB").key) == (
        "H800", "L20", "A800-80GB")
    # New entries without a measured total are labelled nominal, as the catalog requires.
    assert {find_gpu(n).memory_kind for n in ("H800", "L20")} == {"nominal"}
    assert find_gpu("RTX-PRO-6000").memory_kind == "cuda"  # the Server Edition's totalGlobalMem
    assert find_gpu("A800-80GB").total_memory_bytes == 81_920 * 2**20  # nvidia-smi 81,920 MiB


def test_json_flag_is_format_json(runner, tmp_path):
    # --json, as estimate, plan, models and gpus spell it; the same document as --format json.
    (tmp_path / "svc.yaml").write_text("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n")
    as_flag = run_cli(runner, "check", str(tmp_path), "--offline", "--json")
    as_format = run_cli(runner, "check", str(tmp_path), "--offline", "--format", "json")
    assert json.loads(as_flag.stdout) == json.loads(as_format.stdout)
    clash = run_cli(runner, "check", str(tmp_path), "--offline", "--json", "--format", "github")
    assert clash.exit_code == 2 and "--json and --format github contradict" in clash.stderr
