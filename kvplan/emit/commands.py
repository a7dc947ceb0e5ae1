"""The command that starts a planned deployment, in its engine's own flags: vllm serve, SGLang, trtllm-serve.

Each launcher writes the deployment's fields as that engine spells them (vLLM --tensor-parallel-size, SGLang
--tp-size, TensorRT-LLM --tp_size) and leaves the engine's defaults out, so the line starts the server kvplan
planned: one instance; replicas run the same line on their own GPUs. vLLM's --kv-cache-memory-bytes carries
the planned KV budget where the plan pinned it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from kvplan.capacity.deployment import Deployment
from kvplan.errors import InputError
from kvplan.records import dataclass


@dataclass(frozen=True)
class Launch:
    """A command line: the program words (`vllm serve`), then its arguments; notes say what it cannot carry."""

    program: tuple[str, ...]
    args: tuple[str, ...]
    image: str  # the engine's published container image, for deployment files
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        return self.program + self.args

    @property
    def shell(self) -> str:
        """The line as a shell reads it (model names and values quoted where needed)."""
        return shlex.join(self.argv)


def _flag(words: list[str], flag: str, value: object, default: object = None) -> None:
    if value is not None and value != default:
        words += [flag, str(value)]


def _vllm(d: Deployment, model: str) -> Launch:
    o, p = d.engine, d.parallelism
    words = [model, "--max-model-len", str(d.max_model_len)]
    _flag(words, "--tensor-parallel-size", p.tp, 1)
    _flag(words, "--pipeline-parallel-size", p.pp, 1)
    _flag(words, "--data-parallel-size", p.dp, 1)
    if p.expert_parallel:
        words.append("--enable-expert-parallel")
    _flag(words, "--kv-cache-dtype", d.kv_cache_dtype, "auto")
    _flag(words, "--dtype", d.weights.dtype)
    _flag(words, "--quantization", d.weights.quantization)
    for name in ("gpu_memory_utilization", "block_size", "max_num_seqs", "max_num_batched_tokens",
                 "kv_cache_memory_bytes"):
        _flag(words, "--" + name.replace("_", "-"), getattr(o, name, None))
    if getattr(o, "enable_prefix_caching", True) is False:
        words.append("--no-enable-prefix-caching")
    chunked = getattr(o, "enable_chunked_prefill", None)
    if chunked is not None:
        words.append("--enable-chunked-prefill" if chunked else "--no-enable-chunked-prefill")
    notes = []
    if getattr(o, "allow_long_max_model_len", False):
        notes.append("set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the environment")
    return Launch(("vllm", "serve"), tuple(words), "vllm/vllm-openai:latest", tuple(notes))


def _sglang(d: Deployment, model: str) -> Launch:
    o, p = d.engine, d.parallelism
    words = ["--model-path", model, "--context-length", str(d.max_model_len)]
    _flag(words, "--tp-size", p.tp, 1)
    _flag(words, "--pp-size", p.pp, 1)
    _flag(words, "--dp-size", p.dp, 1)
    if p.dp_attention:
        words.append("--enable-dp-attention")
    _flag(words, "--ep-size", p.ep_size)
    _flag(words, "--kv-cache-dtype", d.kv_cache_dtype, "auto")
    _flag(words, "--dtype", d.weights.dtype)
    _flag(words, "--quantization", d.weights.quantization)
    for name in ("mem_fraction_static", "page_size", "max_running_requests", "chunked_prefill_size",
                 "cuda_graph_max_bs"):
        _flag(words, "--" + name.replace("_", "-"), getattr(o, name, None))
    notes = ("SGLang sizes its token pool at start-up from --mem-fraction-static; no flag pins it to bytes",)
    return Launch(("python3", "-m", "sglang.launch_server"), tuple(words), "lmsysorg/sglang:latest", notes)


def _trtllm(d: Deployment, model: str) -> Launch:
    p = d.parallelism
    words = [model, "--backend", "pytorch", "--max_seq_len", str(d.max_model_len)]
    _flag(words, "--tp_size", p.tp, 1)
    _flag(words, "--pp_size", p.pp, 1)
    _flag(words, "--ep_size", p.ep_size)
    notes = []
    if d.kv_cache_dtype != "auto":
        words += ["--extra_llm_api_options", "kv_cache.yaml"]
        notes.append(f"kv_cache.yaml holds: kv_cache_config: {{dtype: {d.kv_cache_dtype}}} (trtllm-serve takes the "
                     "KV dtype only from that file)")
    if d.weights.quantization:
        notes.append(f"TensorRT-LLM quantizes ahead of time: serve a {d.weights.quantization} checkpoint")
    return Launch(("trtllm-serve",), tuple(words), "nvcr.io/nvidia/tensorrt-llm/release:1.0.0", tuple(notes))


# Engines kvplan can write a launch line for; `kvplan plan --engine` offers the registered engines listed here.
LAUNCHERS: dict[str, Callable[[Deployment, str], Launch]] = {
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
}


def launch(d: Deployment, model: str) -> Launch:
    """The command line for `d`, naming the model as the user did (`model`)."""
    try:
        return LAUNCHERS[d.engine.engine](d, model)
    except KeyError:
        raise InputError(f"kvplan writes no launch command for --engine {d.engine.engine}; "
                         f"plan with one of {', '.join(LAUNCHERS)}") from None
