"""One rank's verify: check the cache against a recomputation, allocate it measured, decode through it, time it."""

from __future__ import annotations

import statistics
from types import ModuleType
from typing import Any

from kvplan.errors import DeviceError, KvplanError
from kvplan.hardware.gpus import find_gpu
from kvplan.records import dataclass
from kvplan.units import fmt_bytes
from kvplan.verify.alloc import LayerCache, TokenCache, allocate
from kvplan.verify.decode import Decoder, Reduce, StepLog
from kvplan.verify.device import device_label, free_bytes, import_torch, is_oom, pick_device, release, torch_dtype
from kvplan.verify.measure import ByteMeter, copy_bandwidth, peak_bytes, reserved_bytes, reset_peak, sync, timed
from kvplan.verify.setup import VerifySetup, replan
from kvplan.verify.storage import ROUNDOFF

CHECK_MIN_TOKENS = 48  # the correctness check's length when no window asks for more
CHECK_MAX_TOKENS = 512  # beyond this a full recomputation on a CPU gets slow; longer windows are not wrapped
TOKENS_PER_CHUNK = 65_536  # prefill / recompute this many tokens at a time (requests per chunk = this // seq)
# Relative error (norm of the difference over the norm) allowed between cached decode and recomputation.
# The check computes in float32, but both paths round K and V to the cache's format, and the two compute
# K and V with different kernels (one token against 48 at once), whose last float32 bits differ. Where such
# a difference crosses a rounding boundary the stored element moves by a whole step of the format; few do,
# so the output moves by far less than one roundoff. The bound is the format's roundoff, and never below
# float32's summation-order noise.
# Measured on an H200, bf16 cache: Llama-3.1-8B 2.3e-4 and DeepSeek-V2-Lite 7.3e-5, against 2^-8 = 3.9e-3.
FLOAT32_TOLERANCE = 1e-4


def check_tolerance(kv_dtype: str) -> float:
    """The relative error the decode check allows with a cache of this format: bf16 -> 2^-8 = 3.9e-3."""
    return max(FLOAT32_TOLERANCE, ROUNDOFF[kv_dtype])


@dataclass(frozen=True)
class KindBytes:
    kind: str
    layers: int
    predicted_bytes: int
    measured_bytes: int
    tensor_bytes: int

    @property
    def matches(self) -> bool:
        return self.predicted_bytes == self.measured_bytes


@dataclass(frozen=True)
class DecodeCheck:
    """Cached decode against a full recomputation at a short length, and the cache's growth per step."""

    seq_tokens: int
    batch: int
    steps: int
    rel_error: float
    tolerance: float
    outputs_match: bool
    growth_ok: bool  # every step stored exactly one more token until a window's ring was full
    visibility_ok: bool  # every query saw exactly its window / chunk / history
    windows_wrapped: bool  # the check ran past at least one window or chunk, so the ring turned

    @property
    def passed(self) -> bool:
        return self.outputs_match and self.growth_ok and self.visibility_ok


@dataclass(frozen=True)
class DecodeResult:
    prompt_tokens: int
    steps: int
    decoded_layers: int
    total_layers: int
    step_seconds: float  # median over the steps
    tokens_per_s: float  # batch / step_seconds
    kv_read_bytes_per_step: int  # at the last step
    bandwidth_bytes_per_s: float
    recompute_seconds: float  # one forward over seq tokens without a cache, same layers and batch
    speedup: float
    peak_bytes: int
    peak_what: str


@dataclass(frozen=True)
class RankResult:
    rank: int
    world: int
    device: str
    kinds: tuple[KindBytes, ...]
    reserved_bytes: int | None
    free_before_bytes: int | None
    workspace_bytes: int
    weights_bytes: int
    check: DecodeCheck | None
    decode: DecodeResult | None
    copy_bandwidth_bytes_per_s: float
    peak_bandwidth_bytes_per_s: int | None
    peak_bandwidth_source: str

    @property
    def predicted_bytes(self) -> int:
        return sum(k.predicted_bytes for k in self.kinds)

    @property
    def measured_bytes(self) -> int:
        return sum(k.measured_bytes for k in self.kinds)

    @property
    def passed(self) -> bool:
        return all(k.matches for k in self.kinds) and (self.check is None or self.check.passed)


def workspace_bytes(setup: VerifySetup) -> int:
    """An upper estimate of what decode needs beside the cache, for the refusal before allocating.

    Per chunk of prefill tokens: the hidden stream, queries and outputs of every query head, and K/V expanded to
    them (8 vectors of the widest shape, at 4 bytes), plus a window mask of seq^2 bytes, plus weights of
    4 * hidden * (q_heads * head_dim) per distinct layer shape at 4 bytes.
    """
    model = setup.model
    seq = setup.seq_tokens
    rows = max(1, min(setup.batch, TOKENS_PER_CHUNK // seq))
    width = max([model.hidden_size] + [_q_width(setup, p.spec) for p in setup.layers])
    activations = rows * seq * width * 8 * 4
    mask = rows * seq * seq if any(p.spec.window_tokens is not None for p in setup.layers) else 0
    shapes = {repr(p.spec) for p in setup.layers}
    weights = len(shapes) * 4 * model.hidden_size * width * 4
    return activations + mask + weights


def _q_width(setup: VerifySetup, spec: Any) -> int:
    heads = setup.model.num_attention_heads
    dim: int = getattr(spec, "latent_dim", None) or getattr(spec, "head_dim", None) or 0
    return heads * dim


def _peak_bandwidth(torch: ModuleType, device: Any, gpu: str | None) -> tuple[int | None, str]:
    name = gpu or (torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    if not name:
        return None, "no GPU catalog entry for the host CPU"
    try:
        spec = find_gpu(name)
    except KvplanError:
        return None, f"'{name}' is not in the GPU catalog"
    return spec.bandwidth_bytes_per_s, spec.bandwidth_source or f"{spec.display_name}: no bandwidth figure"


def _refuse_if_too_big(setup: VerifySetup, need_bytes: int, free: int | None, device: str, free_what: str) -> None:
    cap = setup.request.gpu_mem_bytes
    limit = free if cap is None else (cap if free is None else min(free, cap))
    if limit is None or need_bytes <= limit:
        return
    kv = sum(setup.predicted_bytes_by_kind().values())
    fraction = max(0.01, int(limit / need_bytes * setup.request.fraction * 100) / 100)
    source = "--gpu-mem" if cap is not None and (free is None or cap <= free) else free_what
    raise DeviceError(
        f"the planned KV cache ({fmt_bytes(kv)}) plus decode workspace ({fmt_bytes(need_bytes - kv)}) needs "
        f"{fmt_bytes(need_bytes)} but {device} has {fmt_bytes(limit)} {source}; nothing was allocated. "
        f"Lower --batch or --seq, or pass --fraction {fraction:g}"
    )


def compute_dtype(torch: ModuleType, setup: VerifySetup, device: Any) -> Any:
    """The served dtype on a GPU; float32 on the host, where bf16 matmuls without bf16 units run ~100x slower
    (2.3 s for an 80 x 2048 x 2048 product on a 2-core CI runner). The cache keeps the KV dtype either way."""
    return torch_dtype(torch, setup.dtype) if device.type == "cuda" else torch.float32


def _rows_per_chunk(batch: int, seq: int) -> int:
    return max(1, min(batch, TOKENS_PER_CHUNK // seq))


def run_check(torch: ModuleType, setup: VerifySetup, device: Any, reduce: Reduce | None) -> DecodeCheck:
    """Decode through freshly allocated caches at a short length in float32 and compare with recomputation."""
    windows = [w for p in setup.layers if (w := p.spec.window_tokens) is not None]
    steps = setup.request.steps
    want = max([CHECK_MIN_TOKENS, steps + 8] + [w + steps + 8 for w in windows])
    seq = min(setup.seq_tokens, min(want, max(CHECK_MAX_TOKENS, steps + 8)))
    small = replan(setup, seq, min(setup.batch, 2))
    caches = allocate(torch, small, device)
    dec = Decoder(torch, small, caches, device, torch.float32, reduce=reduce, decode_layers=setup.request.decode_layers)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(small.batch, seq, small.model.hidden_size, generator=gen).to(device)
    prompt = seq - steps
    dec.prefill(x[:, :prompt], small.batch)
    log = StepLog()
    outs = [dec.decode_one_token(x[:, prompt + t], prompt + t, log) for t in range(steps)]
    cached = torch.stack(outs, 1)
    ref = dec.recompute(x, small.batch)[:, prompt:]
    rel = float((cached - ref).norm() / ref.norm().clamp_min(1e-30))
    visibility_ok = all(
        seen == dec.expected_seen(i, prompt + t) for t, step in enumerate(log.seen) for i, seen in step.items()
    )
    growth_ok = True
    for t, step in enumerate(log.stored):
        pos = prompt + t
        for i, grew in step.items():
            cache = caches[i]
            assert isinstance(cache, TokenCache)
            # One more token per step until the ring is full; then the newest replaces the oldest (a paged ring
            # drops a whole block when it enters a new one).
            growth_ok &= grew == 1 if pos < cache.slots else grew <= 1
    wrapped = any(w < seq for w in windows)
    del caches, dec
    release(torch, device)
    tol = check_tolerance(setup.kv_dtype.name)
    return DecodeCheck(seq, small.batch, steps, rel, tol, rel <= tol, growth_ok, visibility_ok, wrapped)


def run_rank(setup: VerifySetup, *, rank: int = 0, world: int = 1, device_index: int | None = None,
             reduce: Reduce | None = None, progress: Any = None) -> RankResult:
    """Everything one rank measures. Memory is freed on every way out (error, out-of-memory, Ctrl-C)."""
    torch = import_torch()
    device = pick_device(torch, setup.request.device, rank if device_index is None else device_index)
    label = device_label(torch, device)
    torch.manual_seed(0)
    predicted = setup.predicted_bytes_by_kind()
    workspace = workspace_bytes(setup)
    free, free_what = free_bytes(torch, device)
    _refuse_if_too_big(setup, sum(predicted.values()) + workspace, free, label, free_what)

    try:
        check = run_check(torch, setup, device, reduce) if setup.request.check else None
    except Exception as exc:
        release(torch, device)
        if not is_oom(exc):
            raise
        raise DeviceError(
            f"out of memory on {label} during the correctness check, before the planned cache was allocated; "
            "memory freed. Pass --no-check, --fraction below 1, or lower --batch / --seq"
        ) from None

    meter = ByteMeter(torch, device)
    caches: list[LayerCache | None] = []
    stage = "allocating"
    done = 0
    total = len(setup.layers)
    task = progress.add_task(f"rank {rank}: allocating {total} layers", total=total) if progress else None

    def on_layer(plan: Any, cache: LayerCache | None) -> None:
        nonlocal done
        meter.add(plan.kind, [] if cache is None else cache.tensors())
        caches.append(cache)
        done += 1
        if progress:
            progress.advance(task)

    try:
        allocate(torch, setup, device, before_layer=meter.start, on_layer=on_layer)
        reserved = reserved_bytes(torch, device)
        stage = "decoding"
        dtype = compute_dtype(torch, setup, device)
        dec = Decoder(torch, setup, caches, device, dtype, seed=1 + rank, reduce=reduce,
                      decode_layers=setup.request.decode_layers)
        decode = _decode(torch, setup, dec, device, progress, rank)
        weights = dec.weights.nbytes()
    except KeyboardInterrupt:
        caches.clear()
        release(torch, device)
        raise DeviceError(f"interrupted while {stage} ({done} of {total} layers allocated); memory freed") from None
    except Exception as exc:
        if not is_oom(exc):
            caches.clear()
            release(torch, device)
            raise
        caches.clear()
        release(torch, device)
        got = meter.measured_bytes
        raise DeviceError(
            f"out of memory on {label} while {stage}, after {done} of {total} layers "
            f"({fmt_bytes(got)} of {fmt_bytes(sum(predicted.values()))} planned); memory freed. "
            "Pass --fraction below 1 or lower --batch / --seq"
        ) from None
    kinds = tuple(
        KindBytes(kind, meter.kinds[kind].layers if kind in meter.kinds else 0, predicted_bytes,
                  meter.kinds[kind].measured_bytes if kind in meter.kinds else 0,
                  meter.kinds[kind].tensor_bytes if kind in meter.kinds else 0)
        for kind, predicted_bytes in predicted.items()
    )
    extra = tuple(
        KindBytes(kind, t.layers, 0, t.measured_bytes, t.tensor_bytes) for kind, t in meter.kinds.items()
        if kind not in predicted
    )
    caches.clear()
    del dec
    release(torch, device)
    copy_bytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    try:
        copy_bw = copy_bandwidth(torch, device, copy_bytes)
    except Exception as exc:
        release(torch, device)
        if not is_oom(exc):
            raise
        raise DeviceError(
            f"out of memory on {label} measuring copy bandwidth with two {fmt_bytes(copy_bytes)} buffers, after "
            "the cache was measured; memory freed. Free some device memory and run again"
        ) from None
    peak_bw, peak_src = _peak_bandwidth(torch, device, setup.request.gpu)
    return RankResult(
        rank=rank, world=world, device=label, kinds=kinds + extra, reserved_bytes=reserved,
        free_before_bytes=free, workspace_bytes=workspace, weights_bytes=weights, check=check, decode=decode,
        copy_bandwidth_bytes_per_s=copy_bw, peak_bandwidth_bytes_per_s=peak_bw, peak_bandwidth_source=peak_src,
    )


def _decode(torch: ModuleType, setup: VerifySetup, dec: Decoder, device: Any, progress: Any,
            rank: int) -> DecodeResult:
    """Prefill seq - steps tokens, time `steps` cached decode steps, then one uncached recomputation."""
    steps = setup.request.steps
    seq = setup.seq_tokens
    prompt = seq - steps
    hidden = setup.model.hidden_size
    batch = setup.batch
    rows = _rows_per_chunk(batch, seq)
    gen = torch.Generator(device=device).manual_seed(11)

    def tokens(n_rows: int, n: int) -> Any:
        return torch.randn(n_rows, n, hidden, generator=gen, device=device, dtype=dec.dtype)

    for start in range(0, batch, rows):
        chunk = slice(start, min(start + rows, batch))
        dec.forward(tokens(chunk.stop - chunk.start, prompt), 0, chunk, use_cache=True)
    task = progress.add_task(f"rank {rank}: decoding {steps} steps", total=steps) if progress else None
    reset_peak(torch, device)
    log = StepLog()
    times = []
    for t in range(steps):
        x = tokens(batch, 1)[:, 0]
        _, seconds = timed(torch, device, lambda x=x, t=t: dec.decode_one_token(x, prompt + t, log))
        times.append(seconds)
        if progress:
            progress.advance(task)
    peak, peak_what = peak_bytes(torch, device)
    step_s = statistics.median(times)
    kv_read = log.kv_read_bytes[-1]

    def recompute() -> None:
        for start in range(0, batch, rows):
            chunk = slice(start, min(start + rows, batch))
            dec.forward(tokens(chunk.stop - chunk.start, seq), 0, chunk, use_cache=False)

    _, recompute_s = timed(torch, device, recompute)
    sync(torch, device)
    return DecodeResult(
        prompt_tokens=prompt, steps=steps, decoded_layers=len(dec.decoded), total_layers=len(setup.layers),
        step_seconds=step_s, tokens_per_s=batch / step_s, kv_read_bytes_per_step=kv_read,
        bandwidth_bytes_per_s=kv_read / step_s, recompute_seconds=recompute_s, speedup=recompute_s / step_s,
        peak_bytes=peak, peak_what=peak_what,
    )
