"""Tiny config factories with defaults, for tests that need a model without a library file."""

from __future__ import annotations

from kvplan.model.config_reader import MAX_EXPERTS, MAX_HEADS
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


def hybrid_moe_config(layers: int, *, experts: int = MAX_EXPERTS, heads: int = MAX_HEADS) -> dict:
    """A Qwen3-MoE-shaped config at the caps: alternating full and sliding layers, every layer MoE."""
    return {
        "model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_experts": experts, "num_experts_per_tok": 8, "vocab_size": 151936, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False, "sliding_window": 4096,
        "layer_types": ["sliding_attention" if i % 2 else "full_attention" for i in range(layers)],
    }
