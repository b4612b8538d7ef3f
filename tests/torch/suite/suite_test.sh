#!/usr/bin/env bash
# PyTorch's own distributed_test.py on the "tdist" backend against the same tests on gloo
# (tests/torch/suite/run_suite.py says how), for the PyTorch of $TDIST_TORCH (1.13 or 2.6, see
# tests/testlib/torch.sh) at one world size. Fails on any test gloo passes and tdist does not,
# unless expected_failures.txt lists it with its reason, and on a listed test that passes.
#   args: LIBTDIST_SO PACKAGE_INIT_PY RUN_SUITE_PY EXPECTED WORLD [SELECT]
# TDIST_SUITE_JOBS: tests run at a time (default 4: a test mostly waits on its ranks' polling);
# TDIST_SUITE_TESTS=a,b runs only those tests (by hand: bazel test --test_env=...).
set -uo pipefail
LIB="${TEST_SRCDIR:+$TEST_SRCDIR/${TEST_WORKSPACE:-tdist}/tests/testlib}"
[ -f "$LIB/bounded.sh" ] || LIB="$(dirname "$(realpath "$0")")/../../testlib"
. "$LIB/bounded.sh"
. "$LIB/torch.sh"
exec 9>&2
export TDIST_LIBRARY="$(realpath "$1")"
# The scripts run from the checkout (runfiles lead there): no __pycache__ written into it.
export PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$(dirname "$(dirname "$(realpath "$2")")")"
args=(--world "$5" --expected "$(realpath "$4")" --jobs "${TDIST_SUITE_JOBS:-4}" --timeout 90)
[ $# -ge 6 ] && args+=(--select "$(realpath "$6")")
[ -n "${TDIST_SUITE_TESTS:-}" ] && args+=(--tests "$TDIST_SUITE_TESTS")
# The group's C++ half must be what runs (torch.sh sets TDIST_TORCH_IMPL=cpp with the build).
[ -n "${TDIST_TORCH_EXT:-}" ] || { echo "FAIL: no tdist_torch C++ group for PyTorch $TORCH_VERSION"; exit 1; }
# Under Bazel's limit for a large test (900 s), so that a hang leaves bounded's report.
bounded 840 "$PY" -u "$(realpath "$3")" "${args[@]}"
rc=$?
[ $rc -eq 0 ] && echo "PASS: PyTorch $TORCH_VERSION's distributed_test.py on tdist, world $5" ||
  echo "FAIL: run_suite exited $rc"
exit $rc
