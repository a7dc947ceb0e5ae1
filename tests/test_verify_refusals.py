"""verify's refusals: too big for the device, an out-of-memory mid-way, torch missing, a ring too small."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.torch

LLAMA = ["meta-llama/Llama-3.2-1B-Instruct", "--seq", "20", "--steps", "2", "--decode-layers", "1", "--device", "cpu"]


def test_torch_missing_names_the_extra(runner, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    result = run_cli(runner, "verify", *LLAMA)
    assert result.exit_code == 2
    assert result.stderr.strip() == "Error: torch is not installed: pip install 'kvplan[verify]'"


def test_refuses_more_than_the_device_has_before_allocating(runner, monkeypatch):
    pytest.importorskip("torch")
    import kvplan.verify.alloc as alloc

    calls = []
    monkeypatch.setattr(alloc, "_zeros", lambda *a, **k: calls.append(a) or pytest.fail("allocated"))
    monkeypatch.setattr("kvplan.verify.rank.free_bytes", lambda torch, device: (1 << 20, "free"))  # 1 MiB free
    result = run_cli(runner, "verify", *LLAMA)
    assert result.exit_code == 2 and not calls
    assert "needs" in result.stderr and "but cpu has 1.00 MiB free; nothing was allocated" in result.stderr
    assert "--fraction" in result.stderr


def test_gpu_mem_caps_what_verify_may_use(runner):
    pytest.importorskip("torch")
    result = run_cli(runner, "verify", *LLAMA, "--gpu-mem", "512KiB")
    assert result.exit_code == 2
    assert "but cpu has 512.00 KiB --gpu-mem" in result.stderr


def test_out_of_memory_midway_is_caught_and_says_how_far(runner, monkeypatch):
    torch = pytest.importorskip("torch")
    import kvplan.verify.alloc as alloc

    real = alloc._zeros
    made = []

    def zeros(*args, **kwargs):
        if len(made) == 10:  # K and V of 5 layers, then the 6th layer's K fails
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(alloc, "_zeros", zeros)
    result = run_cli(runner, "verify", *LLAMA, "--no-check")
    assert result.exit_code == 2, result.output
    # 5 layers x 2 x 32 tokens x 1,024 B = 327,680 B = 320 KiB of the 16-layer plan's 1.00 MiB.
    assert result.stderr.strip() == (
        "Error: out of memory on cpu while allocating, after 5 of 16 layers (320.00 KiB of 1.00 MiB planned); "
        "memory freed. Pass --fraction below 1 or lower --batch / --seq"
    )


def test_a_ring_one_block_short_is_caught_by_the_check():
    """The check is not a formality: drop one block from gpt-oss's sliding ring and tokens of the window vanish."""
    pytest.importorskip("torch")
    from kvplan.verify.device import import_torch
    from kvplan.verify.rank import run_check
    from kvplan.verify.setup import VerifyRequest, prepare

    torch = import_torch()
    setup = prepare(VerifyRequest(model="openai/gpt-oss-20b", seq_tokens=200, steps=4, decode_layers=1, offline=True))
    good = run_check(torch, setup, torch.device("cpu"), None)
    assert good.passed and good.windows_wrapped

    import kvplan.verify.rank as run

    real_replan = run.replan

    def short_ring(s, seq, batch):
        small = real_replan(s, seq, batch)
        layers = tuple(
            dataclasses.replace(p, paged_tokens=p.paged_tokens - 16) if p.kind == "sliding_window" else p
            for p in small.layers
        )
        return dataclasses.replace(small, layers=layers)

    run.replan = short_ring
    try:
        bad = run_check(torch, setup, torch.device("cpu"), None)
    finally:
        run.replan = real_replan
    # 8 blocks = 128 slots hold the window only when it starts on a block boundary; mid-block it needs 9.
    assert not bad.visibility_ok and not bad.passed


def test_vllm_only_cache_layouts_are_sized_not_verified():
    # TurboQuant, the per-token-head kinds and SGLang's fp4_e2m1 are engine kernels' own layouts.
    from kvplan.errors import InputError
    from kvplan.verify.setup import VerifyRequest, prepare

    for name in ("turboquant_k8v4", "int8_per_token_head", "fp4_e2m1"):
        with pytest.raises(InputError, match=f"--kv-cache-dtype {name} is a layout of an engine's own kernels"):
            prepare(VerifyRequest(model="meta-llama/Llama-3.2-1B-Instruct", seq_tokens=20, steps=2,
                                  kv_cache_dtype=name, offline=True))
