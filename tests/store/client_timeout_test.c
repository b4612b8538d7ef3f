/* Tests of the TCP store client's waits and timeouts against our own server, through the public
 * API of include/tdist/store.h only: wait/get/multi_get/queue_pop timeouts and the calls right
 * after them (a timeout must never leave the connection out of step, including a wait released
 * just at its deadline), a wait released by another client, and ADD on a non-integer, in both
 * dialects. A timeout must not return early; the upper bounds are generous hang guards. Every
 * blocking call carries a timeout and an alarm turns any hang into a failure. Set TDIST_TEST_SEED
 * to replay a run; the seed is printed at start. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "client_testlib.h"
#include "clock.h"
#include "rng.h"
#include "tdist/tdist.h"

/* ------------------------------------------------------------------------------------------ */
/* Timeouts and the calls after them                                                           */
/* ------------------------------------------------------------------------------------------ */

static void test_wait_timeouts(int port, tdist_store_dialect_t dialect) {
  TEST_LOG("wait/get timeouts, dialect %s", dialect_name(dialect));
  tdist_store_t *a = connect_store(port, dialect, 20000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  char k1[64], k2[64], k3[64];
  snprintf(k1, sizeof k1, "missing-one-%s-%" PRIu64, dialect_name(dialect), rnd());
  snprintf(k2, sizeof k2, "missing-two-%s-%" PRIu64, dialect_name(dialect), rnd());
  snprintf(k3, sizeof k3, "present-%s-%" PRIu64, dialect_name(dialect), rnd());

  /* One missing key, explicit 200 ms. */
  const char *w1[1] = {k1};
  int64_t t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(a, w1, 1, 200), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 200);
  if (!strstr(tdist_store_last_error(a), k1)) {
    fprintf(stderr, "last_error does not name %s: %s\n", k1, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_STORE_OK(tdist_store_set(b, k1, "late", 4), b);
  check_in_step(a, b, "w1");
  expect_get_str(a, k1, "late");

  /* Several keys, one present: names the missing ones. */
  CHECK_STORE_OK(tdist_store_set(b, k3, "here", 4), b);
  const char *w3[3] = {k3, k2, k1};
  CHECK_STORE_OK(tdist_store_delete_key(b, k1, NULL), b);
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(a, w3, 3, 200), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 200);
  if (!strstr(tdist_store_last_error(a), k1) || !strstr(tdist_store_last_error(a), k2)) {
    fprintf(stderr, "last_error does not name %s and %s: %s\n", k1, k2, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_STORE_OK(tdist_store_set(b, k2, "2", 1), b);
  CHECK_STORE_OK(tdist_store_set(b, k1, "1", 1), b);
  check_in_step(a, b, "w3");
  CHECK_STORE_OK(tdist_store_wait(a, w3, 3, 1000), a);

  /* Negative timeout: the handle's. */
  CHECK_STORE_OK(tdist_store_set_timeout(a, 250), a);
  CHECK_EQ_INT(tdist_store_timeout(a), 250);
  char k4[64];
  snprintf(k4, sizeof k4, "missing-four-%s-%" PRIu64, dialect_name(dialect), rnd());
  const char *w4[1] = {k4};
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(a, w4, 1, -1), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  check_in_step(a, b, "w4");

  /* get of a missing key times out with the handle's timeout. */
  void *v = NULL;
  size_t n = 0;
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_get(a, k4, &v, &n), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  if (!strstr(tdist_store_last_error(a), k4)) {
    fprintf(stderr, "last_error does not name %s: %s\n", k4, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_STORE_OK(tdist_store_set(b, k4, "four", 4), b);
  check_in_step(a, b, "g4");
  expect_get_str(a, k4, "four");

  /* multi_get of a missing key likewise (emulated with WAIT + GETs on 1.13). */
  char k5[64];
  snprintf(k5, sizeof k5, "missing-five-%s-%" PRIu64, dialect_name(dialect), rnd());
  const char *w5[2] = {k4, k5};
  void *vals[2] = {0};
  size_t lens[2] = {0};
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_multi_get(a, w5, 2, vals, lens), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  CHECK_STORE_OK(tdist_store_set(b, k5, "five", 4), b);
  check_in_step(a, b, "m5");
  CHECK_STORE_OK(tdist_store_multi_get(a, w5, 2, vals, lens), a);
  CHECK_MEM_EQ(vals[0], lens[0], "four", 4);
  CHECK_MEM_EQ(vals[1], lens[1], "five", 4);
  tdist_free(vals[0]);
  tdist_free(vals[1]);

  /* A blocking pop on an empty queue (2.x only). */
  if (tdist_tcp_store_dialect(a) == TDIST_STORE_DIALECT_V2) {
    char q[64];
    snprintf(q, sizeof q, "empty-queue-%" PRIu64, rnd());
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_queue_pop(a, q, 200, &v, &n), TDIST_ERR_TIMEOUT, a);
    check_elapsed(now_ms() - t0, 200);
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_queue_pop(a, q, -1, &v, &n), TDIST_ERR_TIMEOUT, a);
    check_elapsed(now_ms() - t0, 250);
    CHECK_STORE_OK(tdist_store_queue_push(b, q, "x", 1), b);
    check_in_step(a, b, "q");
    CHECK_STORE_OK(tdist_store_queue_pop(a, q, 0, &v, &n), a);
    CHECK_MEM_EQ(v, n, "x", 1);
    tdist_free(v);
  }

  tdist_store_destroy(a);
  tdist_store_destroy(b);
}

typedef struct {
  tdist_store_t *s;
  const char *key;
  int64_t delay_ms;
  tdist_status_t st;
} setter_arg_t;

static void *delayed_set(void *p) {
  setter_arg_t *a = p;
  sleep_ms(a->delay_ms);
  a->st = tdist_store_set(a->s, a->key, "x", 1);
  return NULL;
}

/* The key is set right around the waiter's deadline, many times: whichever side wins, the
 * waiter's next answers are right. */
static void test_wait_race(int port, tdist_store_dialect_t dialect, int rounds) {
  TEST_LOG("wait released at its deadline, dialect %s, %d rounds", dialect_name(dialect), rounds);
  tdist_store_t *a = connect_store(port, dialect, 40);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  tdist_store_t *c = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  int ok = 0, timed_out = 0;
  for (int i = 0; i < rounds; i++) {
    char key[64];
    snprintf(key, sizeof key, "race-%s-%d-%" PRIu64, dialect_name(dialect), i, rnd());
    setter_arg_t arg = {c, key, 30 + (int64_t)rnd_below(21), TDIST_ERR_INTERNAL};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, delayed_set, &arg) == 0);
    tdist_status_t st;
    if (i % 2 == 0) {
      const char *w[1] = {key};
      st = tdist_store_wait(a, w, 1, 40);
    } else {
      void *v = NULL;
      size_t n = 0;
      st = tdist_store_get(a, key, &v, &n); /* handle timeout 40 ms */
      if (st == TDIST_OK) CHECK_MEM_EQ(v, n, "x", 1);
      tdist_free(v);
    }
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_STORE_OK(arg.st, c);
    if (st == TDIST_OK) {
      ok++;
    } else if (st == TDIST_ERR_TIMEOUT) {
      timed_out++;
    } else {
      fprintf(stderr, "round %d: %s: %s\n", i, tdist_status_name(st), tdist_store_last_error(a));
      exit(1);
    }
    CHECK_STORE_OK(tdist_store_set_timeout(a, 20000), a);
    check_in_step(a, b, "race");
    expect_get_str(a, key, "x");
    CHECK_STORE_OK(tdist_store_set_timeout(a, 40), a);
  }
  TEST_LOG("  %d released, %d timed out", ok, timed_out);
  tdist_store_destroy(a);
  tdist_store_destroy(b);
  tdist_store_destroy(c);
}

/* A wait released by another client before its deadline; the server reports it pending meanwhile.
 */
typedef struct {
  tdist_store_t *s;
  const char *key;
  tdist_status_t st;
  atomic_int returned; /* set once the wait has returned, whatever it returned */
} waiter_arg_t;

static void *waiter(void *p) {
  waiter_arg_t *a = p;
  const char *w[1] = {a->key};
  a->st = tdist_store_wait(a->s, w, 1, -1);
  atomic_store(&a->returned, 1);
  return NULL;
}

static void test_wait_released(tdist_store_dialect_t dialect) {
  TEST_LOG("wait released by another client, dialect %s", dialect_name(dialect));
  tdist_store_server_t *srv = start_server();
  int port = tdist_store_server_port(srv);
  /* The handle's timeout (the wait's, -1) is far longer than the test: an OK can only come from
   * the key being set, a timeout would return TDIST_ERR_TIMEOUT. */
  tdist_store_t *a = connect_store(port, dialect, 120000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  waiter_arg_t arg = {a, "released", TDIST_ERR_INTERNAL, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, waiter, &arg) == 0);
  tdist_store_server_stats_t st;
  int64_t deadline = now_ms() + 30000; /* a hang guard, not a bound */
  do {
    sleep_ms(5);
    tdist_store_server_stats(srv, &st);
  } while (st.waits_pending != 1 && now_ms() < deadline);
  CHECK_EQ_INT(st.waits_pending, 1);
  /* Still blocked while pending: the wait returns only once the key is set. */
  sleep_ms(50);
  CHECK_EQ_INT(atomic_load(&arg.returned), 0);
  CHECK_STORE_OK(tdist_store_set(b, "released", "r", 1), b);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK_STORE_OK(arg.st, a);
  tdist_store_server_stats(srv, &st);
  CHECK_EQ_INT(st.waits_pending, 0);
  check_in_step(a, b, "released");
  tdist_store_destroy(a);
  tdist_store_destroy(b);
  /* Connections closed by clients are noticed by the server. */
  deadline = now_ms() + 30000;
  do {
    sleep_ms(5);
    tdist_store_server_stats(srv, &st);
  } while (st.connections_open != 0 && now_ms() < deadline);
  CHECK_EQ_INT(st.connections_open, 0);
  CHECK(st.connections_total >= 2);
  tdist_store_server_destroy(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* ADD on a non-integer                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void test_add_non_integer(int port, tdist_store_dialect_t dialect) {
  TEST_LOG("add on a non-integer, dialect %s", dialect_name(dialect));
  tdist_store_t *a = connect_store(port, dialect, 5000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  /* Unambiguous non-integers only ("12abc" would pass std::stoll on a PyTorch server). */
  const char *bad[] = {"hello", "", "\x01\x02", "-"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char key[64];
    snprintf(key, sizeof key, "not-int-%s-%zu", dialect_name(dialect), i);
    CHECK_STORE_OK(tdist_store_set(b, key, bad[i], strlen(bad[i])), b);
    expect_ready(b, key, 1); /* SET has no reply: make sure it is applied before a's ADD */
    int64_t r = 424242;
    CHECK_STORE_STATUS(tdist_store_add(a, key, 1, &r), TDIST_ERR_INVALID_USAGE, a);
    CHECK(tdist_store_last_error(a)[0] != '\0');
    /* The handle works for the next call, and the value is unchanged. */
    expect_get_str(a, key, bad[i]);
    check_in_step(a, b, "add");
  }
  /* Signed decimal text works both ways. */
  CHECK_STORE_OK(tdist_store_set(a, "int-text", "-17", 3), a);
  int64_t r = 0;
  CHECK_STORE_OK(tdist_store_add(a, "int-text", 5, &r), a);
  CHECK_EQ_INT(r, -12);
  expect_get_str(b, "int-text", "-12");
  CHECK_STORE_OK(tdist_store_add(b, "int-text", INT64_C(1000000000000), &r), b);
  CHECK_EQ_INT(r, INT64_C(999999999988));
  expect_get_str(a, "int-text", "999999999988");
  tdist_store_destroy(a);
  tdist_store_destroy(b);
}

int main(void) {
  /* Any hang fails the test instead of waiting for Bazel's timeout. */
  alarm(240);
  signal(SIGPIPE, SIG_IGN);
  test_rng_init("client_timeout_test", 0); /* a fresh seed each run, printed */

  tdist_store_server_t *srv = start_server();
  int port = tdist_store_server_port(srv);
  const tdist_store_dialect_t dialects[2] = {TDIST_STORE_DIALECT_AUTO, TDIST_STORE_DIALECT_V1_13};
  for (int d = 0; d < 2; d++) {
    test_wait_timeouts(port, dialects[d]);
    test_wait_race(port, dialects[d], 40);
    test_wait_released(dialects[d]);
    test_add_non_integer(port, dialects[d]);
  }
  tdist_store_server_destroy(srv);
  TEST_LOG("client_timeout_test: all passed");
  return 0;
}
