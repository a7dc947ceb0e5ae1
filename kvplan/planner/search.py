"""The plan search: the deployments that hold a workload, over GPU type x shape x KV dtype x quantization.

Every candidate is a Deployment planned by kvplan.planner.verdict.plan, as `kvplan estimate` plans it, so an
option's flags replayed through estimate give its verdict. A shape is one engine instance: tp x pp GPUs,
and for MoE models data-parallel ranks with expert parallelism; replicas are as many instances as the
workload's requests need. Per GPU type, KV dtype and quantization the option kept is the one on the fewest
GPUs (then the most KV headroom); options are ranked by cost per hour where priced, else by GPUs, then
headroom.

Planning the whole catalog costs a few estimates, not hundreds: the model is parsed once and its per-layer
specs shared by every candidate (ModelSpec memoises them); a lower bound on each shape's GPUs (all weights,
plus every request's own KV at its unsplit bytes, over the GPUs' whole memory) drops unplanned the shapes
whose weights alone overflow their GPUs and those that cannot beat an option already found for their GPU
type; shapes are tried from the lowest bound up; one instance is planned without the longest-context
bisection and its replicas counted from what it holds, and only each GPU type's winners are planned again
with their replicas and in full.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field, replace

from kvplan.capacity.deployment import Deployment, EngineOptions, Parallelism, WeightsChoice, Workload
from kvplan.capacity.kv import KvRequest, estimate_kv
from kvplan.capacity.weights import estimate_weights
from kvplan.engines import get_engine
from kvplan.errors import FieldError, InputError, KvplanError
from kvplan.hardware.gpus import GpuSpec
from kvplan.hardware.prices import Price
from kvplan.model.dtypes import resolve_kv_dtype, serving_dtype
from kvplan.model.specs import ModelSpec
from kvplan.planner.fixes import Change, apply
from kvplan.planner.verdict import Verdict, plan
from kvplan.records import dataclass

MAX_GPUS_LIMIT = 1024
FP8 = "fp8"  # a KV dtype candidate meaning "the engine's 8-bit float KV cache" (vLLM fp8, SGLang fp8_e4m3)


@dataclass(frozen=True)
class SearchSpace:
    """What the search may choose from."""

    gpus: tuple[GpuSpec, ...]
    engine: str = "vllm"
    kv_cache_dtypes: tuple[str, ...] = ("auto", FP8)
    quantizations: tuple[str | None, ...] = (None,)
    max_gpus: int = 8
    gpus_per_node: int = 8

    def validate(self) -> None:
        if not self.gpus:
            raise FieldError("gpu", "name at least one GPU type")
        get_engine(self.engine)
        for name, value in (("max_gpus", self.max_gpus), ("gpus_per_node", self.gpus_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GPUS_LIMIT:
                raise FieldError(f"search.{name}", f"must be between 1 and {MAX_GPUS_LIMIT:,}", value)
        if not self.kv_cache_dtypes:
            raise FieldError("kv_cache_dtype", "name at least one KV cache dtype, e.g. auto")


@dataclass(frozen=True)
class PlanOption:
    """One deployment that holds the workload: its verdict (with its replicas) and what it costs."""

    verdict: Verdict
    price: Price | None

    @property
    def deployment(self) -> Deployment:
        return self.verdict.deployment

    @property
    def cost_per_hour(self) -> float | None:
        return None if self.price is None else self.price.usd_per_hour * self.verdict.total_gpus

    @property
    def headroom_share(self) -> float:
        """KV left after the workload's share, over the limiting pool's budget: 0.25 is 25% free."""
        budget, headroom = self.verdict.kv_budget_bytes, self.verdict.headroom_bytes
        return 0.0 if not budget or headroom is None else headroom / budget

    @property
    def kv_tokens(self) -> int | None:
        """Tokens the KV caches hold at once over every instance (the engine's own per-cache figure x caches)."""
        tokens = self.verdict.account.kv_cache_tokens
        return None if tokens is None else tokens * self.verdict.kv_caches

    @property
    def cost_per_million_kv_tokens(self) -> float | None:
        """Dollars per hour per million tokens of KV-resident capacity: what holding context costs here."""
        cost, tokens = self.cost_per_hour, self.kv_tokens
        return None if cost is None or not tokens else cost / (tokens / 1e6)


@dataclass
class SearchStats:
    """What the search did: candidates planned, and dropped without planning (the benchmark reads these)."""

    planned: int = 0
    pruned_weights: int = 0
    pruned_gpus: int = 0
    refused: int = 0


@dataclass(frozen=True)
class SearchResult:
    options: tuple[PlanOption, ...]  # best first
    stats: SearchStats
    unpriced: tuple[str, ...] = ()  # GPU types with options but no price
    notes: tuple[str, ...] = field(default_factory=tuple)


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def is_moe(model: ModelSpec) -> bool:
    return any(g.name == "experts" for g in model.param_groups)


def _dense_shapes(model: ModelSpec, space: SearchSpace) -> list[Parallelism]:
    """tp within a node (its all-reduce needs NVLink), pp across nodes if needed, up to the GPU limit."""
    out = []
    for tp in _powers_of_two(min(space.gpus_per_node, space.max_gpus)):
        for pp in _powers_of_two(space.max_gpus // tp):
            if pp <= model.num_layers:
                out.append(Parallelism(tp=tp, pp=pp))
    return out


def _vllm_shapes(model: ModelSpec, space: SearchSpace) -> list[Parallelism]:
    """Dense shapes; for MoE also data-parallel ranks with expert parallelism (vLLM's EP group is tp x dp):
    each rank keeps its own requests' KV, which matters most for MLA, whose latent tp does not split."""
    out = _dense_shapes(model, space)
    if is_moe(model):
        for tp in _powers_of_two(min(space.gpus_per_node, space.max_gpus)):
            for dp in _powers_of_two(space.max_gpus // tp)[1:]:
                out.append(Parallelism(tp=tp, dp=dp, expert_parallel=True))
    return out


def _sglang_shapes(model: ModelSpec, space: SearchSpace) -> list[Parallelism]:
    """Dense shapes; for MoE also experts spread over the tp ranks (--ep-size) and DP attention inside tp."""
    out = _dense_shapes(model, space)
    if is_moe(model):
        for tp in _powers_of_two(min(space.gpus_per_node, space.max_gpus))[1:]:
            out.append(Parallelism(tp=tp, ep_size=tp))
            out.append(Parallelism(tp=tp, dp=tp, dp_attention=True, ep_size=tp))
    return out


# Instance shapes per engine; an engine not listed (a new one) gets tp x pp.
SHAPES: dict[str, Callable[[ModelSpec, SearchSpace], list[Parallelism]]] = {
    "vllm": _vllm_shapes,
    "sglang": _sglang_shapes,
}


def _vllm_pin(v: Verdict) -> Change | None:
    """--kv-cache-memory-bytes at the planned budget, so the server starts with exactly the KV it was planned
    with. One flag sets every rank: with pipeline stages, whose budgets differ (the first holds the embedding,
    the last the sampler), no single value reproduces the plan, so none is pinned."""
    stages = v.account.detail.get("stages") or []
    if len(stages) != 1 or stages[0]["available_kv_cache_bytes"] <= 0:
        return None
    return Change("engine.kv_cache_memory_bytes", stages[0]["available_kv_cache_bytes"])


# Engines whose KV budget a flag can pin to the planned bytes, so the server starts with exactly that budget.
KV_PINS: dict[str, Callable[[Verdict], Change | None]] = {"vllm": _vllm_pin}


def _kv_dtype(engine: str, name: str) -> str | None:
    """A KV dtype candidate in the engine's spelling; None when the engine has no 8-bit float cache."""
    if name.lower() != FP8:
        return name
    return get_engine(engine).knobs.fp8_kv_dtype


@dataclass(frozen=True)
class _Found:
    deployment: Deployment  # with its replicas
    one_instance: Verdict  # the same deployment planned as one instance (the engine's account is the same)
    per_instance_gpus: int
    instances: int

    @property
    def total_gpus(self) -> int:
        return self.per_instance_gpus * self.instances


def _replicated(d: Deployment, v: Verdict, concurrency: int) -> int | None:
    """Instances needed for the workload, from what one instance's caches hold (None: it holds none)."""
    per_cache = v.max_requests // v.kv_caches if v.kv_caches else 0
    if v.account.refusal is not None or per_cache < 1:
        return None
    per_instance = per_cache * d.parallelism.dp
    return -(-concurrency // per_instance)


def _weights_lower_bound(model: ModelSpec, quantization: str | None) -> int:
    """Bytes of all weights as served: the ranks of an instance hold at least this between them (replicating
    attention over data-parallel ranks only adds)."""
    dtype = serving_dtype(model.config_dtype)
    return estimate_weights(model, dtype=dtype, quantization=quantization).total_bytes


def _kv_lower_bound(model: ModelSpec, workload: Workload, kv: str) -> int:
    """Bytes of KV one request needs at the least, whatever the engine: the resident tokens it keeps on its own
    (max-model-len less a shared prefix) at the dtype's bytes, unsplit. Engines round to blocks and replicate
    heads beyond tp, which only adds. 0 when the dtype is one kvplan cannot size (the engine refuses it)."""
    try:
        kv_dtype = resolve_kv_dtype(kv, serving_dtype(model.config_dtype))
    except InputError:
        return 0
    length = (workload.max_model_len or model.max_position_embeddings or 1) - workload.shared_prefix_tokens
    return estimate_kv(model, kv_dtype, KvRequest(seq_tokens=max(1, length))).model_contiguous_bytes_per_request


def _kv_replicated(model: ModelSpec) -> Callable[[int], bool]:
    """Whether tp ranks would each hold a copy of some KV: an MLA latent (tp does not split it), or fewer KV heads
    than ranks (Qwen3-30B-A3B's 4 KV heads on 8 ranks: each head on two)."""
    heads = [h for h in (getattr(s, "num_kv_heads", None) for s in model.layers) if h]
    fewest = min(heads) if heads else None
    mla = any(getattr(s, "kind", "") == "mla" for s in model.layers)
    return lambda tp: mla or (fewest is not None and tp > fewest)


def _fewest_instances(shape_ranks: int, gpu: GpuSpec, weights_bytes: int, kv_bytes: int, concurrency: int) -> int:
    """Instances the workload needs at the least: one instance's ranks hold all the weights and keep at most
    the rest of their memory for KV. 0 when the weights alone fill its GPUs.

    Llama-3.3-70B in bf16 (131 GiB) on two H100s (2 x 79.19 GiB): 27.4 GiB left for KV; 50 requests of
    16,000 tokens at 320 KiB a token need 244 GiB, so at least 9 instances, 18 GPUs.
    """
    room = shape_ranks * gpu.total_memory_bytes - weights_bytes
    if room <= 0:
        return 0
    return max(1, -(-concurrency * kv_bytes // room))


def _candidates(
    model: ModelSpec, workload: Workload, gpu: GpuSpec, options: EngineOptions, kv: str, quantization: str | None,
    shapes: Sequence[Parallelism], space: SearchSpace, weights_bytes: int, replicated: Callable[[int], bool],
    stats: SearchStats,
) -> list[_Found]:
    """The shapes on `gpu` that hold the workload on the fewest GPUs, each with its replicas."""
    engine = get_engine(space.engine)
    kv_bytes = _kv_lower_bound(model, workload, kv)
    bounded = []
    for shape in shapes:
        ranks = shape.tp * shape.pp * (1 if shape.dp_attention else shape.dp)
        fewest = _fewest_instances(ranks, gpu, weights_bytes, kv_bytes, workload.concurrency)
        if not fewest:
            stats.pruned_weights += 1
            continue
        bounded.append((fewest * engine.gpus_per_instance(shape), shape))
    best: list[_Found] = []
    best_total = space.max_gpus
    # Most promising first: the fewest GPUs the bound allows, then fewer pipeline stages. A shape whose bound
    # reaches the best found so far can at most tie it: it is planned only to trade pipeline stages away, or
    # to try data-parallel ranks instead of tensor-parallel ones (an MLA latent, which tp does not split,
    # fits more requests per GPU when each rank keeps only its own requests).
    for least_gpus, shape in sorted(bounded, key=lambda b: (b[0], b[1].pp, engine.gpus_per_instance(b[1]))):
        per_instance = engine.gpus_per_instance(shape)
        tie = bool(best) and least_gpus == best_total
        dp_worth_trying = shape.dp not in {f.deployment.parallelism.dp for f in best} and any(
            replicated(f.deployment.parallelism.tp) for f in best)
        if least_gpus > best_total or (tie and shape.pp >= min(f.deployment.parallelism.pp for f in best)
                                       and not dp_worth_trying):
            stats.pruned_gpus += 1
            continue
        d = Deployment(model=model, gpu=gpu, engine=options, workload=workload, parallelism=shape,
                       weights=WeightsChoice(quantization=quantization), kv_cache_dtype=kv)
        stats.planned += 1
        try:
            v = plan(d, detail=False)
        except KvplanError:
            stats.refused += 1
            continue
        instances = _replicated(d, v, workload.concurrency)
        if instances is None:
            stats.refused += v.account.refusal is not None
            continue
        found = _Found(replace(d, instances=instances), v, per_instance, instances)
        if found.total_gpus > best_total:
            continue
        if found.total_gpus < best_total:
            best, best_total = [], found.total_gpus
        best.append(found)
    return best


def _winner(tied: list[_Found], engine: str, stats: SearchStats) -> Verdict | None:
    """Of the candidates on the fewest GPUs: the fewest pipeline stages (each token crosses every stage in
    turn, so stages add latency), then the most KV headroom with its replicas; its KV budget pinned where the
    engine allows, and planned in full (the longest context, the workload figure). A lone candidate needs no
    comparison: its one-instance account (replicas do not change it) gives the pin."""
    if not tied:
        return None
    best = tied[0]
    if len(tied) > 1:
        verdicts = []
        for found in tied:
            stats.planned += 1
            verdicts.append((plan(found.deployment, detail=False), found))
        fitting = [(v, f) for v, f in verdicts if v.fits]
        if not fitting:
            return None
        best = min(fitting, key=lambda vf: (vf[1].deployment.parallelism.pp,
                                            -PlanOption(vf[0], None).headroom_share))[1]
    pin = KV_PINS.get(engine)
    change = pin(best.one_instance) if pin is not None else None
    if change is not None:
        stats.planned += 1
        pinned = plan(apply(best.deployment, (change,)))
        if pinned.fits:
            return pinned
    stats.planned += 1
    final = plan(best.deployment)
    return final if final.fits else None


def _rank(option: PlanOption) -> tuple:
    cost = option.cost_per_hour
    return (cost is None, cost or 0.0, option.verdict.total_gpus, -option.headroom_share,
            option.deployment.gpu.key, option.deployment.kv_cache_dtype)


def search(model: ModelSpec, workload: Workload, space: SearchSpace, options: EngineOptions | None = None,
           prices: dict[str, Price] | None = None) -> SearchResult:
    """Every option that holds `workload`, best first (see the module docstring)."""
    space.validate()
    engine = get_engine(space.engine)
    options = options or engine.default_options()
    prices = prices or {}
    notes: list[str] = []
    kv_names: list[str] = []
    for name in space.kv_cache_dtypes:
        spelled = _kv_dtype(space.engine, name)
        if spelled is None:
            notes.append(f"{engine.label} has no 8-bit float KV cache in kvplan's model: {name} left out")
        elif spelled not in kv_names:
            kv_names.append(spelled)
    quantizations = list(dict.fromkeys(space.quantizations))
    if model.quant is not None and any(quantizations):
        notes.append(f"{model.name} is already quantized ({model.quant.method}): runtime quantization left out")
        quantizations = [None]
    shapes = SHAPES.get(space.engine, _dense_shapes)(model, space)
    weights = {q: _weights_lower_bound(model, q) for q in quantizations}
    replicated = _kv_replicated(model)
    stats = SearchStats()
    found: list[PlanOption] = []
    for gpu in space.gpus:
        for kv in kv_names:
            for q in quantizations:
                tied = _candidates(model, workload, gpu, options, kv, q, shapes, space, weights[q], replicated,
                                   stats)
                best = _winner(tied, space.engine, stats)
                if best is not None:
                    found.append(PlanOption(best, prices.get(gpu.key)))
    ranked = tuple(sorted(found, key=_rank))
    unpriced = tuple(dict.fromkeys(o.deployment.gpu.key for o in ranked if o.price is None))
    return SearchResult(ranked, stats, unpriced, tuple(notes))
