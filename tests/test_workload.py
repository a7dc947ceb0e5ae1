"""workload_concurrency: requests of real lengths resident at once, derived by hand per engine unit and model kind.

Most tests pin vLLM's KV memory at 10 GiB (--kv-cache-memory-bytes) so the budget is hand arithmetic too:
blocks = 10 GiB // bytes per block, less vLLM's null block.
"""

from __future__ import annotations

import pytest

from kvplan.capacity.deployment import Deployment, RequestMix, Workload
from kvplan.engines.sglang import SglangOptions
from kvplan.engines.transformers import TransformersOptions
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.errors import FieldError
from kvplan.hardware.gpus import find_gpu
from kvplan.planner.verdict import plan
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli, run_json

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _plan(model: str, mix: RequestMix, *, length: int = 8192, engine=None, prefix: int = 0, hit: float = 1.0,
          gpu: str = "H100"):
    spec = resolve_model(model, offline=True).model
    options = engine or VllmOptions(kv_cache_memory_bytes=10 * GiB)
    workload = Workload(length, 1, shared_prefix_tokens=prefix, prefix_hit_rate=hit, mix=mix)
    return plan(Deployment(model=spec, gpu=find_gpu(gpu), engine=options, workload=workload))


MEANS = RequestMix.of([(2000, 500)])


def test_plain_gqa_blocks_of_prompt_plus_answer():
    # Llama-3.1-8B, bf16: a block holds 16 tokens x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 B = 2 MiB.
    # 10 GiB / 2 MiB = 5,120 blocks, 5,119 usable. At max-model-len 8,192 a request takes 512 blocks:
    # 1 + (5,119 - 512) // 512 = 9 requests. A 2,000 + 500-token request takes cdiv(2,500, 16) = 157:
    # 5,119 // 157 = 32 requests (157 x 32 = 5,024).
    v = _plan(LLAMA, MEANS)
    assert (v.pools[0].pool.budget_units, v.pools[0].pool.per_request_units) == (5119, 512)
    assert v.max_requests == 9
    assert v.workload.requests == 32 and v.workload.mean_units == (157,)


def test_the_issue_claim_2000_plus_500_on_8k_is_3_3x_not_3_5x():
    # The issue says "about 3.5x more requests than at the worst case". On an H100 with vLLM's own budget
    # (28,317 usable blocks for Llama-3.1-8B at 8,192 tokens on the current release's Model Runner V2, with a cold
    # compile cache, V2's sampler state and 0.33's cuBLAS handles in the baseline), the worst case holds
    # 28,317 // 512 = 55 requests and 2,500-token requests cdiv(2,500, 16) = 157 blocks each: 28,317 // 157 = 180:
    # 180 / 55 = 3.27x. The per-request ratio
    # is 512 / 157 = 3.26; "3.5x" holds only for the mean length mid-answer (2,250 tokens: 141 blocks), which
    # would let resident requests be preempted.
    v = _plan(LLAMA, MEANS, engine=VllmOptions())
    usable = v.pools[0].pool.budget_units
    assert usable == 28317
    assert v.max_requests == usable // 512 == 55 and v.workload.requests == usable // 157 == 180
    assert 3.27 < v.workload.requests / v.max_requests < 3.28


def test_sliding_window_keeps_window_plus_a_step_and_a_block():
    # Gemma-2-9B: 21 full + 21 sliding (4,096) layers, 8 KV heads x 256 x 2 x 2 B = 8 KiB a token a layer; two
    # groups of 21, a block = 16 x 8 KiB x 21 = 2,752,512 B; 10 GiB // that = 3,900 blocks, 3,899 usable.
    # 2,500 tokens: full 157 + sliding cdiv(min(4,095 + 8,192, 2,500), 16) + 1 = 158 -> 315; 3,899 // 315 = 12.
    # At max-model-len: 512 + 513 = 1,025 -> 1 + (3,899 - 1,025) // 1,025 = 3.
    v = _plan("google/gemma-2-9b-it", MEANS)
    assert v.pools[0].pool.budget_units == 3899
    assert v.workload.mean_units == (315,) and v.workload.requests == 12 and v.max_requests == 3


def test_sliding_window_caps_a_long_request():
    # With 1,024 tokens a step and two steps in flight (vLLM 0.26+ with async scheduling) the window keeps at most
    # 4,095 + 2 x 1,024 = 6,143 tokens: a 7,000-token request takes full cdiv(7,000, 16) = 438 + sliding
    # cdiv(6,143, 16) + 1 = 385 = 823 blocks, not 2 x 438.
    v = _plan("google/gemma-2-9b-it", RequestMix.of([(4000, 3000)]),
              engine=VllmOptions(kv_cache_memory_bytes=10 * GiB, max_num_batched_tokens=1024))
    assert v.workload.mean_units == (823,) and v.workload.requests == 3899 // 823 == 4


def test_mla_latent():
    # DeepSeek-V2-Lite: 27 MLA layers of (512 + 64) x 2 B = 1,152 B a token; a block 16 x 1,152 x 27 = 497,664 B;
    # 10 GiB // 497,664 = 21,575 blocks, 21,574 usable; 2,500 tokens -> 157 blocks -> 21,574 // 157 = 137
    # (157 x 137 = 21,509). Worst case: 1 + (21,574 - 512) // 512 = 42.
    v = _plan("deepseek-ai/DeepSeek-V2-Lite", MEANS)
    assert v.pools[0].pool.budget_units == 21574
    assert v.workload.requests == 137 and v.max_requests == 42


def test_hybrid_mamba_state_is_one_block_per_group():
    # Nemotron-3-Nano: 23 Mamba + 6 attention layers (2 KV heads x 128 x 2 x 2 B = 1 KiB a token). A Mamba state
    # (conv 6,144 x 3 x 2 B + ssm 64 x 64 x 128 x 4 B = 2,134,016 B) must fit one page, so vLLM raises the block
    # to 16 x cdiv(2,134,016, 16 x 1,024) = 2,096 tokens. Groups of 6 layers: 4 Mamba groups + 1 attention
    # group; a block = 2,096 KiB x 6 = 12,877,824 B; 10 GiB // that = 833, 832 usable.
    # 2,500 tokens: attention cdiv(2,500, 2,096) = 2 + one state block per Mamba group (4) = 6 -> 832 // 6 = 138.
    # Worst case 8,192: 4 + 4 = 8 -> 1 + (832 - 8) // 8 = 104.
    # 833 blocks hold one state block for each of at most 833 decode sequences: the default 1,024 is refused
    # (vLLM 0.20+, "exceeds available Mamba cache blocks"), so the plan runs 256. Prefix caching off: from 0.28 a
    # hybrid has it by default, and its align mode keeps more state pages a request (test_engine_vllm_versions).
    nano = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    v = _plan(nano, MEANS, engine=VllmOptions(kv_cache_memory_bytes=10 * GiB, max_num_seqs=256,
                                               enable_prefix_caching=False))
    assert v.pools[0].pool.budget_units == 832
    assert v.workload.mean_units == (6,) and v.workload.requests == 138 and v.max_requests == 104
    refused = _plan(nano, MEANS).account.refusal
    assert refused is not None and refused.code == "mamba_blocks" and "Mamba cache blocks (833)" in refused.message


def test_prefix_shared_once_at_its_hit_rate():
    # Llama-3.1-8B, 10 GiB (5,119 blocks), a 1,000-token shared prefix = 62 whole blocks.
    # Hit rate 1: each 157-block request holds 157 - 62 = 95 of its own: (5,119 - 62) // 95 = 53.
    # Hit rate 0.5: int(62 x 0.5) = 31 saved: (5,119 - 31) // 126 = 40 (126 x 40 = 5,040).
    # The max-model-len figure takes the rate too: 1 + (5,119 - 512) // (512 - 31) = 10 (11 at rate 1, 9 with
    # no prefix).
    full = _plan(LLAMA, MEANS, prefix=1000)
    half = _plan(LLAMA, MEANS, prefix=1000, hit=0.5)
    none = _plan(LLAMA, MEANS, prefix=1000, hit=0.0)
    assert full.pools[0].pool.shared_prefix_units == 62 and half.pools[0].pool.shared_prefix_units == 31
    assert (full.workload.requests, half.workload.requests, none.workload.requests) == (53, 40, 32)
    assert (full.max_requests, half.max_requests, none.max_requests) == (11, 10, 9)


def test_hit_rate_read_as_an_exact_share():
    # 0.29 x 100 is 28.999... in floating point; the share is read as 29/100.
    v = _plan(LLAMA, RequestMix.of([(1600, 100)]), prefix=1600, hit=0.29)
    assert v.pools[0].pool.shared_prefix_units == int(100 * 29 / 100) == 29


def test_request_cap_limits_the_workload_figure():
    v = _plan(LLAMA, MEANS, engine=VllmOptions(kv_cache_memory_bytes=10 * GiB, max_num_seqs=16))
    assert v.workload.requests == 16 and v.workload.limit == "request_cap"


def test_observed_lengths_each_rounded_and_the_longest_capped():
    # One request of 9,000 tokens on an 8,192-token server is stopped at 8,192 (512 blocks); one of 1,500 takes
    # 94. Mean 303 blocks: 5,119 x 2 // 606 = 16 (606 x 16 = 9,696).
    v = _plan(LLAMA, RequestMix.of([(8000, 1000), (1000, 500)], source="logs"))
    w = v.workload
    assert w.mean_units == (303,) and w.requests == 16 and w.capped_requests == 1 and w.mix_requests == 2


def test_sglang_token_pool():
    # SGLang's pool is in tokens (page 1): a 2,500-token request takes 2,500 slots; the budget is SGLang's own.
    v = _plan(LLAMA, MEANS, engine=SglangOptions())
    budget = v.pools[0].pool.budget_units
    assert v.workload.mean_units == (2500,) and v.workload.requests == min(budget // 2500, v.account.request_cap)


def test_transformers_bytes():
    # DynamicCache keeps every token: 32 x 8 x 128 x 2 x 2 B = 131,072 B a token, 2,500 tokens = 327,680,000 B.
    v = _plan(LLAMA, MEANS, engine=TransformersOptions())
    assert v.workload.mean_units == (327_680_000,)
    assert v.workload.requests == v.pools[0].pool.budget_units // 327_680_000


def test_a_request_longer_than_the_server_is_refused():
    with pytest.raises(FieldError, match="every request is longer than the 8,192 tokens"):
        _plan(LLAMA, RequestMix.of([(8000, 500)]))


def test_prefix_must_be_part_of_every_prompt():
    with pytest.raises(FieldError, match="shortest prompt"):
        _plan(LLAMA, RequestMix.of([(500, 100)]), prefix=1000)


def test_cli_reports_workload_concurrency_beside_the_engine_figure(runner):
    data = run_json(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100", "--input-len", "2000",
                    "--output-len", "500")
    gpu = data["gpus"][0]
    assert gpu["workload_concurrency"] == 180 and gpu["max_requests"] == 55
    assert gpu["workload"]["engine_prints"] == "max_concurrency"
    human = run_cli(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100", "--input-len", "2000",
                    "--output-len", "500")
    words = " ".join(human.stdout.split())
    assert "real requests 180 at once at 2,000 + 500 tokens" in words and "prints only the max-model-len one" in words


def test_cli_without_lengths_keeps_the_json_as_it_was(runner):
    data = run_json(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100")
    assert "workload_concurrency" not in data["gpus"][0]


def test_cli_lengths_file(runner, tmp_path):
    path = tmp_path / "lengths.jsonl"
    path.write_text('# observed\n{"input_tokens": 8000, "output_tokens": 1000}\n{"prompt_tokens": 1000, '
                    '"completion_tokens": 500}\n')
    data = run_json(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100", "--lengths", str(path))
    w = data["gpus"][0]["workload"]
    assert (w["mix_requests"], w["capped_requests"], w["source"]) == (2, 1, "lengths.jsonl")
    plain = tmp_path / "lengths.csv"
    plain.write_text("input,output\n8000,1000\n1000 500\n")
    again = run_json(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100", "--lengths", str(plain))
    assert again["gpus"][0]["workload_concurrency"] == data["gpus"][0]["workload_concurrency"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input-len", "2000"], "--input-len needs --output-len too"),
        (["--input-len", "0", "--output-len", "5"], "--input-len 0: must be between 1 and"),
        (["--prefix-hit-rate", "1.5"], "--prefix-hit-rate 1.5: must be a share between 0 and 1"),
        (["--lengths", "/nonexistent/l.txt"], "--lengths /nonexistent/l.txt: no such file"),
    ],
)
def test_bad_workload_flags_are_one_line(runner, args, message):
    result = run_cli(runner, "estimate", LLAMA, "--seq", "8192", "--gpu", "H100", *args)
    assert result.exit_code == 2, result.output
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("Error: ") and message in line[0], line


def test_bad_lengths_line_is_named(runner, tmp_path):
    path = tmp_path / "l.txt"
    path.write_text("2000 500\n2000\n")
    result = run_cli(runner, "estimate", LLAMA, "--seq", "8192", "--lengths", str(path))
    assert result.exit_code == 2 and "l.txt:2: expected two numbers" in result.stderr
