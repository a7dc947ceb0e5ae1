"""The start-up lines vLLM prints about memory, in each release's own wording (engine-rules.md 1.2, 1.8)."""

from __future__ import annotations

from typing import Any, Protocol

from kvplan.units import GiB


class VllmReport(Protocol):
    """What the lines print of vllm.VllmReport (a protocol, since vllm.py imports this module)."""

    @property
    def flags(self) -> Any: ...

    @property
    def stages(self) -> Any: ...

    @property
    def refusal(self) -> Any: ...

    @property
    def limiting_stage(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def kv_cache_tokens(self) -> int: ...

    @property
    def max_concurrency(self) -> float: ...

    @property
    def cudagraph_bytes(self) -> int: ...

    @property
    def requested_bytes(self) -> int: ...

    @property
    def total_memory_bytes(self) -> int: ...


# V0 keeps swap blocks for preemption: swap_space 4 GiB per GPU by default.
SWAP_SPACE_BYTES = 4 * GiB


def _gib(n_bytes: int) -> str:
    """vLLM's format_gib: round(bytes / GiB, 2), printed as Python prints a float (42.8, 58.11)."""
    return str(round(n_bytes / GiB, 2))


def _f2(n_bytes: int) -> str:
    """V0's "%.2f" GiB figures."""
    return f"{n_bytes / GiB:.2f}"


def _v0_lines(r: VllmReport) -> list[str]:
    f, rules = r.flags, r.flags.rules
    m = r.stages[0].memory
    kv = r.stages[0].available_kv_bytes
    lines = [f"Loading model weights took {m.weights_bytes / GiB:.4f} GB"]
    if rules.v0_budget == "absolute":  # 0.6.4: one line, torch's absolute peak and all non-torch memory
        lines.append(
            f"Memory profiling results: total_gpu_memory={_f2(r.total_memory_bytes)}GiB "
            f"peak_torch_memory={_f2(m.weights_bytes + m.activation_peak_bytes)}GiB "
            f"non_torch_memory={_f2(m.non_torch_bytes)}GiB kv_cache_size={_f2(kv)}GiB "
            f"gpu_memory_utilization={f.gpu_memory_utilization:.2f}"
        )
    elif rules.v0_budget == "snapshot":
        lines.append(
            f"the current vLLM instance can use total_gpu_memory ({_f2(r.total_memory_bytes)}GiB) x "
            f"gpu_memory_utilization ({f.gpu_memory_utilization:.2f}) = {_f2(r.requested_bytes)}GiB"
        )
        lines.append(
            f"model weights take {_f2(m.weights_bytes)}GiB; non_torch_memory takes {_f2(m.non_torch_bytes)}GiB; "
            f"PyTorch activation peak memory takes {_f2(m.activation_peak_bytes)}GiB; the rest of the memory "
            f"reserved for KV Cache is {_f2(kv)}GiB."
        )
    device = "cuda" if rules.since >= (0, 7, 0) else "GPU"
    cpu_blocks = SWAP_SPACE_BYTES // r.stages[r.limiting_stage].layout.bytes_per_block
    lines.append(f"# {device} blocks: {r.num_blocks}, # CPU blocks: {cpu_blocks}")
    if rules.concurrency_line and (r.refusal is None or r.refusal.code != "no_kv_memory"):
        lines.append(f"Maximum concurrency for {f.max_model_len} tokens per request: {r.max_concurrency:.2f}x")
    return lines


def _v1_weights_line(r: VllmReport) -> str:
    """gpu_model_runner.load_model's line in the release's wording, without its seconds (v1_load_wording)."""
    rules, weights = r.flags.rules, r.stages[0].memory.weights_bytes
    wording = rules.v1_load_wording
    if wording == "loading_gb":
        return f"Loading model weights took {weights / GiB:.4f} GB"
    if wording == "took_gb":
        return f"Model loading took {weights / GiB:.4f} GB"
    figure = _gib(weights) if wording == "format_gib" else f"{weights / GiB:.4f}"
    memory = wording != "took_gib" and (r.flags.runner == "v1" or rules.v2_load_memory_word)
    return f"Model loading took {figure} GiB" + (" memory" if memory else "")


def _v1_lines(r: VllmReport) -> list[str]:
    f, rules = r.flags, r.flags.rules
    lines = [_v1_weights_line(r)]
    # 0.9.1+: memory_profiling's result (a DEBUG line, here without its seconds) and the available KV memory,
    # "%.2f" until format_gib (0.14).
    gib = _gib if rules.v1_load_wording == "format_gib" else _f2
    if rules.v1_profile_logged:
        for s in r.stages:
            m = s.memory
            where = f"[PP{m.stage}] " if len(r.stages) > 1 else ""
            lines.append(
                f"{where}Memory profiling: torch peak memory increase: {_f2(m.activation_peak_bytes)}GiB; "
                f"non-torch forward increase memory: {_f2(m.non_torch_bytes)}GiB; "
                f"weights memory: {_f2(m.weights_bytes)}GiB."
            )
    v2_without_estimate = r.flags.runner == "v2" and not rules.v2_cudagraphs_profiled
    if rules.cudagraphs_profiled and r.cudagraph_bytes and not v2_without_estimate:
        lines.append(f"Estimated CUDA graph memory: {_gib(r.cudagraph_bytes)} GiB total")
    if rules.v1_profile_logged:
        lines.append(f"Available KV cache memory: {gib(r.stages[0].available_kv_bytes)} GiB")
    if r.refusal is not None and r.refusal.code in ("no_kv_memory", "one_request"):
        return lines
    if rules.v1_tokens_rule == "blocks" and rules.since < (0, 8, 0):
        lines.append(f"# GPU blocks: {r.num_blocks}")
        if rules.v1_blocks_concurrency:
            lines.append(f"Maximum concurrency for {f.max_model_len} tokens per request: {r.max_concurrency:.2f}x")
    else:
        size = f"GPU KV cache size: {r.kv_cache_tokens:,} tokens"
        conc = f"Maximum concurrency for {f.max_model_len:,} tokens per request: {r.max_concurrency:.2f}x"
        lines += [f"{size}, {conc}"] if rules.combined_kv_line else [size, conc]
    return lines


def log_lines(r: VllmReport) -> list[str]:
    """What rank 0 prints about memory, then the error vLLM stops with (if any)."""
    lines = _v0_lines(r) if r.flags.engine == "v0" else _v1_lines(r)
    if r.refusal is not None:
        kind = "RuntimeError" if r.refusal.code == "sampler_warmup_oom" else "ValueError"
        lines.append(f"{kind}: {r.refusal.message}")
    return lines
