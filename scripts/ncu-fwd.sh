#!/usr/bin/env bash
# Executed SASS instructions per opcode of the sm80-path forward beside
# FlashAttention-2's forward (torch's flash SDPA) on the same problem: bf16,
# batch 2, seqlen 8192, 16 heads, d128, no mask. On the H200 machine.
#   usage: scripts/ncu-fwd.sh [OUT_DIR]    (needs .gpu/gpu_bench from `make gpu-bundle`)
# Ours: the first d128 non-causal variant of `gpu_bench --tune` (8 warps x
# 1 m-tile x block_n 64, the planner's sm80-path shape), its third launch
# (after two warm-ups). Writes ncu-fwd-{ours,fa2}.csv (per instruction) and
# ncu-fwd-opcodes.txt (scripts/sass_opcodes.py).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
sections=(--section SourceCounters --section InstructionStats)
ATTNFORGE_CACHE_DIR=$(mktemp -d) timeout 300 ncu --clock-control none "${sections[@]}" -f -o "$out/fwd-ours" \
  --kernel-name 'regex:^attnforge_fwd_bf16_d128_none_dense_sm90a' --launch-skip 2 --launch-count 1 \
  .gpu/gpu_bench --tune > "$out/ncu-fwd-ours.txt" 2>&1
echo "ours: rc=$? $(grep -m1 'tune d=128 causal=false' "$out/ncu-fwd-ours.txt")"
cat > /tmp/fa2_fwd.py <<'PY'
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(3):
        F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
PY
timeout 200 ncu --clock-control none "${sections[@]}" -f -o "$out/fwd-fa2" --kernel-name 'regex:flash_fwd_kernel' \
  --launch-skip 2 --launch-count 1 python3 /tmp/fa2_fwd.py > "$out/ncu-fwd-fa2.txt" 2>&1
echo "fa2: rc=$?"
for w in ours fa2; do
  ncu --import "$out/fwd-$w.ncu-rep" --page source --csv --print-source sass > "$out/ncu-fwd-$w.csv" 2>&1
done
python3 scripts/sass_opcodes.py ours="$out/ncu-fwd-ours.csv" fa2="$out/ncu-fwd-fa2.csv" > "$out/ncu-fwd-opcodes.txt" 2>&1
python3 scripts/sass_opcodes.py --full --top 60 ours="$out/ncu-fwd-ours.csv" fa2="$out/ncu-fwd-fa2.csv" >> "$out/ncu-fwd-opcodes.txt" 2>&1
cat "$out/ncu-fwd-opcodes.txt"
