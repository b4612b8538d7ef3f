/* The store server's memory budgets (issue 14), each against a server in a child process whose
 * resident memory is read from /proc/<pid>/status (VmHWM: the peak; VmRSS: now):
 *   - a 1.3 MB MULTI_GET naming a 1 MiB key 131072 times (a 128 GiB reply) closes that
 *     connection; the server's peak stays under the connection budget plus slack, and another
 *     client is still served;
 *   - 20 pipelined WAITs of 131072 missing keys each (about 30 MiB of bookkeeping apiece) are
 *     charged to the connection, which is closed at its budget;
 *   - a 64 MiB SET followed by one stray byte, on several connections that then stay idle, does
 *     not keep 64 MiB resident per connection once the values are deleted;
 *   - clients that pipeline GETs of a 1 MiB value and never read the replies hold at most about
 *     a quarter of their budget each;
 *   - when a small client's request reaches the server budget that two WAIT-holding connections
 *     filled, one of those is closed and the small client is served (not closed for asking).
 * The child runs with a 4 GiB address-space cap (not under sanitizers, which reserve more), so
 * a server without budgets fails these checks instead of taking the machine's memory. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "proc.h"
#include "server_proc.h"
#include "server_wire.h"
#include "tdist/tdist.h"

#define MIB ((size_t)1 << 20)

/* ThreadSanitizer's shadow memory (several bytes per byte the server touches) counts in its RSS:
 * the bounds grow by this factor there. They still tell a bounded server from one that
 * amplifies (the old server grew by 2 GiB and more in the first case). */
#if defined(__SANITIZE_THREAD__)
#define RSS_FACTOR 4
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RSS_FACTOR 4
#endif
#endif
#ifndef RSS_FACTOR
#define RSS_FACTOR 1
#endif

#if defined(__SANITIZE_ADDRESS__)
/* Freed memory must go back at once, or ASan's quarantine reads as the server's memory. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "quarantine_size_mb=0:detect_leaks=0"; }
#endif

/* Sends what the socket takes until the peer closes; returns how much was sent. */
static size_t send_until_closed(conn_t *c, const uint8_t *p, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t k = send(c->fd, p + done, n - done, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  return done;
}

static void expect_under(const char *what, size_t got, size_t bound) {
  bound *= RSS_FACTOR;
  if (got >= bound) TEST_FAIL("%s: %zu MiB, want under %zu MiB", what, got / MIB, bound / MIB);
  TEST_LOG("%s: %zu MiB (bound %zu MiB)", what, got / MIB, bound / MIB);
}

static void test_multi_get_amplification(void) {
  const size_t budget = 64 * MIB;
  server_proc_t sp = spawn_server(budget, 256 * MIB);
  conn_t honest = conn_open(sp.port, 1, "honest");
  uint8_t *big = malloc(MIB);
  CHECK(big != NULL);
  memset(big, 'b', MIB);
  r_set(&honest, "/big", big, MIB);
  free(big);
  sync_conn(&honest);
  size_t base = proc_mem(sp.pid, "VmHWM");
  enc_t m = {0};
  conn_t evil = conn_open(sp.port, 1, "multi-get");
  m_op(&m, &evil, OP_MGET);
  enc_u64(&m, 131072);
  for (int i = 0; i < 131072; i++) enc_cstr(&m, "/big");
  TEST_LOG("MULTI_GET request of %zu bytes asking for a 128 GiB reply", m.len);
  send_until_closed(&evil, m.p, m.len);
  free(m.p);
  expect_closed(&evil, "a MULTI_GET reply past the connection budget");
  conn_close(&evil);
  expect_ping(&honest, 0x1234);
  size_t len = 0;
  free(r_get(&honest, "/big", &len));
  CHECK_EQ_UINT(len, MIB);
  expect_under("MULTI_GET of 128 GiB: server peak RSS growth", proc_mem(sp.pid, "VmHWM") - base,
               budget + 32 * MIB);
  conn_close(&honest);
  stop_server(&sp);
}

static void test_wait_flood(void) {
  const size_t budget = 64 * MIB;
  server_proc_t sp = spawn_server(budget, 256 * MIB);
  conn_t honest = conn_open(sp.port, 1, "honest");
  size_t base = proc_mem(sp.pid, "VmHWM");
  conn_t evil = conn_open(sp.port, 1, "wait-flood");
  enc_t m = {0};
  char key[32];
  for (int w = 0; w < 20; w++) {
    m_op(&m, &evil, OP_WAIT);
    enc_u64(&m, 131072);
    for (int i = 0; i < 131072; i++) {
      snprintf(key, sizeof key, "/w%02d-%06d", w, i);
      enc_cstr(&m, key);
    }
  }
  TEST_LOG("20 pipelined WAITs: %zu bytes", m.len);
  send_until_closed(&evil, m.p, m.len);
  free(m.p);
  expect_closed(&evil, "pipelined WAITs past the connection budget");
  conn_close(&evil);
  expect_ping(&honest, 0x4321);
  CHECK_EQ_INT(r_numkeys(&honest), 0); /* the waits' placeholder keys are gone */
  expect_under("20 pipelined WAITs: server peak RSS growth", proc_mem(sp.pid, "VmHWM") - base,
               budget + 64 * MIB);
  conn_close(&honest);
  stop_server(&sp);
}

static void test_big_set_stray_byte(void) {
  enum { NCONN = 6 };
  server_proc_t sp = spawn_server(0, 0); /* the defaults: 64 MiB values fit */
  conn_t ctl = conn_open(sp.port, 1, "control");
  size_t base = proc_mem(sp.pid, "VmRSS");
  size_t vlen = 64 * MIB;
  uint8_t *v = malloc(vlen);
  CHECK(v != NULL);
  memset(v, 'v', vlen);
  conn_t idle[NCONN];
  char key[32];
  for (int i = 0; i < NCONN; i++) {
    idle[i] = conn_open(sp.port, 1, "big-set");
    snprintf(key, sizeof key, "/big%d", i);
    enc_t m = {0};
    m_op(&m, &idle[i], OP_SET);
    enc_cstr(&m, key);
    enc_str(&m, v, vlen);
    enc_u8(&m, 0x01); /* the stray byte: the start of another SET that never comes */
    m_send(&idle[i], &m);
    const char *keys[1] = {key};
    int64_t deadline = now_ms() + 20000;
    while (r_check(&ctl, keys, 1) != 0) {
      if (now_ms() > deadline) TEST_FAIL("SET of %s not executed after 20 s", key);
      usleep(2000);
    }
    CHECK_EQ_INT(r_delete(&ctl, key), 1);
  }
  free(v);
  sync_conn(&ctl);
  expect_under("6 idle connections after a 64 MiB SET + stray byte: server RSS growth",
               proc_mem(sp.pid, "VmRSS") - base, 32 * MIB);
  for (int i = 0; i < NCONN; i++) conn_close(&idle[i]);
  conn_close(&ctl);
  stop_server(&sp);
}

static void test_never_reading(void) {
  enum { NCONN = 10, NGET = 100 };
  const size_t budget = 8 * MIB;
  server_proc_t sp = spawn_server(budget, 256 * MIB);
  conn_t ctl = conn_open(sp.port, 1, "control");
  uint8_t *big = malloc(MIB);
  CHECK(big != NULL);
  memset(big, 'r', MIB);
  r_set(&ctl, "/v", big, MIB);
  free(big);
  sync_conn(&ctl);
  size_t base = proc_mem(sp.pid, "VmHWM");
  conn_t lazy[NCONN];
  for (int i = 0; i < NCONN; i++) {
    lazy[i] = conn_open(sp.port, 1, "never-reads");
    enc_t m = {0};
    for (int j = 0; j < NGET; j++) {
      m_op(&m, &lazy[i], OP_GET);
      enc_cstr(&m, "/v");
    }
    m_send(&lazy[i], &m);
  }
  /* Give the loop time to fill every socket and queue what it will (no assertion on time). */
  for (int i = 0; i < 20; i++) {
    sync_conn(&ctl);
    usleep(50000);
  }
  expect_under("10 never-reading clients: server peak RSS growth", proc_mem(sp.pid, "VmHWM") - base,
               NCONN * budget + 16 * MIB);
  expect_ping(&ctl, 99);
  for (int i = 0; i < NCONN; i++) conn_close(&lazy[i]);
  conn_close(&ctl);
  stop_server(&sp);
}

/* Whether the server has closed c (EOF or reset within ms); 0 if it stays open and silent. */
static int closed_within(conn_t *c, int ms) {
  uint8_t b;
  int r = read_full(c->fd, &b, 1, ms);
  if (r == 0) TEST_FAIL("%s: the server sent a byte, nothing was due", c->name);
  return r == 1;
}

/* The server budget is reached by a small client's request while two connections hold most of
 * it in pending WAITs: one of those two is closed, and the small client is served. */
static void test_server_budget_victim(void) {
  const size_t conn_budget = 48 * MIB, server_budget = 72 * MIB;
  server_proc_t sp = spawn_server(conn_budget, server_budget);
  conn_t hog[2];
  char key[32];
  for (int h = 0; h < 2; h++) {
    hog[h] = conn_open(sp.port, 1, "wait-hog");
    enc_t m = {0};
    m_op(&m, &hog[h], OP_WAIT);
    enc_u64(&m, 131072); /* about 32 MiB of bookkeeping */
    for (int i = 0; i < 131072; i++) {
      snprintf(key, sizeof key, "/hog%d-%06d", h, i);
      enc_cstr(&m, key);
    }
    m_send(&hog[h], &m);
    expect_ping(&hog[h], 0x100u + (uint32_t)h); /* answered once the WAIT is in */
  }
  conn_t small = conn_open(sp.port, 1, "small");
  size_t vlen = 12 * MIB; /* its input buffer (16 MiB) takes the total past 72 MiB */
  uint8_t *v = malloc(vlen);
  CHECK(v != NULL);
  for (size_t i = 0; i < vlen; i++) v[i] = (uint8_t)(i * 2654435761u >> 24);
  r_set(&small, "/small", v, vlen);
  expect_get(&small, "/small", v, vlen);
  free(v);
  int closed = closed_within(&hog[0], 2000) + closed_within(&hog[1], 500);
  if (closed != 1)
    TEST_FAIL("%d of the 2 connections holding the server budget were closed, want 1", closed);
  TEST_LOG(
      "server budget reached by a 12 MiB SET: one WAIT-holding connection closed, the "
      "small client served");
  for (int h = 0; h < 2; h++) conn_close(&hog[h]);
  conn_close(&small);
  stop_server(&sp);
}

/* With arguments, runs only the named cases (mget, wait, bigset, noread, victim). */
int main(int argc, char **argv) {
  static const struct {
    const char *name;
    void (*fn)(void);
  } cases[] = {{"mget", test_multi_get_amplification},
               {"wait", test_wait_flood},
               {"bigset", test_big_set_stray_byte},
               {"noread", test_never_reading},
               {"victim", test_server_budget_victim}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int run = argc < 2;
    for (int j = 1; j < argc; j++) run |= strcmp(argv[j], cases[i].name) == 0;
    if (run) cases[i].fn();
  }
  TEST_LOG("server_budget_test: all passed");
  return 0;
}
