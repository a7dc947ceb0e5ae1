"""Memory other processes hold on the GPU (--gpu-memory-in-use): what each engine and release makes of it
(docs/engine-rules.md 1.18)."""

from __future__ import annotations

import json

import pytest

from kvplan.capacity.deployment import Deployment, Workload
from kvplan.engines.sglang import SglangOptions, plan_sglang
from kvplan.engines.vllm import VllmFlags, plan_vllm
from kvplan.engines.vllm_memory import CONTEXT_BYTES, cuda_context_bytes
from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import find_gpu
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB, parse_size_or_share
from tests.conftest import run_cli

H100, L4, A100 = find_gpu("H100"), find_gpu("L4"), find_gpu("A100-80GB")
LLAMA = resolve_model("meta-llama/Llama-3.1-8B-Instruct", offline=True).model
QWEN3 = resolve_model("Qwen/Qwen3-8B", offline=True).model


def test_v1_refuses_to_start_when_other_processes_leave_less_than_it_asks():
    # 0.19 on H100 (85,028,372,480 B) at 0.95 asks ceil(total x 0.95) = 80,776,953,856 B (75.23 GiB). With 4 GiB
    # held elsewhere the snapshot finds total - context 547,608,330 - 4 GiB = 80,185,796,854 B (74.68 GiB) free.
    flags = VllmFlags(max_model_len=8192, version="0.19", gpu_memory_utilization=0.95)
    r = plan_vllm(LLAMA, flags, H100, in_use_bytes=4 * GiB)
    assert r.requested_bytes == 80_776_953_856
    assert H100.total_memory_bytes - CONTEXT_BYTES - 4 * GiB == 80_185_796_854
    assert r.refusal is not None and r.refusal.code == "startup_free_memory"
    assert r.refusal.message == (
        "Free memory on device cuda:0 (74.68/79.19 GiB) on startup is less than desired GPU memory utilization "
        "(0.95, 75.23 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    # 3 GiB leaves 75.68 GiB free: past the check, with the same budget as on an idle GPU (the snapshot's
    # budget counts vLLM's own usage only). But the sampler warm-up after the cache runs in what 0.95 leaves
    # out, and the other process holds most of it: 1.87 GiB needed, less free.
    idle, shared = plan_vllm(LLAMA, flags, H100), plan_vllm(LLAMA, flags, H100, in_use_bytes=3 * GiB)
    assert idle.refusal is None
    assert shared.available_kv_cache_bytes == idle.available_kv_cache_bytes
    assert shared.refusal is not None and shared.refusal.code == "sampler_warmup_oom"
    assert shared.warmup is not None and idle.warmup is not None
    assert idle.warmup.free_bytes - shared.warmup.free_bytes == 3 * GiB


def test_the_start_up_check_arrived_in_0_9_1_and_saw_communicators_from_0_11():
    # 0.9.0 has no check (its budget charges everything instead). At tp 2 over NVSwitch the communicators hold
    # 1.02 GiB before 0.19's snapshot: at 0.985 (78.33 GiB asked) 79.19 - 0.51 - 1.02 = 77.66 GiB is free, short.
    # 0.10.2 takes its snapshot before the communicators exist, so 78.68 GiB is free and it starts.
    at = {"max_model_len": 8192, "gpu_memory_utilization": 0.985, "tensor_parallel_size": 2}
    assert plan_vllm(LLAMA, VllmFlags(version="0.19", **at), H100).refusal.code == "startup_free_memory"
    early = plan_vllm(LLAMA, VllmFlags(version="0.10.2", **at), H100).refusal
    assert early is None or early.code != "startup_free_memory"
    old = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.9.0", gpu_memory_utilization=0.5), H100,
                    in_use_bytes=30 * GiB)
    assert old.refusal is None or old.refusal.code != "startup_free_memory"


def test_v1_up_to_0_9_0_charges_other_processes_byte_for_byte():
    # vllm-project/vllm#17431: Qwen3-8B at 0.4 on an A800 (A100-80GB) fails on 0.8.5's V1 beside another
    # instance. The "absolute" budget subtracts everything in use: 1 GiB elsewhere is 1 GiB less KV memory,
    # and a second 0.4 instance (31.74 GiB) leaves none.
    flags = VllmFlags(max_model_len=8192, version="0.8.5", gpu_memory_utilization=0.4)
    idle = plan_vllm(QWEN3, flags, A100)
    one = plan_vllm(QWEN3, flags, A100, in_use_bytes=GiB)
    assert idle.refusal is None
    assert idle.available_kv_cache_bytes - one.available_kv_cache_bytes == GiB
    other_instance = int(A100.total_memory_bytes * 0.4)
    assert plan_vllm(QWEN3, flags, A100, in_use_bytes=other_instance).refusal.code == "no_kv_memory"


def test_v0_sizes_its_cache_blind_to_other_processes_then_cannot_allocate_it():
    # V0 0.7.3 on an L4 at 0.9: the budget counts only its own usage, so the cache is the same with 1 GiB held
    # elsewhere; with 4 GiB the cache (1,850 blocks of 2 MiB, 3.61 GiB) no longer fits the 2.66 GiB left after
    # the weights: 23,654,825,984 - context - 4 GiB - weights - growth.
    flags = VllmFlags(max_model_len=2048, version="0.7.3", gpu_memory_utilization=0.9)
    idle = plan_vllm(LLAMA, flags, L4)
    assert plan_vllm(LLAMA, flags, L4, in_use_bytes=GiB).available_kv_cache_bytes == idle.available_kv_cache_bytes
    r = plan_vllm(LLAMA, flags, L4, in_use_bytes=4 * GiB)
    assert r.refusal is not None and r.refusal.code == "kv_alloc_oom"
    m = r.stages[0].memory
    free = L4.total_memory_bytes - cuda_context_bytes("L4") - 4 * GiB - m.weights_bytes - m.non_torch.growth_bytes
    assert r.num_blocks * r.stages[0].layout.bytes_per_block > free
    assert "3.61 GiB for 1,850 blocks, 2.66 GiB free after loading" in r.refusal.message


def test_sglang_loses_what_other_processes_hold_from_its_free_memory():
    d = Deployment(model=LLAMA, gpu=H100, engine=SglangOptions(mem_fraction_static=0.85),
                   workload=Workload(max_model_len=8192))
    idle = plan_sglang(d)
    shared = plan_sglang(Deployment(**{**d.__dict__, "gpu_in_use_bytes": 2 * GiB}))
    assert idle.free_before_load_bytes - shared.free_before_load_bytes == 2 * GiB
    assert shared.max_total_num_tokens < idle.max_total_num_tokens


def test_in_use_must_leave_some_of_the_gpu():
    d = Deployment(model=LLAMA, gpu=L4, engine=SglangOptions(), gpu_in_use_bytes=L4.total_memory_bytes)
    with pytest.raises(FieldError, match="gpu.in_use_bytes"):
        d.validate()


def test_estimate_and_check_take_the_flag(runner, tmp_path):
    base = ("estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192",
            "--vllm-version", "0.19", "--gpu-memory-utilization", "0.95", "--offline")
    r = run_cli(runner, *base, "--gpu-memory-in-use", "4GiB")
    assert r.exit_code == 1 and r.stdout.startswith("DOES NOT FIT")
    # The fix lowers the utilization below what the other processes leave free.
    assert "Best fix: --gpu-memory-utilization 0.93" in " ".join(r.stdout.split())
    at_09 = [a if a != "0.95" else "0.9" for a in base]
    doc = json.loads(run_cli(runner, *at_09, "--gpu-memory-in-use", "3GiB", "--json").stdout)
    assert doc["request"]["gpu_memory_in_use_bytes"] == 3 * GiB and doc["fits"] is True
    bad = run_cli(runner, *base, "--gpu-memory-in-use", "90GiB")
    assert bad.exit_code != 0 and "--gpu-memory-in-use" in bad.stderr and "Traceback" not in bad.stderr
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "services:\n  llm:\n    image: vllm/vllm-openai:v0.19.0\n"
        "    command: [\"--model\", \"meta-llama/Llama-3.1-8B-Instruct\", \"--max-model-len\", \"8192\", "
        "\"--gpu-memory-utilization\", \"0.95\"]\n"
        "    deploy:\n      resources:\n        reservations:\n          devices:\n"
        "            - driver: nvidia\n              count: 1\n              capabilities: [gpu]\n")
    ok = run_cli(runner, "check", str(deploy), "--gpu", "H100", "--offline")
    shared = run_cli(runner, "check", str(deploy), "--gpu", "H100", "--offline", "--gpu-memory-in-use", "4GiB")
    assert (ok.exit_code, shared.exit_code) == (0, 1)


@pytest.mark.parametrize(("engine", "held"), [("tgi", 2 * GiB), ("trtllm", 2 * GiB), ("transformers", 20 * GiB),
                                              ("generic", 20 * GiB)])
def test_engines_that_measure_free_memory_lose_what_other_processes_hold(engine, held):
    # TGI and TensorRT-LLM measure free memory after start-up: any memory held elsewhere comes off. Transformers
    # and the generic engine use a share of the card (0.9 of 79.19 GiB): held memory bites only past the other
    # 7.92 GiB, so 2 GiB leaves them as they were and 20 GiB does not.
    from kvplan.engines import get_engine

    model = get_engine(engine)
    d = Deployment(model=LLAMA, gpu=H100, engine=model.default_options(), workload=Workload(max_model_len=8192))
    idle = model.account(d).kv_budget_bytes
    shared = model.account(Deployment(**{**d.__dict__, "gpu_in_use_bytes": held})).kv_budget_bytes
    assert 0 < shared < idle
    if held > 2 * GiB:
        assert model.account(Deployment(**{**d.__dict__, "gpu_in_use_bytes": 2 * GiB})).kv_budget_bytes == idle


@pytest.mark.parametrize(("text", "parsed"), [
    ("2GiB", (2 * GiB, 0.0)),
    ("30%", (0, 0.3)),
    (" 12.5 % ", (0, 0.125)),
    ("0%", (0, 0.0)),
])
def test_in_use_reads_a_size_or_a_share(text, parsed):
    assert parse_size_or_share(text, "--gpu-memory-in-use") == parsed


@pytest.mark.parametrize("text", ["100%", "-5%", "abc%", "nan%", "%", "1234567890123%"])
def test_a_share_must_leave_part_of_the_gpu(text):
    with pytest.raises(InputError, match="--gpu-memory-in-use"):
        parse_size_or_share(text, "--gpu-memory-in-use")


def test_a_share_is_of_each_cards_own_memory(runner, tmp_path):
    # 25% of H100's 85,028,372,480 CUDA bytes is 21,257,093,120 bytes (19.80 GiB): the same plan as that size.
    base = ("estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--max-model-len", "8192",
            "--vllm-version", "0.19", "--gpu-memory-utilization", "0.6", "--offline", "--json")
    share = json.loads(run_cli(runner, *base, "--gpu-memory-in-use", "25%").stdout)
    size = json.loads(run_cli(runner, *base, "--gpu-memory-in-use", "21257093120").stdout)
    assert share["request"]["gpu_memory_in_use_share"] == 0.25
    assert {k: v for k, v in share.items() if k != "request"} == {k: v for k, v in size.items() if k != "request"}
    # vLLM 0.19 refuses a start whose utilization (0.6) is above the share free at start-up: 30% in use leaves
    # under 0.70 free (less the CUDA context) and starts; 45% leaves under 0.55 and is refused.
    human = [a for a in base if a != "--json"]
    assert run_cli(runner, *human, "--gpu-memory-in-use", "30%").exit_code == 0
    assert run_cli(runner, *human, "--gpu-memory-in-use", "45%").exit_code == 1
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "services:\n  llm:\n    image: vllm/vllm-openai:v0.19.0\n"
        "    command: [\"--model\", \"meta-llama/Llama-3.1-8B-Instruct\", \"--max-model-len\", \"8192\", "
        "\"--gpu-memory-utilization\", \"0.6\"]\n"
        "    deploy:\n      resources:\n        reservations:\n          devices:\n"
        "            - driver: nvidia\n              count: 1\n              capabilities: [gpu]\n")
    runs = [run_cli(runner, "check", str(deploy), "--gpu", "H100", "--offline", "--gpu-memory-in-use", s)
            for s in ("30%", "45%")]
    assert [r.exit_code for r in runs] == [0, 1]
