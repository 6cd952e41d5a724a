#!/usr/bin/env bash
# Hardware counters of one backward problem, ours beside FlashAttention-2, both
# reached through torch: ours through the attnforge wheel in .gpu/ (policy:
# generated first), FA2 through torch's flash SDPA. On the H200 machine; clocks
# left alone (METHOD.md). The problem comes from the environment:
#   D (head dim, 256), B (batch, 2), H (heads, 8), S (seqlen, 8192), CAUSAL (0).
#   usage: scripts/ncu-bwd-torch.sh [OUT_DIR]
# Writes ncu-bwd-{ours,fa2}.txt (SpeedOfLight, warp-state, scheduler,
# memory-workload, instruction sections) to OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-$PWD/gpu-results}}"; mkdir -p "$out"
. scripts/gpu-nvrtc.sh
site=$(mktemp -d)
python3 -m pip install -q --no-deps --target "$site" "$(ls .gpu/attnforge-*.whl | head -n 1)" || exit 1
cat > /tmp/ncu_bwd_problem.py <<'PY'
import os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import attnforge
import attnforge.torch as at
d, b, h, s = (int(os.environ.get(k, v)) for k, v in (("D", 256), ("B", 2), ("H", 8), ("S", 8192)))
causal = os.environ.get("CAUSAL", "0") == "1"
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
           for _ in range(3))
if sys.argv[1] == "ours":
    attnforge.set_policy(fwd="generated", bwd="generated")
    sdpa = at.scaled_dot_product_attention
else:
    def sdpa(q, k, v, is_causal):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
for _ in range(2):
    o = sdpa(q, k, v, is_causal=causal)
    o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
sections=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section InstructionStats)
for who in ours fa2; do
  if [ $who = ours ]; then kname='regex:^attnforge_bwd_bf16_d[0-9]+_.*_sm90a$'; else kname='regex:flash_bwd_dq_dk_dv'; fi
  (cd /tmp && PYTHONPATH="$site" ATTNFORGE_CACHE_DIR=$(mktemp -d) ncu --clock-control none "${sections[@]}" \
    --kernel-name "$kname" --launch-skip 1 --launch-count 1 python3 /tmp/ncu_bwd_problem.py $who) \
    > "$out/ncu-bwd-$who.txt" 2>&1
  echo "$who: rc=$? $(grep -c 'Section:' "$out/ncu-bwd-$who.txt") sections"
done
