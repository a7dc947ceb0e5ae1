"""kvplan check on the formats serving teams use (issue 11): each fixture read right, and its verdict.

Fixtures live in tests/data/deploy/ (written for these tests, modelled on each project's docs and charts).
Verdicts that need the deployment model (replicas, expert parallel, CPU offload, TGI's own defaults and
quantization, --gpu-mem) are evaluated by the same planner as `kvplan estimate`.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.check.files import read_paths
from kvplan.check.invocation import PipVllm
from tests.conftest import REPO, run_cli

DATA = REPO / "tests" / "data" / "deploy"
REFERENCE = REPO / "tests" / "data" / "reference-deploy"


def read(name: str, **kwargs):
    reading = read_paths([str(DATA / name)], **kwargs)
    assert reading.failures == []
    return reading.requests


def verdicts(runner, *paths: Path, extra: tuple[str, ...] = ()) -> tuple[int, dict[str, dict]]:
    result = run_cli(runner, "check", *map(str, paths), "--offline", "--format", "json", *extra)
    assert result.exit_code in (0, 1, 2), result.output
    data = json.loads(result.stdout)
    return result.exit_code, {r["name"]: r for r in data["results"]}


# --- llm-d modelservice ------------------------------------------------------------------------------------


def test_llmd_prefill_and_decode_are_two_deployments() -> None:
    decode, prefill = read("llmd-pd-qwen3-32b.yaml")
    # uri "hf://{{ .Values.modelArtifacts.name }}" is rendered from the values file itself.
    assert (decode.name, decode.model, decode.source_format) == ("decode/vllm", "Qwen/Qwen3-32B", "llm-d")
    assert (decode.tensor_parallel_size, decode.gpus_per_pod, decode.replicas) == (2, 2, 2)
    assert (decode.gpu, decode.gpu_key, decode.max_model_len) == ("NVIDIA-H100-80GB-HBM3", "H100-80GB", 32768)
    assert decode.line_of("tp") == 23 and decode.line_of("--max-model-len") == 33  # parallelism.tensor, args
    assert [f.flag for f in decode.ignored_flags] == ["kv-transfer-config"]  # NIXL buffers are not counted
    # Prefill sets no GPU limit: the chart gives each pod dataLocal x tensor = 1 x 1 GPU.
    assert (prefill.name, prefill.tensor_parallel_size, prefill.num_gpus, prefill.max_model_len) == (
        "prefill/vllm", 1, 1, 16384)


def test_llmd_verdicts(runner) -> None:
    code, results = verdicts(runner, DATA / "llmd-pd-qwen3-32b.yaml")
    assert code == 0 and {r["verdict"] for r in results.values()} == {"fits"}


# --- AWS inference-charts ----------------------------------------------------------------------------------


def test_eks_values_read_like_the_chart_renders_them() -> None:
    (r,) = read("eks-llama31-8b-g6e.yaml")
    assert (r.model, r.engine, r.source_format, r.engine_version) == (
        "meta-llama/Llama-3.1-8B-Instruct", "vllm", "eks-inference-charts", "0.10.1")
    assert (r.gpu, r.gpu_key, r.num_gpus, r.replicas) == ("g6e.2xlarge", "L40S", 1, 2)
    # maxModelLen -> --max-model-len; no tensorParallelSize, so the chart writes the GPU request (1).
    assert (r.max_model_len, r.gpu_memory_utilization, r.max_num_seqs, r.tensor_parallel_size) == (32768, 0.9, 64, 1)
    assert r.enable_prefix_caching is True and r.flag("enforce-eager") is None  # false renders nothing
    assert r.line_of("max_model_len") == 7 and r.line_of("gpu") == 23


def test_eks_lws_spans_pipeline_parallel_pods(runner) -> None:
    (r,) = read("eks-lws-llama31-70b.yaml")
    # LeaderWorkerSet size = pipelineParallelSize = 2 pods of 4 L40S: tp 4 x pp 2 = 8 GPUs.
    assert (r.pods_per_instance, r.gpus_per_pod, r.num_gpus) == (2, 4, 8)
    assert (r.tensor_parallel_size, r.pipeline_parallel_size) == (4, 2)
    code, results = verdicts(runner, DATA / "eks-llama31-8b-g6e.yaml", DATA / "eks-lws-llama31-70b.yaml")
    assert code == 0 and {r["verdict"] for r in results.values()} == {"fits"}


# --- NVIDIA Dynamo -----------------------------------------------------------------------------------------


def test_dynamo_workers_not_the_frontend(runner) -> None:
    decode, prefill = read("dynamo-disagg-qwen3-30b.yaml")  # the Frontend runs no engine
    assert (decode.name, decode.model, decode.tensor_parallel_size, decode.num_gpus, decode.replicas) == (
        "qwen3-disagg/VllmDecodeWorker", "Qwen/Qwen3-30B-A3B", 2, 2, 2)
    assert (decode.gpu_key, decode.max_model_len, decode.gpu_memory_utilization) == ("H100-80GB", 40960, 0.9)
    assert not any("2>" in n for n in decode.notes)  # `2>&1 | tee` is a redirection, not an argument
    assert (prefill.num_gpus, prefill.line_of("--max-model-len")) == (1, 57)
    code, results = verdicts(runner, DATA / "dynamo-disagg-qwen3-30b.yaml")
    assert code == 0 and {r["verdict"] for r in results.values()} == {"fits"}


# --- SkyPilot ----------------------------------------------------------------------------------------------


def test_skypilot_each_accelerator_choice_is_a_deployment(runner) -> None:
    h100, a100, l4 = read("skypilot-llama31-70b.yaml")
    assert [r.name for r in (h100, a100, l4)] == [
        "llama31-70b[H100:4]", "llama31-70b[A100-80GB:4]", "llama31-70b[L4:4]"]
    # $SKYPILOT_NUM_GPUS_PER_NODE is the choice's count; $MAX_LEN comes from envs.
    assert {(r.tensor_parallel_size, r.num_gpus, r.max_model_len, r.replicas) for r in (h100, a100, l4)} == {
        (4, 4, 32768, 2)}
    assert (h100.gpu_key, a100.gpu_key, l4.gpu_key) == ("H100-80GB", "A100-80GB", "L4")
    code, results = verdicts(runner, DATA / "skypilot-llama31-70b.yaml")
    # 70B in bf16 is 131 GiB: 33 GiB per GPU does not fit an L4's 22.03 GiB; the task must fit any choice.
    assert (results["llama31-70b[H100:4]"]["verdict"], results["llama31-70b[L4:4]"]["verdict"]) == (
        "fits", "does_not_fit")
    assert code == 1


def test_skypilot_multinode() -> None:
    (r,) = read("skypilot-multinode.yaml")
    # `if [ rank == 0 ]; then vllm serve ...`: tp = GPUs per node (8), pp = $SKYPILOT_NUM_NODES (2).
    assert (r.tensor_parallel_size, r.pipeline_parallel_size, r.pods_per_instance, r.num_gpus) == (8, 2, 2, 16)
    assert (r.kv_cache_dtype, r.line_of("--pipeline-parallel-size")) == ("fp8", 17)


def test_compose_servers_pinned_to_one_gpu_see_each_other(runner, tmp_path) -> None:
    # chat and embed both pin device 0 at 0.5; each is planned as started last, with the other's 0.5 of the L4
    # (22.03 GiB) in use: vLLM 0.10.1's start-up check finds 22.03 - 11.02 - its own context = 10.68 GiB free,
    # under the 11.02 GiB it asks for, and refuses. alone, on device 1, fits.
    chat, embed, alone = read("compose-shared-gpu.yaml")
    assert (chat.shared_gpu_fraction, embed.shared_with, alone.shared_gpu_fraction) == (
        0.5, ("chat (0.5 of GPU 0)",), 0.0)
    code, results = verdicts(runner, DATA / "compose-shared-gpu.yaml")
    assert [results[n]["verdict"] for n in ("chat", "embed", "alone")] == ["does_not_fit", "does_not_fit", "fits"]
    assert results["chat"]["reason_code"] == "startup_free_memory" and code == 1
    # Three at 0.5 on one GPU: the other two already hold all of it. A neighbour with no stated fraction is named.
    text = (DATA / "compose-shared-gpu.yaml").read_text().replace('device_ids: ["1"]', 'device_ids: ["0"]')
    (tmp_path / "three.yaml").write_text(text)
    code, results = verdicts(runner, tmp_path / "three.yaml")
    assert results["alone"]["verdict"] == "does_not_fit" and results["alone"]["reason_code"] == "gpu_shared"
    unstated = text.replace(', "--gpu-memory-utilization", "0.5"]', "]", 1)
    (tmp_path / "unstated.yaml").write_text(unstated)
    chat, embed, alone = read_paths([str(tmp_path / "unstated.yaml")]).requests
    assert embed.shared_gpu_fraction == 0.5 and any("chat, whose memory fraction is not stated" in n
                                                     for n in embed.notes)
    # A server on GPUs 0 and 1 beside one on 0 and another on 1 sees the fullest GPU's share, not their sum.
    two = text.replace('device_ids: ["0"]', 'device_ids: ["0", "1"]', 1)
    two = two.replace('device_ids: ["0"]', 'device_ids: ["1"]', 1)
    (tmp_path / "two.yaml").write_text(two)
    wide, _, _ = read_paths([str(tmp_path / "two.yaml")]).requests
    assert wide.shared_gpu_fraction == 0.5


def test_skypilot_pip_installed_vllm_is_the_wheel_at_its_pin(runner) -> None:
    # `pip install vllm==0.11.0` in setup: planned as 0.11.0 from the wheel, which has neither FlashInfer (the
    # sampler sorts 1,024 x 201,088 logits with PyTorch, 7.31 GiB) nor triton_kernels (Marlin's 65.91 GiB): at
    # 0.9 x 79.19 GiB that leaves no KV memory (-2.20 GiB, as vllm-project/vllm#27508 logged on such a box). The
    # image of 0.11.0 would have 2.9 GiB left, enough for one 32,768-token request.
    (r,) = read("skypilot-gpt-oss-pip.yaml")
    assert (r.engine_version, r.engine_install) == ("0.11.0", "wheel")
    assert any("pip-installed by the file's own script" in n for n in r.notes)
    code, results = verdicts(runner, DATA / "skypilot-gpt-oss-pip.yaml")
    assert results["skypilot-gpt-oss-pip[H100:1]"]["verdict"] == "does_not_fit" and code == 1


def test_a_container_that_pip_installs_vllm_runs_the_wheel(tmp_path) -> None:
    # A plain Python image whose shell command installs vLLM first: the pin is the release, the install the wheel.
    # Over the vllm/vllm-openai image the same pin reinstalls vLLM, so it wins over the tag.
    manifest = tmp_path / "pod.yaml"
    pod = ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations: {{kvplan.io/gpu: L4}}\nspec:\n"
           "  containers:\n    - name: vllm\n      image: {image}\n"
           "      command: [\"bash\", \"-c\",\n"
           "                \"pip install vllm==0.10.2 && vllm serve Qwen/Qwen3-8B --max-model-len 8192\"]\n"
           "      resources: {{limits: {{nvidia.com/gpu: 1}}}}\n")
    manifest.write_text(pod.format(name="plain", image="python:3.12") + "---\n"
                        + pod.format(name="tagged", image="vllm/vllm-openai:v0.9.2"))
    plain, tagged = read_paths([str(manifest)]).requests
    assert (plain.engine_version, plain.engine_install) == ("0.10.2", "wheel")
    assert (tagged.engine_version, tagged.engine_install) == ("0.10.2", "wheel")


def test_ray_runtime_env_pip_pins_the_release(tmp_path) -> None:
    # Ray Serve LLM installs runtime_env.pip for the replica; the {packages: [...]} form too.
    config = tmp_path / "serve.yaml"
    config.write_text(
        "applications:\n  - name: app\n    import_path: ray.serve.llm:build_openai_app\n    args:\n"
        "      llm_configs:\n        - model_loading_config: {model_id: q, model_source: Qwen/Qwen2.5-7B-Instruct}\n"
        "          accelerator_type: L4\n          runtime_env: {pip: {packages: [\"vllm==0.10.2\", ray]}}\n")
    (r,) = read_paths([str(config)]).requests
    assert (r.engine_version, r.engine_install) == ("0.10.2", "wheel")


def test_pip_vllm_reads_the_requirement_and_its_pin() -> None:
    from kvplan.check.invocation import pip_vllm

    assert pip_vllm("pip install -U pip\npip install vllm==0.10.1 hf_transfer") == PipVllm("0.10.1")
    assert pip_vllm("uv pip install 'vllm[flashinfer]==0.10.2' --torch-backend=auto") == \
        PipVllm("0.10.2", ("flashinfer",))
    assert pip_vllm("pip install vllm && vllm serve Qwen/Qwen3-8B") == PipVllm(None)
    # FlashInfer as an extra makes the sampler the image's: neither install fits, so none is claimed.
    assert PipVllm("0.10.2", ("flashinfer",)).install is None and PipVllm(None).install == "wheel"
    # Other packages, and vllm named outside a pip command, are not an install of vLLM.
    assert pip_vllm("pip install vllm-router lmcache") is None
    assert pip_vllm("python -m vllm.entrypoints.openai.api_server --model x") is None


# --- the vLLM project's Helm chart --------------------------------------------------------------------------


def test_vllm_chart_values(runner) -> None:
    (r,) = read("vllm-chart-values.yaml")
    assert (r.model, r.gpu, r.gpu_key, r.num_gpus, r.replicas) == (
        "mistralai/Mistral-7B-Instruct-v0.3", "NVIDIA-L4", "L4", 1, 2)
    assert any("--served-model-name" in n for n in r.notes)  # the weights are in /data; the name says which
    code, results = verdicts(runner, DATA / "vllm-chart-values.yaml")
    assert code == 0 and results["vllm"]["verdict"] == "fits"


# --- Ray Serve LLM and KubeRay ------------------------------------------------------------------------------


def test_ray_serve_llm_configs(runner) -> None:
    qwen, llama = read("ray-serve-llm.yaml")
    assert (qwen.name, qwen.model, qwen.gpu_key, qwen.max_model_len) == (
        "llm_app/qwen-7b", "Qwen/Qwen2.5-7B-Instruct", "L4", 16384)
    # Ray's "A100" is either size: read as the 40GB card, and said so.
    assert (llama.gpu_key, llama.tensor_parallel_size, llama.num_gpus) == ("A100-40GB", 4, 4)
    assert any("40GB or 80GB" in n for n in llama.notes)
    code, results = verdicts(runner, DATA / "ray-serve-llm.yaml")
    # 131 GiB of bf16 weights over 4 x 39.39 GiB leave no room for a 131,072-token request.
    assert (results["llm_app/qwen-7b"]["verdict"], results["llm_app/llama-70b"]["verdict"]) == ("fits", "does_not_fit")
    assert code == 1


def test_rayservice_worker_pods_and_lines() -> None:
    (r,) = read("rayservice-qwen3.yaml")
    # tp 2 on worker pods of 1 L4: one replica spans 2 Ray worker pods.
    assert (r.model, r.gpu_key, r.tensor_parallel_size, r.pods_per_instance, r.num_gpus) == (
        "Qwen/Qwen3-8B", "L4", 2, 2, 2)
    assert r.line_of("--max-model-len") == 20  # inside serveConfigV2, counted in the outer file


# --- KServe Hugging Face runtime with vLLM ----------------------------------------------------------------


def test_kserve_huggingface_runtime_vllm_backend(runner) -> None:
    (r,) = read("kserve-hf-vllm-qwen25.yaml")
    assert (r.model, r.gpu, r.gpu_key, r.max_model_len, r.dtype) == (
        "Qwen/Qwen2.5-7B-Instruct", "l4", "L4", 16384, "bfloat16")  # Karpenter's instance-gpu-name
    code, results = verdicts(runner, DATA / "kserve-hf-vllm-qwen25.yaml")
    assert code == 0 and results["qwen25-7b"]["verdict"] == "fits"


# --- compose -------------------------------------------------------------------------------------------------


def test_compose_device_reservations(runner) -> None:
    sglang, vllm = read("compose-gpus.yaml")
    assert (sglang.engine, sglang.num_gpus, sglang.tensor_parallel_size) == ("sglang", 2, 2)
    assert sglang.max_model_len == 32768  # --context-length
    assert (vllm.model, vllm.num_gpus, vllm.max_model_len) == ("meta-llama/Llama-3.2-3B-Instruct", 1, 16384)
    code, results = verdicts(runner, DATA / "compose-gpus.yaml")
    assert code == 0 and {r["verdict"] for r in results.values()} == {"fits"}


# --- args as one shell string, $(VAR) -------------------------------------------------------------------------


def test_shell_string_args_and_lines_per_flag(runner) -> None:
    gemma, phi = read("k8s-shell-args.yaml")
    assert (gemma.model, gemma.max_model_len, gemma.max_num_seqs, gemma.replicas) == (
        "google/gemma-2-9b-it", 8192, 32, 3)
    # The block scalar starts on line 20; each flag is reported on its own line.
    assert (gemma.line_of("--max-model-len"), gemma.line_of("--gpu-memory-utilization")) == (22, 23)
    assert (phi.model, phi.gpu_key, phi.enable_prefix_caching) == ("microsoft/phi-4", "A100-80GB-PCIE", True)
    result = run_cli(runner, "check", str(DATA / "k8s-shell-args.yaml"), "--offline", "--format", "github")
    # gemma-2-9b on one L4 does not fit 8192 tokens; the fix raises --gpu-memory-utilization, so the error
    # points at that flag's line (23), not at the container (15).
    error = next(line for line in result.stdout.splitlines() if line.startswith("::error"))
    assert "Fix: set --gpu-memory-utilization 0.95" in error
    assert f"file={DATA / 'k8s-shell-args.yaml'},line=23," in error
    assert result.exit_code == 1


# --- GPU inference -------------------------------------------------------------------------------------------


def test_unknown_gpu_label_names_the_closest_catalog_entries() -> None:
    (r,) = read("k8s-unknown-gpu-label.yaml")
    (gap,) = r.unresolved
    assert gap.field == "gpu" and gap.line == 8
    assert "unknown GPU 'NVIDIA-H100-80GB-HBM4'; did you mean H100-80GB" in gap.reason


def test_gpu_flag_overrides_the_file_and_gpu_mem_fills_memory() -> None:
    (r,) = read("k8s-unknown-gpu-label.yaml", gpu="H200")
    assert (r.gpu, r.gpu_source, r.gpu_key, r.unresolved) == ("H200", "--gpu", "H200", ())
    assert "GPU H200 from --gpu (the file says NVIDIA-H100-80GB-HBM4)" in r.notes
    (r,) = read("k8s-unknown-gpu-label.yaml", gpu_memory_bytes=96 * 2**30)
    assert (r.gpu_key, r.gpu_memory_bytes, r.unresolved) == (None, 96 * 2**30, ())
    (r,) = read("eks-llama31-8b-g6e.yaml", gpu_memory_bytes=40 * 2**30)
    assert (r.gpu_key, r.gpu_memory_bytes) == ("L40S", 40 * 2**30)  # --gpu-mem wins over the catalog


def test_gpu_mem_is_evaluated(runner) -> None:
    code, results = verdicts(runner, DATA / "k8s-unknown-gpu-label.yaml", extra=("--gpu-mem", "94GiB"))
    assert results["odd-gpu/vllm"]["verdict"] == "fits"


# --- the wrong verdicts of the issue ---------------------------------------------------------------------------


def test_multinode_statefulset_counts_every_node(runner) -> None:
    (r,) = read("sts-sglang-multinode-deepseek-v3.yaml")
    # 2 pods x 8 H100 with --nnodes 2 are ONE engine of tp 16, not 2 replicas short of GPUs.
    assert (r.gpus_per_pod, r.pods_per_instance, r.num_gpus, r.replicas, r.tensor_parallel_size) == (8, 2, 16, 1, 16)
    assert not any("only 8" in n for n in r.notes)
    code, results = verdicts(runner, DATA / "sts-sglang-multinode-deepseek-v3.yaml")
    assert results["deepseek-v3/sglang"]["verdict"] == "fits" and code == 0


def test_dp_attention_does_not_multiply_gpus(runner) -> None:
    (r,) = read("sglang-dp-attention-deepseek-v3.yaml")
    assert (r.dp_attention, r.data_parallel_size, r.tensor_parallel_size, r.num_gpus) == (True, 8, 8, 8)
    assert not any("needs 64" in n for n in r.notes)  # DP-attention ranks share the TP8 GPUs
    code, results = verdicts(runner, DATA / "sglang-dp-attention-deepseek-v3.yaml")
    assert results["deepseek-v3-dpa/sglang"]["verdict"] == "fits"


def test_serve_positional_is_dropped_and_the_real_model_evaluated(runner) -> None:
    (r,) = read("vllm-serve-positional-qwen3-235b.yaml")
    assert r.model == "Qwen/Qwen3-235B-A22B" and r.tensor_parallel_size == 4
    assert "dropped 'serve' from args: the image's entrypoint already runs vllm serve" in r.notes
    code, results = verdicts(runner, DATA / "vllm-serve-positional-qwen3-235b.yaml")
    # 235B parameters in bf16 are 438 GiB; 4 x 79.19 GiB cannot hold them.
    assert results["qwen3-235b/vllm"]["verdict"] == "does_not_fit" and code == 1


def test_expert_parallel_is_read() -> None:
    (r,) = read("lws-vllm-deepseek-r1-dp32-ep.yaml")
    assert (r.expert_parallel, r.data_parallel_size, r.data_parallel_size_local) == (True, 32, 8)
    assert (r.pods_per_instance, r.gpus_per_pod, r.num_gpus) == (4, 8, 32)


def test_expert_parallel_places_experts_over_the_ep_group(runner) -> None:
    # DeepSeek-R1's 627 GiB of fp8 weights are mostly experts; over 32 H200 each holds ~1/32 of them.
    _, results = verdicts(runner, DATA / "lws-vllm-deepseek-r1-dp32-ep.yaml")
    assert results["deepseek-r1-wide-ep/vllm"]["verdict"] == "fits"


def test_cpu_offload_is_read() -> None:
    catalog = read_paths([str(REFERENCE / "kubeai-helm-values-models-catalog.yaml")]).requests
    (r,) = [r for r in catalog if r.name == "llama-3.3-70b-instruct-bf16-gh200"]
    assert (r.cpu_offload_bytes, r.gpu_key) == (60 * 2**30, "GH200-96GB")  # --cpu-offload-gb is GiB in vLLM


def test_cpu_offload_keeps_70b_bf16_on_one_gh200(runner) -> None:
    # 70B bf16 is ~131 GiB; with 60 GiB offloaded ~71 GiB stay on the GH200's 94.88 GiB: it fits on 1 GPU.
    _, results = verdicts(runner, REFERENCE / "kubeai-helm-values-models-catalog.yaml")
    assert results["llama-3.3-70b-instruct-bf16-gh200"]["verdict"] == "fits"


def test_tgi_quantize_and_default_max_total_tokens_are_read() -> None:
    (nf4,) = read_paths([str(REFERENCE / "gke-tgi-llama3-70b-nf4-2xl4-env.yaml")]).requests
    assert (nf4.quantization, nf4.engine_version, nf4.max_model_len_cap_tokens) == ("bitsandbytes-nf4", "2.1", 4096)
    (tgi,) = read("tgi-llama31-8b-l4-defaults.yaml")
    assert (tgi.max_model_len, tgi.max_model_len_cap_tokens, tgi.engine_version) == (None, 4096, "2.4.1")


def test_tgi_bitsandbytes_nf4_70b_fits_two_l4(runner) -> None:
    # GKE's TGI tutorial (QUANTIZE=bitsandbytes-nf4, NUM_SHARD=2 on L4s) with the bundled Llama-3.1-70B (the
    # tutorial's Llama-3-70B is not bundled). Its 80 layers hold 68,451,041,280 linear weights: nf4 packs
    # them in 4 bits (34,225,520,640 B) with an 8-bit absmax per 64 (1,069,547,520 B); the embeddings and the
    # head stay bf16 (2 x 1,050,673,152 x 2 B) and so do the norms (1,318,912 x 2 B): 39,500,398,592 B. Over
    # two shards: 17,647,534,080 B of linear layers, 2,101,346,304 B of embeddings and head, and the norms
    # whole on each (2,637,824 B) = 19,751,518,208 B per L4.
    _, results = verdicts(runner, DATA / "tgi-llama31-70b-nf4-2xl4.yaml")
    (result,) = results.values()
    weights = {t["name"]: t["bytes"] for t in result["figures"]["terms"]}["weights"]
    assert weights == 19_751_518_208
    assert result["verdict"] == "fits"


def test_tgi_default_max_total_tokens(runner) -> None:
    # TGI 2.4 serves min(131,072, 4096) = 4096 tokens: 4096 x 131,072 B = 0.5 GiB of KV, which an L4 holds.
    _, results = verdicts(runner, DATA / "tgi-llama31-8b-l4-defaults.yaml")
    assert results["tgi-llama31-8b/tgi"]["verdict"] == "fits"


def test_replicas_are_read() -> None:
    (r,) = read("kvplan-replicas.yaml")
    assert (r.replicas, r.gpus_per_pod, r.max_num_seqs) == (4, 1, 40)


def test_replicas_share_the_concurrency(runner) -> None:
    # 40 requests x 32,768 tokens x 131,072 B = 160 GiB; four replicas hold 10 each = 40 GiB < 55.85 GiB.
    _, results = verdicts(runner, DATA / "kvplan-replicas.yaml")
    assert results["chat-replicas"]["verdict"] == "fits"


# --- every reference file with model, engine and GPU is evaluated ------------------------------------------------


def test_reference_deployments_with_everything_stated_are_evaluated(runner) -> None:
    from kvplan.sources.library import lookup

    run = run_cli(runner, "check", str(REFERENCE), "--offline", "--format", "json")
    evaluated = 0
    for result in json.loads(run.stdout)["results"]:
        bundled = result["model"] is not None and lookup(result["model"]) is not None
        stated = (bundled and result["engine"] in ("vllm", "sglang", "tgi") and result["gpu_key"] is not None
                  and not result["unresolved"])
        if stated:
            assert result["verdict"] in ("fits", "does_not_fit"), result
            evaluated += 1
    assert evaluated >= 10  # 9 GKE/KubeAI/production-stack deployments and the KubeAI catalog's
