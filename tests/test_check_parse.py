"""kvplan check, input half: deployment files -> DeploymentRequest, over real files and our own fixtures."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvplan.check.build import normalize_model
from kvplan.check.files import load_requests, read_paths
from kvplan.check.flags import parse_args
from kvplan.check.invocation import find_invocation, shell_commands
from kvplan.check.readers.own_schema import KEYS
from kvplan.errors import DeploymentError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "deploy"
REAL = ROOT / "tests" / "data" / "reference-deploy"  # copied from ../shared/reference/deploy-files (SOURCES.md)
REAL_FILES = sorted(REAL.glob("*.yaml"))


def one(path: Path, **kwargs):
    requests, failures = load_requests([str(path)], **kwargs)
    assert failures == []
    return requests


def unresolved_fields(request) -> set[str]:
    return {u.field for u in request.unresolved}


# --- every real file is read or refused with a reason, never a traceback -------------------------------------


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: p.name)
def test_every_real_file_is_read_or_refused(path: Path) -> None:
    requests, failures = load_requests([str(path)])
    assert requests or failures
    for failure in failures:
        assert failure.reason and str(path) in failure.reason
    for request in requests:
        assert request.location.file == str(path) and request.location.line >= 1
        # A request the evaluation cannot run says why and how to fix it.
        for item in request.unresolved:
            assert item.reason and item.how_to_fix


def test_real_files_count() -> None:
    assert len(REAL_FILES) == 36


def real(name: str):
    return one(REAL / name)


# Values pinned against the table in deploy-files/SOURCES.md.
def test_real_lws_deepseek_flags_inside_sh_c() -> None:
    (r,) = real("gke-lws-vllm-deepseek-r1-2x8xh100.yaml")
    assert (r.model, r.gpu, r.num_gpus) == ("deepseek-ai/DeepSeek-R1", "nvidia-h100-80gb", 16)  # 8 per pod x size 2
    assert (r.tensor_parallel_size, r.pipeline_parallel_size, r.max_model_len) == (8, 2, 4096)
    assert r.source_format == "lws" and r.location.line == 34
    assert r.unresolved == ()


def test_real_maverick_bf16_h200_behind_hf_token_placeholder() -> None:
    (r,) = real("gke-vllm-llama4-maverick-bf16-8xh200.yaml")
    assert (r.model, r.gpu, r.num_gpus, r.tensor_parallel_size) == (
        "meta-llama/Llama-4-Maverick-17B-128E-Instruct",
        "nvidia-h200-141gb",
        8,
        8,
    )
    assert (r.max_model_len, r.gpu_memory_utilization, r.kv_cache_dtype, r.max_num_seqs) == (131072, 0.95, "auto", 64)


def test_real_gemma3_27b_model_from_env_substitution() -> None:
    (r,) = real("gke-vllm-gemma3-27b-a100-80gb.yaml")
    assert (r.model, r.gpu, r.num_gpus) == ("google/gemma-3-27b-it", "nvidia-a100-80gb", 1)
    assert (r.max_model_len, r.gpu_memory_utilization, r.max_num_seqs) == (32768, 0.95, 4)


def test_real_nvidia_gemma_more_gpus_than_tp_and_local_path_model() -> None:
    (r,) = real("gke-nvidia-vllm-gemma3-27b-tp4-8gpu.yaml")
    assert (r.num_gpus, r.tensor_parallel_size, r.max_model_len, r.max_num_seqs) == (8, 4, 4096, 4)
    assert "8 GPUs requested but tp x pp = 4 uses 4" in r.notes
    # MODEL_ID is a converted checkpoint under /data: no repo id to recover, so it is not guessed.
    assert r.model is None and "model" in unresolved_fields(r)


def test_real_kubeai_pp4_tp2_abbreviated_flag() -> None:
    (r,) = real("kubeai-model-llama31-70b-fp8-8xl4-pp4tp2.yaml")
    assert (r.model, r.gpu, r.num_gpus) == ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "nvidia-gpu-l4", 8)
    assert (r.tensor_parallel_size, r.pipeline_parallel_size, r.max_model_len) == (2, 4, 32768)
    assert (r.gpu_memory_utilization, r.kv_cache_dtype, r.max_num_seqs) == (0.9, "fp8", 512)
    assert r.max_num_batched_tokens == 32768  # written --max-num-batched-token


def test_real_gie_abbreviated_max_num_seq() -> None:
    (r,) = real("ps-k8s-gie-llama3-1b-deployment.yaml")
    assert (r.model, r.num_gpus, r.tensor_parallel_size, r.max_num_seqs) == (
        "meta-llama/Llama-3.2-1B-Instruct",
        1,
        1,
        1024,
    )
    assert r.gpu is None and "gpu" in unresolved_fields(r)
    # --enable-lora --max-loras 2 --max-lora-rank 32: planned as LoRA slots, not listed as an ignored flag.
    assert r.lora_slots == (2, 32, False)
    assert "enable-lora" not in {f.flag.lstrip("-") for f in r.ignored_flags}


def test_real_tgi_env_configured() -> None:
    (r,) = real("gke-tgi-gemma2-27b-4xl4-env-maxtotaltokens.yaml")
    assert (r.engine, r.model, r.gpu, r.num_gpus, r.tensor_parallel_size) == (
        "tgi",
        "google/gemma-2-27b-it",
        "nvidia-l4",
        4,
        4,
    )
    assert (r.max_model_len, r.gpu_memory_utilization) == (2048, 0.93)
    assert r.flag("max-input-length") == "1562"


def test_real_production_stack_two_models() -> None:
    a, b = real("ps-values-multiple-models.yaml")
    assert (a.model, a.num_gpus, a.max_model_len, a.gpu_memory_utilization, a.max_num_seqs) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        1,
        4096,
        0.8,
        32,
    )
    assert (b.model, b.gpu_memory_utilization) == ("mistralai/Mistral-7B-Instruct-v0.2", 0.95)


def test_real_kserve_model_from_s3_path_despite_placeholder() -> None:
    (r,) = real("kserve-isvc-hf-llama31-8b-g5.yaml")
    assert (r.model, r.gpu, r.gpu_source) == (
        "meta-llama/Meta-Llama-3.1-8B-Instruct",
        "g5.8xlarge",
        "nodeSelector node.kubernetes.io/instance-type",
    )
    assert (r.max_model_len, r.gpu_memory_utilization, r.num_gpus) == (1024, 0.95, 1)


def test_real_kserve_transformers_backend_is_refused() -> None:
    (r,) = real("kserve-isvc-hf-llama2-7b-no-vllm-args.yaml")
    assert r.engine == "huggingface" and "engine" in unresolved_fields(r)


def test_real_llmisvc_args_from_env() -> None:
    (r,) = real("kserve-llmisvc-deepseek-r1-dp32-ep-envargs.yaml")
    # 8 GPUs per pod, data 32 / dataLocal 8 = 4 pods: one DP32 engine over 32 GPUs.
    assert (r.model, r.gpus_per_pod, r.pods_per_instance, r.num_gpus) == ("deepseek-ai/DeepSeek-R1-0528", 8, 4, 32)
    assert (r.max_model_len, r.gpu_memory_utilization) == (8192, 0.95)
    assert (r.data_parallel_size, r.data_parallel_size_local, r.expert_parallel) == (32, 8, True)
    assert r.flag("data-parallel-size") == "32" and r.flag("enforce-eager") == "true"


def test_real_kubeai_catalog_one_request_per_entry() -> None:
    requests = real("kubeai-helm-values-models-catalog.yaml")
    engines = {r.engine for r in requests}
    assert "vllm" in engines and "ollama" in engines
    ollama = [r for r in requests if r.engine == "ollama"]
    assert all("engine" in unresolved_fields(r) for r in ollama)


# --- our own fixtures, one per format --------------------------------------------------------------------------


def test_multi_document_k8s() -> None:
    chat, big = one(FIXTURES / "k8s-multi.yaml")  # the Service between them is not a deployment
    assert (chat.name, chat.location.line, chat.engine, chat.model) == (
        "chat/vllm",
        13,
        "vllm",
        "meta-llama/Llama-3.1-8B-Instruct",
    )
    assert (chat.gpu, chat.gpu_source, chat.num_gpus) == ("H100-80GB", "annotation kvplan.io/gpu", 1)
    assert (chat.max_model_len, chat.gpu_memory_utilization, chat.kv_cache_dtype) == (32768, 0.92, "fp8")
    assert (chat.max_num_seqs, chat.enable_prefix_caching) == (128, False)  # --max-num-seq, --no-enable-prefix-caching
    assert chat.flag("enforce-eager") == "true"
    # sh -c with a line continuation, && and ;, $(MODEL) from env, ${TP} from env, vLLM's "128k" = 128 * 1000.
    assert (big.model, big.tensor_parallel_size, big.max_model_len, big.block_size) == (
        "Qwen/Qwen2.5-72B-Instruct",
        4,
        128_000,
        32,
    )
    assert (big.gpu, big.gpu_source) == ("NVIDIA-A100-SXM4-80GB", "node affinity nvidia.com/gpu.product")
    assert "8 GPUs requested but tp x pp = 4 uses 4" in big.notes


def test_templated_values_are_unresolved_not_guessed() -> None:
    (r,) = one(FIXTURES / "templated.yaml")
    assert r.name == "{{ .Release.Name }}-vllm/vllm" and r.location.line == 16
    assert (r.model, r.tensor_parallel_size, r.max_model_len, r.num_gpus) == ("Qwen/Qwen2.5-7B-Instruct", 2, None, None)
    fields = {u.field: u for u in r.unresolved}
    assert "{{ .Values.maxModelLen }}" in fields["max_model_len"].reason
    assert "helm template" in fields["max_model_len"].how_to_fix
    assert "{{ .Values.gpus }}" in fields["num_gpus"].reason
    assert "port" not in fields  # a templated flag that does not matter is not reported


def test_missing_gpu_type_and_default_gpu() -> None:
    (r,) = one(FIXTURES / "missing-gpu.yaml")
    (gap,) = r.unresolved
    assert gap.field == "gpu" and "kvplan.io/gpu" in gap.how_to_fix and "--gpu" in gap.how_to_fix
    (r,) = one(FIXTURES / "missing-gpu.yaml", gpu="A100-80GB")
    assert (r.gpu, r.gpu_source, r.unresolved) == ("A100-80GB", "--gpu", ())
    assert (r.gpu_key, r.gpu_memory_bytes) == ("A100-80GB", 85_198_045_184)  # the catalog's CUDA total


def test_sglang() -> None:
    (r,) = one(FIXTURES / "sglang.yaml")
    assert (r.engine, r.model, r.tensor_parallel_size, r.num_gpus) == (
        "sglang",
        "meta-llama/Llama-3.1-70B-Instruct",
        4,
        4,
    )
    assert (r.gpu_memory_utilization, r.max_model_len, r.kv_cache_dtype) == (0.85, 65536, "fp8_e5m2")
    assert (r.block_size, r.max_num_seqs, r.enable_prefix_caching) == (16, 48, False)


def test_tgi_flags_override_env() -> None:
    (r,) = one(FIXTURES / "tgi.yaml")
    assert (r.engine, r.model, r.gpu) == ("tgi", "mistralai/Mistral-Nemo-Instruct-2407", "l40s")
    # MAX_TOTAL_TOKENS=6000 in env, --max-total-tokens 8192 in args: the flag wins, as in the launcher.
    assert (r.max_model_len, r.tensor_parallel_size, r.gpu_memory_utilization, r.quantization) == (8192, 2, 0.9, "fp8")


def test_production_stack_values() -> None:
    small, large = one(FIXTURES / "ps-values.yaml")
    assert (small.gpu, small.num_gpus, small.max_model_len, small.gpu_memory_utilization) == ("L4", 1, 16384, 0.85)
    assert (small.kv_cache_dtype, small.max_num_seqs, small.enable_prefix_caching) == ("fp8", 96, True)
    assert small.pipeline_parallel_size == 1 and any("pipelineParallelSize" in n for n in small.notes)
    assert (large.tensor_parallel_size, large.num_gpus, large.enable_prefix_caching) == (4, 4, False)
    assert "several GPU types" in {u.field: u for u in large.unresolved}["gpu"].reason


def test_vllm_config_file() -> None:
    (r,) = one(FIXTURES / "vllm-config.yaml", gpu="H100-80GB")
    assert (r.source_format, r.model, r.tensor_parallel_size, r.num_gpus) == (
        "vllm-config",
        "google/gemma-3-27b-it",
        2,
        2,
    )
    assert (r.max_model_len, r.gpu_memory_utilization, r.enable_prefix_caching) == (65536, 0.9, False)
    assert r.max_num_batched_tokens == 16 * 1024  # "16K": upper-case suffix is binary in vLLM


def test_kvplan_schema() -> None:
    chat, coder = one(FIXTURES / "kvplan.yaml")
    assert (chat.model, chat.gpu, chat.num_gpus, chat.max_num_seqs, chat.min_margin) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "H100-80GB",
        2,
        8,
        0.1,
    )
    assert (coder.engine, coder.tensor_parallel_size, coder.num_gpus) == ("sglang", 2, 2)
    assert "gpu" in unresolved_fields(coder)


def test_kvplan_schema_rejects_unknown_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kvplan: 1\ndeployments:\n  - model: a/b\n    max_model_length: 4096\n")
    requests, (failure,) = load_requests([str(path)])
    assert requests == []
    assert failure.reason.startswith(f"{path}:4: unknown key 'max_model_length'")
    assert failure.request.location.line == 4


def test_json_schema_lists_the_same_keys() -> None:
    schema = json.loads((ROOT / "kvplan" / "check" / "deploy.schema.json").read_text())
    item = schema["$defs"]["deployment"]
    assert set(item["properties"]) - {"kvplan"} == set(KEYS)  # `kvplan` only for the one-deployment form
    assert item["additionalProperties"] is False and "model" in item["required"]


def test_compose() -> None:
    vllm, tgi = one(FIXTURES / "compose.yaml")  # redis runs no engine
    assert (vllm.model, vllm.gpu, vllm.num_gpus, vllm.tensor_parallel_size) == (
        "microsoft/Phi-4-mini-instruct",
        "RTX-4090",
        2,
        2,
    )
    assert (vllm.max_model_len, vllm.gpu_memory_utilization) == (16384, 0.8)  # ${MAX_LEN:-16384} takes its default
    assert unresolved_fields(tgi) == {"num_gpus", "gpu", "max_model_len"}  # count: all, no label, ${TGI_TOTAL} unset


def test_directory_walk_skips_hidden_and_non_deployments() -> None:
    requests, failures = load_requests([str(FIXTURES / "dir")])
    assert failures == []
    assert sorted(os.path.relpath(r.location.file, FIXTURES / "dir") for r in requests) == ["a.yaml", "nested/b.yml"]


def test_file_without_deployment_is_reported_with_what_it_holds() -> None:
    reading = read_paths([str(FIXTURES / "dir" / "svc.yaml")])
    assert reading.requests == [] and reading.failures == []
    (report,) = reading.files
    assert report.skipped == "no deployment kvplan reads: Service/x" and report.deployments == 0
    _, (missing,) = load_requests([str(FIXTURES / "nope.yaml")])
    assert "no such file" in missing.reason and missing.verdict == "cannot_evaluate"


# --- units -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("hf://Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
        ("/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/0e9e", "meta-llama/Llama-3.1-8B"),
        ("s3://b/models/meta-llama--Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct"),
        ("gpt2", "gpt2"),
        ("/data/ckpt/step-100", None),
        ("pvc://my-claim", None),
    ],
)
def test_normalize_model(raw: str, expected: str | None) -> None:
    assert normalize_model(raw)[0] == expected


def test_vllm_argv_booleans_positionals_and_prefixes() -> None:
    parsed = parse_args(
        "vllm",
        [
            "--enforce-eager",
            "org/model",
            "--max_model_len",
            "4096",
            "--max-num-batched-token=2048",
            "-tp",
            "2",
            "--enable-chunked-prefill=false",
            "--served-model-name",
            "a",
            "b",
        ],
    )
    assert parsed.positionals == ("org/model",)  # --enforce-eager takes no value
    assert dict(parsed.flags) == {
        "enforce-eager": "true",
        "max-model-len": "4096",
        "max-num-batched-tokens": "2048",
        "tensor-parallel-size": "2",
        "enable-chunked-prefill": "false",
        "served-model-name": "a b",
    }


def test_ambiguous_prefix_is_kept_as_unknown() -> None:
    parsed = parse_args("vllm", ["--max-num", "8"])  # max-num-seqs? max-num-batched-tokens? argparse refuses too
    assert parsed.get("max-num-seqs") is None and parsed.get("max-num") == "8"
    assert any("not a known vllm flag" in n for n in parsed.notes)


def test_shell_split_keeps_quoted_separators() -> None:
    assert shell_commands("echo 'a; b' && vllm serve m --x=1;\nrun", {}) == [
        ["echo", "a; b"],
        ["vllm", "serve", "m", "--x=1"],
        ["run"],
    ]


def test_find_invocation_forms() -> None:
    env = {"M": "org/m"}
    assert find_invocation(["vllm", "serve", "$(M)"], [], None, env).argv == ("org/m",)
    assert find_invocation(["python3", "-u", "-m", "sglang.launch_server"], ["--tp", "2"], None, {}).engine == "sglang"
    assert (
        find_invocation([], ["--model-id", "x"], "ghcr.io/huggingface/text-generation-inference:3", {}).engine == "tgi"
    )
    assert find_invocation(["bash", "-c", "sleep 1"], [], "vllm/vllm-openai:latest", {}) is None
    assert find_invocation([], ["--port", "1"], "redis:7", {}) is None


def test_deployment_error_is_a_kvplan_error() -> None:
    assert DeploymentError.exit_code == 2


def _compose(tmp_path: Path, services: str) -> list:
    """The deployments of a docker-compose file holding `services`; every one must read."""
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n" + services)
    requests, failures = load_requests([str(path)])
    assert not failures
    return requests


def _ignored_flags(request) -> set[str]:
    return {f.flag.lstrip("-") for f in request.ignored_flags}


def test_vllm_mamba_dtype_flags_are_read_and_sglangs_is_named_ignored(tmp_path: Path) -> None:
    requests = _compose(tmp_path, """
  vllm:
    image: vllm/vllm-openai:v0.19.0
    command: ["--model", "Qwen/Qwen3-Next-80B-A3B-Thinking", "--tensor-parallel-size", "4",
              "--mamba-ssm-cache-dtype", "float32", "--mamba-cache-dtype", "bfloat16"]
  sglang:
    image: lmsysorg/sglang:v0.5.9
    command: ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-Next-80B-A3B-Thinking",
              "--tp", "4", "--mamba-ssm-dtype", "bfloat16"]
""")
    vllm, sglang = sorted(requests, key=lambda r: r.engine, reverse=True)
    assert (vllm.engine, sglang.engine) == ("vllm", "sglang")
    assert (vllm.mamba_cache_dtype, vllm.mamba_ssm_cache_dtype) == ("bfloat16", "float32")
    assert "mamba-ssm-cache-dtype" not in _ignored_flags(vllm) and "mamba-ssm-dtype" in _ignored_flags(sglang)


def test_an_mtp_speculative_config_is_read_and_other_methods_stay_ignored(tmp_path: Path) -> None:
    requests = _compose(tmp_path, """
  mtp:
    image: vllm/vllm-openai:v0.24.0
    command: ["--model", "deepseek-ai/DeepSeek-V3", "--tensor-parallel-size", "8",
              "--speculative-config", '{"method": "deepseek_mtp", "num_speculative_tokens": 2}']
  eagle:
    image: vllm/vllm-openai:v0.24.0
    command: ["--model", "meta-llama/Llama-3.1-8B-Instruct",
              "--speculative-config", '{"method": "eagle3", "model": "some/eagle", "num_speculative_tokens": 3}']
""")
    by_model = {r.model: r for r in requests}
    mtp, eagle = by_model["deepseek-ai/DeepSeek-V3"], by_model["meta-llama/Llama-3.1-8B-Instruct"]
    assert mtp.speculative == ("mtp", 2) and eagle.speculative is None
    assert "speculative-config" not in _ignored_flags(mtp) and "speculative-config" in _ignored_flags(eagle)


def _env_deployment(tmp_path: Path, gpu: str, tag: str, model: str, name: str, value: str) -> Path:
    """A one-GPU Kubernetes Deployment of vllm/vllm-openai:`tag` serving `model` with env `name`=`value`."""
    path = tmp_path / "d.yaml"
    path.write_text(f"""apiVersion: apps/v1
kind: Deployment
metadata: {{name: chat, annotations: {{kvplan.io/gpu: {gpu}}}}}
spec:
  template:
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:{tag}
          args: [{model}, --max-model-len=4096]
          env: [{{name: {name}, value: "{value}"}}]
          resources: {{limits: {{nvidia.com/gpu: 1}}}}
""")
    return path


@pytest.mark.parametrize(("value", "taken", "named"), [("1", True, False), ("0", False, False),
                                                    ("sometimes", False, True)])
def test_vllm_mla_disable_is_read(tmp_path: Path, value: str, taken: bool, named: bool) -> None:
    # envs.py reads VLLM_MLA_DISABLE as bool(int(...)); a value that is not 0 or 1 is named, and MLA stays on.
    (r,) = one(_env_deployment(tmp_path, "H100", "v0.19.0", "deepseek-ai/DeepSeek-V2-Lite", "VLLM_MLA_DISABLE",
                               value))
    assert r.mla_disable is taken
    assert ("mla_disable" in unresolved_fields(r)) is named


@pytest.mark.parametrize(("name", "value", "taken", "named"), [
    ("VLLM_USE_DEEP_GEMM", "0", False, False), ("VLLM_USE_DEEP_GEMM", "1", None, False),
    ("VLLM_MOE_USE_DEEP_GEMM", "0", False, False), ("VLLM_MOE_USE_DEEP_GEMM", "1", True, False),
    ("VLLM_MOE_USE_DEEP_GEMM", "maybe", None, True)])
def test_vllm_deep_gemm_switches_are_read(tmp_path: Path, name: str, value: str, taken: bool | None,
                                          named: bool) -> None:
    # Either switch at 0 turns DeepGEMM's MoE off; VLLM_MOE_USE_DEEP_GEMM=1 asks for it (0.12-0.14 leave it off at
    # tp 8 otherwise); VLLM_USE_DEEP_GEMM=1 is the default. A value that is not 0 or 1 is named.
    (r,) = one(_env_deployment(tmp_path, "RTX-PRO-6000", "v0.27.1", "Qwen/Qwen3-30B-A3B-FP8", name, value))
    assert r.deep_gemm is taken
    assert ("deep_gemm" in unresolved_fields(r)) is named


@pytest.mark.parametrize(("name", "key"), [("VLLM_USE_FLASHINFER_SAMPLER", "flashinfer_sampler"),
                                           ("VLLM_USE_V1", "use_v1")])
@pytest.mark.parametrize(("value", "taken"), [("1", True), ("0", False), ("sometimes", None)])
def test_vllm_env_switches_are_read(tmp_path: Path, name: str, key: str, value: str, taken: bool | None) -> None:
    # vllm/envs.py reads both as bool(int(...)); a value that is not 0 or 1 is named.
    (r,) = one(_env_deployment(tmp_path, "L4", "v0.11.2", "meta-llama/Llama-3.1-8B-Instruct", name, value))
    assert getattr(r, key) is taken
    assert (key in unresolved_fields(r)) is (taken is None)
