#!/usr/bin/env bash
# Where the sm80-path backward's warps wait, instruction by instruction, next
# to FlashAttention-2's backward on the same problem: ncu's SourceCounters
# (executed count and PC-sampled stall reasons of every SASS instruction) and
# WarpStateStats for one launch of each main kernel, bf16, no mask:
#   d128: b2 h16 s8192 (ours: the `gpu_bench --ab` cell, launched with this
#         tree's sm80-path plan), d256: b8 h8 s2048 (likewise).
# On the H200 machine; needs .gpu/gpu_bench from `make gpu-bundle` and one
# cubin dir for `--ab` (AB_DIRS, default .gpu/ab: the cell needs two modules;
# the first launches are this tree's). Clocks left alone (METHOD.md).
#   usage: scripts/ncu-stalls.sh [OUT_DIR]    (NCU_STALLS_FA2=0: ours only)
# Writes per kernel NAME.ncu-rep, NAME.txt (sections) and NAME.csv (the
# source page; scripts/sass_stalls.py summarizes it per code region).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}/ncu-stalls}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
sections=(--section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats
          --section Occupancy --section InstructionStats)
# prof NAME KERNEL_REGEX SKIP CMD...: one launch of the matching kernel.
prof() {
  local name=$1 regex=$2 skip=$3; shift 3
  ATTNFORGE_CACHE_DIR=$(mktemp -d) timeout "${NCU_STALLS_LIMIT:-150}" ncu --clock-control none "${sections[@]}" \
    --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --kill yes -f -o "$out/$name" "$@" \
    > "$out/$name.log" 2>&1
  echo "$name: rc=$?"
  ncu --import "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.csv" 2>&1
  ncu --import "$out/$name.ncu-rep" > "$out/$name.txt" 2>&1
  grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Instructions  " "$out/$name.txt" | head -n 6
}
dirs="${AB_DIRS:-.gpu/ab}"
prof ours-d128 '^attnforge_bwd_bf16_d128_none_dense_sm90a$' 2 .gpu/gpu_bench --ab "$dirs"
prof ours-d256 '^attnforge_bwd_bf16_d256_none_dense_sm90a$' 2 .gpu/gpu_bench --ab "$dirs"
[ "${NCU_STALLS_FA2:-1}" = 0 ] && exit 0
cat > /tmp/fa2_bwd_stalls.py <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
b, h, s, d = map(int, sys.argv[1:5])
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
           for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v)
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
prof fa2-d128 'flash_bwd_dq_dk_dv' 1 python3 /tmp/fa2_bwd_stalls.py 2 16 8192 128
prof fa2-d256 'flash_bwd_dq_dk_dv' 1 python3 /tmp/fa2_bwd_stalls.py 8 8 2048 256
