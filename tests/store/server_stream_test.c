/* Byte-level tests of the TCPStore server (tdist_store_server_*) at the stream level: requests
 * split at every byte and pipelined, in both dialects, and clients that vanish (closed, reset,
 * mid-request, with a wait pending); an idle connection stays usable throughout. The raw client
 * is server_wire.h; every read has a deadline. Random data comes from a fixed seed
 * (TDIST_TEST_SEED overrides it). */
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
/* Streaming clients                                                                        */
/* ---------------------------------------------------------------------------------------- */

/* Clients that stream SETs, one request per send() as torch's set() does (no reply, so they never
 * wait for the server), several at once in both dialects (bench/store/torch_pipeline.sh measures
 * this pattern): every SET is executed in order, a WAIT on another connection is woken by one of
 * the streams, a streamer reset mid-stream disturbs no one, and each streamer's GET after its
 * stream is answered with its last value. */
static void test_streamers(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  enum { NS = 7, NSET = 400 };
  conn_t st[NS];
  char key[96], val[32];
  for (int i = 0; i < NS; i++) st[i] = conn_open(port, i % 3 != 2, "streamer");
  conn_t waiter = conn_open(port, 1, "waiter(2.x)");
  const char *wk = K("mid");
  send_wait(&waiter, &wk, 1);
  for (int j = 0; j < NSET; j++) {
    for (int i = 0; i < NS; i++) {
      if (i == NS - 1 && j == NSET / 2) close_rst(&st[i]);
      if (i == NS - 1 && j >= NSET / 2) continue;
      snprintf(key, sizeof key, "%s-%d", K("s"), i);
      snprintf(val, sizeof val, "%d", j);
      r_sets(&st[i], key, val);
    }
    if (j == NSET / 2) r_sets(&st[0], K("mid"), "m");
  }
  expect_byte(&waiter, 0x00, "WAIT woken by a streamer's SET");
  for (int i = 0; i < NS - 1; i++) {
    snprintf(key, sizeof key, "%s-%d", K("s"), i);
    snprintf(val, sizeof val, "%d", NSET - 1);
    expect_gets(&st[i], key, val);
  }
  /* A streamer that stopped can stream again and be answered again. */
  for (int j = 0; j < 50; j++) r_sets(&st[1], K("again"), j == 49 ? "last" : "x");
  expect_gets(&st[1], K("again"), "last");
  for (int i = 0; i < NS - 1; i++) conn_close(&st[i]);
  conn_close(&waiter);
  TEST_LOG("streaming clients: every SET executed in order, WAIT woken, GETs answered");
}

int main(void) {
  test_rng_init("server_stream_test", 424242);
  /* SIGPIPE is deliberately left at its default: a server that writes to a departed peer without
   * MSG_NOSIGNAL would kill this process, and that is a bug worth seeing. */

  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t idle = conn_open(port, 1, "idle(2.x)"); /* says nothing until the end */
  key_prefix = "split";
  test_split(s);
  key_prefix = "pipe";
  test_pipelined(s);
  key_prefix = "van";
  test_vanishing(s);
  key_prefix = "stream";
  test_streamers(s);
  expect_idle_usable(&idle);
  conn_close(&idle);
  tdist_store_server_destroy(s);
  TEST_LOG("server_stream_test: all passed");
  return 0;
}
