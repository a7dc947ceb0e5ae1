#!/usr/bin/env bash
# The one command to run on a GPU machine: kvplan verify on three models plus a device copy-bandwidth figure.
# Assumes torch with CUDA is installed; installs only kvplan itself (editable) unless it already imports
# (PYTHONPATH=. on a machine without a package index). A few minutes on an H100/H200.
# Results (JSON) go to $OUT when set, else benchmarks/results/. Exit status: non-zero if any verify mismatched.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python}"
"$PY" -c "import kvplan" 2>/dev/null || "$PY" -m pip install -q -e . || exit 2
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.__version__, torch.cuda.get_device_name())" || exit 2

# The GPU's exact CUDA total and what CUDA and cuBLAS hold outside torch, next to the catalog entry.
"$PY" benchmarks/cuda_facts.py "$RESULTS/cuda_facts.json"

# Device copy bandwidth: a 4 GiB device-to-device copy, 20 times; each copy reads and writes 4 GiB.
"$PY" - "$RESULTS/copy_bandwidth.json" <<'PY'
import json, sys, time, torch
n = 4 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
dst.copy_(src); torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    dst.copy_(src)
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
bw = 2 * n * 20 / seconds
doc = {"device": torch.cuda.get_device_name(), "bytes_per_copy": n, "copies": 20, "seconds": seconds,
       "copy_bandwidth_bytes_per_s": bw}
json.dump(doc, open(sys.argv[1], "w"), indent=2)
print(f"copy bandwidth: {bw / 1e9:,.1f} GB/s")
PY

status=0
run() {  # name, then kvplan verify arguments
  local name="$1"; shift
  echo "== $name: kvplan verify $*"
  "$PY" -m kvplan verify "$@" --device cuda --offline --json > "$RESULTS/$name.json"
  local rc=$?
  [ "$rc" -eq 0 ] || status=$rc
  "$PY" - "$RESULTS/$name.json" "$RESULTS/copy_bandwidth.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    print("  no JSON (see the error above)"); sys.exit(0)
copy = json.load(open(sys.argv[2]))["copy_bandwidth_bytes_per_s"]
for r in d["ranks"]:
    dec = r["decode"]
    print(f"  rank {r['rank']}: predicted {r['predicted_bytes']:,} B, measured {r['measured_bytes']:,} B, "
          f"passed={d['passed']}; step {dec['step_seconds'] * 1e3:.2f} ms, KV read {dec['bandwidth_bytes_per_s'] / 1e9:,.0f} GB/s "
          f"= {dec['bandwidth_bytes_per_s'] / copy:.0%} of the 4 GiB copy (target >= 60%), speed-up {dec['speedup']:,.0f}x")
PY
}

# Llama-3.1-8B, 16 x 32,768 tokens, bf16: 32 layers x 8 heads x 256 x 2 B x 32,768 x 16 = 64 GiB of KV.
run llama-3.1-8b-32k-x16 meta-llama/Llama-3.1-8B-Instruct --seq 32768 --batch 16 --kv-cache-dtype bf16 \
  --layout contiguous --steps 16
# MLA: DeepSeek-V2-Lite's 576-wide latent, 27 layers.
run deepseek-v2-lite-mla-32k-x16 deepseek-ai/DeepSeek-V2-Lite --seq 32768 --batch 16 --layout contiguous --steps 16
# Sliding windows: gpt-oss-20b alternates 128-token windows with full attention (paged, as vLLM runs it).
run gpt-oss-20b-sliding-16k-x16 openai/gpt-oss-20b --seq 16384 --batch 16 --layout paged --steps 16
# Where a decode step's time goes (the operators with the most device time), for the bandwidth aim.
"$PY" benchmarks/decode_profile.py meta-llama/Llama-3.1-8B-Instruct 32768 16 contiguous "$RESULTS/decode_profile.txt"
exit $status
