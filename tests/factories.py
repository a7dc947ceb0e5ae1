"""Tiny config factories with defaults, for tests that need a model without a library file."""

from __future__ import annotations

from kvplan.model.parse import parse_config
from kvplan.model.specs import ModelSpec


def llama_config(**overrides) -> dict:
    """A Llama-2-7B-shaped config: 32 layers, d_model 4096, 32 heads (MHA), fp16."""
    cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
    }
    cfg.update(overrides)
    return cfg


def model(**overrides) -> ModelSpec:
    return parse_config(llama_config(**overrides), name="test-model", source="test")
