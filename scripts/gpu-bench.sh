#!/usr/bin/env bash
# Benchmark our kernels and the peers in one run on the GPU machine.
#   usage: scripts/gpu-bench.sh [--quick]     (after `make gpu-bundle` here)
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-$PWD/gpu-results}"; mkdir -p "$OUT"
export ATTNFORGE_CACHE_DIR="${ATTNFORGE_CACHE_DIR:-$(mktemp -d)}"
if [ -z "${ATTNFORGE_NVRTC:-}" ]; then
  for c in /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13 /usr/local/cuda/lib64/libnvrtc.so.13; do
    [ -e "$c" ] && export ATTNFORGE_NVRTC="$c" && break
  done
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
PYTHONUNBUFFERED=1 python3 scripts/gpu_bench.py "$@"
