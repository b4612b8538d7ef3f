/* Tests of the test harness itself: every failing check exits 1 and prints the expression, both
 * values, the file:line and the running case; passing checks do not exit; TDIST_TEST_SEED
 * replays a generator and a bad value is refused; sharding splits jobs as Bazel expects and
 * rejects bad indices; the process helpers tell an exit from a signal and stop a child that
 * outlives its deadline. Each failing check runs in a child whose stderr is captured. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "proc.h"
#include "rng.h"
#include "shard.h"
#include "tdist/tdist.h"
#include "wire_enc.h"

typedef void (*body_fn)(void);

/* Runs body in a child with stderr captured; returns the wait status, the text in out. */
static int run_child(body_fn body, char *out, size_t cap) {
  int p[2];
  CHECK(pipe(p) == 0);
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], 2);
    body();
    exit(0);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t k;
  while (n + 1 < cap && (k = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
  out[n] = '\0';
  close(p[0]);
  int st = test_wait(pid, 30000);
  CHECK(st != -1);
  return st;
}

/* body must fail (exit 1) with a message holding every one of want (NULL-terminated). */
static void expect_failure(const char *what, body_fn body, const char *const *want) {
  char out[4096];
  int st = run_child(body, out, sizeof out);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 1) {
    char how[96];
    TEST_FAIL("%s: want exit 1, the child %s; stderr: %s", what,
              test_wait_text(st, how, sizeof how), out);
  }
  for (const char *const *w = want; *w; w++)
    if (!strstr(out, *w)) TEST_FAIL("%s: message lacks \"%s\": %s", what, *w, out);
}
#define WANT(...) ((const char *const[]){__VA_ARGS__, NULL})

static void f_int(void) {
  int a = 2;
  CHECK_EQ_INT(a + 2, 5);
}
static void f_cmp(void) { CHECK_CMP_INT(-3, >, 7); }
static void f_uint(void) { CHECK_EQ_UINT((size_t)-1, 0); }
static void f_str(void) { CHECK_STR("abc", "abd"); }
static void f_str_null(void) { CHECK_STR(NULL, "x"); }
static void f_has(void) { CHECK_HAS("hello world", "xyz"); }
static void f_mem(void) { CHECK_MEM_EQ("abcdef", 6, "abcxef", 6); }
static void f_mem_len(void) { CHECK_MEM_EQ("abc", 3, "abcd", 4); }
static void f_status(void) { CHECK_STATUS(TDIST_ERR_TIMEOUT, TDIST_OK); }
static void f_ok(void) { CHECK_OK_MSG(TDIST_ERR_INVALID_ARGUMENT, "the detail"); }
static void f_false(void) { CHECK_FALSE(1 + 1 == 2); }
static void f_case(void) {
  TEST_CASE("case seven");
  CHECK(7 == 8);
}
static void f_fail(void) { TEST_FAIL("custom %d", 42); }
static void f_seed_bad(void) {
  setenv("TDIST_TEST_SEED", "12x", 1);
  test_seed("testlib_test", 1);
}
static void f_shard_bad(void) {
  setenv("TEST_TOTAL_SHARDS", "3", 1);
  setenv("TEST_SHARD_INDEX", "3", 1);
  test_shard_init("testlib_test");
}
static void f_unhex_odd(void) {
  uint8_t b[4];
  unhex("abc", b, sizeof b);
}

/* Every check in its passing form: the child must exit 0 with nothing on stderr. */
static void f_passing(void) {
  CHECK(1);
  CHECK_TRUE(2 > 1);
  CHECK_FALSE(0);
  CHECK_EQ_INT(-5, -5);
  CHECK_CMP_INT(-5, <, 3);
  CHECK_EQ_UINT((size_t)-1, (unsigned long long)-1);
  CHECK_CMP_UINT(3u, >=, 3u);
  CHECK_STR("x", "x");
  CHECK_STR(NULL, NULL);
  CHECK_HAS("hello", "ell");
  CHECK_MEM_EQ("a\0b", 3, "a\0b", 3);
  CHECK_MEM_EQ(NULL, 0, "", 0);
  CHECK_STATUS(TDIST_ERR_TIMEOUT, TDIST_ERR_TIMEOUT);
  CHECK_OK(TDIST_OK);
}

static void test_checks(void) {
  expect_failure("CHECK_EQ_INT", f_int,
                 WANT("testlib_test.c:", "a + 2 == 5", "a + 2 = 4", "5 = 5"));
  expect_failure("CHECK_CMP_INT", f_cmp, WANT("-3 > 7", "-3 = -3", "7 = 7"));
  expect_failure("CHECK_EQ_UINT", f_uint, WANT("18446744073709551615", "0 = 0"));
  expect_failure("CHECK_STR", f_str, WANT("\"abc\"", "\"abd\""));
  expect_failure("CHECK_STR NULL", f_str_null, WANT("NULL = (null)", "\"x\""));
  expect_failure("CHECK_HAS", f_has, WANT("\"hello world\" does not contain \"xyz\""));
  expect_failure("CHECK_MEM_EQ", f_mem, WANT("(6 bytes)", "offset 3: 0x64 != 0x78"));
  expect_failure("CHECK_MEM_EQ length", f_mem_len,
                 WANT("(3 bytes)", "(4 bytes)", "equal up to the shorter length"));
  expect_failure("CHECK_STATUS", f_status,
                 WANT(tdist_status_name(TDIST_ERR_TIMEOUT), tdist_strerror(TDIST_ERR_TIMEOUT),
                      tdist_status_name(TDIST_OK)));
  expect_failure("CHECK_OK_MSG", f_ok,
                 WANT(tdist_status_name(TDIST_ERR_INVALID_ARGUMENT), "detail: the detail"));
  expect_failure("CHECK_FALSE", f_false, WANT("1 + 1 == 2 is true"));
  expect_failure("TEST_CASE", f_case, WANT("[case seven]", "7 == 8"));
  expect_failure("TEST_FAIL", f_fail, WANT("custom 42"));
  expect_failure("unhex odd", f_unhex_odd, WANT("half < 0"));
  char out[4096];
  int st = run_child(f_passing, out, sizeof out);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || out[0])
    TEST_FAIL("passing checks: status 0x%x, stderr: %s", st, out);
  uint8_t b[4];
  CHECK_MEM_EQ(b, unhex("00 ff\n1A", b, sizeof b), "\x00\xff\x1a", 3);
  TEST_LOG("checks: each failure names the expression and both values");
}

static void test_rng_helpers(void) {
  setenv("TDIST_TEST_SEED", "0x2a", 1);
  CHECK_EQ_UINT(test_seed("testlib_test", 7), 42);
  unsetenv("TDIST_TEST_SEED");
  CHECK_EQ_UINT(test_seed("testlib_test", 7), 7);
  CHECK_CMP_UINT(test_seed("testlib_test", 0), !=, 0);
  expect_failure("bad TDIST_TEST_SEED", f_seed_bad,
                 WANT("TDIST_TEST_SEED=\"12x\" is not a number"));
  /* the same seed gives the same numbers; another seed others */
  test_rng_t a, b, c;
  test_rng_seed(&a, 99);
  test_rng_seed(&b, 99);
  test_rng_seed(&c, 100);
  int same = 0;
  for (int i = 0; i < 1000; i++) {
    uint64_t x = test_rng_next(&a);
    CHECK_EQ_UINT(x, test_rng_next(&b));
    same += x == test_rng_next(&c);
  }
  CHECK_EQ_INT(same, 0);
  /* a zero seed still moves (0 is xorshift's fixed point) */
  test_rng_seed(&a, 0);
  CHECK_CMP_UINT(test_rng_next(&a), !=, test_rng_next(&a));
  /* below n, every value reached */
  test_rng_init("testlib_test", 5);
  int seen[7] = {0};
  for (int i = 0; i < 7000; i++) {
    uint64_t v = rnd_below(7);
    CHECK_CMP_UINT(v, <, 7);
    seen[v]++;
  }
  for (int v = 0; v < 7; v++) CHECK_CMP_INT(seen[v], >, 500);
  CHECK_EQ_UINT(rnd_below(0), 0);
  TEST_LOG("rng: TDIST_TEST_SEED replays, bad values refused, values in range");
}

static void test_shard(void) {
  char path[512];
  const char *tmp = getenv("TEST_TMPDIR");
  snprintf(path, sizeof path, "%s/shard_status.%d", tmp && *tmp ? tmp : "/tmp", (int)getpid());
  setenv("TEST_TOTAL_SHARDS", "3", 1);
  setenv("TEST_SHARD_INDEX", "1", 1);
  setenv("TEST_SHARD_STATUS_FILE", path, 1);
  unlink(path);
  test_shard_t s = test_shard_init("testlib_test");
  struct stat sb;
  CHECK_EQ_INT(stat(path, &sb), 0); /* Bazel's sign that the test knows about sharding */
  unlink(path);
  char got[16] = {0};
  for (int j = 0; j < 9; j++) got[j] = test_shard_take(&s) ? 'x' : '.';
  CHECK_STR(got, ".x..x..x.");
  unsetenv("TEST_TOTAL_SHARDS");
  unsetenv("TEST_SHARD_INDEX");
  unsetenv("TEST_SHARD_STATUS_FILE");
  s = test_shard_init("testlib_test");
  for (int j = 0; j < 5; j++) CHECK(test_shard_take(&s)); /* not sharded: every job */
  expect_failure("shard index", f_shard_bad,
                 WANT("TEST_SHARD_INDEX=3 is not below TEST_TOTAL_SHARDS=3"));
  TEST_LOG("shard: jobs dealt round robin, status file touched, bad index refused");
}

static void test_proc(void) {
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) raise(SIGKILL);
  CHECK_EQ_INT(test_expect_killed(pid, SIGKILL, "self-killer"), 0);
  pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) _exit(3);
  CHECK_EQ_INT(test_expect_exit(pid, 3, "exit 3"), 0);
  pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) _exit(3);
  CHECK_EQ_INT(test_expect_killed(pid, SIGKILL, "not a signal"), 1); /* and says why */
  pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    for (;;) pause();
  }
  int64_t t0 = now_ms();
  CHECK_EQ_INT(test_wait(pid, 100), -1); /* killed at its deadline, and reaped */
  CHECK_CMP_INT(now_ms() - t0, >=, 100);
  CHECK(kill(pid, 0) != 0);
  t0 = now_ms();
  sleep_ms(20);
  CHECK_CMP_INT(now_ms() - t0, >=, 20); /* sleeps at least as asked */
  TEST_LOG("proc: exits and signals told apart, a deadline kills");
}

int main(void) {
  test_checks();
  test_rng_helpers();
  test_shard();
  test_proc();
  TEST_LOG("testlib_test: all passed");
  return 0;
}
