#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer, outside Bazel, of four targets:
#   proto_fuzz      the TCPStore codec (runtime/store/proto.c + tests/fuzz/proto_fuzz.c)
#   config_fuzz     the agent's YAML configuration reader (operator-agent/config/*.c +
#                   tests/fuzz/config_fuzz.c, linked with the system libyaml)
#   errorfile_fuzz  the agent's reader of workers' error files (JSON; supervisor/errorfile.c)
#   rdzv_record_fuzz  the rendezvous values' codec (operator-agent/rendezvous/rdzv_record.c)
#
#   tests/fuzz/run_libfuzzer.sh [SECONDS]      (default 60, split between the first three; CI runs
#                                              ~60; rdzv_record_fuzz runs SECONDS/6 more, at least 3)
#
# Each target is compiled with `clang -fsanitize=fuzzer,address,undefined` and runs for its share
# of SECONDS (proto gets the odd second), starting from its checked-in seed corpus (read only:
# tests/fuzz/corpus, tests/fuzz/corpus_config, corpus_errorfile, corpus_rdzv) plus a scratch
# corpus in a temporary directory.
# Both always run. Exit status 0 when no invariant failed and no sanitizer fired in either;
# otherwise non-zero, and each crashing input is kept (its path is printed) so that it can be
# replayed:  <work>/<target> <crash-file>   or copied into the seed corpus as a regression seed.
# Needs clang, libclang-rt-14-dev and libyaml-dev (listed in .ci/packages.txt).
# TDIST_FUZZ_WORK=DIR keeps the builds and scratch corpora in DIR instead of a fresh temporary
# directory.
set -euo pipefail

seconds="${1:-60}"
case "$seconds" in
  ''|*[!0-9]*) echo "run_libfuzzer.sh: SECONDS must be a whole number, got '$seconds'" >&2; exit 2 ;;
esac
if [ "$seconds" -lt 3 ]; then
  echo "run_libfuzzer.sh: SECONDS must be at least 3 (one per target), got $seconds" >&2
  exit 2
fi
config_seconds=$((seconds / 3))
errorfile_seconds=$((seconds / 3))
proto_seconds=$((seconds - config_seconds - errorfile_seconds))
# The rendezvous codec is small (7 fields, 4 parsers): a short run covers it.
rdzv_seconds=$((seconds / 6 > 3 ? seconds / 6 : 3))
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cc="${CC_FUZZ:-clang}"
if ! command -v "$cc" >/dev/null; then
  echo "run_libfuzzer.sh: '$cc' not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
fi
work="${TDIST_FUZZ_WORK:-$(mktemp -d /tmp/tdist-fuzz.XXXXXX)}"
mkdir -p "$work"
flags=(-std=gnu11 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I"$root" -I"$root/include")

echo "run_libfuzzer.sh: building in $work with $($cc --version | head -1)"
"$cc" "${flags[@]}" \
  "$root/runtime/store/proto.c" "$root/tests/fuzz/proto_fuzz.c" \
  -o "$work/proto_fuzz"
"$cc" "${flags[@]}" \
  "$root/operator-agent/config/config.c" "$root/operator-agent/config/config_opts.c" \
  "$root/operator-agent/config/config_usage.c" "$root/operator-agent/config/config_yaml.c" \
  "$root/operator-agent/common/utf8.c" "$root/tests/fuzz/config_fuzz.c" -lyaml -lpthread \
  -o "$work/config_fuzz"
"$cc" "${flags[@]}" \
  "$root/operator-agent/supervisor/errorfile.c" "$root/operator-agent/common/utf8.c" \
  "$root/tests/fuzz/errorfile_fuzz.c" \
  -o "$work/errorfile_fuzz"
"$cc" "${flags[@]}" \
  "$root/operator-agent/rendezvous/rdzv_record.c" "$root/operator-agent/state/state.c" \
  "$root/tests/fuzz/rdzv_record_fuzz.c" -lpthread \
  -o "$work/rdzv_record_fuzz"

failed=0
# run_target NAME SECONDS SEED_DIR DICT MAX_LEN
# -max_len bounds an input (and the work per input); -timeout/-rss_limit_mb turn a hang or a
# runaway allocation into a reported failure instead of a stuck CI job. The run is bounded by
# `timeout` too, in case libFuzzer itself cannot stop.
run_target() {
  local name="$1" secs="$2" seeds="$3" dict="$4" max_len="$5" rc=0
  mkdir -p "$work/$name.corpus" "$work/$name.artifacts"
  echo "run_libfuzzer.sh: fuzzing $name for ${secs}s (seeds: $(ls "$seeds" | wc -l) files)"
  TDIST_FUZZ_TMPDIR="$work" timeout --signal=KILL "$((secs + 120))" \
    "$work/$name" \
      -max_total_time="$secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
      -dict="$dict" \
      -artifact_prefix="$work/$name.artifacts/" \
      -print_final_stats=1 \
      "$work/$name.corpus" "$seeds" >"$work/$name.log" 2>&1 || rc=$?
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::new_units_added|Done [0-9]+ runs)' \
    "$work/$name.log" | sed "s/^/  $name: /" || true
  if [ "$rc" -ne 0 ]; then
    echo "run_libfuzzer.sh: $name FAILED (exit $rc). Last lines of $work/$name.log:" >&2
    grep -E -A3 'invariant failed|ERROR: |SUMMARY: ' "$work/$name.log" | head -40 >&2 || true
    ls -1 "$work/$name.artifacts/" |
      sed "s|^|run_libfuzzer.sh: crashing input: $work/$name.artifacts/|" >&2 || true
    failed=1
  fi
}

run_target proto_fuzz "$proto_seconds" "$root/tests/fuzz/corpus" "$root/tests/fuzz/proto.dict" 4096
run_target config_fuzz "$config_seconds" "$root/tests/fuzz/corpus_config" \
  "$root/tests/fuzz/config.dict" 8192
run_target errorfile_fuzz "$errorfile_seconds" "$root/tests/fuzz/corpus_errorfile" \
  "$root/tests/fuzz/errorfile.dict" 65536
run_target rdzv_record_fuzz "$rdzv_seconds" "$root/tests/fuzz/corpus_rdzv" \
  "$root/tests/fuzz/rdzv.dict" 512

if [ "$failed" -ne 0 ]; then
  echo "run_libfuzzer.sh: FAILED (work directory kept: $work)" >&2
  exit 1
fi
echo "run_libfuzzer.sh: PASSED (${proto_seconds}s proto_fuzz, ${config_seconds}s config_fuzz, ${errorfile_seconds}s errorfile_fuzz, ${rdzv_seconds}s rdzv_record_fuzz, no invariant failed)"
if [ -z "${TDIST_FUZZ_WORK:-}" ]; then rm -rf "$work"; fi
