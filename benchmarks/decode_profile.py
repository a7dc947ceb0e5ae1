"""Where one cached decode step of `kvplan verify` spends its time: torch.profiler over a few steps.

    python benchmarks/decode_profile.py MODEL SEQ BATCH [LAYOUT] [OUT.txt]

Allocates the planned cache (as verify does), fills it with a prompt of SEQ - 4 tokens, then profiles 4 decode
steps and prints the 20 operators with the most device time (CPU time on a host without a GPU), beside the
step's KV bytes and the bandwidth that makes. On an H200 verify's decode read the cache at 3-38% of the copy
bandwidth (docs/verify.md): this is the table to read before changing the decode attention. Runs on the host
too, at small sizes: `python benchmarks/decode_profile.py meta-llama/Llama-3.2-1B-Instruct 256 2`.
"""

from __future__ import annotations

import sys
import time

from kvplan.verify.alloc import allocate
from kvplan.verify.decode import Decoder, StepLog
from kvplan.verify.device import import_torch, pick_device
from kvplan.verify.rank import compute_dtype
from kvplan.verify.setup import VerifyRequest, prepare

STEPS = 4


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    model, seq, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    layout = sys.argv[4] if len(sys.argv) > 4 else "paged"
    torch = import_torch()
    setup = prepare(VerifyRequest(model=model, seq_tokens=seq, batch=batch, layout=layout, steps=STEPS,
                                  offline=True))
    device = pick_device(torch, None, 0)
    dtype = compute_dtype(torch, setup, device)
    caches = allocate(torch, setup, device)
    dec = Decoder(torch, setup, caches, device, dtype)
    hidden = setup.model.hidden_size
    prompt = setup.seq_tokens - STEPS
    rows = max(1, min(setup.batch, 65_536 // setup.seq_tokens))
    for start in range(0, setup.batch, rows):
        stop = min(start + rows, setup.batch)
        dec.forward(torch.randn(stop - start, prompt, hidden, device=device, dtype=dtype), 0, slice(start, stop),
                    use_cache=True)
    log = StepLog()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for t in range(STEPS):
            dec.decode_one_token(torch.randn(setup.batch, hidden, device=device, dtype=dtype), prompt + t, log)
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_s = (time.perf_counter() - t0) / STEPS
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    kv = log.kv_read_bytes[-1]
    lines = [
        f"{model}: {setup.batch} x {setup.seq_tokens} tokens, {layout}, on {device} ({dtype})",
        f"step {step_s * 1e3:.2f} ms (profiled), KV read {kv:,} B a step = {kv / step_s / 1e9:,.1f} GB/s",
        prof.key_averages().table(sort_by=sort, row_limit=20, max_name_column_width=48),
    ]
    text = "\n".join(lines)
    print(text)
    if len(sys.argv) > 5:
        with open(sys.argv[5], "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
