/* See session.h. Runs unarmed or armed: nothing here may assume an allocation succeeds. */
#define _GNU_SOURCE
#include "tests/fault/session.h"

#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testlib/check.h"

#define TRY(expr)                    \
  do {                               \
    tdist_status_t st_ = (expr);     \
    if (st_ != TDIST_OK) return st_; \
  } while (0)

tdist_status_t session_connect(int port, tdist_store_t **out) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 20000;
  o.timeout_ms = 20000; /* a hang shows as TIMEOUT, which no loop accepts */
  o.dialect = TDIST_STORE_DIALECT_V2;
  return tdist_tcp_store_connect(&o, out);
}

static char *key(char *buf, size_t cap, const char *prefix, const char *name) {
  snprintf(buf, cap, "%s/%s", prefix, name);
  return buf;
}

static void check_val(void *v, size_t n, const char *want) {
  CHECK_MEM_EQ(v, n, want, strlen(want));
  tdist_free(v);
}

tdist_status_t session_run(tdist_store_t *s, const char *prefix) {
  char ka[128], kn[128], km1[128], km2[128], kq[128], kbig[128];
  key(ka, sizeof ka, prefix, "a");
  key(kn, sizeof kn, prefix, "n");
  key(km1, sizeof km1, prefix, "m1");
  key(km2, sizeof km2, prefix, "m2");
  key(kq, sizeof kq, prefix, "q");
  key(kbig, sizeof kbig, prefix, "big");
  void *v = NULL;
  size_t n = 0;
  int64_t i = 0;

  TRY(tdist_store_set(s, ka, "hello", 5));
  TRY(tdist_store_get(s, ka, &v, &n));
  check_val(v, n, "hello");
  TRY(tdist_store_add(s, kn, 5, &i));
  CHECK_EQ_INT(i, 5);
  TRY(tdist_store_add(s, kn, 2, &i));
  CHECK_EQ_INT(i, 7);
  TRY(tdist_store_compare_set(s, ka, "hello", 5, "world", 5, &v, &n));
  check_val(v, n, "world");
  const char *both[] = {ka, kn};
  int ready = 0;
  TRY(tdist_store_check(s, both, 2, &ready));
  CHECK_EQ_INT(ready, 1);
  TRY(tdist_store_wait(s, both, 2, -1));
  const char *ms[] = {km1, km2};
  const void *mv[] = {"one", "two!"};
  size_t ml[] = {3, 4};
  TRY(tdist_store_multi_set(s, ms, mv, ml, 2));
  void *gv[2] = {NULL, NULL};
  size_t gl[2] = {0, 0};
  TRY(tdist_store_multi_get(s, ms, 2, gv, gl));
  check_val(gv[0], gl[0], "one");
  check_val(gv[1], gl[1], "two!");
  TRY(tdist_store_append(s, ka, "!", 1));
  TRY(tdist_store_get(s, ka, &v, &n));
  check_val(v, n, "world!");
  TRY(tdist_store_num_keys(s, &i));
  CHECK(i >= 4);
  int deleted = 0;
  TRY(tdist_store_delete_key(s, km1, &deleted));
  CHECK_EQ_INT(deleted, 1);
  TRY(tdist_store_check(s, ms, 2, &ready));
  CHECK_EQ_INT(ready, 0);
  TRY(tdist_store_queue_push(s, kq, "x", 1));
  TRY(tdist_store_queue_len(s, kq, &i));
  CHECK_EQ_INT(i, 1);
  TRY(tdist_store_queue_pop(s, kq, 0, &v, &n));
  check_val(v, n, "x");

  /* Big enough to grow the server's input buffer and the client's request buffer. Static: the
   * test's own allocations are wrapped too and must not be counted. */
  static char b[300 << 10];
  for (size_t k = 0; k < sizeof b; k++) b[k] = (char)('a' + k % 26);
  tdist_status_t st = tdist_store_set(s, kbig, b, sizeof b);
  if (st == TDIST_OK) st = tdist_store_get(s, kbig, &v, &n);
  if (st == TDIST_OK) {
    CHECK_MEM_EQ(v, n, b, sizeof b);
    tdist_free(v);
  }
  return st;
}

void session_must_pass(int port, const char *prefix) {
  tdist_store_t *s = NULL;
  CHECK_OK(session_connect(port, &s));
  tdist_status_t st = session_run(s, prefix);
  CHECK_OK_MSG(st, tdist_store_last_error(s));
  tdist_store_destroy(s);
}

int session_fork_server(int *pid) {
  int p[2];
  CHECK(pipe(p) == 0);
  pid_t c = fork();
  CHECK(c >= 0);
  if (c == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that was killed */
    close(p[0]);
    tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.quiet = 1;
    tdist_store_server_t *srv = NULL;
    if (tdist_store_server_create(&o, &srv) != TDIST_OK) _exit(1);
    int port = tdist_store_server_port(srv);
    if (write(p[1], &port, sizeof port) != (ssize_t)sizeof port) _exit(1);
    for (;;) pause(); /* until SIGKILL */
  }
  close(p[1]);
  int port = 0;
  CHECK(read(p[0], &port, sizeof port) == (ssize_t)sizeof port);
  close(p[0]);
  *pid = c;
  return port;
}
