/* Byte-level tests of the TCPStore server (tdist_store_server_*), per op, written from the PyTorch
 * reference (shared/reference/torch-contracts.md §1.3, §1.5, §1.6, §1.12): the captured 1.13
 * session replayed byte for byte, then every op's semantics on one server with both dialects
 * connected at once, waits and their cancellation (including the SET/CANCEL_WAIT race), queues and
 * the counting of waits on several keys; an idle connection stays usable throughout. The raw
 * client is server_wire.h; every read has a deadline. Random data comes from a fixed seed
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
/* §1.12 replayed                                                                           */
/* ---------------------------------------------------------------------------------------- */

static void test_capture_replay(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t c1 = conn_open(port, 0, "c1(1.13)");
  conn_t c2 = conn_open(port, 0, "c2(1.13 callback)"); /* stays silent, as in the capture */
  exchange(&c1, "0003000000000000002f6b31 02000000000000007631", "");
  exchange(&c1, "05 0100000000000000 0300000000000000 2f6b31", "00");
  exchange(&c1, "02 0300000000000000 2f6b31", "0200000000000000 7631");
  exchange(&c1, "03 0400000000000000 2f636e74 0500000000000000", "0500000000000000");
  exchange(&c1, "03 0400000000000000 2f636e74 feffffffffffffff", "0300000000000000");
  exchange(&c1, "01 0300000000000000 2f6373 0000000000000000 0300000000000000 6e6577",
           "0300000000000000 6e6577");
  exchange(&c1, "06", "0300000000000000");
  exchange(&c1, "08 0300000000000000 2f6b31", "0100000000000000");
  exchange(&c1, "05 0200000000000000 0500000000000000 2f6c617465 0400000000000000 2f636e74", "");
  WAIT_STAT(s, waits_pending, 1);
  expect_silent(&c1, 100, "WAIT [/late,/cnt] before /late exists");
  conn_t w = conn_open(port, 1, "setter(2.x)");
  r_sets(&w, "/late", "x");
  expect_byte(&c1, 0x00, "WAIT [/late,/cnt] after SET /late");
  WAIT_STAT(s, waits_pending, 0);
  expect_silent(&c2, 0, "callback connection");
  CHECK_EQ_INT(r_numkeys(&c2), 3); /* /cnt, /cs, /late */
  conn_close(&c1);
  conn_close(&c2);
  conn_close(&w);
  tdist_store_server_destroy(s);
  TEST_LOG("capture replay (§1.12): every reply byte matches");
}

/* ---------------------------------------------------------------------------------------- */
/* Per-op semantics, run once per dialect on one server with both dialects connected          */
/* ---------------------------------------------------------------------------------------- */

/* Wakes a pending WAIT [key] on `waiter` with `op` sent from `waker`; checks the timing. */
static void wake_with(tdist_store_server_t *s, conn_t *waiter, conn_t *waker, int op,
                      const char *name) {
  const char *k = K(name);
  uint64_t base = stats(s).waits_pending;
  send_wait(waiter, &k, 1);
  WAIT_STAT(s, waits_pending, base + 1);
  expect_silent(waiter, 30, "WAIT on a missing key");
  switch (op) {
    case OP_SET: r_sets(waker, k, "v"); break;
    case OP_ADD: CHECK_EQ_INT(r_add(waker, k, 2), 2); break;
    case OP_APPEND: r_append(waker, k, "a"); break;
    case OP_MSET: {
      const char *ks[2] = {K("unrelated"), k};
      const char *vs[2] = {"u", "m"};
      r_mset(waker, ks, vs, 2);
      break;
    }
    default: CHECK(0);
  }
  expect_byte(waiter, 0x00, "STOP_WAITING");
  WAIT_STAT(s, waits_pending, base);
}

/* c: the connection under test. v2aux / v113aux: other connections, one per dialect. */
static void op_suite(tdist_store_server_t *s, conn_t *c, conn_t *v2aux, conn_t *v113aux) {
  int port = tdist_store_server_port(s);
  uint8_t big[4096];
  for (size_t i = 0; i < sizeof(big); i++) big[i] = (uint8_t)rnd();
  big[0] = 0;
  big[100] = 0;

  /* SET: no reply; binary values; empty values; overwrite; visible to the other dialect. */
  r_set(c, K("bin"), big, sizeof(big));
  expect_silent(c, 30, "SET has no reply");
  expect_get(c, K("bin"), big, sizeof(big));
  r_set(c, K("empty"), "", 0);
  expect_get(c, K("empty"), "", 0);
  r_sets(c, K("ow"), "first");
  r_sets(c, K("ow"), "second");
  expect_gets(c, K("ow"), "second");
  expect_gets(v2aux, K("ow"), "second");
  expect_gets(v113aux, K("ow"), "second");
  size_t mib = (size_t)1 << 20;
  uint8_t *large = malloc(mib);
  CHECK(large != NULL);
  for (size_t i = 0; i < mib; i++) large[i] = (uint8_t)(i * 131 + (i >> 9));
  r_set(c, K("mib"), large, mib);
  sync_conn(c);
  expect_get(v2aux, K("mib"), large, mib);
  expect_get(c, K("mib"), large, mib);
  free(large);

  /* COMPARE_SET, the four cases of §1.5 */
  expect_cas(c, K("cas1"), "", "new", "new"); /* absent, expected empty: stored */
  expect_gets(c, K("cas1"), "new");
  expect_cas(c, K("cas2"), "abc", "new", "abc"); /* absent, expected non-empty: "lying" */
  const char *cas2 = K("cas2");
  CHECK_EQ_INT(r_check(c, &cas2, 1), 1);             /* nothing was stored */
  expect_cas(c, K("cas1"), "new", "newer", "newer"); /* present and equal: replaced */
  expect_gets(c, K("cas1"), "newer");
  expect_cas(c, K("cas1"), "wrong", "x", "newer"); /* present, different: current value */
  expect_gets(c, K("cas1"), "newer");
  expect_cas(c, K("cas1"), "newer", "", ""); /* desired may be empty */
  expect_gets(c, K("cas1"), "");

  /* GET of a missing key: 1.13 closes the connection, 2.x replies an empty value. */
  if (c->v2) {
    expect_gets(c, K("nope"), "");
    sync_conn(c);
  } else {
    conn_t t = conn_open(port, 0, "get-missing(1.13)");
    enc_t m = {0};
    m_op(&m, &t, OP_GET);
    enc_cstr(&m, K("nope"));
    m_send(&t, &m);
    expect_closed(&t, "1.13 GET of a missing key");
  }

  /* ADD: decimal text, missing = 0, negative, zero, large */
  CHECK_EQ_INT(r_add(c, K("add"), -5), -5);
  expect_gets(c, K("add"), "-5");
  CHECK_EQ_INT(r_add(c, K("add"), 0), -5);
  CHECK_EQ_INT(r_add(c, K("add"), 12), 7);
  expect_gets(v2aux, K("add"), "7");
  CHECK_EQ_INT(r_add(c, K("cnt"), 5), 5); /* §1.12 */
  CHECK_EQ_INT(r_add(c, K("cnt"), -2), 3);
  expect_gets(c, K("cnt"), "3");
  r_sets(c, K("num"), "42");
  CHECK_EQ_INT(r_add(c, K("num"), 1), 43);
  expect_gets(c, K("num"), "43");
  CHECK_EQ_INT(r_add(c, K("huge"), 1000000000000000LL), 1000000000000000LL);
  CHECK_EQ_INT(r_add(c, K("huge"), 1000000000000000LL), 2000000000000000LL);
  expect_gets(c, K("huge"), "2000000000000000");
  CHECK_EQ_INT(r_add(c, K("neg"), INT64_MIN + 1), INT64_MIN + 1);
  expect_gets(c, K("neg"), "-9223372036854775807");
  /* ADD on a non-integer closes that connection only */
  r_sets(c, K("text"), "hello");
  sync_conn(c);
  {
    conn_t t = conn_open(port, c->v2, "add-on-text");
    enc_t m = {0};
    m_op(&m, &t, OP_ADD);
    enc_cstr(&m, K("text"));
    enc_u64(&m, 1);
    m_send(&t, &m);
    expect_closed(&t, "ADD on the value \"hello\"");
  }
  expect_gets(c, K("text"), "hello");

  /* CHECK */
  const char *have = K("ow"), *missing = K("missing");
  const char *ck2[2] = {have, missing};
  CHECK_EQ_INT(r_check(c, &have, 1), 0);
  CHECK_EQ_INT(r_check(c, ck2, 2), 1);
  CHECK_EQ_INT(r_check(c, &missing, 1), 1);
  CHECK_EQ_INT(r_check(c, NULL, 0), 0);

  /* WAIT: immediate, zero keys, delayed (woken by SET/ADD from either dialect, APPEND and
   * MULTI_SET from 2.x), several keys. */
  send_wait(c, &have, 1);
  expect_byte(c, 0x00, "WAIT on an existing key");
  send_wait(c, NULL, 0);
  expect_byte(c, 0x00, "WAIT with zero keys");
  wake_with(s, c, v113aux, OP_SET, "w-set13");
  wake_with(s, c, v2aux, OP_SET, "w-set2");
  wake_with(s, c, v113aux, OP_ADD, "w-add13");
  wake_with(s, c, v2aux, OP_ADD, "w-add2");
  wake_with(s, c, v2aux, OP_APPEND, "w-append");
  wake_with(s, c, v2aux, OP_MSET, "w-mset");
  {
    const char *wk[3] = {K("wa"), have, K("wb")};
    uint64_t base = stats(s).waits_pending;
    send_wait(c, wk, 3);
    WAIT_STAT(s, waits_pending, base + 1);
    r_sets(v2aux, wk[0], "1");
    sync_conn(v2aux);
    expect_silent(c, 100, "WAIT with one of two missing keys set");
    r_sets(v113aux, wk[2], "2");
    expect_byte(c, 0x00, "WAIT after both keys set");
    WAIT_STAT(s, waits_pending, base);
  }

  /* DELETE_KEY: 1 then 0; the key is gone */
  r_sets(c, K("del"), "x");
  CHECK_EQ_INT(r_delete(c, K("del")), 1);
  CHECK_EQ_INT(r_delete(c, K("del")), 0);
  const char *del = K("del");
  CHECK_EQ_INT(r_check(c, &del, 1), 1);
  CHECK_EQ_INT(r_delete(c, K("never")), 0);

  if (!c->v2) {
    /* WATCH_KEY: KEY_CALLBACK_REGISTERED (on its own connection, like 1.13's callback socket) */
    conn_t t = conn_open(port, 0, "watch(1.13)");
    enc_t m = {0};
    m_op(&m, &t, OP_WATCH);
    enc_cstr(&m, K("watched"));
    m_send(&t, &m);
    expect_byte(&t, 0x03, "WATCH_KEY reply");
    conn_close(&t);
    /* 2.x-only opcodes and beyond are unknown to a 1.13 connection */
    expect_op_closes(port, 0, 0x09, "1.13 opcode 0x09");
    expect_op_closes(port, 0, 0x0c, "1.13 opcode 0x0c");
    expect_op_closes(port, 0, 0xff, "1.13 opcode 0xff");
    sync_conn(c);
    return;
  }

  /* ---- 2.x only ---- */
  /* APPEND creates, then appends */
  r_append(c, K("app"), "ab");
  r_append(c, K("app"), "");
  r_append(c, K("app"), "cd");
  expect_gets(c, K("app"), "abcd");
  r_append(c, K("app-empty"), "");
  const char *ae = K("app-empty");
  CHECK_EQ_INT(r_check(c, &ae, 1), 0);

  /* MULTI_SET (pairs in order: a repeated key keeps the last), MULTI_GET in request order */
  {
    const char *ks[4] = {K("m1"), K("m2"), K("m3"), K("m1")};
    const char *vs[4] = {"one", "", "three", "uno"};
    r_mset(c, ks, vs, 4);
    const char *gk[5] = {K("m3"), K("m1"), K("m2"), K("m1"), K("ow")};
    const char *gv[5] = {"three", "uno", "", "uno", "second"};
    expect_mget(c, gk, gv, 5);
    expect_mget(c, NULL, NULL, 0);
    r_mset(c, NULL, NULL, 0);
    sync_conn(c);
  }

  /* PING echoes the nonce */
  expect_ping(c, 4660);
  expect_ping(c, 0);
  expect_ping(c, 0xffffffffu);
  expect_ping(c, (uint32_t)rnd());

  /* VALIDATE after the first message closes the connection */
  {
    conn_t t = conn_open(port, 1, "late-validate");
    expect_ping(&t, 1);
    static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
    send_raw(&t, validate, 5);
    expect_closed(&t, "VALIDATE later on a 2.x connection");
  }

  /* CANCEL_WAIT with nothing pending: 01 anyway */
  {
    enc_t m = {0};
    m_op(&m, c, OP_CANCEL);
    m_send(c, &m);
    expect_byte(c, 0x01, "CANCEL_WAIT with nothing pending");
  }
  /* CANCEL_WAIT of a pending wait: 01; the later SET sends nothing here */
  {
    const char *k = K("cancelled");
    uint64_t base = stats(s).waits_pending;
    send_wait(c, &k, 1);
    WAIT_STAT(s, waits_pending, base + 1);
    enc_t m = {0};
    m_op(&m, c, OP_CANCEL);
    m_send(c, &m);
    expect_byte(c, 0x01, "CANCEL_WAIT of a pending wait");
    WAIT_STAT(s, waits_pending, base);
    r_sets(v113aux, k, "late");
    sync_conn(v113aux);
    expect_silent(c, 150, "SET after CANCEL_WAIT");
    expect_ping(c, 99);
  }
  /* The race of §1.6: SET (other connection) and CANCEL_WAIT back to back. */
  {
    int only_cancel = 0, both = 0;
    for (int i = 0; i < 40; i++) {
      char name[32];
      snprintf(name, sizeof(name), "race%d", i);
      const char *k = K(name);
      uint64_t base = stats(s).waits_pending;
      send_wait(c, &k, 1);
      WAIT_STAT(s, waits_pending, base + 1);
      enc_t set = {0}, cancel = {0};
      m_op(&set, v2aux, OP_SET);
      enc_cstr(&set, k);
      enc_cstr(&set, "v");
      m_op(&cancel, c, OP_CANCEL);
      if (i % 2) {
        m_send(v2aux, &set);
        m_send(c, &cancel);
      } else {
        m_send(c, &cancel);
        m_send(v2aux, &set);
      }
      uint8_t b = rd_u8(c, "reply to WAIT+CANCEL_WAIT");
      if (b == 0x00) {
        expect_byte(c, 0x01, "WAIT_CANCELED after STOP_WAITING");
        both++;
      } else if (b == 0x01) {
        only_cancel++;
      } else {
        TEST_FAIL("%s: race: got %02x, want 00 01 or 01", c->name, b);
      }
      WAIT_STAT(s, waits_pending, base);
      sync_conn(v2aux);
      expect_ping(c, (uint32_t)i); /* nothing stray in between */
    }
    TEST_LOG("  SET/CANCEL_WAIT race: %d x '01', %d x '00 01'", only_cancel, both);
  }

  /* Unknown opcodes close that connection only */
  expect_op_closes(port, 1, 0x11, "2.x opcode 0x11");
  expect_op_closes(port, 1, 0x80, "2.x opcode 0x80");
  expect_op_closes(port, 1, 0xff, "2.x opcode 0xff");
  sync_conn(c);
}

static void test_queues(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  conn_t c = conn_open(port, 1, "queue");
  conn_t w1 = conn_open(port, 1, "qwait1");
  conn_t w2 = conn_open(port, 1, "qwait2");
  const char *q = K("q");
  CHECK_EQ_INT(r_qlen(&c, q), 0);
  expect_qpop(&c, q, 0, NULL); /* empty: i64 0 and no item */
  expect_ping(&c, 5);          /* ...which the ping proves: nothing else was sent */
  r_qpush(&c, q, "a");
  r_qpush(&c, q, "b");
  r_qpush(&c, q, "");
  CHECK_EQ_INT(r_qlen(&c, q), 3);
  CHECK_EQ_INT(r_check(&c, &q, 1), 0); /* a non-empty queue counts as existing */
  send_wait(&c, &q, 1);
  expect_byte(&c, 0x00, "WAIT on a non-empty queue");
  expect_qpop(&c, q, 3, "a");
  expect_qpop(&c, q, 2, "b");
  expect_qpop(&c, q, 1, "");
  expect_qpop(&c, q, 0, NULL);
  CHECK_EQ_INT(r_qlen(&c, q), 0);
  CHECK_EQ_INT(r_check(&c, &q, 1), 1);

  /* a push wakes exactly one of two waiters */
  const char *q2 = K("q2");
  uint64_t base = stats(s).waits_pending;
  send_wait(&w1, &q2, 1);
  send_wait(&w2, &q2, 1);
  WAIT_STAT(s, waits_pending, base + 2);
  r_qpush(&c, q2, "i1");
  sync_conn(&c);
  struct pollfd p[2] = {{w1.fd, POLLIN, 0}, {w2.fd, POLLIN, 0}};
  int64_t deadline = now_ms() + IO_TIMEOUT_MS;
  while (poll(p, 2, 50) == 0 && now_ms() < deadline) {
  }
  sleep_ms(200); /* give a wrong second wake-up time to show */
  CHECK_EQ_INT(poll(p, 2, 0) >= 0, 1);
  int r1 = (p[0].revents & POLLIN) != 0, r2 = (p[1].revents & POLLIN) != 0;
  if (r1 + r2 != 1) TEST_FAIL("QUEUE_PUSH woke %d of 2 waiters, want exactly 1", r1 + r2);
  conn_t *woken = r1 ? &w1 : &w2, *other = r1 ? &w2 : &w1;
  expect_byte(woken, 0x00, "woken queue waiter");
  WAIT_STAT(s, waits_pending, base + 1);
  expect_qpop(woken, q2, 1, "i1");
  expect_silent(other, 100, "second queue waiter after one push");
  r_qpush(&c, q2, "i2");
  expect_byte(other, 0x00, "second queue waiter after the second push");
  WAIT_STAT(s, waits_pending, base);
  expect_qpop(other, q2, 1, "i2");
  expect_silent(woken, 50, "first waiter after the second push");
  conn_close(&c);
  conn_close(&w1);
  conn_close(&w2);
  TEST_LOG("queues: push/pop/len, FIFO, one waiter per push");
}

static void test_getnumkeys(void) {
  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t a = conn_open(port, 0, "nk(1.13)");
  conn_t b = conn_open(port, 1, "nk(2.x)");
  CHECK_EQ_INT(r_numkeys(&a), 0);
  CHECK_EQ_INT(r_add(&a, "init/", 1), 1); /* raw init/, no "/" */
  CHECK_EQ_INT(r_numkeys(&b), 1);
  r_sets(&b, "/a", "1");
  CHECK_EQ_INT(r_numkeys(&b), 2);
  r_sets(&a, "noslash", "1");
  CHECK_EQ_INT(r_numkeys(&a), 3);
  r_sets(&a, "/a", "2");
  CHECK_EQ_INT(r_numkeys(&a), 3);
  r_append(&b, "/b", "x");
  const char *mk[2] = {"/c", "//worker/attempt_0/d"};
  const char *mv[2] = {"1", "2"};
  r_mset(&b, mk, mv, 2);
  CHECK_EQ_INT(r_numkeys(&b), 6);
  expect_cas(&a, "/e", "", "v", "v");
  CHECK_EQ_INT(r_numkeys(&a), 7);
  expect_cas(&a, "/f", "x", "v", "x");
  CHECK_EQ_INT(r_numkeys(&a), 7);
  CHECK_EQ_INT(r_add(&b, "/g", 3), 3);
  CHECK_EQ_INT(r_numkeys(&a), 8);
  CHECK_EQ_INT(r_delete(&b, "/a"), 1);
  CHECK_EQ_INT(r_delete(&b, "/a"), 0);
  CHECK_EQ_INT(r_numkeys(&a), 7);
  r_set(&a, "", "", 0); /* the empty key is a key too */
  CHECK_EQ_INT(r_numkeys(&b), 8);
  WAIT_STAT(s, keys, 8);
  conn_close(&a);
  conn_close(&b);
  tdist_store_server_destroy(s);
  TEST_LOG("getnumkeys: counts init/, raw and prefixed keys");
}

/* Counting of §1.6: the server records each *missing* key once and counts down per key. */
static void test_wait_edges(tdist_store_server_t *s) {
  int port = tdist_store_server_port(s);
  conn_t w = conn_open(port, 1, "edge-waiter");
  conn_t o = conn_open(port, 0, "edge-setter(1.13)");
  uint64_t base = stats(s).waits_pending;
  int64_t keys0 = r_numkeys(&o);

  /* SET of the same key twice counts once */
  const char *ab[2] = {K("a"), K("b")};
  send_wait(&w, ab, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  CHECK_EQ_INT(r_numkeys(&o), keys0); /* keys that are only awaited are not keys */
  const char *a = ab[0];
  CHECK_EQ_INT(r_check(&o, &a, 1), 1);
  r_sets(&o, ab[0], "1");
  r_sets(&o, ab[0], "2");
  CHECK_EQ_INT(r_add(&o, ab[0], 0), 2);
  expect_silent(&w, 100, "WAIT [a,b] after a was written three times");
  r_sets(&o, ab[1], "3");
  expect_byte(&w, 0x00, "WAIT [a,b] after b");
  expect_ping(&w, 1);

  /* the same missing key twice in one WAIT: one SET completes it, with one reply */
  const char *cc[2] = {K("c"), K("c")};
  send_wait(&w, cc, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  r_sets(&o, cc[0], "x");
  expect_byte(&w, 0x00, "WAIT [c,c] after c");
  expect_ping(&w, 2); /* and no second 00 */

  /* a key that existed when the WAIT arrived is not awaited: deleting it changes nothing */
  const char *de[2] = {K("d"), K("e")};
  r_sets(&o, de[1], "exists");
  sync_conn(&o);
  send_wait(&w, de, 2);
  WAIT_STAT(s, waits_pending, base + 1);
  CHECK_EQ_INT(r_delete(&o, de[1]), 1);
  r_sets(&o, de[0], "now");
  expect_byte(&w, 0x00, "WAIT [d,e] after d (e deleted meanwhile)");
  WAIT_STAT(s, waits_pending, base);

  /* one SET wakes every waiter of the key */
  enum { NW = 50 };
  conn_t many[NW];
  const char *f = K("f");
  for (int i = 0; i < NW; i++) {
    many[i] = conn_open(port, i % 2, "many-waiters");
    send_wait(&many[i], &f, 1);
  }
  WAIT_STAT(s, waits_pending, base + NW);
  CHECK_EQ_INT(r_numkeys(&o), keys0 + 4); /* a, b, c, d (e was deleted); f is only awaited */
  r_sets(&o, f, "go");
  for (int i = 0; i < NW; i++) {
    expect_byte(&many[i], 0x00, "one of 50 waiters");
    conn_close(&many[i]);
  }
  WAIT_STAT(s, waits_pending, base);

  /* a value and a queue under the same name live side by side */
  const char *qk = K("qk");
  r_sets(&w, qk, "val");
  r_qpush(&w, qk, "item");
  expect_gets(&w, qk, "val");
  CHECK_EQ_INT(r_qlen(&w, qk), 1);
  expect_qpop(&w, qk, 1, "item");
  expect_gets(&w, qk, "val");
  conn_close(&w);
  conn_close(&o);
  TEST_LOG("wait edges: per-key counting, duplicates, 50 waiters, awaited keys are not keys");
}

int main(void) {
  test_rng_init("server_ops_test", 424242);
  /* SIGPIPE is deliberately left at its default: a server that writes to a departed peer without
   * MSG_NOSIGNAL would kill this process, and that is a bug worth seeing. */

  test_capture_replay();
  test_getnumkeys();

  tdist_store_server_t *s = start_server(NULL);
  int port = tdist_store_server_port(s);
  conn_t idle = conn_open(port, 0, "idle(1.13 callback)"); /* says nothing until the end */
  conn_t c13 = conn_open(port, 0, "main(1.13)");
  conn_t c2 = conn_open(port, 1, "main(2.x)");
  conn_t aux2 = conn_open(port, 1, "aux(2.x)");
  conn_t aux13 = conn_open(port, 0, "aux(1.13)");

  key_prefix = "d113";
  op_suite(s, &c13, &aux2, &aux13);
  TEST_LOG("ops on a 1.13 connection: ok");
  key_prefix = "d2";
  op_suite(s, &c2, &aux2, &aux13);
  TEST_LOG("ops on a 2.x connection: ok");
  /* what one dialect wrote, the other reads */
  key_prefix = "x";
  r_sets(&c13, K("from13"), "a");
  r_sets(&c2, K("from2"), "b");
  sync_conn(&c13);
  sync_conn(&c2);
  expect_gets(&c2, K("from13"), "a");
  expect_gets(&c13, K("from2"), "b");

  key_prefix = "q";
  test_queues(s);
  key_prefix = "edge";
  test_wait_edges(s);

  expect_idle_usable(&idle);
  expect_ping(&c2, 1);
  (void)r_numkeys(&c13);
  conn_close(&idle);
  conn_close(&c13);
  conn_close(&c2);
  conn_close(&aux2);
  conn_close(&aux13);
  tdist_store_server_destroy(s);
  TEST_LOG("server_ops_test: all passed");
  return 0;
}
