"""llm-d modelservice Helm values: prefill and decode as two deployments of one model.

The chart (llm-d-modelservice) turns `decode` and `prefill` into Deployments (LeaderWorkerSets with
`multinode: true`) whose vLLM command line it writes itself: the model from `modelArtifacts.uri`
(`hf://ORG/NAME`, `pvc://CLAIM/PATH`, `pvc+hf://CLAIM/.../ORG/NAME`), then `--tensor-parallel-size`,
`--data-parallel-size` and `--data-parallel-size-local` from `parallelism` (each only when above 1), then the
container's own `args`. Each pod gets `dataLocal x tensor` GPUs unless the container's limit says otherwise,
and `workers` pods form one engine. A `modelCommand: custom` container runs its `command` as written.
"""

from __future__ import annotations

import re
from typing import Any

from kvplan.check.build import Hardware, Site, build_request, not_served
from kvplan.check.flags import parse_args
from kvplan.check.invocation import find_invocation, image_version
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import (
    affinity_gpu,
    engine_args,
    env_lines,
    gpu_count,
    gpu_type,
    item_lines,
    key_line,
    line_of,
    literal_env,
    mapping,
    scalar_word,
    sequence,
)

ROLES = ("decode", "prefill")
_VALUES_REF_RE = re.compile(r"\{\{-?\s*\.Values\.([\w.]+)\s*-?\}\}")
_SIMULATOR = "llm-d-inference-sim"
_GPU_FIX = "set decode.acceleratorTypes (labelKey, labelValues) to one GPU type, or pass --gpu"


def is_modelservice_values(data: Any) -> bool:
    return (isinstance(data.get("modelArtifacts"), dict) and "apiVersion" not in data
            and any(isinstance(data.get(role), dict) for role in ROLES))


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def resolve_values(text: str, doc: Document, values: Any) -> str:
    """Put `{{ .Values.a.b }}` back from the values file itself (the chart renders it with tpl)."""

    def _lookup(match: re.Match[str]) -> str:
        node: Any = values
        for key in match.group(1).split("."):
            node = mapping(node).get(key)
        return scalar_word(node) if node is not None and not isinstance(node, (dict, list)) else match.group(0)

    original = text
    for index, template in enumerate(doc.templates):
        original = original.replace(f"__kvplan_tpl_{index}__", template)
    return _VALUES_REF_RE.sub(_lookup, original)


def model_of_uri(uri: str) -> tuple[str | None, str]:
    """The `vllm serve` model argument the chart writes for a URI, and how it was read."""
    protocol, _, rest = uri.partition("://")
    rest = rest.strip().strip('"')
    if protocol == "hf":
        return rest, "hf://"
    if protocol == "pvc+hf":
        parts = rest.split("/")
        return ("/".join(parts[-2:]), "pvc+hf:// (the last two path parts)") if len(parts) >= 3 else (None, "pvc+hf://")
    return None, f"{protocol}://"


def modelservice_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    artifacts = mapping(values.get("modelArtifacts"))
    uri = resolve_values(scalar_word(artifacts.get("uri", "")), doc, values)
    model, how = model_of_uri(uri)
    served = scalar_word(artifacts.get("name", ""))
    notes: list[str] = []
    if model is None and "/" in served:
        notes.append(f"model taken from modelArtifacts.name {served} (the weights come from {uri})")
        model = served
    requests = []
    for role in ROLES:
        spec = mapping(values.get(role))
        if not spec or spec.get("create") is False or _int(spec.get("replicas"), 1 if role == "decode" else 0) == 0:
            continue
        for container in sequence(spec.get("containers")):
            requests.append(_container(doc, values, role, spec, mapping(container), model, uri, notes))
    return requests


def _container(doc: Document, values: Any, role: str, spec: Any, container: Any, model: str | None, uri: str,
               notes: list[str]) -> DeploymentRequest:
    line = line_of(container, doc.line)
    name = f"{role}/{scalar_word(container.get('name', 'vllm'))}"
    site = Site(Location(doc.file, line), name, "llm-d", doc.templates, gpu_fix=_GPU_FIX,
                model_fix="set modelArtifacts.uri to hf://ORG/NAME")
    image = scalar_word(container.get("image", ""))
    command = scalar_word(container.get("modelCommand", "custom"))
    if _SIMULATOR in image:
        return not_served(site, f"{image} simulates vLLM without a model or GPU",
                          "point the container at a vLLM image (llm-d or vllm/vllm-openai)")
    env = literal_env(container.get("env"))
    parallel = mapping(spec.get("parallelism"))
    tp = _int(parallel.get("tensor"), 1)
    workers = _int(parallel.get("workers"), 0)
    data, data_local = _int(parallel.get("data"), 0), _int(parallel.get("dataLocal"), 0)
    dp = data or (data_local * workers if data_local and workers else data_local) or 1
    dpl = data_local or (data // workers if data and workers else data) or 1
    pods = workers or (data // data_local if data and data_local else 1)
    lines: dict[str, int] = {}
    unresolved: list[Unresolved] = []
    if command in ("vllmServe", "imageDefault"):
        argv: list[str] = ["--model", model or uri] if command == "imageDefault" else [model or uri]
        argv_lines: list[int | None] = [key_line(mapping(values.get("modelArtifacts")), "uri")] * len(argv)
        for flag, value, key in (("--tensor-parallel-size", tp, "tensor"), ("--data-parallel-size", dp, "data"),
                                 ("--data-parallel-size-local", dpl, "dataLocal")):
            if value > 1:
                argv += [flag, str(value)]
                argv_lines += [key_line(parallel, key) or key_line(spec, "parallelism")] * 2
        args = sequence(container.get("args"))
        argv += [scalar_word(a) for a in args]
        argv_lines += item_lines(args)
        parsed = parse_args("vllm", argv, lines=argv_lines)
        positional = command == "vllmServe"
        version = image_version(image)
        pip = None
    else:
        inv = find_invocation([scalar_word(w) for w in sequence(container.get("command"))],
                              [scalar_word(w) for w in sequence(container.get("args"))], image, env,
                              command_lines=item_lines(container.get("command")),
                              args_lines=item_lines(container.get("args")))
        if inv is None:
            return not_served(site, "modelCommand custom runs no engine kvplan knows",
                              "run vllm serve (modelCommand: vllmServe) or a vLLM / SGLang command")
        parsed, positional, version = engine_args(inv, env, env_lines(container.get("env"))), inv.positional_model, \
            image_version(image)
        pip = inv.pip
    count, count_unresolved = gpu_count(container.get("resources"), doc.templates, site.render_fix, lines)
    if count is None and command in ("vllmServe", "imageDefault"):
        count, count_unresolved = dpl * tp, []  # the chart fills the limit in from parallelism
        notes = notes + [f"{count} GPUs per pod, as the chart sets them: dataLocal {dpl} x tensor {tp}"]
    unresolved += count_unresolved
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(spec, [], lines=lines)
    accel = mapping(spec.get("acceleratorTypes"))
    if gpu is None and accel.get("labelKey"):
        terms = [{"matchExpressions": [{"key": accel["labelKey"], "operator": "In",
                                        "values": sequence(accel.get("labelValues"))}]}]
        found, problem = affinity_gpu(terms)
        if found:
            gpu, source = found[0], f"{role}.acceleratorTypes {accel['labelKey']}"
            lines["gpu"] = key_line(accel, "labelValues") or key_line(spec, "acceleratorTypes") or line
        elif problem:
            unresolved.append(Unresolved("gpu", problem, _GPU_FIX, key_line(spec, "acceleratorTypes")))
    replicas = _int(spec.get("replicas"), 1)
    if key_line(spec, "replicas") is not None:
        lines["replicas"] = key_line(spec, "replicas") or 0
    role_notes = [f"the {role} instances of a prefill/decode pair"] if role == "prefill" else []
    hardware = Hardware(gpu, source, None if count is None else count * pods, tuple(unresolved + gpu_unresolved),
                        tuple(gpu_notes), missing or "no GPU type in the values (acceleratorTypes, nodeSelector)",
                        gpus_per_pod=count, pods_per_instance=pods, replicas=replicas, lines=tuple(lines.items()))
    return build_request(site, parsed, hardware, positional_model=positional, notes=tuple(notes + role_notes),
                         engine_version=version, env=env, pip=pip)
