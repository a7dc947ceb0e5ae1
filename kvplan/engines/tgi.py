"""Text Generation Inference: its launcher options and the KV budget its warm-up leaves.

TGI (server/text_generation_server/models/flash_causal_lm.py, warmup) loads the weights, runs one prefill of
max_batch_prefill_tokens tokens, then sizes the KV cache from what the GPU has free:
    free = free_after_warmup - (1 - cuda_memory_fraction) x total      (utils/import_utils.py, get_free_memory)
    num_blocks = free x TGI_WIGGLE_ROOM (0.95) // bytes per block     (+ the warm-up batch's own blocks)
so nothing is reserved up front: what the weights, the CUDA context, NCCL and the warm-up's activation peak
leave, less 5%, is the cache. kvplan sizes the activation peak and non-torch memory as its vLLM model does
(the same PyTorch forward; TGI runs no sampler over hundreds of dummy requests), in blocks of 16 tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from kvplan.capacity.deployment import Deployment, Parallelism
from kvplan.engines.base import Calibration, EngineAccount, Knobs, MemoryTerm, check_counts
from kvplan.engines.generic import paged_account, rank_weights_bytes
from kvplan.engines.vllm_memory import activation_peak_bytes, non_torch_for
from kvplan.errors import FieldError
from kvplan.model.dtypes import serving_dtype
from kvplan.records import dataclass

TGI_WIGGLE_ROOM = 0.95
TGI_BLOCK_SIZE = 16  # the paged-attention block of TGI 2.x (FlashInfer in 3.x pages by 1; not modelled)


def calibration() -> Calibration:
    """TGI's model comes from its warm-up source only: no TGI log with its free memory and block count was
    found to check it against, so every plan says its error is unknown."""
    return Calibration(
        in_range=False,
        checked_on="no Text Generation Inference start-up log with its free memory and KV blocks: not calibrated",
        outside=("engine TGI (not checked against any log)",),
        error_band="unknown",
    )


@dataclass(frozen=True)
class TgiOptions:
    """Text Generation Inference's launcher options that size memory."""

    engine: ClassVar[str] = "tgi"

    cuda_memory_fraction: float = 1.0
    max_batch_size: int | None = None
    max_batch_total_tokens: int | None = None  # caps the KV pool, in tokens
    # --max-total-tokens when not given: TGI before 3.0 takes min(max_position_embeddings, 4096); 3.0 and
    # later the model's whole context (None here).
    max_total_tokens_cap: int | None = None
    max_batch_prefill_tokens: int = 4096  # the warm-up prefill's size (TGI's default)

    def validate(self) -> None:
        if not 0 < self.cuda_memory_fraction <= 1:
            raise FieldError("engine.cuda_memory_fraction", "must be in (0, 1]", self.cuda_memory_fraction)
        check_counts(self, ("max_batch_size", "max_batch_total_tokens", "max_total_tokens_cap",
                            "max_batch_prefill_tokens"))




class TgiEngine:
    """Text Generation Inference 2.x-3.x (text-generation-launcher)."""

    name: ClassVar[str] = "tgi"
    label: ClassVar[str] = "TGI"
    options_type: ClassVar[type] = TgiOptions
    knobs: ClassVar[Knobs] = Knobs(fp8_kv_dtype="fp8_e4m3", request_cap="engine.max_batch_size")

    def default_options(self) -> TgiOptions:
        return TgiOptions()

    def gpus_per_instance(self, p: Parallelism) -> int:
        return p.tp  # --num-shard

    def account(self, d: Deployment) -> EngineAccount:
        o = d.engine
        if not isinstance(o, TgiOptions):
            raise TypeError("TgiEngine needs TgiOptions")
        p = d.parallelism
        given = d.workload.max_model_len
        length = d.max_model_len if given is None else given
        notes = ["not calibrated: no TGI start-up log with its free memory and KV blocks was found to check these "
                 "figures against; their error is unknown"]
        if given is None and o.max_total_tokens_cap is not None and length > o.max_total_tokens_cap:
            length = o.max_total_tokens_cap
            notes.append(f"--max-total-tokens not given: this TGI release serves min(context, "
                         f"{o.max_total_tokens_cap:,}) = {length:,} tokens")
        dtype = d.weights.dtype or serving_dtype(d.model.config_dtype)
        total = d.gpu.total_memory_bytes
        weights = rank_weights_bytes(d)
        activation = activation_peak_bytes(d.model, dtype=dtype, tp=p.tp, runs_sampler=False, max_num_seqs=1,
                                           max_num_batched_tokens=o.max_batch_prefill_tokens)
        # TGI measures free memory after everything has started: the CUDA context and NCCL count in full.
        non_torch = non_torch_for(d.gpu.key, p.tp, p.pp).charged(with_context=True) + d.gpu_in_use_bytes
        free = total - non_torch - weights - activation - round((1 - o.cuda_memory_fraction) * total)
        budget = int(max(0, free) * TGI_WIGGLE_ROOM)
        terms = (
            MemoryTerm("weights", weights, "weights on this shard"),
            MemoryTerm("activation_peak", activation,
                       f"activation peak of the warm-up prefill ({o.max_batch_prefill_tokens:,} tokens)"),
            MemoryTerm("non_torch", non_torch, "CUDA context, cuBLAS and NCCL (as vLLM logs them)"
                       + (", and other processes' memory" if d.gpu_in_use_bytes else "")),
            MemoryTerm("reserved", total - non_torch - weights - activation - budget,
                       f"outside --cuda-memory-fraction {o.cuda_memory_fraction} and TGI's 5% wiggle room"),
        )
        account = paged_account(
            d, name=self.name, length=length, fraction=o.cuda_memory_fraction, overhead=None, block=TGI_BLOCK_SIZE,
            cap=o.max_batch_size, notes=tuple(notes), budget_terms=(total, terms, budget),
        )
        account = replace(account, calibration=calibration())
        if o.max_batch_total_tokens is None:
            return account
        # --max-batch-total-tokens bounds the pool: that many tokens of KV, whatever memory is free.
        pool = account.pools[0]
        per_token = pool.per_request_units // max(1, length)
        capped = min(pool.budget_units, o.max_batch_total_tokens * per_token)
        return replace(account, pools=(replace(pool, budget_units=capped),),
                       notes=(*account.notes, f"--max-batch-total-tokens caps the KV pool at "
                              f"{o.max_batch_total_tokens:,} tokens"))
