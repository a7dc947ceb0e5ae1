"""Terms measured on the user's own box (a BoxProfile from `kvplan calibrate`), put in place of modelled ones.

Which terms carry over to another deployment, and why:
- total memory: always (the device is the device);
- non-torch growth and CUDA graphs: at the same tensor- and pipeline-parallel sizes (NCCL buffers and the
  graphs' per-layer share depend on them);
- weights and the activation peak: only for the same model at the same parallel sizes, the activation peak
  also only at the same step (max_num_batched_tokens, and max_num_seqs where the profile states it). They are
  what rank 0 logged, so they replace the first pipeline stage's figures;
- Model Runner V2's sampler state as the logged budget held it (none, where it prints non-torch memory apart):
  for the same model, parallel sizes and max_num_seqs; elsewhere it is modelled, and the measured non-torch
  figure carries over net of it.
Replaying the logged deployment then gives back its "Available KV cache memory" up to the logs' 0.01 GiB
rounding, and a change of gpu_memory_utilization alone moves it by exactly that change x the total.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from kvplan.capacity.deployment import BoxProfile
from kvplan.engines.vllm_memory import NonTorch, StageMemory
from kvplan.engines.vllm_versions import VllmRules, rules_for
from kvplan.errors import FieldError
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass


class _Flags(Protocol):
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...


@dataclass(frozen=True)
class ProfileUse:
    """Which measured terms were used, and which were not (with the reason)."""

    source: str
    applied: tuple[str, ...]
    skipped: tuple[str, ...]


def _profile_rules(profile: BoxProfile) -> VllmRules | None:
    if not profile.engine_version:
        return None
    try:
        return rules_for(profile.engine_version)
    except FieldError:
        return None


def _growth(profile: BoxProfile, measured: int, nt: NonTorch) -> int:
    """The growth part of a logged non-torch figure: releases that charge the context logged all of it.
    Which engine printed it matters: vLLM 0.8.5's V1 charges the context, its V0 does not."""
    rules = _profile_rules(profile)
    charged_all = rules is not None and rules.charges_context(profile.vllm_engine or rules.default_engine)
    if charged_all:
        return max(0, measured - nt.context_bytes - nt.before_snapshot_bytes)
    return measured


def apply_profile(
    profile: BoxProfile, *, model: ModelSpec, flags: _Flags, total_bytes: int, memories: tuple[StageMemory, ...],
    graph_bytes: int, charge_context: bool,
) -> tuple[int, tuple[StageMemory, ...], int, ProfileUse]:
    """(total, stage memories, graph bytes) with the measured terms that apply in place of modelled ones."""
    applied: list[str] = []
    skipped: list[str] = []
    if profile.total_memory_bytes is not None:
        total_bytes = profile.total_memory_bytes
        applied.append("total memory")
    same_parallel = (profile.tp, profile.pp) == (flags.tp, flags.pp)
    where = f"measured at tp {profile.tp} pp {profile.pp}, planned at tp {flags.tp} pp {flags.pp}"
    stages = list(memories)
    if profile.non_torch_bytes is not None:
        if same_parallel:
            for i, m in enumerate(stages):
                nt = replace(m.non_torch, growth_bytes=_growth(profile, profile.non_torch_bytes, m.non_torch))
                stages[i] = replace(m, non_torch=nt, non_torch_bytes=nt.charged(charge_context))
            applied.append("non-torch")
        else:
            skipped.append(f"non-torch ({where})")
    if profile.cuda_graph_bytes is not None:
        if same_parallel:
            graph_bytes = profile.cuda_graph_bytes
            applied.append("CUDA graphs")
        else:
            skipped.append(f"CUDA graphs ({where})")
    same_model = profile.model is not None and profile.model.lower() == model.name.lower() and same_parallel
    if profile.weights_bytes is not None:
        if same_model:
            m = stages[0]
            stages[0] = replace(m, weights_bytes=profile.weights_bytes,
                                rotary_cache_bytes=min(m.rotary_cache_bytes, profile.weights_bytes))
            applied.append("weights")
        else:
            skipped.append(f"weights (measured for {profile.model} at tp {profile.tp} pp {profile.pp})")
    if profile.activation_peak_bytes is not None:
        same_step = profile.max_num_batched_tokens == flags.max_num_batched_tokens and (
            profile.max_num_seqs is None or profile.max_num_seqs == flags.max_num_seqs)
        if same_model and same_step:
            # The measured peak is whatever that start ran, cold compile or not.
            stages[0] = replace(stages[0], activation_peak_bytes=profile.activation_peak_bytes,
                                run_peak_bytes=profile.activation_peak_bytes, compile_clone_bytes=0)
            applied.append("activation peak")
        else:
            skipped.append(f"activation peak (measured for {profile.model} with a step of "
                           f"{profile.max_num_batched_tokens} tokens)")
    if profile.sampler_state_bytes is not None and same_model and profile.max_num_seqs == flags.max_num_seqs:
        stages = [replace(m, sampler_state_bytes=profile.sampler_state_bytes if m.sampler_state_bytes else 0)
                  for m in stages]
    return total_bytes, tuple(stages), graph_bytes, ProfileUse(profile.source, tuple(applied), tuple(skipped))
