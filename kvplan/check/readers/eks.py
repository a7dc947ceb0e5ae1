"""AWS inference-charts values (ai-on-eks): `model`, `modelParameters`, `inference.modelServer`.

The chart starts `vllm serve MODEL` with each `modelParameters` key turned into a kebab-case flag
(`maxModelLen: 8192` -> `--max-model-len 8192`; `true` -> a bare flag, `false` -> nothing) and, when
`tensorParallelSize` is absent, `--tensor-parallel-size` set to the pod's GPU request. `framework: lws-vllm`
runs one engine over a LeaderWorkerSet of `pipelineParallelSize` pods, each with the same GPUs.
`instanceType` becomes the node selector `node.kubernetes.io/instance-type`.
"""

from __future__ import annotations

import re
from typing import Any

from kvplan.check.build import Hardware, Site, build_request, unsupported
from kvplan.check.flags import parse_args
from kvplan.check.invocation import image_version
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location
from kvplan.check.readers.k8s import dig, gpu_count, gpu_type, key_line, mapping, scalar_word

_VLLM_FRAMEWORKS = {"vllm", "aibrix", "lws-vllm", "ray-vllm", "triton-vllm"}
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])([A-Z])")
_GPU_FIX = "set inference.modelServer.deployment.instanceType (e.g. p5.48xlarge), or pass --gpu"


def is_eks_values(data: Any) -> bool:
    inference = data.get("inference")
    return ("apiVersion" not in data and isinstance(inference, dict)
            and ("modelServer" in inference or "framework" in inference)
            and ("model" in data or "modelParameters" in data))


def kebab(key: str) -> str:
    """Sprig's kebabcase as the chart applies it: 'maxNumBatchedTokens' -> 'max-num-batched-tokens'."""
    return _CAMEL_RE.sub(r"-\1", key).lower()


def eks_values_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    inference = mapping(values.get("inference"))
    framework = scalar_word(inference.get("framework") or "vllm")
    accelerator = scalar_word(inference.get("accelerator") or "gpu")
    server = mapping(inference.get("modelServer"))
    deployment = mapping(server.get("deployment"))
    name = scalar_word(inference.get("serviceName") or "inference")
    model = values.get("modelPath") or values.get("model")
    line = key_line(values, "modelParameters") or key_line(values, "model") or doc.line
    site = Site(Location(doc.file, line), name, "eks-inference-charts", doc.templates, gpu_fix=_GPU_FIX,
                model_fix="set model: ORG/NAME")
    if framework not in _VLLM_FRAMEWORKS:
        return [unsupported(site, framework, scalar_word(model) if model else None,
                            f"framework {framework} is not a vLLM deployment kvplan models",
                            "kvplan check evaluates the chart's vLLM frameworks")]
    if accelerator != "gpu":
        return [unsupported(site, f"vllm-{accelerator}", scalar_word(model) if model else None,
                            f"accelerator {accelerator} is not a GPU", "kvplan check evaluates GPU deployments")]
    params = mapping(values.get("modelParameters"))
    argv: list[str] = []
    argv_lines: list[int | None] = []
    for key, value in params.items():
        flag = f"--{kebab(str(key))}"
        if isinstance(value, bool):
            if value:
                argv.append(flag)
                argv_lines.append(key_line(params, key))
        elif value is not None:
            argv += [flag, scalar_word(value)]
            argv_lines += [key_line(params, key)] * 2
    lines: dict[str, int] = {}
    resources = mapping(dig(deployment, "resources", "gpu"))
    count, count_unresolved = gpu_count(resources, doc.templates, site.render_fix, lines)
    notes: list[str] = []
    if "tensorParallelSize" not in params and count is not None:
        argv += ["--tensor-parallel-size", str(count)]
        argv_lines += [lines.get("num_gpus")] * 2
        notes.append(f"--tensor-parallel-size {count}: the chart sets it to the GPU request")
    pods = None
    if framework == "lws-vllm":
        pods = int(params.get("pipelineParallelSize") or 1)
        notes.append(f"LeaderWorkerSet of {pods} pods (size = pipelineParallelSize)")
    if framework == "ray-vllm":
        notes.append("framework ray-vllm: the engine runs on Ray workers; read as one vLLM server")
    selector = dict(mapping(deployment.get("nodeSelector")))
    pod_spec: dict[str, Any] = {"nodeSelector": deployment.get("nodeSelector") or {}}
    if deployment.get("instanceType"):
        selector["node.kubernetes.io/instance-type"] = deployment["instanceType"]
        pod_spec = {"nodeSelector": selector}
        if key_line(deployment, "instanceType") is not None:
            lines["gpu"] = key_line(deployment, "instanceType") or 0
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(pod_spec, [], lines=lines)
    if "instanceType" in deployment and gpu is not None:
        source = "inference.modelServer.deployment.instanceType"
    replicas = deployment.get("replicas")
    if key_line(deployment, "replicas") is not None:
        lines["replicas"] = key_line(deployment, "replicas") or 0
    hardware = Hardware(gpu, source, None if count is None else count * (pods or 1),
                        tuple(count_unresolved + gpu_unresolved), tuple(gpu_notes),
                        missing or "no instanceType or GPU node selector in the values", gpus_per_pod=count,
                        pods_per_instance=pods, replicas=replicas if isinstance(replicas, int) and replicas > 0 else 1,
                        lines=tuple(lines.items()))
    image = mapping(server.get("image"))
    version = image_version(f"{image.get('repository', '')}:{image.get('tag', '')}")
    parsed = parse_args("vllm", argv, lines=argv_lines)
    return [build_request(site, parsed, hardware, model_hint=(scalar_word(model), "model") if model else None,
                          notes=tuple(notes), engine_version=version,
                          env={str(k): scalar_word(v) for k, v in mapping(server.get("env")).items()},
                          model_line=key_line(values, "model"))]
