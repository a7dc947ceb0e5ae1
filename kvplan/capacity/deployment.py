"""One deployment, as every command sees it: the model, the workload, parallelism, the GPU, weights, the engine.

`kvplan estimate` builds one from flags, `kvplan check` from a deployment file, `kvplan plan` from each
candidate it searches; the engine registry (kvplan.engines) turns it into one capacity account, and the
planner (kvplan.planner) into one verdict. Values are validated here with errors that name the field
(`workload.max_model_len`), never a flag: each front end says the field its own way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, field, is_dataclass
from typing import ClassVar, Protocol

from kvplan.errors import FieldError, InputError
from kvplan.hardware.gpus import GpuSpec
from kvplan.model.dtypes import kv_dtype_problem, resolve_kv_dtype, served_dtype
from kvplan.model.specs import ModelSpec
from kvplan.records import dataclass

# Bounds far beyond any real deployment; a value past them is a typo or an attack, and would only make the
# arithmetic slow (a 400-digit --seq). Llama 4 Scout's 10M-token context is the longest real one.
MAX_CONTEXT_TOKENS = 1 << 30
MAX_CONCURRENCY = 10**8
MAX_PARALLEL = 4096
MAX_INSTANCES = 100_000
# Observed request lengths read from a file: a day of traffic logs fits; a million-line file is still read in
# about a second, and more adds nothing to a mean.
MAX_MIX_REQUESTS = 1_000_000


def check_int(name: str, value: object, low: int, high: int) -> int:
    """An integer field within [low, high], or a FieldError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, "must be a whole number", repr(value)[:40])
    if not low <= value <= high:
        digits = len(str(abs(value))) if abs(value) < 10**4000 else "4000+"
        shown = value if abs(value) < 10**15 else f"(a {digits}-digit number)"
        raise FieldError(name, f"must be between {low:,} and {high:,}", shown)
    return value


@dataclass(frozen=True)
class RequestMix:
    """Requests as they really come, as a histogram of their lengths (prompt + answer tokens).

    From mean lengths (--input-len 2,000 --output-len 500) it is one request of 2,500 tokens; from a file of
    observed lengths, one entry per distinct length with how many requests had it. A request keeps its prompt
    and, by its last token, its whole answer in the KV cache. Build it with `RequestMix.of(pairs)`, which checks
    every pair once: a mix may hold a million requests and every plan() validates its deployment.
    """

    totals: tuple[tuple[int, int], ...]  # (prompt + answer tokens, requests that long), shortest first
    mean_input_tokens: float
    mean_output_tokens: float
    shortest_prompt_tokens: int
    source: str = "means"  # where the lengths came from, for people: "means", "lengths.jsonl"

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]], source: str = "means") -> RequestMix:
        """The mix of (prompt, answer) token pairs, each checked: prompts of 1 token or more, answers of 0 or more."""
        counts: dict[int, int] = {}
        n = prompts = answers = 0
        shortest = MAX_CONTEXT_TOKENS
        for prompt, answer in pairs:
            check_int("workload.mix.input_tokens", prompt, 1, MAX_CONTEXT_TOKENS)
            check_int("workload.mix.output_tokens", answer, 0, MAX_CONTEXT_TOKENS)
            n += 1
            if n > MAX_MIX_REQUESTS:
                raise FieldError("workload.mix", f"holds more than {MAX_MIX_REQUESTS:,} requests")
            counts[prompt + answer] = counts.get(prompt + answer, 0) + 1
            prompts, answers, shortest = prompts + prompt, answers + answer, min(shortest, prompt)
        if not n:
            raise FieldError("workload.mix", "holds no request lengths; give --input-len and --output-len")
        return cls(tuple(sorted(counts.items())), prompts / n, answers / n, shortest, source)

    @property
    def requests(self) -> int:
        return sum(n for _, n in self.totals)

    def validate(self) -> None:
        if not self.totals or any(length < 1 or n < 1 for length, n in self.totals):
            raise FieldError("workload.mix", "holds no request lengths; give --input-len and --output-len")


@dataclass(frozen=True)
class Workload:
    """What the server must hold at once: `concurrency` requests of up to `max_model_len` tokens each.

    max_model_len None means the engine's default: the context the model's config states.
    shared_prefix_tokens: a prompt prefix common to requests (a system prompt), stored once per instance where
    the engine caches prefixes (whole blocks/pages of it only); prefix_hit_rate: the share of requests that
    find it cached (1.0: every one). mix: the requests' real lengths, for the workload figure beside the
    max-model-len one (kvplan.planner.workload).
    """

    max_model_len: int | None = None
    concurrency: int = 1
    shared_prefix_tokens: int = 0
    prefix_hit_rate: float = 1.0
    mix: RequestMix | None = None

    def validate(self) -> None:
        if self.max_model_len is not None:
            check_int("workload.max_model_len", self.max_model_len, 1, MAX_CONTEXT_TOKENS)
        check_int("workload.concurrency", self.concurrency, 1, MAX_CONCURRENCY)
        check_int("workload.shared_prefix_tokens", self.shared_prefix_tokens, 0, MAX_CONTEXT_TOKENS)
        rate = self.prefix_hit_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise FieldError("workload.prefix_hit_rate", "must be a share between 0 and 1, such as 0.8",
                             repr(rate)[:40])
        if self.mix is not None:
            self.mix.validate()
            if self.shared_prefix_tokens > self.mix.shortest_prompt_tokens:
                raise FieldError(
                    "workload.shared_prefix_tokens",
                    f"is longer than the shortest prompt of the request mix ({self.mix.shortest_prompt_tokens:,} "
                    "tokens): the prefix is part of every prompt",
                    self.shared_prefix_tokens,
                )


@dataclass(frozen=True)
class Parallelism:
    """How one engine instance splits the model over GPUs.

    tp: tensor-parallel ranks; pp: pipeline stages; dp: data-parallel ranks inside the instance (vLLM
    --data-parallel-size, SGLang --dp), each with its own KV cache and share of the requests;
    dp_attention: SGLang's DP attention, where the dp ranks live inside the tp group (tp GPUs in all) and each
    holds whole attention weights and its own requests' KV; expert_parallel: MoE experts split over the
    expert-parallel group instead of tensor-split (vLLM --enable-expert-parallel: the group is tp x dp);
    ep_size: SGLang's --ep-size (None: the engine's default).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    expert_parallel: bool = False
    ep_size: int | None = None

    def validate(self) -> None:
        check_int("parallelism.tp", self.tp, 1, MAX_PARALLEL)
        check_int("parallelism.pp", self.pp, 1, MAX_PARALLEL)
        check_int("parallelism.dp", self.dp, 1, MAX_PARALLEL)
        if self.ep_size is not None:
            check_int("parallelism.ep_size", self.ep_size, 1, MAX_PARALLEL)


@dataclass(frozen=True)
class WeightsChoice:
    """How the weights are served: dtype, runtime quantization, a measured checkpoint size, CPU offload."""

    dtype: str | None = None  # served dtype; None: the engine's reading of the config (float32 served as bf16)
    quantization: str | None = None  # runtime quantization of an unquantized checkpoint (vLLM --quantization fp8)
    checkpoint_bytes: int | None = None  # the checkpoint's measured size (safetensors headers, --weights-bytes)
    checkpoint_source: str = ""  # where checkpoint_bytes came from, for people
    cpu_offload_bytes: int = 0  # weights kept in CPU memory per GPU (vLLM --cpu-offload-gb)

    def validate(self) -> None:
        if self.dtype is not None:
            try:
                served_dtype(self.dtype)
            except InputError:
                raise FieldError(
                    "weights.dtype",
                    "is not a dtype engines serve in (auto, float16, bfloat16, float32); for fp8 weights set the "
                    "quantization to fp8, for an fp8 KV cache the KV cache dtype",
                    self.dtype,
                ) from None
        if self.checkpoint_bytes is not None:
            check_int("weights.checkpoint_bytes", self.checkpoint_bytes, 1, 1 << 50)
        check_int("weights.cpu_offload_bytes", self.cpu_offload_bytes, 0, 1 << 50)


@dataclass(frozen=True)
class BoxProfile:
    """Terms measured on the user's own box from its engine log (`kvplan calibrate --save`), used instead of
    the modelled ones where they apply (same GPU and tensor-parallel size; weights and the activation peak
    only for the same model and step size). None: not measured, the model's figure stands."""

    source: str  # the log it came from, for people
    engine: str
    engine_version: str | None = None
    vllm_engine: str | None = None  # "v0" or "v1": the vLLM engine that printed the log
    gpu_name: str | None = None  # as the log names the device
    total_memory_bytes: int | None = None
    tp: int = 1
    pp: int = 1
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    model: str | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    weights_bytes: int | None = None  # per rank
    activation_peak_bytes: int | None = None  # per rank, at max_num_batched_tokens / max_num_seqs
    # Model Runner V2's sampler state inside the logged budget (0.27+ counts it in the consumed memory; a budget
    # that does not count it holds 0), for the same model and max_num_seqs; non_torch_bytes is net of it.
    sampler_state_bytes: int | None = None


def options_dict(options: object) -> dict[str, object]:
    """An engine's options as JSON values; nested option records (vLLM's LoRA slots) as objects of their fields."""
    return {k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in vars(options).items()}


class EngineOptions(Protocol):
    """An engine's own options (kvplan.engines.<engine>): a frozen dataclass naming its engine."""

    engine: ClassVar[str]

    def validate(self) -> None: ...


@dataclass(frozen=True)
class Deployment:
    """One model server: `instances` identical engine instances sharing the workload's requests."""

    model: ModelSpec
    gpu: GpuSpec
    engine: EngineOptions
    workload: Workload = field(default_factory=Workload)
    parallelism: Parallelism = field(default_factory=Parallelism)
    weights: WeightsChoice = field(default_factory=WeightsChoice)
    kv_cache_dtype: str = "auto"
    instances: int = 1
    profile: BoxProfile | None = None  # measured terms of the user's own box (kvplan calibrate)
    # Memory other processes already hold on each GPU. Engines differ in what they make of it: some charge it,
    # some refuse to start, V0 sizes its cache blind to it and then cannot allocate it (docs/engine-rules.md 1.18).
    gpu_in_use_bytes: int = 0

    def validate(self) -> None:
        self.workload.validate()
        check_int("gpu.in_use_bytes", self.gpu_in_use_bytes, 0, self.gpu.total_memory_bytes - 1)
        self.parallelism.validate()
        self.weights.validate()
        self.engine.validate()
        check_int("instances", self.instances, 1, MAX_INSTANCES)
        try:
            resolve_kv_dtype(self.kv_cache_dtype, "bfloat16")
        except InputError:
            raise FieldError("kv_cache_dtype", kv_dtype_problem(self.kv_cache_dtype), self.kv_cache_dtype) from None
        if self.workload.shared_prefix_tokens >= self.max_model_len:
            raise FieldError(
                "workload.shared_prefix_tokens",
                f"must be shorter than the request length {self.max_model_len:,}: each request generates "
                "tokens of its own",
                self.workload.shared_prefix_tokens,
            )
        mix = self.workload.mix
        if mix is not None and mix.totals[0][0] > self.max_model_len:
            raise FieldError(
                "workload.mix",
                f"every request is longer than the {self.max_model_len:,} tokens one may hold (the shortest, prompt "
                f"and answer, is {mix.totals[0][0]:,}); shorten them or raise the max-model-len",
            )

    @property
    def max_model_len(self) -> int:
        """Tokens per request: the workload's, else the model's stated context."""
        if self.workload.max_model_len is not None:
            return self.workload.max_model_len
        if self.model.max_position_embeddings is None:
            raise FieldError("workload.max_model_len", f"{self.model.name} states no max context; give one")
        return self.model.max_position_embeddings

    @property
    def requests_per_instance(self) -> int:
        """The share of the workload one instance must hold: 40 requests over 4 instances -> 10 each."""
        return -(-self.workload.concurrency // self.instances)
