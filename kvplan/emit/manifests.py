"""Deployment files for a planned option: a Kubernetes Deployment, a compose service, a vLLM --config file, and
vLLM production-stack Helm values, each written so that `kvplan check` reads back the same deployment.

Every file runs the option's own launch line (kvplan.emit.commands) on one instance's GPUs and repeats it for
the replicas; the GPU type goes where each format's readers find it: a node selector label in Kubernetes and
Helm, a kvplan.io/gpu label in compose (compose cannot name a GPU type), a header comment for the vLLM config
(which names no hardware: check it with --gpu).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from kvplan.emit.commands import Launch
from kvplan.errors import InputError, KvplanError
from kvplan.hardware.gpus import GpuSpec, find_gpu
from kvplan.planner.verdict import Verdict

GPU_ANNOTATION = "kvplan.io/gpu"
# Node labels GPU feature discovery sets, per vendor, and the device resource each vendor's plugin offers.
_PRODUCT_LABELS = {"nvidia": "nvidia.com/gpu.product", "amd": "amd.com/gpu.product-name"}
_RESOURCES = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
PORT = 8000


class _Dumper(yaml.SafeDumper):
    """Lists of a mapping indented under their key, as Kubernetes examples write them."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)


def _yaml(data: Any, header: list[str]) -> str:
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=100)
    return "".join(f"# {line}\n" for line in header) + body


def gpu_label(gpu: GpuSpec) -> tuple[str, str] | None:
    """The node label (key, value) that selects this GPU type, when the value reads back as this very card.

    GPU feature discovery labels an H100 SXM node nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3: the device
    name with dashes for spaces.
    """
    key = _PRODUCT_LABELS.get(gpu.vendor)
    if key is None or not gpu.device_names:
        return None
    value = gpu.device_names[0].replace(" ", "-")
    try:
        same = find_gpu(value).key == gpu.key
    except KvplanError:
        same = False
    return (key, value) if same else None


def _slug(model: str) -> str:
    """A Kubernetes name from the model: 'Qwen/Qwen2.5-72B-Instruct' -> 'qwen2-5-72b-instruct'."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:50].strip("-") or "llm"


def header(v: Verdict, model: str, option: int) -> list[str]:
    d = v.deployment
    servers = "1 server" if d.instances == 1 else f"{d.instances} servers"
    return [
        f"kvplan plan option {option}: {model} on {v.total_gpus} x {d.gpu.key} ({servers} of "
        f"{v.gpus_per_instance} GPU{'s' if v.gpus_per_instance > 1 else ''})",
        f"{d.workload.concurrency:,} requests of {d.max_model_len:,} tokens fit: up to {v.max_requests:,} at once",
    ]


def _vendor(v: Verdict) -> str:
    return v.deployment.gpu.vendor if v.deployment.gpu.vendor in _RESOURCES else "nvidia"


def kubernetes(v: Verdict, launch: Launch, model: str, option: int) -> str:
    """A Deployment of `instances` pods, each with one instance's GPUs, on nodes of the planned GPU type."""
    d, name = v.deployment, _slug(model)
    label = gpu_label(d.gpu)
    pod: dict[str, Any] = {}
    template_meta: dict[str, Any] = {"labels": {"app": name}}
    if label is not None:
        pod["nodeSelector"] = {label[0]: label[1]}
    else:
        template_meta["annotations"] = {GPU_ANNOTATION: d.gpu.key}
    pod["containers"] = [{
        "name": d.engine.engine,
        "image": launch.image,
        "command": list(launch.program),
        "args": list(launch.args),
        "ports": [{"containerPort": PORT}],
        "resources": {"limits": {_RESOURCES[_vendor(v)]: v.gpus_per_instance}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }]
    # Tensor-parallel workers share tensors through /dev/shm; a container's default 64 MiB is too small.
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    doc = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": d.instances,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": template_meta, "spec": pod},
        },
    }
    return _yaml(doc, header(v, model, option))


def compose(v: Verdict, launch: Launch, model: str, option: int) -> str:
    """A compose service reserving one instance's GPUs; compose names no GPU type, so a kvplan.io/gpu label does."""
    d = v.deployment
    if _vendor(v) != "nvidia":
        raise InputError("--emit compose reserves NVIDIA GPUs (driver: nvidia); for an AMD option use --emit k8s")
    service: dict[str, Any] = {
        "image": launch.image,
        "entrypoint": list(launch.program),
        "command": list(launch.args),
        "ipc": "host",
        "labels": {GPU_ANNOTATION: d.gpu.key},
        "deploy": {
            "replicas": d.instances,
            "resources": {"reservations": {"devices": [
                {"driver": "nvidia", "count": v.gpus_per_instance, "capabilities": ["gpu"]},
            ]}},
        },
    }
    if d.instances == 1:
        service["ports"] = [f"{PORT}:{PORT}"]  # replicas would collide on one host port
    return _yaml({"services": {_slug(model): service}}, header(v, model, option))


def _flag_pairs(args: tuple[str, ...]) -> dict[str, Any]:
    """`--tensor-parallel-size 2 --enable-expert-parallel` -> {tensor-parallel-size: 2, enable-expert-parallel:
    true}; `--no-enable-prefix-caching` -> {enable-prefix-caching: false}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--"):
            raise InputError(f"cannot write {word!r} as a config key")
        key = word[2:]
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            out[key] = int(value) if value.isdigit() else value
            i += 2
        elif key.startswith("no-"):
            out[key[3:]] = False
            i += 1
        else:
            out[key] = True
            i += 1
    return out


def _vllm_only(v: Verdict, fmt: str) -> None:
    if v.deployment.engine.engine != "vllm":
        raise InputError(f"--emit {fmt} is a vLLM format; this option runs {v.deployment.engine.engine}: use "
                         "--emit k8s or --emit compose")


def vllm_config(v: Verdict, launch: Launch, model: str, option: int) -> str:
    """A `vllm serve --config` file: the flags as keys. It names no hardware; the header says which."""
    _vllm_only(v, "vllm-config")
    d = v.deployment
    lines = header(v, model, option) + [
        f"run it on {d.instances} server(s) of {v.gpus_per_instance} {d.gpu.key}: vllm serve --config THIS_FILE",
        f"check it with: kvplan check THIS_FILE --gpu {d.gpu.key}",
    ]
    return _yaml({"model": model, **_flag_pairs(launch.args[1:])}, lines)


def helm_values(v: Verdict, launch: Launch, model: str, option: int) -> str:
    """vLLM production-stack values: one modelSpec; the chart's own keys where it has them, extraArgs for the rest."""
    _vllm_only(v, "helm-values")
    d, p = v.deployment, v.deployment.parallelism
    flags = _flag_pairs(launch.args[1:])
    config: dict[str, Any] = {"maxModelLen": flags.pop("max-model-len")}
    if "tensor-parallel-size" in flags:
        config["tensorParallelSize"] = flags.pop("tensor-parallel-size")
    # The chart renders --no-enable-prefix-caching unless this is true; kvplan plans with vLLM's default (on).
    config["enablePrefixCaching"] = flags.pop("enable-prefix-caching", True)
    extra: list[str] = []
    for key, value in flags.items():
        extra += [f"--{key}"] if value is True else [f"--{key}", str(value)]
    if extra:
        config["extraArgs"] = extra
    spec: dict[str, Any] = {
        "name": _slug(model),
        "repository": launch.image.split(":")[0],
        "tag": launch.image.split(":")[1],
        "modelURL": model,
        "replicaCount": d.instances,
        "requestGPU": v.gpus_per_instance,
    }
    label = gpu_label(d.gpu)
    if label is not None:
        spec["nodeSelectorTerms"] = [{"matchExpressions": [{"key": label[0], "operator": "In",
                                                            "values": [label[1]]}]}]
    else:
        spec["podAnnotations"] = {GPU_ANNOTATION: d.gpu.key}
    spec["vllmConfig"] = config
    lines = header(v, model, option) + [
        "set requestCPU and requestMemory for your nodes; kvplan sizes GPU memory only",
    ]
    if p.pp > 1 or p.dp > 1:
        lines.append("the chart has no pipeline/data-parallel keys: they go in vllmConfig.extraArgs")
    return _yaml({"servingEngineSpec": {"modelSpec": [spec]}}, lines)


# --emit formats, by name.
EMITTERS: dict[str, Callable[[Verdict, Launch, str, int], str]] = {
    "k8s": kubernetes,
    "compose": compose,
    "vllm-config": vllm_config,
    "helm-values": helm_values,
}
