/* The store server's multiplexed connections (runtime/store/mux.h) at byte level: a raw socket
 * plays a store proxy. The frame format is written here from mux.h's description, not with the
 * codec. Cases: random requests of several carried clients (both dialects) split into random
 * frames and checked against the test's own model of the store; WAITs released across carried
 * clients and a direct connection; a carried client's protocol error closes only it (CLOSE with
 * the reason); DATA for an unknown id is ignored; bad frames close the proxy's connection and
 * every client it carried, WAITs included; max_connections counts carried clients; the hello
 * split byte by byte, and a 0xF7 start that is not the hello; random frame streams; at most
 * 65,536 clients open on one proxy connection. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "server_wire.h"

static const uint8_t HELLO[8] = {0xF7, 't', 'd', 'm', 'u', 'x', '1', '\n'};
enum { F_OPEN = 1, F_DATA = 2, F_CLOSE = 3 };

static uint64_t rng_state;
static uint32_t rnd(uint32_t n) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33) % n;
}

/* A raw proxy connection. */
typedef struct {
  conn_t c; /* fd and a name for server_wire's readers */
} mx_t;

static mx_t mx_open(int port, const char *name) {
  mx_t m;
  m.c.fd = raw_connect(AF_INET, port);
  m.c.v2 = 1;
  snprintf(m.c.name, sizeof m.c.name, "%s", name);
  if (m.c.fd < 0) TEST_FAIL("%s: connect: %s", name, strerror(-m.c.fd));
  send_raw(&m.c, HELLO, sizeof HELLO);
  uint8_t got[8];
  rd(&m.c, got, sizeof got, "hello answer");
  CHECK_MEM_EQ(got, sizeof got, HELLO, sizeof HELLO);
  return m;
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void mx_frame(mx_t *m, uint8_t type, uint32_t id, const void *d, uint32_t n) {
  uint8_t *b = malloc(9 + (size_t)n);
  CHECK(b != NULL);
  b[0] = type;
  put32(b + 1, id);
  put32(b + 5, n);
  if (n) memcpy(b + 9, d, n);
  send_raw(&m->c, b, 9 + (size_t)n);
  free(b);
}

/* The bytes as DATA frames of random sizes, each frame itself sent in up to three pieces. */
static void mx_send_split(mx_t *m, uint32_t id, const uint8_t *d, size_t n) {
  while (n) {
    size_t k = 1 + rnd((uint32_t)(n < 200 ? n : 200));
    uint8_t *b = malloc(9 + k);
    CHECK(b != NULL);
    b[0] = F_DATA;
    put32(b + 1, id);
    put32(b + 5, (uint32_t)k);
    memcpy(b + 9, d, k);
    size_t cut1 = rnd((uint32_t)(9 + k)), cut2 = cut1 + rnd((uint32_t)(9 + k - cut1));
    if (cut1) send_raw(&m->c, b, cut1);
    if (cut2 > cut1) send_raw(&m->c, b + cut1, cut2 - cut1);
    send_raw(&m->c, b + cut2, 9 + k - cut2);
    free(b);
    d += k;
    n -= k;
  }
}

/* One frame; its payload malloc'd (NUL-terminated). */
static uint8_t *mx_read(mx_t *m, uint8_t *type, uint32_t *id, uint32_t *len) {
  uint8_t h[9];
  rd(&m->c, h, 9, "frame header");
  *type = h[0];
  *id = get32(h + 1);
  *len = get32(h + 5);
  CHECK(*len <= (1u << 20));
  uint8_t *p = malloc((size_t)*len + 1);
  CHECK(p != NULL);
  if (*len) rd(&m->c, p, *len, "frame payload");
  p[*len] = 0;
  return p;
}

/* Exactly these bytes for client id, in DATA frames; any other frame fails. */
static void mx_expect_data(mx_t *m, uint32_t id, const void *want, size_t n, const char *what) {
  uint8_t *got = malloc(n + 1);
  CHECK(got != NULL);
  size_t have = 0;
  while (have < n) {
    uint8_t t;
    uint32_t fid, len;
    uint8_t *p = mx_read(m, &t, &fid, &len);
    if (t != F_DATA || fid != id || have + len > n)
      TEST_FAIL("%s: got frame type %u id %u length %u (%s), want %zu more DATA bytes for %u", what,
                t, fid, len, t == F_CLOSE ? (char *)p : "", n - have, id);
    memcpy(got + have, p, len);
    have += len;
    free(p);
  }
  CHECK_MEM_EQ(got, n, want, n);
  free(got);
}

static void enc_validate(enc_t *e) {
  enc_u8(e, 0x00);
  enc_u32(e, 0x3C85F7CEu);
}

/* ---- random requests against the test's model ------------------------------------------- */

#define NKEYS 12
typedef struct {
  int set;
  char v[40];
} mkey_t;

static void case_random_ops(int port) {
  TEST_CASE("random ops of carried clients against a model");
  mx_t m = mx_open(port, "proxy");
  const uint32_t ids[4] = {0, 5, 1000, 77777};
  const int v2[4] = {1, 1, 0, 1};
  for (int i = 0; i < 4; i++) {
    mx_frame(&m, F_OPEN, ids[i], NULL, 0);
    if (v2[i]) {
      enc_t e = {0};
      enc_validate(&e);
      mx_send_split(&m, ids[i], e.p, e.len);
      free(e.p);
    }
  }
  mkey_t model[NKEYS] = {{0}};
  int64_t counter = 0;
  for (int step = 0; step < 400; step++) {
    int c = (int)rnd(4);
    const int *wire = v2[c] ? v2_wire : v113_wire;
    char key[32];
    int k = (int)rnd(NKEYS);
    snprintf(key, sizeof key, "/mux/k%d", k);
    enc_t req = {0}, want = {0};
    int op = (int)rnd(4);
    if (op == 0 || !model[k].set) { /* SET: no reply */
      snprintf(model[k].v, sizeof model[k].v, "v%u-%u", rnd(1u << 30), (unsigned)step);
      model[k].set = 1;
      enc_u8(&req, (uint8_t)wire[OP_SET]);
      enc_cstr(&req, key);
      enc_cstr(&req, model[k].v);
    } else if (op == 1) { /* GET of a key that exists */
      enc_u8(&req, (uint8_t)wire[OP_GET]);
      enc_cstr(&req, key);
      enc_cstr(&want, model[k].v);
    } else if (op == 2) { /* ADD */
      int64_t d = (int64_t)rnd(2001) - 1000;
      counter += d;
      enc_u8(&req, (uint8_t)wire[OP_ADD]);
      enc_cstr(&req, "/mux/counter");
      enc_u64(&req, (uint64_t)d);
      enc_u64(&want, (uint64_t)counter);
    } else { /* DELETE */
      enc_u8(&req, (uint8_t)wire[OP_DELETE]);
      enc_cstr(&req, key);
      enc_u64(&want, 1);
      model[k].set = 0;
    }
    mx_send_split(&m, ids[c], req.p, req.len);
    if (want.len) mx_expect_data(&m, ids[c], want.p, want.len, "reply");
    free(req.p);
    free(want.p);
  }
  for (int i = 0; i < 4; i++) mx_frame(&m, F_CLOSE, ids[i], NULL, 0);
  conn_close(&m.c);
  TEST_LOG("400 random requests over 4 carried clients (one 1.13) matched the model");
}

/* ---- WAITs, errors, unknown ids ----------------------------------------------------------- */

static void send_req(mx_t *m, uint32_t id, int op, const char *key, const char *val) {
  enc_t e = {0};
  enc_u8(&e, (uint8_t)v2_wire[op]);
  if (op == OP_WAIT) enc_u64(&e, 1);
  enc_cstr(&e, key);
  if (val) enc_cstr(&e, val);
  mx_send_split(m, id, e.p, e.len);
  free(e.p);
}

static void open_v2(mx_t *m, uint32_t id) {
  enc_t e = {0};
  mx_frame(m, F_OPEN, id, NULL, 0);
  enc_validate(&e);
  mx_send_split(m, id, e.p, e.len);
  free(e.p);
}

static void case_waits(tdist_store_server_t *s, int port) {
  TEST_CASE("WAITs across carried clients and a direct connection");
  mx_t m = mx_open(port, "proxy");
  open_v2(&m, 1);
  open_v2(&m, 2);
  open_v2(&m, 3);
  send_req(&m, 1, OP_WAIT, "/mux/w1", NULL);
  send_req(&m, 2, OP_WAIT, "/mux/w2", NULL);
  WAIT_STAT(s, waits_pending, 2);
  expect_silent(&m.c, 100, "no key set yet");
  conn_t d = conn_open(port, 1, "direct");
  r_sets(&d, "/mux/w1", "x");
  const uint8_t stop = 0; /* STOP_WAITING */
  mx_expect_data(&m, 1, &stop, 1, "WAIT released by a direct SET");
  send_req(&m, 3, OP_SET, "/mux/w2", "y");
  mx_expect_data(&m, 2, &stop, 1, "WAIT released by another carried client's SET");
  WAIT_STAT(s, waits_pending, 0);

  TEST_CASE("a carried client's protocol error closes only it");
  uint64_t dropped = stats(s).connections_dropped;
  const uint8_t bad = 0x7f;
  mx_frame(&m, F_DATA, 2, &bad, 1);
  uint8_t t;
  uint32_t id, len;
  uint8_t *why = mx_read(&m, &t, &id, &len);
  CHECK_EQ_UINT(t, F_CLOSE);
  CHECK_EQ_UINT(id, 2);
  CHECK_HAS((char *)why, "unknown opcode");
  free(why);
  WAIT_STAT(s, connections_dropped, dropped + 1);
  TEST_CASE("DATA for an id never opened (or just closed) is ignored");
  mx_frame(&m, F_DATA, 2, &bad, 1);
  mx_frame(&m, F_DATA, 100000, &bad, 1); /* within the id space, never opened */
  send_req(&m, 3, OP_GET, "/mux/w2", NULL);
  enc_t want = {0};
  enc_cstr(&want, "y");
  mx_expect_data(&m, 3, want.p, want.len, "GET after the ignored frames");
  free(want.p);
  TEST_CASE("an id the server closed can be opened again");
  open_v2(&m, 2);
  send_req(&m, 2, OP_GET, "/mux/w1", NULL);
  want = (enc_t){0};
  enc_cstr(&want, "x");
  mx_expect_data(&m, 2, want.p, want.len, "GET on the reopened id");
  free(want.p);
  conn_close(&d);
  conn_close(&m.c);
}

/* ---- bad frames and closing -------------------------------------------------------------- */

static void expect_proxy_closed(tdist_store_server_t *s, int port, const char *what,
                                const uint8_t *frame, size_t n, uint64_t open_before) {
  TEST_CASE(what);
  mx_t m = mx_open(port, "proxy");
  for (uint32_t i = 0; i < 30; i++) {
    open_v2(&m, i);
    send_req(&m, i, OP_WAIT, "/mux/never", NULL);
  }
  WAIT_STAT(s, waits_pending, 30);
  WAIT_STAT(s, connections_open, open_before + 31);
  if (frame) {
    send_raw(&m.c, frame, n);
    expect_closed(&m.c, what);
  }
  conn_close(&m.c); /* without a frame: the proxy going away is the case */
  /* Its clients went with it, WAITs included; the server serves others. */
  WAIT_STAT(s, waits_pending, 0);
  WAIT_STAT(s, connections_open, open_before);
  conn_t d = conn_open(port, 1, "direct");
  CHECK_EQ_INT(r_add(&d, "/mux/alive", 1) > 0, 1);
  conn_close(&d);
}

static void case_bad_frames(tdist_store_server_t *s, int port) {
  WAIT_STAT(s, connections_open, 0); /* the earlier cases' connections are gone */
  uint64_t base = 0;
  uint8_t f[9];
  f[0] = 9; /* no such type */
  put32(f + 1, 0);
  put32(f + 5, 0);
  expect_proxy_closed(s, port, "a frame of unknown type", f, 9, base);
  f[0] = F_DATA;
  put32(f + 5, (1u << 20) + 1);
  expect_proxy_closed(s, port, "a DATA frame past 1 MiB", f, 9, base);
  f[0] = F_OPEN;
  put32(f + 1, 3); /* open already */
  put32(f + 5, 0);
  expect_proxy_closed(s, port, "OPEN of an id that is open", f, 9, base);
  put32(f + 1, 1u << 17); /* the first id past the limit */
  expect_proxy_closed(s, port, "an id past the limit", f, 9, base);
  TEST_CASE("closing the proxy's connection closes its clients and frees their WAITs");
  expect_proxy_closed(s, port, "the proxy goes away", NULL, 0, base);
}

static void case_max_connections(void) {
  TEST_CASE("max_connections counts carried clients");
  limits_t lim = {.max_conn = 4};
  tdist_store_server_t *s = start_server(&lim);
  int port = tdist_store_server_port(s);
  mx_t m = mx_open(port, "proxy");
  for (uint32_t i = 0; i < 3; i++) open_v2(&m, i);
  WAIT_STAT(s, connections_open, 4);
  mx_frame(&m, F_OPEN, 3, NULL, 0);
  uint8_t t;
  uint32_t id, len;
  uint8_t *why = mx_read(&m, &t, &id, &len);
  CHECK_EQ_UINT(t, F_CLOSE);
  CHECK_EQ_UINT(id, 3);
  CHECK_HAS((char *)why, "max_connections");
  free(why);
  mx_frame(&m, F_CLOSE, 0, NULL, 0);
  WAIT_STAT(s, connections_open, 3);
  open_v2(&m, 3);
  send_req(&m, 3, OP_SET, "/mux/m", "ok");
  send_req(&m, 3, OP_GET, "/mux/m", NULL);
  enc_t want = {0};
  enc_cstr(&want, "ok");
  mx_expect_data(&m, 3, want.p, want.len, "a client opened once another closed");
  free(want.p);
  conn_close(&m.c);
  tdist_store_server_destroy(s);
}

/* One proxy connection holds at most 65,536 clients open; one more is refused with a CLOSE, and
 * once one closes there is room again. */
static void case_per_proxy_cap(tdist_store_server_t *s, int port) {
  TEST_CASE("65,536 clients a proxy connection at most");
  WAIT_STAT(s, connections_open, 0);
  mx_t m = mx_open(port, "big proxy");
  enum { CAP = 65536 };
  uint8_t *b = malloc((size_t)(CAP + 1) * 9);
  CHECK(b != NULL);
  for (uint32_t i = 0; i <= CAP; i++) {
    b[i * 9] = F_OPEN;
    put32(b + i * 9 + 1, i);
    put32(b + i * 9 + 5, 0);
  }
  send_raw(&m.c, b, (size_t)(CAP + 1) * 9);
  free(b);
  uint8_t t;
  uint32_t id, len;
  uint8_t *why = mx_read(&m, &t, &id, &len);
  CHECK_EQ_UINT(t, F_CLOSE);
  CHECK_EQ_UINT(id, CAP);
  CHECK_HAS((char *)why, "too many clients on one proxy connection");
  free(why);
  WAIT_STAT(s, connections_open, 1 + CAP);
  mx_frame(&m, F_CLOSE, 17, NULL, 0);
  open_v2(&m, CAP);
  send_req(&m, CAP, OP_SET, "/mux/cap", "in");
  send_req(&m, CAP, OP_GET, "/mux/cap", NULL);
  enc_t want = {0};
  enc_cstr(&want, "in");
  mx_expect_data(&m, CAP, want.p, want.len, "the client opened once another closed");
  free(want.p);
  conn_close(&m.c);
  WAIT_STAT(s, connections_open, 0);
}

static void case_hello(int port) {
  TEST_CASE("the hello split byte by byte");
  conn_t c = {.fd = raw_connect(AF_INET, port), .v2 = 1, .name = "slow hello"};
  CHECK(c.fd >= 0);
  for (size_t i = 0; i < sizeof HELLO; i++) {
    expect_silent(&c, 20, "a partial hello");
    send_raw(&c, HELLO + i, 1);
  }
  uint8_t got[8];
  rd(&c, got, 8, "hello answer");
  CHECK_MEM_EQ(got, 8, HELLO, 8);
  conn_close(&c);
  TEST_CASE("0xF7 then other bytes is a 1.13 request with an unknown opcode: closed");
  c = (conn_t){.fd = raw_connect(AF_INET, port), .v2 = 0, .name = "not a hello"};
  const uint8_t other[8] = {0xF7, 't', 'd', 'm', 'u', 'x', '2', '\n'};
  send_raw(&c, other, sizeof other);
  expect_closed(&c, "0xF7 without the hello");
  conn_close(&c);
}

/* Random frame streams (valid and not, random payloads that are requests or noise): whatever
 * the server does with each, it keeps serving, and every carried client is gone once its proxy
 * connection is. */
static void case_random_frames(tdist_store_server_t *s, int port) {
  TEST_CASE("random frame streams");
  for (int round = 0; round < 60; round++) {
    mx_t m = mx_open(port, "random proxy");
    enc_t e = {0};
    for (int f = 0; f < 40; f++) {
      uint8_t type = (uint8_t)(rnd(10) < 8 ? 1 + rnd(3) : rnd(256));
      uint32_t id = rnd(8) ? rnd(8) : rnd(UINT32_MAX);
      uint32_t len = type == F_OPEN && rnd(8) ? 0 : rnd(64);
      enc_u8(&e, type);
      enc_u32(&e, id);
      enc_u32(&e, rnd(16) ? len : rnd(UINT32_MAX));
      for (uint32_t i = 0; i < len; i++) enc_u8(&e, (uint8_t)(rnd(4) ? rnd(16) : rnd(256)));
    }
    send_raw(&m.c, e.p, rnd(4) ? e.len : rnd((uint32_t)e.len + 1));
    free(e.p);
    conn_close(&m.c);
  }
  WAIT_STAT(s, connections_open, 0);
  WAIT_STAT(s, waits_pending, 0);
  conn_t d = conn_open(port, 1, "direct");
  CHECK_EQ_INT(r_add(&d, "/mux/after-random", 5), 5);
  conn_close(&d);
}

int main(void) {
  const char *seed_env = getenv("TDIST_TEST_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)getpid() * 2654435761u;
  rng_state = seed;
  printf("mux_test: seed %llu (TDIST_TEST_SEED to repeat)\n", (unsigned long long)seed);
  key_prefix = "mux";
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  case_random_ops(port);
  case_waits(s, port);
  case_bad_frames(s, port);
  case_hello(port);
  case_random_frames(s, port);
  case_per_proxy_cap(s, port);
  tdist_store_server_destroy(s);
  case_max_connections();
  printf("PASS: mux_test\n");
  return 0;
}
