"""The log's deployment planned by kvplan, each measured figure beside kvplan's prediction, and the loop closed:
the same deployment planned again with the box's profile (what `--profile` will do) should give the log back.

A figure differs when the prediction is off by more than half the log's last printed digit and more than 0.5%
(the loop's own target). The start-up is called right when kvplan's verdict and the log agree on whether the
engine started, and on a refusal for lack of KV room.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, field, replace
from pathlib import PurePath
from typing import Any

from kvplan.calibrate.log import BLOCKS, BYTES, KV_OOM, OOM_OTHER, STARTED, TIMES, TOKENS, Reading, StartupLog
from kvplan.calibrate.profile import build_profile, resolved_setting
from kvplan.calibrate.vllm_log import graph_estimate
from kvplan.capacity.deployment import (
    BoxProfile,
    Deployment,
    EngineOptions,
    Parallelism,
    WeightsChoice,
    Workload,
    options_dict,
)
from kvplan.capacity.weights import runtime_quant
from kvplan.engines.release import CURRENT, parse_release
from kvplan.engines.sglang import SglangOptions
from kvplan.engines.vllm_engine import VllmOptions
from kvplan.engines.vllm_lora import LoraSlots
from kvplan.engines.vllm_speculative import speculative_options
from kvplan.errors import FieldError, InputError, KvplanError
from kvplan.hardware.gpus import GpuSpec, all_gpus, custom_gpu, find_gpu
from kvplan.model.dtypes import normalize_weight_dtype
from kvplan.model.specs import ModelSpec
from kvplan.planner.verdict import Verdict, plan
from kvplan.records import dataclass
from kvplan.sources.resolve import resolve_model
from kvplan.units import GiB

TOLERANCE = 0.005  # the loop's target: the same deployment reproduces the log within 0.5%
REFUSED_FOR_KV = ("no_kv_memory", "one_request", "mamba_blocks")
# Refusals kvplan gives where the engine itself still starts: SGLang caps a request's length at its token pool
# (max_req_input_len) instead of stopping.
STARTS_ANYWAY: dict[str, tuple[str, ...]] = {"sglang": ("one_request",)}


@dataclass(frozen=True)
class Component:
    """One measured figure, kvplan's prediction of it, and the prediction with this box's profile."""

    key: str
    label: str
    unit: str
    logged: Reading | None
    predicted: float | None
    replayed: float | None = None
    note: str = ""

    def relative(self, value: float | None) -> float | None:
        if self.logged is None or value is None or not self.logged.value:
            return None
        return (value - self.logged.value) / abs(self.logged.value)

    def differs(self, value: float | None) -> bool | None:
        if self.logged is None or value is None:
            return None
        allowed = max(self.logged.resolution / 2, abs(self.logged.value) * TOLERANCE)
        return abs(value - self.logged.value) > allowed + 1e-9


@dataclass(frozen=True)
class Outcome:
    logged: str  # started / kv_oom / oom_other / refused / unknown
    predicted: str | None  # "starts", or the refusal code kvplan gives
    right: bool | None  # None: the log or kvplan cannot tell


@dataclass(frozen=True)
class SettingCheck:
    """A setting the log shows as the engine resolved it, beside the default kvplan's rule gives."""

    name: str
    logged: float
    kvplan_default: float | None


@dataclass(frozen=True)
class Report:
    log: StartupLog
    deployment: Deployment | None
    verdict: Verdict | None
    unpredicted: str | None  # why there is no prediction
    components: tuple[Component, ...]
    settings: tuple[SettingCheck, ...]
    outcome: Outcome
    replay_outcome: Outcome | None
    profile: BoxProfile | None
    provenance: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    version_label: str | None = None  # the log's release, or the one --engine-version gave


    @property
    def headline(self) -> Component | None:
        """The figure the verdict line leads with: the KV memory, else the KV tokens."""
        for key in ("available_kv", "kv_pool", "kv_tokens"):
            for c in self.components:
                if c.key == key and c.logged is not None and c.predicted is not None:
                    return c
        return None


# --- the deployment a log describes ---------------------------------------------------------------------------


def _model_candidates(log: StartupLog) -> list[str]:
    s = log.settings
    out = [n for n in (s.served_model_name, s.model) if n]
    for name in list(out):
        parts = PurePath(name).parts
        if len(parts) > 2:
            out.append("/".join(parts[-2:]))
    return list(dict.fromkeys(out))


def _resolve_model(log: StartupLog, model: str | None, offline: bool) -> tuple[ModelSpec | None, str | None]:
    names = [model] if model else _model_candidates(log)
    if not names:
        return None, "the log does not name the model: give it with --model"
    errors = []
    for name in names:
        try:
            return resolve_model(name, offline=offline, prefer_library=True).model, None
        except KvplanError as exc:
            errors.append(f"{name}: {exc.message}")
    return None, f"the model resolves nowhere ({'; '.join(errors)}); give a Hub id, library name or config with --model"


def _cards_printing(value: float, resolution: float) -> list[GpuSpec]:
    """Catalog cards whose CUDA total prints as `value` at the log's `resolution`."""
    return [g for g in all_gpus() if g.memory_kind in ("cuda", "vllm-log")
            and abs(g.total_memory_bytes - value) <= resolution / 2]


def _gpu(log: StartupLog, gpu: str | GpuSpec | None) -> tuple[GpuSpec | None, str | None]:
    if isinstance(gpu, GpuSpec):
        return gpu, None
    if gpu:
        return find_gpu(gpu), None
    name = log.settings.device_name
    if name:
        try:
            return find_gpu(name), None
        except InputError:
            pass
    total = log.get("total")
    if total is not None:
        # A card whose CUDA total prints as the logged figure (H100 SXM: 85,028,372,480 B -> "79.19 GiB").
        cards = _cards_printing(total.value, total.resolution)
        # One card, or cards with one and the same total (the H100 PCIe reports the SXM's): the catalog's first
        # (the note names the others).
        if len({g.total_memory_bytes for g in cards}) == 1:
            return cards[0], None
        return custom_gpu(total.as_int, name="this box"), None
    return None, "the log names no GPU and prints no total memory: give the GPU with --gpu"


def _vllm_version(text: str | None) -> tuple[str, str | None]:
    """The --vllm-version kvplan models a logged release with, and a note when it is not that release's own."""
    if not text:
        return CURRENT, "the log prints no vLLM version: planned with kvplan's current vLLM rules"
    release = parse_release(text)
    older = release is not None and release < (0, 20, 0)
    candidates = [text] + ([f"{release[0]}.{release[1]}"] if release else []) + ["0.19" if older else CURRENT]
    for candidate in dict.fromkeys(candidates):
        try:
            VllmOptions(version=candidate).validate()
        except FieldError:
            continue
        return candidate, None if candidate == text else f"vLLM {text} is planned with kvplan's vLLM {candidate} rules"
    return CURRENT, f"vLLM {text} is planned with kvplan's current vLLM rules"


def _options(log: StartupLog, version: str | None, user_only: bool) -> tuple[EngineOptions, list[str]]:
    """The engine options the log ran with (`user_only`: only those the user's own flags gave)."""
    s = log.settings

    def given(name: str) -> Any:
        return getattr(s, name) if not user_only or name in s.user_set else None

    if log.engine == "sglang":
        text = version or log.version
        notes = [] if text else ["the log prints no SGLang version: planned with the newest rules read (give "
                                 "--engine-version)"]
        return SglangOptions(
            version=text or CURRENT, mem_fraction_static=given("utilization"), page_size=given("block_size"),
            max_running_requests=given("max_num_seqs"), chunked_prefill_size=given("max_num_batched_tokens"),
            cuda_graph_max_bs=given("cuda_graph_max_bs"), max_total_tokens=given("max_total_tokens"),
            attention_backend=given("attention_backend"),
        ), notes
    chosen, note = _vllm_version(version or log.version)
    util = given("utilization")
    if util is None and not user_only:
        logged = log.get("utilization")
        util = logged.value if logged is not None else None
    caching, chunked = given("enable_prefix_caching"), given("enable_chunked_prefill")
    notes = [note] if note else []
    options = VllmOptions(
        version=chosen, gpu_memory_utilization=util, block_size=given("block_size"), max_num_seqs=given("max_num_seqs"),
        max_num_batched_tokens=given("max_num_batched_tokens"),
        enable_prefix_caching=None if caching is None else bool(caching), install=s.install or "image",
        enforce_eager=bool(s.enforce_eager), compile_cache=s.compile_cache or "cold",
        flashinfer_sampler=s.flashinfer_sampler,
        enable_chunked_prefill=None if chunked is None else bool(chunked),
        lora=LoraSlots(s.max_loras or 1, s.max_lora_rank or 16, bool(s.fully_sharded_loras)) if s.enable_lora else None,
        mamba_cache_dtype=s.mamba_cache_dtype or "auto", mamba_ssm_cache_dtype=s.mamba_ssm_cache_dtype or "auto",
        **_mtp(s.speculative_config, notes),
    )
    return _with_engine(options, s.vllm_engine), notes


def _mtp(config: str | None, notes: list[str]) -> dict[str, Any]:
    """The log's --speculative-config when it is MTP, which kvplan plans; another method is named in the notes."""
    try:
        options = speculative_options(config)
    except KvplanError as exc:
        notes.append(f"--speculative-config not read: {exc}")
        return {}
    if options and options["speculative_method"] != "mtp":
        notes.append(f"speculative decoding ({options['speculative_method']}) is not counted: kvplan models MTP only")
        return {}
    return options


def _with_engine(options: VllmOptions, logged: str | None) -> VllmOptions:
    """The options with the engine the log ran (V0 or V1), where the release planned has it."""
    if logged is None:
        return options
    chosen = replace(options, use_v1=logged == "v1")
    try:
        chosen.validate()
    except FieldError:
        return options
    return chosen


def _weights(log: StartupLog) -> tuple[WeightsChoice, list[str]]:
    s, notes = log.settings, []
    dtype = None
    if s.dtype and s.dtype != "auto":
        try:
            dtype = normalize_weight_dtype(s.dtype)
        except InputError:
            notes.append(f"dtype {s.dtype} is not one kvplan plans; the model's own dtype is used")
    quantization = None
    if s.quantization and "quantization" in s.user_set:
        try:
            runtime_quant(s.quantization)
            quantization = s.quantization
        except FieldError:
            notes.append(f"quantization {s.quantization} is read from the model's config, not applied at load")
    offload = round((s.cpu_offload_gb or 0) * GiB)
    return WeightsChoice(dtype=dtype, quantization=quantization, cpu_offload_bytes=offload), notes


def deployment_for(log: StartupLog, *, model: str | None = None, gpu: str | GpuSpec | None = None,
                   version: str | None = None, offline: bool = False
                   ) -> tuple[Deployment | None, str | None, list[str]]:
    """The deployment the log ran, or why it cannot be built (and what to pass)."""
    spec, why = _resolve_model(log, model, offline)
    if spec is None:
        return None, why, []
    card, why = _gpu(log, gpu)
    if card is None:
        return None, why, []
    s = log.settings
    options, notes = _options(log, version, user_only=False)
    weights, more = _weights(log)
    length = s.max_model_len
    for key in ("context_len", "concurrency_len"):
        got = log.summary_get(key)
        if length is None and got is not None:
            length = got.as_int
    kv = s.kv_cache_dtype if s.kv_cache_dtype and s.kv_cache_dtype != "auto" else "auto"
    if length is not None and spec.max_position_embeddings is not None and length > spec.max_position_embeddings:
        # The engine ran this context, so the checkpoint allows it: the config kvplan found states less (a
        # stand-in config of the same architecture, or an older copy).
        notes.append(f"the log ran {length:,} tokens per request; the config used states "
                     f"{spec.max_position_embeddings:,}: planned at the log's")
        spec = replace(spec, geometry=replace(spec.geometry, max_position_embeddings=length))
    d = Deployment(
        model=spec, gpu=card, engine=options, workload=Workload(max_model_len=length),
        parallelism=Parallelism(tp=s.tp or 1, pp=s.pp or 1, dp=s.dp or 1, dp_attention=bool(s.dp_attention)),
        weights=weights, kv_cache_dtype=kv,
    )
    try:
        d.validate()
    except FieldError as exc:
        return None, f"kvplan cannot plan what the log ran: {exc.message}", notes + more
    return d, None, notes + more


# --- what each engine's log is compared on ------------------------------------------------------------------


def _term(name: str) -> Callable[[Verdict], float | None]:
    def get(v: Verdict) -> float | None:
        found = [t.bytes for t in v.account.terms if t.name == name]
        return found[0] if found else None
    return get


def _stage0(key: str, fallback: Callable[[Verdict], float | None]) -> Callable[[Verdict], float | None]:
    """Rank 0's own figure (the first pipeline stage) where the engine reports stages, else the account's."""
    def get(v: Verdict) -> float | None:
        stages = v.account.detail.get("stages")
        if isinstance(stages, list) and stages and key in stages[0]:
            return stages[0][key]
        return fallback(v)
    return get


def _detail(key: str) -> Callable[[Verdict], float | None]:
    return lambda v: v.account.detail.get(key)


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str
    logged: Callable[[StartupLog], Reading | None]
    predict: Callable[[Verdict], float | None]
    note: str = ""


def _first(key: str) -> Callable[[StartupLog], Reading | None]:
    return lambda log: log.get(key)


def _graphs(log: StartupLog) -> Reading | None:
    return log.get("cuda_graph_estimate") or log.get("cuda_graph_actual")


def _logged(row: Row, log: StartupLog, d: Deployment | None) -> Reading | None:
    """The row's figure; for vLLM's CUDA graphs without an "Estimated CUDA graph memory" line, the estimate the
    log prints as a share of the total (graph_estimate) before the capture's own figure."""
    got = row.logged(log)
    if row.key != "cuda_graphs" or log.engine != "vllm" or d is None or log.get("cuda_graph_estimate") is not None:
        return got
    total = log.get("total")
    return graph_estimate(log, total.as_int if total is not None else d.gpu.total_memory_bytes) or got


def _sglang_pool(log: StartupLog) -> Reading | None:
    """K + V sizes of the first pool the primary rank allocated (the served model's; a draft model's follows)."""
    r = log.primary
    kv = next((x for x in r.readings if x.key == "kv_bytes"), None)
    if kv is not None:
        return kv
    k = next((x for x in r.readings if x.key == "k_bytes"), None)
    v = next((x for x in r.readings if x.key == "v_bytes"), None)
    if k is None or v is None:
        return None
    return Reading("kv_pool", k.value + v.value, BYTES, k.resolution * 2, k.line)


def _sglang_tokens(log: StartupLog) -> Reading | None:
    pool = next((x for x in log.primary.readings if x.key == "pool_tokens"), None)
    return pool or log.summary_get("max_total_num_tokens")


def _sglang_free_before(log: StartupLog) -> Reading | None:
    got = log.get("free_before_load")
    after, weights = log.get("free_after_load"), log.get("weights")
    if got is None and after is not None and weights is not None:
        return Reading("free_before_load", after.value + weights.value, BYTES, after.resolution * 2, after.line)
    return got


ROWS: dict[str, tuple[Row, ...]] = {
    "vllm": (
        Row("total", "GPU total", BYTES, _first("total"), lambda v: v.account.total_memory_bytes),
        Row("requested", "usable (x util)", BYTES, _first("requested"), lambda v: v.account.requested_bytes),
        Row("weights", "weights", BYTES, _first("weights"), _stage0("weights_bytes", _term("weights"))),
        Row("activation_peak", "activation peak", BYTES, _first("activation_peak"),
            _stage0("activation_peak_bytes", _term("activation_peak"))),
        Row("non_torch", "non-torch", BYTES, _first("non_torch"), _stage0("non_torch_bytes", _term("non_torch"))),
        Row("cuda_graphs", "CUDA graphs", BYTES, _graphs, _term("cuda_graphs"),
            "kvplan subtracts none for this release"),
        Row("available_kv", "KV memory", BYTES, _first("available_kv"),
            _stage0("available_kv_cache_bytes", lambda v: v.account.kv_budget_bytes)),
        Row("kv_tokens", "KV tokens", TOKENS, _first("kv_tokens"), lambda v: v.account.kv_cache_tokens),
        Row("num_blocks", "KV blocks", BLOCKS, _first("num_blocks"), _detail("num_gpu_blocks")),
        Row("max_concurrency", "concurrency", TIMES, _first("max_concurrency"),
            lambda v: round(v.account.engine_concurrency, 2)),
    ),
    "sglang": (
        Row("free_before_load", "free before load", BYTES, _sglang_free_before, _detail("free_before_load_bytes")),
        Row("weights", "weights", BYTES, _first("weights"), _detail("weights_bytes")),
        Row("free_after_load", "free after load", BYTES, _first("free_after_load"), _detail("free_after_load_bytes")),
        Row("kv_pool", "KV pool", BYTES, _sglang_pool, _detail("token_pool_bytes")),
        Row("kv_tokens", "KV tokens", TOKENS, _sglang_tokens, lambda v: v.account.kv_cache_tokens),
        Row("max_running_requests", "max running", TOKENS, _first("max_running_requests"),
            lambda v: v.account.request_cap),
        Row("context_len", "context length", TOKENS, _first("context_len"), lambda v: v.account.max_model_len),
        Row("cuda_graphs", "CUDA graphs", BYTES, _first("cuda_graph_actual"), lambda v: None,
            "inside the share mem_fraction_static leaves"),
    ),
}
# Settings the log prints as the engine resolved them -> the key kvplan's account reports them under.
SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "vllm": (("utilization", "gpu_memory_utilization"), ("max_num_seqs", "max_num_seqs"),
             ("max_num_batched_tokens", "max_num_batched_tokens"), ("block_size", "block_size")),
    "sglang": (("utilization", "mem_fraction_static"), ("max_num_batched_tokens", "chunked_prefill_size"),
               ("cuda_graph_max_bs", "cuda_graph_max_bs")),
}


def _predicted_outcome(v: Verdict | None) -> str | None:
    if v is None:
        return None
    refusal = v.account.refusal
    if refusal is None or refusal.code in STARTS_ANYWAY.get(v.account.engine, ()):
        return "starts"
    return refusal.code


def _outcome(logged: str, v: Verdict | None) -> Outcome:
    predicted = _predicted_outcome(v)
    right = None
    if predicted is not None:
        if logged == STARTED:
            right = predicted == "starts"
        elif logged == KV_OOM:
            right = predicted in REFUSED_FOR_KV
        elif logged == OOM_OTHER:
            right = predicted == "sampler_warmup_oom"
    return Outcome(logged, predicted, right)


def _plan(d: Deployment) -> tuple[Verdict | None, str | None]:
    try:
        return plan(d), None
    except KvplanError as exc:
        return None, f"kvplan cannot plan what the log ran: {exc.message}"


# The per-rank terms the budget subtracts: the profile's field, the row that predicts it (stage 0), a label.
_BUDGET_TERMS = (("activation_peak_bytes", "activation_peak", "activation"),
                 ("non_torch_bytes", "non_torch", "non-torch"), ("cuda_graph_bytes", "cuda_graphs", "CUDA graphs"),
                 ("weights_bytes", "weights", "weights"))


def _row(engine: str, key: str) -> Row:
    return next(row for row in ROWS[engine] if row.key == key)


def _close_budget(log: StartupLog, d: Deployment, profile: BoxProfile, provenance: dict[str, str],
                  replayed: Verdict) -> tuple[BoxProfile, dict[str, str], Verdict]:
    """Where the log prints the KV memory but not every term the budget subtracts, the terms it leaves out
    together take what the budget has beyond it: their sum is fixed, and it is split as kvplan models them.
    CodeLlama-34B on 0.11.0 prints weights and KV memory only: 71.27 - 62.86 - 8.18 = 0.23 GiB for activation
    and non-torch, which kvplan models as 0.11 and 0.25 GiB, so they become 0.07 and 0.16. A term the log
    measured stays as measured. If even zero for the others leaves the logged KV memory out of reach, the
    catalog's total is not the box's: it is derived where the log prints none (_raise_total)."""
    logged = log.get("available_kv")
    available = _row("vllm", "available_kv").predict
    figure = available(replayed)
    if logged is None or figure is None:
        return profile, provenance, replayed
    residual = round(figure - logged.value)  # > 0: the plan leaves more KV memory than the log
    if abs(residual) <= logged.resolution / 2:
        return profile, provenance, replayed
    # A term the plan does not report is not in this release's budget (CUDA graphs before 0.20).
    free = {field: int(value) for field, key, _ in _BUDGET_TERMS
            if (value := _row("vllm", key).predict(replayed)) is not None
            and not provenance.get(field, "").startswith("measured")}
    held = sum(free.values())
    wanted = held + residual
    # Each printed figure is rounded to half its last digit, so the measured terms and the KV memory may leave a
    # few MB below zero for terms that are truly none (vllm#10511 prints all four: 71.29 - 14.96 - 1.79 - 1.26 =
    # 53.28 GiB against 53.29 logged, so CUDA graphs, planned for an unstated release, take 0).
    printed = 2 + sum(provenance.get(field, "").startswith("measured") for field, _, _ in _BUDGET_TERMS)
    if -printed * logged.resolution / 2 <= wanted < 0:
        wanted = 0
    if wanted < 0:
        return _raise_total(logged, d, profile, provenance, replayed, residual)
    if not free:
        return profile, provenance, replayed
    names = [label for field, _, label in _BUDGET_TERMS if field in free]
    values: dict[str, Any] = {field: (value * wanted // held if held else 0) for field, value in free.items()}
    first = next(iter(values))
    values[first] += wanted - sum(values.values())  # the integer remainder
    split = ", split as kvplan models them" if len(free) > 1 else ""
    why = (f"derived: line {logged.line}, the budget less the logged KV memory leaves {wanted / GiB:.2f} GiB for "
           f"{' + '.join(names)}{split}")
    closed = replace(profile, **values)
    again, _ = _plan(replace(d, profile=closed))
    if again is None:
        return profile, provenance, replayed
    return closed, {**provenance, **dict.fromkeys(values, why)}, again


def _raise_total(logged: Reading, d: Deployment, profile: BoxProfile, provenance: dict[str, str],
                 replayed: Verdict, residual: int) -> tuple[BoxProfile, dict[str, str], Verdict]:
    """The logged KV memory is more than the catalog's total leaves even with nothing else subtracted: where
    the log prints no total, the box's is the one that leaves it (requested = total x utilization). Phi-3-mini
    on an "RTX 3090" under WSL at 0.85: 7.12 GiB of weights and 13.06 of KV memory need 20.18 of the 20.03 GiB
    that 0.85 x 23.56 gives, before any activation."""
    util = resolved_setting(replayed, "gpu_memory_utilization")
    if not provenance.get("total_memory_bytes", "").startswith("catalog") or not util:
        return profile, provenance, replayed
    total = math.ceil((replayed.account.requested_bytes - residual) / float(util))
    raised = replace(profile, total_memory_bytes=total)
    again, _ = _plan(replace(d, profile=raised))
    if again is None:
        return profile, provenance, replayed
    why = (f"derived: line {logged.line}, the total that leaves the logged KV memory at utilization {util} beside "
           f"kvplan's other terms (the catalog's {d.gpu.key} total, {d.gpu.total_memory_bytes / GiB:.2f} GiB, "
           "cannot)")
    return raised, {**provenance, "total_memory_bytes": why}, again


def calibrate(log: StartupLog, *, model: str | None = None, gpu: str | GpuSpec | None = None,
              version: str | None = None, offline: bool = False) -> Report:
    """Compare `log` with kvplan's plan of the same deployment, and replay it with the box's profile. `gpu`: a
    name, or a card of a given size (custom_gpu) when the log's GPU is not one kvplan knows."""
    d, why, notes = deployment_for(log, model=model, gpu=gpu, version=version, offline=offline)
    v = replayed = None
    profile: BoxProfile | None = None
    provenance: dict[str, str] = {}
    if d is not None:
        v, why = _plan(d)
    if d is not None and v is not None:
        profile, provenance = build_profile(log, d, v)
        replayed, _ = _plan(replace(d, profile=profile))
        if replayed is not None and log.engine == "vllm":
            profile, provenance, replayed = _close_budget(log, d, profile, provenance, replayed)
    components = tuple(
        Component(row.key, row.label, row.unit, _logged(row, log, d), None if v is None else row.predict(v),
                  None if replayed is None else row.predict(replayed), row.note)
        for row in ROWS[log.engine]
    )
    checks: list[SettingCheck] = []
    if d is not None and v is not None:
        bare, _ = _options(log, version, user_only=True)
        defaults, _ = _plan(replace(d, engine=bare))
        for name, key in SETTINGS[log.engine]:
            logged = getattr(log.settings, name)
            if logged is None or name in log.settings.user_set or defaults is None:
                continue
            value = resolved_setting(defaults, key)
            checks.append(SettingCheck(key, float(logged), None if value is None else float(value)))
    total = log.get("total")
    if d is not None and d.gpu.key != "this box" and total is not None and not gpu and not log.settings.device_name:
        others = [g.key for g in _cards_printing(total.value, total.resolution) if g.key != d.gpu.key]
        also = f" (so does {', '.join(others)}'s: give --gpu to plan that card)" if others else ""
        notes.append(f"the GPU is taken to be {d.gpu.key}: its CUDA total prints as the logged one{also}")
    if d is not None:
        notes.append(f"planned as {d.model.name} on {d.gpu.key}, tp {d.parallelism.tp} x pp {d.parallelism.pp}, "
                     f"{d.max_model_len:,} tokens per request")
    return Report(
        log=log, deployment=d, verdict=v, unpredicted=why, components=components, settings=tuple(checks),
        outcome=_outcome(log.outcome, v),
        replay_outcome=None if replayed is None else _outcome(log.outcome, replayed),
        profile=profile, provenance=provenance, notes=tuple(notes) + log.notes,
        version_label=log.version or (f"{version} (given)" if version else None),
    )


def report_to_dict(r: Report) -> dict[str, Any]:
    """The report as the --json document's entry for one log."""
    log, d = r.log, r.deployment

    def comp(c: Component) -> dict[str, Any]:
        return {
            "name": c.key, "label": c.label, "unit": c.unit,
            "logged": None if c.logged is None else (c.logged.as_int if c.unit in (BYTES, TOKENS, BLOCKS)
                                                     else c.logged.value),
            "logged_line": None if c.logged is None else c.logged.line,
            "predicted": c.predicted, "relative_error": _round(c.relative(c.predicted)),
            "differs": c.differs(c.predicted),
            "with_profile": c.replayed, "with_profile_relative_error": _round(c.relative(c.replayed)),
            "note": c.note,
        }

    return {
        "source": log.source,
        "engine": log.engine,
        "engine_version": log.version,
        "records_read": log.records,
        "settings": {k: v for k, v in asdict(log.settings).items() if k != "user_set" and v is not None},
        "user_set": sorted(log.settings.user_set),
        "ranks": [{"rank": rk.rank, "figures": {x.key: (x.as_int if x.unit in (BYTES, TOKENS, BLOCKS) else x.value)
                                                 for x in rk.readings}} for rk in log.ranks],
        "deployment": None if d is None else {
            "model": d.model.name, "gpu": d.gpu.key, "total_memory_bytes": d.gpu.total_memory_bytes,
            "tp": d.parallelism.tp, "pp": d.parallelism.pp, "max_model_len": d.max_model_len,
            "engine_options": options_dict(d.engine),
        },
        "prediction_unavailable": r.unpredicted,
        "components": [comp(c) for c in r.components],
        "settings_vs_defaults": [asdict(s) for s in r.settings],
        "outcome": asdict(r.outcome),
        "outcome_with_profile": None if r.replay_outcome is None else asdict(r.replay_outcome),
        "error": log.error,
        "profile": None if r.profile is None else asdict(r.profile),
        "provenance": r.provenance,
        "calibration": None if r.verdict is None or r.verdict.account.calibration is None
        else asdict(r.verdict.account.calibration),
        "notes": list(r.notes),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)
