#!/usr/bin/env bash
# Run the GPU correctness suites on a machine with a CUDA GPU (the H200 lent by
# the device tool): the forward and backward suites, the torch front end's GPU
# tests, and (--sanitize) compute-sanitizer memcheck on a subset. No Rust needed
# there: `make gpu-bundle` builds the test binaries and the wheel here into
# .gpu/, which travels with the working tree (carry it).
#   usage: scripts/gpu-test.sh [--sanitize]
# Results go to $OUT (or ./gpu-results) as gpu-correctness.md and logs.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/gpu-results}"; mkdir -p "$out"
export ATTNFORGE_REPORT_DIR="$out"
export ATTNFORGE_CACHE_DIR="${ATTNFORGE_CACHE_DIR:-$(mktemp -d)}"   # fresh: really compiles
. scripts/gpu-nvrtc.sh
echo "date: $(date -u +%F' '%T) UTC"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "nvrtc: ${ATTNFORGE_NVRTC:-<discovery>}"
status=0
for t in .gpu/gpu_fwd .gpu/gpu_bwd; do
  [ -x "$t" ] || continue
  echo "== $t"
  "$t" 2>&1 | tee "$out/$(basename "$t").log" || status=1
done
# The torch front end's GPU tests, from the wheel `make gpu-bundle` put in .gpu/
# (run from /tmp so that the source tree's python/attnforge does not shadow it).
whl=$(ls .gpu/attnforge-*.whl 2>/dev/null | head -n 1)
if [ -n "$whl" ] && python3 -c "import torch" 2>/dev/null; then
  echo "== python GPU tests ($whl)"
  site=$(mktemp -d)
  python3 -m pip install -q --no-deps --target "$site" "$whl" || status=1
  (cd /tmp && PYTHONPATH="$site" python3 -m pytest "$OLDPWD/python/tests" -m gpu -q -rs -s \
      -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.log" | grep -v "^DEBUG" | tail -n 40) || status=1
fi
if [ "${1:-}" = "--sanitize" ] && command -v compute-sanitizer >/dev/null; then
  for t in .gpu/gpu_fwd .gpu/gpu_bwd; do
    [ -x "$t" ] || continue
    log="$out/memcheck.log"; [ "$t" = .gpu/gpu_fwd ] || log="$out/memcheck-$(basename "$t").log"
    echo "== compute-sanitizer memcheck (subset): $t"
    # Its own report dir: the subset's tables must not replace the full suite's.
    mkdir -p "$out/memcheck"
    ATTNFORGE_BWD_BENCH= ATTNFORGE_REPORT_DIR="$out/memcheck" ATTNFORGE_GPU_CASES="${ATTNFORGE_SANITIZE_CASES:-thd}" \
      compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$t" 2>&1 | tail -n 30 | tee "$log" || status=1
  done
fi
exit $status
