"""vLLM's start-up rules per release, 0.6.0 to 0.33: one frozen record per range, built change by change.

Every field names a rule docs/engine-rules.md found in vLLM's own source at that release (the section is
given beside each change below). A release maps to the record of the last change at or before it:
0.10.1.1 takes the 0.10.1 record, 0.16.1rc1.dev206+g097eb544e the 0.16 one. "current" is the newest.
"""

from __future__ import annotations

import re
from dataclasses import replace

from kvplan.engines.vllm_lora import EXTRA_VOCAB
from kvplan.errors import FieldError
from kvplan.records import dataclass

Release = tuple[int, int, int]

OLDEST: Release = (0, 6, 0)
NEWEST: Release = (0, 33, 0)
ACCEPTED = "a vLLM release from 0.6.0 to 0.33 (e.g. 0.6.4, 0.10.1.1, 0.19, 0.33.0) or current"

# "0.10.1.1", "0.6.3.post1", "0.16.1rc1.dev206+g097eb544e", "0.13.0+faa43dbf.nv26.01", "v0.19.0".
_VERSION_RE = re.compile(
    r"v?(?P<major>\d+)\.(?P<minor>\d+)(?:\.(?P<patch>\d+))?(?:\.\d+)?"
    r"(?:\.?(?:post|rc|a|b)\d+)?(?:\.dev\d+)?(?:\+[0-9A-Za-z.]+)?"
)


@dataclass(frozen=True)
class VllmRules:
    """What one vLLM release does at start-up (engine-rules.md section in brackets)."""

    since: Release  # the first release with exactly these rules
    label: str  # what changed there, for people
    default_engine: str = "v0"  # "v0" or "v1" [1.1]
    v1_available: bool = False  # VLLM_USE_V1=1 possible [1.1]
    v0_available: bool = True  # VLLM_USE_V1=0 possible [1.1]
    default_utilization: float = 0.90  # [1.3]
    requested_ceil: bool = False  # requested = ceil(total x util), else the float product [1.2]
    # V1 refuses to start when free memory at its snapshot is below total x util: None (no check), "plain"
    # (0.9.1: "Free memory on device (a/b GiB) ..."), "device" (0.14: "Free memory on device cuda:0 ...") [1.2]
    startup_check: str | None = None
    snapshot_after_comms: bool = False  # the worker's snapshot follows the distributed set-up (0.11+) [1.2]
    v1_chunked_optional: bool = False  # V1 honours --no-enable-chunked-prefill (0.11.1+; before, always on) [1.4]
    # How the non-KV memory is measured, per engine [1.2, 1.7]:
    #   "free_drop" (V0 0.6.0-0.6.3): free memory at start minus free after profiling, torch's cache included;
    #   "absolute"  (V0 0.6.4, V1 <= 0.9.0): torch's absolute peak (weights included) plus all non-torch memory,
    #               so the CUDA context and communicators set up before the worker's snapshot are charged;
    #   "snapshot"  (V0 0.6.5+, V1 0.9.1-0.26): weights + torch peak increase + non-torch increase since the
    #               snapshot taken after the context exists;
    #   "consumed"  (V1 0.27+): the drop in free memory plus the transient peak; the same terms, measured
    #               through mem_get_info.
    v0_budget: str = "free_drop"
    v1_budget: str = "absolute"
    cudagraphs_subtracted: bool = False  # the CUDA-graph estimate comes off the budget [1.6]
    cudagraphs_profiled: bool = False  # an estimate pass captures graphs before the KV cache [1.6]
    v0_chunked_tokens: int = 512  # V0 max_num_batched_tokens with chunked prefill on [1.4]
    # What keeps V0 from turning chunked prefill on past 32K tokens, beyond a sliding window and LoRA (vllm.
    # _v0_auto_chunked) [1.4]: "prefix_caching", "multimodal", "rocm", "mla"
    v0_auto_chunked_excludes: tuple[str, ...] = ("prefix_caching",)
    # "fixed" (2048/1024), "name" (h100/h200), "memory", "memory_not_a100", "memory_tiers" (0.28: >= 160 GiB) [1.4]
    v1_batch_rule: str = "fixed"
    batch_caps: bool = False  # tokens <= seqs x len, seqs <= tokens when defaulted [1.4]
    hybrid_groups: bool = False  # V1 groups sliding/full/Mamba layers with one unified page [1.9]
    v1_tokens_rule: str = "blocks"  # "blocks", "blocks_per_group", "concurrency" [1.8]
    v1_concurrency_rule: str = "tokens"  # "tokens" (tokens / len) or "blocks" (blocks / blocks per request) [1.8]
    concurrency_line: bool = False  # V0 logs "Maximum concurrency ..." [1.8]
    sampler_warmup: bool = False  # V1 warms the sampler up after the KV cache is allocated [1.5]
    v1_sampler: str = "logits"  # "logits" (all tokens, no sampler), "sort" (PyTorch), "triton" [1.5]
    image_sampler: str | None = None  # the official image's sampler where its FlashInfer changes it [1.5]
    moe_workspace_kept: bool = False  # the fused-MoE scratch outlives the forward (workspace manager) [1.5]
    moe_scratch: str = "three"  # the fused-MoE buffers a forward allocates (vllm_memory.MOE_ROW_VALUES) [1.5]
    moe_chunk_tokens: int | None = 32_768  # VLLM_FUSED_MOE_CHUNK_SIZE's default (None: no chunking) [1.5]
    moe_marlin_old: bool = True  # AWQ/GPTQ experts through the first Marlin MoE kernel (to 0.8.4) [1.5]
    # Experts on DeepGEMM's grouped GEMM keep rows padded per expert (vllm_deepgemm) [1.5]. Where: block-FP8
    # MoE on SM90/SM100 with the deep_gemm package, "sm90_shape" (0.11.0: SM90 only past _valid_deep_gemm),
    # "always" (0.11.1), "below_tp8" (0.12-0.14: off at tp >= 8 unless asked), on SM12x "sm12x" (0.24+);
    # None: Triton, FlashInfer or not read (0.15-0.23)
    deepgemm_fp8: str | None = None
    deepgemm_mxfp4_sm12x: bool = False  # DeepSeek-V4's MXFP4 experts on SM12x (DEEPGEMM_MXFP4, 0.24-0.31)
    deepgemm_vendored: bool = False  # deep_gemm ships inside vLLM's wheel (vllm.third_party, 0.20+); before: image
    deepgemm_rows: str = "uncapped"  # vllm_deepgemm.ROW_RULES: "capped" 0.24, "sm120" 0.25, "sm120_fp8" 0.31
    deepgemm_widths: str = "0.11.0"  # vllm_deepgemm.WIDTHS: "0.11.1" (0.11.1-0.12), "0.13" (0.13+)
    # V0 splits the blocks over its pp virtual engines; from 0.8.0 its start-up check asks one engine's share
    # to hold a request (worker.py raise_if_cache_size_invalid: num_gpu_blocks // pipeline_parallel_size) [1.8]
    v0_pp_check_split: bool = False
    capture_rule: str = "v1_512"  # "v1_512", "v1_2seqs", "v1_2seqs_16" [1.6]
    full_graphs: bool = False  # FULL_AND_PIECEWISE: a full decode set beside the piecewise one [1.6]
    blackwell_1024: bool = False  # capture up to 1,024 on data-center Blackwell [1.6]
    block_sizes: tuple[int, ...] | None = (8, 16, 32, 64, 128)  # None: any positive size [1.9]
    kv_cache_dtypes: tuple[str, ...] = ("auto", "fp8", "fp8_e5m2", "fp8_e4m3")  # [1.12]
    mla_latent: bool = False  # MLA caches the compressed latent (0.7.1+), not per-head K/V [1.23]
    mla_quant_gate: bool = False  # MLA only for fp8 checkpoints (0.7.1-0.7.2 ModelConfig.use_mla) [1.23]
    # Model types the plain attention path caches per head without MLA, and that cache's head width (None:
    # qk_nope + qk_rope_head_dim; 0.6.x pads to 256 for FlashAttention): ModelConfig.get_head_size [1.23].
    mla_dense_types: tuple[str, ...] = ("deepseek_v2",)
    mla_dense_head: int | None = 256
    # What an MLA layer keeps beside its checkpoint weights after loading (vllm_mla.mla_kept_bytes) [1.23]:
    # "none" (no MLA), "absorbed_fp32" (0.7.1-0.7.2: absorbed matrices, fp8 dequantized to float32),
    # "absorbed" (0.7.3: dequantized in the model dtype), "kv_b" (0.8+: a dequantized kv_b_proj only).
    mla_weights: str = "none"
    mla_page_align: bool = False  # V0 pads an MLA latent to 256 B of the model dtype on CUDA (0.7.2-0.7.3) [1.23]
    # The block size an MLA backend sets (vllm_mla.mla_block_size) [1.9]: "none" (0.7.x), "flashmla" (0.8.0:
    # 64 on Hopper), "forced" (0.10.2: and 128 on SM100), "forced_multiple" (0.11.1: a given multiple stands),
    # "preferred" (0.18: the first backend's preferred size, a given size stands).
    mla_block_rule: str = "none"
    mxfp4: bool = False  # gpt-oss mxfp4 MoE weights load (0.10.1+) [1.10]
    # Where mxfp4's Triton backend (OpenAI's triton_kernels) comes from on Hopper/Blackwell [1.10]: "none" (0.10.1
    # pins torch 2.7.1, below the 2.8 it needs), "package" (0.10.2-0.11: the optional triton_kernels package, in
    # the image, not a dependency of the wheel), "vendored" (0.12+: vllm/third_party/triton_kernels).
    mxfp4_triton: str = "none"
    flashinfer_dependency: bool = False  # the vllm wheel itself depends on FlashInfer (0.12+) [1.5, 1.10]
    bitsandbytes: bool = True  # bitsandbytes weights load (0.6-0.27; 0.28 drops the method) [1.19]
    kv_cache_memory_option: bool = False  # --kv-cache-memory-bytes exists (0.10.2+) [1.2]
    mamba_dtype_options: bool = False  # --mamba-cache-dtype and --mamba-ssm-cache-dtype exist (0.10.1+) [1.9]
    combined_kv_line: bool = False  # "GPU KV cache size" and "Maximum concurrency" on one line (0.28+) [1.8]
    # The ModelOpt KV quantizations --kv-cache-dtype auto follows (resolve_kv_cache_dtype_string): FP8 from 0.14,
    # NVFP4 too from 0.20; any other name, or an older release, keeps the model dtype [1.27]
    checkpoint_kv: tuple[str, ...] = ()
    # V1's weights line (gpu_model_runner.load_model) [1.8]: "loading_gb" ("Loading model weights took %.4f GB",
    # 0.6.4-0.7.x), "took_gb" ("Model loading took %.4f GB and ...", 0.8.0), "took_gib" (0.8.3), "took_gib_memory"
    # ("%.4f GiB memory and ...", 0.11.1), "format_gib" ("%s GiB memory", format_gib, 0.14); Model Runner V2
    # writes "GiB and" without "memory" until 0.28 (v2_load_memory_word).
    v1_load_wording: str = "loading_gb"
    v2_load_memory_word: bool = False
    v1_blocks_concurrency: bool = False  # V1 0.7.1-0.7.x print "Maximum concurrency" after "# GPU blocks" [1.8]
    # V1 logs the profiling result (DEBUG) and "Available KV cache memory" from 0.9.1 (gpu_worker.py) [1.8]
    v1_profile_logged: bool = False
    lora_extra_vocab: int = EXTRA_VOCAB  # lora_extra_vocab_size: rows a LoRA slot adds to the vocabulary [1.16]
    pixels_in_model_dtype: bool = False  # the processor's float outputs are cast to the model dtype (0.9.1+) [1.11]
    mamba_cache_modes: bool = False  # prefix caching on a hybrid sets mamba_cache_mode "align"/"all" (0.15+) [1.9]
    # The mode prefix caching picks (models/config.py MambaModelConfig.verify_and_update_config) [1.9]:
    # "support" ("all" where the model supports Mamba prefix caching, else "align"), "support_unless_spec"
    # (0.20-0.21: "align" under speculative decoding), "align" (0.28+: "all" only when asked; 0.32 drops it).
    mamba_mode_default: str = "support"
    # a hybrid with attention and state layers gets prefix caching by default (0.28+; EngineArgs) [1.9]
    hybrid_prefix_caching: bool = False
    mamba_all_spec_pages: bool = False  # "all" mode adds the draft's state pages too (0.22+) [1.9]
    mamba2_checkpoint_page: bool = False  # "align" mode keeps a Mamba2 prefill checkpoint page (0.32+) [1.9]
    # Nemotron-H's SSM state when --mamba-ssm-cache-dtype is auto: None = the conv state's dtype (the model's);
    # else the config's mamba_ssm_cache_dtype, or this (NemotronHForCausalLMConfig, 0.13+) [1.9]
    nemotron_ssm_default: str | None = None
    # Which models run on Model Runner V2 (vllm/v1/worker/gpu/) by default (VllmConfig.use_v2_model_runner):
    # None (V1's GPUModelRunner for all), "listed" (0.22-0.24: the architectures below), "dense" (0.25: generate
    # models without MoE or state layers, vllm-project/vllm#44443, and the MoE architectures listed), "all" (0.29)
    # [1.20]
    v2_runner: str | None = None
    v2_architectures: tuple[str, ...] = ()  # DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES
    v2_listed_unquantized: bool = False  # 0.22-0.23: a listed model only when neither MoE nor quantized
    # V2's profiled sampler copies the logits to float32 (0.25), or keeps them in their own dtype (0.26 works in
    # place; 0.27+ skips the copy for rows that ask for no logits processing, as the dummy rows do) [1.20]
    v2_sampler_fp32: bool = False
    v2_cudagraphs_profiled: bool = False  # V2 estimates CUDA graphs before the KV cache (0.29+) [1.20]
    v2_sharded_sampling: bool = False  # V2 samples each tp rank's share of the rows (0.29+) [1.20]
    # V1's first FULL graph capture warms up with max_num_batched_tokens of context (profile_seq_lens); from 0.26
    # a gated-DeltaNet hybrid leaves a transient of it in the allocator that the estimate counts (vllm#50780) [1.6]
    gdn_graph_transient: bool = False
    # A hybrid (Mamba / DeltaNet state) with FULL decode graphs refuses max_num_seqs above the KV cache's block
    # count, one state block per decode sequence (vllm#38270, compilation.py; 0.20+) [1.12]
    mamba_seqs_check: bool = False
    # A cold torch.compile (no compile cache yet) runs Inductor's combo-kernel benchmark inside the profiled
    # window: vLLM turns benchmark_combo_kernel on with torch >= 2.9 (config/compilation.py, 0.11.1+), and the
    # benchmark runs each kernel on fresh random copies of its arguments, the embedding table among them
    # (vllm#54122, vllm#54383) [1.21].
    compile_clone: bool = False
    # A sliding window (or attention chunk) reserves the tokens in flight beyond it: one step up to 0.25; from
    # 0.26 every concurrent batch's (VllmConfig.max_in_flight_tokens = max_concurrent_batches x step: 2 with
    # async scheduling on V1, pp + 1 on Model Runner V2) [1.9]
    window_in_flight_batches: bool = False
    # The worker creates its cuBLAS / cuBLASLt handles (a 16 x 16 mm and a linear with bias) before its memory
    # snapshot, so they join the baseline instead of the profiled growth (v1/worker/gpu_worker.py init_device,
    # 0.33.0; absent at 0.32.0) [1.7].
    cublas_before_snapshot: bool = False
    # The worker loads the model with the allocator's max_split_size at 20 MiB (gpu_worker.py
    # _scoped_allocator_max_split, 0.21.0; absent at 0.20.0), so no weight of 20 MiB or more shares its block
    # and "Model loading took" counts each rounded to 2 MiB (allocator.allocated_bytes) [1.2].
    load_max_split_mb: int | None = None
    # With LoRA every CUDA-graph size is captured twice, with no adapter active and with max_loras + 1
    # (CompilationConfig.cudagraph_specialize_lora = True; v1/cudagraph_dispatcher.py lora_cases, 0.11.1+) [1.6].
    lora_graph_cases: bool = False
    # ROCm's CUDA graphs are estimated and charged too: the worker skips the estimate on ROCm from 0.20 ("graph
    # pool handles and mem_get_info behave differently"; `not is_rocm()` in 0.20, `is_cuda()` 0.21-0.25) and
    # takes it on `is_cuda_alike()` from 0.26 (v1/worker/gpu_worker.py determine_available_memory) [1.6].
    cudagraphs_rocm: bool = False
    # An off-stride max_num_batched_tokens below the largest capture size is captured too (VllmConfig.
    # _set_cudagraph_sizes, 0.20.1; absent at 0.20.0) [1.6].
    capture_step: bool = False
    # With speculative decoding the largest capture size is min(max_num_seqs x (1 + draft) x 2, 512)
    # (VllmConfig._set_cudagraph_sizes decode_query_len, 0.13.0; absent at 0.12.0) [1.6].
    capture_spec_len: bool = False
    # V1's KV-room refusals (v1/core/kv_cache_utils.py _check_enough_kv_cache_memory): "plain" to 0.12;
    # "docs_link" from 0.13 adds "See https://docs.vllm.ai/.../conserving_memory/ for more details."; "cpu_note"
    # from 0.22 says "model's" (was "models's") and that the utilization also reserves CPU memory [1.12].
    kv_refusal_wording: str = "plain"
    # V1's block pool keeps one block as the null block padded block-table slots point at (v1/core/block_pool.py
    # null_block, 0.8.3; absent from v1/core at 0.8.2) [1.8].
    null_block: bool = False
    # The one-request check and the longest-length estimate plan with the available memory less one block, the
    # null block (kv_cache_utils.py check_enough_kv_cache_memory and get_kv_cache_configs, 0.29.0; absent at
    # 0.28.0) [1.12].
    check_null_block: bool = False
    # DeepSeek-V4's caches (vllm_dsv4, engine-rules.md 1.24), from the 0.20-0.33 sdists. `dsv4`: the model is
    # registered (0.20+). `dsv4_pool`, the bytes one block id takes in the shared pool: "tuples" (0.20-0.22:
    # layer tuples x the full-MLA group's page sizes), "slots" (0.23-0.26: each page size x the most layers of
    # it in one group), "stride" (0.27+: the largest group's pages). `dsv4_check`, what the one-request check
    # charges a page: "tuples" to 0.28, "stride" from 0.29. `dsv4_state_padded`: compressor-state pages are
    # raised to the next full-MLA page size (0.20-0.26). `dsv4_weighted_concurrency`: the concurrency divides
    # by page-weighted blocks (0.20-0.26). `dsv4_mtp_buffer`: the MTP hidden-state buffer is built without
    # speculative decoding too (0.20-0.26; from 0.27 only for a draft). `dsv4_auto_fp8`: --kv-cache-dtype auto
    # takes fp8 (0.30+; before, the attention layer asserts an fp8 cache).
    dsv4: bool = False
    dsv4_pool: str = "tuples"
    dsv4_check: str = "tuples"
    dsv4_state_padded: bool = True
    dsv4_weighted_concurrency: bool = True
    dsv4_mtp_buffer: bool = True
    dsv4_auto_fp8: bool = False
    # The attention backend and FlashInfer's buffers in the CUDA-graph estimate (vllm_attention, engine-rules.md
    # 1.26), from the 0.18-0.33 sdists. `flashinfer_workspace`: "" (not modelled: the estimate is off the budget
    # before 0.20), "fixed" (0.20-0.25: 394 MiB), "step" (0.26+: at least the prefill chunk's heads x 16 B).
    # `flashinfer_head_512`: FlashInfer takes 512-wide heads (0.22+). `flashinfer_min_capability`: SM75 to 0.23,
    # SM80 from 0.24. `flashinfer_sink_majors`: the SM majors FlashInfer runs attention sinks on (SM100 to 0.27,
    # SM12x from 0.28, SM90 from 0.30). `xqa_majors`: the SM majors FlashInfer decodes on through XQA (SM90 from
    # 0.25, SM12x from 0.28).
    flashinfer_workspace: str = ""
    flashinfer_head_512: bool = False
    flashinfer_min_capability: tuple[int, int] = (7, 5)
    flashinfer_sink_majors: tuple[int, ...] = (10,)
    xqa_majors: tuple[int, ...] = ()
    # Sparse MLA (DeepSeek-V3.2 and V4) on SM120 (RTX PRO 6000, RTX 5090) through FlashInfer (0.24+).
    sparse_mla_sm120: bool = False
    # DeepSeek-V3.2's sparse attention (vllm_dsa, engine-rules.md 1.25), from the 0.11-0.33 sdists. `dsa`: the
    # model runs (0.11+). `dsa_auto_fp8`: --kv-cache-dtype auto stores fp8_ds_mla (0.11.0 only; the model dtype
    # after). `dsa_block_forced`: the platform forces 64-token blocks over --block-size (to 0.17).
    # `dsa_fp8_flashinfer`, where SM100 stores an fp8 cache as plain fp8 under FlashInfer-sparse: "never" (to
    # 0.17), "small_heads" (0.18: 16 heads a rank or fewer), "always" (0.19+). `dsa_block_table`: the indexer
    # builder's expanded block table (0.17+). `dsa_index_groups`: a top-k index group per layer (0.30+).
    dsa: bool = False
    dsa_auto_fp8: bool = False
    dsa_block_forced: bool = True
    dsa_fp8_flashinfer: str = "never"
    dsa_block_table: bool = False
    dsa_index_groups: bool = False

    @property
    def release(self) -> str:
        return ".".join(map(str, self.since))

    def budget(self, engine: str) -> str:
        """How `engine` ("v0" or "v1") measures the non-KV memory in this release."""
        return self.v0_budget if engine == "v0" else self.v1_budget

    def charges_context(self, engine: str) -> bool:
        """Whether the CUDA context and early communicators come off the budget (the "absolute" measure)."""
        return self.budget(engine) == "absolute"


# --kv-cache-dtype choices (config/cache.py CacheDType in each sdist; sizes in vllm_kv_quant) [1.27].
_KV_0_18 = ("auto", "float16", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla")
_KV_0_20 = _KV_0_18 + ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
                       "int8_per_token_head", "fp8_per_token_head", "nvfp4")
_KV_0_25 = _KV_0_20 + ("int4_per_token_head",)
_KV_0_28 = _KV_0_25 + ("nvfp4_4over6",)
_KV_0_30 = _KV_0_28 + ("nvfp4_ds_mla",)
_KV_0_32 = _KV_0_30 + ("ultraquant_4bit",)
_KV_0_33 = _KV_0_32 + ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")


def _changes() -> tuple[VllmRules, ...]:
    """The rule records, oldest first; each is the previous one with what that release changed."""
    out = [VllmRules(OLDEST, "V0 engine; budget = total x util - (free at start - free after profiling)",
                     block_sizes=(8, 16, 32))]

    def change(since: Release, label: str, **fields: object) -> None:
        out.append(replace(out[-1], since=since, label=label, **fields))  # type: ignore[arg-type]

    change((0, 6, 1), "V0's automatic chunked prefill no longer waits on prefix caching", v0_auto_chunked_excludes=())
    change((0, 6, 2), "V0 keeps multimodal models off automatic chunked prefill",
           v0_auto_chunked_excludes=("multimodal",))
    change((0, 6, 3), "V0 logs 'Maximum concurrency ...'", concurrency_line=True)
    # --block-size choices (engine/arg_utils.py, then config/cache.py BlockSize): [8, 16, 32] to 0.6.3 and again
    # in 0.6.5, [8 .. 128] in 0.6.4 and from 0.6.6, 1 added in 0.8.5, 256 in 0.11.1, any size from 0.18.
    change((0, 6, 4), "V0 charges torch's absolute peak and the CUDA context; V1 opt-in (VLLM_USE_V1=1); block "
           "sizes to 128", v0_budget="absolute", v1_available=True, block_sizes=(8, 16, 32, 64, 128))
    change((0, 6, 5), "V0 memory_profiling: weights + peak increase + non-torch increase; chunked 2,048; block "
           "sizes to 32", v0_budget="snapshot", v0_chunked_tokens=2048, block_sizes=(8, 16, 32))
    change((0, 6, 6), "block sizes to 128; DeepSeek-V3; no automatic chunked prefill on ROCm",
           block_sizes=(8, 16, 32, 64, 128), mla_dense_types=("deepseek_v2", "deepseek_v3"),
           v0_auto_chunked_excludes=("multimodal", "rocm"))
    change((0, 7, 0), "V1 batch defaults by device name (h100/h200: 8,192 tokens); DeepSeek's per-head cache "
           "unpadded", v1_batch_rule="name", mla_dense_head=None)
    change((0, 7, 1), "MLA caches its latent, for fp8 or unquantized checkpoints; absorbed decode matrices; V1 "
           "logs its concurrency",
           mla_latent=True, mla_quant_gate=True, mla_weights="absorbed_fp32", v1_blocks_concurrency=True)
    change((0, 7, 2), "V0 pads the MLA latent to 256 bytes", mla_page_align=True)
    change((0, 7, 3), "MLA for every quantization, dequantized in the model dtype", mla_quant_gate=False,
           mla_weights="absorbed")
    # 0.8-0.11 sample with FlashInfer whenever it is importable (vllm/v1/sample/ops/topk_topp_sampler.py). The
    # vllm wheel does not install it (an extra at most, until 0.12 makes it a dependency and the sampler
    # opt-in), so a wheel runs PyTorch's sort; the vllm/vllm-openai image ships it (vllm-project/vllm#6172):
    # 0.8's image FlashInfer 0.2.1.post2 (a stored Dockerfile copy; below the 0.2.3 that 0.8 falls back on) uses
    # softmax probabilities; 0.9-0.11's newer one samples from the logits via top_k_mask_logits then softmax.
    change((0, 8, 0), "V1 is the default engine; sampler warm-up after the KV cache; FlashInfer in the image; "
           "fused-MoE caches 1 and 3 share a buffer; V0 checks one pipeline engine's blocks; FlashMLA's 64-token "
           "blocks on Hopper",
           default_engine="v1", sampler_warmup=True, v1_sampler="sort", image_sampler="flashinfer_probs",
           mla_weights="kv_b", mla_page_align=False, moe_scratch="cache13", v0_pp_check_split=True,
           v1_load_wording="took_gb", v0_auto_chunked_excludes=("multimodal", "mla"),
           mla_block_rule="flashmla")
    change((0, 8, 3), "V1 keeps a null block; its weights line in GiB", null_block=True, v1_load_wording="took_gib")
    # 0.8.4's _set_default_args_v1: 1,024 sequences for H100/H200 only, 256 elsewhere (1,024 everywhere before).
    change((0, 8, 4), "V1 batch defaults by device name, sequences too (others: 256)", v1_batch_rule="name_seqs")
    change((0, 8, 5), "V1 batch defaults by memory (>= 70 GiB: 8,192 tokens, 1,024 seqs); block size 1; "
           "the second Marlin MoE kernel",
           v1_batch_rule="memory", block_sizes=(1, 8, 16, 32, 64, 128), moe_marlin_old=False)
    change((0, 9, 0), "A100s get the small-GPU batch defaults; the image's FlashInfer samples from logits",
           v1_batch_rule="memory_not_a100", image_sampler="flashinfer_logits")
    # 0.9.1's call_hf_processor (vllm/inputs/registry.py) casts every floating processor output to the model
    # dtype on the CPU, so pixels reach the GPU in bf16/fp16, not float32 (absent at 0.9.0).
    change((0, 9, 1), "V1 budget from the worker's snapshot (context not charged); hybrid KV groups; pixels "
           "in the model dtype; the profiling result and available KV memory logged", v1_budget="snapshot",
           hybrid_groups=True, v1_tokens_rule="blocks_per_group", v1_concurrency_rule="blocks",
           pixels_in_model_dtype=True, startup_check="plain", v1_profile_logged=True)
    change((0, 10, 0), "CUDA graphs up to min(2 x max_num_seqs, 512)", capture_rule="v1_2seqs",
           kv_cache_dtypes=("auto", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc"))
    change((0, 10, 1), "gpt-oss mxfp4 MoE; --mamba-cache-dtype, --mamba-ssm-cache-dtype", mxfp4=True,
           mamba_dtype_options=True)
    change((0, 10, 2), "--kv-cache-memory-bytes; torch 2.8 (mxfp4 Triton where triton_kernels is installed); "
           "CUTLASS MLA's 128-token blocks on SM100", kv_cache_memory_option=True, mxfp4_triton="package",
           mla_block_rule="forced")
    change((0, 11, 0), "V1 only; FULL_AND_PIECEWISE CUDA graphs; the worker's snapshot after the communicators; "
           "bfloat16 KV; DeepSeek-V3.2 (auto stored as fp8_ds_mla); block-FP8 experts on DeepGEMM where installed",
           v0_available=False, full_graphs=True, snapshot_after_comms=True, dsa=True, dsa_auto_fp8=True,
           deepgemm_fp8="sm90_shape",
           kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc"))
    # 0.11.1: VLLM_USE_FLASHINFER_SAMPLER defaults to None and topk_topp_sampler.py takes FlashInfer only "if
    # envs.VLLM_USE_FLASHINFER_SAMPLER" ("Users must opt in explicitly"); 0.11.0 still took it "is not False".
    change((0, 11, 1), "defaulted tokens capped at seqs x len, seqs at tokens; V1 chunked prefill can be "
           "turned off; torch 2.9: a cold compile benchmarks combo kernels on copies of their arguments; capture "
           "sizes step 16 above 256; FlashInfer sampler opt-in (PyTorch sort in the image too); block size 256; "
           "LoRA graphs captured twice; V1's weights line says memory; a given multiple of an MLA backend's block "
           "stands; DeepSeek-V3.2's auto cache in the model dtype; DeepGEMM for block-FP8 experts without a shape "
           "check, its first buffer 2I wide", mla_block_rule="forced_multiple", deepgemm_fp8="always",
           deepgemm_widths="0.11.1",
           v1_load_wording="took_gib_memory", batch_caps=True, dsa_auto_fp8=False,
           v1_chunked_optional=True, compile_clone=True,
           capture_rule="v1_2seqs_16",
           image_sampler=None, block_sizes=(1, 8, 16, 32, 64, 128, 256), lora_graph_cases=True,
           kv_cache_dtypes=("auto", "bfloat16", "fp8", "fp8_e5m2", "fp8_e4m3", "fp8_inc", "fp8_ds_mla"))
    change((0, 12, 0), "no LoRA extra vocabulary; FlashInfer and triton_kernels in every install; MoE chunks "
           "of 16,384 tokens; DeepGEMM MoE off at tp 8 and more", deepgemm_fp8="below_tp8",
           lora_extra_vocab=0, mxfp4_triton="vendored", flashinfer_dependency=True, moe_chunk_tokens=16_384)
    change((0, 13, 0), "Nemotron-H's SSM state: the config's mamba_ssm_cache_dtype, else float16; capture sizes "
           "sized by speculative decode steps; KV refusals link the docs; DeepGEMM's buffers max(I, H) and max(2I, H) "
           "wide", nemotron_ssm_default="float16", capture_spec_len=True, kv_refusal_wording="docs_link",
           deepgemm_widths="0.13")
    change((0, 14, 0), "requested = ceil(total x util); the fused-MoE runs TritonExperts, whose workspace is "
           "kept between steps; the start-up check names the device; log figures through format_gib; "
           "--kv-cache-dtype auto follows a ModelOpt checkpoint's FP8 KV",
           requested_ceil=True, moe_workspace_kept=True, startup_check="device", moe_scratch="workspace",
           v1_load_wording="format_gib", checkpoint_kv=("FP8",))
    # 0.15's MambaModelConfig: prefix caching on a hybrid sets mamba_cache_mode "all" (models that support
    # Mamba prefix caching) or "align" (the rest: gated DeltaNet), and MambaSpec.max_memory_usage_bytes then
    # counts 2 state pages a request in "align" mode, cdiv(max_model_len, block) in "all" (1 with it off).
    change((0, 15, 0), "prefix caching on a hybrid: mamba_cache_mode align/all; block-FP8 experts planned on "
           "Triton (0.15 not read; from 0.16 FlashInfer or Triton)", mamba_cache_modes=True, deepgemm_fp8=None)
    change((0, 17, 0), "Triton top-k/top-p sampler; the DSA indexer's expanded block table", v1_sampler="triton",
           dsa_block_table=True)
    change((0, 18, 0), "CUDA-graph memory profiled before the KV cache (not subtracted); any block size; float16 "
           "KV spelling; no MoE chunking; the first attention backend picks the block size; DeepSeek-V3.2's fp8 "
           "cache plain under FlashInfer-sparse (SM100, 16 heads a rank or fewer)",
           cudagraphs_profiled=True, block_sizes=None, moe_chunk_tokens=None, mla_block_rule="preferred",
           dsa_block_forced=False, dsa_fp8_flashinfer="small_heads",
           kv_cache_dtypes=_KV_0_18)
    change((0, 19, 0), "SM100 runs any quantized DeepSeek-V3.2 cache on FlashInfer-sparse", dsa_fp8_flashinfer="always")
    # vllm#38270 (merged 2026-03) made resolve_cudagraph_mode_and_sizes raise where it had capped the capture
    # sizes: NVIDIA-NeMo/RL#2620 bisects it to 0.17.1 (starts) -> 0.20.0 (raises), and vllm-project/recipes#551
    # shows 0.17.0-0.19.0 reaching capture with 1,024 sequences on 856 blocks.
    change((0, 20, 0), "utilization 0.92; CUDA-graph estimate subtracted from the budget; Nemotron-H's SSM "
           "state float32 unless the config says; a hybrid's max_num_seqs bounded by the cache's blocks; Mamba "
           "prefix caching aligned under speculative decoding; DeepSeek-V4; DeepGEMM inside the wheel; "
           "FlashInfer's 394 MiB workspace in the "
           "graph estimate; TurboQuant, per-token-head int8/fp8 and NVFP4 caches (auto follows a ModelOpt NVFP4 KV)",
           default_utilization=0.92, cudagraphs_subtracted=True, nemotron_ssm_default="float32",
           mamba_seqs_check=True, mamba_mode_default="support_unless_spec", dsv4=True,
           flashinfer_workspace="fixed", kv_cache_dtypes=_KV_0_20, checkpoint_kv=("FP8", "NVFP4"),
           deepgemm_vendored=True)
    change((0, 20, 1), "'GPU KV cache size' = int(concurrency x max_model_len); an off-stride step is captured",
           v1_tokens_rule="concurrency", capture_step=True)
    change((0, 21, 0), "the model loads with the allocator's max_split_size at 20 MiB: large weights count whole "
           "2 MiB blocks", load_max_split_mb=20)
    # Model Runner V2 (vllm/config/vllm.py _is_default_v2_model_runner_model and DEFAULT_V2_MODEL_RUNNER_
    # ARCHITECTURES in each release's sdist; release notes of 0.25.0, 2026-07-11, and 0.29.0, 2026-09-09): its
    # profile_run samples the dummy rows without top-k/top-p, its profile_cudagraph_memory returns 0 until 0.29,
    # and it warms kernels up instead of V1's sampler warm-up.
    change((0, 22, 0), "Model Runner V2 by default for Qwen3 dense unquantized models; KV refusals say model's; "
           "Mamba prefix caching 'all' under speculative decoding too, with the draft's state pages; FlashInfer "
           "takes 512-wide heads",
           v2_runner="listed", v2_architectures=("Qwen3ForCausalLM",), v2_listed_unquantized=True,
           v2_sampler_fp32=True, kv_refusal_wording="cpu_note", mamba_mode_default="support",
           mamba_all_spec_pages=True, flashinfer_head_512=True)
    change((0, 23, 0), "Model Runner V2 by default for Llama, Mistral and Qwen3 dense unquantized models; "
           "DeepSeek-V4's pool sized by page-size slots",
           v2_architectures=("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"), dsv4_pool="slots")
    change((0, 24, 0), "Model Runner V2 for the listed architectures, quantized or MoE too; sparse MLA on SM120; "
           "FlashInfer from SM80; DeepGEMM on SM12x (block-FP8 and DeepSeek-V4's experts), padding only the "
           "experts a step can reach",
           sparse_mla_sm120=True,
           v2_architectures=("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "LlamaForCausalLM",
                             "MistralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM"),
           v2_listed_unquantized=False, flashinfer_min_capability=(8, 0), deepgemm_fp8="sm12x",
           deepgemm_mxfp4_sm12x=True, deepgemm_rows="capped")
    change((0, 25, 0), "Model Runner V2 default for dense models and three MoE architectures: one float32 copy "
           "of the logits in the profiled sampler, no CUDA-graph estimate; FlashInfer decodes through XQA on "
           "SM90; an int4 per-token-head cache; DeepGEMM's SM120 blocks of 64 rows", v2_runner="dense",
           xqa_majors=(9,), kv_cache_dtypes=_KV_0_25,
           v2_architectures=("DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"),
           deepgemm_rows="sm120")
    # vllm#50780 (open): the estimator is unchanged from 0.23, but from 0.26.0 the GDN decode-with-context path
    # its FULL warm-up runs leaves a transient that grows with max_num_batched_tokens (op not pinned upstream).
    change((0, 26, 0), "a gated-DeltaNet hybrid's CUDA-graph estimate holds a profiling transient (not modelled); "
           "V2's profiled sampler keeps the logits in their own dtype; windows reserve every in-flight batch; ROCm "
           "charges its graph estimate; FlashInfer's workspace sized by the prefill chunk's heads",
           gdn_graph_transient=True, v2_sampler_fp32=False, window_in_flight_batches=True, cudagraphs_rocm=True,
           flashinfer_workspace="step")
    change((0, 27, 0), "non-KV memory = drop in free memory + transient peak (same terms); DeepSeek-V4's pool "
           "strided by its largest group, state pages unpadded, plain concurrency, no MTP buffer without a draft",
           v1_budget="consumed", dsv4_pool="stride", dsv4_state_padded=False, dsv4_weighted_concurrency=False,
           dsv4_mtp_buffer=False)
    change((0, 28, 0), "CUDA graphs up to 1,024 on data-center Blackwell; one KV size and concurrency line; "
           "no bitsandbytes; 16,384 tokens and 1,024 sequences on GPUs of 160 GiB and more; V2's weights line "
           "says memory; prefix caching on by default for hybrids, aligning their Mamba state; FlashInfer "
           "decodes through XQA on SM12x too, and runs sinks there; Model Runner V2 by default for DeepSeek-V4 "
           "on CUDA; the nvfp4_4over6 cache", kv_cache_dtypes=_KV_0_28,
           blackwell_1024=True, combined_kv_line=True, bitsandbytes=False, v1_batch_rule="memory_tiers",
           hybrid_prefix_caching=True,
           v2_load_memory_word=True, mamba_mode_default="align", flashinfer_sink_majors=(10, 12),
           xqa_majors=(9, 12), v2_architectures=("DeepseekV2ForCausalLM", "DeepseekV4ForCausalLM",
                                                  "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"))
    change((0, 29, 0), "Model Runner V2 for every model; it estimates CUDA graphs; batch-sharded sampling; "
           "DeepSeek-V4's one-request check at the pool's stride; the check holds the null block back",
           v2_runner="all", v2_cudagraphs_profiled=True, v2_sharded_sampling=True, dsv4_check="stride",
           check_null_block=True)
    change((0, 30, 0), "DeepSeek-V4 takes --kv-cache-dtype auto as fp8; a DSA top-k index group per layer; "
           "FlashInfer runs sinks on SM90; the nvfp4_ds_mla cache (not sized)", kv_cache_dtypes=_KV_0_30,
           dsv4_auto_fp8=True, dsa_index_groups=True, flashinfer_sink_majors=(9, 10, 12))
    change((0, 31, 0), "DeepGEMM's experts keep their permuted activations as fp8", deepgemm_rows="sm120_fp8")
    # v1/kv_cache_interface.py MambaSpec gains num_prefill_checkpoint_blocks at 0.29.0; mamba_mixer2.py sets it
    # to 1 from 0.32.0 (absent at 0.31.0).
    change((0, 32, 0), "a Mamba2 mixer keeps a prefill checkpoint page in align mode; the ultraquant_4bit cache "
           "(ROCm, not sized); DeepSeek-V4's experts on SM12x not read (planned as Triton's)",
           mamba2_checkpoint_page=True, kv_cache_dtypes=_KV_0_32, deepgemm_mxfp4_sm12x=False)
    change((0, 33, 0), "cuBLAS handles created before the worker's snapshot; the octave caches (ROCm, not sized)",
           cublas_before_snapshot=True, kv_cache_dtypes=_KV_0_33)
    return tuple(out)


RULES: tuple[VllmRules, ...] = _changes()


def parse_release(text: str) -> Release:
    """A release string as (major, minor, patch): "0.10.1.1" -> (0, 10, 1); "current" -> the newest.

    Raises FieldError on engine.version for anything else, or a release outside 0.6.0 .. 0.33.
    """
    raw = str(text).strip()
    if raw.lower() in ("current", "latest", "newest"):
        return NEWEST
    m = _VERSION_RE.fullmatch(raw)
    if m is None:
        raise FieldError("engine.version", f"must be {ACCEPTED}", raw[:40])
    release = (int(m["major"]), int(m["minor"]), int(m["patch"] or 0))
    if not OLDEST <= release <= (NEWEST[0], NEWEST[1], 10**6):
        raise FieldError("engine.version", f"is outside the releases kvplan models; use {ACCEPTED}", raw[:40])
    return release


def rules_for(version: str) -> VllmRules:
    """The rules of `version` ("0.19", "0.6.4", "current", ...)."""
    release = parse_release(version)
    return [r for r in RULES if r.since <= release][-1]


def engine_for(rules: VllmRules, use_v1: bool | None, field: str = "engine.use_v1") -> str:
    """"v0" or "v1": the release's default engine, or the one VLLM_USE_V1 asks for if the release has it."""
    if use_v1 is None:
        return rules.default_engine
    if use_v1 and not rules.v1_available:
        raise FieldError(field, f"vLLM {rules.release} has no V1 engine (0.6.4 and later)", use_v1)
    if not use_v1 and not rules.v0_available:
        raise FieldError(field, f"vLLM {rules.release} has no V0 engine (0.10.x and earlier)", use_v1)
    return "v1" if use_v1 else "v0"
