"""kvplan's TensorRT-LLM engine model against the held-out TensorRT-LLM logs (benchmarks/logs/trtllm.jsonl).

Every record is held out: nothing here is fitted, and the engine model was read from TensorRT-LLM's source
(docs/engine-rules.md part 3) before these logs were collected. Public TensorRT-LLM logs seldom print the whole
memory profile, so each log is checked for what it does print:
  per token  the bytes one token of KV takes: "kv size is N" (the PyTorch backend's estimator), else the C++
             allocation's bytes over its tokens ("Allocate B bytes ... Using N tokens"), else "Allocated X GiB
             ... (N)" (X printed to 0.01 GiB: kvplan's bytes x N must print the same X);
  A          from the log's own measurements, as `kvplan calibrate` would keep them: the PyTorch backend's total,
             weights, activation peak and memory outside torch (less the estimation pass's own KV cache, which
             TensorRT-LLM adds back), or the C++ manager's free memory; tests the fraction and block rules;
  B          end to end from the deployment alone, where the log names a catalog GPU and its release.

    python benchmarks/trtllm_accuracy.py     # print the tables, write benchmarks/results/trtllm_accuracy.md
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvplan.capacity.deployment import BoxProfile, Deployment, Parallelism, Workload  # noqa: E402
from kvplan.engines.trtllm import DEFAULT_MAX_NUM_TOKENS, TrtllmOptions, estimation_requests  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.hardware.gpus import GpuSpec, custom_gpu, find_gpu  # noqa: E402
from kvplan.planner.verdict import Verdict, plan  # noqa: E402
from kvplan.sources.resolve import resolve_model  # noqa: E402
from kvplan.units import GiB  # noqa: E402

LOGS = Path(os.environ.get("KVPLAN_LOGS", REPO / "benchmarks" / "logs"))
RESULTS = REPO / "benchmarks" / "results" / "trtllm_accuracy.md"
GIB_STEP = 0.005  # the logs print GiB to two decimals: a printed X stands for [X - 0.005, X + 0.005)


@dataclass
class Row:
    rec: dict
    per_token_logged: int | None = None  # exact bytes, where the log gives them
    per_token_kvplan: int | None = None
    per_token_ok: bool | None = None
    a_kv_gib: float | None = None  # mode A: kvplan's KV budget
    a_tokens: int | None = None
    b_tokens: int | None = None
    reason: str = ""


def _gib(rec: dict, key: str) -> int | None:
    value = rec.get(key)
    return None if value is None else round(value * GiB)


def _options(rec: dict) -> TrtllmOptions:
    flags = rec.get("flags") or {}
    fraction = next((flags[k] for k in ("free_gpu_memory_fraction", "kv_cache_free_gpu_mem_fraction", "gpu_fraction")
                     if isinstance(flags.get(k), (int, float))), None)
    return TrtllmOptions(
        free_gpu_memory_fraction=fraction,
        max_num_tokens=flags.get("max_num_tokens") if isinstance(flags.get("max_num_tokens"), int) else None,
        max_batch_size=flags.get("max_batch_size") if isinstance(flags.get("max_batch_size"), int) else None,
    )


def _deployment(rec: dict, model_path: str, gpu: GpuSpec, profile: BoxProfile | None = None) -> Deployment:
    model = resolve_model(model_path, offline=True).model
    flags = rec.get("flags") or {}
    length = flags.get("max_seq_len") if isinstance(flags.get("max_seq_len"), int) else None
    return Deployment(model=model, gpu=gpu, engine=_options(rec), workload=Workload(max_model_len=length),
                      parallelism=Parallelism(tp=rec.get("tp") or 1, pp=rec.get("pp") or 1),
                      kv_cache_dtype=rec.get("kv_cache_dtype") or "auto", profile=profile)


def _per_token(row: Row, v: Verdict) -> None:
    rec = row.rec
    mine = int(v.account.detail["bytes_per_token"])
    row.per_token_kvplan = mine
    tokens = rec.get("kv_tokens")
    if rec.get("kv_size_per_token") is not None:
        row.per_token_logged = rec["kv_size_per_token"]
        row.per_token_ok = mine == row.per_token_logged
    elif rec.get("kv_bytes") is not None and tokens:
        row.per_token_logged = rec["kv_bytes"] // tokens
        row.per_token_ok = mine * tokens == rec["kv_bytes"]
    elif rec.get("kv_alloc_gib") is not None and tokens:
        row.per_token_ok = abs(mine * tokens / GiB - rec["kv_alloc_gib"]) < GIB_STEP


def _profile(rec: dict, d: Deployment, gpu: GpuSpec) -> BoxProfile | None:
    """The log's measured terms as kvplan's profile (None where the log prints no total and free memory)."""
    step = d.engine.max_num_tokens or DEFAULT_MAX_NUM_TOKENS
    common = dict(source=rec["id"], engine="trtllm", gpu_name=gpu.key, tp=d.parallelism.tp, pp=d.parallelism.pp,
                  model=d.model.name, max_num_batched_tokens=step, max_num_seqs=estimation_requests(step,
                                                                                                     d.max_model_len),
                  total_memory_bytes=gpu.total_memory_bytes, cuda_graph_bytes=0)
    if rec.get("peak_gib") is not None:
        # peak = weights + activation + outside torch, and the estimation pass's KV cache sits outside torch
        # (its pools are the C++ manager's): TensorRT-LLM adds it back, so kvplan's non-torch term leaves it out.
        return BoxProfile(**common, weights_bytes=_gib(rec, "weights_inside_torch_gib"),
                          activation_peak_bytes=_gib(rec, "activation_gib"),
                          non_torch_bytes=_gib(rec, "outside_torch_gib") - (_gib(rec, "tmp_kv_gib") or 0))
    if rec.get("available_gib") is not None:
        # The C++ manager sizes the cache from the free memory it finds: everything else is already in use.
        return BoxProfile(**common, weights_bytes=gpu.total_memory_bytes - _gib(rec, "available_gib"),
                          activation_peak_bytes=0, non_torch_bytes=0)
    return None


def evaluate(rec: dict, aliases: dict) -> Row:
    row = Row(rec)
    alias = aliases.get(rec.get("model") or "")
    config = alias.get("config") if alias else None
    if not config:
        row.reason = f"no config for {rec.get('model')!r}"
        return row
    total = _gib(rec, "device_total_gib") or _gib(rec, "total_gib")
    if total is not None:
        gpu = custom_gpu(total, "logged total")  # mode A plans from the size the log measured
    elif rec.get("gpu_key"):
        gpu = find_gpu(rec["gpu_key"])
    else:
        gpu = find_gpu("H100")  # the bytes a token do not depend on the card (an nvfp4 cache's would; none here)
    path = str(REPO / config)
    try:
        d = _deployment(rec, path, gpu)
        if rec.get("kv_cache_dtype") is not None:  # a KV dtype the source states ("auto" included)
            _per_token(row, plan(d, detail=False))
        profile = _profile(rec, d, gpu)
        if profile is not None:
            a = plan(_deployment(rec, path, gpu, profile), detail=False)
            row.a_kv_gib = a.account.kv_budget_bytes / GiB
            row.a_tokens = a.account.kv_cache_tokens if rec.get("kv_cache_dtype") is not None else None
        if rec.get("gpu_key") and total is None and rec.get("engine_version") and rec.get("backend") == "pytorch":
            row.b_tokens = plan(d, detail=False).account.kv_cache_tokens
    except KvplanError as exc:
        row.reason = exc.message
    if not row.reason and row.per_token_ok is None and row.a_kv_gib is None and row.b_tokens is None:
        row.reason = "nothing to check: no KV bytes with a stated KV dtype, no free memory, no catalog GPU and release"
    return row


def _err(pred: float | None, logged: float | None) -> float | None:
    return None if pred is None or not logged else (pred - logged) / logged


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2%}"


def report(rows: list[Row]) -> str:
    out = ["# TensorRT-LLM accuracy on held-out start-up logs", "",
           "Generated by `python benchmarks/trtllm_accuracy.py` from `benchmarks/logs/trtllm.jsonl`; every log is "
           "held out, and the engine model (kvplan/engines/trtllm.py, docs/engine-rules.md part 3) was read from "
           "TensorRT-LLM's source, not fitted. *Per token*: kvplan's KV bytes a token against the log's (exact "
           "where the log gives bytes; where it gives GiB to two decimals, kvplan's bytes x the logged tokens must "
           "print the same). *A*: planned from the log's own measurements (the PyTorch backend's profile lines, or "
           "the C++ manager's free memory). *B*: planned from the deployment alone (catalog GPU, stated release).",
           "", "| log | backend | release | GPU | per token (logged / kvplan) | A: KV GiB | A: tokens | "
           "B: tokens |", "|---|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        rec = r.rec
        inferred = str(rec.get("engine_version_inferred", "?")).split(" ")[0].lstrip("~")
        release = rec.get("engine_version") or f"~{inferred}"
        if r.per_token_ok is None:
            per = "-"
        else:
            logged = f"{r.per_token_logged:,}" if r.per_token_logged else f"{rec['kv_alloc_gib']} GiB / " \
                                                                            f"{rec['kv_tokens']:,}"
            per = f"{logged} / {r.per_token_kvplan:,} ({'same' if r.per_token_ok else 'DIFFERS'})"
        logged_kv = rec.get("available_kv_profiled_gib") or rec.get("kv_alloc_gib")
        out.append(f"| {rec['id']}{f' [{r.reason}]' if r.reason else ''} | {rec.get('backend', '-')} | {release} | "
                   f"{rec.get('gpu_key') or '-'} | {per} | {_pct(_err(r.a_kv_gib, logged_kv))} | "
                   f"{_pct(_err(r.a_tokens, rec.get('kv_tokens')))} | {_pct(_err(r.b_tokens, rec.get('kv_tokens')))} |")
    checked = [r for r in rows if r.per_token_ok is not None]
    a_kv = [e for e in (_err(r.a_kv_gib, r.rec.get("available_kv_profiled_gib") or r.rec.get("kv_alloc_gib"))
                        for r in rows) if e is not None]
    a_tok = [e for e in (_err(r.a_tokens, r.rec.get("kv_tokens")) for r in rows) if e is not None]
    b_tok = [e for e in (_err(r.b_tokens, r.rec.get("kv_tokens")) for r in rows) if e is not None]
    out += ["", "## Summary", "",
            f"- per token: {sum(bool(r.per_token_ok) for r in checked)} of {len(checked)} logs the same",
            f"- A, KV memory: {_stats(a_kv)}", f"- A, KV tokens: {_stats(a_tok)}", f"- B, KV tokens: {_stats(b_tok)}",
            "", "Too few logs print TensorRT-LLM's whole profile for an error band; the engine stays marked "
            "uncalibrated in every plan (kvplan.engines.trtllm.calibration)."]
    return "\n".join(out) + "\n"


def _stats(errors: list[float]) -> str:
    if not errors:
        return "no logs"
    logs = f"{len(errors)} log{'' if len(errors) == 1 else 's'}"
    return f"{logs}, MAE {statistics.mean(abs(e) for e in errors):.2%}, worst {max(errors, key=abs):+.2%}"


def main() -> None:
    path = LOGS / "trtllm.jsonl"
    aliases = json.loads((LOGS / "configs" / "aliases.json").read_text())
    rows = [evaluate(json.loads(line), aliases) for line in path.read_text().splitlines() if line.strip()]
    text = report(rows)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
