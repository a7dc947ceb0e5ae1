"""verify's parts that the first GPU run (H200, benchmarks/results/gpu/) corrected, tested without a GPU."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from kvplan.model import dtypes  # noqa: E402
from kvplan.verify.decode import SPLIT_TOKENS, _split_product  # noqa: E402
from kvplan.verify.measure import ByteMeter  # noqa: E402
from kvplan.verify.rank import FLOAT32_TOLERANCE, check_tolerance  # noqa: E402
from kvplan.verify.storage import ROUNDOFF  # noqa: E402
from tests.conftest import REPO  # noqa: E402

pytestmark = pytest.mark.torch


class _FakeCuda:
    """torch.cuda as the caching allocator reports a 2.25 MiB request served from a free 2.75 MiB block."""

    def __init__(self) -> None:
        self.requested, self.allocated = 0, 0

    def synchronize(self, device: object) -> None:
        pass

    def memory_allocated(self, device: object) -> int:
        return self.allocated

    def memory_stats(self, device: object) -> dict[str, int]:
        return {"requested_bytes.all.current": self.requested, "allocated_bytes.all.current": self.allocated}


def test_the_meter_counts_requested_bytes_not_the_block_the_allocator_handed_out():
    cuda = _FakeCuda()
    meter = ByteMeter(SimpleNamespace(cuda=cuda), SimpleNamespace(type="cuda"))
    tensor = torch.zeros(2_359_296, dtype=torch.uint8)  # 2.25 MiB, one gpt-oss-20b sliding-window K tensor
    meter.start()
    cuda.requested += 2_359_296
    cuda.allocated += 2_883_584  # the whole 2.75 MiB block: splitting would leave 512 KiB, under 1 MiB
    meter.add("sliding_window", [tensor])
    assert meter.kinds["sliding_window"].measured_bytes == 2_359_296
    assert meter.kinds["sliding_window"].tensor_bytes == 2_359_296


def test_every_kv_format_has_a_check_tolerance():
    # Engines' own layouts (vLLM's per-token-head, nvfp4_4over6, TurboQuant; SGLang's fp4_e2m1) are sized, not
    # stored: verify refuses them.
    names = {v.name for v in vars(dtypes).values() if isinstance(v, dtypes.KvDtype)} - set(dtypes.ENGINE_KV_DTYPES)
    assert names == set(ROUNDOFF)
    # bf16 keeps 8 significant bits: a rounding flip moves an element by up to 2^-8 = 0.00390625 relative,
    # above float32's 1e-4 floor; a float32 cache keeps the floor.
    assert check_tolerance("bfloat16") == 0.00390625
    assert check_tolerance("float32") == FLOAT32_TOLERANCE == 1e-4


@pytest.mark.parametrize("slots", [32_768, 144, 1_000, 997])
def test_the_split_product_equals_one_product(slots):
    # 32,768 slots -> 64 parts of 512; 144 -> one part of 144; 1,000 -> 2 parts of 500; 997 (prime) -> one part.
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(3, slots, 4, generator=gen, dtype=torch.float64)
    vals = torch.randn(3, slots, 5, generator=gen, dtype=torch.float64)
    whole = probs.transpose(1, 2) @ vals
    split = _split_product(torch, probs, vals)
    assert split.shape == (3, 4, 5)
    assert torch.allclose(split, whole, rtol=1e-9, atol=1e-9)
    assert SPLIT_TOKENS == 512


@pytest.mark.slow
def test_the_decode_profile_script_runs_on_the_host(tmp_path):
    # benchmarks/decode_profile.py is what the next GPU run reads for the bandwidth aim; keep it working.
    out = tmp_path / "profile.txt"
    done = subprocess.run(
        [sys.executable, "benchmarks/decode_profile.py", "meta-llama/Llama-3.2-1B-Instruct", "64", "2", "paged",
         str(out)], capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    # 16 layers x 8 KV heads x (64 + 64) x 2 B x 64 paged slots x 2 requests = 4,194,304 B read a step.
    assert "KV read 4,194,304 B a step" in text and "aten::bmm" in text
