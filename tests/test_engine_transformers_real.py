"""kvplan's Transformers cache bytes against transformers itself, for every bundled model it can build.

Each model is built from its bundled config on the meta device (no weights, no download, never
trust_remote_code) and a real prefill of 2 x 5,000 tokens runs through a DynamicCache; meta tensors carry
shapes and dtypes, so the bytes the cache holds are exact. The configs are reduced so that the forward stays
cheap while every cache mechanism still shows, and kvplan parses the SAME reduced config (like for like):
- at most 12 layers: every alternation pattern in the library fits (Gemma 3's 5:1, Llama 4's 3 chunked : 1
  global, Nemotron-H's Mamba/MLP/attention mix, Qwen3-Next's 3 DeltaNet : 1 attention);
- Gemma 3n's KV-shared tail is scaled with the layer count (15 of 35 -> 5 of 12), so shared layers remain;
- Llama 4's attention_chunk_size is cut to 4,096, so that 5,000 tokens pass a chunk as they pass Gemma 2's
  4,096-token window (at 8,192 the chunked layers would hold every token and test nothing).
Kimi-K2's model_type kimi_k2 is remote code, but its config names DeepseekV3ForCausalLM and that code is
DeepSeek-V3's, so it is built as deepseek_v3. Models whose architecture Transformers does not ship
(falcon-7b's remote-code RefinedWebModel) are left out by name, and a test checks Transformers still refuses them.
"""

from __future__ import annotations

import copy
import json

import pytest

from kvplan.engines.transformers import hf_cache_bytes
from kvplan.model.parse import parse_config
from tests.conftest import REPO

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_LAYERS = 12
MAX_CHUNK_TOKENS = 4096
BATCH, SEQ = 2, 5000
# Remote-code model types whose code is a Transformers architecture (the config's `architectures` says which).
_SAME_CODE_AS = {"kimi_k2": "deepseek_v3"}
# Architectures Transformers does not ship (remote code): not compared; test_remote_code_is_refused keeps it true.
REMOTE_CODE = {"tiiuae__falcon-7b"}
ALL_CONFIGS = sorted(p for p in (REPO / "model_configs").glob("*.json") if p.name != "aliases.json"
                     and not p.name.endswith(".hf_quant_config.json") and not p.name.endswith(".params.json"))
CONFIGS = [p for p in ALL_CONFIGS if p.stem not in REMOTE_CODE]


def _reduce(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    cfg = raw.get("text_config", raw)
    n = cfg.get("num_hidden_layers")
    if not isinstance(n, int):
        return raw
    keep = min(n, MAX_LAYERS)
    cfg["num_hidden_layers"] = keep
    for key, value in cfg.items():  # per-layer lists: layer_types, no_rope_layers, Gemma 3n's intermediate_size
        if isinstance(value, list) and len(value) == n:
            cfg[key] = value[:keep]
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"][:keep]
    if isinstance(cfg.get("num_kv_shared_layers"), int):
        cfg["num_kv_shared_layers"] = cfg["num_kv_shared_layers"] * keep // n
    if isinstance(cfg.get("attention_chunk_size"), int):
        cfg["attention_chunk_size"] = min(cfg["attention_chunk_size"], MAX_CHUNK_TOKENS)
    raw.pop("quantization_config", None)
    return raw


def _build(raw: dict):
    """The model class Transformers maps the config to: a causal LM, else the image-text model (Qwen2.5-VL);
    where a vision or audio tower needs a library this environment lacks (Gemma 3n's timm tower), the text
    model alone, whose cache is the same."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    fields = {k: v for k, v in raw.items() if k not in ("transformers_version", "model_type", "auto_map")}
    model_type = _SAME_CODE_AS.get(raw.get("model_type"), raw.get("model_type"))
    cfg = AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        try:
            try:
                return cfg, AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
            except ValueError:
                return cfg, AutoModelForImageTextToText.from_config(cfg, dtype=torch.bfloat16)
        except ImportError:
            text = cfg.get_text_config()
            return text, AutoModelForCausalLM.from_config(text, dtype=torch.bfloat16)


def _held_bytes(cache) -> int:
    """Every distinct tensor the cache holds: K and V (DeepSeek-V4's compressing layers alias V to K),
    DeepSeek-V3.2's indexer keys, the conv / recurrent states of linear-attention layers, and DeepSeek-V4's
    compressor and indexer state."""
    tensors = {}
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None), getattr(layer, "indexer_keys", None)):
            tensors[id(t)] = t
        for states in ("conv_states", "recurrent_states", "compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv",
                       "overlap_gate"):
            tensors.update((id(t), t) for t in (getattr(layer, states, None) or {}).values())
    return sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_dynamic_cache_bytes_equal_transformers(path):
    from transformers import DynamicCache

    raw = _reduce(json.loads(path.read_text()))
    spec = parse_config(raw, name=path.stem, source=str(path))
    ours = hf_cache_bytes(spec, seq_tokens=SEQ, batch=BATCH, dtype="bfloat16").total_bytes
    cfg, model = _build(raw)
    cache = DynamicCache(config=cfg)
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
    assert ours == _held_bytes(cache)


def _small_jamba():
    from transformers import JambaConfig

    # Jamba-v0.1's layout at toy widths: attention at odd layers, Mamba (v1) elsewhere, torch scan path.
    return JambaConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
        num_experts=2, vocab_size=1000, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, use_mamba_kernels=False,
    )


def _small_granite4():
    from transformers import GraniteMoeHybridConfig

    # Granite 4's Mamba2 + attention mix at toy widths (mamba_expand x hidden = 8 heads x 64).
    return GraniteMoeHybridConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=1000, layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=64,
        mamba_expand=2, mamba_d_state=16, mamba_n_groups=1, num_local_experts=2, num_experts_per_tok=1,
    )


@pytest.mark.parametrize("make", [_small_jamba, _small_granite4], ids=["jamba", "granitemoehybrid"])
def test_hybrids_without_a_bundled_checkpoint(make):
    """Families kvplan parses but the library holds no checkpoint of, from their config classes."""
    from transformers import AutoModelForCausalLM, DynamicCache

    cfg = make()
    raw = cfg.to_dict() | {"torch_dtype": "bfloat16"}
    spec = parse_config(raw, name=cfg.model_type, source="test")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(input_ids=torch.zeros((BATCH, 300), dtype=torch.long, device="meta"), past_key_values=cache,
              use_cache=True)
    assert hf_cache_bytes(spec, seq_tokens=300, batch=BATCH, dtype="bfloat16").total_bytes == _held_bytes(cache)


@pytest.mark.parametrize("stem", sorted(REMOTE_CODE))
def test_remote_code_is_refused(stem):
    path = next(p for p in ALL_CONFIGS if p.stem == stem)
    with pytest.raises(ValueError):
        _build(_reduce(json.loads(path.read_text())))


def test_deepseek_v32_latent_and_indexer_keys():
    """DeepSeek-V3.2 (no verbatim config.json in the library): DeepSeek-V3's with the indexer keys the V3.2
    checkpoint's config adds (index_head_dim 128, index_n_heads 64, index_topk 2048)."""
    from transformers import DynamicCache

    v3 = json.loads((REPO / "model_configs" / "deepseek-ai__DeepSeek-V3.json").read_text())
    raw = _reduce(v3 | {"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"],
                        "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048})
    spec = parse_config(raw, name="deepseek_v32", source="test")
    cfg, model = _build(raw)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(input_ids=torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta"), past_key_values=cache,
              use_cache=True)
    # 12 layers x 2 requests x 5,000 tokens x (512 + 64 + 128) x 2 B = 168,960,000 B.
    assert hf_cache_bytes(spec, seq_tokens=SEQ, batch=BATCH, dtype="bfloat16").total_bytes == _held_bytes(cache)
    assert _held_bytes(cache) == 168_960_000
