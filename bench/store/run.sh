#!/usr/bin/env bash
# Builds the store benchmark optimised (-c opt) and runs it; arguments go to store_bench
# (see `bench/store/run.sh --help`). With TDIST_STORE_BIN=1 our server runs as the tdist-store
# binary (a separate process, like torch's) instead of in-process.
#
# bench/store/run.sh --soak [--before PATH] [soak flags]: the soak instead (bench/store/soak.c,
# `--soak --help`): this tree's tdist-store under hostile and honest clients; --before PATH runs
# another tdist-store binary (an older build) the same way first, for a before/after table.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ "${1:-}" == --soak ]]; then
  shift
  before=""
  if [[ "${1:-}" == --before ]]; then
    [[ $# -ge 2 && -x "$2" ]] || { echo "run.sh: --before needs an executable tdist-store" >&2; exit 2; }
    before="$2"
    shift 2
  fi
  bazel build -c opt //bench/store:soak //runtime/store/cli:tdist-store
  bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
  [[ -n "$before" ]] && "$bin/bench/store/soak" --tdist-store "$before" --label before "$@"
  exec "$bin/bench/store/soak" --tdist-store "$bin/runtime/store/cli/tdist-store" --label after "$@"
fi
targets=(//bench/store:store_bench)
[[ "${TDIST_STORE_BIN:-0}" == 1 ]] && targets+=(//runtime/store/cli:tdist-store)
bazel build -c opt "${targets[@]}"
# The bazel-bin symlink follows whichever configuration built last in this shared workspace;
# ask for the -c opt output directory instead.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
args=()
[[ "${TDIST_STORE_BIN:-0}" == 1 ]] && args+=(--tdist-store "$bin/runtime/store/cli/tdist-store")
exec "$bin/bench/store/store_bench" "${args[@]}" "$@"
