"""parse_size and parse_count: exact, bounded, and read as vLLM reads its flags; bad input is one InputError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvplan.errors import InputError
from kvplan.units import MAX_COUNT, MAX_SIZE_BYTES, GiB, TiB, parse_count, parse_size
from tests.conftest import run_cli


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("32768", 32_768),
        ("32k", 32_000),  # lower case: decimal
        ("32K", 32_768),  # upper case: binary, 32 x 1024
        ("25.6k", 25_600),
        ("1m", 1_000_000),
        ("1M", 1_048_576),
        ("2G", 2 * GiB),
        ("32.3k", 32_299),  # vLLM multiplies in floating point and truncates: 32.3 * 1000 = 32299.999...
        ("1_000", 1_000),  # Python's int(), which vLLM calls for a plain number
        (" 512 ", 512),
    ],
)
def test_parse_count_reads_like_vllm(text: str, count: int) -> None:
    assert parse_count(text, "--max-model-len") == count


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.5K", "--seq: decimals are not allowed with the binary suffix K (vLLM refuses '1.5K'); did you mean 1.5k?"),
        ("lots", "--seq: cannot read 'lots' as a whole number; write it like 32768, 32k or 32K"),
        ("9" * 400, "--seq: 400 characters is not a number; write it like 32768 or 32k"),
        ("2T", "--seq: must be between 0 and 1,000,000,000,000, got 2,199,023,255,552"),
        ("-1", "--seq: must be between 0 and 1,000,000,000,000, got -1"),
    ],
)
def test_parse_count_refuses_with_one_line(text: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_count(text, "--seq")
    assert caught.value.message == message


def test_parse_count_bounds_are_the_callers() -> None:
    assert parse_count("16", "--block-size", minimum=1, maximum=256) == 16
    with pytest.raises(InputError, match="between 1 and 256"):
        parse_count(0, "--block-size", minimum=1, maximum=256)
    with pytest.raises(InputError):
        parse_count(True, "--batch")


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("48GiB", 48 * GiB),
        ("80 GB", 80 * 10**9),
        ("1.5TiB", 1_649_267_441_664),  # 1.5 x 2**40, exact: Decimal arithmetic, no float rounding
        ("1024TiB", 1024 * TiB),  # 1 PiB, the largest size kvplan accepts
        (12345, 12345),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text, "--gpu-mem") == size


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9" * 400, "--gpu-mem: 400 characters is not a number; write it like 48GiB, 80GB or 51539607552"),
        ("1025TiB", "--gpu-mem: 1025TiB is more than kvplan plans for (at most 1 PiB)"),
        ("9" * 30 + ".5", "--gpu-mem: 999999999999999999999999999999.5 is more than kvplan plans for (at most 1 PiB)"),
        (float("inf"), "--gpu-mem: inf bytes is more than kvplan plans for (at most 1 PiB)"),
        (float("nan"), "--gpu-mem: a size must be a number of bytes >= 0, got nan"),
    ],
)
def test_parse_size_is_bounded(text: str | float, message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_size(text, "--gpu-mem")
    assert caught.value.message == message


@given(st.text(max_size=60))
def test_parse_size_and_count_never_raise_anything_else(text: str) -> None:
    for parse, limit in ((parse_size, MAX_SIZE_BYTES), (parse_count, MAX_COUNT)):
        try:
            value = parse(text, "x")
        except InputError as exc:
            assert "\n" not in exc.message
        else:
            assert 0 <= value <= limit


def test_a_400_digit_gpu_mem_is_one_error_line(runner) -> None:
    result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--seq", "1024", "--gpu-mem", "9" * 400)
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --gpu-mem: 400 characters is not a number; write it like 48GiB, 80GB or 51539607552\n"
    )
