#!/usr/bin/env bash
# The sm90a forward beside cuDNN's (torch SDPA's cudnn backend) under Nsight
# Compute's full set, one launch of each, same problem: bf16 BHSD, batch ×
# seqlen = 16k tokens, heads × d = 2048 (`gpu_bench --one`: the kernel a call of that length takes,
# its short-keys variant included; its 4th launch is
# profiled; torch's 3rd call). Clocks left alone (METHOD.md).
#   NCU90_CELLS="128 8192 none;128 512 causal-tl" (default): head dim, seqlen, mask
#   usage: scripts/ncu-fwd90.sh OUT_DIR     (needs .gpu/gpu_bench from `make gpu-bundle`)
# Writes OUT_DIR/ncu90-raw.tgz (every profile's raw metrics and per-instruction
# source page as CSV) and prints scripts/ncu_compare.py's side-by-side table.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/ncu-fwd90.sh OUT_DIR}"; mkdir -p "$out"
work=$(mktemp -d)
. scripts/gpu-nvrtc.sh
IFS=';' read -r -a cells <<< "${NCU90_CELLS:-128 8192 none;128 512 causal-tl}"
cat > "$work/cudnn_fwd.py" <<'PY'
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
b, h, s, d = map(int, sys.argv[1:5])
causal = sys.argv[5] != "none"
g = torch.Generator(device="cuda").manual_seed(1)
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(4):
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
torch.cuda.synchronize()
PY
# prof NAME KERNEL_REGEX SKIP CMD...
prof() {
  local name=$1 regex=$2 skip=$3; shift 3
  ATTNFORGE_CACHE_DIR=$(mktemp -d) timeout "${NCU90_LIMIT:-180}" ncu --clock-control none --set full \
    --import-source no --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 -f \
    -o "$work/$name" "$@" > "$work/$name.log" 2>&1
  echo "$name: rc=$? $(grep -m1 -o 'Profiling "[^"]*' "$work/$name.log" | cut -c1-120)"
  ncu --import "$work/$name.ncu-rep" --page raw --csv > "$work/$name.raw.csv" 2>&1
  ncu --import "$work/$name.ncu-rep" --page source --csv --print-source sass > "$work/$name.src.csv" 2>&1
  ncu --import "$work/$name.ncu-rep" > "$work/$name.txt" 2>&1
}
names=()
for cell in "${cells[@]}"; do
  set -- $cell
  d=$1 s=$2 mask=$3 b=$((16384 / $2)) h=$((2048 / $1))
  prof "ours-d$d-s$s-$mask" "^attnforge_fwd_bf16_d${d}_${mask//-/_}_dense_sm90a" 3 \
    .gpu/gpu_bench --one "fwd.bf16.d$d.$mask.dense.sm90a" --seqlen "$s"
  prof "cudnn-d$d-s$s-$mask" "sdpa|fmha|fprop|cudnn" 2 python3 "$work/cudnn_fwd.py" $b $h $s $d "$mask"
  names+=("ours-d$d-s$s-$mask" "cudnn-d$d-s$s-$mask")
done
python3 scripts/ncu_compare.py "$work" "${names[@]}" | tee "$out/ncu90-compare.txt"
NCU_COMPARE_ALL=1 python3 scripts/ncu_compare.py "$work" "${names[@]}" > "$out/ncu90-all.txt"
for ((i = 0; i < ${#names[@]}; i += 2)); do
  a=${names[i]} b=${names[i+1]}
  python3 scripts/sass_opcodes.py --top 40 "$a=$work/$a.src.csv" "$b=$work/$b.src.csv" 2>&1
done > "$out/ncu90-opcodes.txt"
tar -C "$work" -czf "$out/ncu90-raw.tgz" $(cd "$work" && ls *.raw.csv *.src.csv *.txt *.log)
