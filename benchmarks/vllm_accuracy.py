"""kvplan's vLLM engine model against real vLLM 0.19.0 start-up logs (../shared/reference/vllm-startup-logs.jsonl).

Per case and in summary, predicted vs logged: weights, activation peak, non-torch memory, available KV memory,
GPU KV cache tokens and maximum concurrency, with percent errors, in two modes:
  A  given the logged available KV memory (--kv-cache-memory-bytes): tests the per-token and block math;
  B  end to end from the deployment flags alone: tests the whole budget model.
Cases whose model config is not in the bundled library are listed with the reason, not evaluated.

    python benchmarks/vllm_accuracy.py              # print the tables, write benchmarks/results/vllm_accuracy.md
    python benchmarks/vllm_accuracy.py --fit        # refit the activation-peak coefficients (train/held-out)
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kvplan.engines.vllm import VllmFlags, VllmReport, plan_vllm  # noqa: E402
from kvplan.engines.vllm_memory import padded_vocab  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.hardware.gpus import find_gpu  # noqa: E402
from kvplan.model.dtypes import serving_dtype, weight_dtype_bytes  # noqa: E402
from kvplan.model.specs import ModelSpec  # noqa: E402
from kvplan.sources.resolve import resolve_model  # noqa: E402
from kvplan.units import GiB  # noqa: E402

LOGS = REPO.parent / "shared" / "reference" / "vllm-startup-logs.jsonl"
RESULTS = REPO / "benchmarks" / "results" / "vllm_accuracy.md"
_ARGS_RE = re.compile(r"non-default args: (\{.*\})")
_KV_IN_USE_RE = re.compile(r"(?:Available KV cache memory:|kv cache memory in use is) ([0-9.]+) GiB")


@dataclass(frozen=True)
class Case:
    row: dict
    args: dict  # vLLM's "non-default args" as logged
    model: ModelSpec | None
    skip_reason: str | None

    @property
    def label(self) -> str:
        r = self.row
        extra = [f"tp{r['tp']}", f"pp{r['pp']}", f"L{r['max_model_len']}"]
        for key in ("dtype", "kv_cache_dtype", "quantization"):
            if key in self.args:
                extra.append(f"{key}={self.args[key]}")
        if r["gpu_memory_utilization"] != 0.95:
            extra.append(f"util={r['gpu_memory_utilization']}")
        return f"{r['model']} ({' '.join(extra)})"


def load_cases() -> list[Case]:
    cases = []
    for line in LOGS.read_text().splitlines():
        row = json.loads(line)
        args: dict = {}
        for raw in row["raw"]:
            m = _ARGS_RE.search(raw)
            if m:
                args = ast.literal_eval(m.group(1))
        try:
            model = resolve_model(row["model"], offline=True).model
            reason = None
        except KvplanError as exc:
            model, reason = None, f"no bundled config ({type(exc).__name__})"
        cases.append(Case(row, args, model, reason))
    return cases


def flags_for(case: Case, kv_cache_memory_bytes: int | None = None) -> VllmFlags:
    a, r = case.args, case.row
    return VllmFlags(
        max_model_len=r["max_model_len"],
        gpu_memory_utilization=r["gpu_memory_utilization"],
        kv_cache_dtype=a.get("kv_cache_dtype", "auto"),
        block_size=a.get("block_size"),
        max_num_seqs=a.get("max_num_seqs"),
        max_num_batched_tokens=a.get("max_num_batched_tokens"),
        tensor_parallel_size=r["tp"],
        pipeline_parallel_size=r["pp"],
        dtype=a.get("dtype", "auto"),
        quantization=a.get("quantization"),
        enable_prefix_caching=a.get("enable_prefix_caching", True),
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        version="0.19",
    )


def logged_min_available_bytes(case: Case) -> int:
    """The smallest KV memory any rank logged (TP ranks agree to within rounding)."""
    values = [float(m.group(1)) for raw in case.row["raw"] for m in _KV_IN_USE_RE.finditer(raw)]
    return round(min(values or [case.row["available_kv_gib"]]) * GiB)


def pct(pred: float, actual: float | None) -> float | None:
    if actual in (None, 0):
        return None
    return 100.0 * (pred - actual) / actual


def _fmt_pct(p: float | None) -> str:
    return "-" if p is None else f"{p:+.2f}%"


@dataclass(frozen=True)
class Result:
    case: Case
    a: VllmReport
    b: VllmReport


def evaluate(cases: list[Case]) -> list[Result]:
    gpu = find_gpu("H100")
    out = []
    for c in cases:
        if c.model is None:
            continue
        b = plan_vllm(c.model, flags_for(c), gpu)
        if c.row["pp"] == 1:
            a = plan_vllm(c.model, flags_for(c, logged_min_available_bytes(c)), gpu)
        else:
            # Only some PP ranks log their KV memory: pin rank 0 to its logged figure and keep the modelled
            # differences between stages (the last stage, which runs the sampler, is usually the limit).
            shift = round(c.row["available_kv_gib"] * GiB) - b.first_rank_available_kv_bytes
            a = plan_vllm(c.model, flags_for(c), gpu, available_shift_bytes=shift)
        out.append(Result(c, a, b))
    return out


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(abs(v) for v in values) / len(values)
    worst = max(values, key=abs)
    return f"mean |err| {mean:.2f}%, worst {worst:+.2f}%"


def report(cases: list[Case], results: list[Result]) -> str:
    lines = ["# kvplan vs vLLM 0.19.0 start-up logs (H100-80GB)", "",
             "Generated by `python benchmarks/vllm_accuracy.py`; logs: ../shared/reference/vllm-startup-logs.jsonl.",
             "Predicted with `--engine vllm --vllm-version 0.19` (the logs' release). GiB = 2**30.", ""]
    a_tok = [pct(r.a.kv_cache_tokens, r.case.row["kv_tokens"]) for r in results]
    b_av = [pct(r.b.first_rank_available_kv_bytes / GiB, r.case.row["available_kv_gib"]) for r in results]
    b_tok = [pct(r.b.kv_cache_tokens, r.case.row["kv_tokens"]) for r in results]
    b_conc = [pct(r.b.max_concurrency, r.case.row["max_concurrency"]) for r in results]
    b_w = [pct(r.b.stages[0].memory.weights_bytes / GiB, r.case.row["weights_gib"]) for r in results]
    lines += ["## Summary", "",
              f"Evaluated {len(results)} of {len(cases)} logs; {len(cases) - len(results)} lack a bundled config.", "",
              "| quantity | mode | error |", "|---|---|---|",
              f"| KV cache tokens | A: given logged KV memory | {_summary([p for p in a_tok if p is not None])} |",
              f"| available KV memory | B: flags only | {_summary([p for p in b_av if p is not None])} |",
              f"| KV cache tokens | B: flags only | {_summary([p for p in b_tok if p is not None])} |",
              f"| max concurrency | B: flags only | {_summary([p for p in b_conc if p is not None])} |",
              f"| weights (rank 0) | B: flags only | {_summary([p for p in b_w if p is not None])} |", ""]
    train, held = fit_split(cases)
    role = {id(c): "train" for c in train} | {id(c): "held-out" for c in held}
    lines += ["## Calibration split", "",
              "The activation-peak coefficients (`FWD_*`, `SAMPLER_*` in kvplan/engines/vllm_memory.py) were fitted by",
              "`--fit` on the train logs below; the held-out models were not seen by that fit. MoE models are in",
              "neither set: their fused-MoE workspace is a separate term with no fitted coefficient (its buffer shapes",
              "are vLLM's). But that the workspace adds to the sampler peak, rather than competing with it, was read off",
              "these same MoE logs, so they are not a clean test of that choice. The non-torch figures are medians",
              "over all 61 logs (not held out). Mode B error on available KV memory by role:", "",
              "| role | logs | models | available KV (B) |", "|---|---|---|---|"]
    for name in ("train", "held-out", "not in the fit"):
        group = [r for r in results if role.get(id(r.case), "not in the fit") == name]
        errs = [pct(r.b.first_rank_available_kv_bytes / GiB, r.case.row["available_kv_gib"]) for r in group]
        models = ", ".join(sorted({r.case.row["model"].split("/")[-1] for r in group}))
        lines.append(f"| {name} | {len(group)} | {models} | {_summary([e for e in errs if e is not None])} |")
    lines += [""]
    lines += ["## Per case", "",
              "Memory in GiB (logged / predicted, rank 0); tokens and concurrency from the limiting rank.", "",
              "| case | weights | activation | non-torch | available KV (B) | tokens (A) | tokens (B) | concurrency (B) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        row, m = r.case.row, r.b.stages[0].memory

        def cell(logged, pred, digits=2):
            if logged is None:
                return f"- / {pred:.{digits}f}"
            return f"{logged:.{digits}f} / {pred:.{digits}f} ({_fmt_pct(pct(pred, logged))})"

        lines.append(
            f"| {r.case.label} | {cell(row['weights_gib'], m.weights_bytes / GiB)} "
            f"| {cell(row['activation_peak_gib'], m.activation_peak_bytes / GiB)} "
            f"| {cell(row['non_torch_gib'], m.non_torch_bytes / GiB)} "
            f"| {cell(row['available_kv_gib'], r.b.first_rank_available_kv_bytes / GiB)} "
            f"| {row['kv_tokens']:,} / {r.a.kv_cache_tokens:,} ({_fmt_pct(pct(r.a.kv_cache_tokens, row['kv_tokens']))}) "
            f"| {row['kv_tokens']:,} / {r.b.kv_cache_tokens:,} ({_fmt_pct(pct(r.b.kv_cache_tokens, row['kv_tokens']))}) "
            f"| {cell(row['max_concurrency'], r.b.max_concurrency)} |"
        )
    lines += ["", "## Not evaluated", "", "| log | model | reason |", "|---|---|---|"]
    for c in cases:
        if c.model is None:
            lines.append(f"| {c.row['id']} | {c.row['model']} | {c.skip_reason} |")
    failed = [r for r in results if r.case.row["error_text"]]
    if failed:
        lines += ["", "Logs whose run failed after KV sizing (the sizing lines are still compared): "
                  + ", ".join(r.case.row["id"] for r in failed) + "."]
    return "\n".join(lines) + "\n"


# --- Activation-peak fit --------------------------------------------------------------------------------

def _solve(rows: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares by the normal equations (a handful of unknowns), Gauss-Jordan with pivoting."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys))] for i in range(n)]
    for col in range(n):
        piv = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[piv] = a[piv], a[col]
        for k in range(n):
            if k != col and a[col][col]:
                f = a[k][col] / a[col][col]
                a[k] = [x - f * y for x, y in zip(a[k], a[col])]
    return [a[i][n] / a[i][i] if a[i][i] else 0.0 for i in range(n)]


def _features(c: Case) -> tuple[list[float], list[float], bool]:
    """(forward features, sampler features, runs sampler) for the rank whose activation is logged (rank 0)."""
    m, f = c.model, flags_for(c)
    dtype = serving_dtype(m.config_dtype) if f.dtype == "auto" else f.dtype
    b = weight_dtype_bytes(dtype)
    tokens, seqs = 8192, 1024  # the H100 defaults; no log overrides them
    inter = (m.intermediate_size or 4 * m.hidden_size) / f.tensor_parallel_size
    fwd = [1.0, tokens * b * (inter + m.hidden_size) / 1e9]
    logits = min(seqs, tokens) * padded_vocab(m.vocab_size)
    # The lm_head output itself, [S, V] in the model dtype, is counted at its exact size (not fitted).
    smp = [1.0, logits * 4 / 1e9, logits * b / 1e9]
    return fwd, smp, f.pipeline_parallel_size == 1


def _sampler(ks: list[float], s: list[float]) -> float:
    return ks[0] * s[0] + ks[1] * s[1] + s[2] * 1e9 / GiB


def fit_split(cases: list[Case]) -> tuple[list[Case], list[Case]]:
    """The activation fit's train and held-out logs: dense models with a logged peak, every other model
    (sorted by name) in training and the rest held out, so no held-out model was seen by the fit."""
    usable = [c for c in cases if c.model is not None and c.row["activation_peak_gib"] is not None
              and c.model.geometry.moe is None]
    models = sorted({c.row["model"] for c in usable})
    train_models = set(models[::2])
    return ([c for c in usable if c.row["model"] in train_models],
            [c for c in usable if c.row["model"] not in train_models])


def fit(cases: list[Case]) -> None:
    train, held = fit_split(cases)
    train_models = {c.row["model"] for c in train}
    data = [(c, *_features(c)) for c in train]
    use_sampler = {id(c): runs and s[1] > 2 * fw[1] for c, fw, s, runs in data}
    for _ in range(10):
        f_rows = [(fw, c.row["activation_peak_gib"]) for c, fw, s, runs in data if not use_sampler[id(c)]]
        s_rows = [(s[:2], c.row["activation_peak_gib"] - s[2] * 1e9 / GiB) for c, fw, s, runs in data if use_sampler[id(c)]]
        kf = _solve([r for r, _ in f_rows], [y for _, y in f_rows])
        ks = _solve([r for r, _ in s_rows], [y for _, y in s_rows])
        new = {}
        for c, fw, s, runs in data:
            pf = sum(a * x for a, x in zip(kf, fw))
            ps = _sampler(ks, s)
            new[id(c)] = runs and ps > pf
        if new == use_sampler:
            break
        use_sampler = new
    print(f"forward: base {kf[0]:.3f} GiB, {kf[1] * GiB / 1e9:.3f} x b B per token x (intermediate/tp + hidden)")
    print(f"sampler: base {ks[0]:.3f} GiB, {ks[1] * GiB / 1e9:.3f} x 4 B per logit, plus b B per logit (lm_head output)")

    def err(group: list[Case], verbose: bool = True) -> str:
        e = []
        for c in group:
            fw, s, runs = _features(c)
            pf = sum(a * x for a, x in zip(kf, fw))
            ps = _sampler(ks, s)
            e.append((max(pf, ps) if runs else pf) - c.row["activation_peak_gib"])
            if verbose:
                print(f"    {c.label:70s} logged {c.row['activation_peak_gib']:.2f} predicted {e[-1] + c.row['activation_peak_gib']:.2f}")
        return f"{len(group)} cases, mean |err| {sum(map(abs, e)) / len(e):.3f} GiB, worst {max(e, key=abs):+.3f} GiB"

    print("train   :", err(train), sorted(train_models))
    print("held-out:", err(held))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the activation coefficients and print them")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the markdown table")
    args = parser.parse_args()
    cases = load_cases()
    if args.fit:
        fit(cases)
        return
    text = report(cases, evaluate(cases))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
