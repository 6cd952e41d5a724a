#!/usr/bin/env bash
# Benchmark our kernels and the peers in one run on the GPU machine.
#   usage: scripts/gpu-bench.sh [--quick]     (after `make gpu-bundle` here)
set -euo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-$PWD/gpu-results}"; mkdir -p "$OUT"
export ATTNFORGE_CACHE_DIR="${ATTNFORGE_CACHE_DIR:-$(mktemp -d)}"
. scripts/gpu-nvrtc.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# Optional: cuDNN's own ragged forward as a peer, through a carried
# nvidia-cudnn-frontend wheel (.whl/, see docs/benchmarks/README.md).
if ls .whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
  fe_site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$fe_site" .whl/nvidia_cudnn_frontend-*.whl \
    && export PYTHONPATH="$fe_site${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONUNBUFFERED=1 python3 scripts/gpu_bench.py "$@"
