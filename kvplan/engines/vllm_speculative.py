"""vLLM's --speculative-config, read into the two fields kvplan plans (the method and the draft tokens), and the
buffers the MTP proposer allocates.

kvplan models the "mtp" method, the multi-token-prediction block a checkpoint ships beside its model
(DeepSeek-V3, DeepSeek-V4, Qwen3.5): docs/engine-rules.md 1.17. The older spellings "deepseek_mtp",
"qwen3_next_mtp" and the like name the same method.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from kvplan.errors import FieldError, InputError
from kvplan.model.specs import ModelSpec
from kvplan.units import INT32_BYTES, INT64_BYTES


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


def proposer_buffer_bytes(
    model: ModelSpec, *, runner: str, elem_bytes: int, max_num_batched_tokens: int, max_num_seqs: int,
) -> int:
    """The GPU buffers the MTP proposer allocates when the model runner is built, on the last pipeline stage.

    V1's proposer (v1/spec_decode/llm_base_proposer.py, 0.20-0.28): the target's hidden states [T, width] and the
    draft's input embeddings [T, hidden] in the model dtype, token ids (int32 [T]), positions and the slot
    mapping (int64 [T] each; M-RoPE positions are [3, T + 1], 16 T + 8 B more, not counted), a row arange
    (int32 [max(seqs + 1, T)]) and the backup next tokens (int32 [seqs]). Model Runner V2's speculator keeps the
    hidden states (and small per-request inputs, not counted). The width is DeepSeek-V4's whole residual stream,
    hc_mult x hidden. DeepSeek-V4-Flash on V1 at T = 4,096, 64 sequences: 4,096 x (16,384 + 4,096) x 2 +
    4,096 x 20 + 4 x 4,096 + 4 x 64 = 167,870,720 B."""
    t = max_num_batched_tokens
    d = model.geometry.compressed_mla
    hidden_states = t * model.hidden_size * (d.hc_mult if d is not None else 1) * elem_bytes
    if runner == "v2":
        return hidden_states
    inputs = t * model.hidden_size * elem_bytes + t * (INT32_BYTES + 2 * INT64_BYTES)
    return hidden_states + inputs + INT32_BYTES * (max(max_num_seqs + 1, t) + max_num_seqs)
