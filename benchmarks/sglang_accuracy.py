"""kvplan's SGLang engine model against the held-out SGLang start-up logs (benchmarks/logs/sglang.jsonl).

Every record is held out: nothing here is fitted, no constant is chosen by looking at them. Two modes per log:
  A  from the log's own measurements (the profile `kvplan calibrate` builds: free memory before loading, the
     weights SGLang loaded): tests SGLang's fraction rule per release (its default where the log does not give
     the fraction), the token-pool arithmetic, page rounding and the pool split;
  B  end to end from the deployment alone (the catalog GPU, kvplan's weights and context estimate); only for
     logs whose GPU is named.
Metrics: KV tokens (the pool's "#tokens", else max_total_num_tokens) and KV memory (the pool's K + V sizes),
and whether the start-up is called right (started, or refused for lack of KV room). Logs kvplan cannot plan are
listed with the reason; settings a log does not print come from its record (what the source states).

    python benchmarks/sglang_accuracy.py     # print the tables, write benchmarks/results/sglang_accuracy.md
    KVPLAN_LOGS=/path/to/logs python benchmarks/sglang_accuracy.py
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvplan.calibrate.compare import calibrate  # noqa: E402
from kvplan.calibrate.formats import read_log  # noqa: E402
from kvplan.calibrate.log import StartupLog  # noqa: E402
from kvplan.capacity.deployment import BoxProfile  # noqa: E402
from kvplan.engines.release import parse_release  # noqa: E402
from kvplan.engines.sglang import SglangOptions  # noqa: E402
from kvplan.engines.sglang_releases import release_of, rules_for  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.hardware.gpus import custom_gpu  # noqa: E402
from kvplan.planner.verdict import Verdict, plan  # noqa: E402
from kvplan.units import GiB  # noqa: E402

LOGS = Path(os.environ.get("KVPLAN_LOGS", REPO / "benchmarks" / "logs"))
RESULTS = REPO / "benchmarks" / "results" / "sglang_accuracy.md"
TARGET_MAE, TARGET_WORST = 0.03, 0.10
# Record flag names -> the LogSettings field they fill where the log does not print the setting.
FLAGS = {"mem_fraction_static": "utilization", "context_length": "max_model_len", "tp": "tp", "dp": "dp",
         "enable_dp_attention": "dp_attention", "max_total_tokens": "max_total_tokens", "page_size": "block_size",
         "chunked_prefill_size": "max_num_batched_tokens", "cuda_graph_max_bs": "cuda_graph_max_bs",
         "kv_cache_dtype": "kv_cache_dtype", "max_running_requests": "max_num_seqs", "dtype": "dtype",
         "cpu_offload_gb": "cpu_offload_gb", "attention_backend": "attention_backend"}
# A log from an unreleased branch that sizes the pool by its own rule, as its own debug lines show.
BRANCH_MARKERS = {"candidate_kv_budget": "a PR branch: the pool follows its printed candidate_kv_budget, not a "
                                        "release's rule"}


# What each log's own lines show about a start-up kvplan calls wrong (facts from the record, not excuses).
WHY_WRONG = {
    "sglang4895-gemma3-27b-awq-4090-not-enough-memory":
        "Mode A, from the log's own free memory, calls the refusal: 3.64 GiB free after loading is below the "
        "3.88 GiB that fraction 0.88 x 0.95 (a multimodal model) leaves aside on the 23.64 GiB card. Mode B plans "
        "0.44 GiB of context where this card had 1.18 GiB in use before loading (23.64 - 3.64 - 18.82), so it "
        "finds a 1,215-token pool: a start that cannot admit one 4,096-token request.",
    "sglang7691-deepseek-r1-rocm-dp8-negative-pool":
        "The excerpt shows rank DP0 TP0 only: 21.73 GiB free after 166.59 GiB of weights at fraction 0.95 leaves "
        "21.73 - 188.32 x 0.05 = 12.31 GiB, a positive pool, yet SGLang profiled -561,981 tokens. SGLang takes the "
        "minimum free memory over all ranks; the other ranks' lines are not in the excerpt, so the rank that ran "
        "short cannot be planned from it.",
}


@dataclass
class Row:
    rec: dict
    release: str
    gpu: str
    tokens: int | None = None  # logged
    kv_bytes: int | None = None  # logged
    a_tokens: int | None = None
    a_kv: int | None = None
    b_tokens: int | None = None
    b_kv: int | None = None
    called: bool | None = None  # mode B (mode A where B is impossible)
    predicted: str = ""
    fraction_rule: float | None = None  # kvplan's default fraction for this log's GPU and release
    fraction_logged: float | None = None
    excluded: str = ""  # why a log is out of the summary
    weights_from_log: bool = False  # mode B: the config lacks the checkpoint's quantization, the log's weights stand
    reason: str = ""  # why a mode could not run


def _version(rec: dict) -> str | None:
    text = rec.get("engine_version") or rec.get("engine_version_inferred") or ""
    m = re.search(r"\d+\.\d+(?:\.\d+)?", text)
    return m.group(0) if m and parse_release(m.group(0)) else None


def _quantized_variant(rec: dict, aliases: dict) -> bool:
    alias = aliases.get(rec.get("model") or "")
    return bool(alias) and alias.get("relation") == "quantized variant"


def _model(rec: dict, aliases: dict) -> str | None:
    alias = aliases.get(rec.get("model") or "")
    config = alias.get("config") if alias else None
    if not config:
        return None
    return str(LOGS / config.removeprefix("benchmarks/logs/")) if config.startswith("benchmarks/logs/") \
        else str(REPO / config)


def _with_record_flags(log: StartupLog, rec: dict) -> StartupLog:
    """The log's settings, with what its record states (from the source's text) where the log prints nothing."""
    s = log.settings
    extra = {}
    for key, field in FLAGS.items():
        value = (rec.get("flags") or {}).get(key)
        if key == "chunked_prefill_size" and isinstance(value, int) and value <= 0:
            value = None  # -1: chunked prefill off
        if value is not None and getattr(s, field) is None:
            extra[field] = value
    for key in ("tp", "dp"):
        if rec.get(key) and getattr(s, key) is None and key not in extra:
            extra[key] = rec[key]
    if not extra:
        return log
    return replace(log, settings=replace(s, **extra, user_set=s.user_set | set(extra)))


def _logged(log: StartupLog) -> tuple[int | None, int | None]:
    r = log.primary
    pool = next((x for x in r.readings if x.key == "pool_tokens"), None) or log.summary_get("max_total_num_tokens")
    kv = next((x for x in r.readings if x.key == "kv_bytes"), None)
    k = next((x for x in r.readings if x.key == "k_bytes"), None)
    v = next((x for x in r.readings if x.key == "v_bytes"), None)
    kv_bytes = kv.as_int if kv else (k.as_int + v.as_int if k and v else None)
    return (pool.as_int if pool else None), kv_bytes


def _pool(v: Verdict) -> tuple[int, int]:
    """Tokens and the token pool's K + V bytes, as the log's "KV Cache is allocated" lines count them (a
    hybrid's state pool is logged apart)."""
    return v.account.kv_cache_tokens or 0, int(v.account.detail.get("token_pool_bytes", 0))


def _called(logged: str, v: Verdict) -> tuple[bool | None, str]:
    refusal = v.account.refusal
    code = "starts" if refusal is None or refusal.code == "one_request" else refusal.code
    if logged == "started":
        return code == "starts", code
    if logged == "kv_oom":
        return code == "no_kv_memory", code
    return None, code


def evaluate(rec: dict, aliases: dict) -> Row:
    log = _with_record_flags(read_log("\n".join(rec["raw"]), rec["id"]), rec)
    # The record's outcome, as the vLLM benchmark takes it: the source's text beside an excerpt that may stop
    # before the refusal (sglang#4895: "Not enough memory" is the title, the excerpt ends at loading).
    outcome = rec.get("outcome") or log.outcome
    version = _version(rec)
    release = version or "newest rules"
    row = Row(rec, release, rec.get("gpu_key") or "-")
    row.tokens, row.kv_bytes = _logged(log)
    text = "\n".join(rec["raw"])
    row.excluded = next((why for marker, why in BRANCH_MARKERS.items() if marker in text), "")
    model = _model(rec, aliases)
    if model is None:
        row.reason = f"no config for {rec.get('model')!r} (benchmarks/logs/configs/aliases.json)"
        return row
    before = log.get("free_before_load")
    after, weights = log.get("free_after_load"), log.get("weights")
    # Mode A needs a GPU only for a default fraction: an unnamed card is taken as the free memory before loading
    # plus kvplan's context (the fraction rule then reads its size class from that).
    gpu = rec.get("gpu_key")
    free = before.as_int if before else (after.as_int + weights.as_int if after and weights else None)
    card = custom_gpu(free + round(0.51 * GiB), "unnamed") if gpu is None and free is not None else gpu
    try:
        report = calibrate(log, model=model, gpu=card, version=version, offline=True)
    except KvplanError as exc:
        row.reason = exc.message
        return row
    if report.deployment is None or report.verdict is None:
        row.reason = report.unpredicted or "not planned"
        return row
    d = report.deployment
    options = d.engine
    if not isinstance(options, SglangOptions):
        raise TypeError("an SGLang log plans as SGLang")
    rules = rules_for(release_of(options.version))
    if report.profile is not None and free is not None:
        replay = plan(replace(d, profile=report.profile))
        row.a_tokens, row.a_kv = _pool(replay)
        row.called, row.predicted = _called(outcome, replay)
    if gpu is not None:
        # A quantized export planned from its base model's config: kvplan would size the base model's weights, so
        # mode B takes the log's own weights as the vLLM benchmark does ("W"); everything else is the deployment's.
        deployment = report.verdict
        if _quantized_variant(rec, aliases) and weights is not None:
            pinned = BoxProfile(source=rec["id"], engine="sglang", gpu_name=d.gpu.key, model=d.model.name,
                                tp=d.parallelism.tp, pp=d.parallelism.pp, weights_bytes=weights.as_int)
            deployment = plan(replace(d, profile=pinned))
            row.weights_from_log = True
        row.b_tokens, row.b_kv = _pool(deployment)
        row.called, row.predicted = _called(outcome, deployment)
    elif free is None:
        row.reason = "the log prints no free memory and the record names no GPU"
    defaults = plan(replace(d, engine=replace(options, mem_fraction_static=None)))
    row.fraction_rule = defaults.account.detail["mem_fraction_static"]
    row.fraction_logged = options.mem_fraction_static
    row.release = f"{release} ({rules.label}+ rules)"
    return row


def _err(pred: int | None, logged: int | None) -> float | None:
    if pred is None or not logged:
        return None
    return (pred - logged) / logged


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.2%}"


def _summary(errors: list[float]) -> str:
    if not errors:
        return "no logs"
    mae = statistics.mean(abs(e) for e in errors)
    worst = max(errors, key=abs)
    ok = mae <= TARGET_MAE and abs(worst) <= TARGET_WORST
    return f"{len(errors)} logs, MAE {mae:.2%}, worst {worst:+.2%} ({'meets' if ok else 'misses'} <= 3% / <= 10%)"


def report(rows: list[Row]) -> str:
    out = ["# SGLang accuracy on held-out start-up logs", "",
           "Generated by `python benchmarks/sglang_accuracy.py` from `benchmarks/logs/sglang.jsonl`; every log is "
           "held out (nothing is fitted on them). Mode A plans each log from its own measured free memory and "
           "weights (what `kvplan calibrate` saves as the box's profile), so it tests SGLang's rules: the "
           "fraction (its default per release where the log gives none), the pool arithmetic, page rounding. "
           "Mode B plans from the deployment alone: the catalog GPU, kvplan's weights and context (W: the config "
           "stands for a quantized export's base model, so the log's weights stand in). KV memory is "
           "the pool's K + V sizes as logged; KV tokens the pool's size.", "",
           "| log | GPU | release | logged tokens | A tokens | A memory | B tokens | B memory | call |",
           "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        call = "-" if r.called is None else ("right" if r.called else f"WRONG ({r.predicted})")
        note = f" [excluded: {r.excluded}]" if r.excluded else ""
        note += f" [{r.reason}]" if r.reason else ""
        mark = " W" if r.weights_from_log else ""
        out.append(f"| {r.rec['id']}{mark}{note} | {r.gpu} | {r.release} | "
                   f"{'-' if r.tokens is None else f'{r.tokens:,}'} ({r.rec['outcome']}) | "
                   f"{_pct(_err(r.a_tokens, r.tokens))} | {_pct(_err(r.a_kv, r.kv_bytes))} | "
                   f"{_pct(_err(r.b_tokens, r.tokens))} | {_pct(_err(r.b_kv, r.kv_bytes))} | {call} |")
    kept = [r for r in rows if not r.excluded]
    out += ["", "## Summary (held-out release logs; targets: MAE <= 3%, worst <= 10%)", ""]
    for label, pick in (("A, KV tokens", lambda r: _err(r.a_tokens, r.tokens)),
                        ("A, KV memory", lambda r: _err(r.a_kv, r.kv_bytes)),
                        ("B, KV tokens", lambda r: _err(r.b_tokens, r.tokens)),
                        ("B, KV memory", lambda r: _err(r.b_kv, r.kv_bytes))):
        errors = [e for e in (pick(r) for r in kept) if e is not None]
        out.append(f"- {label}: {_summary(errors)}")
    calls = [r for r in rows if r.called is not None]
    wrong = [r.rec["id"] for r in calls if not r.called]
    out.append(f"- start-ups called right: {sum(r.called for r in calls if r.called)} of {len(calls)} with a "
               f"prediction" + (f"; wrong: {', '.join(wrong)}" if wrong else ""))
    out += ["", "## By GPU and by release range (mode A, KV tokens)", "", "| group | logs | MAE | worst |",
            "|---|---:|---:|---:|"]
    for key in ("gpu", "release"):
        groups: dict[str, list[float]] = {}
        for r in kept:
            e = _err(r.a_tokens, r.tokens)
            if e is not None:
                groups.setdefault(f"{key} {getattr(r, key)}", []).append(e)
        for name, errors in sorted(groups.items()):
            out.append(f"| {name} | {len(errors)} | {statistics.mean(abs(e) for e in errors):.2%} | "
                       f"{max(errors, key=abs):+.2%} |")
    out += ["", "## SGLang's default mem_fraction_static rule beside the fraction each log ran with", "",
            "The rule for the log's GPU and release (kvplan.engines.sglang_releases); the logged fraction may be "
            "the user's, so a difference is not by itself an error.", "",
            "| log | release | logged (or given) | kvplan's default rule |", "|---|---|---:|---:|"]
    for r in rows:
        if r.fraction_rule is not None:
            logged = "-" if r.fraction_logged is None else f"{r.fraction_logged:g}"
            out.append(f"| {r.rec['id']} | {r.release} | {logged} | {r.fraction_rule:.4g} |")
    out += ["", "A wrong call, and what the log shows:", ""]
    out += [f"- {r.rec['id']}: logged {r.rec['outcome']}, kvplan says {r.predicted}. {WHY_WRONG.get(r.rec['id'], '')}"
            for r in calls if not r.called]
    out += ["", "Not planned, and why:", ""]
    out += [f"- {r.rec['id']}: {r.reason}" for r in rows if r.reason and r.a_tokens is None and r.b_tokens is None]
    return "\n".join(out) + "\n"


def _relative(text: str) -> str:
    """Paths as the repository names them, wherever the logs were read from."""
    return text.replace(str(LOGS), "benchmarks/logs").replace(f"{REPO}/", "")


def main() -> None:
    path = LOGS / "sglang.jsonl"
    if not path.exists():
        sys.exit(f"no SGLang logs at {path} (set KVPLAN_LOGS to the collected logs)")
    aliases = json.loads((LOGS / "configs" / "aliases.json").read_text())
    rows = [evaluate(json.loads(line), aliases) for line in path.read_text().splitlines() if line.strip()]
    text = _relative(report(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
