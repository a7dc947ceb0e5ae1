"""Kubernetes workloads (Deployment, StatefulSet, Pod, Job, LeaderWorkerSet, ...) -> deployment requests.

The engine comes from each container's command/args/image, the GPU count from its `nvidia.com/gpu` (or
`amd.com/gpu`) limit, the GPU type from the pod's node selector or required node affinity on a GPU label, or
from the annotation `kvplan.io/gpu`, which wins because it is written for kvplan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.flag_tables import TGI
from kvplan.check.flags import ParsedArgs, parse_args
from kvplan.check.invocation import Invocation, expand_k8s, find_invocation, image_version
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.templates import find_template
from kvplan.units import MiB

GPU_ANNOTATION = "kvplan.io/gpu"
MODEL_ANNOTATION = "kvplan.io/model"
# Node labels that name the GPU, most specific first: GPU feature discovery's product, the DRA driver's model,
# GKE's accelerator, Karpenter's GPU name, then the instance type (or Karpenter's instance family) it implies.
GPU_LABELS = (
    "nvidia.com/gpu.product",
    "gpu.nvidia.com/model",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "amd.com/gpu.product-name",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "karpenter.k8s.aws/instance-family",
)
# Labels that state each GPU's memory in MiB (GPU feature discovery: nvidia-smi's total; Karpenter: EC2's figure).
GPU_MEMORY_LABELS = ("nvidia.com/gpu.memory", "karpenter.k8s.aws/instance-gpu-memory")
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
_POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job", "ReplicationController"}
WORKLOAD_KINDS = _POD_TEMPLATE_KINDS | {"Pod", "CronJob", "LeaderWorkerSet"}


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = mapping(value).get(key)
    return value


def scalar_word(value: Any) -> str:
    """A YAML scalar as the word a command line would carry: True -> "true", 8192 -> "8192"."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def line_of(container: Any, fallback: int) -> int:
    return getattr(container, "line", 0) or fallback


def key_line(block: Any, key: Any) -> int | None:
    """The line of `key` in a YAML mapping, when the loader recorded it."""
    line_of_key = getattr(block, "line_of", None)
    return line_of_key(key) if line_of_key is not None and key in block else None


def item_lines(items: Any) -> list[int | None]:
    """The line of each item of a YAML sequence, when the loader recorded them."""
    lines = getattr(items, "item_lines", None)
    return list(lines) if lines is not None else [None] * len(sequence(items))


def env_lines(env_list: Any) -> dict[str, int]:
    """The line of each literal env entry, so flags read from env (TGI) point at their entry."""
    found: dict[str, int] = {}
    for item in sequence(env_list):
        line = getattr(item, "line", None)
        if isinstance(mapping(item).get("name"), str) and line:
            found[mapping(item)["name"]] = line
    return found


def literal_env(env_list: Any) -> dict[str, str]:
    """Env entries with literal values (valueFrom secrets are unknown), $(VAR) expanded in order."""
    env: dict[str, str] = {}
    for item in sequence(env_list):
        item = mapping(item)
        name, value = item.get("name"), item.get("value")
        if isinstance(name, str) and value is not None and not isinstance(value, (Mapping, list)):
            env[name] = expand_k8s(_text(value), env)
    return env


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def engine_args(inv: Invocation, env: Mapping[str, str], env_line: Mapping[str, int] | None = None,
                **extras: frozenset[str]) -> ParsedArgs:
    """Parse an invocation; TGI also reads every flag from its upper-case env var (flags win)."""
    argv, lines = list(inv.argv), list(inv.argv_lines) + [None] * (len(inv.argv) - len(inv.argv_lines))
    if inv.engine == "tgi":
        names = [n for n in sorted(TGI.names) if n.upper().replace("-", "_") in env]
        argv = [f"--{n}={env[n.upper().replace('-', '_')]}" for n in names] + argv
        lines = [(env_line or {}).get(n.upper().replace("-", "_")) for n in names] + lines
    return parse_args(inv.engine, argv, lines=lines, **extras)


def gpu_count(resources: Any, templates: tuple[str, ...], render_fix: str,
              lines: dict[str, int] | None = None) -> tuple[int | None, list[Unresolved]]:
    """GPUs of one container from resources.limits (else requests); records the line in `lines["num_gpus"]`."""
    for section in ("limits", "requests"):
        block = mapping(mapping(resources).get(section))
        for key in GPU_RESOURCES:
            if key in block:
                line = key_line(block, key)
                if lines is not None and line is not None:
                    lines["num_gpus"] = line
                return _count(block[key], f"resources.{section} {key}", templates, render_fix, line)
    return None, [
        Unresolved("num_gpus", "the container requests no nvidia.com/gpu or amd.com/gpu",
                   "set resources.limits nvidia.com/gpu: N on the serving container")
    ]


def _count(value: Any, where: str, templates: tuple[str, ...], render_fix: str,
           line: int | None = None) -> tuple[int | None, list[Unresolved]]:
    template = find_template(value, templates)
    if template:
        return None, [Unresolved("num_gpus", f"{where} is templated: {template}", render_fix, line)]
    try:
        count = int(str(value).strip())
    except ValueError:
        return None, [Unresolved("num_gpus", f"{where} is {value!r}, not a whole number", f"set {where} to a number",
                                 line)]
    return count, []


def gpu_memory(selector: Any, lines: dict[str, int] | None = None) -> int | None:
    """Each GPU's memory in bytes when a node selector pins it by label (the labels' values are MiB)."""
    block = mapping(selector)
    for label in GPU_MEMORY_LABELS:
        value = str(block.get(label, "")).strip()
        if value.isdigit():
            if lines is not None and key_line(block, label) is not None:
                lines["gpu_memory_bytes"] = key_line(block, label) or 0
            return int(value) * MiB
    return None


def gpu_type(
    pod_spec: Any, annotation_maps: list[Any], *, selector_key: str = "nodeSelector",
    lines: dict[str, int] | None = None,
) -> tuple[str | None, str, list[Unresolved], list[str], str | None]:
    """(gpu, source, unresolved, notes, missing reason) from annotations, node selector and affinity.

    The line of what was used goes to `lines["gpu"]`.
    """
    notes: list[str] = []
    annotated_in = next((a for a in annotation_maps if GPU_ANNOTATION in mapping(a)), None)
    annotated = _text(mapping(annotated_in)[GPU_ANNOTATION]) if annotated_in is not None else None
    found: tuple[str, str] | None = None
    selector = mapping(mapping(pod_spec).get(selector_key))
    for label in GPU_LABELS:
        if label in selector:
            found = (_text(selector[label]), f"nodeSelector {label}")
            if lines is not None and key_line(selector, label) is not None:
                lines["gpu"] = key_line(selector, label) or 0
            break
    unresolved: list[Unresolved] = []
    if found is None:
        terms = dig(pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                    "nodeSelectorTerms")
        found, problem = affinity_gpu(terms)
        if problem and annotated is None:
            unresolved.append(Unresolved("gpu", problem,
                                         f"pin one type with annotation {GPU_ANNOTATION}: NAME, or pass --gpu"))
    if annotated is not None:
        if found and found[0] != annotated:
            notes.append(f"GPU {annotated} from annotation {GPU_ANNOTATION} (the {found[1]} says {found[0]})")
        if lines is not None and key_line(annotated_in, GPU_ANNOTATION) is not None:
            lines["gpu"] = key_line(annotated_in, GPU_ANNOTATION) or 0
        return annotated, f"annotation {GPU_ANNOTATION}", [], notes, None
    if found:
        return found[0], found[1], unresolved, notes, None
    missing = "no GPU type in the manifest (no node selector or affinity on a GPU label, no kvplan.io/gpu annotation)"
    return None, "", unresolved, notes, missing


def affinity_gpu(terms: Any) -> tuple[tuple[str, str] | None, str | None]:
    """The single GPU type required by nodeSelectorTerms, or a problem when several are allowed."""
    values: dict[str, str] = {}
    for term in sequence(terms):
        for expression in sequence(mapping(term).get("matchExpressions")):
            expression = mapping(expression)
            key = expression.get("key")
            if key in GPU_LABELS and expression.get("operator") == "In":
                for value in sequence(expression.get("values")):
                    values.setdefault(_text(value), f"node affinity {key}")
    if len(values) == 1:
        value, source = next(iter(values.items()))
        return (value, source), None
    if len(values) > 1:
        return None, f"the node affinity allows several GPU types ({', '.join(values)})"
    return None, None


def pod_requests(
    doc: Document,
    pod_spec: Any,
    *,
    workload: str,
    annotation_maps: list[Any],
    source_format: str = "k8s",
    extra_gpus: tuple[int, int] | None = None,
    replicas: int = 1,
    replicas_line: int | None = None,
    injected_env: dict[str, str] | None = None,
) -> list[DeploymentRequest]:
    """One request per container of a pod spec that runs an engine kvplan knows.

    `extra_gpus` = (pods, gpus per pod) added to the container's own count (LeaderWorkerSet workers).
    """
    requests: list[DeploymentRequest] = []
    type_lines: dict[str, int] = {}
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(pod_spec, annotation_maps, lines=type_lines)
    memory = gpu_memory(mapping(pod_spec).get("nodeSelector"), type_lines)
    model_override = next(
        (_text(mapping(a)[MODEL_ANNOTATION]) for a in annotation_maps if MODEL_ANNOTATION in mapping(a)), None
    )
    for container in sequence(mapping(pod_spec).get("containers")):
        container = mapping(container)
        env = (injected_env or {}) | literal_env(container.get("env"))
        command, args = container.get("command"), container.get("args")
        if isinstance(args, str):  # a values file may give args as one string; Kubernetes needs a list
            args = [args]
        inv = find_invocation(
            [_text(w) for w in sequence(command)],
            [_text(w) for w in sequence(args)],
            _text(container.get("image") or ""),
            env,
            command_lines=item_lines(command),
            args_lines=item_lines(args),
        )
        if inv is None:
            continue
        site = Site(Location(doc.file, line_of(container, doc.line)), f"{workload}/{container.get('name', '?')}",
                    source_format, doc.templates)
        lines = dict(type_lines)
        if replicas_line is not None:
            lines["replicas"] = replicas_line
        count, count_unresolved = gpu_count(container.get("resources"), doc.templates, site.render_fix, lines)
        per_pod = count
        notes = list(gpu_notes) + list(inv.notes)
        pods = None
        if extra_gpus is not None and count is not None:
            workers, worker_gpus = extra_gpus
            notes.append(f"{workers + 1} pods per group: {count} + {workers} x {worker_gpus} GPUs")
            count += workers * worker_gpus
            pods = workers + 1
        elif extra_gpus is not None:
            pods = extra_gpus[0] + 1
        hardware = Hardware(gpu, source, count, tuple(gpu_unresolved + count_unresolved), tuple(notes), missing,
                            gpus_per_pod=per_pod, pods_per_instance=pods, replicas=replicas,
                            gpu_memory_bytes=memory, lines=tuple(lines.items()))
        parsed = engine_args(inv, env, env_lines(container.get("env")))
        hint = None
        if inv.engine == "tgi" and "MODEL_ID" in env:
            hint = (env["MODEL_ID"], "env MODEL_ID")
        requests.append(
            build_request(site, parsed, hardware, positional_model=inv.positional_model, model_hint=hint,
                          model_override=model_override, engine_version=image_version(_text(container.get("image"))),
                          env=env, model_line=env_lines(container.get("env")).get("MODEL_ID") if hint else None,
                          pip=inv.pip)
        )
    return requests


def replica_count(spec: Any) -> tuple[int, int | None]:
    """A workload's `replicas` (1 when absent or not a number) and its line."""
    value = mapping(spec).get("replicas")
    count = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    return count, key_line(spec, "replicas")


def workload_requests(doc: Document, obj: Mapping[str, Any]) -> list[DeploymentRequest]:
    """Requests of one Kubernetes workload object."""
    kind = obj.get("kind")
    name = _text(dig(obj, "metadata", "name") or kind)
    annotations = [dig(obj, "metadata", "annotations")]
    if kind == "Pod":
        return pod_requests(doc, obj.get("spec"), workload=name, annotation_maps=annotations)
    if kind == "CronJob":
        template = dig(obj, "spec", "jobTemplate", "spec", "template")
    elif kind == "LeaderWorkerSet":
        return _lws_requests(doc, obj, name, annotations)
    else:
        template = dig(obj, "spec", "template")
    annotations.insert(0, dig(template, "metadata", "annotations"))
    scaled = kind in ("Deployment", "StatefulSet", "ReplicaSet")
    replicas, line = replica_count(obj.get("spec")) if scaled else (1, None)
    requests = pod_requests(doc, dig(template, "spec"), workload=name, annotation_maps=annotations,
                            replicas=replicas, replicas_line=line)
    if kind == "StatefulSet":
        # With --nnodes N, N pods of the set form one engine: its replicas are groups of N pods.
        requests = [_grouped(r, replicas) if r.pods_per_instance > 1 else r for r in requests]
    return requests


def _grouped(request: DeploymentRequest, pods: int) -> DeploymentRequest:
    instances, rest = divmod(pods, request.pods_per_instance)
    notes = request.notes
    if rest or not instances:
        notes += (f"{pods} pods do not form whole groups of --nnodes {request.pods_per_instance}",)
    return replace(request, replicas=max(1, instances), notes=notes)


def _lws_requests(doc: Document, obj: Mapping[str, Any], name: str, annotations: list[Any]) -> list[DeploymentRequest]:
    """A LeaderWorkerSet group is one engine spread over `size` pods: leader flags, GPUs of all pods."""
    lwt = mapping(dig(obj, "spec", "leaderWorkerTemplate"))
    size_raw = lwt.get("size", 1)
    try:
        size = int(size_raw)
    except (TypeError, ValueError):
        size = 1
    worker = mapping(lwt.get("workerTemplate"))
    leader = mapping(lwt.get("leaderTemplate")) or worker
    worker_gpus = 0
    for container in sequence(dig(worker, "spec", "containers")):
        count, _ = gpu_count(mapping(container).get("resources"), doc.templates, "")
        worker_gpus += count or 0
    leader_annotations = [dig(leader, "metadata", "annotations"), *annotations]
    replicas, line = replica_count(obj.get("spec"))
    # The LWS controller sets these in every pod of a group (the leader is worker 0).
    injected = {"LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": "0"}
    return pod_requests(doc, leader.get("spec"), workload=name, annotation_maps=leader_annotations,
                        source_format="lws", extra_gpus=(size - 1, worker_gpus) if size > 1 else None,
                        replicas=replicas, replicas_line=line, injected_env=injected)
