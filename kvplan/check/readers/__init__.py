"""Recognise what each YAML document is and hand it to the reader for that format."""

from __future__ import annotations

from typing import Any

from kvplan.check.invocation import engine_of_image
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest
from kvplan.check.readers.compose import compose_requests, is_compose
from kvplan.check.readers.helm import chart_values_requests, production_stack_requests
from kvplan.check.readers.k8s import WORKLOAD_KINDS, mapping, workload_requests
from kvplan.check.readers.kserve import inference_service_requests, llm_inference_service_requests
from kvplan.check.readers.kubeai import catalog_requests, model_cr_requests
from kvplan.check.readers.own_schema import is_own_schema, own_schema_requests
from kvplan.check.readers.vllm_config import is_vllm_config, vllm_config_requests

RECOGNISED = (
    "kvplan schema (kvplan: 1), Kubernetes Deployment/StatefulSet/Pod/Job/CronJob/LeaderWorkerSet, KServe "
    "InferenceService/LLMInferenceService, KubeAI Model, production-stack or KubeAI Helm values, "
    "docker-compose services, vLLM --config files"
)


def detect_format(data: Any) -> str | None:
    """The format name of one document, or None when it holds no deployment kvplan reads."""
    if not isinstance(data, dict):
        return None
    if is_own_schema(data):
        return "kvplan"
    kind, api = data.get("kind"), str(data.get("apiVersion", ""))
    if kind is not None and "apiVersion" in data:
        if kind == "List":
            return "k8s-list"
        if kind in WORKLOAD_KINDS:
            return "lws" if kind == "LeaderWorkerSet" else "k8s"
        if kind == "InferenceService" and api.startswith("serving.kserve.io"):
            return "kserve"
        if kind == "LLMInferenceService":
            return "kserve-llmisvc"
        if kind == "Model" and api.startswith("kubeai.org"):
            return "kubeai"
        return None
    if isinstance(data.get("servingEngineSpec"), dict):
        return "helm-production-stack"
    catalog = data.get("catalog")
    if isinstance(catalog, dict) and any(isinstance(v, dict) and "url" in v for v in catalog.values()):
        return "kubeai-catalog"
    if is_compose(data):
        return "compose"
    if is_vllm_config(data):
        return "vllm-config"
    image = data.get("image")
    if isinstance(image, dict) and engine_of_image(str(image.get("repository", ""))) and "model" in data:
        return "helm-values"
    return None


def requests_of_document(doc: Document, default_gpu: str | None) -> list[DeploymentRequest] | None:
    """The deployments in one document; None when the document is not a deployment at all."""
    data = doc.data
    fmt = detect_format(data)
    if fmt is None:
        return None
    if fmt == "k8s-list":
        found: list[DeploymentRequest] = []
        items = data.get("items") if isinstance(data.get("items"), list) else []
        for i, item in enumerate(items):
            line = items.line_of(i) if hasattr(items, "line_of") else doc.line
            sub = requests_of_document(Document(doc.file, line, item, doc.templates), default_gpu)
            found.extend(sub or [])
        return found
    readers = {
        "kvplan": own_schema_requests,
        "k8s": workload_requests,
        "lws": workload_requests,
        "kserve": inference_service_requests,
        "kserve-llmisvc": llm_inference_service_requests,
        "kubeai": model_cr_requests,
        "helm-production-stack": production_stack_requests,
        "kubeai-catalog": catalog_requests,
        "compose": compose_requests,
        "vllm-config": vllm_config_requests,
        "helm-values": chart_values_requests,
    }
    return readers[fmt](doc, mapping(data), default_gpu)
