"""The fix-finder: changes that make a deployment fit, each verified by planning it again.

A fix is data (`field`, value), never a flag: the CLI says `--tp 4`, `kvplan check` says
`tensor_parallel_size: 4` at its line. Fixes that keep the workload come first (fewest GPUs, then fewest
changes, then most headroom); fixes that shrink it (fewer requests, a shorter context) follow. A fix never
repeats the request, and combinations are tried (tp x fp8 KV x utilization, another GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

from kvplan.capacity.deployment import Deployment
from kvplan.engines import get_engine
from kvplan.errors import KvplanError
from kvplan.hardware.gpus import COMMON_GPUS, GpuSpec, find_gpu
from kvplan.planner.verdict import Verdict, plan
from kvplan.records import dataclass

# Tensor-parallel widths tried, as multiples of the current one, and the widest instance considered.
TP_STEPS = (2, 4, 8)
MAX_TP = 64
WORKLOAD_FIELDS = ("workload.concurrency", "workload.max_model_len")
# Among fixes on as many GPUs, the lighter change first: an engine setting (utilization 0.95, max_num_seqs)
# before a lower-precision KV cache, which changes the numerics, before other parallelism or another card.
_CHANGE_WEIGHT = {"engine": 1, "instances": 1, "kv_cache_dtype": 2, "parallelism": 2, "gpu": 3}


@dataclass(frozen=True)
class Change:
    """One field of a deployment set to a new value (a GpuSpec for `gpu`)."""

    field: str
    value: object

    @property
    def shown_value(self) -> object:
        return self.value.key if isinstance(self.value, GpuSpec) else self.value


@dataclass(frozen=True)
class Fix:
    changes: tuple[Change, ...]
    verdict: Verdict  # the deployment with the changes, planned again (it fits)

    @property
    def keeps_workload(self) -> bool:
        return not any(c.field in WORKLOAD_FIELDS for c in self.changes)

    @property
    def other_gpu(self) -> bool:
        return any(c.field == "gpu" for c in self.changes)

    @property
    def beyond_context(self) -> bool:
        """Serves longer requests than the model was configured for (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN):
        the engine starts, but the model's quality beyond its trained context is the user's risk."""
        return any(c.field.endswith("allow_long_max_model_len") for c in self.changes)


def apply(d: Deployment, changes: Iterable[Change]) -> Deployment:
    """`d` with each change's field set: "kv_cache_dtype", "gpu", "instances", or "<part>.<name>"."""
    for c in changes:
        part, _, name = c.field.partition(".")
        value: Any = c.value if not name else replace(getattr(d, part), **{name: c.value})
        d = replace(d, **{part: value})
    return d


def _current(d: Deployment, field: str) -> object:
    part, _, name = field.partition(".")
    return getattr(d, part) if not name else getattr(getattr(d, part), name)


def _valid_tps(d: Deployment) -> list[int]:
    """Wider tensor parallelism that divides the attention heads (what vLLM and SGLang require)."""
    heads, tp = d.model.num_attention_heads, d.parallelism.tp
    return [tp * k for k in TP_STEPS if tp * k <= MAX_TP and heads % (tp * k) == 0]


def _bigger_gpus(d: Deployment) -> list[GpuSpec]:
    """The common cards with more memory than this one, smallest first."""
    cards = [find_gpu(k) for k in COMMON_GPUS]
    bigger = {g.key: g for g in cards if g.total_memory_bytes > d.gpu.total_memory_bytes}
    return sorted(bigger.values(), key=lambda g: g.total_memory_bytes)


def _workload_keeping(d: Deployment, v: Verdict) -> Iterator[tuple[Change, ...]]:
    """Combinations of engine and hardware changes that leave the requests as asked."""
    engine = get_engine(d.engine.engine)
    knobs = engine.knobs
    refusal = v.account.refusal
    if refusal is not None and refusal.code == "tp_heads":
        heads = d.model.num_attention_heads
        for tp in (t for t in range(d.parallelism.tp - 1, 0, -1) if heads % t == 0):
            yield (Change("parallelism.tp", tp),)
            break
        for tp in _valid_tps(d)[:1] or [t for t in range(d.parallelism.tp + 1, MAX_TP + 1) if heads % t == 0][:1]:
            yield (Change("parallelism.tp", tp),)
        return
    if refusal is not None and refusal.code in ("kv_dtype", "kv_dtype_gpu"):
        yield (Change("kv_cache_dtype", "auto"),)
        if knobs.fp8_kv_dtype and d.kv_cache_dtype != knobs.fp8_kv_dtype:
            yield (Change("kv_cache_dtype", knobs.fp8_kv_dtype),)
        return
    if refusal is not None and refusal.code == "option" and refusal.field:
        default = getattr(engine.default_options(), refusal.field.partition(".")[2], None)
        yield (Change(refusal.field, default),)
        return
    if refusal is not None and refusal.code == "mamba_blocks" and knobs.request_cap:
        # One state block per decode sequence: as many sequences as the cache has blocks (vLLM's own advice),
        # or the blocks a larger utilization leaves (the general choices below).
        blocks = v.account.detail.get("num_gpu_blocks")
        if isinstance(blocks, int) and blocks > 0:
            yield (Change(knobs.request_cap, blocks),)
    if refusal is not None and refusal.code == "context" and knobs.long_context:
        yield (Change(knobs.long_context, True),)
    if refusal is not None and refusal.code in ("sampler_warmup_oom", "startup_free_memory", "kv_alloc_oom"):
        # The warm-up runs in the memory utilization leaves out: leave more (0.95 -> 0.93 ... 0.85), or warm
        # the sampler up over fewer requests (1,024 -> 512 -> 256). Memory other processes hold needs the
        # utilization lowered past it: further steps, down to 0.55 below the current one.
        account = v.account
        if knobs.utilization is not None and account.total_memory_bytes:
            util_now = account.requested_bytes / account.total_memory_bytes  # the engine's default if none given
            steps = (2, 4, 6, 8, 10) if refusal.code == "sampler_warmup_oom" else (2, 4, 6, 8, 10, 15, 20, 30, 40, 55)
            for step in steps:
                if util_now - step / 100 > 0.05:
                    yield (Change(knobs.utilization[0], round(util_now - step / 100, 2)),)
        if knobs.request_cap and account.request_cap:
            for share in (2, 4):
                yield (Change(knobs.request_cap, account.request_cap // share),)
    kv_choices: list[str | None] = [None]
    if knobs.fp8_kv_dtype and d.kv_cache_dtype.lower() in ("auto", "bf16", "bfloat16", "fp16", "float16"):
        kv_choices.append(knobs.fp8_kv_dtype)
    util_choices: list[float | None] = [None]
    if knobs.utilization is not None:
        field, high = knobs.utilization
        current = _current(d, field)
        if not isinstance(current, int | float) or current < high:
            util_choices.append(high)
    tp_choices: list[int | None] = [None, *_valid_tps(d)]
    for wider in tp_choices:
        for kv in kv_choices:
            for util in util_choices:
                changes = []
                if wider is not None:
                    changes.append(Change("parallelism.tp", wider))
                if kv is not None:
                    changes.append(Change("kv_cache_dtype", kv))
                if util is not None and knobs.utilization is not None:
                    changes.append(Change(knobs.utilization[0], util))
                if changes:
                    yield tuple(changes)
    for gpu in _bigger_gpus(d):
        yield (Change("gpu", gpu),)
        for kv in kv_choices[1:]:
            yield (Change("gpu", gpu), Change("kv_cache_dtype", kv))
    if v.limit == "request_cap" and knobs.request_cap:
        yield (Change(knobs.request_cap, v.requests_per_cache),)


def _with_replicas(d: Deployment, changes: tuple[Change, ...]) -> tuple[Change, ...] | None:
    """When one cache holds some requests but not the workload's share, enough instances to spread them."""
    try:
        trial = plan(apply(d, changes), detail=False)
    except KvplanError:
        return None
    if trial.fits or trial.account.refusal is not None:
        return None
    per_cache = trial.max_requests // trial.kv_caches
    if per_cache < 1:
        return None
    instances = -(-d.workload.concurrency // (per_cache * d.parallelism.dp))
    return (*changes, Change("instances", instances)) if instances > d.instances else None


def _largest(d: Deployment, field: str, high: int, ok: Callable[[Verdict], bool]) -> int:
    """The largest value in [1, high] of a workload field at which `d` fits and passes `ok` (0: none).

    Requests and context only ever need more memory as they grow, so bisect.
    """

    def passes(value: int) -> bool:
        try:
            trial = plan(apply(d, (Change(field, value),)), detail=False)
        except KvplanError:
            return False
        return trial.fits and ok(trial)

    if high < 1 or not passes(1):
        return 0
    lo, hi = 1, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid - 1)
    return lo


def _workload_shrinking(d: Deployment, ok: Callable[[Verdict], bool]) -> Iterator[tuple[Change, ...]]:
    """The most requests, and the longest context, that fit as asked otherwise (strictly less than asked)."""
    asked = (("workload.concurrency", d.workload.concurrency), ("workload.max_model_len", d.max_model_len))
    for field, current in asked:
        best = _largest(d, field, current - 1, ok)
        if best:
            yield (Change(field, best),)


def find_fixes(
    d: Deployment, v: Verdict, *, limit: int = 5, accept: Callable[[Verdict], bool] | None = None
) -> tuple[Fix, ...]:
    """Up to `limit` verified fixes: workload-keeping ones first. A fix must fit, and pass `accept` when given
    (`kvplan check --min-margin` asks for headroom too); a deployment that already passes gets none."""
    ok = accept or (lambda _: True)
    if v.fits and ok(v):
        return ()
    candidates: list[tuple[Change, ...]] = []
    for changes in _workload_keeping(d, v):
        candidates.append(changes)
        more = _with_replicas(d, changes)
        if more is not None:
            candidates.append(more)
    more = _with_replicas(d, ())
    if more is not None:
        candidates.append(more)
    candidates.extend(_workload_shrinking(d, ok))
    fixes: dict[tuple[tuple[str, object], ...], Fix] = {}
    for changes in candidates:
        changes = tuple(c for c in changes if c.value != _current(d, c.field))
        key = tuple((c.field, c.shown_value) for c in changes)
        if not changes or key in fixes:
            continue
        try:
            trial = plan(apply(d, changes), detail=False)
        except KvplanError:
            continue
        if trial.fits and ok(trial):
            fixes[key] = Fix(changes, trial)

    def rank(f: Fix) -> tuple:
        headroom = f.verdict.headroom_bytes or 0
        budget = f.verdict.kv_budget_bytes or 1
        weight = sum(_CHANGE_WEIGHT.get(c.field.partition(".")[0], 1) for c in f.changes)
        return (f.beyond_context, not f.keeps_workload, f.other_gpu, f.verdict.total_gpus, weight, -headroom / budget)

    return _pick(sorted(fixes.values(), key=rank), limit)


def _pick(ranked: list[Fix], limit: int) -> tuple[Fix, ...]:
    """The best of each kind first (same GPU, another GPU, a smaller workload), then the next best; a fix that
    only adds changes to one already picked, on as many GPUs, is left out."""
    picked: list[Fix] = []

    def redundant(f: Fix) -> bool:
        fields = {c.field for c in f.changes}
        return any(
            (set(p.changes) < set(f.changes) or {c.field for c in p.changes} == fields)
            and p.verdict.total_gpus <= f.verdict.total_gpus
            for p in picked
        )

    def kind(f: Fix) -> str:
        if not f.keeps_workload:
            return next(c.field for c in f.changes if c.field in WORKLOAD_FIELDS)
        return "other gpu" if f.other_gpu else "same gpu"

    for wanted in ("same gpu", "other gpu", *WORKLOAD_FIELDS):
        for f in ranked:
            if kind(f) == wanted and not redundant(f):
                picked.append(f)
                break
    for f in ranked:
        if len(picked) >= limit:
            break
        if f not in picked and not redundant(f):
            picked.append(f)
    return tuple(sorted(picked[:limit], key=ranked.index))
