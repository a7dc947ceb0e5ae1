"""The engine registry: every serving engine kvplan models, registered once; every command reads this table.

To add an engine: a module with its options dataclass and an EngineModel (kvplan.engines.base), one line
below, and its options in the CLI and check files that ARCHITECTURE.md lists under "An engine".
"""

from __future__ import annotations

from kvplan.engines.base import EngineModel
from kvplan.engines.generic import GenericEngine
from kvplan.engines.sglang import SglangEngine
from kvplan.engines.tgi import TgiEngine
from kvplan.engines.transformers import TransformersEngine
from kvplan.engines.trtllm import TrtllmEngine
from kvplan.engines.vllm_engine import VllmEngine
from kvplan.errors import FieldError

ENGINES: dict[str, EngineModel] = {
    e.name: e
    for e in (VllmEngine(), SglangEngine(), TrtllmEngine(), TransformersEngine(), GenericEngine(), TgiEngine())
}


def get_engine(name: str) -> EngineModel:
    """The registered engine called `name`, or a FieldError listing them."""
    try:
        return ENGINES[name]
    except KeyError:
        raise FieldError("engine", f"must be one of {', '.join(ENGINES)}", name) from None
