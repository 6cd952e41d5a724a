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
else
  echo "gpu-bench: no .whl/nvidia_cudnn_frontend-*.whl (carry .whl): the ragged rows get no cuDNN figure" >&2
fi
# SM clock, power and temperature every 200 ms while the benchmark runs
# (the H200 runs ~10% faster for the first ~50 ms after an idle pause:
# docs/benchmarks/2026-12-04-s10-tune90.md); summarized into bench.md.
smi_pid=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 200 \
    > "$OUT/clocks.csv" 2>/dev/null &
  smi_pid=$!
fi
status=0
PYTHONUNBUFFERED=1 python3 scripts/gpu_bench.py "$@" || status=$?
# The forward, then the backward, against the peers in interleaved rounds,
# one process each, balanced order (scripts/bench_interleaved.py): the ratios
# issues 3 and 4 are read from. Needs the wheel (.gpu/attnforge-*.whl,
# `make gpu-bundle`); skipped with --quick.
whl=$(ls .gpu/attnforge-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$whl" ] && [ "${1:-}" != "--quick" ]; then
  wsite=$(mktemp -d)
  if python3 -m pip install -q --no-deps --target "$wsite" "$whl"; then
    (cd /tmp && PYTHONUNBUFFERED=1 PYTHONPATH="$wsite" python3 "$OLDPWD/scripts/bench_interleaved.py") || status=$?
    (cd /tmp && PYTHONUNBUFFERED=1 PYTHONPATH="$wsite" python3 "$OLDPWD/scripts/bench_interleaved.py" --bwd) || status=$?
  else
    status=1
  fi
else
  echo "interleaved forward and backward: skipped (no wheel in .gpu, or --quick)"
fi
if [ -n "$smi_pid" ]; then
  kill "$smi_pid" 2>/dev/null || true; wait "$smi_pid" 2>/dev/null || true
  python3 - "$OUT" <<'PY' || true
import csv, os, statistics, sys
out = sys.argv[1]
rows = []
for r in csv.reader(open(os.path.join(out, "clocks.csv"))):
    try:
        rows.append((float(r[1]), float(r[2]), float(r[3])))
    except (IndexError, ValueError):
        pass
busy = [r for r in rows if r[1] > 200.0]  # samples under load (W)
if busy and os.path.exists(os.path.join(out, "bench.md")):
    clk, pw, tc = (sorted(x[i] for x in busy) for i in range(3))
    q = lambda v, f: v[min(len(v) - 1, int(f * len(v)))]
    line = (f"\nDuring the run ({len(busy)} samples above 200 W, every 200 ms): SM clock median "
            f"{statistics.median(clk):.0f} MHz (10-90%: {q(clk, .1):.0f}-{q(clk, .9):.0f}), power median "
            f"{statistics.median(pw):.0f} W (max {pw[-1]:.0f}), temperature {tc[0]:.0f}-{tc[-1]:.0f} C.\n")
    open(os.path.join(out, "bench.md"), "a").write(line)
    print(line.strip())
PY
fi
exit $status
