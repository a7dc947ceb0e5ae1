"""vLLM `--config` YAML files: flat keys named like the flags (`max-model-len: 8192`, `tensor_parallel_size: 2`).

vLLM turns each key into `--key value` (true booleans into a bare `--key`) before parsing, so the same
parser reads them. A config file names no hardware: the GPU type comes from `--gpu`, and the count is
what tp x pp x dp uses.
"""

from __future__ import annotations

from typing import Any

from kvplan.check.build import Hardware, Site, build_request
from kvplan.check.flag_tables import VLLM
from kvplan.check.flags import parse_args
from kvplan.check.loader import Document
from kvplan.check.model import DeploymentRequest, Location


def _canonical(key: Any) -> str:
    return str(key).replace("_", "-")


def is_vllm_config(data: Any) -> bool:
    """A flat mapping whose keys are mostly vLLM flag names, including `model` or a sizing flag."""
    if not isinstance(data, dict) or not data or "apiVersion" in data or "kind" in data:
        return False
    if any(isinstance(v, dict) for v in data.values()):
        return False
    keys = [_canonical(k) for k in data]
    known = [k for k in keys if k in VLLM.names]
    sizing = {"model", "max-model-len", "tensor-parallel-size", "gpu-memory-utilization", "max-num-seqs"}
    return bool(sizing & set(known)) and len(known) * 2 >= len(keys)


def vllm_config_requests(doc: Document, data: Any) -> list[DeploymentRequest]:
    argv: list[str] = []
    for key, value in data.items():
        flag = f"--{_canonical(key)}"
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append(f"--no-{_canonical(key)}")
        elif isinstance(value, list):
            argv += [flag, *(str(v) for v in value)]
        elif value is not None:
            argv += [flag, str(value)]
    parsed = parse_args("vllm", argv)
    name = doc.file.rsplit("/", 1)[-1]
    site = Site(Location(doc.file, doc.line), name, "vllm-config", doc.templates, gpu_fix="pass --gpu",
                model_fix="set model: ORG/NAME")
    ints = []
    for flag in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        try:
            ints.append(int(parsed.get(flag) or 1))
        except ValueError:
            ints.append(1)
    used = ints[0] * ints[1] * ints[2]
    hardware = Hardware(num_gpus=used, notes=(f"GPU count taken as tp x pp x dp = {used}",),
                        missing_gpu="a vLLM config file names no GPU type")
    return [build_request(site, parsed, hardware)]
