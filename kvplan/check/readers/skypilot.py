"""SkyPilot task YAML: `resources.accelerators`, `num_nodes`, `envs`, the `run` script, a `service`.

`accelerators` is one choice (`H100:8`, `{H100: 8}`) or several that SkyPilot may pick from (a list, or a
mapping with several entries, or `resources.any_of` / `ordered`); each choice is evaluated as a deployment
of its own, since the task must fit whichever one it gets. The run script is read as a shell would split
it, with `envs` and SkyPilot's own `$SKYPILOT_NUM_GPUS_PER_NODE` / `$SKYPILOT_NUM_NODES` filled in.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.invocation import find_invocation, pip_vllm
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location, Unresolved
from kvplan.check.readers.k8s import engine_args, key_line, mapping, scalar_word, sequence
from kvplan.records import dataclass

_GPU_FIX = "name one accelerator in resources.accelerators (e.g. H100:8), or pass --gpu"


@dataclass(frozen=True)
class Choice:
    """One accelerator the task may run on: its name, the GPUs per node, and the line that offers it."""

    name: str
    count: float
    line: int | None


def is_skypilot_task(data: Any) -> bool:
    if "apiVersion" in data or "kind" in data or "services" in data:
        return False
    resources = data.get("resources")
    has_accelerators = isinstance(resources, dict) and (
        "accelerators" in resources or "any_of" in resources or "ordered" in resources)
    return isinstance(data.get("run"), str) and (has_accelerators or "num_nodes" in data or "envs" in data)


def choices(resources: Any) -> list[Choice]:
    """Every accelerator choice of a task's resources, in the order written."""
    found: list[Choice] = []
    block = mapping(resources)
    for key in ("any_of", "ordered"):
        for item in sequence(block.get(key)):
            found += choices(item)
    value = block.get("accelerators")
    line = key_line(block, "accelerators")
    if isinstance(value, dict):
        for name, count in value.items():
            found.append(Choice(str(name), _count(count), key_line(value, name) or line))
    elif isinstance(value, list):
        found += [_parse(scalar_word(v), line) for v in value]
    elif value is not None:
        found.append(_parse(scalar_word(value), line))
    return found


def _parse(text: str, line: int | None) -> Choice:
    name, _, count = text.partition(":")
    return Choice(name.strip(), _count(count or 1), line)


def _count(value: Any) -> float:
    try:
        return float(scalar_word(value))
    except ValueError:
        return 0.0


def skypilot_requests(doc: Document, task: Any) -> list[DeploymentRequest]:
    resources = mapping(task.get("resources"))
    nodes = task.get("num_nodes") if isinstance(task.get("num_nodes"), int) else 1
    service = mapping(task.get("service"))
    replicas = service.get("replicas") or mapping(service.get("replica_policy")).get("min_replicas") or 1
    task_name = scalar_word(task.get("name") or doc.file.rsplit("/", 1)[-1].split(".")[0])
    options = choices(resources) or [Choice("", 0.0, None)]
    requests = []
    for choice in options:
        requests += _one(doc, task, task_name, choice, nodes, replicas if isinstance(replicas, int) else 1,
                         several=len(options) > 1)
    return requests


def _one(doc: Document, task: Any, task_name: str, choice: Choice, nodes: int, replicas: int,
         several: bool) -> list[DeploymentRequest]:
    count = int(choice.count) if choice.count == int(choice.count) else None
    env = {str(k): scalar_word(v) for k, v in mapping(task.get("envs")).items() if v is not None}
    env |= {"SKYPILOT_NUM_NODES": str(nodes), "SKYPILOT_NODE_RANK": "0"}
    if count:
        env["SKYPILOT_NUM_GPUS_PER_NODE"] = str(count)
    run = scalar_word(task.get("run"))
    inv = find_invocation(["bash", "-c", run], [], None, env, command_lines=[None, None, key_line(task, "run")])
    if inv is None:
        return []
    label = f"{task_name}[{choice.name}:{choice.count:g}]" if choice.name else task_name
    site = Site(Location(doc.file, key_line(task, "run") or doc.line), label, "skypilot", doc.templates,
                gpu_fix=_GPU_FIX, model_fix="name the model in envs (MODEL_NAME: ORG/NAME) or in the run script")
    unresolved: list[Unresolved] = []
    lines: dict[str, int] = {}
    if choice.line is not None:
        lines["gpu"] = lines["num_gpus"] = choice.line
    if choice.name and count is None:
        unresolved.append(Unresolved("num_gpus", f"{choice.name}:{choice.count:g} is a fraction of a GPU",
                                     "give its memory with --gpu-mem", choice.line))
    notes = [f"one of {'several accelerator choices' if several else 'the accelerators'}: "
             f"{choice.name}:{choice.count:g} per node"] if choice.name else []
    if nodes > 1:
        notes.append(f"num_nodes {nodes}: the engine spans {nodes} nodes")
    hardware = Hardware(choice.name or None, "resources.accelerators" if choice.name else "",
                        None if count is None else count * nodes, tuple(unresolved), tuple(notes),
                        "the task names no accelerators", gpus_per_pod=count, pods_per_instance=nodes,
                        replicas=replicas, lines=tuple(lines.items()))
    # The task's setup installs what run serves: a pip-installed vLLM there is the wheel, at its pin.
    pip = pip_vllm(f"{scalar_word(task.get('setup') or '')}\n{run}")
    return [build_request(site, engine_args(inv, env), hardware, positional_model=inv.positional_model, env=env,
                          pip=pip)]
