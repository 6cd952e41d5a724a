#!/usr/bin/env bash
# Build the release test binary NAME of the cargo workspace in the current
# directory (CARGO_TARGET_DIR as set) and print its path; for `make
# gpu-bundle` and scripts/bundle-rev.sh, which carry it to the GPU machine.
#   usage: [CARGO=cargo] scripts/test-exe.sh NAME
set -euo pipefail
name=${1:?usage: scripts/test-exe.sh NAME}
f=$(${CARGO:-cargo} test -q --release --test "$name" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"]==sys.argv[1]]' "$name") \
  || f=""
[ -n "$f" ] || { echo "test-exe: no test binary $name (\`cargo test --release --test $name --no-run\` says why)" >&2; exit 1; }
echo "$f"
