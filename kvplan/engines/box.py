"""Which terms of a measured BoxProfile (kvplan calibrate --save) stand for a deployment, and why the others not.

A profile measures one box: one GPU, one engine, one tensor/pipeline split, one model at one step size. Each
term holds only where what it depends on is the same:
- the GPU total: the same GPU (any engine, any model);
- non-torch memory (context, NCCL, cuBLAS): the same GPU, engine and tp x pp split;
- CUDA-graph memory: that, and the same model (graphs hold the model's own buffers);
- the weights actually loaded: the same engine, model and split;
- the activation peak: that, and the same step (max_num_batched_tokens) and sampler rows (max_num_seqs).
A term that does not hold falls back to the engine model's own figure; the notes say which and why.
"""

from __future__ import annotations

from dataclasses import replace

from kvplan.capacity.deployment import BoxProfile, Deployment
from kvplan.errors import InputError
from kvplan.hardware.gpus import GpuSpec, find_gpu
from kvplan.records import dataclass


@dataclass(frozen=True)
class BoxTerms:
    """The profile's terms that apply to one deployment (None: not measured, or not applicable)."""

    total_memory_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    weights_bytes: int | None = None
    activation_peak_bytes: int | None = None
    notes: tuple[str, ...] = ()


NO_TERMS = BoxTerms()


def same_gpu(profile: BoxProfile, gpu: GpuSpec) -> bool:
    """The profile was measured on this kind of GPU: its name resolves to the same catalog card (or names the
    same custom card); a profile that names no GPU matches a card of the same total within 1%."""
    if profile.gpu_name:
        if profile.gpu_name == gpu.key:
            return True
        try:
            return find_gpu(profile.gpu_name).key == gpu.key
        except InputError:
            return False
    total = profile.total_memory_bytes
    return total is not None and abs(total - gpu.total_memory_bytes) <= gpu.total_memory_bytes // 100


def box_terms(profile: BoxProfile | None, d: Deployment, *, max_num_batched_tokens: int | None = None,
              max_num_seqs: int | None = None) -> BoxTerms:
    """The profile's terms that hold for `d` on this engine. The step size and sampler rows are the engine's
    resolved ones for `d` (None when the engine has no such setting: no activation term then)."""
    if profile is None:
        return NO_TERMS
    notes: list[str] = []
    engine = d.engine.engine
    p = d.parallelism
    if not same_gpu(profile, d.gpu):
        return BoxTerms(notes=(f"profile {profile.source} was measured on {profile.gpu_name or 'another GPU'}, not "
                               f"{d.gpu.key}: none of its terms apply",))
    same_engine = profile.engine == engine
    same_split = (profile.tp, profile.pp) == (p.tp, p.pp)
    same_model = profile.model is not None and profile.model == d.model.name
    why_not = []
    if not same_engine:
        why_not.append(f"it was measured with {profile.engine}, not {engine}")
    if not same_split:
        why_not.append(f"it ran tp {profile.tp} x pp {profile.pp}, not tp {p.tp} x pp {p.pp}")
    if not same_model:
        why_not.append(f"it ran {profile.model or 'an unnamed model'}, not {d.model.name}")
    step = (profile.max_num_batched_tokens, profile.max_num_seqs) == (max_num_batched_tokens, max_num_seqs)
    if same_engine and same_split and same_model and not step and max_num_batched_tokens is not None:
        why_not.append(f"its activation peak was measured at {profile.max_num_batched_tokens} tokens per step and "
                       f"{profile.max_num_seqs} sequences, not {max_num_batched_tokens} and {max_num_seqs}")
    machine = same_engine and same_split
    terms = BoxTerms(
        total_memory_bytes=profile.total_memory_bytes,
        non_torch_bytes=profile.non_torch_bytes if machine else None,
        cuda_graph_bytes=profile.cuda_graph_bytes if machine and same_model else None,
        weights_bytes=profile.weights_bytes if machine and same_model else None,
        activation_peak_bytes=(profile.activation_peak_bytes
                               if machine and same_model and step and max_num_batched_tokens is not None else None),
    )
    used = [name for name, value in (("GPU total", terms.total_memory_bytes), ("non-torch", terms.non_torch_bytes),
                                     ("CUDA graphs", terms.cuda_graph_bytes), ("weights", terms.weights_bytes),
                                     ("activation peak", terms.activation_peak_bytes)) if value is not None]
    if used:
        notes.append(f"measured on this box ({profile.source}): {', '.join(used)}")
    if why_not:
        notes.append("other terms are modelled: " + "; ".join(why_not))
    return replace(terms, notes=tuple(notes))
