"""Regenerate kvplan/model/hf_defaults.json: the Transformers config-class defaults kvplan applies to absent keys.

A config.json only lists what differs from its class's defaults (Gemma 3 configs omit vocab_size and
sliding_window_pattern); Transformers and vLLM read the class defaults for the rest, so kvplan must too.
Run with transformers installed:  python scripts/gen_hf_defaults.py
"""

from __future__ import annotations

import json
import pathlib

import transformers
from transformers import CONFIG_MAPPING

# The architecture keys kvplan reads; other defaults (token ids, dropout) do not change memory.
KEYS = (
    "vocab_size hidden_size num_hidden_layers num_attention_heads num_key_value_heads head_dim intermediate_size "
    "sliding_window sliding_window_pattern use_sliding_window max_window_layers max_position_embeddings "
    "attention_chunk_size no_rope_layer_interval interleave_moe_layer_step num_kv_shared_layers "
    "tie_word_embeddings attention_bias mlp_bias multi_query new_decoder_architecture num_kv_heads "
    "num_local_experts num_experts num_experts_per_tok moe_intermediate_size intermediate_size_mlp "
    "shared_expert_intermediate_size kv_lora_rank q_lora_rank qk_rope_head_dim qk_nope_head_dim v_head_dim "
    "n_routed_experts n_shared_experts first_k_dense_replace moe_layer_freq num_nextn_predict_layers "
    "linear_conv_kernel_dim linear_key_head_dim linear_value_head_dim linear_num_key_heads "
    "linear_num_value_heads full_attention_interval mamba_num_heads mamba_head_dim ssm_state_size "
    "n_groups conv_kernel expand mamba_d_state mamba_d_conv mamba_expand attn_layer_period "
    "attn_layer_offset expert_layer_period expert_layer_offset hidden_size_per_layer_input "
    "laurel_rank altup_num_inputs vocab_size_per_layer_input partial_rotary_factor mamba_n_heads mamba_d_head "
    "mamba_n_groups mamba_dt_rank mamba_conv_bias mamba_proj_bias shared_intermediate_size "
    "use_conv_bias use_bias moe_shared_expert_intermediate_size "
    # vision towers (vision_config), whose weights count toward weight memory
    "num_channels image_size patch_size vision_use_head pixel_shuffle_ratio projector_input_dim "
    "projector_output_dim vision_output_dim depth in_chans in_channels temporal_patch_size spatial_merge_size "
    "out_hidden_size num_position_embeddings deepstack_visual_indexes attn_output_gate"
).split()

MODEL_TYPES = (
    "llama llama4 llama4_text mistral mistral3 mixtral qwen2 qwen2_moe qwen2_5_vl qwen2_5_vl_text qwen3 "
    "qwen3_moe qwen3_next gemma gemma2 gemma3 gemma3_text gemma3n gemma3n_text granite granitemoe "
    "granitemoehybrid phi phi3 opt gpt2 gpt_bigcode falcon deepseek_v2 deepseek_v3 gpt_oss nemotron_h "
    "jamba starcoder2 cohere cohere2 olmo2 llava llava_next siglip_vision_model llama4_vision_model "
    "qwen2_5_vl_vision qwen3_5 qwen3_5_text qwen3_5_moe qwen3_5_moe_text qwen3_5_vision qwen3_5_moe_vision"
).split()


def derived_keys(cls, base: dict) -> set[str]:
    """Keys whose default is computed from others (Mistral's head_dim = hidden / heads): never apply those.

    Found by building the class again with hidden_size and num_attention_heads doubled, one at a time,
    and seeing which defaults move.
    """
    moved: set[str] = set()
    for key in ("hidden_size", "num_attention_heads"):
        if not isinstance(base.get(key), int):
            continue
        try:
            other = cls(**{key: base[key] * 2}).to_dict()
        except Exception:  # a class that validates the pair; nothing derived can be learned this way
            continue
        moved |= {k for k in KEYS if k != key and other.get(k) != base.get(k)}
    return moved


def main() -> None:
    out: dict[str, dict] = {"_transformers_version": transformers.__version__}
    for model_type in MODEL_TYPES:
        if model_type not in CONFIG_MAPPING:
            continue
        cls = CONFIG_MAPPING[model_type]
        cfg = cls().to_dict()
        skip = derived_keys(cls, cfg)
        out[model_type] = {
            k: cfg[k] for k in KEYS if k in cfg and k not in skip and not isinstance(cfg[k], dict)
        }
    path = pathlib.Path(__file__).resolve().parent.parent / "kvplan" / "model" / "hf_defaults.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path} ({len(out) - 1} model types)")


if __name__ == "__main__":
    main()
