"""kvplan's parameter count equals, exactly, the model Transformers builds from the same config.

For every bundled model, build the Transformers class on the meta device (no memory, no weights) and count
unique parameters (tied embeddings count once). Multimodal configs build the full ForConditionalGeneration
model, vision tower included, because the tower's weights are loaded and count toward weight memory.
Never trust_remote_code: a model whose class Transformers lacks is skipped with the reason.

Runtime, measured on 2 CPU cores: after the first build (~2.8 s, Transformers' lazy imports) every build takes
under 0.4 s, Kimi-K2's 1.03e12 parameters included (Transformers 5 fuses each layer's experts into 3-D tensors,
so the object graph has 61 x 3 expert tensors, not 61 x 384 x 3 modules); the whole file runs in ~15 s, so no
model needs its layer count reduced.

Deliberate differences, recorded here and covered by the equality (both sides agree):
- DeepSeek-V3/R1 and Kimi-K2 configs have num_nextn_predict_layers = 1: a multi-token-prediction layer stored
  in the checkpoint that Transformers does not build and vLLM loads only for speculative decoding. kvplan
  leaves it out too (the planner sizes what serving loads).
- The routers' e_score_correction_bias (DeepSeek-V3, Nemotron-3-Nano) is a buffer, not a parameter, in
  Transformers; kvplan does not count it either (58 x 256 fp32 values in DeepSeek-V3: 59 KiB).
"""

from __future__ import annotations

import json
import warnings

import pytest

from kvplan.model.parse import parse_config
from kvplan.sources import library

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Configs whose model_type Transformers does not register but whose `architectures` names a class it ships:
# build that class with its own config class (no remote code runs).
_BY_ARCHITECTURE = {"kimi_k2": "deepseek_v3"}

# Not compared, with the reason; test_remote_code_configs_are_refused checks Transformers still refuses them,
# so the exclusion is dropped (and the model compared) the day it stops being true.
REMOTE_CODE = {
    "tiiuae/falcon-7b": "model_type RefinedWebModel / RWForCausalLM is remote code; the same weights under the "
    "native falcon config (tiiuae/falcon-7b-instruct) are compared instead",
}

# Multimodal models whose towers kvplan does not size (it says so in the model's notes): compare the text model.
_TEXT_ONLY = {
    "gemma3n": "Gemma 3n's MobileNetV5 vision tower (timm) and audio encoder are not sized by kvplan",
}


def _entries():
    return [pytest.param(e, id=e.repo_id) for e in library.entries() if e.repo_id not in REMOTE_CODE]


def _build_count(raw: dict) -> int:
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    model_type = raw.get("model_type")
    mapping = transformers.CONFIG_MAPPING
    auto = transformers.AutoModelForCausalLM
    if model_type in _TEXT_ONLY:
        text = dict(raw["text_config"])
        cfg = mapping[text.get("model_type") or f"{model_type}_text"].from_dict(text)
    elif model_type in _BY_ARCHITECTURE:
        body = {k: v for k, v in raw.items() if k not in ("model_type", "auto_map")}
        cfg = mapping[_BY_ARCHITECTURE[model_type]].from_dict(body)
    else:
        if model_type not in mapping:
            raise ValueError(f"Transformers has no class for model_type {model_type!r}")
        cfg = transformers.AutoConfig.for_model(**raw)
        if "vision_config" in raw:
            auto = transformers.AutoModelForImageTextToText
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = auto.from_config(cfg)
    # parameters() yields each Parameter once, so tied embeddings count once.
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("entry", _entries())
def test_param_count_equals_transformers_meta_build(entry: library.LibraryEntry) -> None:
    raw = entry.read_config()
    spec = parse_config(raw, name=entry.repo_id, source=entry.filename, hf_quant_config=entry.read_hf_quant_config())
    expected = _build_count(json.loads(json.dumps(raw)))
    assert spec.num_params == expected, (spec.num_params - expected, [(g.name, g.params) for g in spec.param_groups])


@pytest.mark.parametrize(
    "model_type, kwargs",
    [
        # Architectures the library may not hold yet, at Transformers' documented defaults (layer counts cut so
        # every kind of layer still occurs: Jamba's attention sits at layer 4 of each period of 8).
        ("jamba", {"num_hidden_layers": 8}),
        ("granitemoehybrid", {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}),
        ("gemma3n_text", {}),
        ("qwen3_next", {"num_hidden_layers": 8}),
        # GPT-BigCode shares GPT-2's counter: the fused c_attn is hidden + 2 x head_dim wide under multi_query
        # (one K and V head), 3 x hidden without it.
        ("gpt_bigcode", {"n_layer": 2, "multi_query": True}),
        ("gpt_bigcode", {"n_layer": 2, "multi_query": False}),
    ],
)
def test_param_count_equals_transformers_at_class_defaults(model_type: str, kwargs: dict) -> None:
    cfg = transformers.CONFIG_MAPPING[model_type](**kwargs)
    raw = cfg.to_dict()
    spec = parse_config(raw, name=model_type, source="class defaults")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    assert spec.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("repo_id", sorted(REMOTE_CODE))
def test_remote_code_configs_are_refused(repo_id: str) -> None:
    entry = next(e for e in library.entries() if e.repo_id == repo_id)
    with pytest.raises(ValueError):
        _build_count(entry.read_config())


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_class_defaults_equal_transformers_and_ignore_deepstack(model_type: str) -> None:
    # Class defaults with the text model cut to one DeltaNet-and-attention period (layer_types follows
    # full_attention_interval) and a 4-block tower. deepstack_visual_indexes is set on purpose: Qwen3.5's
    # tower, unlike Qwen3-VL's, builds no deepstack mergers from it, and kvplan must not count any.
    cfg = transformers.CONFIG_MAPPING[model_type](
        text_config={"num_hidden_layers": 4, "layer_types": None},
        vision_config={"depth": 4, "deepstack_visual_indexes": [1, 3]},
    )
    spec = parse_config(cfg.to_dict(), name=model_type, source="class defaults")
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    assert spec.num_params == sum(p.numel() for p in model.parameters())


def test_mtp_blocks_are_counted_apart_from_the_model() -> None:
    # Transformers builds no MTP block, so these are by hand. DeepSeek-V3's (num_nextn_predict_layers 1): MLA
    # q_a 7,168 x 1,536 + q_b 1,536 x 128 x 192 + kv_a 7,168 x 576 + kv_b 512 x 128 x 256 + o 16,384 x 7,168 =
    # 187,105,280; 256 experts x 3 x 7,168 x 2,048 = 11,274,289,152; the shared expert 44,040,192; the router
    # 1,835,008; eh_proj 2 x 7,168 x 7,168 = 102,760,448; norms 1,536 + 512 + 5 x 7,168 = 37,888.
    v3 = parse_config(library.require("deepseek-ai/DeepSeek-V3").read_config(), name="v3", source="library")
    assert v3.mtp is not None and v3.mtp.num_params == (187_105_280 + 11_274_289_152 + 44_040_192 + 1_835_008
                                                       + 102_760_448 + 37_888) == 11_610_067_968
    # Qwen3.6-27B's (mtp_num_hidden_layers 1): gated q 5,120 x 12,288, k and v 5,120 x 1,024 each, o 6,144 x
    # 5,120 = 104,857,600; the MLP 3 x 5,120 x 17,408 = 267,386,880; fc 2 x 5,120 x 5,120 = 52,428,800; norms
    # 2 x 256 + 2 x 5,120 + 3 x 5,120 = 26,112. The model's own count is unchanged by it.
    entry = library.require("nvidia/Qwen3.6-27B-NVFP4")
    q36 = parse_config(entry.read_config(), name="q36", source="library", hf_quant_config=entry.read_hf_quant_config())
    assert q36.mtp is not None and q36.mtp.num_params == 424_699_392 and q36.num_params == 27_356_728_560
    # Its hf_quant_config excludes mtp*: the block stays bf16.
    assert not any(g.quantizable for g in q36.mtp.param_groups)
