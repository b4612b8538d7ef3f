#!/usr/bin/env bash
# Pipelined SETs from real PyTorch TCPStore clients (2.6 from the Debian 13 root, 1.13 from
# /usr/bin/python3) against tdist-store and against torch's own servers, interleaved in one run:
# builds tdist-store (-c opt) and runs bench/store/torch_pipeline.py's driver, which prints
# SETs/s and server CPU per run, the medians and the ratio tdist/torch. Asserts nothing about speed.
#
#   bench/store/torch_pipeline.sh [--keys N] [--value-bytes B] [--repeat R] [--clients 2.6,1.13]
#   bench/store/torch_pipeline.sh --tdist-store [LABEL=]PATH ...  # given builds (repeatable),
#                                                                   # none built
set -euo pipefail

tmp=""

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  echo "options: --keys N (200000) --value-bytes B (16) --repeat R (5) --clients LIST (2.6,1.13)"
  echo "         --tdist-store PATH  --tdist-only (no torch server: for profiling ours)"
}

main() {
  cd "$(dirname "$0")/../.."
  local stores=() args=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -h | --help) usage; return 0 ;;
      --tdist-store) stores+=(--tdist-store "$2"); shift 2 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  if [[ ${#stores[@]} -eq 0 ]]; then
    bazel build -c opt //runtime/store/cli:tdist-store
    stores=(--tdist-store "$(bazel info -c opt bazel-bin 2>/dev/null)/runtime/store/cli/tdist-store")
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 bench/store/torch_pipeline.py driver "${stores[@]}" \
    --py26 "$PWD/tests/testlib/torch26/python3" --tmp "$tmp" "${args[@]}"
}

main "$@"
