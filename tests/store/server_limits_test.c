/* Tests of the TCPStore server's limits and bookkeeping (tdist_store_server_*), over raw sockets
 * (server_wire.h): key, value, key-count and request limits in both dialects, the default 1 TB
 * value refusal, max_connections, the stats counters, IPv4 and IPv6 reachability of the default
 * (dual-stack) server, and destroying a server with live clients and pending waits.
 * A machine without IPv6 loopback fails the [::1] check unless the run sets
 * TDIST_TEST_ALLOW_NO_IPV6=1 (then it says the check was not made). Random data comes from a
 * fixed seed (TDIST_TEST_SEED overrides it). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "rng.h"
#include "server_wire.h"
#include "tdist/tdist.h"

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
    /* A machine without IPv6 loopback fails this check; such a run must say so explicitly. */
    const char *allow = getenv("TDIST_TEST_ALLOW_NO_IPV6");
    if ((err == EAFNOSUPPORT || err == EADDRNOTAVAIL || err == ENETUNREACH) && allow &&
        strcmp(allow, "1") == 0) {
      TEST_LOG(
          "address families: [::1] NOT CHECKED (no IPv6 loopback here: %s), as "
          "TDIST_TEST_ALLOW_NO_IPV6=1 allows",
          strerror(err));
      conn_close(&v4);
      return;
    }
    TEST_FAIL(
        "connect [::1]:%d: %s (the default server must listen dual stack; a machine "
        "without IPv6 loopback can opt out with TDIST_TEST_ALLOW_NO_IPV6=1)",
        port, strerror(err));
  }
  expect_ping(&v6, 6);
  r_sets(&v6, K("fam"), "six");
  sync_conn(&v6);
  expect_gets(&v4, K("fam"), "six");
  conn_close(&v4);
  conn_close(&v6);
  TEST_LOG("address families: 127.0.0.1 and [::1] reach the default server");
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
  test_rng_init("server_limits_test", 424242);
  /* SIGPIPE is deliberately left at its default: a server that writes to a departed peer without
   * MSG_NOSIGNAL would kill this process, and that is a bug worth seeing. */

  test_stats();
  test_limits();
  test_max_connections();
  test_lifecycle();

  tdist_store_server_t *s = start_server(NULL);
  key_prefix = "lim";
  test_default_value_limit(s);
  key_prefix = "fam";
  test_address_families(s);
  tdist_store_server_destroy(s);
  TEST_LOG("server_limits_test: all passed");
  return 0;
}
