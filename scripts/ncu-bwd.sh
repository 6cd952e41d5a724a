#!/usr/bin/env bash
# Hardware counters of the sm80-path backward's main kernel next to
# FlashAttention-2's backward (torch's flash SDPA) on the same problem: bf16,
# batch 4, seqlen 4096, 16 heads, d128, no mask. On the H200 machine (ncu reads
# counters on its Firecracker runtime; clocks left alone, METHOD.md).
#   usage: scripts/ncu-bwd.sh [OUT_DIR]    (needs .gpu/gpu_bwd from `make gpu-bundle`)
#   NCU_BWD_FA2=0 skips FlashAttention-2's kernel.
#   NCU_BWD_OPCODES=1 takes ncu's SourceCounters instead of the sections: the
#   executed count of every SASS instruction, exported as CSV (ncu-src-*.csv)
#   and summed per opcode by scripts/sass_opcodes.py (ncu-opcodes.txt).
# Ours: the planner's sm80-path shape for the spec, in the two block orders, as
# `ATTNFORGE_BWD_TUNE=d128 .gpu/gpu_bwd` times them after its tile variants.
# Every timed kernel there launches its main kernel 17 times; the d128
# no-mask variants before them: 8x64x64, 8x128x64 (chunk 16), 8x128x64
# (chunk 32; spill-free since the 2026-12-03 load/peel changes, so timed),
# 4x64x64, 4x64x32 = 5 timed, so the planner's shape in the old order starts
# at launch 85, head-major at 102 (before: 4 timed, 68 and 85).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section InstructionStats)
runs=("old-order 85" "head-major 102")
if [ "${NCU_BWD_OPCODES:-0}" = 1 ]; then
  sections=(--section SourceCounters --section InstructionStats); runs=("head-major 102")
fi
# ncu_report NAME: the per-instruction CSV of report $out/NAME.ncu-rep.
ncu_report() {
  [ "${NCU_BWD_OPCODES:-0}" = 1 ] || return 0
  ncu --import "$out/$1.ncu-rep" --page source --csv --print-source sass > "$out/ncu-src-$1.csv" 2>&1
  echo "  $1: $(wc -l < "$out/ncu-src-$1.csv") source rows"
}
rep() { [ "${NCU_BWD_OPCODES:-0}" = 1 ] && echo "-f -o $out/$1"; }
for run in "${runs[@]}"; do
  set -- $run
  ATTNFORGE_CACHE_DIR=$(mktemp -d) ATTNFORGE_BWD_TUNE=d128 ncu --clock-control none "${sections[@]}" $(rep ours) \
    --kernel-name 'regex:^attnforge_bwd_bf16_d128_none_dense_sm90a$' --launch-skip "$2" --launch-count 1 \
    .gpu/gpu_bwd > "$out/ncu-bwd-ours-$1.txt" 2>&1
  echo "ours $1: rc=$? $(grep -c 'Section:' "$out/ncu-bwd-ours-$1.txt") sections;" \
    "$(grep -h 'tune.*planner shape' "$out/ncu-bwd-ours-$1.txt" | head -n 1)"
  ncu_report ours
done
[ "${NCU_BWD_FA2:-1}" = 0 ] && exit 0
cat > /tmp/fa2_bwd.py <<'EOF'
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
           for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v)
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
EOF
ncu --clock-control none "${sections[@]}" $(rep fa2) --kernel-name 'regex:flash_bwd_dq_dk_dv' --launch-skip 1 \
  --launch-count 1 python3 /tmp/fa2_bwd.py > "$out/ncu-bwd-fa2.txt" 2>&1
echo "fa2: rc=$? $(grep -c 'Section:' "$out/ncu-bwd-fa2.txt") sections"
ncu_report fa2
if [ "${NCU_BWD_OPCODES:-0}" = 1 ]; then
  python3 scripts/sass_opcodes.py ours="$out/ncu-src-ours.csv" fa2="$out/ncu-src-fa2.csv" > "$out/ncu-opcodes.txt" 2>&1
  python3 scripts/sass_opcodes.py --full --top 60 ours="$out/ncu-src-ours.csv" fa2="$out/ncu-src-fa2.csv" >> "$out/ncu-opcodes.txt" 2>&1
  cat "$out/ncu-opcodes.txt"
fi
