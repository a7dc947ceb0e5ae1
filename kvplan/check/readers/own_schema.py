"""kvplan's own deployment schema (`kvplan: 1`), described by deploy.schema.json next to this file.

    kvplan: 1
    deployments:
      - name: chat
        model: meta-llama/Llama-3.1-8B-Instruct
        gpu: H100-80GB
        num_gpus: 1
        max_model_len: 32768
        max_num_seqs: 64          # or `concurrency`: the concurrent full-length requests it must hold
        kv_cache_dtype: fp8
        min_margin: 0.10

Keys are checked strictly: a misspelt key is an error naming the key and its line, not a silent default.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import normalize_model
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.errors import DeploymentError

SCHEMA_VERSION = 1
_TYPE_WORDS: dict[type, str] = {str: "a string", int: "a whole number", bool: "true or false"}
ENGINES = ("vllm", "sglang", "tgi")
# key -> (type, request field); `tp`/`pp`/`concurrency` are short spellings of the long fields.
KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "name": (str, "name"),
    "model": (str, "model"),
    "engine": (str, "engine"),
    "gpu": (str, "gpu"),
    "num_gpus": (int, "num_gpus"),
    "tp": (int, "tensor_parallel_size"),
    "tensor_parallel_size": (int, "tensor_parallel_size"),
    "pp": (int, "pipeline_parallel_size"),
    "pipeline_parallel_size": (int, "pipeline_parallel_size"),
    "max_model_len": (int, "max_model_len"),
    "max_num_seqs": (int, "max_num_seqs"),
    "concurrency": (int, "max_num_seqs"),
    "max_num_batched_tokens": (int, "max_num_batched_tokens"),
    "gpu_memory_utilization": ((int, float), "gpu_memory_utilization"),
    "kv_cache_dtype": (str, "kv_cache_dtype"),
    "dtype": (str, "dtype"),
    "quantization": (str, "quantization"),
    "block_size": (int, "block_size"),
    "enable_prefix_caching": (bool, "enable_prefix_caching"),
    "min_margin": ((int, float), "min_margin"),
}


def is_own_schema(data: Any) -> bool:
    return isinstance(data, dict) and "kvplan" in data


def own_schema_requests(doc: Document, data: Any) -> list[DeploymentRequest]:
    version = data.get("kvplan")
    if version != SCHEMA_VERSION:
        raise DeploymentError(
            f"{doc.file}:{doc.line}: kvplan: {version!r} is not a schema version kvplan reads (use kvplan: 1)"
        )
    if "deployments" in data:
        extra = sorted(str(k) for k in data if k not in ("kvplan", "deployments"))
        if extra:
            raise DeploymentError(f"{doc.file}:{data.line_of(extra[0])}: unknown key '{extra[0]}' beside deployments")
        items = data["deployments"]
        if not isinstance(items, list) or not items:
            raise DeploymentError(f"{doc.file}:{data.line_of('deployments')}: deployments must be a non-empty list")
        lines = [items.line_of(i) if hasattr(items, "line_of") else doc.line for i in range(len(items))]
    else:
        items = [{k: v for k, v in data.items() if k != "kvplan"}]
        lines = [doc.line]
    return [_one(doc, item, line, i) for i, (item, line) in enumerate(zip(items, lines, strict=True))]


def _one(doc: Document, item: Any, line: int, index: int) -> DeploymentRequest:
    if not isinstance(item, dict):
        raise DeploymentError(f"{doc.file}:{line}: each deployment must be a mapping of keys")
    line_of = getattr(item, "line_of", lambda key: line)
    fields: dict[str, Any] = {}
    for key, value in item.items():
        if key not in KEYS:
            raise DeploymentError(f"{doc.file}:{line_of(key)}: unknown key '{key}'; known keys: {', '.join(KEYS)}")
        kind, target = KEYS[key]
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            want = _TYPE_WORDS.get(kind, "a number") if isinstance(kind, type) else "a number"
            raise DeploymentError(f"{doc.file}:{line_of(key)}: '{key}' must be {want}, not {value!r}")
        if target in fields:
            raise DeploymentError(f"{doc.file}:{line_of(key)}: '{key}' repeats a value already given for {target}")
        fields[target] = value
    if "model" not in fields:
        raise DeploymentError(f"{doc.file}:{line}: a deployment needs 'model' (a Hugging Face repo id)")
    engine = fields.pop("engine", "vllm").lower()
    if engine not in ENGINES:
        raise DeploymentError(f"{doc.file}:{line_of('engine')}: engine must be one of {', '.join(ENGINES)}")
    for key in ("gpu_memory_utilization", "min_margin"):
        if key in fields and not 0 <= fields[key] <= 1:
            raise DeploymentError(f"{doc.file}:{line_of(key)}: {key} must be between 0 and 1")
    unresolved: list[Unresolved] = []
    model, problem = normalize_model(fields.pop("model"))
    if model is None:
        unresolved.append(Unresolved("model", problem or "", "write model: ORG/NAME"))
    gpu = fields.pop("gpu", None)
    source = "gpu key" if gpu else ""
    if gpu is None:
        unresolved.append(Unresolved("gpu", "no gpu key", "add gpu: H100-80GB, or pass --gpu"))
    tp = fields.pop("tensor_parallel_size", 1)
    pp = fields.pop("pipeline_parallel_size", 1)
    num_gpus = fields.pop("num_gpus", tp * pp)
    notes = []
    replicas = 1
    if num_gpus > tp * pp:
        # The schema's num_gpus counts every replica (README): 4 GPUs at tp x pp = 1 are 4 servers.
        replicas = num_gpus // (tp * pp)
        notes.append(f"num_gpus {num_gpus} with tp x pp = {tp * pp}: {replicas} replicas")
    elif num_gpus < tp * pp:
        notes.append(
            f"tp x pp = {tp * pp} needs {tp * pp} GPUs but only {num_gpus} are requested: the engine will not start"
        )
    if "gpu_memory_utilization" in fields:
        fields["gpu_memory_utilization"] = float(fields["gpu_memory_utilization"])
    if "min_margin" in fields:
        fields["min_margin"] = float(fields["min_margin"])
    name = fields.pop("name", f"deployment[{index}]")
    flags = tuple((k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in item.items() if k != "name")
    return DeploymentRequest(
        location=Location(doc.file, line),
        name=name,
        source_format="kvplan",
        engine=engine,
        model=model,
        gpu=gpu,
        gpu_source=source if gpu else "",
        num_gpus=num_gpus,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        flags=flags,
        unresolved=tuple(unresolved),
        notes=tuple(notes),
        replicas=replicas,
        gpus_per_pod=num_gpus // replicas,
        lines=tuple(sorted((KEYS[k][1], line_of(k)) for k in item if k in KEYS)),
        **fields,
    )
