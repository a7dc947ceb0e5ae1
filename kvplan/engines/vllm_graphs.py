"""vLLM's CUDA graphs: which batch sizes each release captures, and the memory the captured graphs hold.

docs/engine-rules.md 1.6. The sizes are vLLM's own lists; the bytes are a mechanism with fitted
coefficients (the research found no closed form): every captured graph costs a fixed amount plus an amount
per decoder layer (its kernel nodes), and the shared pool holds the widest step's per-layer buffers:

    bytes = graphs x (PER_GRAPH + layers x PER_GRAPH_LAYER [+ moe_layers x PER_GRAPH_MOE_LAYER / tp])
            + POOL_PER_TOKEN_WIDTH x sum_modes(largest size) x layers x (hidden + intermediate) / tp x b

Fitted by `python benchmarks/vllm_accuracy.py --fit` on the fit split only (vLLM 0.19, H100: 51 piecewise
+ 51 full graphs up to 512, from the "... GiB for CUDAGraph memory" debug line). Dense models, 22 distinct
configurations (Llama-3.1-8B at tp 1/2/4, pp 2/4 and three dtypes among them, 0.51-0.91 GiB): mean |error|
8.6%, worst +22.8%. MoE layers run kernels whose graph buffers depend on the kernel family and shrink with
the expert width each rank holds (1 / tp), one coefficient each: Triton fused-MoE (DeepSeek-V2-Lite,
Qwen3-30B-A3B at tp 1, Mixtral at tp 2, Llama 4 Scout at tp 4: worst -27.8%), and OpenAI's Triton kernels
for mxfp4, which rests on one model (gpt-oss-20b at tp 1 and 2: 1.84 and 1.55 GiB logged, 1.96 and 1.31
predicted).
"""

from __future__ import annotations

from kvplan.engines.vllm_versions import VllmRules
from kvplan.hardware.gpus import GpuSpec
from kvplan.records import dataclass
from kvplan.units import GiB

PER_GRAPH_BYTES = round(0.004564 * GiB)
PER_GRAPH_LAYER_BYTES = round(0.0000792 * GiB)
POOL_PER_TOKEN_WIDTH = 0.0995  # x largest size x layers x (hidden + intermediate) / tp x dtype bytes
PER_GRAPH_MOE_LAYER_BYTES = {"fused_moe": round(0.0001436 * GiB), "mxfp4": round(0.0005045 * GiB)}

# Data-center Blackwell (compute capability 10.x) captures up to 1,024 from 0.28 (is_device_capability_family).
_BLACKWELL_KEYS = ("B200", "GB200", "B300", "GB300")


@dataclass(frozen=True)
class GraphModes:
    """The batch sizes captured per CUDA-graph mode (empty: eager, or a mode the release lacks)."""

    piecewise: tuple[int, ...]
    full: tuple[int, ...] = ()
    # Captures of each size: 2 with LoRA from 0.11.1 (cudagraph_specialize_lora, on by default: one graph with
    # no adapter active and one with max_loras + 1), into the same pool.
    lora_cases: int = 1

    @property
    def count(self) -> int:
        return (len(self.piecewise) + len(self.full)) * self.lora_cases

    @property
    def largest_total(self) -> int:
        """The widest step of each mode, summed: each mode's pool holds its widest step's buffers."""
        return max(self.piecewise, default=0) + max(self.full, default=0)


NO_GRAPHS = GraphModes(())


def _v1_top(rules: VllmRules, gpu: GpuSpec, max_num_seqs: int, decode_query_len: int) -> int:
    """The largest capture size (0.10+): min(2 x seqs, 512), 1,024 on data-center Blackwell from 0.28; from 0.13
    a speculative decode step carries 1 + draft tokens a sequence."""
    ceiling = 1024 if rules.blackwell_1024 and gpu.key.upper().startswith(_BLACKWELL_KEYS) else 512
    return min(max_num_seqs * (decode_query_len if rules.capture_spec_len else 1) * 2, ceiling)


def _v1_sizes(rules: VllmRules, gpu: GpuSpec, max_num_seqs: int, decode_query_len: int) -> list[int]:
    if rules.capture_rule == "v1_512":  # 0.7 - 0.9: [1, 2, 4] + every 8 up to 512 (67 sizes)
        return [1, 2, 4, *range(8, 513, 8)]
    top = _v1_top(rules, gpu, max_num_seqs, decode_query_len)
    if rules.capture_rule == "v1_2seqs":  # 0.10.0 - 0.11.0: every 8 up to min(2 x seqs, 512)
        return [s for s in [1, 2, 4, *range(8, top + 1, 8)] if s <= top]
    # 0.11.1+: every 8 below 256, then every 16 (1,024 seqs -> 512 -> 51 sizes)
    return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)] if s <= top]


def capture_sizes(
    rules: VllmRules, engine: str, gpu: GpuSpec, *, max_num_seqs: int, max_num_batched_tokens: int,
    enforce_eager: bool = False, lora: bool = False, decode_query_len: int = 1,
) -> GraphModes:
    """The sizes vLLM captures. V0: decode batches [1, 2, 4, 8, 16, ...] up to max_num_seqs rounded up to 8
    (256 -> 35 graphs). V1: piecewise graphs up to the step; from 0.11 a FULL decode set beside them, up to
    max_num_seqs (the 0.19.1 log with 256 sequences: PIECEWISE=51 (largest=512), FULL=35 (largest=256))."""
    if enforce_eager:
        return NO_GRAPHS
    if engine == "v0":
        top = -(-max_num_seqs // 8) * 8
        return GraphModes(tuple(s for s in [1, 2, 4, *range(8, 257, 8)] if s <= top))
    sizes = [s for s in _v1_sizes(rules, gpu, max_num_seqs, decode_query_len) if s <= max_num_batched_tokens]
    # 0.20.1+ (VllmConfig._set_cudagraph_sizes) also captures an off-stride step within the largest size:
    # --max-num-batched-tokens 300 with 256 sequences adds 300 after 288.
    top = _v1_top(rules, gpu, max_num_seqs, decode_query_len)
    if rules.capture_step and max_num_batched_tokens <= top and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    # FULL decode graphs take uniform decode steps: max_num_seqs x q >= size >= q, q = 1 + draft tokens
    # (GPUModelRunner.capture_model, uniform_decode_query_len, 0.11+).
    q = decode_query_len
    full = tuple(s for s in sizes if q <= s <= max_num_seqs * q) if rules.full_graphs else ()
    return GraphModes(tuple(sizes), full, lora_cases=2 if lora and rules.lora_graph_cases else 1)


def graph_bytes(
    modes: GraphModes, *, layers: int, moe_layers: int, moe_kernel: str | None, hidden: int,
    intermediate: int, tp: int, dtype_bytes: int,
) -> int:
    """Memory the captured graphs hold on one rank (see the module docstring for the terms).

    Llama-3.1-8B, 0.19 on H100 (51 + 51 graphs, largest 512 each), bf16, tp 1: 102 x (4.67 MiB + 32 x 83 KiB)
    + 0.0995 x 1,024 x 32 x (4,096 + 14,336) x 2 B = 0.466 + 0.259 + 0.112 = 0.84 GiB (logged 0.91).
    """
    if modes.count == 0:
        return 0
    per_graph = PER_GRAPH_BYTES + layers * PER_GRAPH_LAYER_BYTES
    if moe_layers and moe_kernel:
        per_graph += moe_layers * PER_GRAPH_MOE_LAYER_BYTES[moe_kernel] // tp
    pool = POOL_PER_TOKEN_WIDTH * modes.largest_total * layers * (hidden + intermediate) / tp * dtype_bytes
    return modes.count * per_graph + int(pool)
