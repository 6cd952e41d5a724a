#!/usr/bin/env bash
# Build the cubins of another revision for `gpu_bench --ab` (session step
# `ab`): a worktree of REV, its CLI, and one cubin per cell of the A/B (sm90a
# forward: the main plan and the short/mid-keys variants that calls take;
# d256 backward; the sm80 path's forward and d64/d128 backward),
# named as gpu_bench looks them up, into DIR
# (default .gpu/ab), each with its plan beside it ({cubin}.plan.json: the
# A/B launches the cubin with that revision's launch geometry).
#   usage: [AB_TARGET_DIR=DIR] [AB_ONLY=GLOB] scripts/ab-cubins.sh REV [DIR]      (NVRTC as for `make sweep`)
# AB_ONLY keeps only the cubins (and plans) whose names match GLOB, e.g.
# 'fwd.*.sm80path.cubin*' for a change to the sm80-path forward: the A/B skips
# the cells a dir has no cubin for (and the device call carries less).
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/ab-cubins.sh REV [DIR]}
dir=$(realpath -m "${2:-.gpu/ab}")
mkdir -p "$dir"
# The worktree and its own target dir (AB_TARGET_DIR keeps one across runs).
. scripts/rev-worktree.sh
rev_worktree ab-cubins "$rev" "${AB_TARGET_DIR:-}"
(cd "$wt" && CARGO_TARGET_DIR="$target" cargo build -q --release -p attnforge-cli)
cli="$target/release/attnforge"
for spec in fwd.bf16.d64.none.dense.sm90a fwd.bf16.d64.causal-tl.dense.sm90a fwd.bf16.d128.none.dense.sm90a fwd.bf16.d128.causal-tl.dense.sm90a \
            fwd.bf16.d256.none.dense.sm90a fwd.bf16.d256.causal-tl.dense.sm90a \
            fwd.bf16.d128.none.thd.sm90a fwd.bf16.d128.causal-br.thd.sm90a \
            fwd.bf16.d256.none.thd.sm90a fwd.bf16.d256.causal-br.thd.sm90a; do
  # One cubin (and its plan) per plan: the main one, then the per-call variants
  # (plan::Variant) that the A/B times where calls take them (keys up to 1024;
  # 1025..=2048), named {spec}.short... / {spec}.mid...; a spec without the
  # variant (or a revision without --path) has none. The plan's consumers,
  # block_n and stages name the file (as in examples/gpu_bench.rs).
  for v in :: short-keys:.short mid-keys:.mid; do
    path=${v%%:*} tag=${v##*:}
    opt=(); [ -z "$path" ] || opt=(--path "$path")
    bm=""
    read -r bm bn st < <("$cli" plan "$spec" "${opt[@]}" 2>/dev/null \
      | sed -n 's/^tile .*block_m=\([0-9]*\) block_n=\([0-9]*\) .*stages=\([0-9]*\).*/\1 \2 \3/p') || true
    [ -n "$bm" ] || continue
    f="$dir/$spec$tag.c$((bm / 64)).bn$bn.st$st.cubin"
    "$cli" compile "$spec" "${opt[@]}" -o "$f"
    "$cli" plan "$spec" "${opt[@]}" --json > "$f.plan.json"
  done
done
# The backward cells of the planner (the sm80 instruction path at d256, the
# wgmma backward at d64/d128), named by spec.
for spec in bwd.bf16.d256.none.dense.sm90a bwd.bf16.d256.causal-tl.dense.sm90a \
            bwd.bf16.d64.none.dense.sm90a bwd.bf16.d128.none.dense.sm90a bwd.bf16.d128.causal-tl.dense.sm90a; do
  "$cli" compile "$spec" -o "$dir/$spec.cubin"
  "$cli" plan "$spec" --json > "$dir/$spec.cubin.plan.json"
done
# The sm80 instruction path where the planner takes wgmma (issue 3's figures
# on the H200), named {spec}.sm80path.cubin; revisions before `compile --path`
# have no such cubins, and the A/B skips those cells.
for spec in fwd.bf16.d64.none.dense.sm90a fwd.bf16.d64.causal-tl.dense.sm90a \
            fwd.bf16.d128.none.dense.sm90a fwd.bf16.d128.causal-tl.dense.sm90a fwd.bf16.d256.none.dense.sm90a \
            fwd.bf16.d256.none.thd.sm90a \
            bwd.bf16.d64.none.dense.sm90a bwd.bf16.d64.causal-tl.dense.sm90a bwd.bf16.d128.none.dense.sm90a \
            bwd.bf16.d128.causal-tl.dense.sm90a; do
  "$cli" compile "$spec" --path sm80 -o "$dir/$spec.sm80path.cubin" \
    && "$cli" plan "$spec" --path sm80 --json > "$dir/$spec.sm80path.cubin.plan.json" \
    || echo "ab-cubins: $rev's CLI has no --path: no sm80-path cubin for $spec"
done
if [ -n "${AB_ONLY:-}" ]; then
  find "$dir" -maxdepth 1 -type f ! -name "$AB_ONLY" -delete
fi
ls -la "$dir"
