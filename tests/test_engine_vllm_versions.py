"""vLLM's rules per release: version strings, one test per rule change, and what each change does to a plan."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kvplan.engines.vllm import MoeScratch, VllmFlags, fused_moe_scratch, plan_vllm, resolve_flags
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.engines.vllm_memory import CONTEXT_BYTES, NO_SPLIT, moe_workspace_bytes
from kvplan.engines.vllm_mla import mla_kept_bytes
from kvplan.engines.vllm_versions import NEWEST, RULES, parse_release, rules_for
from kvplan.errors import FieldError
from kvplan.hardware.gpus import custom_gpu, find_gpu
from kvplan.model.kinds import LayerKind
from kvplan.model.specs import QuantSpec
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB
from tests.conftest import run_cli

H100, L4, A100 = find_gpu("H100"), find_gpu("L4"), find_gpu("A100-80GB")
REPO = Path(__file__).resolve().parents[1]


def _model(name: str):
    return resolve_model(name, offline=True).model


LLAMA = _model("meta-llama/Llama-3.1-8B-Instruct")


@pytest.mark.parametrize(("text", "release"), [
    ("0.6.0", (0, 6, 0)),
    ("0.10.1.1", (0, 10, 1)),
    ("0.6.3.post1", (0, 6, 3)),
    ("0.16.1rc1.dev206+g097eb544e", (0, 16, 1)),
    ("0.13.0+faa43dbf.nv26.01", (0, 13, 0)),
    ("v0.19.0", (0, 19, 0)),
    ("0.19", (0, 19, 0)),
    ("0.33.0", (0, 33, 0)),
    ("current", NEWEST),
])
def test_release_strings(text, release):
    assert parse_release(text) == release


@pytest.mark.parametrize("text", ["0.5.4", "0.34", "1.0.0", "banana", "0.19.x", ""])
def test_unknown_or_malformed_release_names_the_field_and_what_is_accepted(text):
    with pytest.raises(FieldError) as err:
        rules_for(text)
    assert err.value.field == "engine.version"
    assert "0.6.0 to 0.33" in err.value.problem and "current" in err.value.problem


def test_a_release_takes_the_last_change_at_or_before_it():
    assert rules_for("0.16.1rc1.dev206+g097eb544e").since == (0, 15, 0)
    assert rules_for("0.10.1.1").since == (0, 10, 1)
    assert rules_for("0.20.2").since == (0, 20, 1)  # 0.20.2 changes no rule kvplan models
    assert rules_for("0.21.1").since == (0, 21, 0)
    assert rules_for("current") == RULES[-1]


# (release before, release after, field, value before, value after): every rule change of engine-rules.md.
_KV_0_18 = ("auto", "float16", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla")
_KV_NEW_0_20 = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                "int8_per_token_head", "fp8_per_token_head", "nvfp4")

CHANGES = [
    ("0.6.2", "0.6.3", "concurrency_line", False, True),
    ("0.6.3", "0.6.4", "v0_budget", "free_drop", "absolute"),
    ("0.6.3", "0.6.4", "v1_available", False, True),
    ("0.6.4", "0.6.5", "v0_budget", "absolute", "snapshot"),
    ("0.6.4", "0.6.5", "v0_chunked_tokens", 512, 2048),
    # --block-size choices in engine/arg_utils.py (config/cache.py BlockSize later), per sdist.
    ("0.6.3", "0.6.4", "block_sizes", (8, 16, 32), (8, 16, 32, 64, 128)),
    ("0.6.4", "0.6.5", "block_sizes", (8, 16, 32, 64, 128), (8, 16, 32)),
    ("0.6.5", "0.6.6", "block_sizes", (8, 16, 32), (8, 16, 32, 64, 128)),
    ("0.8.4", "0.8.5", "block_sizes", (8, 16, 32, 64, 128), (1, 8, 16, 32, 64, 128)),
    ("0.11.0", "0.11.1", "block_sizes", (1, 8, 16, 32, 64, 128), (1, 8, 16, 32, 64, 128, 256)),
    ("0.17.1", "0.18.0", "block_sizes", (1, 8, 16, 32, 64, 128, 256), None),
    ("0.6.6", "0.7.0", "v1_batch_rule", "fixed", "name"),
    ("0.7.0", "0.7.1", "mla_latent", False, True),
    # config.py ModelConfig.use_mla: 0.7.1-0.7.2 keep MLA only for fp8 (and all-fp8 compressed-tensors groups);
    # 0.7.3 reads `is_deepseek_mla and not VLLM_MLA_DISABLE` alone. get_head_size hard-codes 256 for DeepSeek up
    # to 0.6.6 (deepseek_v3 from 0.6.6, with DeepseekV3ForCausalLM) and qk_nope + qk_rope_head_dim from 0.7.0.
    ("0.7.0", "0.7.1", "mla_quant_gate", False, True),
    ("0.7.2", "0.7.3", "mla_quant_gate", True, False),
    ("0.6.5", "0.6.6", "mla_dense_types", ("deepseek_v2",), ("deepseek_v2", "deepseek_v3")),
    ("0.6.6", "0.7.0", "mla_dense_head", 256, None),
    # attention/backends/mla/utils.py absorbs the decode matrices (0.7.1-0.7.3; fp8 dequantized by
    # scaled_dequantize in float32 until 0.7.2, by the layer's own apply in the model dtype at 0.7.3);
    # mla/common.py (0.8.0+) keeps W_UK_T and W_UV only.
    ("0.7.0", "0.7.1", "mla_weights", "none", "absorbed_fp32"),
    ("0.7.2", "0.7.3", "mla_weights", "absorbed_fp32", "absorbed"),
    ("0.7.3", "0.8.0", "mla_weights", "absorbed", "kv_b"),
    # worker/cache_engine.py CacheEngine._align_cache (use_mla, CUDA, VLLM_CUDA_MEM_ALIGN_KV_CACHE on by default):
    # present at 0.7.2 and 0.7.3, absent at 0.7.1 and 0.8.0.
    ("0.7.1", "0.7.2", "mla_page_align", False, True),
    ("0.7.3", "0.8.0", "mla_page_align", True, False),
    # model_executor/layers/fused_moe/fused_moe.py fused_experts_impl: three caches at 0.7.3, cache13 (the first
    # and third sharing one buffer) from 0.8.0; 0.14.0's UnquantizedFusedMoEMethod runs TritonExperts in the
    # workspace manager. envs.py VLLM_FUSED_MOE_CHUNK_SIZE: "32768" to 0.11.2, "16384" at 0.12.0, gone at 0.18.0.
    # fused_marlin_moe: two marlin_gemm_moe calls to 0.8.4, moe_wna16_marlin_gemm into cache13 from 0.8.5.
    ("0.7.3", "0.8.0", "moe_scratch", "three", "cache13"),
    ("0.13.0", "0.14.0", "moe_scratch", "cache13", "workspace"),
    ("0.11.2", "0.12.0", "moe_chunk_tokens", 32_768, 16_384),
    ("0.17.1", "0.18.0", "moe_chunk_tokens", 16_384, None),
    ("0.8.4", "0.8.5", "moe_marlin_old", True, False),
    # worker/worker.py raise_if_cache_size_invalid: block_size x num_gpu_blocks to 0.7.3, x (num_gpu_blocks //
    # pipeline_parallel_size) from 0.8.0 (the scheduler and cache engine split the blocks in every release).
    ("0.7.3", "0.8.0", "v0_pp_check_split", False, True),
    # engine/arg_utils.py create_engine_config, V0's automatic chunked prefill past 32K tokens: off with prefix
    # caching at 0.6.0 only, off for multimodal models from 0.6.2, off on ROCm 0.6.6-0.7.3, off with MLA in use
    # from 0.8.0 (a sliding window and LoRA keep it off in every release).
    ("0.6.0", "0.6.1", "v0_auto_chunked_excludes", ("prefix_caching",), ()),
    ("0.6.1", "0.6.2", "v0_auto_chunked_excludes", (), ("multimodal",)),
    ("0.6.5", "0.6.6", "v0_auto_chunked_excludes", ("multimodal",), ("multimodal", "rocm")),
    ("0.7.3", "0.8.0", "v0_auto_chunked_excludes", ("multimodal", "rocm"), ("multimodal", "mla")),
    # model_executor/models/config.py MambaModelConfig.verify_and_update_config: "all" where supported (0.15+),
    # "align" under a speculative config at 0.20.0-0.21.0 (gone at 0.22.0), "align" by default from 0.28.0.
    ("0.19.1", "0.20.0", "mamba_mode_default", "support", "support_unless_spec"),
    ("0.21.0", "0.22.0", "mamba_mode_default", "support_unless_spec", "support"),
    ("0.27.1", "0.28.0", "mamba_mode_default", "support", "align"),
    # v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes: "all" mode adds num_speculative_blocks from
    # 0.22.0 (not at 0.21.0); mamba_mixer2.py sets num_prefill_checkpoint_blocks=1 from 0.32.0 (not at 0.31.0).
    ("0.21.0", "0.22.0", "mamba_all_spec_pages", False, True),
    ("0.31.0", "0.32.0", "mamba2_checkpoint_page", False, True),
    # platforms/cuda.py check_and_update_config: "Forcing kv cache block size to 64 for FlashMLA backend" from
    # 0.8.0 (absent at 0.7.3), 128 for CUTLASS_MLA on SM100 by default from 0.10.2, `block_size % 64 != 0` from
    # 0.11.1; 0.18.0 drops the forcing for Platform's "Setting kv cache block size to %d for %s backend".
    ("0.7.3", "0.8.0", "mla_block_rule", "none", "flashmla"),
    ("0.10.1", "0.10.2", "mla_block_rule", "flashmla", "forced"),
    ("0.11.0", "0.11.1", "mla_block_rule", "forced", "forced_multiple"),
    ("0.17.1", "0.18.0", "mla_block_rule", "forced_multiple", "preferred"),
    # DeepSeek-V4, per sdist (tests/test_engine_vllm_dsv4.py): model_executor/models/deepseek_v4.py from 0.20.0;
    # kv_cache_utils._get_kv_cache_config_deepseek_v4 sizes the pool by layer tuples to 0.22, by page-size slots
    # (_pool_bytes_per_block) from 0.23, by the largest group (_get_packed_kv_cache_layout) from 0.27, which also
    # stops padding state pages, divides the concurrency by plain blocks and builds _mtp_hidden_buffer only with
    # a draft; _max_memory_usage_bytes_from_groups charges the largest group from 0.29; attention.py maps auto
    # to fp8 from 0.30.
    ("0.19.1", "0.20.0", "dsv4", False, True),
    ("0.22.1", "0.23.0", "dsv4_pool", "tuples", "slots"),
    ("0.26.0", "0.27.0", "dsv4_pool", "slots", "stride"),
    ("0.26.0", "0.27.0", "dsv4_state_padded", True, False),
    ("0.26.0", "0.27.0", "dsv4_weighted_concurrency", True, False),
    ("0.26.0", "0.27.0", "dsv4_mtp_buffer", True, False),
    ("0.28.0", "0.29.0", "dsv4_check", "tuples", "stride"),
    # kv_cache_utils.py: "Reserve the null block BlockPool permanently holds back, so the check plans against
    # usable blocks" from 0.29.0 (absent at 0.28.0).
    ("0.28.0", "0.29.0", "check_null_block", False, True),
    ("0.29.0", "0.30.0", "dsv4_auto_fp8", False, True),
    # nvidia/model.py: DeepseekV4FlashInferSM120Attention for SM12x from 0.24.0 (FlashMLA only before); cuda.py
    # adds FLASHINFER_MLA_SPARSE_SM120 for DeepSeek-V3.2 at 0.24.0 too.
    ("0.23.0", "0.24.0", "sparse_mla_sm120", False, True),
    # DeepSeek-V3.2 (tests/test_engine_vllm_dsa.py): config.py forces auto to fp8_ds_mla in 0.11.0 only; cuda.py
    # forces 64-token blocks to 0.17.1; FlashInfer-sparse takes plain fp8 from 0.18.0 (small head counts first)
    # and comes first for any quantized cache on SM100 from 0.19.0; indexer.py's expanded_block_table_buffer from
    # 0.17.0; index_group.py from 0.30.0.
    ("0.10.2", "0.11.0", "dsa", False, True),
    ("0.10.2", "0.11.0", "dsa_auto_fp8", False, True),
    ("0.11.0", "0.11.1", "dsa_auto_fp8", True, False),
    ("0.17.1", "0.18.0", "dsa_block_forced", True, False),
    ("0.17.1", "0.18.0", "dsa_fp8_flashinfer", "never", "small_heads"),
    ("0.18.1", "0.19.0", "dsa_fp8_flashinfer", "small_heads", "always"),
    ("0.16.0", "0.17.0", "dsa_block_table", False, True),
    ("0.29.0", "0.30.0", "dsa_index_groups", False, True),
    # The attention backend and FlashInfer's buffers (tests/test_engine_vllm_attention.py): the estimate comes off
    # the budget from 0.20 (394 MiB workspace), flashinfer.py sizes it by the prefill chunk from 0.26
    # (FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM), takes 512-wide heads from 0.22 and SM80+ only from 0.24;
    # supports_sink adds SM12x at 0.28 and SM90 at 0.30; utils/flashinfer.py supports_trtllm_attention gives SM90
    # XQA decode at 0.25 and SM12x at 0.28.
    # gpu_worker.py wraps load_model in _scoped_allocator_max_split(max_split_size_mb=20) from 0.21.0.
    ("0.20.2", "0.21.0", "load_max_split_mb", None, 20),
    ("0.19.1", "0.20.0", "flashinfer_workspace", "", "fixed"),
    ("0.25.1", "0.26.0", "flashinfer_workspace", "fixed", "step"),
    ("0.21.0", "0.22.0", "flashinfer_head_512", False, True),
    ("0.23.0", "0.24.0", "flashinfer_min_capability", (7, 5), (8, 0)),
    ("0.27.1", "0.28.0", "flashinfer_sink_majors", (10,), (10, 12)),
    ("0.29.0", "0.30.0", "flashinfer_sink_majors", (10, 12), (9, 10, 12)),
    ("0.24.0", "0.25.0", "xqa_majors", (), (9,)),
    ("0.27.1", "0.28.0", "xqa_majors", (9,), (9, 12)),
    # config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES gains DeepseekV4ForCausalLM at 0.28.0 (kept off on
    # ROCm by default_v2_model_runner_architectures; kvplan plans V4 on CUDA only).
    ("0.27.1", "0.28.0", "v2_architectures", ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"),
     ("DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM")),
    # V1's start-up lines, per sdist: v1/executor (0.6.4) then v1/core/kv_cache_utils.py print "# GPU blocks: %d",
    # with "Maximum concurrency ..." after it from 0.7.1; gpu_model_runner.load_model's weights line; gpu_worker.py
    # logs memory_profiling's result and "Available KV cache memory" from 0.9.1; format_gib from 0.14.0; Model
    # Runner V2's (v1/worker/gpu/model_runner.py) weights line gains "memory" at 0.28.0.
    ("0.7.0", "0.7.1", "v1_blocks_concurrency", False, True),
    ("0.7.3", "0.8.0", "v1_load_wording", "loading_gb", "took_gb"),
    ("0.8.2", "0.8.3", "v1_load_wording", "took_gb", "took_gib"),
    ("0.11.0", "0.11.1", "v1_load_wording", "took_gib", "took_gib_memory"),
    ("0.13.0", "0.14.0", "v1_load_wording", "took_gib_memory", "format_gib"),
    ("0.9.0", "0.9.1", "v1_profile_logged", False, True),
    ("0.27.1", "0.28.0", "v2_load_memory_word", False, True),
    ("0.7.3", "0.8.0", "default_engine", "v0", "v1"),
    ("0.7.3", "0.8.0", "sampler_warmup", False, True),
    ("0.7.3", "0.8.0", "v1_sampler", "logits", "sort"),
    ("0.7.3", "0.8.0", "image_sampler", None, "flashinfer_probs"),
    # _set_default_args_v1: 0.8.4 gives 1,024 sequences to H100/H200 only (256 elsewhere); 0.8.5 decides by memory.
    ("0.8.3", "0.8.4", "v1_batch_rule", "name", "name_seqs"),
    # v1/core/block_pool.py's null_block appears at 0.8.3.
    ("0.8.2", "0.8.3", "null_block", False, True),
    ("0.8.4", "0.8.5", "v1_batch_rule", "name_seqs", "memory"),
    ("0.8.5", "0.9.0", "v1_batch_rule", "memory", "memory_not_a100"),
    # EngineArgs.get_batch_defaults: 0.28.0 adds "if device_memory >= 160 * GiB_bytes" (B200/B300) ahead of the
    # 70 GiB test, with 16,384 tokens and 1,024 sequences for both entry points.
    ("0.27.1", "0.28.0", "v1_batch_rule", "memory_not_a100", "memory_tiers"),
    ("0.8.5", "0.9.0", "image_sampler", "flashinfer_probs", "flashinfer_logits"),
    ("0.9.0", "0.9.1", "v1_budget", "absolute", "snapshot"),
    ("0.9.0", "0.9.1", "hybrid_groups", False, True),
    ("0.9.0", "0.9.1", "v1_tokens_rule", "blocks", "blocks_per_group"),
    ("0.9.0", "0.9.1", "v1_concurrency_rule", "tokens", "blocks"),
    # vllm/inputs/registry.py call_hf_processor: `x.to(dtype=self.model_config.dtype)` for floating outputs
    # appears at 0.9.1 (absent at 0.9.0).
    ("0.9.0", "0.9.1", "pixels_in_model_dtype", False, True),
    ("0.9.0", "0.9.1", "startup_check", None, "plain"),
    ("0.9.2", "0.10.0", "capture_rule", "v1_512", "v1_2seqs"),
    ("0.9.2", "0.10.0", "kv_cache_dtypes", ("auto", "fp8", "fp8_e5m2", "fp8_e4m3"),
     ("auto", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc")),
    ("0.10.0", "0.10.1", "mxfp4", False, True),
    # CacheDType in config/cache.py: bfloat16 at 0.11.0, fp8_ds_mla at 0.11.1, float16 at 0.18.0.
    ("0.10.2", "0.11.0", "kv_cache_dtypes", ("auto", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc"),
     ("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc")),
    ("0.11.0", "0.11.1", "kv_cache_dtypes", ("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc"),
     ("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla")),
    ("0.17.1", "0.18.0", "kv_cache_dtypes",
     ("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla"),
     ("auto", "float16", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla")),
    # CacheDType at each release (config/cache.py): TurboQuant's four presets, the per-token-head int8/fp8 and
    # nvfp4 at 0.20.0, int4_per_token_head at 0.25.0, nvfp4_4over6 at 0.28.0, nvfp4_ds_mla at 0.30.0,
    # ultraquant_4bit at 0.32.0, the three octave formats at 0.33.0 (each absent the release before).
    ("0.19.1", "0.20.0", "kv_cache_dtypes", _KV_0_18, _KV_0_18 + _KV_NEW_0_20),
    ("0.24.0", "0.25.0", "kv_cache_dtypes", _KV_0_18 + _KV_NEW_0_20,
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head",)),
    ("0.27.1", "0.28.0", "kv_cache_dtypes", _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head",),
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6")),
    ("0.29.0", "0.30.0", "kv_cache_dtypes", _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6"),
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6", "nvfp4_ds_mla")),
    ("0.31.0", "0.32.0", "kv_cache_dtypes",
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6", "nvfp4_ds_mla"),
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6", "nvfp4_ds_mla", "ultraquant_4bit")),
    ("0.32.0", "0.33.0", "kv_cache_dtypes",
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6", "nvfp4_ds_mla", "ultraquant_4bit"),
     _KV_0_18 + _KV_NEW_0_20 + ("int4_per_token_head", "nvfp4_4over6", "nvfp4_ds_mla", "ultraquant_4bit",
                                "octave_k3v4", "octave_k3v3", "octave_k3v3_compact")),
    # 0.11.1: capture sizes step 16 above 256 (0.10.2 still steps 8); VLLM_USE_FLASHINFER_SAMPLER defaults to
    # None and the sampler takes FlashInfer only when it is set.
    ("0.11.0", "0.11.1", "capture_rule", "v1_2seqs", "v1_2seqs_16"),
    ("0.11.0", "0.11.1", "image_sampler", "flashinfer_logits", None),
    # CompilationConfig.cudagraph_specialize_lora (default True) and the dispatcher's lora_cases appear at 0.11.1.
    ("0.11.0", "0.11.1", "lora_graph_cases", False, True),
    # CacheConfig.mamba_cache_dtype / mamba_ssm_cache_dtype and their flags: absent from arg_utils.py at 0.10.0.
    ("0.10.0", "0.10.1", "mamba_dtype_options", False, True),
    ("0.10.1", "0.10.2", "kv_cache_memory_option", False, True),
    ("0.10.2", "0.11.0", "v0_available", True, False),
    ("0.10.2", "0.11.0", "full_graphs", False, True),
    ("0.10.2", "0.11.0", "snapshot_after_comms", False, True),
    ("0.11.0", "0.11.1", "batch_caps", False, True),
    ("0.11.0", "0.11.1", "v1_chunked_optional", False, True),
    ("0.11.2", "0.12.0", "lora_extra_vocab", 256, 0),
    # NemotronHForCausalLMConfig.update_mamba_ssm_cache_dtype appears at 0.13.0 with getattr(hf_config,
    # "mamba_ssm_cache_dtype", "float16"); 0.20.0 makes the default float32 (DEFAULT_MAMBA_SSM_CACHE_DTYPE).
    ("0.12.0", "0.13.0", "nemotron_ssm_default", None, "float16"),
    # VllmConfig._set_cudagraph_sizes: `max_num_seqs * decode_query_len * 2` appears at 0.13.0.
    ("0.12.0", "0.13.0", "capture_spec_len", False, True),
    # kv_cache_utils.py: the conserving_memory link from 0.13.0, "model's" and the CPU note from 0.22.0.
    ("0.12.0", "0.13.0", "kv_refusal_wording", "plain", "docs_link"),
    ("0.21.0", "0.22.0", "kv_refusal_wording", "docs_link", "cpu_note"),
    ("0.19.1", "0.20.0", "nemotron_ssm_default", "float16", "float32"),
    ("0.13.0", "0.14.0", "requested_ceil", False, True),
    ("0.13.0", "0.14.0", "moe_workspace_kept", False, True),
    ("0.13.0", "0.14.0", "startup_check", "plain", "device"),
    # MambaModelConfig.verify_and_update_config sets mamba_cache_mode from 0.15.0 (config/cache.py has no
    # mamba_cache_mode at 0.14.1).
    ("0.14.1", "0.15.0", "mamba_cache_modes", False, True),
    ("0.16.0", "0.17.0", "v1_sampler", "sort", "triton"),
    ("0.17.1", "0.18.0", "cudagraphs_profiled", False, True),
    ("0.19.1", "0.20.0", "default_utilization", 0.90, 0.92),
    ("0.19.1", "0.20.0", "cudagraphs_subtracted", False, True),
    ("0.20.0", "0.20.1", "v1_tokens_rule", "blocks_per_group", "concurrency"),
    # VllmConfig._set_cudagraph_sizes appends an off-stride max_num_batched_tokens from 0.20.1.
    ("0.20.0", "0.20.1", "capture_step", False, True),
    ("0.26.0", "0.27.0", "v1_budget", "snapshot", "consumed"),
    # vllm#50780: 0.25.1's GDN path leaves no warm-up transient in the FULL graph estimate, 0.26.0's does.
    ("0.25.1", "0.26.0", "gdn_graph_transient", False, True),
    # vllm#38270: 0.17-0.19 capped the FULL decode sizes to a hybrid's blocks, 0.20 raises instead.
    ("0.19.1", "0.20.0", "mamba_seqs_check", False, True),
    # vllm/config/compilation.py: 0.11.1 (torch 2.9) sets Inductor's combo_kernels and benchmark_combo_kernel
    # when the user gave neither; 0.11.0 (torch 2.8) has no such block.
    ("0.11.0", "0.11.1", "compile_clone", False, True),
    # config/vllm.py _is_default_v2_model_runner_model and DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, per sdist:
    # 0.22.0 {Qwen3ForCausalLM} when neither MoE nor quantized; 0.23.0 adds Llama and Mistral; 0.24.0 lists six
    # architectures and drops the MoE/quantized test; 0.25.0 takes every non-MoE, non-hybrid model and keeps a
    # list of MoE architectures.
    ("0.21.0", "0.22.0", "v2_runner", None, "listed"),
    ("0.21.0", "0.22.0", "v2_architectures", (), ("Qwen3ForCausalLM",)),
    ("0.21.0", "0.22.0", "v2_listed_unquantized", False, True),
    ("0.22.0", "0.23.0", "v2_architectures", ("Qwen3ForCausalLM",),
     ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM")),
    ("0.23.0", "0.24.0", "v2_architectures", ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"),
     ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
      "Qwen2MoeForCausalLM", "Qwen3ForCausalLM")),
    ("0.23.0", "0.24.0", "v2_listed_unquantized", True, False),
    ("0.24.0", "0.25.0", "v2_runner", "listed", "dense"),
    ("0.24.0", "0.25.0", "v2_architectures", ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "LlamaForCausalLM",
                                              "MistralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM"),
     ("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM")),
    # gpu/sample/sampler.py apply_sampling_params: 0.22.0-0.25.x copy the logits to float32 first; 0.26.0 works
    # on them in place; 0.27.0 copies again but returns early when no row asks for logits processing.
    ("0.21.0", "0.22.0", "v2_sampler_fp32", False, True),
    ("0.25.1", "0.26.0", "v2_sampler_fp32", True, False),
    # v1/kv_cache_interface.py: SlidingWindowSpec / ChunkedLocalAttentionSpec size with max_in_flight_tokens
    # from 0.26.0 (max_num_batched_tokens before).
    ("0.25.1", "0.26.0", "window_in_flight_batches", False, True),
    # gpu_worker.py: `not is_rocm()` (0.20), `is_cuda()` (0.21-0.25), `is_cuda_alike()` (0.26+) guard the estimate.
    ("0.25.1", "0.26.0", "cudagraphs_rocm", False, True),
    ("0.28.0", "0.29.0", "v2_runner", "dense", "all"),
    ("0.28.0", "0.29.0", "v2_cudagraphs_profiled", False, True),
    ("0.28.0", "0.29.0", "v2_sharded_sampling", False, True),
    # v1/worker/gpu_worker.py init_device: "Create the handles now, before the snapshot" at 0.33.0, not at 0.32.0.
    ("0.32.0", "0.33.0", "cublas_before_snapshot", False, True),
    ("0.27.1", "0.28.0", "blackwell_1024", False, True),
    ("0.27.1", "0.28.0", "combined_kv_line", False, True),
    # mxfp4's Triton backend on Hopper: 0.10.1 asks for torch >= 2.8 (it pins 2.7.1); 0.10.2-0.11 for the
    # optional triton_kernels package (quantization/mxfp4.py get_mxfp4_backend); 0.12 vendors it
    # (vllm/third_party/triton_kernels, utils/import_utils.py has_triton_kernels) and depends on FlashInfer.
    ("0.10.1", "0.10.2", "mxfp4_triton", "none", "package"),
    ("0.11.2", "0.12.0", "mxfp4_triton", "package", "vendored"),
    ("0.11.2", "0.12.0", "flashinfer_dependency", False, True),
    # vllm/model_executor/layers/quantization/__init__.py: "bitsandbytes" is in QuantizationMethods at 0.27.1,
    # gone at 0.28.0 (with the module bitsandbytes.py).
    ("0.27.1", "0.28.0", "bitsandbytes", True, False),
    # utils/torch_utils.py resolve_kv_cache_dtype_string (absent before 0.14.0): auto takes a ModelOpt
    # checkpoint's FP8 KV; MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP gains "nvfp4" in 0.20.0.
    ("0.13.0", "0.14.0", "checkpoint_kv", (), ("FP8",)),
    ("0.19.1", "0.20.0", "checkpoint_kv", ("FP8",), ("FP8", "NVFP4")),
    # engine/arg_utils.py: default_prefix_caching loses "and not model_config.is_hybrid" at 0.28.0.
    ("0.27.1", "0.28.0", "hybrid_prefix_caching", False, True),
    # DeepGEMM's MoE (vllm_deepgemm). Block-FP8 experts: quantization/fp8.py (0.11.0 fused_experts'
    # _valid_deep_gemm on SM90; 0.11.1 get_fp8_moe_backend; 0.12 "DeepGEMM MoE is disabled by default when TP
    # size is >= 8"), oracle/fp8.py from 0.14 (0.16: FlashInfer first; 0.17: Triton first on SM90);
    # platforms/cuda.py support_deep_gemm adds family 120 at 0.24. DeepSeek-V4: DeepGemmFP4Experts takes
    # SM12x from 0.24 (SM100 only before); 0.32 adds SM12x MXFP4 backends, not read. deep_gemm inside the
    # wheel from 0.20 (import_utils.has_deep_gemm: vllm.third_party.deep_gemm). compute_aligned_M caps the
    # padded experts at the rows from 0.24; DeepGEMM a6b593d (pinned from 0.25) shrinks SM12x blocks to 64;
    # _fp8_workspace_shape at 0.31. workspace_shapes' widths change at 0.11.1 and 0.13.0.
    ("0.10.2", "0.11.0", "deepgemm_fp8", None, "sm90_shape"),
    ("0.11.0", "0.11.1", "deepgemm_fp8", "sm90_shape", "always"),
    ("0.11.2", "0.12.0", "deepgemm_fp8", "always", "below_tp8"),
    ("0.14.1", "0.15.0", "deepgemm_fp8", "below_tp8", None),
    ("0.23.0", "0.24.0", "deepgemm_fp8", None, "sm12x"),
    ("0.23.0", "0.24.0", "deepgemm_mxfp4_sm12x", False, True),
    ("0.31.0", "0.32.0", "deepgemm_mxfp4_sm12x", True, False),
    ("0.19.1", "0.20.0", "deepgemm_vendored", False, True),
    ("0.23.0", "0.24.0", "deepgemm_rows", "uncapped", "capped"),
    ("0.24.0", "0.25.0", "deepgemm_rows", "capped", "sm120"),
    ("0.30.0", "0.31.0", "deepgemm_rows", "sm120", "sm120_fp8"),
    ("0.11.0", "0.11.1", "deepgemm_widths", "0.11.0", "0.11.1"),
    ("0.12.0", "0.13.0", "deepgemm_widths", "0.11.1", "0.13"),
]


@pytest.mark.parametrize(("before", "after", "name", "old", "new"), CHANGES)
def test_rule_change(before, after, name, old, new):
    assert getattr(rules_for(before), name) == old
    assert getattr(rules_for(after), name) == new


def test_every_change_in_the_table_is_tested():
    tested = {(parse_release(after), name) for _, after, name, _, _ in CHANGES}
    for prev, cur in zip(RULES, RULES[1:], strict=False):
        changed = {f.name for f in dataclasses.fields(cur) if f.name not in ("since", "label")
                   and getattr(cur, f.name) != getattr(prev, f.name)}
        assert changed, f"{cur.release} changes nothing"
        assert {(cur.since, n) for n in changed} <= tested, f"{cur.release}: {changed}"


# --- what the changes do to a plan ------------------------------------------------------------------------

def test_model_runner_v2_for_dense_models_from_0_25_and_every_model_from_0_29():
    # Llama-3.1-8B on an H100 at 8,192 tokens (1,024 sampler rows, 128,256 logits a row), a warm compile cache
    # (the cold one is test_cold_compile_copies_the_embedding_table_from_0_11_1). 0.22 runs V1's GPUModelRunner
    # (Llama is listed for V2 from 0.23):
    # its Triton sampler peaks at 0.023 GiB + 131,334,144 x (2 + 3.279 x 4) B = 2,009,942,982 B, above the
    # forward, and the 897,619,451 B CUDA-graph estimate comes off the budget. 0.25 runs Model Runner V2 for dense
    # models: one float32 copy, 24,696,062 + 131,334,144 x (2 + 4) = 812,700,926 B, stays under the forward's
    # 986,701,627 B, and V2 makes no graph estimate: 1,023,241,355 + 897,619,451 B more KV memory. 0.29
    # estimates graphs on V2 too, so the estimate comes off again, and its budget (0.27+) counts V2's sampler
    # state: 1,024 x (128,256 + 2 x 4,008) x 4 B = 558,170,112 B.
    plans = {v: plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=v, compile_cache="warm"), H100)
             for v in ("0.22.0", "0.25.0", "0.29.0")}
    assert [plans[v].flags.runner for v in plans] == ["v1", "v2", "v2"]
    assert [plans[v].stages[0].memory.activation_peak_bytes for v in plans] == [2_009_942_982, 986_701_627,
                                                                               986_701_627]
    kv = [plans[v].stages[0].available_kv_bytes for v in plans]
    assert kv[1] - kv[0] == 1_023_241_355 + 897_619_451 and kv[1] - kv[2] == 897_619_451 + 558_170_112
    # MoE and DeltaNet hybrids stay on V1 until 0.29 (VllmConfig._is_default_v2_model_runner_model).
    moe, hybrid = _model("Qwen/Qwen3-30B-A3B"), _model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert resolve_flags(moe, VllmFlags(version="0.28.0"), H100).runner == "v1"
    assert resolve_flags(hybrid, VllmFlags(version="0.28.0"), H100).runner == "v1"
    assert resolve_flags(moe, VllmFlags(version="0.29.0"), H100).runner == "v2"


@pytest.mark.parametrize(("name", "version", "quantization", "runner"), [
    ("Qwen/Qwen3-8B", "0.21.0", None, "v1"),  # no default V2 yet
    ("Qwen/Qwen3-8B", "0.22.0", None, "v2"),  # Qwen3ForCausalLM, dense, unquantized
    ("meta-llama/Llama-3.1-8B-Instruct", "0.22.0", None, "v1"),  # not listed until 0.23
    ("meta-llama/Llama-3.1-8B-Instruct", "0.23.0", None, "v2"),
    ("meta-llama/Llama-3.1-8B-Instruct", "0.23.0", "fp8", "v1"),  # quantized: V1 on 0.22-0.23
    ("meta-llama/Llama-3.1-8B-Instruct", "0.24.0", "fp8", "v2"),
    ("google/gemma-2-9b-it", "0.24.0", None, "v1"),  # Gemma2ForCausalLM is not listed
    ("google/gemma-2-9b-it", "0.25.0", None, "v2"),  # dense
    ("deepseek-ai/DeepSeek-V2-Lite", "0.23.0", None, "v1"),
    ("deepseek-ai/DeepSeek-V2-Lite", "0.24.0", None, "v2"),  # a listed MoE architecture
    ("deepseek-ai/DeepSeek-V2-Lite", "0.28.0", None, "v2"),
    ("Qwen/Qwen3-30B-A3B", "0.24.0", None, "v1"),  # Qwen3MoeForCausalLM is never listed
])
def test_default_runner_per_release_and_architecture(name, version, quantization, runner):
    flags = VllmFlags(version=version, max_model_len=8192, quantization=quantization)
    assert resolve_flags(_model(name), flags, H100).runner == runner


def test_cold_compile_copies_the_embedding_table_from_0_11_1():
    # A cold torch.compile benchmarks the kernel that gathers the embeddings (and applies the first RMSNorm) on
    # random copies of its arguments: the padded table and two [T, hidden] outputs. Llama-3.1-8B in bf16 on an
    # A40 at 2,048 tokens (0.26.0, Model Runner V2): (128,256 + 2 x 2,048) x 4,096 x 2 B = 1,084,227,584 B,
    # 1.01 GiB as vireshkoli's four A40 logs print it whatever the checkpoint's quantization (the table stays
    # bf16). Warm, the run's own peak is the forward's: 103,079,215 + 2.926 x 2,048 x 2 x (14,336 + 4,096) =
    # 323,984,818 B (0.30 GiB), above V2's sampler (24,696,062 + 256 x 128,256 x 6 = 221,697,278 B).
    a40 = dict(max_model_len=4096, max_num_seqs=256, version="0.26.0")
    cold = plan_vllm(LLAMA, VllmFlags(**a40), find_gpu("A40")).stages[0].memory
    warm = plan_vllm(LLAMA, VllmFlags(**a40, compile_cache="warm"), find_gpu("A40")).stages[0].memory
    assert cold.compile_clone_bytes == cold.activation_peak_bytes == 1_084_227_584
    assert warm.compile_clone_bytes == 0 and warm.activation_peak_bytes == cold.run_peak_bytes == 323_984_818
    # The fit split's Llama-3.1-8B at pp 2 on 0.19 (8,192 tokens): stage 0 holds the embedding, (128,256 +
    # 16,384) x 4,096 x 2 = 1,184,890,880 B = 1.10 GiB, the "torch peak memory increase: 1.1GiB" Worker_PP0
    # printed; stage 1 has no embedding to copy. In float32 at pp 1: (128,256 + 16,384) x 4,096 x 4 B =
    # 2,369,781,760 B = 2.21 GiB, above the float32 sampler (2.12 GiB), as that log printed.
    pp2 = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.19.0", pipeline_parallel_size=2), H100)
    assert [s.memory.compile_clone_bytes for s in pp2.stages] == [1_184_890_880, 0]
    f32 = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.19.0", dtype="float32"), H100)
    assert f32.stages[0].memory.activation_peak_bytes == 2_369_781_760
    # tp 2 copies each rank's half of the table: (64,128 + 16,384) x 4,096 x 2 = 659,554,304 B.
    tp2 = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.19.0", tensor_parallel_size=2), H100)
    assert tp2.stages[0].memory.compile_clone_bytes == 659_554_304
    # Nothing before 0.11.1 (torch 2.8), nothing with --enforce-eager (no torch.compile), nothing for a multimodal
    # model (its embeddings are made outside the compiled graph: _prepare_mm_inputs passes inputs_embeds).
    assert plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.11.0"), H100).stages[0].memory \
        .compile_clone_bytes == 0
    assert plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.19.0", enforce_eager=True), H100) \
        .stages[0].memory.compile_clone_bytes == 0
    gemma3 = _model("google/gemma-3-4b-it")
    assert plan_vllm(gemma3, VllmFlags(max_model_len=8192, version="0.19.0"), H100).stages[0].memory \
        .compile_clone_bytes == 0


def test_v2_profiled_sampler_per_release_and_its_rows_sharded_over_tp_from_0_29():
    # Qwen2.5-0.5B at tp 2, a 2,048-token step and 2,048 sequences, a warm compile cache: the sampler outweighs the
    # forward (0.096 GiB + 2.926 x 2,048 x 2 x (4,864 / 2 + 896) = 143 MB). 0.25 samples all 2,048 rows from a
    # float32 copy, 24,696,062 + 2,048 x 151,936 x (2 + 4) B = 1,891,685,630 B; 0.26 (in place) and 0.28 (no row
    # needs processing) keep the bfloat16 logits only, 24,696,062 + 2,048 x 151,936 x 2 = 647,025,918 B; 0.29's
    # batch-sharded sampling takes 1,024 rows a rank, 24,696,062 + 1,024 x 151,936 x 2 = 335,860,990 B.
    small = _model("Qwen/Qwen2.5-0.5B")
    flags = dict(max_model_len=8192, tensor_parallel_size=2, max_num_batched_tokens=2048, max_num_seqs=2048,
                 compile_cache="warm")
    peaks = [plan_vllm(small, VllmFlags(version=v, **flags), H100).stages[0].memory.activation_peak_bytes
             for v in ("0.25.0", "0.26.0", "0.28.0", "0.29.0")]
    assert peaks == [1_891_685_630, 647_025_918, 647_025_918, 335_860_990]


def test_v2_sampler_state_counts_on_the_last_stage_from_0_27():
    # Model Runner V2 allocates its penalty counts and token masks in load_model: Qwen3-32B at 1,024 sequences,
    # 1,024 x (151,936 + 2 x cdiv(151,936, 32) = 4,748) x 4 B = 661,225,472 B. 0.26's budget (weights + the
    # profiling's increases) does not see it; 0.27's (the drop in free memory since the worker started) does, on
    # the last pipeline stage only. V1 (an MoE model on 0.27) has none.
    qwen32 = _model("Qwen/Qwen3-32B")
    pro = find_gpu("RTX-PRO-6000")

    def state(version: str, tp: int = 1, pp: int = 1, model=qwen32) -> list[int]:
        plan = plan_vllm(model, VllmFlags(max_model_len=32768, version=version, tensor_parallel_size=tp,
                                          pipeline_parallel_size=pp), pro)
        return [s.memory.sampler_state_bytes for s in plan.stages]

    assert state("0.26.0", tp=2) == [0]
    assert state("0.27.1", tp=2) == [661_225_472]
    assert state("0.27.1", pp=2) == [0, 661_225_472]
    assert state("0.27.1", model=_model("Qwen/Qwen3-30B-A3B")) == [0]


def test_ceil_of_requested_memory_from_0_14():
    # A 1,000,000,001-byte card at utilization 0.5: 500,000,000.5 B requested; 0.13 keeps the float (int() in
    # the budget), 0.14 rounds up (request_memory's math.ceil).
    gpu = custom_gpu(1_000_000_001)
    opt = _model("facebook/opt-125m")
    flags = dict(max_model_len=512, gpu_memory_utilization=0.5)
    assert plan_vllm(opt, VllmFlags(version="0.13.0", **flags), gpu).requested_bytes == 500_000_000
    assert plan_vllm(opt, VllmFlags(version="0.14.0", **flags), gpu).requested_bytes == 500_000_001


def test_cuda_context_charged_until_0_9_0():
    # V1 up to 0.9.0 subtracts torch's absolute peak and all non-torch memory, so the CUDA context (0.51 GiB
    # on H100: the worker's init snapshot, cuda_memory=0.51GiB) comes off the budget; 0.9.1 measures from the
    # snapshot. Same step, sampler and utilization: the budgets differ by exactly round(0.51 x 2^30) B.
    old = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.9.0", gpu_memory_utilization=0.9), H100)
    new = plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.9.1", gpu_memory_utilization=0.9), H100)
    assert CONTEXT_BYTES == 547_608_330
    assert new.available_kv_cache_bytes - old.available_kv_cache_bytes == CONTEXT_BYTES


def test_communicators_charged_until_0_11():
    # Before 0.11 the worker snapshots before init_worker_distributed_environment, so the communicators it then
    # sets up are growth the budget charges: at tp 4 on H100s the 1.02 GiB the 0.19 fit split shows before
    # the snapshot, on top of the 2.17 GiB grown while profiling. 0.11.0 snapshots after them.
    flags = dict(max_model_len=8192, gpu_memory_utilization=0.9, tensor_parallel_size=4)
    before_11 = plan_vllm(LLAMA, VllmFlags(version="0.10.2", **flags), H100).stages[0].memory
    after_11 = plan_vllm(LLAMA, VllmFlags(version="0.11.0", **flags), H100).stages[0].memory
    assert after_11.non_torch_bytes == round(2.17 * GiB) == 2_330_019_758
    assert before_11.non_torch_bytes == round(2.17 * GiB) + round(1.02 * GiB) == 3_425_236_418
    # V0 too (worker.py init_device: baseline_snapshot, then the distributed set-up), DeepSeek-V3-AWQ's 0.7.3.
    v0 = plan_vllm(LLAMA, VllmFlags(version="0.7.3", **flags), H100).stages[0].memory
    assert v0.non_torch_bytes == 3_425_236_418


def test_cuda_graphs_subtracted_from_0_20():
    # Same utilization (0.9, given), same requested memory: 0.20 takes the graph estimate off the budget.
    # Llama-3.1-8B, 51 piecewise + 51 full graphs up to 512 tokens, 32 layers, bf16:
    # 102 x (4,900,558 + 32 x 85,040) + int(0.0995 x 1,024 x 32 x (4,096 + 14,336) x 2) = 777,427,476
    # + 120,191,975 = 897,619,451 B (0.84 GiB; the 0.19 log says 0.91 GiB).
    flags = dict(max_model_len=8192, gpu_memory_utilization=0.9)
    old = plan_vllm(LLAMA, VllmFlags(version="0.19", **flags), H100)
    new = plan_vllm(LLAMA, VllmFlags(version="0.20.0", **flags), H100)
    assert new.cudagraph_bytes == old.cudagraph_bytes == 897_619_451
    assert old.available_kv_cache_bytes - new.available_kv_cache_bytes == 897_619_451


def test_default_utilization_per_release():
    assert resolve_flags(LLAMA, VllmFlags(version="0.19.1"), H100).gpu_memory_utilization == 0.90
    assert resolve_flags(LLAMA, VllmFlags(version="0.20.0"), H100).gpu_memory_utilization == 0.92


def test_kv_tokens_formula_per_release():
    # Gemma-3-4B at 8,192 tokens: 7 KV-cache groups (1 full, 6 sliding), 3,590 blocks per request. 0.19
    # reports num_blocks // 7 x 16; 0.20.1+ int(concurrency x 8,192) with concurrency = num_blocks / 3,590.
    gemma = _model("google/gemma-3-4b-it")
    flags = dict(max_model_len=8192, kv_cache_memory_bytes=8 * GiB)
    old = plan_vllm(gemma, VllmFlags(version="0.19", **flags), H100)
    new = plan_vllm(gemma, VllmFlags(version="0.20.1", **flags), H100)
    assert old.num_blocks == new.num_blocks
    assert old.kv_cache_tokens == old.num_blocks // 7 * 16
    assert new.kv_cache_tokens == int(new.num_blocks / 3590 * 8192)
    assert new.kv_cache_tokens != old.kv_cache_tokens


def test_v0_blocks_have_no_null_block_and_cache_whole_windows():
    # V0 (default up to 0.7.3): every layer caches every token (a sliding window only masks), blocks are
    # tokens x all layers, no null block; concurrency = blocks x 16 / max_model_len.
    gemma2 = _model("google/gemma-2-9b-it")
    r = plan_vllm(gemma2, VllmFlags(max_model_len=8192, version="0.7.3"), H100)
    layout = r.stages[0].layout
    assert r.flags.engine == "v0" and [g.kind for g in layout.groups] == ["full_attention"]
    assert layout.group_size == gemma2.num_layers
    assert r.usable_blocks == r.num_blocks
    assert r.kv_cache_tokens == r.num_blocks * 16
    assert r.max_concurrency == r.num_blocks * 16 / 8192
    assert r.warmup is None  # V0 has no sampler warm-up after the KV cache
    assert any(line.startswith("# cuda blocks: ") for line in r.log_lines)


def test_v0_one_request_refusal_in_tokens():
    r = plan_vllm(LLAMA, VllmFlags(max_model_len=131072, version="0.7.3", gpu_memory_utilization=0.5), L4)
    assert r.refusal is not None and r.refusal.code in ("one_request", "no_kv_memory")
    if r.refusal.code == "one_request":
        assert f"stored in KV cache ({r.num_blocks * 16})" in r.refusal.message


@pytest.mark.parametrize(("version", "gpu", "max_model_len", "seqs_given", "expected"), [
    ("0.8.3", "L4", 8192, None, (2048, 1024)),  # name rule: only h100/h200 get 8,192; seqs 1,024 everywhere
    ("0.8.4", "L4", 8192, None, (2048, 256)),  # 0.8.4: only h100/h200 get 1,024 sequences too
    ("0.8.4", "H100", 8192, None, (8192, 1024)),
    ("0.8.5", "L4", 8192, None, (2048, 256)),  # memory rule
    ("0.8.5", "A100-80GB", 8192, None, (8192, 1024)),  # 79 GiB >= 70 GiB
    ("0.9.0", "A100-80GB", 8192, None, (2048, 256)),  # ... but not an A100 from 0.9.0
    ("0.19", "H100", 8192, None, (8192, 1024)),
    ("0.6.4", "H100", 8192, None, (8192, 256)),  # V0: chunked prefill off below 32K: max(len, 2,048)
    ("0.6.4", "H100", 131072, None, (512, 256)),  # V0 chunked on: 512 up to 0.6.4
    ("0.6.5", "H100", 131072, None, (2048, 256)),  # ... 2,048 from 0.6.5
    ("0.11.0", "H100", 4096, 1, (8192, 1)),
    ("0.11.1", "H100", 4096, 1, (4096, 1)),  # defaulted step capped at 1 sequence x 4,096 tokens
    ("0.27.1", "B200", 8192, None, (8192, 1024)),  # 0.27: >= 70 GiB
    ("0.28.0", "B200", 8192, None, (16384, 1024)),  # 0.28: >= 160 GiB, the largest step for `vllm serve` too
    ("0.28.0", "H200", 8192, None, (8192, 1024)),  # 139.8 GiB: below 160
])
def test_batch_defaults(version, gpu, max_model_len, seqs_given, expected):
    f = resolve_flags(LLAMA, VllmFlags(max_model_len=max_model_len, version=version, max_num_seqs=seqs_given),
                      find_gpu(gpu))
    assert (f.max_num_batched_tokens, f.max_num_seqs) == expected


def test_llm_class_batch_defaults():
    f = resolve_flags(LLAMA, VllmFlags(max_model_len=8192, version="0.19", usage="llm"), H100)
    assert (f.max_num_batched_tokens, f.max_num_seqs) == (16384, 1024)


def test_engine_choice_per_release():
    assert resolve_flags(LLAMA, VllmFlags(max_model_len=8192, version="0.8.5", use_v1=False), H100).engine == "v0"
    with pytest.raises(FieldError, match="no V0 engine"):
        resolve_flags(LLAMA, VllmFlags(max_model_len=8192, version="0.11.0", use_v1=False), H100)
    with pytest.raises(FieldError, match="no V1 engine"):
        resolve_flags(LLAMA, VllmFlags(max_model_len=8192, version="0.6.3", use_v1=True), H100)


def test_kv_cache_memory_option_only_from_0_10_2():
    with pytest.raises(FieldError, match="0.10.2"):
        plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version="0.10.1", kv_cache_memory_bytes=GiB), H100)


def test_mxfp4_needs_0_10_1():
    with pytest.raises(FieldError, match="mxfp4"):
        plan_vllm(_model("openai/gpt-oss-20b"), VllmFlags(max_model_len=8192, version="0.9.2"), H100)


def test_log_wording_per_release():
    def lines(version, use_v1=None):
        return plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=version, use_v1=use_v1), H100).log_lines

    assert any(line.startswith("# GPU blocks: ") for line in lines("0.6.2"))
    assert not any("Maximum concurrency" in line for line in lines("0.6.2"))
    assert any(line.startswith("Memory profiling results: total_gpu_memory=") for line in lines("0.6.4"))
    assert any(line.startswith("model weights take ") for line in lines("0.7.3"))
    assert "Estimated CUDA graph memory" in " ".join(lines("0.19"))
    assert any(line.startswith("GPU KV cache size: ") and ", Maximum concurrency" in line for line in lines("0.28"))
    # V1's weights line per release (Llama-3.1-8B: 16,094,076,928 B = 14.9888 GiB); no available-memory line
    # before 0.9.1; "# GPU blocks" with its concurrency from 0.7.1.
    assert lines("0.6.4", True)[0] == "Loading model weights took 14.9888 GB"
    assert [lines(v)[0] for v in ("0.8.0", "0.8.5", "0.11.1", "0.14.0", "0.22.0")] == [
        "Model loading took 14.9888 GB", "Model loading took 14.9888 GiB", "Model loading took 14.9888 GiB memory",
        "Model loading took 14.99 GiB memory", "Model loading took 14.99 GiB memory"]
    assert lines("0.25.0")[0] == "Model loading took 14.99 GiB" and lines("0.28.0")[0].endswith(" GiB memory")
    assert not any("Available KV cache memory" in line for line in lines("0.8.5"))
    assert any(line.startswith("Available KV cache memory") for line in lines("0.9.1"))
    assert lines("0.7.3", True)[-1].startswith("Maximum concurrency for 8192 tokens per request: ")
    assert lines("0.7.0", True)[-1].startswith("# GPU blocks: ")


def test_cli_version_errors(runner):
    result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--vllm-version",
                     "0.5", "--offline")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --vllm-version 0.5: is outside the releases kvplan models")
    assert "0.6.0 to 0.33" in result.stderr and "Traceback" not in result.stderr


def test_cli_takes_any_release(runner):
    for version in ("0.6.4", "0.10.1", "0.11.0", "0.19", "0.20", "0.33", "current"):
        result = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "8192",
                         "--gpu", "H100", "--vllm-version", version, "--offline")
        assert result.exit_code == 0, (version, result.output)
        assert f"vLLM {version}" in result.stdout


def test_chunked_prefill_off_makes_the_step_hold_a_whole_prompt():
    # V0 decides by itself past 32K tokens (chunked, 2,048-token steps from 0.6.5); --no-enable-chunked-prefill
    # makes the step max(max_model_len, 2,048): 65,536 tokens, the forward the profile then runs.
    v0 = {"max_model_len": 65536, "version": "0.8.5", "use_v1": False}
    assert resolve_flags(LLAMA, VllmFlags(**v0), H100).max_num_batched_tokens == 2048
    off = resolve_flags(LLAMA, VllmFlags(**v0, enable_chunked_prefill=False), H100)
    assert (off.max_num_batched_tokens, off.chunked_prefill) == (65536, False)
    # V1 honours the switch from 0.11.1 (EngineArgs: max(max_model_len, the default step)); 0.11.0 forces it on.
    v1 = {"max_model_len": 32768, "enable_chunked_prefill": False}
    assert resolve_flags(LLAMA, VllmFlags(version="0.11.0", **v1), L4).max_num_batched_tokens == 2048
    assert resolve_flags(LLAMA, VllmFlags(version="0.11.1", **v1), L4).max_num_batched_tokens == 32768
    # A step given shorter than a prompt is refused with vLLM's own words (SchedulerConfig.verify_max_model_len).
    short = plan_vllm(LLAMA, VllmFlags(version="0.19", max_num_batched_tokens=8192, **v1), H100)
    assert short.refusal is not None and short.refusal.code == "option"
    assert short.refusal.message.startswith("max_num_batched_tokens (8192) is smaller than max_model_len (32768).")


def test_check_reads_no_enable_chunked_prefill(runner, tmp_path):
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text(
        "services:\n  llm:\n    image: vllm/vllm-openai:v0.19.0\n"
        "    command: [\"--model\", \"meta-llama/Llama-3.1-8B-Instruct\", \"--max-model-len\", \"32768\", "
        "\"--max-num-batched-tokens\", \"8192\", \"--no-enable-chunked-prefill\"]\n"
        "    deploy:\n      resources:\n        reservations:\n          devices:\n"
        "            - driver: nvidia\n              count: 1\n              capabilities: [gpu]\n")
    r = run_cli(runner, "check", str(deploy), "--gpu", "H100", "--offline")
    assert r.exit_code == 1 and "is smaller than max_model_len" in " ".join(r.stdout.split())


def test_bitsandbytes_is_refused_from_028():
    # 0.28's ModelConfig rejects the method ("Unknown quantization method: bitsandbytes"), for a flag on a plain
    # checkpoint as for a bitsandbytes checkpoint; 0.27.1 loads it.
    model = _model("meta-llama/Llama-3.1-8B-Instruct")
    plan_vllm(model, VllmFlags(max_model_len=8192, version="0.27.1", quantization="bitsandbytes"), find_gpu("L4"))
    with pytest.raises(FieldError, match="no bitsandbytes quantization"):
        plan_vllm(model, VllmFlags(max_model_len=8192, version="0.28", quantization="bitsandbytes"), find_gpu("L4"))
    checkpoint = dataclasses.replace(model, quant=QuantSpec("bitsandbytes", 4, group_size=64, scale_bytes=4))
    with pytest.raises(FieldError, match="no bitsandbytes quantization"):
        plan_vllm(checkpoint, VllmFlags(max_model_len=8192, version="current"), find_gpu("L4"))


def test_a_window_reserves_every_batch_in_flight_from_0_26():
    # gpt-oss-20b at 131,072 tokens on an H100 (8,192-token steps): the full-attention group takes
    # cdiv(131,072, 16) = 8,192 blocks a request. Its 128-token window reserves the steps in flight beside it:
    # 0.25, one step: cdiv(127 + 8,192, 16) + 1 = 521 -> 8,713; 0.26 (VllmConfig.max_in_flight_tokens), two
    # batches with async scheduling on V1 at pp 1: cdiv(127 + 16,384, 16) + 1 = 1,033 -> 9,225. Model Runner V2
    # (0.29) runs pp + 1 = 2 batches, V1 at pp 2 runs pp = 2: the same 16,384 tokens.
    gpt = _model("openai/gpt-oss-20b")

    def plan(version: str, pp: int = 1):
        return plan_vllm(gpt, VllmFlags(max_model_len=131072, version=version, pipeline_parallel_size=pp), H100)

    assert [plan(v).blocks_per_request for v in ("0.25.1", "0.26.0", "0.29.0")] == [8_713, 9_225, 9_225]
    assert plan("0.26.0", pp=2).flags.window_tokens_in_flight == 16_384
    assert plan("0.25.1").flags.window_tokens_in_flight == 8_192


@pytest.mark.parametrize(("version", "install", "env", "path"), [
    # 0.8-0.11.0 take FlashInfer wherever it is importable (the image) unless VLLM_USE_FLASHINFER_SAMPLER=0.
    ("0.9.2", "image", None, "flashinfer_logits"),
    ("0.9.2", "image", False, "sort"),
    ("0.9.2", "wheel", True, "flashinfer_logits"),  # FlashInfer installed beside the wheel and opted in
    ("0.8.5", "wheel", True, "flashinfer_probs"),  # 0.8's FlashInfer samples from probabilities
    # 0.11.1+ only with VLLM_USE_FLASHINFER_SAMPLER=1 (Unsloth sets it), whatever the install.
    ("0.11.2", "image", None, "sort"),
    ("0.11.2", "image", True, "flashinfer_logits"),
    ("0.19", "wheel", True, "flashinfer_logits"),
    ("0.19", "image", None, "triton"),
    ("0.7.3", "image", True, "logits"),  # V1 before 0.8 profiles no sampler warm-up: the option does not reach it
])
def test_flashinfer_sampler_env_picks_the_profiled_sampler(version, install, env, path):
    from kvplan.engines.vllm import _sampler_path

    f = resolve_flags(LLAMA, VllmFlags(max_model_len=8192, version=version, install=install, use_v1=True,
                                       flashinfer_sampler=env), find_gpu("L4"))
    assert _sampler_path(f) == path


def test_flashinfer_sampler_moves_the_peak_and_says_so(runner):
    # Llama-3.1-8B on an L4 under 0.11.2 (warm compile cache, so the sampler is the profiled peak): 256 sampler
    # rows (the small-GPU default) of 128,256 logits beside the 2 B bfloat16 logits. PyTorch's sort holds 4 + 32 B
    # an element (vllm_memory.torch_sort_bytes_per_element), FlashInfer's kernels three float32 copies, 12 B:
    # opting in leaves (38 - 14) x 256 x 128,256 = 788,004,864 B more KV memory, and the plan says why.
    base = ["estimate", "meta-llama/Llama-3.1-8B-Instruct", "--offline", "--gpu", "L4", "--seq", "4096",
            "--vllm-version", "0.11.2", "--compile-cache", "warm", "--json"]

    def kv_and_notes(*extra: str) -> tuple[int, list[str]]:
        out = json.loads(run_cli(runner, *base, *extra).stdout)
        return out["available_kv_cache_bytes"], out["gpus"][0]["notes"]

    default_kv, default_notes = kv_and_notes()
    opted_kv, opted_notes = kv_and_notes("--flashinfer-sampler")
    assert opted_kv - default_kv == 788_004_864
    assert any("VLLM_USE_FLASHINFER_SAMPLER=1" in n for n in opted_notes)
    assert not any("VLLM_USE_FLASHINFER_SAMPLER" in n for n in default_notes)


def test_cublas_handles_join_the_baseline_from_0_33_on_hopper():
    # 0.33 creates its cuBLAS handles before the worker's snapshot: on an H100 the measured handle (H200: 718,077,952
    # - 552,402,944 = 165,675,008 B outside torch after one bf16 product) leaves the charged growth, so the KV
    # memory grows by exactly that; on an L4 (Ada, not measured) nothing moves.
    def kv(version: str, gpu: str) -> int:
        return plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=version), find_gpu(gpu)) \
            .first_rank_available_kv_bytes

    assert kv("0.33.0", "H100") - kv("0.32.0", "H100") == 165_675_008
    assert kv("0.33.0", "L4") == kv("0.32.0", "L4")


def test_lora_captures_every_graph_twice_from_0_11_1():
    # Llama-3.1-8B on an H100 (1,024 sequences: 51 piecewise + 51 full sizes up to 512). From 0.11.1 LoRA captures
    # each size with no adapter and with max_loras + 1 active, into the same pool: 102 more graphs of
    # PER_GRAPH_BYTES + 32 layers x PER_GRAPH_LAYER_BYTES = 4,900,558 + 32 x 85,040 = 7,621,838 B each,
    # 777,427,476 B in all; 0.11.0 captures once.
    from kvplan.engines.vllm_graphs import PER_GRAPH_BYTES, PER_GRAPH_LAYER_BYTES
    from kvplan.engines.vllm_lora import LoraSlots

    def graphs(version: str, lora: LoraSlots | None):
        return plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=version, lora=lora), H100)

    assert PER_GRAPH_BYTES + 32 * PER_GRAPH_LAYER_BYTES == 7_621_838
    with_lora, plain = graphs("0.20.0", LoraSlots()), graphs("0.20.0", None)
    assert (with_lora.graphs.count, plain.graphs.count) == (204, 102)
    assert with_lora.cudagraph_bytes - plain.cudagraph_bytes == 102 * 7_621_838 == 777_427_476
    assert graphs("0.11.0", LoraSlots()).graphs.count == graphs("0.11.0", None).graphs.count


def test_rocm_charges_the_graph_estimate_from_0_26():
    # vLLM 0.20-0.25 skip profile_cudagraph_memory on ROCm, 0.26 takes it (is_cuda_alike). Qwen3-30B-A3B stays on
    # the V1 runner through 0.28 (an MoE not on V2's list), so on an MI300X 0.26 plans exactly its graph bytes
    # less KV memory than 0.25.1, while an H100 is charged on both.
    moe, mi300x = _model("Qwen/Qwen3-30B-A3B"), find_gpu("MI300X")

    def plan(version: str, gpu):
        return plan_vllm(moe, VllmFlags(max_model_len=8192, version=version), gpu)

    before, after = plan("0.25.1", mi300x), plan("0.26.0", mi300x)
    assert (before.to_dict()["cudagraphs_subtracted"], after.to_dict()["cudagraphs_subtracted"]) == (False, True)
    assert plan("0.25.1", H100).to_dict()["cudagraphs_subtracted"] is True
    assert before.first_rank_available_kv_bytes - after.first_rank_available_kv_bytes == after.cudagraph_bytes > 0


def test_an_off_stride_step_is_captured_from_0_20_1():
    # 256 sequences, --max-num-batched-tokens 300: sizes [1, 2, 4, 8 .. 248, 256, 272, 288] (3 + 31 + 3 = 37 below the
    # step); 0.20.1 appends 300 itself, a piecewise graph only (full sizes stop at the 256 sequences).
    from kvplan.engines.vllm_graphs import capture_sizes

    def modes(version: str):
        return capture_sizes(rules_for(version), "v1", H100, max_num_seqs=256, max_num_batched_tokens=300)

    assert (len(modes("0.20.0").piecewise), max(modes("0.20.0").piecewise)) == (37, 288)
    assert (len(modes("0.20.1").piecewise), max(modes("0.20.1").piecewise)) == (38, 300)
    assert max(modes("0.20.1").full) == 256
    # The bound is the largest size vLLM computes, min(2 x 150, 512) = 300, not the last listed one (288).
    off = capture_sizes(rules_for("0.20.1"), "v1", H100, max_num_seqs=150, max_num_batched_tokens=296)
    assert off.piecewise[-2:] == (288, 296)


def test_speculative_decode_steps_size_the_captures():
    # 128 sequences with one MTP draft token (q = 2 tokens a decode step). 0.12: top min(128 x 2, 512) = 256, 35
    # piecewise sizes; 0.13 (decode_query_len): min(128 x 2 x 2, 512) = 512, 51 sizes. FULL decode graphs take
    # 2 <= size <= 128 x 2 = 256: the 1-token size drops out, 34 of the 35 sizes up to 256.
    from kvplan.engines.vllm_graphs import capture_sizes

    def modes(version: str):
        return capture_sizes(rules_for(version), "v1", H100, max_num_seqs=128, max_num_batched_tokens=8192,
                             decode_query_len=2)

    assert (len(modes("0.12.0").piecewise), max(modes("0.12.0").piecewise)) == (35, 256)
    assert (len(modes("0.13.0").piecewise), max(modes("0.13.0").piecewise)) == (51, 512)
    assert (len(modes("0.13.0").full), min(modes("0.13.0").full), max(modes("0.13.0").full)) == (34, 2, 256)


@pytest.mark.parametrize(("version", "opening", "ending"), [
    # v1/core/kv_cache_utils.py _check_enough_kv_cache_memory, as each sdist words it
    ("0.12.0", "with the models's max seq len", "`max_model_len` when initializing the engine."),
    ("0.13.0", "with the models's max seq len", "conserving_memory/ for more details."),
    ("0.22.0", "with the model's max seq len", "conserving_memory/ for more details."),
])
def test_the_kv_refusal_is_worded_as_the_release_words_it(version, opening, ending):
    r = plan_vllm(LLAMA, VllmFlags(max_model_len=131072, version=version, kv_cache_memory_bytes=4 * GiB), H100)
    assert r.refusal is not None and r.refusal.code == "one_request"
    assert opening in r.refusal.message and r.refusal.message.endswith(ending)
    assert ("which also controls CPU memory" in r.refusal.message) is (version == "0.22.0")


def test_the_null_block_from_0_8_3():
    # V1's block pool holds a null block from 0.8.3: every block is usable on 0.8.2, all but one on 0.8.3 (the
    # budget is the same: nothing else changes between the two releases).
    def report(version: str):
        return plan_vllm(LLAMA, VllmFlags(max_model_len=8192, version=version), H100)

    old, new = report("0.8.2"), report("0.8.3")
    assert old.num_blocks == new.num_blocks > 0
    assert (old.usable_blocks, new.usable_blocks) == (old.num_blocks, new.num_blocks - 1)


def test_mla_falls_back_to_per_head_kv_before_0_7_1_and_for_non_fp8_checkpoints_until_0_7_3(runner):
    # ModelConfig.use_mla is false before 0.7.1 (no MLA cache) and, in 0.7.1-0.7.2, for any quantization but fp8;
    # DeepseekV2Attention then caches K and V per head. DeepSeek-V2-Lite (27 layers, 16 heads, qk 128 + 64):
    # 0.6.6 pads the head to 256: 16 x 2 x 256 x 2 B = 16,384 B a token a layer, x 27 x 16 tokens = 7,077,888 B a
    # block; 0.7.0 caches 192 wide: 16 x 2 x 192 x 2 = 12,288 B, 5,308,416 B a block; from 0.7.1 the latent
    # (512 + 64) x 2 = 1,152 B, 497,664 B a block.
    lite = _model("deepseek-ai/DeepSeek-V2-Lite")

    def block_bytes(model, version, **flags):
        return plan_vllm(model, VllmFlags(max_model_len=8192, version=version, **flags), H100).stages[0] \
            .layout.bytes_per_block

    assert [block_bytes(lite, v) for v in ("0.6.6", "0.7.0", "0.7.1")] == [7_077_888, 5_308_416, 497_664]
    # 0.7.2 keeps the latent for --quantization fp8, not for bitsandbytes (0.7.3 keeps it for both); V0 pads it
    # to 640 values there (test_v0_pads_the_mla_latent_to_256_bytes_on_0_7_2_and_0_7_3): 640 x 2 x 27 x 16 =
    # 552,960 B.
    assert block_bytes(lite, "0.7.2", quantization="fp8") == 552_960
    assert block_bytes(lite, "0.7.2", quantization="bitsandbytes") == 5_308_416
    assert block_bytes(lite, "0.7.3", quantization="bitsandbytes") == 552_960
    # An AWQ DeepSeek-V3 at tp 8 on 0.7.2: 16 heads a rank x 2 x 192 x 2 B = 12,288 B a token a layer, x 61
    # layers x 16 = 11,993,088 B a block, against the fp8 checkpoint's padded latent 1,280 x 61 x 16 = 1,249,280 B.
    v3 = _model("deepseek-ai/DeepSeek-V3")
    awq = dataclasses.replace(v3, quant=QuantSpec("awq", 4, group_size=128, scale_bytes=2, zero_point_bits=4))
    assert block_bytes(awq, "0.7.2", tensor_parallel_size=8) == 11_993_088
    assert block_bytes(v3, "0.7.2", tensor_parallel_size=8) == 1_249_280
    # DeepSeek-V3 is registered from 0.6.6; a model type the fallback path does not cover is refused by name.
    with pytest.raises(FieldError, match="deepseek_v2 only, not deepseek_v3"):
        block_bytes(v3, "0.6.5", tensor_parallel_size=8)
    with pytest.raises(FieldError, match="not kimi_k2"):
        block_bytes(_model("moonshotai/Kimi-K2-Instruct"), "0.7.0", tensor_parallel_size=8)
    out = run_cli(runner, "estimate", "deepseek-ai/DeepSeek-V2-Lite", "--gpu", "H100", "--seq", "8192",
                  "--vllm-version", "0.7.0")
    assert "vLLM 0.7.0 has no MLA cache (it came in 0.7.1): each layer caches K and V for every head, 12,288 B" \
        in " ".join(out.stdout.split())
    # Per-head K/V is split by tp, so the plan does not claim the latent is whole on every rank (0.8.0 does).
    def notes(version):
        return " ".join(run_cli(runner, "estimate", "deepseek-ai/DeepSeek-V3", "--gpu", "H200", "--tp", "8", "--seq",
                                "8192", "--vllm-version", version).stdout.split())

    assert "the MLA latent is not split" not in notes("0.7.0") and "the MLA latent is not split" in notes("0.8.0")


def test_mla_layers_keep_absorbed_or_dequantized_matrices_beside_their_weights():
    # DeepSeek-R1 (fp8, 128 x 128 scale blocks) at tp 8: 16 heads a rank, latent 512, nope 128, rope 64, V 128,
    # q_lora_rank 1,536, hidden 7,168, 61 MLA layers.
    # 0.7.2: W_QR 1,536 x 16 x 64 x 2 B = 3,145,728; kv_b_proj dequantized in float32 512 x 16 x 256 x 4 =
    # 8,388,608; W_Q_UK in fp8 1,536 x 8,192 = 12,582,912 + 12 x 64 scales x 4 B = 3,072; W_UV_O in fp8
    # 8,192 x 7,168 = 58,720,256 + 64 x 56 x 4 = 14,336: 82,854,912 B a layer.
    # 0.7.3 dequantizes in bf16: 8,388,608 -> 4,194,304, 78,660,608 B. 0.8+: the bf16 kv_b_proj only, 4,194,304.
    r1 = _model("deepseek-ai/DeepSeek-R1")
    kept = {v: mla_kept_bytes(r1, rules_for(v), dtype="bfloat16", tp=8, quantization=None)
            for v in ("0.7.0", "0.7.2", "0.7.3", "0.8.0", "0.33.0")}
    assert kept == {"0.7.0": 0, "0.7.2": 82_854_912, "0.7.3": 78_660_608, "0.8.0": 4_194_304,
                    "0.33.0": 4_194_304}
    # An AWQ DeepSeek-V3 on 0.7.3 absorbs in bf16: 3,145,728 + 4,194,304 + 1,536 x 8,192 x 2 (25,165,824) +
    # 8,192 x 7,168 x 2 (117,440,512) = 149,946,368 B a layer.
    v3 = _model("deepseek-ai/DeepSeek-V3")
    awq = dataclasses.replace(v3, quant=QuantSpec("awq", 4, group_size=128, scale_bytes=2, zero_point_bits=4))
    assert mla_kept_bytes(awq, rules_for("0.7.3"), dtype="bfloat16", tp=8, quantization=None) == 149_946_368
    # DeepSeek-V2-Lite in bf16 (no q_lora: the query input is hidden 2,048), 16 heads at tp 1, on 0.7.2:
    # 2,048 x 16 x 64 x 2 + 2,048 x 8,192 x 2 + 8,192 x 2,048 x 2 = 71,303,168 B a layer, x 27 =
    # 1,925,185,536 B of weights more; unquantized 0.8+ keeps views only. --quantization fp8 at 0.8: the bf16
    # kv_b_proj copy 512 x 16 x 256 x 2 = 4,194,304 B a layer.
    lite = _model("deepseek-ai/DeepSeek-V2-Lite")
    plans = {v: plan_vllm(lite, VllmFlags(max_model_len=8192, version=v), H100).stages[0].memory
             for v in ("0.7.0", "0.7.2", "0.8.0")}
    assert [plans[v].mla_kept_bytes for v in plans] == [0, 1_925_185_536, 0]
    assert plans["0.7.2"].weights_bytes - plans["0.7.0"].weights_bytes == 1_925_185_536
    assert mla_kept_bytes(lite, rules_for("0.8.0"), dtype="bfloat16", tp=1, quantization="fp8") == 4_194_304
    # Where MLA is off (0.7.2 with bitsandbytes) nothing is absorbed.
    off = plan_vllm(lite, VllmFlags(max_model_len=8192, version="0.7.2", quantization="bitsandbytes"), H100)
    assert off.flags.mla_dense is not None and off.stages[0].memory.mla_kept_bytes == 0


def test_v0_pads_the_mla_latent_to_256_bytes_on_0_7_2_and_0_7_3():
    # CacheEngine.get_cache_block_size rounds the latent (512 + 64 = 576 values) up to 256 bytes of the model
    # dtype: align_to_256bytes(576, bf16) = 640 values. DeepSeek-R1, tp 8, 16-token blocks, 61 layers:
    # 640 x 2 B x 16 x 61 = 1,249,280 B a block (dzhsurf's DeepSeek-V3-AWQ on 0.7.3 logs 10.99 GiB for 9,442
    # blocks, about 1,249,800 B each); with an fp8 cache the rounding still counts bf16 elements: 640 x 1 B
    # x 16 x 61 = 624,640 B. 0.7.1 keeps 576 x 2 x 16 x 61 = 1,124,352 B; V1 0.8 too, in FlashMLA's 64-token
    # blocks on Hopper: 576 x 2 x 64 x 61 = 4,497,408 B.
    r1 = _model("deepseek-ai/DeepSeek-R1")

    def block_bytes(version, gpu=H100, **flags):
        return plan_vllm(r1, VllmFlags(max_model_len=8192, version=version, tensor_parallel_size=8, **flags),
                         gpu).stages[0].layout.bytes_per_block

    assert [block_bytes(v) for v in ("0.7.1", "0.7.2", "0.7.3", "0.8.0")] == [1_124_352, 1_249_280, 1_249_280,
                                                                           4_497_408]
    assert block_bytes("0.7.3", kv_cache_dtype="fp8") == 624_640
    # ROCm is not CUDA: no padding (current_platform.is_cuda()).
    assert block_bytes("0.7.3", gpu=find_gpu("MI300X")) == 1_124_352


def test_vllm_mla_disable_caches_per_head_on_any_release(runner):
    # VLLM_MLA_DISABLE=1 makes ModelConfig.use_mla false; DeepseekV2Attention then caches K and V for each of
    # DeepSeek-V2-Lite's 16 heads, V padded to K's 192: 16 x 2 x 192 x 2 B = 12,288 B a token a layer, x 27 x 16
    # = 5,308,416 B a block on V1 (0.19), against the latent's 497,664. No absorbed or dequantized copy is kept.
    lite = _model("deepseek-ai/DeepSeek-V2-Lite")
    on, off = (plan_vllm(lite, VllmFlags(max_model_len=8192, version="0.19.0", mla_disable=d), H100)
               for d in (False, True))
    assert on.stages[0].layout.bytes_per_block == 497_664
    assert off.stages[0].layout.bytes_per_block == 5_308_416 and off.flags.mla_dense is not None
    out = run_cli(runner, "estimate", "deepseek-ai/DeepSeek-V2-Lite", "--gpu", "H100", "--seq", "8192",
                  "--vllm-version", "0.19.0", "--mla-disable")
    assert "VLLM_MLA_DISABLE=1 turns MLA off: each layer caches K and V for every head, 12,288 B" \
        in " ".join(out.stdout.split())
    # On a model without MLA the switch changes nothing, and the plan says so.
    out = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100", "--seq", "8192",
                  "--mla-disable")
    assert "VLLM_MLA_DISABLE=1 changes nothing here" in " ".join(out.stdout.split())


def test_the_fused_moe_scratch_per_release():
    # Qwen3-30B-A3B at 8,192 tokens, bf16, tp 1: top_k 8, I = 768, H = 2,048, 65,536 rows.
    # 0.7.3 (three caches): 65,536 x (1,536 + 768 + 2,048) x 2 B = 570,425,344 B.
    # 0.10.2 (cache13): 65,536 x (max(1,536, 2,048) + 768) x 2 = 369,098,752 B.
    # 0.19 (TritonExperts): 65,536 x (max(768, 2,048) + max(1,536, 2,048)) x 2 = 536,870,912 B.
    # At 32,768 tokens 0.12-0.17 chunk to 16,384 (262,144 -> 131,072 rows), 0.18+ does not.
    qwen = _model("Qwen/Qwen3-30B-A3B")

    def scratch(version, tokens=8192):
        s = fused_moe_scratch(qwen, resolve_flags(qwen, VllmFlags(version=version), H100), H100, NO_SPLIT)
        return moe_workspace_bytes(qwen, dtype="bfloat16", tp=1, max_num_batched_tokens=tokens, scratch=s.kind,
                                   chunk_tokens=s.chunk_tokens)

    assert [scratch(v) for v in ("0.7.3", "0.10.2", "0.19.0")] == [570_425_344, 369_098_752, 536_870_912]
    assert scratch("0.17.1", 32768) == 131_072 * 4_096 * 2 and scratch("0.18.0", 32768) == 262_144 * 4_096 * 2
    # DeepSeek-V3 AWQ at tp 8 on 0.7.3 runs Marlin (no chunking): 32,768 tokens x 8 x (3 x 256 + 7,168) +
    # 32,768 x max(8 x 256, 7,168), x 2 B = 4,630,511,616 B; from 0.8.5 Marlin writes into cache13.
    v3 = _model("deepseek-ai/DeepSeek-V3")
    awq = dataclasses.replace(v3, quant=QuantSpec("awq", 4, group_size=128, scale_bytes=2, zero_point_bits=4))
    def marlin(version):
        f = resolve_flags(awq, VllmFlags(version=version, tensor_parallel_size=8), H100)
        return fused_moe_scratch(awq, f, H100, NO_SPLIT)

    assert marlin("0.7.3") == MoeScratch("marlin_old", None, False)
    assert marlin("0.19.0") == MoeScratch("marlin", None, False)
    assert moe_workspace_bytes(awq, dtype="bfloat16", tp=8, max_num_batched_tokens=32768, scratch="marlin_old") == \
        4_630_511_616


def test_v0_checks_one_pipeline_virtual_engines_blocks_from_0_8(runner):
    # Llama-3.1-8B at pp 2 on two L4s, 100,000 tokens: the stages' block counts differ (the first holds the
    # embedding, the last the head) and every worker checks the minimum. 0.8.0+ compare max_model_len with
    # (blocks // 2) x 16; 0.7.3 with blocks x 16, so it starts, and each virtual engine still schedules from
    # blocks // 2 (the note says so).
    plans = {v: plan_vllm(LLAMA, VllmFlags(max_model_len=100_000, version=v, pipeline_parallel_size=2), L4)
             for v in ("0.7.3", "0.8.5")}
    assert all(p.flags.engine == "v0" for p in plans.values())
    blocks = plans["0.8.5"].num_blocks
    assert blocks == min(s.num_blocks for s in plans["0.8.5"].stages) and blocks * 16 >= 100_000 > blocks // 2 * 16
    assert plans["0.7.3"].refusal is None
    assert f"stored in KV cache ({blocks // 2 * 16})" in plans["0.8.5"].refusal.message
    out = run_cli(runner, "estimate", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L4", "--pp", "2", "--seq",
                  "100000", "--vllm-version", "0.7.3")
    assert f"over its 2 pipeline virtual engines, {plans['0.7.3'].num_blocks // 2:,} each" in " ".join(
        out.stdout.split())


def test_v0_automatic_chunked_prefill_per_release():
    # Past 32K tokens V0 chunks prompts by itself (a step of 2,048 tokens from 0.6.5) unless something keeps it
    # off, and then the step holds a whole prompt: max(max_model_len, 2,048) = 65,536 tokens.
    def step(model, version, gpu=H100, **flags):
        return resolve_flags(model, VllmFlags(max_model_len=65_536, version=version, use_v1=False, **flags),
                             gpu).max_num_batched_tokens

    assert step(LLAMA, "0.7.3") == 2_048
    assert step(LLAMA, "0.7.3", lora=LoraSlots(1, 16)) == 65_536  # LoRA, every release
    mi300x = find_gpu("MI300X")
    assert [step(LLAMA, v, mi300x) for v in ("0.6.5", "0.7.0", "0.8.5")] == [2_048, 65_536, 2_048]  # ROCm 0.6.6-0.7.3
    assert [step(LLAMA, v, enable_prefix_caching=True) for v in ("0.6.0", "0.6.1")] == [65_536, 512]  # 0.6.0 only
    lite = _model("deepseek-ai/DeepSeek-V2-Lite")
    assert step(lite, "0.8.5") == 65_536 and step(lite, "0.8.5", mla_disable=True) == 2_048  # MLA in use, 0.8+
    assert step(lite, "0.7.3") == 2_048
    # A multimodal model chunks on 0.6.1 (its 512-token step raised to V0's multimodal minimum, 5,120), not 0.6.2.
    vl = _model("Qwen/Qwen2.5-VL-7B-Instruct")
    assert [step(vl, v) for v in ("0.6.1", "0.6.2")] == [5_120, 65_536]


def test_prefix_caching_on_a_mamba_hybrid_aligns_its_state_by_default_from_0_28():
    # Nemotron-H-56B (Mamba2 layers, which support prefix caching) with --enable-prefix-caching: "all" on 0.19 and
    # 0.27 (a state page for every block of a request), "align" from 0.28 (two pages a request); under
    # speculative decoding 0.20-0.21 align too. Gated DeltaNet (Qwen3-Next) aligns in every release.
    from kvplan.engines.vllm import mamba_cache_mode

    nemotron, qwen_next = _model("nvidia/Nemotron-H-56B-Base-8K"), _model("Qwen/Qwen3-Next-80B-A3B-Thinking")

    def mode(model, version, draft=0):
        f = resolve_flags(model, VllmFlags(max_model_len=8192, version=version, enable_prefix_caching=True), H100)
        return mamba_cache_mode(model, dataclasses.replace(f, num_speculative_tokens=draft))

    assert [mode(nemotron, v) for v in ("0.19.0", "0.20.0", "0.27.1", "0.28.0", "0.33.0")] == [
        "all", "all", "all", "align", "align"]
    assert [mode(nemotron, v, draft=1) for v in ("0.19.0", "0.20.0", "0.22.0")] == ["all", "align", "all"]
    assert {mode(qwen_next, v) for v in ("0.19.0", "0.28.0")} == {"align"}


def test_a_hybrid_gets_prefix_caching_by_default_from_0_28():
    # EngineArgs: default_prefix_caching = is_prefix_caching_supported, "and not model_config.is_hybrid" up to
    # 0.27.1 (0.26.0 already says "Generative hybrid models support prefix caching"); an attention-free model
    # (attn_type "attention_free") stays off. Lebhoryi's Qwen3.8-27B on 0.28.0 (LLM() with defaults, 262,144
    # tokens) prints int(concurrency x 262,144) = 298,275 tokens: a page is 784 tokens x 4,096 B (4 KV heads x 256
    # x 2 x 2 B) = 3,211,264 B, a block 16 layers of it; its 18.61 GiB hold 388 blocks, and 388 / 341 blocks a
    # request (cdiv(262,144, 784) = 335 attention pages + 2 align-mode state pages x 3 DeltaNet groups) x 262,144
    # = 298,275.2. Without prefix caching a request holds 338 blocks: 300,922 tokens.
    nemotron, qwen_next = _model("nvidia/Nemotron-H-56B-Base-8K"), _model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    llama = _model("meta-llama/Llama-3.1-8B-Instruct")
    mamba_only = dataclasses.replace(nemotron, layers=tuple(
        spec for spec in nemotron.layers if spec.kind in (LayerKind.MAMBA, LayerKind.NO_CACHE)))

    def default(model, version):
        return resolve_flags(model, VllmFlags(max_model_len=8192, version=version), H100).enable_prefix_caching

    assert [default(m, "0.27.1") for m in (nemotron, qwen_next, llama)] == [False, False, True]
    assert [default(m, "0.28.0") for m in (nemotron, qwen_next, llama)] == [True, True, True]
    assert not default(mamba_only, "0.33.0")
    qwen38 = resolve_model(str(REPO / "benchmarks/logs/configs/Qwen__Qwen3.8-27B.json"), offline=True).model
    def blocks(**flags):
        plan = plan_vllm(qwen38, VllmFlags(version="0.28.0", usage="llm", kv_cache_memory_bytes=388 * 16 * 3_211_264,
                                           **flags), find_gpu("A100-80GB-PCIE"))
        return plan.num_blocks, plan.blocks_per_request, plan.kv_cache_tokens

    assert blocks() == (388, 341, 298_275)
    assert blocks(enable_prefix_caching=False) == (388, 338, 300_922)



def test_extra_state_pages_per_mode_and_release():
    # MambaSpec.max_memory_usage_bytes: align keeps 2 + draft pages a Mamba group, all cdiv(L, B) (+ draft from
    # 0.22); from 0.32 a Mamba2 mixer keeps one more in align mode (its prefill checkpoint). Nemotron-H-56B is
    # Mamba2; Qwen3-Next's gated DeltaNet is not a Mamba2 mixer.
    from kvplan.engines.vllm import _extra_state_pages, mamba_cache_mode

    nemotron, qwen_next = _model("nvidia/Nemotron-H-56B-Base-8K"), _model("Qwen/Qwen3-Next-80B-A3B-Thinking")

    def extra(model, version, draft=0):
        f = resolve_flags(model, VllmFlags(max_model_len=8192, version=version, enable_prefix_caching=True), H100)
        f = dataclasses.replace(f, num_speculative_tokens=draft)
        return _extra_state_pages(model, f, mamba_cache_mode(model, f))

    assert [extra(nemotron, v) for v in ("0.19.0", "0.28.0", "0.31.0", "0.32.0")] == [0, 0, 0, 1]
    assert [extra(nemotron, v, draft=2) for v in ("0.19.0", "0.22.0", "0.32.0")] == [0, 2, 3]  # all, all, align
    assert [extra(qwen_next, v, draft=2) for v in ("0.19.0", "0.32.0")] == [2, 2]


def test_the_block_size_an_mla_backend_sets_per_release_and_gpu():
    # DeepSeek-R1 at tp 8: FlashMLA's 64 on Hopper from 0.8.0 (not on an A100); CUTLASS MLA's 128 on a B200 from
    # 0.10.2; from 0.18 the first backend's preferred size: FLASH_ATTN_MLA's 16 on Hopper (FLASHMLA's 64 with an
    # fp8 cache, which FLASH_ATTN_MLA does not take), FLASHINFER_MLA's 32 on SM100.
    r1 = _model("deepseek-ai/DeepSeek-R1")
    b200 = find_gpu("B200")

    def block(version, gpu=H100, **flags):
        return resolve_flags(r1, VllmFlags(version=version, tensor_parallel_size=8, **flags), gpu).block_size

    assert [block(v) for v in ("0.7.3", "0.8.5", "0.17.1", "0.18.0", "0.33.0")] == [16, 64, 64, 16, 16]
    assert [block(v, b200) for v in ("0.8.5", "0.10.2", "0.17.1", "0.19.0")] == [16, 128, 128, 32]
    assert block("0.19.0", A100) == 16 and block("0.19.0", kv_cache_dtype="fp8") == 64
    # A given size: forced unless it is the backend's (0.10.2), or a multiple of it (0.11.1+); kept from 0.18.
    assert [block(v, block_size=128) for v in ("0.10.2", "0.13.0", "0.19.0")] == [64, 128, 128]
    # A model without MLA keeps vLLM's 16.
    assert resolve_flags(LLAMA, VllmFlags(version="0.13.0"), H100).block_size == 16


def test_the_one_request_check_holds_the_null_block_back_from_0_29():
    # Llama-3.1-8B at 8,192 tokens: a 16-token block is 32 layers x 16 x 8 heads x (128 + 128) x 2 B = 2,097,152 B
    # and one request takes 512 of them, 1,073,741,824 B. Given exactly that, 0.28 starts; 0.29 checks the memory
    # less one block (the null block), 1,071,644,672 B, and refuses: 511 blocks hold 8,176 tokens.
    flags = {"max_model_len": 8192, "kv_cache_memory_bytes": 1_073_741_824, "compile_cache": "warm"}
    assert plan_vllm(LLAMA, VllmFlags(version="0.28.0", **flags), H100).refusal is None
    r = plan_vllm(LLAMA, VllmFlags(version="0.29.0", **flags), H100)
    assert r.refusal is not None and r.refusal.code == "one_request"
    assert "estimated maximum model length is 8176." in r.refusal.message
    assert r.max_model_len_fit == 8176
