#!/usr/bin/env bash
# Build another revision's GPU binaries (gpu_bench, gpu_fwd, gpu_bwd) into DIR
# (default .gpu/b) for a same-call comparison with this tree's `make
# gpu-bundle` (gpu-session step `raggedab`, or any script that runs both): a
# worktree of REV built in its own target dir, since the binaries embed their
# tree's templates. BUNDLE_TARGET_DIR keeps that target dir across runs (the
# dependencies then build once; never this tree's ./target).
#   usage: [BUNDLE_TARGET_DIR=DIR] scripts/bundle-rev.sh REV [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/bundle-rev.sh REV [DIR]}
dir=$(realpath -m "${2:-.gpu/b}")
mkdir -p "$dir"
. scripts/rev-worktree.sh
rev_worktree bundle-rev "$rev" "${BUNDLE_TARGET_DIR:-}"
(cd "$wt" && CARGO_TARGET_DIR="$target" cargo build -q --release --example gpu_bench)
cp "$target/release/examples/gpu_bench" "$dir/gpu_bench"
here=$PWD
for t in gpu_fwd gpu_bwd; do
  # (this tree's helper, run in the worktree: REV may predate it)
  f=$(cd "$wt" && CARGO_TARGET_DIR="$target" "$here/scripts/test-exe.sh" "$t")
  cp "$f" "$dir/$t"
done
if command -v strip >/dev/null; then strip "$dir"/gpu_bench "$dir"/gpu_fwd "$dir"/gpu_bwd; fi
echo "$(git rev-parse --short "$rev")" > "$dir/REV"
ls -la "$dir"
