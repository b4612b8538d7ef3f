/* Minimal assertion helpers for cc_test binaries. A failed CHECK prints file:line and the
 * expression (and values for the typed forms) and exits 1, so Bazel marks the test failed. */
#ifndef TDIST_TESTLIB_CHECK_H
#define TDIST_TESTLIB_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                                      \
  do {                                                                                          \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                       \
    if (va_ != vb_) {                                                                           \
      fprintf(stderr, "%s:%d: CHECK_EQ_INT failed: %s = %lld, %s = %lld\n", __FILE__, __LINE__, \
              #a, va_, #b, vb_);                                                                \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

#define CHECK_MEM_EQ(p, plen, q, qlen)                                                            \
  do {                                                                                            \
    size_t pl_ = (size_t)(plen), ql_ = (size_t)(qlen);                                            \
    if (pl_ != ql_ || (pl_ && memcmp((p), (q), pl_) != 0)) {                                      \
      fprintf(stderr, "%s:%d: CHECK_MEM_EQ failed: %s (%zu bytes) != %s (%zu bytes)\n", __FILE__, \
              __LINE__, #p, pl_, #q, ql_);                                                        \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)

/* CHECK_OK(expr) for calls returning tdist_status_t; prints the status and, when given, a detail
 * string expression. */
#define CHECK_OK_MSG(expr, detail)                                                        \
  do {                                                                                    \
    int st_ = (int)(expr);                                                                \
    if (st_ != 0) {                                                                       \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #expr, st_, \
              tdist_strerror((tdist_status_t)st_), (detail));                             \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)
#define CHECK_OK(expr) CHECK_OK_MSG(expr, tdist_last_error())

#define TEST_LOG(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

#endif
