"""vLLM start-up logs (0.5 to current, V0 and V1, tabular and one-line profiling summaries) -> StartupLog.

Each message vLLM prints about memory is one Pattern with the figures it carries (docs/engine-rules.md 1.2,
1.6, 1.8 give the wording per release): the worker's memory snapshot, "Model loading took", the profiling
summary, "Available KV cache memory", "GPU KV cache size", "Maximum concurrency", the CUDA-graph lines,
"# GPU blocks", and the refusals. Settings come from "non-default args", the engine config line, a pasted
`vllm serve` command and wrappers that print them (Unsloth).
"""

from __future__ import annotations

import re

from kvplan.calibrate.log import (
    BLOCKS,
    BYTES,
    COUNT,
    KV_OOM,
    NUMBER,
    OOM_OTHER,
    OTHER_FAILURE,
    RATIO,
    TIMES,
    TOKENS,
    Collector,
    Field,
    Reading,
    StartupLog,
    cli_flags,
    literal_pairs,
    number,
    pattern,
)
from kvplan.calibrate.text import Record

N = NUMBER
GIB = r" ?Gi?B"
_SHARE_UTIL, _SHARE_WITHOUT, _SHARE_RAISED = "graph_share_util", "graph_share_without", "graph_share_raised"

PATTERNS = (
    # Weights: V1 "Model loading took 12.56 GiB memory", V0 "Loading model weights took 14.9888 GB".
    pattern(r"(?:Model loading|Loading model weights) took " + N + GIB, Field("weights", 1)),
    # V1 0.9+: the worker's snapshot at start (after the CUDA context exists).
    pattern(r"memory snapshot: .*?free_memory=" + N + r"GiB, total_memory=" + N + r"GiB, cuda_memory=" + N + "GiB",
            Field("free_at_start", 1), Field("total", 2), Field("context", 3)),
    # V1 0.19 debug summary, and the same words in other releases' lines.
    pattern(r"Total non KV cache memory: " + N + GIB, Field("non_kv", 1)),
    pattern(r"torch peak memory increase: " + N + GIB, Field("activation_peak", 1)),
    pattern(r"non-torch forward increase memory: " + N + GIB, Field("non_torch", 1)),
    pattern(r"weights memory: " + N + GIB, Field("weights", 1)),
    # V0 0.6.5-0.10: "total_gpu_memory (14.74GiB) x gpu_memory_utilization (0.59) = 8.76GiB" and the next line.
    pattern(r"total_gpu_memory \(" + N + r" ?GiB\) x gpu_memory_utilization \(" + N + r"\) = " + N + GIB,
            Field("total", 1), Field("utilization", 2, RATIO), Field("requested", 3)),
    pattern(r"model weights take\s+" + N + GIB, Field("weights", 1)),
    pattern(r"non_torch_memory(?: takes|\s+)\s*" + N + GIB, Field("non_torch", 1)),
    pattern(r"PyTorch activation peak memory(?: takes)?\s+" + N + GIB, Field("activation_peak", 1)),
    pattern(r"reserved for KV Cache is " + N + GIB, Field("available_kv", 1)),
    # 0.6.4 one-line and 0.6.5 tabular summaries.
    pattern(r"total_gpu_memory(?:=|\s+)" + N + GIB, Field("total", 1)),
    pattern(r"peak_torch_memory=" + N + GIB, Field("peak_torch_absolute", 1)),
    # (the worker snapshot also prints "non_torch_memory=", the context at start: only 0.6.4's line is growth)
    pattern(r"memory_usage_post_profile=" + N + r" ?Gi[bB] non_torch_memory=" + N + GIB, Field("non_torch", 2)),
    pattern(r"kv_cache_size=" + N + GIB, Field("available_kv", 1)),
    pattern(r"gpu_memory_utilization(?:=|\s+)" + N + r"\b(?! ?Gi?B)", Field("utilization", 1, RATIO)),
    pattern(r"the current vLLM instance can use\s+" + N + GIB, Field("requested", 1)),
    pattern(r"available_kv_cache_memory\s+" + N + GIB, Field("available_kv", 1)),
    # V1.
    pattern(r"Available KV cache memory: " + N + GIB, Field("available_kv", 1)),
    pattern(r"Free memory on device (?:\S+ )?\(" + N + "/" + N + r" GiB\) on startup",
            Field("free_at_start", 1), Field("total", 2)),
    pattern(r"Desired GPU memory utilization is \(" + N + ", " + N + r" GiB\)",
            Field("utilization", 1, RATIO), Field("requested", 2)),
    pattern(N + r" GiB for weight,", Field("weights", 1)),
    pattern(N + r" GiB for consumed memory", Field("consumed", 1)),
    pattern(N + r" GiB for peak activation", Field("activation_peak", 1)),
    pattern(N + r" GiB for non-torch memory", Field("non_torch", 1)),
    pattern(N + r" GiB for CUDAGraph memory", Field("cuda_graph_actual", 1)),
    # The same line ends with self.available_kv_cache_memory_bytes: "Current kv cache memory in use is 12.26 GiB"
    # on club-3090#1087 (0.27.1), whose excerpt lacks the "Available KV cache memory" line.
    pattern(r"Current kv cache memory in use is " + N + GIB, Field("available_kv", 1)),
    pattern(r"Graph capturing finished in " + N + r" secs?, took " + N + GIB, Field("cuda_graph_actual", 2)),
    pattern(r"CUDA graph pool memory: " + N + r" GiB \(actual\), " + N + r" GiB \(estimated\)",
            Field("cuda_graph_actual", 1), Field("cuda_graph_estimate", 2)),
    pattern(r"Estimated CUDA graph memory: " + N + GIB, Field("cuda_graph_estimate", 1)),
    # 0.18.1+ also print the estimate as a share of the CUDA total (gpu_worker.py, cg_util_delta = estimate /
    # total, each utilization rounded to 4 places), the only graph figure Model Runner V2 prints: "The current
    # --gpu-memory-utilization=0.8500 is equivalent to --gpu-memory-utilization=0.8265 without CUDA graph memory
    # profiling" where the budget subtracts it, "increase --gpu-memory-utilization from 0.9000 to 0.9063" where
    # it does not (0.18-0.19 by default). graph_estimate() turns the pair into bytes.
    pattern(r"current --gpu-memory-utilization=" + N + r" is equivalent to --gpu-memory-utilization=" + N,
            Field(_SHARE_UTIL, 1, RATIO), Field(_SHARE_WITHOUT, 2, RATIO)),
    pattern(r"increase --gpu-memory-utilization from " + N + r" to " + N,
            Field(_SHARE_UTIL, 1, RATIO), Field(_SHARE_RAISED, 2, RATIO)),
    # Unsloth's banner: torch's total_memory in GiB ("Max memory: 14.741 GB").
    pattern(r"Max memory[:=] " + N + " GB", Field("total", 1)),
    # Engine-wide figures (the engine core prints them once, or once per rank in 0.10).
    pattern(r"GPU(?: \+ host)? KV cache size: " + N + " tokens", Field("kv_tokens", 1, TOKENS), per_rank=False),
    pattern(r"Maximum concurrency for " + N + r" tokens per request: " + N + "x",
            Field("concurrency_len", 1, TOKENS), Field("max_concurrency", 2, TIMES), per_rank=False),
    pattern(r"(?:# (?:GPU|gpu|cuda|CUDA|rocm) blocks|(?<![#\w] )GPU blocks|num_gpu_blocks is): " + N,
            Field("num_blocks", 1, BLOCKS), per_rank=False),
    # A user's --num-gpu-blocks-override replaces the count vLLM sized. From 0.18.1 the CUDA-graph profiling
    # prints the same line for its throwaway cache ("num_gpu_blocks=0 with num_gpu_blocks_override=512", the
    # largest capture size): that one is not the KV cache.
    pattern(r"Overriding num_gpu_blocks=[1-9][\d,]* with num_gpu_blocks_override=" + N,
            Field("num_blocks", 1, BLOCKS), per_rank=False),
    pattern(r"stored in KV cache \(" + N + r"\)", Field("kv_tokens", 1, TOKENS), per_rank=False),
    pattern(N + r" GiB KV cache is needed", Field("kv_needed", 1)),
    pattern(r"larger than the available KV cache memory \(" + N + r" GiB\)", Field("available_kv", 1)),
    pattern(r"estimated maximum model length is " + N, Field("max_model_len_fit", 1, TOKENS), per_rank=False),
    pattern(r"warming up sampler with " + N + r" dummy requests", Field("sampler_requests", 1, COUNT),
            per_rank=False),
)
FAILURES = (
    (re.compile(r"To serve at least one request with the models?'s max seq len"), KV_OOM),
    (re.compile(r"is larger than the maximum number of tokens that can be stored in KV cache"), KV_OOM),
    (re.compile(r"No available memory for the cache blocks"), KV_OOM),
    # 0.20+: a hybrid's cache has fewer blocks than max_num_seqs needs for their state (vllm#38270).
    (re.compile(r"exceeds available Mamba cache blocks"), KV_OOM),
    (re.compile(r"CUDA out of memory occurred when warming up sampler"), OOM_OTHER),
    (re.compile(r"on startup is less than desired GPU memory utilization"), OTHER_FAILURE),
    (re.compile(r"torch\.OutOfMemoryError|torch\.cuda\.OutOfMemoryError|CUDA out of memory\. Tried"), OOM_OTHER),
    (re.compile(r"EngineCore failed to start|Engine core initialization failed|WorkerProc hit an exception"),
     OTHER_FAILURE),
)
_EXCEPTION = re.compile(r"\b[A-Z]\w*(?:Error|Exception): \S")
_VERSION = (
    re.compile(r"vLLM API server version (\d[\w.+-]*)"),
    re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v(\d[\w.+-]*)\)"),
    re.compile(r"\bversion (\d+\.\d+[\w.+-]*)\s*$"),  # the 0.16+ banner: "▄▄ ▄█ █ ... version 0.19.0"
    re.compile(r"\bvLLM: (\d+\.\d+[\w.+-]*?)\.?\s*$"),  # Unsloth's banner: "Transformers: 4.52.4. vLLM: 0.8.2."
)
_ENGINE = re.compile(r"Initializing an? (V[01]) LLM engine")
# 0.20+ with the estimate turned off by the user (gpu_worker.py's warning; 0.18-0.19 leave it off by default).
_GRAPHS_OFF = re.compile(r"CUDA graph memory profiling is disabled \(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0\)")
# What the log shows of FlashInfer (V1 0.8-0.11 sample with it whenever it is importable): its sampler in use
# (the vllm/vllm-openai image ships it), or missing or declined, as a plain wheel install runs. A traceback
# through site-packages/vllm/ is a pip/uv install of the wheel (a venv, a conda env such as
# /opt/conda/envs/x/lib/python3.13/site-packages); the image installs into /usr/local/lib/python3.x/dist-packages.
_INSTALL = (
    (re.compile(r"Using FlashInfer for top-p & top-k sampling"), "image"),
    (re.compile(r"FlashInfer is not available|sampler is disabled because FlashInfer"), "wheel"),
    (re.compile(r"/lib/python[\d.]+/site-packages/vllm/"), "wheel"),
)
# Whether torch.compile found its cache (vllm/compilation/backends.py and decorators.py, 0.11.1-0.33): a hit
# prints "Directly load the compiled graph(s) ... from the cache" or "Directly load AOT compilation from path";
# a miss compiles, "Compiling a graph for dynamic shape / compile range ... takes X s".
_COMPILE_CACHE = (
    (re.compile(r"Compiling a graph for (?:dynamic shape|compile range)"), "cold"),
    (re.compile(r"Directly load (?:the compiled graph|AOT compilation)"), "warm"),
)
# The V1 sampler's choice (v1/sample/ops/topk_topp_sampler.py): "Using FlashInfer for top-p & top-k sampling"
# where it runs FlashInfer (0.8-0.11.0 whenever importable, 0.11.1+ only with VLLM_USE_FLASHINFER_SAMPLER=1),
# "FlashInfer is available, but it is not enabled" where VLLM_USE_FLASHINFER_SAMPLER=0 turned it off (0.8-0.11.0).
_FLASHINFER_SAMPLER = (
    (re.compile(r"Using FlashInfer for top-p & top-k sampling"), True),
    (re.compile(r"FlashInfer is available, but it is not enabled"), False),
)
_ARGS = re.compile(r"non-default args: (\{.*)")
_NAMESPACE = re.compile(r"args: Namespace\((.*)")
_CONFIG = re.compile(r"with config: (.*)")
_SERVE = re.compile(r"\bvllm serve\s+(\S+)(.*)")
# `docker run ... vllm/vllm-openai:v0.27.1 MODEL --flags`: the image's entrypoint is `vllm serve`, its tag the release.
_IMAGE_RUN = re.compile(r"\bvllm/vllm-openai(?::(?P<tag>[\w.+-]+))?\s+(?P<args>.*)")
_RELEASE_TAG = re.compile(r"v?(\d+\.\d+(?:\.\d+)*)$")
_MAX_LEN = re.compile(r"Using max model len " + N)
_CHUNKED = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=" + N)
_UNSLOTH_LOAD = re.compile(r"Unsloth: vLLM loading (\S+) with actual GPU utilization = " + N + "%")
_UNSLOTH_STEP = re.compile(r"Chunked prefill tokens = " + N + r"\. Num Sequences = " + N)
_UNSLOTH_GPU = re.compile(r"(?:GPU: |GPU = |\|\s+)((?:NVIDIA|Tesla|AMD)[^.]*?)\. (?:Num GPUs|Max memory)")
_DEVICE = re.compile(r"device_name=((?:NVIDIA|AMD)_[\w-]+?)(?:\.json|,|\s|$)")
_NVIDIA_GPU = re.compile(r"NVIDIA GPU: (NVIDIA [\w -]+)")

# Flag names (non-default args, the config line, a command line) -> LogSettings fields, with a converter.
_FLAG_FIELDS = {
    "model": ("model", str),
    "served_model_name": ("served_model_name", str),
    "max_model_len": ("max_model_len", int),
    "max_seq_len": ("max_model_len", int),
    "tensor_parallel_size": ("tp", int),
    "pipeline_parallel_size": ("pp", int),
    "data_parallel_size": ("dp", int),
    "dtype": ("dtype", str),
    "kv_cache_dtype": ("kv_cache_dtype", str),
    "quantization": ("quantization", str),
    "gpu_memory_utilization": ("utilization", float),
    "block_size": ("block_size", int),
    "max_num_seqs": ("max_num_seqs", int),
    "max_num_batched_tokens": ("max_num_batched_tokens", int),
    "enforce_eager": ("enforce_eager", bool),
    "enable_prefix_caching": ("enable_prefix_caching", bool),
    "enable_chunked_prefill": ("enable_chunked_prefill", bool),
    "chunked_prefill_enabled": ("enable_chunked_prefill", bool),  # the engine config line's name
    "cpu_offload_gb": ("cpu_offload_gb", float),
    "enable_lora": ("enable_lora", bool),
    "max_loras": ("max_loras", int),
    "max_lora_rank": ("max_lora_rank", int),
    "fully_sharded_loras": ("fully_sharded_loras", bool),
    "mamba_cache_dtype": ("mamba_cache_dtype", str),
    "mamba_ssm_cache_dtype": ("mamba_ssm_cache_dtype", str),
    "speculative_config": ("speculative_config", object),  # kept as printed: vllm_speculative reads it
}
_ABBREVIATED = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size"}


def _convert(kind: type, text: str) -> object | None:
    if kind is object:
        return text.strip() if text.strip() not in ("None", "null", "") else None
    text = text.strip().strip("'\"[]")
    if text in ("None", "null", ""):
        return None
    if kind is bool:
        return text.lower() in ("true", "1", "yes")
    if kind is str:
        text = text.split("'")[0].strip()
        return text.removeprefix("torch.") or None
    try:
        return kind(number(text)) if kind is int else kind(text)
    except ValueError:
        return None


def _settings_from(c: Collector, pairs: dict[str, str], *, user: bool, overwrite: bool = True) -> None:
    for key, text in pairs.items():
        key = _ABBREVIATED.get(key, key)
        if key in _FLAG_FIELDS:
            name, kind = _FLAG_FIELDS[key]
            c.set(name, _convert(kind, text), user=user, overwrite=overwrite)


def _settings(c: Collector, rec: Record) -> None:
    text = rec.text
    m = _ARGS.search(text)
    if m:
        pairs = literal_pairs(m.group(1))
        pairs.pop("model_tag", None)
        _settings_from(c, pairs, user=True)
    m = _NAMESPACE.search(text)
    if m:
        _settings_from(c, literal_pairs(m.group(1)), user=True)
    m = _CONFIG.search(text)
    if m:
        # The engine's resolved config: it fills what the user's flags left to defaults.
        _settings_from(c, literal_pairs(m.group(1)), user=False, overwrite=False)
    m = _SERVE.search(text)
    if m:
        c.set("model", m.group(1), user=True, overwrite=False)
        _settings_from(c, cli_flags(m.group(2)), user=True, overwrite=False)
    m = _IMAGE_RUN.search(text)
    if m:
        _image_run(c, m)
    for regex, name in ((_MAX_LEN, "max_model_len"), (_CHUNKED, "max_num_batched_tokens")):
        m = regex.search(text)
        if m:
            c.set(name, int(number(m.group(1))), overwrite=False)
    # Unsloth chooses these and passes them to vLLM as the user would.
    m = _UNSLOTH_LOAD.search(text)
    if m:
        c.set("model", m.group(1), user=True, overwrite=False)
        c.set("utilization", round(number(m.group(2)) / 100, 4), user=True, overwrite=False)
    m = _UNSLOTH_STEP.search(text)
    if m:
        c.set("max_num_batched_tokens", int(number(m.group(1))), user=True, overwrite=False)
        c.set("max_num_seqs", int(number(m.group(2))), user=True, overwrite=False)
    m = _ENGINE.search(text)
    if m:
        c.set("vllm_engine", m.group(1).lower(), overwrite=False)
    c.set("install", install_shown(text), overwrite=False)
    c.set("compile_cache", compile_cache_shown(text), overwrite=False)
    c.set("flashinfer_sampler", flashinfer_sampler_shown(text), overwrite=False)
    for regex in (_UNSLOTH_GPU, _NVIDIA_GPU, _DEVICE):
        m = regex.search(text)
        if m:
            c.set("device_name", m.group(1).replace("_", " ").strip(), overwrite=False)


def _image_run(c: Collector, m: re.Match[str]) -> None:
    """A pasted `docker run` of the vllm/vllm-openai image: the model (the first word after the image, unless the
    command passes --model), the flags, the tag's release where it names one (not "latest"), an image install.
    The shell's line continuations (a lone backslash) are dropped first."""
    words = [w for w in m.group("args").split() if w != "\\"]
    if words and not words[0].startswith("-"):
        c.set("model", words[0], user=True, overwrite=False)
    _settings_from(c, cli_flags(" ".join(words)), user=True, overwrite=False)
    c.set("install", "image", overwrite=False)
    tag = _RELEASE_TAG.match(m.group("tag") or "")
    if tag and c.version is None:
        c.version = tag.group(1)


def install_shown(text: str) -> str | None:
    """"image" or "wheel" where `text` shows whether FlashInfer was importable; None where it does not."""
    return next((install for regex, install in _INSTALL if regex.search(text)), None)


def compile_cache_shown(text: str) -> str | None:
    """"cold" or "warm" where `text` shows whether torch.compile compiled or loaded its graphs; None where not."""
    return next((state for regex, state in _COMPILE_CACHE if regex.search(text)), None)


def flashinfer_sampler_shown(text: str) -> bool | None:
    """True or False where `text` shows V1's sampler taking or refusing FlashInfer by VLLM_USE_FLASHINFER_SAMPLER;
    None where it does not."""
    return next((taken for regex, taken in _FLASHINFER_SAMPLER if regex.search(text)), None)


def read_vllm(records: list[Record], source: str) -> StartupLog:
    """The vLLM start-up these records tell."""
    c = Collector("vllm")
    for rec in records:
        c.apply(PATTERNS, rec)
        _settings(c, rec)
        if c.version is None:
            for regex in _VERSION:
                m = regex.search(rec.text)
                if m:
                    c.version = m.group(1)
                    break
        for regex, outcome in FAILURES:
            if regex.search(rec.text):
                c.fail(outcome, rec.text)
        if c.outcome == OTHER_FAILURE and _EXCEPTION.search(rec.text) and "failed to start" in (c.error or ""):
            c.error = rec.text.strip()[:400]  # the exception that made the engine fail, not the banner
        for r in c.by_rank.get(rec.rank or "driver", [])[-4:] + c.summary[-2:]:
            if r.line == rec.line and ((r.key == "num_blocks" and r.value <= 0) or
                                       (r.key == "available_kv" and r.value < 0)):
                # vLLM stops here: "No available memory for the cache blocks" (raise_if_cache_size_invalid).
                c.fail(KV_OOM, rec.text)
    if any(_GRAPHS_OFF.search(rec.text) for rec in records):
        c.notes.append("the log ran with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0: vLLM left its CUDA-graph "
                       "estimate out of the budget, where kvplan plans 0.20+ with it")
    tokens = [r for r in c.summary if r.key == "kv_tokens"]
    if len({r.value for r in tokens}) > 1:
        c.notes.append(f"{len(tokens)} ranks printed GPU KV cache sizes from {min(r.value for r in tokens):,.0f} "
                       f"to {max(r.value for r in tokens):,.0f} tokens; vLLM runs at the smallest")
        low = min(tokens, key=lambda r: r.value)
        c.summary = [r for r in c.summary if r.key != "kv_tokens"] + [low]
    return c.build(source, len(records), _started)


def graph_estimate(log: StartupLog, total_bytes: int) -> Reading | None:
    """The CUDA-graph estimate the primary rank printed as a share of the CUDA total, in bytes: T4 on 0.30,
    (0.8500 - 0.8265) x 15,835,660,288 B = 372,138,017 B (0.35 GiB), to within 1 / 10,000 of the total. None
    where the rank printed no share, or where the suggested utilization is capped at 1.0 (then only a bound)."""
    r = log.primary
    util, without, raised = r.get(_SHARE_UTIL), r.get(_SHARE_WITHOUT), r.get(_SHARE_RAISED)
    if util is None:
        return None
    if without is not None:
        share = util.value - without.value
    elif raised is not None and raised.value < 1.0:
        share = raised.value - util.value
    else:
        return None
    return Reading("cuda_graph_share", round(share * total_bytes), BYTES, total_bytes / 10_000, util.line)


def _started(c: Collector) -> bool:
    """The KV cache was sized: vLLM printed its size or the blocks."""
    return any(r.key in ("kv_tokens", "num_blocks", "max_concurrency") for r in c.summary) or any(
        r.key == "available_kv" for rs in c.by_rank.values() for r in rs)
