#!/usr/bin/env bash
# Builds the store benchmark optimised (-c opt) and runs it; arguments go to store_bench
# (see `bench/store/run.sh --help`). With TDIST_STORE_BIN=1 our server runs as the tdist-store
# binary (a separate process, like torch's) instead of in-process.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(//bench/store:store_bench)
[[ "${TDIST_STORE_BIN:-0}" == 1 ]] && targets+=(//runtime/store:tdist-store)
bazel build -c opt "${targets[@]}"
# The bazel-bin symlink follows whichever configuration built last in this shared workspace;
# ask for the -c opt output directory instead.
bin="$(bazel info -c opt bazel-bin 2>/dev/null)"
args=()
[[ "${TDIST_STORE_BIN:-0}" == 1 ]] && args+=(--tdist-store "$bin/runtime/store/tdist-store")
exec "$bin/bench/store/store_bench" "${args[@]}" "$@"
