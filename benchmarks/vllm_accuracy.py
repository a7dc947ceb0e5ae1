"""kvplan's vLLM engine model against every collected vLLM start-up log (benchmarks/logs/).

Each log is predicted from what its deployment states (model config, GPU, release, flags) and compared with
what vLLM printed: available KV memory, KV cache tokens, maximum concurrency, and the verdict (a logged
start must be called "fits", a logged failure for lack of KV room "does not fit"). Two modes:
  A  given the logged available KV memory: tests the block, token and concurrency arithmetic;
  B  end to end from the deployment alone: tests the whole budget model.
Logs split into "fit" (vllm-h100-0.19.jsonl: vLLM 0.19 on H100; and vllm-nontorch-fit.jsonl, other public logs
that only give the non-torch growth before Hopper) and "holdout" (vllm.jsonl: other GPUs and releases; nothing
is fitted on them). A log whose model config,
GPU or release is not known is listed as not evaluated, with the reason; nothing is guessed.

    python benchmarks/vllm_accuracy.py             # tables; writes benchmarks/results/vllm_accuracy.{md,json}
    python benchmarks/vllm_accuracy.py --logs DIR  # another log folder (same layout)
    python benchmarks/vllm_accuracy.py --fit       # refit activation, CUDA-graph, non-torch coefficients
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvplan.calibrate.formats import read_log  # noqa: E402
from kvplan.calibrate.vllm_log import (  # noqa: E402
    compile_cache_shown,
    flashinfer_sampler_shown,
    graph_estimate,
    install_shown,
)
from kvplan.capacity.deployment import BoxProfile  # noqa: E402
from kvplan.capacity.weights import CHECKPOINT_FLAGS, names_checkpoint_format  # noqa: E402
from kvplan.engines.checkpoint_kv import checkpoint_kv_dtype  # noqa: E402
from kvplan.engines.vllm import VllmFlags, VllmReport, graphs_charged, plan_vllm, resolve_flags  # noqa: E402
from kvplan.engines.vllm_graphs import capture_sizes  # noqa: E402
from kvplan.engines.vllm_lora import LoraSlots  # noqa: E402
from kvplan.engines.vllm_memory import HOPPER, padded_vocab  # noqa: E402
from kvplan.engines.vllm_speculative import speculative_options  # noqa: E402
from kvplan.engines.vllm_versions import parse_release, rules_for  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.hardware.gpus import GpuSpec, custom_gpu, find_gpu  # noqa: E402
from kvplan.model.dtypes import weight_dtype_bytes  # noqa: E402
from kvplan.model.specs import ModelSpec  # noqa: E402
from kvplan.sources.resolve import resolve_model  # noqa: E402
from kvplan.units import GiB  # noqa: E402

LOGS = REPO / "benchmarks" / "logs"
RESULTS = REPO / "benchmarks" / "results"
FILES = (("vllm-h100-0.19.jsonl", "fit"), ("vllm.jsonl", "holdout"))
FAILURE_CODES = ("one_request", "no_kv_memory", "mamba_blocks")
_ARGS_RE = re.compile(r"non-default args: (\{.*\})")
_PAIR_RE = re.compile(r"'(\w+)': ('[^']*'|[\w.]+)")
_RELEASE_RE = re.compile(r"\d+\.\d+(?:\.\d+)?")
_UNSLOTH_RE = re.compile(r"Chunked prefill tokens = (\d+)\. Num Sequences = (\d+)")
# The step vLLM's scheduler settled on; it outranks a wrapper's banner (in the Qwen2.5-VL notebooks Unsloth
# prints 2,048 and vLLM's scheduler 16,384).
_CHUNKED_RE = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)")
_UNSLOTH_UTIL_RE = re.compile(r"actual GPU utilization = ([0-9.]+)%")
_GRAPH_RE = re.compile(r"and ([0-9.]+) GiB for CUDAGraph memory")
_ENGINE_CFG = {
    "dtype": re.compile(r"\bdtype=torch\.(\w+)"),
    "quantization": re.compile(r"\bquantization=(\w+)"),
    "kv_cache_dtype": re.compile(r"\bkv_cache_dtype=(\w+)"),
    "enforce_eager": re.compile(r"\benforce_eager=(True|False)"),
    "max_seq_len": re.compile(r"\bmax_seq_len=(\d+)"),
    "enable_chunked_prefill": re.compile(r"\b(?:chunked_prefill_enabled|enable_chunked_prefill)=(True|False)"),
}
# Runtime quantizations kvplan sizes from an unquantized config (vLLM --quantization fp8).
RUNTIME_QUANT = ("fp8",)
# Formats whose forward kvplan sizes from the flag alone, even where the weights come from the log: a
# bitsandbytes checkpoint's skipped modules change its weights, not how its 4-bit layers run.
FORWARD_QUANT = RUNTIME_QUANT + ("bitsandbytes",)
# Unsloth launched vLLM (its "Unsloth: ..." lines): unsloth_zoo's patch runs bitsandbytes in the model dtype.
_UNSLOTH_LINE_RE = re.compile(r"^Unsloth: ", re.MULTILINE)


@dataclass(frozen=True)
class Case:
    row: dict
    split: str
    outcome: str  # started, kv_oom, oom_other, other_failure
    model: ModelSpec | None = None
    gpu: GpuSpec | None = None
    flags: VllmFlags | None = None
    relation: str = "library"  # how the config stands for the logged checkpoint (configs/aliases.json)
    weights_from_log: bool = False  # the config lacks the checkpoint's quantization: weights pinned to the log
    version_inferred: bool = False
    gpu_from_total: bool = False
    # The checkpoint's weights are neither in the config nor in the log: only mode A (the block, token and
    # concurrency arithmetic from the logged KV memory) is compared; no verdict, no mode-B error.
    a_only: bool = False
    # Memory another process holds on each GPU, as the thread states it (`other_process_gib`, or another vLLM
    # instance's `other_process_utilization` x the card's total): planned with --gpu-memory-in-use.
    in_use_bytes: int = 0
    skip: str | None = None

    @property
    def release(self) -> str:
        return "-" if self.flags is None else self.flags.version

    @property
    def minor(self) -> str:
        return "unknown" if self.flags is None else ".".join(self.flags.version.split(".")[:2])

    @property
    def gpu_key(self) -> str:
        if self.gpu is None:
            return "unknown"
        return "logged total" if self.gpu_from_total else self.gpu.key


@dataclass(frozen=True)
class Result:
    case: Case
    a: VllmReport  # rank 0 pinned to the logged available KV memory
    b: VllmReport  # from the deployment alone
    errors: dict[str, float | None] = field(default_factory=dict)

    @property
    def verdict_ok(self) -> bool | None:
        """The predicted start or refusal agrees with the log (None: the log's outcome is not a memory one, or
        the deployment's weights are unknown)."""
        if self.case.a_only:
            return None
        code = self.b.refusal.code if self.b.refusal else None
        o = self.case.outcome
        if o == "started":
            return code is None
        if o == "kv_oom":
            return code in FAILURE_CODES
        if o == "oom_other":
            return code == "sampler_warmup_oom"
        return None


# --- reading the logs -----------------------------------------------------------------------------------------

def _outcome(row: dict) -> str:
    if "outcome" in row:
        return row["outcome"]
    err = row.get("error_text") or ""
    return "oom_other" if "warming up sampler" in err else ("kv_oom" if err else "started")


def _raw(row: dict) -> str:
    return "\n".join(row.get("raw") or [])


def _logged_args(row: dict) -> dict:
    """The "non-default args" dict vLLM logs (joined across wrapped lines), or {}."""
    text = "".join(row.get("raw") or [])
    m = _ARGS_RE.search(text)
    if not m:
        return {}
    try:
        value = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        # Values Python cannot read back (torch.bfloat16, <CUDAGraphMode...>): the plain 'key': value pairs.
        found: dict[str, Any] = {}
        for key, raw in _PAIR_RE.findall(m.group(1)):
            found.setdefault(key, _flag(raw.strip("'")))
        return found
    return value if isinstance(value, dict) else {}


def _engine_cfg(row: dict) -> dict:
    text = "".join(row.get("raw") or [])
    out = {}
    for key, rx in _ENGINE_CFG.items():
        m = rx.search(text)
        if m:
            out[key] = m.group(1)
    return out


def _release(row: dict) -> tuple[str | None, bool]:
    """(release, inferred?) from engine_version, else the first version in engine_version_inferred."""
    exact = row.get("engine_version") or row.get("vllm_version")
    if exact:
        return exact, False
    m = _RELEASE_RE.search(row.get("engine_version_inferred") or "")
    return (m.group(0), True) if m else (None, False)


def _config_path(logs: Path, rel: str) -> Path:
    """A config named relative to the log collection's repository: its configs/ folder, or model_configs/."""
    if rel.startswith("benchmarks/logs/"):
        return logs / rel[len("benchmarks/logs/"):]
    return REPO / rel


def _model(row: dict, logs: Path, aliases: dict) -> tuple[ModelSpec | None, str, str | None]:
    """(model, relation, why not) for the log's model string."""
    name = row.get("model") or ""
    alias = aliases.get(name)
    if alias is not None:
        if not alias.get("config"):
            return None, alias.get("relation", "not found"), f"no config ({alias.get('relation')})"
        try:
            spec = resolve_model(str(_config_path(logs, alias["config"])), offline=True).model
        except KvplanError as exc:
            why = str(exc).replace(f"{REPO}/", "")  # repo-relative: results committed from any checkout agree
            return None, alias["relation"], f"config not sized ({type(exc).__name__}: {why[:90]})"
        return spec, alias["relation"], None
    try:
        return resolve_model(name, offline=True).model, "library", None
    except KvplanError as exc:
        return None, "not found", f"no bundled config ({type(exc).__name__})"


def _flag(value: Any) -> Any:
    """'True'/'False'/'None'/'123' as logged by wrappers -> Python values."""
    if isinstance(value, str):
        if value in ("True", "False"):
            return value == "True"
        if value == "None":
            return None
        if value.isdigit():
            return int(value)
    return value


# Config relations (configs/aliases.json) where the config is the logged checkpoint's own, so its ModelOpt KV
# quantization is the checkpoint's too; a stand-in's is not.
OWN_CONFIG = ("library", "verbatim", "printed copy", "re-saved copy", "re-upload")


def _vllm_flags(row: dict, release: str, model: ModelSpec, relation: str) -> tuple[VllmFlags, dict]:
    """The deployment's flags as the log states them; the dict says where each came from."""
    given: dict[str, Any] = {}
    given.update({k: _flag(v) for k, v in (row.get("flags") or {}).items()})
    given.update(_logged_args(row))
    cfg = _engine_cfg(row)
    raw = _raw(row)
    m = _CHUNKED_RE.search(raw)
    if m and "max_num_batched_tokens" not in given:
        given["max_num_batched_tokens"] = int(m.group(1))
    m = _UNSLOTH_RE.search(raw)
    if m:  # Unsloth passes its own step and sequence count to vLLM
        given.setdefault("max_num_batched_tokens", int(m.group(1)))
        given.setdefault("max_num_seqs", int(m.group(2)))
    util = row.get("gpu_memory_utilization") or given.get("gpu_memory_utilization")
    m = _UNSLOTH_UTIL_RE.search(raw)
    if m:
        util = float(m.group(1)) / 100
    max_len = row.get("max_model_len") or _flag(given.get("max_model_len")) or _flag(given.get("max_seq_len"))
    if not max_len and "max_seq_len" in cfg:
        max_len = int(cfg["max_seq_len"])
    dtype = str(given.get("dtype") or cfg.get("dtype") or "auto").replace("torch.", "")
    quant = row.get("quantization") or given.get("quantization") or cfg.get("quantization")
    quant = None if quant in (None, "None", "none") else str(quant)
    if "V0 LLM engine" in raw:
        use_v1: bool | None = False
    elif "V1 LLM engine" in raw or str(given.get("VLLM_USE_V1")) == "1":
        use_v1 = True
    else:
        use_v1 = None
    # The vllm/vllm-openai image's entrypoint is the OpenAI server, so a docker run of it serves.
    serve = any(x in raw for x in ("non-default args", "api_server", "vllm serve", "vllm/vllm-openai"))
    # The image (kvplan's default) unless the log, or the record from the thread's environment, shows a wheel
    # install; it decides 0.8-0.11's sampler.
    install = install_shown(raw) or row.get("install") or "image"
    eager = given.get("enforce_eager", cfg.get("enforce_eager"))
    kv_dtype = row.get("kv_cache_dtype") or given.get("kv_cache_dtype") or cfg.get("kv_cache_dtype") or "auto"
    if kv_dtype == "auto" and relation in OWN_CONFIG:  # what vLLM 0.14+ runs for a ModelOpt KV checkpoint
        kv_dtype = checkpoint_kv_dtype(model, "vllm", release) or "auto"
    caching = _flag(given.get("enable_prefix_caching"))
    chunked = _flag(given.get("enable_chunked_prefill", cfg.get("enable_chunked_prefill")))
    spec = given.get("speculative_config")
    spec = speculative_options(spec if isinstance(spec, (str, dict)) else None)
    flags = VllmFlags(
        max_model_len=int(max_len) if max_len else None,
        gpu_memory_utilization=float(util) if util else None,
        kv_cache_dtype=str(kv_dtype),
        block_size=row.get("block_size") or _flag(given.get("block_size")),
        max_num_seqs=_flag(given.get("max_num_seqs")),
        max_num_batched_tokens=_flag(given.get("max_num_batched_tokens")),
        tensor_parallel_size=row.get("tp") or int(given.get("tensor_parallel_size") or 1),
        pipeline_parallel_size=row.get("pp") or int(given.get("pipeline_parallel_size") or 1),
        dtype=dtype if dtype not in ("half",) else "float16",
        quantization=quant if (model.quant is None and quant in FORWARD_QUANT) else None,
        enable_prefix_caching=None if caching is None else bool(caching),
        enable_chunked_prefill=None if chunked is None else bool(chunked),
        version=release,
        use_v1=use_v1,
        usage="serve" if serve else "llm",
        install=install,
        enforce_eager=bool(_flag(eager)) if eager is not None else False,
        # kvplan's default (a cold compile cache) unless the log shows torch.compile loading its graphs.
        compile_cache=compile_cache_shown(raw) or "cold",
        # The sampler the log names (Unsloth sets VLLM_USE_FLASHINFER_SAMPLER=1 where FlashInfer is importable).
        flashinfer_sampler=flashinfer_sampler_shown(raw),
        allow_long_max_model_len=True,
        lora=_lora(given),
        bnb_compute="model" if _UNSLOTH_LINE_RE.search(raw) else "bfloat16",
        # VLLM_USE_DEEP_GEMM / VLLM_MOE_USE_DEEP_GEMM where the record's command sets them.
        deep_gemm=_deep_gemm(given),
        **spec,
    )
    return flags, {"quantization": quant}


def _deep_gemm(given: dict[str, Any]) -> bool | None:
    """The DeepGEMM switches of the record's command (VllmFlags.deep_gemm): off where either is 0."""
    values = [str(given[k]) for k in ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM") if k in given]
    if "0" in values:
        return False
    return True if str(given.get("VLLM_MOE_USE_DEEP_GEMM")) == "1" else None


def _lora(given: dict[str, Any]) -> LoraSlots | None:
    """LoRA slots where the log's arguments (or, for Unsloth, the notebook's own cell) turn LoRA on."""
    if not _flag(given.get("enable_lora")):
        return None
    return LoraSlots(int(_flag(given.get("max_loras")) or 1), int(_flag(given.get("max_lora_rank")) or 16))


def load_cases(logs: Path) -> list[Case]:
    alias_file = logs / "configs" / "aliases.json"
    aliases = json.loads(alias_file.read_text()) if alias_file.exists() else {}
    cases = []
    for name, split in FILES:
        path = logs / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            row = json.loads(line)
            cases.append(_case(row, row.get("split", split), logs, aliases))
    return cases


def _case(row: dict, split: str, logs: Path, aliases: dict) -> Case:
    case = Case(row, split, _outcome(row))
    if case.outcome == "other_failure":
        return replace(case, skip="not a memory outcome")
    model, relation, why = _model(row, logs, aliases)
    case = replace(case, relation=relation)
    if model is None:
        return replace(case, skip=why)
    release, inferred = _release(row)
    if release is None:
        return replace(case, model=model, skip="release not stated")
    try:
        parse_release(release)
    except KvplanError:
        return replace(case, model=model, skip=f"release {release} outside 0.6.0-0.33")
    gpu, from_total = None, False
    if row.get("gpu_key"):
        gpu = find_gpu(row["gpu_key"])
    elif split == "fit":  # the reference file: every log is an H100 80GB (its "gpu" field names it)
        gpu = find_gpu(row["gpu"])
    elif row.get("total_gpu_memory_gib"):
        gpu, from_total = custom_gpu(round(row["total_gpu_memory_gib"] * GiB), "logged-total"), True
    if gpu is None:
        return replace(case, model=model, skip="GPU not named and no total logged")
    flags, seen = _vllm_flags(row, release, model, relation)
    if (row.get("num_gpus") or 1) > 1 and flags.tensor_parallel_size * flags.pipeline_parallel_size == 1:
        # Several GPUs and no tp / pp in the record (an excerpt that cuts the args): planning it on one GPU
        # would test a deployment nobody ran.
        return replace(case, model=model, gpu=gpu, skip=f"the parallel layout over {row['num_gpus']} GPUs not stated")
    case = replace(case, in_use_bytes=_in_use(row, gpu))
    quantized_variant = relation == "quantized variant" or _other_quantization(seen["quantization"], model)
    unknown = ("checkpoint quantization not in the config" if quantized_variant else
               "checkpoint not named" if relation == "uncertain" else None)
    if unknown and not row.get("weights_gib"):
        if not row.get("available_kv_gib"):
            return replace(case, model=model, gpu=gpu, flags=flags, skip=f"{unknown} and no weights logged")
        return replace(case, model=model, gpu=gpu, flags=flags, a_only=True, version_inferred=inferred,
                       gpu_from_total=from_total)
    return replace(case, model=model, gpu=gpu, flags=flags, weights_from_log=bool(quantized_variant),
                   version_inferred=inferred, gpu_from_total=from_total)


def _in_use(row: dict, gpu: GpuSpec) -> int:
    """Bytes another process holds on the GPU, from the record: a printed figure, else another vLLM instance's
    --gpu-memory-utilization times the card's total. That instance's footprint is its budget: it returns its
    profiling peak to the driver and adds its CUDA graphs, a few hundred MiB either way, far less than the
    margins these failures show (a 0.2 instance beside another 0.2 one on a 44.4 GiB L40S)."""
    if row.get("other_process_gib") is not None:
        return round(row["other_process_gib"] * GiB)
    if row.get("other_process_utilization") is not None:
        return round(row["other_process_utilization"] * gpu.total_memory_bytes)
    return 0


def _other_quantization(flag: str | None, model: ModelSpec) -> bool:
    """The log's --quantization names a format the config does not hold: the config is not the checkpoint's.

    club-3090's Qwen3.6-27B runs pass auto_round (an AutoRound INT4 checkpoint) while the config that stands
    in for them is NVIDIA's ModelOpt export; a config without quantization under any non-runtime flag."""
    if not flag:
        return False
    if model.quant is None:
        return flag not in RUNTIME_QUANT
    return flag in CHECKPOINT_FLAGS and not names_checkpoint_format(flag, model.quant)


# --- evaluation ----------------------------------------------------------------------------------------------

def pct(pred: float | None, actual: float | None) -> float | None:
    if pred is None or actual in (None, 0):
        return None
    return 100.0 * (pred - actual) / abs(actual)


def _logged_tokens(row: dict, flags: VllmFlags) -> int | None:
    if row.get("kv_tokens"):
        return row["kv_tokens"]
    if row.get("num_gpu_blocks") and "GPU KV cache size" not in _raw(row):
        return row["num_gpu_blocks"] * (flags.block_size or 16)
    return None


def _weights_profile(c: Case) -> BoxProfile | None:
    """The logged weights as a measured term, for checkpoints whose quantization the config lacks."""
    if not c.weights_from_log or c.model is None or c.flags is None:
        return None
    return BoxProfile(source=c.row["id"], engine="vllm", model=c.model.name,
                      tp=c.flags.tensor_parallel_size, pp=c.flags.pipeline_parallel_size,
                      weights_bytes=round(c.row["weights_gib"] * GiB))


def evaluate(cases: list[Case]) -> tuple[list[Result], list[Case]]:
    results, skipped = [], []
    for c in cases:
        if c.skip is not None:
            skipped.append(c)
            continue
        assert c.model is not None and c.gpu is not None and c.flags is not None
        try:
            b = plan_vllm(c.model, c.flags, c.gpu, profile=_weights_profile(c), in_use_bytes=c.in_use_bytes)
        except KvplanError as exc:
            skipped.append(replace(c, skip=f"kvplan cannot evaluate: {str(exc)[:90]}"))
            continue
        logged_av = c.row.get("available_kv_gib")
        shift = 0 if logged_av is None else round(logged_av * GiB) - b.first_rank_available_kv_bytes
        a = plan_vllm(c.model, c.flags, c.gpu, profile=_weights_profile(c), available_shift_bytes=shift,
                      in_use_bytes=c.in_use_bytes)
        tokens = _logged_tokens(c.row, c.flags)
        errors = {
            "available": pct(b.first_rank_available_kv_bytes / GiB, logged_av) if logged_av and logged_av > 0 else None,
            "tokens_a": pct(a.kv_cache_tokens, tokens) if logged_av else None,
            "tokens_b": pct(b.kv_cache_tokens, tokens),
            "concurrency": pct(b.max_concurrency, c.row.get("max_concurrency")),
            "weights": pct(b.stages[0].memory.weights_bytes / GiB, c.row.get("weights_gib")),
        }
        if c.a_only:
            errors.update(available=None, tokens_b=None, concurrency=None, weights=None)
        results.append(Result(c, a, b, errors))
    return results, skipped


# --- report --------------------------------------------------------------------------------------------------

def _stats(values: list[float | None]) -> tuple[int, float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return 0, None, None
    return len(vals), sum(abs(v) for v in vals) / len(vals), max(vals, key=abs)


def _cell(values: list[float | None]) -> str:
    n, mae, worst = _stats(values)
    return "-" if n == 0 else f"{mae:.2f}% / {worst:+.1f}% ({n})"


def _verdict_cell(group: list[Result]) -> str:
    judged = [r.verdict_ok for r in group if r.verdict_ok is not None]
    return "-" if not judged else f"{sum(judged)}/{len(judged)}"


def _table(title: str, results: list[Result], key) -> list[str]:
    lines = [f"## {title}", "",
             "Each cell: mean |error| / worst error (logs compared). Available KV and tokens (B) from the deployment "
             "alone; tokens (A) given the logged KV memory.", "",
             "| split | group | logs | available KV (B) | KV tokens (B) | KV tokens (A) | concurrency (B) "
             "| verdict right |",
             "|---|---|---|---|---|---|---|---|"]
    for split in ("fit", "holdout"):
        groups: dict[str, list[Result]] = {}
        for r in results:
            if r.case.split == split:
                groups.setdefault(key(r), []).append(r)
        for name in sorted(groups):
            g = groups[name]
            lines.append(
                f"| {split} | {name} | {len(g)} | {_cell([r.errors['available'] for r in g])} "
                f"| {_cell([r.errors['tokens_b'] for r in g])} | {_cell([r.errors['tokens_a'] for r in g])} "
                f"| {_cell([r.errors['concurrency'] for r in g])} | {_verdict_cell(g)} |"
            )
    return lines + [""]


def _clean(r: Result) -> bool:
    """A log stated in full: exact release, a named GPU, its own checkpoint's config, weights modelled."""
    c = r.case
    return not (c.version_inferred or c.gpu_from_total or c.weights_from_log
                or c.relation not in ("library", "verbatim", "re-upload"))


def _summary_of(g: list[Result]) -> dict[str, Any]:
    n_av, mae_av, worst_av = _stats([r.errors["available"] for r in g])
    n_tok, mae_tok, worst_tok = _stats([r.errors["tokens_b"] for r in g])
    def called(outcomes: tuple[str, ...]) -> list[int]:
        group = [r for r in g if r.case.outcome in outcomes and not r.case.a_only]
        return [sum(bool(r.verdict_ok) for r in group), len(group)]

    return {
        "logs_evaluated": len(g),
        "available_kv": {"logs": n_av, "mae_pct": mae_av, "worst_pct": worst_av},
        "kv_tokens": {"logs": n_tok, "mae_pct": mae_tok, "worst_pct": worst_tok},
        "starts_called_fits": called(("started",)),
        # Refused for lack of KV room (the target), and out of memory after the cache was allocated
        # (sampler warm-up, CUDA-graph capture): reported apart, the second is not a KV-room failure.
        "failures_called_does_not_fit": called(("kv_oom",)),
        "oom_after_kv_called": called(("oom_other",)),
    }


def _held_out_bands(results: list[Result], key) -> dict[str, dict[str, Any]]:
    """Available KV memory on the held-out logs per group (GPU, minor release): the bands a plan quotes."""
    groups: dict[str, list[float | None]] = {}
    for r in results:
        if r.case.split == "holdout":
            groups.setdefault(key(r), []).append(r.errors["available"])
    bands = {}
    for name in sorted(groups):
        n, mae, worst = _stats(groups[name])
        if n:
            bands[name] = {"logs": n, "mae_pct": mae, "worst_pct": worst}
    return bands


def summary(results: list[Result]) -> dict[str, Any]:
    """Per split, the held-out logs stated in full ("holdout_clean": no mark in the per-log table), and the
    held-out available-KV error per GPU and per minor release (kvplan/engines/vllm_calibration.py quotes them)."""
    out = {split: _summary_of([r for r in results if r.case.split == split]) for split in ("fit", "holdout")}
    out["holdout_clean"] = _summary_of([r for r in results if r.case.split == "holdout" and _clean(r)])
    out["holdout_by_gpu"] = _held_out_bands(results, lambda r: r.case.gpu_key)
    out["holdout_by_release"] = _held_out_bands(results, lambda r: r.case.minor)
    return out


def _targets(s: dict[str, Any]) -> list[str]:
    def mark(ok: bool) -> str:
        return "met" if ok else "**missed**"

    def cells(h: dict[str, Any]) -> list[str]:
        av, tok = h["available_kv"], h["kv_tokens"]
        starts, fails, after = h["starts_called_fits"], h["failures_called_does_not_fit"], h["oom_after_kv_called"]
        if not av["logs"]:
            return ["-"] * 6
        return [
            f"{av['mae_pct']:.2f}% over {av['logs']} logs, {mark(av['mae_pct'] <= 3)}",
            f"{av['worst_pct']:+.1f}%, {mark(abs(av['worst_pct']) <= 10)}",
            f"{tok['mae_pct']:.2f}% over {tok['logs']} logs, {mark(tok['mae_pct'] <= 3)}",
            f"{starts[0]}/{starts[1]}, {mark(starts[0] == starts[1])}",
            f"{fails[0]}/{fails[1]}, {mark(fails[0] == fails[1])}",
            f"{after[0]}/{after[1]} (no target)",
        ]

    names = ["available KV memory MAE <= 3%", "available KV memory worst <= 10%", "KV tokens MAE <= 3%",
             "every logged start called fits", "every logged KV-room failure called does not fit",
             "out of memory after the KV cache (warm-up, graph capture) called"]
    every, clean = cells(s["holdout"]), cells(s["holdout_clean"])
    lines = ["## Targets on the held-out logs", "",
             "*All*: every evaluated held-out log. *Stated in full*: only those with an exact release, a named GPU, "
             "the checkpoint's own config and modelled weights (no mark in the per-log table).", "",
             "| target | all held-out logs | stated in full |", "|---|---|---|"]
    lines += [f"| {n} | {a} | {b} |" for n, a, b in zip(names, every, clean, strict=True)]
    return lines + [""]


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


_CONSUMED_SUMMARY = "GiB for consumed memory (weights + non-torch)"


def _predicted_activation(r: Result) -> int:
    """kvplan's figure for the log's "peak activation". vLLM 0.26+'s consumed-memory summary prints under that name
    all the budget takes beyond weights and non-torch memory, the CUDA-graph estimate included (fentz26's
    Qwen3.8-27B: 30.1 - 14.94 - 4.81 = 10.35 GiB available, 3.51 of the 4.81 its logged graph estimate), so the
    plan's charged graph estimate joins its activation there."""
    m = r.b.stages[0].memory
    summary = any(_CONSUMED_SUMMARY in line for line in r.case.row.get("raw", []))
    graphs = r.b.cudagraph_bytes if summary and graphs_charged(r.b.flags) else 0
    return m.activation_peak_bytes + graphs


def logged_graph_estimate(r: Result) -> int | None:
    """The CUDA-graph estimate the log prints (0.18.1+): "Estimated CUDA graph memory", the pool line's
    "(estimated)", or the same as a share of the total (kvplan calibrate's reader, one parser for both)."""
    log = read_log("\n".join(r.case.row.get("raw") or []), r.case.row["id"])
    got = log.get("cuda_graph_estimate") or graph_estimate(log, r.b.total_memory_bytes)
    return None if got is None else got.as_int


def _graph_estimates(results: list[Result]) -> list[str]:
    """kvplan's CUDA-graph bytes against the estimate each log prints: a term the fit never saw (its 0.19 logs
    print the captured pool only), so every row is held out."""
    rows = [(r, got) for r in results if r.case.split == "holdout" and (got := logged_graph_estimate(r))]
    errs = [pct(r.b.cudagraph_bytes / GiB, got / GiB) for r, got in rows]
    n, mae, worst = _stats(errs)
    gib_mae = sum(abs(r.b.cudagraph_bytes - got) for r, got in rows) / max(n, 1) / GiB
    lines = ["## CUDA-graph estimate", "",
             "vLLM 0.18.1+ estimate their CUDA graphs before sizing the KV cache (0.20+ subtract the estimate) and "
             "print it, or its share of the total. kvplan's graph bytes come from coefficients fitted on the 0.19 "
             "fit split's captured pools (vllm_graphs.py). "
             + (f"Over {n} held-out logs: MAE {mae:.1f}% ({gib_mae:.2f} GiB), worst {worst:+.1f}%." if n else ""),
             "", "| log | GPU | release | runner | graphs | logged estimate | kvplan | error |",
             "|---|---|---|---|---|---|---|---|"]
    for (r, got), err in sorted(zip(rows, errs, strict=True), key=lambda x: x[0][0].case.row["id"]):
        f = r.b.flags
        lines.append(f"| {r.case.row['id']} | {r.case.gpu_key} | {r.case.release} | {f.runner} | {r.b.graphs.count} "
                     f"| {_gib(got / GiB)} | {_gib(r.b.cudagraph_bytes / GiB)} | {err:+.1f}% |")
    return lines + [""]


def _per_log(results: list[Result]) -> list[str]:
    lines = ["## Per log", "",
             "GiB as logged / predicted (rank 0). Marks: ~ release inferred by the collector, T GPU from the "
             "logged total, W weights from the log (the config lacks the checkpoint's quantization), "
             "R config stands in for the checkpoint (relation in configs/aliases.json), A weights unknown (neither "
             "config nor log): only tokens given the logged KV memory (mode A) are compared, O another process holds "
             "memory on the GPU (as the thread states it; planned with --gpu-memory-in-use). Activation: from 0.26 "
             "vLLM prints the CUDA-graph estimate inside \"peak activation\", and kvplan's column adds its own "
             "there.", "",
             "| split | log | GPU | release | outcome / predicted | weights | activation | available KV | "
             "tokens (B) | concurrency |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.case.split, r.case.gpu_key, r.case.release, r.case.row["id"])):
        c, b, row = r.case, r.b, r.case.row
        m = b.stages[0].memory
        marks = "".join(x for x, on in (("~", c.version_inferred), ("T", c.gpu_from_total), ("W", c.weights_from_log),
                                         ("R", c.relation not in ("library", "verbatim", "re-upload")),
                                         ("A", c.a_only), ("O", c.in_use_bytes > 0)) if on)
        predicted = "-" if c.a_only else b.refusal.code if b.refusal else "fits"
        tokens = _logged_tokens(row, c.flags) if c.flags else None
        shown = r.a if c.a_only else b  # mode A's figures where the deployment's weights are unknown
        tok = "-" if tokens is None else f"{tokens:,} / {shown.kv_cache_tokens:,}"
        conc = ("-" if not row.get("max_concurrency")
                else f"{row['max_concurrency']:.2f} / {shown.max_concurrency:.2f}")
        av_err = r.errors["available"]
        av = f"{_gib(row.get('available_kv_gib'))} / {_gib(shown.first_rank_available_kv_bytes / GiB)}"
        if av_err is not None:
            av += f" ({av_err:+.1f}%)"
        lines.append(
            f"| {c.split} | {row['id']} {marks} | {c.gpu_key} | {c.release} ({b.flags.engine}) "
            f"| {c.outcome} / {predicted} | {_gib(row.get('weights_gib'))} / {_gib(m.weights_bytes / GiB)} "
            f"| {_gib(row.get('activation_peak_gib'))} / {_gib(_predicted_activation(r) / GiB)} "
            f"| {av} | {tok} | {conc} |"
        )
    return lines + [""]


def _collection(logs: Path) -> str:
    """The log collection's git commit, when the folder is in a repository (which logs these results cover)."""
    try:
        done = subprocess.run(["git", "-C", str(logs), "log", "-1", "--format=%h %cs", "--", "."],
                              capture_output=True, text=True, timeout=10)
    except OSError:
        return ""
    return f" at commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else ""


def cases_of(results: list[Result], skipped: list[Case]) -> list[Case]:
    return [r.case for r in results] + skipped


def _engine_choice(cases: list[Case]) -> list[str]:
    """vLLM 0.8-0.10 logs that name their engine ("Initializing a V0/V1 LLM engine") against the engine kvplan
    picks with VLLM_USE_V1 unset (kvplan.engines.vllm_fallback): a check of the V1 oracle as read from source.
    A log whose user set VLLM_USE_V1 shows the engine asked for, not the oracle's, and is left out."""
    rows, agree, total = [], 0, 0
    for c in cases:
        if c.flags is None or c.model is None or c.gpu is None or c.flags.use_v1 is None:
            continue
        if "VLLM_USE_V1" in _raw(c.row) or not (0, 8, 0) <= parse_release(c.flags.version) < (0, 11, 0):
            continue
        logged = "v1" if c.flags.use_v1 else "v0"
        total += 1
        try:
            picked = resolve_flags(c.model, replace(c.flags, use_v1=None), c.gpu)
        except KvplanError as exc:
            rows.append(f"| {c.row['id']} | {c.flags.version} | {c.gpu_key} | {logged} | refused: {exc} |")
            continue
        agree += picked.engine == logged
        if picked.engine != logged or picked.v0_fallback:
            why = f" ({picked.v0_fallback})" if picked.v0_fallback else ""
            rows.append(f"| {c.row['id']} | {c.flags.version} | {c.gpu_key} | {logged} | {picked.engine}{why} |")
    return [
        "## Engine chosen (vLLM 0.8-0.10, VLLM_USE_V1 unset)", "",
        f"The engine each log names against the one kvplan picks from the release's V1 oracle: {agree} of {total} "
        "agree. Listed: every log sent to V0 by a setting, and every disagreement.", "",
        "| log | release | GPU | logged | kvplan |", "|---|---|---|---|---|", *rows, "",
    ]


def report(results: list[Result], skipped: list[Case], logs: Path) -> str:
    s = summary(results)
    lines = [
        "# kvplan's vLLM model against collected start-up logs", "",
        f"Generated by `python benchmarks/vllm_accuracy.py` over the logs in `benchmarks/logs/`{_collection(logs)}. "
        "GiB = 2^30. Errors in percent of the logged figure.", "",
        "**Split.** *fit*: the 61 logs of vLLM 0.19 on H100-80GB (`vllm-h100-0.19.jsonl`); the activation-peak, "
        "non-torch and CUDA-graph coefficients were fitted on these only (`--fit`), and the single-GPU non-torch "
        "growth before Hopper on the growth-only fit set `vllm-nontorch-fit.jsonl` (no T4 or RTX 3090 log in it). "
        "*holdout*: every other log (`vllm.jsonl`, other GPUs and releases); no constant was chosen by looking at "
        "them.", "",
        f"Evaluated {len(results)} logs ({s['fit']['logs_evaluated']} fit, {s['holdout']['logs_evaluated']} holdout); "
        f"{len(skipped)} not evaluated (listed at the end with the reason).", "",
    ]
    lines += _targets(s)
    lines += _table("By GPU", results, lambda r: r.case.gpu_key)
    lines += _table("By release", results, lambda r: f"{r.case.minor} ({r.b.flags.engine})")
    lines += _table("By outcome", results, lambda r: r.case.outcome)
    lines += _per_log(results)
    lines += _graph_estimates(results)
    lines += _engine_choice(cases_of(results, skipped))
    lines += ["## Not evaluated", "", "| split | log | model | reason |", "|---|---|---|---|"]
    for c in skipped:
        lines.append(f"| {c.split} | {c.row['id']} | {c.row.get('model')} | {c.skip} |")
    return "\n".join(lines) + "\n"


def to_json(results: list[Result], skipped: list[Case]) -> dict[str, Any]:
    return {
        "summary": summary(results),
        "logs": [
            {
                "id": r.case.row["id"], "split": r.case.split, "gpu": r.case.gpu_key, "release": r.case.release,
                "engine": r.b.flags.engine, "outcome": r.case.outcome,
                "predicted": r.b.refusal.code if r.b.refusal else "fits", "verdict_right": r.verdict_ok,
                "available_kv_gib": {"logged": r.case.row.get("available_kv_gib"),
                                     "predicted": round(r.b.first_rank_available_kv_bytes / GiB, 4)},
                "errors_pct": {k: None if v is None else round(v, 3) for k, v in r.errors.items()},
                "marks": {"release_inferred": r.case.version_inferred, "gpu_from_total": r.case.gpu_from_total,
                          "weights_from_log": r.case.weights_from_log, "config_relation": r.case.relation,
                          "gpu_in_use_bytes": r.case.in_use_bytes},
            }
            for r in results
        ],
        "not_evaluated": [{"id": c.row["id"], "split": c.split, "reason": c.skip} for c in skipped],
    }


# --- fitting (fit split only) --------------------------------------------------------------------------------

def _solve(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns), Gauss-Jordan with pivoting."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
         for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[piv] = a[piv], a[col]
        for k in range(n):
            if k != col and a[col][col]:
                f = a[k][col] / a[col][col]
                a[k] = [x - f * y for x, y in zip(a[k], a[col], strict=True)]
    return [a[i][n] / a[i][i] if a[i][i] else 0.0 for i in range(n)]


def _fit_cases(cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.split == "fit" and c.skip is None and c.model is not None]


def _logged_stage(c: Case) -> int:
    """The pipeline stage whose "torch peak memory increase" the record carries (its Worker_PPn line; 0 if none)."""
    for line in c.row["raw"]:
        if f"torch peak memory increase: {c.row['activation_peak_gib']}GiB" in line:
            m = re.search(r"Worker_PP(\d+)", line)
            return int(m.group(1)) if m else 0
    return 0


def fit_activation(cases: list[Case]) -> None:
    """Forward and sampler coefficients on dense fit-split models: every other model trains, the rest check.

    Each log's peak is the largest of the forward, the sampler (one-stage runs) and a cold compile's benchmark
    copies (the embedding's stage; vllm_memory.compile_clone_bytes, no coefficient), plus a later stage's receive
    buffers (vllm_memory.intermediate_bytes, no coefficient): a log trains the term that decides it, and one
    decided by the copies trains nothing."""
    usable = [c for c in _fit_cases(cases) if c.row.get("activation_peak_gib") and c.model.geometry.moe is None]
    models = sorted({c.row["model"] for c in usable})
    train_models = set(models[::2])

    def features(c: Case) -> tuple[list[float], list[float], float, bool, float, float]:
        f = resolve_flags(c.model, c.flags, c.gpu)
        b = weight_dtype_bytes(f.dtype)
        inter = (c.model.intermediate_size or 4 * c.model.hidden_size) / f.tp
        fwd = [1.0, f.max_num_batched_tokens * b * (inter + c.model.hidden_size) / 1e9]
        logits = min(f.max_num_seqs, f.max_num_batched_tokens) * padded_vocab(c.model.vocab_size)
        stages = plan_vllm(c.model, c.flags, c.gpu).stages
        m = stages[min(_logged_stage(c), len(stages) - 1)].memory
        return fwd, [1.0, logits * 4 / 1e9], logits * b / GiB, f.pp == 1, m.compile_clone_bytes / GiB, \
            m.intermediate_bytes / GiB

    data = [(c, *features(c)) for c in usable if c.row["model"] in train_models]
    decides = {id(c): "sampler" if runs and s[1] > 2 * fw[1] else "forward" for c, fw, s, _, runs, *_ in data}
    kf, ks = [0.0, 0.0], [0.0, 0.0]
    for _ in range(10):
        kf = _solve([fw for c, fw, *_ in data if decides[id(c)] == "forward"],
                    [c.row["activation_peak_gib"] - d[-1] for c, *d in data if decides[id(c)] == "forward"])
        ks = _solve([s for c, fw, s, *_ in data if decides[id(c)] == "sampler"],
                    [c.row["activation_peak_gib"] - x - got for c, fw, s, x, _, _, got in data
                     if decides[id(c)] == "sampler"])
        new = {}
        for c, fw, s, x, runs, clone, got in data:
            terms = {"forward": got + kf[0] + kf[1] * fw[1], "clone": clone}
            if runs:
                terms["sampler"] = got + ks[0] + ks[1] * s[1] + x
            new[id(c)] = max(terms, key=lambda k: terms[k])
        if new == decides:
            break
        decides = new
    print(f"forward: base {kf[0]:.3f} GiB, {kf[1] * GiB / 1e9:.3f} x b B per token x (intermediate/tp + hidden)")
    print(f"sampler (0.17+ Triton): base {ks[0]:.3f} GiB, {ks[1] * GiB / 1e9:.3f} fp32 copies per logit")
    print(f"  decided by the cold compile's copies: {sum(v == 'clone' for v in decides.values())} training logs")
    for group, name in ((True, "train"), (False, "check")):
        errs = []
        for c in usable:
            if (c.row["model"] in train_models) != group:
                continue
            fw, s, x, runs, clone, got = features(c)
            pf, ps = kf[0] + kf[1] * fw[1], ks[0] + ks[1] * s[1] + x
            errs.append(max(got + max(pf, ps if runs else 0.0), clone) - c.row["activation_peak_gib"])
        print(f"  {name}: {len(errs)} logs, mean |err| {statistics.mean(map(abs, errs)):.3f} GiB, "
              f"worst {max(errs, key=abs):+.3f} GiB")


def fit_graphs(cases: list[Case]) -> None:
    """CUDA-graph coefficients (vllm_graphs) from the fit split's "GiB for CUDAGraph memory" lines."""
    seen, dense, moe = set(), [], []
    for c in _fit_cases(cases):
        m = _GRAPH_RE.search(_raw(c.row))
        if not m:
            continue
        f = resolve_flags(c.model, c.flags, c.gpu)
        key = (c.row["model"], f.tp, f.pp, f.dtype, m.group(1))
        if key in seen:
            continue
        seen.add(key)
        modes = capture_sizes(f.rules, f.engine, c.gpu, max_num_seqs=f.max_num_seqs,
                              max_num_batched_tokens=f.max_num_batched_tokens)
        layers = -(-c.model.num_layers // f.pp)
        moe_geometry = c.model.geometry.moe
        experts = moe_geometry.num_experts if moe_geometry else 0
        inter = c.model.intermediate_size or 4 * c.model.hidden_size
        if moe_geometry is not None:
            inter = (moe_geometry.expert_intermediate_size or inter) * (moe_geometry.experts_per_token or 1)
        x = [modes.count, modes.count * layers,
             modes.largest_total * layers * (c.model.hidden_size + inter) / f.tp * weight_dtype_bytes(f.dtype)]
        kernel = "mxfp4" if c.model.quant is not None and c.model.quant.method == "mxfp4" else "fused_moe"
        (moe if experts else dense).append((c.row["model"], f.tp, f.pp, x, float(m.group(1)) * GiB, kernel,
                                            modes.count * layers / f.tp))
    k = _solve([x for *_, x, y, _, _ in dense], [y for *_, x, y, _, _ in dense])
    print(f"graphs: PER_GRAPH {k[0] / GiB:.6f} GiB, PER_GRAPH_LAYER {k[1] / GiB:.7f} GiB, "
          f"POOL_PER_TOKEN_WIDTH {k[2]:.4f}")
    errs = [(sum(a * b for a, b in zip(k, x, strict=True)) - y) / y for *_, x, y, _, _ in dense]
    print(f"  dense: {len(errs)} configurations, mean |err| {100 * statistics.mean(map(abs, errs)):.1f}%, "
          f"worst {100 * max(errs, key=abs):+.1f}%")
    for kernel in ("fused_moe", "mxfp4"):
        rows = [(sum(a * b for a, b in zip(k, x, strict=True)), y, n, name)
                for name, _, _, x, y, kk, n in moe if kk == kernel]
        if not rows:
            continue
        coef = sum(n * (y - base) for base, y, n, _ in rows) / sum(n * n for *_, n, _ in rows)
        worst = max(((base + coef * n - y) / y for base, y, n, _ in rows), key=abs)
        print(f"  PER_GRAPH_MOE_LAYER[{kernel}] {coef / GiB:.7f} GiB over {len(rows)} configurations, "
              f"worst {100 * worst:+.1f}%")


def fit_non_torch(logs: Path) -> None:
    """Single-GPU non-torch growth by architecture, from the growth-only fit set (vllm-nontorch-fit.jsonl).

    One GPU, releases that charge growth only (V0 0.6.5+, V1 0.9.1+: 0.6.4 and V1 <= 0.9.0 print the context
    with it), a known compute capability. The model takes each class's median (vllm_memory.NON_TORCH).
    """
    path = logs / "vllm-nontorch-fit.jsonl"
    if not path.exists():
        print(f"non-torch: no {path.name}")
        return
    groups: dict[str, list[tuple[float, str]]] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        release = r.get("vllm_version") or r.get("engine_version_inferred", "").split(":")[0].split("-")[0]
        cc = r.get("compute_capability")
        if r["tp"] != 1 or r["pp"] != 1 or cc is None or not release:
            continue
        rules = rules_for(release.lstrip("~"))
        if rules.charges_context(r["engine_generation"]):
            continue
        group = "Hopper and later" if tuple(cc) >= HOPPER else "before Hopper"
        groups.setdefault(group, []).append((r["non_torch_gib"], r["id"]))
    for group, rows in sorted(groups.items()):
        values = sorted(v for v, _ in rows)
        print(f"non-torch growth, one GPU, {group}: median {statistics.median(values):.2f} GiB over {len(values)} "
              f"logs ({', '.join(f'{v:.2f}' for v in values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=Path, default=LOGS, help="the log folder (benchmarks/logs layout)")
    parser.add_argument("--fit", action="store_true", help="refit the coefficients on the fit split and print them")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for vllm_accuracy.md and .json")
    args = parser.parse_args()
    cases = load_cases(args.logs)
    if not cases:
        sys.exit(f"no vLLM logs under {args.logs}")
    if args.fit:
        fit_activation(cases)
        fit_graphs(cases)
        fit_non_torch(args.logs)
        return
    results, skipped = evaluate(cases)
    text = report(results, skipped, args.logs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm_accuracy.md").write_text(text)
    (args.out / "vllm_accuracy.json").write_text(json.dumps(to_json(results, skipped), indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
