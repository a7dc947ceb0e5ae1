"""Ray Serve LLM configs (`llm_configs` with `engine_kwargs`, `accelerator_type`) and KubeRay RayService.

Each LLM config is one vLLM deployment: `engine_kwargs` are vLLM's engine arguments (written with
underscores, like a vLLM --config file), the model is `model_loading_config.model_source` (else its
`model_id`), and Ray places one GPU bundle per rank, so a replica holds tp x pp (x dp) GPUs of type
`accelerator_type`. Replicas are `deployment_config.num_replicas`, or the autoscaler's `min_replicas`.
A RayService carries the same config as a YAML string (`serveConfigV2`); its worker groups say how many
GPUs each Ray worker pod has, and so how many pods one replica spans, and their node selectors the GPU type.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.flags import parse_args
from kvplan.check.invocation import pip_vllm
from kvplan.check.loader import Document, load_documents
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import dig, gpu_count, gpu_type, key_line, line_of, mapping, scalar_word, sequence
from kvplan.errors import DeploymentError

_GPU_FIX = "set accelerator_type in the LLM config (e.g. L40S), or pass --gpu"
# Ray's accelerator_type "A100" covers both memory sizes; kvplan's catalog reads it as the 40GB card.
_AMBIGUOUS = {"A100": "A100-40GB"}


def is_ray_serve_config(data: Any) -> bool:
    if "apiVersion" in data:
        return False
    apps = [mapping(a) for a in sequence(data.get("applications"))]
    return (any("llm_configs" in mapping(a.get("args")) for a in apps) or "llm_configs" in data
            or ("model_loading_config" in data and "engine_kwargs" in data))


def is_ray_service(data: Any) -> bool:
    return data.get("kind") == "RayService" and "apiVersion" in data


def _configs(data: Any) -> list[tuple[Any, str]]:
    """(LLM config, application name) for every config of a Serve config file or a single LLMConfig."""
    if "model_loading_config" in data:
        return [(data, "llm")]
    found: list[tuple[Any, str]] = [(c, "llm") for c in sequence(data.get("llm_configs"))]
    for app in sequence(data.get("applications")):
        app = mapping(app)
        configs = sequence(mapping(app.get("args")).get("llm_configs"))
        found += [(c, scalar_word(app.get("name", "app"))) for c in configs]
    return found


def ray_serve_requests(doc: Document, data: Any, workers: Hardware | None = None) -> list[DeploymentRequest]:
    requests = []
    for config, app in _configs(data):
        requests.append(_llm_config(doc, config, app, workers))
    return requests


def _llm_config(doc: Document, config: Any, app: str, workers: Hardware | None) -> DeploymentRequest:
    line = line_of(config, doc.line)
    if isinstance(config, str):
        site = Site(Location(doc.file, line), f"{app}/{config}", "ray-serve", doc.templates)
        return build_request(site, parse_args("vllm", []), Hardware(),
                             unresolved=(Unresolved("flags", f"the LLM config is the file {config}",
                                                    f"check {config} itself", line),))
    config = mapping(config)
    loading = mapping(config.get("model_loading_config"))
    model_id = scalar_word(loading.get("model_id", "model"))
    site = Site(Location(doc.file, line), f"{app}/{model_id}", "ray-serve", doc.templates, gpu_fix=_GPU_FIX,
                model_fix="set model_loading_config.model_source to the Hugging Face repo id")
    kwargs = mapping(config.get("engine_kwargs"))
    argv: list[str] = []
    argv_lines: list[int | None] = []
    for key, value in kwargs.items():
        flag = f"--{str(key).replace('_', '-')}"
        words = ([flag] if value else [f"--no-{flag[2:]}"]) if isinstance(value, bool) else (
            [flag, json.dumps(value) if isinstance(value, (dict, list)) else scalar_word(value)])
        argv += words
        argv_lines += [key_line(kwargs, key)] * len(words)
    parsed = parse_args("vllm", argv, lines=argv_lines)
    source = loading.get("model_source") or loading.get("model_id")
    lines: dict[str, int] = {}
    accelerator = config.get("accelerator_type")
    notes: list[str] = []
    gpu, gpu_source = None, ""
    if accelerator is not None:
        gpu, gpu_source = scalar_word(accelerator), "accelerator_type"
        lines["gpu"] = key_line(config, "accelerator_type") or line
        if gpu in _AMBIGUOUS:
            notes.append(f"accelerator_type {gpu} is 40GB or 80GB; read as {_AMBIGUOUS[gpu]}, the smaller")
            gpu = _AMBIGUOUS[gpu]
    elif workers is not None and workers.gpu is not None:
        gpu, gpu_source = workers.gpu, f"worker group {workers.gpu_source}"
    deployment = mapping(config.get("deployment_config"))
    autoscaling = mapping(deployment.get("autoscaling_config"))
    replicas = deployment.get("num_replicas") or autoscaling.get("min_replicas") or 1
    if autoscaling.get("max_replicas"):
        notes.append(f"autoscales from {replicas} to {autoscaling['max_replicas']} replicas; each evaluated alone")
    ranks = 1
    for flag in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        value = parsed.get(flag) or "1"
        ranks *= int(value) if value.isdigit() else 1
    pods = None
    if workers is not None and workers.gpus_per_pod:
        pods = math.ceil(ranks / workers.gpus_per_pod)
        notes.append(f"Ray places {ranks} GPUs per replica on worker pods of {workers.gpus_per_pod}: {pods} pods")
    else:
        notes.append(f"Ray places one GPU per rank: {ranks} GPUs per replica")
    hardware = Hardware(gpu, gpu_source, ranks, (), tuple(notes),
                        "no accelerator_type in the LLM config", gpus_per_pod=min(ranks, workers.gpus_per_pod)
                        if workers is not None and workers.gpus_per_pod else ranks,
                        pods_per_instance=pods, replicas=replicas if isinstance(replicas, int) else 1,
                        lines=tuple(lines.items()))
    env = {str(k): scalar_word(v) for k, v in mapping(dig(config, "runtime_env", "env_vars")).items()}
    hint = (scalar_word(source), "model_loading_config") if source else None
    # runtime_env.pip (a list, or {packages: [...]}) installs packages for the replica: a vllm requirement there
    # is the wheel, at its pin.
    spec = dig(config, "runtime_env", "pip")
    packages = sequence(spec) or sequence(mapping(spec).get("packages"))
    pip = pip_vllm("pip install " + " ".join(scalar_word(p) for p in packages)) if packages else None
    return build_request(site, parsed, hardware, model_hint=hint, pip=pip,
                         env=env, model_line=key_line(loading, "model_source") or key_line(loading, "model_id"))


def ray_service_requests(doc: Document, obj: Any) -> list[DeploymentRequest]:
    spec = mapping(obj.get("spec"))
    text = spec.get("serveConfigV2")
    name = scalar_word(dig(obj, "metadata", "name") or "rayservice")
    if not isinstance(text, str):
        return []
    workers = _worker_hardware(doc, spec)
    base = key_line(spec, "serveConfigV2") or doc.line
    try:
        inner = load_documents(doc.file, text)
    except DeploymentError as exc:
        site = Site(Location(doc.file, base), name, "rayservice", doc.templates)
        return [build_request(site, parse_args("vllm", []), Hardware(),
                              unresolved=(Unresolved("flags", f"serveConfigV2 is not valid YAML ({exc.message})",
                                                     "fix serveConfigV2", base),))]
    requests = []
    for document in inner:
        if isinstance(document.data, dict) and is_ray_serve_config(document.data):
            for request in ray_serve_requests(document, document.data, workers):
                # serveConfigV2 is a block scalar: its first line is the line after the key.
                shift = base
                requests.append(replace(
                    request, source_format="rayservice", name=f"{name}/{request.name}",
                    location=Location(doc.file, request.location.line + shift),
                    lines=tuple((k, v + shift) for k, v in request.lines),
                    unresolved=tuple(replace(u, line=u.line + shift if u.line else None) for u in request.unresolved),
                ))
    return requests


def _worker_hardware(doc: Document, spec: Any) -> Hardware | None:
    """The GPU worker group of a RayService: GPUs per pod and the GPU type its pods select."""
    for group in sequence(dig(spec, "rayClusterConfig", "workerGroupSpecs")):
        pod = mapping(dig(group, "template", "spec"))
        for container in sequence(pod.get("containers")):
            count, _ = gpu_count(mapping(container).get("resources"), doc.templates, "")
            if count:
                gpu, source, _, _, _ = gpu_type(pod, [dig(group, "template", "metadata", "annotations")])
                return Hardware(gpu, source, count, gpus_per_pod=count)
    return None
