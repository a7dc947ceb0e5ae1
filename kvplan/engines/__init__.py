"""The engine registry: every serving engine kvplan models, registered once; every command reads this table.

An engine's module is imported the first time it is asked for, so `kvplan estimate` with vLLM does not pay
for building SGLang's and TensorRT-LLM's release tables (about 20 ms of a 200 ms start).

To add an engine: a module with its options dataclass and an EngineModel (kvplan.engines.base), one line
below, and its options in the CLI and check files that ARCHITECTURE.md lists under "An engine".
"""

from __future__ import annotations

import importlib

from kvplan.engines.base import EngineModel
from kvplan.errors import FieldError

# name -> (module under kvplan.engines, its EngineModel class); the order is the order help and plans list them.
_REGISTRY: dict[str, tuple[str, str]] = {
    "vllm": ("vllm_engine", "VllmEngine"),
    "sglang": ("sglang", "SglangEngine"),
    "trtllm": ("trtllm", "TrtllmEngine"),
    "transformers": ("transformers", "TransformersEngine"),
    "generic": ("generic", "GenericEngine"),
    "tgi": ("tgi", "TgiEngine"),
}
ENGINE_NAMES: tuple[str, ...] = tuple(_REGISTRY)
_loaded: dict[str, EngineModel] = {}


def get_engine(name: str) -> EngineModel:
    """The registered engine called `name`, or a FieldError listing them."""
    if name not in _REGISTRY:
        raise FieldError("engine", f"must be one of {', '.join(ENGINE_NAMES)}", name)
    if name not in _loaded:
        module, cls = _REGISTRY[name]
        _loaded[name] = getattr(importlib.import_module(f"kvplan.engines.{module}"), cls)()
    return _loaded[name]
