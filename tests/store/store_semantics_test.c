/* Table-driven semantic checks of the store API, run unchanged against every kind of store: the
 * in-memory store, a TCP client of our server (2.x and 1.13 dialects), each of them wrapped in a
 * prefix store, and a prefix store nested in another.
 *
 * The expected answers come from PyTorch's semantics (torch-contracts.md §1.5, §1.6, §1.9):
 * compare_set's four cases, ADD on decimal text, num_keys over the whole store, delete, check,
 * wait (woken by SET, ADD, APPEND and MULTI_SET from another thread), multi_get/multi_set,
 * append, and queues (FIFO, pop timeout 0 = NOT_FOUND, a push wakes one blocked pop). Through a
 * prefix store every key must land at "prefix/key" of the inner store, which is checked by
 * reading it back through an unprefixed handle; for TCP that handle is a second connection, so
 * both sides put the same "/" in front and the server holds "/prefix/key". Last, several
 * threads hammer one memory store and the totals must be exact.
 * Every blocking call has a timeout, and a global alarm turns any hang into a failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "tdist/tdist.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A byte string literal with its length, NUL bytes included. */
#define B(lit) lit, (sizeof(lit) - 1)

static void check_elapsed(int64_t elapsed, int64_t lo, int64_t hi) {
  if (elapsed < lo || elapsed > hi) {
    fprintf(stderr, "[%s] elapsed %" PRId64 " ms, want %" PRId64 "..%" PRId64 "\n", test_case_name,
            elapsed, lo, hi);
    exit(1);
  }
}

static void expect_get(tdist_store_t *s, const char *key, const void *want, size_t want_len) {
  void *v = NULL;
  size_t n = 999;
  CHECK_STORE_OK(tdist_store_get(s, key, &v, &n), s);
  if (n != want_len || (n && memcmp(v, want, n) != 0)) {
    fprintf(stderr, "[%s] get(%s): got %zu bytes \"%.*s\", want %zu bytes \"%.*s\"\n",
            test_case_name, key, n, (int)(n > 64 ? 64 : n), (const char *)v, want_len,
            (int)(want_len > 64 ? 64 : want_len), (const char *)want);
    exit(1);
  }
  tdist_free(v);
}

static void expect_get_str(tdist_store_t *s, const char *key, const char *want) {
  expect_get(s, key, want, strlen(want));
}

static int exists(tdist_store_t *s, const char *key) {
  int ready = -1;
  const char *keys[1] = {key};
  CHECK_STORE_OK(tdist_store_check(s, keys, 1, &ready), s);
  CHECK(ready == 0 || ready == 1);
  return ready;
}

static int64_t num_keys(tdist_store_t *s) {
  int64_t n = -1;
  CHECK_STORE_OK(tdist_store_num_keys(s, &n), s);
  CHECK(n >= 0);
  return n;
}

/* ------------------------------------------------------------------------------------------ */
/* The stores under test                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum { BACKEND_MEMORY, BACKEND_TCP_AUTO, BACKEND_TCP_V1_13 } backend_t;

typedef struct {
  const char *name;
  backend_t backend;
  int nprefix;
  const char *prefixes[2]; /* [0] wraps the base store, [1] wraps [0] */
} case_desc_t;

static const case_desc_t cases[] = {
    {"memory", BACKEND_MEMORY, 0, {NULL, NULL}},
    {"tcp", BACKEND_TCP_AUTO, 0, {NULL, NULL}},
    {"tcp-1.13", BACKEND_TCP_V1_13, 0, {NULL, NULL}},
    {"prefix(memory)", BACKEND_MEMORY, 1, {"pfx", NULL}},
    {"prefix(tcp)", BACKEND_TCP_AUTO, 1, {"pfx", NULL}},
    {"prefix(tcp-1.13)", BACKEND_TCP_V1_13, 1, {"pfx", NULL}},
    {"prefix(prefix(memory))", BACKEND_MEMORY, 2, {"outer", "in ner"}},
    {"prefix(prefix(tcp))", BACKEND_TCP_AUTO, 2, {"outer", "in ner"}},
};

typedef struct {
  const case_desc_t *d;
  tdist_store_t *mem; /* memory backend: one store shared by every view */
  tdist_store_server_t *srv;
  int port;
  char full_prefix[64]; /* what the base store sees in front of a key: "" or "outer/in ner/" */
  int v2;               /* append and queues available */
} backend_ctx_t;

/* A handle onto the backend: a base store (shared memory store or a fresh TCP connection),
 * wrapped in the case's prefix stores when `prefixed`. One view per thread. */
typedef struct {
  tdist_store_t *layers[3];
  int n;
  int owns_base;
  tdist_store_t *top;
} view_t;

static view_t open_view(backend_ctx_t *c, int prefixed) {
  view_t v;
  memset(&v, 0, sizeof v);
  if (c->d->backend == BACKEND_MEMORY) {
    v.layers[0] = c->mem;
  } else {
    tdist_tcp_store_options_t o = TDIST_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = c->port;
    o.connect_timeout_ms = 10000;
    o.timeout_ms = 10000;
    o.dialect =
        c->d->backend == BACKEND_TCP_V1_13 ? TDIST_STORE_DIALECT_V1_13 : TDIST_STORE_DIALECT_AUTO;
    CHECK_OK(tdist_tcp_store_connect(&o, &v.layers[0]));
    CHECK_EQ_INT(tdist_tcp_store_dialect(v.layers[0]), c->d->backend == BACKEND_TCP_V1_13
                                                           ? TDIST_STORE_DIALECT_V1_13
                                                           : TDIST_STORE_DIALECT_V2);
    v.owns_base = 1;
  }
  v.n = 1;
  if (prefixed)
    for (int i = 0; i < c->d->nprefix; i++) {
      CHECK_OK(tdist_prefix_store_create(v.layers[v.n - 1], c->d->prefixes[i], &v.layers[v.n]));
      CHECK_EQ_INT(tdist_tcp_store_dialect(v.layers[v.n]), TDIST_STORE_DIALECT_AUTO);
      v.n++;
    }
  v.top = v.layers[v.n - 1];
  return v;
}

static void close_view(view_t *v) {
  for (int i = v->n - 1; i >= 1; i--) tdist_store_destroy(v->layers[i]);
  if (v->owns_base) tdist_store_destroy(v->layers[0]);
  memset(v, 0, sizeof *v);
}

static void backend_open(backend_ctx_t *c, const case_desc_t *d) {
  memset(c, 0, sizeof *c);
  c->d = d;
  if (d->backend == BACKEND_MEMORY) {
    CHECK_OK(tdist_memory_store_create(&c->mem));
    CHECK_EQ_INT(tdist_tcp_store_dialect(c->mem), TDIST_STORE_DIALECT_AUTO);
  } else {
    tdist_store_server_options_t o = TDIST_STORE_SERVER_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.quiet = 1;
    CHECK_OK(tdist_store_server_create(&o, &c->srv));
    c->port = tdist_store_server_port(c->srv);
  }
  c->v2 = d->backend != BACKEND_TCP_V1_13;
  /* PyTorch's PrefixStore joins with "/"; nesting applies the inner wrapper's prefix last. */
  for (int i = 0; i < d->nprefix; i++) {
    strcat(c->full_prefix, d->prefixes[i]);
    strcat(c->full_prefix, "/");
  }
}

static void backend_close(backend_ctx_t *c) {
  tdist_store_destroy(c->mem);
  tdist_store_server_destroy(c->srv);
}

/* The base store's name for a key given to the top of a prefixed view. */
static const char *raw_key(const backend_ctx_t *c, const char *key) {
  static char buf[4][256];
  static int next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "%s%s", c->full_prefix, key);
  return b;
}

/* ------------------------------------------------------------------------------------------ */
/* Work done by another thread (each with its own view)                                        */
/* ------------------------------------------------------------------------------------------ */

typedef enum { ACT_SET, ACT_ADD, ACT_APPEND, ACT_MULTI_SET, ACT_PUSH, ACT_POP, ACT_WAIT } act_t;

typedef struct {
  tdist_store_t *s;
  act_t act;
  const char *key;
  const char *key2; /* MULTI_SET: second key */
  const char *val;
  int64_t delay_ms;
  int64_t timeout_ms; /* POP, WAIT */
  tdist_status_t st;
  void *out;
  size_t out_len;
  int64_t elapsed;
  int done;
  pthread_t th;
} job_t;

static void *job_run(void *p) {
  job_t *j = p;
  sleep_ms(j->delay_ms);
  int64_t t0 = now_ms();
  size_t len = j->val ? strlen(j->val) : 0;
  switch (j->act) {
    case ACT_SET: j->st = tdist_store_set(j->s, j->key, j->val, len); break;
    case ACT_ADD: j->st = tdist_store_add(j->s, j->key, 1, NULL); break;
    case ACT_APPEND: j->st = tdist_store_append(j->s, j->key, j->val, len); break;
    case ACT_MULTI_SET: {
      const char *keys[2] = {j->key, j->key2};
      const void *vals[2] = {j->val, j->val};
      size_t lens[2] = {len, len};
      j->st = tdist_store_multi_set(j->s, keys, vals, lens, 2);
      break;
    }
    case ACT_PUSH: j->st = tdist_store_queue_push(j->s, j->key, j->val, len); break;
    case ACT_POP:
      j->st = tdist_store_queue_pop(j->s, j->key, j->timeout_ms, &j->out, &j->out_len);
      break;
    case ACT_WAIT: {
      const char *keys[1] = {j->key};
      j->st = tdist_store_wait(j->s, keys, 1, j->timeout_ms);
      break;
    }
  }
  j->elapsed = now_ms() - t0;
  __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
  return NULL;
}

static void job_start(job_t *j) {
  j->st = TDIST_ERR_INTERNAL;
  j->done = 0;
  CHECK(pthread_create(&j->th, NULL, job_run, j) == 0);
}

static void job_join(job_t *j) { CHECK(pthread_join(j->th, NULL) == 0); }

static int job_done(job_t *j) { return __atomic_load_n(&j->done, __ATOMIC_ACQUIRE); }

/* ------------------------------------------------------------------------------------------ */
/* Semantic checks                                                                             */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
  const char *what;
  int present; /* key exists before the call */
  const char *initial;
  size_t initial_len;
  const char *expected;
  size_t expected_len;
  const char *desired;
  size_t desired_len;
  const char *reply; /* what compare_set returns */
  size_t reply_len;
  int stored;        /* key exists afterwards */
  const char *after; /* its value afterwards */
  size_t after_len;
} cas_row_t;

/* Reference §1.5, including the captured 1.13 answers ("new", "newer", "abc"). */
static const cas_row_t cas_rows[] = {
    {"absent, expected empty: stores desired", 0, B(""), B(""), B("new"), B("new"), 1, B("new")},
    {"absent, expected non-empty: replies expected, stores nothing", 0, B(""), B("abc"), B("new"),
     B("abc"), 0, B("")},
    {"present, expected differs: replies current", 1, B("new"), B("wrong"), B("x"), B("new"), 1,
     B("new")},
    {"present, expected matches: replaces", 1, B("new"), B("new"), B("newer"), B("newer"), 1,
     B("newer")},
    {"present empty, expected empty: replaces", 1, B(""), B(""), B("e"), B("e"), 1, B("e")},
    {"binary with NULs, matches", 1, B("a\0b\0"), B("a\0b\0"), B("\0\0\xff"), B("\0\0\xff"), 1,
     B("\0\0\xff")},
    {"binary differs after a NUL", 1, B("a\0b"), B("a\0c"), B("z"), B("a\0b"), 1, B("a\0b")},
    {"present, desired empty", 1, B("v"), B("v"), B(""), B(""), 1, B("")},
    {"prefix of current is not equal", 1, B("abc"), B("ab"), B("z"), B("abc"), 1, B("abc")},
};

static void check_cas(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  for (size_t i = 0; i < sizeof cas_rows / sizeof cas_rows[0]; i++) {
    const cas_row_t *r = &cas_rows[i];
    char key[32];
    snprintf(key, sizeof key, "cas-%zu", i);
    if (r->present) CHECK_STORE_OK(tdist_store_set(s, key, r->initial, r->initial_len), s);
    int64_t n0 = num_keys(s);
    void *out = NULL;
    size_t out_len = 0;
    CHECK_STORE_OK(tdist_store_compare_set(s, key, r->expected, r->expected_len, r->desired,
                                           r->desired_len, &out, &out_len),
                   s);
    if (out_len != r->reply_len || (out_len && memcmp(out, r->reply, out_len) != 0)) {
      fprintf(stderr, "[%s] CAS row \"%s\": reply of %zu bytes, want %zu\n", test_case_name,
              r->what, out_len, r->reply_len);
      exit(1);
    }
    tdist_free(out);
    CHECK_EQ_INT(exists(s, key), r->stored);
    CHECK_EQ_INT(num_keys(s), n0 + (r->stored && !r->present));
    if (r->stored) {
      expect_get(s, key, r->after, r->after_len);
      expect_get(raw, raw_key(c, key), r->after, r->after_len);
    }
    CHECK_EQ_INT(exists(raw, raw_key(c, key)), r->stored);
  }
}

typedef struct {
  const char *initial; /* NULL: key missing */
  int64_t delta;
  int64_t result;
  const char *text;
} add_row_t;

static const add_row_t add_rows[] = {
    {NULL, 5, 5, "5"},
    {NULL, -3, -3, "-3"},
    {NULL, 0, 0, "0"},
    {"10", 0, 10, "10"},
    {"-17", 5, -12, "-12"},
    {"0", -1, -1, "-1"},
    {"41", 1, 42, "42"},
    {"9223372036854775806", 1, INT64_MAX, "9223372036854775807"},
    {"-9223372036854775807", -1, INT64_MIN, "-9223372036854775808"},
    {"1000000", -1000000, 0, "0"},
};

static void check_add(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  for (size_t i = 0; i < sizeof add_rows / sizeof add_rows[0]; i++) {
    const add_row_t *r = &add_rows[i];
    char key[32];
    snprintf(key, sizeof key, "add-%zu", i);
    if (r->initial) CHECK_STORE_OK(tdist_store_set(s, key, r->initial, strlen(r->initial)), s);
    int64_t n0 = num_keys(s), res = 0;
    CHECK_STORE_OK(tdist_store_add(s, key, r->delta, &res), s);
    CHECK_EQ_INT(res, r->result);
    CHECK_EQ_INT(num_keys(s), n0 + (r->initial == NULL));
    expect_get_str(s, key, r->text);
    expect_get_str(raw, raw_key(c, key), r->text);
  }
  /* Running total, result pointer optional. */
  int64_t total = 0;
  for (int i = 1; i <= 20; i++) {
    int64_t res = 0;
    CHECK_STORE_OK(tdist_store_add(s, "add-run", i * (i % 2 ? 1 : -3), i % 3 ? &res : NULL), s);
    total += i * (i % 2 ? 1 : -3);
    if (i % 3) CHECK_EQ_INT(res, total);
  }
  char text[32];
  snprintf(text, sizeof text, "%" PRId64, total);
  expect_get_str(s, "add-run", text);
  /* Values that are not integers: INVALID_USAGE, unchanged, and the handle keeps working. */
  const char *bad[] = {"abc", "", "x12", " "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char key[32];
    snprintf(key, sizeof key, "add-bad-%zu", i);
    CHECK_STORE_OK(tdist_store_set(s, key, bad[i], strlen(bad[i])), s);
    int64_t res = 77;
    CHECK_STORE_STATUS(tdist_store_add(s, key, 1, &res), TDIST_ERR_INVALID_USAGE, s);
    CHECK(tdist_store_last_error(s)[0] != '\0');
    expect_get_str(s, key, bad[i]);
    CHECK_STORE_OK(tdist_store_add(s, "add-run", 0, &res), s);
    CHECK_EQ_INT(res, total);
  }
}

static void check_num_keys_and_delete(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  int64_t n0 = num_keys(s);
  CHECK_EQ_INT(num_keys(raw), n0); /* the whole store, whatever the prefix */
  CHECK_STORE_OK(tdist_store_set(s, "nk-a", B("1")), s);
  CHECK_STORE_OK(tdist_store_set(s, "nk-b", B("")), s);
  CHECK_STORE_OK(tdist_store_set(s, "nk-c", B("\0")), s);
  CHECK_EQ_INT(num_keys(s), n0 + 3);
  CHECK_STORE_OK(tdist_store_set(s, "nk-a", B("2")), s); /* overwrite: no new key */
  CHECK_EQ_INT(num_keys(s), n0 + 3);
  /* A key outside the prefix counts too. SET has no reply, so ask `raw` first: its answer
   * means the server has applied the SET before `s` (maybe another connection) asks. */
  CHECK_STORE_OK(tdist_store_set(raw, "nk-outside", B("o")), raw);
  CHECK_EQ_INT(num_keys(raw), n0 + 4);
  CHECK_EQ_INT(num_keys(s), n0 + 4);

  int del = -1;
  CHECK_STORE_OK(tdist_store_delete_key(s, "nk-b", &del), s);
  CHECK_EQ_INT(del, 1);
  CHECK_EQ_INT(exists(s, "nk-b"), 0);
  CHECK_EQ_INT(exists(raw, raw_key(c, "nk-b")), 0);
  CHECK_EQ_INT(num_keys(s), n0 + 3);
  del = -1;
  CHECK_STORE_OK(tdist_store_delete_key(s, "nk-b", &del), s);
  CHECK_EQ_INT(del, 0);
  del = -1;
  CHECK_STORE_OK(tdist_store_delete_key(s, "nk-never", &del), s);
  CHECK_EQ_INT(del, 0);
  CHECK_STORE_OK(tdist_store_delete_key(s, "nk-c", NULL), s);
  CHECK_EQ_INT(exists(s, "nk-c"), 0);
  CHECK_EQ_INT(num_keys(s), n0 + 2);
  expect_get_str(s, "nk-a", "2");
  /* Through the raw handle: deleting "prefix/key" is what the prefixed delete does. */
  CHECK_STORE_OK(tdist_store_delete_key(raw, raw_key(c, "nk-a"), &del), raw);
  CHECK_EQ_INT(del, 1);
  CHECK_EQ_INT(exists(s, "nk-a"), 0);
  if (c->full_prefix[0]) {
    /* A prefixed delete of "nk-outside" must not touch the unprefixed key. */
    CHECK_STORE_OK(tdist_store_delete_key(s, "nk-outside", &del), s);
    CHECK_EQ_INT(del, 0);
    CHECK_EQ_INT(exists(raw, "nk-outside"), 1);
  }
  CHECK_STORE_OK(tdist_store_delete_key(raw, "nk-outside", &del), raw);
  CHECK_EQ_INT(del, 1);
  CHECK_EQ_INT(num_keys(s), n0);
  /* A deleted key can come back. */
  CHECK_STORE_OK(tdist_store_set(s, "nk-b", B("again")), s);
  expect_get_str(s, "nk-b", "again");
  CHECK_STORE_OK(tdist_store_delete_key(s, "nk-b", NULL), s);
}

static void check_check(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  CHECK_STORE_OK(tdist_store_set(s, "chk-1", B("")), s);
  CHECK_STORE_OK(tdist_store_set(s, "chk-2", B("x")), s);
  static const struct {
    int n;
    const char *keys[4];
    int ready;
  } rows[] = {
      {0, {NULL}, 1},
      {1, {"chk-1"}, 1},
      {2, {"chk-1", "chk-2"}, 1},
      {3, {"chk-2", "chk-1", "chk-2"}, 1},
      {1, {"chk-missing"}, 0},
      {3, {"chk-1", "chk-missing", "chk-2"}, 0},
      {2, {"chk-2", "chk-missing"}, 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    int ready = -1;
    CHECK_STORE_OK(tdist_store_check(s, rows[i].keys, (size_t)rows[i].n, &ready), s);
    CHECK_EQ_INT(ready, rows[i].ready);
  }
  if (c->full_prefix[0]) {
    /* An unprefixed key of the same name is invisible through the prefix. */
    CHECK_STORE_OK(tdist_store_set(raw, "chk-raw-only", B("r")), raw);
    CHECK_EQ_INT(exists(s, "chk-raw-only"), 0);
    CHECK_EQ_INT(exists(raw, raw_key(c, "chk-1")), 1);
    CHECK_EQ_INT(exists(raw, "chk-1"), 0);
    CHECK_STORE_OK(tdist_store_delete_key(raw, "chk-raw-only", NULL), raw);
  }
}

/* wait, and every write that must wake it, each done by another thread through its own view. */
static void check_wait(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  CHECK_STORE_OK(tdist_store_set(s, "w-here", B("h")), s);
  const char *here[2] = {"w-here", "w-here"};
  CHECK_STORE_OK(tdist_store_wait(s, here, 2, 1000), s);
  CHECK_STORE_OK(tdist_store_wait(s, here, 0, 1000), s);

  const char *missing[2] = {"w-here", "w-missing"};
  int64_t t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(s, missing, 2, 120), TDIST_ERR_TIMEOUT, s);
  check_elapsed(now_ms() - t0, 100, 2500);
  CHECK(tdist_store_last_error(s)[0] != '\0');
  CHECK_STORE_OK(tdist_store_wait(s, here, 1, 1000), s); /* the handle still works */

  /* Woken by each kind of write from another thread. */
  static const act_t acts[] = {ACT_SET, ACT_ADD, ACT_APPEND, ACT_MULTI_SET};
  for (size_t i = 0; i < 4; i++) {
    if (acts[i] == ACT_APPEND && !c->v2) continue;
    char key[32], key2[32];
    snprintf(key, sizeof key, "w-woken-%zu", i);
    snprintf(key2, sizeof key2, "w-woken-%zu-b", i);
    view_t peer = open_view(c, 1);
    job_t j;
    memset(&j, 0, sizeof j);
    j.s = peer.top;
    j.act = acts[i];
    j.key = key;
    j.key2 = key2;
    j.val = "7";
    j.delay_ms = 150;
    job_start(&j);
    const char *keys[1] = {key};
    t0 = now_ms();
    CHECK_STORE_OK(tdist_store_wait(s, keys, 1, 5000), s);
    check_elapsed(now_ms() - t0, 100, 4000);
    job_join(&j);
    CHECK_STORE_OK(j.st, peer.top);
    expect_get_str(s, key, acts[i] == ACT_ADD ? "1" : "7");
    close_view(&peer);
  }

  /* Two keys: only the second write releases the wait. */
  view_t peer = open_view(c, 1);
  job_t j1, j2;
  memset(&j1, 0, sizeof j1);
  memset(&j2, 0, sizeof j2);
  j1.s = j2.s = peer.top;
  j1.act = ACT_SET;
  j1.key = "w-two-a";
  j1.val = "a";
  j1.delay_ms = 50;
  job_start(&j1);
  job_join(&j1); /* one view, one thread at a time */
  const char *two[2] = {"w-two-a", "w-two-b"};
  j2.act = ACT_SET;
  j2.key = "w-two-b";
  j2.val = "b";
  j2.delay_ms = 250;
  t0 = now_ms();
  job_start(&j2);
  CHECK_STORE_OK(tdist_store_wait(s, two, 2, 5000), s);
  check_elapsed(now_ms() - t0, 200, 4000);
  job_join(&j2);
  CHECK_STORE_OK(j2.st, peer.top);
  close_view(&peer);

  /* The raw handle's write of "prefix/key" releases a wait on "key" through the prefix. */
  if (c->full_prefix[0]) {
    view_t rawpeer = open_view(c, 0);
    job_t j;
    memset(&j, 0, sizeof j);
    j.s = rawpeer.top;
    j.act = ACT_SET;
    j.key = raw_key(c, "w-from-raw");
    j.val = "r";
    j.delay_ms = 100;
    job_start(&j);
    const char *keys[1] = {"w-from-raw"};
    CHECK_STORE_OK(tdist_store_wait(s, keys, 1, 5000), s);
    job_join(&j);
    CHECK_STORE_OK(j.st, rawpeer.top);
    close_view(&rawpeer);
  }
  (void)raw;
}

/* The handle's timeout bounds get, wait(-1), multi_get and pop(-1), set on the handle itself
 * or on a store it wraps. */
static void check_timeouts(backend_ctx_t *c, view_t *v) {
  tdist_store_t *s = v->top;
  int64_t saved = tdist_store_timeout(s);
  CHECK(saved > 0);
  const char *w[1] = {"to-missing"};
  /* On the base store: the wrappers follow. */
  CHECK_STORE_OK(tdist_store_set_timeout(v->layers[0], 150), v->layers[0]);
  CHECK_EQ_INT(tdist_store_timeout(v->layers[0]), 150);
  CHECK_EQ_INT(tdist_store_timeout(s), 150);
  int64_t t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(s, w, 1, -1), TDIST_ERR_TIMEOUT, s);
  check_elapsed(now_ms() - t0, 130, 2500);
  /* On the top handle. */
  CHECK_STORE_OK(tdist_store_set_timeout(s, 200), s);
  CHECK_EQ_INT(tdist_store_timeout(s), 200);
  void *val = NULL;
  size_t len = 0;
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_get(s, "to-missing", &val, &len), TDIST_ERR_TIMEOUT, s);
  check_elapsed(now_ms() - t0, 180, 2500);
  CHECK(tdist_store_last_error(s)[0] != '\0');
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_wait(s, w, 1, -1), TDIST_ERR_TIMEOUT, s);
  check_elapsed(now_ms() - t0, 180, 2500);
  CHECK_STORE_OK(tdist_store_set(s, "to-here", B("h")), s);
  const char *mk[2] = {"to-here", "to-missing"};
  void *vals[2] = {0};
  size_t lens[2] = {0};
  t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_multi_get(s, mk, 2, vals, lens), TDIST_ERR_TIMEOUT, s);
  check_elapsed(now_ms() - t0, 180, 2500);
  if (c->v2) {
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_queue_pop(s, "to-queue", -1, &val, &len), TDIST_ERR_TIMEOUT, s);
    check_elapsed(now_ms() - t0, 180, 2500);
    t0 = now_ms();
    CHECK_STORE_STATUS(tdist_store_queue_pop(s, "to-queue", 100, &val, &len), TDIST_ERR_TIMEOUT, s);
    check_elapsed(now_ms() - t0, 80, 2500);
  }
  /* After the timeouts the handle answers correctly. */
  expect_get_str(s, "to-here", "h");
  CHECK_STORE_OK(tdist_store_set_timeout(s, saved), s);
  CHECK_STORE_OK(tdist_store_set_timeout(v->layers[0], saved), v->layers[0]);
  CHECK_EQ_INT(tdist_store_timeout(s), saved);
}

static void check_multi(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  const char *keys[5] = {"m-a", "m-b", "m-empty", "m-a", "m-bin"};
  const void *vals[5] = {"first", "bee", "", "second", "\0\1\0"};
  const size_t lens[5] = {5, 3, 0, 6, 3};
  int64_t n0 = num_keys(s);
  CHECK_STORE_OK(tdist_store_multi_set(s, keys, vals, lens, 5), s);
  CHECK_EQ_INT(num_keys(s), n0 + 4);
  /* Pairs apply in order: the later "m-a" wins. */
  expect_get(s, "m-a", B("second"));
  expect_get(raw, raw_key(c, "m-b"), B("bee"));
  const char *gk[5] = {"m-bin", "m-a", "m-empty", "m-b", "m-bin"};
  const char *want[5] = {"\0\1\0", "second", "", "bee", "\0\1\0"};
  const size_t want_len[5] = {3, 6, 0, 3, 3};
  void *out[5] = {0};
  size_t out_len[5] = {0};
  CHECK_STORE_OK(tdist_store_multi_get(s, gk, 5, out, out_len), s);
  for (int i = 0; i < 5; i++) {
    CHECK_MEM_EQ(out[i], out_len[i], want[i], want_len[i]);
    tdist_free(out[i]);
  }
  CHECK_STORE_OK(tdist_store_multi_get(s, gk, 0, out, out_len), s);
  CHECK_STORE_OK(tdist_store_multi_set(s, keys, vals, lens, 0), s);
  CHECK_EQ_INT(num_keys(s), n0 + 4);
  /* The raw handle reads them all under "prefix/". */
  const char *rk[2] = {raw_key(c, "m-a"), raw_key(c, "m-empty")};
  CHECK_STORE_OK(tdist_store_multi_get(raw, rk, 2, out, out_len), raw);
  CHECK_MEM_EQ(out[0], out_len[0], "second", 6);
  CHECK_MEM_EQ(out[1], out_len[1], "", 0);
  tdist_free(out[0]);
  tdist_free(out[1]);
  /* multi_get waits for a missing key; another thread sets it. */
  view_t peer = open_view(c, 1);
  job_t j;
  memset(&j, 0, sizeof j);
  j.s = peer.top;
  j.act = ACT_SET;
  j.key = "m-late";
  j.val = "late";
  j.delay_ms = 150;
  job_start(&j);
  const char *lk[2] = {"m-b", "m-late"};
  int64_t t0 = now_ms();
  CHECK_STORE_OK(tdist_store_multi_get(s, lk, 2, out, out_len), s);
  check_elapsed(now_ms() - t0, 100, 4000);
  job_join(&j);
  CHECK_STORE_OK(j.st, peer.top);
  CHECK_MEM_EQ(out[0], out_len[0], "bee", 3);
  CHECK_MEM_EQ(out[1], out_len[1], "late", 4);
  tdist_free(out[0]);
  tdist_free(out[1]);
  close_view(&peer);
}

static void check_append(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  if (!c->v2) {
    int64_t n0 = num_keys(s);
    CHECK_STORE_STATUS(tdist_store_append(s, "ap-x", B("abc")), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK(tdist_store_last_error(s)[0] != '\0');
    CHECK_EQ_INT(num_keys(s), n0);
    CHECK_EQ_INT(exists(s, "ap-x"), 0);
    return;
  }
  int64_t n0 = num_keys(s);
  CHECK_STORE_OK(tdist_store_append(s, "ap-x", B("ab\0")), s);
  CHECK_EQ_INT(num_keys(s), n0 + 1);
  expect_get(s, "ap-x", B("ab\0"));
  CHECK_STORE_OK(tdist_store_append(s, "ap-x", B("cd")), s);
  CHECK_STORE_OK(tdist_store_append(s, "ap-x", B("")), s);
  expect_get(s, "ap-x", B("ab\0cd"));
  expect_get(raw, raw_key(c, "ap-x"), B("ab\0cd"));
  CHECK_STORE_OK(tdist_store_set(s, "ap-y", B("set")), s);
  CHECK_STORE_OK(tdist_store_append(s, "ap-y", B("+app")), s);
  expect_get(s, "ap-y", B("set+app"));
  /* Appending nothing to a missing key still creates it, empty. */
  CHECK_STORE_OK(tdist_store_append(s, "ap-empty", B("")), s);
  CHECK_EQ_INT(exists(s, "ap-empty"), 1);
  expect_get(s, "ap-empty", B(""));
  CHECK_EQ_INT(num_keys(s), n0 + 3);
  /* Appended decimal text is an integer for ADD. */
  CHECK_STORE_OK(tdist_store_append(s, "ap-num", B("1")), s);
  CHECK_STORE_OK(tdist_store_append(s, "ap-num", B("2")), s);
  int64_t r = 0;
  CHECK_STORE_OK(tdist_store_add(s, "ap-num", 1, &r), s);
  CHECK_EQ_INT(r, 13);
}

typedef struct {
  const char *val;
  size_t len;
} item_t;

static void check_queue(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  void *v = NULL;
  size_t n = 0;
  int64_t len = -1;
  if (!c->v2) {
    CHECK_STORE_STATUS(tdist_store_queue_push(s, "q", B("a")), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK_STORE_STATUS(tdist_store_queue_pop(s, "q", 0, &v, &n), TDIST_ERR_NOT_AVAILABLE, s);
    CHECK_STORE_STATUS(tdist_store_queue_len(s, "q", &len), TDIST_ERR_NOT_AVAILABLE, s);
    return;
  }
  CHECK_STORE_OK(tdist_store_queue_len(s, "q-unknown", &len), s);
  CHECK_EQ_INT(len, 0);
  CHECK_STORE_STATUS(tdist_store_queue_pop(s, "q-unknown", 0, &v, &n), TDIST_ERR_NOT_FOUND, s);
  CHECK(tdist_store_last_error(s)[0] != '\0');
  static const item_t items[] = {{B("first")}, {B("")}, {B("\0x\0")}, {B("last")}};
  for (size_t i = 0; i < 4; i++) {
    CHECK_STORE_OK(tdist_store_queue_push(s, "q", items[i].val, items[i].len), s);
    CHECK_STORE_OK(tdist_store_queue_len(s, "q", &len), s);
    CHECK_EQ_INT(len, (int64_t)i + 1);
  }
  /* Through the raw handle the queue is "prefix/q". */
  CHECK_STORE_OK(tdist_store_queue_len(raw, raw_key(c, "q"), &len), raw);
  CHECK_EQ_INT(len, 4);
  if (c->full_prefix[0]) {
    CHECK_STORE_OK(tdist_store_queue_len(raw, "q", &len), raw);
    CHECK_EQ_INT(len, 0);
  }
  for (size_t i = 0; i < 4; i++) { /* FIFO */
    CHECK_STORE_OK(tdist_store_queue_pop(s, "q", i % 2 ? 0 : 1000, &v, &n), s);
    CHECK_MEM_EQ(v, n, items[i].val, items[i].len);
    tdist_free(v);
  }
  CHECK_STORE_OK(tdist_store_queue_len(s, "q", &len), s);
  CHECK_EQ_INT(len, 0);
  int64_t t0 = now_ms();
  CHECK_STORE_STATUS(tdist_store_queue_pop(s, "q", 0, &v, &n), TDIST_ERR_NOT_FOUND, s);
  check_elapsed(now_ms() - t0, 0, 1000);

  /* A blocking pop is woken by a push from another thread. */
  view_t peer = open_view(c, 1);
  job_t j;
  memset(&j, 0, sizeof j);
  j.s = peer.top;
  j.act = ACT_PUSH;
  j.key = "q";
  j.val = "pushed";
  j.delay_ms = 150;
  job_start(&j);
  t0 = now_ms();
  CHECK_STORE_OK(tdist_store_queue_pop(s, "q", 5000, &v, &n), s);
  check_elapsed(now_ms() - t0, 100, 4000);
  CHECK_MEM_EQ(v, n, "pushed", 6);
  tdist_free(v);
  job_join(&j);
  CHECK_STORE_OK(j.st, peer.top);
  close_view(&peer);

  /* A push wakes one pop: two blocked poppers, one push, then the other. */
  view_t pv[2] = {open_view(c, 1), open_view(c, 1)};
  job_t pop[2];
  for (int i = 0; i < 2; i++) {
    memset(&pop[i], 0, sizeof pop[i]);
    pop[i].s = pv[i].top;
    pop[i].act = ACT_POP;
    pop[i].key = "q-two";
    pop[i].timeout_ms = 8000;
    job_start(&pop[i]);
  }
  sleep_ms(200);
  CHECK(!job_done(&pop[0]) && !job_done(&pop[1]));
  CHECK_STORE_OK(tdist_store_queue_push(s, "q-two", B("one")), s);
  int64_t deadline = now_ms() + 3000;
  while (!job_done(&pop[0]) && !job_done(&pop[1]) && now_ms() < deadline) sleep_ms(5);
  sleep_ms(200);
  int done = job_done(&pop[0]) + job_done(&pop[1]);
  CHECK_EQ_INT(done, 1);
  CHECK_STORE_OK(tdist_store_queue_push(s, "q-two", B("two")), s);
  job_join(&pop[0]);
  job_join(&pop[1]);
  CHECK_STORE_OK(pop[0].st, pv[0].top);
  CHECK_STORE_OK(pop[1].st, pv[1].top);
  int first = pop[0].out_len == 3 && memcmp(pop[0].out, "one", 3) == 0 ? 0 : 1;
  CHECK_MEM_EQ(pop[first].out, pop[first].out_len, "one", 3);
  CHECK_MEM_EQ(pop[!first].out, pop[!first].out_len, "two", 3);
  for (int i = 0; i < 2; i++) {
    tdist_free(pop[i].out);
    close_view(&pv[i]);
  }
  CHECK_STORE_OK(tdist_store_queue_len(s, "q-two", &len), s);
  CHECK_EQ_INT(len, 0);
}

/* Keys written through the prefix reach the base store as "prefix/key", and keys written there
 * under the prefix are read back through it. */
static void check_prefix_mapping(backend_ctx_t *c, tdist_store_t *s, tdist_store_t *raw) {
  if (!c->full_prefix[0]) return;
  CHECK_STORE_OK(tdist_store_set(s, "pm-key", B("through prefix")), s);
  expect_get_str(raw, raw_key(c, "pm-key"), "through prefix");
  CHECK_EQ_INT(exists(raw, "pm-key"), 0);
  CHECK_STORE_OK(tdist_store_set(raw, raw_key(c, "pm-back"), B("from raw")), raw);
  expect_get_str(s, "pm-back", "from raw");
  /* Keys with slashes and the empty key are joined the same way. */
  CHECK_STORE_OK(tdist_store_set(s, "a/b//c", B("slashes")), s);
  expect_get_str(raw, raw_key(c, "a/b//c"), "slashes");
  CHECK_STORE_OK(tdist_store_set(s, "", B("empty key")), s);
  expect_get_str(raw, raw_key(c, ""), "empty key");
  if (c->d->nprefix == 2) {
    /* The literal layout: outer wrapper's prefix last. */
    expect_get_str(raw, "outer/in ner/pm-key", "through prefix");
  } else {
    expect_get_str(raw, "pfx/pm-key", "through prefix");
  }
  /* The same through a fresh unprefixed view (a second TCP connection for tcp). */
  view_t other = open_view(c, 0);
  expect_get_str(other.top, raw_key(c, "pm-key"), "through prefix");
  close_view(&other);
}

static void run_case(const case_desc_t *d) {
  TEST_CASE(d->name);
  TEST_LOG("case %s", d->name);
  int64_t t0 = now_ms();
  backend_ctx_t c;
  backend_open(&c, d);
  view_t v = open_view(&c, 1);
  view_t raw = open_view(&c, 0);
  check_cas(&c, v.top, raw.top);
  check_add(&c, v.top, raw.top);
  check_num_keys_and_delete(&c, v.top, raw.top);
  check_check(&c, v.top, raw.top);
  check_wait(&c, v.top, raw.top);
  check_timeouts(&c, &v);
  check_multi(&c, v.top, raw.top);
  check_append(&c, v.top, raw.top);
  check_queue(&c, v.top, raw.top);
  check_prefix_mapping(&c, v.top, raw.top);
  /* Both handles agree on the whole store's size at the end. */
  CHECK_EQ_INT(num_keys(v.top), num_keys(raw.top));
  if (c.srv) {
    tdist_store_server_stats_t st;
    tdist_store_server_stats(c.srv, &st);
    CHECK_EQ_INT((int64_t)st.keys, num_keys(raw.top));
  }
  close_view(&raw);
  close_view(&v);
  backend_close(&c);
  TEST_LOG("  ok in %" PRId64 " ms", now_ms() - t0);
}

/* ------------------------------------------------------------------------------------------ */
/* Memory store thread safety                                                                  */
/* ------------------------------------------------------------------------------------------ */

#define MT_THREADS 4
#define MT_ADDS 5000
#define MT_ITEMS 500

typedef struct {
  tdist_store_t *mem;
  int id;
  int failed;
} mt_arg_t;

static void *mt_body(void *p) {
  mt_arg_t *a = p;
  /* Half the threads go through their own prefix store over the shared memory store. */
  tdist_store_t *pre = NULL, *s = a->mem;
  if (a->id % 2) {
    if (tdist_prefix_store_create(a->mem, "mt", &pre) != TDIST_OK) {
      a->failed = 1;
      return NULL;
    }
    s = pre;
  }
  for (int i = 0; i < MT_ADDS && !a->failed; i++) {
    if (tdist_store_add(s, a->id % 2 ? "ctr" : "mt/ctr", 1, NULL) != TDIST_OK) a->failed = 2;
    if (i % 10 == 0) {
      char key[32], val[32];
      snprintf(key, sizeof key, "%s-%d-%d", a->id % 2 ? "k" : "mt/k", a->id, i);
      snprintf(val, sizeof val, "%d", i);
      void *v = NULL;
      size_t n = 0;
      if (tdist_store_set(s, key, val, strlen(val)) != TDIST_OK ||
          tdist_store_get(s, key, &v, &n) != TDIST_OK || n != strlen(val) || memcmp(v, val, n) != 0)
        a->failed = 3;
      tdist_free(v);
    }
    if (i < MT_ITEMS) {
      char item[32];
      snprintf(item, sizeof item, "%d:%d", a->id, i);
      if (tdist_store_queue_push(s, a->id % 2 ? "q" : "mt/q", item, strlen(item)) != TDIST_OK)
        a->failed = 4;
    }
  }
  tdist_store_destroy(pre);
  return NULL;
}

static void test_memory_threads(void) {
  TEST_CASE("memory threads");
  TEST_LOG("memory store, %d threads", MT_THREADS);
  tdist_store_t *mem = NULL;
  CHECK_OK(tdist_memory_store_create(&mem));
  CHECK_STORE_OK(tdist_store_set_timeout(mem, 20000), mem);
  /* A waiter on the key the last add creates, and a blocked popper, run alongside. */
  job_t w;
  memset(&w, 0, sizeof w);
  w.s = mem;
  w.act = ACT_WAIT;
  w.key = "mt/k-0-4990";
  w.timeout_ms = 20000;
  job_start(&w);
  pthread_t th[MT_THREADS];
  mt_arg_t args[MT_THREADS];
  for (int i = 0; i < MT_THREADS; i++) {
    args[i] = (mt_arg_t){mem, i, 0};
    CHECK(pthread_create(&th[i], NULL, mt_body, &args[i]) == 0);
  }
  /* The main thread consumes the queue while the producers run: per producer, FIFO order. */
  int next[MT_THREADS] = {0};
  int popped = 0;
  int64_t deadline = now_ms() + 30000;
  while (popped < MT_THREADS * MT_ITEMS && now_ms() < deadline) {
    void *v = NULL;
    size_t n = 0;
    tdist_status_t st = tdist_store_queue_pop(mem, "mt/q", 5000, &v, &n);
    CHECK_STORE_OK(st, mem);
    char item[32];
    CHECK(n < sizeof item);
    memcpy(item, v, n);
    item[n] = '\0';
    tdist_free(v);
    int id = -1, seq = -1;
    CHECK(sscanf(item, "%d:%d", &id, &seq) == 2);
    CHECK(id >= 0 && id < MT_THREADS);
    CHECK_EQ_INT(seq, next[id]);
    next[id]++;
    popped++;
  }
  CHECK_EQ_INT(popped, MT_THREADS * MT_ITEMS);
  for (int i = 0; i < MT_THREADS; i++) {
    CHECK(pthread_join(th[i], NULL) == 0);
    CHECK_EQ_INT(args[i].failed, 0);
  }
  job_join(&w);
  CHECK_STORE_OK(w.st, mem);
  int64_t total = 0;
  CHECK_STORE_OK(tdist_store_add(mem, "mt/ctr", 0, &total), mem);
  CHECK_EQ_INT(total, MT_THREADS * MT_ADDS);
  expect_get_str(mem, "mt/ctr", "20000");
  /* ctr + one key per 10 iterations per thread; the queue is not a key. */
  CHECK_EQ_INT(num_keys(mem), 1 + MT_THREADS * (MT_ADDS / 10));
  int64_t len = -1;
  CHECK_STORE_OK(tdist_store_queue_len(mem, "mt/q", &len), mem);
  CHECK_EQ_INT(len, 0);
  tdist_store_destroy(mem);
}

int main(void) {
  alarm(200);
  signal(SIGPIPE, SIG_IGN);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
  test_memory_threads();
  TEST_LOG("store_semantics_test: all passed");
  return 0;
}
