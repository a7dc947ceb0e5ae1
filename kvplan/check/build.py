"""Turn an engine's parsed flags plus what the manifest says about GPUs into one DeploymentRequest.

Each engine names the same knob differently (vLLM --max-model-len, SGLang --context-length, TGI
--max-total-tokens); this module maps them onto the request's fields, reads numbers strictly, and records
every value it cannot determine (a Helm template, an undefined $(VAR), a local model path) as Unresolved
with the way to supply it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvplan.check.flags import ParsedArgs, bool_word
from kvplan.check.invocation import unexpanded
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.templates import find_template, unmask

# Request field -> canonical flag per engine. TGI's knobs are the launcher's; SGLang's page size is its block.
_FIELDS: dict[str, dict[str, str]] = {
    "vllm": {
        "model": "model",
        "tp": "tensor-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp": "data-parallel-size-local",
        "dp_total": "data-parallel-size",
        "max_model_len": "max-model-len",
        "max_num_seqs": "max-num-seqs",
        "max_num_batched_tokens": "max-num-batched-tokens",
        "gpu_memory_utilization": "gpu-memory-utilization",
        "kv_cache_dtype": "kv-cache-dtype",
        "dtype": "dtype",
        "quantization": "quantization",
        "block_size": "block-size",
        "enable_prefix_caching": "enable-prefix-caching",
    },
    "sglang": {
        "model": "model-path",
        "tp": "tensor-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp_total": "data-parallel-size",
        "max_model_len": "context-length",
        "max_num_seqs": "max-running-requests",
        "max_num_batched_tokens": "chunked-prefill-size",
        "gpu_memory_utilization": "mem-fraction-static",
        "kv_cache_dtype": "kv-cache-dtype",
        "dtype": "dtype",
        "quantization": "quantization",
        "block_size": "page-size",
    },
    "tgi": {
        "model": "model-id",
        "tp": "num-shard",
        "max_model_len": "max-total-tokens",
        "max_num_seqs": "max-batch-size",
        "max_num_batched_tokens": "max-batch-prefill-tokens",
        "gpu_memory_utilization": "cuda-memory-fraction",
        "kv_cache_dtype": "kv-cache-dtype",
        "dtype": "dtype",
        "quantization": "quantize",
    },
}
_HF_CACHE_RE = re.compile(r"models--([A-Za-z0-9][\w.-]*)--([\w.-]+?)(?:/|$)")
_DOUBLE_DASH_RE = re.compile(r"(?:^|/)([A-Za-z0-9][\w.-]*?)--([A-Za-z0-9][\w.-]*)(?:/|$)")
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?$")
_VAR_NAME_RE = re.compile(r"\$[({]?(\w+)")
_HUMAN_INT_RE = re.compile(r"^(\d+(?:\.\d+)?)([kmgKMG]?)$")


@dataclass(frozen=True)
class Site:
    """Where a deployment is and how its user supplies what is missing there."""

    location: Location
    name: str
    source_format: str
    templates: tuple[str, ...] = ()
    gpu_fix: str = "add annotation kvplan.io/gpu: H100-80GB to the pod template, or pass --gpu"
    model_fix: str = "add annotation kvplan.io/model: ORG/NAME (the Hugging Face repo of the weights)"
    render_fix: str = "render the templates first (helm template ... | kvplan check -)"


@dataclass(frozen=True)
class Hardware:
    """What the manifest says about the accelerators of one replica."""

    gpu: str | None = None
    gpu_source: str = ""
    num_gpus: int | None = None
    unresolved: tuple[Unresolved, ...] = ()
    notes: tuple[str, ...] = ()
    missing_gpu: str | None = None  # why no GPU type was found, when none was


@dataclass
class _Collect:
    unresolved: list[Unresolved] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def normalize_model(raw: str) -> tuple[str | None, str | None]:
    """A Hugging Face repo id recovered from how the model is given, or None and the reason why not.

    'hf://Qwen/Qwen2.5-7B-Instruct' -> 'Qwen/Qwen2.5-7B-Instruct';
    '/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/abc' -> 'meta-llama/Llama-3.1-8B';
    's3://bucket/models/meta-llama--Meta-Llama-3.1-8B-Instruct' -> 'meta-llama/Meta-Llama-3.1-8B-Instruct';
    '/data/checkpoints/step-100' -> None (a local path names no repo).
    """
    text = raw.strip()
    if text.startswith("hf://"):
        text = text[len("hf://") :]
    cached = _HF_CACHE_RE.search(text)
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}", None
    if "://" in text or text.startswith(("/", "./", "../", "~")):
        flat = _DOUBLE_DASH_RE.search(text.split("://", 1)[-1])
        if flat and "://" in text:
            return f"{flat.group(1)}/{flat.group(2)}", None
        kind = "a local path" if "://" not in text else f"a {text.split('://')[0]}:// URI"
        return None, f"the model is {kind} ({raw}), not a Hugging Face repo id"
    if _REPO_RE.match(text):
        return text, None
    return None, f"cannot read {raw!r} as a Hugging Face repo id"


def build_request(
    site: Site,
    parsed: ParsedArgs,
    hardware: Hardware,
    *,
    positional_model: bool = False,
    model_hint: tuple[str, str] | None = None,
    model_override: str | None = None,
    default_gpu: str | None = None,
    notes: tuple[str, ...] = (),
    unresolved: tuple[Unresolved, ...] = (),
    min_margin: float | None = None,
) -> DeploymentRequest:
    """Map flags to fields. `model_hint` = (value, where) used when the command line names no model."""
    engine = parsed.engine
    names = _FIELDS[engine]
    out = _Collect(list(unresolved), list(notes) + list(parsed.notes) + list(hardware.notes))
    out.unresolved.extend(hardware.unresolved)

    def text(key: str) -> str | None:
        flag = names.get(key)
        return parsed.get(flag) if flag else None

    def number(key: str, kind: type, human: bool = False) -> int | float | None:
        raw = text(key)
        if raw is None:
            return None
        flag = names[key]
        if not _usable(raw, key, f"--{flag}", site, out):
            return None
        try:
            return _read_number(raw, kind, human)
        except ValueError:
            out.unresolved.append(
                Unresolved(key, f"--{flag} is {raw!r}, not a {'whole number' if kind is int else 'number'}", f"fix --{flag}")
            )
            return None

    model = _model(site, parsed, positional_model, model_hint, model_override, text("model"), out)

    tp = number("tp", int) or 1
    pp = number("pp", int) or 1
    dp_local = number("dp", int) if "dp" in names else None
    dp_total = number("dp_total", int) if "dp_total" in names else None
    dp = dp_local or dp_total or 1
    if engine == "tgi" and parsed.get("num-shard") is None and hardware.num_gpus:
        # TGI shards over every GPU it can see when --num-shard is not given.
        tp = hardware.num_gpus
        out.notes.append(f"TGI without --num-shard shards over all {tp} visible GPUs")

    gmu = number("gpu_memory_utilization", float)
    if gmu is not None and not 0 < gmu <= 1:
        flag = names["gpu_memory_utilization"]
        out.unresolved.append(Unresolved("gpu_memory_utilization", f"--{flag} {gmu} is outside (0, 1]", f"set --{flag} between 0 and 1"))
        gmu = None

    prefix: bool | None = None
    if engine == "vllm" and text("enable_prefix_caching") is not None:
        prefix = bool_word(text("enable_prefix_caching") or "") == "true"
    if engine == "sglang" and parsed.get("disable-radix-cache") is not None:
        prefix = bool_word(parsed.get("disable-radix-cache") or "") != "true"

    gpu, gpu_source = hardware.gpu, hardware.gpu_source
    if gpu is not None:
        template = find_template(gpu, site.templates)
        if template or unexpanded(gpu):
            out.unresolved.append(
                Unresolved("gpu", f"the GPU type is templated ({unmask(gpu, site.templates)})", site.gpu_fix)
            )
            gpu = None
    elif default_gpu:
        gpu, gpu_source = default_gpu, "--gpu"
    elif not any(u.field == "gpu" for u in out.unresolved):
        out.unresolved.append(Unresolved("gpu", hardware.missing_gpu or "no GPU type in the manifest", site.gpu_fix))

    num_gpus = hardware.num_gpus
    used = tp * pp * dp
    if num_gpus is not None:
        if num_gpus > used:
            out.notes.append(
                f"{num_gpus} GPUs requested but tp x pp{' x dp' if dp > 1 else ''} = {used} uses {used}"
            )
        elif num_gpus < used:
            out.notes.append(
                f"tp x pp{' x dp' if dp > 1 else ''} = {used} needs {used} GPUs but only {num_gpus} are "
                "requested: the engine will not start"
            )

    return DeploymentRequest(
        location=site.location,
        name=unmask(site.name, site.templates),
        source_format=site.source_format,
        engine=engine,
        model=model,
        gpu=gpu,
        gpu_source=gpu_source if gpu else "",
        num_gpus=num_gpus,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=number("max_model_len", int, human=engine == "vllm"),
        max_num_seqs=number("max_num_seqs", int),
        max_num_batched_tokens=number("max_num_batched_tokens", int, human=engine == "vllm"),
        gpu_memory_utilization=gmu,
        kv_cache_dtype=_plain(text("kv_cache_dtype"), "kv_cache_dtype", names, site, out),
        dtype=_plain(text("dtype"), "dtype", names, site, out),
        quantization=_plain(text("quantization"), "quantization", names, site, out),
        block_size=number("block_size", int) if "block_size" in names else None,
        enable_prefix_caching=prefix,
        min_margin=min_margin,
        flags=tuple((k, unmask(v, site.templates)) for k, v in parsed.flags),
        unresolved=tuple(out.unresolved),
        notes=tuple(dict.fromkeys(out.notes)),
    )


def _model(
    site: Site,
    parsed: ParsedArgs,
    positional_model: bool,
    hint: tuple[str, str] | None,
    override: str | None,
    flag_value: str | None,
    out: _Collect,
) -> str | None:
    raw = flag_value
    if raw is None and positional_model and parsed.positionals:
        raw = parsed.positionals[0]
    extra = parsed.positionals[1:] if positional_model else parsed.positionals
    if extra:
        out.notes.append(f"ignored positional words: {' '.join(extra)}")
    where = "the command line"
    if raw is None and hint is not None:
        raw, where = hint
    if override:
        if raw and raw != override:
            out.notes.append(f"model {override} from annotation kvplan.io/model (the manifest loads {raw})")
        return override
    if raw is None:
        if parsed.engine == "vllm":
            # vLLM's default --model is facebook/opt-125m; a manifest that relies on it is almost surely incomplete.
            out.unresolved.append(Unresolved("model", "no model on the command line", site.model_fix))
        else:
            out.unresolved.append(Unresolved("model", "no model given", site.model_fix))
        return None
    template = find_template(raw, site.templates)
    if template:
        out.unresolved.append(Unresolved("model", f"{where} is templated: {template}", site.model_fix))
        return None
    model, problem = normalize_model(raw)
    variable = unexpanded(raw)
    if model is None or variable and variable in model:
        if variable:
            problem = f"{where} is {raw!r}, and {variable} is not defined in the manifest"
        out.unresolved.append(Unresolved("model", problem or "unknown model", site.model_fix))
        return None
    if model not in (raw, f"hf://{raw}") and raw != f"hf://{model}":
        out.notes.append(f"model {model} read from {raw}")
    return model


def _usable(raw: str, key: str, where: str, site: Site, out: _Collect, fix: str | None = None) -> bool:
    """False (and an Unresolved) when a value is a Helm template or an undefined variable."""
    template = find_template(raw, site.templates)
    if template:
        out.unresolved.append(Unresolved(key, f"{where} is templated: {template}", fix or site.render_fix))
        return False
    variable = unexpanded(raw)
    if variable:
        out.unresolved.append(
            Unresolved(key, f"{where} is {raw!r}, and {variable} is not defined in the manifest",
                       fix or f"define {_VAR_NAME_RE.match(variable).group(1)} in the container env, or write the value")
        )
        return False
    return True


def _plain(raw: str | None, key: str, names: dict[str, str], site: Site, out: _Collect) -> str | None:
    if raw is None or not _usable(raw, key, f"--{names[key]}", site, out):
        return None
    return raw.strip().lower() if key != "dtype" else raw.strip()


def _read_number(raw: str, kind: type, human: bool) -> int | float:
    """'4096' -> 4096; with `human` also vLLM's '128k' (x1000) and '128K' (x1024); '0.9' as float."""
    text = raw.strip().strip("'\"")
    if kind is float:
        return float(text)
    if human:
        match = _HUMAN_INT_RE.match(text)
        if match and match.group(2):
            unit = match.group(2)
            scale = {"k": 10**3, "m": 10**6, "g": 10**9}[unit.lower()] if unit.islower() else {"K": 2**10, "M": 2**20, "G": 2**30}[unit]
            value = float(match.group(1)) * scale
            if value != int(value):
                raise ValueError(text)
            return int(value)
    return int(text)


def unsupported(site: Site, engine: str, model: str | None, reason: str, fix: str) -> DeploymentRequest:
    """A deployment found but served by an engine kvplan does not model: reported, never evaluated."""
    return DeploymentRequest(site.location, site.name, site.source_format, engine.lower(), model, None, "", None,
                             unresolved=(Unresolved("engine", reason, fix),))
