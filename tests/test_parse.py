"""Config -> per-layer specs: every library config, hybrids, shared KV, per-layer differences, and the errors."""

from __future__ import annotations

import copy

import pytest

from kvplan.errors import ConfigError
from kvplan.model.dtypes import BFLOAT16, FLOAT16
from kvplan.model.kinds import LayerKind
from kvplan.model.parse import parse_config
from kvplan.model.quant import group_weight_bytes
from kvplan.model.specs import FullAttentionSpec, MambaSpec, MLASpec, SharedKVSpec, SlidingWindowSpec
from kvplan.sources import library
from tests.factories import llama_config


def _parse(raw: dict):
    return parse_config(raw, name="t", source="test")


def _library(repo_id: str):
    entry = library.require(repo_id)
    return parse_config(entry.read_config(), name=repo_id, source=entry.filename,
                        hf_quant_config=entry.read_hf_quant_config())


def _kv_per_token(model, kv=BFLOAT16) -> int:
    return sum(spec.kv_bytes_per_token(kv) for spec in model.layers)


def _state(model) -> int:
    return sum(spec.state_bytes() for spec in model.layers)


@pytest.mark.parametrize("entry", library.entries(), ids=lambda e: e.repo_id)
def test_every_library_config_parses_into_one_spec_per_layer(entry: library.LibraryEntry) -> None:
    raw = entry.read_config()
    model = parse_config(raw, name=entry.repo_id, source=entry.filename, hf_quant_config=entry.read_hf_quant_config())
    text = raw.get("text_config", raw)
    declared = text.get("num_hidden_layers", text.get("n_layer", raw.get("n_layers")))
    if declared is not None:
        assert model.num_layers == declared
    assert model.num_params > 0
    assert any(spec.has_cache for spec in model.layers)


# ---- hybrids: attention KV only on attention layers, plus a constant state per request -----------------------

def test_qwen3_next_counts_kv_on_full_attention_layers_and_deltanet_state_from_shapes() -> None:
    model = _library("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert model.layer_kinds() == {"linear_attention": 36, "full_attention": 12}
    # 12 full-attention layers (every 4th of 48) x 2 x 2 KV heads x head_dim 256 x 2 B.
    assert _kv_per_token(model) == 12 * 2 * 2 * 256 * 2 == 24_576
    # Gated DeltaNet state per layer: conv (2*16*128 + 32*128 = 8192 channels, kernel 4 - 1) + recurrent
    # (32 value heads, 128, 128), bf16: (8192*3 + 32*128*128) * 2 B = 1,097,728 B; 36 layers.
    assert _state(model) == 36 * (8192 * 3 + 32 * 128 * 128) * 2 == 39_518_208


def test_nemotron_h_counts_kv_on_attention_layers_and_mamba2_state_from_shapes() -> None:
    model = _library("nvidia/Nemotron-H-56B-Base-8K")
    assert model.layer_kinds() == {"mamba": 54, "none": 54, "full_attention": 10}
    assert _kv_per_token(model) == 10 * 2 * 8 * 128 * 2
    # Mamba2 per layer: conv (256*64 + 2*8*256 = 20480, 4 - 1) and ssm (256 heads, 64, 256), both bf16
    # (mamba_ssm_cache_dtype absent: the model dtype): (20480*3 + 256*64*256) * 2 B = 8,511,488 B; 54 layers.
    assert _state(model) == 54 * (20480 * 3 + 256 * 64 * 256) * 2 == 459_620_352


def test_nemotron_nano_ssm_state_uses_its_float32_cache_dtype() -> None:
    model = _library("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    # conv (64*64 + 2*8*128 = 6144, 3) bf16 + ssm (64, 64, 128) fp32 (mamba_ssm_cache_dtype float32), 23 layers.
    assert _state(model) == 23 * (6144 * 3 * 2 + 64 * 64 * 128 * 4)


def jamba_config(**overrides) -> dict:
    """Jamba-v0.1's shape (Transformers' JambaConfig defaults) cut to 8 layers: one attention layer (4)."""
    cfg = {
        "model_type": "jamba", "architectures": ["JambaForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32, "num_key_value_heads": 8,
        "attn_layer_period": 8, "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1,
        "num_experts": 16, "mamba_expand": 2, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_dt_rank": 256,
        "vocab_size": 65536, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }
    cfg.update(overrides)
    return cfg


def test_jamba_attention_period_and_mamba1_state() -> None:
    model = _parse(jamba_config())
    assert [spec.kind for spec in model.layers] == ["mamba"] * 4 + ["full_attention"] + ["mamba"] * 3
    assert _kv_per_token(model) == 1 * 2 * 8 * 128 * 2
    # Mamba v1 (vLLM mamba1_state_shape): inner = 2 * 4096 = 8192; conv (8192, 4 - 1), ssm (8192, 16), bf16.
    per_layer = (8192 * 3 + 8192 * 16) * 2
    assert per_layer == 311_296
    assert _state(model) == 7 * per_layer
    state = model.layers[0]
    assert isinstance(state, MambaSpec) and [t.shape for t in state.tensors] == [(8192, 3), (8192, 16)]


def test_jamba_offset_beyond_period_names_the_key() -> None:
    with pytest.raises(ConfigError, match="attn_layer_offset"):
        _parse(jamba_config(attn_layer_offset=8))


def granite_hybrid_config(**overrides) -> dict:
    """A granite-4-style (granitemoehybrid) factory: 4 layers, one attention, Mamba2 elsewhere."""
    cfg = {
        "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 32, "mamba_d_head": 64,
        "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2, "num_local_experts": 0,
        "shared_intermediate_size": 1024, "vocab_size": 1000, "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    return cfg


def test_granite_hybrid_layer_types_and_mamba2_state() -> None:
    model = _parse(granite_hybrid_config())
    assert [s.kind for s in model.layers] == ["mamba", "full_attention", "mamba", "mamba"]
    assert _kv_per_token(model) == 2 * 4 * 64 * 2  # one layer x (K+V) x 4 heads x (1024/16) x 2 B
    # conv (2 * 1024 + 2*1*128 = 2304, 3) and ssm (32, 64, 128), bf16: 538,112 B per Mamba layer.
    assert _state(model) == 3 * (2304 * 3 + 32 * 64 * 128) * 2 == 1_614_336


def test_granite_hybrid_reads_the_older_layers_block_type() -> None:
    old = granite_hybrid_config()
    old["layers_block_type"] = old.pop("layer_types")
    assert _parse(old).layers == _parse(granite_hybrid_config()).layers


def test_granite_hybrid_unknown_layer_type_names_the_index() -> None:
    with pytest.raises(ConfigError, match=r"layer_types\[1\]"):
        _parse(granite_hybrid_config(layer_types=["mamba", "conv", "mamba", "mamba"]))


# ---- layers that reuse another layer's KV (Gemma 3n) --------------------------------------------------------

def gemma3n_config() -> dict:
    """Gemma-3n-shaped text_config, 10 layers: 4 local + 1 global, twice; the last 4 reuse earlier KV."""
    layer_types = (["sliding_attention"] * 4 + ["full_attention"]) * 2
    return {
        "model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"], "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3n_text", "hidden_size": 2048, "num_hidden_layers": 10,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "layer_types": layer_types,
            "sliding_window": 512, "num_kv_shared_layers": 4,
            "intermediate_size": [8192] * 5 + [16384] * 5, "vocab_size": 262400,
        },
        "vision_config": {"model_type": "gemma3n_vision"},
        "audio_config": {"model_type": "gemma3n_audio"},
    }


def test_gemma3n_shared_layers_hold_no_kv_and_point_at_their_source() -> None:
    model = _parse(gemma3n_config())
    shared = [s for s in model.layers if isinstance(s, SharedKVSpec)]
    # Layers 6, 7, 8 are local: they read layer 5 (the last local layer that owns KV); layer 9 is global: layer 4.
    assert [s.source_layer for s in shared] == [5, 5, 5, 4]
    # Own KV on layers 0-5 only: 6 x 2 x 2 heads x 256 x 2 B.
    assert _kv_per_token(model) == 6 * 2 * 2 * 256 * 2 == 12_288
    assert model.intermediate_size == 16384  # the widest per-layer MLP
    # Its MobileNet vision tower and audio encoder are not sized: said in the notes, not hidden.
    assert any("vision tower" in n for n in model.notes) and any("audio encoder" in n for n in model.notes)


def test_gemma3n_intermediate_list_of_wrong_length_names_the_key() -> None:
    raw = gemma3n_config()
    raw["text_config"]["intermediate_size"] = [8192] * 9
    with pytest.raises(ConfigError, match="intermediate_size"):
        _parse(raw)


# ---- per-layer differences -----------------------------------------------------------------------------------

def test_per_layer_kv_heads_from_a_list() -> None:
    model = _parse(llama_config(num_key_value_heads=[8] * 16 + [4] * 16))
    # fp16: 16 layers x 2 x 8 x 128 x 2 B + 16 x 2 x 4 x 128 x 2 B.
    assert _kv_per_token(model, FLOAT16) == 65_536 + 32_768
    assert {s.num_kv_heads for s in model.layers} == {8, 4}


def test_per_layer_kv_heads_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        _parse(llama_config(num_key_value_heads=[8] * 31))
    with pytest.raises(ConfigError, match=r"num_key_value_heads\[3\]"):
        _parse(llama_config(num_key_value_heads=[8, 8, 8, "x"] + [8] * 28))
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        _parse(llama_config(num_key_value_heads=[5] * 32))  # 5 does not divide 32


def test_k_and_v_of_different_widths() -> None:
    model = _parse(llama_config(head_dim=128, v_head_dim=64))
    spec = model.layers[0]
    assert isinstance(spec, FullAttentionSpec) and spec.v_dim == 64
    # 32 KV heads x (128 + 64) x 2 B per layer, 32 layers.
    assert _kv_per_token(model, FLOAT16) == 32 * 32 * (128 + 64) * 2 == 393_216
    # v_proj and o_proj shrink with V: 32 layers x 2 x 4096 x (32 x 64) fewer weights than with V at 128.
    same_width = _parse(llama_config(head_dim=128))
    assert same_width.num_params - model.num_params == 32 * 2 * 4096 * 32 * 64


def test_mla_ignores_v_head_dim_for_the_cache() -> None:
    spec = _library("deepseek-ai/DeepSeek-V3").layers[0]
    assert isinstance(spec, MLASpec) and spec.kv_bytes_per_token(BFLOAT16) == (512 + 64) * 2


# ---- contradictions name the key -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"layer_types": ["full_attention"] * 31}, "layer_types"),
        ({"num_key_value_heads": 12}, "num_key_value_heads"),
        ({"layer_types": ["sliding_attention"] * 32}, "sliding_window"),
        ({"layer_types": ["full_attention"] * 31 + ["teleport"]}, r"layer_types\[31\]"),
        ({"hidden_size": "4096"}, "hidden_size"),
        ({"num_hidden_layers": -3}, "num_hidden_layers"),
    ],
)
def test_contradictory_configs_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        _parse(llama_config(**overrides))


# ---- Gemma 3: absent fields read as the class defaults ----------------------------------------------------

def test_gemma3_absent_fields_equal_the_defaults_written_out() -> None:
    entry = library.require("google/gemma-3-4b-it")
    sparse = entry.read_config()
    full = copy.deepcopy(sparse)
    # Gemma3TextConfig / SiglipVisionConfig defaults (Transformers 5.24) for what the published config omits:
    # a 262,208-token vocabulary, 8 query and 4 KV heads of 256, 131,072 positions, tied embeddings, and
    # layer_types with every 6th layer global (sliding_window_pattern 6).
    full["text_config"].update(
        vocab_size=262_208, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        max_position_embeddings=131_072, tie_word_embeddings=True,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
    )
    full["vision_config"]["num_channels"] = 3
    a, b = _parse(sparse), _parse(full)
    assert a.layers == b.layers
    assert a.param_groups == b.param_groups
    assert (a.vocab_size, a.max_position_embeddings, a.num_attention_heads) == (262_208, 131_072, 8)
    assert (b.vocab_size, b.max_position_embeddings, b.num_attention_heads) == (262_208, 131_072, 8)
    assert sum(isinstance(s, SlidingWindowSpec) for s in a.layers) == 29
    assert any("class defaults" in n for n in a.notes)  # the sparse one says defaults were used


def test_an_unmodelled_cache_mechanism_is_refused_by_its_key() -> None:
    # DeepSeek-V3.2's DSA indexer keeps its own key cache beside the MLA cache; read with the standard decoder
    # keys its config would still produce a plan, and a wrong one.
    with pytest.raises(ConfigError, match=r"'index_topk'.*does not model"):
        parse_config(llama_config(model_type="deepseek_v32", index_topk=2048), name="t", source="test")


def test_deepseek_v4_layers_are_read_from_their_compress_ratios() -> None:
    # DeepSeek-V4-Flash: 43 layers; compress_ratios lists 44 (the MTP block's last, never read), 0 = the window
    # alone. Layers 0-1 keep the window, then ratio 4 (with the indexer's 128-wide keys) and 128 alternate.
    m = _dsv4_flash()
    ratios = [s.compress_ratio for s in m.layers]
    assert ratios[:4] == [1, 1, 4, 128] and ratios.count(4) == 21 and ratios.count(128) == 20
    assert {s.kind for s in m.layers} == {LayerKind.COMPRESSED_MLA}
    four = m.layers[2]
    assert (four.head_dim, four.rope_dim, four.window, four.index_head_dim) == (512, 64, 128, 128)
    assert m.layers[3].index_head_dim == 0  # the indexer serves ratio-4 layers only
    # Engine-neutral bytes of a request of 32,768 tokens in bf16: a window of 128 latents of 512 x 2 B, and a
    # ratio-4 layer's 8,192 entries of (512 + 128) x 2 B: 131,072 + 8,192 x 1,280 = 10,616,832 B; a ratio-128
    # layer's 256 entries of 1,024 B: 131,072 + 262,144 = 393,216 B.
    assert four.cache_bytes(BFLOAT16, 2, 32_768) == 10_616_832
    assert m.layers[3].cache_bytes(BFLOAT16, 2, 32_768) == 393_216
    assert m.layers[0].cache_bytes(BFLOAT16, 2, 32_768) == 131_072


def test_deepseek_v4_compress_ratios_must_be_ones_its_compressor_takes() -> None:
    with pytest.raises(ConfigError, match=r"compress_ratios.*0, 4 or 128"):
        parse_config({**_dsv4_flash_config(), "compress_ratios": [0, 8] * 22}, name="t", source="test")
    with pytest.raises(ConfigError, match=r"compress_ratios.*3 entries for 43 layers"):
        parse_config({**_dsv4_flash_config(), "compress_ratios": [0, 4, 128]}, name="t", source="test")


def test_deepseek_v4_weights_count_fp32_mixers_and_mxfp4_experts() -> None:
    # Per layer of DeepSeek-V4-Flash (H = 4,096, hc_mult 4): the hyper-connection mixers fn [(2 + 4) x 4,
    # 4 x 4,096] twice, their base [24] and scale [3] twice, in float32; the head's fn [4, 16,384], base [4],
    # scale [1]: 43 x 2 x (24 x 16,384 + 24 + 3) + 65,536 + 5 = 33,884,439 floats, 135,537,756 B.
    groups = {g.name: g for g in _dsv4_flash().param_groups}
    hc = groups["hyper_connections"]
    assert (hc.params, hc.elem_bytes, hc.tp) == (33_884_439, 4, "replicated")
    assert group_weight_bytes(hc, None, 2) == 135_537_756
    # Routed experts: 43 layers x 256 experts x 3 x 4,096 x 2,048 values, 4 bits each and one byte of scale per
    # 32: 277,025,390,592 x 17 / 32 = 147,169,738,752 B.
    experts = groups["experts"]
    assert experts.params == 277_025_390_592 and experts.fmt is not None and experts.fmt.method == "mxfp4"
    assert group_weight_bytes(experts, None, 2) == 147_169_738_752
    # The hash-routed first 3 layers keep an int32 [129,280, 6] table instead of the gate's bias.
    assert groups["hash_routing"].params == 3 * 129_280 * 6 and groups["hash_routing"].elem_bytes == 4


def _dsv4_flash_config() -> dict:
    return library.require("deepseek-ai/DeepSeek-V4-Flash").read_config()


def _dsv4_flash():
    return _library("deepseek-ai/DeepSeek-V4-Flash")
