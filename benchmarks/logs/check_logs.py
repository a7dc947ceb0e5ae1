#!/usr/bin/env python3
"""Validate the collected start-up logs and print the counts table.

Standard library only. Run from anywhere:

    python3 benchmarks/logs/check_logs.py            # validate + table
    python3 benchmarks/logs/check_logs.py --markdown # table as Markdown (for README.md)

Exit status is 1 when any line fails a check. Checks:
  * every line is a JSON object with the keys its engine requires, of the right types;
  * ``raw`` is a non-empty list of strings;
  * ``split`` is ``fit`` only in vllm-h100-0.19.jsonl (and the growth-only file below), ``holdout`` elsewhere;
  * ``outcome`` is one of started / kv_oom / oom_other / other_failure;
  * ``gpu_key`` is one of the known keys, or null with a note;
  * each figure that has a fixed log wording is found in ``raw`` with the same value
    (e.g. "Available KV cache memory: X GiB" == available_kv_gib);
  * ids are unique, and no two records carry the same KV-sizing lines (a duplicate quote);
  * vllm-nontorch-fit.jsonl (the non-torch growth's own fit set) holds split ``fit``, a compute capability per
    record, and a non-torch figure its ``raw`` lines print.
"""

import collections
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = {
    "vllm-h100-0.19.jsonl": ("vllm", "fit"),
    "vllm.jsonl": ("vllm", "holdout"),
    "sglang.jsonl": ("sglang", "holdout"),
    "trtllm.jsonl": ("trtllm", "holdout"),
}
GPU_KEYS = {
    "H100-80GB",
    "H100-PCIE",
    "H100-NVL",
    "H200",
    "H200-NVL",
    "GH200-96GB",
    "H20",
    "B200",
    "A100-80GB",
    "A100-80GB-PCIE",
    "A100-40GB",
    "A100-40GB-PCIE",
    "A10G",
    "A10",
    "A30",
    "A40",
    "L4",
    "L40",
    "L40S",
    "T4",
    "V100-16GB",
    "V100-32GB",
    "RTX-3090",
    "RTX-4090",
    "RTX-5090",
    "RTX-PRO-6000",
    "RTX-6000-ADA",
    "RTX-A6000",
    "RTX-A5000",
    "MI300X",
    "MI325X",
    "MI355X",
}
OUTCOMES = {"started", "kv_oom", "oom_other", "other_failure"}
NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))

COMMON = {
    "id": str,
    "source_url": str,
    "engine": str,
    "split": str,
    "model": OPT_STR,
    "gpu": OPT_STR,
    "error_text": OPT_STR,
    "notes": OPT_STR,
    "raw": list,
}
HOLDOUT_EXTRA = {"engine_version": OPT_STR, "outcome": str, "gpu_key": OPT_STR, "flags": (dict, type(None))}
VLLM = {
    "num_gpus": OPT_INT,
    "tp": OPT_INT,
    "pp": OPT_INT,
    "max_model_len": OPT_INT,
    "gpu_memory_utilization": OPT_NUM,
    "kv_cache_dtype": OPT_STR,
    "block_size": OPT_INT,
    "quantization": OPT_STR,
    "vllm_version": OPT_STR,
    "weights_gib": OPT_NUM,
    "available_kv_gib": OPT_NUM,
    "kv_tokens": OPT_INT,
    "num_gpu_blocks": OPT_INT,
    "max_concurrency": OPT_NUM,
    "concurrency_tokens": OPT_INT,
    "total_gpu_memory_gib": OPT_NUM,
    "activation_peak_gib": OPT_NUM,
    "non_torch_gib": OPT_NUM,
}
SGLANG = {
    "num_gpus": OPT_INT,
    "tp": OPT_INT,
    "avail_mem_before_load_gb": OPT_NUM,
    "weights_mem_usage_gb": OPT_NUM,
    "avail_mem_after_load_gb": OPT_NUM,
    "kv_alloc_tokens": OPT_INT,
    "k_size_gb": OPT_NUM,
    "v_size_gb": OPT_NUM,
    "kv_size_gb": OPT_NUM,
    "avail_mem_after_kv_gb": OPT_NUM,
    "max_total_num_tokens": OPT_INT,
    "max_running_requests": OPT_INT,
    "context_len": OPT_INT,
    "available_gpu_mem": OPT_NUM,
}
TRTLLM = {"num_gpus": OPT_INT, "tp": OPT_INT}
# Keys only the later TensorRT-LLM records carry: "pytorch" (the LLM API / trtllm-serve) or "tensorrt" (an engine
# run by the C++ executor), and the KV dtype the source states (null: not known).
TRTLLM_OPTIONAL = {"backend": ("pytorch", "tensorrt"), "kv_cache_dtype": None}

N = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"
# field -> list of regexes; the field must equal the number captured by one of them somewhere in raw
VLLM_FIGS = {
    "available_kv_gib": [
        r"Available KV cache memory: " + N + r" ?GiB",
        r"kv_cache_size=" + N + r" ?GiB",
        r"reserved for KV Cache is " + N + r" ?GiB",
        r"larger than the available KV cache memory \(" + N + r" ?GiB\)",
        r"available_kv_cache_memory\s+" + N + r" ?GiB",
        # the "Free memory on device" line (0.10.2+) ends with self.available_kv_cache_memory_bytes, the figure of
        # "Available KV cache memory" (printed in bytes at first, in GiB by 0.26)
        r"Current kv cache memory in use is " + N + r" ?GiB",
    ],
    "kv_needed_gib": [N + r" GiB KV cache is needed"],
    "estimated_max_model_len": [r"estimated maximum model length is " + N],
    "kv_capacity_tokens_in_error": [r"maximum number of tokens that can be stored in KV cache \(" + N + r"\)"],
    "kv_tokens": [r"GPU KV cache size: " + N + r" tokens"],
    "num_gpu_blocks": [
        r"# (?:GPU|gpu|cuda|CUDA|rocm) blocks: " + N,
        r"(?<![#\w] )GPU blocks: " + N,
        r"num_gpu_blocks is: " + N,
    ],
    "max_concurrency": [r"Maximum concurrency for [0-9,]+ tokens per request: " + N + r"x"],
    "concurrency_tokens": [r"Maximum concurrency for " + N + r" tokens per request"],
    "weights_gib": [
        r"Model loading took " + N + r" ?Gi?B",
        r"Loading model weights took " + N + r" ?GB",
        r"model weights take\s+" + N + r" ?GiB",
        r"weights memory: " + N + r" ?GiB",
        r"Actual usage is " + N + r" GiB for weight\b",  # the summary before 0.27 (then: consumed memory)
    ],
    "total_gpu_memory_gib": [
        r"total_gpu_memory[= ]\(?" + N + r" ?GiB",
        r"total_gpu_memory\s+" + N + r" ?GiB",
        r"total_memory=" + N + r" ?GiB",
        r"Free memory on device \([0-9.]+/" + N + r" GiB\)",
    ],
    "activation_peak_gib": [
        r"torch peak memory increase: " + N + r" ?GiB",
        r"activation peak memory takes " + N + r" ?GiB",
        r"PyTorch activation peak memory\s+" + N + r" ?GiB",
        N + r" GiB for peak activation",
    ],
    "non_torch_gib": [
        r"non-torch forward increase memory: " + N + r" ?GiB",
        r"non_torch_memory takes " + N + r" ?GiB",
        r"non_torch_memory=" + N + r" ?GiB",
        r"non_torch_memory\s+" + N + r" ?GiB",
        N + r" GiB for non-torch memory",
    ],
}
SGLANG_FIGS = {
    "weights_mem_usage_gb": [r"Load weight end\..*?mem usage=" + N + r" GB"],
    "avail_mem_after_load_gb": [r"Load weight end\..*?avail mem=" + N + r" GB"],
    "avail_mem_before_load_gb": [r"Load weight begin\. avail mem=" + N + r" GB"],
    "kv_alloc_tokens": [r"KV Cache is allocated\..*?#tokens: " + N],
    "k_size_gb": [r"K size: " + N + r" GB"],
    "v_size_gb": [r"V size: " + N + r" GB"],
    "kv_size_gb": [r"KV size: " + N + r" GB"],
    "avail_mem_after_kv_gb": [r"Memory pool end\. avail mem=" + N + r" GB"],
    "max_total_num_tokens": [r"max_total_num_tokens=" + N],
    "max_running_requests": [r"max_running_requests=" + N],
    "context_len": [r"context_len=" + N],
    "available_gpu_mem": [r"available_gpu_mem=" + N + r" ?GB"],
    "profiled_max_total_num_tokens": [r"larger than the profiled value " + N],
}
TRTLLM_FIGS = {
    "kv_tokens": [
        r"Using " + N + r" tokens in paged KV cache",
        r"Allocated [0-9.]+ GiB for max tokens in paged KV cache \(" + N + r"\)",
        r"max_tokens=" + N,
    ],
    "kv_bytes": [r"Allocate " + N + r" bytes for k/v cache"],
    "kv_alloc_gib": [r"Allocated " + N + r" GiB for max tokens in paged KV cache"],
    "num_blocks_primary": [r"Number of blocks in KV cache primary pool: " + N],
    # The PyTorch backend's memory-profiling lines (tensorrt_llm/_torch/pyexecutor/_util.py).
    "weights_inside_torch_gib": [r"Memory used after loading model weights \(inside torch\) in memory usage profiling: "
                                 + N + r" GiB"],
    "weights_outside_torch_gib": [r"Memory used after loading model weights \(outside torch\) in memory usage "
                                  r"profiling: " + N + r" GiB"],
    "activation_gib": [r"Memory dynamically allocated during inference \(inside torch\) in memory usage profiling: "
                       + N + r" GiB"],
    "outside_torch_gib": [r"Memory used outside torch \(e\.g\., NCCL and CUDA graphs\) in memory usage profiling: "
                          + N + r" GiB"],
    "peak_gib": [r"Peak memory during memory usage profiling \(torch \+ non-torch\): " + N + r" GiB"],
    "available_kv_profiled_gib": [r"available KV cache memory when calculating max tokens: " + N + r" GiB"],
    "fraction_logged": [r"fraction is set " + N],
    "kv_size_per_token": [r"kv size is " + N],
    "device_total_gib": [r"device total memory " + N + r" GiB"],
    "tmp_kv_gib": [r"tmp kv_mem " + N + r" GiB"],
    "estimated_kv_gib": [r"Estimated max memory in KV cache : " + N + r" GiB"],
    "total_gib": [r"Memory usage when calculating max tokens in paged kv cache: total: " + N + r" ?GiB"],
    "available_gib": [
        r"Memory usage when calculating max tokens in paged kv cache: total: [0-9.]+ ?GiB, available: " + N + r" ?GiB"
    ],
}
KV_LINE = re.compile(
    r"paged KV cache|k/v cache|Available KV cache memory|available_kv_cache_memory|GPU KV cache size|blocks: [0-9]|"
    r"reserved for KV Cache|kv_cache_size=|"
    r"KV Cache is allocated|max_total_num_tokens=|Maximum concurrency"
)
TS = re.compile(r"^\S*\s*|\d\d:\d\d:\d\d[,.]?\d*|\d\d-\d\d|pid=\d+|TP\d+|\[[\w./]+:\d+\]")


def _num(s):
    s = s.replace(",", "")
    return float(s)


def check_figures(rec, figs, errors, where):
    text = "\n".join(x for x in rec["raw"] if isinstance(x, str))
    for field, pats in figs.items():
        val = rec.get(field)
        if val is None:
            continue
        found = []
        for p in pats:
            found += [_num(m) for m in re.findall(p, text)]
        if not found:
            errors.append(f"{where}: {field}={val} but no matching line in raw")
        elif not any(abs(f - float(val)) < 1e-9 for f in found):
            errors.append(f"{where}: {field}={val} but raw says {sorted(set(found))}")


def check_types(rec, spec, errors, where):
    for k, t in spec.items():
        if k not in rec:
            errors.append(f"{where}: missing key {k}")
        elif not isinstance(rec[k], t) or (isinstance(rec[k], bool) and t in (OPT_INT, OPT_NUM)):
            errors.append(f"{where}: key {k} has type {type(rec[k]).__name__}")


def release(rec):
    v = rec.get("engine_version") or rec.get("vllm_version")
    if v:
        return v
    inf = rec.get("engine_version_inferred")
    return "~" + inf.split(" ")[0].lstrip("~") if inf else "unknown"


COMPONENTS = "vllm-nontorch-fit.jsonl"
COMPONENT = {"id": str, "source_url": str, "engine": str, "split": str, "engine_generation": str, "gpu": str,
             "gpu_key": OPT_STR, "compute_capability": (list, type(None)), "tp": int, "pp": int,
             "non_torch_gib": NUM, "raw": list, "notes": str}


def check_components(errors, ids):
    """The non-torch fit set: no outcome or KV figures, only the growth line and what classifies it."""
    path = os.path.join(HERE, COMPONENTS)
    if not os.path.exists(path):
        return 0
    n = 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            rec = json.loads(line)
            where = f"{COMPONENTS}:{i} ({rec.get('id')})"
            check_types(rec, COMPONENT, errors, where)
            if rec.get("split") != "fit" or rec.get("engine") != "vllm":
                errors.append(f"{where}: must be a vllm fit record")
            if rec.get("gpu_key") is not None and rec["gpu_key"] not in GPU_KEYS:
                errors.append(f"{where}: unknown gpu_key {rec['gpu_key']!r}")
            check_figures(rec, {"non_torch_gib": VLLM_FIGS["non_torch_gib"]}, errors, where)
            ids[rec.get("id")] += 1
            n += 1
    return n


def main(argv):
    errors, warnings = [], []
    counts = collections.Counter()
    ids = collections.Counter()
    kvsig = collections.defaultdict(list)
    totals = collections.Counter()
    for name, (engine, split) in FILES.items():
        path = os.path.join(HERE, name)
        if not os.path.exists(path):
            if name != "trtllm.jsonl":
                errors.append(f"{name}: file missing")
            continue
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                where = f"{name}:{i}"
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    errors.append(f"{where}: not JSON ({e})")
                    continue
                if not isinstance(rec, dict):
                    errors.append(f"{where}: not an object")
                    continue
                where = f"{name}:{i} ({rec.get('id')})"
                check_types(rec, COMMON, errors, where)
                if rec.get("engine") != engine:
                    errors.append(f"{where}: engine {rec.get('engine')!r}, expected {engine!r}")
                if rec.get("split") != split:
                    errors.append(f"{where}: split {rec.get('split')!r}, expected {split!r}")
                raw = rec.get("raw")
                if not isinstance(raw, list) or not raw or not all(isinstance(x, str) and x.strip() for x in raw):
                    errors.append(f"{where}: raw must be a non-empty list of non-empty strings")
                    continue
                if not str(rec.get("source_url", "")).startswith("http"):
                    errors.append(f"{where}: source_url is not a URL")
                ids[rec.get("id")] += 1
                spec = {"vllm": VLLM, "sglang": SGLANG, "trtllm": TRTLLM}[engine]
                check_types(rec, spec, errors, where)
                if split == "holdout":
                    check_types(rec, HOLDOUT_EXTRA, errors, where)
                    if rec.get("outcome") not in OUTCOMES:
                        errors.append(f"{where}: outcome {rec.get('outcome')!r}")
                    gk = rec.get("gpu_key")
                    if gk is not None and gk not in GPU_KEYS:
                        errors.append(f"{where}: unknown gpu_key {gk!r}")
                    if gk is None and not rec.get("notes"):
                        errors.append(f"{where}: gpu_key null without a note")
                    if rec.get("outcome") != "started" and not rec.get("error_text"):
                        warnings.append(f"{where}: failed start without error_text")
                    if engine == "vllm" and rec.get("vllm_version") != rec.get("engine_version"):
                        errors.append(f"{where}: vllm_version != engine_version")
                if engine == "trtllm":
                    for key, allowed in TRTLLM_OPTIONAL.items():
                        value = rec.get(key)
                        if value is not None and (not isinstance(value, str) or (allowed and value not in allowed)):
                            errors.append(f"{where}: {key} {value!r}")
                figs = {"vllm": VLLM_FIGS, "sglang": SGLANG_FIGS, "trtllm": TRTLLM_FIGS}[engine]
                check_figures(rec, figs, errors, where)
                sig = tuple(sorted({TS.sub("", x).strip() for x in raw if KV_LINE.search(x)}))
                if sig:
                    kvsig[(engine, sig, rec.get("model"))].append(rec.get("id"))
                gpu = rec.get("gpu_key") or ("H100-80GB" if split == "fit" else "other/unknown")
                counts[
                    (
                        engine,
                        split,
                        gpu,
                        release(rec),
                        rec.get("outcome") or ("started" if not rec.get("error_text") else "failed"),
                    )
                ] += 1
                totals[(engine, split)] += 1
    totals[("vllm", "fit (non-torch only)")] = check_components(errors, ids)
    for k, v in ids.items():
        if v > 1:
            errors.append(f"duplicate id {k} ({v}x)")
    for v in kvsig.values():
        if len(v) > 1:
            warnings.append(f"same KV lines in {len(v)} records (check they are separate runs): {v}")

    md = "--markdown" in argv
    rows = sorted(counts.items())
    if md:
        print("| engine | split | gpu_key | release | outcome | logs |")
        print("|---|---|---|---|---|---|")
        for (e, s, g, r, o), n in rows:
            print(f"| {e} | {s} | {g} | {r} | {o} | {n} |")
    else:
        print(f"{'engine':7} {'split':8} {'gpu_key':15} {'release':30} {'outcome':14} logs")
        for (e, s, g, r, o), n in rows:
            print(f"{e:7} {s:8} {g:15} {r:30} {o:14} {n}")
    print()
    for (e, s), n in sorted(totals.items()):
        print(f"total {e} {s}: {n}")
    hold = [k for k in counts if k[1] == "holdout"]
    print(
        "holdout GPU types:",
        len({k[2] for k in hold if k[2] != "other/unknown"}),
        "| vLLM releases:",
        len({k[3] for k in hold if k[0] == "vllm" and k[3] != "unknown"}),
        "| failed starts:",
        sum(n for k, n in counts.items() if k[1] == "holdout" and k[4] != "started"),
    )
    for w in warnings:
        print("WARNING", w, file=sys.stderr)
    for e in errors:
        print("ERROR", e, file=sys.stderr)
    if errors:
        print(f"{len(errors)} error(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
