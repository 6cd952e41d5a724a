#!/usr/bin/env bash
# Where a kernel's warps wait, instruction by instruction, next to
# FlashAttention-2 on the same problem: ncu's SourceCounters (executed count
# and PC-sampled stall reasons of every SASS instruction) and WarpStateStats
# for one launch of each main kernel; bf16, no mask, BHSD, batch × seqlen =
# 16k tokens, hidden 2048 (`gpu_bench --one`, whose first 3 launches are
# untimed: the 4th is profiled).
#   NCU_STALLS_KIND=bwd (default): the sm80-path backward, d128 s8192 and d256 s2048
#   NCU_STALLS_KIND=fwd: the sm80-path forward, d128 and d256 at s8192
#   NCU_STALLS_CELLS="128 8192": only these (head dim, seqlen) cells, ;-separated
#   NCU_STALLS_MASK=causal-tl: causal instead of no mask (FA2 then causal too)
#   NCU_STALLS_BENCH=PATH: another build of gpu_bench for ours (an older tree's, say),
#   NCU_STALLS_TAG=NAME: the first part of our profiles' names (default ours)
# On the H200 machine; needs .gpu/gpu_bench from `make gpu-bundle`. Clocks left
# alone (METHOD.md).
#   usage: scripts/ncu-stalls.sh [OUT_DIR]    (NCU_STALLS_FA2=0: ours only)
# Writes per kernel NAME.ncu-rep, NAME.txt (sections) and NAME.csv (the
# source page; scripts/sass_stalls.py summarizes it per code region).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}/ncu-stalls}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
kind="${NCU_STALLS_KIND:-bwd}"
mask="${NCU_STALLS_MASK:-none}"
bench="${NCU_STALLS_BENCH:-.gpu/gpu_bench}"
tag="${NCU_STALLS_TAG:-ours}"
sections=(--section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats
          --section Occupancy --section InstructionStats --section MemoryWorkloadAnalysis)
# prof NAME KERNEL_REGEX SKIP CMD...: one launch of the matching kernel.
prof() {
  local name=$1 regex=$2 skip=$3; shift 3
  ATTNFORGE_CACHE_DIR=$(mktemp -d) timeout "${NCU_STALLS_LIMIT:-150}" ncu --clock-control none "${sections[@]}" \
    --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --kill yes -f -o "$out/$name" "$@" \
    > "$out/$name.log" 2>&1
  echo "$name: rc=$?"
  ncu --import "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.csv" 2>&1
  ncu --import "$out/$name.ncu-rep" > "$out/$name.txt" 2>&1
  grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Executed Instructions  |L2 Hit Rate|DRAM Throughput|Mem Busy" "$out/$name.txt" | head -n 12
}
if [ "$kind" = bwd ]; then cells=("128 8192" "256 2048"); else cells=("128 8192" "256 8192"); fi
[ -n "${NCU_STALLS_CELLS:-}" ] && IFS=';' read -r -a cells <<< "$NCU_STALLS_CELLS"
for cell in "${cells[@]}"; do
  set -- $cell
  prof "$tag-$kind-d$1-s$2-$mask" "^attnforge_${kind}_bf16_d$1_${mask//-/_}_dense_sm90a\$" 3 \
    "$bench" --one "$kind.bf16.d$1.$mask.dense.sm90a" --path sm80 --seqlen "$2"
done
[ "${NCU_STALLS_FA2:-1}" = 0 ] && exit 0
cat > /tmp/fa2_stalls.py <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
kind, b, h, s, d = sys.argv[1], *map(int, sys.argv[2:6])
causal = sys.argv[6] != "none"
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(kind == "bwd")
           for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if kind == "bwd":
            o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
regex=$([ "$kind" = bwd ] && echo flash_bwd_dq_dk_dv || echo flash_fwd_kernel)
for cell in "${cells[@]}"; do
  set -- $cell
  prof "fa2-$kind-d$1-s$2-$mask" "$regex" 1 python3 /tmp/fa2_stalls.py "$kind" $((16384 / $2)) $((2048 / $1)) "$2" "$1" "$mask"
done
