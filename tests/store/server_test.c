/* Byte-level tests of the TCPStore server (tdist_store_server_*), written from the PyTorch
 * reference (shared/reference/torch-contracts.md §1.3, §1.5, §1.6, §1.11, §1.12).
 *
 * The server runs in this process on an ephemeral port; the test talks raw bytes to it over real
 * sockets with an encoder of its own, in both dialects at once, and checks every reply byte for
 * byte: per-op semantics, waits and their cancellation (including the SET/CANCEL_WAIT race),
 * queues, requests split at every byte and pipelined, idle and vanishing clients, limits,
 * max_connections, the stats counters and IPv4/IPv6 reachability. Every read has a deadline, so
 * nothing can hang. Random data comes from a fixed seed (TDIST_TEST_SEED overrides it). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "rng.h"
#include "wire_enc.h"
#include "tdist/tdist.h"

/* ---------------------------------------------------------------------------------------- */
/* Plumbing                                                                                 */
/* ---------------------------------------------------------------------------------------- */

#define IO_TIMEOUT_MS 5000

/* Canonical ops of this test and their wire bytes, copied from reference §1.2. */
enum {
  OP_VALIDATE,
  OP_SET,
  OP_CAS,
  OP_GET,
  OP_ADD,
  OP_CHECK,
  OP_WAIT,
  OP_NUMKEYS,
  OP_WATCH,
  OP_DELETE,
  OP_APPEND,
  OP_MGET,
  OP_MSET,
  OP_CANCEL,
  OP_PING,
  OP_QPUSH,
  OP_QPOP,
  OP_QLEN,
  OP_N
};
static const int v113_wire[OP_N] = {-1,   0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                                    0x08, -1,   -1,   -1,   -1,   -1,   -1,   -1,   -1};
static const int v2_wire[OP_N] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, -1,
                                  0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10};

typedef struct {
  int fd;
  int v2; /* 1 = 2.x dialect, 0 = 1.13 */
  char name[32];
} conn_t;

static int raw_connect(int family, int port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int r;
  if (family == AF_INET6) {
    struct sockaddr_in6 a;
    memset(&a, 0, sizeof(a));
    a.sin6_family = AF_INET6;
    a.sin6_port = htons((uint16_t)port);
    a.sin6_addr = in6addr_loopback;
    r = connect(fd, (struct sockaddr *)&a, sizeof(a));
  } else {
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    r = connect(fd, (struct sockaddr *)&a, sizeof(a));
  }
  if (r != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

static void send_raw(conn_t *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = send(c->fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) TEST_FAIL("%s: send: %s", c->name, strerror(errno));
    b += k;
    n -= (size_t)k;
  }
}

/* Opens a connection; a 2.x one sends VALIDATE first, as every 2.x client does. */
static conn_t conn_open(int port, int v2, const char *name) {
  conn_t c;
  c.v2 = v2;
  snprintf(c.name, sizeof(c.name), "%s", name);
  c.fd = raw_connect(AF_INET, port);
  if (c.fd < 0) TEST_FAIL("%s: connect 127.0.0.1:%d: %s", name, port, strerror(-c.fd));
  if (v2) {
    static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
    send_raw(&c, validate, 5);
  }
  return c;
}

static void conn_close(conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

/* 0: got n bytes; 1: closed/reset first; 2: timed out. */
static int read_full(int fd, void *buf, size_t n, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  size_t got = 0;
  while (got < n) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return 2;
    struct pollfd p = {fd, POLLIN, 0};
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return 2;
    ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
    if (k == 0) return 1;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return 1;
    }
    got += (size_t)k;
  }
  return 0;
}

static void rd(conn_t *c, void *buf, size_t n, const char *what) {
  int r = read_full(c->fd, buf, n, IO_TIMEOUT_MS);
  if (r == 1) TEST_FAIL("%s: connection closed while reading %zu bytes of %s", c->name, n, what);
  if (r == 2) TEST_FAIL("%s: timed out reading %zu bytes of %s", c->name, n, what);
}

static uint64_t rd_u64(conn_t *c, const char *what) {
  uint8_t b[8];
  rd(c, b, 8, what);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

static uint8_t rd_u8(conn_t *c, const char *what) {
  uint8_t b;
  rd(c, &b, 1, what);
  return b;
}

/* u64 length + bytes; returns malloc'd (NUL-terminated for convenience). */
static uint8_t *rd_bytes(conn_t *c, size_t *len, const char *what) {
  uint64_t n = rd_u64(c, what);
  if (n > ((uint64_t)256 << 20)) TEST_FAIL("%s: absurd length %" PRIu64 " in %s", c->name, n, what);
  uint8_t *p = malloc((size_t)n + 1);
  CHECK(p != NULL);
  if (n) rd(c, p, (size_t)n, what);
  p[n] = 0;
  *len = (size_t)n;
  return p;
}

/* Nothing may arrive for ms. */
static void expect_silent(conn_t *c, int ms, const char *why) {
  struct pollfd p = {c->fd, POLLIN, 0};
  int r = poll(&p, 1, ms);
  if (r > 0) {
    uint8_t b[16];
    ssize_t k = recv(c->fd, b, sizeof(b), MSG_DONTWAIT);
    if (k <= 0) TEST_FAIL("%s: closed, expected silence (%s)", c->name, why);
    fprintf(stderr, "%s: unexpected bytes:", c->name);
    for (ssize_t i = 0; i < k; i++) fprintf(stderr, " %02x", b[i]);
    TEST_FAIL("\n(%s)", why);
  }
}

/* The server must close the connection (EOF or reset) without sending anything. */
static void expect_closed(conn_t *c, const char *why) {
  int64_t deadline = now_ms() + IO_TIMEOUT_MS;
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0)
      TEST_FAIL("%s: still open after %d ms, expected the server to close it (%s)", c->name,
                IO_TIMEOUT_MS, why);
    struct pollfd p = {c->fd, POLLIN, 0};
    int r = poll(&p, 1, (int)left);
    if (r <= 0) continue;
    uint8_t b[16];
    ssize_t k = recv(c->fd, b, sizeof(b), 0);
    if (k == 0 || (k < 0 && errno == ECONNRESET)) break;
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) TEST_FAIL("%s: recv: %s", c->name, strerror(errno));
    fprintf(stderr, "%s: got bytes instead of a close:", c->name);
    for (ssize_t i = 0; i < k; i++) fprintf(stderr, " %02x", b[i]);
    TEST_FAIL("\n(%s)", why);
  }
  conn_close(c);
}

/* ---- request encoder: tests/testlib/wire_enc.h ---- */
static void m_op(enc_t *m, const conn_t *c, int op) {
  int w = c->v2 ? v2_wire[op] : v113_wire[op];
  if (w < 0) TEST_FAIL("%s: op %d does not exist in this dialect (test bug)", c->name, op);
  enc_u8(m, (uint8_t)w);
}
static void m_send(conn_t *c, enc_t *m) {
  send_raw(c, m->p, m->len);
  free(m->p);
  memset(m, 0, sizeof(*m));
}

/* ---- one call per op ---- */
static void r_set(conn_t *c, const char *key, const void *v, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_SET);
  enc_cstr(&m, key);
  enc_str(&m, v, n);
  m_send(c, &m);
}
static void r_sets(conn_t *c, const char *key, const char *v) { r_set(c, key, v, strlen(v)); }

static uint8_t *r_get(conn_t *c, const char *key, size_t *len) {
  enc_t m = {0};
  m_op(&m, c, OP_GET);
  enc_cstr(&m, key);
  m_send(c, &m);
  return rd_bytes(c, len, "GET reply");
}
static void expect_get(conn_t *c, const char *key, const void *v, size_t n) {
  size_t len;
  uint8_t *got = r_get(c, key, &len);
  if (len != n || (n && memcmp(got, v, n) != 0))
    TEST_FAIL("%s: GET %s: got %zu bytes '%.*s', want %zu bytes '%.*s'", c->name, key, len,
              (int)(len > 60 ? 60 : len), got, n, (int)(n > 60 ? 60 : n), (const char *)v);
  free(got);
}
static void expect_gets(conn_t *c, const char *key, const char *v) {
  expect_get(c, key, v, strlen(v));
}

static int64_t r_add(conn_t *c, const char *key, int64_t delta) {
  enc_t m = {0};
  m_op(&m, c, OP_ADD);
  enc_cstr(&m, key);
  enc_u64(&m, (uint64_t)delta);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "ADD reply");
}

static void expect_cas(conn_t *c, const char *key, const char *exp, const char *des,
                       const char *want) {
  enc_t m = {0};
  m_op(&m, c, OP_CAS);
  enc_cstr(&m, key);
  enc_cstr(&m, exp);
  enc_cstr(&m, des);
  m_send(c, &m);
  size_t len;
  uint8_t *got = rd_bytes(c, &len, "COMPARE_SET reply");
  if (len != strlen(want) || memcmp(got, want, len) != 0)
    TEST_FAIL("%s: CAS %s '%s'->'%s': got '%s', want '%s'", c->name, key, exp, des, got, want);
  free(got);
}

static void m_keys(enc_t *m, const char *const *keys, size_t n) {
  enc_u64(m, n);
  for (size_t i = 0; i < n; i++) enc_cstr(m, keys[i]);
}

static uint8_t r_check(conn_t *c, const char *const *keys, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_CHECK);
  m_keys(&m, keys, n);
  m_send(c, &m);
  return rd_u8(c, "CHECK reply");
}

static void send_wait(conn_t *c, const char *const *keys, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_WAIT);
  m_keys(&m, keys, n);
  m_send(c, &m);
}

static void expect_byte(conn_t *c, uint8_t want, const char *what) {
  uint8_t got = rd_u8(c, what);
  if (got != want) TEST_FAIL("%s: %s: got byte %02x, want %02x", c->name, what, got, want);
}

static int64_t r_numkeys(conn_t *c) {
  enc_t m = {0};
  m_op(&m, c, OP_NUMKEYS);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "GETNUMKEYS reply");
}

static int64_t r_delete(conn_t *c, const char *key) {
  enc_t m = {0};
  m_op(&m, c, OP_DELETE);
  enc_cstr(&m, key);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "DELETE_KEY reply");
}

static void r_append(conn_t *c, const char *key, const char *v) {
  enc_t m = {0};
  m_op(&m, c, OP_APPEND);
  enc_cstr(&m, key);
  enc_cstr(&m, v);
  m_send(c, &m);
}

static void r_mset(conn_t *c, const char *const *keys, const char *const *vals, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_MSET);
  enc_u64(&m, n);
  for (size_t i = 0; i < n; i++) {
    enc_cstr(&m, keys[i]);
    enc_cstr(&m, vals[i]);
  }
  m_send(c, &m);
}

static void expect_mget(conn_t *c, const char *const *keys, const char *const *vals, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_MGET);
  m_keys(&m, keys, n);
  m_send(c, &m);
  for (size_t i = 0; i < n; i++) {
    size_t len;
    uint8_t *got = rd_bytes(c, &len, "MULTI_GET value");
    if (len != strlen(vals[i]) || memcmp(got, vals[i], len) != 0)
      TEST_FAIL("%s: MULTI_GET item %zu (%s): got '%s', want '%s'", c->name, i, keys[i], got,
                vals[i]);
    free(got);
  }
}

static void expect_ping(conn_t *c, uint32_t nonce) {
  enc_t m = {0};
  m_op(&m, c, OP_PING);
  enc_u32(&m, nonce);
  m_send(c, &m);
  uint8_t b[4];
  rd(c, b, 4, "PING echo");
  uint32_t got = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  if (got != nonce) TEST_FAIL("%s: PING %08x echoed %08x", c->name, nonce, got);
}

/* A round trip that proves every earlier request of c was executed. */
static void sync_conn(conn_t *c) {
  if (c->v2) {
    expect_ping(c, (uint32_t)rnd());
  } else {
    (void)r_numkeys(c);
  }
}

static void r_qpush(conn_t *c, const char *key, const char *v) {
  enc_t m = {0};
  m_op(&m, c, OP_QPUSH);
  enc_cstr(&m, key);
  enc_cstr(&m, v);
  m_send(c, &m);
}
static int64_t r_qlen(conn_t *c, const char *key) {
  enc_t m = {0};
  m_op(&m, c, OP_QLEN);
  enc_cstr(&m, key);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "QUEUE_LEN reply");
}
/* Pops; want == NULL means the queue must be empty. */
static void expect_qpop(conn_t *c, const char *key, int64_t want_len, const char *want) {
  enc_t m = {0};
  m_op(&m, c, OP_QPOP);
  enc_cstr(&m, key);
  m_send(c, &m);
  int64_t len = (int64_t)rd_u64(c, "QUEUE_POP length");
  if (len != want_len)
    TEST_FAIL("%s: QUEUE_POP %s: length %" PRId64 ", want %" PRId64, c->name, key, len, want_len);
  if (len > 0) {
    size_t n;
    uint8_t *got = rd_bytes(c, &n, "QUEUE_POP item");
    if (!want || n != strlen(want) || memcmp(got, want, n) != 0)
      TEST_FAIL("%s: QUEUE_POP %s: item '%s', want '%s'", c->name, key, got,
                want ? want : "(none)");
    free(got);
  }
}

/* ---- server ---- */
typedef struct {
  size_t max_key, max_value, max_multi, max_conn;
} limits_t;

static tdist_store_server_t *start_server(const limits_t *lim) {
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.port = 0;
  o.quiet = 1;
  if (lim) {
    if (lim->max_key) o.max_key_bytes = lim->max_key;
    if (lim->max_value) o.max_value_bytes = lim->max_value;
    if (lim->max_multi) o.max_multi_keys = lim->max_multi;
    if (lim->max_conn) o.max_connections = lim->max_conn;
  }
  tdist_store_server_t *s = NULL;
  CHECK_OK(tdist_store_server_create(&o, &s));
  CHECK(s != NULL);
  CHECK(tdist_store_server_port(s) > 0);
  return s;
}

static tdist_store_server_stats_t stats(tdist_store_server_t *s) {
  tdist_store_server_stats_t st;
  memset(&st, 0xEE, sizeof(st));
  tdist_store_server_stats(s, &st);
  return st;
}

/* Polls a stats field until it equals want (the loop thread updates it asynchronously). */
#define STAT_OFF(field) offsetof(tdist_store_server_stats_t, field)
static void wait_stat(tdist_store_server_t *s, size_t off, const char *name, uint64_t want) {
  int64_t deadline = now_ms() + IO_TIMEOUT_MS;
  uint64_t got = 0;
  for (;;) {
    tdist_store_server_stats_t st = stats(s);
    memcpy(&got, (char *)&st + off, sizeof(got));
    if (got == want) return;
    if (now_ms() > deadline) break;
    sleep_ms(2);
  }
  TEST_FAIL("stats.%s = %" PRIu64 ", want %" PRIu64, name, got, want);
}
#define WAIT_STAT(s, field, want) wait_stat((s), STAT_OFF(field), #field, (uint64_t)(want))

/* ---------------------------------------------------------------------------------------- */
/* §1.12 replayed: the captured 1.13 session, reply bytes compared with the capture          */
/* ---------------------------------------------------------------------------------------- */

static void exchange(conn_t *c, const char *req_hex, const char *reply_hex) {
  uint8_t req[256], want[256], got[256];
  size_t n = unhex(req_hex, req, sizeof(req));
  size_t w = unhex(reply_hex, want, sizeof(want));
  send_raw(c, req, n);
  if (w == 0) return;
  rd(c, got, w, req_hex);
  if (memcmp(got, want, w) != 0) {
    fprintf(stderr, "%s: request %s\n  reply:", c->name, req_hex);
    for (size_t i = 0; i < w; i++) fprintf(stderr, " %02x", got[i]);
    TEST_FAIL("\n  want:  %s", reply_hex);
  }
}

static conn_t conn_open_family(int family, int port, int v2, const char *name, int *err) {
  conn_t c;
  c.v2 = v2;
  snprintf(c.name, sizeof(c.name), "%s", name);
  c.fd = raw_connect(family, port);
  *err = c.fd < 0 ? -c.fd : 0;
  if (c.fd >= 0 && v2) {
    static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
    send_raw(&c, validate, 5);
  }
  return c;
}

/* Rotating key buffers: K("x") gives "/<prefix>/x" for the running suite. */
static const char *key_prefix = "t";
static const char *K(const char *name) {
  static char bufs[32][160];
  static int next;
  char *b = bufs[next++ % 32];
  snprintf(b, 160, "/%s/%s", key_prefix, name);
  return b;
}

/* ---------------------------------------------------------------------------------------- */
/* §1.12 replayed                                                                           */
/* ---------------------------------------------------------------------------------------- */

static void test_capture_replay(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t c1 = conn_open(port, 0, "c1(1.13)");
  conn_t c2 = conn_open(port, 0, "c2(1.13 callback)"); /* stays silent, as in the capture */
  exchange(&c1, "0003000000000000002f6b31 02000000000000007631", "");
  exchange(&c1, "05 0100000000000000 0300000000000000 2f6b31", "00");
  exchange(&c1, "02 0300000000000000 2f6b31", "0200000000000000 7631");
  exchange(&c1, "03 0400000000000000 2f636e74 0500000000000000", "0500000000000000");
  exchange(&c1, "03 0400000000000000 2f636e74 feffffffffffffff", "0300000000000000");
  exchange(&c1, "01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577",
           "0300000000000000 6e6577");
  exchange(&c1, "06", "0300000000000000");
  exchange(&c1, "08 0300000000000000 2f6b31", "0100000000000000");
  exchange(&c1, "05 0200000000000000 0500000000000000 2f6c617465 0400000000000000 2f636e74", "");
  WAIT_STAT(s, waits_pending, 1);
  expect_silent(&c1, 100, "WAIT [/late,/cnt] before /late exists");
  conn_t w = conn_open(port, 1, "setter(2.x)");
  r_sets(&w, "/late", "x");
  expect_byte(&c1, 0x00, "WAIT [/late,/cnt] after SET /late");
  WAIT_STAT(s, waits_pending, 0);
  expect_silent(&c2, 0, "callback connection");
  CHECK_EQ_INT(r_numkeys(&c2), 3); /* /cnt, /cs, /late */
  conn_close(&c1);
  conn_close(&c2);
  conn_close(&w);
  tdist_store_server_destroy(s);
  TEST_LOG("capture replay (§1.12): every reply byte matches");
}

/* ---------------------------------------------------------------------------------------- */
/* Per-op semantics, run once per dialect on one server with both dialects connected          */
/* ---------------------------------------------------------------------------------------- */

/* Wakes a pending WAIT [key] on `waiter` with `op` sent from `waker`; checks the timing. */
static void wake_with(tdist_store_server_t *s, conn_t *waiter, conn_t *waker, int op,
                      const char *name) {
  const char *k = K(name);
  uint64_t base = stats(s).waits_pending;
  send_wait(waiter, &k, 1);
  WAIT_STAT(s, waits_pending, base + 1);
  expect_silent(waiter, 30, "WAIT on a missing key");
  switch (op) {
    case OP_SET: r_sets(waker, k, "v"); break;
    case OP_ADD: CHECK_EQ_INT(r_add(waker, k, 2), 2); break;
    case OP_APPEND: r_append(waker, k, "a"); break;
    case OP_MSET: {
      const char *ks[2] = {K("unrelated"), k};
      const char *vs[2] = {"u", "m"};
      r_mset(waker, ks, vs, 2);
      break;
    }
    default: CHECK(0);
  }
  expect_byte(waiter, 0x00, "STOP_WAITING");
  WAIT_STAT(s, waits_pending, base);
}

/* Sends one raw opcode byte (+ padding) on a fresh connection; the server must close it. */
static void expect_op_closes(int port, int v2, uint8_t opcode, const char *why) {
  conn_t t = conn_open(port, v2, "throwaway");
  if (v2) expect_ping(&t, 7);
  uint8_t b[24];
  memset(b, 0, sizeof(b));
  b[0] = opcode;
  send_raw(&t, b, sizeof(b));
  expect_closed(&t, why);
}

/* c: the connection under test. v2aux / v113aux: other connections, one per dialect. */
static void op_suite(tdist_store_server_t *s, conn_t *c, conn_t *v2aux, conn_t *v113aux) {
  int port = tdist_store_server_port(s);
  uint8_t big[4096];
  for (size_t i = 0; i < sizeof(big); i++) big[i] = (uint8_t)rnd();
  big[0] = 0;
  big[100] = 0;

  /* SET: no reply; binary values; empty values; overwrite; visible to the other dialect. */
  r_set(c, K("bin"), big, sizeof(big));
  expect_silent(c, 30, "SET has no reply");
  expect_get(c, K("bin"), big, sizeof(big));
  r_set(c, K("empty"), "", 0);
  expect_get(c, K("empty"), "", 0);
  r_sets(c, K("ow"), "first");
  r_sets(c, K("ow"), "second");
  expect_gets(c, K("ow"), "second");
  expect_gets(v2aux, K("ow"), "second");
  expect_gets(v113aux, K("ow"), "second");
  size_t mib = (size_t)1 << 20;
  uint8_t *large = malloc(mib);
  CHECK(large != NULL);
  for (size_t i = 0; i < mib; i++) large[i] = (uint8_t)(i * 131 + (i >> 9));
  r_set(c, K("mib"), large, mib);
  sync_conn(c);
  expect_get(v2aux, K("mib"), large, mib);
  expect_get(c, K("mib"), large, mib);
  free(large);

  /* COMPARE_SET, the four cases of §1.5 */
  expect_cas(c, K("cas1"), "", "new", "new"); /* absent, expected empty: stored */
  expect_gets(c, K("cas1"), "new");
  expect_cas(c, K("cas2"), "abc", "new", "abc"); /* absent, expected non-empty: "lying" */
  const char *cas2 = K("cas2");
  CHECK_EQ_INT(r_check(c, &cas2, 1), 1);             /* nothing was stored */
  expect_cas(c, K("cas1"), "new", "newer", "newer"); /* present and equal: replaced */
  expect_gets(c, K("cas1"), "newer");
  expect_cas(c, K("cas1"), "wrong", "x", "newer"); /* present, different: current value */
  expect_gets(c, K("cas1"), "newer");
  expect_cas(c, K("cas1"), "newer", "", ""); /* desired may be empty */
  expect_gets(c, K("cas1"), "");

  /* GET of a missing key: 1.13 closes the connection, 2.x replies an empty value. */
  if (c->v2) {
    expect_gets(c, K("nope"), "");
    sync_conn(c);
  } else {
    conn_t t = conn_open(port, 0, "get-missing(1.13)");
    enc_t m = {0};
    m_op(&m, &t, OP_GET);
    enc_cstr(&m, K("nope"));
    m_send(&t, &m);
    expect_closed(&t, "1.13 GET of a missing key");
  }

  /* ADD: decimal text, missing = 0, negative, zero, large */
  CHECK_EQ_INT(r_add(c, K("add"), -5), -5);
  expect_gets(c, K("add"), "-5");
  CHECK_EQ_INT(r_add(c, K("add"), 0), -5);
  CHECK_EQ_INT(r_add(c, K("add"), 12), 7);
  expect_gets(v2aux, K("add"), "7");
  CHECK_EQ_INT(r_add(c, K("cnt"), 5), 5); /* §1.12 */
  CHECK_EQ_INT(r_add(c, K("cnt"), -2), 3);
  expect_gets(c, K("cnt"), "3");
  r_sets(c, K("num"), "42");
  CHECK_EQ_INT(r_add(c, K("num"), 1), 43);
  expect_gets(c, K("num"), "43");
  CHECK_EQ_INT(r_add(c, K("huge"), 1000000000000000LL), 1000000000000000LL);
  CHECK_EQ_INT(r_add(c, K("huge"), 1000000000000000LL), 2000000000000000LL);
  expect_gets(c, K("huge"), "2000000000000000");
  CHECK_EQ_INT(r_add(c, K("neg"), INT64_MIN + 1), INT64_MIN + 1);
  expect_gets(c, K("neg"), "-9223372036854775807");
  /* ADD on a non-integer closes that connection only */
  r_sets(c, K("text"), "hello");
  sync_conn(c);
  {
    conn_t t = conn_open(port, c->v2, "add-on-text");
    enc_t m = {0};
    m_op(&m, &t, OP_ADD);
    enc_cstr(&m, K("text"));
    enc_u64(&m, 1);
    m_send(&t, &m);
    expect_closed(&t, "ADD on the value \"hello\"");
  }
  expect_gets(c, K("text"), "hello");

  /* CHECK */
  const char *have = K("ow"), *missing = K("missing");
  const char *ck2[2] = {have, missing};
  CHECK_EQ_INT(r_check(c, &have, 1), 0);
  CHECK_EQ_INT(r_check(c, ck2, 2), 1);
  CHECK_EQ_INT(r_check(c, &missing, 1), 1);
  CHECK_EQ_INT(r_check(c, NULL, 0), 0);

  /* WAIT: immediate, zero keys, delayed (woken by SET/ADD from either dialect, APPEND and
   * MULTI_SET from 2.x), several keys. */
  send_wait(c, &have, 1);
  expect_byte(c, 0x00, "WAIT on an existing key");
  send_wait(c, NULL, 0);
  expect_byte(c, 0x00, "WAIT with zero keys");
  wake_with(s, c, v113aux, OP_SET, "w-set13");
  wake_with(s, c, v2aux, OP_SET, "w-set2");
  wake_with(s, c, v113aux, OP_ADD, "w-add13");
  wake_with(s, c, v2aux, OP_ADD, "w-add2");
  wake_with(s, c, v2aux, OP_APPEND, "w-append");
  wake_with(s, c, v2aux, OP_MSET, "w-mset");
  {
    const char *wk[3] = {K("wa"), have, K("wb")};
    uint64_t base = stats(s).waits_pending;
    send_wait(c, wk, 3);
    WAIT_STAT(s, waits_pending, base + 1);
    r_sets(v2aux, wk[0], "1");
    sync_conn(v2aux);
    expect_silent(c, 100, "WAIT with one of two missing keys set");
    r_sets(v113aux, wk[2], "2");
    expect_byte(c, 0x00, "WAIT after both keys set");
    WAIT_STAT(s, waits_pending, base);
  }

  /* DELETE_KEY: 1 then 0; the key is gone */
  r_sets(c, K("del"), "x");
  CHECK_EQ_INT(r_delete(c, K("del")), 1);
  CHECK_EQ_INT(r_delete(c, K("del")), 0);
  const char *del = K("del");
  CHECK_EQ_INT(r_check(c, &del, 1), 1);
  CHECK_EQ_INT(r_delete(c, K("never")), 0);

  if (!c->v2) {
    /* WATCH_KEY: KEY_CALLBACK_REGISTERED (on its own connection, like 1.13's callback socket) */
    conn_t t = conn_open(port, 0, "watch(1.13)");
    enc_t m = {0};
    m_op(&m, &t, OP_WATCH);
    enc_cstr(&m, K("watched"));
    m_send(&t, &m);
    expect_byte(&t, 0x03, "WATCH_KEY reply");
    conn_close(&t);
    /* 2.x-only opcodes and beyond are unknown to a 1.13 connection */
    expect_op_closes(port, 0, 0x09, "1.13 opcode 0x09");
    expect_op_closes(port, 0, 0x0c, "1.13 opcode 0x0c");
    expect_op_closes(port, 0, 0xff, "1.13 opcode 0xff");
    sync_conn(c);
    return;
  }

  /* ---- 2.x only ---- */
  /* APPEND creates, then appends */
  r_append(c, K("app"), "ab");
  r_append(c, K("app"), "");
  r_append(c, K("app"), "cd");
  expect_gets(c, K("app"), "abcd");
  r_append(c, K("app-empty"), "");
  const char *ae = K("app-empty");
  CHECK_EQ_INT(r_check(c, &ae, 1), 0);

  /* MULTI_SET (pairs in order: a repeated key keeps the last), MULTI_GET in request order */
  {
    const char *ks[4] = {K("m1"), K("m2"), K("m3"), K("m1")};
    const char *vs[4] = {"one", "", "three", "uno"};
    r_mset(c, ks, vs, 4);
    const char *gk[5] = {K("m3"), K("m1"), K("m2"), K("m1"), K("ow")};
    const char *gv[5] = {"three", "uno", "", "uno", "second"};
    expect_mget(c, gk, gv, 5);
    expect_mget(c, NULL, NULL, 0);
    r_mset(c, NULL, NULL, 0);
    sync_conn(c);
  }

  /* PING echoes the nonce */
  expect_ping(c, 4660);
  expect_ping(c, 0);
  expect_ping(c, 0xffffffffu);
  expect_ping(c, (uint32_t)rnd());

  /* VALIDATE after the first message closes the connection */
  {
    conn_t t = conn_open(port, 1, "late-validate");
    expect_ping(&t, 1);
    static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
    send_raw(&t, validate, 5);
    expect_closed(&t, "VALIDATE later on a 2.x connection");
  }

  /* CANCEL_WAIT with nothing pending: 01 anyway */
  {
    enc_t m = {0};
    m_op(&m, c, OP_CANCEL);
    m_send(c, &m);
    expect_byte(c, 0x01, "CANCEL_WAIT with nothing pending");
  }
  /* CANCEL_WAIT of a pending wait: 01; the later SET sends nothing here */
  {
    const char *k = K("cancelled");
    uint64_t base = stats(s).waits_pending;
    send_wait(c, &k, 1);
    WAIT_STAT(s, waits_pending, base + 1);
    enc_t m = {0};
    m_op(&m, c, OP_CANCEL);
    m_send(c, &m);
    expect_byte(c, 0x01, "CANCEL_WAIT of a pending wait");
    WAIT_STAT(s, waits_pending, base);
    r_sets(v113aux, k, "late");
    sync_conn(v113aux);
    expect_silent(c, 150, "SET after CANCEL_WAIT");
    expect_ping(c, 99);
  }
  /* The race of §1.6: SET (other connection) and CANCEL_WAIT back to back. */
  {
    int only_cancel = 0, both = 0;
    for (int i = 0; i < 40; i++) {
      char name[32];
      snprintf(name, sizeof(name), "race%d", i);
      const char *k = K(name);
      uint64_t base = stats(s).waits_pending;
      send_wait(c, &k, 1);
      WAIT_STAT(s, waits_pending, base + 1);
      enc_t set = {0}, cancel = {0};
      m_op(&set, v2aux, OP_SET);
      enc_cstr(&set, k);
      enc_cstr(&set, "v");
      m_op(&cancel, c, OP_CANCEL);
      if (i % 2) {
        m_send(v2aux, &set);
        m_send(c, &cancel);
      } else {
        m_send(c, &cancel);
        m_send(v2aux, &set);
      }
      uint8_t b = rd_u8(c, "reply to WAIT+CANCEL_WAIT");
      if (b == 0x00) {
        expect_byte(c, 0x01, "WAIT_CANCELED after STOP_WAITING");
        both++;
      } else if (b == 0x01) {
        only_cancel++;
      } else {
        TEST_FAIL("%s: race: got %02x, want 00 01 or 01", c->name, b);
      }
      WAIT_STAT(s, waits_pending, base);
      sync_conn(v2aux);
      expect_ping(c, (uint32_t)i); /* nothing stray in between */
    }
    TEST_LOG("  SET/CANCEL_WAIT race: %d x '01', %d x '00 01'", only_cancel, both);
  }

  /* Unknown opcodes close that connection only */
  expect_op_closes(port, 1, 0x11, "2.x opcode 0x11");
  expect_op_closes(port, 1, 0x80, "2.x opcode 0x80");
  expect_op_closes(port, 1, 0xff, "2.x opcode 0xff");
  sync_conn(c);
}

static void test_queues(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  conn_t c = conn_open(port, 1, "queue");
  conn_t w1 = conn_open(port, 1, "qwait1");
  conn_t w2 = conn_open(port, 1, "qwait2");
  const char *q = K("q");
  CHECK_EQ_INT(r_qlen(&c, q), 0);
  expect_qpop(&c, q, 0, NULL); /* empty: i64 0 and no item */
  expect_ping(&c, 5);          /* ...which the ping proves: nothing else was sent */
  r_qpush(&c, q, "a");
  r_qpush(&c, q, "b");
  r_qpush(&c, q, "");
  CHECK_EQ_INT(r_qlen(&c, q), 3);
  CHECK_EQ_INT(r_check(&c, &q, 1), 0); /* a non-empty queue counts as existing */
  send_wait(&c, &q, 1);
  expect_byte(&c, 0x00, "WAIT on a non-empty queue");
  expect_qpop(&c, q, 3, "a");
  expect_qpop(&c, q, 2, "b");
  expect_qpop(&c, q, 1, "");
  expect_qpop(&c, q, 0, NULL);
  CHECK_EQ_INT(r_qlen(&c, q), 0);
  CHECK_EQ_INT(r_check(&c, &q, 1), 1);

  /* a push wakes exactly one of two waiters */
  const char *q2 = K("q2");
  uint64_t base = stats(s).waits_pending;
  send_wait(&w1, &q2, 1);
  send_wait(&w2, &q2, 1);
  WAIT_STAT(s, waits_pending, base + 2);
  r_qpush(&c, q2, "i1");
  sync_conn(&c);
  struct pollfd p[2] = {{w1.fd, POLLIN, 0}, {w2.fd, POLLIN, 0}};
  int64_t deadline = now_ms() + IO_TIMEOUT_MS;
  while (poll(p, 2, 50) == 0 && now_ms() < deadline) {
  }
  sleep_ms(200); /* give a wrong second wake-up time to show */
  CHECK_EQ_INT(poll(p, 2, 0) >= 0, 1);
  int r1 = (p[0].revents & POLLIN) != 0, r2 = (p[1].revents & POLLIN) != 0;
  if (r1 + r2 != 1) TEST_FAIL("QUEUE_PUSH woke %d of 2 waiters, want exactly 1", r1 + r2);
  conn_t *woken = r1 ? &w1 : &w2, *other = r1 ? &w2 : &w1;
  expect_byte(woken, 0x00, "woken queue waiter");
  WAIT_STAT(s, waits_pending, base + 1);
  expect_qpop(woken, q2, 1, "i1");
  expect_silent(other, 100, "second queue waiter after one push");
  r_qpush(&c, q2, "i2");
  expect_byte(other, 0x00, "second queue waiter after the second push");
  WAIT_STAT(s, waits_pending, base);
  expect_qpop(other, q2, 1, "i2");
  expect_silent(woken, 50, "first waiter after the second push");
  conn_close(&c);
  conn_close(&w1);
  conn_close(&w2);
  TEST_LOG("queues: push/pop/len, FIFO, one waiter per push");
}

static void test_getnumkeys(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t a = conn_open(port, 0, "nk(1.13)");
  conn_t b = conn_open(port, 1, "nk(2.x)");
  CHECK_EQ_INT(r_numkeys(&a), 0);
  CHECK_EQ_INT(r_add(&a, "init/", 1), 1); /* raw init/, no "/" */
  CHECK_EQ_INT(r_numkeys(&b), 1);
  r_sets(&b, "/a", "1");
  CHECK_EQ_INT(r_numkeys(&b), 2);
  r_sets(&a, "noslash", "1");
  CHECK_EQ_INT(r_numkeys(&a), 3);
  r_sets(&a, "/a", "2");
  CHECK_EQ_INT(r_numkeys(&a), 3);
  r_append(&b, "/b", "x");
  const char *mk[2] = {"/c", "//worker/attempt_0/d"};
  const char *mv[2] = {"1", "2"};
  r_mset(&b, mk, mv, 2);
  CHECK_EQ_INT(r_numkeys(&b), 6);
  expect_cas(&a, "/e", "", "v", "v");
  CHECK_EQ_INT(r_numkeys(&a), 7);
  expect_cas(&a, "/f", "x", "v", "x");
  CHECK_EQ_INT(r_numkeys(&a), 7);
  CHECK_EQ_INT(r_add(&b, "/g", 3), 3);
  CHECK_EQ_INT(r_numkeys(&a), 8);
  CHECK_EQ_INT(r_delete(&b, "/a"), 1);
  CHECK_EQ_INT(r_delete(&b, "/a"), 0);
  CHECK_EQ_INT(r_numkeys(&a), 7);
  r_set(&a, "", "", 0); /* the empty key is a key too */
  CHECK_EQ_INT(r_numkeys(&b), 8);
  WAIT_STAT(s, keys, 8);
  conn_close(&a);
  conn_close(&b);
  tdist_store_server_destroy(s);
  TEST_LOG("getnumkeys: counts init/, raw and prefixed keys");
}

/* ---------------------------------------------------------------------------------------- */
/* Split and pipelined requests                                                             */
/* ---------------------------------------------------------------------------------------- */

static void send_bytewise(conn_t *c, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    send_raw(c, p + i, 1);
    sleep_ms(1);
  }
}

static void send_split(conn_t *c, const uint8_t *p, size_t n, size_t k) {
  send_raw(c, p, k);
  sleep_ms(2);
  send_raw(c, p + k, n - k);
}

static void test_split(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  /* 1.13: a SET as the very first message, one byte per segment (classification must wait for
   * 5 bytes), then GET the same way. */
  {
    conn_t c = conn_open(port, 0, "bytewise(1.13)");
    enc_t m = {0};
    m_op(&m, &c, OP_SET);
    enc_cstr(&m, K("bw13"));
    enc_cstr(&m, "value13");
    send_bytewise(&c, m.p, m.len);
    free(m.p);
    memset(&m, 0, sizeof(m));
    m_op(&m, &c, OP_GET);
    enc_cstr(&m, K("bw13"));
    send_bytewise(&c, m.p, m.len);
    free(m.p);
    size_t len;
    uint8_t *v = rd_bytes(&c, &len, "bytewise GET");
    CHECK_MEM_EQ(v, len, "value13", 7);
    free(v);
    conn_close(&c);
  }
  /* 2.x: VALIDATE, PING and MULTI_SET/MULTI_GET one byte per segment */
  {
    conn_t c;
    int err;
    c = conn_open_family(AF_INET, port, 0, "bytewise(2.x)", &err);
    CHECK(c.fd >= 0);
    c.v2 = 1;
    enc_t m = {0};
    m_op(&m, &c, OP_VALIDATE);
    enc_u32(&m, 0x3C85F7CEu);
    m_op(&m, &c, OP_PING);
    enc_u32(&m, 0xabcdef01u);
    send_bytewise(&c, m.p, m.len);
    free(m.p);
    uint8_t echo[4];
    rd(&c, echo, 4, "bytewise PING");
    CHECK_MEM_EQ(echo, 4, "\x01\xef\xcd\xab", 4);
    memset(&m, 0, sizeof(m));
    const char *ks[2] = {K("bwa"), K("bwb")};
    const char *vs[2] = {"A", "BB"};
    m_op(&m, &c, OP_MSET);
    enc_u64(&m, 2);
    for (int i = 0; i < 2; i++) {
      enc_cstr(&m, ks[i]);
      enc_cstr(&m, vs[i]);
    }
    m_op(&m, &c, OP_MGET);
    m_keys(&m, ks, 2);
    send_bytewise(&c, m.p, m.len);
    free(m.p);
    for (int i = 0; i < 2; i++) {
      size_t len;
      uint8_t *v = rd_bytes(&c, &len, "bytewise MULTI_GET");
      CHECK_MEM_EQ(v, len, vs[i], strlen(vs[i]));
      free(v);
    }
    conn_close(&c);
  }
  /* Every split point of the first message, on fresh connections: 1.13 SET, 2.x VALIDATE+PING */
  {
    enc_t m = {0};
    conn_t proto13 = {.fd = -1, .v2 = 0};
    m_op(&m, &proto13, OP_SET);
    enc_cstr(&m, K("first"));
    enc_cstr(&m, "v");
    for (size_t k = 1; k < m.len; k++) {
      conn_t c = conn_open(port, 0, "split-first(1.13)");
      send_split(&c, m.p, m.len, k);
      expect_gets(&c, K("first"), "v");
      conn_close(&c);
    }
    free(m.p);
    uint8_t vp[10] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x0d, 0x34, 0x12, 0x00, 0x00};
    for (size_t k = 1; k < sizeof(vp); k++) {
      int err;
      conn_t c = conn_open_family(AF_INET, port, 0, "split-first(2.x)", &err);
      CHECK(c.fd >= 0);
      c.v2 = 1;
      send_split(&c, vp, sizeof(vp), k);
      uint8_t echo[4];
      rd(&c, echo, 4, "split VALIDATE+PING");
      CHECK_MEM_EQ(echo, 4, "\x34\x12\x00\x00", 4);
      conn_close(&c);
    }
  }
  /* Every split point of later requests, both dialects: ADD, COMPARE_SET, WAIT */
  for (int v2 = 0; v2 < 2; v2++) {
    conn_t c = conn_open(port, v2, v2 ? "split(2.x)" : "split(1.13)");
    char name[32];
    snprintf(name, sizeof(name), "split-add%d", v2);
    enc_t m = {0};
    m_op(&m, &c, OP_ADD);
    enc_cstr(&m, K(name));
    enc_u64(&m, 1);
    for (size_t k = 1; k < m.len; k++) {
      send_split(&c, m.p, m.len, k);
      CHECK_EQ_INT((int64_t)rd_u64(&c, "split ADD"), (int64_t)k);
    }
    free(m.p);
    memset(&m, 0, sizeof(m));
    snprintf(name, sizeof(name), "split-cas%d", v2);
    r_sets(&c, K(name), "x");
    m_op(&m, &c, OP_CAS);
    enc_cstr(&m, K(name));
    enc_cstr(&m, "x");
    enc_cstr(&m, "x");
    for (size_t k = 1; k < m.len; k++) {
      send_split(&c, m.p, m.len, k);
      size_t len;
      uint8_t *v = rd_bytes(&c, &len, "split CAS");
      CHECK_MEM_EQ(v, len, "x", 1);
      free(v);
    }
    free(m.p);
    memset(&m, 0, sizeof(m));
    const char *wk[2] = {K(name), K("ow")};
    r_sets(&c, wk[1], "y");
    m_op(&m, &c, OP_WAIT);
    m_keys(&m, wk, 2);
    for (size_t k = 1; k < m.len; k++) {
      send_split(&c, m.p, m.len, k);
      expect_byte(&c, 0x00, "split WAIT");
    }
    free(m.p);
    conn_close(&c);
  }
  TEST_LOG("split requests: byte by byte and at every split point, both dialects");
}

static void test_pipelined(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  /* §1.12: SET, ADD, GET in one segment, answered in order */
  {
    conn_t c = conn_open(port, 0, "pipe(1.13)");
    enc_t m = {0};
    m_op(&m, &c, OP_SET);
    enc_cstr(&m, K("p"));
    enc_cstr(&m, "pv");
    m_op(&m, &c, OP_ADD);
    enc_cstr(&m, K("pc"));
    enc_u64(&m, 7);
    m_op(&m, &c, OP_GET);
    enc_cstr(&m, K("p"));
    m_send(&c, &m);
    CHECK_EQ_INT((int64_t)rd_u64(&c, "pipelined ADD"), 7);
    size_t len;
    uint8_t *v = rd_bytes(&c, &len, "pipelined GET");
    CHECK_MEM_EQ(v, len, "pv", 2);
    free(v);
    /* 200 ADDs in one write */
    for (int i = 0; i < 200; i++) {
      m_op(&m, &c, OP_ADD);
      enc_cstr(&m, K("pipe200"));
      enc_u64(&m, 1);
    }
    m_send(&c, &m);
    for (int i = 1; i <= 200; i++) CHECK_EQ_INT((int64_t)rd_u64(&c, "pipelined ADD x200"), i);
    conn_close(&c);
  }
  /* 2.x: the whole opening and a mix of replies in one write */
  {
    int err;
    conn_t c = conn_open_family(AF_INET, port, 0, "pipe(2.x)", &err);
    CHECK(c.fd >= 0);
    c.v2 = 1;
    enc_t m = {0};
    m_op(&m, &c, OP_VALIDATE);
    enc_u32(&m, 0x3C85F7CEu);
    m_op(&m, &c, OP_PING);
    enc_u32(&m, 42);
    m_op(&m, &c, OP_SET);
    enc_cstr(&m, K("p2"));
    enc_cstr(&m, "v2");
    m_op(&m, &c, OP_GET);
    enc_cstr(&m, K("p2"));
    m_op(&m, &c, OP_MGET);
    const char *ks[2] = {K("p2"), K("p")};
    m_keys(&m, ks, 2);
    m_op(&m, &c, OP_CHECK);
    m_keys(&m, ks, 2);
    m_op(&m, &c, OP_CANCEL);
    m_op(&m, &c, OP_DELETE);
    enc_cstr(&m, K("p2"));
    m_op(&m, &c, OP_QLEN);
    enc_cstr(&m, K("noq"));
    m_send(&c, &m);
    uint8_t echo[4];
    rd(&c, echo, 4, "pipelined PING");
    CHECK_MEM_EQ(echo, 4, "\x2a\0\0\0", 4);
    size_t len;
    uint8_t *v = rd_bytes(&c, &len, "pipelined GET");
    CHECK_MEM_EQ(v, len, "v2", 2);
    free(v);
    v = rd_bytes(&c, &len, "pipelined MULTI_GET[0]");
    CHECK_MEM_EQ(v, len, "v2", 2);
    free(v);
    v = rd_bytes(&c, &len, "pipelined MULTI_GET[1]");
    CHECK_MEM_EQ(v, len, "pv", 2);
    free(v);
    expect_byte(&c, 0x00, "pipelined CHECK");
    expect_byte(&c, 0x01, "pipelined CANCEL_WAIT");
    CHECK_EQ_INT(rd_u64(&c, "pipelined DELETE"), 1);
    CHECK_EQ_INT(rd_u64(&c, "pipelined QUEUE_LEN"), 0);
    conn_close(&c);
  }
  TEST_LOG("pipelined requests: answered in order");
}

/* ---------------------------------------------------------------------------------------- */
/* Clients that vanish                                                                      */
/* ---------------------------------------------------------------------------------------- */

static void close_rst(conn_t *c) {
  struct linger l = {1, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  conn_close(c);
}

static void test_vanishing(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  const char *k = K("vanish");
  conn_t a = conn_open(port, 0, "vanish-a(1.13)");
  conn_t b = conn_open(port, 1, "vanish-b(2.x)");
  conn_t c = conn_open(port, 1, "vanish-c(2.x)");
  conn_t setter = conn_open(port, 1, "vanish-setter");
  uint64_t base = stats(s).waits_pending;
  send_wait(&a, &k, 1);
  send_wait(&b, &k, 1);
  send_wait(&c, &k, 1);
  WAIT_STAT(s, waits_pending, base + 3);
  conn_close(&a); /* FIN */
  close_rst(&c);  /* RST */
  WAIT_STAT(s, waits_pending, base + 1);
  r_sets(&setter, k, "v");
  expect_byte(&b, 0x00, "surviving waiter");
  WAIT_STAT(s, waits_pending, base);
  expect_ping(&b, 3);
  expect_ping(&setter, 4);

  /* half a request, then gone: nothing is applied */
  {
    conn_t h = conn_open(port, 1, "half");
    enc_t m = {0};
    m_op(&m, &h, OP_SET);
    enc_cstr(&m, K("half"));
    enc_cstr(&m, "value");
    send_raw(&h, m.p, m.len - 3);
    free(m.p);
    sleep_ms(20);
    conn_close(&h);
    sleep_ms(20);
    const char *hk = K("half");
    CHECK_EQ_INT(r_check(&setter, &hk, 1), 1);
  }
  /* requests whose large replies go to a peer that has left (the server's send fails: it must
   * not die of SIGPIPE, and this test process does not ignore SIGPIPE) */
  {
    size_t n = (size_t)1 << 20;
    uint8_t *v = malloc(n);
    CHECK(v != NULL);
    memset(v, 'z', n);
    r_set(&setter, K("bigv"), v, n);
    sync_conn(&setter);
    free(v);
    for (int round = 0; round < 3; round++) {
      conn_t g = conn_open(port, round % 2, "leaver");
      enc_t m = {0};
      for (int i = 0; i < 16; i++) {
        m_op(&m, &g, OP_GET);
        enc_cstr(&m, K("bigv"));
      }
      m_send(&g, &m);
      sleep_ms(5);
      if (round == 2)
        close_rst(&g);
      else
        conn_close(&g);
    }
    sleep_ms(100);
    expect_ping(&setter, 77);
  }
  conn_close(&b);
  conn_close(&setter);
  TEST_LOG("vanishing clients: waits discarded, others unaffected, no SIGPIPE");
}

/* ---------------------------------------------------------------------------------------- */
/* Limits, max_connections, stats, address families                                          */
/* ---------------------------------------------------------------------------------------- */

static void test_limits(void) {
  limits_t lim = {.max_key = 16, .max_value = 64, .max_multi = 4, .max_conn = 0};
  tdist_store_server_t *s = start_server(&lim);
  int port = tdist_store_server_port(s);
  conn_t keeper = conn_open(port, 1, "keeper");
  char k16[17], k17[18], v64[65], v65[66];
  memset(k16, 'k', 16);
  k16[0] = '/';
  k16[16] = 0;
  memset(k17, 'k', 17);
  k17[0] = '/';
  k17[17] = 0;
  memset(v64, 'v', 64);
  v64[64] = 0;
  memset(v65, 'v', 65);
  v65[65] = 0;
  uint64_t dropped = 0;
  for (int v2 = 0; v2 < 2; v2++) {
    conn_t c = conn_open(port, v2, "limits-ok");
    r_sets(&c, k16, v64); /* exactly at the limits */
    expect_gets(&c, k16, v64);
    const char *four[4] = {k16, k16, k16, k16};
    send_wait(&c, four, 4);
    expect_byte(&c, 0x00, "WAIT with max_multi_keys keys");
    CHECK_EQ_INT(r_check(&c, four, 4), 0);
    if (v2) {
      const char *vals[4] = {"a", "b", "c", v64};
      r_mset(&c, four, vals, 4);
      expect_gets(&c, k16, v64);
      const char *gv[4] = {v64, v64, v64, v64};
      expect_mget(&c, four, gv, 4);
    }
    conn_close(&c);

    for (int kind = 0; kind < (v2 ? 12 : 8); kind++) {
      conn_t t = conn_open(port, v2, "over-limit");
      enc_t m = {0};
      const char *what = "";
      switch (kind) {
        case 0:
          what = "SET key of 17";
          m_op(&m, &t, OP_SET);
          enc_cstr(&m, k17);
          enc_cstr(&m, "v");
          break;
        case 1:
          what = "key length 17 announced";
          m_op(&m, &t, OP_GET);
          enc_u64(&m, 17);
          break;
        case 2:
          what = "SET value of 65";
          m_op(&m, &t, OP_SET);
          enc_cstr(&m, k16);
          enc_cstr(&m, v65);
          break;
        case 3:
          what = "1 TB value announced";
          m_op(&m, &t, OP_SET);
          enc_cstr(&m, k16);
          enc_u64(&m, (uint64_t)1 << 40);
          break;
        case 4:
          what = "WAIT of 5 keys";
          m_op(&m, &t, OP_WAIT);
          enc_u64(&m, 5);
          break;
        case 5:
          what = "CHECK of 5 keys";
          m_op(&m, &t, OP_CHECK);
          enc_u64(&m, 5);
          break;
        case 6:
          what = "ADD key of 17";
          m_op(&m, &t, OP_ADD);
          enc_cstr(&m, k17);
          enc_u64(&m, 1);
          break;
        case 7:
          what = "CAS desired of 65";
          m_op(&m, &t, OP_CAS);
          enc_cstr(&m, k16);
          enc_cstr(&m, "");
          enc_cstr(&m, v65);
          break;
        case 8:
          what = "MULTI_SET of 5 pairs";
          m_op(&m, &t, OP_MSET);
          enc_u64(&m, 5);
          break;
        case 9:
          what = "MULTI_GET of 5 keys";
          m_op(&m, &t, OP_MGET);
          enc_u64(&m, 5);
          break;
        case 10:
          what = "APPEND of 65";
          m_op(&m, &t, OP_APPEND);
          enc_cstr(&m, k16);
          enc_cstr(&m, v65);
          break;
        case 11:
          what = "MULTI_SET value of 65";
          m_op(&m, &t, OP_MSET);
          enc_u64(&m, 2);
          enc_cstr(&m, k16);
          enc_cstr(&m, "ok");
          enc_cstr(&m, k16);
          enc_cstr(&m, v65);
          break;
      }
      m_send(&t, &m);
      char why[96];
      snprintf(why, sizeof(why), "%s (%s)", what, v2 ? "2.x" : "1.13");
      expect_closed(&t, why);
      dropped++;
      WAIT_STAT(s, connections_dropped, dropped);
      expect_ping(&keeper, (uint32_t)kind);
    }
  }
  expect_gets(&keeper, k16, v64); /* no over-limit request changed anything */
  conn_close(&keeper);
  tdist_store_server_destroy(s);
  TEST_LOG("limits: over-limit requests close only their connection");
}

/* The default server refuses a 1 TB value as soon as its length arrives. */
static void test_default_value_limit(tdist_store_server_t *s) {
  conn_t t = conn_open(tdist_store_server_port(s), 1, "1TB");
  enc_t m = {0};
  m_op(&m, &t, OP_SET);
  enc_cstr(&m, K("tb"));
  enc_u64(&m, (uint64_t)1 << 40);
  m_send(&t, &m);
  expect_closed(&t, "1 TB value announced to the default server");
}

static void test_max_connections(void) {
  limits_t lim = {.max_conn = 4};
  tdist_store_server_t *s = start_server(&lim);
  int port = tdist_store_server_port(s);
  conn_t c[4];
  for (int i = 0; i < 4; i++) {
    c[i] = conn_open(port, i % 2, "maxconn");
    sync_conn(&c[i]);
  }
  WAIT_STAT(s, connections_open, 4);
  conn_t extra = conn_open(port, 1, "maxconn-extra");
  expect_closed(&extra, "fifth connection with max_connections 4");
  for (int i = 0; i < 4; i++) sync_conn(&c[i]);
  conn_close(&c[0]);
  WAIT_STAT(s, connections_open, 3);
  c[0] = conn_open(port, 1, "maxconn-again");
  expect_ping(&c[0], 11);
  for (int i = 0; i < 4; i++) conn_close(&c[i]);
  WAIT_STAT(s, connections_open, 0);
  tdist_store_server_destroy(s);
  TEST_LOG("max_connections: the extra connection is closed, the others served");
}

static void test_stats(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  tdist_store_server_stats_t st = stats(s);
  CHECK_EQ_INT(st.connections_total, 0);
  CHECK_EQ_INT(st.connections_open, 0);
  CHECK_EQ_INT(st.connections_dropped, 0);
  CHECK_EQ_INT(st.keys, 0);
  CHECK_EQ_INT(st.waits_pending, 0);
  CHECK_EQ_INT(st.requests_total, 0);
  conn_t a = conn_open(port, 1, "stats-a");
  conn_t b = conn_open(port, 0, "stats-b");
  sync_conn(&a);
  sync_conn(&b);
  WAIT_STAT(s, connections_total, 2);
  WAIT_STAT(s, connections_open, 2);
  uint64_t r0 = stats(s).requests_total;
  CHECK(r0 >= 2); /* at least the two syncs */
  for (int i = 0; i < 10; i++) {
    char name[16];
    snprintf(name, sizeof(name), "/s%d", i);
    r_sets(&a, name, "v");
  }
  expect_ping(&a, 1);
  WAIT_STAT(s, requests_total, r0 + 11);
  WAIT_STAT(s, keys, 10);
  const char *k = "/later";
  send_wait(&b, &k, 1);
  WAIT_STAT(s, waits_pending, 1);
  WAIT_STAT(s, requests_total, r0 + 12);
  r_sets(&a, k, "x");
  expect_byte(&b, 0x00, "stats WAIT");
  WAIT_STAT(s, waits_pending, 0);
  WAIT_STAT(s, keys, 11);
  CHECK_EQ_INT(r_delete(&b, "/s0"), 1);
  WAIT_STAT(s, keys, 10);
  WAIT_STAT(s, requests_total, r0 + 14);
  expect_op_closes(port, 1, 0x42, "stats: unknown opcode");
  WAIT_STAT(s, connections_dropped, 1);
  WAIT_STAT(s, connections_total, 3);
  WAIT_STAT(s, connections_open, 2);
  conn_close(&b);
  WAIT_STAT(s, connections_open, 1);
  st = stats(s);
  CHECK_EQ_INT(st.connections_dropped, 1); /* a client's own close is not a drop */
  CHECK_EQ_INT(st.connections_total, 3);
  conn_close(&a);
  WAIT_STAT(s, connections_open, 0);
  tdist_store_server_destroy(s);
  TEST_LOG("stats: counters follow connections, requests, keys and waits");
}

static void test_address_families(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  int err = 0;
  conn_t v4 = conn_open_family(AF_INET, port, 1, "127.0.0.1", &err);
  if (v4.fd < 0) TEST_FAIL("connect 127.0.0.1:%d: %s", port, strerror(err));
  expect_ping(&v4, 4);
  conn_t v6 = conn_open_family(AF_INET6, port, 1, "[::1]", &err);
  if (v6.fd < 0) {
    if (err == EAFNOSUPPORT || err == EADDRNOTAVAIL || err == ENETUNREACH) {
      TEST_LOG("address families: SKIPPED [::1] (no IPv6 loopback here: %s)", strerror(err));
      conn_close(&v4);
      return;
    }
    TEST_FAIL("connect [::1]:%d: %s (the default server must listen dual stack)", port,
              strerror(err));
  }
  expect_ping(&v6, 6);
  r_sets(&v6, K("fam"), "six");
  sync_conn(&v6);
  expect_gets(&v4, K("fam"), "six");
  conn_close(&v4);
  conn_close(&v6);
  TEST_LOG("address families: 127.0.0.1 and [::1] reach the default server");
}

/* Counting of §1.6: the server records each *missing* key once and counts down per key. */
static void test_wait_edges(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  conn_t w = conn_open(port, 1, "edge-waiter");
  conn_t o = conn_open(port, 0, "edge-setter(1.13)");
  uint64_t base = stats(s).waits_pending;
  int64_t keys0 = r_numkeys(&o);

  /* SET of the same key twice counts once */
  const char *ab[2] = {K("a"), K("b")};
  send_wait(&w, ab, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  CHECK_EQ_INT(r_numkeys(&o), keys0); /* keys that are only awaited are not keys */
  const char *a = ab[0];
  CHECK_EQ_INT(r_check(&o, &a, 1), 1);
  r_sets(&o, ab[0], "1");
  r_sets(&o, ab[0], "2");
  CHECK_EQ_INT(r_add(&o, ab[0], 0), 2);
  expect_silent(&w, 100, "WAIT [a,b] after a was written three times");
  r_sets(&o, ab[1], "3");
  expect_byte(&w, 0x00, "WAIT [a,b] after b");
  expect_ping(&w, 1);

  /* the same missing key twice in one WAIT: one SET completes it, with one reply */
  const char *cc[2] = {K("c"), K("c")};
  send_wait(&w, cc, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  r_sets(&o, cc[0], "x");
  expect_byte(&w, 0x00, "WAIT [c,c] after c");
  expect_ping(&w, 2); /* and no second 00 */

  /* a key that existed when the WAIT arrived is not awaited: deleting it changes nothing */
  const char *de[2] = {K("d"), K("e")};
  r_sets(&o, de[1], "exists");
  sync_conn(&o);
  send_wait(&w, de, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  CHECK_EQ_INT(r_delete(&o, de[1]), 1);
  r_sets(&o, de[0], "now");
  expect_byte(&w, 0x00, "WAIT [d,e] after d (e deleted meanwhile)");
  WAIT_STAT(s, waits_pending, base);

  /* one SET wakes every waiter of the key */
  enum { NW = 50 };
  conn_t many[NW];
  const char *f = K("f");
  for (int i = 0; i < NW; i++) {
    many[i] = conn_open(port, i % 2, "many-waiters");
    send_wait(&many[i], &f, 1);
  }
  WAIT_STAT(s, waits_pending, base + NW);
  CHECK_EQ_INT(r_numkeys(&o), keys0 + 4); /* a, b, c, d (e was deleted); f is only awaited */
  r_sets(&o, f, "go");
  for (int i = 0; i < NW; i++) {
    expect_byte(&many[i], 0x00, "one of 50 waiters");
    conn_close(&many[i]);
  }
  WAIT_STAT(s, waits_pending, base);

  /* a value and a queue under the same name live side by side */
  const char *qk = K("qk");
  r_sets(&w, qk, "val");
  r_qpush(&w, qk, "item");
  expect_gets(&w, qk, "val");
  CHECK_EQ_INT(r_qlen(&w, qk), 1);
  expect_qpop(&w, qk, 1, "item");
  expect_gets(&w, qk, "val");
  conn_close(&w);
  conn_close(&o);
  TEST_LOG("wait edges: per-key counting, duplicates, 50 waiters, awaited keys are not keys");
}

/* Destroying a server with live clients and pending waits; a second server on a used port. */
static void test_lifecycle(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.port = port;
  o.quiet = 1;
  tdist_store_server_t *dup = NULL;
  tdist_status_t st = tdist_store_server_create(&o, &dup);
  if (st == TDIST_OK) {
    tdist_store_server_destroy(dup);
    TEST_FAIL("a second server could bind port %d while the first listens", port);
  }
  CHECK(tdist_last_error()[0] != '\0');
  TEST_LOG("  second server on port %d: %s (%s)", port, tdist_status_name(st), tdist_last_error());

  conn_t a = conn_open(port, 1, "doomed-waiter");
  conn_t b = conn_open(port, 0, "doomed-idle");
  const char *k = "/never";
  send_wait(&a, &k, 1);
  WAIT_STAT(s, waits_pending, 1);
  tdist_store_server_destroy(s);
  expect_closed(&a, "server destroyed during a WAIT");
  expect_closed(&b, "server destroyed");
  tdist_store_server_destroy(NULL);
  /* the port is free again */
  tdist_store_server_t *again = NULL;
  CHECK_OK(tdist_store_server_create(&o, &again));
  CHECK_EQ_INT(tdist_store_server_port(again), port);
  conn_t c = conn_open(port, 1, "reborn");
  expect_ping(&c, 9);
  CHECK_EQ_INT(r_numkeys(&c), 0);
  conn_close(&c);
  tdist_store_server_destroy(again);
  TEST_LOG("lifecycle: port in use refused, destroy closes live clients, port reusable");
}

int main(void) {
  test_rng_init("server_test", 424242);
  /* SIGPIPE is deliberately left at its default: a server that writes to a departed peer without
   * MSG_NOSIGNAL would kill this process, and that is a bug worth seeing. */

  test_capture_replay();
  test_getnumkeys();
  test_stats();
  test_limits();
  test_max_connections();
  test_lifecycle();

  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t idle = conn_open(port, 0, "idle(1.13 callback)"); /* says nothing until the end */
  conn_t c13 = conn_open(port, 0, "main(1.13)");
  conn_t c2 = conn_open(port, 1, "main(2.x)");
  conn_t aux2 = conn_open(port, 1, "aux(2.x)");
  conn_t aux13 = conn_open(port, 0, "aux(1.13)");

  key_prefix = "d113";
  op_suite(s, &c13, &aux2, &aux13);
  TEST_LOG("ops on a 1.13 connection: ok");
  key_prefix = "d2";
  op_suite(s, &c2, &aux2, &aux13);
  TEST_LOG("ops on a 2.x connection: ok");
  /* what one dialect wrote, the other reads */
  key_prefix = "x";
  r_sets(&c13, K("from13"), "a");
  r_sets(&c2, K("from2"), "b");
  sync_conn(&c13);
  sync_conn(&c2);
  expect_gets(&c2, K("from13"), "a");
  expect_gets(&c13, K("from2"), "b");

  key_prefix = "q";
  test_queues(s);
  key_prefix = "edge";
  test_wait_edges(s);
  key_prefix = "split";
  test_split(s);
  key_prefix = "pipe";
  test_pipelined(s);
  key_prefix = "van";
  test_vanishing(s);
  key_prefix = "lim";
  test_default_value_limit(s);
  key_prefix = "fam";
  test_address_families(s);

  /* the idle connection is still open and works when it finally speaks */
  expect_silent(&idle, 0, "idle connection");
  CHECK(r_numkeys(&idle) > 0);
  expect_ping(&c2, 1);
  (void)r_numkeys(&c13);
  conn_close(&idle);
  conn_close(&c13);
  conn_close(&c2);
  conn_close(&aux2);
  conn_close(&aux13);
  tdist_store_server_destroy(s);
  TEST_LOG("server_test: all passed");
  return 0;
}
