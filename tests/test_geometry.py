"""One geometry for the cache and the weights: facts derived once, so the KV cache and the parameter count of a
model cannot disagree; MoE facts only where a layer is sparse."""

from __future__ import annotations

import pytest

from kvplan.engines.vllm_memory import moe_workspace_bytes
from kvplan.model.dtypes import BFLOAT16, FLOAT16
from kvplan.model.kinds import LayerKind
from kvplan.model.parse import parse_config
from kvplan.model.specs import AttentionSpec, FullAttentionSpec, ModelSpec
from kvplan.sources import library


def _parse(raw: dict) -> ModelSpec:
    return parse_config(raw, name="t", source="test")


def _library(repo_id: str) -> ModelSpec:
    entry = library.require(repo_id)
    return parse_config(entry.read_config(), name=repo_id, source=entry.filename,
                        hf_quant_config=entry.read_hf_quant_config())


def chatglm_style(**overrides: object) -> dict:
    """A GLM-shaped config: 5120 wide, 32 query heads of kv_channels = 128 (not 5120 / 32 = 160), and
    multi_query_group_num = 2 KV heads. 4 layers keep the numbers small."""
    cfg = {
        "model_type": "chatglm", "hidden_size": 5120, "num_hidden_layers": 4, "num_attention_heads": 32,
        "kv_channels": 128, "multi_query_attention": True, "multi_query_group_num": 2,
        "intermediate_size": 13696, "padded_vocab_size": 65024, "seq_length": 8192,
        "tie_word_embeddings": False, "torch_dtype": "float16",
    }
    cfg.update(overrides)
    return cfg


def _group(model: ModelSpec, name: str) -> int:
    return sum(g.params for g in model.param_groups if g.name == name)


def test_multi_query_group_num_gives_the_same_kv_heads_to_the_cache_and_the_weights() -> None:
    model = _parse(chatglm_style())
    assert model.geometry.kv_heads == (2, 2, 2, 2)
    assert {s.num_kv_heads for s in model.layers if isinstance(s, FullAttentionSpec)} == {2}
    # Cache: 4 layers x 2 KV heads x (128 + 128) x 2 B (fp16) = 4,096 B per token.
    assert sum(s.kv_bytes_per_token(FLOAT16) for s in model.layers) == 4 * 2 * 256 * 2 == 4_096
    # Weights, per layer: q 5120 x (32 x 128) + k and v 5120 x (2 x 128) each + o (32 x 128) x 5120
    # = 20,971,520 + 2 x 1,310,720 + 20,971,520 = 44,564,480; 4 layers = 178,257,920 (it was MHA at
    # head 160 before: 4 x 4 x 5120 x 5120 = 419,430,400).
    assert _group(model, "attention") == 4 * (2 * 5120 * 4096 + 2 * 5120 * 256) == 178_257_920


def test_kv_channels_is_the_head_dim_of_both_the_cache_and_the_weights() -> None:
    model = _parse(chatglm_style(multi_query_attention=False))
    assert model.geometry.head_dim == 128
    # multi_query_attention off: every query head has its own K/V (ChatGLM's rule), 32 heads of 128.
    assert model.geometry.kv_heads == (32,) * 4
    # Cache: 4 layers x 32 x (128 + 128) x 2 B = 65,536 B per token, not 32 x (160 + 160) x 2 x 4 = 81,920.
    assert sum(s.kv_bytes_per_token(FLOAT16) for s in model.layers) == 65_536
    # Weights: q, k, v, o all 5120 x 4096 per layer: 4 x 4 x 20,971,520 = 335,544,320.
    assert _group(model, "attention") == 4 * 4 * 5120 * 4096 == 335_544_320


def test_geometry_reads_each_fact_once_for_llama_3_1_8b() -> None:
    g = _library("meta-llama/Llama-3.1-8B").geometry
    assert (g.hidden_size, g.num_layers, g.num_attention_heads, g.head_dim, g.v_head_dim) == (4096, 32, 32, 128, 128)
    assert g.kv_heads == (8,) * 32 and g.layer_kinds == (LayerKind.FULL_ATTENTION,) * 32
    assert (g.intermediate_size, g.vocab_size, g.tie_word_embeddings) == (14336, 128_256, False)
    assert (g.max_position_embeddings, g.rotary_dim, g.moe, g.mla) == (131_072, 128, None, None)


def test_mla_geometry_and_its_rotary_width() -> None:
    g = _library("deepseek-ai/DeepSeek-V3").geometry
    assert g.mla is not None
    assert (g.mla.q_lora_rank, g.mla.kv_lora_rank, g.mla.qk_nope_head_dim, g.mla.qk_rope_head_dim,
            g.mla.v_head_dim) == (1536, 512, 128, 64, 128)
    assert g.rotary_dim == 64  # MLA rotates only the qk_rope part
    assert g.moe is not None
    # 61 layers, the first 3 dense (first_k_dense_replace): 58 MoE layers of 256 experts, 8 per token.
    assert (len(g.moe.layers), g.moe.layers[0], g.moe.num_experts, g.moe.experts_per_token) == (58, 3, 256, 8)
    assert (g.moe.expert_intermediate_size, g.moe.shared_experts) == (2048, 1)


def test_class_default_experts_do_not_make_a_dense_hybrid_moe() -> None:
    # Nemotron-H-56B's pattern has no 'E' layer; NemotronHConfig's defaults still name 8 routed experts.
    dense = _library("nvidia/Nemotron-H-56B-Base-8K")
    assert dense.geometry.moe is None
    assert moe_workspace_bytes(dense, dtype="bfloat16", tp=1, max_num_batched_tokens=8192) == 0
    nano = _library("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert nano.geometry.moe is not None and len(nano.geometry.moe.layers) == 23  # the 'E's of its pattern
    # 8,192 tokens x 6 experts each = 49,152 rows x (max(1856, 2688) + max(2 x 1856, 2688)) x 2 B
    # = 49,152 x 6,400 x 2 = 629,145,600 B.
    assert moe_workspace_bytes(nano, dtype="bfloat16", tp=1, max_num_batched_tokens=8192) == 629_145_600


@pytest.mark.parametrize("entry", library.entries(), ids=lambda e: e.repo_id)
def test_every_attention_spec_is_the_geometry_of_its_layer(entry: library.LibraryEntry) -> None:
    model = _library(entry.repo_id)
    g = model.geometry
    assert g.num_layers == model.num_layers and g.layer_kinds == tuple(s.kind for s in model.layers)
    for i, spec in enumerate(model.layers):
        if isinstance(spec, AttentionSpec):  # full, sliding and chunked layers
            assert (spec.num_kv_heads, spec.head_dim, spec.v_dim) == (g.kv_heads[i], g.head_dims[i], g.v_dim(i))


def gemma4_style(**overrides: object) -> dict:
    """gemma-4-26B-A4B's attention, 6 layers: 5 sliding (8 KV heads of 256, window 1,024) then 1 global
    (global_head_dim 512, num_global_key_value_heads 2, attention_k_eq_v: V is the K projection). Dense MLP
    only, to keep the weight count plain."""
    cfg = {
        "model_type": "gemma4_text", "hidden_size": 2816, "num_hidden_layers": 6, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
        "attention_k_eq_v": True, "sliding_window": 1024, "intermediate_size": 2112, "vocab_size": 262144,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_gemma4_global_layers_have_their_own_heads_in_the_cache():
    m = _parse(gemma4_style())
    sliding, glob = m.layers[0], m.layers[5]
    assert isinstance(sliding, AttentionSpec) and isinstance(glob, AttentionSpec)
    assert (sliding.num_kv_heads, sliding.head_dim, sliding.v_dim) == (8, 256, 256)
    assert (glob.num_kv_heads, glob.head_dim, glob.v_dim) == (2, 512, 512)
    # bf16 bytes per token: sliding 8 x (256 + 256) x 2 = 8,192; global 2 x (512 + 512) x 2 = 4,096. K = V
    # shares the projection, not the cache: vLLM stores V after its own norm.
    assert sliding.kv_bytes_per_token(BFLOAT16, 1) == 8_192
    assert glob.kv_bytes_per_token(BFLOAT16, 1) == 4_096


def test_gemma4_global_layers_count_no_v_proj():
    # Attention weights: sliding q 2816 x 16 x 256 + k and v 2816 x 8 x 256 each + o 16 x 256 x 2816
    # = 11,534,336 + 2 x 5,767,168 + 11,534,336 = 34,603,008 per layer, x 5 = 173,015,040; global
    # q 2816 x 16 x 512 = 23,068,672 + k 2816 x 2 x 512 = 2,883,584 (no v_proj) + o 23,068,672
    # = 49,020,928. Total 222,035,968.
    assert _group(_parse(gemma4_style()), "attention") == 222_035_968
    # Without attention_k_eq_v the global layers keep num_key_value_heads (8 of 512) and a v_proj:
    # q 23,068,672 + k and v 2816 x 8 x 512 = 11,534,336 each + o 23,068,672 = 69,206,016.
    assert _group(_parse(gemma4_style(attention_k_eq_v=False)), "attention") == 173_015_040 + 69_206_016


GEMMA4_VISION = {
    "model_type": "gemma4_vision", "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 72, "patch_size": 16,
    "position_embedding_size": 10240, "attention_bias": False,
}


def test_gemma4_moe_layers_keep_their_dense_mlp_and_the_vision_tower_is_sized():
    text = gemma4_style(num_experts=128, top_k_experts=8, moe_intermediate_size=704, enable_moe_block=True)
    m = _parse({"model_type": "gemma4", "text_config": text, "vision_config": GEMMA4_VISION,
                "tie_word_embeddings": True})
    # Dense MLP beside the experts, every layer: 6 x 3 x 2,816 x 2,112 = 107,053,056.
    assert _group(m, "mlp") == 107_053_056
    # Routed experts: 6 x 128 x 3 x 2,816 x 704 = 4,567,597,056.
    assert _group(m, "experts") == 4_567_597_056
    # Vision: patch 3 x 16 x 16 x 1,152 = 884,736; positions 2 x 10,240 x 1,152 = 23,592,960; per layer
    # q, k, v, o 4 x 1,152^2 = 5,308,416 and gate, up, down 3 x 1,152 x 4,304 = 14,874,624, x 27 =
    # 544,942,080; norms 27 x (4 x 1,152 + 2 x 72) = 128,304; projector 1,152 x 2,816 = 3,244,032.
    assert _group(m, "vision") + _group(m, "vision_unquantized") == 572_792_112
    assert not any("vision tower" in note for note in m.notes)
