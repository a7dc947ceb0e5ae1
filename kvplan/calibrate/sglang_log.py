"""SGLang start-up logs (0.3 to current) -> StartupLog.

The lines SGLang prints while it sizes memory (docs/engine-rules.md 2.5): "Init torch distributed ends. mem
usage", "Load weight begin. avail mem", "Load weight end. ... avail mem, mem usage", "KV Cache is allocated.
#tokens, K size, V size" (or "KV size" for MLA), "Memory pool end. avail mem", the CUDA-graph capture lines,
the scheduler's "max_total_num_tokens=..., max_running_requests=..., context_len=..., available_gpu_mem=...",
and the refusals. Settings come from the "server_args=ServerArgs(...)" line and a pasted launch command.
SGLang's "GB" are GiB.
"""

from __future__ import annotations

import re

from kvplan.calibrate.log import (
    KV_OOM,
    NUMBER,
    OOM_OTHER,
    TOKENS,
    Collector,
    Field,
    StartupLog,
    cli_flags,
    literal_pairs,
    number,
    pattern,
)
from kvplan.calibrate.text import Record

N = NUMBER

PATTERNS = (
    pattern(r"Init torch distributed ends\..*?mem usage=" + N + " GB", Field("init_usage", 1)),
    pattern(r"Load weight begin\. avail mem=" + N + " GB", Field("free_before_load", 1)),
    pattern(r"Load weight end\..*?avail mem=" + N + " GB", Field("free_after_load", 1)),
    pattern(r"Load weight end\..*?mem usage=" + N + " GB", Field("weights", 1)),
    pattern(r"KV Cache is allocated\..*?#tokens: " + N, Field("pool_tokens", 1, TOKENS)),
    pattern(r"KV Cache is allocated\..*?K size: " + N + " GB, V size: " + N + " GB",
            Field("k_bytes", 1), Field("v_bytes", 2)),
    pattern(r"KV Cache is allocated\..*?\bKV size: " + N + " GB", Field("kv_bytes", 1)),
    pattern(r"Memory pool end\. avail mem=" + N + " GB", Field("free_after_pool", 1)),
    pattern(r"Capture cuda graph begin\..*?avail mem=" + N + " GB", Field("free_before_graphs", 1)),
    pattern(r"Capture cuda graph end\..*?mem usage=" + N + " GB", Field("cuda_graph_actual", 1)),
    pattern(r"max_total_num_tokens=" + N, Field("max_total_num_tokens", 1, TOKENS), per_rank=False),
    pattern(r"max_running_requests=" + N + r"(?=,|\s|$)", Field("max_running_requests", 1, TOKENS), per_rank=False),
    pattern(r"\bcontext_len=" + N, Field("context_len", 1, TOKENS), per_rank=False),
    pattern(r"available_gpu_mem=" + N + " GB", Field("available_gpu_mem", 1)),
    pattern(r"is larger than the profiled value " + N, Field("profiled_tokens", 1, TOKENS), per_rank=False),
)
FAILURES = (
    (re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"), KV_OOM),
    (re.compile(r"Loaded weights leave no GPU memory for the KV cache"), KV_OOM),
    (re.compile(r"torch\.OutOfMemoryError|CUDA out of memory\. Tried"), OOM_OTHER),
)
_SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)")
_LAUNCH = re.compile(r"sglang\.launch_server\b(.*)|\bsglang serve\b(.*)")
_LOAD_END = re.compile(r"Load weight end\..*?type=(\w+)(?:.*?dtype=torch\.(\w+))?")
_SUMMARY_CHUNK = re.compile(r"max_total_num_tokens=.*?chunked_prefill_size=(-?\d+)")
_VERSION = re.compile(r"\bsglang(?:==| version:? ?)v?(\d+\.\d+[\w.+-]*)", re.IGNORECASE)

# server_args / command-line names -> LogSettings fields, with a converter.
_FLAG_FIELDS = {
    "model_path": ("model", str),
    "model": ("model", str),
    "served_model_name": ("served_model_name", str),
    "tp_size": ("tp", int),
    "tensor_parallel_size": ("tp", int),
    "tp": ("tp", int),
    "pp_size": ("pp", int),
    "pipeline_parallel_size": ("pp", int),
    "dp_size": ("dp", int),
    "dp": ("dp", int),
    "enable_dp_attention": ("dp_attention", bool),
    "context_length": ("max_model_len", int),
    "dtype": ("dtype", str),
    "kv_cache_dtype": ("kv_cache_dtype", str),
    "quantization": ("quantization", str),
    "mem_fraction_static": ("utilization", float),
    "page_size": ("block_size", int),
    "max_running_requests": ("max_num_seqs", int),
    "chunked_prefill_size": ("max_num_batched_tokens", int),
    "cuda_graph_max_bs": ("cuda_graph_max_bs", int),
    "max_total_tokens": ("max_total_tokens", int),
    "attention_backend": ("attention_backend", str),
    "cpu_offload_gb": ("cpu_offload_gb", float),
}


def _convert(kind: type, text: str) -> object | None:
    text = text.strip().strip("'\"")
    if text in ("None", "null", ""):
        return None
    if kind is bool:
        return text.lower() in ("true", "1", "yes")
    if kind is str:
        return text
    try:
        value = number(text)
    except ValueError:
        return None
    return int(value) if kind is int else value


def _settings_from(c: Collector, pairs: dict[str, str], *, user: bool) -> None:
    for key, text in pairs.items():
        if key in _FLAG_FIELDS:
            name, kind = _FLAG_FIELDS[key]
            value = _convert(kind, text)
            if name == "max_num_batched_tokens" and isinstance(value, int) and value <= 0:
                value = None  # -1: chunked prefill off
            c.set(name, value, user=user, overwrite=user)


def read_sglang(records: list[Record], source: str) -> StartupLog:
    """The SGLang start-up these records tell."""
    c = Collector("sglang")
    for rec in records:
        c.apply(PATTERNS, rec)
        m = _SERVER_ARGS.search(rec.text)
        if m:
            _settings_from(c, literal_pairs(m.group(1)), user=False)
        m = _LAUNCH.search(rec.text)
        if m:
            _settings_from(c, cli_flags(m.group(1) or m.group(2) or ""), user=True)
        m = _SUMMARY_CHUNK.search(rec.text)
        if m:
            _settings_from(c, {"chunked_prefill_size": m.group(1)}, user=False)
        m = _LOAD_END.search(rec.text)
        if m:
            c.set("architecture", m.group(1), overwrite=False)
        m = _VERSION.search(rec.text)
        if m and c.version is None:
            c.version = m.group(1)
        for regex, outcome in FAILURES:
            if regex.search(rec.text):
                c.fail(outcome, rec.text)
        if "is larger than the profiled value -" in rec.text:
            c.fail(KV_OOM, rec.text)  # a negative pool: the "Not enough memory" error follows
    return c.build(source, len(records), _started)


def _started(c: Collector) -> bool:
    """The pool was allocated: SGLang printed its size."""
    return any(r.key in ("pool_tokens", "k_bytes", "kv_bytes", "free_after_pool") for rs in c.by_rank.values()
               for r in rs) or any(r.key == "max_total_num_tokens" for r in c.summary)
