"""Pasted log text -> records: one engine message each, with the rank that printed it and its line number.

Handles what a terminal or a pod log adds around the engine's own message: ANSI colours, `kubectl logs
--prefix` and docker-compose prefixes, RFC 3339 timestamps, vLLM's process prefixes (`(EngineCore pid=283)`,
`(VllmWorker TP1 pid=1431)`, `(Worker_PP1_TP0 pid=9)`, `(RayWorkerWrapper pid=345, ip=10.0.0.2)`), SGLang's
`[2025-03-08 12:29:13 DP0 TP1]`, lines a terminal or an editor wrapped (a line that does not start a record is
the rest of the one before), and a record that starts mid-line after a progress bar.
"""

from __future__ import annotations

import re

from kvplan.records import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\r")
_OUTER = (
    re.compile(r"^\[pod/[^\]]+\]\s?"),  # kubectl logs --prefix
    re.compile(r"^[\w.-]+\s+\|\s"),  # docker compose
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),  # kubectl --timestamps
    re.compile(r"^vLLM STDOUT:\s*"),  # a wrapper that relays vLLM's output
)
# vLLM's process prefix. The driver (EngineCore, APIServer) has no rank; workers name theirs.
_PROCESS = re.compile(
    r"\((?P<name>APIServer|EngineCore\w*|\w*Worker\w*)(?: (?P<tag>TP\d+|rank=\d+|DP\d+ TP\d+))?"
    r"(?: pid=(?P<pid>\d+))?(?:, ip=(?P<ip>[\d.:a-f]+))?\)"
)
# SGLang's prefix: a time, then the ranks of the process that printed the line.
_SGLANG = re.compile(r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?P<tags>(?: (?:DP|PP|TP|EP|CP|ATTN_DP)\d+)*)\]")
_TAGS = re.compile(r"(DP|PP|TP|EP)_?(\d+)")
# A line that starts a record of its own: a prefix, a level, a time, an exception, or a message the engines
# print (a bare excerpt). Any other line is the rest of the line before it, wrapped.
_STARTS = re.compile(
    r"^(?:[(\[#=\\]|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b|\d{4}-\d\d-\d\d|\d\d-\d\d \d\d:|\d\d:\d\d:\d\d"
    r"|\w*(?:Error|Exception)\b|Traceback|vLLM STDOUT|Unsloth|GPU = "
    r"|Available KV cache memory|GPU KV cache size|Maximum concurrency|Model loading took|Loading model weights"
    r"|Memory profiling|GPU blocks|KV Cache is allocated|Load weight|Memory pool end|max_total_num_tokens"
    r"|Capture cuda graph|The model's max seq len|To serve at least one request|python|vllm serve|sglang)"
)
_HARD_WRAP = 80  # a terminal cuts full-width lines mid-word; a shorter line was wrapped at a space


@dataclass(frozen=True)
class Record:
    line: int  # 1-based line of the input where the record starts
    rank: str | None  # "TP1", "PP1 TP0", "rank 3", "pid 345 @ 10.0.0.2"; None: the driver, or not said
    text: str  # the whole record, prefixes included (patterns search it)


def _clean(line: str) -> str:
    line = _ANSI.sub("", line).replace("**", "")  # colours, and Markdown bold around a pasted figure
    changed = True
    while changed:
        changed = False
        for outer in _OUTER:
            stripped = outer.sub("", line, count=1)
            if stripped != line:
                line, changed = stripped, True
    return line.rstrip("\n")


def _rank_of_process(m: re.Match[str]) -> str | None:
    name, tag, pid, ip = m.group("name"), m.group("tag"), m.group("pid"), m.group("ip")
    if name == "APIServer" or name.startswith("EngineCore"):
        return None
    if tag:
        return tag.replace("rank=", "rank ")
    tags = _TAGS.findall(name)
    if tags:
        return " ".join(f"{k}{n}" for k, n in tags)
    where = f" @ {ip}" if ip else ""
    return f"pid {pid}{where}" if pid else name


def rank_of(text: str) -> str | None:
    """The rank a record's prefixes name (the innermost process prefix wins: Ray nests the worker's)."""
    rank = None
    for m in _PROCESS.finditer(text[:200]):
        if m.start() > 0 and text[: m.start()].strip() and not text[: m.start()].rstrip().endswith(")"):
            break
        rank = _rank_of_process(m) or rank
    if rank is None:
        s = _SGLANG.search(text[:80])
        if s and s.group("tags").strip():
            rank = " ".join(f"{k}{n}" for k, n in _TAGS.findall(s.group("tags")))
    return rank


def _split_mid_line(line: str) -> list[str]:
    """A progress bar without a newline, then a record: `...20.10it/s](VllmWorker TP1 pid=1431) INFO ...`."""
    for m in _PROCESS.finditer(line):
        before = line[: m.start()]
        if m.start() > 0 and before.strip() and not before.rstrip().endswith(")"):
            return [before, *_split_mid_line(line[m.start():])]
    return [line]


def records(text: str) -> list[Record]:
    """The records of a pasted log, in order."""
    out: list[Record] = []
    previous = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _clean(raw)
        if not line.strip():
            previous = ""
            continue
        pieces = _split_mid_line(line)
        first = pieces[0]
        if out and previous and not _STARTS.match(first):
            glue = "" if len(previous) >= _HARD_WRAP or previous[-1].isspace() else " "
            last = out[-1]
            out[-1] = Record(last.line, last.rank, last.text + glue + first)
            pieces = pieces[1:]
        for piece in pieces:
            out.append(Record(number, rank_of(piece), piece))
        previous = line
    return out
