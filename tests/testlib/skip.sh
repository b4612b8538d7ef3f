# Sourced by shell tests: `test_skip REASON` reports a part that cannot run here, with the same
# convention as tests/testlib/skip.h. It prints one line "TDIST-TEST-SKIP: REASON" (which
# .ci/test counts and lists) and returns 0 only when the run opts out explicitly with
# TDIST_TEST_ALLOW_SKIP=1 (`bazel test --test_env=TDIST_TEST_ALLOW_SKIP=1`; CI never sets it);
# otherwise it prints a FAIL line and returns 1, and the caller must fail the test.
test_skip() {
  if [ "${TDIST_TEST_ALLOW_SKIP:-}" = 1 ]; then
    echo "TDIST-TEST-SKIP: $* (allowed: TDIST_TEST_ALLOW_SKIP=1)"
    return 0
  fi
  echo "TDIST-TEST-SKIP: $*"
  echo "FAIL: a skipped part fails the test; set TDIST_TEST_ALLOW_SKIP=1 to allow skips" \
    "(bazel test --test_env=TDIST_TEST_ALLOW_SKIP=1)"
  return 1
}
