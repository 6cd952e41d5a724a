#!/usr/bin/env bash
# FlashAttention-2's machine code as torch ships it, without a GPU: the sm_90
# cubins of torch's libtorch_cuda.so (the PyPI wheel in .venv-py, `make pytest`
# installs it) hold the kernels that torch SDPA's flash backend runs on the
# H200. Lists the kernels of FILE-PATTERN's translation units (e.g.
# flash_bwd_hdim256_bf16_sm80) with registers and stack, or, given a pattern
# that picks one kernel's mangled name, writes its SASS to OUT.
#   usage: scripts/fa2-sass.sh FILE-PATTERN [KERNEL-PATTERN OUT.sass]
# Which kernel torch runs: its launch templates pick the tile traits per head
# dim and shared memory (H100/H200: e.g. Flash_bwd_kernel_traits<256, 64, 64,
# 8, 4, 2, 2, false, false>), and the bool parameters after the traits (dropout,
# causal, ..., even M/N, even K, ...) are set for the standard problems.
# Then scripts/sass_loops.py OUT.sass.
set -euo pipefail
cd "$(dirname "$0")/.."
file_pat=${1:?usage: scripts/fa2-sass.sh FILE-PATTERN [KERNEL-PATTERN OUT.sass]}
lib=$(realpath -e .venv-py/lib/python3*/site-packages/torch/lib/libtorch_cuda.so 2>/dev/null | head -n 1)
[ -n "$lib" ] || { echo "fa2-sass: no torch in .venv-py (make pytest installs it)" >&2; exit 2; }
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -n "$cuobjdump" ] || { echo "fa2-sass: no cuobjdump (pip install nvidia-cuda-cuobjdump; set CUOBJDUMP)" >&2; exit 2; }
cache=${FA2_SASS_CACHE:-/tmp/fa2-sass-$(stat -c %Y "$lib")}
if [ ! -d "$cache" ]; then
  # Every sm_90 cubin, once (~700 MB of the ~4 GB the library holds).
  mkdir -p "$cache.tmp" && (cd "$cache.tmp" && "$cuobjdump" -xelf all "$lib" >/dev/null)
  find "$cache.tmp" -name '*.cubin' ! -name '*sm_90.cubin' -delete
  mv "$cache.tmp" "$cache"
fi
cubins=$(grep -l -- "$file_pat" "$cache"/*.cubin || true)
[ -n "$cubins" ] || { echo "fa2-sass: no sm_90 cubin holds '$file_pat'" >&2; exit 1; }
if [ $# -lt 3 ]; then
  for c in $cubins; do
    echo "== $(basename "$c")"
    "$cuobjdump" -res-usage "$c" | grep -A1 'Function' | grep -v '^--' | paste - - \
      | sed -E 's/^\s*Function ([^:]*):.*(REG:[0-9]+ STACK:[0-9]+).*/\2 \1/'
  done
  exit 0
fi
for c in $cubins; do
  name=$("$cuobjdump" -res-usage "$c" | grep -o 'Function [^:]*' | cut -d' ' -f2 | grep -- "$2" | head -n 1 || true)
  if [ -n "$name" ]; then
    "$cuobjdump" -sass -fun "$name" "$c" > "$3"
    echo "$name -> $3 ($(grep -c '/\*[0-9a-f]\{4\}\*/' "$3") instructions)"
    exit 0
  fi
done
echo "fa2-sass: no kernel matches '$2'" >&2
exit 1
