#!/usr/bin/env bash
# Before/after benchmark of tdist's gloo backend alone: an older coll_bench binary (BEFORE, e.g.
# one built from main before a change and copied aside) and this tree's, run alternately R times
# in one session (so the machine's drift hits both alike), then one table of the two with the
# ratio and the noise each build shows against itself (before_after.py).
#
#   bash bench/collectives/before_after.sh BEFORE_BIN [-r R] [coll_bench args...]
#   e.g. before_after.sh /tmp/coll_bench.main -r 3 --ranks 2,4 --colls all_reduce,broadcast \
#          --sizes 8,65536,4194304
#
# coll_bench runs with --peers none --repeat 1 (alternation replaces its own repeat). The raw
# TSVs stay in a temporary directory whose name is printed.
set -euo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

main() {
  [[ $# -ge 1 && "$1" != --help && "$1" != -h ]] || { usage; exit 2; }
  local before="$1" reps=3
  shift
  [[ -x "$before" ]] || { echo "before_after.sh: $before is not an executable coll_bench" >&2; exit 2; }
  if [[ "${1:-}" == -r ]]; then
    [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "before_after.sh: -r needs a count >= 1, got '${2:-}'" >&2; exit 2; }
    reps="$2"
    shift 2
  fi
  bazel build -c opt --color=no --curses=no //bench/collectives:coll_bench </dev/null
  local after dir
  after="$(bazel info -c opt bazel-bin 2>/dev/null)/bench/collectives/coll_bench"
  dir="$(mktemp -d /tmp/coll_before_after.XXXXXX)"
  echo "before_after.sh: raw results in $dir" >&2
  for ((i = 1; i <= reps; i++)); do
    "$before" --peers none --repeat 1 --tsv "$dir/before.$i.tsv" "$@" >"$dir/before.$i.log"
    "$after" --peers none --repeat 1 --tsv "$dir/after.$i.tsv" "$@" >"$dir/after.$i.log"
  done
  python3 bench/collectives/before_after.py "$dir"
}

main "$@"
