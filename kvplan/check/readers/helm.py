"""Helm values files: vLLM production-stack (`servingEngineSpec.modelSpec[]`) and single-model charts.

The production-stack chart turns each modelSpec into `vllm serve MODEL_URL` with flags from a fixed set of
`vllmConfig` keys (maxModelLen, dtype, tensorParallelSize, maxNumSeqs, gpuMemoryUtilization, maxLoras,
enableChunkedPrefill, enablePrefixCaching -- rendered as --no-enable-prefix-caching when false or absent) plus
`vllmConfig.extraArgs`; `requestGPU` becomes the nvidia.com/gpu request. Other vllmConfig keys are not
rendered, so kvplan reports them instead of using them.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.flags import parse_args
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import (
    GPU_ANNOTATION,
    GPU_LABELS,
    MODEL_ANNOTATION,
    affinity_gpu,
    dig,
    gpu_count,
    gpu_type,
    mapping,
    scalar_word,
    sequence,
)
from kvplan.check.templates import find_template

_RENDERED = {
    "maxModelLen": "max-model-len",
    "dtype": "dtype",
    "tensorParallelSize": "tensor-parallel-size",
    "maxNumSeqs": "max-num-seqs",
    "gpuMemoryUtilization": "gpu-memory-utilization",
    "maxLoras": "max-loras",
}
_CHART_ONLY = {"extraArgs", "v0", "prometheusMultiprocDir", "enableChunkedPrefill", "enablePrefixCaching"}
_GPU_FIX = "pass --gpu, or add podAnnotations: {kvplan.io/gpu: H100-80GB} to the modelSpec entry"


def production_stack_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    """One request per servingEngineSpec.modelSpec entry."""
    engine_spec = mapping(values.get("servingEngineSpec"))
    specs = sequence(engine_spec.get("modelSpec"))
    requests = []
    for index, spec in enumerate(specs):
        spec = mapping(spec)
        line = getattr(specs, "line_of", lambda i: doc.line)(index)
        site = Site(
            Location(doc.file, line),
            str(spec.get("name", f"modelSpec[{index}]")),
            "helm-production-stack",
            doc.templates,
            gpu_fix=_GPU_FIX,
            model_fix="set modelURL to the Hugging Face repo id",
        )
        argv: list[str] = []
        notes: list[str] = []
        config = spec.get("vllmConfig")
        if isinstance(config, dict):
            if "enableChunkedPrefill" in config:
                argv.append(
                    "--enable-chunked-prefill" if config["enableChunkedPrefill"] else "--no-enable-chunked-prefill"
                )
            argv.append(
                "--enable-prefix-caching" if config.get("enablePrefixCaching") else "--no-enable-prefix-caching"
            )
            for key, flag in _RENDERED.items():
                if key in config:
                    argv += [f"--{flag}", scalar_word(config[key])]
            argv += [scalar_word(a) for a in sequence(config.get("extraArgs"))]
            ignored = sorted(k for k in config if k not in _RENDERED and k not in _CHART_ONLY)
            if ignored:
                notes.append(
                    f"vllmConfig keys the chart does not render: {', '.join(ignored)} (use vllmConfig.extraArgs)"
                )
            if scalar_word(config.get("v0", "")) == "1":
                notes.append("vllmConfig.v0 = 1: the V0 engine (VLLM_USE_V1=0)")
        if spec.get("extraArgs"):
            argv += [scalar_word(a) for a in sequence(spec.get("extraArgs"))]
            notes.append("modelSpec.extraArgs read as engine flags (current charts render only vllmConfig.extraArgs)")
        if spec.get("enableLoRA"):
            argv.append("--enable-lora")
        parsed = parse_args("vllm", argv)

        count: int | None = None
        unresolved: list[Unresolved] = []
        if "requestGPU" in spec:
            raw = spec["requestGPU"]
            template = find_template(raw, doc.templates)
            try:
                count = None if template else int(str(raw))
            except ValueError:
                unresolved.append(Unresolved("num_gpus", f"requestGPU is {raw!r}", "set requestGPU to a number"))
            if template:
                unresolved.append(Unresolved("num_gpus", f"requestGPU is templated: {template}", site.render_fix))
        else:
            unresolved.append(Unresolved("num_gpus", "the modelSpec entry sets no requestGPU", "set requestGPU: N"))

        annotations = [mapping(spec.get("podAnnotations")), mapping(spec.get("annotations"))]
        gpu = next((scalar_word(a[GPU_ANNOTATION]) for a in annotations if GPU_ANNOTATION in a), None)
        source = f"podAnnotations {GPU_ANNOTATION}" if gpu else ""
        if gpu is None:
            found, problem = affinity_gpu(spec.get("nodeSelectorTerms"))
            if problem:
                unresolved.append(Unresolved("gpu", problem, _GPU_FIX))
            selector = {**mapping(engine_spec.get("nodeSelector")), **mapping(spec.get("nodeSelector"))}

            label = next((k for k in GPU_LABELS if k in selector), None)
            if found:
                gpu, source = found
            elif label:
                gpu, source = scalar_word(selector[label]), f"nodeSelector {label}"
        model_override = next((scalar_word(a[MODEL_ANNOTATION]) for a in annotations if MODEL_ANNOTATION in a), None)
        replicas = spec.get("replicaCount")
        replicas = replicas if isinstance(replicas, int) and replicas > 0 else 1
        model_url = spec.get("modelURL")
        hardware = Hardware(
            gpu,
            source,
            count,
            tuple(unresolved),
            missing_gpu="no GPU type in the values (no kvplan.io/gpu pod annotation, no GPU node label)",
            gpus_per_pod=count,
            replicas=replicas,
        )
        requests.append(
            build_request(
                site,
                parsed,
                hardware,
                model_hint=(scalar_word(model_url), "modelURL") if model_url else None,
                model_override=model_override,
                notes=tuple(notes),
            )
        )
    return requests


def chart_values_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    """A single-model chart's values (image vllm, model.id, tensorParallelSize, maxModelLen, resources).

    The chart's own templates may add flags this file does not show (the GKE sample hard-codes
    --gpu-memory-utilization 0.95), so the request is marked unresolved until the rendered manifest is checked.
    """
    model = values.get("model")
    model_id = model.get("id") or model.get("name") if isinstance(model, dict) else model
    argv: list[str] = []
    for key, flag in (
        ("tensorParallelSize", "tensor-parallel-size"),
        ("maxModelLen", "max-model-len"),
        ("gpuMemoryUtilization", "gpu-memory-utilization"),
        ("maxNumSeqs", "max-num-seqs"),
    ):
        if key in values:
            argv += [f"--{flag}", scalar_word(values[key])]
    parsed = parse_args("vllm", argv)
    site = Site(
        Location(doc.file, doc.line),
        str(dig(values, "image", "repository") or "chart"),
        "helm-values",
        doc.templates,
        model_fix="set model.id to the Hugging Face repo id",
    )

    count, count_unresolved = gpu_count(values.get("resources"), doc.templates, site.render_fix)
    gpu, source, gpu_unresolved, gpu_notes, missing = gpu_type(values, [values.get("podAnnotations")])
    hidden = Unresolved(
        "flags",
        "a chart's values file: its templates may add engine flags (gpu-memory-utilization, max-num-seqs) "
        "that the values do not show",
        "check the rendered manifest instead: helm template CHART -f VALUES | kvplan check -",
    )
    hardware = Hardware(gpu, source, count, tuple(count_unresolved + gpu_unresolved), tuple(gpu_notes), missing)
    return [
        build_request(
            site, parsed, hardware, model_hint=(scalar_word(model_id), "model.id") if model_id else None,
            unresolved=(hidden,),
        )
    ]
