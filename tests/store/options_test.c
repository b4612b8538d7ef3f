/* The size and version check of the store's option structs (runtime/common/options.h, shared
 * with tdist_pg_options_t: see //tests/pg:pg_init_test). For tdist_store_server_options_t and
 * tdist_tcp_store_options_t, whose version 1 is every field they have:
 *   - a size that ends at version 1's last field (this build's size without its trailing
 *     padding) is accepted, and the fields are read: the server's max_key_bytes closes a
 *     connection that sends a longer key, the client's dialect is the one asked for;
 *   - a larger size (a caller built against a newer header, whose fields this build does not
 *     know) is accepted too;
 *   - one byte less than version 1's fields, the bare {size, version} header and size 0 are
 *     refused with TDIST_ERR_INVALID_ARGUMENT and a message naming the size; version 0 and a
 *     negative version likewise. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tdist/tdist.h"

#define SERVER_V1                                  \
  (offsetof(tdist_store_server_options_t, quiet) + \
   sizeof(((tdist_store_server_options_t *)0)->quiet))
#define CLIENT_V1 \
  (offsetof(tdist_tcp_store_options_t, dialect) + sizeof(((tdist_tcp_store_options_t *)0)->dialect))

typedef struct {
  tdist_store_server_options_t o;
  unsigned char newer[32];
} newer_server_t;

typedef struct {
  tdist_tcp_store_options_t o;
  unsigned char newer[32];
} newer_client_t;

static void expect_refused(tdist_status_t st, const char *fn, size_t size, int version) {
  char want[160];
  snprintf(want, sizeof want, "%s: options not initialised with", fn);
  char sz[64];
  snprintf(sz, sizeof sz, "(size %zu, version %d;", size, version);
  if (st != TDIST_ERR_INVALID_ARGUMENT || !strstr(tdist_last_error(), want) ||
      !strstr(tdist_last_error(), sz)) {
    fprintf(stderr, "%s with size %zu, version %d: got %s: %s\n", fn, size, version,
            tdist_status_name(st), tdist_last_error());
    exit(1);
  }
}

static tdist_store_server_t *server_of_size(size_t size, int version, tdist_status_t *st) {
  newer_server_t n;
  memset(n.newer, 0xa5, sizeof n.newer);
  n.o = (tdist_store_server_options_t)TDIST_STORE_SERVER_OPTIONS_INIT;
  n.o.size = size;
  n.o.version = version;
  n.o.host = "127.0.0.1";
  n.o.max_key_bytes = 16; /* read: a longer key closes the connection */
  n.o.quiet = 1;          /* the last field of version 1 */
  tdist_store_server_t *srv = NULL;
  *st = tdist_store_server_create(&n.o, &srv);
  return srv;
}

static tdist_store_t *client_of_size(int port, size_t size, int version, tdist_status_t *st) {
  newer_client_t n;
  memset(n.newer, 0xa5, sizeof n.newer);
  n.o = (tdist_tcp_store_options_t)TDIST_TCP_STORE_OPTIONS_INIT;
  n.o.size = size;
  n.o.version = version;
  n.o.host = "127.0.0.1";
  n.o.port = port;
  n.o.connect_timeout_ms = 10000;
  n.o.timeout_ms = 10000;
  n.o.dialect = TDIST_STORE_DIALECT_V1_13; /* the last field of version 1: read */
  tdist_store_t *s = NULL;
  *st = tdist_tcp_store_connect(&n.o, &s);
  return s;
}

/* The server's fields were read: a short key works, a 64-byte one (over max_key_bytes 16)
 * closes the connection, so the call fails. */
static void check_server(tdist_store_server_t *srv) {
  tdist_status_t st;
  tdist_store_t *s = client_of_size(tdist_store_server_port(srv), CLIENT_V1, 1, &st);
  CHECK_OK(st);
  CHECK_EQ_INT(tdist_tcp_store_dialect(s), TDIST_STORE_DIALECT_V1_13);
  int64_t v = 0;
  CHECK_OK(tdist_store_add(s, "k", 5, &v));
  CHECK_EQ_INT(v, 5);
  char key[65];
  memset(key, 'x', 64);
  key[64] = '\0';
  CHECK(tdist_store_add(s, key, 1, &v) != TDIST_OK);
  tdist_store_destroy(s);
}

int main(void) {
  CHECK(SERVER_V1 <= sizeof(tdist_store_server_options_t));
  CHECK(CLIENT_V1 <= sizeof(tdist_tcp_store_options_t));
  tdist_status_t st;
  size_t server_ok[] = {SERVER_V1, sizeof(tdist_store_server_options_t), sizeof(newer_server_t)};
  for (size_t i = 0; i < sizeof server_ok / sizeof server_ok[0]; i++) {
    TEST_LOG("server options of size %zu (version 1's fields end at %zu)", server_ok[i],
             (size_t)SERVER_V1);
    tdist_store_server_t *srv = server_of_size(server_ok[i], 1, &st);
    CHECK_OK(st);
    check_server(srv);
    tdist_store_server_destroy(srv);
  }
  size_t bad[] = {SERVER_V1 - 1, sizeof(size_t) + sizeof(int), 0};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(server_of_size(bad[i], 1, &st) == NULL);
    expect_refused(st, "tdist_store_server_create", bad[i], 1);
  }
  CHECK(server_of_size(SERVER_V1, 0, &st) == NULL);
  expect_refused(st, "tdist_store_server_create", SERVER_V1, 0);
  CHECK(server_of_size(sizeof(tdist_store_server_options_t), -1, &st) == NULL);
  expect_refused(st, "tdist_store_server_create", sizeof(tdist_store_server_options_t), -1);
  TEST_LOG("server: sizes below %zu and versions below 1 refused", (size_t)SERVER_V1);

  tdist_store_server_t *srv = server_of_size(sizeof(tdist_store_server_options_t), 1, &st);
  CHECK_OK(st);
  int port = tdist_store_server_port(srv);
  size_t client_ok[] = {CLIENT_V1, sizeof(tdist_tcp_store_options_t), sizeof(newer_client_t)};
  for (size_t i = 0; i < sizeof client_ok / sizeof client_ok[0]; i++) {
    TEST_LOG("client options of size %zu (version 1's fields end at %zu)", client_ok[i],
             (size_t)CLIENT_V1);
    tdist_store_t *s = client_of_size(port, client_ok[i], 1, &st);
    CHECK_OK(st);
    CHECK_EQ_INT(tdist_tcp_store_dialect(s), TDIST_STORE_DIALECT_V1_13);
    CHECK_OK(tdist_store_set(s, "k", "v", 1));
    tdist_store_destroy(s);
  }
  size_t cbad[] = {CLIENT_V1 - 1, sizeof(size_t) + sizeof(int), 0};
  for (size_t i = 0; i < sizeof cbad / sizeof cbad[0]; i++) {
    CHECK(client_of_size(port, cbad[i], 1, &st) == NULL);
    expect_refused(st, "tdist_tcp_store_connect", cbad[i], 1);
  }
  CHECK(client_of_size(port, CLIENT_V1, 0, &st) == NULL);
  expect_refused(st, "tdist_tcp_store_connect", CLIENT_V1, 0);
  TEST_LOG("client: sizes below %zu and versions below 1 refused", (size_t)CLIENT_V1);
  tdist_store_server_destroy(srv);
  TEST_LOG("ok");
  return 0;
}
