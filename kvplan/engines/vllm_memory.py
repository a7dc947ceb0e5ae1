"""vLLM's memory accounting before the KV cache: weights per rank, profiling activation peak, non-torch memory.

vLLM 0.19 (vllm/v1/worker/gpu_worker.py determine_available_memory) computes, per GPU,
    available_kv = ceil(total_memory * gpu_memory_utilization) - weights - activation_peak - non_torch
where `weights` is the torch memory the loaded model holds (parameters plus buffers such as the rotary
cos/sin cache), `activation_peak` the torch peak of one dummy forward of max_num_batched_tokens tokens plus
the sampler over max_num_seqs rows, and `non_torch` what CUDA context, cuBLAS and NCCL grew by meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.capacity.kv import pp_stage_layers
from kvplan.capacity.weights import runtime_quant
from kvplan.model.dtypes import weight_dtype_bytes
from kvplan.model.quant import group_weight_bytes
from kvplan.model.specs import ModelSpec, ParamGroup, QuantSpec
from kvplan.units import GiB, cdiv

# VocabParallelEmbedding / ParallelLMHead pad the vocabulary to a multiple of 64 before splitting it over
# TP ranks: Granite's 49,155 tokens become 49,216 rows.
VOCAB_PADDING = 64

# Families whose positions are learned embeddings, not rotary: they hold no cos/sin cache.
_NO_ROPE = ("gpt2", "gpt_bigcode", "opt")

# --- Activation peak, fitted on vllm-startup-logs.jsonl (`python benchmarks/vllm_accuracy.py --fit`) -------
# The profiling run is one forward of T = max_num_batched_tokens tokens, then (last pipeline stage only) the
# sampler on S = min(max_num_seqs, T) rows of logits over the padded vocabulary V. Two peaks compete and
# the larger one is what torch records (b = bytes of the weight dtype):
#   forward: FWD_BASE + FWD_PER_TOKEN_WIDTH * T * b * (intermediate / tp + hidden)
#   sampler: SAMPLER_BASE + S * V * b  (the lm_head output, exact)  +  SAMPLER_FP32_COPIES * S * V * 4
# The sampler keeps about three fp32 [S, V] tensors alive (float logits, softmax, sorted values for
# top-k/top-p) and logits are gathered over TP, so TP does not shrink it: Llama-3.1-8B, S = 1,024,
# V = 128,256: 131.3 M logits x (2 + 3.279 x 4) B + 0.023 GiB = 1.87 GiB (logged: 1.89 GiB at tp 1, 2 and 4).
# Fitted on 6 of the 12 dense library models (14 logs): mean |error| 0.016 GiB; held out on the other 6
# (19 logs): mean 0.048 GiB, worst -0.19 GiB (Llama-3.1-8B in float32). MoE models were left out of the fit:
# they add the fused-MoE workspace (moe_workspace_bytes, buffer shapes from vLLM, no fitted coefficient),
# which the forward allocates once and still holds when the sampler runs, so it adds to whichever peak wins.
FWD_BASE_BYTES = round(0.096 * GiB)
FWD_PER_TOKEN_WIDTH = 2.926
SAMPLER_BASE_BYTES = round(0.023 * GiB)
SAMPLER_FP32_COPIES = 3.279

# --- Non-torch memory growth during profiling (CUDA context excluded: it predates the snapshot) ----------
# Medians of the 61 logs on H100: TP=1 PP=1 0.25 GiB (cuBLAS workspaces); PP>1 at TP=1 0.07 GiB (each
# worker's context is created before its snapshot); TP=2 2.07 GiB and TP=4 2.17 GiB (NCCL buffers and the
# custom all-reduce workspace). TP=8 is not in the logs: it takes the TP=4 figure.
NON_TORCH_BYTES = {"single": round(0.25 * GiB), "pp": round(0.07 * GiB), "tp2": round(2.07 * GiB),
                   "tp4": round(2.17 * GiB)}


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
        if group.name == "attention" and self.attention_ranks:
            return self.attention_ranks
        if group.name == "experts" and self.expert_ranks:
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
    non_torch_bytes: int
    runs_sampler: bool

    @property
    def non_kv_bytes(self) -> int:
        return self.weights_bytes + self.activation_peak_bytes + self.non_torch_bytes


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


def weights_per_stage(
    model: ModelSpec, *, dtype: str, tp: int, pp: int, quantization: str | None, checkpoint_bytes: int | None = None,
    split: WeightSplit = NO_SPLIT,
) -> list[tuple[int, int]]:
    """(weights bytes, rotary cache bytes) on one rank of each pipeline stage.

    `checkpoint_bytes`: the checkpoint's measured size (safetensors headers), see checkpoint_scale.
    """
    elem = weight_dtype_bytes(dtype)
    quant = model.quant or (runtime_quant(quantization) if quantization else None)
    stages = pp_stage_layers(model.num_layers, pp)
    tied = model.geometry.tie_word_embeddings
    rope = rotary_cache_bytes(model, elem)
    scale = checkpoint_scale(model, checkpoint_bytes)
    out = []
    for i, stage in enumerate(stages):
        first, last = i == 0, i == len(stages) - 1
        total = 0.0
        for g in model.param_groups:
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


def moe_workspace_bytes(model: ModelSpec, *, dtype: str, tp: int, max_num_batched_tokens: int) -> int:
    """vLLM's fused-MoE (Triton experts) scratch for one forward of T tokens, on one rank.

    TritonExperts.workspace_shapes asks for two buffers of T x top_k rows in the activation dtype:
    max(I, H) wide (the activation output, then the down projection) and max(2I, H) wide (the fused gate/up
    projection), I = the expert MLP width / tp and H = hidden. vLLM's workspace manager keeps them allocated
    after the forward. Qwen3-30B-A3B, T = 8,192, top_k 8, I = 768, H = 2,048, bf16: 65,536 x (2,048 + 2,048)
    x 2 B = 0.50 GiB, the gap between its logged peak (2.68 GiB) and its sampler peak (2.21 GiB). gpt-oss's
    mxfp4 experts run OpenAI's Triton kernels instead, which take no such workspace: 0 for them.
    """
    moe = model.geometry.moe
    if moe is None or not moe.experts_per_token or (model.quant is not None and model.quant.method == "mxfp4"):
        return 0
    inter = cdiv(moe.expert_intermediate_size, tp)
    rows = max_num_batched_tokens * moe.experts_per_token
    return rows * (max(inter, model.hidden_size) + max(2 * inter, model.hidden_size)) * weight_dtype_bytes(dtype)


def activation_peak_bytes(
    model: ModelSpec, *, dtype: str, tp: int, max_num_batched_tokens: int, max_num_seqs: int, runs_sampler: bool
) -> int:
    """The torch peak of vLLM's profiling run on one rank (see the coefficients above)."""
    b = weight_dtype_bytes(dtype)
    inter = (model.intermediate_size or 4 * model.hidden_size) / tp
    forward = FWD_BASE_BYTES + FWD_PER_TOKEN_WIDTH * max_num_batched_tokens * b * (inter + model.hidden_size)
    moe = moe_workspace_bytes(model, dtype=dtype, tp=tp, max_num_batched_tokens=max_num_batched_tokens)
    if not runs_sampler:
        return int(forward) + moe
    logits = min(max_num_seqs, max_num_batched_tokens) * padded_vocab(model.vocab_size)
    sampler = SAMPLER_BASE_BYTES + logits * b + SAMPLER_FP32_COPIES * logits * 4
    return int(max(forward, sampler)) + moe


def non_torch_bytes(tp: int, pp: int) -> int:
    if tp >= 4:
        return NON_TORCH_BYTES["tp4"]
    if tp >= 2:
        return NON_TORCH_BYTES["tp2"]
    return NON_TORCH_BYTES["pp"] if pp > 1 else NON_TORCH_BYTES["single"]


def stage_memory(
    model: ModelSpec,
    *,
    dtype: str,
    tp: int,
    pp: int,
    quantization: str | None,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    checkpoint_bytes: int | None = None,
    split: WeightSplit = NO_SPLIT,
) -> tuple[StageMemory, ...]:
    """Weights, activation peak and non-torch memory on a rank of each pipeline stage."""
    stages = pp_stage_layers(model.num_layers, pp)
    weights = weights_per_stage(
        model, dtype=dtype, tp=tp, pp=pp, quantization=quantization, checkpoint_bytes=checkpoint_bytes, split=split
    )
    out = []
    for i, (stage, (w, rope)) in enumerate(zip(stages, weights)):
        last = i == len(stages) - 1
        out.append(
            StageMemory(
                stage=i,
                layers=len(stage),
                weights_bytes=w,
                rotary_cache_bytes=rope,
                activation_peak_bytes=activation_peak_bytes(
                    model, dtype=dtype, tp=tp, max_num_batched_tokens=max_num_batched_tokens,
                    max_num_seqs=max_num_seqs, runs_sampler=last,
                ),
                non_torch_bytes=non_torch_bytes(tp, pp),
                runs_sampler=last,
            )
        )
    return tuple(out)
