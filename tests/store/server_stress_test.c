/* Load tests of the TCPStore server, over raw sockets with an encoder of its own (the wire format
 * of shared/reference/torch-contracts.md §1.2-§1.3).
 *
 * Part 1: 10,000 idle connections (a forked child holds the client ends, this process the server
 * ends, so neither passes the RLIMIT_NOFILE hard limit) stay open while a working client's
 * SET/GET/ADD round trips keep succeeding with correct values; then all 10,000 close at once and
 * the server keeps serving. The idle ones mimic real peers: silent (1.13 callback sockets),
 * validated 2.x connections, and connections that sent a lone 0x00 and cannot be classified yet.
 * Part 2: 200 client threads, both dialects, do random operations; every reply is checked against
 * a per-thread model, and shared counters and cross-thread waits against their totals.
 * Every read has a deadline. Random data comes from a fixed seed (TDIST_TEST_SEED overrides). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "rng.h"
#include "wire_enc.h"
#include "proc.h"
#include "skip.h"
#include "tdist/tdist.h"

#define N_IDLE 10000
#define IO_TIMEOUT_MS 30000

static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

/* ---- raw client (wire bytes from reference §1.2) ---- */
typedef struct {
  int fd, v2;
  enc_t m; /* request being built (wire_enc.h) */
} conn_t;

static int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  while (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    if (errno == EINTR) continue;
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

static void send_all(int fd, const void *p, size_t n) {
  const uint8_t *b = p;
  while (n > 0) {
    ssize_t k = send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("send: %s", strerror(errno));
    b += k;
    n -= (size_t)k;
  }
}

static void conn_open(conn_t *c, int port, int v2) {
  memset(c, 0, sizeof(*c));
  c->v2 = v2;
  c->fd = connect_loopback(port);
  if (c->fd < 0) fail("connect 127.0.0.1:%d: %s", port, strerror(-c->fd));
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (v2) send_all(c->fd, "\x00\xce\xf7\x85\x3c", 5);
}
static void conn_close(conn_t *c) {
  close(c->fd);
  free(c->m.p);
  c->fd = -1;
  c->m = (enc_t){0};
}

static void put_u64(conn_t *c, uint64_t v) { enc_u64(&c->m, v); }
static void put_str(conn_t *c, const void *s, size_t n) { enc_str(&c->m, s, n); }
static void put_op(conn_t *c, int op) {
  int w = c->v2 ? v2_wire[op] : v113_wire[op];
  CHECK(w >= 0);
  enc_u8(&c->m, (uint8_t)w);
}
static void flush(conn_t *c) {
  send_all(c->fd, c->m.p, c->m.len);
  c->m.len = 0;
}

static void rd(conn_t *c, void *buf, size_t n) {
  int64_t deadline = now_ms() + IO_TIMEOUT_MS;
  size_t got = 0;
  while (got < n) {
    int64_t left = deadline - now_ms();
    if (left <= 0) fail("fd %d: timed out reading %zu bytes", c->fd, n);
    struct pollfd p = {c->fd, POLLIN, 0};
    if (poll(&p, 1, (int)left) <= 0) continue;
    ssize_t k = recv(c->fd, (char *)buf + got, n - got, 0);
    if (k == 0) fail("fd %d: server closed the connection", c->fd);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      fail("fd %d: recv: %s", c->fd, strerror(errno));
    }
    got += (size_t)k;
  }
}
static uint64_t rd_u64(conn_t *c) {
  uint8_t b[8];
  rd(c, b, 8);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}
static uint8_t rd_u8(conn_t *c) {
  uint8_t b;
  rd(c, &b, 1);
  return b;
}
/* Reads `u64 len, bytes` and compares with want. */
static void rd_expect(conn_t *c, const void *want, size_t wlen, const char *what) {
  uint64_t n = rd_u64(c);
  if (n > ((uint64_t)1 << 24)) fail("%s: absurd length %" PRIu64, what, n);
  uint8_t *b = malloc((size_t)n + 1);
  CHECK(b != NULL);
  rd(c, b, (size_t)n);
  if (n != wlen || (n && memcmp(b, want, n) != 0))
    fail("%s: got %" PRIu64 " bytes '%.*s', want %zu bytes '%.*s'", what, n, (int)(n > 40 ? 40 : n),
         b, wlen, (int)(wlen > 40 ? 40 : wlen), (const char *)want);
  free(b);
}

/* ---- server ---- */
static tdist_store_server_t *start_server(void) {
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.quiet = 1;
  tdist_store_server_t *s = NULL;
  CHECK_OK(tdist_store_server_create(&o, &s));
  return s;
}

static uint64_t open_conns(tdist_store_server_t *s) {
  tdist_store_server_stats_t st;
  tdist_store_server_stats(s, &st);
  return st.connections_open;
}

/* ---------------------------------------------------------------------------------------- */
/* Part 1: 10,000 idle connections                                                          */
/* ---------------------------------------------------------------------------------------- */

/* Resident memory of this process (the server's side of every connection), in KiB. */
static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  fclose(f);
  return kib;
}

/* Raises the soft open-file limit to the hard one; returns the soft limit now in force. */
static rlim_t raise_nofile(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  rlim_t soft = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  return setrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_max : soft;
}

/* Reads one byte from fd within ms; -1 on timeout/EOF. */
static int read_byte(int fd, int ms) {
  struct pollfd p = {fd, POLLIN, 0};
  int64_t deadline = now_ms() + ms;
  for (;;) {
    int64_t left = deadline - now_ms();
    if (left <= 0) return -1;
    int r = poll(&p, 1, (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    uint8_t b;
    ssize_t k = read(fd, &b, 1);
    if (k == 1) return b;
    if (k < 0 && errno == EINTR) continue;
    return -1;
  }
}

/* The child: opens N_IDLE connections, reports, checks them on request, then exits (which closes
 * all of them at once). Protocol on the pipes: parent sends the port (int); child answers 'O'
 * (open) or 'E' (+ errno int); parent sends 'C'; child answers the number of connections that
 * were closed or got bytes (int); parent sends 'X' and the child exits. */
static void child_main(int from_parent, int to_parent) {
  raise_nofile();
  int port = 0;
  struct pollfd pp = {from_parent, POLLIN, 0};
  if (poll(&pp, 1, 30000) <= 0 || read(from_parent, &port, sizeof(port)) != sizeof(port)) _exit(3);
  struct pollfd *fds = calloc(N_IDLE, sizeof(*fds));
  if (!fds) _exit(4);
  for (int i = 0; i < N_IDLE; i++) {
    int fd = connect_loopback(port);
    if (fd < 0) {
      int e = -fd;
      char tag = 'E';
      if (write(to_parent, &tag, 1) != 1 || write(to_parent, &e, sizeof(e)) != sizeof(e)) _exit(5);
      if (write(to_parent, &i, sizeof(i)) != sizeof(i)) _exit(5);
      _exit(2);
    }
    /* a third silent, a third validated 2.x, a third with a lone 0x00 (not classifiable yet) */
    if (i % 3 == 1 && send(fd, "\x00\xce\xf7\x85\x3c", 5, MSG_NOSIGNAL) != 5) _exit(6);
    if (i % 3 == 2 && send(fd, "\x00", 1, MSG_NOSIGNAL) != 1) _exit(6);
    fds[i].fd = fd;
    fds[i].events = POLLIN;
  }
  char tag = 'O';
  if (write(to_parent, &tag, 1) != 1) _exit(5);
  if (read_byte(from_parent, 120000) != 'C') _exit(7);
  int bad = poll(fds, N_IDLE, 0);
  if (write(to_parent, &bad, sizeof(bad)) != sizeof(bad)) _exit(5);
  (void)read_byte(from_parent, 120000); /* 'X', or the parent is gone */
  _exit(0);
}

typedef struct {
  conn_t c;
  uint64_t n;     /* round trips done */
  int64_t cnt;    /* the ADD counter's value */
  int64_t max_us; /* slowest round trip */
  test_rng_t rng;
} worker_t;

/* One SET + GET + ADD round trip, values checked. Alternates dialects by connection. */
static void work_once(worker_t *w) {
  int64_t t0 = now_us();
  char key[32], val[48];
  snprintf(key, sizeof(key), "/work/%" PRIu64, w->n % 64);
  int vlen = snprintf(val, sizeof(val), "v%" PRIu64 "-%" PRIx64, w->n, test_rng_next(&w->rng));
  conn_t *c = &w->c;
  put_op(c, OP_SET);
  put_str(c, key, strlen(key));
  put_str(c, val, (size_t)vlen);
  put_op(c, OP_GET);
  put_str(c, key, strlen(key));
  flush(c);
  rd_expect(c, val, (size_t)vlen, "working GET");
  put_op(c, OP_ADD);
  put_str(c, "/work/cnt", 9);
  put_u64(c, 3);
  flush(c);
  w->cnt += 3;
  int64_t got = (int64_t)rd_u64(c);
  if (got != w->cnt) fail("working ADD: got %" PRId64 ", want %" PRId64, got, w->cnt);
  w->n++;
  int64_t dt = now_us() - t0;
  if (dt > w->max_us) w->max_us = dt;
}

static void test_idle_connections(uint64_t seed) {
  rlim_t lim = raise_nofile();
  if (lim < N_IDLE + 300) {
    test_skip(
        "server_stress_test: 10,000 idle connections: RLIMIT_NOFILE is %llu after raising the "
        "soft limit to the hard one, need %d (raise the hard limit: `ulimit -Hn`, limits.conf)",
        (unsigned long long)lim, N_IDLE + 300);
    return;
  }
  int down[2], up[2];
  CHECK(pipe(down) == 0 && pipe(up) == 0);
  fflush(stderr);
  pid_t pid = fork(); /* before the server thread exists: the child is single-threaded */
  CHECK(pid >= 0);
  if (pid == 0) {
    close(down[1]);
    close(up[0]);
    child_main(down[0], up[1]);
  }
  close(down[0]);
  close(up[1]);

  tdist_store_server_t *s = start_server();
  int port = tdist_store_server_port(s);
  long rss0 = rss_kib();
  worker_t w;
  memset(&w, 0, sizeof(w));
  test_rng_seed(&w.rng, seed);
  conn_open(&w.c, port, 1);
  CHECK(write(down[1], &port, sizeof(port)) == sizeof(port));

  /* round trips while the child connects */
  int64_t t0 = now_ms();
  for (;;) {
    work_once(&w);
    struct pollfd p = {up[0], POLLIN, 0};
    if (poll(&p, 1, 0) > 0) break;
    if (now_ms() - t0 > 120000) fail("the child did not open its connections within 120 s");
  }
  int tag = read_byte(up[0], 1000);
  if (tag == 'E') {
    int e = 0, i = 0;
    if (read(up[0], &e, sizeof(e)) != sizeof(e) || read(up[0], &i, sizeof(i)) != sizeof(i)) e = 0;
    fail("child: connection %d of %d failed: %s", i, N_IDLE, strerror(e));
  }
  if (tag != 'O') fail("child: unexpected report %d", tag);
  int64_t t_open = now_ms() - t0;
  uint64_t during = w.n;
  /* the server sees every one of them (+ the worker) */
  while (open_conns(s) != N_IDLE + 1) {
    work_once(&w);
    if (now_ms() - t0 > 180000)
      fail("connections_open = %" PRIu64 ", want %d", open_conns(s), N_IDLE + 1);
  }
  long rss1 = rss_kib();
  TEST_LOG("idle: %d connections open in %" PRId64 " ms, %" PRIu64
           " working round trips meanwhile (slowest %" PRId64
           " us); RSS %ld -> %ld KiB "
           "(%.1f KiB per connection)",
           N_IDLE, t_open, during, w.max_us, rss0, rss1, (double)(rss1 - rss0) / N_IDLE);
  w.max_us = 0;
  uint64_t before = w.n;
  int64_t t1 = now_ms();
  while (w.n - before < 2000) work_once(&w);
  TEST_LOG("idle: 2000 round trips with %d idle peers in %" PRId64 " ms (slowest %" PRId64 " us)",
           N_IDLE, now_ms() - t1, w.max_us);

  /* none of the idle connections was closed or sent anything */
  CHECK(write(down[1], "C", 1) == 1);
  int bad = -1;
  struct pollfd p = {up[0], POLLIN, 0};
  CHECK(poll(&p, 1, 60000) == 1);
  CHECK(read(up[0], &bad, sizeof(bad)) == sizeof(bad));
  if (bad != 0) fail("%d idle connections were closed or got bytes from the server", bad);
  CHECK_EQ_INT(open_conns(s), N_IDLE + 1);

  /* all close at once; the server keeps serving */
  CHECK(write(down[1], "X", 1) == 1);
  CHECK(test_expect_exit(pid, 0, "the child holding idle connections") == 0);
  int64_t t2 = now_ms();
  w.max_us = 0;
  before = w.n;
  while (open_conns(s) != 1) {
    work_once(&w);
    if (now_ms() - t2 > 120000)
      fail("after the mass close connections_open = %" PRIu64 ", want 1", open_conns(s));
  }
  /* A slow round trip here is usually the kernel: the burst of 10,000 FINs overflows loopback
   * queues and the worker's segment waits for a TCP retransmission (see TcpRetransSegs). */
  TEST_LOG("idle: %d closed at once, server down to 1 connection in %" PRId64 " ms (%" PRIu64
           " round trips meanwhile, slowest %" PRId64 " us)",
           N_IDLE, now_ms() - t2, w.n - before, w.max_us);
  for (int i = 0; i < 500; i++) work_once(&w);
  /* and new connections are still accepted */
  conn_t fresh;
  conn_open(&fresh, port, 0);
  put_op(&fresh, OP_GET);
  put_str(&fresh, "/work/cnt", 9);
  flush(&fresh);
  char want[32];
  snprintf(want, sizeof(want), "%" PRId64, w.cnt);
  rd_expect(&fresh, want, strlen(want), "fresh GET of the counter");
  conn_close(&fresh);
  conn_close(&w.c);
  close(down[1]);
  close(up[0]);
  tdist_store_server_destroy(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Part 2: 200 threads, random ops, checked against a model                                 */
/* ---------------------------------------------------------------------------------------- */

#define N_THREADS 200
#define N_OPS 250
#define N_KEYS 8
#define MAX_V 48

typedef struct {
  int present;
  size_t len;
  uint8_t v[MAX_V * 8]; /* APPEND can grow a value */
} mval_t;

typedef struct {
  int id, port;
  test_rng_t rng;
  mval_t keys[N_KEYS];
  char queue[64][MAX_V]; /* FIFO of strings */
  int qhead, qtail;
  int64_t shared_sum;
  uint64_t ops;
} tstate_t;

static void tkey(const tstate_t *t, int j, char *out, size_t cap) {
  snprintf(out, cap, "/m/t%d/k%d", t->id, j);
}

static int is_integer(const mval_t *m, int64_t *out) {
  if (!m->present) {
    *out = 0;
    return 1;
  }
  if (m->len == 0 || m->len > 20) return 0;
  char b[24];
  memcpy(b, m->v, m->len);
  b[m->len] = 0;
  char *end;
  errno = 0;
  long long v = strtoll(b, &end, 10);
  if (errno || *end || end == b || b[0] == ' ' || b[0] == '+') return 0;
  *out = v;
  return 1;
}

static size_t rnd_value(tstate_t *t, uint8_t *buf) {
  size_t n = test_rng_next(&t->rng) % (MAX_V + 1);
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)('a' + test_rng_next(&t->rng) % 26);
  return n;
}

static void *thread_main(void *arg) {
  tstate_t *t = arg;
  conn_t c;
  conn_open(&c, t->port, t->id % 2);
  char key[64];
  uint8_t val[MAX_V + 1];
  for (int i = 0; i < N_OPS; i++) {
    int j = (int)(test_rng_next(&t->rng) % N_KEYS);
    mval_t *m = &t->keys[j];
    tkey(t, j, key, sizeof(key));
    int choice = (int)(test_rng_next(&t->rng) % (c.v2 ? 14 : 9));
    switch (choice) {
      case 0: { /* SET */
        size_t n = rnd_value(t, val);
        put_op(&c, OP_SET);
        put_str(&c, key, strlen(key));
        put_str(&c, val, n);
        flush(&c);
        m->present = 1;
        m->len = n;
        memcpy(m->v, val, n);
        break;
      }
      case 1: /* GET (1.13 closes on a missing key: only present ones there) */
        if (!m->present && !c.v2) break;
        put_op(&c, OP_GET);
        put_str(&c, key, strlen(key));
        flush(&c);
        rd_expect(&c, m->v, m->present ? m->len : 0, "model GET");
        break;
      case 2: { /* ADD, on integer values only */
        int64_t cur;
        if (!is_integer(m, &cur)) {
          put_op(&c, OP_SET);
          put_str(&c, key, strlen(key));
          put_str(&c, "10", 2);
          flush(&c);
          m->present = 1;
          m->len = 2;
          memcpy(m->v, "10", 2);
          cur = 10;
        }
        int64_t d = (int64_t)(test_rng_next(&t->rng) % 2001) - 1000;
        put_op(&c, OP_ADD);
        put_str(&c, key, strlen(key));
        put_u64(&c, (uint64_t)d);
        flush(&c);
        int64_t got = (int64_t)rd_u64(&c);
        if (got != cur + d)
          fail("thread %d ADD %s: got %" PRId64 ", want %" PRId64, t->id, key, got, cur + d);
        m->present = 1;
        m->len = (size_t)snprintf((char *)m->v, sizeof(m->v), "%" PRId64, got);
        break;
      }
      case 3: { /* COMPARE_SET, with a right or a wrong expected value */
        uint8_t exp[MAX_V * 8 + 1], des[MAX_V + 1];
        size_t elen;
        int coin = (int)(test_rng_next(&t->rng) % 3);
        if (coin == 0 && m->present) {
          elen = m->len;
          memcpy(exp, m->v, elen);
        } else if (coin == 1) {
          elen = 0;
        } else {
          elen = rnd_value(t, exp);
        }
        size_t dlen = rnd_value(t, des);
        put_op(&c, OP_CAS);
        put_str(&c, key, strlen(key));
        put_str(&c, exp, elen);
        put_str(&c, des, dlen);
        flush(&c);
        if (!m->present) {
          if (elen == 0) {
            m->present = 1;
            m->len = dlen;
            memcpy(m->v, des, dlen);
            rd_expect(&c, des, dlen, "model CAS (absent, empty expected)");
          } else {
            rd_expect(&c, exp, elen, "model CAS (absent, expected given)");
          }
        } else {
          if (elen == m->len && memcmp(exp, m->v, elen) == 0) {
            m->len = dlen;
            memcpy(m->v, des, dlen);
          }
          rd_expect(&c, m->v, m->len, "model CAS (present)");
        }
        break;
      }
      case 4: { /* DELETE_KEY */
        put_op(&c, OP_DELETE);
        put_str(&c, key, strlen(key));
        flush(&c);
        uint64_t got = rd_u64(&c);
        if (got != (uint64_t)m->present) fail("thread %d DELETE %s: got %" PRIu64, t->id, key, got);
        m->present = 0;
        break;
      }
      case 5:   /* CHECK of two keys */
      case 6: { /* WAIT on present keys only (it would block otherwise) */
        int j2 = (int)(test_rng_next(&t->rng) % N_KEYS);
        char key2[64];
        tkey(t, j2, key2, sizeof(key2));
        if (choice == 6 && !(m->present && t->keys[j2].present)) break;
        put_op(&c, choice == 5 ? OP_CHECK : OP_WAIT);
        put_u64(&c, 2);
        put_str(&c, key, strlen(key));
        put_str(&c, key2, strlen(key2));
        flush(&c);
        uint8_t want = choice == 6 ? 0 : (m->present && t->keys[j2].present) ? 0 : 1;
        uint8_t got = rd_u8(&c);
        if (got != want)
          fail("thread %d %s: got %u, want %u", t->id, choice == 5 ? "CHECK" : "WAIT", got, want);
        break;
      }
      case 7:
      case 8: { /* the shared counter */
        int64_t d = (int64_t)(test_rng_next(&t->rng) % 21) - 10;
        put_op(&c, OP_ADD);
        put_str(&c, "/m/shared", 9);
        put_u64(&c, (uint64_t)d);
        flush(&c);
        (void)rd_u64(&c); /* depends on the other threads */
        t->shared_sum += d;
        break;
      }
      case 9: { /* APPEND (2.x) */
        size_t n = rnd_value(t, val);
        if (m->len + n > sizeof(m->v)) break;
        put_op(&c, OP_APPEND);
        put_str(&c, key, strlen(key));
        put_str(&c, val, n);
        flush(&c);
        if (!m->present) m->len = 0;
        m->present = 1;
        memcpy(m->v + m->len, val, n);
        m->len += n;
        break;
      }
      case 10: { /* MULTI_SET of two keys, then MULTI_GET of the present ones (2.x) */
        int j2 = (int)(test_rng_next(&t->rng) % N_KEYS);
        char key2[64];
        tkey(t, j2, key2, sizeof(key2));
        uint8_t v2b[MAX_V + 1];
        size_t n1 = rnd_value(t, val), n2 = rnd_value(t, v2b);
        put_op(&c, OP_MSET);
        put_u64(&c, 2);
        put_str(&c, key, strlen(key));
        put_str(&c, val, n1);
        put_str(&c, key2, strlen(key2));
        put_str(&c, v2b, n2);
        m->present = 1;
        m->len = n1;
        memcpy(m->v, val, n1);
        mval_t *m2 = &t->keys[j2];
        m2->present = 1;
        m2->len = n2;
        memcpy(m2->v, v2b, n2);
        put_op(&c, OP_MGET);
        put_u64(&c, 2);
        put_str(&c, key2, strlen(key2));
        put_str(&c, key, strlen(key));
        flush(&c);
        rd_expect(&c, m2->v, m2->len, "model MULTI_GET[0]");
        rd_expect(&c, m->v, m->len, "model MULTI_GET[1]");
        break;
      }
      case 11: { /* QUEUE_PUSH (2.x) */
        if (t->qtail - t->qhead >= 64) break;
        char item[MAX_V];
        int n = snprintf(item, sizeof(item), "item-%d-%d", t->id, i);
        char q[32];
        snprintf(q, sizeof(q), "/m/q%d", t->id);
        put_op(&c, OP_QPUSH);
        put_str(&c, q, strlen(q));
        put_str(&c, item, (size_t)n);
        flush(&c);
        memcpy(t->queue[t->qtail % 64], item, (size_t)n + 1);
        t->qtail++;
        break;
      }
      case 12: { /* QUEUE_POP (2.x) */
        char q[32];
        snprintf(q, sizeof(q), "/m/q%d", t->id);
        put_op(&c, OP_QPOP);
        put_str(&c, q, strlen(q));
        flush(&c);
        int64_t len = (int64_t)rd_u64(&c);
        if (len != t->qtail - t->qhead)
          fail("thread %d QUEUE_POP: length %" PRId64 ", want %d", t->id, len, t->qtail - t->qhead);
        if (len > 0) {
          const char *item = t->queue[t->qhead % 64];
          rd_expect(&c, item, strlen(item), "model QUEUE_POP item");
          t->qhead++;
        }
        break;
      }
      case 13: { /* QUEUE_LEN (2.x) */
        char q[32];
        snprintf(q, sizeof(q), "/m/q%d", t->id);
        put_op(&c, OP_QLEN);
        put_str(&c, q, strlen(q));
        flush(&c);
        int64_t len = (int64_t)rd_u64(&c);
        if (len != t->qtail - t->qhead) fail("thread %d QUEUE_LEN: %" PRId64, t->id, len);
        break;
      }
    }
    t->ops++;
  }
  /* every key of the model, read back */
  for (int j = 0; j < N_KEYS; j++) {
    if (!t->keys[j].present) continue;
    tkey(t, j, key, sizeof(key));
    put_op(&c, OP_GET);
    put_str(&c, key, strlen(key));
    flush(&c);
    rd_expect(&c, t->keys[j].v, t->keys[j].len, "final GET");
  }
  /* a ring of waits across threads: each waits for its neighbour's "done" key */
  char done[32], next[32];
  snprintf(done, sizeof(done), "/m/done/%d", t->id);
  snprintf(next, sizeof(next), "/m/done/%d", (t->id + 1) % N_THREADS);
  put_op(&c, OP_SET);
  put_str(&c, done, strlen(done));
  put_str(&c, "1", 1);
  put_op(&c, OP_WAIT);
  put_u64(&c, 1);
  put_str(&c, next, strlen(next));
  flush(&c);
  if (rd_u8(&c) != 0) fail("thread %d: ring WAIT reply", t->id);
  conn_close(&c);
  return NULL;
}

static void test_threads(uint64_t seed) {
  tdist_store_server_t *s = start_server();
  int port = tdist_store_server_port(s);
  tstate_t *ts = calloc(N_THREADS, sizeof(*ts));
  pthread_t *th = calloc(N_THREADS, sizeof(*th));
  CHECK(ts && th);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  int64_t t0 = now_ms();
  for (int i = 0; i < N_THREADS; i++) {
    ts[i].id = i;
    ts[i].port = port;
    test_rng_seed(&ts[i].rng, seed * 1000003u + (uint64_t)i);
    CHECK(pthread_create(&th[i], &attr, thread_main, &ts[i]) == 0);
  }
  pthread_attr_destroy(&attr);
  for (int i = 0; i < N_THREADS; i++) CHECK(pthread_join(th[i], NULL) == 0);
  int64_t dt = now_ms() - t0;
  int64_t shared = 0;
  uint64_t ops = 0, keys = 0;
  for (int i = 0; i < N_THREADS; i++) {
    shared += ts[i].shared_sum;
    ops += ts[i].ops;
    for (int j = 0; j < N_KEYS; j++) keys += (uint64_t)ts[i].keys[j].present;
  }
  conn_t c;
  conn_open(&c, port, 1);
  put_op(&c, OP_ADD);
  put_str(&c, "/m/shared", 9);
  put_u64(&c, 0);
  flush(&c);
  int64_t got = (int64_t)rd_u64(&c);
  if (got != shared) fail("shared counter %" PRId64 ", want %" PRId64, got, shared);
  /* GETNUMKEYS counts the key map (queues are not keys): model keys + shared + 200 done keys */
  put_op(&c, OP_NUMKEYS);
  flush(&c);
  uint64_t nk = rd_u64(&c);
  if (nk != keys + 1 + N_THREADS)
    fail("GETNUMKEYS %" PRIu64 ", want %" PRIu64, nk, keys + 1 + N_THREADS);
  conn_close(&c);
  tdist_store_server_stats_t st;
  tdist_store_server_stats(s, &st);
  CHECK_EQ_INT(st.connections_dropped, 0);
  CHECK_EQ_INT(st.waits_pending, 0);
  TEST_LOG("threads: %d clients, %" PRIu64 " random ops in %" PRId64
           " ms, all replies match the model (shared counter %" PRId64 ", %" PRIu64 " keys)",
           N_THREADS, ops, dt, shared, nk);
  free(ts);
  free(th);
  tdist_store_server_destroy(s);
}

int main(void) {
  uint64_t seed = test_seed("server_stress_test", 777);
  test_idle_connections(seed);
  test_threads(seed);
  TEST_LOG("server_stress_test: all passed");
  return 0;
}
