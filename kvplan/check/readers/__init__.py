"""The format registry: each deployment format is a (detect, read) pair, tried in order on every YAML document.

A new format registers here once: `detect(data)` says whether a parsed document is of that format, and
`read(doc, data)` returns its deployments (an empty list when the document is of the format but runs no
model server). The first format whose detector accepts a document reads it, so more specific formats
(a Kubernetes kind, a chart's distinctive keys) come before the loose ones (a flat vLLM config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvplan.check.invocation import engine_of_image
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest
from kvplan.check.readers.compose import compose_requests, is_compose
from kvplan.check.readers.dynamo import graph_requests, is_dynamo_graph
from kvplan.check.readers.eks import eks_values_requests, is_eks_values
from kvplan.check.readers.helm import chart_values_requests, production_stack_requests
from kvplan.check.readers.k8s import WORKLOAD_KINDS, mapping, workload_requests
from kvplan.check.readers.kserve import inference_service_requests, llm_inference_service_requests
from kvplan.check.readers.kubeai import catalog_requests, model_cr_requests
from kvplan.check.readers.llmd import is_modelservice_values, modelservice_requests
from kvplan.check.readers.own_schema import is_own_schema, own_schema_requests
from kvplan.check.readers.ray import is_ray_serve_config, is_ray_service, ray_serve_requests, ray_service_requests
from kvplan.check.readers.skypilot import is_skypilot_task, skypilot_requests
from kvplan.check.readers.vllm_chart import is_vllm_chart_values, vllm_chart_requests
from kvplan.check.readers.vllm_config import is_vllm_config, vllm_config_requests
from kvplan.records import dataclass

Reader = Callable[[Document, Mapping[str, Any]], list[DeploymentRequest]]


@dataclass(frozen=True)
class Format:
    """One deployment format: its name in reports, how to recognise it, and how to read it."""

    name: str
    detect: Callable[[Mapping[str, Any]], bool]
    read: Reader
    describes: str  # for the list of formats kvplan reads


def _kind(*kinds: str, api: str = "") -> Callable[[Mapping[str, Any]], bool]:
    """A detector for Kubernetes objects of these kinds (and, when given, an apiVersion prefix)."""

    def detect(data: Mapping[str, Any]) -> bool:
        return "apiVersion" in data and data.get("kind") in kinds and str(data.get("apiVersion")).startswith(api)

    return detect


def _list_requests(doc: Document, data: Mapping[str, Any]) -> list[DeploymentRequest]:
    """A `kind: List` holds objects; each is read as a document of its own at its line."""
    items = data.get("items")
    found: list[DeploymentRequest] = []
    if not isinstance(items, list):
        return found
    line_of = getattr(items, "line_of", lambda index: doc.line)
    for i, item in enumerate(items):
        line = line_of(i)
        found.extend(requests_of_document(Document(doc.file, line, item, doc.templates)) or [])
    return found


def _is_helm_values(data: Mapping[str, Any]) -> bool:
    image = data.get("image")
    return isinstance(image, dict) and bool(engine_of_image(str(image.get("repository", "")))) and "model" in data


FORMATS: tuple[Format, ...] = (
    Format("kvplan", is_own_schema, own_schema_requests, "kvplan schema (kvplan: 1)"),
    Format("k8s-list", _kind("List"), _list_requests, "Kubernetes List"),
    Format("lws", _kind("LeaderWorkerSet"), workload_requests, "LeaderWorkerSet"),
    Format("k8s", _kind(*sorted(WORKLOAD_KINDS - {"LeaderWorkerSet"})), workload_requests,
           "Kubernetes Deployment/StatefulSet/Pod/Job/CronJob"),
    Format("kserve", _kind("InferenceService", api="serving.kserve.io"), inference_service_requests,
           "KServe InferenceService"),
    Format("kserve-llmisvc", _kind("LLMInferenceService"), llm_inference_service_requests,
           "KServe LLMInferenceService"),
    Format("kubeai", _kind("Model", api="kubeai.org"), model_cr_requests, "KubeAI Model"),
    Format("dynamo", is_dynamo_graph, graph_requests, "NVIDIA Dynamo DynamoGraphDeployment"),
    Format("rayservice", is_ray_service, ray_service_requests, "KubeRay RayService"),
    Format("llm-d", is_modelservice_values, modelservice_requests, "llm-d modelservice values"),
    Format("eks-inference-charts", is_eks_values, eks_values_requests, "AWS inference-charts values"),
    Format("helm-production-stack", lambda d: isinstance(d.get("servingEngineSpec"), dict),
           production_stack_requests, "vLLM production-stack values"),
    Format("kubeai-catalog",
           lambda d: isinstance(d.get("catalog"), dict)
           and any(isinstance(v, dict) and "url" in v for v in d["catalog"].values()),
           catalog_requests, "KubeAI models catalog"),
    Format("vllm-chart", is_vllm_chart_values, vllm_chart_requests, "vLLM Helm chart values"),
    Format("compose", is_compose, compose_requests, "docker-compose services"),
    Format("skypilot", is_skypilot_task, skypilot_requests, "SkyPilot task"),
    Format("ray-serve", is_ray_serve_config, ray_serve_requests, "Ray Serve LLM config"),
    Format("vllm-config", is_vllm_config, vllm_config_requests, "vLLM --config file"),
    Format("helm-values", _is_helm_values, chart_values_requests, "single-model chart values"),
)

RECOGNISED = ", ".join(f.describes for f in FORMATS)


def detect_format(data: Any) -> Format | None:
    """The format of one document, or None when it holds no deployment kvplan reads."""
    if not isinstance(data, dict):
        return None
    return next((f for f in FORMATS if f.detect(data)), None)


def requests_of_document(doc: Document) -> list[DeploymentRequest] | None:
    """The deployments in one document; None when the document is not of a format kvplan reads."""
    fmt = detect_format(doc.data)
    if fmt is None:
        return None
    return fmt.read(doc, mapping(doc.data))


def describe_document(data: Any) -> str:
    """What a document is, for the report of a file without deployments: 'Service/web', 'a list', ..."""
    if isinstance(data, dict):
        kind, name = data.get("kind"), mapping(data.get("metadata")).get("name")
        if kind:
            return f"{kind}/{name}" if name else str(kind)
        keys = [str(k) for k in list(data)[:3]]
        return "a mapping with keys " + ", ".join(keys) + (", ..." if len(data) > 3 else "")
    if isinstance(data, list):
        return "a list"
    return "a scalar"
