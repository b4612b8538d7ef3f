/* The callback store (tdist_callback_store_create): a language binding's own store handed to
 * libtdist. The callbacks here drive a memory store (the "user's" store); a second memory store
 * is the reference. Checked:
 *   - random operations (set, get, add, compare_set, check, delete_key, num_keys, multi_get,
 *     multi_set) give the same results through the callback store as on the reference;
 *   - get and wait pass their timeout on and a TIMEOUT from the callback comes back as
 *     TDIST_ERR_TIMEOUT with the callback's text in the handle's error;
 *   - a callback's status outside tdist's range becomes TDIST_ERR_INTERNAL;
 *   - a get that hands back no value is an error, not a crash;
 *   - append and queues, and callbacks left NULL, are TDIST_ERR_NOT_AVAILABLE naming the op;
 *   - set, get and wait are required; size/version are checked; destroy is called once;
 *   - a process group of 3 ranks (threads, one group each) meets through callback stores over
 *     one shared memory store and all_reduces correctly. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tdist/tdist.h"
#include "tests/testlib/check.h"

typedef struct {
  tdist_store_t *inner;
  int destroyed;
  int get_nothing; /* get returns OK without a value */
  int bad_status;  /* every op returns 42 */
  int64_t last_timeout;
  pthread_mutex_t mu; /* the memory store is thread-safe; this guards the fields */
} ctx_t;

static tdist_status_t pass_err(ctx_t *c, tdist_status_t st, tdist_store_reply_t *r) {
  if (st) tdist_store_reply_error(r, tdist_store_last_error(c->inner));
  return st;
}

static tdist_status_t f_set(void *ctx, const char *k, const void *v, size_t n,
                            tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  if (c->bad_status) return (tdist_status_t)42;
  return pass_err(c, tdist_store_set(c->inner, k, v, n), r);
}

static tdist_status_t f_get(void *ctx, const char *k, int64_t to, tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  c->last_timeout = to;
  if (c->get_nothing) return TDIST_OK;
  const char *keys[] = {k};
  tdist_status_t st = tdist_store_wait(c->inner, keys, 1, to);
  if (st) {
    tdist_store_reply_error(r, "the user's store timed out");
    return st;
  }
  void *v;
  size_t n;
  st = tdist_store_get(c->inner, k, &v, &n);
  if (st) return pass_err(c, st, r);
  st = tdist_store_reply_value(r, v, n);
  free(v);
  return st;
}

static tdist_status_t f_add(void *ctx, const char *k, int64_t d, int64_t *res,
                            tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  return pass_err(c, tdist_store_add(c->inner, k, d, res), r);
}

static tdist_status_t f_wait(void *ctx, const char *const *keys, size_t n, int64_t to,
                             tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  c->last_timeout = to;
  return pass_err(c, tdist_store_wait(c->inner, keys, n, to), r);
}

static tdist_status_t f_check(void *ctx, const char *const *keys, size_t n, int *ready,
                              tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  return pass_err(c, tdist_store_check(c->inner, keys, n, ready), r);
}

static tdist_status_t f_delete(void *ctx, const char *k, int *deleted, tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  return pass_err(c, tdist_store_delete_key(c->inner, k, deleted), r);
}

static tdist_status_t f_num(void *ctx, int64_t *n, tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  return pass_err(c, tdist_store_num_keys(c->inner, n), r);
}

static tdist_status_t f_cas(void *ctx, const char *k, const void *e, size_t en, const void *d,
                            size_t dn, tdist_store_reply_t *r) {
  ctx_t *c = ctx;
  void *v;
  size_t n;
  tdist_status_t st = tdist_store_compare_set(c->inner, k, e, en, d, dn, &v, &n);
  if (st) return pass_err(c, st, r);
  st = tdist_store_reply_value(r, v, n);
  free(v);
  return st;
}

static void f_destroy(void *ctx) { ((ctx_t *)ctx)->destroyed++; }

static tdist_store_t *make(ctx_t *c, tdist_store_t *inner, int full) {
  memset(c, 0, sizeof *c);
  c->inner = inner;
  tdist_store_callbacks_t cb = TDIST_STORE_CALLBACKS_INIT;
  cb.ctx = c;
  cb.set = f_set;
  cb.get = f_get;
  cb.wait = f_wait;
  if (full) {
    cb.add = f_add;
    cb.check = f_check;
    cb.delete_key = f_delete;
    cb.num_keys = f_num;
    cb.compare_set = f_cas;
  }
  cb.destroy = f_destroy;
  tdist_store_t *s = NULL;
  CHECK_OK(tdist_callback_store_create(&cb, 5000, &s));
  return s;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_random_ops(void) {
  TEST_CASE("random operations equal the reference store");
  tdist_store_t *inner, *ref;
  CHECK_OK(tdist_memory_store_create(&inner));
  CHECK_OK(tdist_memory_store_create(&ref));
  ctx_t c;
  tdist_store_t *s = make(&c, inner, 1);
  char key[16], val[64];
  for (int i = 0; i < 20000; i++) {
    snprintf(key, sizeof key, "k%d", (int)(next() % 24));
    size_t vn = next() % sizeof val;
    for (size_t j = 0; j < vn; j++) val[j] = (char)next();
    switch (next() % 8) {
      case 0: {
        CHECK_STORE_OK(tdist_store_set(s, key, val, vn), s);
        CHECK_STORE_OK(tdist_store_set(ref, key, val, vn), ref);
        break;
      }
      case 1: {
        const char *keys[] = {key};
        int a = -1, b = -1;
        CHECK_STORE_OK(tdist_store_check(s, keys, 1, &a), s);
        CHECK_STORE_OK(tdist_store_check(ref, keys, 1, &b), ref);
        CHECK_EQ_INT(a, b);
        if (a) {
          void *x, *y;
          size_t xn, yn;
          CHECK_STORE_OK(tdist_store_get(s, key, &x, &xn), s);
          CHECK_STORE_OK(tdist_store_get(ref, key, &y, &yn), ref);
          CHECK_MEM_EQ(x, xn, y, yn);
          free(x);
          free(y);
        }
        break;
      }
      case 2: {
        snprintf(key, sizeof key, "n%d", (int)(next() % 4));
        int64_t d = (int64_t)(next() % 2001) - 1000, a, b;
        CHECK_STORE_OK(tdist_store_add(s, key, d, &a), s);
        CHECK_STORE_OK(tdist_store_add(ref, key, d, &b), ref);
        CHECK_EQ_INT(a, b);
        break;
      }
      case 3: {
        int a, b;
        CHECK_STORE_OK(tdist_store_delete_key(s, key, &a), s);
        CHECK_STORE_OK(tdist_store_delete_key(ref, key, &b), ref);
        CHECK_EQ_INT(a, b);
        break;
      }
      case 4: {
        int64_t a, b;
        CHECK_STORE_OK(tdist_store_num_keys(s, &a), s);
        CHECK_STORE_OK(tdist_store_num_keys(ref, &b), ref);
        CHECK_EQ_INT(a, b);
        break;
      }
      case 5: {
        /* expected: the current value half the time, else random (or empty) */
        void *cur = NULL;
        size_t cn = 0;
        const char *keys[] = {key};
        int have = 0;
        CHECK_STORE_OK(tdist_store_check(ref, keys, 1, &have), ref);
        if (have && next() % 2) CHECK_STORE_OK(tdist_store_get(ref, key, &cur, &cn), ref);
        void *x, *y;
        size_t xn, yn;
        CHECK_STORE_OK(tdist_store_compare_set(s, key, cur, cn, val, vn, &x, &xn), s);
        CHECK_STORE_OK(tdist_store_compare_set(ref, key, cur, cn, val, vn, &y, &yn), ref);
        CHECK_MEM_EQ(x, xn, y, yn);
        free(x);
        free(y);
        free(cur);
        break;
      }
      case 6: {
        const char *keys[] = {"m0", "m1", "m2"};
        const void *vals[] = {val, val + 1, val + 2};
        size_t lens[] = {vn / 2, vn / 3, 0};
        CHECK_STORE_OK(tdist_store_multi_set(s, keys, vals, lens, 3), s);
        CHECK_STORE_OK(tdist_store_multi_set(ref, keys, vals, lens, 3), ref);
        break;
      }
      default: {
        const char *keys[] = {"m0", "m1", "m2"};
        int have;
        CHECK_STORE_OK(tdist_store_check(ref, keys, 3, &have), ref);
        if (!have) break;
        void *x[3], *y[3];
        size_t xn[3], yn[3];
        CHECK_STORE_OK(tdist_store_multi_get(s, keys, 3, x, xn), s);
        CHECK_STORE_OK(tdist_store_multi_get(ref, keys, 3, y, yn), ref);
        for (int j = 0; j < 3; j++) {
          CHECK_MEM_EQ(x[j], xn[j], y[j], yn[j]);
          free(x[j]);
          free(y[j]);
        }
      }
    }
  }
  tdist_store_destroy(s);
  CHECK_EQ_INT(c.destroyed, 1);
  tdist_store_destroy(inner);
  tdist_store_destroy(ref);
}

static void test_errors(void) {
  TEST_CASE("timeouts, bad statuses, missing values and operations");
  tdist_store_t *inner;
  CHECK_OK(tdist_memory_store_create(&inner));
  ctx_t c;
  tdist_store_t *s = make(&c, inner, 0);
  CHECK_OK(tdist_store_set_timeout(s, 150));
  void *v = NULL;
  size_t n = 0;
  CHECK_STORE_STATUS(tdist_store_get(s, "absent", &v, &n), TDIST_ERR_TIMEOUT, s);
  CHECK_EQ_INT(c.last_timeout, 150);
  CHECK_HAS(tdist_store_last_error(s), "callback store: get: the user's store timed out");
  const char *keys[] = {"absent", "also"};
  CHECK_STORE_STATUS(tdist_store_wait(s, keys, 2, -1), TDIST_ERR_TIMEOUT, s);
  CHECK_EQ_INT(c.last_timeout, 150);
  int64_t x;
  CHECK_STORE_STATUS(tdist_store_add(s, "a", 1, &x), TDIST_ERR_NOT_AVAILABLE, s);
  CHECK_HAS(tdist_store_last_error(s), "callback store: add: not provided by this store");
  CHECK_STORE_STATUS(tdist_store_append(s, "a", "x", 1), TDIST_ERR_NOT_AVAILABLE, s);
  CHECK_HAS(tdist_store_last_error(s), "append");
  CHECK_STORE_STATUS(tdist_store_queue_push(s, "q", "x", 1), TDIST_ERR_NOT_AVAILABLE, s);
  c.get_nothing = 1;
  CHECK_OK(tdist_store_set(inner, "k", "v", 1));
  CHECK_STORE_STATUS(tdist_store_get(s, "k", &v, &n), TDIST_ERR_INTERNAL, s);
  CHECK_HAS(tdist_store_last_error(s), "gave no value");
  c.get_nothing = 0;
  c.bad_status = 1;
  CHECK_STORE_STATUS(tdist_store_set(s, "k", "v", 1), TDIST_ERR_INTERNAL, s);
  c.bad_status = 0;
  CHECK_STORE_OK(tdist_store_get(s, "k", &v, &n), s);
  CHECK_MEM_EQ(v, n, "v", 1);
  free(v);
  tdist_store_destroy(s);
  CHECK_EQ_INT(c.destroyed, 1);

  tdist_store_callbacks_t cb = TDIST_STORE_CALLBACKS_INIT;
  cb.set = f_set;
  cb.get = f_get; /* no wait */
  tdist_store_t *bad = NULL;
  CHECK_STATUS(tdist_callback_store_create(&cb, 0, &bad), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_HAS(tdist_last_error(), "set, get and wait are required");
  CHECK(bad == NULL);
  cb.wait = f_wait;
  cb.size = 3;
  CHECK_STATUS(tdist_callback_store_create(&cb, 0, &bad), TDIST_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(tdist_callback_store_create(NULL, 0, &bad), TDIST_ERR_INVALID_ARGUMENT);
  tdist_store_destroy(inner);
}

typedef struct {
  tdist_store_t *shared;
  int rank;
  int ok;
} rank_arg_t;

static void *rank_main(void *p) {
  rank_arg_t *a = p;
  ctx_t c;
  tdist_store_t *s = make(&c, a->shared, 1);
  tdist_pg_options_t o = TDIST_PG_OPTIONS_INIT;
  o.store = s;
  o.rank = a->rank;
  o.world_size = 3;
  o.timeout_ms = 20000;
  tdist_pg_t *pg = NULL;
  if (tdist_init_process_group(&o, &pg) != TDIST_OK) {
    TEST_LOG("rank %d: init: %s", a->rank, tdist_last_error());
    tdist_store_destroy(s);
    return NULL;
  }
  int64_t buf[1000];
  for (int i = 0; i < 1000; i++) buf[i] = (int64_t)i * (a->rank + 1);
  a->ok = tdist_all_reduce(pg, buf, 1000, TDIST_INT64, TDIST_SUM) == TDIST_OK;
  for (int i = 0; a->ok && i < 1000; i++) a->ok = buf[i] == (int64_t)i * 6;
  tdist_pg_destroy(pg);
  tdist_store_destroy(s);
  return NULL;
}

static void test_process_group(void) {
  TEST_CASE("a 3-rank process group over callback stores");
  tdist_store_t *shared;
  CHECK_OK(tdist_memory_store_create(&shared));
  pthread_t t[3];
  rank_arg_t a[3];
  for (int r = 0; r < 3; r++) {
    a[r] = (rank_arg_t){shared, r, 0};
    CHECK(pthread_create(&t[r], NULL, rank_main, &a[r]) == 0);
  }
  for (int r = 0; r < 3; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < 3; r++) CHECK(a[r].ok);
  tdist_store_destroy(shared);
}

int main(void) {
  test_random_ops();
  test_errors();
  test_process_group();
  TEST_LOG("PASS");
  return 0;
}
