"""Turn an engine's parsed flags plus what the manifest says about GPUs into one DeploymentRequest.

Each engine names the same knob differently (vLLM --max-model-len, SGLang --context-length, TGI
--max-total-tokens); this module maps them onto the request's fields, reads numbers strictly, and records
every value it cannot determine (a Helm template, an undefined $(VAR), a local model path) as Unresolved
with the way to supply it.
"""

from __future__ import annotations

import re
from dataclasses import field, replace

from kvplan.check.flags import ParsedArgs, bool_word
from kvplan.check.invocation import PipVllm, unexpanded
from kvplan.check.model import DeploymentRequest, IgnoredFlag, Location, Unresolved
from kvplan.check.templates import find_template, unmask
from kvplan.engines.vllm_speculative import speculative_options
from kvplan.errors import InputError, KvplanError
from kvplan.hardware.gpus import find_gpu
from kvplan.records import dataclass

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
        "enable_chunked_prefill": "enable-chunked-prefill",
        "nnodes": "nnodes",
        "cpu_offload_gb": "cpu-offload-gb",
        "kv_cache_memory": "kv-cache-memory-bytes",
        "max_loras": "max-loras",
        "max_lora_rank": "max-lora-rank",
        "mamba_cache_dtype": "mamba-cache-dtype",
        "mamba_ssm_cache_dtype": "mamba-ssm-cache-dtype",
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
        "nnodes": "nnodes",
        "ep": "expert-parallel-size",
        "cpu_offload_gb": "cpu-offload-gb",
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
        "max_batch_total_tokens": "max-batch-total-tokens",
    },
}
# Flags that change the engine's GPU memory and that kvplan's figures do not apply, with why. Every other
# memory flag is read into a field of the request (see DeploymentRequest); flags that only change the host
# (swap space, CPU LoRA slots) or nothing of memory are not listed.
_UNMODELLED: dict[str, dict[str, str]] = {
    "vllm": {
        "speculative-config": "a draft model's weights and KV cache take GPU memory kvplan does not count",
        "speculative-model": "a draft model's weights and KV cache take GPU memory kvplan does not count",
        "num-speculative-tokens": "speculative decoding takes GPU memory kvplan does not count",
        "num-gpu-blocks-override": "fixes vLLM's KV block count; kvplan derives it from memory",
        "disable-sliding-window": "vLLM then caches the whole context of windowed layers; kvplan plans the window",
        "hf-overrides": "config overrides are not applied to the model kvplan plans",
        "rope-scaling": "changes the context the model accepts; kvplan plans the model's own config",
        "kv-transfer-config": "KV connector buffers (NIXL, LMCache) take memory kvplan does not count",
        "compilation-config": "CUDA-graph capture sizes change the memory vLLM sets aside; kvplan uses the default",
        "cuda-graph-sizes": "CUDA-graph capture sizes change the memory vLLM sets aside; kvplan uses the default",
        "enforce-eager": "no CUDA graphs, no torch.compile: vLLM keeps that memory for KV; kvplan still subtracts "
                         "it (conservative)",
    },
    "sglang": {
        "max-total-tokens": "caps SGLang's token pool; kvplan sizes the pool from memory",
        "speculative-algorithm": "a draft model's weights and KV cache take GPU memory kvplan does not count",
        "speculative-draft-model-path": "a draft model's weights and KV cache take GPU memory kvplan does not count",
        "enable-lora": "LoRA adapters take GPU memory kvplan does not count",
        "lora-paths": "LoRA adapters take GPU memory kvplan does not count",
        "json-model-override-args": "config overrides are not applied to the model kvplan plans",
        "cuda-graph-max-bs": "CUDA-graph memory depends on it; kvplan uses SGLang's default",
        "mamba-ssm-dtype": "sets a hybrid's SSM state dtype; kvplan plans SGLang's float32 default",
    },
    "tgi": {
        "speculate": "speculative tokens take KV kvplan does not count",
        "lora-adapters": "LoRA adapters take GPU memory kvplan does not count",
        "rope-scaling": "changes the context the model accepts; kvplan plans the model's own config",
        "rope-factor": "changes the context the model accepts; kvplan plans the model's own config",
    },
}
# TGI before 3.0 caps its default --max-total-tokens at 4096 (launcher: `let max_default = 4096;`, then
# min(max_position_embeddings, max_default)); 3.x derives it from free memory instead.
TGI_DEFAULT_MAX_TOTAL_TOKENS_CAP = 4096

_HF_CACHE_RE = re.compile(r"models--([A-Za-z0-9][\w.-]*)--([\w.-]+?)(?:/|$)")
_DOUBLE_DASH_RE = re.compile(r"(?:^|/)([A-Za-z0-9][\w.-]*?)--([A-Za-z0-9][\w.-]*)(?:/|$)")
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?$")
_VAR_NAME_RE = re.compile(r"\$[({]?(\w+)")
GiB_BYTES = 2**30  # vLLM and SGLang read --cpu-offload-gb as GiB (`cpu_offload_gb * 1024**3`)
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
    """What the manifest says about the accelerators of one instance (one engine)."""

    gpu: str | None = None
    gpu_source: str = ""
    num_gpus: int | None = None  # GPUs of the instance: per pod x pods, unless the format states the total
    unresolved: tuple[Unresolved, ...] = ()
    notes: tuple[str, ...] = ()
    missing_gpu: str | None = None  # why no GPU type was found, when none was
    gpus_per_pod: int | None = None
    pods_per_instance: int | None = None  # None: the file does not say (then --nnodes, else 1)
    replicas: int = 1
    gpu_memory_bytes: int | None = None  # when the file states it (GPU feature discovery's gpu.memory)
    lines: tuple[tuple[str, int], ...] = ()  # "gpu", "num_gpus", "replicas" -> the line that states it


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
    engine_version: str | None = None,
    env: dict[str, str] | None = None,
    model_line: int | None = None,
    pip: PipVllm | None = None,
) -> DeploymentRequest:
    """Map flags to fields. `model_hint` = (value, where) used when the command line names no model.

    `default_gpu` fills in a GPU type the file does not state; `kvplan check --gpu` overrides the file
    later, in one place (readers.finish), for every format alike. `pip`: the file's own script pip-installs
    vLLM: its pin is the release (over an image tag, which it reinstalls), and the install is the wheel.
    """
    engine = parsed.engine
    names = _FIELDS[engine]
    out = _Collect(list(unresolved), list(notes) + list(parsed.notes) + list(hardware.notes))
    if pip is not None and engine == "vllm":
        extras = f"[{','.join(pip.extras)}]" if pip.extras else ""
        release = f"vLLM{extras} {pip.version}" if pip.version else f"vLLM{extras} (no release pinned)"
        out.notes.append(f"{release} pip-installed by the file's own script: planned as the wheel, which before 0.12 "
                         "has neither FlashInfer nor OpenAI's triton_kernels" if pip.install == "wheel" else
                         f"{release} pip-installed by the file's own script: planned as the image (FlashInfer's "
                         "sampler)")
    out.unresolved.extend(hardware.unresolved)
    lines: dict[str, int] = dict(hardware.lines)
    for (flag, _), line in zip(parsed.flags, parsed.flag_lines, strict=True):
        if line is not None:
            lines[f"--{flag}"] = line

    def text(key: str) -> str | None:
        flag = names.get(key)
        return parsed.get(flag) if flag else None

    def number(key: str, kind: type, human: bool = False) -> int | float | None:
        raw = text(key)
        if raw is None:
            return None
        flag = names[key]
        line = parsed.line(flag)
        if line is not None:
            lines[key] = line
        if not _usable(raw, key, f"--{flag}", site, out, line=line):
            return None
        try:
            return _read_number(raw, kind, human)
        except ValueError:
            out.unresolved.append(
                Unresolved(key, f"--{flag} is {raw!r}, not a {'whole number' if kind is int else 'number'}",
                           f"fix --{flag}", line)
            )
            return None

    def whole(key: str, human: bool = False) -> int | None:
        value = number(key, int, human)
        return None if value is None else int(value)

    def real(key: str) -> float | None:
        value = number(key, float)
        return None if value is None else float(value)

    model = _model(site, parsed, positional_model, model_hint, model_override, text("model"), out)
    if parsed.line(names["model"]) is not None:
        lines["model"] = parsed.line(names["model"]) or 0
    elif model_line is not None:
        lines["model"] = model_line

    tp = whole("tp") or 1
    pp = whole("pp") or 1
    dp_local = whole("dp") if "dp" in names else None
    dp_total = whole("dp_total") if "dp_total" in names else None
    dp = dp_total or 1
    if engine == "tgi" and parsed.get("num-shard") is None and hardware.num_gpus:
        # TGI shards over every GPU it can see when --num-shard is not given.
        tp = hardware.num_gpus
        out.notes.append(f"TGI without --num-shard shards over all {tp} visible GPUs")

    gmu = real("gpu_memory_utilization")
    if gmu is not None and not 0 < gmu <= 1:
        flag = names["gpu_memory_utilization"]
        out.unresolved.append(Unresolved("gpu_memory_utilization", f"--{flag} {gmu} is outside (0, 1]",
                                         f"set --{flag} between 0 and 1", parsed.line(flag)))
        gmu = None

    prefix: bool | None = None
    if engine == "vllm" and text("enable_prefix_caching") is not None:
        prefix = bool_word(text("enable_prefix_caching") or "") == "true"
    chunked: bool | None = None
    if engine == "vllm" and text("enable_chunked_prefill") is not None:
        chunked = bool_word(text("enable_chunked_prefill") or "") == "true"
    if engine == "sglang" and parsed.get("disable-radix-cache") is not None:
        prefix = bool_word(parsed.get("disable-radix-cache") or "") != "true"

    dp_attention = engine == "sglang" and _switch(parsed, "enable-dp-attention")
    ep_size = whole("ep") if "ep" in names else None
    expert_parallel = (engine == "vllm" and _switch(parsed, "enable-expert-parallel")) or (
        engine == "sglang" and ((ep_size or 1) > 1 or _switch(parsed, "enable-ep-moe")
                                or _switch(parsed, "enable-deepep-moe")))
    nnodes = whole("nnodes") if "nnodes" in names else None
    pods = hardware.pods_per_instance or nnodes or 1
    if nnodes and hardware.pods_per_instance and nnodes != hardware.pods_per_instance:
        out.notes.append(f"--nnodes {nnodes}, but the manifest runs {hardware.pods_per_instance} pods per instance")
    num_gpus = hardware.num_gpus
    if num_gpus is not None and hardware.pods_per_instance is None and nnodes and nnodes > 1:
        # One pod of a StatefulSet (or LWS) per node: the instance holds every node's GPUs.
        num_gpus = num_gpus * nnodes
        out.notes.append(f"--nnodes {nnodes}: {nnodes} pods x {hardware.num_gpus} GPUs = {num_gpus} GPUs per instance")

    offload_gib = real("cpu_offload_gb") if "cpu_offload_gb" in names else None
    kv_memory = whole("kv_cache_memory", human=True) if "kv_cache_memory" in names else None
    batch_tokens = whole("max_batch_total_tokens") if "max_batch_total_tokens" in names else None

    max_model_len = whole("max_model_len", human=engine == "vllm")
    cap = None
    if engine == "tgi" and max_model_len is None:
        major = _major(engine_version)
        if major is not None and major < 3:
            cap = TGI_DEFAULT_MAX_TOTAL_TOKENS_CAP
            out.notes.append(f"TGI {engine_version} without --max-total-tokens serves min(model context, {cap})")
        else:
            out.notes.append("TGI 3 without --max-total-tokens sizes it from free memory (at most the model context)")
    speculative = _speculative(parsed, out) if engine == "vllm" else None
    lora = None
    if engine == "vllm" and _switch(parsed, "enable-lora"):
        # vLLM's defaults: one adapter slot of rank 16. A value that cannot be read is already unresolved.
        loras = whole("max_loras") if "max_loras" in names else None
        rank = whole("max_lora_rank") if "max_lora_rank" in names else None
        lora = (1 if loras is None else loras, 16 if rank is None else rank, _switch(parsed, "fully-sharded-loras"))
    allow_long = bool(env) and bool_word((env or {}).get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")) == "true"
    flashinfer_sampler = _env_switch(env, "VLLM_USE_FLASHINFER_SAMPLER", "flashinfer_sampler", out) \
        if engine == "vllm" else None
    use_v1 = _env_switch(env, "VLLM_USE_V1", "use_v1", out) if engine == "vllm" else None
    mla_disable = engine == "vllm" and bool(_env_switch(env, "VLLM_MLA_DISABLE", "mla_disable", out))
    deep_gemm = _deep_gemm(env, out) if engine == "vllm" else None

    gpu, gpu_source = hardware.gpu, hardware.gpu_source
    if gpu is not None:
        template = find_template(gpu, site.templates)
        if template or unexpanded(gpu):
            out.unresolved.append(
                Unresolved("gpu", f"the GPU type is templated ({unmask(gpu, site.templates)})", site.gpu_fix,
                           lines.get("gpu"))
            )
            gpu = None
    elif default_gpu:
        gpu, gpu_source = default_gpu, "--gpu"
    elif not any(u.field == "gpu" for u in out.unresolved):
        out.unresolved.append(Unresolved("gpu", hardware.missing_gpu or "no GPU type in the manifest", site.gpu_fix))

    if num_gpus is not None:
        used, rule = engine_gpus(engine, tp, pp, dp, dp_attention)
        if num_gpus > used:
            out.notes.append(f"{num_gpus} GPUs requested but {rule} = {used} uses {used}")
        elif num_gpus < used:
            out.notes.append(f"{rule} = {used} needs {used} GPUs but only {num_gpus} are requested: "
                             "the engine will not start")

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
        max_model_len=max_model_len,
        max_num_seqs=whole("max_num_seqs"),
        max_num_batched_tokens=whole("max_num_batched_tokens", human=engine == "vllm"),
        gpu_memory_utilization=gmu,
        kv_cache_dtype=_plain(text("kv_cache_dtype"), "kv_cache_dtype", names, site, out),
        dtype=_plain(text("dtype"), "dtype", names, site, out),
        quantization=_plain(text("quantization"), "quantization", names, site, out),
        block_size=whole("block_size") if "block_size" in names else None,
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        min_margin=min_margin,
        flags=tuple((k, unmask(v, site.templates)) for k, v in parsed.flags),
        unresolved=tuple(out.unresolved),
        notes=tuple(dict.fromkeys(out.notes)),
        gpus_per_pod=hardware.gpus_per_pod if hardware.gpus_per_pod is not None else hardware.num_gpus,
        pods_per_instance=pods,
        replicas=hardware.replicas,
        data_parallel_size=dp,
        data_parallel_size_local=dp_local,
        dp_attention=dp_attention,
        expert_parallel=expert_parallel,
        expert_parallel_size=ep_size,
        cpu_offload_bytes=round(offload_gib * GiB_BYTES) if offload_gib else None,
        kv_cache_memory_bytes=kv_memory,
        max_batch_total_tokens=batch_tokens,
        max_model_len_cap_tokens=cap,
        allow_long_max_model_len=allow_long,
        flashinfer_sampler=flashinfer_sampler,
        mla_disable=mla_disable,
        deep_gemm=deep_gemm,
        use_v1=use_v1,
        lora_slots=lora,
        mamba_cache_dtype=_plain(text("mamba_cache_dtype"), "mamba_cache_dtype", names, site, out)
        if "mamba_cache_dtype" in names else None,
        mamba_ssm_cache_dtype=_plain(text("mamba_ssm_cache_dtype"), "mamba_ssm_cache_dtype", names, site, out)
        if "mamba_ssm_cache_dtype" in names else None,
        engine_version=(pip.version if pip is not None and pip.version else engine_version),
        engine_install=pip.install if pip is not None and engine == "vllm" else None,
        gpu_memory_bytes=hardware.gpu_memory_bytes,
        speculative=speculative,
        ignored_flags=_ignored(parsed, read=("speculative-config",) if speculative else ()),
        lines=tuple(sorted(lines.items())),
    )


def engine_gpus(engine: str, tp: int, pp: int, dp: int, dp_attention: bool) -> tuple[int, str]:
    """The GPUs one instance needs, and the rule in words: vLLM tp x pp x dp; SGLang tp x pp when its
    DP-attention ranks live inside the TP group (else tp x pp x dp); TGI its shards."""
    if engine == "sglang" and dp_attention:
        return tp * pp, "tp x pp (DP-attention ranks share the TP GPUs)"
    if dp > 1 and engine in ("vllm", "sglang"):
        return tp * pp * dp, "tp x pp x dp"
    return tp * pp, "tp x pp"


def _switch(parsed: ParsedArgs, flag: str) -> bool:
    value = parsed.get(flag)
    return value is not None and bool_word(value) == "true"


def _major(version: str | None) -> int | None:
    head = (version or "").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _speculative(parsed: ParsedArgs, out: _Collect) -> tuple[str, int] | None:
    """An MTP --speculative-config as (method, draft tokens); None without one, or for another method, which
    stays listed as ignored. A value that is not vLLM's JSON is named in the notes."""
    value = parsed.get("speculative-config")
    if value is None:
        return None
    try:
        options = speculative_options(value)
    except KvplanError as exc:
        out.notes.append(f"--speculative-config not read: {exc}")
        return None
    if options["speculative_method"] != "mtp":
        return None
    return options["speculative_method"], options["num_speculative_tokens"]


def _ignored(parsed: ParsedArgs, read: tuple[str, ...] = ()) -> tuple[IgnoredFlag, ...]:
    """The flags given that change memory in ways kvplan does not model (a switch set to false changes nothing);
    `read`: flags of the table this deployment's value of which kvplan does plan (an MTP --speculative-config)."""
    table = _UNMODELLED[parsed.engine]
    found: dict[str, IgnoredFlag] = {}
    for (flag, value), line in zip(parsed.flags, parsed.flag_lines, strict=True):
        if flag in table and flag not in read and bool_word(value) != "false":
            found[flag] = IgnoredFlag(flag, value, table[flag], line)
    return tuple(found.values())


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


def _usable(raw: str, key: str, where: str, site: Site, out: _Collect, fix: str | None = None,
            line: int | None = None) -> bool:
    """False (and an Unresolved) when a value is a Helm template or an undefined variable."""
    template = find_template(raw, site.templates)
    if template:
        out.unresolved.append(Unresolved(key, f"{where} is templated: {template}", fix or site.render_fix, line))
        return False
    variable = unexpanded(raw)
    if variable:
        name = _VAR_NAME_RE.match(variable)
        out.unresolved.append(
            Unresolved(key, f"{where} is {raw!r}, and {variable} is not defined in the manifest",
                       fix or f"define {name.group(1) if name else variable} in the container env, or write the value",
                       line)
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
            decimal, binary = {"k": 10**3, "m": 10**6, "g": 10**9}, {"K": 2**10, "M": 2**20, "G": 2**30}
            scale = decimal[unit] if unit.islower() else binary[unit]
            value = float(match.group(1)) * scale
            if value != int(value):
                raise ValueError(text)
            return int(value)
    return int(text)


def unsupported(site: Site, engine: str, model: str | None, reason: str, fix: str) -> DeploymentRequest:
    """A deployment found but served by an engine kvplan does not model: reported, never evaluated."""
    return DeploymentRequest(site.location, site.name, site.source_format, engine.lower(), model, None, "", None,
                             unresolved=(Unresolved("engine", reason, fix),))


def not_served(site: Site, what: str, fix: str) -> DeploymentRequest:
    """A deployment whose container runs no model server kvplan knows (a simulator, an unknown command)."""
    return DeploymentRequest(site.location, site.name, site.source_format, "unknown", None, None, "", None,
                             unresolved=(Unresolved("engine", what, fix),))


def apply_hardware(request: DeploymentRequest, *, gpu: str | None = None,
                   gpu_memory_bytes: int | None = None) -> DeploymentRequest:
    """Resolve the request's GPU against the catalog, after `kvplan check --gpu` / `--gpu-mem` are applied.

    What wins: `--gpu` over the GPU type the file states (noted when they differ); `--gpu-mem` over every
    other memory figure (the catalog's, or a node label's nvidia.com/gpu.memory); the catalog's figure over a
    node label's (the catalog holds what CUDA reports, the label what nvidia-smi does). A GPU the catalog does
    not know is a gap that names the closest catalog entries, unless --gpu-mem gives its memory.
    """
    unresolved = list(request.unresolved)
    notes = list(request.notes)
    name, source = request.gpu, request.gpu_source
    if gpu:
        if name and name != gpu:
            notes.append(f"GPU {gpu} from --gpu (the file says {name})")
        name, source = gpu, "--gpu"
        unresolved = [u for u in unresolved if u.field != "gpu"]
    memory, key = request.gpu_memory_bytes, None
    if gpu_memory_bytes:
        memory = gpu_memory_bytes
        if name is None:
            unresolved = [u for u in unresolved if u.field != "gpu"]
            source = "--gpu-mem"
    if name is not None:
        try:
            spec = find_gpu(name)
        except InputError as exc:
            if not gpu_memory_bytes:
                how = "name a catalog GPU with annotation kvplan.io/gpu or --gpu, or give its memory with --gpu-mem"
                unresolved.append(Unresolved("gpu", exc.message, how, request.line_of("gpu")))
        else:
            key = spec.key
            if not gpu_memory_bytes:
                memory = spec.total_memory_bytes
    return replace(request, gpu=name, gpu_source=source if (name or memory) else "", gpu_key=key,
                   gpu_memory_bytes=memory, unresolved=tuple(unresolved), notes=tuple(dict.fromkeys(notes)))


def _deep_gemm(env: dict[str, str] | None, out: _Collect) -> bool | None:
    """VLLM_USE_DEEP_GEMM and VLLM_MOE_USE_DEEP_GEMM: off where either is 0, asked for where the MoE switch is
    1 (vllm.VllmFlags.deep_gemm), None where neither is set."""
    use = _env_switch(env, "VLLM_USE_DEEP_GEMM", "deep_gemm", out)
    moe = _env_switch(env, "VLLM_MOE_USE_DEEP_GEMM", "deep_gemm", out)
    if use is False or moe is False:
        return False
    return moe


def _env_switch(env: dict[str, str] | None, name: str, key: str, out: _Collect) -> bool | None:
    """A vLLM environment switch read as bool(int(...)) in vllm/envs.py (VLLM_USE_FLASHINFER_SAMPLER,
    VLLM_USE_V1, VLLM_MLA_DISABLE); None where unset, and named as unresolved where it is not 0 or 1."""
    raw = (env or {}).get(name)
    if raw is None:
        return None
    word = bool_word(raw)
    if word is None:
        out.unresolved.append(Unresolved(key, f"env {name} is {raw!r}, not 0 or 1", f"set {name} to 0 or 1"))
    return None if word is None else word == "true"
