"""`--kv-cache-dtype auto` on a checkpoint that quantizes its own KV cache: the dtype each engine then runs.

NVIDIA ModelOpt exports state a KV cache quantization beside the weights' (hf_quant_config.json's
"kv_cache_quant_algo", or config.json's "kv_cache_scheme"; kvplan.model.quant reads it into
QuantSpec.kv_cache_quant). Under auto, an engine that honours it stores K and V in that format instead of the
model dtype, which halves the cache's bytes for FP8: nvidia/Qwen3-8B-FP8 (36 layers, 8 KV heads of 128) keeps
36 x 8 x 128 x 2 x 1 B = 73,728 B a token, not 147,456.

- vLLM from 0.14.0 (resolve_kv_cache_dtype_string, vllm/utils/torch_utils.py): FP8 -> fp8_e4m3; from 0.20.0
  NVFP4 -> nvfp4 too. Another name, or an earlier release, keeps the model dtype (engine-rules.md 1.27).
- SGLang from 0.5.3 (ModelRunner.configure_kv_cache_dtype, sglang#10336): FP8 -> fp8_e4m3 only (2.7).
- TensorRT-LLM's PyTorch backend (KVCacheManager, tensorrt_llm/_torch/pyexecutor/resource_manager.py): the
  cache is FP8 where the checkpoint's quant config has an FP8 KV cache, NVFP4 where it has an FP4 one, else the
  model dtype (engine-rules.md part 3); its log says so ('KV cache quantization set to "auto". Using
  checkpoint KV quantization.', 1.1.0rc3 in benchmarks/logs/trtllm.jsonl).
Transformers, TGI and the generic engine keep the model dtype.
"""

from __future__ import annotations

from kvplan.engines.release import CURRENT
from kvplan.engines.sglang_releases import release_of, rules_for
from kvplan.engines.vllm_versions import rules_for as vllm_rules_for
from kvplan.model.specs import ModelSpec

# (the checkpoint's name for it, the name the engine's --kv-cache-dtype takes)
_VLLM = {"FP8": "fp8_e4m3", "NVFP4": "nvfp4"}
_TRTLLM = {"FP8": "fp8", "NVFP4": "nvfp4"}


def checkpoint_kv_dtype(model: ModelSpec, engine: str, version: str | None) -> str | None:
    """The KV dtype `engine` at `version` runs under auto for `model`, None where auto means the model dtype."""
    algo = model.quant.kv_cache_quant if model.quant is not None else None
    if algo is None:
        return None
    if engine == "vllm":
        return _VLLM.get(algo) if algo in vllm_rules_for(version or CURRENT).checkpoint_kv else None
    if engine == "sglang":
        return "fp8_e4m3" if algo == "FP8" and rules_for(release_of(version or CURRENT)).checkpoint_kv_fp8 else None
    if engine == "trtllm":
        return _TRTLLM.get(algo)
    return None


def auto_note(model: ModelSpec, engine_label: str, picked: str) -> str:
    """The plan's note on the substitution, for people."""
    algo = model.quant.kv_cache_quant if model.quant is not None else None
    return f"--kv-cache-dtype auto runs {picked}: {engine_label} follows the checkpoint's ModelOpt KV cache ({algo})"
