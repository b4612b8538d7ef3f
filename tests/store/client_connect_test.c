/* Tests of the TCP store client's connections, through the public API of include/tdist/store.h
 * only: connect timeouts and backoff retries (nothing listening, a server that starts late, a
 * listener that never answers), a server that disappears under a waiting client, a 2.x server
 * without queue ops (PyTorch 2.6: refused, not hung) and the dual-stack default host. Every
 * blocking call carries a timeout and an alarm turns any hang into a failure. */
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
#include "ports.h"
#include "rng.h"
#include "tdist/tdist.h"

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void test_connect_nothing_listens(tdist_store_dialect_t dialect) {
  TEST_LOG("connect where nothing listens, dialect %s", dialect_name(dialect));
  int port = test_free_port();
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 500;
  o.dialect = dialect;
  tdist_store_t *s = (tdist_store_t *)(uintptr_t)1;
  int64_t t0 = now_ms();
  CHECK_STORE_STATUS(tdist_tcp_store_connect(&o, &s), TDIST_ERR_TIMEOUT, NULL);
  int64_t el = now_ms() - t0;
  if (el < 450 || el > 2500) {
    fprintf(stderr, "connect gave up after %" PRId64 " ms, want about 500\n", el);
    exit(1);
  }
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", port);
  if (!strstr(tdist_last_error(), want)) {
    fprintf(stderr, "tdist_last_error() does not name %s: %s\n", want, tdist_last_error());
    exit(1);
  }
}

/* A peer that accepts (the kernel does, from the backlog) but never answers. 2.x must give up
 * on its VALIDATE+PING handshake within connect_timeout_ms; 1.13 has no handshake, so it
 * connects, and every call that expects a reply ends at the handle's timeout. */
static void test_silent_listener(void) {
  TEST_LOG("silent listener");
  struct sockaddr_in a;
  int fd = loopback_socket(&a);
  CHECK(listen(fd, 16) == 0);
  const tdist_store_dialect_t ds[3] = {TDIST_STORE_DIALECT_AUTO, TDIST_STORE_DIALECT_V2,
                                       TDIST_STORE_DIALECT_V1_13};
  for (int i = 0; i < 3; i++) {
    tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = ntohs(a.sin_port);
    o.connect_timeout_ms = 500;
    o.timeout_ms = 300;
    o.dialect = ds[i];
    tdist_store_t *s = NULL;
    int64_t t0 = now_ms();
    tdist_status_t st = tdist_tcp_store_connect(&o, &s);
    int64_t el = now_ms() - t0;
    if (ds[i] != TDIST_STORE_DIALECT_V1_13) {
      CHECK_STORE_STATUS(st, TDIST_ERR_TIMEOUT, NULL);
      check_elapsed(el, 500);
      char want[64];
      snprintf(want, sizeof want, "127.0.0.1:%d", o.port);
      CHECK(strstr(tdist_last_error(), want) != NULL);
      continue;
    }
    CHECK_OK(st);
    void *v = NULL;
    size_t n = 0;
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_get(s, "k", &v, &n), TDIST_ERR_TIMEOUT, s);
    check_elapsed(now_ms() - t0, 300);
    int64_t nk = 0;
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_num_keys(s, &nk), TDIST_ERR_TIMEOUT, s);
    check_elapsed(now_ms() - t0, 300);
    tdist_store_destroy(s);
  }
  close(fd);
}

typedef struct {
  int port;
  int64_t delay_ms;
  tdist_store_server_t *srv;
  tdist_status_t st;
} late_server_arg_t;

static void *late_server(void *p) {
  late_server_arg_t *a = p;
  sleep_ms(a->delay_ms);
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = a->port;
  o.quiet = 1;
  a->st = tdist_store_server_create(&o, &a->srv);
  return NULL;
}

static void test_connect_before_server(tdist_store_dialect_t dialect) {
  TEST_LOG("connect before the server exists, dialect %s", dialect_name(dialect));
  late_server_arg_t arg = {test_free_port(), 300, NULL, TDIST_ERR_INTERNAL};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, late_server, &arg) == 0);
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = arg.port;
  o.connect_timeout_ms = 10000;
  o.timeout_ms = 5000;
  o.dialect = dialect;
  tdist_store_t *s = NULL;
  int64_t t0 = now_ms();
  tdist_status_t st = tdist_tcp_store_connect(&o, &s);
  int64_t el = now_ms() - t0;
  CHECK(pthread_join(th, NULL) == 0);
  CHECK_OK_MSG(arg.st, "late server failed to start");
  CHECK_OK(st);
  CHECK(el >= 250 && el < 6000);
  TEST_LOG("  connected after %" PRId64 " ms", el);
  CHECK_EQ_INT(tdist_tcp_store_dialect(s), dialect == TDIST_STORE_DIALECT_V1_13
                                               ? TDIST_STORE_DIALECT_V1_13
                                               : TDIST_STORE_DIALECT_V2);
  CHECK_STORE_OK(tdist_store_set(s, "late", "ok", 2), s);
  expect_get_str(s, "late", "ok");
  tdist_store_destroy(s);
  tdist_store_server_destroy(arg.srv);
}

typedef struct {
  tdist_store_server_t *srv;
  int64_t delay_ms;
} killer_arg_t;

static void *kill_server(void *p) {
  killer_arg_t *a = p;
  sleep_ms(a->delay_ms);
  tdist_store_server_destroy(a->srv);
  return NULL;
}

static void test_server_dies_mid_wait(tdist_store_dialect_t dialect) {
  TEST_LOG("server destroyed while a client waits, dialect %s", dialect_name(dialect));
  tdist_store_server_t *srv = start_server();
  tdist_store_t *s = connect_store(tdist_store_server_port(srv), dialect, 3000);
  CHECK_STORE_OK(tdist_store_set(s, "before", "b", 1), s);
  killer_arg_t arg = {srv, 300};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, kill_server, &arg) == 0);
  const char *w[1] = {"never-set"};
  int64_t t0 = now_ms();
  tdist_status_t st = tdist_store_wait(s, w, 1, -1);
  int64_t el = now_ms() - t0;
  CHECK(pthread_join(th, NULL) == 0);
  TEST_LOG("  wait returned %s after %" PRId64 " ms: %s", tdist_status_name(st), el,
           tdist_store_last_error(s));
  CHECK(st != TDIST_OK);
  CHECK(tdist_store_last_error(s)[0] != '\0');
  CHECK(el < 3000 + 1000);
  /* The next call fails too (nothing to reconnect to), within the handle's timeout. */
  CHECK_STORE_OK(tdist_store_set_timeout(s, 500), s);
  t0 = now_ms();
  void *v = NULL;
  size_t n = 0;
  st = tdist_store_get(s, "before", &v, &n);
  el = now_ms() - t0;
  TEST_LOG("  next get returned %s after %" PRId64 " ms", tdist_status_name(st), el);
  CHECK(st != TDIST_OK);
  CHECK(el < 500 + 1500);
  tdist_store_destroy(s);
}

/* The server's default host is dual stack: reachable on 127.0.0.1, ::1 and "localhost". */
static void test_dual_stack(void) {
  TEST_LOG("dual-stack server");
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.quiet = 1;
  tdist_store_server_t *srv = NULL;
  CHECK_OK(tdist_store_server_create(&o, &srv));
  int port = tdist_store_server_port(srv);
  const char *hosts[] = {"127.0.0.1", "::1", "localhost"};
  int have_v6 = access("/proc/net/if_inet6", F_OK) == 0;
  for (size_t i = 0; i < 3; i++) {
    if (i == 1 && !have_v6) continue;
    tdist_tcp_store_options_t co = TDIST_TCP_STORE_OPTIONS_INIT;
    co.host = hosts[i];
    co.port = port;
    co.connect_timeout_ms = 5000;
    co.timeout_ms = 5000;
    tdist_store_t *s = NULL;
    CHECK_OK(tdist_tcp_store_connect(&co, &s));
    CHECK_STORE_OK(tdist_store_set(s, hosts[i], "h", 1), s);
    int64_t n = 0;
    CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
    CHECK_EQ_INT(n, (int64_t)i + 1 - (i > 1 && !have_v6));
    tdist_store_destroy(s);
  }
  /* A second server on the same port fails and says which address. */
  tdist_store_server_options_t o2 = TDIST_STORE_SERVER_OPTIONS_INIT;
  o2.quiet = 1;
  o2.host = "127.0.0.1";
  o2.port = port;
  tdist_store_server_t *srv2 = NULL;
  tdist_status_t st = tdist_store_server_create(&o2, &srv2);
  CHECK(st != TDIST_OK);
  char want[16];
  snprintf(want, sizeof want, "%d", port);
  if (!strstr(tdist_last_error(), want)) {
    fprintf(stderr, "bind failure does not name port %d: %s\n", port, tdist_last_error());
    exit(1);
  }
  tdist_store_server_destroy(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* A 2.x server without queues (PyTorch 2.6)                                                   */
/* ------------------------------------------------------------------------------------------ */

/* Just enough of PyTorch 2.6's legacy TCPStoreBackend, one connection at a time: VALIDATE, PING,
 * SET (no reply), GETNUMKEYS; any opcode it does not know (QUEUE_PUSH/POP/LEN among them) closes
 * the connection, as 2.6 does. It counts the queue opcodes it was sent. */
typedef struct {
  int lfd, port;
  int stop; /* atomic: the main thread sets it while noq_serve reads it (TSan) */
  int queue_ops, queue_pushes, connections;
  int64_t keys;
  pthread_t th;
} noq_server_t;

static int read_full(int fd, void *p, size_t n) {
  for (size_t got = 0; got < n;) {
    ssize_t r = read(fd, (char *)p + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

static int skip_str(int fd) {
  uint64_t n;
  if (read_full(fd, &n, 8) || n > 1 << 20) return -1;
  char buf[256];
  while (n) {
    size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
    if (read_full(fd, buf, k)) return -1;
    n -= k;
  }
  return 0;
}

static void *noq_serve(void *p) {
  noq_server_t *q = p;
  while (!__atomic_load_n(&q->stop, __ATOMIC_SEQ_CST)) {
    int fd = accept(q->lfd, NULL, NULL);
    if (fd < 0) continue;
    __atomic_add_fetch(&q->connections, 1, __ATOMIC_SEQ_CST);
    uint8_t hello[5];
    if (read_full(fd, hello, 5) || hello[0] != 0x00) goto done; /* VALIDATE */
    for (;;) {
      uint8_t op;
      if (read_full(fd, &op, 1)) break;
      if (op == 0x0d) { /* PING: echo the nonce */
        uint8_t nonce[4];
        if (read_full(fd, nonce, 4) || write(fd, nonce, 4) != 4) break;
      } else if (op == 0x01) { /* SET */
        if (skip_str(fd) || skip_str(fd)) break;
        __atomic_add_fetch(&q->keys, 1, __ATOMIC_SEQ_CST);
      } else if (op == 0x07) { /* GETNUMKEYS */
        int64_t k = __atomic_load_n(&q->keys, __ATOMIC_SEQ_CST);
        if (write(fd, &k, 8) != 8) break;
      } else {
        if (op >= 0x0e && op <= 0x10) __atomic_add_fetch(&q->queue_ops, 1, __ATOMIC_SEQ_CST);
        if (op == 0x0e) __atomic_add_fetch(&q->queue_pushes, 1, __ATOMIC_SEQ_CST);
        break; /* "Unexpected query type": the connection is closed */
      }
    }
  done:
    close(fd);
  }
  return NULL;
}

static void expect_no_queues(tdist_store_t *s, tdist_status_t st, int64_t t0) {
  CHECK_STORE_STATUS(st, TDIST_ERR_NOT_AVAILABLE, s);
  CHECK(strstr(tdist_store_last_error(s), "no queue") != NULL);
  int64_t el = now_ms() - t0;
  if (el > 2000) {
    fprintf(stderr, "a queue op on a server without queues was refused only after %" PRId64 " ms\n",
            el);
    exit(1);
  }
}

/* PyTorch 2.6's server has no QUEUE_* and the 2.x handshake does not say so: every queue call
 * must be refused with NOT_AVAILABLE at once (a push must not "succeed" into a closed connection,
 * a blocking pop must not wait its timeout out), without losing the handle, and after the first
 * refusal without asking the server again. */
static void test_server_without_queues(void) {
  TEST_LOG("2.x server without queues");
  noq_server_t q;
  memset(&q, 0, sizeof q);
  q.lfd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(q.lfd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(q.lfd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(q.lfd, 16) == 0);
  socklen_t al = sizeof a;
  CHECK(getsockname(q.lfd, (struct sockaddr *)&a, &al) == 0);
  q.port = ntohs(a.sin_port);
  CHECK(pthread_create(&q.th, NULL, noq_serve, &q) == 0);

  tdist_store_t *s = connect_store(q.port, TDIST_STORE_DIALECT_AUTO, 5000);
  CHECK_EQ_INT(tdist_tcp_store_dialect(s), TDIST_STORE_DIALECT_V2);
  CHECK_STORE_OK(tdist_store_set(s, "k", "v", 1), s);
  int64_t n = -1;
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 1);

  int64_t t0 = now_ms();
  expect_no_queues(s, tdist_store_queue_push(s, "q", "item", 4), t0);
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s); /* the handle still works */
  CHECK_EQ_INT(n, 1);
  void *v = NULL;
  size_t vn = 0;
  int64_t len = -1;
  t0 = now_ms();
  expect_no_queues(s, tdist_store_queue_len(s, "q", &len), t0);
  expect_no_queues(s, tdist_store_queue_pop(s, "q", 0, &v, &vn), t0);
  expect_no_queues(s, tdist_store_queue_pop(s, "q", 3000, &v, &vn), t0);
  CHECK(v == NULL);
  /* One probe (a QUEUE_LEN, never the push itself) for all of them. */
  CHECK_EQ_INT(__atomic_load_n(&q.queue_ops, __ATOMIC_SEQ_CST), 1);
  CHECK_EQ_INT(__atomic_load_n(&q.queue_pushes, __ATOMIC_SEQ_CST), 0);
  CHECK_STORE_OK(tdist_store_set(s, "k2", "v", 1), s);
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 2);
  tdist_store_destroy(s);

  /* A fresh handle's first call is a blocking pop: refused at once, not after 3 s. */
  s = connect_store(q.port, TDIST_STORE_DIALECT_V2, 5000);
  t0 = now_ms();
  expect_no_queues(s, tdist_store_queue_pop(s, "q", 3000, &v, &vn), t0);
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 2);
  CHECK_EQ_INT(__atomic_load_n(&q.queue_ops, __ATOMIC_SEQ_CST), 2);
  tdist_store_destroy(s);

  __atomic_store_n(&q.stop, 1, __ATOMIC_SEQ_CST);
  shutdown(q.lfd, SHUT_RDWR); /* wakes the accept() */
  pthread_join(q.th, NULL);
  close(q.lfd);
}

int main(void) {
  /* Any hang fails the test instead of waiting for Bazel's timeout. */
  alarm(240);
  signal(SIGPIPE, SIG_IGN);
  test_rng_init("client_connect_test", 0); /* a fresh seed each run, printed */

  const tdist_store_dialect_t dialects[2] = {TDIST_STORE_DIALECT_AUTO, TDIST_STORE_DIALECT_V1_13};
  for (int d = 0; d < 2; d++) {
    test_connect_nothing_listens(dialects[d]);
    test_connect_before_server(dialects[d]);
    test_server_dies_mid_wait(dialects[d]);
  }
  test_silent_listener();
  test_server_without_queues();
  test_dual_stack();
  TEST_LOG("client_connect_test: all passed");
  return 0;
}
