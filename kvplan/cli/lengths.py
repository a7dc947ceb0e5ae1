"""Read observed request lengths for --lengths: one (prompt tokens, answer tokens) pair per line.

Accepted lines: `2000 500`, `2000,500` (a CSV with an optional header), or JSON objects such as
`{"input_tokens": 2000, "output_tokens": 500}` (also input/output, input_len/output_len,
prompt_tokens/completion_tokens, the last two as OpenAI's usage block names them). Blank lines and lines
starting with # are skipped. Every other line must hold a pair: a wrong line is an error naming its number.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from kvplan.capacity.deployment import MAX_CONTEXT_TOKENS, MAX_MIX_REQUESTS, RequestMix
from kvplan.errors import FieldError, InputError

# Key pairs a JSON line may use, in the order they are tried.
_JSON_KEYS = (
    ("input_tokens", "output_tokens"),
    ("input", "output"),
    ("input_len", "output_len"),
    ("prompt_tokens", "completion_tokens"),
)
# 40 bytes a line at most for a million requests, with room for JSON keys: beyond it the file is not lengths.
_MAX_FILE_BYTES = 200 * 1024 * 1024


def _whole(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or len(str(value)) > 12:
        raise InputError(f"{where}: {str(value)[:20]!r} is not a whole number of tokens")
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{where}: {value!r} is not a whole number of tokens") from None


def _checked(prompt: int, answer: int, where: str) -> tuple[int, int]:
    if not 1 <= prompt <= MAX_CONTEXT_TOKENS or not 0 <= answer <= MAX_CONTEXT_TOKENS:
        raise InputError(f"{where}: {prompt} and {answer}: a prompt holds 1 to {MAX_CONTEXT_TOKENS:,} tokens, an "
                         f"answer 0 to {MAX_CONTEXT_TOKENS:,}")
    return prompt, answer


def _pair(line: str, where: str) -> tuple[int, int] | None:
    """The pair on one line; None for a CSV header."""
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected an object with input_tokens and output_tokens")
        for prompt_key, answer_key in _JSON_KEYS:
            if prompt_key in obj and answer_key in obj:
                return _checked(_whole(obj[prompt_key], where), _whole(obj[answer_key], where), where)
        raise InputError(f"{where}: no input_tokens/output_tokens (or prompt_tokens/completion_tokens) keys")
    words = line.replace(",", " ").split()
    if len(words) != 2:
        raise InputError(f"{where}: expected two numbers, prompt and answer tokens, e.g. '2000 500'")
    if not any(w.lstrip("-").isdigit() for w in words):
        return None  # a header such as "input,output"
    return _checked(_whole(words[0], where), _whole(words[1], where), where)


def _pairs(path: Path) -> Iterator[tuple[int, int]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            pair = _pair(line, f"--lengths {path.name}:{number}")
            if pair is not None:
                yield pair


def read_lengths(path_text: str) -> RequestMix:
    """The request mix of a lengths file (at most a million requests)."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InputError(f"--lengths {path_text}: no such file; give a file of 'prompt answer' token pairs")
    if path.stat().st_size > _MAX_FILE_BYTES:
        raise InputError(f"--lengths {path_text}: larger than {_MAX_FILE_BYTES // 2**20} MiB; sample it to at most "
                         f"{MAX_MIX_REQUESTS:,} requests")
    try:
        return RequestMix.of(_pairs(path), source=path.name)
    except FieldError as exc:
        raise InputError(f"--lengths {path_text}: {exc.problem}") from None


def request_mix(input_len: int | None, output_len: int | None, lengths: str | None) -> RequestMix | None:
    """The mix the flags describe: mean lengths (--input-len with --output-len), a --lengths file, or none."""
    if lengths is not None:
        if input_len is not None or output_len is not None:
            raise InputError("--lengths gives the lengths already; leave out --input-len and --output-len")
        return read_lengths(lengths)
    if input_len is None and output_len is None:
        return None
    if input_len is None or output_len is None:
        given, missing = ("--input-len", "--output-len") if output_len is None else ("--output-len", "--input-len")
        raise InputError(f"{given} needs {missing} too: a request holds its prompt and its answer")
    try:
        return RequestMix.of([(input_len, output_len)])
    except FieldError as exc:
        flag = "--output-len" if exc.field.endswith("output_tokens") else "--input-len"
        raise InputError(exc.phrased(flag)) from None
