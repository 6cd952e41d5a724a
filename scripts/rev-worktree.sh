# Sourced by scripts/ab-cubins.sh and scripts/bundle-rev.sh (from the repo
# root): `rev_worktree NAME REV TARGET` checks out REV in a temporary worktree
# ($wt, removed on exit) and picks its cargo target dir ($target): TARGET if
# set (kept across runs, so the dependencies build once), else one beside the
# worktree. A separate target dir because the binaries embed their tree's
# templates; never this tree's ./target, whose builds would then be rebuilt
# from the other tree's sources.
rev_worktree() {
  local name=$1 rev=$2 keep=$3
  wt=$(mktemp -d)/tree
  git worktree add -q --detach "$wt" "$rev"
  trap 'git worktree remove --force "$wt"' EXIT
  target=$(realpath -m "${keep:-$wt/../target}")
  [ "$target" != "$(realpath -m target)" ] || { echo "$name: its target dir must not be ./target" >&2; exit 2; }
}
