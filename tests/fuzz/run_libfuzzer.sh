#!/usr/bin/env bash
# Coverage-guided fuzzing of the TCPStore codec with libFuzzer, outside Bazel.
#
#   tests/fuzz/run_libfuzzer.sh [SECONDS]      (default 60; CI runs ~60)
#
# Compiles runtime/store/proto.c + tests/fuzz/proto_fuzz.c with
# `clang -fsanitize=fuzzer,address,undefined` and runs for SECONDS, starting from the checked-in
# seed corpus (tests/fuzz/corpus, read only) plus a scratch corpus in a temporary directory.
# Exit status 0 when no invariant failed and no sanitizer fired; otherwise non-zero, and the
# crashing input is kept (its path is printed) so that it can be replayed:
#   <work>/proto_fuzz <crash-file>     or copied into tests/fuzz/corpus/ as a regression seed.
# Needs clang and libclang-rt-14-dev (listed in .ci/packages.txt). TDIST_FUZZ_WORK=DIR keeps the
# build and scratch corpus in DIR instead of a fresh temporary directory.
set -euo pipefail

seconds="${1:-60}"
case "$seconds" in
  ''|*[!0-9]*) echo "run_libfuzzer.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cc="${CC_FUZZ:-clang}"
if ! command -v "$cc" >/dev/null; then
  echo "run_libfuzzer.sh: '$cc' not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
work="${TDIST_FUZZ_WORK:-$(mktemp -d /tmp/tdist-fuzz.XXXXXX)}"
mkdir -p "$work/corpus" "$work/artifacts"

echo "run_libfuzzer.sh: building $work/proto_fuzz with $($cc --version | head -1)"
"$cc" -std=gnu11 -g -O1 -fno-omit-frame-pointer \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -I"$root" \
  "$root/runtime/store/proto.c" "$root/tests/fuzz/proto_fuzz.c" \
  -o "$work/proto_fuzz"

echo "run_libfuzzer.sh: fuzzing for ${seconds}s (seeds: $(ls "$root/tests/fuzz/corpus" | wc -l) files)"
rc=0
# -max_len bounds an input (and the work of the prefix checks); -timeout/-rss_limit_mb turn a hang
# or a runaway allocation into a reported failure instead of a stuck CI job. The run is bounded
# by `timeout` too, in case libFuzzer itself cannot stop.
timeout --signal=KILL "$((seconds + 120))" \
  "$work/proto_fuzz" \
    -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -dict="$root/tests/fuzz/proto.dict" \
    -artifact_prefix="$work/artifacts/" \
    -print_final_stats=1 \
    "$work/corpus" "$root/tests/fuzz/corpus" >"$work/fuzz.log" 2>&1 || rc=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|Done [0-9]+ runs)' \
  "$work/fuzz.log" || true
if [ "$rc" -ne 0 ]; then
  echo "run_libfuzzer.sh: FAILED (exit $rc). Last lines of $work/fuzz.log:" >&2
  grep -E -A3 'invariant failed|ERROR: |SUMMARY: ' "$work/fuzz.log" | head -40 >&2 || true
  ls -1 "$work/artifacts/" | sed "s|^|run_libfuzzer.sh: crashing input: $work/artifacts/|" >&2 || true
  exit 1
fi
echo "run_libfuzzer.sh: PASSED (${seconds}s, no invariant failed)"
if [ -z "${TDIST_FUZZ_WORK:-}" ]; then rm -rf "$work"; fi
