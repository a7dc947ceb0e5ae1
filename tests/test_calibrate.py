"""`kvplan calibrate` on real start-up logs (tests/data/logs, sources in SOURCES.md): what it reads, what it
compares, the profile it saves, and the loop's two checks (the same deployment reproduces the log within 0.5%;
changing only the utilization moves the KV memory by exactly the change x the GPU total)."""

from __future__ import annotations

import json
import math
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from kvplan.calibrate.compare import Report, calibrate
from kvplan.calibrate.formats import read_log
from kvplan.calibrate.log import StartupLog
from kvplan.calibrate.profile import load_profile, save_profile
from kvplan.calibrate.vllm_log import graph_estimate
from kvplan.capacity.deployment import Deployment
from kvplan.errors import InputError
from kvplan.planner.verdict import plan
from kvplan.units import GiB
from tests.conftest import run_cli

DATA = Path(__file__).parent / "data" / "logs"


def _read(name: str) -> StartupLog:
    return read_log((DATA / name).read_text(), name)


def _calibrate(name: str, **kw) -> Report:
    return calibrate(_read(name), offline=True, **kw)


def _gib(x: float) -> int:
    """A figure the engine printed as x GiB, as kvplan stores it: round(x x 2^30) bytes."""
    return round(x * GiB)


# --- reading ---------------------------------------------------------------------------------------------------


def test_reads_the_vllm_0_19_reference_log():
    log = _read("vllm-0.19-h100-codellama-7b.log")
    assert (log.engine, log.version, log.outcome) == ("vllm", "0.19.0", "started")
    r = log.primary
    # The worker snapshot, the profiling summary and "Available KV cache memory", as printed.
    assert r.get("total").as_int == _gib(79.19) and r.get("free_at_start").as_int == _gib(78.68)
    assert r.get("context").as_int == _gib(0.51)
    assert (r.get("weights").as_int, r.get("activation_peak").as_int, r.get("non_torch").as_int) == (
        _gib(12.56), _gib(0.77), _gib(0.25))
    assert r.get("available_kv").as_int == _gib(61.66) and r.get("cuda_graph_actual").as_int == _gib(0.89)
    assert log.get("kv_tokens").value == 126_256 and log.get("num_blocks").value == 7_891
    assert (log.get("max_concurrency").value, log.get("concurrency_len").value) == (15.41, 8192)
    s = log.settings
    assert (s.model, s.max_model_len, s.utilization, s.enable_prefix_caching) == (
        "codellama/CodeLlama-7b-hf", 8192, 0.95, False)
    assert {"model", "max_model_len", "utilization", "enable_prefix_caching"} <= s.user_set
    # A figure printed with two decimals is known to half a hundredth of a GiB.
    assert r.get("weights").resolution == GiB / 100


def test_reads_each_tp_rank_and_a_record_after_a_progress_bar():
    log = _read("vllm-0.10-a100-tp2-qwen2-7b.log")
    assert [r.rank for r in log.ranks] == ["TP0", "TP1"]
    for r in log.ranks:
        assert r.get("weights").as_int == _gib(7.1217) and r.get("available_kv").as_int == _gib(12.02)
        # TP1's "Graph capturing finished" line follows a tqdm bar on the same terminal line.
        assert r.get("cuda_graph_actual").as_int == _gib(0.65)
    assert log.settings.tp == 2 and log.get("kv_tokens").value == 450_192


def test_reads_ray_workers_by_pid_and_node():
    log = _read("vllm-0.10-a100-ray-tp4-gpt-oss-120b.log")
    ranks = {r.rank for r in log.ranks}
    assert {"pid 345 @ 10.42.11.243", "pid 343 @ 10.42.9.224", "pid 1273"} <= ranks
    assert all(r.get("weights").as_int == _gib(17.2217) for r in log.ranks)
    assert log.get("kv_tokens").value == 2_640_144 and log.settings.tp == 4


def test_joins_lines_the_terminal_hard_wrapped():
    # The file wraps at the terminal's width, even inside the non-default args and a number's line.
    log = _read("vllm-0.10-a100-wrapped-qwen2-7b.log")
    s = log.settings
    assert (s.model, s.max_model_len, s.utilization, s.tp) == ("Qwen2-7B-Instruct", 16384, 0.25, 1)
    assert log.primary.get("available_kv").as_int == _gib(5.01) and log.get("kv_tokens").value == 93_872


def test_reads_a_v0_log_and_the_wrapper_around_it():
    log = _read("vllm-0.8-t4-v0-llama-3.2-3b.log")
    r = log.primary
    # V0: "total_gpu_memory (14.74GiB) x gpu_memory_utilization (0.59) = 8.76GiB" and the line after it. The
    # finest figure wins: "Model loading took 6.2473 GiB" over "model weights take 6.25GiB", and Unsloth's
    # "Max memory: 14.741 GB" (torch's total in GiB, three decimals) over vLLM's 14.74.
    assert (r.get("total").as_int, r.get("requested").as_int) == (_gib(14.741), _gib(8.76))
    assert r.get("weights").as_int == _gib(6.2473)
    assert (r.get("activation_peak").as_int, r.get("non_torch").as_int, r.get("available_kv").as_int) == (
        _gib(0.75), _gib(0.03), _gib(1.74))
    assert log.get("num_blocks").value == 1_017
    # Unsloth chose these and passed them on: the user's settings, not vLLM's defaults.
    s = log.settings
    assert (s.device_name, s.utilization, s.max_num_seqs, s.max_num_batched_tokens) == ("Tesla T4", 0.5943, 160,
                                                                                       2048)
    assert {"utilization", "max_num_seqs"} <= s.user_set


def test_reads_refusals_and_their_figures():
    oom = _read("vllm-rtx3090-kv-oom-llama-3.1-8b.log")
    assert oom.outcome == "kv_oom" and "larger than the maximum number of tokens" in oom.error
    assert oom.get("kv_tokens").value == 23_648 and oom.primary.get("available_kv").as_int == _gib(2.89)
    sampler = _read("vllm-0.11-sampler-oom.log")
    # The error is wrapped over three lines; read whole, it names the 1,024 dummy requests.
    assert sampler.outcome == "oom_other" and sampler.get("sampler_requests").value == 1024
    assert sampler.error.endswith("when initializing the engine.")


def test_reads_a_pasted_docker_run_of_the_vllm_image():
    # The image's entrypoint is `vllm serve`: the model follows the image, the flags after it; the shell's line
    # continuations are dropped, and an image install is recorded (the tag "latest" names no release).
    log = _read("vllm-0.27-4xrtxpro6000-docker-qwen3-235b-fp8.log")
    s = log.settings
    assert (s.model, s.tp, s.max_model_len, s.max_num_seqs, s.utilization, s.install) == (
        "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", 4, 32768, 32, 0.9, "image")
    assert log.version is None
    tagged = read_log("docker run --gpus all vllm/vllm-openai:v0.27.1 Qwen/Qwen3-8B --enforce-eager \\\n"
                      "  --max-model-len 8192\nINFO [gpu_worker.py:563] Available KV cache memory: 20.00 GiB\n", "cmd")
    assert (tagged.version, tagged.settings.model, tagged.settings.enforce_eager, tagged.settings.max_model_len) == (
        "0.27.1", "Qwen/Qwen3-8B", True, 8192)


def test_reads_the_newest_one_line_summary():
    log = _read("vllm-0.31-qwen2.5-coder-1.5b.log")
    assert log.version == "0.31.0"
    assert (log.get("kv_tokens").value, log.get("max_concurrency").value) == (1_207_072, 73.67)
    r = log.primary
    assert (r.get("consumed").as_int, r.get("cuda_graph_estimate").as_int) == (_gib(3.31), _gib(0.35))


def test_reads_the_graph_estimate_printed_as_a_share_of_the_total():
    # gpu_worker.py (0.18.1+) prints round(util - estimate / total, 4): 0.31.0 on a 39.49 GiB card,
    # (0.9200 - 0.9110) x 42,402,064,630 B (39.49 GiB) = 381,618,582 B, the 0.35 GiB its pool line estimates,
    # to 1 / 10,000 of the total.
    log = _read("vllm-0.31-qwen2.5-coder-1.5b.log")
    got = graph_estimate(log, _gib(39.49))
    assert got is not None and got.as_int == 381_618_582 and got.resolution == _gib(39.49) / 10_000
    assert abs(got.as_int - log.get("cuda_graph_estimate").as_int) < _gib(0.005) + got.resolution
    # 0.18-0.19 without the estimate in the budget print the raised utilization instead: (0.9063 - 0.9000) x
    # 85,520,809,984 B (H100's total) = 538,781,103 B. Capped at 1.0 it is only a bound, so nothing is read.
    for raised, expected in (("0.9063", 538_781_103), ("1.0000", None)):
        line = ("INFO [gpu_worker.py:470] In v0.19, CUDA graph memory profiling will be enabled by default ... and "
                f"increase --gpu-memory-utilization from 0.9000 to {raised} to maintain the same effective KV cache "
                "size.\nINFO [gpu_worker.py:405] Available KV cache memory: 60.00 GiB\n")
        share = graph_estimate(read_log(line, "0.19"), 85_520_809_984)
        assert (share and share.as_int) == expected
    # On 0.20+ the same advice follows a warning that the user turned the estimate off: said, since kvplan plans
    # those releases with the estimate in the budget.
    off = read_log("WARNING [gpu_worker.py:490] CUDA graph memory profiling is disabled "
                   "(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph memory is not accounted "
                   "for during KV cache allocation ... increasing --gpu-memory-utilization from 0.9000 to 0.9063.\n"
                   "INFO [gpu_worker.py:470] Available KV cache memory: 60.00 GiB\n", "0.26")
    assert any("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in n for n in off.notes)
    assert not any("ESTIMATE_CUDAGRAPHS" in n for n in log.notes)


def test_model_runner_v2_prints_its_graph_estimate_only_as_a_share():
    # 0.30.0's V2 runner on a T4 prints no "Estimated CUDA graph memory" line; its share, (0.8500 - 0.8265) x
    # 15,835,660,288 B (T4's CUDA total) = 372,138,017 B, is what the budget subtracted, not the 0.28 GiB the
    # later capture took. The profile keeps it as the graph term and derives the activation from the rest.
    report = _calibrate("vllm-0.30-t4-qwen2.5-1.5b.log", gpu="T4")
    graphs = next(c for c in report.components if c.key == "cuda_graphs")
    assert graphs.logged is not None and graphs.logged.as_int == 372_138_017
    assert report.profile is not None and report.profile.cuda_graph_bytes == 372_138_017
    assert report.provenance["cuda_graph_bytes"].startswith("derived: line 15, the estimate as a share")


def test_reads_sglang_lines_and_its_launch_command():
    log = _read("sglang-0.4.3-4xl4-qwq-32b.log")
    assert log.engine == "sglang" and [r.rank for r in log.ranks] == ["TP0"]
    r = log.primary
    assert (r.get("free_before_load").as_int, r.get("free_after_load").as_int, r.get("weights").as_int) == (
        _gib(21.63), _gib(6.09), _gib(15.54))
    assert (r.get("pool_tokens").value, r.get("k_bytes").as_int, r.get("free_after_pool").as_int) == (
        46_611, _gib(1.42), _gib(2.09))
    assert (log.get("max_running_requests").value, log.get("context_len").value) == (2049, 131_072)
    assert (log.settings.tp, log.settings.max_num_batched_tokens) == (4, 2048)
    assert log.settings.model == "/home/model/Qwen/QwQ-32B"  # --model-path, which the engine loaded


def test_reads_sglang_server_args_shortened_in_the_middle():
    log = _read("sglang-tp2-qwen3-14b.log")
    s = log.settings
    # The quoted server_args line drops pieces as "[...]"; the pairs around each piece stand. tp is not in the
    # quote: the ranks TP0 and TP1 say it.
    assert (s.utilization, s.max_num_seqs, s.dtype, s.tp) == (0.65, 1, "half", 2)
    assert [r.rank for r in log.ranks] == ["TP0", "TP1"]


def test_terminal_and_pod_decorations_do_not_change_what_is_read():
    text = (DATA / "vllm-0.19-h100-codellama-7b.log").read_text()
    plain = read_log(text, "plain")
    colour = "\n".join(f"[pod/vllm-7d9f/vllm] 2026-01-02T03:04:05.123456Z \x1b[1;36m{line}\x1b[0m"
                       for line in text.splitlines())
    compose = "\n".join(f"vllm-1  | {line}" for line in text.splitlines())
    # A terminal 80 columns wide wraps every long line.
    wrapped = "\n".join(piece for line in text.splitlines() for piece in textwrap.wrap(
        line, 80, drop_whitespace=False, break_on_hyphens=False) or [""])
    for variant in (colour, compose, wrapped):
        log = read_log(variant, "variant")
        assert [(x.key, x.value) for x in log.primary.readings] == [(x.key, x.value) for x in plain.primary.readings]
        assert [(x.key, x.value) for x in log.summary] == [(x.key, x.value) for x in plain.summary]
        assert log.settings == plain.settings


def test_no_start_up_lines_is_an_error_naming_what_was_looked_for():
    with pytest.raises(InputError, match="no vLLM or SGLang start-up lines"):
        read_log("hello\nworld\n", "notes.txt")
    with pytest.raises(InputError, match="TensorRT-LLM log"):
        read_log("[TensorRT-LLM][INFO] Using 10718 tokens in paged KV cache.", "trt.log")


# --- comparing ---------------------------------------------------------------------------------------------------


def test_compares_the_reference_log_with_the_same_deployment():
    r = _calibrate("vllm-0.19-h100-codellama-7b.log")
    d = r.deployment
    # The GPU is the catalog card whose CUDA total prints as the logged 79.19 GiB.
    assert (d.model.name, d.gpu.key, d.max_model_len) == ("codellama/CodeLlama-7b-hf", "H100-80GB", 8192)
    assert (d.engine.gpu_memory_utilization, d.engine.enable_prefix_caching) == (0.95, False)
    assert r.outcome.right is True and r.headline.key == "available_kv"
    weights = next(c for c in r.components if c.key == "weights")
    assert weights.logged.as_int == _gib(12.56) and weights.predicted is not None
    # Every term of the profile is measured, each with the line it came from.
    p = r.profile
    assert (p.total_memory_bytes, p.weights_bytes, p.activation_peak_bytes, p.non_torch_bytes) == (
        _gib(79.19), _gib(12.56), _gib(0.77), _gib(0.25))
    assert r.provenance["weights_bytes"].startswith("measured: line ")
    assert (p.model, p.gpu_name, p.tp, p.engine_version) == ("codellama/CodeLlama-7b-hf", "H100-80GB", 1, "0.19.0")


def test_reads_the_engine_and_what_the_log_shows_of_flashinfer():
    # Unsloth's T4 notebook ran vLLM 0.8.5's V0 engine (the release's default is V1).
    assert _read("vllm-0.8-t4-v0-llama-3.2-3b.log").settings.vllm_engine == "v0"
    assert _read("vllm-0.19-h100-codellama-7b.log").settings.vllm_engine == "v1"
    # 0.8-0.11 sample with FlashInfer whenever it is importable: the image ships it, a wheel in a virtualenv
    # does not; a log that shows neither leaves it open.
    shown = {
        "INFO 06-16 14:13:28 [topk_topp_sampler.py:50] Using FlashInfer for top-p & top-k sampling.": "image",
        "WARNING 07-17 03:28:00 [topk_topp_sampler.py:59] FlashInfer is not available. Falling back to the "
        "PyTorch-native implementation of top-p & top-k sampling.": "wheel",
        "Config file not found at ['/home/u/hw3/.venv/lib/python3.12/site-packages/vllm/model_executor/layers/"
        "fused_moe/configs/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json']": "wheel",
        # a conda environment (vllm-project/vllm#27508's traceback) is a pip install too; the image's own path is not
        "(EngineCore_DP0 pid=6880)   File \"/opt/conda/envs/vllm_env/lib/python3.13/site-packages/vllm/v1/core/"
        "kv_cache_utils.py\", line 1243, in get_kv_cache_configs": "wheel",
        "ERROR 11-18 18:07:28 engine.py:366]   File \"/usr/local/lib/python3.12/dist-packages/vllm/worker/worker.py\", "
        "line 493, in raise_if_cache_size_invalid": None,
        "INFO 06-16 14:13:11 [api_server.py:1896] vLLM API server version 0.10.2": None,
    }
    for line, install in shown.items():
        log = read_log(line + "\nINFO 06-16 14:13:56 [gpu_worker.py:298] Available KV cache memory: 8.68 GiB\n",
                       "x.log")
        assert log.settings.install == install, line


def test_the_sampler_the_log_names_is_the_sampler_planned():
    # 0.11.1+ takes FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1 (Unsloth sets it), 0.8-0.11.0 wherever it
    # is importable unless the variable is 0: the line says which the run took, and the plan takes the same.
    shown = {
        "INFO 11-25 15:08:03 [topk_topp_sampler.py:36] Using FlashInfer for top-p & top-k sampling.": True,
        "WARNING 04-01 10:00:00 [topk_topp_sampler.py:56] FlashInfer is available, but it is not enabled. Falling "
        "back to the PyTorch-native implementation of top-p & top-k sampling.": False,
        "WARNING 07-17 03:28:00 [topk_topp_sampler.py:59] FlashInfer is not available. Falling back to the "
        "PyTorch-native implementation of top-p & top-k sampling.": None,  # the install's doing (a wheel), not the env
    }
    for line, taken in shown.items():
        log = read_log(line + "\nINFO 06-16 14:13:56 [gpu_worker.py:298] Available KV cache memory: 8.68 GiB\n",
                       "x.log")
        assert log.settings.flashinfer_sampler is taken, line


def test_a_v0_profile_records_its_engine(tmp_path):
    r = _calibrate("vllm-0.8-t4-v0-llama-3.2-3b.log", model="meta-llama/Llama-3.2-3B-Instruct")
    assert r.deployment.engine.use_v1 is False and r.profile.vllm_engine == "v0"
    path = tmp_path / "t4.json"
    save_profile(str(path), r.profile, r.provenance)
    assert load_profile(str(path)).vllm_engine == "v0"


def test_without_a_model_or_gpu_it_says_what_to_pass():
    r = _calibrate("vllm-0.11-sampler-oom.log")
    assert r.deployment is None and "--model" in r.unpredicted
    r = _calibrate("sglang-tp2-qwen3-14b.log")
    assert r.deployment is None and "--gpu" in r.unpredicted


def test_an_unknown_activation_is_derived_from_the_budget_identity():
    # 0.11.0 on H100 prints weights and the KV memory only; with the catalog total and vLLM's util default 0.9
    # the activation peak is what is left: ceil(T x 0.9) - 14.2488 GiB - 56.25 GiB - non-torch.
    r = _calibrate("vllm-0.11-h100-qwen2.5-7b.log", gpu="H100")
    p = r.profile
    t = r.deployment.gpu.total_memory_bytes
    assert p.activation_peak_bytes == math.ceil(t * 0.9) - _gib(14.2488) - _gib(56.25) - p.non_torch_bytes
    assert r.provenance["activation_peak_bytes"].startswith("derived:")
    assert r.provenance["non_torch_bytes"].startswith("modelled:")


# --- the loop: same deployment, then one setting changed ---------------------------------------------------------

VLLM_LOOP = [
    pytest.param("vllm-0.19-h100-codellama-7b.log", {}, id="0.19-h100"),
    pytest.param("vllm-0.11-h100-qwen2.5-7b.log", {"gpu": "H100"}, id="0.11-h100"),
    pytest.param("vllm-0.10-a100-wrapped-qwen2-7b.log", {"gpu": "A100-80GB", "model": "Qwen/Qwen2.5-7B-Instruct"},
                 id="0.10-a100-util0.25"),
    pytest.param("vllm-0.10-a100-tp2-qwen2-7b.log", {"gpu": "A100-80GB", "model": "Qwen/Qwen2.5-7B-Instruct"},
                 id="0.10-a100-tp2"),
    # "Initializing a V0 LLM engine": planned on V0, which (0.6.5+) charges only the 0.03 GiB of non-torch growth
    # the log prints, not the CUDA context that 0.8.5's default V1 engine would charge.
    pytest.param("vllm-0.8-t4-v0-llama-3.2-3b.log", {"model": "meta-llama/Llama-3.2-3B-Instruct"}, id="0.8-t4-v0"),
    # 0.27's summary prints the CUDA-graph charge inside "peak activation" (85.51 - 56.89 - 0.76 = 27.86 GiB, the
    # logged 27.85); tp 4 comes from the pasted `docker run` of the vllm/vllm-openai image.
    pytest.param("vllm-0.27-4xrtxpro6000-docker-qwen3-235b-fp8.log",
                 {"gpu": "RTX-PRO-6000", "model": "Qwen/Qwen3-235B-A22B-FP8", "version": "0.27.1"}, id="0.27-tp4"),
    # Weights and KV memory only: activation and non-torch share what the budget leaves (split as modelled).
    pytest.param("vllm-0.11-h100-codellama-34b.log", {"gpu": "H100", "model": "codellama/CodeLlama-34b-Instruct-hf"},
                 id="0.11-h100-34b"),
    # More KV memory than the catalog's RTX 3090 total allows at 0.85: the box's total is derived.
    pytest.param("vllm-0.19-wsl-rtx3090-phi-3-mini.log", {"gpu": "RTX-3090"}, id="0.19-wsl-3090"),
]


@pytest.mark.parametrize(("name", "kw"), VLLM_LOOP)
def test_vllm_same_deployment_with_the_profile_reproduces_the_log(name, kw):
    r = _calibrate(name, **kw)
    v = plan(replace(r.deployment, profile=r.profile))  # what `kvplan estimate --profile` plans
    logged = r.log.primary.get("available_kv").value
    stages = v.account.detail.get("stages")
    available = stages[0]["available_kv_cache_bytes"] if stages else v.account.kv_budget_bytes
    assert abs(available - logged) <= 0.005 * logged


def test_terms_the_log_leaves_out_close_the_budget_as_modelled():
    # CodeLlama-34B on 0.11.0 prints weights (62.8571 GiB) and KV memory (8.18 GiB) only. The catalog H100
    # (85,028,372,480 B) at 0.9 gives 76,525,535,232 B, 71.27 GiB: 71.27 - 62.857 - 8.18 = 0.233 GiB for
    # activation and non-torch together, which kvplan models as 114,392,956 B and 256 MiB (0.11 and 0.25 GiB).
    # Each keeps its share of the sum: 0.070 and 0.163 GiB.
    r = _calibrate("vllm-0.11-h100-codellama-34b.log", gpu="H100", model="codellama/CodeLlama-34b-Instruct-hf")
    p, why = r.profile, r.provenance
    assert why["weights_bytes"].startswith("measured") and why["total_memory_bytes"].startswith("catalog")
    assert why["activation_peak_bytes"] == why["non_torch_bytes"]
    assert "activation + non-torch, split as kvplan models them" in why["non_torch_bytes"]
    requested = math.ceil(p.total_memory_bytes * 0.9)
    kv = r.log.primary.get("available_kv").as_int
    # The two share the rest to the byte (the log's KV figure, 8.18 GiB, is what the budget leaves).
    assert abs(requested - p.weights_bytes - kv - p.activation_peak_bytes - p.non_torch_bytes) <= 2**20
    assert 0 < p.activation_peak_bytes < p.non_torch_bytes


def test_a_total_the_catalog_cannot_reach_is_derived_and_the_profiling_override_is_not_the_kv_cache():
    # Phi-3-mini in float16 at 0.85 under WSL: 7.12 GiB of weights and 13.06 GiB of KV memory are 20.18 GiB, more
    # than 0.85 x the catalog's RTX 3090 (23.56 GiB) = 20.03 GiB before any activation. The profile takes the
    # total that leaves the logged KV memory beside kvplan's activation, non-torch (and the logged graph
    # estimate, which 0.19 does not subtract): about 24.05 GiB.
    r = _calibrate("vllm-0.19-wsl-rtx3090-phi-3-mini.log", gpu="RTX-3090")
    assert r.provenance["total_memory_bytes"].startswith("derived")
    assert "RTX-3090 total, 23.56 GiB, cannot" in r.provenance["total_memory_bytes"]
    assert 24.0 * GiB < r.profile.total_memory_bytes < 24.1 * GiB
    # "Overriding num_gpu_blocks=0 with num_gpu_blocks_override=512" is 0.19's CUDA-graph profiling cache (512 =
    # the largest capture size), printed before the KV cache is sized: not a block count.
    assert r.log.primary.get("num_blocks") is None


def _available(d: Deployment) -> int:
    a = plan(d).account
    stages = a.detail.get("stages")
    return stages[0]["available_kv_cache_bytes"] if stages else a.kv_budget_bytes


@pytest.mark.parametrize(("name", "kw"), [
    # The log prints the GPU total (79.19 GiB): the profile's, not the catalog's, must scale the utilization.
    pytest.param("vllm-0.19-h100-codellama-7b.log", {}, id="0.19-h100"),
    pytest.param("vllm-0.8-t4-v0-llama-3.2-3b.log", {"model": "meta-llama/Llama-3.2-3B-Instruct"}, id="0.8-t4"),
    # No total in the log: the profile holds the catalog's, and the change scales with it.
    pytest.param("vllm-0.11-h100-qwen2.5-7b.log", {"gpu": "H100"}, id="0.11-h100"),
])
def test_vllm_changing_only_the_utilization_moves_kv_memory_by_the_change_times_the_total(name, kw):
    r = _calibrate(name, **kw)
    d = replace(r.deployment, profile=r.profile)
    u = d.engine.gpu_memory_utilization or 0.9
    higher = replace(d, engine=replace(d.engine, gpu_memory_utilization=round(u + 0.03, 4)))
    total = r.profile.total_memory_bytes
    # requested = ceil(total x util): the difference is 0.03 x total to within the one byte each ceil may add.
    assert abs((_available(higher) - _available(d)) - 0.03 * total) <= 1


SGLANG_CASES = (
    # (log, calibrate arguments, logged pool tokens, id)
    ("sglang-0.4.3-4xl4-qwq-32b.log", {"gpu": "L4", "model": "Qwen/Qwen2.5-32B", "version": "0.4.3.post4"}, 46_611,
     "0.4.3-4xl4"),
    # The fraction is not in the log: the 0.4.x default for a multimodal model, 0.88 x 0.95.
    ("sglang-0.4.4-h200-gemma-3-4b.log", {"gpu": "H200", "model": "google/gemma-3-4b-it", "version": "0.4.4"},
     834_615, "0.4.4-h200"),
    ("sglang-tp2-qwen3-14b.log", {"gpu": "RTX-4090", "version": "0.5.9"}, 139_814, "0.5-tp2"),
    ("sglang-16gb-qwen2.5-7b-awq.log", {"gpu": "T4", "model": "Qwen/Qwen2.5-7B-Instruct"}, 133_052, "recent-16gb"),
)
SGLANG_LOOP = [pytest.param(name, kw, tokens, id=i) for name, kw, tokens, i in SGLANG_CASES]
SGLANG_LOGS = [pytest.param(name, kw, id=i) for name, kw, _, i in SGLANG_CASES]


@pytest.mark.parametrize(("name", "kw", "tokens"), SGLANG_LOOP)
def test_sglang_same_deployment_with_the_profile_reproduces_the_log(name, kw, tokens):
    r = _calibrate(name, **kw)
    v = plan(replace(r.deployment, profile=r.profile))
    assert abs(v.account.kv_cache_tokens - tokens) <= 0.005 * tokens


@pytest.mark.parametrize(("name", "kw"), SGLANG_LOGS)
def test_sglang_changing_only_the_fraction_moves_kv_memory_by_the_change_times_free_memory(name, kw):
    r = _calibrate(name, **kw)
    d = replace(r.deployment, profile=r.profile)
    f = d.engine.mem_fraction_static or 0.8  # the log's fraction, or one given where it used the default
    before = plan(replace(d, engine=replace(d.engine, mem_fraction_static=f))).account
    higher = plan(replace(d, engine=replace(d.engine, mem_fraction_static=round(f + 0.02, 6)))).account
    # The fraction SGLang applies (0.4.x multiplies a multimodal model's, as given, by 0.95 too).
    change = higher.detail["mem_fraction_static"] - before.detail["mem_fraction_static"]
    free = before.detail["free_before_load_bytes"]  # SGLang's fraction is of the memory free before loading
    # rest = free - weights - round(free x (1 - f)): change x free to within the byte each round may move.
    assert change == pytest.approx(0.02 * (0.95 if "gemma" in name else 1))
    assert abs((higher.kv_budget_bytes - before.kv_budget_bytes) - change * free) <= 1


# --- the profile file ------------------------------------------------------------------------------------------


def test_profile_file_round_trip_and_errors(tmp_path):
    r = _calibrate("vllm-0.19-h100-codellama-7b.log")
    path = tmp_path / "box.json"
    save_profile(str(path), r.profile, r.provenance)
    data = json.loads(path.read_text())
    assert data["kvplan_profile"] == 1 and data["provenance"] == r.provenance
    assert load_profile(str(path)) == r.profile
    for body, message in (
        ({**data, "kvplan_profile": 2}, "profile version 2; this kvplan reads version 1"),
        ({**data, "profile": {**data["profile"], "weight_bytes": 1}}, "unknown key profile.weight_bytes"),
        ({**data, "profile": {**data["profile"], "weights_bytes": "12 GiB"}}, "profile.weights_bytes must be"),
        ({"profile": data["profile"]}, "not a kvplan profile"),
    ):
        path.write_text(json.dumps(body))
        with pytest.raises(InputError, match=message):
            load_profile(str(path))
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a JSON profile"):
        load_profile(str(path))


# --- the command ------------------------------------------------------------------------------------------------


def _lines_fit(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80 and line == line.rstrip(), repr(line)


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.log")))
def test_calibrate_prints_within_80_columns_and_json_holds_the_same_figures(runner, name):
    args = ["calibrate", str(DATA / name), "--offline"]
    human = run_cli(runner, *args)
    assert human.exit_code == 0, human.output
    _lines_fit(human.stdout)
    doc = json.loads(run_cli(runner, *args, "--json").stdout)
    entry = doc["logs"][0]
    assert doc["schema_version"] == 1 and entry["engine"] in ("vllm", "sglang")
    for c in entry["components"]:
        if c["logged"] is not None and c["unit"] == "tokens":
            assert f"{c['logged']:,}" in human.stdout


def test_calibrate_save_then_estimate_with_the_profile(runner, tmp_path):
    box = tmp_path / "box.json"
    log = DATA / "sglang-0.4.3-4xl4-qwq-32b.log"
    saved = run_cli(runner, "calibrate", str(log), "--gpu", "L4", "--model", "Qwen/Qwen2.5-32B", "--engine-version",
                    "0.4.3.post4", "--save", str(box), "--offline")
    assert saved.exit_code == 0, saved.output
    assert "Profile saved to" in saved.stdout and json.loads(box.read_text())["profile"]["engine"] == "sglang"
    doc = json.loads(run_cli(runner, "estimate", "Qwen/Qwen2.5-32B", "--engine", "sglang", "--sglang-version",
                             "0.4.3.post4", "--tp", "4", "--max-model-len", "131072", "--mem-fraction-static",
                             "0.85", "--profile", str(box), "--json").stdout)
    # No --gpu: the profiled box's GPU. Its pool is the log's 46,611 tokens within 0.5%.
    g = doc["gpus"][0]
    assert g["gpu"] == "L4" and abs(g["kv_cache_tokens"] - 46_611) <= 0.005 * 46_611
    assert doc["request"]["profile"] == "sglang-0.4.3-4xl4-qwq-32b.log"


def test_vllm_calibrate_save_then_estimate_reproduces_the_log(runner, tmp_path):
    box = tmp_path / "box.json"
    log = DATA / "vllm-0.10-a100-wrapped-qwen2-7b.log"
    assert run_cli(runner, "calibrate", str(log), "--gpu", "A100-80GB", "--model", "Qwen/Qwen2.5-7B-Instruct",
                   "--save", str(box), "--offline").exit_code == 0
    doc = json.loads(run_cli(runner, "estimate", "Qwen/Qwen2.5-7B-Instruct", "--max-model-len", "16384",
                             "--gpu-memory-utilization", "0.25", "--profile", str(box), "--json").stdout)
    assert abs(doc["gpus"][0]["available_kv_cache_bytes"] - _gib(5.01)) <= 0.005 * _gib(5.01)


def test_calibrate_reads_stdin(runner):
    from kvplan.cli import app

    text = (DATA / "vllm-0.19-h100-codellama-7b.log").read_text()
    doc = json.loads(runner.invoke(app, ["calibrate", "-", "--json", "--offline"], input=text).stdout)
    assert doc["logs"][0]["source"] == "stdin" and doc["logs"][0]["engine_version"] == "0.19.0"


def test_calibrate_errors_are_one_line(runner, tmp_path):
    r = run_cli(runner, "calibrate", str(tmp_path / "missing.log"))
    assert r.exit_code == 2 and r.output.startswith("Error: cannot read log") and r.output.count("\n") == 1
    empty = tmp_path / "notes.txt"
    empty.write_text("nothing to see\n")
    r = run_cli(runner, "calibrate", str(empty))
    assert r.exit_code == 2 and "no vLLM or SGLang start-up lines" in r.output
    log = str(DATA / "vllm-0.19-h100-codellama-7b.log")
    r = run_cli(runner, "calibrate", log, log, "--save", str(tmp_path / "b.json"))
    assert r.exit_code == 2 and "give one log, not 2" in r.output
    r = run_cli(runner, "calibrate", str(DATA / "vllm-0.11-sampler-oom.log"), "--save", str(tmp_path / "b.json"))
    assert r.exit_code == 2 and "no profile, because the log does not name the model" in r.output


def test_estimate_and_check_refuse_a_bad_profile_in_one_line(runner, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kvplan_profile": 1, "profile": {"source": "x", "engine": "vllm", "tp": "two"}}))
    r = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--profile", str(bad))
    assert r.exit_code == 2 and r.output.startswith(f"Error: --profile {bad}: profile.tp must be")
    fixture = Path(__file__).parent / "fixtures" / "deploy" / "sglang.yaml"
    r = run_cli(runner, "check", str(fixture), "--offline", "--profile", str(bad))
    assert r.exit_code == 2 and "profile.tp must be" in r.output


def test_check_plans_with_the_profile(runner, tmp_path):
    box = tmp_path / "box.json"
    assert run_cli(runner, "calibrate", str(DATA / "vllm-0.19-h100-codellama-7b.log"), "--save", str(box),
                   "--offline").exit_code == 0
    fixture = Path(__file__).parent / "fixtures" / "deploy" / "sglang.yaml"
    r = run_cli(runner, "check", str(fixture), "--offline", "--profile", str(box), "--format", "json")
    assert r.exit_code in (0, 1), r.output
    assert json.loads(r.stdout)


def test_a_v2_logs_consumed_memory_holds_the_sampler_state_apart_from_non_torch():
    # vLLM 0.31 (Model Runner V2) prints "3.31 GiB for consumed memory (weights + non-torch)" beside 2.98 GiB of
    # weights. The consumed memory also holds V2's sampler state, which kvplan models on its own: 256 sequences x
    # (151,936 + 2 x cdiv(151,936, 32)) x 4 B = 256 x 161,432 x 4 = 165,306,368 B. The profile keeps that figure
    # and a non-torch figure net of it, and the same deployment replays the logged KV memory within 0.5%.
    r = _calibrate("vllm-0.31-qwen2.5-coder-1.5b.log", model="Qwen/Qwen2.5-1.5B-Instruct")
    p, why = r.profile, r.provenance
    assert p.sampler_state_bytes == 165_306_368 and why["sampler_state_bytes"].startswith("modelled")
    assert p.non_torch_bytes == _gib(3.31) - _gib(2.98) - 165_306_368
    assert "- the sampler state" in why["non_torch_bytes"]
    kv = next(c for c in r.components if c.key == "available_kv")
    assert kv.logged is not None and kv.replayed is not None
    assert abs(kv.relative(kv.replayed) or 0) <= 0.005
