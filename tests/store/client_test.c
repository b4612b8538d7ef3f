/* Tests of the TCP store client against our own server, in one process, through the public API
 * of include/tdist/store.h only.
 *
 * A random sequence of every store call (binary values with NUL bytes, empty and multi-MiB values,
 * odd keys) runs in both dialects and each answer is compared with a model kept in this file.
 * Then the failure paths: wait/get timeouts and the calls right after them (a timeout must never
 * leave the connection out of step, including a wait released just at its deadline), connect
 * timeouts and backoff retries, a server that disappears under a waiting client, ADD on a
 * non-integer, a 2.x server without queue ops (PyTorch 2.6: refused, not hung), one handle per
 * thread, argument validation, status strings and the version.
 * Every blocking call carries a timeout and a global alarm turns any hang into a failure.
 * Set TDIST_TEST_SEED to replay a run; the seed is printed at start. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "tdist/tdist.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

#define CHECK_STATUS(expr, want, store)                                                          \
  do {                                                                                           \
    tdist_status_t got_ = (expr);                                                                \
    tdist_status_t want_ = (want);                                                               \
    if (got_ != want_) {                                                                         \
      const tdist_store_t *cs_ = (store);                                                        \
      fprintf(stderr, "%s:%d: %s returned %s, want %s; detail: %s\n", __FILE__, __LINE__, #expr, \
              tdist_status_name(got_), tdist_status_name(want_),                                 \
              cs_ ? tdist_store_last_error(cs_) : tdist_last_error());                           \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

/* Success must also clear the handle's detail ("Empty if the last call succeeded"). */
#define CHECK_SOK(expr, store)                            \
  do {                                                    \
    CHECK_STATUS(expr, TDIST_OK, store);                  \
    CHECK(tdist_store_last_error(store) != NULL);         \
    CHECK_EQ_INT(tdist_store_last_error(store)[0], '\0'); \
  } while (0)

static uint64_t rng_state;

static uint64_t rnd(void) {
  /* xorshift64*: good enough for test data, and replayable from the printed seed. */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t rnd_below(uint64_t n) { return n ? rnd() % n : 0; }

static void rnd_bytes(uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  CHECK(p != NULL);
  return p;
}

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

static const char *dialect_name(tdist_store_dialect_t d) {
  switch (d) {
    case TDIST_STORE_DIALECT_AUTO: return "AUTO";
    case TDIST_STORE_DIALECT_V2: return "V2";
    case TDIST_STORE_DIALECT_V1_13: return "V1_13";
  }
  return "?";
}

static tdist_store_server_t *start_server(void) {
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

static tdist_store_t *connect_store(int port, tdist_store_dialect_t dialect, int64_t timeout_ms) {
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

/* A port where nothing listens: bind an ephemeral one, read it back, close it. */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t al = sizeof a;
  CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

static void expect_get(tdist_store_t *s, const char *key, const void *want, size_t want_len) {
  void *v = NULL;
  size_t n = 12345;
  CHECK_SOK(tdist_store_get(s, key, &v, &n), s);
  CHECK_MEM_EQ(v, n, want, want_len);
  tdist_free(v);
}

static void expect_get_str(tdist_store_t *s, const char *key, const char *want) {
  expect_get(s, key, want, strlen(want));
}

static void expect_ready(tdist_store_t *s, const char *key, int want) {
  int ready = -1;
  const char *keys[1] = {key};
  CHECK_SOK(tdist_store_check(s, keys, 1, &ready), s);
  CHECK_EQ_INT(ready, want);
}

/* A timeout took about `want_ms`: not early, and not absurdly late (2 loaded cores, sanitizers). */
static void check_elapsed(int64_t elapsed, int64_t want_ms) {
  if (elapsed < want_ms - 20 || elapsed > want_ms + 2500) {
    fprintf(stderr, "elapsed %" PRId64 " ms, want about %" PRId64 " ms\n", elapsed, want_ms);
    exit(1);
  }
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
  CHECK_SOK(tdist_store_compare_set(s, sl->key, exp, elen, des, dlen, &out, &out_len), s);
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
  CHECK_SOK(tdist_store_multi_get(s, keys, n, vals, lens), s);
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
  CHECK_SOK(tdist_store_multi_set(s, keys, vals, lens, n), s);
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
  CHECK_SOK(tdist_store_check(s, keys, n, &ready), s);
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
  CHECK_SOK(tdist_store_wait(s, keys, n, 5000), s);
}

static void op_counter(tdist_store_t *s, model_t *m) {
  ctr_t *c = &m->ctrs[rnd_below(NCTRS)];
  uint64_t r = rnd_below(10);
  if (r < 6) {
    int64_t delta = (int64_t)rnd_below(2001) - 1000;
    if (rnd_below(20) == 0) delta = 0;
    int64_t res = 0, *resp = rnd_below(8) ? &res : NULL; /* result pointer may be NULL */
    CHECK_SOK(tdist_store_add(s, c->key, delta, resp), s);
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
    CHECK_SOK(tdist_store_delete_key(s, c->key, &del), s);
    CHECK_EQ_INT(del, c->present);
    c->present = 0;
  } else {
    /* A counter set by SET with decimal text keeps counting from there. */
    int64_t v = (int64_t)rnd_below(1000000) - 500000;
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, v);
    CHECK_SOK(tdist_store_set(s, c->key, text, strlen(text)), s);
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
    CHECK_STATUS(tdist_store_queue_push(s, q->key, &b, 1), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK(tdist_store_last_error(s)[0] != '\0');
    CHECK_STATUS(tdist_store_queue_pop(s, q->key, 0, &v, &n), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK_STATUS(tdist_store_queue_len(s, q->key, &len), TDIST_ERR_NOT_AVAILABLE, s);
    return;
  }
  if (r == 0 && q->count < 64) {
    size_t n = rnd_len() % 4096;
    uint8_t *v = rnd_value(n);
    CHECK_SOK(tdist_store_queue_push(s, q->key, v, n), s);
    q->items[(q->head + q->count) % 64] = v;
    q->lens[(q->head + q->count) % 64] = n;
    q->count++;
  } else if (r == 1) {
    void *v = NULL;
    size_t n = 0;
    if (q->count == 0) {
      CHECK_STATUS(tdist_store_queue_pop(s, q->key, 0, &v, &n), TDIST_ERR_NOT_FOUND, s);
      return;
    }
    CHECK_SOK(tdist_store_queue_pop(s, q->key, rnd_below(2) ? 0 : 2000, &v, &n), s);
    CHECK_MEM_EQ(v, n, q->items[q->head], q->lens[q->head]);
    tdist_free(v);
    free(q->items[q->head]);
    q->head = (q->head + 1) % 64;
    q->count--;
  } else {
    int64_t len = -1;
    CHECK_SOK(tdist_store_queue_len(s, q->key, &len), s);
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
        CHECK_SOK(tdist_store_set(s, sl->key, v, n), s);
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
        CHECK_SOK(tdist_store_delete_key(s, sl->key, rnd_below(4) ? &del : NULL), s);
        if (del != -1) CHECK_EQ_INT(del, sl->present);
        sl->present = 0;
        break;
      }
      case 6: {
        int64_t n = -1;
        CHECK_SOK(tdist_store_num_keys(s, &n), s);
        CHECK_EQ_INT(n, model_num_keys(&m));
        break;
      }
      case 7: op_compare_set(s, &m); break;
      case 8: op_counter(s, &m); break;
      case 9: {
        size_t n = rnd_len();
        uint8_t *v = rnd_value(n);
        if (v2) {
          CHECK_SOK(tdist_store_append(s, sl->key, v, n), s);
          size_t old = sl->present ? sl->len : 0;
          uint8_t *c = xmalloc(old + n);
          if (old) memcpy(c, sl->val, old);
          if (n) memcpy(c + old, v, n);
          slot_store(sl, c, old + n);
          free(c);
        } else {
          CHECK_STATUS(tdist_store_append(s, sl->key, v, n), TDIST_ERR_NOT_AVAILABLE, s);
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
  CHECK_SOK(tdist_store_num_keys(s, &n), s);
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
  CHECK_SOK(tdist_store_set(s, ka, a, a_len), s);
  expect_get(s, ka, a, a_len);
  /* CAS with a multi-MiB expected value that matches. */
  void *out = NULL;
  size_t out_len = 0;
  CHECK_SOK(tdist_store_compare_set(s, ka, a, a_len, b, b_len, &out, &out_len), s);
  CHECK_MEM_EQ(out, out_len, b, b_len);
  tdist_free(out);
  /* And one that does not (differs in the last byte only). */
  a[a_len - 1] ^= 0x5a;
  CHECK_SOK(tdist_store_compare_set(s, ka, a, a_len, c, c_len, &out, &out_len), s);
  CHECK_MEM_EQ(out, out_len, b, b_len);
  tdist_free(out);
  const char *keys[2] = {ka, kb};
  const void *vals[2] = {c, a};
  size_t lens[2] = {c_len, a_len};
  CHECK_SOK(tdist_store_multi_set(s, keys, vals, lens, 2), s);
  void *got[2] = {0};
  size_t got_len[2] = {0};
  CHECK_SOK(tdist_store_multi_get(s, keys, 2, got, got_len), s);
  CHECK_MEM_EQ(got[0], got_len[0], c, c_len);
  CHECK_MEM_EQ(got[1], got_len[1], a, a_len);
  tdist_free(got[0]);
  tdist_free(got[1]);
  if (v2) {
    CHECK_SOK(tdist_store_append(s, ka, b, b_len), s);
    uint8_t *cat = xmalloc(c_len + b_len);
    memcpy(cat, c, c_len);
    memcpy(cat + c_len, b, b_len);
    expect_get(s, ka, cat, c_len + b_len);
    free(cat);
    CHECK_SOK(tdist_store_queue_push(s, "big-q", a, a_len), s);
    void *v = NULL;
    size_t n = 0;
    CHECK_SOK(tdist_store_queue_pop(s, "big-q", 0, &v, &n), s);
    CHECK_MEM_EQ(v, n, a, a_len);
    tdist_free(v);
  }
  int del = 0;
  CHECK_SOK(tdist_store_delete_key(s, ka, &del), s);
  CHECK_EQ_INT(del, 1);
  CHECK_SOK(tdist_store_delete_key(s, kb, &del), s);
  CHECK_EQ_INT(del, 1);
  free(a);
  free(b);
  free(c);
  tdist_store_destroy(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Timeouts and the calls after them                                                           */
/* ------------------------------------------------------------------------------------------ */

/* After a timeout on `a`, the keys it waited for appear (a server that still held the wait would
 * now send a stray STOP_WAITING on a's connection); a's next answers must still be right. */
static void check_in_step(tdist_store_t *a, tdist_store_t *b, const char *tag) {
  char key[64], val[64];
  snprintf(key, sizeof key, "sentinel-%s-%" PRIu64, tag, rnd());
  snprintf(val, sizeof val, "v-%" PRIu64, rnd());
  CHECK_SOK(tdist_store_set(b, key, val, strlen(val)), b);
  expect_get_str(a, key, val);
  int64_t r = 0;
  CHECK_SOK(tdist_store_add(a, "in-step-ctr", 0, &r), a);
  int64_t r2 = 0;
  CHECK_SOK(tdist_store_add(b, "in-step-ctr", 7, &r2), b);
  CHECK_EQ_INT(r2, r + 7);
  CHECK_SOK(tdist_store_add(a, "in-step-ctr", 0, &r), a);
  CHECK_EQ_INT(r, r2);
  expect_ready(a, key, 1);
  int del = -1;
  CHECK_SOK(tdist_store_delete_key(a, key, &del), a);
  CHECK_EQ_INT(del, 1);
  expect_ready(b, key, 0);
}

static void test_wait_timeouts(int port, tdist_store_dialect_t dialect) {
  TEST_LOG("wait/get timeouts, dialect %s", dialect_name(dialect));
  tdist_store_t *a = connect_store(port, dialect, 20000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  char k1[64], k2[64], k3[64];
  snprintf(k1, sizeof k1, "missing-one-%s-%" PRIu64, dialect_name(dialect), rnd());
  snprintf(k2, sizeof k2, "missing-two-%s-%" PRIu64, dialect_name(dialect), rnd());
  snprintf(k3, sizeof k3, "present-%s-%" PRIu64, dialect_name(dialect), rnd());

  /* One missing key, explicit 200 ms. */
  const char *w1[1] = {k1};
  int64_t t0 = now_ms();
  CHECK_STATUS(tdist_store_wait(a, w1, 1, 200), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 200);
  if (!strstr(tdist_store_last_error(a), k1)) {
    fprintf(stderr, "last_error does not name %s: %s\n", k1, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_SOK(tdist_store_set(b, k1, "late", 4), b);
  check_in_step(a, b, "w1");
  expect_get_str(a, k1, "late");

  /* Several keys, one present: names the missing ones. */
  CHECK_SOK(tdist_store_set(b, k3, "here", 4), b);
  const char *w3[3] = {k3, k2, k1};
  CHECK_SOK(tdist_store_delete_key(b, k1, NULL), b);
  t0 = now_ms();
  CHECK_STATUS(tdist_store_wait(a, w3, 3, 200), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 200);
  if (!strstr(tdist_store_last_error(a), k1) || !strstr(tdist_store_last_error(a), k2)) {
    fprintf(stderr, "last_error does not name %s and %s: %s\n", k1, k2, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_SOK(tdist_store_set(b, k2, "2", 1), b);
  CHECK_SOK(tdist_store_set(b, k1, "1", 1), b);
  check_in_step(a, b, "w3");
  CHECK_SOK(tdist_store_wait(a, w3, 3, 1000), a);

  /* Negative timeout: the handle's. */
  CHECK_SOK(tdist_store_set_timeout(a, 250), a);
  CHECK_EQ_INT(tdist_store_timeout(a), 250);
  char k4[64];
  snprintf(k4, sizeof k4, "missing-four-%s-%" PRIu64, dialect_name(dialect), rnd());
  const char *w4[1] = {k4};
  t0 = now_ms();
  CHECK_STATUS(tdist_store_wait(a, w4, 1, -1), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  check_in_step(a, b, "w4");

  /* get of a missing key times out with the handle's timeout. */
  void *v = NULL;
  size_t n = 0;
  t0 = now_ms();
  CHECK_STATUS(tdist_store_get(a, k4, &v, &n), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  if (!strstr(tdist_store_last_error(a), k4)) {
    fprintf(stderr, "last_error does not name %s: %s\n", k4, tdist_store_last_error(a));
    exit(1);
  }
  CHECK_SOK(tdist_store_set(b, k4, "four", 4), b);
  check_in_step(a, b, "g4");
  expect_get_str(a, k4, "four");

  /* multi_get of a missing key likewise (emulated with WAIT + GETs on 1.13). */
  char k5[64];
  snprintf(k5, sizeof k5, "missing-five-%s-%" PRIu64, dialect_name(dialect), rnd());
  const char *w5[2] = {k4, k5};
  void *vals[2] = {0};
  size_t lens[2] = {0};
  t0 = now_ms();
  CHECK_STATUS(tdist_store_multi_get(a, w5, 2, vals, lens), TDIST_ERR_TIMEOUT, a);
  check_elapsed(now_ms() - t0, 250);
  CHECK_SOK(tdist_store_set(b, k5, "five", 4), b);
  check_in_step(a, b, "m5");
  CHECK_SOK(tdist_store_multi_get(a, w5, 2, vals, lens), a);
  CHECK_MEM_EQ(vals[0], lens[0], "four", 4);
  CHECK_MEM_EQ(vals[1], lens[1], "five", 4);
  tdist_free(vals[0]);
  tdist_free(vals[1]);

  /* A blocking pop on an empty queue (2.x only). */
  if (tdist_tcp_store_dialect(a) == TDIST_STORE_DIALECT_V2) {
    char q[64];
    snprintf(q, sizeof q, "empty-queue-%" PRIu64, rnd());
    t0 = now_ms();
    CHECK_STATUS(tdist_store_queue_pop(a, q, 200, &v, &n), TDIST_ERR_TIMEOUT, a);
    check_elapsed(now_ms() - t0, 200);
    t0 = now_ms();
    CHECK_STATUS(tdist_store_queue_pop(a, q, -1, &v, &n), TDIST_ERR_TIMEOUT, a);
    check_elapsed(now_ms() - t0, 250);
    CHECK_SOK(tdist_store_queue_push(b, q, "x", 1), b);
    check_in_step(a, b, "q");
    CHECK_SOK(tdist_store_queue_pop(a, q, 0, &v, &n), a);
    CHECK_MEM_EQ(v, n, "x", 1);
    tdist_free(v);
  }

  tdist_store_destroy(a);
  tdist_store_destroy(b);
}

typedef struct {
  tdist_store_t *s;
  const char *key;
  int64_t delay_ms;
  tdist_status_t st;
} setter_arg_t;

static void *delayed_set(void *p) {
  setter_arg_t *a = p;
  sleep_ms(a->delay_ms);
  a->st = tdist_store_set(a->s, a->key, "x", 1);
  return NULL;
}

/* The key is set right around the waiter's deadline, many times: whichever side wins, the
 * waiter's next answers are right. */
static void test_wait_race(int port, tdist_store_dialect_t dialect, int rounds) {
  TEST_LOG("wait released at its deadline, dialect %s, %d rounds", dialect_name(dialect), rounds);
  tdist_store_t *a = connect_store(port, dialect, 40);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  tdist_store_t *c = connect_store(port, TDIST_STORE_DIALECT_AUTO, 20000);
  int ok = 0, timed_out = 0;
  for (int i = 0; i < rounds; i++) {
    char key[64];
    snprintf(key, sizeof key, "race-%s-%d-%" PRIu64, dialect_name(dialect), i, rnd());
    setter_arg_t arg = {c, key, 30 + (int64_t)rnd_below(21), TDIST_ERR_INTERNAL};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, delayed_set, &arg) == 0);
    tdist_status_t st;
    if (i % 2 == 0) {
      const char *w[1] = {key};
      st = tdist_store_wait(a, w, 1, 40);
    } else {
      void *v = NULL;
      size_t n = 0;
      st = tdist_store_get(a, key, &v, &n); /* handle timeout 40 ms */
      if (st == TDIST_OK) CHECK_MEM_EQ(v, n, "x", 1);
      tdist_free(v);
    }
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_SOK(arg.st, c);
    if (st == TDIST_OK) {
      ok++;
    } else if (st == TDIST_ERR_TIMEOUT) {
      timed_out++;
    } else {
      fprintf(stderr, "round %d: %s: %s\n", i, tdist_status_name(st), tdist_store_last_error(a));
      exit(1);
    }
    CHECK_SOK(tdist_store_set_timeout(a, 20000), a);
    check_in_step(a, b, "race");
    expect_get_str(a, key, "x");
    CHECK_SOK(tdist_store_set_timeout(a, 40), a);
  }
  TEST_LOG("  %d released, %d timed out", ok, timed_out);
  tdist_store_destroy(a);
  tdist_store_destroy(b);
  tdist_store_destroy(c);
}

/* A wait released by another client before its deadline; the server reports it pending meanwhile.
 */
typedef struct {
  tdist_store_t *s;
  const char *key;
  tdist_status_t st;
  int64_t elapsed;
} waiter_arg_t;

static void *waiter(void *p) {
  waiter_arg_t *a = p;
  const char *w[1] = {a->key};
  int64_t t0 = now_ms();
  a->st = tdist_store_wait(a->s, w, 1, -1);
  a->elapsed = now_ms() - t0;
  return NULL;
}

static void test_wait_released(tdist_store_dialect_t dialect) {
  TEST_LOG("wait released by another client, dialect %s", dialect_name(dialect));
  tdist_store_server_t *srv = start_server();
  int port = tdist_store_server_port(srv);
  tdist_store_t *a = connect_store(port, dialect, 5000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  waiter_arg_t arg = {a, "released", TDIST_ERR_INTERNAL, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, waiter, &arg) == 0);
  tdist_store_server_stats_t st;
  int64_t deadline = now_ms() + 3000;
  do {
    sleep_ms(5);
    tdist_store_server_stats(srv, &st);
  } while (st.waits_pending != 1 && now_ms() < deadline);
  CHECK_EQ_INT(st.waits_pending, 1);
  CHECK_SOK(tdist_store_set(b, "released", "r", 1), b);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK_SOK(arg.st, a);
  CHECK(arg.elapsed < 4000);
  tdist_store_server_stats(srv, &st);
  CHECK_EQ_INT(st.waits_pending, 0);
  check_in_step(a, b, "released");
  tdist_store_destroy(a);
  tdist_store_destroy(b);
  /* Connections closed by clients are noticed by the server. */
  deadline = now_ms() + 3000;
  do {
    sleep_ms(5);
    tdist_store_server_stats(srv, &st);
  } while (st.connections_open != 0 && now_ms() < deadline);
  CHECK_EQ_INT(st.connections_open, 0);
  CHECK(st.connections_total >= 2);
  tdist_store_server_destroy(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* ADD on a non-integer                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void test_add_non_integer(int port, tdist_store_dialect_t dialect) {
  TEST_LOG("add on a non-integer, dialect %s", dialect_name(dialect));
  tdist_store_t *a = connect_store(port, dialect, 5000);
  tdist_store_t *b = connect_store(port, TDIST_STORE_DIALECT_AUTO, 5000);
  /* Unambiguous non-integers only ("12abc" would pass std::stoll on a PyTorch server). */
  const char *bad[] = {"hello", "", "\x01\x02", "-"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char key[64];
    snprintf(key, sizeof key, "not-int-%s-%zu", dialect_name(dialect), i);
    CHECK_SOK(tdist_store_set(b, key, bad[i], strlen(bad[i])), b);
    expect_ready(b, key, 1); /* SET has no reply: make sure it is applied before a's ADD */
    int64_t r = 424242;
    CHECK_STATUS(tdist_store_add(a, key, 1, &r), TDIST_ERR_INVALID_USAGE, a);
    CHECK(tdist_store_last_error(a)[0] != '\0');
    /* The handle works for the next call, and the value is unchanged. */
    expect_get_str(a, key, bad[i]);
    check_in_step(a, b, "add");
  }
  /* Signed decimal text works both ways. */
  CHECK_SOK(tdist_store_set(a, "int-text", "-17", 3), a);
  int64_t r = 0;
  CHECK_SOK(tdist_store_add(a, "int-text", 5, &r), a);
  CHECK_EQ_INT(r, -12);
  expect_get_str(b, "int-text", "-12");
  CHECK_SOK(tdist_store_add(b, "int-text", INT64_C(1000000000000), &r), b);
  CHECK_EQ_INT(r, INT64_C(999999999988));
  expect_get_str(a, "int-text", "999999999988");
  tdist_store_destroy(a);
  tdist_store_destroy(b);
}

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static void test_connect_nothing_listens(tdist_store_dialect_t dialect) {
  TEST_LOG("connect where nothing listens, dialect %s", dialect_name(dialect));
  int port = free_port();
  tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout_ms = 500;
  o.dialect = dialect;
  tdist_store_t *s = (tdist_store_t *)(uintptr_t)1;
  int64_t t0 = now_ms();
  CHECK_STATUS(tdist_tcp_store_connect(&o, &s), TDIST_ERR_TIMEOUT, NULL);
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
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  CHECK(listen(fd, 16) == 0);
  socklen_t al = sizeof a;
  CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
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
      CHECK_STATUS(st, TDIST_ERR_TIMEOUT, NULL);
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
    CHECK_STATUS(tdist_store_get(s, "k", &v, &n), TDIST_ERR_TIMEOUT, s);
    check_elapsed(now_ms() - t0, 300);
    int64_t nk = 0;
    t0 = now_ms();
    CHECK_STATUS(tdist_store_num_keys(s, &nk), TDIST_ERR_TIMEOUT, s);
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
  late_server_arg_t arg = {free_port(), 300, NULL, TDIST_ERR_INTERNAL};
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
  CHECK_SOK(tdist_store_set(s, "late", "ok", 2), s);
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
  CHECK_SOK(tdist_store_set(s, "before", "b", 1), s);
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
  CHECK_SOK(tdist_store_set_timeout(s, 500), s);
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
    CHECK_SOK(tdist_store_set(s, hosts[i], "h", 1), s);
    int64_t n = 0;
    CHECK_SOK(tdist_store_num_keys(s, &n), s);
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
  CHECK_STATUS(st, TDIST_ERR_NOT_AVAILABLE, s);
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
  CHECK_SOK(tdist_store_set(s, "k", "v", 1), s);
  int64_t n = -1;
  CHECK_SOK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 1);

  int64_t t0 = now_ms();
  expect_no_queues(s, tdist_store_queue_push(s, "q", "item", 4), t0);
  CHECK_SOK(tdist_store_num_keys(s, &n), s); /* the handle still works */
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
  CHECK_SOK(tdist_store_set(s, "k2", "v", 1), s);
  CHECK_SOK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 2);
  tdist_store_destroy(s);

  /* A fresh handle's first call is a blocking pop: refused at once, not after 3 s. */
  s = connect_store(q.port, TDIST_STORE_DIALECT_V2, 5000);
  t0 = now_ms();
  expect_no_queues(s, tdist_store_queue_pop(s, "q", 3000, &v, &vn), t0);
  CHECK_SOK(tdist_store_num_keys(s, &n), s);
  CHECK_EQ_INT(n, 2);
  CHECK_EQ_INT(__atomic_load_n(&q.queue_ops, __ATOMIC_SEQ_CST), 2);
  tdist_store_destroy(s);

  __atomic_store_n(&q.stop, 1, __ATOMIC_SEQ_CST);
  shutdown(q.lfd, SHUT_RDWR); /* wakes the accept() */
  pthread_join(q.th, NULL);
  close(q.lfd);
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
  CHECK_SOK(tdist_store_add(s, "shared-ctr", 0, &r), s);
  CHECK_EQ_INT(r, THREADS * THREAD_ITERS);
  tdist_store_destroy(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Invalid arguments                                                                           */
/* ------------------------------------------------------------------------------------------ */

#define CHECK_INVALID(expr, store)                                      \
  do {                                                                  \
    CHECK_STATUS(expr, TDIST_ERR_INVALID_ARGUMENT, store);              \
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
  CHECK_STATUS(tdist_store_set(NULL, "k", "x", 1), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_store_get(NULL, "k", &v, &n), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_store_num_keys(NULL, &i64), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_store_set_timeout(NULL, 10), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_memory_store_create(NULL), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_prefix_store_create(NULL, "p", &out), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_prefix_store_create(s, NULL, &out), TDIST_ERR_INVALID_ARGUMENT, NULL);
  CHECK_STATUS(tdist_prefix_store_create(s, "p", NULL), TDIST_ERR_INVALID_ARGUMENT, NULL);
  /* Empty lists are fine and need no pointers. */
  CHECK_SOK(tdist_store_wait(s, NULL, 0, 100), s);
  flag = -1;
  CHECK_SOK(tdist_store_check(s, NULL, 0, &flag), s);
  CHECK_EQ_INT(flag, 1);
  CHECK_SOK(tdist_store_multi_get(s, NULL, 0, NULL, NULL), s);
  CHECK_SOK(tdist_store_multi_set(s, NULL, NULL, NULL, 0), s);
  /* Empty values with a NULL pointer are fine too. */
  CHECK_SOK(tdist_store_set(s, "empty-null", NULL, 0), s);
  expect_get(s, "empty-null", "", 0);
  /* And after all that the handle still answers. */
  CHECK_SOK(tdist_store_set(s, "after-invalid", "ok", 2), s);
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

/* ------------------------------------------------------------------------------------------ */

int main(void) {
  /* Any hang fails the test instead of waiting for Bazel's timeout. */
  alarm(240);
  signal(SIGPIPE, SIG_IGN);
  const char *seed_env = getenv("TDIST_TEST_SEED");
  uint64_t seed =
      seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)getpid();
  TEST_LOG("seed %" PRIu64 " (TDIST_TEST_SEED to replay)", seed);
  rng_state = seed ? seed : 1;

  test_status_and_version();

  model_run(TDIST_STORE_DIALECT_AUTO, 600);
  model_run(TDIST_STORE_DIALECT_V2, 200);
  model_run(TDIST_STORE_DIALECT_V1_13, 500);

  tdist_store_server_t *srv = start_server();
  int port = tdist_store_server_port(srv);
  test_invalid_arguments(port);
  const tdist_store_dialect_t dialects[2] = {TDIST_STORE_DIALECT_AUTO, TDIST_STORE_DIALECT_V1_13};
  for (int d = 0; d < 2; d++) {
    test_big_values(port, dialects[d]);
    test_wait_timeouts(port, dialects[d]);
    test_wait_race(port, dialects[d], 40);
    test_wait_released(dialects[d]);
    test_add_non_integer(port, dialects[d]);
    test_connect_nothing_listens(dialects[d]);
    test_connect_before_server(dialects[d]);
    test_server_dies_mid_wait(dialects[d]);
  }
  test_silent_listener();
  test_server_without_queues();
  test_threads(port);
  test_dual_stack();
  tdist_store_server_destroy(srv);
  TEST_LOG("client_test: all passed");
  return 0;
}
