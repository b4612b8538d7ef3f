/* See client_testlib.h. */
#define _GNU_SOURCE
#include "client_testlib.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "tdist/tdist.h"

void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  CHECK(p != NULL);
  return p;
}

const char *dialect_name(tdist_store_dialect_t d) {
  switch (d) {
    case TDIST_STORE_DIALECT_AUTO: return "AUTO";
    case TDIST_STORE_DIALECT_V2: return "V2";
    case TDIST_STORE_DIALECT_V1_13: return "V1_13";
  }
  return "?";
}

tdist_store_server_t *start_server(void) {
  tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = 0;
  o.quiet = 1;
  tdist_store_server_t *srv = NULL;
  CHECK_OK(tdist_store_server_create(&o, &srv));
  CHECK(srv != NULL);
  int port = tdist_store_server_port(srv);
  CHECK(port > 0 && port < 65536);
  return srv;
}

tdist_store_t *connect_store(int port, tdist_store_dialect_t dialect, int64_t timeout_ms) {
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 10000;
  o.timeout_ms = timeout_ms;
  o.dialect = dialect;
  tdist_store_t *s = NULL;
  CHECK_OK(tdist_tcp_store_connect(&o, &s));
  CHECK(s != NULL);
  tdist_store_dialect_t want =
      dialect == TDIST_STORE_DIALECT_V1_13 ? TDIST_STORE_DIALECT_V1_13 : TDIST_STORE_DIALECT_V2;
  if (tdist_tcp_store_dialect(s) != want) {
    fprintf(stderr, "asked %s, got dialect %s, want %s\n", dialect_name(dialect),
            dialect_name(tdist_tcp_store_dialect(s)), dialect_name(want));
    exit(1);
  }
  CHECK_EQ_INT(tdist_store_timeout(s), timeout_ms);
  return s;
}

int loopback_socket(struct sockaddr_in *a) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(fd, (struct sockaddr *)a, sizeof *a) == 0);
  socklen_t al = sizeof *a;
  CHECK(getsockname(fd, (struct sockaddr *)a, &al) == 0);
  return fd;
}

void expect_get(tdist_store_t *s, const char *key, const void *want, size_t want_len) {
  void *v = NULL;
  size_t n = 12345;
  CHECK_STORE_OK(tdist_store_get(s, key, &v, &n), s);
  CHECK_MEM_EQ(v, n, want, want_len);
  tdist_free(v);
}

void expect_get_str(tdist_store_t *s, const char *key, const char *want) {
  expect_get(s, key, want, strlen(want));
}

void expect_ready(tdist_store_t *s, const char *key, int want) {
  int ready = -1;
  const char *keys[1] = {key};
  CHECK_STORE_OK(tdist_store_check(s, keys, 1, &ready), s);
  CHECK_EQ_INT(ready, want);
}

void check_elapsed(int64_t elapsed, int64_t want_ms) {
  if (elapsed < want_ms - 20 || elapsed > want_ms + 2500) {
    fprintf(stderr, "elapsed %" PRId64 " ms, want about %" PRId64 " ms\n", elapsed, want_ms);
    exit(1);
  }
}

void check_in_step(tdist_store_t *a, tdist_store_t *b, const char *tag) {
  char key[64], val[64];
  static unsigned n;
  n++;
  snprintf(key, sizeof key, "sentinel-%s-%d-%u", tag, (int)getpid(), n);
  snprintf(val, sizeof val, "v-%u", n * 2654435761u);
  CHECK_STORE_OK(tdist_store_set(b, key, val, strlen(val)), b);
  expect_get_str(a, key, val);
  int64_t r = 0;
  CHECK_STORE_OK(tdist_store_add(a, "in-step-ctr", 0, &r), a);
  int64_t r2 = 0;
  CHECK_STORE_OK(tdist_store_add(b, "in-step-ctr", 7, &r2), b);
  CHECK_EQ_INT(r2, r + 7);
  CHECK_STORE_OK(tdist_store_add(a, "in-step-ctr", 0, &r), a);
  CHECK_EQ_INT(r, r2);
  expect_ready(a, key, 1);
  int del = -1;
  CHECK_STORE_OK(tdist_store_delete_key(a, key, &del), a);
  CHECK_EQ_INT(del, 1);
  expect_ready(b, key, 0);
}
