"""`--dtype fp8` is refused as vLLM refuses it (its --dtype has no 8-bit choice), naming the flags that do give
fp8 weights or an fp8 KV cache; 'auto' KV stays the served dtype."""

from __future__ import annotations

import pytest

from kvplan.errors import EXIT_CANNOT_EVALUATE, InputError
from kvplan.model.dtypes import BFLOAT16, FLOAT16, FP8_E4M3, resolve_kv_dtype, served_dtype
from tests.conftest import run_cli


@pytest.mark.parametrize("name", ["fp8", "float8_e4m3fn", "torch.float8_e5m2"])
def test_an_8_bit_dtype_is_not_a_serving_dtype(name: str) -> None:
    with pytest.raises(InputError, match=rf"dtype '{name}' is not one engines serve in .*--quantization fp8"):
        served_dtype(name)
    # Neither with 'auto' (once "unknown KV cache dtype 'auto'") nor with an explicit KV dtype.
    for kv in ("auto", "fp8"):
        with pytest.raises(InputError, match="--kv-cache-dtype fp8"):
            resolve_kv_dtype(kv, name)


def test_auto_kv_is_the_served_dtype() -> None:
    assert served_dtype("bf16") == "bfloat16"
    assert resolve_kv_dtype("auto", "bf16") == BFLOAT16
    assert resolve_kv_dtype("auto", "half") == FLOAT16
    assert resolve_kv_dtype("fp8", "bfloat16") == FP8_E4M3


def test_estimate_with_dtype_fp8_prints_one_error_line(runner) -> None:
    result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B", "--seq", "1000", "--dtype", "fp8")
    assert result.exit_code == EXIT_CANNOT_EVALUATE
    assert result.stderr.startswith("Error: --dtype fp8: is not a dtype engines serve in")
    assert len(result.stderr.strip().splitlines()) == 1 and "unknown KV cache dtype" not in result.stderr
