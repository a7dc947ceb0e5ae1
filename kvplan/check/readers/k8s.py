"""Kubernetes workloads (Deployment, StatefulSet, Pod, Job, LeaderWorkerSet, ...) -> deployment requests.

The engine comes from each container's command/args/image, the GPU count from its `nvidia.com/gpu` (or
`amd.com/gpu`) limit, the GPU type from the pod's node selector or required node affinity on a GPU label, or
from the annotation `kvplan.io/gpu`, which wins because it is written for kvplan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.flag_tables import TGI
from kvplan.check.flags import ParsedArgs, parse_args
from kvplan.check.invocation import Invocation, expand_k8s, find_invocation
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.templates import find_template

GPU_ANNOTATION = "kvplan.io/gpu"
MODEL_ANNOTATION = "kvplan.io/model"
GPU_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "amd.com/gpu.product-name",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
)
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


def line_of(container: Any, fallback: int) -> int:
    return getattr(container, "line", 0) or fallback


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


def engine_args(inv: Invocation, env: Mapping[str, str], **extras: frozenset[str]) -> ParsedArgs:
    """Parse an invocation; TGI also reads every flag from its upper-case env var (flags win)."""
    argv = list(inv.argv)
    if inv.engine == "tgi":
        from_env = [f"--{n}={env[n.upper().replace('-', '_')]}" for n in sorted(TGI.names) if n.upper().replace("-", "_") in env]
        argv = from_env + argv
    return parse_args(inv.engine, argv, **extras)


def gpu_count(resources: Any, templates: tuple[str, ...], render_fix: str) -> tuple[int | None, list[Unresolved]]:
    """GPUs of one container from resources.limits (else requests)."""
    for section in ("limits", "requests"):
        block = mapping(mapping(resources).get(section))
        for key in GPU_RESOURCES:
            if key in block:
                return _count(block[key], f"resources.{section} {key}", templates, render_fix)
    return None, [
        Unresolved("num_gpus", "the container requests no nvidia.com/gpu or amd.com/gpu",
                   "set resources.limits nvidia.com/gpu: N on the serving container")
    ]


def _count(value: Any, where: str, templates: tuple[str, ...], render_fix: str) -> tuple[int | None, list[Unresolved]]:
    template = find_template(value, templates)
    if template:
        return None, [Unresolved("num_gpus", f"{where} is templated: {template}", render_fix)]
    try:
        count = int(str(value).strip())
    except ValueError:
        return None, [Unresolved("num_gpus", f"{where} is {value!r}, not a whole number", f"set {where} to a number")]
    return count, []


def gpu_type(
    pod_spec: Any, annotation_maps: list[Any], *, selector_key: str = "nodeSelector"
) -> tuple[str | None, str, list[Unresolved], list[str], str | None]:
    """(gpu, source, unresolved, notes, missing reason) from annotations, node selector and affinity."""
    notes: list[str] = []
    annotated = next((_text(mapping(a)[GPU_ANNOTATION]) for a in annotation_maps if GPU_ANNOTATION in mapping(a)), None)
    found: tuple[str, str] | None = None
    selector = mapping(mapping(pod_spec).get(selector_key))
    for label in GPU_LABELS:
        if label in selector:
            found = (_text(selector[label]), f"nodeSelector {label}")
            break
    unresolved: list[Unresolved] = []
    if found is None:
        terms = dig(pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
        found, problem = affinity_gpu(terms)
        if problem and annotated is None:
            unresolved.append(Unresolved("gpu", problem, f"pin one type with annotation {GPU_ANNOTATION}: NAME, or pass --gpu"))
    if annotated is not None:
        if found and found[0] != annotated:
            notes.append(f"GPU {annotated} from annotation {GPU_ANNOTATION} (the {found[1]} says {found[0]})")
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
    default_gpu: str | None = None,
) -> list[DeploymentRequest]:
    """One request per container of a pod spec that runs an engine kvplan knows.

    `extra_gpus` = (pods, gpus per pod) added to the container's own count (LeaderWorkerSet workers).
    """
    requests: list[DeploymentRequest] = []
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(pod_spec, annotation_maps)
    model_override = next(
        (_text(mapping(a)[MODEL_ANNOTATION]) for a in annotation_maps if MODEL_ANNOTATION in mapping(a)), None
    )
    for container in sequence(mapping(pod_spec).get("containers")):
        container = mapping(container)
        env = literal_env(container.get("env"))
        inv = find_invocation(
            [_text(w) for w in sequence(container.get("command"))],
            [_text(w) for w in sequence(container.get("args"))],
            _text(container.get("image") or ""),
            env,
        )
        if inv is None:
            continue
        site = Site(Location(doc.file, line_of(container, doc.line)), f"{workload}/{container.get('name', '?')}",
                    source_format, doc.templates)
        count, count_unresolved = gpu_count(container.get("resources"), doc.templates, site.render_fix)
        notes = list(gpu_notes)
        if extra_gpus is not None and count is not None:
            pods, per_pod = extra_gpus
            notes.append(f"{pods + 1} pods per group: {count} + {pods} x {per_pod} GPUs")
            count += pods * per_pod
        hardware = Hardware(gpu, source, count, tuple(gpu_unresolved + count_unresolved), tuple(notes), missing)
        parsed = engine_args(inv, env)
        hint = None
        if inv.engine == "tgi" and "MODEL_ID" in env:
            hint = (env["MODEL_ID"], "env MODEL_ID")
        requests.append(
            build_request(site, parsed, hardware, positional_model=inv.positional_model, model_hint=hint,
                          model_override=model_override, default_gpu=default_gpu)
        )
    return requests


def workload_requests(doc: Document, obj: Mapping[str, Any], default_gpu: str | None) -> list[DeploymentRequest]:
    """Requests of one Kubernetes workload object."""
    kind = obj.get("kind")
    name = _text(dig(obj, "metadata", "name") or kind)
    annotations = [dig(obj, "metadata", "annotations")]
    if kind == "Pod":
        return pod_requests(doc, obj.get("spec"), workload=name, annotation_maps=annotations, default_gpu=default_gpu)
    if kind == "CronJob":
        template = dig(obj, "spec", "jobTemplate", "spec", "template")
    elif kind == "LeaderWorkerSet":
        return _lws_requests(doc, obj, name, annotations, default_gpu)
    else:
        template = dig(obj, "spec", "template")
    annotations.insert(0, dig(template, "metadata", "annotations"))
    return pod_requests(doc, dig(template, "spec"), workload=name, annotation_maps=annotations, default_gpu=default_gpu)


def _lws_requests(doc: Document, obj: Mapping[str, Any], name: str, annotations: list[Any],
                  default_gpu: str | None) -> list[DeploymentRequest]:
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
    requests = pod_requests(doc, leader.get("spec"), workload=name, annotation_maps=leader_annotations,
                            source_format="lws", extra_gpus=(size - 1, worker_gpus) if size > 1 else None,
                            default_gpu=default_gpu)
    return requests
