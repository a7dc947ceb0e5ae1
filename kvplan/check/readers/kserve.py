"""KServe InferenceService (huggingface runtime, custom containers) and LLMInferenceService.

The huggingface runtime serves with vLLM unless `--backend=huggingface`; its own flags (`--model_id`,
`--model_dir`, ...) sit beside vLLM's, and the model comes from `storageUri`. An LLMInferenceService starts
`vllm serve` with `spec.parallelism` rendered to flags and the words of the env `VLLM_ADDITIONAL_ARGS` appended.
"""

from __future__ import annotations

import shlex
from typing import Any

from kvplan.check.build import Hardware, Site, build_request, normalize_model, unsupported
from kvplan.check.flag_tables import KSERVE_HF_BOOLEAN, KSERVE_HF_VALUE
from kvplan.check.flags import bool_word, parse_args
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location
from kvplan.check.readers.k8s import (
    MODEL_ANNOTATION,
    dig,
    env_lines,
    gpu_count,
    gpu_type,
    item_lines,
    key_line,
    line_of,
    literal_env,
    mapping,
    pod_requests,
    scalar_word,
    sequence,
)

_NOT_VLLM_BACKENDS = {"huggingface"}


def inference_service_requests(doc: Document, obj: Any) -> list[DeploymentRequest]:
    name = scalar_word(dig(obj, "metadata", "name") or "isvc")
    predictor = mapping(dig(obj, "spec", "predictor"))
    annotations = [predictor.get("annotations"), dig(obj, "metadata", "annotations")]
    model = mapping(predictor.get("model"))
    if not model:
        return pod_requests(doc, predictor, workload=name, annotation_maps=annotations, source_format="kserve")
    model_format = scalar_word(dig(model, "modelFormat", "name") or "").lower()
    if model_format != "huggingface" and not (model.get("command") or model.get("args")):
        return []
    site = Site(Location(doc.file, line_of(model, doc.line)), name, "kserve", doc.templates)
    env = literal_env(model.get("env"))
    parsed = parse_args("vllm", [scalar_word(a) for a in sequence(model.get("args"))],
                        lines=item_lines(model.get("args")), extra_value=KSERVE_HF_VALUE,
                        extra_boolean=KSERVE_HF_BOOLEAN)
    storage = model.get("storageUri")
    model_id = parsed.get("model-id")
    hint = (model_id, "--model_id") if model_id else ((scalar_word(storage), "storageUri") if storage else None)
    backend = (parsed.get("backend") or "auto").lower()
    if backend in _NOT_VLLM_BACKENDS:
        repo = normalize_model(hint[0])[0] if hint else None
        return [unsupported(site, backend, repo, f"the huggingface runtime runs with --backend={backend} "
                            "(Transformers, not vLLM)", "kvplan check evaluates the vLLM backend; drop --backend")]
    lines: dict[str, int] = {}
    count, count_unresolved = gpu_count(model.get("resources"), doc.templates, site.render_fix, lines)
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(predictor, annotations, lines=lines)
    override = next(
        (scalar_word(mapping(a)[MODEL_ANNOTATION]) for a in annotations if MODEL_ANNOTATION in mapping(a)), None
    )
    notes = [f"env: {', '.join(sorted(env))}"] if env else []
    replicas = predictor.get("minReplicas")
    if isinstance(predictor.get("maxReplicas"), int) and predictor["maxReplicas"] > (replicas or 1):
        notes.append(f"autoscales up to {predictor['maxReplicas']} replicas; each evaluated alone")
    hardware = Hardware(gpu, source, count, tuple(count_unresolved + gpu_unresolved), tuple(gpu_notes), missing,
                        gpus_per_pod=count, replicas=replicas if isinstance(replicas, int) and replicas > 0 else 1,
                        lines=tuple(lines.items()))
    return [build_request(site, parsed, hardware, model_hint=hint, model_override=override, notes=tuple(notes),
                          env=env, model_line=key_line(model, "storageUri"))]


def llm_inference_service_requests(doc: Document, obj: Any) -> list[DeploymentRequest]:
    name = scalar_word(dig(obj, "metadata", "name") or "llmisvc")
    spec = mapping(obj.get("spec"))
    template = mapping(spec.get("template"))
    containers = sequence(template.get("containers"))
    main = next((mapping(c) for c in containers if mapping(c).get("name") == "main"),
                mapping(containers[0]) if containers else {})
    annotations = [dig(obj, "metadata", "annotations")]
    if main.get("command"):
        return pod_requests(doc, template, workload=name, annotation_maps=annotations, source_format="kserve")
    site = Site(Location(doc.file, line_of(main, doc.line) if main else doc.line), name, "kserve-llmisvc",
                doc.templates)
    parallel = mapping(spec.get("parallelism"))
    argv: list[str] = []
    argv_lines: list[int | None] = []
    for key, flag in (("tensor", "tensor-parallel-size"), ("pipeline", "pipeline-parallel-size"),
                      ("data", "data-parallel-size"), ("dataLocal", "data-parallel-size-local")):
        if key in parallel:
            argv += [f"--{flag}", scalar_word(parallel[key])]
            argv_lines += [key_line(parallel, key)] * 2
    if bool_word(scalar_word(parallel.get("expert", False))) == "true":
        argv.append("--enable-expert-parallel")
        argv_lines.append(key_line(parallel, "expert"))
    env = literal_env(main.get("env"))
    args = sequence(main.get("args"))
    argv += [scalar_word(a) for a in args]
    argv_lines += item_lines(args)
    notes: list[str] = []
    if "VLLM_ADDITIONAL_ARGS" in env:
        try:
            extra = shlex.split(env["VLLM_ADDITIONAL_ARGS"])
        except ValueError:
            extra = env["VLLM_ADDITIONAL_ARGS"].split()
        argv += extra
        argv_lines += [env_lines(main.get("env")).get("VLLM_ADDITIONAL_ARGS")] * len(extra)
        notes.append("flags from env VLLM_ADDITIONAL_ARGS")
    parsed = parse_args("vllm", argv, lines=argv_lines)
    uri, served = dig(spec, "model", "uri"), dig(spec, "model", "name")
    hint = None
    if uri and normalize_model(scalar_word(uri))[0]:
        hint = (scalar_word(uri), "spec.model.uri")
    elif served and normalize_model(scalar_word(served))[0] and "/" in scalar_word(served):
        hint = (scalar_word(served), "spec.model.name")
        notes.append(f"model taken from spec.model.name (the weights come from {uri})")
    elif uri:
        hint = (scalar_word(uri), "spec.model.uri")
    lines: dict[str, int] = {}
    count, count_unresolved = gpu_count(main.get("resources"), doc.templates, site.render_fix, lines)
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(template, annotations, lines=lines)
    pods = None
    if spec.get("worker") and parallel.get("data") and parallel.get("dataLocal"):
        pods = int(parallel["data"]) // max(1, int(parallel["dataLocal"]))
        notes.append(f"{pods} pods per replica (data {parallel['data']} / dataLocal {parallel['dataLocal']}); "
                     "each data-parallel rank holds its own KV cache")
    replicas = spec.get("replicas")
    replicas = replicas if isinstance(replicas, int) and replicas > 0 else 1
    first = mapping(annotations[0])
    override = scalar_word(first.get(MODEL_ANNOTATION)) if MODEL_ANNOTATION in first else None
    hardware = Hardware(gpu, source, None if count is None else count * (pods or 1),
                        tuple(count_unresolved + gpu_unresolved), tuple(gpu_notes), missing, gpus_per_pod=count,
                        pods_per_instance=pods, replicas=replicas, lines=tuple(lines.items()))
    return [build_request(site, parsed, hardware, positional_model=False, model_hint=hint, model_override=override,
                          notes=tuple(notes))]
