/* A test that cannot run one of its parts says so with test_skip(): a skip is a failure unless the
 * run opts out explicitly with TDIST_TEST_ALLOW_SKIP=1 (`bazel test
 * --test_env=TDIST_TEST_ALLOW_SKIP=1 ...`; CI never sets it). Either way the reason is printed on
 * one line starting with TEST_SKIP_MARKER, which .ci/test counts and lists in its summary. The
 * shell tests use the same convention through tests/testlib/skip.sh. */
#ifndef TDIST_TESTLIB_SKIP_H
#define TDIST_TESTLIB_SKIP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SKIP_MARKER "TDIST-TEST-SKIP:"

/* 1 when this run allows skips (TDIST_TEST_ALLOW_SKIP=1). */
static inline int test_skip_allowed(void) {
  const char *v = getenv("TDIST_TEST_ALLOW_SKIP");
  return v && strcmp(v, "1") == 0;
}

/* Reports a skipped part (printf-style reason). Returns when skips are allowed (the caller then
 * leaves that part out); otherwise exits 1, so the test fails. */
__attribute__((format(printf, 1, 2))) static inline void test_skip(const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (test_skip_allowed()) {
    fprintf(stderr, "%s %s (allowed: TDIST_TEST_ALLOW_SKIP=1)\n", TEST_SKIP_MARKER, why);
    return;
  }
  fprintf(stderr,
          "%s %s\nFAIL: a skipped part fails the test; set TDIST_TEST_ALLOW_SKIP=1 to allow skips "
          "(bazel test --test_env=TDIST_TEST_ALLOW_SKIP=1)\n",
          TEST_SKIP_MARKER, why);
  exit(1);
}

#endif
