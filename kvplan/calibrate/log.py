"""What a start-up log says, as typed values: its settings, each rank's measured figures, the engine-wide
figures, and how the start-up ended. Each engine's reader (vllm_log.py, sglang_log.py) fills one in from
records through a table of message patterns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import field

from kvplan.calibrate.text import Record
from kvplan.records import dataclass
from kvplan.units import GiB

BYTES = "bytes"
TOKENS = "tokens"
BLOCKS = "blocks"
TIMES = "x"
COUNT = "count"
RATIO = "ratio"

# Outcomes, as benchmarks/logs records them: started, refused for lack of KV room, out of memory elsewhere (the
# sampler warm-up), failed for another reason, or the log ends before the KV cache is sized.
STARTED, KV_OOM, OOM_OTHER, OTHER_FAILURE, UNKNOWN = "started", "kv_oom", "oom_other", "other_failure", "unknown"

NUMBER = r"(-?\d[\d,]*(?:\.\d+)?)"


def number(text: str) -> float:
    return float(text.replace(",", ""))


def decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


@dataclass(frozen=True)
class Reading:
    """One figure the log printed: bytes for sizes (printed as GiB, so known to half the last digit), tokens,
    blocks or a ratio; the line it came from."""

    key: str
    value: float
    unit: str
    resolution: float  # one step of the last printed digit, in `unit` (0.01 GiB -> 10,737,418 B)
    line: int

    @property
    def as_int(self) -> int:
        return round(self.value)


@dataclass(frozen=True)
class Field:
    """How a captured number becomes a reading: its key, unit and scale (GiB -> bytes)."""

    key: str
    group: int
    unit: str = BYTES


@dataclass(frozen=True)
class Pattern:
    """A message and the figures it carries. `per_rank`: the figure belongs to the rank that printed it."""

    regex: re.Pattern[str]
    fields: tuple[Field, ...]
    per_rank: bool = True


def pattern(regex: str, *fields: Field, per_rank: bool = True) -> Pattern:
    return Pattern(re.compile(regex), fields, per_rank)


def reading(f: Field, text: str, line: int) -> Reading:
    value = number(text)
    if f.unit == BYTES:  # engines print sizes as GiB (vLLM's and SGLang's "GB" are 2^30 too)
        return Reading(f.key, round(value * GiB), BYTES, GiB / 10 ** decimals(text), line)
    step = 1.0 if f.unit in (TOKENS, BLOCKS, COUNT) else 10.0 ** -decimals(text)
    return Reading(f.key, value, f.unit, step, line)


@dataclass(frozen=True)
class RankReadings:
    rank: str  # "driver" for lines no worker prefix claims
    readings: tuple[Reading, ...]

    def get(self, key: str) -> Reading | None:
        """The figure for `key`: the most precise of the lines that print it, the last among equals
        ("Model loading took 6.2473 GiB" over "model weights take 6.25GiB")."""
        found = [r for r in self.readings if r.key == key]
        return min(reversed(found), key=lambda r: r.resolution) if found else None


@dataclass(frozen=True)
class LogSettings:
    """The deployment the log ran: flags the user gave, and values the engine printed as resolved.

    `utilization` is vLLM's gpu_memory_utilization or SGLang's mem_fraction_static; `block_size` vLLM's block
    or SGLang's page; `max_num_seqs` vLLM's or SGLang's max_running_requests; `max_num_batched_tokens` vLLM's
    or SGLang's chunked_prefill_size. `vllm_engine` is "v0" or "v1" as vLLM's "Initializing a V0/V1 LLM
    engine" line says; `install` "image" or "wheel" where the log shows whether FlashInfer was importable;
    `compile_cache` "cold" or "warm" where it shows whether torch.compile compiled or loaded its graphs;
    `flashinfer_sampler` True or False where it shows VLLM_USE_FLASHINFER_SAMPLER taken (vllm.VllmFlags).
    `user_set` names the fields the user's own flags gave.
    """

    model: str | None = None
    served_model_name: str | None = None
    device_name: str | None = None
    architecture: str | None = None
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    dp_attention: bool | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    utilization: float | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enforce_eager: bool | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    cuda_graph_max_bs: int | None = None
    max_total_tokens: int | None = None
    attention_backend: str | None = None
    cpu_offload_gb: float | None = None
    enable_lora: bool | None = None
    max_loras: int | None = None
    mamba_cache_dtype: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    speculative_config: str | None = None  # vLLM's --speculative-config as printed (a dict's repr)
    max_lora_rank: int | None = None
    fully_sharded_loras: bool | None = None
    vllm_engine: str | None = None
    install: str | None = None
    compile_cache: str | None = None
    flashinfer_sampler: bool | None = None
    user_set: frozenset[str] = frozenset()


SETTING_NAMES = tuple(n for n in LogSettings.__dataclass_fields__ if n != "user_set")


@dataclass(frozen=True)
class StartupLog:
    """One engine start-up as its log tells it."""

    source: str
    engine: str  # "vllm" | "sglang"
    version: str | None
    settings: LogSettings
    ranks: tuple[RankReadings, ...]  # the rank with the most figures first (rank 0 / TP0 / the driver)
    summary: tuple[Reading, ...]  # engine-wide figures (KV tokens, concurrency, ...)
    outcome: str
    error: str | None  # the refusal or error line, as printed
    records: int
    notes: tuple[str, ...] = ()

    @property
    def primary(self) -> RankReadings:
        return self.ranks[0] if self.ranks else RankReadings("driver", ())

    def summary_get(self, key: str) -> Reading | None:
        found = [r for r in self.summary if r.key == key]
        return found[-1] if found else None

    def get(self, key: str) -> Reading | None:
        """A figure of the primary rank, else an engine-wide one."""
        return self.primary.get(key) or self.summary_get(key)

    @property
    def figures(self) -> int:
        return sum(len(r.readings) for r in self.ranks) + len(self.summary)


@dataclass
class Collector:
    """Gathers readings, settings and the outcome while an engine's reader walks the records."""

    engine: str
    by_rank: dict[str, list[Reading]] = field(default_factory=dict)
    summary: list[Reading] = field(default_factory=list)
    settings: dict[str, object] = field(default_factory=dict)
    user_set: set[str] = field(default_factory=set)
    version: str | None = None
    outcome: str = UNKNOWN
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def apply(self, patterns: Iterable[Pattern], rec: Record) -> None:
        for p in patterns:
            for m in p.regex.finditer(rec.text):
                for f in p.fields:
                    text = m.group(f.group)
                    if text is None:
                        continue
                    r = reading(f, text, rec.line)
                    if p.per_rank:
                        self.by_rank.setdefault(rec.rank or "driver", []).append(r)
                    else:
                        self.summary.append(r)

    def set(self, name: str, value: object, *, user: bool = False, overwrite: bool = True) -> None:
        if value is None or (not overwrite and name in self.settings):
            return
        if name not in SETTING_NAMES:
            raise KeyError(name)
        self.settings[name] = value
        if user:
            self.user_set.add(name)

    def fail(self, outcome: str, line: str) -> None:
        """A failure seen; a KV refusal outranks an OOM elsewhere, which outranks other refusals."""
        rank = {UNKNOWN: 0, STARTED: 0, OTHER_FAILURE: 1, OOM_OTHER: 2, KV_OOM: 3}
        if rank[outcome] >= rank.get(self.outcome, 0):
            self.outcome, self.error = outcome, line.strip()[:400]

    def build(self, source: str, records: int, started: Callable[[Collector], bool]) -> StartupLog:
        if self.outcome == UNKNOWN and started(self):
            self.outcome = STARTED
        tps = [int(m.group(1)) for rank in self.by_rank for m in [re.search(r"\bTP(\d+)", rank)] if m]
        if "tp" not in self.settings and tps and max(tps) > 0:
            # Ranks TP0 and TP1 printed: at least tp 2 (a truncated config line may not say it).
            self.settings["tp"] = max(tps) + 1
            self.notes.append(f"tp {max(tps) + 1} read from the ranks that printed (TP0 to TP{max(tps)})")
        ranks = [RankReadings(k, tuple(v)) for k, v in self.by_rank.items()]
        ranks.sort(key=lambda r: (-len(r.readings), r.rank != "driver", r.rank))
        settings = LogSettings(**self.settings, user_set=frozenset(self.user_set))  # type: ignore[arg-type]
        return StartupLog(source, self.engine, self.version, settings, tuple(ranks), tuple(self.summary),
                          self.outcome, self.error, records, tuple(self.notes))


def literal_pairs(text: str) -> dict[str, str]:
    """key=value pairs of a printed config (`model='x', dtype=torch.bfloat16, max_seq_len=8192, ...`) or a
    Python dict (`{'model': 'x', 'max_model_len': 8192}`), values as printed, quotes removed. Tolerates
    truncation (`[...]`) and nested brackets, whose values are kept whole."""
    out: dict[str, str] = {}
    text = re.sub(r"\s*\[\.\.\.\]\s*", " ", text)  # a quote shortened in the middle: the pairs around it stand
    i, n = 0, len(text)
    key_re = re.compile(r"\s*[,{(]?\s*'?([A-Za-z_][\w.]*)'?\s*[=:]\s*")
    while i < n:
        m = key_re.match(text, i)
        if not m:
            nxt = text.find(",", i + 1)
            if nxt < 0:
                break
            i = nxt
            continue
        key, j = m.group(1), m.end()
        depth, quote, start = 0, "", j
        while j < n:
            c = text[j]
            if quote:
                if c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            j += 1
        value = text[start:j].strip().strip("'\"")
        out.setdefault(key, value)
        i = j
    return out


def cli_flags(text: str) -> dict[str, str]:
    """--flag value pairs of a pasted command line (`--max-model-len 8192 --enforce-eager`), keys with _."""
    out: dict[str, str] = {}
    words = text.split()
    for i, w in enumerate(words):
        if not w.startswith("--"):
            continue
        key, _, value = w[2:].partition("=")
        if not value:
            value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "true"
        out[key.replace("-", "_")] = value
    return out
