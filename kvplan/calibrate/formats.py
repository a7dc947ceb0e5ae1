"""Which engine wrote a log, and its reader: the one registry of log formats `kvplan calibrate` reads."""

from __future__ import annotations

from collections.abc import Callable

from kvplan.calibrate.log import StartupLog
from kvplan.calibrate.sglang_log import read_sglang
from kvplan.calibrate.text import Record, records
from kvplan.calibrate.vllm_log import read_vllm
from kvplan.errors import InputError

READERS: dict[str, Callable[[list[Record], str], StartupLog]] = {"vllm": read_vllm, "sglang": read_sglang}
# Words only that engine prints while it starts; the engine with more of them in the log wrote it.
MARKERS: dict[str, tuple[str, ...]] = {
    "vllm": ("vLLM", "LLM engine", "Model loading took", "Loading model weights took", "Available KV cache memory",
             "GPU KV cache size", "GPU blocks", "cuda blocks", "Maximum concurrency for", "non-default args",
             "gpu_memory_utilization", "reserved for KV Cache", "max seq len", "KV cache is needed",
             "EngineCore", "cache blocks", "warming up sampler", "desired GPU memory utilization"),
    "sglang": ("sglang", "Load weight begin", "Load weight end", "KV Cache is allocated", "max_total_num_tokens",
               "Memory pool end", "ServerArgs(", "mem_fraction_static", "Capture cuda graph"),
}


def detect(recs: list[Record]) -> str | None:
    scores = {engine: sum(rec.text.count(w) for rec in recs for w in words) for engine, words in MARKERS.items()}
    best = max(scores, key=lambda e: scores[e])
    return best if scores[best] else None


def read_log(text: str, source: str, engine: str | None = None) -> StartupLog:
    """The start-up `text` tells; `engine` forces the reader. An InputError when no start-up lines are found."""
    recs = records(text)
    if engine is not None and engine not in READERS:
        raise InputError(f"--engine must be one of {', '.join(READERS)} for calibrate, got {engine!r}")
    found = engine or detect(recs)
    # TensorRT-LLM's prefixes, or its KV lines where a paste dropped them ("Allocated 4.53 GiB for max tokens in
    # paged KV cache (395776).").
    if found is None and any(w in text for w in ("[TensorRT-LLM]", "[TRT-LLM]", "in paged KV cache", "k/v cache")):
        raise InputError(f"{source}: a TensorRT-LLM log; kvplan calibrate reads vLLM and SGLang start-up logs")
    if found is None:
        raise InputError(f"{source}: no vLLM or SGLang start-up lines found (looked for "
                         "'Available KV cache memory', 'KV Cache is allocated' and the like)")
    log = READERS[found](recs, source)
    if not log.figures and log.error is None:
        raise InputError(f"{source}: {found} lines, but no memory figures or start-up outcome in them; paste the "
                         "engine's start-up section (model loading through the KV cache size)")
    return log
