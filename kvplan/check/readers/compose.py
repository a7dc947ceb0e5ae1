"""docker-compose services that run vLLM, SGLang or TGI.

`command` / `entrypoint` may be strings (split as a shell would, without running one) or lists;
`${VAR:-default}` interpolation uses the default, an unset `${VAR}` leaves the field unresolved.
GPUs come from `deploy.resources.reservations.devices` (count or device_ids); compose names no GPU type,
so it comes from the label `kvplan.io/gpu` or `--gpu`.
"""

from __future__ import annotations

import shlex
from dataclasses import replace
from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.invocation import expand_shell, find_invocation, image_version
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import GPU_ANNOTATION, MODEL_ANNOTATION, dig, engine_args, mapping, scalar_word, sequence

_GPU_FIX = "add label kvplan.io/gpu: H100-80GB to the service, or pass --gpu"


def _env(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): scalar_word(v) for k, v in value.items() if v is not None}
    env: dict[str, str] = {}
    for item in sequence(value):
        key, sep, val = scalar_word(item).partition("=")
        if sep:
            env[key] = val
    return env


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError:
            return value.split()
    return [scalar_word(w) for w in sequence(value)]


def is_compose(data: Any) -> bool:
    services = mapping(data).get("services") if isinstance(data, dict) else None
    return isinstance(services, dict) and any(
        isinstance(s, dict) and ("image" in s or "build" in s) for s in services.values()
    )


def compose_requests(doc: Document, data: Any) -> list[DeploymentRequest]:
    services = mapping(data.get("services"))
    line_of = getattr(services, "line_of", lambda key: doc.line)
    requests = []
    devices: dict[str, tuple[str, ...]] = {}
    for name, service in services.items():
        service = mapping(service)
        env = _env(service.get("environment"))
        image = expand_shell(scalar_word(service.get("image", "")), {})
        command = [expand_shell(w, {}) for w in _words(service.get("command"))]
        entrypoint = [expand_shell(w, {}) for w in _words(service.get("entrypoint"))]
        inv = find_invocation(entrypoint, command, image, env)
        if inv is None:
            continue
        site = Site(Location(doc.file, line_of(name)), str(name), "compose", doc.templates, gpu_fix=_GPU_FIX,
                    model_fix="add label kvplan.io/model: ORG/NAME to the service")
        labels = _env(service.get("labels"))
        count, unresolved = _gpus(service)
        gpu = labels.get(GPU_ANNOTATION)
        replicas = dig(service, "deploy", "replicas")
        hardware = Hardware(gpu, f"label {GPU_ANNOTATION}" if gpu else "", count, tuple(unresolved),
                            missing_gpu="compose files name no GPU type (no kvplan.io/gpu label)",
                            replicas=replicas if isinstance(replicas, int) and replicas > 0 else 1)
        hint = (env["MODEL_ID"], "environment MODEL_ID") if inv.engine == "tgi" and "MODEL_ID" in env else None
        requests.append(build_request(site, engine_args(inv, env), hardware, positional_model=inv.positional_model,
                                      model_hint=hint, model_override=labels.get(MODEL_ANNOTATION),
                                      engine_version=image_version(image), pip=inv.pip))
        devices[str(name)] = _device_ids(service)
    return _share_gpus(requests, devices)


def _device_ids(service: Any) -> tuple[str, ...]:
    """The GPUs a service pins by id (deploy.resources.reservations.devices[].device_ids); () when by count."""
    for device in sequence(dig(service, "deploy", "resources", "reservations", "devices")):
        ids = sequence(mapping(device).get("device_ids"))
        if ids:
            return tuple(scalar_word(i) for i in ids)
    return ()


def _share_gpus(requests: list[DeploymentRequest], devices: dict[str, tuple[str, ...]]) -> list[DeploymentRequest]:
    """Servers pinned to the same GPU id each see the others' memory in use: the memory fraction each other states
    (--gpu-memory-utilization, --mem-fraction-static, --cuda-memory-fraction) of the GPU they share, summed per
    GPU, the fullest of a server's GPUs taken for all of them. Evaluated as the last to start, with every other
    already holding its share (its budget: it returns its profiling peak and adds CUDA graphs, a few hundred MiB
    either way). A neighbour that states no fraction is named, not guessed."""
    out = []
    for req in requests:
        mine = devices.get(req.name, ())
        per_gpu = dict.fromkeys(mine, 0.0)
        names: list[str] = []
        unstated: list[str] = []
        for other in requests:
            both = [d for d in mine if d in devices.get(other.name, ())]
            if other is req or not both:
                continue
            if other.gpu_memory_utilization is None:
                unstated.append(other.name)
                continue
            for d in both:
                per_gpu[d] += other.gpu_memory_utilization
            names.append(f"{other.name} ({other.gpu_memory_utilization:g} of GPU {', '.join(both)})")
        if not names and not unstated:
            out.append(req)
            continue
        shared = max(per_gpu.values())
        notes = list(req.notes)
        if names:
            notes.append(f"shares its GPUs with {', '.join(names)}: planned as started last, with {shared:g} of "
                         "a GPU in use")
        if unstated:
            notes.append(f"shares its GPUs with {', '.join(unstated)}, whose memory fraction is not stated: its "
                         "memory is not counted")
        out.append(replace(req, shared_gpu_fraction=shared, shared_with=tuple(names), notes=tuple(notes)))
    return out


def _gpus(service: Any) -> tuple[int | None, list[Unresolved]]:
    for device in sequence(dig(service, "deploy", "resources", "reservations", "devices")):
        device = mapping(device)
        capabilities = [scalar_word(c) for c in sequence(device.get("capabilities"))]
        if "gpu" not in capabilities and scalar_word(device.get("driver", "")) != "nvidia":
            continue
        if "device_ids" in device:
            return len(sequence(device.get("device_ids"))), []
        count = device.get("count")
        if isinstance(count, int):
            return count, []
        if scalar_word(count).isdigit():
            return int(scalar_word(count)), []
        return None, [Unresolved("num_gpus", f"GPU count is {count!r} (all GPUs of the host: unknown here)",
                                 "set count: N in deploy.resources.reservations.devices")]
    if service.get("gpus") is not None:
        gpus = scalar_word(service.get("gpus"))
        if gpus.isdigit():
            return int(gpus), []
        return None, [Unresolved("num_gpus", f"gpus: {gpus} (all GPUs of the host: unknown here)", "set a count")]
    return None, [Unresolved("num_gpus", "the service reserves no GPU device",
                             "add deploy.resources.reservations.devices with capabilities [gpu] and count: N")]
