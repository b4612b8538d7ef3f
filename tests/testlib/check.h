/* Assertions for cc_test binaries. A failed check prints file:line, the expression and the values
 * it compared (and the running case, see TEST_CASE), then exits 1, so Bazel marks the test failed.
 * Header-only and free of libtdist: the status checks name tdist_strerror/tdist_last_error only
 * (and tdist_status_name) inside their expansion, so a file that uses them includes
 * "tdist/tdist.h".
 *
 *   CHECK(c) CHECK_TRUE(c) CHECK_FALSE(c)      a condition
 *   CHECK_EQ_INT(a, b)  CHECK_CMP_INT(a, <, b) signed integers (as long long)
 *   CHECK_EQ_UINT(a, b) CHECK_CMP_UINT(a, <, b) unsigned integers and sizes (unsigned long long)
 *   CHECK_STR(a, b)  CHECK_HAS(s, sub)         C strings (NULL is a value), a substring
 *   CHECK_MEM_EQ(p, plen, q, qlen)             byte strings: both lengths, the first differing
 * offset CHECK_OK(expr)  CHECK_OK_MSG(expr, detail) a tdist_status_t that must be TDIST_OK
 *   CHECK_STATUS(expr, want)                   a given tdist_status_t (CHECK_STATUS_MSG with
 * detail) CHECK_STORE_STATUS(expr, want, store)      ... with the store handle's detail;
 *   CHECK_STORE_OK(expr, store)                TDIST_OK and the handle's detail cleared
 *   TEST_FAIL(fmt, ...)                        an unconditional failure with a message
 *   TEST_LOG(fmt, ...)                         one line on stderr */
#ifndef TDIST_TESTLIB_CHECK_H
#define TDIST_TESTLIB_CHECK_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The case being run, printed with every failure; set with TEST_CASE("name") (NULL: none). */
static const char *test_case_name __attribute__((unused));
#define TEST_CASE(name) (test_case_name = (name))

static inline void test_fail_at_(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
static inline void test_fail_at_(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fflush(stdout);
  fprintf(stderr, "%s:%d: ", file, line);
  if (test_case_name) fprintf(stderr, "[%s] ", test_case_name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}
#define TEST_FAIL(...) test_fail_at_(__FILE__, __LINE__, __VA_ARGS__)

#define TEST_LOG(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) test_fail_at_(__FILE__, __LINE__, "CHECK failed: %s", #cond); \
  } while (0)
#define CHECK_TRUE(cond) CHECK(cond)
#define CHECK_FALSE(cond)                                                                 \
  do {                                                                                    \
    if (cond) test_fail_at_(__FILE__, __LINE__, "CHECK_FALSE failed: %s is true", #cond); \
  } while (0)

#define CHECK_CMP_INT(a, op, b)                                                                  \
  do {                                                                                           \
    long long va_ = (long long)(a), vb_ = (long long)(b);                                        \
    if (!(va_ op vb_))                                                                           \
      test_fail_at_(__FILE__, __LINE__, "CHECK failed: %s %s %s, with %s = %lld, %s = %lld", #a, \
                    #op, #b, #a, va_, #b, vb_);                                                  \
  } while (0)
#define CHECK_EQ_INT(a, b) CHECK_CMP_INT(a, ==, b)

#define CHECK_CMP_UINT(a, op, b)                                                                 \
  do {                                                                                           \
    unsigned long long va_ = (unsigned long long)(a), vb_ = (unsigned long long)(b);             \
    if (!(va_ op vb_))                                                                           \
      test_fail_at_(__FILE__, __LINE__, "CHECK failed: %s %s %s, with %s = %llu, %s = %llu", #a, \
                    #op, #b, #a, va_, #b, vb_);                                                  \
  } while (0)
#define CHECK_EQ_UINT(a, b) CHECK_CMP_UINT(a, ==, b)

static inline void test_check_str_(const char *file, int line, const char *ea, const char *a,
                                   const char *eb, const char *b) {
  if (a != NULL && b != NULL && strcmp(a, b) == 0) return;
  if (a == NULL && b == NULL) return;
  test_fail_at_(file, line, "CHECK_STR failed:\n  %s = %s%s%s\n  %s = %s%s%s", ea, a ? "\"" : "",
                a ? a : "(null)", a ? "\"" : "", eb, b ? "\"" : "", b ? b : "(null)",
                b ? "\"" : "");
}
#define CHECK_STR(a, b) test_check_str_(__FILE__, __LINE__, #a, (a), #b, (b))

static inline void test_check_has_(const char *file, int line, const char *es, const char *s,
                                   const char *sub) {
  if (s != NULL && sub != NULL && strstr(s, sub) != NULL) return;
  test_fail_at_(file, line, "CHECK_HAS failed: %s = \"%s\" does not contain \"%s\"", es,
                s ? s : "(null)", sub ? sub : "(null)");
}
#define CHECK_HAS(s, sub) test_check_has_(__FILE__, __LINE__, #s, (s), (sub))

static inline void test_check_mem_(const char *file, int line, const char *ep, const void *p,
                                   size_t pl, const char *eq, const void *q, size_t ql) {
  const unsigned char *a = p, *b = q;
  size_t n = pl < ql ? pl : ql, at = 0;
  while (at < n && a[at] == b[at]) at++;
  if (pl == ql && at == n) return;
  if (at < n)
    test_fail_at_(file, line,
                  "CHECK_MEM_EQ failed: %s (%zu bytes) != %s (%zu bytes): first difference at "
                  "offset %zu: 0x%02x != 0x%02x",
                  ep, pl, eq, ql, at, a[at], b[at]);
  test_fail_at_(file, line,
                "CHECK_MEM_EQ failed: %s (%zu bytes) != %s (%zu bytes): equal up to the shorter "
                "length",
                ep, pl, eq, ql);
}
#define CHECK_MEM_EQ(p, plen, q, qlen) \
  test_check_mem_(__FILE__, __LINE__, #p, (p), (size_t)(plen), #q, (q), (size_t)(qlen))

/* A tdist_status_t equal to want; on failure both statuses with their tdist_strerror text and
 * the detail string expression (evaluated only then). */
#define CHECK_STATUS_MSG(expr, want, detail)                                                     \
  do {                                                                                           \
    int st_ = (int)(expr), want_ = (int)(want);                                                  \
    if (st_ != want_) {                                                                          \
      const char *d_ = (detail);                                                                 \
      test_fail_at_(__FILE__, __LINE__, "%s returned %s (%s), want %s (%s); detail: %s", #expr,  \
                    tdist_status_name((tdist_status_t)st_), tdist_strerror((tdist_status_t)st_), \
                    tdist_status_name((tdist_status_t)want_),                                    \
                    tdist_strerror((tdist_status_t)want_), d_ ? d_ : "(null)");                  \
    }                                                                                            \
  } while (0)
#define CHECK_STATUS(expr, want) CHECK_STATUS_MSG(expr, want, tdist_last_error())
#define CHECK_OK_MSG(expr, detail) CHECK_STATUS_MSG(expr, 0, detail)
#define CHECK_OK(expr) CHECK_OK_MSG(expr, tdist_last_error())

/* For store handles: the detail is the handle's (the thread's when store is NULL). */
#define CHECK_STORE_STATUS(expr, want, store) \
  CHECK_STATUS_MSG(                           \
      expr, want,                             \
      (store) ? tdist_store_last_error((const tdist_store_t *)(store)) : tdist_last_error())
/* Success must also clear the handle's detail ("Empty if the last call succeeded"). */
#define CHECK_STORE_OK(expr, store)                                        \
  do {                                                                     \
    CHECK_STORE_STATUS(expr, 0, store);                                    \
    CHECK_STR(tdist_store_last_error((const tdist_store_t *)(store)), ""); \
  } while (0)

#endif
