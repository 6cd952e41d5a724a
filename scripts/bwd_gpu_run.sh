#!/usr/bin/env bash
# Backward on the GPU machine in one call: correctness suite + our bench over
# the standard shapes, the peers (torch flash / cuDNN) on the same shapes, and
# the tile-variant table. Build the test binary here first (`make gpu-bundle`,
# or `cargo test --release --test gpu_bwd --no-run` and copy it to DIR).
#   usage: scripts/bwd_gpu_run.sh [DIR]   (DIR holds gpu_bwd; default .gpu)
# Results go to $OUT (or ./gpu-results): correct-bench.log, peers.log, tune.log.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:-.gpu}"
out="${OUT:-$PWD/gpu-results}"; mkdir -p "$out"
if [ -z "${ATTNFORGE_NVRTC:-}" ]; then
  export ATTNFORGE_NVRTC=$(ls /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 2>/dev/null | head -1)
fi
export ATTNFORGE_CACHE_DIR="${ATTNFORGE_CACHE_DIR:-$(mktemp -d)}" ATTNFORGE_REPORT_DIR="$out" PYTHONUNBUFFERED=1
seqs="${BWD_SEQS:-2048,16384}"
t0=$(date +%s); el() { echo "[t+$(( $(date +%s) - t0 ))s] $*"; }
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
status=0
el "correctness + bench (seqlen $seqs)"
ATTNFORGE_BWD_BENCH=1 ATTNFORGE_BWD_BENCH_SEQS="$seqs" timeout 120 "$dir/gpu_bwd" > "$out/correct-bench.log" 2>&1 || status=1
el peers; timeout 90 python3 "$here/gpu_bench.py" --peers-only --seqs "$seqs" > "$out/peers.log" 2>&1
el tune; ATTNFORGE_BWD_TUNE=1 timeout 90 "$dir/gpu_bwd" > "$out/tune.log" 2>&1
el done
grep -E "FAIL|gpu_bwd:" "$out/correct-bench.log" | head
grep -A20 "bwd ms" "$out/correct-bench.log"
grep "TFLOP" "$out/tune.log" | sed 's/.*tune //'
cat "$out/peers.log"
exit $status
