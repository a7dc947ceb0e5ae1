"""KubeAI `Model` resources and the KubeAI models chart catalog (`catalog.<name>`).

KubeAI runs `vllm` with the model from `url` plus `args`; `resourceProfile: nvidia-gpu-h100:8` names the
accelerator profile and the GPU count. The profile name is passed on raw for the GPU catalog to map.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request, unsupported
from kvplan.check.flags import parse_args
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import dig, mapping, scalar_word, sequence

_ENGINES = {"vllm": "vllm"}
_NOT_GPU = ("cpu", "google-tpu")
_GPU_FIX = "use a GPU resourceProfile such as nvidia-gpu-h100:1, or pass --gpu"


def model_request(doc: Document, name: str, spec: Any, line: int, source_format: str) -> DeploymentRequest:
    """The request for one KubeAI model spec (the CR's `spec` or one catalog entry)."""
    spec = mapping(spec)
    site = Site(Location(doc.file, line), name, source_format, doc.templates, gpu_fix=_GPU_FIX,
                model_fix="set url: hf://ORG/NAME")
    engine_raw = scalar_word(spec.get("engine", ""))
    url = spec.get("url")
    engine = _ENGINES.get(engine_raw.lower())
    if engine is None:
        return unsupported(site, engine_raw or "unknown", scalar_word(url) if url else None,
                           f"KubeAI engine {engine_raw or '(none)'} is not one kvplan models",
                           "kvplan check evaluates vLLM, SGLang and TGI deployments")
    notes: list[str] = []
    if spec.get("enabled") is False:
        notes.append("enabled: false in this values file")
    profile = scalar_word(spec.get("resourceProfile", ""))
    unresolved: list[Unresolved] = []
    gpu: str | None = None
    count: int | None = None
    missing = None
    if not profile:
        missing = "no resourceProfile"
        unresolved.append(Unresolved("num_gpus", "no resourceProfile", "set resourceProfile: nvidia-gpu-h100:1"))
    else:
        kind, _, raw_count = profile.partition(":")
        try:
            count = int(raw_count) if raw_count else 1
        except ValueError:
            unresolved.append(Unresolved("num_gpus", f"resourceProfile {profile!r} has no count", "write NAME:COUNT"))
        if kind.startswith(_NOT_GPU):
            unresolved.append(Unresolved("gpu", f"resourceProfile {profile} is not a GPU", _GPU_FIX))
        else:
            gpu = kind
    env = {str(k): scalar_word(v) for k, v in mapping(spec.get("env")).items()}
    parsed = parse_args("vllm", [scalar_word(a) for a in sequence(spec.get("args"))])
    if env:
        notes.append(f"env: {', '.join(sorted(env))}")
    hardware = Hardware(gpu, "KubeAI resourceProfile" if gpu else "", count, tuple(unresolved), missing_gpu=missing)
    return build_request(site, parsed, hardware, model_hint=(scalar_word(url), "url") if url else None,
                         notes=tuple(notes))


def model_cr_requests(doc: Document, obj: Any) -> list[DeploymentRequest]:
    name = scalar_word(dig(obj, "metadata", "name") or "model")
    return [model_request(doc, name, obj.get("spec"), doc.line, "kubeai")]


def catalog_requests(doc: Document, values: Any) -> list[DeploymentRequest]:
    catalog = mapping(values.get("catalog"))
    line_of = getattr(catalog, "line_of", lambda key: doc.line)
    return [model_request(doc, str(name), spec, line_of(name), "kubeai-catalog")
            for name, spec in catalog.items() if isinstance(spec, dict)]
