/* Tests of the TCP store client against our own server, in one process, through the public API
 * of include/tdist/store.h only: a random sequence of every store call (binary values with NUL
 * bytes, empty and multi-MiB values, odd keys) in both dialects, each answer compared with a
 * model kept in this file; explicit multi-MiB values; one handle per thread; argument validation;
 * status strings and the version. Every blocking call carries a timeout and an alarm turns any
 * hang into a failure. Set TDIST_TEST_SEED to replay a run; the seed is printed at start. */
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
#include "rng.h"
#include "tdist/tdist.h"

static uint8_t *rnd_value(size_t len) {
  uint8_t *p = xmalloc(len);
  rnd_bytes(p, len);
  /* Make sure NUL bytes are in there even for short values. */
  if (len > 2) p[len / 2] = 0;
  return p;
}

/* Mostly small values, some KiB, a few hundreds of KiB; the multi-MiB ones are explicit below. */
static size_t rnd_len(void) {
  uint64_t r = rnd_below(100);
  if (r < 10) return 0;
  if (r < 70) return 1 + rnd_below(64);
  if (r < 96) return 65 + rnd_below(8192);
  return 8193 + rnd_below(256 << 10);
}

/* ------------------------------------------------------------------------------------------ */
/* Status strings and version                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void test_status_and_version(void) {
  TEST_LOG("status strings and version");
  int count = 0;
#define CHECK_STATUS_ROW_(name, value, text)          \
  CHECK_EQ_INT(name, value);                          \
  CHECK(strcmp(tdist_strerror(name), text) == 0);     \
  CHECK(strcmp(tdist_status_name(name), #name) == 0); \
  count++;
  TDIST_STATUS_LIST(CHECK_STATUS_ROW_)
#undef CHECK_STATUS_ROW_
  CHECK_EQ_INT(count, 13);
  /* Every value has a distinct text and name. */
  const tdist_status_t all[] = {
#define LIST_ROW_(name, value, text) name,
      TDIST_STATUS_LIST(LIST_ROW_)
#undef LIST_ROW_
  };
  for (int i = 0; i < count; i++)
    for (int j = i + 1; j < count; j++) {
      CHECK(strcmp(tdist_strerror(all[i]), tdist_strerror(all[j])) != 0);
      CHECK(strcmp(tdist_status_name(all[i]), tdist_status_name(all[j])) != 0);
    }
  const int unknown[] = {1, 7, -13, -100, 12345, -2147483647};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    CHECK(strcmp(tdist_strerror((tdist_status_t)unknown[i]), "unknown status") == 0);
    CHECK(strcmp(tdist_status_name((tdist_status_t)unknown[i]), "TDIST_UNKNOWN") == 0);
  }
  CHECK(tdist_version() != NULL);
  CHECK(strcmp(tdist_version(), TDIST_VERSION_STRING) == 0);
  char buf[32];
  snprintf(buf, sizeof buf, "%d.%d.%d", TDIST_VERSION_MAJOR, TDIST_VERSION_MINOR,
           TDIST_VERSION_PATCH);
  CHECK(strcmp(buf, TDIST_VERSION_STRING) == 0);
  CHECK(tdist_last_error() != NULL);
  tdist_store_destroy(NULL);
  tdist_store_server_destroy(NULL);
  tdist_free(NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* Random operations against a model                                                           */
/* ------------------------------------------------------------------------------------------ */

#define NSLOTS 24
#define NCTRS 4
#define NQUEUES 3

typedef struct {
  char *key;
  uint8_t *val;
  size_t len;
  int present;
} slot_t;

typedef struct {
  char key[32];
  int64_t val;
  int present;
} ctr_t;

typedef struct {
  char key[32];
  uint8_t *items[64];
  size_t lens[64];
  size_t head, count;
} queue_t;

typedef struct {
  slot_t slots[NSLOTS];
  ctr_t ctrs[NCTRS];
  queue_t queues[NQUEUES];
} model_t;

/* Keys are C strings, so any byte but NUL: slashes, spaces, non-UTF-8, one of 3000 bytes, and
 * the empty key. A distinct "kNN-" head keeps them unique. */
static char *make_key(int i) {
  if (i == 0) return strdup("");
  size_t extra = i == 1 ? 3000 : rnd_below(24);
  char *k = xmalloc(8 + extra + 1);
  int n = snprintf(k, 8, "k%02d-", i);
  for (size_t j = 0; j < extra; j++) k[n + j] = (char)(1 + rnd_below(255));
  if (i == 2) k[n] = '/';
  k[n + extra] = '\0';
  return k;
}

static void model_init(model_t *m) {
  memset(m, 0, sizeof *m);
  for (int i = 0; i < NSLOTS; i++) m->slots[i].key = make_key(i);
  for (int i = 0; i < NCTRS; i++) snprintf(m->ctrs[i].key, sizeof m->ctrs[i].key, "ctr/%d", i);
  for (int i = 0; i < NQUEUES; i++)
    snprintf(m->queues[i].key, sizeof m->queues[i].key, "queue-%d", i);
}

static void model_free(model_t *m) {
  for (int i = 0; i < NSLOTS; i++) {
    free(m->slots[i].key);
    free(m->slots[i].val);
  }
  for (int i = 0; i < NQUEUES; i++)
    for (size_t j = 0; j < m->queues[i].count; j++)
      free(m->queues[i].items[(m->queues[i].head + j) % 64]);
}

static void slot_store(slot_t *sl, const uint8_t *v, size_t n) {
  uint8_t *c = xmalloc(n);
  if (n) memcpy(c, v, n);
  free(sl->val);
  sl->val = c;
  sl->len = n;
  sl->present = 1;
}

static int64_t model_num_keys(const model_t *m) {
  int64_t n = 0;
  for (int i = 0; i < NSLOTS; i++) n += m->slots[i].present;
  for (int i = 0; i < NCTRS; i++) n += m->ctrs[i].present;
  return n;
}

static int present_slot(const model_t *m) {
  int idx[NSLOTS], n = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (m->slots[i].present) idx[n++] = i;
  return n ? idx[rnd_below((uint64_t)n)] : -1;
}

static void op_compare_set(tdist_store_t *s, model_t *m) {
  slot_t *sl = &m->slots[rnd_below(NSLOTS)];
  size_t elen = 0, dlen = rnd_len();
  uint8_t *exp = NULL;
  /* Steer towards all four cases of the reference: absent+empty expected, absent+other
   * expected, present+matching, present+mismatching. */
  if (sl->present && rnd_below(2)) {
    elen = sl->len;
    exp = xmalloc(elen);
    if (elen) memcpy(exp, sl->val, elen);
  } else if (!sl->present && rnd_below(2)) {
    elen = 0;
    exp = xmalloc(1);
  } else {
    elen = 1 + rnd_below(40);
    exp = rnd_value(elen);
  }
  uint8_t *des = rnd_value(dlen);
  void *out = NULL;
  size_t out_len = 0;
  CHECK_STORE_OK(tdist_store_compare_set(s, sl->key, exp, elen, des, dlen, &out, &out_len), s);
  if (!sl->present) {
    if (elen == 0) {
      slot_store(sl, des, dlen);
      CHECK_MEM_EQ(out, out_len, des, dlen);
    } else {
      CHECK_MEM_EQ(out, out_len, exp, elen);
    }
  } else if (sl->len == elen && (elen == 0 || memcmp(sl->val, exp, elen) == 0)) {
    slot_store(sl, des, dlen);
    CHECK_MEM_EQ(out, out_len, des, dlen);
  } else {
    CHECK_MEM_EQ(out, out_len, sl->val, sl->len);
  }
  tdist_free(out);
  free(exp);
  free(des);
}

static void op_multi_get(tdist_store_t *s, model_t *m) {
  size_t n = rnd_below(6);
  const char *keys[6];
  int idx[6];
  for (size_t i = 0; i < n; i++) {
    idx[i] = present_slot(m);
    if (idx[i] < 0) return;
    keys[i] = m->slots[idx[i]].key;
  }
  void *vals[6] = {0};
  size_t lens[6] = {0};
  CHECK_STORE_OK(tdist_store_multi_get(s, keys, n, vals, lens), s);
  for (size_t i = 0; i < n; i++) {
    CHECK_MEM_EQ(vals[i], lens[i], m->slots[idx[i]].val, m->slots[idx[i]].len);
    tdist_free(vals[i]);
  }
}

static void op_multi_set(tdist_store_t *s, model_t *m) {
  size_t n = rnd_below(6);
  const char *keys[6];
  const void *vals[6];
  size_t lens[6];
  uint8_t *bufs[6];
  int idx[6];
  for (size_t i = 0; i < n; i++) {
    idx[i] = (int)rnd_below(NSLOTS); /* duplicates allowed: pairs apply in order */
    keys[i] = m->slots[idx[i]].key;
    lens[i] = rnd_len();
    bufs[i] = rnd_value(lens[i]);
    vals[i] = bufs[i];
  }
  CHECK_STORE_OK(tdist_store_multi_set(s, keys, vals, lens, n), s);
  for (size_t i = 0; i < n; i++) {
    slot_store(&m->slots[idx[i]], bufs[i], lens[i]);
    free(bufs[i]);
  }
}

static void op_check(tdist_store_t *s, model_t *m) {
  size_t n = 1 + rnd_below(4);
  const char *keys[4];
  int all = 1;
  for (size_t i = 0; i < n; i++) {
    slot_t *sl = &m->slots[rnd_below(NSLOTS)];
    keys[i] = sl->key;
    all &= sl->present;
  }
  int ready = -1;
  CHECK_STORE_OK(tdist_store_check(s, keys, n, &ready), s);
  CHECK_EQ_INT(ready, all);
}

static void op_wait_present(tdist_store_t *s, model_t *m) {
  size_t n = rnd_below(4);
  const char *keys[4];
  for (size_t i = 0; i < n; i++) {
    int k = present_slot(m);
    if (k < 0) return;
    keys[i] = m->slots[k].key;
  }
  CHECK_STORE_OK(tdist_store_wait(s, keys, n, 5000), s);
}

static void op_counter(tdist_store_t *s, model_t *m) {
  ctr_t *c = &m->ctrs[rnd_below(NCTRS)];
  uint64_t r = rnd_below(10);
  if (r < 6) {
    int64_t delta = (int64_t)rnd_below(2001) - 1000;
    if (rnd_below(20) == 0) delta = 0;
    int64_t res = 0, *resp = rnd_below(8) ? &res : NULL; /* result pointer may be NULL */
    CHECK_STORE_OK(tdist_store_add(s, c->key, delta, resp), s);
    c->val = (c->present ? c->val : 0) + delta;
    c->present = 1;
    if (resp) CHECK_EQ_INT(res, c->val);
  } else if (r < 8) {
    if (!c->present) return;
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, c->val); /* the stored form is decimal text */
    expect_get_str(s, c->key, text);
  } else if (r < 9) {
    int del = -1;
    CHECK_STORE_OK(tdist_store_delete_key(s, c->key, &del), s);
    CHECK_EQ_INT(del, c->present);
    c->present = 0;
  } else {
    /* A counter set by SET with decimal text keeps counting from there. */
    int64_t v = (int64_t)rnd_below(1000000) - 500000;
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, v);
    CHECK_STORE_OK(tdist_store_set(s, c->key, text, strlen(text)), s);
    c->val = v;
    c->present = 1;
  }
}

static void op_queue(tdist_store_t *s, model_t *m, int v2) {
  queue_t *q = &m->queues[rnd_below(NQUEUES)];
  uint64_t r = rnd_below(3);
  if (!v2) {
    /* 1.13 has no queue ops at all. */
    uint8_t b = 1;
    void *v = NULL;
    size_t n = 0;
    int64_t len = 0;
    CHECK_STORE_STATUS(tdist_store_queue_push(s, q->key, &b, 1), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK(tdist_store_last_error(s)[0] != '\0');
    CHECK_STORE_STATUS(tdist_store_queue_pop(s, q->key, 0, &v, &n), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK_STORE_STATUS(tdist_store_queue_len(s, q->key, &len), TDIST_ERR_NOT_AVAILABLE, s);
    return;
  }
  if (r == 0 && q->count < 64) {
    size_t n = rnd_len() % 4096;
    uint8_t *v = rnd_value(n);
    CHECK_STORE_OK(tdist_store_queue_push(s, q->key, v, n), s);
    q->items[(q->head + q->count) % 64] = v;
    q->lens[(q->head + q->count) % 64] = n;
    q->count++;
  } else if (r == 1) {
    void *v = NULL;
    size_t n = 0;
    if (q->count == 0) {
      CHECK_STORE_STATUS(tdist_store_queue_pop(s, q->key, 0, &v, &n), TDIST_ERR_NOT_FOUND, s);
      return;
    }
    CHECK_STORE_OK(tdist_store_queue_pop(s, q->key, rnd_below(2) ? 0 : 2000, &v, &n), s);
    CHECK_MEM_EQ(v, n, q->items[q->head], q->lens[q->head]);
    tdist_free(v);
    free(q->items[q->head]);
    q->head = (q->head + 1) % 64;
    q->count--;
  } else {
    int64_t len = -1;
    CHECK_STORE_OK(tdist_store_queue_len(s, q->key, &len), s);
    CHECK_EQ_INT(len, q->count);
  }
}

static void model_run(tdist_store_dialect_t dialect, int ops) {
  TEST_LOG("random model, dialect %s, %d ops", dialect_name(dialect), ops);
  tdist_store_server_t *srv = start_server();
  tdist_store_t *s = connect_store(tdist_store_server_port(srv), dialect, 20000);
  int v2 = tdist_tcp_store_dialect(s) == TDIST_STORE_DIALECT_V2;
  model_t m;
  model_init(&m);
  for (int i = 0; i < ops; i++) {
    uint64_t op = rnd_below(13);
    slot_t *sl = &m.slots[rnd_below(NSLOTS)];
    switch (op) {
      case 0:
      case 1: {
        size_t n = rnd_len();
        uint8_t *v = rnd_value(n);
        CHECK_STORE_OK(tdist_store_set(s, sl->key, v, n), s);
        slot_store(sl, v, n);
        free(v);
        break;
      }
      case 2: {
        int k = present_slot(&m);
        if (k >= 0) expect_get(s, m.slots[k].key, m.slots[k].val, m.slots[k].len);
        break;
      }
      case 3: op_check(s, &m); break;
      case 4: op_wait_present(s, &m); break;
      case 5: {
        int del = -1;
        CHECK_STORE_OK(tdist_store_delete_key(s, sl->key, rnd_below(4) ? &del : NULL), s);
        if (del != -1) CHECK_EQ_INT(del, sl->present);
        sl->present = 0;
        break;
      }
      case 6: {
        int64_t n = -1;
        CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
        CHECK_EQ_INT(n, model_num_keys(&m));
        break;
      }
      case 7: op_compare_set(s, &m); break;
      case 8: op_counter(s, &m); break;
      case 9: {
        size_t n = rnd_len();
        uint8_t *v = rnd_value(n);
        if (v2) {
          CHECK_STORE_OK(tdist_store_append(s, sl->key, v, n), s);
          size_t old = sl->present ? sl->len : 0;
          uint8_t *c = xmalloc(old + n);
          if (old) memcpy(c, sl->val, old);
          if (n) memcpy(c + old, v, n);
          slot_store(sl, c, old + n);
          free(c);
        } else {
          CHECK_STORE_STATUS(tdist_store_append(s, sl->key, v, n), TDIST_ERR_NOT_AVAILABLE, s);
          CHECK(tdist_store_last_error(s)[0] != '\0');
        }
        free(v);
        break;
      }
      case 10: op_multi_get(s, &m); break;
      case 11: op_multi_set(s, &m); break;
      case 12: op_queue(s, &m, v2); break;
    }
  }
  /* Final sweep: every slot as the model says. */
  for (int i = 0; i < NSLOTS; i++) {
    expect_ready(s, m.slots[i].key, m.slots[i].present);
    if (m.slots[i].present) expect_get(s, m.slots[i].key, m.slots[i].val, m.slots[i].len);
  }
  int64_t n = -1;
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, model_num_keys(&m));
  /* The server's own counters agree. Queues are not keys. */
  tdist_store_server_stats_t st;
  memset(&st, 0xff, sizeof st);
  tdist_store_server_stats(srv, &st);
  CHECK_EQ_INT(st.keys, model_num_keys(&m));
  CHECK(st.connections_total >= 1);
  CHECK(st.connections_open >= 1);
  CHECK(st.requests_total >= (uint64_t)ops / 2);
  CHECK_EQ_INT(st.waits_pending, 0);
  tdist_store_destroy(s);
  model_free(&m);
  tdist_store_server_destroy(srv);
}

/* Explicit multi-MiB values through every call that carries a value. */
static void test_big_values(int port, tdist_store_dialect_t dialect) {
  TEST_LOG("big values, dialect %s", dialect_name(dialect));
  tdist_store_t *s = connect_store(port, dialect, 30000);
  int v2 = tdist_tcp_store_dialect(s) == TDIST_STORE_DIALECT_V2;
  const size_t a_len = (5u << 20) + 3, b_len = 3u << 20, c_len = (2u << 20) + 1;
  uint8_t *a = rnd_value(a_len), *b = rnd_value(b_len), *c = rnd_value(c_len);
  char ka[32], kb[32];
  snprintf(ka, sizeof ka, "big-a-%s", dialect_name(dialect));
  snprintf(kb, sizeof kb, "big-b-%s", dialect_name(dialect));
  CHECK_STORE_OK(tdist_store_set(s, ka, a, a_len), s);
  expect_get(s, ka, a, a_len);
  /* CAS with a multi-MiB expected value that matches. */
  void *out = NULL;
  size_t out_len = 0;
  CHECK_STORE_OK(tdist_store_compare_set(s, ka, a, a_len, b, b_len, &out, &out_len), s);
  CHECK_MEM_EQ(out, out_len, b, b_len);
  tdist_free(out);
  /* And one that does not (differs in the last byte only). */
  a[a_len - 1] ^= 0x5a;
  CHECK_STORE_OK(tdist_store_compare_set(s, ka, a, a_len, c, c_len, &out, &out_len), s);
  CHECK_MEM_EQ(out, out_len, b, b_len);
  tdist_free(out);
  const char *keys[2] = {ka, kb};
  const void *vals[2] = {c, a};
  size_t lens[2] = {c_len, a_len};
  CHECK_STORE_OK(tdist_store_multi_set(s, keys, vals, lens, 2), s);
  void *got[2] = {0};
  size_t got_len[2] = {0};
  CHECK_STORE_OK(tdist_store_multi_get(s, keys, 2, got, got_len), s);
  CHECK_MEM_EQ(got[0], got_len[0], c, c_len);
  CHECK_MEM_EQ(got[1], got_len[1], a, a_len);
  tdist_free(got[0]);
  tdist_free(got[1]);
  if (v2) {
    CHECK_STORE_OK(tdist_store_append(s, ka, b, b_len), s);
    uint8_t *cat = xmalloc(c_len + b_len);
    memcpy(cat, c, c_len);
    memcpy(cat + c_len, b, b_len);
    expect_get(s, ka, cat, c_len + b_len);
    free(cat);
    CHECK_STORE_OK(tdist_store_queue_push(s, "big-q", a, a_len), s);
    void *v = NULL;
    size_t n = 0;
    CHECK_STORE_OK(tdist_store_queue_pop(s, "big-q", 0, &v, &n), s);
    CHECK_MEM_EQ(v, n, a, a_len);
    tdist_free(v);
  }
  int del = 0;
  CHECK_STORE_OK(tdist_store_delete_key(s, ka, &del), s);
  CHECK_EQ_INT(del, 1);
  CHECK_STORE_OK(tdist_store_delete_key(s, kb, &del), s);
  CHECK_EQ_INT(del, 1);
  free(a);
  free(b);
  free(c);
  tdist_store_destroy(s);
}

/* ------------------------------------------------------------------------------------------ */
/* One handle per thread                                                                       */
/* ------------------------------------------------------------------------------------------ */

#define THREADS 4
#define THREAD_ITERS 150

typedef struct {
  int port;
  int id;
  uint64_t seed;
  int failed;
} thread_arg_t;

static void *thread_body(void *p) {
  thread_arg_t *a = p;
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = a->port;
  o.timeout_ms = 20000;
  o.dialect = a->id % 2 ? TDIST_STORE_DIALECT_V1_13 : TDIST_STORE_DIALECT_AUTO;
  tdist_store_t *s = NULL;
  if (tdist_tcp_store_connect(&o, &s) != TDIST_OK) {
    a->failed = 1;
    return NULL;
  }
  uint64_t x = a->seed | 1;
  for (int i = 0; i < THREAD_ITERS && !a->failed; i++) {
    char key[64], val[64];
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    snprintf(key, sizeof key, "thread-%d-%d", a->id, i % 10);
    snprintf(val, sizeof val, "%d:%" PRIu64, a->id, x);
    int64_t r = 0;
    if (tdist_store_add(s, "shared-ctr", 1, &r) != TDIST_OK || r < 1) a->failed = 2;
    if (tdist_store_set(s, key, val, strlen(val)) != TDIST_OK) a->failed = 3;
    void *v = NULL;
    size_t n = 0;
    if (tdist_store_get(s, key, &v, &n) != TDIST_OK || n != strlen(val) || memcmp(v, val, n) != 0)
      a->failed = 4;
    tdist_free(v);
  }
  if (a->failed) fprintf(stderr, "thread %d: %s\n", a->id, tdist_store_last_error(s));
  tdist_store_destroy(s);
  return NULL;
}

static void test_threads(int port) {
  TEST_LOG("%d threads, one handle each", THREADS);
  pthread_t th[THREADS];
  thread_arg_t args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (thread_arg_t){port, i, rnd(), 0};
    CHECK(pthread_create(&th[i], NULL, thread_body, &args[i]) == 0);
  }
  for (int i = 0; i < THREADS; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK_EQ_INT(args[i].failed, 0);
  }
  tdist_store_t *s = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  int64_t r = 0;
  CHECK_STORE_OK(tdist_store_add(s, "shared-ctr", 0, &r), s);
  CHECK_EQ_INT(r, THREADS * THREAD_ITERS);
  tdist_store_destroy(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Invalid arguments                                                                           */
/* ------------------------------------------------------------------------------------------ */

#define CHECK_INVALID(expr, store)                                      \
  do {                                                                  \
    CHECK_STORE_STATUS(expr, TDIST_ERR_INVALID_ARGUMENT, store);        \
    const tdist_store_t *ci_ = (store);                                 \
    CHECK((ci_ ? tdist_store_last_error(ci_) : tdist_last_error())[0]); \
  } while (0)

static void test_invalid_arguments(int port) {
  TEST_LOG("invalid arguments");
  tdist_store_t *out = NULL;
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 2000;
  CHECK_INVALID(tdist_tcp_store_connect(NULL, &out), NULL);
  CHECK_INVALID(tdist_tcp_store_connect(&o, NULL), NULL);
  tdist_tcp_store_options_t bad = o;
  bad.host = NULL;
  CHECK_INVALID(tdist_tcp_store_connect(&bad, &out), NULL);
  CHECK(out == NULL);
  bad = o;
  bad.host = "";
  CHECK_INVALID(tdist_tcp_store_connect(&bad, &out), NULL);
  const int bad_ports[] = {0, -1, 65536, 1 << 20};
  for (size_t i = 0; i < 4; i++) {
    bad = o;
    bad.port = bad_ports[i];
    CHECK_INVALID(tdist_tcp_store_connect(&bad, &out), NULL);
    CHECK(out == NULL);
  }

  tdist_store_server_options_t so = TDIST_STORE_SERVER_OPTIONS_INIT;
  so.quiet = 1;
  tdist_store_server_t *srv = NULL;
  CHECK_INVALID(tdist_store_server_create(&so, NULL), NULL);
  so.port = -1;
  CHECK_INVALID(tdist_store_server_create(&so, &srv), NULL);
  so.port = 65536;
  CHECK_INVALID(tdist_store_server_create(&so, &srv), NULL);
  CHECK(srv == NULL);

  tdist_store_t *s = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  void *v = NULL;
  size_t n = 0;
  int64_t i64 = 0;
  int flag = 0;
  const char *keys[2] = {"a", NULL};
  const void *vals[2] = {"x", "y"};
  size_t lens[2] = {1, 1};
  void *outs[2];
  size_t out_lens[2];
  CHECK_INVALID(tdist_store_set(s, NULL, "x", 1), s);
  CHECK_INVALID(tdist_store_set(s, "k", NULL, 1), s);
  CHECK_INVALID(tdist_store_get(s, NULL, &v, &n), s);
  CHECK_INVALID(tdist_store_get(s, "k", NULL, &n), s);
  CHECK_INVALID(tdist_store_get(s, "k", &v, NULL), s);
  CHECK_INVALID(tdist_store_add(s, NULL, 1, &i64), s);
  CHECK_INVALID(tdist_store_compare_set(s, NULL, "", 0, "d", 1, &v, &n), s);
  CHECK_INVALID(tdist_store_compare_set(s, "k", "", 0, "d", 1, NULL, &n), s);
  CHECK_INVALID(tdist_store_compare_set(s, "k", "", 0, "d", 1, &v, NULL), s);
  CHECK_INVALID(tdist_store_compare_set(s, "k", NULL, 3, "d", 1, &v, &n), s);
  CHECK_INVALID(tdist_store_compare_set(s, "k", "", 0, NULL, 1, &v, &n), s);
  CHECK_INVALID(tdist_store_check(s, keys, 2, &flag), s);
  CHECK_INVALID(tdist_store_check(s, NULL, 1, &flag), s);
  CHECK_INVALID(tdist_store_check(s, keys, 1, NULL), s);
  CHECK_INVALID(tdist_store_wait(s, keys, 2, 100), s);
  CHECK_INVALID(tdist_store_wait(s, NULL, 1, 100), s);
  CHECK_INVALID(tdist_store_delete_key(s, NULL, &flag), s);
  CHECK_INVALID(tdist_store_num_keys(s, NULL), s);
  CHECK_INVALID(tdist_store_append(s, NULL, "x", 1), s);
  CHECK_INVALID(tdist_store_append(s, "k", NULL, 1), s);
  CHECK_INVALID(tdist_store_multi_get(s, keys, 2, outs, out_lens), s);
  CHECK_INVALID(tdist_store_multi_get(s, keys, 1, NULL, out_lens), s);
  CHECK_INVALID(tdist_store_multi_get(s, keys, 1, outs, NULL), s);
  CHECK_INVALID(tdist_store_multi_set(s, keys, vals, lens, 2), s);
  CHECK_INVALID(tdist_store_multi_set(s, NULL, vals, lens, 1), s);
  CHECK_INVALID(tdist_store_multi_set(s, keys, NULL, lens, 1), s);
  CHECK_INVALID(tdist_store_multi_set(s, keys, vals, NULL, 1), s);
  CHECK_INVALID(tdist_store_queue_push(s, NULL, "x", 1), s);
  CHECK_INVALID(tdist_store_queue_push(s, "q", NULL, 1), s);
  CHECK_INVALID(tdist_store_queue_pop(s, NULL, 0, &v, &n), s);
  CHECK_INVALID(tdist_store_queue_pop(s, "q", 0, NULL, &n), s);
  CHECK_INVALID(tdist_store_queue_pop(s, "q", 0, &v, NULL), s);
  CHECK_INVALID(tdist_store_queue_len(s, NULL, &i64), s);
  CHECK_INVALID(tdist_store_queue_len(s, "q", NULL), s);
  CHECK_INVALID(tdist_store_set_timeout(s, 0), s);
  CHECK_INVALID(tdist_store_set_timeout(s, -5), s);
  CHECK_EQ_INT(tdist_store_timeout(s), 5000);
  /* NULL handles. */
  CHECK_STORE_STATUS(tdist_store_set(NULL, "k", "x", 1), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_store_get(NULL, "k", &v, &n), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_store_num_keys(NULL, &i64), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_store_set_timeout(NULL, 10), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_memory_store_create(NULL), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_prefix_store_create(NULL, "p", &out), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_prefix_store_create(s, NULL, &out), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STORE_STATUS(tdist_prefix_store_create(s, "p", NULL), TDIST_ERR_INVALID_ARGUMENT, NULL);
  /* Empty lists are fine and need no pointers. */
  CHECK_STORE_OK(tdist_store_wait(s, NULL, 0, 100), s);
  flag = -1;
  CHECK_STORE_OK(tdist_store_check(s, NULL, 0, &flag), s);
  CHECK_EQ_INT(flag, 1);
  CHECK_STORE_OK(tdist_store_multi_get(s, NULL, 0, NULL, NULL), s);
  CHECK_STORE_OK(tdist_store_multi_set(s, NULL, NULL, NULL, 0), s);
  /* Empty values with a NULL pointer are fine too. */
  CHECK_STORE_OK(tdist_store_set(s, "empty-null", NULL, 0), s);
  expect_get(s, "empty-null", "", 0);
  /* And after all that the handle still answers. */
  CHECK_STORE_OK(tdist_store_set(s, "after-invalid", "ok", 2), s);
  expect_get_str(s, "after-invalid", "ok");
  /* A TCP store reports its dialect, others AUTO. */
  tdist_store_t *mem = NULL;
  CHECK_OK(tdist_memory_store_create(&mem));
  CHECK_EQ_INT(tdist_tcp_store_dialect(mem), TDIST_STORE_DIALECT_AUTO);
  tdist_store_t *pre = NULL;
  CHECK_OK(tdist_prefix_store_create(s, "p", &pre));
  CHECK_EQ_INT(tdist_tcp_store_dialect(pre), TDIST_STORE_DIALECT_AUTO);
  tdist_store_destroy(pre);
  tdist_store_destroy(mem);
  tdist_store_destroy(s);
}

int main(void) {
  /* Any hang fails the test instead of waiting for Bazel's timeout. */
  alarm(240);
  signal(SIGPIPE, SIG_IGN);
  test_rng_init("client_model_test", 0); /* a fresh seed each run, printed */

  test_status_and_version();

  model_run(TDIST_STORE_DIALECT_AUTO, 600);
  model_run(TDIST_STORE_DIALECT_V2, 200);
  model_run(TDIST_STORE_DIALECT_V1_13, 500);

  tdist_store_server_t *srv = start_server();
  int port = tdist_store_server_port(srv);
  test_invalid_arguments(port);
  const tdist_store_dialect_t dialects[2] = {TDIST_STORE_DIALECT_AUTO, TDIST_STORE_DIALECT_V1_13};
  for (int d = 0; d < 2; d++) test_big_values(port, dialects[d]);
  test_threads(port);
  tdist_store_server_destroy(srv);
  TEST_LOG("client_model_test: all passed");
  return 0;
}
