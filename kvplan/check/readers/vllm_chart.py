"""Values of the vLLM project's own Helm chart (examples/online_serving/chart-helm).

The chart runs `image.command` as written (`["vllm", "serve", "/data/", "--dtype", ...]`) with `image.env`,
`resources` as the container's resources, `replicaCount` pods, and a node affinity on
`nvidia.com/gpu.product` In `gpuModels`. The weights are synced from S3 into `/data`, so the model is a local
path; when `--served-model-name` is a Hugging Face repo id (ORG/NAME) that names the model instead.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request, normalize_model
from kvplan.check.invocation import find_invocation, image_version
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import (
    affinity_gpu,
    engine_args,
    env_lines,
    gpu_count,
    item_lines,
    key_line,
    literal_env,
    mapping,
    scalar_word,
    sequence,
)

_PLACEHOLDER = "TYPE_GPU_USED"  # the chart's default gpuModels entry
_GPU_FIX = "set gpuModels to the nvidia.com/gpu.product of your nodes (e.g. NVIDIA-H100-80GB-HBM3), or pass --gpu"


def is_vllm_chart_values(data: Any) -> bool:
    image = data.get("image")
    command = mapping(image).get("command")
    return ("apiVersion" not in data and isinstance(command, list) and bool(command)
            and ("gpuModels" in data or "resources" in data))


def vllm_chart_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    image = mapping(values.get("image"))
    command = image.get("command")
    env_list = image.get("env")
    env = literal_env(env_list)
    repo = f"{image.get('repository', '')}:{image.get('tag', '')}"
    inv = find_invocation([scalar_word(w) for w in sequence(command)], [], repo, env, command_lines=item_lines(command))
    if inv is None:
        return []
    name = scalar_word(values.get("serviceName") or "vllm")
    site = Site(Location(doc.file, key_line(image, "command") or doc.line), name, "vllm-chart", doc.templates,
                gpu_fix=_GPU_FIX, model_fix="serve a Hugging Face repo id, or name it in --served-model-name ORG/NAME")
    lines: dict[str, int] = {}
    count, unresolved = gpu_count(values.get("resources"), doc.templates, site.render_fix, lines)
    models = [scalar_word(m) for m in sequence(values.get("gpuModels"))]
    gpu, source = None, ""
    missing = "no gpuModels in the values"
    if models == [_PLACEHOLDER]:
        missing = f"gpuModels still holds the chart's placeholder {_PLACEHOLDER}"
        unresolved.append(Unresolved("gpu", missing, _GPU_FIX, key_line(values, "gpuModels")))
    elif models:
        found, problem = affinity_gpu([{"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": models}]}])
        if found:
            gpu, source = found[0], "gpuModels (node affinity nvidia.com/gpu.product)"
            lines["gpu"] = key_line(values, "gpuModels") or doc.line
        elif problem:
            unresolved.append(Unresolved("gpu", problem, _GPU_FIX, key_line(values, "gpuModels")))
    replicas = values.get("replicaCount")
    if key_line(values, "replicaCount") is not None:
        lines["replicas"] = key_line(values, "replicaCount") or 0
    parsed = engine_args(inv, env, env_lines(env_list))
    notes = list(inv.notes)
    hint = None
    positional = parsed.positionals[0] if inv.positional_model and parsed.positionals else parsed.get("model")
    served = parsed.get("served-model-name") or ""
    if positional and normalize_model(positional)[0] is None and "/" in served and normalize_model(served)[0]:
        notes.append(f"model taken from --served-model-name {served} (the weights are read from {positional})")
        hint = (served, "--served-model-name")
    hardware = Hardware(gpu, source, count, tuple(unresolved), (), missing, gpus_per_pod=count,
                        replicas=replicas if isinstance(replicas, int) and replicas > 0 else 1,
                        lines=tuple(lines.items()))
    return [build_request(site, parsed, hardware, positional_model=inv.positional_model and hint is None,
                          model_hint=hint, notes=tuple(notes), engine_version=image_version(repo), env=env)]
