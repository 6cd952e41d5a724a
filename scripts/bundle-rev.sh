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
exe() { # the test binary NAME of the worktree's build
  (cd "$wt" && CARGO_TARGET_DIR="$target" cargo test -q --release --test "$1" --no-run --message-format=json 2>/dev/null) \
    | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]==sys.argv[1]]' "$1"
}
(cd "$wt" && CARGO_TARGET_DIR="$target" cargo build -q --release --example gpu_bench)
cp "$target/release/examples/gpu_bench" "$dir/gpu_bench"
for t in gpu_fwd gpu_bwd; do
  f=$(exe "$t"); [ -n "$f" ] || { echo "bundle-rev: no $t binary" >&2; exit 1; }
  cp "$f" "$dir/$t"
done
if command -v strip >/dev/null; then strip "$dir"/gpu_bench "$dir"/gpu_fwd "$dir"/gpu_bwd; fi
echo "$(git rev-parse --short "$rev")" > "$dir/REV"
ls -la "$dir"
