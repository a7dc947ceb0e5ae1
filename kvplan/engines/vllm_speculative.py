"""vLLM's --speculative-config, read into the two fields kvplan plans: the method and the draft tokens.

kvplan models the "mtp" method, the multi-token-prediction block a checkpoint ships beside its model
(DeepSeek-V3, DeepSeek-V4, Qwen3.5): docs/engine-rules.md 1.17. The older spellings "deepseek_mtp",
"qwen3_next_mtp" and the like name the same method.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kvplan.errors import FieldError, InputError


def speculative_options(config: str | dict[str, Any] | None) -> dict[str, Any]:
    """{"speculative_method", "num_speculative_tokens"} from the flag's JSON text, or the dict a start-up log
    prints (a Python literal); {} without one. '{"method": "mtp", "num_speculative_tokens": 3}' -> ("mtp", 3)."""
    if config is None:
        return {}
    if isinstance(config, str):
        config = _literal(config)
    if not isinstance(config, dict):
        raise InputError("--speculative-config must be a JSON object with a method and num_speculative_tokens")
    method = config.get("method")
    if not isinstance(method, str):
        raise FieldError("engine.speculative_method", "--speculative-config needs a \"method\"", method)
    tokens = config.get("num_speculative_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise FieldError("engine.num_speculative_tokens", "--speculative-config needs num_speculative_tokens >= 1",
                         tokens)
    return {"speculative_method": "mtp" if method.endswith("mtp") else method, "num_speculative_tokens": tokens}


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)  # a start-up log prints the dict's repr; literal_eval runs no code
    except (ValueError, SyntaxError):
        raise InputError("--speculative-config must be JSON, e.g. "
                         "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'") from None
