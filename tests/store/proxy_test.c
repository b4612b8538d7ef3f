/* The store proxy (tdist_store_proxy_*, tdist/store.h) with our C client: 16 threads, each its
 * own client through the proxy, do random ADDs on shared counters and SET/GET their own keys,
 * and a WAIT of one is released by another; the counters must equal the sum the threads report,
 * and the server must have seen them as 16 connections over one; a 3 MiB random value goes
 * through both ways (many frames, reads that end mid-frame). Then the errors a user meets:
 * bad options named; an upstream that is not a tdist store server (one that hangs up, one that
 * answers other bytes) refused with the reason; and the upstream going away: the proxy's clients
 * see the store go, its port refuses new clients, and it counts the loss. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "tdist/tdist.h"

#define THREADS 16
#define OPS 300
#define COUNTERS 5

static int proxy_port;
static _Atomic int64_t sums[COUNTERS];

static tdist_store_t *client(int port, int64_t timeout_ms) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 10000;
  o.timeout_ms = timeout_ms;
  tdist_store_t *s = NULL;
  CHECK_OK(tdist_tcp_store_connect(&o, &s));
  return s;
}

static void *worker(void *arg) {
  uintptr_t me = (uintptr_t)arg;
  uint64_t r = 0x9e3779b97f4a7c15ULL * (me + 1);
  tdist_store_t *s = client(proxy_port, 30000);
  char key[64], val[64];
  for (int i = 0; i < OPS; i++) {
    r = r * 6364136223846793005ULL + 1442695040888963407ULL;
    int c = (int)((r >> 33) % COUNTERS);
    int64_t d = (int64_t)((r >> 40) % 201) - 100;
    snprintf(key, sizeof key, "counter%d", c);
    CHECK_STORE_OK(tdist_store_add(s, key, d, NULL), s);
    atomic_fetch_add(&sums[c], d);
    snprintf(key, sizeof key, "t%u/k%d", (unsigned)me, i % 7);
    int n = snprintf(val, sizeof val, "%u:%d:%llu", (unsigned)me, i, (unsigned long long)r);
    CHECK_STORE_OK(tdist_store_set(s, key, val, (size_t)n), s);
    void *got = NULL;
    size_t len = 0;
    CHECK_STORE_OK(tdist_store_get(s, key, &got, &len), s);
    CHECK_MEM_EQ(got, len, val, (size_t)n);
    tdist_free(got);
  }
  /* Thread k waits for thread k+1's key: every WAIT is released by another carried client. */
  snprintf(key, sizeof key, "done%u", (unsigned)me);
  CHECK_STORE_OK(tdist_store_set(s, key, "1", 1), s);
  snprintf(key, sizeof key, "done%u", (unsigned)((me + 1) % THREADS));
  void *got = NULL;
  size_t len = 0;
  CHECK_STORE_OK(tdist_store_get(s, key, &got, &len), s);
  tdist_free(got);
  tdist_store_destroy(s);
  return NULL;
}

static tdist_store_proxy_t *proxy_to(int upstream_port, tdist_status_t want, const char *has) {
  tdist_store_proxy_options_t o = TDIST_STORE_PROXY_OPTIONS_INIT;
  o.upstream_host = "127.0.0.1";
  o.upstream_port = upstream_port;
  o.connect_timeout_ms = 5000;
  o.quiet = 1;
  tdist_store_proxy_t *p = NULL;
  tdist_status_t st = tdist_store_proxy_create(&o, &p);
  CHECK_STATUS_MSG(st, want, tdist_last_error());
  if (has) CHECK_HAS(tdist_last_error(), has);
  return p;
}

static void case_many_clients(void) {
  TEST_CASE("16 clients through one proxy");
  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.quiet = 1;
  tdist_store_server_t *srv = NULL;
  CHECK_OK(tdist_store_server_create(&so, &srv));
  tdist_store_proxy_t *p = proxy_to(tdist_store_server_port(srv), TDIST_OK, NULL);
  proxy_port = tdist_store_proxy_port(p, 0);
  CHECK(proxy_port > 0);
  CHECK_EQ_INT(tdist_store_proxy_port(p, 1), -1);
  pthread_t t[THREADS];
  for (uintptr_t i = 0; i < THREADS; i++)
    CHECK_EQ_INT(pthread_create(&t[i], NULL, worker, (void *)i), 0);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  tdist_store_t *direct = client(tdist_store_server_port(srv), 30000);
  for (int c = 0; c < COUNTERS; c++) {
    char key[32];
    snprintf(key, sizeof key, "counter%d", c);
    int64_t v = 0;
    CHECK_STORE_OK(tdist_store_add(direct, key, 0, &v), direct);
    CHECK_EQ_INT(v, atomic_load(&sums[c]));
  }
  tdist_store_destroy(direct);
  tdist_store_server_stats_t ss;
  tdist_store_server_stats(srv, &ss);
  /* the proxy's connection, its 16 clients, the direct check */
  CHECK_EQ_UINT(ss.connections_total, 1 + THREADS + 1);
  tdist_store_proxy_stats_t ps;
  tdist_store_proxy_stats(p, &ps);
  CHECK_EQ_UINT(ps.clients_total, THREADS);
  CHECK(ps.bytes_up > 0 && ps.bytes_down > 0);
  CHECK_EQ_UINT(ps.upstreams_lost, 0);

  TEST_CASE("a 3 MiB random value through the proxy, both ways");
  tdist_store_t *big = client(proxy_port, 30000);
  size_t bn = (3u << 20) + 12345;
  uint8_t *bv = malloc(bn);
  CHECK(bv != NULL);
  uint64_t r = 88172645463325252ULL;
  for (size_t i = 0; i < bn; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    bv[i] = (uint8_t)r;
  }
  CHECK_STORE_OK(tdist_store_set(big, "big", bv, bn), big);
  void *bg = NULL;
  size_t bl = 0;
  CHECK_STORE_OK(tdist_store_get(big, "big", &bg, &bl), big);
  CHECK_MEM_EQ(bg, bl, bv, bn);
  tdist_free(bg);
  free(bv);
  tdist_store_destroy(big);

  TEST_CASE("the upstream goes away");
  tdist_store_t *c = client(proxy_port, 5000);
  CHECK_STORE_OK(tdist_store_set(c, "before", "1", 1), c);
  tdist_store_server_destroy(srv);
  for (int i = 0; i < 200; i++) {
    tdist_store_proxy_stats(p, &ps);
    if (ps.upstreams_lost == 1) break;
    usleep(10000);
  }
  CHECK_EQ_UINT(ps.upstreams_lost, 1);
  CHECK_EQ_UINT(ps.clients_open, 0);
  void *got = NULL;
  size_t len = 0;
  tdist_status_t st = tdist_store_get(c, "before", &got, &len);
  CHECK(st != TDIST_OK);
  tdist_store_destroy(c);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)proxy_port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK_EQ_INT(connect(fd, (struct sockaddr *)&a, sizeof a), -1);
  CHECK_EQ_INT(errno, ECONNREFUSED);
  close(fd);
  tdist_store_proxy_destroy(p);
}

/* A listener that answers each connection with `answer` (NULL: hangs up at once). */
typedef struct {
  int fd;
  const char *answer;
} fake_t;

static void *fake_main(void *arg) {
  fake_t *f = arg;
  int c = accept(f->fd, NULL, NULL);
  if (c >= 0) {
    char buf[8];
    ssize_t n = recv(c, buf, sizeof buf, MSG_WAITALL);
    (void)n;
    if (f->answer) {
      ssize_t w = send(c, f->answer, strlen(f->answer), MSG_NOSIGNAL);
      (void)w;
    }
    close(c);
  }
  return NULL;
}

static void case_not_a_tdist_server(const char *answer) {
  TEST_CASE(answer ? "an upstream that answers other bytes" : "an upstream that hangs up");
  fake_t f = {.fd = socket(AF_INET, SOCK_STREAM, 0), .answer = answer};
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof a;
  CHECK_EQ_INT(bind(f.fd, (struct sockaddr *)&a, sizeof a), 0);
  CHECK_EQ_INT(listen(f.fd, 4), 0);
  CHECK_EQ_INT(getsockname(f.fd, (struct sockaddr *)&a, &sl), 0);
  pthread_t t;
  CHECK_EQ_INT(pthread_create(&t, NULL, fake_main, &f), 0);
  CHECK(proxy_to(ntohs(a.sin_port), TDIST_ERR_PROTOCOL, "did not answer the proxy's hello") ==
        NULL);
  CHECK_HAS(tdist_last_error(), "not PyTorch's");
  pthread_join(t, NULL);
  close(f.fd);
}

static void case_bad_options(void) {
  TEST_CASE("bad options");
  tdist_store_proxy_options_t o = TDIST_STORE_PROXY_OPTIONS_INIT;
  tdist_store_proxy_t *p = NULL;
  CHECK_STATUS(tdist_store_proxy_create(&o, &p), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_HAS(tdist_last_error(), "a host and a port in 1..65535 are required");
  o.upstream_host = "127.0.0.1";
  o.upstream_port = 1;
  o.instances = 2;
  o.port = 5000;
  CHECK_STATUS(tdist_store_proxy_create(&o, &p), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_HAS(tdist_last_error(), "more than 1 needs port 0");
  CHECK_STATUS(tdist_store_proxy_create(NULL, &p), TDIST_ERR_INVALID_ARGUMENT);
  CHECK(p == NULL);
  TEST_CASE("nothing listens upstream");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof a;
  CHECK_EQ_INT(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  CHECK_EQ_INT(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
  o = (tdist_store_proxy_options_t)TDIST_STORE_PROXY_OPTIONS_INIT;
  o.upstream_host = "127.0.0.1";
  o.upstream_port = ntohs(a.sin_port); /* bound, not listening: refused */
  o.connect_timeout_ms = 300;
  o.quiet = 1;
  CHECK_STATUS(tdist_store_proxy_create(&o, &p), TDIST_ERR_REMOTE);
  CHECK_HAS(tdist_last_error(), "cannot connect to the store server");
  close(fd);
}

int main(void) {
  case_many_clients();
  case_not_a_tdist_server(NULL);
  case_not_a_tdist_server("PyTorch!");
  case_bad_options();
  printf("PASS: proxy_test\n");
  return 0;
}
