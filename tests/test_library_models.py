"""Every bundled model: KV bytes per token at its served dtype and parameter count, pinned.

KV bytes per token (all layers, tp=1, the dtype `--kv-cache-dtype auto` serves: bf16 for bf16 and float32
configs, fp16 for fp16) = layers_with_KV x 2 (K and V) x KV heads x head_dim x 2 B for attention, and
layers x (kv_lora_rank + qk_rope_head_dim) x 2 B for MLA (one latent, no K/V factor). Mamba / linear-attention
layers add no per-token bytes (their constant state is tested in test_parse.py). Each row's comment gives the
derivation with the config's numbers.

Parameter counts equal the model Transformers 5.24 builds from the same config (tests/test_params_transformers.py
checks that live when transformers is installed; here they are pinned so the suite checks them without it).
Worked by hand for one of them (test_llama_2_7b_param_count_by_hand), and one note:
- Llama-2-7B: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms) + 4096 final norm
  + 2 x 32000 x 4096 (untied embeddings and head) = 6_738_415_616.
- DeepSeek-V3 is pinned at Transformers' 671_026_404_352: without the multi-token-prediction layer that neither
  Transformers nor vLLM (outside speculative decoding) loads; see test_params_transformers.py.
"""

from __future__ import annotations

import pytest

from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.parse import parse_config
from kvplan.sources import library

PINS = [
    # 80 x 2 x 8 x 128 x 2 B (AWQ int4 weights, float16 model dtype: fp16 KV)
    ("PatronusAI/Llama-3.1-70B-Instruct-AWQ-INT4", 327_680, 70_553_706_496),
    # 60 layers x (K+V) x 8 KV heads x 128 x 2 B
    ("01-ai/Yi-34B", 245_760, 34_388_917_248),
    # 48 x 2 x 8 x 128 x 2 B
    ("codellama/CodeLlama-34b-Instruct-hf", 196_608, 33_743_970_304),
    # 32 x 2 x 32 x 128 x 2 B (config float32, served bf16)
    ("codellama/CodeLlama-7b-hf", 524_288, 6_738_546_688),
    # MLA: 61 x (kv_lora_rank 512 + rope 64) x 2 B, no K/V factor
    ("deepseek-ai/DeepSeek-R1", 70_272, 671_026_404_352),
    # 27 x (512 + 64) x 2 B
    ("deepseek-ai/DeepSeek-V2-Lite", 31_104, 15_706_484_224),
    # 61 x (512 + 64) x 2 B
    ("deepseek-ai/DeepSeek-V3", 70_272, 671_026_404_352),
    # bf16 latents of 512 x 2 B: 2 window-only layers at 1,024 B a token; 21 ratio-4 layers at cdiv(1,024 + 128
    # x 2, 4) = 320; 20 ratio-128 layers at cdiv(1,024, 128) = 8: 2,048 + 6,720 + 160. Parameters: the layers'
    # (hyper-connections and MXFP4 experts included, tests/test_parse.py; the hash table and router bias are
    # buffers) and 2 x 129,280 x 4,096 for the untied embedding and head; Transformers 5.24 counts the same
    # (tests/test_params_transformers.py).
    ("deepseek-ai/DeepSeek-V4-Flash", 8_928, 284_332_230_231),
    # No window-only layer: 30 ratio-4 layers at 320 B and 31 ratio-128 layers at 8 B, 9,600 + 248. Its
    # parameters are counted as Flash's; Transformers 5.24 counts the same (tests/test_params_transformers.py).
    ("deepseek-ai/DeepSeek-V4-Pro", 9_848, 1_572_997_179_491),
    # 12 x 2 x 12 heads x 64 x 2 B (MHA)
    ("facebook/opt-125m", 36_864, 125_239_296),
    # 32 x 2 x 32 x 128 x 2 B
    ("facebook/opt-6.7b", 524_288, 6_658_473_984),
    # 46 x 2 x 16 x 128 x 2 B (23 of them sliding, 4096-token window)
    ("google/gemma-2-27b-it", 376_832, 27_227_128_320),
    # 42 x 2 x 8 x 256 x 2 B
    ("google/gemma-2-9b-it", 344_064, 9_241_705_984),
    # 62 x 2 x 16 x 128 x 2 B (52 sliding, window 1024)
    ("google/gemma-3-27b-it", 507_904, 27_432_406_640),
    # Gemma 3n (Transformers' class defaults, E4B-shaped): 35 layers, the last 15 reuse earlier KV, so
    # 20 x 2 x 2 KV heads x 256 x 2 B; text model only (its vision and audio towers are not sized)
    ("transformers/gemma-3n-class-defaults", 40_960, 6_835_235_568),
    # Gemma 4: 25 sliding x 2 x 8 x 256 x 2 B + 5 global x 2 x 2 x 512 x 2 B (attention_k_eq_v: no v_proj,
    # but V is cached) = 204,800 + 20,480; vision tower included (572,792,112 parameters)
    ("google/gemma-4-26B-A4B", 225_280, 25_805_933_872),
    # 34 x 2 x 4 x 256 x 2 B (text_config defaults: 4 KV heads, head_dim 256)
    ("google/gemma-3-4b-it", 139_264, 4_300_079_472),
    # 40 x 2 x 8 x (2048/32 = 64) x 2 B
    ("ibm-granite/granite-3.1-2b-instruct", 81_920, 2_533_531_648),
    # 40 x 2 x 8 x (4096/32) x 2 B
    ("ibm-granite/granite-3.1-8b-instruct", 163_840, 8_170_848_256),
    # 40 x 2 x 40 x 128 x 2 B (MHA, fp16)
    ("meta-llama/Llama-2-13b-hf", 819_200, 13_015_864_320),
    # 80 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-2-70b-hf", 327_680, 68_976_648_192),
    # 32 x 2 x 32 x 128 x 2 B: the textbook 512 KiB/token
    ("meta-llama/Llama-2-7b-hf", 524_288, 6_738_415_616),
    # 80 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-3.1-70B-Instruct", 327_680, 70_553_706_496),
    # 32 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-3.1-8B-Instruct", 131_072, 8_030_261_248),
    # 16 x 2 x 8 x head_dim 64 x 2 B
    ("meta-llama/Llama-3.2-1B-Instruct", 32_768, 1_235_814_400),
    # 28 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-3.2-3B", 114_688, 3_212_749_824),
    # 28 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-3.2-3B-Instruct", 114_688, 3_212_749_824),
    # 80 x 2 x 8 x 128 x 2 B
    ("meta-llama/Llama-3.3-70B-Instruct", 327_680, 70_553_706_496),
    # 48 x 2 x 8 x 128 x 2 B (36 chunked, 8192-token chunks)
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 196_608, 108_641_793_536),
    # 126 x 2 x 8 x 128 x 2 B
    ("meta-llama/Meta-Llama-3.1-405B", 516_096, 405_853_388_800),
    # 80 x 2 x 8 x 128 x 2 B
    ("meta-llama/Meta-Llama-3.1-70B", 327_680, 70_553_706_496),
    # 32 x 2 x 8 x 128 x 2 B
    ("meta-llama/Meta-Llama-3.1-8B", 131_072, 8_030_261_248),
    # 32 x 2 x 32 x (2560/32 = 80) x 2 B
    ("microsoft/phi-2", 327_680, 2_779_683_840),
    # 32 x 2 x 32 x (3072/32 = 96) x 2 B (sliding window 2047)
    ("microsoft/Phi-3-mini-4k-instruct", 393_216, 3_821_079_552),
    # 40 x 2 x 10 x (5120/40) x 2 B
    ("microsoft/phi-4", 204_800, 14_659_507_200),
    # 32 x 2 x 8 x 128 x 2 B
    ("mistralai/Mistral-7B-Instruct-v0.3", 131_072, 7_248_023_552),
    # 32 x 2 x 8 x 128 x 2 B (window 4096)
    ("mistralai/Mistral-7B-v0.1", 131_072, 7_241_732_096),
    # 40 x 2 x 8 x head_dim 128 (not 5120/32) x 2 B
    ("mistralai/Mistral-Nemo-Instruct-2407", 163_840, 12_247_782_400),
    # 56 x 2 x 8 x 128 x 2 B
    ("mistralai/Mixtral-8x22B-Instruct-v0.1", 229_376, 140_630_071_296),
    # 56 x 2 x 8 x 128 x 2 B
    ("mistralai/Mixtral-8x22B-v0.1", 229_376, 140_620_634_112),
    # 32 x 2 x 8 x 128 x 2 B
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", 131_072, 46_702_792_704),
    # 32 x 2 x 8 x 128 x 2 B
    ("mistralai/Mixtral-8x7B-v0.1", 131_072, 46_702_792_704),
    # MLA 61 x (512 + 64) x 2 B
    ("moonshotai/Kimi-K2-Instruct", 70_272, 1_026_408_209_408),
    # 80 x 2 x 8 x 128 x 2 B (KV at the bf16 model dtype)
    ("nvidia/Llama-3.1-70B-Instruct-FP8", 327_680, 70_553_706_496),
    # only the 10 attention layers: 10 x 2 x 8 x 128 x 2 B
    ("nvidia/Nemotron-H-56B-Base-8K", 40_960, 56_324_350_464),
    # only the 6 attention layers: 6 x 2 x 2 x 128 x 2 B
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 6_144, 31_577_937_344),
    # only the 16 full-attention layers (every 4th): 16 x 2 x 4 x 256 x 2 B; 27.36B with the vision tower
    ("nvidia/Qwen3.6-27B-NVFP4", 65_536, 27_356_728_560),
    # only the 10 full-attention layers: 10 x 2 x 2 x 256 x 2 B
    ("nvidia/Qwen3.6-35B-A3B-NVFP4", 20_480, 35_107_181_936),
    # 48 x 2 x 25 x (1600/25 = 64) x 2 B (float32 config served bf16)
    ("openai-community/gpt2-xl", 307_200, 1_557_611_200),
    # 36 x 2 x 8 x 64 x 2 B (18 sliding, window 128)
    ("openai/gpt-oss-120b", 73_728, 116_829_156_672),
    # 24 x 2 x 8 x 64 x 2 B
    ("openai/gpt-oss-20b", 49_152, 20_914_757_184),
    # 24 x 2 x 2 x (896/14 = 64) x 2 B
    ("Qwen/Qwen2.5-0.5B", 12_288, 494_032_768),
    # 28 x 2 x 2 x (1536/12) x 2 B
    ("Qwen/Qwen2.5-1.5B-Instruct", 28_672, 1_543_714_304),
    # 48 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen2.5-14B", 196_608, 14_770_033_664),
    # 64 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen2.5-32B", 262_144, 32_763_876_352),
    # 36 x 2 x 2 x 128 x 2 B
    ("Qwen/Qwen2.5-3B-Instruct", 36_864, 3_085_938_688),
    # 28 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen2.5-7B-Instruct", 57_344, 7_615_616_512),
    # 28 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen2.5-VL-7B-Instruct", 57_344, 8_292_166_656),
    # 28 x 2 x 8 x head_dim 128 x 2 B
    ("Qwen/Qwen3-0.6B", 114_688, 596_049_920),
    # 28 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-1.7B", 114_688, 1_720_574_976),
    # 40 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-14B", 163_840, 14_768_307_200),
    # 94 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen3-235B-A22B", 192_512, 235_093_634_560),
    # 94 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen3-235B-A22B-FP8", 192_512, 235_093_634_560),
    # 48 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen3-30B-A3B", 98_304, 30_532_122_624),
    # 48 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen3-30B-A3B-FP8", 98_304, 30_532_122_624),
    # 64 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-32B", 262_144, 32_762_123_264),
    # 64 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-32B-FP8", 262_144, 32_762_123_264),
    # 36 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-8B", 147_456, 8_190_735_360),
    # 48 x 2 x 4 x 128 x 2 B
    ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 98_304, 30_532_122_624),
    # 62 x 2 x 8 x 128 x 2 B
    ("Qwen/Qwen3-Coder-480B-A35B-Instruct", 253_952, 480_154_875_392),
    # only the 12 full-attention layers (every 4th): 12 x 2 x 2 x 256 x 2 B
    ("Qwen/Qwen3-Next-80B-A3B-Thinking", 24_576, 79_674_391_296),
    # 48 x 2 x 8 x 128 x 2 B
    ("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic", 196_608, 108_641_793_536),
    # MQA: 32 x 2 x 1 x (4544/71 = 64) x 2 B
    ("tiiuae/falcon-7b", 8_192, 6_921_720_704),
    # 32 x 2 x 1 x 64 x 2 B
    ("tiiuae/falcon-7b-instruct", 8_192, 6_921_720_704),
]


def _parse(repo_id: str):
    entry = library.require(repo_id)
    return parse_config(
        entry.read_config(), name=repo_id, source=entry.filename, hf_quant_config=entry.read_hf_quant_config()
    )


@pytest.mark.parametrize("repo_id, kv_bytes_per_token, num_params", PINS, ids=[p[0] for p in PINS])
def test_library_model_kv_bytes_and_params(repo_id: str, kv_bytes_per_token: int, num_params: int) -> None:
    model = _parse(repo_id)
    kv = resolve_kv_dtype("auto", serving_dtype(model.config_dtype))
    assert sum(spec.kv_bytes_per_token(kv) for spec in model.layers) == kv_bytes_per_token
    assert model.num_params == num_params


def test_every_library_model_is_pinned() -> None:
    # A config added to model_configs/ needs its row above (with the derivation).
    assert sorted(e.repo_id for e in library.entries()) == sorted(p[0] for p in PINS)


def test_llama_2_7b_param_count_by_hand() -> None:
    hidden, inter, layers, vocab = 4096, 11008, 32, 32000
    by_hand = layers * (4 * hidden**2 + 3 * hidden * inter + 2 * hidden) + hidden + 2 * vocab * hidden
    assert by_hand == 6_738_415_616
    assert _parse("meta-llama/Llama-2-7b-hf").num_params == by_hand
