#!/usr/bin/env bash
# Hardware counters of the sm80-path backward's main kernel next to
# FlashAttention-2's backward (torch's flash SDPA) on the same problem: bf16,
# batch 4, seqlen 4096, 16 heads, d128, no mask. On the H200 machine (ncu reads
# counters on its Firecracker runtime; clocks left alone, METHOD.md).
#   usage: scripts/ncu-bwd.sh [OUT_DIR]    (needs .gpu/gpu_bwd from `make gpu-bundle`)
#   NCU_BWD_FA2=0 skips FlashAttention-2's kernel.
# Ours: the planner's sm80-path shape for the spec, in the two block orders, as
# `ATTNFORGE_BWD_TUNE=d128 .gpu/gpu_bwd` times them after its tile variants.
# Every timed kernel there launches its main kernel 17 times; the d128
# no-mask variants before them: 8x64x64, 8x128x64 (chunk 16), 8x128x64
# (chunk 32: spills on sm_90a, not launched), 4x64x64, 4x64x32 = 4 timed, so
# the planner's shape in the old order starts at launch 68, head-major at 85.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section InstructionStats)
for run in "old-order 68" "head-major 85"; do
  set -- $run
  ATTNFORGE_CACHE_DIR=$(mktemp -d) ATTNFORGE_BWD_TUNE=d128 ncu --clock-control none "${sections[@]}" \
    --kernel-name 'regex:^attnforge_bwd_bf16_d128_none_dense_sm90a$' --launch-skip "$2" --launch-count 1 \
    .gpu/gpu_bwd > "$out/ncu-bwd-ours-$1.txt" 2>&1
  echo "ours $1: rc=$? $(grep -c 'Section:' "$out/ncu-bwd-ours-$1.txt") sections;" \
    "$(grep -h 'tune.*planner shape' "$out/ncu-bwd-ours-$1.txt" | head -n 1)"
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
ncu --clock-control none "${sections[@]}" --kernel-name 'regex:flash_bwd_dq_dk_dv' --launch-skip 1 \
  --launch-count 1 python3 /tmp/fa2_bwd.py > "$out/ncu-bwd-fa2.txt" 2>&1
echo "fa2: rc=$? $(grep -c 'Section:' "$out/ncu-bwd-fa2.txt") sections"
