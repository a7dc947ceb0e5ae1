"""NVIDIA Dynamo DynamoGraphDeployment: each worker service of the graph is a deployment.

A service runs `extraPodSpec.mainContainer` (`python3 -m dynamo.vllm ...` or `dynamo.sglang`, whose flags are
the engine's own, often inside `sh -c`), with `resources.limits.gpu` GPUs per pod, `multinode.nodeCount`
pods per engine and `replicas` engines. The frontend and planner services run no engine and are skipped;
a prefill worker (`--is-prefill-worker`) and a decode worker are separate deployments.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request, unsupported
from kvplan.check.invocation import find_invocation
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import (
    MODEL_ANNOTATION,
    dig,
    engine_args,
    env_lines,
    gpu_type,
    item_lines,
    key_line,
    line_of,
    literal_env,
    mapping,
    scalar_word,
    sequence,
)
from kvplan.check.templates import find_template

_GPU_FIX = "add annotation kvplan.io/gpu: H100-80GB to the service (or a GPU nodeSelector), or pass --gpu"


def is_dynamo_graph(data: Any) -> bool:
    return data.get("kind") == "DynamoGraphDeployment" and "apiVersion" in data


def graph_requests(doc: Document, obj: Any) -> list[DeploymentRequest]:
    graph = scalar_word(dig(obj, "metadata", "name") or "graph")
    services = mapping(dig(obj, "spec", "services"))
    requests = []
    for service_name, service in services.items():
        found = _service(doc, obj, graph, str(service_name), mapping(service), services)
        if found is not None:
            requests.append(found)
    return requests


def _service(doc: Document, obj: Any, graph: str, name: str, service: Any, services: Any) -> DeploymentRequest | None:
    main = mapping(dig(service, "extraPodSpec", "mainContainer"))
    command, args = main.get("command"), main.get("args")
    env = literal_env(service.get("envs")) | literal_env(main.get("env"))
    inv = find_invocation([scalar_word(w) for w in sequence(command)], [scalar_word(w) for w in sequence(args)],
                          scalar_word(main.get("image", "")), env, command_lines=item_lines(command),
                          args_lines=item_lines(args))
    line = getattr(services, "line_of", lambda key: doc.line)(name)
    site = Site(Location(doc.file, line_of(main, line)), f"{graph}/{name}", "dynamo", doc.templates,
                gpu_fix=_GPU_FIX)
    if inv is None:
        words = " ".join(scalar_word(w) for w in sequence(command) + sequence(args))
        if "dynamo.trtllm" in words:
            return unsupported(site, "trtllm", None, "the worker runs TensorRT-LLM (dynamo.trtllm)",
                               "kvplan check evaluates the vLLM and SGLang workers")
        return None  # the frontend, the planner: no engine
    lines: dict[str, int] = {}
    unresolved: list[Unresolved] = []
    per_pod = None
    for section in ("limits", "requests"):
        block = mapping(dig(service, "resources", section))
        if "gpu" in block:
            raw = block["gpu"]
            lines["num_gpus"] = key_line(block, "gpu") or line
            template = find_template(raw, doc.templates)
            if template or not scalar_word(raw).strip().isdigit():
                unresolved.append(Unresolved("num_gpus", f"resources.{section}.gpu is {scalar_word(raw)!r}",
                                             "set resources.limits.gpu to a number", lines["num_gpus"]))
            else:
                per_pod = int(scalar_word(raw))
            break
    else:
        unresolved.append(Unresolved("num_gpus", "the service sets no resources.limits.gpu",
                                     "set resources.limits.gpu: N on the worker service"))
    nodes = dig(service, "multinode", "nodeCount")
    pods = nodes if isinstance(nodes, int) and nodes > 0 else None
    annotations = [service.get("annotations"), dig(obj, "metadata", "annotations")]
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(mapping(service.get("extraPodSpec")), annotations,
                                                               lines=lines)
    replicas = service.get("replicas")
    if key_line(service, "replicas") is not None:
        lines["replicas"] = key_line(service, "replicas") or 0
    notes = list(gpu_notes) + list(inv.notes)
    if pods:
        notes.append(f"multinode.nodeCount {pods}: {pods} pods per engine")
    hardware = Hardware(gpu, source, None if per_pod is None else per_pod * (pods or 1),
                        tuple(unresolved + gpu_unresolved), tuple(notes), missing, gpus_per_pod=per_pod,
                        pods_per_instance=pods, replicas=replicas if isinstance(replicas, int) and replicas > 0 else 1,
                        lines=tuple(lines.items()))
    override = next(
        (scalar_word(mapping(a)[MODEL_ANNOTATION]) for a in annotations if MODEL_ANNOTATION in mapping(a)), None
    )
    return build_request(site, engine_args(inv, env, env_lines(service.get("envs"))), hardware,
                         positional_model=inv.positional_model, model_override=override,
                         engine_version=None, env=env)  # the image tag is Dynamo's version, not the engine's
