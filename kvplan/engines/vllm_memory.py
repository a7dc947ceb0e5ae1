"""vLLM's memory accounting before the KV cache: weights per rank, profiling activation peak, non-torch memory.

vLLM 0.19 (vllm/v1/worker/gpu_worker.py determine_available_memory) computes, per GPU,
    available_kv = ceil(total_memory * gpu_memory_utilization) - weights - activation_peak - non_torch
where `weights` is the torch memory the loaded model holds (parameters plus buffers such as the rotary
cos/sin cache), `activation_peak` the torch peak of one dummy forward of max_num_batched_tokens tokens plus
the sampler over max_num_seqs rows (and, for multimodal models, the vision encoder before them), and
`non_torch` what cuBLAS and NCCL grew by meanwhile. Other releases charge other terms (vllm_versions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from kvplan.capacity.kv import pp_stage_layers
from kvplan.capacity.weights import runtime_quant
from kvplan.engines.allocator import allocated_bytes, loaded_tensor_bytes
from kvplan.engines.vllm_deepgemm import DeepGemmScratch, deepgemm_workspace_bytes
from kvplan.engines.vllm_dsv4 import dsv4_forward_bytes
from kvplan.engines.vllm_encoder import EncoderProfile
from kvplan.engines.vllm_lora import LoraSlots, lora_slot_bytes
from kvplan.engines.vllm_mxfp4 import Mxfp4Backend, expert_bytes_per_rank
from kvplan.hardware.gpus import COMPUTE_CAPABILITY, resident_threads
from kvplan.model.dtypes import serving_dtype, weight_dtype_bytes
from kvplan.model.quant import group_weight_bytes
from kvplan.model.specs import LayerKind, ModelSpec, ParamGroup, QuantSpec
from kvplan.records import dataclass
from kvplan.units import FP32_BYTES, GiB, cdiv

# VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a multiple of 64 before splitting it over
# TP ranks: Granite's 49,155 tokens become 49,216 rows.
VOCAB_PADDING = 64

# Families whose positions are learned embeddings, not rotary: they hold no cos/sin cache.
_NO_ROPE = ("gpt2", "gpt_bigcode", "opt")
# Families whose pipeline stages pass only "hidden_states" between them (make_empty_intermediate_tensors_factory
# in vllm/model_executor/models/<family>.py); the others pass "hidden_states" and "residual".
_ONE_INTERMEDIATE = ("arctic", "bloom", "chatglm", "dbrx", "falcon", "gpt2", "gpt_bigcode", "gptj", "gpt_neox",
                     "jais", "mpt", "olmo", "olmo2", "opt", "persimmon", "phi", "stablelm", "starcoder2")

# --- Activation peak, fitted on the fit split (`python benchmarks/vllm_accuracy.py --fit`) ---------------
# The profiling run is one forward of T = max_num_batched_tokens tokens, then (last pipeline stage only) the
# sampler on S = min(max_num_seqs, T) rows of logits over the padded vocabulary V. Two peaks compete and
# the larger one is what torch records (b = bytes of the weight dtype):
#   forward: FWD_BASE + FWD_PER_TOKEN_WIDTH * T * b * (intermediate / tp + hidden)
#   sampler: SAMPLER_BASE + S * V * b  (the lm_head output, exact)  +  fp32 copies * S * V * 4
# Logits are gathered over TP, so TP does not shrink the sampler: Llama-3.1-8B, S = 1,024, V = 128,256 on
# 0.19: 131.3 M logits x (2 + 3.279 x 4) B + 0.023 GiB = 1.87 GiB (logged: 1.89 GiB at tp 1, 2 and 4).
# The forward coefficients and the 0.17+ sampler's 3.279 copies were fitted on 6 of the 12 dense library
# models of the fit split (14 logs): mean |error| 0.016 GiB; the other 6 (19 logs): mean 0.048 GiB, worst
# -0.19 GiB (Llama-3.1-8B in float32). MoE models add the fused-MoE workspace (moe_workspace_bytes, buffer
# shapes from vLLM, no fitted coefficient), which 0.14+ still holds when the sampler runs.
FWD_BASE_BYTES = round(0.096 * GiB)
FWD_PER_TOKEN_WIDTH = 2.926
SAMPLER_BASE_BYTES = round(0.023 * GiB)
# float32 [S, V] tensors alive at the sampler's peak, per sampler path (engine-rules.md 1.5): the 0.17+ Triton
# top-k/top-p keeps the float logits, softmax and the exponential noise (3; fitted 3.279 on 0.19). FlashInfer
# (0.8-0.11 where installed): 0.8 takes softmax probabilities and samples from them (logits and probabilities:
# 2); 0.9-0.11 call top_k_top_p_sampling_from_logits, which masks the logits into a new tensor and takes its
# softmax (flashinfer/sampling.py, filter_apply_order "top_k_first": 3). V1 0.6.4-0.7.x runs no sampler:
# compute_logits over all T tokens, in the model dtype only (0). The PyTorch sort path is sized by
# torch_sort_bytes_per_element below, not by a count of copies. Model Runner V2 (0.25+ for dense models): 0.25
# copies the logits to float32 once and applies penalties and temperature in place; the profiling rows ask for
# no top-k/top-p, and its gumbel_sample kernel writes only the token ids (vllm/v1/worker/gpu/sample/sampler.py):
# 1. 0.26 applies them in place on the logits themselves, and 0.27+ returns early for rows that need no logits
# processing, as the dummy rows do: 0 ("v2_in_place").
SAMPLER_FP32_COPIES = {"triton": 3.279, "flashinfer_logits": 3.0, "flashinfer_probs": 2.0, "logits": 0.0,
                       "v2": 1.0, "v2_in_place": 0.0}
# 0.17+ sends fewer rows than this to PyTorch's sort (vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p).
TRITON_MIN_ROWS = 8


def torch_sort_bytes_per_element(rows: int) -> int:
    """Bytes torch.sort holds per element of a float32 [rows, V] tensor at its peak, input excluded.

    The PyTorch-native top-k/top-p (V0's sampler, V1's before 0.17) sorts the float32 logits. The sort
    returns float32 values (4 B) and int64 indices (8 B) and meanwhile takes scratch from the caching
    allocator (aten/src/ATen/native/cuda/SortStable.cu; cub's radix sorts, called without a double buffer,
    allocate a spare key and a spare value buffer):
      one row, or >= 128 rows (segmented_sort_large_segments, segmented_sort_pairs): int64 source indices 8
        + cub's spare keys 4 and indices 8 = 20 -> 32 B with the outputs;
      2..127 rows (segmented_sort_pairs_by_full_sort): two int2 index/segment arrays 16 + the sorted-keys
        buffer 4 + cub's spare keys 4 and int2 values 8 = 32 -> 44 B.
    vLLM's own benchmark of this path, input and its clone (8 B) included: 1.25 GiB for 256 x 131,072
    (33,554,432 x 40 B = 1.25 GiB; vllm-project/vllm#32558) and 78.50 MiB for 48 x 32,768 (1,572,864 x
    52 B = 78.0 MiB; vllm-project/vllm#33538).
    """
    outputs = 4 + 8
    if 1 < rows < 128:
        return outputs + 2 * 8 + 4 + 4 + 8
    return outputs + 8 + 4 + 8


def sampler_bytes_per_logit(sampler: str, rows: int) -> float:
    """Bytes the sampler holds at its peak per (row x vocabulary) element, beyond the model-dtype logits.

    "sort": the float32 logits plus torch.sort's working set; Llama-3.1-8B on V0 with 256 sequences:
    4 + 32 = 36 B, with the 2 B bfloat16 logits 38 B x 256 x 128,256 = 1.16 GiB.
    """
    if sampler == "triton" and rows < TRITON_MIN_ROWS:
        sampler = "sort"
    if sampler == "sort":
        return FP32_BYTES + torch_sort_bytes_per_element(rows)
    return SAMPLER_FP32_COPIES[sampler] * FP32_BYTES


# --- Non-torch memory: the CUDA context, NCCL set up before the worker's snapshot, growth while profiling --
@dataclass(frozen=True)
class NonTorch:
    """Memory outside torch's allocator on one rank, in three parts that releases charge differently."""

    context_bytes: int  # CUDA context and runtime: in every worker's snapshot
    before_snapshot_bytes: int  # communicators set up before the snapshot (tp or pp > 1)
    growth_bytes: int  # grown during the profiling run (cuBLAS workspaces, NCCL buffers on first use)
    other_bytes: int = 0  # held by other processes on the GPU (--gpu-memory-in-use)

    @property
    def before_start_bytes(self) -> int:
        """In use when the worker takes its snapshot: the context, early communicators, other processes."""
        return self.context_bytes + self.before_snapshot_bytes + self.other_bytes

    def charged(self, with_context: bool) -> int:
        """What the budget subtracts: the growth, or (V0 0.6.4, V1 <= 0.9.0) everything in use but torch's,
        other processes' memory included."""
        return self.growth_bytes + (self.before_start_bytes if with_context else 0)


# vLLM 0.19 on H100 (the fit split's worker snapshots and profiling lines): context 0.51 GiB on every rank;
# before the snapshot +1.02 GiB at tp >= 2 and +0.92 GiB at pp > 1; growth 0.25 GiB on one GPU (cuBLAS
# workspaces, compiled kernels), 0.07 GiB per pipeline stage, 2.07 GiB at tp 2 and 2.17 GiB at tp >= 4 (NCCL
# with NVLink SHARP buffers, custom all-reduce). NVLink SHARP needs NVSwitch: H100/H200/H20 HGX, GH200,
# B200. Elsewhere (PCIe cards, A100, NVLink bridges) NCCL is much smaller: 0.34-0.43 GiB at tp 4 on
# A100-40GB (vllm-project/vllm#16570, V0 0.8.3) and 0.20 GiB at tp 4 on 24 GB cards (vllm#14447, V0 0.8):
# 0.30 GiB, their middle, with nothing known before the snapshot.
#
# On one GPU the growth is mostly kernel images, which CUDA loads into device memory the first time a kernel
# runs (lazy module loading): cuBLAS/cuBLASLt, attention and Triton kernels, built per architecture. Hopper's
# are large: one bf16 cuBLAS product on an H200 grew memory outside torch by 0.154 GiB
# (benchmarks/results/gpu/cuda_facts.json), and an H200 on V0 0.6.4 prints 0.73 GiB of context plus growth
# (vllm-nontorch-fit.jsonl), the fit split's 0.51 + 0.25 within 0.03. Before Hopper it is a tenth of that:
# the single-GPU logs of benchmarks/logs/vllm-nontorch-fit.jsonl on compute capability 7.5-8.9 print 0.02,
# 0.02, 0.04, 0.10 and 0.16 GiB (RTX 4080, RTX 4090, RTX 2060, A100-40GB, L40S; V0 0.6.5-0.8 and V1 0.10.2):
# their median, 0.04 GiB (`python benchmarks/vllm_accuracy.py --fit` prints it). That file holds no T4 or
# RTX 3090 log, the held-out set's own pre-Hopper cards.
#
# The context itself differs by card. CUDA reserves local memory for every thread the card can hold
# resident, at the per-thread stack (cudaLimitStackSize, 1 KiB by default): SMs x threads per SM x 1 KiB
# (docs/engine-rules.md 1.7). The rest of the context (driver, runtime, torch's start-up kernels) is taken as
# the same on every card: H100's 0.51 GiB less its 132 x 2,048 x 1 KiB = 264 MiB. An RTX 3090 (82 x 1,536)
# then holds 0.252 + 0.120 = 0.372 GiB; vLLM 0.6.4 printed 0.35 GiB of context plus growth on one
# (vllm-project/vllm#10517, held out).
CONTEXT_BYTES = round(0.51 * GiB)  # H100 (and H200: 552,402,944 B outside torch after init, cuda_facts.json)
STACK_BYTES_PER_THREAD = 1024
CONTEXT_FIXED_BYTES = CONTEXT_BYTES - (resident_threads("H100-80GB") or 0) * STACK_BYTES_PER_THREAD
# Catalog keys whose nodes have NVSwitch; exact keys, as the PCIe forms share a prefix (H200-NVL: bridges only).
NVLS_GPUS = ("H100-80GB", "H200", "H20", "GH200-96GB", "GH200-144GB", "B200")
HOPPER = (9, 0)
NON_TORCH = {
    "single": NonTorch(CONTEXT_BYTES, 0, round(0.25 * GiB)),
    "single_pre_hopper": NonTorch(CONTEXT_BYTES, 0, round(0.04 * GiB)),
    "pp": NonTorch(CONTEXT_BYTES, round(0.92 * GiB), round(0.07 * GiB)),
    "nvls_tp2": NonTorch(CONTEXT_BYTES, round(1.02 * GiB), round(2.07 * GiB)),
    "nvls_tp4": NonTorch(CONTEXT_BYTES, round(1.02 * GiB), round(2.17 * GiB)),
    "other_tp": NonTorch(CONTEXT_BYTES, 0, round(0.30 * GiB)),
}


# The cuBLAS handle and the kernels its first product loads, outside torch: a bf16 4,096 x 4,096 product on an
# H200 (driver 580, torch 2.11, CUDA 13.0) grew memory outside torch from 552,402,944 to 718,077,952 B
# (benchmarks/results/gpu/cuda_facts.json). Measured on Hopper only.
CUBLAS_HANDLE_BYTES = 718_077_952 - 552_402_944


def cublas_in_baseline(nt: NonTorch, gpu_key: str) -> NonTorch:
    """vLLM 0.33 creates its cuBLAS handles before the worker's snapshot: on Hopper their 165,675,008 B leave the
    profiled growth (0.25 GiB on one H100 -> 0.096 GiB) for the baseline, which no budget charges. Elsewhere
    the handle is not measured and stays in the growth (0.04 GiB on one card before Hopper)."""
    if COMPUTE_CAPABILITY.get(gpu_key) != HOPPER:
        return nt
    moved = min(nt.growth_bytes, CUBLAS_HANDLE_BYTES)
    return replace(nt, before_snapshot_bytes=nt.before_snapshot_bytes + moved, growth_bytes=nt.growth_bytes - moved)


def comms_in_growth(nt: NonTorch) -> NonTorch:
    """Before 0.11 the worker takes its snapshot (V0 worker.py and V1 gpu_worker.py init_device: init_gpu_memory,
    baseline_snapshot, init_snapshot) before init_worker_distributed_environment, so the communicators it then
    sets up (pynccl with its warm-up all-reduce, the custom all-reduce buffers) are part of the growth every
    budget charges, not of the baseline: tp 8 on H100s charges 1.02 + 2.17 GiB, not 2.17."""
    return replace(nt, before_snapshot_bytes=0, growth_bytes=nt.growth_bytes + nt.before_snapshot_bytes)


def cuda_context_bytes(gpu_key: str) -> int:
    """The CUDA context on one card: the fixed part plus local memory for every resident thread; H100's
    figure where the card's SMs are unknown (AMD, --gpu-mem). T4: 0.252 GiB + 40 x 1,024 x 1 KiB = 0.291 GiB."""
    threads = resident_threads(gpu_key)
    return CONTEXT_BYTES if threads is None else CONTEXT_FIXED_BYTES + threads * STACK_BYTES_PER_THREAD


def non_torch_for(gpu_key: str, tp: int, pp: int) -> NonTorch:
    """The NON_TORCH row for this GPU and parallelism, with this card's own CUDA context."""
    return replace(NON_TORCH[non_torch_class(gpu_key, tp, pp)], context_bytes=cuda_context_bytes(gpu_key))


def non_torch_class(gpu_key: str, tp: int, pp: int) -> str:
    """The NON_TORCH row for this GPU and parallelism (tp 8 takes the tp 4 figure: no logs beyond). A card of
    unknown architecture (AMD, --gpu-mem) takes Hopper's larger single-GPU growth."""
    if tp >= 2:
        if gpu_key not in NVLS_GPUS:
            return "other_tp"
        return "nvls_tp4" if tp >= 4 else "nvls_tp2"
    if pp > 1:
        return "pp"
    capability = COMPUTE_CAPABILITY.get(gpu_key)
    return "single_pre_hopper" if capability is not None and capability < HOPPER else "single"


@dataclass(frozen=True)
class WeightSplit:
    """How one rank's share of each parameter group is cut, beyond plain tensor parallelism.

    attention_ranks: ranks the attention weights are split over (SGLang DP attention keeps tp / dp of them,
    so each GPU holds tp / dp-th of attention, not 1 / tp); expert_ranks: ranks the routed experts are spread
    over (expert parallel: vLLM's EP group is tp x dp); cpu_offload_bytes: weights kept in CPU memory per
    GPU (vLLM --cpu-offload-gb), taken off the GPU up to what the rank holds. None means tp.
    """

    attention_ranks: int | None = None
    expert_ranks: int | None = None
    cpu_offload_bytes: int = 0

    def ranks_for(self, group: ParamGroup, tp: int) -> int:
        name = group.name.removeprefix("mtp_")  # an MTP block's groups are cut as the model's
        if name == "attention" and self.attention_ranks:
            return self.attention_ranks
        if name == "experts" and self.expert_ranks:
            return self.expert_ranks
        return tp


NO_SPLIT = WeightSplit()


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's rank (every TP rank of a stage holds the same)."""

    stage: int
    layers: int
    weights_bytes: int
    rotary_cache_bytes: int  # part of weights_bytes
    activation_peak_bytes: int
    non_torch: NonTorch
    non_torch_bytes: int  # what the release charges of non_torch (growth, or all of it)
    runs_sampler: bool
    encoder_bytes: int = 0  # the vision encoder's own peak, when it ran on this stage (part of the peak)
    lora_bytes: int = 0  # LoRA slots (vllm_lora), part of weights_bytes: vLLM counts them as loaded weights
    draft_bytes: int = 0  # an MTP draft's own weights, part of weights_bytes (loaded with the model)
    # A cold compile's benchmark copies on this rank (compile_clone_bytes; 0 without them). The compile runs, and
    # frees its copies, before the first forward: the activation peak is the larger of the two.
    compile_clone_bytes: int = 0
    run_peak_bytes: int = 0  # the profiling run's own peak (forward, sampler, encoder), without those copies
    intermediate_bytes: int = 0  # a later pipeline stage's receive buffers (intermediate_bytes), part of the peak
    sampler_state_bytes: int = 0  # Model Runner V2's sampler state on the last stage (v2_sampler_state_bytes)
    # an MTP proposer's input buffers on the last stage, where the budget counts them (proposer_buffer_bytes)
    proposer_bytes: int = 0
    mla_kept_bytes: int = 0  # what the MLA layers keep beside their checkpoint weights, part of weights_bytes
    buffer_bytes: int = 0  # buffers the model allocates when built (vllm_dsv4, vllm_dsa), part of weights_bytes

    @property
    def non_kv_bytes(self) -> int:
        return (self.weights_bytes + self.activation_peak_bytes + self.non_torch_bytes + self.sampler_state_bytes
                + self.proposer_bytes)


def num_experts(model: ModelSpec) -> int:
    """Routed experts per MoE layer; 0 for a dense model (a hybrid whose class default names experts it never
    uses, like Nemotron-H-56B, is dense: its geometry has no MoE layer)."""
    return model.geometry.moe.num_experts if model.geometry.moe else 0


def padded_vocab(vocab_size: int) -> int:
    return cdiv(vocab_size, VOCAB_PADDING) * VOCAB_PADDING


def _is_vocab_group(g: ParamGroup) -> bool:
    return g.tp == "vocab"


def _group_rank_bytes(g: ParamGroup, quant: QuantSpec | None, elem: int, vocab: int, tp: int) -> int:
    """Bytes of one group on one TP rank. Vocab-parallel groups are padded rows, split over TP."""
    full = group_weight_bytes(g, quant, elem)
    if _is_vocab_group(g):
        row_bytes = full / vocab
        return math.ceil(cdiv(padded_vocab(vocab), tp) * row_bytes)
    if g.tp == "replicated" or tp == 1:
        return full
    return cdiv(full, tp)


def rotary_cache_bytes(model: ModelSpec, elem: int) -> int:
    """The cos/sin cache vLLM's get_rope builds: [max_position, rotary_dim] in the model dtype.

    Llama-3.1-8B: 131,072 positions x 128 x 2 B = 32 MiB, the gap between its parameter bytes
    (14.96 GiB) and the logged 14.99 GiB. MLA rotates only the qk_rope_head_dim part.
    """
    if model.model_type in _NO_ROPE or not model.max_position_embeddings:
        return 0
    if model.geometry.compressed_mla is not None:
        # DeepSeek-V4 builds two caches (rope_theta and compress_rope_theta), kept in float32 (get_rope with
        # is_deepseek_v4): Flash 2 x 1,048,576 x 64 x 4 B = 536,870,912 B.
        return 2 * model.max_position_embeddings * model.geometry.rotary_dim * FP32_BYTES
    return model.max_position_embeddings * model.geometry.rotary_dim * elem


def checkpoint_scale(model: ModelSpec, checkpoint_bytes: int | None) -> float:
    """Exact checkpoint bytes over what the parameter groups say the checkpoint holds, in its stored dtype
    (the config's torch_dtype) and quantization; 1.0 without a measured figure.

    With --weights-from-hub or --weights-bytes, every rank's modelled share is multiplied by this, so the
    whole model matches the measured bytes while embeddings, the head, replicated norms, vocabulary padding,
    a dtype cast at load (a float32 checkpoint served in bf16) and runtime fp8 keep their modelled effect.
    The split over tp/pp ranks stays the parameter-group model's: exact on one GPU, approximate beyond.
    """
    if checkpoint_bytes is None:
        return 1.0
    stored_elem = weight_dtype_bytes(model.config_dtype or "float32")
    stored = sum(group_weight_bytes(g, model.quant, stored_elem) for g in model.param_groups)
    return checkpoint_bytes / stored if stored else 1.0


def _mxfp4_experts(g: ParamGroup, model: ModelSpec, tp: int, split: WeightSplit, backend: Mxfp4Backend) -> int:
    """One rank's mxfp4 experts as loaded (vllm_mxfp4), the biases group included."""
    moe = model.geometry.moe
    experts = moe.num_experts if moe else 0
    ranks = split.ranks_for(g, tp)
    on_rank, inter_ranks = (cdiv(experts, ranks), 1) if split.expert_ranks else (experts, ranks)
    return expert_bytes_per_rank(
        experts=on_rank, layers=model.num_layers, hidden=model.hidden_size,
        intermediate=(moe.expert_intermediate_size if moe else 0) or model.intermediate_size or 0,
        ranks=inter_ranks, bias_bytes=weight_dtype_bytes(serving_dtype(model.config_dtype)), backend=backend,
    )


def weights_per_stage(
    model: ModelSpec, *, dtype: str, tp: int, pp: int, quantization: str | None, checkpoint_bytes: int | None = None,
    split: WeightSplit = NO_SPLIT, mxfp4_backend: Mxfp4Backend | None = None,
) -> list[tuple[int, int]]:
    """(weights bytes, rotary cache bytes) on one rank of each pipeline stage.

    `checkpoint_bytes`: the checkpoint's measured size (safetensors headers), see checkpoint_scale.
    `mxfp4_backend`: the kernel backend an mxfp4 model's experts load for; they are then padded as it pads
    them (vllm_mxfp4), instead of the checkpoint's shapes.
    """
    elem = weight_dtype_bytes(dtype)
    quant = model.quant or (runtime_quant(quantization) if quantization else None)
    stages = pp_stage_layers(model.num_layers, pp)
    tied = model.geometry.tie_word_embeddings
    rope = rotary_cache_bytes(model, elem)
    scale = checkpoint_scale(model, checkpoint_bytes)
    padded = mxfp4_backend is not None and quant is not None and quant.method == "mxfp4"
    out = []
    for i, stage in enumerate(stages):
        first, last = i == 0, i == len(stages) - 1
        total = 0.0
        for g in model.param_groups:
            if padded and g.name == "experts_bias":
                continue  # loaded with the experts below
            if padded and g.name == "experts" and mxfp4_backend is not None:
                b = _mxfp4_experts(g, model, tp, split, mxfp4_backend)
            else:
                b = _group_rank_bytes(g, quant, elem, model.vocab_size, split.ranks_for(g, tp))
            if g.name.startswith(("embed_tokens", "embed_positions", "embed_proj", "vision")):
                # A tied head on a separate last stage loads its own copy of the embedding.
                total += b * (first + (last and not first and tied and g.name == "embed_tokens"))
            elif g.name.startswith("lm_head"):
                total += b if last else 0
            else:
                total += b * len(stage) / model.num_layers
        on_gpu = max(0, int(total * scale) - split.cpu_offload_bytes)
        out.append((on_gpu + rope, rope))
    return out


# Values a row (a token's top_k copies) of each fused-MoE scratch kind holds; i = expert width / tp, h = hidden.
MOE_ROW_VALUES: dict[str, Callable[[int, int], int]] = {
    "three": lambda i, h: 2 * i + i + h,
    "cache13": lambda i, h: max(2 * i, h) + i,
    "marlin": lambda i, h: max(2 * i, h) + i,
    "workspace": lambda i, h: max(i, h) + max(2 * i, h),
}


def moe_workspace_bytes(model: ModelSpec, *, dtype: str, tp: int, max_num_batched_tokens: int,
                        scratch: str = "workspace", chunk_tokens: int | None = None,
                        deepgemm: DeepGemmScratch | None = None) -> int:
    """vLLM's fused-MoE scratch for one forward of T tokens, on one rank, as each release allocates it
    (fused_moe.py per sdist; docs/engine-rules.md 1.5). Rows are Tc x top_k, Tc = min(T, chunk_tokens) (the
    VLLM_FUSED_MOE_CHUNK_SIZE loop), in the activation dtype; I = the expert MLP width / tp, H = hidden:

    - "three" (0.6-0.7, fused_experts_impl): three caches alive together, 2I, I and H wide.
    - "cache13" (0.8-0.13): the first and third share one buffer, max(2I, H) wide, beside the I-wide one.
    - "workspace" (0.14+, TritonExperts.workspace_shapes): max(I, H) and max(2I, H) wide, kept by the
      workspace manager. Qwen3-30B-A3B, T = 8,192, top_k 8, I = 768, H = 2,048, bf16: 65,536 x (2,048 +
      2,048) x 2 B = 0.50 GiB, the gap between its logged peak (2.68 GiB) and its sampler peak (2.21 GiB) on
      0.19; on 0.10.2, 65,536 x (2,048 + 768) x 2 B = 0.34 GiB.
    - AWQ/GPTQ experts run Marlin (fused_marlin_moe, no chunking): "marlin_old" (to 0.8.4, two marlin_gemm_moe
      calls and the top_k sum: T x top_k x (3I + H) + T x max(top_k x I, H)), then "marlin" as "cache13".

    gpt-oss's mxfp4 experts run OpenAI's Triton kernels instead, which take no such workspace: 0 for them.
    Experts on DeepGEMM (`deepgemm`) keep rows padded per expert (vllm_deepgemm).
    """
    moe = model.geometry.moe
    if moe is None or not moe.experts_per_token or (model.quant is not None and model.quant.method == "mxfp4"):
        return 0
    inter, hidden, k = cdiv(moe.expert_intermediate_size, tp), model.hidden_size, moe.experts_per_token
    tokens = max_num_batched_tokens if chunk_tokens is None else min(max_num_batched_tokens, chunk_tokens)
    if deepgemm is not None:
        return deepgemm_workspace_bytes(deepgemm, tokens=max_num_batched_tokens, chunk_tokens=tokens, top_k=k,
                                        expert_width=moe.expert_intermediate_size, hidden=hidden, tp=tp,
                                        dtype_bytes=weight_dtype_bytes(dtype))
    if scratch == "marlin_old":
        values = tokens * k * (3 * inter + hidden) + tokens * max(k * inter, hidden)
    else:
        values = tokens * k * MOE_ROW_VALUES[scratch](inter, hidden)
    return values * weight_dtype_bytes(dtype)


# bitsandbytes 4-bit layers compute in bfloat16 (stock vLLM) or in the model's dtype (Unsloth's patch).
BNB_COMPUTE = ("bfloat16", "model")


def bnb_4bit_forward_bytes(model: ModelSpec, *, compute: str, dtype: str, tp: int, tokens: int) -> int:
    """What bitsandbytes 4-bit linears add to the forward's peak on one rank, beyond a plain matmul.

    vLLM's BitsAndBytesLinearMethod._apply_4bit_weight (0.6-0.27) allocates the layer's whole output first and
    runs each shard as bitsandbytes' MatMul4Bit: F.linear on dequantize_4bit(shard), whose result is then
    copied into that output. At the forward's peak, the down projection (gate/up and the activation still
    held), the shard's result (tokens x hidden) and the dequantised weight (hidden x intermediate / tp) sit
    beside the output the plain path writes. Stock vLLM computes in bfloat16: for any other model dtype it
    also holds a bfloat16 copy of the input (tokens x intermediate / tp). Unsloth's patched vLLM
    (unsloth_zoo patch_vllm_bitsandbytes) computes in the model's dtype, so it makes no copy. Qwen2.5-VL-7B
    in float16 under Unsloth, 16,384 tokens: 16,384 x 3,584 x 2 B = 112 MiB + 3,584 x 18,944 x 2 B = 130 MiB.
    Dense MLPs only: a bitsandbytes MoE runs fused experts, not modelled here (0).
    """
    if model.geometry.moe is not None:
        return 0
    c = weight_dtype_bytes(dtype) if compute == "model" else 2
    inter = cdiv(model.intermediate_size or 4 * model.hidden_size, tp)
    extra = tokens * model.hidden_size * c + model.hidden_size * inter * c
    if compute == "bfloat16" and serving_dtype(dtype) != "bfloat16":
        extra += tokens * inter * 2
    return extra


def intermediate_bytes(model: ModelSpec, *, dtype: str, max_num_batched_tokens: int) -> int:
    """The tensors a pipeline stage after the first receives its input in: make_empty_intermediate_tensors over
    max_num_batched_tokens rows of the hidden size, one per key (hidden_states, and residual in most families).
    V1 allocates them in the first dummy run, inside the profiled window, and keeps them (V0 holds them through
    its profiling run). Llama-3.1-8B at 8,192 tokens: 2 x 8,192 x 4,096 x 2 B = 134,217,728 B (0.125 GiB): the
    fit split's pp 4 middle stage printed a 1.05 GiB peak against its forward's 0.92."""
    keys = 1 if model.model_type in _ONE_INTERMEDIATE else 2
    return keys * max_num_batched_tokens * model.hidden_size * weight_dtype_bytes(dtype)


def v2_sampler_state_bytes(model: ModelSpec, *, max_num_seqs: int, draft_tokens: int) -> int:
    """What Model Runner V2's sampler keeps on every rank of the last pipeline stage from load_model on: int32
    output-token counts per request and vocabulary entry (PenaltiesState.output_bin_counts, which vLLM's own
    comment says can take GBs), a prompt bitmask of the vocabulary per request (prompt_bin_mask) and a grammar
    bitmask per logit row (StructuredOutputsWorker, 1 + draft tokens rows a request). Qwen3-32B at 1,024
    sequences, 151,936 tokens: 1,024 x (151,936 + 2 x 4,748) x 4 B = 661,225,472 B (0.62 GiB)."""
    words = cdiv(model.vocab_size, 32)
    return max_num_seqs * (model.vocab_size + words + (1 + draft_tokens) * words) * 4


def compile_clone_bytes(model: ModelSpec, *, dtype: str, tp: int, max_num_batched_tokens: int) -> int:
    """What a cold torch.compile holds at once inside the profiled window, on the rank with the embedding.

    vLLM 0.11.1+ turns Inductor's benchmark_combo_kernel on (torch >= 2.9), and the benchmark runs each generated
    kernel on fresh random copies of its arguments. The largest is the kernel that gathers the token embeddings
    and applies the first RMSNorm: this rank's shard of the padded embedding table and its two [T, hidden]
    outputs. A multimodal model embeds its inputs outside the compiled graph, so it has no such kernel.
    Llama-3.1-8B, T = 2,048, bf16: (128,256 + 2 x 2,048) x 4,096 x 2 B = 1,084,227,584 B (1.01 GiB).
    """
    rows = cdiv(padded_vocab(model.vocab_size), tp) + 2 * max_num_batched_tokens
    return rows * model.hidden_size * weight_dtype_bytes(dtype)


def activation_peak_bytes(
    model: ModelSpec, *, dtype: str, tp: int, max_num_batched_tokens: int, max_num_seqs: int, runs_sampler: bool,
    sampler: str = "triton", encoder: EncoderProfile | None = None, moe_workspace_kept: bool = True,
    bnb_4bit: str | None = None, sampler_shards: int = 1, moe_scratch: str = "workspace",
    moe_chunk_tokens: int | None = None, moe_deepgemm: DeepGemmScratch | None = None,
) -> int:
    """The torch peak of vLLM's profiling run on one rank (see the coefficients above).

    `sampler`: the release's sampler path ("sort" or a SAMPLER_FP32_COPIES key). `encoder`: the vision
    encoder's part of the run on this rank; its embeddings stay cached while the forward and the sampler run.
    `moe_workspace_kept`: the fused-MoE scratch outlives the forward (0.14+: the workspace manager keeps it),
    so it adds to the sampler's peak; before, fused_experts allocates it per call and it adds to the
    forward's only. `bnb_4bit`: the model's linears are bitsandbytes 4-bit, computed in BNB_COMPUTE's dtype.
    `sampler_shards`: the ranks the sampled rows are split over (V2's batch-sharded sampling, 0.29+: tp).
    `moe_scratch`, `moe_chunk_tokens`, `moe_deepgemm`: the release's fused-MoE buffers (moe_workspace_bytes).
    """
    if encoder is not None and encoder.lm_tokens is not None and encoder.lm_rows is not None:
        # V0: the multimodal prompts set the language model's forward and the sampler's rows (vllm_encoder).
        max_num_batched_tokens, max_num_seqs = encoder.lm_tokens, encoder.lm_rows
    b = weight_dtype_bytes(dtype)
    inter = (model.intermediate_size or 4 * model.hidden_size) / tp
    forward: float
    if model.geometry.compressed_mla is not None:  # read from DeepSeek-V4's source, not the fitted coefficients
        forward = dsv4_forward_bytes(model, tp=tp, tokens=max_num_batched_tokens, dtype_bytes=b)
    else:
        forward = FWD_BASE_BYTES + FWD_PER_TOKEN_WIDTH * max_num_batched_tokens * b * (inter + model.hidden_size)
    if bnb_4bit is not None:
        forward += bnb_4bit_forward_bytes(model, compute=bnb_4bit, dtype=dtype, tp=tp, tokens=max_num_batched_tokens)
    moe = moe_workspace_bytes(model, dtype=dtype, tp=tp, max_num_batched_tokens=max_num_batched_tokens,
                              scratch=moe_scratch, chunk_tokens=moe_chunk_tokens, deepgemm=moe_deepgemm)
    kept = moe if moe_workspace_kept else 0
    peak = forward + moe - kept
    if runs_sampler:
        rows = max_num_batched_tokens if sampler == "logits" else min(max_num_seqs, max_num_batched_tokens)
        rows = cdiv(rows, sampler_shards)
        logits = rows * padded_vocab(model.vocab_size)
        peak = max(peak, SAMPLER_BASE_BYTES + logits * (b + sampler_bytes_per_logit(sampler, rows)))
    lm = int(peak) + kept
    if encoder is None:
        return lm
    return max(encoder.peak_bytes, lm + encoder.cached_bytes)


def stage_memory(
    model: ModelSpec,
    *,
    dtype: str,
    tp: int,
    pp: int,
    quantization: str | None,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    non_torch: NonTorch,
    charge_context: bool,
    sampler: str = "triton",
    moe_workspace_kept: bool = True,
    encoder: EncoderProfile | None = None,
    checkpoint_bytes: int | None = None,
    split: WeightSplit = NO_SPLIT,
    mxfp4_backend: Mxfp4Backend | None = None,
    lora: LoraSlots | None = None,
    lora_extra_vocab: int = 0,
    draft: tuple[ParamGroup, ...] = (),
    bnb_compute: str = "bfloat16",
    sampler_shards: int = 1,
    cold_compile: bool = False,
    intermediate_charged: bool = True,
    sampler_state_bytes: int = 0,
    proposer_bytes: int = 0,
    load_max_split_bytes: int | None = None,
    weight_blocks: bool = False,
    mla_layer_bytes: int = 0,
    moe_scratch: str = "workspace",
    moe_chunk_tokens: int | None = None,
    moe_deepgemm: DeepGemmScratch | None = None,
    buffers: tuple[int, int] = (0, 0),
) -> tuple[StageMemory, ...]:
    """Weights, activation peak and non-torch memory on a rank of each pipeline stage.

    The vision encoder runs on the first stage (it makes the input embeddings), the sampler on the last.
    `lora`: LoRA slots, with the release's extra vocabulary rows (vllm_lora). `draft`: an MTP block's
    parameter groups, loaded on the last stage beside the model (its embeddings and head are the model's).
    `bnb_compute`: the dtype bitsandbytes 4-bit layers compute in (BNB_COMPUTE). `sampler_shards`: see
    activation_peak_bytes. `cold_compile`: torch.compile runs without a compile cache inside the profiled
    window (compile_clone_bytes, first stage only: the embedding lives there). `intermediate_charged`: the later
    stages' receive buffers count in the budget (intermediate_bytes). `sampler_state_bytes`: persistent sampler
    state the budget counts on the last stage (v2_sampler_state_bytes; 0 where none is counted). `proposer_bytes`:
    an MTP proposer's buffers the budget counts on the last stage (vllm_speculative.proposer_buffer_bytes).
    `weight_blocks`: count each weight tensor as torch's caching allocator counts its block (allocator.
    allocated_bytes, on CUDA, where the weights come from the config), with the max_split_size the release
    loads under (`load_max_split_bytes`).
    `mla_layer_bytes`: what each MLA layer, the draft's too, keeps beside its weights (vllm_mla.mla_kept_bytes).
    `moe_scratch`, `moe_chunk_tokens`, `moe_deepgemm`: the release's fused-MoE buffers (moe_workspace_bytes).
    `buffers`: what the model allocates when it is built on every stage, and on the last stage besides
    (vllm_dsv4.dsv4_buffer_bytes, vllm_dsa.dsa_buffer_bytes); vLLM measures them with the weights.
    """
    elem = weight_dtype_bytes(dtype)
    quant = model.quant or (runtime_quant(quantization) if quantization else None)
    bnb_4bit = bnb_compute if quant is not None and quant.method.startswith("bitsandbytes") and \
        quant.weight_bits == 4 else None
    draft_bytes = sum(_group_rank_bytes(g, quant, elem, model.vocab_size, split.ranks_for(g, tp)) for g in draft)
    stages = pp_stage_layers(model.num_layers, pp)
    weights = weights_per_stage(
        model, dtype=dtype, tp=tp, pp=pp, quantization=quantization, checkpoint_bytes=checkpoint_bytes, split=split,
        mxfp4_backend=mxfp4_backend,
    )
    out = []
    for i, (stage, (w, rope)) in enumerate(zip(stages, weights, strict=True)):
        last = i == len(stages) - 1
        enc = encoder if i == 0 else None
        slots = 0 if lora is None else lora_slot_bytes(
            model, lora, layers=stage, tp=tp, elem=weight_dtype_bytes(dtype), first=i == 0, last=last,
            extra_vocab=lora_extra_vocab,
        )
        drafted = draft_bytes if last else 0
        tensors = loaded_tensor_bytes(model, stage, tp=tp, elem=elem, quant=quant, first=i == 0, last=last) \
            if weight_blocks and checkpoint_bytes is None else None
        rounding = allocated_bytes(tensors, max_split_bytes=load_max_split_bytes) - sum(tensors) if tensors else 0
        mla_layers = sum(spec.kind == LayerKind.MLA for spec in model.layers[stage.start:stage.stop:stage.step])
        if draft and last and model.mtp is not None:
            mla_layers += sum(spec.kind == LayerKind.MLA for spec in model.mtp.layers)
        mla_kept = mla_layers * mla_layer_bytes
        built = buffers[0] + (buffers[1] if last else 0)
        clone = compile_clone_bytes(model, dtype=dtype, tp=tp, max_num_batched_tokens=max_num_batched_tokens) \
            if cold_compile and i == 0 and encoder is None else 0
        received = intermediate_bytes(model, dtype=dtype, max_num_batched_tokens=max_num_batched_tokens) \
            if i > 0 and intermediate_charged else 0
        run_peak = received + activation_peak_bytes(
            model, dtype=dtype, tp=tp, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            runs_sampler=last, sampler=sampler, encoder=enc, moe_workspace_kept=moe_workspace_kept,
            bnb_4bit=bnb_4bit, sampler_shards=sampler_shards, moe_scratch=moe_scratch,
            moe_chunk_tokens=moe_chunk_tokens, moe_deepgemm=moe_deepgemm,
        )
        out.append(
            StageMemory(
                stage=i,
                layers=len(stage),
                weights_bytes=w + rounding + slots + drafted + mla_kept + built,
                rotary_cache_bytes=rope,
                activation_peak_bytes=max(run_peak, clone),
                non_torch=non_torch,
                non_torch_bytes=non_torch.charged(charge_context),
                runs_sampler=last,
                encoder_bytes=0 if enc is None else enc.peak_bytes,
                lora_bytes=slots,
                draft_bytes=drafted,
                compile_clone_bytes=clone,
                run_peak_bytes=run_peak,
                intermediate_bytes=received,
                sampler_state_bytes=sampler_state_bytes if last else 0,
                proposer_bytes=proposer_bytes if last else 0,
                mla_kept_bytes=mla_kept,
                buffer_bytes=built,
            )
        )
    return tuple(out)
