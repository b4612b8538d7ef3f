/* See server_wire.h. */
#include "server_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"

int raw_connect(int family, int port) {
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

void send_raw(conn_t *c, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = send(c->fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) TEST_FAIL("%s: send: %s", c->name, strerror(errno));
    b += k;
    n -= (size_t)k;
  }
}

conn_t conn_open(int port, int v2, const char *name) {
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

void conn_close(conn_t *c) {
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
}

int read_full(int fd, void *buf, size_t n, int timeout_ms) {
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

void rd(conn_t *c, void *buf, size_t n, const char *what) {
  int r = read_full(c->fd, buf, n, IO_TIMEOUT_MS);
  if (r == 1) TEST_FAIL("%s: connection closed while reading %zu bytes of %s", c->name, n, what);
  if (r == 2) TEST_FAIL("%s: timed out reading %zu bytes of %s", c->name, n, what);
}

uint64_t rd_u64(conn_t *c, const char *what) {
  uint8_t b[8];
  rd(c, b, 8, what);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

uint8_t rd_u8(conn_t *c, const char *what) {
  uint8_t b;
  rd(c, &b, 1, what);
  return b;
}

uint8_t *rd_bytes(conn_t *c, size_t *len, const char *what) {
  uint64_t n = rd_u64(c, what);
  if (n > ((uint64_t)256 << 20)) TEST_FAIL("%s: absurd length %" PRIu64 " in %s", c->name, n, what);
  uint8_t *p = malloc((size_t)n + 1);
  CHECK(p != NULL);
  if (n) rd(c, p, (size_t)n, what);
  p[n] = 0;
  *len = (size_t)n;
  return p;
}

void expect_silent(conn_t *c, int ms, const char *why) {
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

void expect_closed(conn_t *c, const char *why) {
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

void m_op(enc_t *m, const conn_t *c, int op) {
  int w = c->v2 ? v2_wire[op] : v113_wire[op];
  if (w < 0) TEST_FAIL("%s: op %d does not exist in this dialect (test bug)", c->name, op);
  enc_u8(m, (uint8_t)w);
}

void m_send(conn_t *c, enc_t *m) {
  send_raw(c, m->p, m->len);
  free(m->p);
  memset(m, 0, sizeof(*m));
}

void r_set(conn_t *c, const char *key, const void *v, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_SET);
  enc_cstr(&m, key);
  enc_str(&m, v, n);
  m_send(c, &m);
}

void r_sets(conn_t *c, const char *key, const char *v) { r_set(c, key, v, strlen(v)); }

uint8_t *r_get(conn_t *c, const char *key, size_t *len) {
  enc_t m = {0};
  m_op(&m, c, OP_GET);
  enc_cstr(&m, key);
  m_send(c, &m);
  return rd_bytes(c, len, "GET reply");
}

void expect_get(conn_t *c, const char *key, const void *v, size_t n) {
  size_t len;
  uint8_t *got = r_get(c, key, &len);
  if (len != n || (n && memcmp(got, v, n) != 0))
    TEST_FAIL("%s: GET %s: got %zu bytes '%.*s', want %zu bytes '%.*s'", c->name, key, len,
              (int)(len > 60 ? 60 : len), got, n, (int)(n > 60 ? 60 : n), (const char *)v);
  free(got);
}

void expect_gets(conn_t *c, const char *key, const char *v) { expect_get(c, key, v, strlen(v)); }

int64_t r_add(conn_t *c, const char *key, int64_t delta) {
  enc_t m = {0};
  m_op(&m, c, OP_ADD);
  enc_cstr(&m, key);
  enc_u64(&m, (uint64_t)delta);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "ADD reply");
}

void expect_cas(conn_t *c, const char *key, const char *exp, const char *des, const char *want) {
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

void m_keys(enc_t *m, const char *const *keys, size_t n) {
  enc_u64(m, n);
  for (size_t i = 0; i < n; i++) enc_cstr(m, keys[i]);
}

uint8_t r_check(conn_t *c, const char *const *keys, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_CHECK);
  m_keys(&m, keys, n);
  m_send(c, &m);
  return rd_u8(c, "CHECK reply");
}

void send_wait(conn_t *c, const char *const *keys, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_WAIT);
  m_keys(&m, keys, n);
  m_send(c, &m);
}

void expect_byte(conn_t *c, uint8_t want, const char *what) {
  uint8_t got = rd_u8(c, what);
  if (got != want) TEST_FAIL("%s: %s: got byte %02x, want %02x", c->name, what, got, want);
}

int64_t r_numkeys(conn_t *c) {
  enc_t m = {0};
  m_op(&m, c, OP_NUMKEYS);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "GETNUMKEYS reply");
}

int64_t r_delete(conn_t *c, const char *key) {
  enc_t m = {0};
  m_op(&m, c, OP_DELETE);
  enc_cstr(&m, key);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "DELETE_KEY reply");
}

void r_append(conn_t *c, const char *key, const char *v) {
  enc_t m = {0};
  m_op(&m, c, OP_APPEND);
  enc_cstr(&m, key);
  enc_cstr(&m, v);
  m_send(c, &m);
}

void r_mset(conn_t *c, const char *const *keys, const char *const *vals, size_t n) {
  enc_t m = {0};
  m_op(&m, c, OP_MSET);
  enc_u64(&m, n);
  for (size_t i = 0; i < n; i++) {
    enc_cstr(&m, keys[i]);
    enc_cstr(&m, vals[i]);
  }
  m_send(c, &m);
}

void expect_mget(conn_t *c, const char *const *keys, const char *const *vals, size_t n) {
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

void expect_ping(conn_t *c, uint32_t nonce) {
  enc_t m = {0};
  m_op(&m, c, OP_PING);
  enc_u32(&m, nonce);
  m_send(c, &m);
  uint8_t b[4];
  rd(c, b, 4, "PING echo");
  uint32_t got = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
  if (got != nonce) TEST_FAIL("%s: PING %08x echoed %08x", c->name, nonce, got);
}

void sync_conn(conn_t *c) {
  if (c->v2) {
    static uint32_t nonce;
    expect_ping(c, ++nonce * 2654435761u);
  } else {
    (void)r_numkeys(c);
  }
}

void r_qpush(conn_t *c, const char *key, const char *v) {
  enc_t m = {0};
  m_op(&m, c, OP_QPUSH);
  enc_cstr(&m, key);
  enc_cstr(&m, v);
  m_send(c, &m);
}

int64_t r_qlen(conn_t *c, const char *key) {
  enc_t m = {0};
  m_op(&m, c, OP_QLEN);
  enc_cstr(&m, key);
  m_send(c, &m);
  return (int64_t)rd_u64(c, "QUEUE_LEN reply");
}

void expect_qpop(conn_t *c, const char *key, int64_t want_len, const char *want) {
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

tdist_store_server_t *start_server(const limits_t *lim) {
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

tdist_store_server_stats_t stats(tdist_store_server_t *s) {
  tdist_store_server_stats_t st;
  memset(&st, 0xEE, sizeof(st));
  tdist_store_server_stats(s, &st);
  return st;
}

void wait_stat(tdist_store_server_t *s, size_t off, const char *name, uint64_t want) {
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

void exchange(conn_t *c, const char *req_hex, const char *reply_hex) {
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

conn_t conn_open_family(int family, int port, int v2, const char *name, int *err) {
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

const char *key_prefix = "t";

const char *K(const char *name) {
  static char bufs[32][160];
  static int next;
  char *b = bufs[next++ % 32];
  snprintf(b, 160, "/%s/%s", key_prefix, name);
  return b;
}

void expect_op_closes(int port, int v2, uint8_t opcode, const char *why) {
  conn_t t = conn_open(port, v2, "throwaway");
  if (v2) expect_ping(&t, 7);
  uint8_t b[24];
  memset(b, 0, sizeof(b));
  b[0] = opcode;
  send_raw(&t, b, sizeof(b));
  expect_closed(&t, why);
}

void expect_idle_usable(conn_t *idle) {
  expect_silent(idle, 0, "idle connection");
  CHECK(r_numkeys(idle) > 0);
}
