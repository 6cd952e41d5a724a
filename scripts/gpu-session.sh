#!/usr/bin/env bash
# Everything one device call should run, each step under its own time limit so
# that a slow or hung step cannot take the others down with it (the device
# tool allows 600 s per call): the GPU suites, the torch GPU tests, memcheck on
# a subset, the same-run benchmark and the sm90a forward tile variants. Prints
# one summary line per step; logs and reports go to $OUT (or ./gpu-results).
#   usage: scripts/gpu-session.sh [steps...]   (default: bwd fwd py memcheck bench)
#          steps: bwd fwd py memcheck bench inter tune tune90 trace90 trace80b trace80f phases ragged raggedab ncu80f ncu90 ab
#          (inter: the forward against the peers in interleaved rounds, one process; INTER_ARGS)
#          (tune: the sm80 forward's tile shapes, `gpu_bench --tune`)
# Limits (seconds) can be set by env: LIMIT_BWD LIMIT_FWD LIMIT_PY LIMIT_MEMCHECK
# LIMIT_BENCH LIMIT_INTER LIMIT_TUNE LIMIT_TUNE90 LIMIT_TRACE90 LIMIT_TRACE80B LIMIT_TRACE80F LIMIT_PHASES LIMIT_RAGGED LIMIT_NCU80F LIMIT_NCU90 LIMIT_AB; ATTNFORGE_SANITIZE_CASES picks the memcheck subset.
# AB_DIRS: the comma-separated cubin dirs of step ab (default .gpu/ab; scripts/ab-cubins.sh REV DIR).
# RAGGED_AB_DIR: the other revision's binaries of step raggedab (default .gpu/b; scripts/bundle-rev.sh REV DIR).
# Measured on the H200 (2026-12-03): bwd 45 s, fwd 225 s, py 70 s, memcheck
# 12 s, bench 146 s (before the wgmma backward options got their columns:
# ~185 s on an H100 in session 31, and ~75 s + ~120 s more since session 32
# for the interleaved forward and backward at its end), tune90 88 s; all default steps together are close to the
# device tool's 600 s per call, so split them over two calls when steps grow
# (e.g. `scripts/gpu-session.sh bwd fwd py memcheck`, then `bench tune90`).
# The device tool brings back at most 8 files from $OUT, so with OUT set every
# log and report is written to a scratch folder and packed into one archive,
# $OUT/gpu-session.tgz, refreshed after every step (the step summary goes to stdout).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${OUT:-}" ]; then
  dest="$OUT"; out=$(mktemp -d)
else
  dest=""; out="$PWD/gpu-results"
fi
mkdir -p "$out"
export ATTNFORGE_REPORT_DIR="$out"
. scripts/gpu-nvrtc.sh
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(bwd fwd py memcheck bench)
echo "date: $(date -u +%F' '%T) UTC; steps: ${steps[*]}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
status=0
# run NAME LIMIT CMD...: fresh kernel cache per step (so it really compiles).
run() {
  local name=$1 lim=$2; shift 2
  local s; s=$(date +%s)
  ATTNFORGE_CACHE_DIR=$(mktemp -d) timeout "$lim" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  echo "$name: rc=$rc $(( $(date +%s) - s ))s (limit ${lim}s)$([ $rc -eq 124 ] && echo ' TIMED OUT')"
}
counts() { echo "  ok=$(grep -c '^ok' "$1") fail=$(grep -c '^FAIL' "$1")"; grep '^FAIL\|panicked' "$1" | head -n 8; }
# The attnforge wheel from .gpu installed into a scratch site dir ($site), once.
site=""
wheel_site() {
  [ -n "$site" ] && return 0
  local whl; whl=$(ls .gpu/attnforge-*.whl 2>/dev/null | head -n 1)
  [ -n "$whl" ] && python3 -c "import torch" 2>/dev/null || return 1
  site=$(mktemp -d)
  python3 -m pip install -q --no-deps --target "$site" "$whl" || { status=1; site=""; return 1; }
}
# Pack what is there so far (after every step, so that a call cut off at the
# device tool's limit still brings back the steps that finished).
pack() {
  [ -n "$dest" ] || return 0
  tar czf "$dest/gpu-session.tgz.part" -C "$out" . && mv -f "$dest/gpu-session.tgz.part" "$dest/gpu-session.tgz"
}
for step in "${steps[@]}"; do
  pack
  case $step in
    bwd) run gpu_bwd "${LIMIT_BWD:-200}" .gpu/gpu_bwd; counts "$out/gpu_bwd.log" ;;
    fwd) run gpu_fwd "${LIMIT_FWD:-360}" .gpu/gpu_fwd; counts "$out/gpu_fwd.log" ;;
    py)
      if wheel_site; then
        # From /tmp, so that the source tree's python/attnforge cannot shadow the wheel.
        run pytest-gpu "${LIMIT_PY:-120}" bash -c "cd /tmp && PYTHONPATH='$site' python3 -m pytest \
          '$PWD/python/tests' -m gpu -q -rs -s -p no:cacheprovider"
        tail -n 1 "$out/pytest-gpu.log"; grep -A1 "host time" "$out/pytest-gpu.log"
      else
        echo "py: skipped (no wheel in .gpu or no torch)"
      fi ;;
    memcheck)
      if command -v compute-sanitizer >/dev/null; then
        for t in bwd fwd; do
          # Its own report dir: the subset's tables must not replace the full suite's.
          mkdir -p "$out/memcheck"
          run "memcheck-gpu_$t" "${LIMIT_MEMCHECK:-90}" env ATTNFORGE_BWD_BENCH= ATTNFORGE_REPORT_DIR="$out/memcheck" \
            ATTNFORGE_GPU_CASES="${ATTNFORGE_SANITIZE_CASES:-causal-tl.thd}" \
            compute-sanitizer --tool memcheck --error-exitcode 9 ".gpu/gpu_$t"
          grep -h "ERROR SUMMARY" "$out/memcheck-gpu_$t.log"; counts "$out/memcheck-gpu_$t.log"
        done
      else
        echo "memcheck: skipped (no compute-sanitizer)"
      fi ;;
    bench) mkdir -p "$out/bench"; run gpu-bench "${LIMIT_BENCH:-560}" env OUT="$out/bench" scripts/gpu-bench.sh ;;
    # The forward with the peers interleaved in one process (scripts/bench_interleaved.py).
    inter)
      if wheel_site; then
        run interleaved "${LIMIT_INTER:-300}" env OUT="$out" PYTHONPATH="$site" python3 scripts/bench_interleaved.py ${INTER_ARGS:-}
        grep '^|' "$out/interleaved.log" | head -n 30
      else
        echo "inter: skipped (no wheel in .gpu or no torch)"
      fi ;;
    tune) run tune "${LIMIT_TUNE:-120}" .gpu/gpu_bench --tune ;;
    tune90) run tune90 "${LIMIT_TUNE90:-120}" .gpu/gpu_bench --tune90 ;;
    # Where the time goes: tracing builds of the sm90a forward (per-tile
    # waits and work of each warpgroup) and of the sm80-path backward (each
    # warp's phases per query tile).
    trace90) run trace90 "${LIMIT_TRACE90:-90}" .gpu/gpu_bench --trace90; grep -v '^trace90   block 0 warpgroup 0 events\|producer:' "$out/trace90.log" | head -n 60 ;;
    trace80b) run trace80b "${LIMIT_TRACE80B:-90}" .gpu/gpu_bench --trace80b; grep '^trace80b' "$out/trace80b.log" | head -n 60 ;;
    # The sm80-path forward's blocks per SM over time and each key tile's phases (d64/d128/d256, 2k and 8k).
    trace80f) run trace80f "${LIMIT_TRACE80F:-90}" .gpu/gpu_bench --trace80f; grep '^trace80f' "$out/trace80f.log" | head -n 80 ;;
    # The causal block order's phase counts against each other (plan::causal_tile_phases).
    phases) run phases "${LIMIT_PHASES:-150}" .gpu/gpu_bench --phases; grep '^phases' "$out/phases.log" | head -n 300 ;;
    # Ragged batches in batch order against longest keys first (one-tile entry; common/order.cuh).
    ragged) run ragged "${LIMIT_RAGGED:-120}" .gpu/gpu_bench --ragged-order; grep '^ragged ' "$out/ragged.log" | head -n 40 ;;
    # The ragged order's figures of this tree's binaries (A, .gpu) against another
    # revision's (B, RAGGED_AB_DIR, default .gpu/b, from scripts/bundle-rev.sh),
    # A B A B ... (RAGGED_AB_PAIRS, default 1; ATTNFORGE_RAGGED_DRAWS picks the
    # draws), then B's gpu_fwd and memcheck on the ragged cases.
    raggedab)
      bdir=${RAGGED_AB_DIR:-.gpu/b}
      if [ -x "$bdir/gpu_bench" ] && [ -x "$bdir/gpu_fwd" ]; then
        for i in $(seq "${RAGGED_AB_PAIRS:-1}"); do
          run "ragged-a-$i" "${LIMIT_RAGGED:-120}" .gpu/gpu_bench --ragged-order
          run "ragged-b-$i" "${LIMIT_RAGGED:-120}" "$bdir/gpu_bench" --ragged-order
        done
        run gpu_fwd-b-thd "${LIMIT_FWD:-360}" env ATTNFORGE_GPU_CASES=thd "$bdir/gpu_fwd"; counts "$out/gpu_fwd-b-thd.log"
        if command -v compute-sanitizer >/dev/null; then
          mkdir -p "$out/memcheck-b"
          run memcheck-b-thd "${LIMIT_MEMCHECK:-90}" env ATTNFORGE_REPORT_DIR="$out/memcheck-b" ATTNFORGE_GPU_CASES=thd \
            compute-sanitizer --tool memcheck --error-exitcode 9 "$bdir/gpu_fwd"
          grep -h "ERROR SUMMARY" "$out/memcheck-b-thd.log"; counts "$out/memcheck-b-thd.log"
        fi
      else
        echo "raggedab: skipped (no $bdir/gpu_bench and gpu_fwd: scripts/bundle-rev.sh REV $bdir)"
        status=1
      fi ;;
    # ncu beside FlashAttention-2: the sm80-path forward's stalls, memory and
    # instruction counts per cell (NCU80F_CELLS, default d128 at 2k and 8k).
    ncu80f) mkdir -p "$out/ncu80f"; run ncu80f "${LIMIT_NCU80F:-240}" env NCU_STALLS_KIND=fwd \
              NCU_STALLS_CELLS="${NCU80F_CELLS:-128 2048;128 8192}" scripts/ncu-stalls.sh "$out/ncu80f"
            grep -E '^[a-z0-9-]+: rc|Duration|Executed Instructions|L2 Hit|DRAM Throughput|Warp Cycles Per Issued' "$out/ncu80f.log" | head -n 60 ;;
    # ncu's full set on the sm90a forward beside cuDNN's (NCU90_CELLS, default d128 8k and d128 512 causal).
    ncu90) mkdir -p "$out/ncu90"; run ncu90 "${LIMIT_NCU90:-400}" scripts/ncu-fwd90.sh "$out/ncu90"
           head -n 120 "$out/ncu90/ncu90-compare.txt" ;;
    # Same-process A/B of the forward against the cubins carried in .gpu/ab.
    ab) run ab "${LIMIT_AB:-60}" .gpu/gpu_bench --ab "${AB_DIRS:-.gpu/ab}" ;;
    *) echo "unknown step: $step"; status=1 ;;
  esac
done
if [ -n "$dest" ]; then
  pack && echo "results: \$OUT/gpu-session.tgz ($(find "$out" -type f | wc -l) files)"
fi
exit $status
